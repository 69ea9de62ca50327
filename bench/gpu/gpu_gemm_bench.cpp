// SPDX-License-Identifier: Apache-2.0
// kdispatch_gpu_gemm_bench: two GEMM measurements the Python benchmark
// (bench/gpu/bench_gpu.py --sections gemm) cannot make, on a CUDA device:
//
//  overhead  host-side dispatch cost of dispatch::gemm on a table hit:
//            host time of N calls of dispatch::gemm minus host time of N
//            direct calls of the same plan (plan.variant->launch with the
//            same arguments), per call: the median over 31 pairs of
//            400-call bursts (the two in alternating order) of their
//            difference (a burst never fills the launch queue; the stream
//            is drained before each burst, untimed). Shapes: the committed
//            table's.
//  tiled     our tiled mma.sync family alone at M >= 1024: the best of its
//            compiled points (every block shape x stages, split_k 1) against
//            cuBLASLt's own first pick (get_default's cuBLASLt plan), CUDA
//            events around 20 back-to-back launches after warm-up, median of
//            5; M = 1024 and 4096 on the Llama (N, K) grid.
//
//  sweep     (--sweep M,M,...: only this) every point of the skinny and
//            skinny_mma spaces, get_default's plan and cuBLASLt's first pick
//            on the Llama (N, K) grid at the given M: the tuner's clock (a
//            256 MiB L2-evicting read before each launch, CUDA events around
//            the launch alone), the points timed in turns over --reps rounds
//            (default 15), a fresh random order each round; median per point.
//            The design data behind the decode families' spaces and defaults.
//
//  probe-lt  (--probe-lt: only this) cuBLASLt's first pick timed cold right
//            after each of a few of our plans (and after itself), on three
//            streams (legacy, per-thread, a non-blocking one, events on the
//            launch's stream; L2 evicted by a 256 MiB memset on it), with
//            the host time of its launch call: why the sweep's random order
//            reads it slower than the grid bench's back-to-back calls.
//
//  profile   (--profile M,N,K/M,N,K...: only this) get_default's plan, the
//            table's plan where it differs, and
//            cuBLASLt's pick launched twice each per shape after a 256 MiB
//            memset: a short program to run under ncu.
//
//  fixed-cost (--fixed-cost: only this) time against bytes, cold, in one
//            clock (256 MiB memset, events on the launch's stream, the
//            implementations in turns, 31 rounds, median): an empty kernel,
//            cudaMemcpyAsync of half the weight bytes (the bench's read
//            ceiling), a plain read kernel (bench/gpu/gpu_read_kernels.cu),
//            get_default's plan and cuBLASLt's pick at M = 1, 8, 16 for
//            weights of 16 to 224 MiB: the fixed cost and the streaming rate
//            of each.
//
//  data-probe (--data-probe M,N,K: only this) the table's plan against
//            cuBLASLt's pick on the tuner's data and on the grid bench's,
//            with the tuner's clock: whether the data moves a tuned winner.
//
//   kdispatch_gpu_gemm_bench --configs DIR [--csv FILE] [--sweep 1,8,16 [--reps N]] [--probe-lt] [--fixed-cost]
//                            [--data-probe M,N,K]
//                            [--profile M,N,K/...]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.hpp"
#include "backends/registry.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "gpu/gemm_plan.hpp"
#include "backends/backend.hpp"
#include "ops/gemm.hpp"
#include "gpu_bench_util.hpp"
#include "tune/harness.hpp"
#include "tune/search.hpp"

using namespace dispatch;
using kdbench::dalloc;
using kdbench::median;

cudaError_t kd_launch_empty(float* out, cudaStream_t s);
cudaError_t kd_launch_read(const void* p, int64_t bytes, int blocks, float* out, cudaStream_t s);

