// SPDX-License-Identifier: Apache-2.0
// bench_lookup — what one dispatch-table lookup costs, beside a
// straightforward baseline, on a realistic table.
//
// The table: every file of SGLang's shipped config trees
// (<shared>/data/sglang-configs: fused-MoE and block-fp8 GEMM tables) plus
// 400 synthetic own-op CPU gemm keys x 14 M rows (written as config files to
// a temp dir and loaded by the real loader), plus two tiny own-op tables
// (rmsnorm hidden=64, gemm N=K=16) that the dispatch-overhead benchmarks hit.
//
// Benchmarks (see bench/README.md for numbers):
//   BM_Hit                 the whole per-call lookup as src/api/ops.cpp does it:
//                          build_own_key(Problem) -> XXH3 -> epoch guard ->
//                          Snapshot::find -> Snapshot::nearest -> plan copy.
//                          Queries rotate over the 400 gemm keys and M in
//                          [1, 1100] (exact and between-row M).
//   BM_HitSameKey          the same, one key and one M every call (the decode-loop case).
//   BM_Miss                same path, key absent (the caller would then run get_default).
//   BM_GetDefault          core::get_default for a CPU gemm (what a miss adds).
//   BM_Baseline_SharedMutex  the straightforward implementation: unordered_map<string,
//                          map<int64_t, Plan>> behind a shared_mutex; lock_shared per
//                          lookup, std::string key built per call, map lower_bound
//                          nearest. Same keys, same queries as BM_Hit.
//   BM_Dispatch{Rmsnorm,Gemm} / BM_Direct{Rmsnorm,Gemm}
//                          dispatch::rmsnorm/gemm through a Runtime on a tiny problem
//                          (a table hit) vs plan.variant->launch(...) with the same
//                          args; the difference is the dispatch overhead.
//
// Threads: BM_Hit and the baseline run with 1 and 2 reader threads
// (UseRealTime). Google Benchmark then reports Time = wall / (iterations of
// all threads), i.e. aggregate throughput; the counter `ns_per_call` is the
// latency one thread sees per call (its own wall time / its own iterations,
// averaged over threads): compare that one across thread counts.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/runtime_impl.hpp"
#include "api/validate.hpp"
#include "backends/registry.hpp"
#include "dispatch/dispatch.hpp"
#include "store/loader.hpp"
#include "table/epoch.hpp"
#include "table/key.hpp"
#include "table/snapshot.hpp"

namespace {
namespace fs = std::filesystem;
namespace core = dispatch::core;
namespace table = dispatch::table;
namespace store = dispatch::store;

constexpr int kSynthKeys = 400;
constexpr int64_t kSynthMs[14] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024};
constexpr size_t kQueries = 4096;  // power of two
constexpr int64_t kTinyHidden = 64;
constexpr int64_t kTinyGemm = 16;

int64_t synth_n(int i) { return 256 * (1 + i % 20); }
int64_t synth_k(int i) { return 128 * (1 + i / 20); }

/// Everything the benchmarks share; built once (thread-safe static).
struct World {
  fs::path tmp;
  std::string device_name;  ///< cpu_device_info().device_name
  std::unique_ptr<table::Snapshot> snap;
  std::atomic<const table::Snapshot*> current{nullptr};
  table::NearestPolicy policy;
  std::vector<core::Problem> hits;    ///< kQueries gemm problems whose key is in the table
  std::vector<core::Problem> misses;  ///< kQueries gemm problems whose key is absent
  size_t table_keys = 0;
  int64_t table_rows = 0;
  size_t sglang_files = 0;

  // The baseline: the same keys and rows.
  struct Baseline {
    mutable std::shared_mutex mu;
    std::unordered_map<std::string, std::map<int64_t, core::Plan>> map;
  } baseline;

  std::unique_ptr<dispatch::Runtime> rt;  ///< sglang + synthetic dirs, no shipped configs

