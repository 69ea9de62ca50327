// SPDX-License-Identifier: Apache-2.0
// bench_cpu_kernels — the CPU variants on serving shapes, from the same list
// that registers and tests them (core::all_variants(): the backend's lists
// plus the plugins that loaded, gemm_fp32__openblas).
//
// Shapes:
//   gemm  (fp32 and bf16 in, output = input dtype)
//         M=1   N=4096 K=4096   decode against a 4096 x 4096 weight
//         M=16  N=4864 K=896    Qwen2.5-0.5B gate_up at batch 16
//         M=256 N=1024 K=1024   a prefill chunk
//   rmsnorm, fused_add_rmsnorm (fp32 and bf16): tokens {1, 64, 1024} x hidden {896, 4096}
//
// Per (op, dtype, shape): get_default's plan ("default"), then for each
// variant that accepts the problem (references excluded: baselines, not
// candidates) up to 3 points of its config space, evenly spaced over the
// points it accepts; a variant with a `ukernel` param is sampled at the
// widest micro-kernel the host runs only. Not every point: the whole grid is
// the tuner's job, and the default run stays near a minute.
//
// Counters (rates, printed per second): GFLOP (2·M·N·K per call) for gemm,
// so "GFLOP=61.3/s" is 61.3 GFLOP/s; GB for the norms (bytes that must move:
// x read, y written, w read once; the fused op reads and writes x and
// residual). Wall time (UseRealTime): the split-K and OpenBLAS threads=2
// points use more than the calling thread. On a busy machine compare with
// --benchmark_repetitions=N --benchmark_enable_random_interleaving=true.
//
// Caveat when reading OpenBLAS's numbers: after a multi-threaded call its
// helper threads spin for a while, which can slow the next benchmark on a
// machine with few cores. Filter (--benchmark_filter=openblas) to compare.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/numeric.hpp"
#include "core/op.hpp"
#include "ops/specs.hpp"
#include "backends/registry.hpp"
#include "dispatch/device.hpp"

