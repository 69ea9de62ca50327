// SPDX-License-Identifier: Apache-2.0
// The CPU plugin machinery and the two GEMM families added with it:
// - libkdispatch_cpu_openblas.so (gemm_fp32__openblas): it loads into this
//   binary (which does not link OpenBLAS) without adding a symbol to the
//   global namespace; KDISPATCH_OPENBLAS=0 disables it; absence is reported,
//   not an error; a table from another build is refused; its variant matches
//   the float64 reference and declines what BLAS cannot express.
// - gemm_fp32__splitk: flagged nondeterministic, within fp32 tolerance at
//   any M, N, K (K tails, M chunks, concurrent callers).
// - the thread pool under it: every task once, nested and concurrent calls,
//   fork.
// (Every CPU variant, the plugin's included, also runs at every config point
// on the shapes of tests/test_cpu_kernels.cpp.)
#include <doctest/doctest.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/validate.hpp"
#include "core/op.hpp"
#include "backends/plugin_abi.hpp"
#include "backends/plugin_loader.hpp"
#include "backends/registry.hpp"
#include "cpu/gemm_list.hpp"
#include "cpu/thread_pool.hpp"
#include "dispatch/device.hpp"
#include "dispatch/runtime.hpp"
#include "reference.hpp"
#include "table/key.hpp"

namespace {

using dispatch::DeviceInfo;
using dispatch::DeviceType;
using dispatch::DType;
using dispatch::StatusCode;
using dispatch::core::LaunchArgs;
using dispatch::core::OpKind;
using dispatch::core::Plan;
using dispatch::core::Problem;
using dispatch::core::VariantDef;
namespace core = dispatch::core;
namespace cpu = dispatch::cpu;

constexpr std::string_view kOpenBlasVariant = "gemm_fp32__openblas";

DeviceInfo host_device(int threads = 2) {
  DeviceInfo d;
  d.device = {DeviceType::cpu, 0};
  d.device_name = "CPU_x86_64_test";
  d.compute_units = threads;
  d.l2_bytes = 32 << 20;
  d.available = true;
  return d;
}

/// Whether this run should have the plugin: it was built, and neither
/// KDISPATCH_OPENBLAS=0 nor a KDISPATCH_CPU_PLUGIN_DIR elsewhere says otherwise.
bool plugin_expected(std::string* why) {
#ifndef KDISPATCH_TEST_OPENBLAS_PLUGIN
  *why = "the plugin was not built (KDISPATCH_OPENBLAS=OFF, or libopenblas not found at configure time)";
  return false;
#else
  const core::PluginLoadOptions env = core::plugin_options_from_env();
  if (!env.openblas_enabled) {
    *why = "KDISPATCH_OPENBLAS=" + env.openblas_env + " in the environment";
    return false;
  }
  if (!env.plugin_dir.empty()) {
    *why = "KDISPATCH_CPU_PLUGIN_DIR=" + env.plugin_dir + " in the environment";
    return false;
  }
  return true;
#endif
}

/// The registry's OpenBLAS variant, or nullptr (with the test saying why).
const VariantDef* openblas_variant() {
  const VariantDef* v = core::find_variant(kOpenBlasVariant);
  if (v == nullptr) MESSAGE("gemm_fp32__openblas absent: ", core::plugin_status());
  return v;
}

/// An fp32 gemm problem as an op call builds it (validate_gemm), on buffers
/// the object owns. lda = -1: contiguous; 0: A broadcast along M.
struct GemmCase {
  int64_t m, n, k;
  int64_t lda, ldb, ldd;
  bool bias;
  std::vector<float> a, b, d, bias_v;
  Problem p;
  LaunchArgs args;

  GemmCase(int64_t m_, int64_t n_, int64_t k_, bool bias_ = false, int64_t lda_ = -1, int64_t ldb_pad = 0,
           int64_t ldd_pad = 0, uint32_t seed = 1)
      : m(m_), n(n_), k(k_), lda(lda_ < 0 ? k_ : lda_), ldb(k_ + ldb_pad), ldd(n_ + ldd_pad), bias(bias_) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    a.resize(static_cast<size_t>(lda == 0 ? k : m * lda));
    b.resize(static_cast<size_t>(n * ldb));
    d.assign(static_cast<size_t>(m * ldd), std::nanf(""));
    bias_v.resize(static_cast<size_t>(n));
    for (float& x : a) x = u(rng);
    for (float& x : b) x = u(rng);
    for (float& x : bias_v) x = u(rng);
    dispatch::GemmArgs ga;
    ga.a = dispatch::make_tensor_2d(a.data(), DType::fp32, m, k, lda);
    ga.b = dispatch::make_tensor_2d(b.data(), DType::fp32, n, k, ldb);
    ga.d = dispatch::make_tensor_2d(d.data(), DType::fp32, m, n, ldd);
    if (bias) ga.bias = dispatch::make_tensor_1d(bias_v.data(), DType::fp32, n);
    bool empty = false;
    const dispatch::Status s = dispatch::api::validate_gemm(ga, &p, &args, &empty);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
  }