  World() {
    device_name = dispatch::cpu_device_info().device_name;
    char tmpl[] = "/tmp/kdispatch-bench-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) std::abort();
    tmp = tmpl;
    write_synthetic();

    const std::string sglang = std::string(KDISPATCH_SHARED_DIR) + "/data/sglang-configs";
    std::vector<std::pair<std::string, std::string>> sources;
    auto intern = [&](const std::string& d, const std::string& r) -> uint32_t {
      sources.emplace_back(d, r);
      return static_cast<uint32_t>(sources.size());
    };
    store::LoadOutput out = store::load_config_dirs({{sglang, 0}, {tmp.string(), 1}}, {}, intern);
    for (const auto& f : out.report.files)
      if (f.dir == sglang) ++sglang_files;
    std::vector<std::string> notes;
    snap = table::Snapshot::build(std::move(out.inputs), {}, &notes);
    current.store(snap.get(), std::memory_order_seq_cst);
    table_keys = snap->buckets().size();
    table_rows = snap->row_count();

    for (const auto& b : snap->buckets()) {
      auto& m = baseline.map[b.key];
      for (size_t i = 0; i < b.ms.size(); ++i) m.emplace(b.ms[i], table::Snapshot::plan(b, i));
    }

    std::mt19937_64 rng(42);
    std::uniform_int_distribution<int> key_dist(0, kSynthKeys - 1);
    std::uniform_int_distribution<int64_t> m_dist(1, 1100);
    for (size_t q = 0; q < kQueries; ++q) {
      const int i = key_dist(rng);
      const core::Problem p = gemm_problem(synth_n(i), synth_k(i), m_dist(rng));
      hits.push_back(p);
      core::Problem miss = p;
      miss.n = p.n + 1;  // N=257, 513, ...: no table
      misses.push_back(miss);
    }

    dispatch::RuntimeOptions o;
    o.config_dirs = {sglang, tmp.string()};
    o.load_shipped_configs = false;
    auto r = dispatch::Runtime::create(o);
    if (!r.ok()) {
      std::fprintf(stderr, "Runtime::create: %s\n", r.status().message().c_str());
      std::abort();
    }
    rt = std::move(r.value());
  }

  ~World() {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }

  static core::Problem gemm_problem(int64_t n, int64_t k, int64_t m) {
    core::Problem p;
    p.op = core::OpKind::gemm;
    p.device = dispatch::Device{dispatch::DeviceType::cpu, 0};
    p.in_dtype = p.out_dtype = dispatch::DType::fp32;
    p.m = m;
    p.n = n;
    p.k = k;
    return p;
  }

  void write_synthetic() {
    const fs::path gemm = tmp / "cpu" / "gemm";
    const fs::path norm = tmp / "cpu" / "rmsnorm";
    fs::create_directories(gemm);
    fs::create_directories(norm);
    static const char* const kBm[] = {"8", "32", "128"};
    static const char* const kBn[] = {"16", "64", "256"};
    for (int i = 0; i < kSynthKeys; ++i) {
      std::ofstream f(gemm / ("N=" + std::to_string(synth_n(i)) + ",K=" + std::to_string(synth_k(i)) +
                              ",device_name=" + device_name + ",dtype=fp32.json"));
      f << "{";
      for (int j = 0; j < 14; ++j)
        f << (j ? ",\n " : "") << "\"" << kSynthMs[j]
          << "\": {\"variant\": \"gemm_fp32__blocked\", \"BLOCK_SIZE_M\": " << kBm[j % 3]
          << ", \"BLOCK_SIZE_N\": " << kBn[(j / 3) % 3] << ", \"BLOCK_SIZE_K\": 512, \"ukernel\": \"scalar\"}";
      f << "}\n";
    }
    std::ofstream(gemm / ("N=16,K=16,device_name=" + device_name + ",dtype=fp32.json"))
        << R"({"1": {"variant": "gemm_fp32__blocked", "BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 128, "ukernel": "scalar"},
 "16": {"variant": "gemm_fp32__blocked", "BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 128, "ukernel": "scalar"}})";
    std::ofstream(norm / ("hidden=64,device_name=" + device_name + ",dtype=fp32.json"))
        << R"({"1": {"variant": "rmsnorm_fp32__vec", "vec": 4, "unroll": 1}, "16": {"variant": "rmsnorm_fp32__vec", "vec": 4, "unroll": 2}})";
  }
};

World& world() {
  static World w;
  return w;
}