namespace {

/// A bf16 GEMM problem on `d` with 16-byte aligned rows (what the modes below time).
core::Problem bf16_problem(Device d, int64_t m, int64_t n, int64_t k) {
  core::Problem p;
  p.op = core::OpKind::gemm;
  p.device = d;
  p.in_dtype = p.out_dtype = DType::bf16;
  p.m = m, p.n = n, p.k = k;
  p.align_bytes = 16;
  return p;
}

/// Contiguous A [m, k], B [n, k], D [m, n] on `stream` with a 32 MiB workspace.
core::LaunchArgs contiguous_args(void* A, void* B, void* D, int64_t n, int64_t k, void* stream, void* ws) {
  core::LaunchArgs la;
  la.data[core::kGemmArgA] = A, la.ld[core::kGemmArgA] = k;
  la.data[core::kGemmArgB] = B, la.ld[core::kGemmArgB] = k;
  la.data[core::kGemmArgD] = D, la.ld[core::kGemmArgD] = n;
  la.stream = stream, la.workspace = ws, la.workspace_bytes = int64_t{32} << 20;
  return la;
}

/// cuBLASLt's first heuristic pick (get_default's cuBLASLt plan, algo_id -1).
core::Plan cublaslt_pick() {
  core::Plan pl;
  pl.variant = core::find_variant("gemm_bf16__cublaslt");
  pl.params[0] = -1;
  return pl;
}

/// The plan a runtime's table serves for bf16 (N, K) at M, through the public
/// lookup (what a table hit of dispatch::gemm resolves to).
Result<core::Plan> table_plan(const Runtime& rt, const DeviceInfo& dev, int64_t m, int64_t n, int64_t k) {
  LookupQuery q;
  q.op = "gemm";
  q.key = "N=" + std::to_string(n) + ",K=" + std::to_string(k) + ",dtype=bf16";
  q.device = dev.device_name;
  q.backend = "cuda";
  q.M = m;
  auto lr = lookup(rt, q);
  if (!lr.ok()) return lr.status();
  return core::plan_from_config(lr->config, core::OpKind::gemm, DeviceType::cuda);
}

void fill(void* d, size_t elems, std::mt19937& rng) {
  std::vector<uint16_t> h(elems);
  std::normal_distribution<float> nd(0.f, 0.5f);
  for (auto& v : h) v = core::float_to_bf16(nd(rng));
  CK(cudaMemcpy(d, h.data(), elems * 2, cudaMemcpyHostToDevice));
}

}  // namespace