  /// Runs `plan` and checks D against the float64 reference (fp32
  /// tolerance: 1e-5 of ||a_m||·||b_n|| + |bias_n|) and the padding.
  void check(const Plan& plan) {
    std::fill(d.begin(), d.end(), std::nanf(""));
    const dispatch::Status st = plan.variant->launch(args, p, plan.params);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    const auto want = kdtest::ref::gemm(m, n, k, a.data(), lda, b.data(), ldb, bias ? bias_v.data() : nullptr);
    double worst = 0;
    int64_t bad = 0, padding_hit = 0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldd; ++j) {
        const float got = d[static_cast<size_t>(i * ldd + j)];
        if (j >= n) {
          padding_hit += std::isnan(got) ? 0 : 1;
          continue;
        }
        const double w = want.d[static_cast<size_t>(i * n + j)];
        const double tol = 1e-5 * want.scale[static_cast<size_t>(i * n + j)] + 1e-30;
        if (!std::isfinite(got)) {
          ++bad;
          continue;
        }
        worst = std::max(worst, std::fabs(got - w) / tol);
      }
    }
    CHECK(bad == 0);
    CHECK(padding_hit == 0);
    CHECK(worst <= 1.0);
  }
};

Plan make_plan(const VariantDef& v, std::initializer_list<int64_t> params) {
  Plan plan;
  plan.variant = &v;
  size_t i = 0;
  for (int64_t x : params) plan.params[i++] = x;
  return plan;
}

/// The widest split-K micro-kernel this host runs.
int64_t best_ukernel() {
  for (int64_t uk : {2, 1}) {
    Problem p;
    p.m = p.n = p.k = 8;
    const int64_t prm[core::kMaxParams] = {2, uk};
    if (cpu::kGemmFp32SplitK.supports(p, prm, host_device()).ok()) return uk;
  }
  return 0;
}

// ------------------------------------------------------------------ loading

TEST_CASE("cpu plugin: the OpenBLAS plugin loads in this binary or the test says why it cannot") {
  const std::string& status = core::plugin_status();
  MESSAGE("plugin status: ", status);
  CHECK(!status.empty());
  CHECK(status.find('\n') == std::string::npos);  // one line
  std::string why;
  if (!plugin_expected(&why)) {
    MESSAGE("skipped: ", why);
    CHECK(core::find_variant(kOpenBlasVariant) == nullptr);
#ifdef KDISPATCH_TEST_OPENBLAS_PLUGIN
    const core::PluginLoadOptions env = core::plugin_options_from_env();
    if (!env.openblas_enabled) CHECK(status == "openblas: disabled by KDISPATCH_OPENBLAS=" + env.openblas_env);
#endif
    return;
  }
  REQUIRE_MESSAGE(status.rfind("openblas: loaded ", 0) == 0, status);
  const VariantDef* v = core::find_variant(kOpenBlasVariant);
  REQUIRE(v != nullptr);
  CHECK(v->backend == DeviceType::cpu);
  CHECK(v->op == OpKind::gemm);
  CHECK(v->in_dtype == DType::fp32);
  CHECK((v->flags & core::kVariantNondeterministic) == 0);  // OpenBLAS splits M/N, never K
  CHECK((v->flags & core::kVariantReference) == 0);
  // A second-class citizen nowhere: listed per op, resolvable from a config row.
  bool listed = false;
  for (const VariantDef* g : core::variants_for(OpKind::gemm, DeviceType::cpu)) listed = listed || g == v;
  CHECK(listed);
  dispatch::Config row;
  row.emplace_back("variant", dispatch::ConfigValue::string(std::string(kOpenBlasVariant)));
  row.emplace_back("threads", dispatch::ConfigValue::integer(2));
  const auto plan = core::plan_from_config(row, OpKind::gemm, DeviceType::cpu);
  REQUIRE_MESSAGE(plan.ok(), plan.status().to_string());
  CHECK(plan->variant == v);
  CHECK(plan->params[0] == 2);
  CHECK(core::plan_to_string(*plan) == "gemm_fp32__openblas{threads=2}");
  CHECK(core::registry_errors().empty());
}

