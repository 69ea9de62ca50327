// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU plugin "openblas": OpenBLAS's sgemm as a second fp32 GEMM
// family, gemm_fp32__openblas, in the same config space as our own kernels.
//
// This file is the whole module libkdispatch_cpu_openblas.so (see
// backends/plugin_abi.hpp for why it is a separate module and what it may use:
// header-inline kdispatch code only, no function of libkdispatch; the link
// uses --no-undefined and a version script exporting one symbol).
//
//   D[M,N] = A[M,K] · B[N,K]^T (+ bias[N]), fp32 in and out:
//     M >= 2: cblas_sgemm(RowMajor, NoTrans, Trans, M, N, K, 1, A, lda, B, ldb, 0, D, ldd)
//     M == 1: cblas_sgemv(RowMajor, NoTrans, N, K, 1, B, ldb, a, 1, 0, d, 1). OpenBLAS 0.3.21's
//             sgemm does not special-case one row; its sgemv streamed B 2.6x faster
//             (N = K = 4096: 2.4 ms vs 6.2 ms on one core), and M = 1 is decode.
//     bias:   a post-pass in fp32 (D += bias), so beta stays 0 and D is never read.
//
// Params, in Plan::params order:
//   threads {1, 2}  OpenBLAS threads for this call. OpenBLAS 0.3.21 has only a
//                   process-wide count (openblas_set_num_threads; the per-thread
//                   openblas_set_num_threads_local arrived in 0.3.27), so a call
//                   sets it, runs, and restores the previous value under one
//                   mutex: a tuned row measures and runs at its own thread count
//                   whatever OPENBLAS_NUM_THREADS says, and the host's own use of
//                   that OpenBLAS (numpy on the same libopenblas.so.0) keeps its
//                   setting. The price: calls of this family from several threads
//                   run one at a time (each set costs ~5 ns). The results do not
//                   depend on the count (OpenBLAS splits M and N, never K), so the
//                   family is deterministic. Declined when above the host's
//                   hardware threads (DeviceInfo::compute_units).
//
// Declined: bf16/fp16 (Debian's OpenBLAS exports no cblas_sbgemm), an output
// dtype other than fp32, a zero row stride for A or B (lda = 0 broadcast is not
// expressible in BLAS: it needs ld >= K), and dims beyond blasint.
//
// Which OpenBLAS: the module links libopenblas, but a symbol like cblas_sgemm
// is looked up in the global scope first, where a host's own BLAS (MKL loaded
// RTLD_GLOBAL) would win over ours, and then our thread setting would not
// apply to the sgemm that runs. So the BLAS entry points are taken with
// dlsym() from the library that defines openblas_get_config (looked up by
// address with dladdr): sgemm, sgemv and the thread count always come from
// one OpenBLAS.
#include <cblas.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <string_view>

#include "core/op.hpp"
#include "ops/gemm.hpp"
#include "backends/plugin_abi.hpp"
#include "dispatch/device.hpp"
#include "dispatch/status.hpp"

namespace dispatch::cpu::openblas {
namespace {

using namespace core::variant_names;

// ------------------------------------------------------------------ the OpenBLAS we call

struct Blas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_sgemv) sgemv = nullptr;
  decltype(&openblas_set_num_threads) set_threads = nullptr;
  decltype(&openblas_get_num_threads) get_threads = nullptr;
  char description[320] = {};
  bool ok = false;
};

template <class F>
F resolve(void* handle, const char* name, F linked) {
  if (handle != nullptr)
    if (void* p = ::dlsym(handle, name)) return reinterpret_cast<F>(p);
  return linked;
}