int main(int argc, char** argv) {
  std::string configs = "configs", csv_path = "gpu_gemm_bench.csv", sweep_ms;
  int sweep_reps = 15;
  bool probe_lt = false, fixed_cost = false;
  std::string profile, nk_filter, data_probe;  // --nk 1280x8192,...: the sweep's shapes (default: all eight)
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--probe-lt")
      probe_lt = true;
    else if (std::string(argv[i]) == "--fixed-cost")
      fixed_cost = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--configs")
      configs = argv[i + 1];
    else if (a == "--csv")
      csv_path = argv[i + 1];
    else if (a == "--sweep")
      sweep_ms = argv[i + 1];
    else if (a == "--reps")
      sweep_reps = std::max(3, std::atoi(argv[i + 1]));
    else if (a == "--profile")
      profile = argv[i + 1];
    else if (a == "--data-probe")
      data_probe = argv[i + 1];
    else if (a == "--nk")
      nk_filter = "," + std::string(argv[i + 1]) + ",";
  }
  const backends::Backend* ops = backends::find(DeviceType::cuda);
  if (!ops || !ops->status().available) {
    std::printf("kdispatch_gpu_gemm_bench: no usable CUDA device\n");
    return 0;
  }
  const DeviceInfo& dev = *ops->device_info(0);
  RuntimeOptions o;
  o.load_shipped_configs = false;
  o.config_dirs = {configs};
  o.log_level = LogLevel::off;
  auto rt = Runtime::create(o);
  if (!rt.ok()) {
    std::fprintf(stderr, "runtime: %s\n", rt.status().to_string().c_str());
    return 1;
  }
  const Device d{DeviceType::cuda, 0};
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (Status s = (*rt)->attach_stream(d, Stream{stream}); !s.ok()) {
    std::fprintf(stderr, "attach_stream: %s\n", s.to_string().c_str());
    return 1;
  }
  FILE* csv = std::fopen(csv_path.c_str(), "w");
  std::fprintf(csv, "what,M,N,K,variant,a_us,b_us,value\n");
  std::mt19937 rng(1);
  const std::pair<int64_t, int64_t> nks[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336},
                                             {1280, 8192}, {8192, 1024}, {7168, 8192},  {8192, 3584}};
  const int64_t maxM = 4096, maxN = 28672, maxK = 14336;
  void* A = dalloc(size_t(maxM) * maxK * 2);
  void* B = dalloc(size_t(maxN) * maxK * 2);
  void* D = dalloc(size_t(maxM) * maxN * 2);
  void* ws = dalloc(size_t{32} << 20);
  fill(A, size_t(maxM) * maxK, rng);
  fill(B, size_t(4096) * 4096, rng);  // the values do not matter for timing; a part is enough

  // ---------------------------------------------------------------- data-probe
  // --data-probe M,N,K: the table's plan vs cuBLASLt's pick on the tuner's
  // data (uniform(-1, 1)) and on the grid bench's (weights randn * 0.05, x
  // randn), with the tuner's clock, in turns, 31 rounds.
  if (!data_probe.empty()) {
    long long M = 0, N = 0, K = 0;
    int copies = 4;  // --data-probe M,N,K[,copies]
    if (std::sscanf(data_probe.c_str(), "%lld,%lld,%lld,%d", &M, &N, &K, &copies) < 3 || copies < 0 || copies > 64 ||
        M < 1 || M > maxM || N < 1 || N > maxN || K < 1 || K > maxK) {
      std::fprintf(stderr, "--data-probe M,N,K (M <= %lld, N <= %lld, K <= %lld)\n", (long long)maxM, (long long)maxN,
                   (long long)maxK);
      return 2;
    }
    const core::Problem p = bf16_problem(d, M, N, K);
    auto lk = table_plan(**rt, dev, M, N, K);
    if (!lk.ok()) {
      std::fprintf(stderr, "data-probe: no table plan: %s\n", lk.status().to_string().c_str());
      return 1;
    }
    const core::Plan tuned = *lk, pick = cublaslt_pick();
    const core::LaunchArgs la = contiguous_args(A, B, D, N, K, ops->tuner_stream(), ws);
    std::unique_ptr<tune::Clock> clock = ops->memory().make_clock(dev);
    // The table plan and the pick in turns on `args`, a host wait per rep
    // (the tuner's clock before e43801a): their medians.
    auto in_turns = [&](const core::LaunchArgs& args, int rounds) {
      std::vector<double> tt, tp;
      for (int r = 0; r < rounds; ++r)
        for (int w = 0; w < 2; ++w) {
          const bool first_tuned = (r + w) % 2 == 0;
          const core::Plan& pl = first_tuned ? tuned : pick;
          clock->flush();
          auto us = clock->time_us([&] { return pl.variant->launch(args, p, pl.params); });
          if (us.ok()) (first_tuned ? tt : tp).push_back(*us);
        }
      return std::make_pair(median(tt), median(tp));
    };
    for (int data = 0; data < 2; ++data) {
      std::vector<uint16_t> ha(size_t(M) * K), hb(size_t(N) * K);
      std::mt19937 g(5);
      std::uniform_real_distribution<float> u(-1.f, 1.f);
      std::normal_distribution<float> nd(0.f, 1.f);
      for (auto& v : ha) v = core::float_to_bf16(data == 0 ? u(g) : nd(g));
      for (auto& v : hb) v = core::float_to_bf16(data == 0 ? u(g) : 0.05f * nd(g));
      CK(cudaMemcpy(A, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(B, hb.data(), hb.size() * 2, cudaMemcpyHostToDevice));
      const auto [t_tuned, t_pick] = in_turns(la, 31);
      std::printf("data-probe M=%lld N=%lld K=%lld %s: table plan %.2f us, cuBLASLt's pick %.2f us (%s)\n", M, N, K,
                  data == 0 ? "uniform(-1,1) (the tuner's), host wait per rep"
                            : "randn, weights x0.05 (the grid's), host wait per rep",
                  t_tuned, t_pick, core::plan_to_string(tuned).c_str());
    }
    // The same pair timed the grid bench's way (gpu_timing.py): chunks of 5
    // reps of each, every rep behind an L2 flush, the chunk behind a lead of
    // GPU work (two more flushes) so the host never waits, no host sync
    // inside a chunk; against the tuner's clock (a host sync after every rep).
    {
      constexpr int kChunk = 5, kRounds = 12;
      std::vector<cudaEvent_t> ev(2 * 2 * kChunk * kRounds);
      for (auto& e : ev) CK(cudaEventCreate(&e));
      std::vector<double> t_grid[2];
      for (int r = 0; r < kRounds; ++r) {
        clock->flush();
        clock->flush();
        for (int w = 0; w < 2; ++w) {
          const int which = (r + w) % 2;  // 0: table plan, 1: pick
          const core::Plan& pl = which == 0 ? tuned : pick;
          for (int i = 0; i < kChunk; ++i) {
            clock->flush();
            cudaEvent_t* e = &ev[static_cast<size_t>(((r * 2 + w) * kChunk + i) * 2)];
            CK(cudaEventRecord(e[0], ops->tuner_stream() ? static_cast<cudaStream_t>(ops->tuner_stream()) : nullptr));
            (void)pl.variant->launch(la, p, pl.params);
            CK(cudaEventRecord(e[1], ops->tuner_stream() ? static_cast<cudaStream_t>(ops->tuner_stream()) : nullptr));
          }
        }
        CK(cudaDeviceSynchronize());
        for (int w = 0; w < 2; ++w)
          for (int i = 0; i < kChunk; ++i) {
            cudaEvent_t* e = &ev[static_cast<size_t>(((r * 2 + w) * kChunk + i) * 2)];
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e[0], e[1]));
            t_grid[(r + w) % 2].push_back(ms * 1e3);
          }
      }
      for (auto& e : ev) CK(cudaEventDestroy(e));
      std::printf(
          "data-probe M=%lld N=%lld K=%lld grid-style timing (no sync per rep): table plan %.2f us, cuBLASLt's "
          "pick %.2f us, ratio %.3f\n",
          M, N, K, median(t_grid[0]), median(t_grid[1]), median(t_grid[0]) / median(t_grid[1]));
    }
    // The same pair on fresh copies of the weights (new allocations: other
    // physical pages), uniform data: does the order depend on placement?
    std::vector<void*> held;
    std::vector<double> ratios;
    for (int place = 0; place < copies; ++place) {
      held.push_back(dalloc(size_t{64} << 20));  // a gap before the next copy
      void* b2 = dalloc(size_t(N) * K * 2);
      CK(cudaMemcpy(b2, B, size_t(N) * K * 2, cudaMemcpyDeviceToDevice));
      const core::LaunchArgs la2 = contiguous_args(A, b2, D, N, K, ops->tuner_stream(), ws);
      const auto [t_tuned, t_pick] = in_turns(la2, 21);
      std::printf("data-probe M=%lld N=%lld K=%lld weights copy %d: table plan %.2f us, cuBLASLt's pick %.2f us\n", M,
                  N, K, place + 1, t_tuned, t_pick);
      ratios.push_back(t_tuned / t_pick);
    }
    if (!ratios.empty()) {
      std::sort(ratios.begin(), ratios.end());
      std::printf("data-probe M=%lld N=%lld K=%lld table/pick over %d copies: min %.3f median %.3f max %.3f\n", M, N, K,
                  copies, ratios.front(), ratios[ratios.size() / 2], ratios.back());
    }
    return 0;
  }

  // ---------------------------------------------------------------- fixed-cost
  if (fixed_cost) {
    void* flushbuf = dalloc(size_t{256} << 20);
    void* copy_dst = dalloc(size_t{128} << 20);
    float* out = static_cast<float*>(dalloc(size_t{1} << 20));
    CK(cudaMemset(out, 0, size_t{1} << 20));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int sms = dev.compute_units > 0 ? dev.compute_units : 132;
    const std::pair<int64_t, int64_t> wk[] = {{8192, 1024}, {4096, 4096}, {6144, 4096}, {7168, 8192}, {28672, 4096}};
    std::printf("fixed-cost: cold us per implementation (median of 31 rounds, in turns); W = N*K*2 bytes\n");
    for (auto [N, K] : wk) {
      const int64_t wbytes = N * K * 2;
      std::vector<std::pair<std::string, std::function<bool()>>> impls;
      impls.push_back({"empty kernel", [&] { return kd_launch_empty(out, stream) == cudaSuccess; }});
      impls.push_back({"memcpy W/2", [&] {
                         return cudaMemcpyAsync(copy_dst, B, wbytes / 2, cudaMemcpyDeviceToDevice, stream) ==
                                cudaSuccess;
                       }});
      for (int per_sm : {2, 4, 8})
        impls.push_back({"read " + std::to_string(per_sm) + "/SM",
                         [&, per_sm] { return kd_launch_read(B, wbytes, sms * per_sm, out, stream) == cudaSuccess; }});
      std::vector<core::Problem> probs;
      for (int64_t M : {1, 8, 16}) probs.push_back(bf16_problem(d, M, N, K));
      const core::LaunchArgs la = contiguous_args(A, B, D, N, K, stream, ws);
      std::vector<core::Plan> plans(probs.size() * 2);
      for (size_t i = 0; i < probs.size(); ++i) {
        plans[2 * i] = core::get_default(probs[i], dev);
        plans[2 * i + 1] = cublaslt_pick();
        for (int j = 0; j < 2; ++j) {
          const core::Plan* pl = &plans[2 * i + j];
          const core::Problem* pp = &probs[i];
          impls.push_back(
              {(j ? "cuBLASLt M=" : "default M=") + std::to_string(pp->m) + " " + std::string(pl->variant->name),
               [&, pl, pp] { return pl->variant->launch(la, *pp, pl->params).ok(); }});
        }
      }
      std::vector<std::vector<double>> t(impls.size());
      for (auto& im : impls) (void)im.second();  // warm-up (module load, heuristic pick)
      CK(cudaStreamSynchronize(stream));
      for (int r = 0; r < 31; ++r)
        for (size_t q = 0; q < impls.size(); ++q) {
          const size_t i = (q + r) % impls.size();
          CK(cudaMemsetAsync(flushbuf, r, size_t{256} << 20, stream));
          CK(cudaEventRecord(e0, stream));
          const bool ok = impls[i].second();
          CK(cudaEventRecord(e1, stream));
          CK(cudaEventSynchronize(e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          if (ok) t[i].push_back(ms * 1e3);
        }
      for (size_t i = 0; i < impls.size(); ++i) {
        const double us = median(t[i]);
        std::printf("  W=%4lld MiB (N=%5lld K=%5lld) %-36s %8.2f us  %6.0f GB/s\n", (long long)(wbytes >> 20),
                    (long long)N, (long long)K, impls[i].first.c_str(), us, wbytes / us * 1e-3);
        std::fprintf(csv, "fixed_cost,0,%lld,%lld,\"%s\",%.3f,0,%zu\n", (long long)N, (long long)K,
                     impls[i].first.c_str(), us, t[i].size());
      }
      std::fflush(stdout);
    }
    std::fclose(csv);
    return 0;
  }

  // ---------------------------------------------------------------- profile
  if (!profile.empty()) {
    void* flushbuf = dalloc(size_t{256} << 20);
    for (size_t pos = 0; pos < profile.size();) {
      size_t e = profile.find('/', pos);
      if (e == std::string::npos) e = profile.size();
      long long m = 0, n = 0, k = 0;
      if (std::sscanf(profile.substr(pos, e - pos).c_str(), "%lld,%lld,%lld", &m, &n, &k) != 3) return 2;
      pos = e + 1;
      const core::Problem p = bf16_problem(d, m, n, k);
      const core::LaunchArgs la = contiguous_args(A, B, D, n, k, stream, ws);
      // get_default's plan, the table's (--configs) when it differs, cuBLASLt's pick.
      std::vector<core::Plan> plans{core::get_default(p, dev)};
      if (auto tp = table_plan(**rt, dev, m, n, k); tp.ok() && !(*tp == plans[0])) plans.push_back(*tp);
      plans.push_back(cublaslt_pick());
      for (const core::Plan& pl : plans) {
        std::printf("profile M=%lld N=%lld K=%lld: %s\n", m, n, k, core::plan_to_string(pl).c_str());
        for (int r = 0; r < 2; ++r) {
          CK(cudaMemsetAsync(flushbuf, 0, size_t{256} << 20, stream));
          if (!pl.variant->launch(la, p, pl.params).ok()) std::printf("  launch failed\n");
        }
      }
    }
    CK(cudaStreamSynchronize(stream));
    std::fflush(stdout);
    return 0;
  }

  // ---------------------------------------------------------------- probe-lt
  if (probe_lt) {
    void* flushbuf = dalloc(size_t{256} << 20);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const core::VariantDef* sk = core::find_variant("gemm_bf16__skinny");
    const core::VariantDef* sm = core::find_variant("gemm_bf16__skinny_mma");
    struct Shape {
      int64_t m, n, k;
    };
    const Shape shapes[] = {{1, 4096, 4096}, {1, 1280, 8192}, {16, 8192, 1024}, {4, 4096, 4096}, {16, 28672, 4096}};
    const std::pair<const char*, cudaStream_t> streams[] = {
        {"legacy", nullptr}, {"per-thread", cudaStreamPerThread}, {"non-blocking", stream}};
    std::printf("probe-lt: cuBLASLt's pick (algo -1) timed cold right after another plan, 15 rounds, medians\n");
    for (const Shape& sh : shapes) {
      const core::Problem p = bf16_problem(d, sh.m, sh.n, sh.k);
      const core::Plan ltp = cublaslt_pick();
      // Predecessors: itself, get_default, then the first points below.
      std::vector<std::pair<std::string, core::Plan>> preds = {{"cublaslt", ltp},
                                                               {"default", core::get_default(p, dev)}};
      // The first point of each space: a skinny plan, skinny_mma without and with a cluster.
      auto add_first = [&](const char* name, const core::VariantDef* v,
                           const std::function<bool(const core::Plan&)>& pred) {
        for (const core::Plan& q : core::config_space(*v, p, dev))
          if (pred(q)) {
            preds.push_back({name, q});
            return;
          }
      };
      add_first("skinny", sk, [](const core::Plan&) { return true; });
      add_first("smma", sm, [](const core::Plan& q) { return q.params[gpu::gemm::kSkinnyMmaCluster] == 1; });
      add_first("smma-cluster", sm, [](const core::Plan& q) { return q.params[gpu::gemm::kSkinnyMmaCluster] > 1; });
      for (const auto& [sname, st] : streams) {
        const core::LaunchArgs la = contiguous_args(A, B, D, sh.n, sh.k, st, ws);
        auto timed = [&](const core::Plan& pl, double* host_us) {
          CK(cudaMemsetAsync(flushbuf, 0, size_t{256} << 20, st));
          CK(cudaEventRecord(e0, st));
          const auto t0 = std::chrono::steady_clock::now();
          const Status s = pl.variant->launch(la, p, pl.params);
          if (host_us)
            *host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
          CK(cudaEventRecord(e1, st));
          CK(cudaEventSynchronize(e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          return s.ok() ? ms * 1e3 : -1.0;
        };
        for (const auto& [pname, pl] : preds) {
          std::vector<double> tl, th, tp;
          for (int r = 0; r < 15; ++r) {
            tp.push_back(timed(pl, nullptr));
            double h = 0;
            tl.push_back(timed(ltp, &h));
            th.push_back(h);
          }
          std::printf(
              "  M=%3lld N=%5lld K=%5lld %-12s after %-12s: cuBLASLt %7.2f us (host %6.2f us) | before it %7.2f us  "
              "%s\n",
              (long long)sh.m, (long long)sh.n, (long long)sh.k, sname, pname.c_str(), median(tl), median(th),
              median(tp), core::plan_to_string(pl).c_str());
          std::fprintf(csv, "probe_lt,%lld,%lld,%lld,\"%s after %s\",%.3f,%.3f,%.3f\n", (long long)sh.m,
                       (long long)sh.n, (long long)sh.k, sname, pname.c_str(), median(tl), median(tp), median(th));
        }
      }
      // The tuner's clock (legacy-stream events and flush kernel, launch on
      // the per-thread stream), as the sweep and the tuner time it.
      tune::DeviceMemory* mem = &ops->memory();
      std::unique_ptr<tune::Clock> clock = mem->make_clock(dev);
      const core::LaunchArgs la = contiguous_args(A, B, D, sh.n, sh.k, ops->tuner_stream(), ws);
      for (const auto& [pname, pl] : preds) {
        std::vector<double> tl, tp;
        for (int r = 0; r < 15; ++r) {
          clock->flush();
          auto a = clock->time_us([&] { return pl.variant->launch(la, p, pl.params); });
          clock->flush();
          auto b = clock->time_us([&] { return ltp.variant->launch(la, p, ltp.params); });
          tp.push_back(a.ok() ? *a : -1);
          tl.push_back(b.ok() ? *b : -1);
        }
        std::printf("  M=%3lld N=%5lld K=%5lld tuner-clock  after %-12s: cuBLASLt %7.2f us | before it %7.2f us\n",
                    (long long)sh.m, (long long)sh.n, (long long)sh.k, pname.c_str(), median(tl), median(tp));
        std::fprintf(csv, "probe_lt,%lld,%lld,%lld,\"tuner-clock after %s\",%.3f,%.3f,0\n", (long long)sh.m,
                     (long long)sh.n, (long long)sh.k, pname.c_str(), median(tl), median(tp));
      }
      std::fflush(stdout);
      std::fflush(csv);
    }
    std::fclose(csv);
    return 0;
  }

  // ---------------------------------------------------------------- sweep
  if (!sweep_ms.empty()) {
    std::vector<int64_t> ms;
    for (size_t pos = 0; pos < sweep_ms.size();) {
      const size_t c = sweep_ms.find(',', pos);
      ms.push_back(std::atoll(sweep_ms.substr(pos, c - pos).c_str()));
      pos = c == std::string::npos ? sweep_ms.size() : c + 1;
    }
    tune::DeviceMemory* mem = &ops->memory();
    std::unique_ptr<tune::Clock> clock = mem->make_clock(dev);
    const core::VariantDef* fams[] = {core::find_variant("gemm_bf16__skinny"),
                                      core::find_variant("gemm_bf16__skinny_mma")};
    std::printf("sweep: %d rounds per point, cold L2, the tuner's clock\n", sweep_reps);
    for (int64_t M : ms) {
      for (auto [N, K] : nks) {
        if (!nk_filter.empty() &&
            nk_filter.find("," + std::to_string(N) + "x" + std::to_string(K) + ",") == std::string::npos)
          continue;
        const core::Problem p = bf16_problem(d, M, N, K);
        const core::LaunchArgs la = contiguous_args(A, B, D, N, K, ops->tuner_stream(), ws);
        std::vector<core::Plan> plans;
        for (const core::VariantDef* v : fams)
          for (const core::Plan& pl : core::config_space(*v, p, dev)) plans.push_back(pl);
        // cuBLASLt's pick and get_default's plan, each once: a plan equal to
        // one already listed is that one (never timed against itself).
        auto index_of = [&](const core::Plan& q) {
          for (size_t i = 0; i < plans.size(); ++i)
            if (plans[i] == q) return i;
          plans.push_back(q);
          return plans.size() - 1;
        };
        const size_t n_lt = index_of(cublaslt_pick());
        const size_t n_def = index_of(core::get_default(p, dev));
        // A fresh random order every round: no point always follows the same one.
        std::vector<size_t> order(plans.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::mt19937 shuffle_rng(static_cast<uint32_t>(M * 1000003 + N * 131 + K));
        std::vector<std::vector<double>> t(plans.size()), host(plans.size());
        for (int r = 0; r < sweep_reps; ++r) {
          std::shuffle(order.begin(), order.end(), shuffle_rng);
          for (size_t i : order) {
            clock->flush();
            double h = 0;
            auto us = clock->time_us([&] {
              const auto t0 = std::chrono::steady_clock::now();
              Status st = plans[i].variant->launch(la, p, plans[i].params);
              h = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
              return st;
            });
            if (us.ok()) t[i].push_back(*us), host[i].push_back(h);
          }
        }
        size_t best = 0, best_wn1 = 0;
        bool have_wn1 = false;
        std::vector<double> med(plans.size());
        for (size_t i = 0; i < plans.size(); ++i) {
          med[i] = t[i].empty() ? 1e30 : median(t[i]);
          if (med[i] < med[best]) best = i;
          if (plans[i].variant == fams[1] && plans[i].params[gpu::gemm::kSkinnyMmaWarpsN] == 1 &&
              (!have_wn1 || med[i] < med[best_wn1]))
            best_wn1 = i, have_wn1 = true;
        }
        // Rows: "sweep" per point (value = timed rounds, 0: it failed), then
        // which of them get_default and cuBLASLt's pick are.
        auto row = [&](const char* what, size_t i) {
          std::fprintf(csv, "%s,%lld,%lld,%lld,\"%s\",%.3f,%.3f,%zu\n", what, (long long)M, (long long)N, (long long)K,
                       core::plan_to_string(plans[i]).c_str(), med[i], med[n_lt], t[i].size());
        };
        for (size_t i = 0; i < plans.size(); ++i) row("sweep", i);
        row("sweep_default", n_def);
        row("sweep_cublaslt", n_lt);
        std::fflush(csv);
        std::printf(
            "  M=%3lld N=%5lld K=%5lld best %.2f us %s | warps_n 1: %.2f us %s | default %.2f | cuBLASLt %.2f "
            "(host launch: cuBLASLt %.1f us, max %.1f; the best %.1f us)\n",
            (long long)M, (long long)N, (long long)K, med[best], core::plan_to_string(plans[best]).c_str(),
            have_wn1 ? med[best_wn1] : 0.0, have_wn1 ? core::plan_to_string(plans[best_wn1]).c_str() : "-", med[n_def],
            med[n_lt], median(host[n_lt]),
            host[n_lt].empty() ? 0.0 : *std::max_element(host[n_lt].begin(), host[n_lt].end()), median(host[best]));
        std::vector<size_t> rank(plans.size());
        for (size_t i = 0; i < rank.size(); ++i) rank[i] = i;
        std::sort(rank.begin(), rank.end(), [&](size_t a, size_t b) { return med[a] < med[b]; });
        for (size_t r = 0; r < std::min<size_t>(5, rank.size()); ++r)
          std::printf("      #%zu %.2f us %s\n", r + 1, med[rank[r]], core::plan_to_string(plans[rank[r]]).c_str());
        std::fflush(stdout);
      }
    }
    std::fclose(csv);
    return 0;
  }

  // ---------------------------------------------------------------- overhead
  std::printf("host dispatch overhead on a table hit (dispatch::gemm - direct plan launch), per call:\n");
  std::vector<double> overheads;
  for (auto [N, K] : nks) {
    for (int64_t M : {1, 16, 256}) {
      GemmArgs g{make_tensor_2d(A, DType::bf16, M, K, K, d), make_tensor_2d(B, DType::bf16, N, K, K, d),
                 make_tensor_2d(D, DType::bf16, M, N, N, d), TensorRef{}};
      DispatchInfo info;
      CallOptions co;
      co.info = &info;
      if (Status s = gemm(**rt, g, Stream{stream}, co); !s.ok() || info.source != PlanSource::table) {
        std::printf("  N=%lld K=%lld M=%lld: not a table hit (%s), skipped\n", (long long)N, (long long)K, (long long)M,
                    s.ok() ? "default" : s.to_string().c_str());
        continue;
      }
      // The same plan, launched directly (what the table hit resolves to).
      core::Problem p;
      p.op = core::OpKind::gemm;
      p.device = d;
      p.in_dtype = p.out_dtype = DType::bf16;
      p.m = M, p.n = N, p.k = K;
      // The plan the table serves, through the public lookup.
      auto lk = table_plan(**rt, dev, M, N, K);
      if (!lk.ok()) {
        std::printf("  no table plan: %s\n", lk.status().to_string().c_str());
        continue;
      }
      core::LaunchArgs la;
      la.data[core::kGemmArgA] = A, la.ld[core::kGemmArgA] = K;
      la.data[core::kGemmArgB] = B, la.ld[core::kGemmArgB] = K;
      la.data[core::kGemmArgD] = D, la.ld[core::kGemmArgD] = N;
      la.stream = stream, la.workspace = ws, la.workspace_bytes = int64_t{32} << 20;
      constexpr int kBurst = 400;
      std::vector<double> t_api, t_direct, t_diff;
      auto burst = [&](bool api) {
        CK(cudaStreamSynchronize(stream));
        const auto t0 = std::chrono::steady_clock::now();
        if (api)
          for (int i = 0; i < kBurst; ++i) (void)gemm(**rt, g, Stream{stream});
        else
          for (int i = 0; i < kBurst; ++i) (void)lk->variant->launch(la, p, lk->params);
        return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kBurst;
      };
      for (int rep = 0; rep < 31; ++rep) {
        // Alternating which burst goes first cancels order effects (a
        // warmer host cache, the driver's queue state).
        const bool api_first = rep % 2 == 0;
        const double first = burst(api_first), second = burst(!api_first);
        const double a = api_first ? first : second, b = api_first ? second : first;
        t_api.push_back(a);
        t_direct.push_back(b);
        t_diff.push_back(a - b);
      }
      CK(cudaStreamSynchronize(stream));
      const double a = median(t_api), b = median(t_direct), d = median(t_diff);
      overheads.push_back(d * 1e3);
      std::printf("  N=%5lld K=%5lld M=%4lld %-26s dispatch::gemm %.3f us, direct %.3f us, overhead %.0f ns\n",
                  (long long)N, (long long)K, (long long)M, std::string(info.variant).c_str(), a, b, d * 1e3);
      std::fprintf(csv, "overhead,%lld,%lld,%lld,%s,%.4f,%.4f,%.1f\n", (long long)M, (long long)N, (long long)K,
                   info.variant, a, b, d * 1e3);
    }
  }
  std::printf("overhead median %.0f ns over %zu table hits\n", median(overheads), overheads.size());

  // ---------------------------------------------------------------- tiled alone
  std::printf("tiled mma.sync family alone (best point) vs cuBLASLt's first pick, M >= 1024:\n");
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const core::VariantDef* tiled = core::find_variant("gemm_bf16__tiled_mma");
  const core::VariantDef* lt = core::find_variant("gemm_bf16__cublaslt");
  std::vector<double> fractions;
  for (auto [N, K] : nks) {
    for (int64_t M : {1024, 4096}) {
      core::Problem p;
      p.op = core::OpKind::gemm;
      p.device = d;
      p.in_dtype = p.out_dtype = DType::bf16;
      p.m = M, p.n = N, p.k = K;
      core::LaunchArgs la;
      la.data[core::kGemmArgA] = A, la.ld[core::kGemmArgA] = K;
      la.data[core::kGemmArgB] = B, la.ld[core::kGemmArgB] = K;
      la.data[core::kGemmArgD] = D, la.ld[core::kGemmArgD] = N;
      la.stream = stream, la.workspace = ws, la.workspace_bytes = int64_t{32} << 20;
      auto time_plan = [&](const core::Plan& pl) -> double {
        for (int i = 0; i < 3; ++i)
          if (!pl.variant->launch(la, p, pl.params).ok()) return -1;
        std::vector<double> v;
        for (int r = 0; r < 5; ++r) {
          CK(cudaEventRecord(e0, stream));
          for (int i = 0; i < 20; ++i) (void)pl.variant->launch(la, p, pl.params);
          CK(cudaEventRecord(e1, stream));
          CK(cudaEventSynchronize(e1));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, e0, e1));
          v.push_back(ms * 1e3 / 20);
        }
        return median(v);
      };
      double best = 1e30;
      std::string best_s;
      for (const core::Plan& pl : core::config_space(*tiled, p, dev)) {
        if (pl.params[gpu::gemm::kTiledSplitK] != 1) continue;
        const double t = time_plan(pl);
        if (t > 0 && t < best) best = t, best_s = core::plan_to_string(pl);
      }
      core::Plan ltp;
      ltp.variant = lt;
      ltp.params[0] = -1;
      const double tl = time_plan(ltp);
      fractions.push_back(tl / best);
      std::printf("  N=%5lld K=%5lld M=%4lld tiled %.1f us (%s), cuBLASLt %.1f us: tiled at %.0f%% of cuBLASLt\n",
                  (long long)N, (long long)K, (long long)M, best, best_s.c_str(), tl, 100 * tl / best);
      std::fprintf(csv, "tiled,%lld,%lld,%lld,\"%s\",%.3f,%.3f,%.4f\n", (long long)M, (long long)N, (long long)K,
                   best_s.c_str(), best, tl, tl / best);
    }
  }
  std::sort(fractions.begin(), fractions.end());
  double gm = 0;
  for (double f : fractions) gm += std::log(f);
  std::printf("tiled / cuBLASLt at M >= 1024: geomean %.0f%%, min %.0f%%, max %.0f%% of cuBLASLt's speed\n",
              100 * std::exp(gm / fractions.size()), 100 * fractions.front(), 100 * fractions.back());
  std::fclose(csv);
  return 0;
}