TEST_CASE("cpu plugin: loading it adds no symbol to the process's global namespace") {
  (void)core::all_variants();  // the registry (and the plugin) is loaded
  // Neither the module's entry point nor anything of libopenblas it pulled
  // in is visible to a global lookup: a host's own BLAS keeps its names.
  CHECK(::dlsym(RTLD_DEFAULT, "cblas_sgemm") == nullptr);
  CHECK(::dlsym(RTLD_DEFAULT, "cblas_sgemv") == nullptr);
  CHECK(::dlsym(RTLD_DEFAULT, "sgemm_") == nullptr);
  CHECK(::dlsym(RTLD_DEFAULT, "openblas_get_config") == nullptr);
  CHECK(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads") == nullptr);
  CHECK(::dlsym(RTLD_DEFAULT, core::kCpuPluginEntryV1) == nullptr);
  if (core::find_variant(kOpenBlasVariant) == nullptr)
    MESSAGE("(the plugin is not loaded in this run: ", core::plugin_status(), ")");
}

TEST_CASE("cpu plugin: KDISPATCH_OPENBLAS=0 disables it and a missing plugin is a status not an error") {
  // The environment, as the registry reads it.
  const char* saved = std::getenv("KDISPATCH_OPENBLAS");
  const std::string saved_value = saved ? saved : "";
  for (const char* off : {"0", "off", "FALSE", "no"}) {
    ::setenv("KDISPATCH_OPENBLAS", off, 1);
    const core::PluginLoadOptions o = core::plugin_options_from_env();
    CHECK_MESSAGE(!o.openblas_enabled, off);
    const core::PluginLoadResult r = core::load_cpu_plugins(o);
    CHECK(!r.loaded);
    CHECK(r.variants.empty());
#ifdef KDISPATCH_TEST_OPENBLAS_PLUGIN
    CHECK_MESSAGE(r.status == std::string("openblas: disabled by KDISPATCH_OPENBLAS=") + off, r.status);
#endif
  }
  for (const char* on : {"1", "on", ""}) {
    ::setenv("KDISPATCH_OPENBLAS", on, 1);
    CHECK_MESSAGE(core::plugin_options_from_env().openblas_enabled, on);
  }
  if (saved) {
    ::setenv("KDISPATCH_OPENBLAS", saved_value.c_str(), 1);
  } else {
    ::unsetenv("KDISPATCH_OPENBLAS");
  }

  core::PluginLoadOptions nowhere;
  nowhere.plugin_dir = "/nonexistent/kdispatch-plugins";
  const core::PluginLoadResult r = core::load_cpu_plugins(nowhere);
  CHECK(!r.loaded);
  CHECK(r.variants.empty());
#ifdef KDISPATCH_TEST_OPENBLAS_PLUGIN
  CHECK_MESSAGE(
      r.status.find("libkdispatch_cpu_openblas.so not found in /nonexistent/kdispatch-plugins") != std::string::npos,
      r.status);

  // KDISPATCH_CPU_PLUGIN_DIR pointing at the build's module: it loads, and
  // (dlopen of an open module) hands out the very variants the registry has.
  std::string dir = KDISPATCH_TEST_OPENBLAS_PLUGIN;
  dir = dir.substr(0, dir.rfind('/'));
  core::PluginLoadOptions here;
  here.plugin_dir = dir;
  const core::PluginLoadResult h = core::load_cpu_plugins(here);
  REQUIRE_MESSAGE(h.loaded, h.status);
  REQUIRE(h.variants.size() == 1);
  CHECK(h.variants[0]->name == kOpenBlasVariant);
  if (const VariantDef* reg = core::find_variant(kOpenBlasVariant)) CHECK(h.variants[0] == reg);
  CHECK(h.status.find("OpenBLAS") != std::string::npos);  // the description names the library
#else
  CHECK(r.status.find("not built") != std::string::npos);
#endif
}

TEST_CASE("cpu plugin: a table from another build or with bad variants is refused with a reason") {
  static const VariantDef kGood{.name = "gemm_fp32__test_plugin", .op = OpKind::gemm, .backend = DeviceType::cpu};
  static const VariantDef kGpu{.name = "gemm_fp32__test_gpu", .op = OpKind::gemm, .backend = DeviceType::cuda};
  static const VariantDef kClash{.name = "gemm_fp32__blocked", .op = OpKind::gemm, .backend = DeviceType::cpu};
  static const VariantDef* const kGoodList[] = {&kGood};
  KdispatchCpuPluginV1 t{};
  t.abi_version = core::kCpuPluginAbiVersion;
  t.struct_size = sizeof t;
  t.layout = core::plugin_layout_fingerprint();
  t.kdispatch_version = dispatch::version();
  t.name = "test";
  t.description = "test";
  t.variant_count = 1;
  t.variants = kGoodList;
  CHECK(core::check_plugin_table(&t) == "");

  auto refused = [](KdispatchCpuPluginV1 bad, std::string_view expect) {
    const std::string why = core::check_plugin_table(&bad);
    INFO(why);
    CHECK(why.find(expect) != std::string::npos);
  };
  KdispatchCpuPluginV1 bad = t;
  bad.abi_version = 2;
  refused(bad, "ABI version 2");
  bad = t;
  bad.struct_size = 8;
  refused(bad, "bytes");
  bad = t;
  bad.layout ^= 1;
  refused(bad, "layout");
  bad = t;
  bad.kdispatch_version = "0.0.0-other";
  refused(bad, "built for kdispatch 0.0.0-other");
  static const VariantDef* const kNull[] = {nullptr};
  bad = t;
  bad.variants = kNull;
  refused(bad, "is null");
  static const VariantDef* const kGpuList[] = {&kGpu};
  bad = t;
  bad.variants = kGpuList;
  refused(bad, "not a CPU variant");
  static const VariantDef* const kClashList[] = {&kClash};
  bad = t;
  bad.variants = kClashList;
  refused(bad, "name of a built-in variant");
  static const VariantDef* const kTwice[] = {&kGood, &kGood};
  bad = t;
  bad.variant_count = 2;
  bad.variants = kTwice;
  refused(bad, "listed twice");
  CHECK(core::check_plugin_table(nullptr) != "");
}

// ------------------------------------------------------------------ gemm_fp32__openblas

TEST_CASE("cpu gemm: gemm_fp32__openblas declines lda = 0 and ldb = 0 and bf16 and threads beyond the host") {
  const VariantDef* v = openblas_variant();
  if (v == nullptr) return;
  const DeviceInfo dev = host_device();
  const int64_t one_thread[core::kMaxParams] = {1};

  GemmCase broadcast(6, 19, 33, true, /*lda=*/0);
  CHECK(broadcast.p.stride_code != 0);
  dispatch::Status st = v->supports(broadcast.p, one_thread, dev);
  CHECK(st.code() == StatusCode::unsupported_problem);
  CHECK_MESSAGE(st.message().find("lda = 0") != std::string::npos, st.message());
  CHECK(st.message().find("gemm_fp32__openblas") != std::string::npos);
  // Called anyway (a forced plan): refused before BLAS sees the stride.
  st = v->launch(broadcast.args, broadcast.p, one_thread);
  CHECK(st.code() == StatusCode::unsupported_problem);

  // One row: the stride class is the default one, and sgemv needs no lda.
  GemmCase row(1, 19, 33, true, /*lda=*/0);
  CHECK(v->supports(row.p, one_thread, dev).ok());
  row.check(make_plan(*v, {1}));

  // B broadcast along N.
  std::vector<float> a(4 * 8, 1.0f), b(8, 1.0f), d(4 * 5);
  dispatch::GemmArgs ga;
  ga.a = dispatch::make_tensor_2d(a.data(), DType::fp32, 4, 8, 8);
  ga.b = dispatch::make_tensor_2d(b.data(), DType::fp32, 5, 8, 0);
  ga.d = dispatch::make_tensor_2d(d.data(), DType::fp32, 4, 5, 5);
  Problem pb;
  LaunchArgs la;
  bool empty = false;
  REQUIRE(dispatch::api::validate_gemm(ga, &pb, &la, &empty).ok());
  st = v->supports(pb, one_thread, dev);
  CHECK(st.code() == StatusCode::unsupported_problem);
  CHECK_MESSAGE(st.message().find("ldb = 0") != std::string::npos, st.message());

  // The decoding of Problem::stride_code in the plugin matches pack_stride_code.
  for (uint8_t a0 : {0, 1, 2}) {
    uint8_t classes[4][2] = {{a0, 1}, {2, 1}, {2, 1}, {0, 0}};
    const int8_t ranks[4] = {2, 2, 2, 0};
    Problem q = GemmCase(4, 8, 8).p;
    q.stride_code = dispatch::table::pack_stride_code(classes, ranks, 3);
    CHECK(v->supports(q, one_thread, dev).ok() == (a0 != 0));
  }

  Problem bf16 = GemmCase(4, 8, 8).p;
  bf16.in_dtype = bf16.out_dtype = DType::bf16;
  st = v->supports(bf16, one_thread, dev);
  CHECK(st.code() == StatusCode::unsupported_problem);
  CHECK_MESSAGE(st.message().find("fp32") != std::string::npos, st.message());
  Problem mixed = GemmCase(4, 8, 8).p;
  mixed.out_dtype = DType::bf16;
  CHECK(!v->supports(mixed, one_thread, dev).ok());

  const int64_t two_threads[core::kMaxParams] = {2};
  CHECK(v->supports(GemmCase(4, 8, 8).p, two_threads, host_device(2)).ok());
  st = v->supports(GemmCase(4, 8, 8).p, two_threads, host_device(1));
  CHECK(st.code() == StatusCode::unsupported_problem);
  const int64_t three_threads[core::kMaxParams] = {3};
  CHECK(v->supports(GemmCase(4, 8, 8).p, three_threads, host_device(8)).code() == StatusCode::invalid_argument);
}

TEST_CASE("cpu gemm: gemm_fp32__openblas matches the float64 reference at serving shapes with 1 and 2 threads") {
  const VariantDef* v = openblas_variant();
  if (v == nullptr) return;
  struct Shape {
    int64_t m, n, k;
    bool bias;
    int64_t ldb_pad, ldd_pad;
  };
  const Shape shapes[] = {
      {1, 4096, 4096, false, 0, 0},   // decode: sgemv
      {16, 4864, 896, true, 0, 0},    // small batch, bias post-pass
      {64, 1024, 1024, false, 3, 5},  // padded rows
      {3, 7, 1, true, 0, 0},          // K = 1
  };
  const int64_t host_threads = cpu::hardware_threads();
  for (const Shape& s : shapes) {
    GemmCase c(s.m, s.n, s.k, s.bias, -1, s.ldb_pad, s.ldd_pad, 7);
    for (int64_t t : {1, 2}) {
      if (t > host_threads) continue;
      INFO("M=", s.m, " N=", s.n, " K=", s.k, " threads=", t);
      c.check(make_plan(*v, {t}));
    }
  }
}

// ------------------------------------------------------------------ gemm_fp32__splitk

TEST_CASE("cpu gemm: gemm_fp32__splitk is flagged nondeterministic and matches the reference at any shape") {
  CHECK((cpu::kGemmFp32SplitK.flags & core::kVariantNondeterministic) != 0);
  CHECK((cpu::kGemmFp32Blocked.flags & core::kVariantNondeterministic) == 0);
  CHECK(core::find_variant("gemm_fp32__splitk") == &cpu::kGemmFp32SplitK);
  // get_default never picks it: a default must be reproducible.
  for (int64_t m : {1, 16, 256}) {
    Problem p = GemmCase(m, 64, 4096).p;
    CHECK(core::get_default(p, host_device()).variant != &cpu::kGemmFp32SplitK);
  }

  const int64_t uk = best_ukernel();
  struct Shape {
    int64_t m, n, k;
    bool bias;
  };
  const Shape shapes[] = {
      {1, 1, 1, true},         // one slice, on the caller
      {3, 5, 15, false},       // K below one aligned slice
      {2, 9, 17, true},        // a 16-wide slice and a 1-wide tail
      {1, 4096, 4096, false},  // decode: a slice is one K pass
      {16, 600, 896, true},    // several M tiles, 8 slices of 112
      {5, 33, 1000, false},    // uneven slices
      {7, 300000, 3, true},    // N so large that M runs in chunks of 3 rows
  };
  for (const Shape& s : shapes) {
    GemmCase c(s.m, s.n, s.k, s.bias, -1, 0, 0, 11);
    for (int64_t split : {2, 4, 8}) {
      for (int64_t u : {int64_t{0}, uk}) {
        INFO("M=", s.m, " N=", s.n, " K=", s.k, " split_k=", split, " ukernel=", u);
        c.check(make_plan(cpu::kGemmFp32SplitK, {split, u}));
      }
    }
  }
}

TEST_CASE("cpu gemm: gemm_fp32__splitk from concurrent callers (the pool busy: the caller runs its slices)") {
  const int64_t uk = best_ukernel();
  std::atomic<int> failures{0};
  auto worker = [&](uint32_t seed) {
    GemmCase c(9, 70, 600, true, -1, 0, 0, seed);
    const auto want = kdtest::ref::gemm(c.m, c.n, c.k, c.a.data(), c.lda, c.b.data(), c.ldb, c.bias_v.data());
    const Plan plan = make_plan(cpu::kGemmFp32SplitK, {8, uk});
    for (int it = 0; it < 50; ++it) {
      if (!plan.variant->launch(c.args, c.p, plan.params).ok()) ++failures;
      for (int64_t i = 0; i < c.m * c.n; ++i) {
        const double tol = 1e-5 * want.scale[static_cast<size_t>(i)];
        if (!(std::fabs(c.d[static_cast<size_t>(i)] - want.d[static_cast<size_t>(i)]) <= tol)) {
          ++failures;
          break;
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) threads.emplace_back(worker, 100 + t);
  for (std::thread& t : threads) t.join();
  CHECK(failures.load() == 0);
}

// ------------------------------------------------------------------ the thread pool

struct Counts {
  std::vector<std::atomic<int>> hits;
  explicit Counts(int n) : hits(static_cast<size_t>(n)) {}
};

void count_task(void* ctx, int t) noexcept { static_cast<Counts*>(ctx)->hits[static_cast<size_t>(t)]++; }

TEST_CASE("cpu thread pool: every task runs exactly once whatever the threads and nested calls run inline") {
  const int hw = cpu::hardware_threads();
  CHECK(hw >= 1);
  CHECK(cpu::parallel_for(0, 4, &count_task, nullptr) == 0);
  for (int tasks : {1, 2, 3, 8, 100}) {
    for (int threads : {1, 2, 8, 64}) {
      Counts c(tasks);
      const int used = cpu::parallel_for(tasks, threads, &count_task, &c);
      INFO("tasks=", tasks, " threads=", threads, " used=", used);
      CHECK(used >= 1);
      CHECK(used <= std::min({tasks, threads, hw}));
      for (auto& h : c.hits) CHECK(h.load() == 1);
    }
  }
  // A task that itself calls parallel_for: the pool is busy, the inner call
  // runs on the task's thread; nothing deadlocks.
  struct Nested {
    Counts inner{16 * 4};
    static void outer(void* ctx, int t) noexcept {
      auto* n = static_cast<Nested*>(ctx);
      struct Slice {
        Counts* c;
        int base;
      } s{&n->inner, t * 16};
      cpu::parallel_for(
          16, 4,
          [](void* x, int i) noexcept {
            auto* sl = static_cast<Slice*>(x);
            sl->c->hits[static_cast<size_t>(sl->base + i)]++;
          },
          &s);
    }
  } nested;
  cpu::parallel_for(4, 4, &Nested::outer, &nested);
  for (auto& h : nested.inner.hits) CHECK(h.load() == 1);
}

TEST_CASE("cpu thread pool: concurrent callers and a fork()ed child all complete") {
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int it = 0; it < 300; ++it) {
        Counts c(12);
        cpu::parallel_for(12, 4, &count_task, &c);
        for (auto& h : c.hits)
          if (h.load() != 1) ++wrong;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  CHECK(wrong.load() == 0);

#if defined(__SANITIZE_THREAD__)
  MESSAGE("fork() part skipped: ThreadSanitizer cannot start threads after a multi-threaded fork");
  return;
#endif
  // The parent's helpers are running; the child has none and must start its own.
  Counts warm(8);
  cpu::parallel_for(8, 8, &count_task, &warm);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    bool ok = true;
    for (int it = 0; it < 20 && ok; ++it) {
      Counts c(8);
      cpu::parallel_for(8, 8, &count_task, &c);
      for (auto& h : c.hits) ok = ok && h.load() == 1;
    }
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace
