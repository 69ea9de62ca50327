#!/usr/bin/env bash
# kdispatch on the H200: build, GPU tests, tuning, benchmarks, the regression
# gate — one script, in sections that each fit one device call (< 10 min) and
# resume from what the previous call returned.
#
#   bench/gpu/run_h200.sh --sections build,test          # build + GPU/torch tests
#   bench/gpu/run_h200.sh --sections tune                # tune the grid (resumes)
#   bench/gpu/run_h200.sh --sections bench,check         # peers side by side, gate
#
# The device machine (Ubuntu 24.04, nvcc 13, CMake 4, torch, Triton) reaches no
# package registry: the Debian .debs kdispatch needs travel in .deps/ (git-ignored;
# `bench/gpu/run_h200.sh --fetch-deps` fills it on a machine with apt) and are
# unpacked into /tmp/deps, never into /. The peers' Triton kernels are read from
# $KDISPATCH_PEERS_DIR (default ../shared/peers; carry a copy as .peers/).
#
# Results land in $OUT (default ./out): logs, bench_gpu.json, h200.md, and
# configs.tar (tuned files, config-file format, under cuda/<op>/) — unpack it
# into configs/ to commit. Each section is idempotent: build skips when
# build/gpu is current; tune resumes (kdispatch tune skips rows the emit dir has).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SECTIONS=build,test
OUT=${OUT:-$ROOT/out}
BUDGET_MS=${KD_TUNE_BUDGET_MS:-250}
TOKENS=${KD_TOKENS:-1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384,32768}
HIDDENS=${KD_HIDDENS:-1024,2048,2560,3584,4096,5120,7168,8192,12288,16384}
DTYPES=${KD_DTYPES:-bf16,fp16}
NORM_OPS=${KD_NORM_OPS:-rmsnorm,fused_add_rmsnorm}
PEERS=${KDISPATCH_PEERS_DIR:-}
[ -z "$PEERS" ] && for d in "$ROOT/.peers" "$ROOT/../shared/peers"; do [ -f "$d/h200_kernels.py" ] && PEERS=$d && break; done
while [ $# -gt 0 ]; do
  case "$1" in
    --sections) SECTIONS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --fetch-deps)
      mkdir -p .deps && (cd .deps && apt-get download libsimdjson-dev libsimdjson14 doctest-dev libcli11-dev \
        libdlpack-dev libxxhash-dev libxxhash0)
      exit 0 ;;
    *) echo "usage: $0 [--sections build,test,tune,bench,check] [--out DIR] | --fetch-deps" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
has() { [[ ",$SECTIONS," == *",$1,"* ]]; }
t0=$(date +%s)
stamp() { echo "::: [$(( $(date +%s) - t0 )) s] $*"; }
PY=python3
[ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3

# ---- dependencies: unpack the carried .debs (never into /)
DEPS=/tmp/deps
if [ ! -d "$DEPS/usr" ] && ls .deps/*.deb >/dev/null 2>&1; then
  for f in .deps/*.deb; do dpkg -x "$f" "$DEPS"; done
fi
export PKG_CONFIG_PATH="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:${PKG_CONFIG_PATH:-}"
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export PATH=/usr/local/cuda/bin:$PATH
BUILD=$ROOT/build/gpu
LIB=$BUILD/libkdispatch.so

build() {
  stamp "build: configure"
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DKDISPATCH_CUDA=ON -DKDISPATCH_HIP=OFF -DKDISPATCH_OPENBLAS=OFF -DKDISPATCH_PYTHON=OFF \
    -DKDISPATCH_BUILD_BENCH=OFF -DKDISPATCH_BUILD_TESTS=ON \
    -DCMAKE_PREFIX_PATH="$DEPS/usr;$DEPS/usr/lib/x86_64-linux-gnu/cmake;$DEPS/usr/share/cmake" \
    -DCMAKE_INCLUDE_PATH="$DEPS/usr/include" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; return 1; }
  stamp "build: compile"
  cmake --build "$BUILD" -j "$(nproc)" >>"$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -40; return 1; }
  stamp "build: done ($(grep -c 'Building CUDA' "$OUT/build.log" || true) CUDA objects)"
}
ensure_build() { [ -f "$LIB" ] && [ -x "$BUILD/kdispatch" ] || build; }

if has build; then build; fi

if has test; then
  ensure_build
  stamp "test: GPU tests"
  if [ -x "$BUILD/tests/gpu/kdispatch_gpu_tests" ]; then
    "$BUILD/tests/gpu/kdispatch_gpu_tests" 2>&1 | tee "$OUT/gpu_tests.log" | tail -15
  else
    echo "no GPU test binary" | tee "$OUT/gpu_tests.log"
  fi
  stamp "test: CPU suite (sanity on this host)"
  (cd "$BUILD" && KDISPATCH_CACHE_DIR=$BUILD/no-cache ctest -j 8 -E "python|cli tune" 2>&1 | tail -5) | tee "$OUT/cpu_tests.log"
  stamp "test: torch custom ops"
  (cd integrations/python/tests && PYTHONPATH="$ROOT/integrations/python" KDISPATCH_LIBRARY="$LIB" \
    "$PY" -m unittest -v test_torch_ops 2>&1 | tail -25) | tee "$OUT/torch_ops.log"
fi

if has tune; then
  ensure_build
  EMIT=$ROOT/configs
  grid=$OUT/norm_grid.csv
  echo "M,hidden" >"$grid"
  for h in ${HIDDENS//,/ }; do for m in ${TOKENS//,/ }; do echo "$m,$h" >>"$grid"; done; done
  for op in ${NORM_OPS//,/ }; do
    for dt in ${DTYPES//,/ }; do
      stamp "tune: $op $dt ($(($(wc -l <"$grid") - 1)) shapes, ${BUDGET_MS} ms each at most)"
      "$BUILD/kdispatch" tune --backend cuda --shapes "$grid" --op "$op" --dtype "$dt" --emit "$EMIT" \
        --budget-ms "$BUDGET_MS" >"$OUT/tune_${op}_${dt}.log" 2>&1 || true
      tail -3 "$OUT/tune_${op}_${dt}.log"
    done
  done
  (cd "$ROOT" && tar cf "$OUT/configs.tar" configs/cuda)
  "$BUILD/kdispatch" validate "$EMIT" >"$OUT/validate.log" 2>&1 && stamp "tune: configs validate" || tail -5 "$OUT/validate.log"
fi

if has bench; then
  ensure_build
  stamp "bench: norms (peers: ${PEERS:-none})"
  "$PY" bench/gpu/bench_gpu.py --lib "$LIB" --configs "$ROOT/configs" ${PEERS:+--peers "$PEERS"} \
    --sections norms --dtypes "$DTYPES" --ops "$NORM_OPS" --tokens "$TOKENS" --hiddens "$HIDDENS" \
    --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -20
  "$PY" bench/gpu/render.py "$OUT/bench_gpu.json" --commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    >"$OUT/h200.md" && stamp "bench: table in $OUT/h200.md"
fi

if has check; then
  ensure_build
  stamp "check: committed H200 rows vs get_default (gate: 1.10x)"
  "$PY" bench/gpu/check_configs.py --lib "$LIB" --configs "$ROOT/configs" --device-name NVIDIA_H200 \
    --max-ratio 1.10 --out "$OUT" 2>&1 | tee "$OUT/check.log" | tail -15
fi
stamp "done: $SECTIONS"
