// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — what the GEMM floors (a vendor library called as
// torch's F.linear calls it: cuBLAS, kernels/cuda/cublas.cpp; hipBLASLt,
// kernels/hip/hipblaslt.cpp) check of a call before they touch the library:
// its operands, and the strides and sizes the library takes. Plain C++,
// header only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string_view>

#include "core/op.hpp"
#include "ops/gemm.hpp"

namespace dispatch::gpu {

/// The operands of a floor GEMM call: D[M,N] = A[M,K] B[N,K]^T (+ bias[N]).
struct BlasOperands {
  const void* a = nullptr;
  const void* b = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
  int64_t lda = 0, ldb = 0, ldd = 0;
};

/// Reads the operands of a gemm call into `*o` and checks them for the
/// library `lib`: invalid_argument when A, B or D is null; Ok when M < 1
/// (nothing to run: the caller returns it); needs_fallback when the
/// library cannot take the call ("<lib> needs row strides >= the row
/// length": its leading dimensions must cover a row, so a broadcast operand
/// or overlapping rows go to our kernels, which take any stride; "<lib>
/// takes dimensions and strides below 2^31": its sizes are int); else Ok.
inline Status blas_operands(const core::LaunchArgs& la, const core::Problem& p, std::string_view lib,
                            BlasOperands* o) noexcept {
  using core::kGemmArgA, core::kGemmArgB, core::kGemmArgD, core::kGemmArgBias;
  o->a = la.data[kGemmArgA];
  o->b = la.data[kGemmArgB];
  o->d = la.data[kGemmArgD];
  o->bias = la.data[kGemmArgBias];
  if (o->a == nullptr || o->b == nullptr || o->d == nullptr)
    return make_status(StatusCode::invalid_argument, "gemm: a, b and d must not be null");
  if (p.m < 1) return Status();
  o->lda = la.ld[kGemmArgA], o->ldb = la.ld[kGemmArgB], o->ldd = la.ld[kGemmArgD];
  char why[96];
  const int n = static_cast<int>(lib.size());
  if ((p.m > 1 && (o->lda < p.k || o->ldd < p.n)) || (p.n > 1 && o->ldb < p.k)) {
    std::snprintf(why, sizeof why, "%.*s needs row strides >= the row length", n, lib.data());
    return core::needs_fallback(why);
  }
  if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX || o->lda > INT32_MAX || o->ldb > INT32_MAX ||
      o->ldd > INT32_MAX) {
    std::snprintf(why, sizeof why, "%.*s takes dimensions and strides below 2^31", n, lib.data());
    return core::needs_fallback(why);
  }
  return Status();
}

}  // namespace dispatch::gpu
