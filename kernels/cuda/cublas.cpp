// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the bf16/fp16 GEMM floor: cuBLAS as torch calls
// it (see cublas.hpp).
#include "cuda/cublas.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string_view>
#include <vector>

#include "cuda/cublaslt.hpp"
#include "cuda/dl_library.hpp"
#include "gpu/blas_floor.hpp"
#include "gpu/handle_pool.hpp"
#include "ops/gemm.hpp"

namespace dispatch::cuda::blas {
namespace {

struct Api {
  void* so = nullptr;
  int version = 0;
  std::string describe;
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasGetVersion_v2) get_version = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&cublasSetMathMode) set_math = nullptr;
  // cublas_api.h overloads cublasGemmEx for C++ (the compute type as a
  // cudaDataType_t too): the C entry point's type, spelled out.
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType_t, int, const void*, cudaDataType_t, int, const void*,
                                    void*, cudaDataType_t, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm_ex = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
};

using dl::sym;

Api* open_api() {
  auto* a = new Api;  // kept for the process lifetime
  a->so = dl::open_or_say("KDISPATCH_CUBLAS", {"libcublas.so." + std::to_string(CUBLAS_VER_MAJOR), "libcublas.so"},
                          "cuBLAS", "cuBLAS floor", &a->describe);
  if (!a->so) return a;
  const bool ok = sym(a->so, "cublasCreate_v2", &a->create) && sym(a->so, "cublasGetVersion_v2", &a->get_version) &&
                  sym(a->so, "cublasSetStream_v2", &a->set_stream) &&
                  sym(a->so, "cublasSetWorkspace_v2", &a->set_workspace) &&
                  sym(a->so, "cublasSetMathMode", &a->set_math) && sym(a->so, "cublasGemmEx", &a->gemm_ex) &&
                  sym(a->so, "cublasGetStatusName", &a->status_name);
  const std::string path = dl::path_of(reinterpret_cast<void*>(a->create));
  if (!ok) {
    a->describe = std::string("cuBLAS unavailable: ") + path + " lacks an entry point the floor uses";
    return a;
  }
  // The version needs a handle; cublasGetProperty would too on old
  // libraries. The major must match the headers: the enums we pass are theirs.
  cublasHandle_t h = nullptr;
  if (a->create(&h) == CUBLAS_STATUS_SUCCESS && a->get_version(h, &a->version) == CUBLAS_STATUS_SUCCESS &&
      a->version / 10000 != CUBLAS_VER_MAJOR) {
    a->describe = std::string("cuBLAS unavailable: ") + path + " is version " + std::to_string(a->version) +
                  ", this build's headers are major " + std::to_string(CUBLAS_VER_MAJOR);
    a->gemm_ex = nullptr;
    return a;  // the probe handle is kept: destroying it needs one more symbol
  }
  if (h == nullptr) {
    a->describe = std::string("cuBLAS unavailable: cublasCreate failed (") + path + ")";
    a->gemm_ex = nullptr;
    return a;
  }
  a->describe = "cuBLAS " + std::to_string(a->version) + " (" + path + ")";
  return a;
}

const Api& api() {
  static const Api* a = open_api();
  return *a;
}

/// The calling thread's handle on `device` (created once, or taken from the
/// pool; kept for the thread's life).
cublasHandle_t handle_for(const Api& a, int device) {
  struct Tag;
  return gpu::HandlePool<Tag, cublasHandle_t>::acquire(device, [&](cublasHandle_t* h) {
    // cublasCreate allocates: legal inside a global-mode capture only in
    // relaxed mode (as torch's allocator does), restored after.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    const bool swapped = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    const bool ok = a.create(h) == CUBLAS_STATUS_SUCCESS;
    if (swapped) (void)cudaThreadExchangeStreamCaptureMode(&mode);
    return ok;
  });
}

cudaDataType_t cuda_type(DType t) {
  return t == DType::fp32 ? CUDA_R_32F : t == DType::fp16 ? CUDA_R_16F : CUDA_R_16BF;
}

std::string status_text(const Api& a, cublasStatus_t s) { return a.status_name(s); }

/// The bias in every row of D: one copy into row 0, then rows [0, r) into
/// [r, 2r) (log2 M stream-ordered copies, not M), as torch's expand copy.
bool broadcast_bias(void* D, const void* bias, int64_t m, int64_t n, int64_t ldd, int64_t eb, cudaStream_t s) {
  char* d = static_cast<char*>(D);
  if (cudaMemcpyAsync(d, bias, static_cast<size_t>(n * eb), cudaMemcpyDeviceToDevice, s) != cudaSuccess) return false;
  for (int64_t r = 1; r < m; r *= 2) {
    const int64_t rows = std::min(r, m - r);
    const size_t pitch = static_cast<size_t>(ldd * eb);
    if (cudaMemcpy2DAsync(d + r * ldd * eb, pitch, d, pitch, static_cast<size_t>(n * eb), static_cast<size_t>(rows),
                          cudaMemcpyDeviceToDevice, s) != cudaSuccess)
      return false;
  }
  return true;
}

