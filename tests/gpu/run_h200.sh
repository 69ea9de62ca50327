#!/usr/bin/env bash
# Builds kdispatch's CUDA backend from source on the H200 machine (Ubuntu
# 24.04, nvcc 13, CMake 4, no package registry) and runs, in one go: the GPU
# tests, the host-side GPU/config tests, the norm benchmark on the peers'
# grid, the peers themselves (Triton, torch) and the comparison. Results go
# to $OUT (default ./h200-out): build.txt, gpu_tests.txt, host_tests.txt,
# bench.csv, peers/h200-baseline.json, compare.txt.
#
# Needs .deps/ in the repo root (git-ignored; see tests/gpu/README.md): the
# Debian 12 .debs of simdjson, doctest, dlpack, xxhash (and CLI11), plus
# ../shared/peers/h200_baseline.py and h200_kernels.py copied beside them.
# With NO_PEERS=1 the peers and the comparison are skipped.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
D=${DEPS_DIR:-/tmp/kdispatch-deps}
B=${BUILD_DIR:-/tmp/kdispatch-build-h200}
L=$D/usr/lib/x86_64-linux-gnu
mkdir -p "$D"
for f in .deps/*.deb; do dpkg -x "$f" "$D"; done
# The .pc file names prefix=/usr: point it at the unpacked tree.
sed -i "s|^prefix=/usr\$|prefix=$D/usr|" "$L/pkgconfig/libxxhash.pc"
export PKG_CONFIG_PATH=$L/pkgconfig LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKDISPATCH_CUDA=ON -DKDISPATCH_HIP=OFF \
  -DKDISPATCH_PYTHON=OFF -DKDISPATCH_OPENBLAS=OFF -DKDISPATCH_BUILD_BENCH=OFF -DKDISPATCH_BUILD_CLI=OFF \
  -DCMAKE_PREFIX_PATH="$D/usr;$L/cmake" -DCMAKE_INCLUDE_PATH="$D/usr/include" >"$OUT/build.txt" 2>&1 &&
  cmake --build "$B" -j"$(nproc)" --target kdispatch_gpu_tests kdispatch_gpu_norm_bench kdispatch_tests \
    >>"$OUT/build.txt" 2>&1
rc=$?
echo "build rc=$rc in $(($(date +%s) - t0)) s"
[ $rc -eq 0 ] || { tail -20 "$OUT/build.txt"; exit $rc; }

"$B/tests/gpu/kdispatch_gpu_tests" >"$OUT/gpu_tests.txt" 2>&1
echo "kdispatch_gpu_tests rc=$?: $(tail -2 "$OUT/gpu_tests.txt" | head -1)"
"$B/tests/kdispatch_tests" -tc='gpu host*,configs*' >"$OUT/host_tests.txt" 2>&1
echo "kdispatch_tests (gpu host, configs) rc=$?: $(tail -2 "$OUT/host_tests.txt" | head -1)"
"$B/bench/gpu/kdispatch_gpu_norm_bench" --csv "$OUT/bench.csv" >/dev/null 2>"$OUT/bench_err.txt"
echo "kdispatch_gpu_norm_bench rc=$?"
[ -s "$OUT/bench_err.txt" ] || rm -f "$OUT/bench_err.txt"
if [ "${NO_PEERS:-0}" != 1 ]; then
  timeout 400 python3 .deps/h200_baseline.py --sections rmsnorm,fused --budget-s 520 --copy-bw 4234 \
    --out "$OUT/peers" >/dev/null 2>&1
  echo "peers rc=$?"
  rm -f "$OUT/peers/h200-baseline.md"
  python3 bench/gpu/compare_peers.py --peers "$OUT/peers/h200-baseline.json" --ours "$OUT/bench.csv" >"$OUT/compare.txt" 2>&1
  tail -7 "$OUT/compare.txt"
fi
