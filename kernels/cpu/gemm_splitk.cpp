// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — gemm_fp32__splitk: D[M,N] = A[M,K] · B[N,K]^T (+ bias[N])
// with K split into slices that run on the persistent thread pool
// (thread_pool.hpp), fp32 in and out.
//
// Each slice s computes the partial product over its K range with the
// blocked loop nest (gemm_fp32_accumulate, the same micro-kernels as
// gemm_fp32__blocked) into its thread's scratch, then folds it into D under
// a mutex: the first slice to finish stores (partial + bias), every later
// one adds. The order of those additions is the order in which the slices
// FINISH, which depends on thread scheduling, so two runs of the same call
// can differ in the last bits: the variant is flagged
// kVariantNondeterministic (the tuner's deterministic mode excludes it).
// Why this reduction and not atomic float adds: a CAS loop per element costs
// ~10 ns uncontended, M·N·split_k of them (2 M at M=256, N=1024, split 8) is
// as much as the product itself; the locked fold is a vectorised pass over a
// buffer that is still in cache, and it overlaps the slower slices' compute.
// D is written, never accumulated into, so no reset_to_zero role is needed.
//
// Params, in Plan::params order:
//   split_k {2, 4, 8}               K slices; threads = min(split_k, hardware threads),
//                                   the caller included; slices are taken dynamically
//   ukernel scalar | avx2 | avx512  the blocked variant's micro-kernels (declined when
//                                   the host lacks the ISA)
// Slices are whole multiples of 16 elements of K (one AVX-512 vector), so a
// small K runs fewer slices (K <= 16: one, on the caller). Block sizes are
// fixed: at M <= MR (decode) a slice is one K pass (its B rows stream once,
// one horizontal reduction per output); otherwise 128 x 256 x 512, the
// blocked default for a 1 MiB L2. M runs in chunks whose partial (chunk x N
// fp32) stays within 4 MiB per thread, so the scratch is bounded whatever M.
// Any M, N, K >= 1 and strides (lda may be 0).
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>

#include "cpu/cpu_common.hpp"
#include "ops/gemm.hpp"
#include "cpu/gemm_list.hpp"
#include "cpu/thread_pool.hpp"

namespace dispatch::cpu {
namespace {

using namespace core::variant_names;

constexpr int64_t kSliceAlign = 16;          // K elements: one AVX-512 vector
constexpr int64_t kPartialFloats = 1 << 20;  // per-thread partial: 4 MiB

/// The calling thread's partial sums (cpu_common.hpp's thread_floats,
/// grown to what a call needs).
struct SplitKPartial;

/// One M chunk of one call: what every slice task reads, and the fold state.
struct SplitKJob {
  GemmUkernel uk = GemmUkernel::scalar;
  const float* a = nullptr;  // at the chunk's first row
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float* d = nullptr;  // at the chunk's first row
  int64_t ldd = 0;
  const float* bias = nullptr;
  int64_t rows = 0, n = 0, k = 0;
  int64_t slice = 0;  // K elements per slice (the last may be shorter)
  int64_t bm = 0, bn = 0, bk = 0;

