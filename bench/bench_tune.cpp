// SPDX-License-Identifier: Apache-2.0
// bench_tune — what online tuning costs: the time to tune one shape, and what
// a busy background tuner does to the latency of the calls being served.
// Public API only (dispatch/dispatch.hpp).
//
//   BM_PretuneOneShape/<op>/<budget_ms>
//       dispatch::pretune of one representative CPU shape per op, with the
//       TuneOptions defaults (cold cache, 5 reps, validation) and a time
//       budget per shape of <budget_ms> (2000 = the default): gemm
//       M=16,N=896,K=896 bf16 (Qwen2.5-0.5B's o_proj at a decode batch of
//       16); rmsnorm and fused_add_rmsnorm tokens=16, hidden=896 bf16. A fresh
//       runtime with an empty temp cache dir per iteration (the winner is
//       persisted there, as online tuning does). Time = wall time of one
//       pretune; counters: candidates benchmarked, winner and default µs,
//       speedup of the winner over get_default.
//
//   BM_ForegroundRmsnorm/<busy>
//       latency of one dispatch::rmsnorm call (tokens=4, hidden=896 bf16, a
//       table hit) on a runtime in background tuning mode, measured call by
//       call: p50/p99/max as counters (µs). busy=0: the tuner is idle.
//       busy=1: before the loop another thread issues misses of large GEMM
//       shapes (N=K=4096 bf16, 24 values of M) on the same runtime, so the
//       background tuner searches them (default budget 2000 ms per shape,
//       duty cycle 0.5) while the foreground loop runs; the counter
//       tuner_busy is 1 when the tuner was searching both before and after
//       the loop, tuner_shapes_done how many searches ended meanwhile.
//
// Informational on a 2-core host: the tuner's candidate GEMMs use the CPU
// backend's thread pool, i.e. the same cores as the foreground calls.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/dispatch.hpp"