namespace {

namespace core = dispatch::core;
using core::LaunchArgs;
using core::OpKind;
using core::Plan;
using core::Problem;
using core::VariantDef;
using dispatch::DType;

// ------------------------------------------------------------------ buffers

/// One 64-byte aligned buffer per (name, dtype, elements), filled once with
/// values in [-1, 1] and shared by every benchmark of that shape.
void* buffer(const std::string& name, DType dt, int64_t elems) {
  struct Free {
    void operator()(void* p) const noexcept { ::operator delete[](p, std::align_val_t{64}); }
  };
  static std::map<std::tuple<std::string, int, int64_t>, std::unique_ptr<void, Free>> cache;
  auto& slot = cache[{name, static_cast<int>(dt), elems}];
  if (!slot) {
    const size_t esz = dt == DType::fp32 ? 4 : 2;
    slot.reset(::operator new[](static_cast<size_t>(elems) * esz, std::align_val_t{64}));
    std::mt19937 rng(static_cast<uint32_t>(elems));
    std::uniform_real_distribution<float> u(-1, 1);
    if (dt == DType::fp32) {
      auto* f = static_cast<float*>(slot.get());
      for (int64_t i = 0; i < elems; ++i) f[i] = u(rng);
    } else {
      auto* h = static_cast<uint16_t*>(slot.get());
      for (int64_t i = 0; i < elems; ++i) h[i] = core::float_to_bf16(u(rng));
    }
  }
  return slot.get();
}

const char* dtype_text(DType dt) { return dt == DType::fp32 ? "fp32" : "bf16"; }

// ------------------------------------------------------------------ problems

struct Case {
  std::string label;  // "gemm/fp32/M=1,N=4096,K=4096"
  Problem p;
  LaunchArgs args;
  double work = 0;  // FLOP (gemm) or bytes (norms) per call
  bool gemm = false;
};

Case gemm_case(DType dt, int64_t m, int64_t n, int64_t k) {
  Case c;
  c.gemm = true;
  c.label = std::string("gemm/") + dtype_text(dt) + "/M=" + std::to_string(m) + ",N=" + std::to_string(n) +
            ",K=" + std::to_string(k);
  c.p.op = OpKind::gemm;
  c.p.device = {dispatch::DeviceType::cpu, 0};
  c.p.in_dtype = c.p.out_dtype = dt;
  c.p.m = m;
  c.p.n = n;
  c.p.k = k;
  c.args.data[core::kGemmArgA] = buffer("a", dt, m * k);
  c.args.ld[core::kGemmArgA] = k;
  c.args.data[core::kGemmArgB] = buffer("b", dt, n * k);
  c.args.ld[core::kGemmArgB] = k;
  c.args.data[core::kGemmArgD] = buffer("d", dt, m * n);
  c.args.ld[core::kGemmArgD] = n;
  c.work = 2.0 * double(m) * double(n) * double(k);
  return c;
}

Case norm_case(OpKind op, DType dt, int64_t tokens, int64_t hidden) {
  Case c;
  c.label = std::string(core::op_name(op)) + "/" + dtype_text(dt) + "/tokens=" + std::to_string(tokens) +
            ",hidden=" + std::to_string(hidden);
  c.p.op = op;
  c.p.device = {dispatch::DeviceType::cpu, 0};
  c.p.in_dtype = c.p.out_dtype = dt;
  c.p.m = tokens;
  c.p.n = hidden;
  const double esz = dt == DType::fp32 ? 4 : 2;
  const double rows = double(tokens) * double(hidden) * esz;
  // Slots: rmsnorm y, x, w; fused_add_rmsnorm x, residual, w.
  const bool fused = op != OpKind::rmsnorm;
  const int sx = fused ? core::kFusedArgX : core::kNormArgX;
  c.args.data[sx] = buffer("x", dt, tokens * hidden);
  c.args.ld[sx] = hidden;
  c.args.data[fused ? core::kFusedArgW : core::kNormArgW] = buffer("w", dt, hidden);
  c.args.scalar[0] = 1e-6f;
  if (!fused) {
    c.args.data[core::kNormArgY] = buffer("y", dt, tokens * hidden);
    c.args.ld[core::kNormArgY] = hidden;
    c.work = 2 * rows + double(hidden) * esz;
  } else {
    // In place: residual += x grows by |x| <= 1 per call (no overflow in any
    // run length a benchmark reaches); x is renormalised every call.
    c.args.data[core::kFusedArgResidual] = buffer("residual", dt, tokens * hidden);
    c.args.ld[core::kFusedArgResidual] = hidden;
    c.work = 4 * rows + double(hidden) * esz;
  }
  return c;
}

// ------------------------------------------------------------------ sampling

/// Up to `want` points of v's space that v accepts for p, evenly spaced; at
/// the widest accepted `ukernel` when v has one.
std::vector<Plan> sample_points(const VariantDef& v, const Problem& p, const dispatch::DeviceInfo& dev, size_t want) {
  std::vector<Plan> space = core::config_space(v, p, dev);
  for (size_t i = 0; i < v.params.size(); ++i) {
    if (v.params[i].name != "ukernel") continue;
    int64_t widest = -1;
    for (const Plan& pl : space) widest = std::max(widest, pl.params[i]);
    std::erase_if(space, [&](const Plan& pl) { return pl.params[i] != widest; });
  }
  if (space.size() <= want) return space;
  std::vector<Plan> out;
  for (size_t j = 0; j < want; ++j) out.push_back(space[j * (space.size() - 1) / (want - 1)]);
  return out;
}

void run_plan(benchmark::State& state, const Case& c, const Plan& plan) {
  const dispatch::Status first = plan.variant->launch(c.args, c.p, plan.params);
  if (!first.ok()) {
    state.SkipWithError(first.to_string().c_str());
    return;
  }
  for (auto _ : state) {
    const dispatch::Status s = plan.variant->launch(c.args, c.p, plan.params);
    benchmark::DoNotOptimize(s.ok());
    benchmark::ClobberMemory();
  }
  state.counters[c.gemm ? "GFLOP" : "GB"] =
      benchmark::Counter(c.work / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void register_case(const Case& c, const dispatch::DeviceInfo& dev) {
  const double min_time = c.gemm ? 0.2 : 0.1;
  auto add = [&](const std::string& name, const Plan& plan) {
    benchmark::RegisterBenchmark(name.c_str(), [c, plan](benchmark::State& st) { run_plan(st, c, plan); })
        ->UseRealTime()
        ->MinTime(min_time)
        ->Unit(benchmark::kMicrosecond);
  };
  const Plan def = core::get_default(c.p, dev);
  if (def.valid()) add(c.label + "/default=" + core::plan_to_string(def), def);
  for (const VariantDef* v : core::all_variants()) {
    if (v->backend != dispatch::DeviceType::cpu || v->op != c.p.op || v->in_dtype != c.p.in_dtype) continue;
    if (v->flags & core::kVariantReference) continue;
    for (const Plan& plan : sample_points(*v, c.p, dev, 3)) add(c.label + "/" + core::plan_to_string(plan), plan);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const dispatch::DeviceInfo& dev = dispatch::cpu_device_info();
  benchmark::AddCustomContext("cpu_device", dev.device_name + " (" + dev.reported_name + ", " +
                                                std::to_string(dev.compute_units) + " hardware threads)");
  benchmark::AddCustomContext("cpu_plugins", core::plugin_status());
  if (const char* t = std::getenv("OPENBLAS_NUM_THREADS")) benchmark::AddCustomContext("OPENBLAS_NUM_THREADS", t);

  for (DType dt : {DType::fp32, DType::bf16}) {
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 4096, 4096}, {16, 4864, 896}, {256, 1024, 1024}})
      register_case(gemm_case(dt, m, n, k), dev);
  }
  for (OpKind op : {OpKind::rmsnorm, OpKind::fused_add_rmsnorm})
    for (DType dt : {DType::fp32, DType::bf16})
      for (int64_t tokens : {1, 64, 1024})
        for (int64_t hidden : {896, 4096}) register_case(norm_case(op, dt, tokens, hidden), dev);

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
