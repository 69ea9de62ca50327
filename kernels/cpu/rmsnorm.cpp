// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — rmsnorm and fused_add_rmsnorm variants.
//
// Both ops are two passes over a row: sum of squares, then scale. They are
// memory-bound, so the SIMD body is written once, with GCC vector extensions
// (`float __attribute__((vector_size))`), as an always-inline template on the
// vector width W and the unroll U. Three thin entry points (cpu_rows.hpp)
// instantiate it inside functions carrying a target attribute — W=4 baseline (SSE2 on
// x86-64, NEON elsewhere), W=8 AVX2, W=16 AVX-512 — so each width is lowered
// to native instructions while the library stays baseline x86-64. Generic
// vectors (not intrinsics) are what make the single body possible: an
// intrinsic cannot be inlined into a function of a narrower target.
// Vectors are passed by reference between helpers, so no vector crosses a
// call boundary of the default target (no -Wpsabi ABI change).
//
// bf16: loads widen exactly (a 16-bit shift); stores round to nearest even
// with NaN kept (the rule of core/numeric.hpp, in SIMD). The fused op rounds
// z = x + residual to the storage dtype before storing it and before the sum
// of squares, and pass 2 re-reads the stored residual: the norm is taken of z
// as stored, exactly as vLLM's fused_add_rms_norm.
#include "cpu/norm_list.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/numeric.hpp"
#include "cpu/cpu_common.hpp"
#include "cpu/cpu_rows.hpp"
#include "cpu/cpu_simd.hpp"
#include "ops/fused_add_rmsnorm.hpp"
#include "ops/rmsnorm.hpp"