const Blas& blas() noexcept {
  static const Blas b = [] {
    Blas r;
    Dl_info info{};
    const char* lib = "?";
    void* handle = nullptr;
    if (::dladdr(reinterpret_cast<void*>(&openblas_get_config), &info) != 0 && info.dli_fname != nullptr) {
      lib = info.dli_fname;
      // Already loaded (it is our dependency): NOLOAD only takes a reference.
      handle = ::dlopen(info.dli_fname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    }
    r.sgemm = resolve(handle, "cblas_sgemm", &cblas_sgemm);
    r.sgemv = resolve(handle, "cblas_sgemv", &cblas_sgemv);
    r.set_threads = resolve(handle, "openblas_set_num_threads", &openblas_set_num_threads);
    r.get_threads = resolve(handle, "openblas_get_num_threads", &openblas_get_num_threads);
    // The pointers stay valid without this reference: the library is our
    // DT_NEEDED dependency, loaded for as long as this module is.
    if (handle != nullptr) ::dlclose(handle);
    const char* config = openblas_get_config();
    std::snprintf(r.description, sizeof r.description, "%s, from %s, %d threads at load", config ? config : "OpenBLAS",
                  lib, openblas_get_num_threads());
    r.ok = r.sgemm != nullptr && r.sgemv != nullptr && r.set_threads != nullptr && r.get_threads != nullptr;
    return r;
  }();
  return b;
}

// ------------------------------------------------------------------ helpers (header-inline only)

extern const VariantDef kGemmFp32OpenBlas;

/// "<variant>: <why>" as a failed Status, built with Status's inline
/// constructor (make_status lives in libkdispatch, which this module must
/// not call).
Status fail(StatusCode code, std::string_view why) noexcept {
  try {
    std::string msg;
    msg.reserve(kGemmFp32OpenBlas.name.size() + 2 + why.size());
    msg.append(kGemmFp32OpenBlas.name).append(": ").append(why);
    return Status(code, std::move(msg));
  } catch (...) {
    return Status(code, std::string());
  }
}

/// True when operand `i` (0 = A, 1 = B, 2 = D; all rank 2) has a zero row
/// stride (core::stride_class decodes Problem::stride_code, inline; the
/// tests check it against table::pack_stride_code).
bool zero_row_stride(const Problem& p, int i) noexcept {
  return core::stride_class(p.stride_code, i, 0, 2) == StrideClass::zero;
}

constexpr int64_t kBlasMax = std::numeric_limits<blasint>::max();

// ------------------------------------------------------------------ the variant

constexpr int kThreads = 0;
constexpr int64_t kThreadsValues[] = {1, 2};
constexpr ParamDef kParams[] = {
    {"threads", ParamKind::integer, kThreadsValues, {}, 1},
};

Status supports(const Problem& p, const int64_t* prm, const DeviceInfo& dev) {
  if (p.op != OpKind::gemm) return fail(StatusCode::unsupported_problem, "not a gemm problem");
  if (p.device.type != DeviceType::cpu)
    return fail(StatusCode::unsupported_device, "CPU variant, problem is on another device");
  if (p.in_dtype != DType::fp32)
    return fail(StatusCode::unsupported_problem,
                "input dtype must be fp32 (this OpenBLAS exports no cblas_sbgemm; bf16 runs on our own kernels)");
  if (p.out_dtype != DType::fp32) return fail(StatusCode::unsupported_problem, "output dtype must be fp32");
  if (p.n < 1 || p.k < 1) return fail(StatusCode::invalid_argument, "N and K must be >= 1");
  if (p.n > kBlasMax || p.k > kBlasMax)
    return fail(StatusCode::unsupported_problem, "N or K exceeds OpenBLAS's integer type");
  if (zero_row_stride(p, 0))
    return fail(StatusCode::unsupported_problem,
                "lda = 0 (A broadcast along M) is not expressible in BLAS, which needs lda >= K");
  if (zero_row_stride(p, 1))
    return fail(StatusCode::unsupported_problem,
                "ldb = 0 (B broadcast along N) is not expressible in BLAS, which needs ldb >= K");
  bool in_space = false;
  for (int64_t v : kThreadsValues) in_space = in_space || v == prm[kThreads];
  if (!in_space) return fail(StatusCode::invalid_argument, "a param value is outside its config space");
  if (dev.compute_units > 0 && prm[kThreads] > dev.compute_units) {
    char why[96];
    std::snprintf(why, sizeof why, "threads=%lld exceeds this host's %d hardware threads",
                  static_cast<long long>(prm[kThreads]), static_cast<int>(dev.compute_units));
    return fail(StatusCode::unsupported_problem, why);
  }
  if (!blas().ok) return fail(StatusCode::backend_error, "OpenBLAS entry points not found");
  return Status();
}

std::mutex& threads_mutex() {
  static std::mutex mu;
  return mu;
}

Status launch(const LaunchArgs& args, const Problem& p, const int64_t* prm) {
  if (p.m < 1) return Status();
  if (args.data[core::kGemmArgA] == nullptr || args.data[core::kGemmArgB] == nullptr ||
      args.data[core::kGemmArgD] == nullptr)
    return fail(StatusCode::invalid_argument, "gemm: a, b and d must not be null");
  if (p.has_bias && args.data[core::kGemmArgBias] == nullptr)
    return fail(StatusCode::invalid_argument, "gemm: has_bias but bias is null");
  const int64_t M = p.m, N = p.n, K = p.k;
  // BLAS needs every leading dimension >= the row length (lda is unused for
  // one row, which runs as sgemv).
  if ((M > 1 && args.ld[core::kGemmArgA] < K) || args.ld[core::kGemmArgB] < K ||
      (M > 1 && args.ld[core::kGemmArgD] < N))
    return fail(StatusCode::unsupported_problem,
                "a row stride below the row length (lda = 0 broadcast) is not expressible in BLAS");
  if (N > kBlasMax || K > kBlasMax || args.ld[core::kGemmArgA] > kBlasMax || args.ld[core::kGemmArgB] > kBlasMax ||
      args.ld[core::kGemmArgD] > kBlasMax)
    return fail(StatusCode::unsupported_problem, "a dimension or stride exceeds OpenBLAS's integer type");
  const Blas& ob = blas();
  if (!ob.ok) return fail(StatusCode::backend_error, "OpenBLAS entry points not found");
  const auto* a = static_cast<const float*>(args.data[core::kGemmArgA]);
  const auto* b = static_cast<const float*>(args.data[core::kGemmArgB]);
  auto* d = static_cast<float*>(args.data[core::kGemmArgD]);
  const int want = static_cast<int>(prm[kThreads]);
  {
    std::lock_guard<std::mutex> lock(threads_mutex());
    const int prev = ob.get_threads();
    if (prev != want) ob.set_threads(want);
    if (M == 1) {
      ob.sgemv(CblasRowMajor, CblasNoTrans, static_cast<blasint>(N), static_cast<blasint>(K), 1.0f, b,
               static_cast<blasint>(args.ld[core::kGemmArgB]), a, 1, 0.0f, d, 1);
    } else {
      // M beyond blasint runs in row chunks.
      constexpr int64_t kChunk = kBlasMax < (int64_t{1} << 30) ? kBlasMax : (int64_t{1} << 30);
      for (int64_t m0 = 0; m0 < M; m0 += kChunk) {
        const int64_t mc = M - m0 < kChunk ? M - m0 : kChunk;
        ob.sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(mc), static_cast<blasint>(N),
                 static_cast<blasint>(K), 1.0f, a + m0 * args.ld[core::kGemmArgA],
                 static_cast<blasint>(args.ld[core::kGemmArgA]), b, static_cast<blasint>(args.ld[core::kGemmArgB]),
                 0.0f, d + m0 * args.ld[core::kGemmArgD], static_cast<blasint>(args.ld[core::kGemmArgD]));
      }
    }
    if (prev != want) ob.set_threads(prev);
  }
  if (p.has_bias) {
    const auto* bias = static_cast<const float*>(args.data[core::kGemmArgBias]);
    for (int64_t m = 0; m < M; ++m) {
      float* row = d + m * args.ld[core::kGemmArgD];
      for (int64_t n = 0; n < N; ++n) row[n] += bias[n];
    }
  }
  return Status();
}