/// Per-thread latency counter: this thread's wall time / its iterations,
/// averaged over threads (Time itself is wall / all threads' iterations).
struct ThreadClock {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  void finish(benchmark::State& state) {
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    state.counters["ns_per_call"] = benchmark::Counter(
        state.iterations() ? ns / static_cast<double>(state.iterations()) : 0.0, benchmark::Counter::kAvgThreads);
  }
};

// The text-key lookup (what dispatch::lookup and the tuner use; the ops
// used it before the binary key): kept as a comparison point.
inline bool table_lookup_text(const World& w, const core::Problem& p, core::Plan* plan) noexcept {
  table::KeyBuffer key;
  table::build_own_key(p, dispatch::device_type_name(p.device.type), w.device_name, &key);
  const uint64_t hash = table::key_hash(key.view());
  table::EpochDomain::Guard guard(table::EpochDomain::global());
  const table::Snapshot* snap = w.current.load(std::memory_order_seq_cst);
  if (const table::Bucket* b = snap->find(key.view(), hash)) {
    size_t idx = 0;
    if (const table::Row* r = table::Snapshot::nearest(*b, p.m, w.policy, &idx);
        r && table::Snapshot::plan(*b, idx).valid()) {
      *plan = table::Snapshot::plan(*b, idx);
      return true;
    }
  }
  return false;
}

// The lookup as src/api/ops.cpp run() does it, up to (not including) the
// launch: binary key (OwnKey), hash, guard, find_own, nearest, plan copy.
// Returns true on a hit.
inline bool table_lookup(const World& w, const core::Problem& p, core::Plan* plan) noexcept {
  const table::OwnKey key = table::make_own_key(p, table::key_hash(w.device_name));
  const uint64_t hash = table::own_key_hash(key);
  table::EpochDomain::Guard guard(table::EpochDomain::global());
  const table::Snapshot* snap = w.current.load(std::memory_order_seq_cst);
  if (const table::Bucket* b = snap->find_own(key, hash, w.device_name)) {
    size_t idx = 0;
    if (const table::Row* r = table::Snapshot::nearest(*b, p.m, w.policy, &idx);
        r && table::Snapshot::plan(*b, idx).valid()) {
      *plan = table::Snapshot::plan(*b, idx);
      return true;
    }
  }
  return false;
}

// ------------------------------------------------------------ (a) hit

void BM_Hit(benchmark::State& state) {
  const World& w = world();
  size_t q = static_cast<size_t>(state.thread_index()) * 977;
  int64_t hits = 0;
  ThreadClock clock;
  for (auto _ : state) {
    core::Plan plan;
    hits += table_lookup(w, w.hits[q++ & (kQueries - 1)], &plan);
    benchmark::DoNotOptimize(plan);
  }
  clock.finish(state);
  if (hits != state.iterations()) state.SkipWithError("a BM_Hit query missed");
  if (state.thread_index() == 0) {
    state.counters["table_keys"] = static_cast<double>(w.table_keys);
    state.counters["table_rows"] = static_cast<double>(w.table_rows);
  }
}
BENCHMARK(BM_Hit)->Threads(1)->Threads(2)->UseRealTime();

void BM_HitSameKey(benchmark::State& state) {
  const World& w = world();
  const core::Problem p = w.hits[7];
  ThreadClock clock;
  for (auto _ : state) {
    core::Plan plan;
    benchmark::DoNotOptimize(table_lookup(w, p, &plan));
    benchmark::DoNotOptimize(plan);
  }
  clock.finish(state);
}
BENCHMARK(BM_HitSameKey)->Threads(1)->Threads(2)->UseRealTime();

// The hit path, piece by piece (rotating queries as BM_Hit; each piece
// alone, so the sum is an upper bound: pieces overlap in the pipeline).

void BM_Part_BuildKey(benchmark::State& state) {
  const World& w = world();
  size_t q = 0;
  for (auto _ : state) {
    table::KeyBuffer key;
    const core::Problem& p = w.hits[q++ & (kQueries - 1)];
    table::build_own_key(p, dispatch::device_type_name(p.device.type), w.device_name, &key);
    benchmark::DoNotOptimize(key.size);
    benchmark::DoNotOptimize(key.data);
  }
}
BENCHMARK(BM_Part_BuildKey);