namespace dispatch::cpu {
namespace {

using namespace core::variant_names;
using namespace simd;

// ------------------------------------------------------------------ row bodies

/// y = x * inv * w over one row; x is read as TI, y written as TO.
template <int W, int U, class TI, class TO>
KDISPATCH_INLINE void scale_row(TO* y, const TI* x, const TI* w, int64_t n, float inv) {
  using F = typename Vec<W>::F;
  const F vinv = F{} + inv;
  int64_t h = for_each_vector<W, U>(n, [&](int64_t i, int) KDISPATCH_LAMBDA_INLINE {
    F xv, wv;
    vload<W>(xv, x + i);
    vload<W>(wv, w + i);
    vstore<W>(y + i, xv * vinv * wv);
  });
  for (; h < n; ++h) store_as(y + h, to_float(x[h]) * inv * to_float(w[h]));
}

/// U independent sum-of-squares chains over a row.
template <int W, int U, class T>
KDISPATCH_INLINE float sum_squares(const T* x, int64_t n) {
  using F = typename Vec<W>::F;
  F acc[U] = {};
  int64_t h = for_each_vector<W, U>(n, [&](int64_t i, int u) KDISPATCH_LAMBDA_INLINE {
    F v;
    vload<W>(v, x + i);
    acc[u] += v * v;
  });
  float ss = hsum_chains<W, U>(acc);
  for (; h < n; ++h) ss += to_float(x[h]) * to_float(x[h]);
  return ss;
}

inline float inv_rms(float ss, int64_t n, float eps) noexcept {
  return 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
}

/// The rmsnorm row body (cpu_rows.hpp): x read as TI, y written as TO.
template <class TI, class TO>
struct RmsnormRows {
  template <int W, int U>
  KDISPATCH_INLINE static void run(const LaunchArgs& a, const Problem& p) {
    const auto* x = static_cast<const TI*>(a.data[core::kNormArgX]);
    const auto* w = static_cast<const TI*>(a.data[core::kNormArgW]);
    auto* y = static_cast<TO*>(a.data[core::kNormArgY]);
    const int64_t n = p.n;
    for (int64_t t = 0; t < p.m; ++t) {
      const TI* xr = x + t * a.ld[core::kNormArgX];
      const float inv = inv_rms(sum_squares<W, U>(xr, n), n, a.scalar[0]);
      scale_row<W, U>(y + t * a.ld[core::kNormArgY], xr, w, n, inv);
    }
  }
};

/// Pass 1 of the fused op: r = x + r rounded to T; returns sum(r^2) of r as stored.
template <int W, int U, class T>
KDISPATCH_INLINE float add_residual(const T* x, T* r, int64_t n) {
  using F = typename Vec<W>::F;
  F acc[U] = {};
  int64_t h = for_each_vector<W, U>(n, [&](int64_t i, int u) KDISPATCH_LAMBDA_INLINE {
    F xv, rv;
    vload<W>(xv, x + i);
    vload<W>(rv, r + i);
    F z = xv + rv;
    store_rounded<W>(r + i, z);
    acc[u] += z * z;
  });
  float ss = hsum_chains<W, U>(acc);
  for (; h < n; ++h) {
    const float z = stored_value(to_float(x[h]) + to_float(r[h]), static_cast<T*>(nullptr));
    store_as(r + h, z);
    ss += z * z;
  }
  return ss;
}

/// The fused_add_rmsnorm row body (cpu_rows.hpp).
template <class T>
struct FusedRows {
  template <int W, int U>
  KDISPATCH_INLINE static void run(const LaunchArgs& a, const Problem& p) {
    auto* x = static_cast<T*>(a.data[core::kFusedArgX]);
    auto* r = static_cast<T*>(a.data[core::kFusedArgResidual]);
    const auto* w = static_cast<const T*>(a.data[core::kFusedArgW]);
    const int64_t n = p.n;
    for (int64_t t = 0; t < p.m; ++t) {
      T* xr = x + t * a.ld[core::kFusedArgX];
      T* rr = r + t * a.ld[core::kFusedArgResidual];
      const float inv = inv_rms(add_residual<W, U>(xr, rr, n), n, a.scalar[0]);
      scale_row<W, U>(xr, rr, w, n, inv);  // the norm of z as stored
    }
  }
};

constexpr RowsTable kRmsnormF32 = make_rows_table<RmsnormRows<float, float>>();
constexpr RowsTable kRmsnormBf16 = make_rows_table<RmsnormRows<Bf16, Bf16>>();
constexpr RowsTable kRmsnormBf16F32 = make_rows_table<RmsnormRows<Bf16, float>>();
constexpr RowsTable kFusedF32 = make_rows_table<FusedRows<float>>();
constexpr RowsTable kFusedBf16 = make_rows_table<FusedRows<Bf16>>();

// ------------------------------------------------------------------ references

template <class TI, class TO>
void rmsnorm_ref_rows(const LaunchArgs& a, const Problem& p) {
  const auto* x = static_cast<const TI*>(a.data[core::kNormArgX]);
  const auto* w = static_cast<const TI*>(a.data[core::kNormArgW]);
  auto* y = static_cast<TO*>(a.data[core::kNormArgY]);
  for (int64_t t = 0; t < p.m; ++t) {
    const TI* xr = x + t * a.ld[core::kNormArgX];
    float ss = 0.f;
    for (int64_t h = 0; h < p.n; ++h) ss += to_float(xr[h]) * to_float(xr[h]);
    const float inv = inv_rms(ss, p.n, a.scalar[0]);
    for (int64_t h = 0; h < p.n; ++h)
      store_as(y + t * a.ld[core::kNormArgY] + h, to_float(xr[h]) * inv * to_float(w[h]));
  }
}

template <class T>
void fused_ref_rows(const LaunchArgs& a, const Problem& p) {
  auto* x = static_cast<T*>(a.data[core::kFusedArgX]);
  auto* r = static_cast<T*>(a.data[core::kFusedArgResidual]);
  const auto* w = static_cast<const T*>(a.data[core::kFusedArgW]);
  for (int64_t t = 0; t < p.m; ++t) {
    T* xr = x + t * a.ld[core::kFusedArgX];
    T* rr = r + t * a.ld[core::kFusedArgResidual];
    float ss = 0.f;
    for (int64_t h = 0; h < p.n; ++h) {
      store_as(rr + h, to_float(xr[h]) + to_float(rr[h]));  // z rounded to storage
      const float z = to_float(rr[h]);
      ss += z * z;
    }
    const float inv = inv_rms(ss, p.n, a.scalar[0]);
    for (int64_t h = 0; h < p.n; ++h) store_as(xr + h, to_float(rr[h]) * inv * to_float(w[h]));
  }
}

// ------------------------------------------------------------------ config space

static_assert(kNormVec == kRowsVec && kNormUnroll == kRowsUnroll, "the row families' param slots (cpu_rows.hpp)");
constexpr ParamDef kVecParams[] = {
    {"vec", ParamKind::integer, kRowsVecValues, {}, 4},
    {"unroll", ParamKind::integer, kRowsUnrollValues, {}, 1},
};

// ------------------------------------------------------------------ supports / launch

Status check_problem(const VariantDef& v, const Problem& p) noexcept {
  if (p.op != v.op) {
    return decline(v, StatusCode::unsupported_problem,
                   v.op == OpKind::rmsnorm ? "not an rmsnorm problem" : "not a fused_add_rmsnorm problem");
  }
  if (p.device.type != DeviceType::cpu)
    return decline(v, StatusCode::unsupported_device, "CPU variant, problem is on another device");
  if (p.in_dtype != v.in_dtype) {
    return decline(v, StatusCode::unsupported_problem,
                   v.in_dtype == DType::fp32 ? "input dtype must be fp32" : "input dtype must be bf16");
  }
  if (v.op == OpKind::fused_add_rmsnorm && p.out_dtype != p.in_dtype)
    return decline(v, StatusCode::unsupported_problem, "in place: the output dtype must be the input dtype");
  if (p.out_dtype != DType::fp32 && p.out_dtype != p.in_dtype)
    return decline(v, StatusCode::unsupported_problem, "output dtype must be fp32 or the input dtype");
  if (p.n < 1) return decline(v, StatusCode::invalid_argument, "hidden must be >= 1");
  return Status::Ok();
}

Status check_args(const LaunchArgs& a, OpKind op) noexcept {
  if (a.data[0] == nullptr || a.data[1] == nullptr || a.data[2] == nullptr) {  // y, x, w / x, residual, w
    return make_status(StatusCode::invalid_argument, op == OpKind::rmsnorm
                                                         ? "rmsnorm: x, y and w must not be null"
                                                         : "fused_add_rmsnorm: x, residual and w must not be null");
  }
  return Status::Ok();
}

/// A vec plan's launch when the host cannot run its width.
constexpr const char* kNoIsa = "norm: the plan's vec width needs an ISA this host lacks";

Status rmsnorm_vec_launch(const LaunchArgs& a, const Problem& p, const int64_t* prm) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(a, OpKind::rmsnorm); !s.ok()) return s;
  const RowsTable& t = p.in_dtype == DType::fp32    ? kRmsnormF32
                       : p.out_dtype == DType::fp32 ? kRmsnormBf16F32
                                                    : kRmsnormBf16;
  return run_rows(t, prm, a, p, kNoIsa);
}