  std::mutex fold_mu;
  int folded = 0;  // slices folded into D so far (guarded by fold_mu)
  std::atomic<bool> out_of_memory{false};
};

void run_slice(void* ctx, int s) noexcept {
  SplitKJob& j = *static_cast<SplitKJob*>(ctx);
  const int64_t k0 = s * j.slice;
  const int64_t kc = std::min(j.slice, j.k - k0);
  const int64_t elems = j.rows * j.n;
  float* part = thread_floats<SplitKPartial>(static_cast<std::size_t>(elems), false);
  if (part == nullptr) {
    j.out_of_memory.store(true, std::memory_order_relaxed);
    return;
  }
  std::fill(part, part + elems, 0.0f);
  GemmAccumulate g;
  g.m = j.rows;
  g.n = j.n;
  g.k = kc;
  g.a = j.a + k0;
  g.lda = j.lda;
  g.b = j.b + k0;
  g.ldb = j.ldb;
  g.c = part;
  g.ldc = j.n;
  g.bm = j.bm;
  g.bn = j.bn;
  g.bk = j.bk > 0 ? j.bk : kc;
  (void)gemm_fp32_accumulate(g, j.uk);  // the ISA was checked by launch

  // Fold in finish order: the first finisher stores, later ones add.
  std::lock_guard<std::mutex> lock(j.fold_mu);
  const bool first = j.folded++ == 0;
  for (int64_t i = 0; i < j.rows; ++i) {
    float* drow = j.d + i * j.ldd;
    const float* prow = part + i * j.n;
    if (!first) {
      for (int64_t x = 0; x < j.n; ++x) drow[x] += prow[x];
    } else if (j.bias != nullptr) {
      for (int64_t x = 0; x < j.n; ++x) drow[x] = prow[x] + j.bias[x];
    } else {
      std::copy(prow, prow + j.n, drow);
    }
  }
}

// ------------------------------------------------------------------ config space

constexpr int64_t kSplitValues[] = {2, 4, 8};
constexpr int64_t kUkernelValues[] = {0, 1, 2};
constexpr std::string_view kUkernelLabels[] = {"scalar", "avx2", "avx512"};

constexpr ParamDef kSplitKParams[] = {
    {"split_k", ParamKind::integer, kSplitValues, {}, 4},
    {"ukernel", ParamKind::enumeration, kUkernelValues, kUkernelLabels, 0},
};

bool host_runs(GemmUkernel uk) noexcept {
  const HostIsa& isa = host_isa();
  switch (uk) {
    case GemmUkernel::scalar: return true;
    case GemmUkernel::avx2: return KDISPATCH_CPU_X86 && isa.avx2;
    case GemmUkernel::avx512: return KDISPATCH_CPU_X86 && isa.avx512;
    default: return false;
  }
}

Status splitk_supports(const Problem& p, const int64_t* prm, const DeviceInfo&) {
  const VariantDef& v = kGemmFp32SplitK;
  if (p.op != OpKind::gemm) return decline(v, StatusCode::unsupported_problem, "not a gemm problem");
  if (p.device.type != DeviceType::cpu)
    return decline(v, StatusCode::unsupported_device, "CPU variant, problem is on another device");
  if (p.in_dtype != DType::fp32) return decline(v, StatusCode::unsupported_problem, "input dtype must be fp32");
  if (p.out_dtype != DType::fp32) return decline(v, StatusCode::unsupported_problem, "output dtype must be fp32");
  if (p.n < 1 || p.k < 1) return decline(v, StatusCode::invalid_argument, "N and K must be >= 1");
  if (!params_in_space(v, prm))
    return decline(v, StatusCode::invalid_argument, "a param value is outside its config space");
  if (!host_runs(static_cast<GemmUkernel>(prm[kSplitKUkernel])))
    return decline(v, StatusCode::unsupported_problem, "the ukernel needs an ISA this host lacks");
  return Status::Ok();
}

Status splitk_launch(const LaunchArgs& args, const Problem& p, const int64_t* prm) {
  if (p.m < 1) return Status::Ok();
  if (args.data[core::kGemmArgA] == nullptr || args.data[core::kGemmArgB] == nullptr ||
      args.data[core::kGemmArgD] == nullptr)
    return make_status(StatusCode::invalid_argument, "gemm: a, b and d must not be null");
  if (p.has_bias && args.data[core::kGemmArgBias] == nullptr)
    return make_status(StatusCode::invalid_argument, "gemm: has_bias but bias is null");
  const auto uk = static_cast<GemmUkernel>(prm[kSplitKUkernel]);
  if (!host_runs(uk))
    return make_status(StatusCode::unsupported_problem, "gemm: the plan's ukernel needs an ISA this host lacks");
  const int64_t M = p.m, N = p.n, K = p.k;
  const int64_t split = std::clamp<int64_t>(prm[kSplitKSlices], 1, 64);
  const int64_t slice = (K + split - 1) / split;
  const int64_t slice_len = (slice + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
  const int slices = static_cast<int>((K + slice_len - 1) / slice_len);
  const int threads = static_cast<int>(std::min<int64_t>(split, hardware_threads()));
  const int64_t chunk_rows = std::clamp<int64_t>(kPartialFloats / N, 1, M);
  const bool decode = chunk_rows <= gemm_ukernel_mr(uk);

  const auto* a = static_cast<const float*>(args.data[core::kGemmArgA]);
  const auto* b = static_cast<const float*>(args.data[core::kGemmArgB]);
  auto* d = static_cast<float*>(args.data[core::kGemmArgD]);
  for (int64_t m0 = 0; m0 < M; m0 += chunk_rows) {
    SplitKJob job;
    job.uk = uk;
    job.a = a + m0 * args.ld[core::kGemmArgA];
    job.lda = args.ld[core::kGemmArgA];
    job.b = b;
    job.ldb = args.ld[core::kGemmArgB];
    job.d = d + m0 * args.ld[core::kGemmArgD];
    job.ldd = args.ld[core::kGemmArgD];
    job.bias = p.has_bias ? static_cast<const float*>(args.data[core::kGemmArgBias]) : nullptr;
    job.rows = std::min(chunk_rows, M - m0);
    job.n = N;
    job.k = K;
    job.slice = slice_len;
    job.bm = 128;
    job.bn = 256;
    job.bk = decode ? 0 : 512;  // 0: the whole slice in one pass
    parallel_for(slices, threads, &run_slice, &job);
    if (job.out_of_memory.load(std::memory_order_relaxed))
      return make_status(StatusCode::out_of_memory, "gemm_fp32__splitk: partial buffer allocation failed");
  }
  return Status::Ok();
}

}  // namespace

constinit const core::VariantDef kGemmFp32SplitK{
    .name = "gemm_fp32__splitk",
    .op = OpKind::gemm,
    .backend = DeviceType::cpu,
    .in_dtype = DType::fp32,
    .params = kSplitKParams,
    .flags = core::kVariantNondeterministic,
    .schema_version = 1,
    .supports = &splitk_supports,
    .launch = &splitk_launch,
};

}  // namespace dispatch::cpu