void BM_HitTextKey(benchmark::State& state) {
  const World& w = world();
  size_t q = 0;
  int64_t hits = 0;
  for (auto _ : state) {
    core::Plan plan;
    hits += table_lookup_text(w, w.hits[q++ & (kQueries - 1)], &plan);
    benchmark::DoNotOptimize(plan);
  }
  if (hits != static_cast<int64_t>(state.iterations())) state.SkipWithError("a text-key query missed");
}
BENCHMARK(BM_HitTextKey);

void BM_Part_Hash(benchmark::State& state) {
  const World& w = world();
  std::vector<std::string> keys;
  for (size_t q = 0; q < kQueries; ++q) {
    table::KeyBuffer key;
    table::build_own_key(w.hits[q], "cpu", w.device_name, &key);
    keys.emplace_back(key.view());
  }
  size_t q = 0;
  for (auto _ : state) benchmark::DoNotOptimize(table::key_hash(keys[q++ & (kQueries - 1)]));
  state.counters["key_bytes"] = static_cast<double>(keys[0].size());
}
BENCHMARK(BM_Part_Hash);

void BM_Part_EpochGuard(benchmark::State& state) {
  const World& w = world();
  for (auto _ : state) {
    table::EpochDomain::Guard guard(table::EpochDomain::global());
    benchmark::DoNotOptimize(w.current.load(std::memory_order_seq_cst));
  }
}
BENCHMARK(BM_Part_EpochGuard);

void BM_Part_FindNearest(benchmark::State& state) {
  const World& w = world();
  std::vector<std::pair<std::string, uint64_t>> keys;
  for (size_t q = 0; q < kQueries; ++q) {
    table::KeyBuffer key;
    table::build_own_key(w.hits[q], "cpu", w.device_name, &key);
    keys.emplace_back(std::string(key.view()), table::key_hash(key.view()));
  }
  const table::Snapshot* snap = w.current.load();
  size_t q = 0;
  for (auto _ : state) {
    const size_t i = q++ & (kQueries - 1);
    const table::Bucket* b = snap->find(keys[i].first, keys[i].second);
    size_t idx = 0;
    benchmark::DoNotOptimize(table::Snapshot::nearest(*b, w.hits[i].m, w.policy, &idx));
  }
}
BENCHMARK(BM_Part_FindNearest);

// ------------------------------------------------------------ (b) miss, get_default

void BM_Miss(benchmark::State& state) {
  const World& w = world();
  size_t q = 0;
  int64_t hits = 0;
  for (auto _ : state) {
    core::Plan plan;
    hits += table_lookup(w, w.misses[q++ & (kQueries - 1)], &plan);
    benchmark::DoNotOptimize(plan);
  }
  if (hits != 0) state.SkipWithError("a BM_Miss query hit");
}
BENCHMARK(BM_Miss);

void BM_GetDefault(benchmark::State& state) {
  const World& w = world();
  const dispatch::DeviceInfo& dev = dispatch::cpu_device_info();
  size_t q = 0;
  for (auto _ : state) {
    core::Plan plan = core::get_default(w.misses[q++ & (kQueries - 1)], dev);
    benchmark::DoNotOptimize(plan);
  }
}
BENCHMARK(BM_GetDefault);

// ------------------------------------------------------------ (d) baseline

inline bool baseline_lookup(const World& w, const core::Problem& p, core::Plan* plan) {
  // What a first implementation writes: the key as a std::string per call.
  std::string key = std::string(dispatch::device_type_name(p.device.type)) + "/" + std::string(core::op_name(p.op)) +
                    "|" + w.device_name + "|K=" + std::to_string(p.k) + ",N=" + std::to_string(p.n) +
                    ",dtype=" + std::string(dispatch::dtype_name(p.in_dtype));
  std::shared_lock<std::shared_mutex> lock(w.baseline.mu);
  auto it = w.baseline.map.find(key);
  if (it == w.baseline.map.end() || it->second.empty()) return false;
  const auto& rows = it->second;
  auto hi = rows.lower_bound(p.m);
  if (hi == rows.end()) {
    *plan = std::prev(hi)->second;
  } else if (hi->first == p.m || hi == rows.begin()) {
    *plan = hi->second;
  } else {
    auto lo = std::prev(hi);
    *plan = (p.m - lo->first <= hi->first - p.m) ? lo->second : hi->second;  // tie: smaller key
  }
  return true;
}