Status fused_vec_launch(const LaunchArgs& a, const Problem& p, const int64_t* prm) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(a, OpKind::fused_add_rmsnorm); !s.ok()) return s;
  return run_rows(p.in_dtype == DType::fp32 ? kFusedF32 : kFusedBf16, prm, a, p, kNoIsa);
}

Status rmsnorm_ref_launch(const LaunchArgs& a, const Problem& p, const int64_t*) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(a, OpKind::rmsnorm); !s.ok()) return s;
  if (p.in_dtype == DType::fp32) {
    rmsnorm_ref_rows<float, float>(a, p);
  } else if (p.out_dtype == DType::fp32) {
    rmsnorm_ref_rows<Bf16, float>(a, p);
  } else {
    rmsnorm_ref_rows<Bf16, Bf16>(a, p);
  }
  return Status::Ok();
}

Status fused_ref_launch(const LaunchArgs& a, const Problem& p, const int64_t*) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(a, OpKind::fused_add_rmsnorm); !s.ok()) return s;
  if (p.in_dtype == DType::fp32) {
    fused_ref_rows<float>(a, p);
  } else {
    fused_ref_rows<Bf16>(a, p);
  }
  return Status::Ok();
}

}  // namespace

// ------------------------------------------------------------------ the lists

KDISPATCH_CPU_ROWS_VARIANTS(Rmsnorm, "rmsnorm", OpKind::rmsnorm, check_problem, kVecParams, &rmsnorm_vec_launch,
                            &rmsnorm_ref_launch)
KDISPATCH_CPU_ROWS_VARIANTS(FusedAddRmsnorm, "fused_add_rmsnorm", OpKind::fused_add_rmsnorm, check_problem, kVecParams,
                            &fused_vec_launch, &fused_ref_launch)

// The model: the op is a streaming pass (two reads, one or two writes per
// element), so take the widest vector the host runs, no wider than the row,
// and the deepest unroll whose step still fits in the row (independent
// sum-of-squares chains hide the add latency: at 64x4096 fp32, unroll 4 vs 1
// was 1.2x (vec 16) to 1.7x (vec 4) faster). Rows shorter than 4 elements have
// nothing to vectorise: the reference.
core::Plan norm_default(const core::Problem& p, const DeviceInfo&) noexcept {
  core::Plan plan;
  if (p.op != OpKind::rmsnorm && p.op != OpKind::fused_add_rmsnorm) return plan;
  const bool fused = p.op == OpKind::fused_add_rmsnorm;
  const bool bf16 = p.in_dtype == DType::bf16;
  if (p.in_dtype != DType::fp32 && !bf16) return plan;
  if (p.out_dtype != p.in_dtype && (fused || p.out_dtype != DType::fp32)) return plan;
  if (p.n < 4) {
    plan.variant = fused ? (bf16 ? &kFusedAddRmsnormBf16Ref : &kFusedAddRmsnormFp32Ref)
                         : (bf16 ? &kRmsnormBf16Ref : &kRmsnormFp32Ref);
    return plan;
  }
  const int64_t vec = widest_vec(p.n);
  int64_t unroll = 4;
  while (unroll > 1 && vec * unroll > p.n) unroll /= 2;
  plan.variant = fused ? (bf16 ? &kFusedAddRmsnormBf16Vec : &kFusedAddRmsnormFp32Vec)
                       : (bf16 ? &kRmsnormBf16Vec : &kRmsnormFp32Vec);
  plan.params[kNormVec] = vec;
  plan.params[kNormUnroll] = unroll;
  return plan;
}

}  // namespace dispatch::cpu
