#!/usr/bin/env bash
# kdispatch on the H200: build, GPU tests, tuning, benchmarks and the
# regression gate — one script, in sections that each fit one device call
# (10 minutes) on a bare machine, and resume from what the previous call
# returned.
#
#   bench/gpu/run_h200.sh --sections build       # configure + build everything (timed)
#   bench/gpu/run_h200.sh --sections test        # GPU tests but silu_and_mul's kernel cases, host GPU/config tests, torch ops
#                 (KD_TEST_PARTS=gpu,host,torch: the parts to run)
#   bench/gpu/run_h200.sh --sections fp8-test    # the fp8 GEMM and quantisation GPU tests (fp8_tests.log; ~400 s;
#                 KD_FP8_TEST_CASES="gpu fp8 gemm: get_default*,gpu fp8 gemm fast_accum*": those cases only)
#   bench/gpu/run_h200.sh --sections moe         # fused_moe beside SGLang's Triton MoE kernel (moe_bench.json;
#                 KD_MOE_CASES, KD_MOE_M, KD_MOE_ROUTING, KD_MOE_ROUNDS, KD_MOE_VARIANTS: see the section)
#   KD_GPU_TEST_CASES='gpu fused_moe*' ... --sections build,test   # the GPU tests of those doctest cases only
#   bench/gpu/run_h200.sh --sections moe-w8a8    # fp8_w8a8 (per-tensor, per-channel) moe_gemm decode and
#                 prefill and fused_moe beside the peer, in one call (moe_w8a8_{decode,prefill,fused}.json)
#   bench/gpu/run_h200.sh --sections moe-profile # ncu on fused_moe's kernels at one bench_moe.py point
#                 (KD_MOE_PROFILE_CASE, KD_MOE_PROFILE_M: a comma list, one ncu run each,
#                 KD_MOE_PROFILE_KERNELS; moe_ncu.txt)
#   bench/gpu/run_h200.sh --sections moe-model   # transformers' Qwen3-MoE, experts by kdispatch vs grouped_mm
#                 (bench/gpu/e2e_moe.py; KD_MOE_LAYERS, default 16; KD_MOE_BATCHES; KD_MOE_PREFILL, 4x512)
#   bench/gpu/run_h200.sh --sections fp8-tune    # fp8 GEMM rows at decode Ms into configs/cuda (resumes)
#   bench/gpu/run_h200.sh --sections fp8-bench   # fp8 GEMMs beside torch._scaled_mm, bf16 and the read ceiling
#   bench/gpu/run_h200.sh --sections fp8-model   # Llama-3-8B with fp8 block-scaled projections (e2e_model.py --fp8)
#   bench/gpu/run_h200.sh --sections fp8-profile # ncu on the fp8 decode kernel at KD_FP8_PROFILE (fp8_ncu.txt)
#   bench/gpu/run_h200.sh --sections shards      # issue 22 on one GPU: one process vs two shards one after the
#                 other vs --devices 0 on a small bf16 GEMM grid, the merge (both orders), merge --retime (shards.json),
#                 the grid served from the one-process and the merged configs (shard_serving.json; KD_SHARD_SERVING=0: not)
#   KD_TEST_OPS=1 ... --sections build,silu-test  # with the test-only GPU family (kernels/cuda/test/): its
#                                                  # fp32 silu_and_mul variant runs in the silu tests (fresh build dir)
#   KD_FP8_GRID=full ... --sections fp8-bench    # the issue's whole fp8 grid (bench_fp8.py full_grid(), 238 points)
#   bench/gpu/run_h200.sh --sections silu-test   # the GPU silu_and_mul tests (silu_tests.log): with test, the
#                 whole GPU suite (together they outgrew one call: ~480 s + ~170 s on 2026-12-01)
#   bench/gpu/run_h200.sh --sections tune        # tune the grid into configs/cuda (resumes)
#   bench/gpu/run_h200.sh --sections bench       # kdispatch beside the peers (resumes)
#   bench/gpu/run_h200.sh --sections check       # committed rows vs get_default, gate 1.10x
#   bench/gpu/run_h200.sh --sections norm-peers  # every point of every bf16 norm variant on the peers' grid
#                 (kdispatch_gpu_norm_bench), the peers' own h200_baseline.py (rmsnorm, fused) in the same
#                 call and compare_peers.py's ratios and targets (KD_NO_PEERS=1: the norm benchmark alone)
#   bench/gpu/run_h200.sh --sections gemm-tune   # tune the bf16 GEMM grid into configs/cuda/gemm (resumes)
#   bench/gpu/run_h200.sh --sections gemm-bench  # GEMM beside torch (cuBLAS) and Triton (resumes)
#   bench/gpu/run_h200.sh --sections gemm-test   # the GPU GEMM tests alone (gemm_tests.log)
#   bench/gpu/run_h200.sh --sections wgmma-harness # the wgmma kernels alone against cuBLAS, with a barrier
#                 watchdog (bench/gpu/wgmma_harness.cu; KD_WGMMA_HARNESS=dense|moe|all; wgmma_harness.log)
#   bench/gpu/run_h200.sh --sections gemm-host   # dispatch::gemm host overhead; tiled family alone vs cuBLASLt
#                 (KD_GEMM_SWEEP_M=1,8,16: then every skinny/skinny_mma point of the grid at those M;
#                  KD_GEMM_SWEEP_ONLY=1: the sweep alone; KD_GEMM_SWEEP_NK=1280x8192,...: these shapes only)
#   bench/gpu/run_h200.sh --sections gemm-probe  # diagnostics: time against bytes (empty kernel, copy, read
#                 kernel, get_default, cuBLASLt; PDL on and off), cuBLASLt after other plans (KD_GEMM_PROBE_LT=0:
#                 skip), ncu on KD_GEMM_PROFILE=M,N,K/... (none: skip); results in bench/results/h200_gemm_fixed.md
#   bench/gpu/run_h200.sh --sections e2e         # decode end to end: torch ops vs kdispatch ops (resumes)
#   bench/gpu/run_h200.sh --sections silu        # silu_and_mul beside eager and torch.compile, and the
#                 copy rate of the same run (resumes; bench/gpu/bench_silu.py)
#   bench/gpu/run_h200.sh --sections torch       # the native torch ops (libkdispatch_torch for the machine's
#                 torch): their tests (opcheck, torch.compile, CUDA streams, graphs) and the host cost per
#                 eager call against torch and the floor ops (bench/tools/torch_op_host.py)
#   bench/gpu/run_h200.sh --sections anymodel    # issue 32: the floor's test, then kdispatch vs torch on 14
#                 projections with no committed rows, bf16 + fp8, cold and graphs, A/A (resumes; any_model.json)
#   bench/gpu/run_h200.sh --sections large       # issue 36's milestone: the any-model harness with kd forced to
#                 KD_LARGE_FORCE (default gemm=gemm_bf16__wgmma) on 8192^3 and the committed bf16 shapes at M >= 1024
#                 against torch and the floor, cold and graphs, A/A (resumes; large.json)
#   bench/gpu/run_h200.sh --sections fit         # the synthetic decode grid get_default is fitted on (fit.json)
#   bench/gpu/run_h200.sh --sections committed   # the any-model harness on the committed shapes (committed.json)
#   bench/gpu/run_h200.sh --sections pip         # issue 33: pip install . (CUDA) into a venv, the GPU torch tests against it
#   bench/gpu/run_h200.sh --sections nvml        # the SM clock screen: a short tune, verify and report of its rows
#   bench/gpu/run_h200.sh --sections graph       # issue 32 item 3: the capture tests, a tune whose rows say cold+graph
#   bench/gpu/run_h200.sh --sections tunemodel   # issue 32 item 5: tune --model qwen2.5-7b timed (resumes), then
#                                                #   its any-model points served from the emit dir
#   bench/gpu/run_h200.sh --sections compile     # issue 32 item 7: reduce-overhead MLP block / decoder layer, torch vs kd
#   bench/gpu/run_h200.sh --sections model       # a real model end to end: transformers' Llama-3-8B and
#                 Qwen2.5-7B (all layers, random weights), stock vs fused torch vs kdispatch ops
#                 (bench/gpu/e2e_model.py; KD_MODELS=llama3-8b,qwen2.5-7b, KD_MODEL_LAYERS=0: all)
#
# The GEMM grid (gemm-tune, gemm-bench): bf16, (N,K) in $KD_GEMM_NK x M in
# $KD_GEMM_M (defaults: the 8 weight shapes x M 1..8192 of bench_gpu.py). e2e
# runs bench/gpu/e2e_decode.py four ways: (a) Llama-3-8B dims on the committed
# configs, (b) Qwen2.5-0.5B dims on them too (no committed row covers its
# shapes: get_default), (c) `kdispatch tune` of Qwen's GEMM and norm shapes at
# batch 1, 8, 64 into a scratch dir, (d) Qwen again on that dir. The silu
# grid: $KD_SILU_DTYPES x d in $KD_SILU_DS x tokens in $KD_SILU_TOKENS
# (defaults bf16,fp16 x 4864,14336,18944 x 1,8,64,512,4096,16384).
#
# The device machine (Ubuntu 24.04, nvcc 13, CMake 4, torch + Triton in
# python3) reaches no package registry and starts bare on every call. What it
# needs travels with the call:
#   .deps/   (git-ignored; carry it) the Debian 12 .debs of simdjson, xxHash,
#            doctest, DLPack and CLI11 (`--fetch-deps` fills it where apt
#            works), unpacked into /tmp/deps (never into /), plus the peers'
#            Triton kernels h200_kernels.py (a copy of ../shared/peers/), and
#            sglang_moe/ (../shared/peers/sglang_moe with SGLang's fused-MoE
#            configs in configs/: the moe sections' peer).
#   .h200/   (git-ignored; carry it when it exists) what earlier calls
#            returned under $OUT, copied in as is: configs.tar (tuned files),
#            bench_gpu.json and check.json (partial results). tune, bench and
#            check unpack configs.tar over configs/ and skip the grid points
#            those files already hold. Likewise gemm_configs.tar (unpacked by
#            gemm-tune, gemm-bench and e2e; configs.tar too by gemm-bench and
#            e2e), bench_gemm.json (gemm-bench), e2e.json and
#            e2e_qwen_configs.tar (e2e), bench_silu.json (silu).
# Every section builds what it needs first (build/gpu, 1-2 min on 16 cores;
# nothing when the machine is still warm), stops starting new work when its
# time budget (KD_SECTION_S, default 540 s) runs out, and prints a last line
# "::: <section>: complete" or "::: <section>: INCOMPLETE (...)": then copy
# the returned files into .h200/ and run the same section again.
#
# $OUT (default ./out) gets at most 6 files per section, no folders:
#   build  build.log
#   test   build.log gpu_tests.log host_tests.log torch_ops.log
#   silu-test   build.log silu_tests.log
#   tune   build.log configs.tar tune.log validate.log
#   bench  build.log bench_gpu.json bench.log h200.md
#   check  build.log check.json check.log
#   norm-peers  build.log norm_bench.csv norm_bench_err.txt peers.log peers_baseline.json compare.txt
#   gemm-tune   build.log gemm_configs.tar gemm_tune.log gemm_validate.log
#   gemm-probe  gemm_fixed_pdl{1,0}.{log,csv} gemm_probe.log gemm_probe.csv gemm_ncu.txt
#   gemm-host   build.log gemm_host.log gemm_host.csv (+ gemm_sweep.csv gemm_sweep.log h200_gemm_sweep.md)
#   gemm-bench  build.log bench_gemm.json bench_gemm.log h200_gemm.md
#   e2e         build.log e2e.json e2e.md e2e.log e2e_tune.log e2e_qwen_configs.tar
#   silu        build.log bench_silu.json bench_silu.log h200_silu.md
#   moe-w8a8    build.log moe_w8a8_decode.json moe_w8a8_prefill.json moe_w8a8_fused.json moe_w8a8.log
#   torch       build.log torch_native.log torch_op_host.json torch_op_host.md torch_host.log
#   model       build.log e2e_model.json e2e_model.md e2e_model.log
#   shards      build.log shards.json shards.log shards_dirs.tar
# KD_COMMIT names the commit in h200.md / h200_gemm.md / h200_silu.md (the device has no .git).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SECTIONS=build
OUT=${OUT:-$ROOT/out}
RESUME=${KD_RESUME:-$ROOT/.h200}
SECTION_S=${KD_SECTION_S:-540}
BUDGET_MS=${KD_TUNE_BUDGET_MS:-250}
TOKENS=${KD_TOKENS:-1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384,32768}
HIDDENS=${KD_HIDDENS:-1024,2048,2560,3584,4096,5120,7168,8192,12288,16384}
DTYPES=${KD_DTYPES:-bf16,fp16}
NORM_OPS=${KD_NORM_OPS:-rmsnorm,fused_add_rmsnorm}
# The tune section's ops: the norms on $KD_TOKENS x $KD_HIDDENS, silu_and_mul
# on $KD_TOKENS x $KD_SILU_DS.
TUNE_OPS=${KD_TUNE_OPS:-$NORM_OPS,silu_and_mul}
TUNE_BACKEND=${KD_TUNE_BACKEND:-cuda}  # cpu: a dry run of the tune section's logic on a machine without a GPU
GEMM_NK=${KD_GEMM_NK:-6144x4096,4096x4096,28672x4096,4096x14336,1280x8192,8192x1024,7168x8192,8192x3584}
GEMM_M=${KD_GEMM_M:-1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192}
# 1 s, 9 reps and all 162 skinny_mma points per shape: every decode point
# (~190 candidates) is timed, and the median of 9 cold reps separates
# points 2% apart.
GEMM_BUDGET_MS=${KD_GEMM_TUNE_BUDGET_MS:-1000}
GEMM_REPS=${KD_GEMM_TUNE_REPS:-9}
# `kdispatch tune` skips shapes over --max-flops (default 2e9, sized for CPUs: it
# would skip most of this grid) and over --mem-gib of scratch (default 1 GiB:
# M=8192 x 28672x4096 needs ~0.75 GiB before any split-K workspace).
GEMM_MAX_FLOPS=${KD_GEMM_MAX_FLOPS:-1e13}
GEMM_MEM_GIB=${KD_GEMM_TUNE_MEM_GIB:-16}
E2E_LAYERS=${KD_E2E_LAYERS:-2}
E2E_BATCHES=${KD_E2E_BATCHES:-1,8,64}
E2E_TUNE_BUDGET_MS=${KD_E2E_TUNE_BUDGET_MS:-300}
E2E_DEVICE=${KD_E2E_DEVICE:-cuda}  # cpu (with KD_TUNE_BACKEND=cpu): a dry run of the e2e section's logic without a GPU
# fp8 (issue 21): layouts, (N, K) pairs and Ms of fp8-tune and fp8-bench
FP8_LAYOUTS=${KD_FP8_LAYOUTS:-tensor,rowwise,block}
FP8_NK=${KD_FP8_NK:-6144x4096,4096x4096,28672x4096,4096x14336,2112x7168,7168x16384}
FP8_M=${KD_FP8_M:-1,16,64,1024}
FP8_TUNE_M=${KD_FP8_TUNE_M:-1,2,4,8,16}
FP8_BUDGET_MS=${KD_FP8_TUNE_BUDGET_MS:-800}  # KD_FP8_TUNE_FLAGS=--no-resume: tune rows configs/ has again
SILU_DTYPES=${KD_SILU_DTYPES:-bf16,fp16}
SILU_DS=${KD_SILU_DS:-4864,14336,18944}
SILU_TOKENS=${KD_SILU_TOKENS:-1,8,64,512,4096,16384}
while [ $# -gt 0 ]; do
  case "$1" in
    --sections) SECTIONS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --fetch-deps)
      mkdir -p .deps && (cd .deps && apt-get download libsimdjson-dev libsimdjson14 doctest-dev libcli11-dev \
        libdlpack-dev libxxhash-dev libxxhash0) && cp ../shared/peers/h200_kernels.py ../shared/peers/h200_baseline.py .deps/ &&
        rm -rf .deps/sglang_moe && cp -r ../shared/peers/sglang_moe .deps/sglang_moe &&
        cp -r ../shared/data/sglang-configs/fused_moe_triton .deps/sglang_moe/configs
      exit $? ;;
    *) echo "usage: $0 [--sections build,test,moe,moe-w8a8,moe-profile,moe-model,fp8-test,shards,fp8-tune,fp8-bench,fp8-profile,fp8-model,silu-test,tune,bench,check,norm-peers,gemm-tune,gemm-bench,gemm-test,wgmma-harness,gemm-host,gemm-probe,e2e,silu,torch,anymodel,fit,committed,large,pip,nvml,graph,tunemodel,compile,model] [--out DIR] | --fetch-deps" >&2
       exit 2 ;;
  esac