void BM_Baseline_SharedMutex(benchmark::State& state) {
  const World& w = world();
  size_t q = static_cast<size_t>(state.thread_index()) * 977;
  int64_t hits = 0;
  ThreadClock clock;
  for (auto _ : state) {
    core::Plan plan;
    hits += baseline_lookup(w, w.hits[q++ & (kQueries - 1)], &plan);
    benchmark::DoNotOptimize(plan);
  }
  clock.finish(state);
  if (hits != state.iterations()) state.SkipWithError("a baseline query missed");
}
BENCHMARK(BM_Baseline_SharedMutex)->Threads(1)->Threads(2)->UseRealTime();

// Same answers from both: checked once before any timing (see main).
bool check_same_answers(const World& w) {
  for (size_t q = 0; q < kQueries; ++q) {
    core::Plan a, b;
    const bool ha = table_lookup(w, w.hits[q], &a);
    const bool hb = baseline_lookup(w, w.hits[q], &b);
    if (ha != hb || !ha || a.variant != b.variant || std::memcmp(a.params, b.params, sizeof a.params) != 0) {
      std::fprintf(stderr, "table and baseline disagree on query %zu (M=%lld)\n", q,
                   static_cast<long long>(w.hits[q].m));
      return false;
    }
  }
  return true;
}

// ------------------------------------------------------------ (c) dispatch overhead

struct Tiny {
  std::vector<float> x, y, w, a, b, d;
  Tiny()
      : x(kTinyHidden, 0.5f),
        y(kTinyHidden),
        w(kTinyHidden, 1.0f),
        a(kTinyGemm, 0.25f),
        b(kTinyGemm * kTinyGemm, 0.5f),
        d(kTinyGemm) {}
  dispatch::RmsNormArgs norm_args() {
    return {.y = dispatch::make_tensor_2d(y.data(), dispatch::DType::fp32, 1, kTinyHidden, kTinyHidden),
            .x = dispatch::make_tensor_2d(x.data(), dispatch::DType::fp32, 1, kTinyHidden, kTinyHidden),
            .w = dispatch::make_tensor_1d(w.data(), dispatch::DType::fp32, kTinyHidden),
            .eps = 1e-6f};
  }
  dispatch::GemmArgs gemm_args() {
    return {.a = dispatch::make_tensor_2d(a.data(), dispatch::DType::fp32, 1, kTinyGemm, kTinyGemm),
            .b = dispatch::make_tensor_2d(b.data(), dispatch::DType::fp32, kTinyGemm, kTinyGemm, kTinyGemm),
            .d = dispatch::make_tensor_2d(d.data(), dispatch::DType::fp32, 1, kTinyGemm, kTinyGemm),
            .bias = {}};
  }
};

// The plan the Runtime's table serves for `p` (looked up once, outside timing).
bool runtime_plan(dispatch::Runtime& rt, const core::Problem& p, core::Plan* plan) {
  table::KeyBuffer key;
  table::build_own_key(p, dispatch::device_type_name(p.device.type), dispatch::cpu_device_info().device_name, &key);
  table::EpochDomain::Guard guard(table::EpochDomain::global());
  const table::Snapshot* snap = rt.impl().table.current.load(std::memory_order_seq_cst);
  const table::Bucket* b = snap->find(key.view(), table::key_hash(key.view()));
  if (!b) return false;
  size_t idx = 0;
  const table::Row* r = table::Snapshot::nearest(*b, p.m, rt.impl().policy, &idx);
  if (!r || !table::Snapshot::plan(*b, idx).valid()) return false;
  *plan = table::Snapshot::plan(*b, idx);
  return true;
}