constinit const VariantDef kGemmFp32OpenBlas{
    .name = "gemm_fp32__openblas",
    .op = OpKind::gemm,
    .backend = DeviceType::cpu,
    .in_dtype = DType::fp32,
    .params = kParams,
    .flags = 0,
    .schema_version = 1,
    .supports = &supports,
    .launch = &launch,
};

constexpr const VariantDef* kVariants[] = {&kGemmFp32OpenBlas};

}  // namespace
}  // namespace dispatch::cpu::openblas

extern "C" __attribute__((visibility("default"))) const KdispatchCpuPluginV1* kdispatch_cpu_plugin_v1() {
  using namespace dispatch::cpu::openblas;
  static const KdispatchCpuPluginV1 table = [] {
    const Blas& ob = blas();
    KdispatchCpuPluginV1 t{};
    t.abi_version = dispatch::core::kCpuPluginAbiVersion;
    t.struct_size = sizeof(KdispatchCpuPluginV1);
    t.layout = dispatch::core::plugin_layout_fingerprint();
    t.kdispatch_version = KDISPATCH_VERSION_STRING;
    t.name = "openblas";
    t.description = ob.ok ? ob.description : "OpenBLAS entry points (cblas_sgemm, cblas_sgemv, openblas_*) not found";
    t.variant_count = ob.ok ? 1 : 0;
    t.variants = kVariants;
    return t;
  }();
  return &table;
}