done
mkdir -p "$OUT"
has() { [[ ",$SECTIONS," == *",$1,"* ]]; }
t0=$(date +%s)
deadline=$((t0 + SECTION_S))
left() { echo $((deadline - $(date +%s))); }
stamp() { echo "::: [$(($(date +%s) - t0)) s] $*"; }
PY=python3
[ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
export PYTHONUNBUFFERED=1
status=0

# ---- peers' Triton kernels: .deps/ (carried), else the shared folder beside the repo
PEERS=${KDISPATCH_PEERS_DIR:-}
if [ -z "$PEERS" ]; then
  for d in "$ROOT/.deps" "$ROOT/../shared/peers"; do [ -f "$d/h200_kernels.py" ] && PEERS=$d && break; done
fi

# ---- dependencies: the carried .debs, unpacked into /tmp/deps (never into /)
DEPS=/tmp/deps
ARCHLIB=$DEPS/usr/lib/x86_64-linux-gnu
if [ ! -d "$DEPS/usr" ]; then
  if ! ls .deps/*.deb >/dev/null 2>&1; then
    echo "no .deps/*.deb here: carry .deps (bench/gpu/run_h200.sh --fetch-deps fills it where apt works)" >&2
    exit 2
  fi
  mkdir -p "$DEPS"
  for f in .deps/*.deb; do dpkg -x "$f" "$DEPS"; done
  # libxxhash.pc says prefix=/usr: point it at the unpacked tree.
  sed -i "s|^prefix=/usr\$|prefix=$DEPS/usr|" "$ARCHLIB/pkgconfig/libxxhash.pc"
fi
export PKG_CONFIG_PATH="$ARCHLIB/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$ARCHLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -d /usr/local/cuda/bin ] && export PATH=/usr/local/cuda/bin:$PATH
BUILD=$ROOT/build/gpu
LIB=$BUILD/libkdispatch.so

# ---- resume: the tuned files an earlier call returned, over configs/
if [ -f "$RESUME/configs.tar" ] && { has tune || has bench || has check || has gemm-bench || has e2e; }; then
  tar xf "$RESUME/configs.tar" -C "$ROOT" && stamp "resume: $(tar tf "$RESUME/configs.tar" | grep -c '\.json$') tuned file(s) from $RESUME/configs.tar over configs/"
fi
# ---- and the tuned GEMM files (gemm-tune's configs.tar)
if [ -f "$RESUME/gemm_configs.tar" ] && { has gemm-tune || has gemm-bench || has gemm-host || has check || has e2e; }; then
  tar xf "$RESUME/gemm_configs.tar" -C "$ROOT" && stamp "resume: $(tar tf "$RESUME/gemm_configs.tar" | grep -c '\.json$') tuned GEMM file(s) from $RESUME/gemm_configs.tar over configs/"
fi

# ensure_build <target...>: configure once, then build the targets (a no-op when current).
ensure_build() {
  local s; s=$(date +%s)
  if [ ! -f "$BUILD/build.ninja" ]; then
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DKDISPATCH_CUDA=ON -DKDISPATCH_HIP=OFF -DKDISPATCH_OPENBLAS=OFF -DKDISPATCH_PYTHON=OFF \
      -DKDISPATCH_BUILD_BENCH=OFF -DKDISPATCH_BUILD_TESTS=ON -DKDISPATCH_BUILD_CLI=ON \
      -DKDISPATCH_TEST_OPS="$([ "${KD_TEST_OPS:-0}" = 1 ] && echo ON || echo OFF)" \
      -DCMAKE_PREFIX_PATH="$DEPS/usr;$ARCHLIB/cmake;$DEPS/usr/share/cmake" \
      -DCMAKE_INCLUDE_PATH="$DEPS/usr/include" >>"$OUT/build.log" 2>&1 ||
      { tail -30 "$OUT/build.log"; return 1; }
  fi
  cmake --build "$BUILD" -j "$(nproc)" --target "$@" >>"$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | head -30; return 1; }
  stamp "build: $* current ($(($(date +%s) - s)) s; $(grep -c 'Building CUDA' "$OUT/build.log") CUDA objects compiled)"
}

# ================================================================ build
if has build; then
  stamp "build: configure + every target (CUDA sm_90a + compute_90 PTX)"
  ensure_build all || { echo "::: build: FAILED (build.log)"; exit 1; }
  grep -q -i "warning" "$OUT/build.log" && echo "build: $(grep -c -i warning "$OUT/build.log") warning line(s) in build.log"
  echo "::: build: complete"
fi

# ================================================================ test
# KD_TEST_PARTS (default gpu,host,torch): the parts of the section to run.
TEST_PARTS=${KD_TEST_PARTS:-gpu,host,torch}
part() { [[ ",$TEST_PARTS," == *",$1,"* ]]; }
if has test; then
  ensure_build kdispatch_gpu_tests kdispatch_tests kdispatch || { echo "::: test: FAILED to build (build.log)"; exit 1; }
fi
if has test && part gpu; then
  stamp "test: GPU tests (every variant and point against float64, device compare, sync tuning; silu-test: the rest)"
  t=$(($(left) - 60)); [ $t -lt 60 ] && t=60  # timeout 0 would mean no limit, a negative one an error
  # KD_GPU_TEST_CASES: a doctest -tc filter instead (e.g. 'gpu fused_moe*')
  if [ -n "${KD_GPU_TEST_CASES:-}" ]; then filter=(-tc="$KD_GPU_TEST_CASES"); else filter=(-tce='gpu silu*,gpu fp8*'); fi
  KDISPATCH_CACHE_DIR=/tmp/kd-no-cache timeout $t "$BUILD/tests/gpu/kdispatch_gpu_tests" "${filter[@]}" \
    >"$OUT/gpu_tests.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "kdispatch_gpu_tests rc=$rc: $(grep -E '^\[doctest\] (test cases|assertions)|skipped' "$OUT/gpu_tests.log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || grep -E "ERROR|FAILED|error" "$OUT/gpu_tests.log" | head -20
fi
if has test && part host; then
  stamp "test: host-side GPU and committed-configs tests"
  KDISPATCH_CACHE_DIR=/tmp/kd-no-cache "$BUILD/tests/kdispatch_tests" -tc='gpu host*,configs*' >"$OUT/host_tests.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "kdispatch_tests (gpu host, configs) rc=$rc: $(grep -E '^\[doctest\] test cases' "$OUT/host_tests.log")"
fi
if has test && part torch; then
  stamp "test: torch custom ops on CUDA tensors (streams, graph capture)"
  (cd integrations/python/tests && PYTHONPATH="$ROOT/integrations/python" KDISPATCH_LIBRARY="$LIB" \
    "$PY" -m unittest -v test_torch_ops) >"$OUT/torch_ops.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "test_torch_ops rc=$rc: $(tail -3 "$OUT/torch_ops.log" | tr '\n' ' ')"
fi
if has test; then
  [ $status -eq 0 ] && echo "::: test: complete ($TEST_PARTS)" || echo "::: test: FAILED (see the logs)"
fi

# ================================================================ fp8-test
if has fp8-test; then
  ensure_build kdispatch_gpu_tests kdispatch || { echo "::: fp8-test: FAILED to build (build.log)"; exit 1; }
  stamp "fp8-test: the fp8 GEMMs (every variant, point and cuBLASLt candidate vs float64) and quantisation (bit for bit)"
  t=$(($(left) - 30)); [ $t -lt 60 ] && t=60
  # KD_FP8_TEST_CASES: a doctest -tc filter (comma list) instead of every fp8 case (the whole set is ~400 s)
  KDISPATCH_CACHE_DIR=/tmp/kd-no-cache timeout $t "$BUILD/tests/gpu/kdispatch_gpu_tests" -tc="${KD_FP8_TEST_CASES:-gpu fp8*}" \
    >"$OUT/fp8_tests.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "kdispatch_gpu_tests (fp8) rc=$rc: $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/fp8_tests.log" | tr '\n' ' ')"
  grep -E "runs checked|declined at launch|accum=fast: |accum=fast pretune|cuBLASLt rows: " "$OUT/fp8_tests.log" | sort | uniq -c | head -30
  [ $rc -eq 0 ] || grep -E "ERROR|FAILED|error|CHECK|with expansion|got " "$OUT/fp8_tests.log" | head -40
  [ $rc -eq 0 ] && echo "::: fp8-test: complete" || echo "::: fp8-test: FAILED (fp8_tests.log)"
fi

# ensure_torch: the Python package and libkdispatch_torch in build/gpu for
# this machine's torch ($PY): the same build dir, reconfigured (the CUDA
# kernels are not rebuilt); the package is staged in build/gpu/python.
ensure_torch() {
  ensure_build kdispatch || return 1
  local s; s=$(date +%s)
  cmake -S . -B "$BUILD" -DKDISPATCH_PYTHON=AUTO -DKDISPATCH_TORCH=ON -DKDISPATCH_TORCH_PYTHON="$PY" \
    -DPython3_EXECUTABLE="$PY" >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; return 1; }
  cmake --build "$BUILD" -j "$(nproc)" --target kdispatch_python_package >>"$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | head -30; return 1; }
  stamp "build: libkdispatch_torch for $("$PY" -c 'import torch; print(torch.__version__)') ($(($(date +%s) - s)) s): $(grep 'kdispatch torch ops:' "$OUT/build.log" | tail -1)"
}

# ================================================================ moe
# fused_moe (issue 35): kdispatch's whole op beside SGLang's Triton
# fused_moe_kernel on SGLang's H200 configs (bench/gpu/bench_moe.py ->
# moe_bench.json). The peer's harness and configs: ../shared/peers/sglang_moe
# and ../shared/data/sglang-configs/fused_moe_triton, or copies carried in
# .deps/sglang_moe (its configs/ beside it).
moe_peers() {
  MOE_PEERS=$ROOT/../shared/peers/sglang_moe
  MOE_CFG=$ROOT/../shared/data/sglang-configs/fused_moe_triton
  [ -f "$MOE_PEERS/peer_moe.py" ] || { MOE_PEERS=$ROOT/.deps/sglang_moe; MOE_CFG=$ROOT/.deps/sglang_moe/configs; }
}
if has moe; then
  ensure_torch || { echo "::: moe: FAILED to build (build.log)"; exit 1; }
  moe_peers
  budget=$(($(left) - 20))
  # KD_MOE_CASES: case-name substrings (comma list; e.g. fp8-block); KD_MOE_ROUTING: uniform,skewed;
  # KD_MOE_ROUNDS (5); KD_MOE_VARIANTS: fused_moe variants also timed, each forced (e.g.
  # fused_moe_bf16__split,fused_moe_bf16__experts); KD_MOE_MODE=gemm: moe_gemm's two calls against the
  # peer's two launches on the same aligned ids (moe_gemm_bench.json).
  stamp "moe: bench_moe.py, M ${KD_MOE_M:-1,4,16,64} (${budget} s; peer from $MOE_PEERS)"
  PYTHONPATH="$BUILD/python" KDISPATCH_TORCH_OPS=native KDISPATCH_CACHE_DIR=/tmp/kd-no-cache \
    timeout "$budget" "$PY" bench/gpu/bench_moe.py --lib "$LIB" --peers "$MOE_PEERS" --configs "$MOE_CFG" \
    --m "${KD_MOE_M:-1,4,16,64}" --budget-s $((budget - 30)) --out "$OUT" --commit "${KD_COMMIT:-unknown}" \
    --cases "${KD_MOE_CASES:-}" --routing "${KD_MOE_ROUTING:-uniform}" --rounds "${KD_MOE_ROUNDS:-5}" \
    --variants "${KD_MOE_VARIANTS:-}" --mode "${KD_MOE_MODE:-fused}" >"$OUT/bench_moe.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  grep -E '"case"|Error|error' "$OUT/bench_moe.log" | tail -40
  [ $rc -eq 0 ] && echo "::: moe: complete (moe_bench.json or moe_gemm_bench.json)" || echo "::: moe: rc=$rc (bench_moe.log)"
fi

# ================================================================ moe-w8a8
# Issue 36's per-tensor and per-channel fp8 (fp8_w8a8) readings in one section, each part in
# its share of the budget: moe_gemm at decode M (KD_W8A8_DECODE_M, 1,4,16,64,256; 45 %), at
# prefill M (KD_W8A8_PREFILL_M, 1024,4096; 35 %), and fused_moe (KD_W8A8_FUSED_M, 1,16,64).
# Cases fp8-tensor,fp8-channel (KD_MOE_CASES), KD_MOE_ROUNDS (5). Writes
# moe_w8a8_{decode,prefill,fused}.json and moe_w8a8.log.
if has moe-w8a8; then
  ensure_torch || { echo "::: moe-w8a8: FAILED to build (build.log)"; exit 1; }
  moe_peers
  total=$(($(left) - 20)) w8a8_ok=1
  for part in decode:45:gemm:"${KD_W8A8_DECODE_M:-1,4,16,64,256}" prefill:35:gemm:"${KD_W8A8_PREFILL_M:-1024,4096}" \
              fused:100:fused:"${KD_W8A8_FUSED_M:-1,16,64}"; do
    IFS=: read -r name pct mode ms <<<"$part"
    budget=$((total * pct / 100)); [ "$budget" -gt $(($(left) - 10)) ] && budget=$(($(left) - 10))
    [ "$budget" -lt 40 ] && { echo "::: moe-w8a8: no time left for $name"; w8a8_ok=0; continue; }
    stamp "moe-w8a8: $name, moe mode $mode, M $ms (${budget} s)"
    rm -rf "/tmp/kd-w8a8-$name" && mkdir -p "/tmp/kd-w8a8-$name"
    PYTHONPATH="$BUILD/python" KDISPATCH_TORCH_OPS=native KDISPATCH_CACHE_DIR=/tmp/kd-no-cache \
      timeout "$budget" "$PY" bench/gpu/bench_moe.py --lib "$LIB" --peers "$MOE_PEERS" --configs "$MOE_CFG" \
      --m "$ms" --budget-s $((budget - 25)) --out "/tmp/kd-w8a8-$name" --commit "${KD_COMMIT:-unknown}" \
      --cases "${KD_MOE_CASES:-fp8-tensor,fp8-channel}" --rounds "${KD_MOE_ROUNDS:-5}" --mode "$mode" \
      >>"$OUT/moe_w8a8.log" 2>&1 || w8a8_ok=0
    for f in /tmp/kd-w8a8-$name/moe_gemm_bench.json /tmp/kd-w8a8-$name/moe_bench.json; do
      [ -f "$f" ] && cp "$f" "$OUT/moe_w8a8_$name.json"
    done
    grep -E '"case"|Error' "$OUT/moe_w8a8.log" | tail -12
  done
  [ $w8a8_ok -eq 1 ] && echo "::: moe-w8a8: complete (moe_w8a8_*.json)" ||
    { status=1; echo "::: moe-w8a8: INCOMPLETE (moe_w8a8.log)"; }
fi

# ================================================================ moe-profile
# ncu on fused_moe's GEMM kernels (moe_*mma*, moe_*split*) at one point of bench_moe.py:
# KD_MOE_PROFILE_CASE (a case-name substring, default "Qwen3-30B-A3B TP1 bf16"), KD_MOE_PROFILE_M (16),
# one routing set, no peer; SpeedOfLight, memory, occupancy and warp stalls into moe_ncu.txt.
# KD_MOE_MODE=gemm: moe_gemm's two calls (bench_moe.py --mode gemm, which takes its sort's block
# size from the peer's configs: the peer's harness loads, its kernels are not profiled unless
# KD_MOE_PROFILE_KERNELS names them), e.g. KD_MOE_PROFILE_KERNELS='moe_gemm_kernel|moe_quant'.
if has moe-profile; then
  ensure_torch || { echo "::: moe-profile: FAILED to build (build.log)"; exit 1; }
  prof_peer=(--no-peer)
  if [ "${KD_MOE_MODE:-fused}" = gemm ]; then
    peers=$ROOT/../shared/peers/sglang_moe cfgs=$ROOT/../shared/data/sglang-configs/fused_moe_triton
    [ -f "$peers/peer_moe.py" ] || { peers=$ROOT/.deps/sglang_moe; cfgs=$ROOT/.deps/sglang_moe/configs; }
    prof_peer=(--peers "$peers" --configs "$cfgs" --mode gemm)
  fi
  if command -v ncu >/dev/null 2>&1; then
    : >"$OUT/moe_ncu.txt"
    for pm in $(echo "${KD_MOE_PROFILE_M:-16}" | tr ',' ' '); do  # a comma list: one ncu run per M
      # The time left, checked per M: `timeout 0` would run ncu unbounded, a negative one not at all.
      t=$(($(left) - 5))
      [ "$t" -gt 0 ] || { echo "::: moe-profile: no time left for M $pm (KD_SECTION_S)"; status=1; break; }
      stamp "moe-profile: ncu at ${KD_MOE_PROFILE_CASE:-Qwen3-30B-A3B TP1 bf16}, M $pm"
      echo "=== M $pm" >>"$OUT/moe_ncu.txt"
      PYTHONPATH="$BUILD/python" KDISPATCH_TORCH_OPS=native KDISPATCH_CACHE_DIR=/tmp/kd-no-cache \
        timeout "$t" ncu --clock-control none --cache-control all -k "regex:${KD_MOE_PROFILE_KERNELS:-moe_.*(mma|split|sort|reduce|quant)}" \
        --launch-count "${KD_MOE_PROFILE_LAUNCHES:-8}" --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
        "$PY" bench/gpu/bench_moe.py --lib "$LIB" "${prof_peer[@]}" --m "$pm" --sets 1 --rounds 1 \
        --cases "${KD_MOE_PROFILE_CASE:-Qwen3-30B-A3B TP1 bf16}" --budget-s 200 --out /tmp >>"$OUT/moe_ncu.txt" 2>&1
      echo "ncu rc=$?"
    done
    grep -E "^=== M|moe_.*kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Stall|Issue Slots Busy|No Eligible|L1/TEX Hit|L2 Hit" "$OUT/moe_ncu.txt" | head -200
    echo "::: moe-profile: complete (moe_ncu.txt)"
  else
    echo "::: moe-profile: no ncu here"
  fi
fi

# ================================================================ moe-model
# Issue 35 item 8: transformers' Qwen3-MoE (Qwen3-30B-A3B dims, KD_MOE_LAYERS of its 48 layers,
# random bf16 weights), its experts by grouped_mm / eager / kdispatch's fused_moe, decode in CUDA
# graphs and eager at batch 1, 8, 64 (KD_MOE_BATCHES; '' skips decode), prefill 4 x 512 (issue 36;
# KD_MOE_PREFILL, '' skips it), and the logits of its first 4 layers against fp32 (e2e_moe.json).
if has moe-model; then
  ensure_torch || { echo "::: moe-model: FAILED to build (build.log)"; exit 1; }
  budget=$(($(left) - 20))
  stamp "moe-model: bench/gpu/e2e_moe.py, ${KD_MOE_LAYERS:-16} layers (${budget} s)"
  PYTHONPATH="$BUILD/python" KDISPATCH_TORCH_OPS=native KDISPATCH_CACHE_DIR=/tmp/kd-no-cache \
    timeout "$budget" "$PY" bench/gpu/e2e_moe.py --out "$OUT" --layers "${KD_MOE_LAYERS:-16}" \
    --batches "${KD_MOE_BATCHES-1,8,64}" --prefill "${KD_MOE_PREFILL-4x512}" \
    --budget-s $((budget - 60)) >"$OUT/e2e_moe.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  tail -12 "$OUT/e2e_moe.log"
  [ $rc -eq 0 ] && echo "::: moe-model: complete (e2e_moe.json)" || echo "::: moe-model: rc=$rc (e2e_moe.log)"
fi

# ================================================================ fp8-tune
# The fp8 GEMM rows at decode Ms (FP8_TUNE_M) for FP8_NK in each layout, into
# configs/cuda/gemm_fp8_<layout> (resumes: shapes already there are skipped).
if has fp8-tune; then
  ensure_build kdispatch kdispatch_cli || ensure_build kdispatch || { echo "::: fp8-tune: FAILED to build"; exit 1; }
  [ -x "$BUILD/kdispatch" ] || ensure_build all
  grid=$OUT/fp8_shapes.csv
  echo "M,N,K" >"$grid"
  for nk in ${FP8_NK//,/ }; do for m in ${FP8_TUNE_M//,/ }; do echo "$m,${nk%x*},${nk#*x}" >>"$grid"; done; done
  for lay in ${FP8_LAYOUTS//,/ }; do
    budget=$(($(left) - 30)); [ $budget -lt 20 ] && { echo "fp8-tune: no time left for $lay"; break; }
    stamp "fp8-tune: gemm_fp8_$lay ($(($(wc -l <"$grid") - 1)) shapes, ${FP8_BUDGET_MS} ms each, ${budget} s left)"
    KDISPATCH_LOG_LEVEL=info timeout "$budget" "$BUILD/kdispatch" tune --backend cuda --op "gemm_fp8_$lay" \
      --dtype fp8_e4m3fn --shapes "$grid" --emit "$ROOT/configs" --budget-ms "$FP8_BUDGET_MS" --reps 9 \
      --max-candidates 192 --max-flops 1e13 --mem-gib 8 ${KD_FP8_TUNE_FLAGS:-} >>"$OUT/fp8_tune.log" 2>&1
    echo "tune gemm_fp8_$lay rc=$?: $(grep -E '^[0-9]+ .* shapes: ' "$OUT/fp8_tune.log" | tail -1)"
  done
  (cd "$ROOT" && find configs/cuda -path '*gemm_fp8*' -name '*.json' | sort | tar cf "$OUT/fp8_configs.tar" -T -)
  stamp "fp8-tune: $(tar tf "$OUT/fp8_configs.tar" | wc -l) file(s) in fp8_configs.tar"
fi

# ================================================================ fp8-bench
if has fp8-bench; then
  [ -f "$RESUME/fp8_configs.tar" ] && tar xf "$RESUME/fp8_configs.tar" -C "$ROOT"
  ensure_torch || { echo "::: fp8-bench: FAILED to build (build.log)"; exit 1; }
  ensure_build kdispatch_bench_read || true
  # SGLang's H200 block-fp8 tables for the Triton peer: ../shared, or a copy carried in .deps/sglang-quant
  SGL_QUANT=$ROOT/../shared/data/sglang-configs/quantization
  [ -d "$SGL_QUANT" ] || SGL_QUANT=$ROOT/.deps/sglang-quant
  budget=$(($(left) - 20))
  stamp "fp8-bench: layouts $FP8_LAYOUTS, N x K $FP8_NK, M $FP8_M (${budget} s)"
  PYTHONPATH="$BUILD/python" KDISPATCH_TORCH_OPS=native KDISPATCH_CACHE_DIR=/tmp/kd-no-cache \
    "$PY" bench/gpu/bench_fp8.py --lib "$LIB" --read-lib "$BUILD/bench/gpu/libkdispatch_bench_read.so" \
    --layouts "$FP8_LAYOUTS" --nk "$FP8_NK" --m "$FP8_M" --grid "${KD_FP8_GRID:-nk}" --budget-s "$budget" --out "$OUT" \
    --commit "${KD_COMMIT:-unknown}" --sglang-configs "$SGL_QUANT" >"$OUT/bench_fp8.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  grep -E "^- |Error|error" "$OUT/bench_fp8.log" | tail -8
  [ $rc -eq 0 ] && echo "::: fp8-bench: complete (h200_fp8.md)" || echo "::: fp8-bench: rc=$rc (bench_fp8.log)"
fi

# ================================================================ fp8-profile
# ncu on the fp8 decode kernel (skinny_mma) of the table's choice at
# KD_FP8_PROFILE (layout:NxK:M,...; two launches per point, in order): where
# the block layout's time goes against per-tensor on the same weight.
if has fp8-profile; then
  ensure_torch || { echo "::: fp8-profile: FAILED to build (build.log)"; exit 1; }
  PROF=${KD_FP8_PROFILE:-tensor:7168x16384:16,block:7168x16384:16,tensor:7168x16384:1,block:7168x16384:1}
  if command -v ncu >/dev/null 2>&1; then
    stamp "fp8-profile: ncu at $PROF"
    PYTHONPATH="$BUILD/python" KDISPATCH_TORCH_OPS=native KDISPATCH_CACHE_DIR=/tmp/kd-no-cache \
      timeout $(($(left) - 5)) ncu --clock-control none --cache-control all -k regex:skinny_mma_kernel \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
      --section WarpStateStats --section SchedulerStats \
      "$PY" bench/gpu/fp8_profile.py --lib "$LIB" --points "$PROF" >"$OUT/fp8_ncu.txt" 2>&1
    echo "ncu rc=$?"
    grep -E "^point |skinny_mma_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Stall|Issue Slots Busy|No Eligible" "$OUT/fp8_ncu.txt" | head -90
    echo "::: fp8-profile: complete (fp8_ncu.txt)"
  else
    echo "::: fp8-profile: no ncu here"
  fi
fi

# ================================================================ torch
if has torch; then
  ensure_torch || { echo "::: torch: FAILED to build (build.log)"; exit 1; }
  stamp "torch: native ops tests (opcheck, torch.compile, CUDA streams, devices, graph capture, reduce-overhead)"
  (cd integrations/python/tests && PYTHONPATH="$BUILD/python" KDISPATCH_TORCH_OPS=native \
    KDISPATCH_CACHE_DIR=/tmp/kd-no-cache "$PY" -m unittest -v test_torch_ops) >"$OUT/torch_native.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "test_torch_ops (native) rc=$rc: $(tail -3 "$OUT/torch_native.log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || grep -E "^(FAIL|ERROR):|Error" "$OUT/torch_native.log" | head -20
  stamp "torch: host cost per eager call (25 interleaved rounds x 1000 calls, one core)"
  PYTHONPATH="$BUILD/python" "$PY" bench/tools/torch_op_host.py --device cuda --out "$OUT" >"$OUT/torch_host.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  tail -8 "$OUT/torch_host.log"
  [ $status -eq 0 ] && echo "::: torch: complete" || echo "::: torch: FAILED (see the logs)"
fi

# ================================================================ anymodel / fit
# anymodel: issue 32's "any model" benchmark (bench/gpu/bench_any_model.py):
# the floor's test first (TorchFloorCudaTest: kernel names under
# torch.profiler and bitwise equality against F.linear / torch._scaled_mm),
# then kdispatch vs torch on 14 projections of 5 model families with no
# committed rows, bf16 and the fp8 layouts (KD_ANY_KINDS), cold and in CUDA
# graphs, 5 interleaved rounds with the A/A controls; resumes from
# .h200/any_model.json. fit: the synthetic grid (bench/gpu/fit_grid.csv) at
# M <= 16, cold and graph modes, kd vs the floor vs torch; resumes from
# .h200/fit.json (then `fit_defaults.py fit.json --apply
# kernels/cuda/default_fit.hpp`). committed: the same harness on the shapes
# configs/cuda has rows for, served from them (committed.json).
for sec in anymodel fit committed large; do
  has $sec || continue
  ensure_torch || { echo "::: $sec: FAILED to build (build.log)"; exit 1; }
  if [ $sec = anymodel ] && [ "${KD_FLOOR_TEST:-1}" = 1 ]; then
    stamp "anymodel: the floor's test (TorchFloorCudaTest)"
    (cd integrations/python/tests && PYTHONPATH="$BUILD/python" KDISPATCH_TORCH_OPS=native \
      KDISPATCH_CACHE_DIR=/tmp/kd-no-cache "$PY" -m unittest -v test_torch_ops.TorchFloorCudaTest) >"$OUT/floor_test.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "TorchFloorCudaTest rc=$rc: $(tail -3 "$OUT/floor_test.log" | tr '\n' ' ')"
    [ $rc -eq 0 ] || grep -E "^(FAIL|ERROR):|Error|AssertionError" "$OUT/floor_test.log" | head -20
  fi
  f=$sec.json; [ $sec = anymodel ] && f=any_model.json
  budget=$(($(left) - 20))
  stamp "$sec: ${budget} s"
  grid=bench; rule=; [ $sec = fit ] && { grid=fit; rule=everywhere; }  # fit: time the rule in every cell
  [ $sec = committed ] && grid=committed
  kinds=${KD_ANY_KINDS:-bf16,tensor,rowwise,block}; flags=${KD_ANY_FLAGS:-}
  # large: issue 36's milestone, the wgmma family forced (KD_LARGE_FORCE) on 8192^3 and the committed bf16 shapes
  [ $sec = large ] && { grid=large; kinds=bf16; flags="--kd-force ${KD_LARGE_FORCE:-gemm=gemm_bf16__wgmma} $flags"; }
  KDISPATCH_TEST_DEFAULT_RULE=$rule PYTHONPATH="$BUILD/python" KDISPATCH_CACHE_DIR=/tmp/kd-no-cache KDISPATCH_TUNE=off "$PY" bench/gpu/bench_any_model.py \
    --out "$OUT" --grid $grid --kinds "$kinds" --budget-s "$budget" \
    --resume "$RESUME/$f" $flags >"$OUT/$sec.log" 2>&1
  rc=$?
  tail -2 "$OUT/$sec.log"
  [ $rc -eq 0 ] || { status=1; grep -E "Error|Traceback" "$OUT/$sec.log" | head; }
  if grep -q "^COMPLETE" "$OUT/$sec.log"; then echo "::: $sec: complete"; else echo "::: $sec: INCOMPLETE (copy $f into .h200/ and run again)"; fi
done

# ================================================================ pip
# pip: issue 33 on the device: `pip install --no-build-isolation --no-index .`
# (the CUDA build, sm_90a; pybind11 where the machine has it: AUTO) into a
# venv over the machine's torch, then, from outside the tree, the GPU torch
# tests (test_torch_ops, native ops required) and test_installed against the
# installed package (pip.log, pip_tests.log).
if has pip; then
  stamp "pip: pip install . into a venv over $PY's torch"
  venv=/tmp/kd-pip-venv; rm -rf "$venv"
  "$PY" -m venv --system-site-packages "$venv" >>"$OUT/pip.log" 2>&1
  # a venv over a venv sees the base interpreter's packages, not its parent's: a .pth adds $PY's (torch, numpy)
  "$PY" -c "import site; print(site.getsitepackages()[0])" >"$("$venv/bin/python" -c "import site; print(site.getsitepackages()[0])")/kd-parent-venv.pth"
  s0=$(date +%s)
  KDISPATCH_CMAKE_ARGS="-DKDISPATCH_PYTHON=AUTO -DKDISPATCH_HIP=OFF -DKDISPATCH_CUDA=ON -DKDISPATCH_OPENBLAS=OFF \
-DCMAKE_PREFIX_PATH=$DEPS/usr;$ARCHLIB/cmake;$DEPS/usr/share/cmake -DCMAKE_INCLUDE_PATH=$DEPS/usr/include" \
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$venv/bin/pip" install --no-build-isolation --no-index ${KD_PIP_FLAGS:-} "$ROOT" >>"$OUT/pip.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || { status=1; tail -30 "$OUT/pip.log"; }
  echo "pip install rc=$rc in $(($(date +%s) - s0)) s"
  if [ $rc -eq 0 ]; then
    (cd /tmp && "$venv/bin/python" -c "import kdispatch, kdispatch.torch_ops as t; print('NATIVE', t.NATIVE, 'BUILT_FOR', t.BUILT_FOR, kdispatch.BACKEND, kdispatch.__file__)" &&
     KDISPATCH_TEST_INSTALLED="$ROOT" KDISPATCH_TORCH_OPS=native KDISPATCH_CACHE_DIR=/tmp/kd-no-cache \
       "$venv/bin/python" -m unittest discover -v -s "$ROOT/integrations/python/tests" -t "$ROOT/integrations/python/tests" \
       -p 'test_[it][no]*.py') >"$OUT/pip_tests.log" 2>&1
    rc=$?; [ $rc -eq 0 ] || status=1
    echo "installed package's tests rc=$rc: $(tail -3 "$OUT/pip_tests.log" | tr '\n' ' ')"
    grep -E "^(FAIL|ERROR):|NATIVE" "$OUT/pip_tests.log" | head -10
  fi
  [ $status -eq 0 ] && echo "::: pip: complete" || echo "::: pip: FAILED (pip.log, pip_tests.log)"
fi

# ================================================================ nvml
# nvml: the tuner's SM clock screen and verify/report on the device: a
# short bf16 GEMM tune (2 shapes; KDISPATCH_LOG_LEVEL=info prints each row
# with the clock's note), `verify` of the rows it wrote against the floor,
# and of one shipped table, and `report` of them (nvml.log, verify.json,
# report.html).
if has nvml; then
  ensure_build kdispatch || { echo "::: nvml: FAILED to build (build.log)"; exit 1; }
  printf 'M,N,K\n1,4608,3584\n16,4608,3584\n' >/tmp/nvml_shapes.csv
  rm -rf /tmp/nvml-emit /tmp/nvml-cache
  KDISPATCH_LOG_LEVEL=info KDISPATCH_CACHE_DIR=/tmp/nvml-cache "$BUILD/kdispatch" tune --backend cuda --op gemm \
    --dtype bf16 --shapes /tmp/nvml_shapes.csv --budget-ms "${KD_NVML_BUDGET_MS:-400}" --emit /tmp/nvml-emit \
    >"$OUT/nvml.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "tune rc=$rc: $(grep -c 'SM clock' "$OUT/nvml.log") line(s) with the clock's note; last: $(grep -o 'SM clock[^;]*' "$OUT/nvml.log" | tail -1)"
  # and one shipped table (Llama-3-70B TP8's down, 14 rows; the any-model run lost 3-6 % to torch on it)
  mkdir -p /tmp/nvml-ship/cuda/gemm && cp "configs/cuda/gemm/N=8192,K=3584,device_name=NVIDIA_H200,dtype=bf16.json" /tmp/nvml-ship/cuda/gemm/
  "$BUILD/kdispatch" verify --configs /tmp/nvml-emit /tmp/nvml-ship --op gemm --cache /tmp/nvml-cache --json \
    >"$OUT/verify.json" 2>>"$OUT/nvml.log"
  echo "verify rc=$?: $(grep -o '"verdict": "[a-z ]*"' "$OUT/verify.json" | sort | uniq -c | tr '\n' ' ')"
  "$BUILD/kdispatch" report /tmp/nvml-emit /tmp/nvml-ship --out "$OUT/report.html" >>"$OUT/nvml.log" 2>&1
  echo "report rc=$?: $(wc -c <"$OUT/report.html" 2>/dev/null) bytes"
  [ $status -eq 0 ] && echo "::: nvml: complete" || echo "::: nvml: FAILED (nvml.log)"
fi

# ================================================================ graph
# graph: issue 32 item 3 on the device: the GPU capture tests (engines'
# global-mode captures beside the background tuner; the tuner's own
# graph-mode confirmation beside an engine's capture in another thread),
# then a short tune whose rows must each say "cold+graph" (graph.log,
# graph_tests.log).
if has graph; then
  ensure_build kdispatch_gpu_tests kdispatch_cli || { echo "::: graph: FAILED to build (build.log)"; exit 1; }
  stamp "graph: the capture tests"
  KDISPATCH_CACHE_DIR=/tmp/kd-no-cache timeout 300 "$BUILD/tests/gpu/kdispatch_gpu_tests" -tc='gpu capture*' -s \
    >"$OUT/graph_tests.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  echo "kdispatch_gpu_tests -tc='gpu capture*' rc=$rc: $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/graph_tests.log" | tr '\n' ' ')"
  grep -E "engine captures|captures,|ERROR|FATAL|: \"why\"" "$OUT/graph_tests.log" | head -12
  stamp "graph: a short tune (3 bf16 GEMM shapes at M 4 and 16)"
  printf 'M,N,K\n4,4608,3584\n16,4608,3584\n16,5120,4096\n4,3072,8192\n' >/tmp/graph_shapes.csv
  rm -rf /tmp/graph-emit
  KDISPATCH_LOG_LEVEL=info KDISPATCH_CACHE_DIR=/tmp/graph-cache "$BUILD/kdispatch" tune --backend cuda --op gemm \
    --dtype bf16 --shapes /tmp/graph_shapes.csv --budget-ms "${KD_GRAPH_BUDGET_MS:-400}" --emit /tmp/graph-emit \
    >"$OUT/graph.log" 2>&1
  rc=$?; [ $rc -eq 0 ] || status=1
  cat /tmp/graph-emit/cuda/gemm/*.json >"$OUT/graph_rows.json" 2>/dev/null
  echo "tune rc=$rc: $(grep -o '"cold+graph"' "$OUT/graph_rows.json" | wc -l) row(s) timed cold+graph, $(grep -o '"cold"' "$OUT/graph_rows.json" | wc -l) cold"
  grep -E "in a graph|default kept|beat" "$OUT/graph.log" | head -12
  [ $status -eq 0 ] && echo "::: graph: complete" || echo "::: graph: FAILED (graph.log, graph_tests.log)"
fi

# ================================================================ tunemodel
# tunemodel: issue 32 item 5's one command, timed: `kdispatch tune --model
# qwen2.5-7b` (KD_TUNE_MODEL; every bf16 GEMM, norm and activation shape at
# the 14 Ms) into $OUT/emit_model.tgz, resuming from .h200/emit_model.tgz
# (copy it back between calls); its progress lines and the wall time per call in
# tunemodel.log. When it is complete, the any-model bench's points of that
# model are timed again served from the emit dir (KDISPATCH_CONFIG_DIRS):
# any_model_tuned.json, resuming from .h200/any_model_tuned.json.
if has tunemodel; then
  ensure_torch || { echo "::: tunemodel: FAILED to build (build.log)"; exit 1; }
  ensure_build kdispatch_cli || { echo "::: tunemodel: FAILED to build (build.log)"; exit 1; }
  em=/tmp/emit_model; rm -rf "$em"; mkdir -p "$em"
  [ -f "$RESUME/emit_model.tgz" ] && tar xzf "$RESUME/emit_model.tgz" -C "$em"
  model=${KD_TUNE_MODEL:-qwen2.5-7b}
  budget=$(($(left) - 40))
  stamp "tunemodel: tune --model $model ($budget s)"
  s0=$(date +%s)
  KDISPATCH_CACHE_DIR=/tmp/kd-no-cache timeout "$budget" "$BUILD/kdispatch" tune --model "$model" --backend cuda \
    --emit "$em" ${KD_TUNE_MODEL_FLAGS:-} >>"$OUT/tunemodel.log" 2>&1
  rc=$?
  tar czf "$OUT/emit_model.tgz" -C "$em" .
  echo "tune --model $model rc=$rc in $(($(date +%s) - s0)) s"
  tail -3 "$OUT/tunemodel.log"
  if [ $rc -eq 0 ]; then
    budget=$(($(left) - 20))
    stamp "tunemodel: the any-model points of $model served from the emit dir ($budget s)"
    KDISPATCH_CONFIG_DIRS="$em" PYTHONPATH="$BUILD/python" KDISPATCH_CACHE_DIR=/tmp/kd-no-cache KDISPATCH_TUNE=off \
      "$PY" bench/gpu/bench_any_model.py --out "$OUT" --kinds bf16 --models "${KD_BENCH_MODEL:-Qwen2.5-7B}" \
      --json-name any_model_tuned.json --budget-s "$budget" --resume "$RESUME/any_model_tuned.json" >"$OUT/tunemodel_bench.log" 2>&1
    tail -2 "$OUT/tunemodel_bench.log"
    grep -q "^COMPLETE" "$OUT/tunemodel_bench.log" && echo "::: tunemodel: complete" ||
      echo "::: tunemodel: INCOMPLETE (copy emit_model.tgz and any_model_tuned.json into .h200/ and run again)"
  else
    echo "::: tunemodel: INCOMPLETE (rc=$rc; copy emit_model.tgz into .h200/ and run again)"
  fi
fi

# ================================================================ compile
# compile: issue 32 item 7: torch.compile(mode="reduce-overhead") of a
# Llama-3-8B MLP block and a whole decoder layer on torch's ops and on
# torch.ops.kdispatch at batch 1, 8, 64, 256, with torch.profiler at batch
# 64 (bench/gpu/bench_compile.py; compile.json, compile.log).
if has compile; then
  ensure_torch || { echo "::: compile: FAILED to build (build.log)"; exit 1; }
  budget=$(($(left) - 20))
  stamp "compile: MLP block and decoder layer under reduce-overhead ($budget s)"
  PYTHONPATH="$BUILD/python" KDISPATCH_CACHE_DIR=/tmp/kd-no-cache KDISPATCH_TUNE=off "$PY" bench/gpu/bench_compile.py \
    --out "$OUT" --batches "${KD_COMPILE_BATCHES:-1,8,64,256}" --budget-s "$budget" >"$OUT/compile.log" 2>&1
  rc=$?
  grep -E "^\|" "$OUT/compile.log"
  [ $rc -eq 0 ] || { status=1; grep -E "Error|Traceback" "$OUT/compile.log" | head; }
  grep -q "^COMPLETE" "$OUT/compile.log" && echo "::: compile: complete" || echo "::: compile: INCOMPLETE (compile.log)"
fi

# ================================================================ model
if has model; then
  ensure_torch || { echo "::: model: FAILED to build (build.log)"; exit 1; }
  stamp "model: ${KD_MODELS:-llama3-8b,qwen2.5-7b}, stock vs fused torch vs kdispatch ($(left) s)"
  PYTHONPATH="$BUILD/python" "$PY" bench/gpu/e2e_model.py --out "$OUT" --models "${KD_MODELS:-llama3-8b,qwen2.5-7b}" \
    --layers "${KD_MODEL_LAYERS:-0}" --budget-s "$(left)" >"$OUT/e2e_model.log" 2>&1
  rc=$?
  grep -E "rel. error|round|failed|reduce-overhead|Error|Traceback" "$OUT/e2e_model.log" | tail -12
  cat "$OUT/e2e_model.md" 2>/dev/null
  case $rc in
    0) echo "::: model: complete" ;;
    3) echo "::: model: INCOMPLETE (time budget: run again with KD_MODELS naming the rest)" ;;
    *) status=1; echo "::: model: FAILED (rc=$rc, e2e_model.log)" ;;
  esac
fi

# ================================================================ fp8-model
# The real model with fp8 weights and block scales (issue 21): e2e_model.py
# --fp8 adds the kd_fp8 way (quant_fp8_group + gemm_fp8_block for every
# decoder projection) beside stock bf16, fused torch and kdispatch bf16.
if has fp8-model; then
  ensure_torch || { echo "::: fp8-model: FAILED to build (build.log)"; exit 1; }
  [ -f "$RESUME/fp8_configs.tar" ] && tar xf "$RESUME/fp8_configs.tar" -C "$ROOT"
  mkdir -p "$OUT/fp8_model"
  stamp "fp8-model: ${KD_FP8_MODELS:-llama3-8b}, batches ${KD_FP8_BATCHES:-1,8,64}, kd_fp8 beside stock/fused/kdispatch ($(left) s)"
  PYTHONPATH="$BUILD/python" "$PY" bench/gpu/e2e_model.py --fp8 --skip-reduce-overhead --out "$OUT/fp8_model" \
    --models "${KD_FP8_MODELS:-llama3-8b}" --batches "${KD_FP8_BATCHES:-1,8,64}" --rounds "${KD_FP8_ROUNDS:-3}" \
    --layers "${KD_MODEL_LAYERS:-0}" --budget-s "$(($(left) - 10))" >"$OUT/fp8_model.log" 2>&1
  rc=$?
  grep -E "rel. error|failed|Error|Traceback" "$OUT/fp8_model.log" | tail -8
  cat "$OUT/fp8_model/e2e_model.md" 2>/dev/null
  case $rc in
    0) echo "::: fp8-model: complete" ;;
    3) echo "::: fp8-model: INCOMPLETE (time budget)" ;;
    *) status=1; echo "::: fp8-model: FAILED (rc=$rc, fp8_model.log)"; tail -5 "$OUT/fp8_model.log" ;;
  esac
fi

# ================================================================ shards
# Issue 22 on one GPU: a small bf16 GEMM grid ($KD_SHARD_NK x $KD_SHARD_M)
# tuned (a) by one process, (b) as --shard 0/2 then --shard 1/2 one after
# the other, (c) by `--devices 0` (one worker process); then the shards
# merged in both orders (byte-identical?), every unit of (a) in exactly one
# shard, each shard's time (the static split's imbalance: slowest / mean),
# and `merge --retime` of (a) against the merged shards on this GPU.
if has shards; then
  ensure_build kdispatch_cli || { echo "::: shards: FAILED to build (build.log)"; exit 1; }
  SH=/tmp/kd_shards; rm -rf "$SH"; mkdir -p "$SH"
  echo "M,N,K" >"$SH/grid.csv"
  SHM=${KD_SHARD_M:-1,16,64,256}; SHNK=${KD_SHARD_NK:-4096x4096,1280x8192,8192x1024}
  for m in ${SHM//,/ }; do for nk in ${SHNK//,/ }; do
    echo "$m,${nk%x*},${nk#*x}" >>"$SH/grid.csv"; done; done
  K="$BUILD/kdispatch"
  T=(tune --backend "$TUNE_BACKEND" --op gemm --dtype bf16 --shapes "$SH/grid.csv" --budget-ms "${KD_SHARD_BUDGET_MS:-300}"
     --reps "${KD_SHARD_REPS:-5}" --max-flops 1e13 --mem-gib 8 --json)
  timed() { local s; s=$(date +%s%N); "$@"; local rc=$?; echo $((($(date +%s%N) - s) / 1000000)) >>"$SH/times"; return $rc; }
  : >"$SH/times"
  stamp "shards: $(($(wc -l <"$SH/grid.csv") - 1)) units: one process, shard 0/2, shard 1/2, --devices 0"
  timed "$K" "${T[@]}" --emit "$SH/single" >"$SH/single.json" 2>>"$OUT/shards.log"
  timed "$K" "${T[@]}" --emit "$SH/s0" --shard 0/2 >"$SH/s0.json" 2>>"$OUT/shards.log"
  timed "$K" "${T[@]}" --emit "$SH/s1" --shard 1/2 >"$SH/s1.json" 2>>"$OUT/shards.log"
  timed "$K" "${T[@]}" --emit "$SH/dev" --devices 0 --unit-timeout-s 120 >"$SH/dev.json" 2>>"$OUT/shards.log"
  "$K" merge --out "$SH/m01" "$SH/s0" "$SH/s1" >>"$OUT/shards.log" 2>&1; r1=$?
  "$K" merge --out "$SH/m10" "$SH/s1" "$SH/s0" >>"$OUT/shards.log" 2>&1; r2=$?
  diff -r "$SH/m01" "$SH/m10" >/dev/null && same=yes || same=no
  timed "$K" merge --retime --out "$SH/retimed" "$SH/single" "$SH/m01" >"$SH/retime.log" 2>&1; r3=$?
  cat "$SH/retime.log" >>"$OUT/shards.log"
  "$PY" - "$SH" "$same" "$r1" "$r2" "$r3" >"$OUT/shards.json" <<'PYEOF'
import json, sys
sh, same, r1, r2, r3 = sys.argv[1], sys.argv[2] == "yes", *map(int, sys.argv[3:6])
t = [int(x) / 1000.0 for x in open(sh + "/times").read().split()]
def units(name):
    d = json.load(open(f"{sh}/{name}.json"))
    return [(r["shape"], r["M"]) for r in d["results"] if r["status"] == "tuned"], d
single, ds = units("single"); s0, d0 = units("s0"); s1, d1 = units("s1"); dev, dd = units("dev")
both = s0 + s1
out = {"units": len(single), "shard0": len(s0), "shard1": len(s1),
       "each_unit_once": sorted(both) == sorted(single) and len(set(both)) == len(both),
       "devices0_same_units": sorted(dev) == sorted(single),
       "seconds": {"single": t[0], "shard0": t[1], "shard1": t[2], "devices0": t[3], "merge_retime": t[4]},
       "imbalance_slowest_over_mean": max(t[1], t[2]) / ((t[1] + t[2]) / 2),
       "merge_rc": [r1, r2], "merge_byte_identical_either_order": same, "retime_rc": r3}
print(json.dumps(out, indent=1))
PYEOF
  cat "$OUT/shards.json"
  grep -E "conflict|retim|kept" "$SH/retime.log" | tail -5
  (cd "$SH" && tar cf "$OUT/shards_dirs.tar" single s0 s1 m01 retimed 2>/dev/null)
  # Serving: the grid from the one-process configs (twice: the noise pair) and
  # from the merged shards', interleaved per point (shard_serving.json).
  serve=skipped
  if [ "${KD_SHARD_SERVING:-1}" = 1 ] && ensure_torch; then
    PYTHONPATH="$BUILD/python" "$PY" bench/gpu/shard_serving.py --single "$SH/single" --merged "$SH/m01" \
      --grid "$SH/grid.csv" --out "$OUT/shard_serving.json" >"$OUT/shard_serving.log" 2>&1 && serve=ok || serve=FAILED
    tail -14 "$OUT/shard_serving.log"
  fi
  if grep -q '"each_unit_once": true' "$OUT/shards.json" && [ "$same" = yes ] && [ "$serve" != FAILED ]; then
    echo "::: shards: complete (serving: $serve)"
  else status=1; echo "::: shards: FAILED (shards.json, shards.log, shard_serving.log)"; fi
fi

# ================================================================ tune
if has tune; then
  ensure_build kdispatch_cli || { echo "::: tune: FAILED to build (build.log)"; exit 1; }
  # One grid per dim name: M x hidden (the norms), M x d (silu_and_mul).
  for g in hidden:$HIDDENS d:$SILU_DS; do
    echo "M,${g%%:*}" >"/tmp/kd_grid_${g%%:*}.csv"
    for v in $(echo "${g#*:}" | tr , ' '); do for m in ${TOKENS//,/ }; do echo "$m,$v" >>"/tmp/kd_grid_${g%%:*}.csv"; done; done
  done
  incomplete=""
  for op in ${TUNE_OPS//,/ }; do
    grid=/tmp/kd_grid_$([ "$op" = silu_and_mul ] && echo d || echo hidden).csv
    npts=$(($(wc -l <"$grid") - 1))
    for dt in ${DTYPES//,/ }; do
      # Keep 30 s for packing and validating what was tuned.
      budget=$(($(left) - 30))
      if [ $budget -lt 20 ]; then incomplete="$incomplete $op/$dt(not started)"; continue; fi
      stamp "tune: $op $dt ($npts shapes, ${BUDGET_MS} ms search each, ${budget} s left)"
      echo "===== $op $dt" >>"$OUT/tune.log"
      # Each shape is written to its file as soon as it is tuned (tmp file +
      # rename), so a run stopped here loses only the shape in progress.
      timeout "$budget" "$BUILD/kdispatch" tune --backend "$TUNE_BACKEND" --shapes "$grid" --op "$op" --dtype "$dt" \
        --emit "$ROOT/configs" --budget-ms "$BUDGET_MS" >>"$OUT/tune.log" 2>&1
      rc=$?
      if [ $rc -eq 124 ]; then incomplete="$incomplete $op/$dt(stopped)"; echo "stopped: time budget" >>"$OUT/tune.log"
      elif [ $rc -ne 0 ]; then status=1; echo "tune $op $dt rc=$rc: $(tail -1 "$OUT/tune.log")"; fi
      [ $rc -eq 2 ] && break 2  # a usage error (no usable device): the other runs would say the same
      grep -E "^[0-9]+ .* shapes: |^geomean" "$OUT/tune.log" | tail -2
    done
  done
  (cd "$ROOT" && find "configs/$TUNE_BACKEND" -name '*.json' ! -name '.*' 2>/dev/null | sort | tar cf "$OUT/configs.tar" -T -)
  stamp "tune: $(tar tf "$OUT/configs.tar" | wc -l) file(s) in configs.tar"
  "$BUILD/kdispatch" validate "$ROOT/configs" >"$OUT/validate.log" 2>&1 || { status=1; tail -5 "$OUT/validate.log"; }
  if [ -n "$incomplete" ]; then echo "::: tune: INCOMPLETE ($incomplete ): copy configs.tar into .h200/ and run tune again"
  elif [ $status -ne 0 ]; then echo "::: tune: FAILED (tune.log, validate.log)"
  else echo "::: tune: complete (unpack configs.tar in the repo root and commit configs/cuda)"; fi
fi

# ================================================================ bench
if has bench; then
  ensure_build kdispatch || { echo "::: bench: FAILED to build (build.log)"; exit 1; }
  budget=$(($(left) - 20))
  stamp "bench: norms beside the peers (peers: ${PEERS:-none}; ${budget} s)"
  "$PY" bench/gpu/bench_gpu.py --lib "$LIB" --configs "$ROOT/configs" ${PEERS:+--peers "$PEERS"} \
    --sections norms --dtypes "$DTYPES" --ops "$NORM_OPS" --tokens "$TOKENS" --hiddens "$HIDDENS" \
    --resume "$RESUME/bench_gpu.json" --budget-s "$budget" --out "$OUT" >"$OUT/bench.log" 2>&1
  rc=$?
  tail -4 "$OUT/bench.log"
  "$PY" bench/gpu/render.py "$OUT/bench_gpu.json" --commit "${KD_COMMIT:-unknown}" >"$OUT/h200.md" 2>>"$OUT/bench.log"
  grep -E "^Summary" "$OUT/h200.md"
  if [ $rc -eq 3 ]; then echo "::: bench: INCOMPLETE (time budget): copy bench_gpu.json into .h200/ and run bench again"
  elif [ $rc -ne 0 ]; then echo "::: bench: FAILED rc=$rc (bench.log)"
  else echo "::: bench: complete (h200.md -> bench/results/)"; fi
fi

# ================================================================ check
if has check; then
  ensure_build kdispatch || { echo "::: check: FAILED to build (build.log)"; exit 1; }
  budget=$(($(left) - 10))
  stamp "check: committed H200 rows vs get_default (gate 1.10x; ${budget} s)"
  "$PY" bench/gpu/check_configs.py --lib "$LIB" --configs "$ROOT/configs" --device-name NVIDIA_H200 \
    --max-ratio 1.10 --resume "$RESUME/check.json" --budget-s "$budget" --out "$OUT" >"$OUT/check.log" 2>&1
  rc=$?
  grep -E "^FAIL|^check:" "$OUT/check.log" | tail -20
  case $rc in
    0) echo "::: check: complete, every committed row within 1.10x of get_default" ;;
    3) echo "::: check: INCOMPLETE (time budget): copy check.json into .h200/ and run check again" ;;
    *) echo "::: check: FAILED rc=$rc (check.log)" ;;
  esac
fi
# ================================================================ gemm-tune
if has gemm-tune; then
  ensure_build kdispatch_cli || { echo "::: gemm-tune: FAILED to build (build.log)"; exit 1; }
  # M outermost: a call that runs out of time has done the small-M (decode) shapes of every (N,K).
  grid=/tmp/kd_gemm_grid.csv
  echo "M,N,K" >"$grid"
  for m in ${GEMM_M//,/ }; do for nk in ${GEMM_NK//,/ }; do echo "$m,${nk%x*},${nk#*x}" >>"$grid"; done; done
  npts=$(($(wc -l <"$grid") - 1))
  incomplete=""
  gstatus=0
  budget=$(($(left) - 30))  # keep 30 s for packing and validating
  if [ $budget -lt 20 ]; then incomplete="gemm/bf16(not started)"
  else
    stamp "gemm-tune: gemm bf16 ($npts shapes, ${GEMM_BUDGET_MS} ms search each, ${budget} s left)"
    echo "===== gemm bf16" >>"$OUT/gemm_tune.log"
    # Each shape is written as soon as it is tuned; a rerun skips the shapes configs/ holds. The
    # info log adds the confirmation rounds (winner/default per round) of every shape.
    KDISPATCH_LOG_LEVEL=info timeout "$budget" "$BUILD/kdispatch" tune --backend "$TUNE_BACKEND" --op gemm --dtype bf16 --shapes "$grid" \
      --emit "$ROOT/configs" --budget-ms "$GEMM_BUDGET_MS" --reps "$GEMM_REPS" --max-candidates 192 --max-flops "$GEMM_MAX_FLOPS" --mem-gib "$GEMM_MEM_GIB" \
      >>"$OUT/gemm_tune.log" 2>&1
    rc=$?
    if [ $rc -eq 124 ]; then incomplete="gemm/bf16(stopped)"; echo "stopped: time budget" >>"$OUT/gemm_tune.log"
    elif [ $rc -ne 0 ]; then gstatus=1; echo "tune gemm bf16 rc=$rc: $(tail -1 "$OUT/gemm_tune.log")"; fi
    grep -E "^[0-9]+ .* shapes: |^geomean" "$OUT/gemm_tune.log" | tail -2
    grep -E "FAILED|skipped: " "$OUT/gemm_tune.log" | grep -v "already in" | head -5
  fi
  (cd "$ROOT" && find "configs/$TUNE_BACKEND/gemm" -name '*.json' ! -name '.*' 2>/dev/null | sort | tar cf "$OUT/gemm_configs.tar" -T -)
  stamp "gemm-tune: $(tar tf "$OUT/gemm_configs.tar" | wc -l) file(s) in gemm_configs.tar"
  "$BUILD/kdispatch" validate "$ROOT/configs" >"$OUT/gemm_validate.log" 2>&1 || { gstatus=1; tail -5 "$OUT/gemm_validate.log"; }
  if [ -n "$incomplete" ]; then echo "::: gemm-tune: INCOMPLETE ($incomplete): copy gemm_configs.tar into .h200/ and run gemm-tune again"
  elif [ $gstatus -ne 0 ]; then status=1; echo "::: gemm-tune: FAILED (gemm_tune.log, gemm_validate.log)"
  else echo "::: gemm-tune: complete (unpack gemm_configs.tar in the repo root and commit configs/cuda/gemm)"; fi
fi

# ================================================================ gemm-bench
if has gemm-bench; then
  ensure_build kdispatch kdispatch_bench_read || { echo "::: gemm-bench: FAILED to build (build.log)"; exit 1; }
  budget=$(($(left) - 20))
  stamp "gemm-bench: bf16 GEMM beside torch (cuBLAS) and Triton (peers: ${PEERS:-none}; ${budget} s)"
  "$PY" bench/gpu/bench_gpu.py --lib "$LIB" --configs "$ROOT/configs" ${PEERS:+--peers "$PEERS"} \
    --read-lib "$BUILD/bench/gpu/libkdispatch_bench_read.so" \
    --sections gemm --gemm-nk "$GEMM_NK" --gemm-m "$GEMM_M" --json-name bench_gemm.json \
    --resume "$RESUME/bench_gemm.json" --budget-s "$budget" --out "$OUT" >"$OUT/bench_gemm.log" 2>&1
  rc=$?
  tail -4 "$OUT/bench_gemm.log"
  "$PY" bench/gpu/render.py "$OUT/bench_gemm.json" --commit "${KD_COMMIT:-unknown}" >"$OUT/h200_gemm.md" 2>>"$OUT/bench_gemm.log"
  sed -n '/^### GEMM summary/,/^Graph replay/p' "$OUT/h200_gemm.md" | grep -vE '^###|^\|---|^\| target|^$'
  if [ $rc -eq 3 ]; then echo "::: gemm-bench: INCOMPLETE (time budget): copy bench_gemm.json into .h200/ and run gemm-bench again"
  elif [ $rc -ne 0 ]; then echo "::: gemm-bench: FAILED rc=$rc (bench_gemm.log)"; status=1
  else echo "::: gemm-bench: complete (h200_gemm.md -> bench/results/)"; fi
fi

# ================================================================ gemm-probe
# Diagnostics behind the GEMM table's read ceiling, the sweep's cuBLASLt column
# and the decode kernels' efficiency: time against bytes in one clock
# (--fixed-cost, PDL on and off), cuBLASLt's pick timed right after each of a
# few of our plans on three streams (--probe-lt), then ncu (when it can read
# the counters) on get_default's plan, the table's plan where it differs and
# cuBLASLt's pick at $KD_GEMM_PROFILE (M,N,K/...).
if has gemm-probe; then
  ensure_build kdispatch_gpu_gemm_bench || { echo "::: gemm-probe: FAILED to build (build.log)"; exit 1; }
  rc=0
  stamp "gemm-probe: fixed cost and streaming rate (PDL on, then KDISPATCH_PDL=0)"
  for pdl in 1 0; do
    KDISPATCH_PDL=$pdl timeout $(($(left) - 5)) "$BUILD/bench/gpu/kdispatch_gpu_gemm_bench" --configs "$ROOT/configs" \
      --csv "$OUT/gemm_fixed_pdl$pdl.csv" --fixed-cost >"$OUT/gemm_fixed_pdl$pdl.log" 2>&1 || rc=$?
    echo "--- KDISPATCH_PDL=$pdl"; cat "$OUT/gemm_fixed_pdl$pdl.log"
  done
  if [ "${KD_GEMM_PROBE_LT:-1}" != 0 ] && [ $rc -eq 0 ]; then
    stamp "gemm-probe: cuBLASLt after other plans"
    timeout $(($(left) - 5)) "$BUILD/bench/gpu/kdispatch_gpu_gemm_bench" --configs "$ROOT/configs" --csv "$OUT/gemm_probe.csv" \
      --probe-lt >"$OUT/gemm_probe.log" 2>&1
    rc=$?
    cat "$OUT/gemm_probe.log"
  fi
  PROFILE=${KD_GEMM_PROFILE:-16,1280,8192/8,8192,1024/16,6144,4096/1,4096,4096}
  if [ $rc -eq 0 ] && command -v ncu >/dev/null 2>&1 && [ "$PROFILE" != none ]; then
    stamp "gemm-probe: ncu at $PROFILE"
    timeout $(($(left) - 5)) ncu --clock-control none --cache-control all \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
      --section WarpStateStats --section SchedulerStats \
      "$BUILD/bench/gpu/kdispatch_gpu_gemm_bench" --configs "$ROOT/configs" --profile "$PROFILE" >"$OUT/gemm_ncu.txt" 2>&1
    echo "ncu rc=$?"
    grep -E "^  [a-z_A-Z].*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size" "$OUT/gemm_ncu.txt" | head -80
  fi
  if [ $rc -ne 0 ]; then echo "::: gemm-probe: FAILED rc=$rc (gemm_probe.log)"; status=1
  else echo "::: gemm-probe: complete"; fi
fi

# ================================================================ silu-test
if has silu-test; then
  ensure_build kdispatch_gpu_tests || { echo "::: silu-test: FAILED to build (build.log)"; exit 1; }
  stamp "silu-test: GPU silu_and_mul tests"
  t=$(($(left) - 5)); [ $t -lt 60 ] && t=60
  KDISPATCH_CACHE_DIR=/tmp/kd-no-cache timeout $t "$BUILD/tests/gpu/kdispatch_gpu_tests" \
    -tc='gpu silu*,gpu runtime: dispatch::silu*' >"$OUT/silu_tests.log" 2>&1
  rc=$?
  echo "kdispatch_gpu_tests -tc='gpu silu*' rc=$rc: $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/silu_tests.log" | tr '\n' ' ')"
  if [ $rc -ne 0 ]; then grep -E "ERROR|FAILED|error" "$OUT/silu_tests.log" | head -20; echo "::: silu-test: FAILED"; status=1
  else echo "::: silu-test: complete"; fi
fi

# ================================================================ wgmma-harness
# The wgmma kernels alone (bench/gpu/wgmma_harness.cu: dense beside cuBLAS,
# moe_gemm's against a per-expert cuBLAS reference), built with a watchdog
# (KD_WGMMA_WATCHDOG_NS, default 5 s: a barrier wait past it prints the block
# and traps instead of hanging); unbuffered output in wgmma_harness.log.
# KD_WGMMA_HARNESS=dense|moe|all (default all).
if has wgmma-harness; then
  stamp "wgmma-harness: nvcc (sm_90a, watchdog ${KD_WGMMA_WATCHDOG_NS:-5000000000} ns)"
  nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -I kernels \
    -DKD_WGMMA_WATCHDOG_NS="${KD_WGMMA_WATCHDOG_NS:-5000000000}" bench/gpu/wgmma_harness.cu -lcublas \
    -o "$OUT/wgmma_harness.bin" >"$OUT/wgmma_harness_build.log" 2>&1 ||
    { tail -20 "$OUT/wgmma_harness_build.log"; echo "::: wgmma-harness: FAILED to build"; exit 1; }
  timeout $(($(left) - 5)) "$OUT/wgmma_harness.bin" "${KD_WGMMA_HARNESS:-all}" >"$OUT/wgmma_harness.log" 2>&1
  rc=$?
  rm -f "$OUT/wgmma_harness.bin"
  grep -E "FAIL|watchdog|error" "$OUT/wgmma_harness.log" | head -20
  tail -3 "$OUT/wgmma_harness.log"
  if [ $rc -eq 0 ]; then echo "::: wgmma-harness: complete"; else echo "::: wgmma-harness: rc=$rc (124: the section's time ran out)"; status=1; fi
fi

# ================================================================ gemm-test
# The GPU GEMM tests alone (every variant and point against float64, the
# runtime paths): a quick check after a kernel change, before timing it.
if has gemm-test; then
  ensure_build kdispatch_gpu_tests || { echo "::: gemm-test: FAILED to build (build.log)"; exit 1; }
  stamp "gemm-test: GPU GEMM tests"
  KDISPATCH_CACHE_DIR=/tmp/kd-no-cache timeout $(($(left) - 5)) "$BUILD/tests/gpu/kdispatch_gpu_tests" -tc='gpu gemm*' \
    >"$OUT/gemm_tests.log" 2>&1
  rc=$?
  echo "kdispatch_gpu_tests -tc='gpu gemm*' rc=$rc: $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/gemm_tests.log" | tr '\n' ' ')"
  grep -E "runs checked" "$OUT/gemm_tests.log" | head -3
  if [ $rc -ne 0 ]; then grep -E "ERROR|FAILED|error" "$OUT/gemm_tests.log" | head -20; echo "::: gemm-test: FAILED"; status=1
  else echo "::: gemm-test: complete"; fi
fi

# ================================================================ gemm-host
# Host dispatch overhead of dispatch::gemm on a table hit, and the tiled
# family alone vs cuBLASLt at M >= 1024 (bench/gpu/gpu_gemm_bench.cpp).
if has gemm-host; then
  ensure_build kdispatch_gpu_gemm_bench || { echo "::: gemm-host: FAILED to build (build.log)"; exit 1; }
  rc=0
  if [ -z "${KD_GEMM_SWEEP_ONLY:-}" ]; then
    stamp "gemm-host: dispatch overhead and the tiled family alone"
    timeout $(($(left) - 5)) "$BUILD/bench/gpu/kdispatch_gpu_gemm_bench" --configs "$ROOT/configs" --csv "$OUT/gemm_host.csv" \
      >"$OUT/gemm_host.log" 2>&1
    rc=$?
    grep -E "^overhead median|^tiled / cuBLASLt" "$OUT/gemm_host.log"
  fi
  if [ -n "${KD_GEMM_SWEEP_M:-}" ] && [ $rc -eq 0 ]; then
    # Then the design sweep: every skinny / skinny_mma point at these M.
    stamp "gemm-host: sweep of the decode families at M=$KD_GEMM_SWEEP_M"
    timeout $(($(left) - 5)) "$BUILD/bench/gpu/kdispatch_gpu_gemm_bench" --configs "$ROOT/configs" \
      --csv "$OUT/gemm_sweep.csv" --sweep "$KD_GEMM_SWEEP_M" --reps "${KD_GEMM_SWEEP_REPS:-15}" \
      ${KD_GEMM_SWEEP_NK:+--nk "$KD_GEMM_SWEEP_NK"} >"$OUT/gemm_sweep.log" 2>&1
    rc=$?
    # (a stopped run leaves its last point incomplete: the renderer skips it and says so)
    "$PY" bench/gpu/render_sweep.py "$OUT/gemm_sweep.csv" --commit "${KD_COMMIT:-unknown}" >"$OUT/h200_gemm_sweep.md"
    sed -n '/^| M | get_default/,$p' "$OUT/h200_gemm_sweep.md"
  fi
  if [ $rc -ne 0 ]; then echo "::: gemm-host: FAILED rc=$rc (gemm_host.log)"; status=1
  else echo "::: gemm-host: complete (gemm_host.log -> bench/results/)"; fi
fi

# ================================================================ e2e
if has e2e; then
  ensure_build kdispatch kdispatch_cli || { echo "::: e2e: FAILED to build (build.log)"; exit 1; }
  QDIR=/tmp/kd_e2e_qwen_configs  # the "engine team's" dir: Qwen's shapes tuned here, never into configs/
  mkdir -p "$QDIR"
  [ -f "$RESUME/e2e_qwen_configs.tar" ] && tar xf "$RESUME/e2e_qwen_configs.tar" -C "$QDIR" &&
    stamp "resume: $(tar tf "$RESUME/e2e_qwen_configs.tar" | grep -c '\.json$') tuned Qwen file(s) into $QDIR"
  e2e_incomplete=""
  e2e_failed=""
  # e2e_run <label> <model> <configs>: one e2e_decode.py run; its rows go into $OUT/e2e.json under <label>.
  e2e_run() {
    local budget=$(($(left) - 15))
    if [ $budget -lt 30 ]; then e2e_incomplete="$e2e_incomplete [$1](not started)"; return; fi
    stamp "e2e: $1 (${budget} s)"
    local from=$(($(cat "$OUT/e2e.log" 2>/dev/null | wc -l) + 1))
    "$PY" bench/gpu/e2e_decode.py --lib "$LIB" --model "$2" --configs "$3" --label "$1" --layers "$E2E_LAYERS" \
      --batches "$E2E_BATCHES" --device "$E2E_DEVICE" --resume "$RESUME/e2e.json" --budget-s "$budget" \
      --out "$OUT" >>"$OUT/e2e.log" 2>&1
    local rc=$?
    tail -n +"$from" "$OUT/e2e.log" | grep -E "batch [0-9]+ (eager|graph):|ERROR|FAILED|Traceback|Error" | tail -8
    case $rc in
      0) ;;
      3) e2e_incomplete="$e2e_incomplete [$1](time budget)" ;;
      *) e2e_failed="$e2e_failed [$1](rc=$rc)"; status=1 ;;
    esac
  }
  e2e_run "Llama-3-8B, committed configs" llama3-8b "$ROOT/configs"
  e2e_run "Qwen2.5-0.5B, committed configs (get_default)" qwen2.5-0.5b "$ROOT/configs"
  # (c) what an engine team would do for shapes no committed config covers: tune them.
  budget=$(($(left) - 60))  # keep time for run (d)
  if [ $budget -lt 20 ]; then e2e_incomplete="$e2e_incomplete [Qwen tuning](not started)"
  else
    "$PY" bench/gpu/e2e_decode.py --model qwen2.5-0.5b --batches "$E2E_BATCHES" --write-shapes /tmp/kd_e2e_qwen_shapes >/dev/null
    stamp "e2e: kdispatch tune of Qwen2.5-0.5B's shapes (M $E2E_BATCHES) into $QDIR (${E2E_TUNE_BUDGET_MS} ms each, ${budget} s)"
    tune_end=$(($(date +%s) + budget))
    for op in gemm rmsnorm fused_add_rmsnorm silu_and_mul; do
      case $op in gemm) csv=gemm ;; silu_and_mul) csv=silu ;; *) csv=norms ;; esac
      csv=/tmp/kd_e2e_qwen_shapes/$csv.csv
      b=$((tune_end - $(date +%s)))
      if [ $b -lt 5 ]; then e2e_incomplete="$e2e_incomplete [tune $op](not started)"; continue; fi
      echo "===== $op bf16" >>"$OUT/e2e_tune.log"
      timeout "$b" "$BUILD/kdispatch" tune --backend "$TUNE_BACKEND" --op $op --dtype bf16 --shapes "$csv" \
        --emit "$QDIR" --budget-ms "$E2E_TUNE_BUDGET_MS" --max-flops "$GEMM_MAX_FLOPS" >>"$OUT/e2e_tune.log" 2>&1
      rc=$?
      if [ $rc -eq 124 ]; then e2e_incomplete="$e2e_incomplete [tune $op](stopped)"
      elif [ $rc -ne 0 ]; then e2e_failed="$e2e_failed [tune $op](rc=$rc)"; status=1; fi
      grep -E "^[0-9]+ .* shapes: |^geomean" "$OUT/e2e_tune.log" | tail -2
    done
    (cd "$QDIR" && find . -name '*.json' ! -name '.*' | sort | tar cf "$OUT/e2e_qwen_configs.tar" -T -)
  fi
  e2e_run "Qwen2.5-0.5B, tuned by kdispatch tune" qwen2.5-0.5b "$QDIR,$ROOT/configs"
  [ -f "$OUT/e2e.md" ] && grep -E "^- \*\*" "$OUT/e2e.md"
  if [ -n "$e2e_failed" ]; then echo "::: e2e: FAILED ($e2e_failed ) (e2e.log, e2e_tune.log)"
  elif [ -n "$e2e_incomplete" ]; then
    echo "::: e2e: INCOMPLETE ($e2e_incomplete ): copy e2e.json and e2e_qwen_configs.tar into .h200/ and run e2e again"
  else echo "::: e2e: complete (e2e.md -> bench/results/)"; fi
fi

# ================================================================ silu
# silu_and_mul: kdispatch (the committed configs' rows, else get_default)
# beside eager F.silu(g) * u and its torch.compile'd form, cold and under
# graph replay; the copy rate B_copy of >= 4x L2 bytes measured in the same
# run (bench/gpu/bench_silu.py says how).
if has silu; then
  ensure_build kdispatch || { echo "::: silu: FAILED to build (build.log)"; exit 1; }
  budget=$(($(left) - 20))
  stamp "silu: silu_and_mul beside eager and torch.compile ($SILU_DTYPES x d $SILU_DS x tokens $SILU_TOKENS; ${budget} s)"
  "$PY" bench/gpu/bench_silu.py --lib "$LIB" --configs "$ROOT/configs" --dtypes "$SILU_DTYPES" --ds "$SILU_DS" \
    --tokens "$SILU_TOKENS" --resume "$RESUME/bench_silu.json" --budget-s "$budget" --out "$OUT" \
    >"$OUT/bench_silu.log" 2>&1
  rc=$?
  tail -4 "$OUT/bench_silu.log"
  if [ -f "$OUT/bench_silu.json" ]; then
    "$PY" bench/gpu/bench_silu.py --render "$OUT/bench_silu.json" --commit "${KD_COMMIT:-unknown}" \
      >"$OUT/h200_silu.md" 2>>"$OUT/bench_silu.log"
    grep -E "^- " "$OUT/h200_silu.md"
  fi
  if [ $rc -eq 3 ]; then echo "::: silu: INCOMPLETE (time budget): copy bench_silu.json into .h200/ and run silu again"
  elif [ $rc -ne 0 ]; then echo "::: silu: FAILED rc=$rc (bench_silu.log)"; status=1
  else echo "::: silu: complete (h200_silu.md -> bench/results/)"; fi
fi

# ================================================================ norm-peers
# The first H200 run's (2026-11-30; the table in tests/gpu/README.md): every
# point of every bf16 norm variant and get_default's plan on the peers' grid
# (kdispatch_gpu_norm_bench: cold and graph, one CSV row per point), the
# peers' own h200_baseline.py --sections rmsnorm,fused ($PEERS) in the same
# call, and bench/gpu/compare_peers.py: the ratios and the issue's targets.
# KD_NO_PEERS=1: the norm benchmark alone.
if has norm-peers; then
  ensure_build kdispatch_gpu_norm_bench || { echo "::: norm-peers: FAILED to build (build.log)"; exit 1; }
  stamp "norm-peers: kdispatch_gpu_norm_bench on the peers' grid"
  t=$(($(left) - 5)); [ $t -lt 60 ] && t=60
  timeout $t "$BUILD/bench/gpu/kdispatch_gpu_norm_bench" --csv "$OUT/norm_bench.csv" >/dev/null 2>"$OUT/norm_bench_err.txt"
  rc=$?
  echo "kdispatch_gpu_norm_bench rc=$rc"
  [ -s "$OUT/norm_bench_err.txt" ] || rm -f "$OUT/norm_bench_err.txt"
  if [ $rc -eq 0 ] && [ "${KD_NO_PEERS:-0}" != 1 ]; then
    if [ -z "$PEERS" ] || [ ! -f "$PEERS/h200_baseline.py" ]; then
      echo "norm-peers: no h200_baseline.py beside h200_kernels.py (carry .deps: --fetch-deps copies both)"; rc=2
    elif [ $(($(left) - 30)) -lt 60 ]; then
      echo "norm-peers: no time left for the peers: run the section again with a larger KD_SECTION_S"; rc=3
    else
      budget=$(($(left) - 30))
      stamp "norm-peers: the peers' h200_baseline.py --sections rmsnorm,fused (${budget} s)"
      rm -rf /tmp/kd_peers
      timeout $((budget + 10)) "$PY" "$PEERS/h200_baseline.py" --sections rmsnorm,fused --budget-s "$budget" \
        --copy-bw 4234 --out /tmp/kd_peers >"$OUT/peers.log" 2>&1
      echo "peers rc=$?"
      cp /tmp/kd_peers/h200-baseline.json "$OUT/peers_baseline.json" 2>/dev/null
      "$PY" bench/gpu/compare_peers.py --peers "$OUT/peers_baseline.json" --ours "$OUT/norm_bench.csv" \
        >"$OUT/compare.txt" 2>&1
      rc=$?
      tail -7 "$OUT/compare.txt"
    fi
  fi
  if [ $rc -eq 3 ]; then echo "::: norm-peers: INCOMPLETE (time budget: the peers did not run)"
  elif [ $rc -ne 0 ]; then echo "::: norm-peers: FAILED rc=$rc (norm_bench_err.txt, peers.log, compare.txt)"; status=1
  else echo "::: norm-peers: complete (norm_bench.csv, compare.txt)"; fi
fi
stamp "done: $SECTIONS"
exit $status