/// The call's device current for the scope (the handle is per device).
using DeviceScope = gpu::DeviceScope<cudaError_t, &cudaGetDevice, &cudaSetDevice, cudaSuccess>;

}  // namespace

bool available() noexcept {
  try {
    return api().gemm_ex != nullptr;
  } catch (...) {
    return false;
  }
}

const std::string& describe() noexcept { return api().describe; }

Status gemm(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  if (!available()) return core::needs_fallback(describe());
  gpu::BlasOperands o;
  if (Status s = gpu::blas_operands(la, p, "cuBLAS", &o); !s.ok() || p.m < 1) return s;
  // torch's addmm takes cuBLASLt's bias epilogue when N > 1, K > 1 and the
  // result has the input dtype (torch 2.11: at M = 1 too, cublas.hpp); where
  // cuBLASLt declines, torch's own fallback: the bias copied, beta 1.
  if (o.bias != nullptr && p.n > 1 && p.k > 1 && p.out_dtype == p.in_dtype) {
    int64_t prm[core::kMaxParams] = {};
    prm[lt::kAlgoId] = lt::kTorchPick;
    const Status st = lt::launch(la, p, prm);
    if (st.code() != core::kNeedsFallbackCode) return st;
  }
  const Api& a = api();
  const int device = static_cast<int>(p.device.ordinal);
  DeviceScope on(device);
  if (!on.ok) return core::needs_fallback("cannot make device " + std::to_string(device) + " current");
  cublasHandle_t h = handle_for(a, device);
  if (h == nullptr) return core::needs_fallback("cublasCreate failed on device " + std::to_string(device));
  const cudaStream_t stream = static_cast<cudaStream_t>(la.stream);
  cublasStatus_t s = a.set_stream(h, stream);
  // After the stream (cublasSetStream resets it): the call's workspace, or
  // none (cuBLAS then picks an algorithm that needs none, and never
  // allocates inside a capture).
  // (cuBLAS takes a workspace aligned to 256 bytes; a less aligned one is
  // not offered: the call then runs an algorithm that needs none.)
  const bool has_ws =
      la.workspace != nullptr && la.workspace_bytes > 0 && reinterpret_cast<uintptr_t>(la.workspace) % 256 == 0;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = a.set_workspace(h, has_ws ? la.workspace : nullptr, has_ws ? static_cast<size_t>(la.workspace_bytes) : 0);
  if (s == CUBLAS_STATUS_SUCCESS) s = a.set_math(h, CUBLAS_DEFAULT_MATH);
  if (s != CUBLAS_STATUS_SUCCESS) return make_status(StatusCode::backend_error, "cuBLAS handle: " + status_text(a, s));
  float beta = 0.f;
  if (o.bias != nullptr) {
    // M = 1 (or K = 1, N = 1, an fp32 D, cuBLASLt declining): torch copies
    // the bias into the result and runs the GEMM with beta 1.
    const int64_t eb = p.out_dtype == DType::fp32 ? 4 : 2;
    if (!broadcast_bias(o.d, o.bias, p.m, p.n, std::max<int64_t>(o.ldd, p.n), eb, stream))
      return make_status(StatusCode::backend_error, "cuBLAS floor: the bias copy into d failed");
    beta = 1.f;
  }
  const float alpha = 1.f;
  const cudaDataType_t in = cuda_type(p.in_dtype), out = cuda_type(p.out_dtype);
  // Our row-major D[M,N] = A[M,K] B[N,K]^T is cuBLAS's column-major
  // D^T[N,M] = B^T' (K x N, transposed) x A^T (K x M): the TN call torch's
  // F.linear makes.
  s = a.gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(p.n), static_cast<int>(p.m), static_cast<int>(p.k),
                &alpha, o.b, in, static_cast<int>(std::max<int64_t>(o.ldb, p.k)), o.a, in,
                static_cast<int>(std::max<int64_t>(o.lda, p.k)), &beta, o.d, out,
                static_cast<int>(std::max<int64_t>(o.ldd, p.n)), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP);
  if (s == CUBLAS_STATUS_SUCCESS) return Status();
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE)
    return core::needs_fallback("cublasGemmEx refused the call: " + status_text(a, s));
  return make_status(StatusCode::backend_error, "cublasGemmEx: " + status_text(a, s));
}

}  // namespace dispatch::cuda::blas
