// SPDX-License-Identifier: Apache-2.0
// float64 reference implementations of the ops, for the kernel tests.
//
// Inputs are the exact values the kernels see (bf16 inputs already widened
// to float); the references compute in double, so a kernel's error against
// them is its own. Each function also returns the scale its error is judged
// against (see tests/test_cpu_kernels.cpp for the tolerances).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/numeric.hpp"

namespace kdtest::ref {

/// D[m*N + n] = sum_k A[m*lda + k] * B[n*ldb + k] (+ bias[n]), in double.
/// `scale[m*N + n]` = ||A row m|| * ||B row n|| + |bias[n]|: the magnitude an
/// fp32 accumulation error is relative to (Cauchy-Schwarz bounds |D| by it).
struct GemmResult {
  std::vector<double> d;
  std::vector<double> scale;
};

inline GemmResult gemm(int64_t M, int64_t N, int64_t K, const float* a, int64_t lda, const float* b, int64_t ldb,
                       const float* bias) {
  GemmResult r;
  r.d.resize(static_cast<size_t>(M * N));
  r.scale.resize(static_cast<size_t>(M * N));
  std::vector<double> bnorm(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += double(b[n * ldb + k]) * double(b[n * ldb + k]);
    bnorm[n] = std::sqrt(s);
  }
  for (int64_t m = 0; m < M; ++m) {
    double an = 0;
    for (int64_t k = 0; k < K; ++k) an += double(a[m * lda + k]) * double(a[m * lda + k]);
    an = std::sqrt(an);
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(a[m * lda + k]) * double(b[n * ldb + k]);
      const double bv = bias != nullptr ? double(bias[n]) : 0.0;
      r.d[m * N + n] = acc + bv;
      r.scale[m * N + n] = an * bnorm[n] + std::fabs(bv);
    }
  }
  return r;
}

/// y[t*H + h] = x[t*ldx + h] / sqrt(mean_h(x^2) + eps) * w[h], in double.
inline std::vector<double> rmsnorm(int64_t T, int64_t H, const float* x, int64_t ldx, const float* w, double eps) {
  std::vector<double> y(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t h = 0; h < H; ++h) ss += double(x[t * ldx + h]) * double(x[t * ldx + h]);
    const double inv = 1.0 / std::sqrt(ss / double(H) + eps);
    for (int64_t h = 0; h < H; ++h) y[t * H + h] = double(x[t * ldx + h]) * inv * double(w[h]);
  }
  return y;
}

/// vLLM's fused_add_rms_norm: z = x + residual computed in fp32 and rounded
/// to the storage dtype (bf16 when `bf16_storage`), residual = z, then
/// out = rmsnorm(z as stored) * w in double. When `round_z` is false the
/// norm is taken of the unrounded fp32 sum instead: the wrong behaviour the
/// tests prove they can tell apart.
struct FusedResult {
  std::vector<float> residual;  ///< [T*H], exactly as the kernel must store it
  std::vector<double> out;      ///< [T*H]
};

inline FusedResult fused_add_rmsnorm(int64_t T, int64_t H, const float* x, int64_t ldx, const float* residual,
                                     int64_t ldr, const float* w, double eps, bool bf16_storage, bool round_z = true) {
  FusedResult r;
  r.residual.resize(static_cast<size_t>(T * H));
  std::vector<float> z(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float sum = x[t * ldx + h] + residual[t * ldr + h];  // fp32 add, as the kernel
      const float stored = bf16_storage ? dispatch::core::round_to_bf16(sum) : sum;
      r.residual[t * H + h] = stored;
      z[t * H + h] = round_z ? stored : sum;
    }
  }
  r.out = rmsnorm(T, H, z.data(), H, w, eps);
  return r;
}

/// Half a bf16 ulp at |v| (the largest error of a correct rounding).
inline double bf16_half_ulp(double v) {
  const double a = std::fabs(v);
  if (a == 0.0) return std::ldexp(1.0, -134);  // half the smallest bf16 subnormal
  int e = 0;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  return std::ldexp(1.0, std::max(e - 1, -126) - 8);
}

}  // namespace kdtest::ref