void BM_DispatchRmsnorm(benchmark::State& state) {
  World& w = world();
  Tiny t;
  const dispatch::RmsNormArgs args = t.norm_args();
  dispatch::DispatchInfo info;
  if (!dispatch::rmsnorm(*w.rt, args, {}, {.info = &info}).ok() || info.source != dispatch::PlanSource::table) {
    state.SkipWithError("dispatch::rmsnorm did not hit the table");
    return;
  }
  for (auto _ : state) {
    dispatch::Status s = dispatch::rmsnorm(*w.rt, args);
    benchmark::DoNotOptimize(s);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DispatchRmsnorm);

void BM_DirectRmsnorm(benchmark::State& state) {
  World& w = world();
  Tiny t;
  const dispatch::RmsNormArgs args = t.norm_args();
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  core::Plan plan;
  if (!dispatch::api::validate_rmsnorm(args, &p, &la, &empty).ok() || !runtime_plan(*w.rt, p, &plan)) {
    state.SkipWithError("no plan for the tiny rmsnorm");
    return;
  }
  for (auto _ : state) {
    dispatch::Status s = plan.variant->launch(la, p, plan.params);
    benchmark::DoNotOptimize(s);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DirectRmsnorm);

// The host caches disturbed between calls, as a GPU driver's launch path
// does (it walks several hundred KiB of its own state): the hit path's cost
// is then the cache lines it touches, not its instructions. The sweep is
// outside the timed region (manual time).
std::vector<char>& sweep_buffer() {
  static std::vector<char> buf(static_cast<size_t>(1) << 20, 1);
  return buf;
}
void sweep_caches() {
  auto& b = sweep_buffer();
  for (size_t i = 0; i < b.size(); i += 64) b[i] = static_cast<char>(b[i] + 1);
  benchmark::ClobberMemory();
}

// dispatch::gemm on a table hit (kDispatch) or a direct launch of the plan
// it serves; warm, or with the caches swept before each call (kCold).
template <bool kDispatch, bool kCold>
void gemm_hit(benchmark::State& state) {
  World& w = world();
  Tiny t;
  const dispatch::GemmArgs args = t.gemm_args();
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  core::Plan plan;
  if constexpr (kDispatch) {
    dispatch::DispatchInfo info;
    if (!dispatch::gemm(*w.rt, args, {}, {.info = &info}).ok() || info.source != dispatch::PlanSource::table) {
      state.SkipWithError("dispatch::gemm did not hit the table");
      return;
    }
  } else if (!dispatch::api::validate_gemm(args, &p, &la, &empty).ok() || !runtime_plan(*w.rt, p, &plan)) {
    state.SkipWithError("no plan for the tiny gemm");
    return;
  }
  for (auto _ : state) {
    std::chrono::steady_clock::time_point t0;
    if constexpr (kCold) {
      sweep_caches();
      t0 = std::chrono::steady_clock::now();
    }
    dispatch::Status s;
    if constexpr (kDispatch)
      s = dispatch::gemm(*w.rt, args);
    else
      s = plan.variant->launch(la, p, plan.params);
    benchmark::DoNotOptimize(s);
    benchmark::ClobberMemory();
    if constexpr (kCold)
      state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}
void BM_DispatchGemm(benchmark::State& state) { gemm_hit<true, false>(state); }
void BM_DirectGemm(benchmark::State& state) { gemm_hit<false, false>(state); }
void BM_DispatchGemmColdCache(benchmark::State& state) { gemm_hit<true, true>(state); }
void BM_DirectGemmColdCache(benchmark::State& state) { gemm_hit<false, true>(state); }
BENCHMARK(BM_DispatchGemm);
BENCHMARK(BM_DirectGemm);
BENCHMARK(BM_DispatchGemmColdCache)->UseManualTime()->Iterations(20000);
BENCHMARK(BM_DirectGemmColdCache)->UseManualTime()->Iterations(20000);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const World& w = world();
  std::fprintf(stderr, "table: %zu keys, %lld rows (%zu files from sglang-configs, %d synthetic gemm keys x 14 M)\n",
               w.table_keys, static_cast<long long>(w.table_rows), w.sglang_files, kSynthKeys);
  if (!check_same_answers(w)) return 1;
  benchmark::AddCustomContext("table_keys", std::to_string(w.table_keys));
  benchmark::AddCustomContext("table_rows", std::to_string(w.table_rows));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