namespace {
namespace fs = std::filesystem;
namespace dsp = dispatch;
using Clock = std::chrono::steady_clock;

// A temp dir removed on scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const char* tag) {
    std::string tmpl = (fs::temp_directory_path() / (std::string("kdispatch-bench-") + tag + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

enum BenchOp : int64_t { kGemm = 0, kRmsNorm = 1, kFusedAdd = 2 };
const char* const kOpNames[] = {"gemm", "rmsnorm", "fused_add_rmsnorm"};

constexpr int64_t kHidden = 896;
constexpr int64_t kTokens = 16;

dsp::Result<dsp::PretuneResult> pretune_op(dsp::Runtime& rt, int64_t op) {
  const dsp::DType bf16 = dsp::DType::bf16;
  switch (op) {
    case kGemm: {
      dsp::GemmArgs a;  // null data: pretune tunes on scratch buffers
      a.a = dsp::make_tensor_2d(nullptr, bf16, kTokens, kHidden, kHidden);
      a.b = dsp::make_tensor_2d(nullptr, bf16, kHidden, kHidden, kHidden);
      a.d = dsp::make_tensor_2d(nullptr, bf16, kTokens, kHidden, kHidden);
      return dsp::pretune(rt, a);
    }
    case kRmsNorm: {
      dsp::RmsNormArgs a;
      a.x = dsp::make_tensor_2d(nullptr, bf16, kTokens, kHidden, kHidden);
      a.y = dsp::make_tensor_2d(nullptr, bf16, kTokens, kHidden, kHidden);
      a.w = dsp::make_tensor_1d(nullptr, bf16, kHidden);
      return dsp::pretune(rt, a);
    }
    default: {
      dsp::FusedAddRmsNormArgs a;
      a.x = dsp::make_tensor_2d(nullptr, bf16, kTokens, kHidden, kHidden);
      a.residual = dsp::make_tensor_2d(nullptr, bf16, kTokens, kHidden, kHidden);
      a.w = dsp::make_tensor_1d(nullptr, bf16, kHidden);
      return dsp::pretune(rt, a);
    }
  }
}

void BM_PretuneOneShape(benchmark::State& state) {
  const int64_t op = state.range(0);
  const double budget_ms = static_cast<double>(state.range(1));
  state.SetLabel(std::string(kOpNames[op]) + (op == kGemm ? " M=16,N=896,K=896 bf16" : " tokens=16,hidden=896 bf16"));
  double candidates = 0, best_us = 0, default_us = 0;
  int64_t n = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto tmp = std::make_unique<TempDir>("pretune");
    dsp::RuntimeOptions o;
    o.load_shipped_configs = false;
    o.tune.cache_dir = tmp->path.string();
    o.tune.time_budget_ms = budget_ms;
    auto rt = dsp::Runtime::create(o);
    if (!rt.ok()) {
      state.SkipWithError(rt.status().to_string().c_str());
      return;
    }
    state.ResumeTiming();
    auto r = pretune_op(**rt, op);
    state.PauseTiming();
    if (!r.ok()) {
      state.SkipWithError(r.status().to_string().c_str());
      return;
    }
    candidates += r->candidates;
    best_us += r->best_us;
    default_us += r->default_us;
    ++n;
    rt.value().reset();
    tmp.reset();
    state.ResumeTiming();
  }
  if (n > 0) {
    state.counters["candidates"] = candidates / n;
    state.counters["best_us"] = best_us / n;
    state.counters["default_us"] = default_us / n;
    state.counters["speedup"] = best_us > 0 ? default_us / best_us : 0.0;
  }
}
BENCHMARK(BM_PretuneOneShape)
    ->ArgNames({"op", "budget_ms"})
    ->Args({kGemm, 2000})
    ->Args({kRmsNorm, 2000})
    ->Args({kFusedAdd, 2000})
    ->Args({kGemm, 250})
    ->Args({kRmsNorm, 250})
    ->Args({kFusedAdd, 250})
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A 64-byte-aligned bf16 buffer of `n` elements (zeroes: the values do not
// change which kernel runs or how long it takes).
struct Bf16Buffer {
  std::unique_ptr<uint16_t, decltype(&std::free)> p{nullptr, &std::free};
  explicit Bf16Buffer(size_t n) {
    const size_t bytes = (n * 2 + 63) / 64 * 64;
    p.reset(static_cast<uint16_t*>(std::aligned_alloc(64, bytes)));
    if (!p) std::abort();
    std::fill(p.get(), p.get() + n, uint16_t{0x3f80});  // 1.0
  }
  uint16_t* get() const { return p.get(); }
};

void BM_ForegroundRmsnorm(benchmark::State& state) {
  const bool busy = state.range(0) != 0;
  constexpr int64_t kFgTokens = 4;
  const dsp::DType bf16 = dsp::DType::bf16;
  TempDir cache("fg-cache");

  // A table row for the foreground shape: pretune it into the cache dir first.
  {
    dsp::RuntimeOptions o;
    o.load_shipped_configs = false;
    o.tune.cache_dir = cache.path.string();
    o.tune.time_budget_ms = 200;
    auto rt = dsp::Runtime::create(o);
    if (!rt.ok()) return state.SkipWithError(rt.status().to_string().c_str());
    dsp::RmsNormArgs a;
    a.x = dsp::make_tensor_2d(nullptr, bf16, kFgTokens, kHidden, kHidden);
    a.y = dsp::make_tensor_2d(nullptr, bf16, kFgTokens, kHidden, kHidden);
    a.w = dsp::make_tensor_1d(nullptr, bf16, kHidden);
    if (auto r = dsp::pretune(**rt, a); !r.ok()) return state.SkipWithError(r.status().to_string().c_str());
  }

  dsp::RuntimeOptions o;
  o.load_shipped_configs = false;
  o.tune.mode = dsp::TuneMode::background;
  o.tune.cache_dir = cache.path.string();
  auto rt_r = dsp::Runtime::create(o);
  if (!rt_r.ok()) return state.SkipWithError(rt_r.status().to_string().c_str());
  dsp::Runtime& rt = **rt_r;

  Bf16Buffer x(kFgTokens * kHidden), y(kFgTokens * kHidden), w(kHidden);
  const dsp::RmsNormArgs args{dsp::make_tensor_2d(y.get(), bf16, kFgTokens, kHidden, kHidden),
                              dsp::make_tensor_2d(x.get(), bf16, kFgTokens, kHidden, kHidden),
                              dsp::make_tensor_1d(w.get(), bf16, kHidden), 1e-6f};
  dsp::DispatchInfo info;
  dsp::CallOptions co;
  co.info = &info;
  if (auto s = dsp::rmsnorm(rt, args, {}, co); !s.ok()) return state.SkipWithError(s.to_string().c_str());
  if (info.source != dsp::PlanSource::table) return state.SkipWithError("the foreground shape is not a table hit");

  if (busy) {
    // Misses of large GEMM shapes from another thread: the tuner queues
    // them and searches them (most-missed first) while the loop below runs.
    std::thread feeder([&] {
      constexpr int64_t kN = 4096, kK = 4096, kMaxM = 24;
      Bf16Buffer a(kMaxM * kK), b(kN * kK), d(kMaxM * kN);
      for (int64_t m = 1; m <= kMaxM; ++m) {
        dsp::GemmArgs g{dsp::make_tensor_2d(a.get(), bf16, m, kK, kK),
                        dsp::make_tensor_2d(b.get(), bf16, kN, kK, kK),
                        dsp::make_tensor_2d(d.get(), bf16, m, kN, kN),
                        {}};
        (void)dsp::gemm(rt, g);
      }
    });
    feeder.join();
    // Wait until the tuner is searching (a candidate ran).
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (rt.tune_stats().candidates_run == 0 && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // Busy: not idle for 50 ms (Runtime::wait_tuner_idle needs a few quiet polls).
  const bool busy_before = !rt.wait_tuner_idle(0.05);
  const dsp::TuneStats before = rt.tune_stats();

  std::vector<double> lat;
  lat.reserve(static_cast<size_t>(state.max_iterations));
  for (auto _ : state) {
    const auto t0 = Clock::now();
    const dsp::Status s = dsp::rmsnorm(rt, args);
    const auto t1 = Clock::now();
    benchmark::DoNotOptimize(s);
    lat.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  const dsp::TuneStats after = rt.tune_stats();
  const bool busy_after = !rt.wait_tuner_idle(0.05);
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) {
    return lat.empty() ? 0.0 : lat[std::min(lat.size() - 1, static_cast<size_t>(p * lat.size()))];
  };
  state.counters["p50_us"] = pct(0.50);
  state.counters["p99_us"] = pct(0.99);
  state.counters["max_us"] = lat.empty() ? 0.0 : lat.back();
  // TuneStats count a shape's candidates when its search ends; a search of an
  // N=K=4096 shape outlasts the loop, so "busy" is the tuner's own state.
  state.counters["tuner_busy"] = busy_before && busy_after ? 1.0 : 0.0;
  state.counters["tuner_shapes_done"] = static_cast<double>(after.shapes_tuned - before.shapes_tuned);
  state.counters["tuner_pending"] = static_cast<double>(after.pending);
  state.SetLabel(busy ? "tuner busy on N=K=4096 GEMM misses" : "tuner idle");
}
BENCHMARK(BM_ForegroundRmsnorm)
    ->ArgName("busy")
    ->Arg(0)
    ->Arg(1)
    ->Iterations(1000000)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
