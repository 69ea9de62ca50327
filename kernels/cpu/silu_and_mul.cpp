// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — silu_and_mul variants:
//   out[t, i] = silu(x[t, i]) * x[t, d + i],  silu(g) = g / (1 + exp(-g)).
//
//   silu_and_mul_fp32__vec / _bf16__vec   SIMD (cpu_simd.hpp), params in Plan::params order:
//     vec     {4, 8, 16}  fp32 lanes per vector: 4 = SSE2, 8 = AVX2, 16 = AVX-512
//                         (declined when the host lacks it)
//     unroll  {1, 2, 4}   vectors per loop step
//   silu_and_mul_fp32__ref / _bf16__ref   plain loops with std::exp (validation baseline)
//
// exp(-g) in SIMD is Cephes' expf: n = round(x log2 e), r = x - n ln 2 (in
// two parts), a degree-5 polynomial, times 2^n built in the exponent bits;
// within 2 ulp of std::exp over the clamped range [-87.3, 88.3]. silu
// takes e^-g as the square of e^(-g/2) (within ~5 ulp), which overflows and
// underflows where std::exp's does: very negative g gives -0 (NaN for -inf). Computed in fp32, the result
// rounded once to the output dtype (round to nearest even for bf16).
#include <cmath>
#include <cstdint>

#include "core/numeric.hpp"
#include "cpu/cpu_common.hpp"
#include "cpu/cpu_simd.hpp"
#include "cpu/silu_list.hpp"
#include "ops/silu_and_mul.hpp"

namespace dispatch::cpu {
namespace {

using core::LaunchArgs;
using core::OpKind;
using core::ParamDef;
using core::ParamKind;
using core::Problem;
using core::VariantDef;
using namespace simd;

// ------------------------------------------------------------------ vector math

/// e^x per lane (Cephes expf).
template <int W>
KDISPATCH_INLINE void vexp(typename Vec<W>::F& y, const typename Vec<W>::F& xin) {
  using F = typename Vec<W>::F;
  using I = typename Vec<W>::I;
  const F lo = F{} + -87.3f, hi = F{} + 88.3f;
  F x = xin < lo ? lo : xin;
  x = x > hi ? hi : x;
  const F fx = x * 1.44269504088896341f + 0.5f;
  I n = __builtin_convertvector(fx, I);  // toward zero ...
  F nf = __builtin_convertvector(n, F);
  n = n + (nf > fx);  // ... then floor: a comparison's true lane is -1
  nf = __builtin_convertvector(n, F);
  x = x - nf * 0.693359375f - nf * -2.12194440e-4f;
  const F z = x * x;
  F p = F{} + 1.9875691500e-4f;
  p = p * x + 1.3981999507e-3f;
  p = p * x + 8.3334519073e-3f;
  p = p * x + 4.1665795894e-2f;
  p = p * x + 1.6666665459e-1f;
  p = p * x + 5.0000001201e-1f;
  p = p * z + x + 1.f;
  const I bits = (n + 127) << 23;
  y = p * reinterpret_cast<F>(bits);
}

/// g / (1 + e^-g) * u per lane.
template <int W>
KDISPATCH_INLINE void vsilu_mul(typename Vec<W>::F& out, const typename Vec<W>::F& g, const typename Vec<W>::F& u) {
  using F = typename Vec<W>::F;
  // e^-g as (e^(-g/2))^2: the half stays inside vexp's range for |g| < 176,
  // and the square overflows to inf exactly where fp32's e^-g does (g below
  // -88.72), so silu is g / inf there: -0, or NaN for -inf, as the
  // reference's std::exp gives (a clamped e^-g would leave g / e^88.3).
  F h;
  vexp<W>(h, g * -0.5f);
  const F e = h * h;
  out = g / (e + 1.f) * u;
}

// ------------------------------------------------------------------ row bodies

template <int W, int U, class T>
KDISPATCH_INLINE void silu_rows(const LaunchArgs& a, const Problem& p) {
  using F = typename Vec<W>::F;
  const auto* x = static_cast<const T*>(a.data[core::kSiluArgX]);
  auto* out = static_cast<T*>(a.data[core::kSiluArgOut]);
  const int64_t d = p.n;
  for (int64_t t = 0; t < p.m; ++t) {
    const T* g = x + t * a.ld[core::kSiluArgX];
    const T* u = g + d;
    T* o = out + t * a.ld[core::kSiluArgOut];
    int64_t i = 0;
    for (; i + W * U <= d; i += W * U) {
#pragma GCC unroll 4
      for (int k = 0; k < U; ++k) {
        F gv, uv, ov;
        vload<W>(gv, g + i + k * W);
        vload<W>(uv, u + i + k * W);
        vsilu_mul<W>(ov, gv, uv);
        vstore<W>(o + i + k * W, ov);
      }
    }
    for (; i + W <= d; i += W) {
      F gv, uv, ov;
      vload<W>(gv, g + i);
      vload<W>(uv, u + i);
      vsilu_mul<W>(ov, gv, uv);
      vstore<W>(o + i, ov);
    }
    for (; i < d; ++i) {
      const float gi = to_float(g[i]);
      store_as(o + i, gi / (1.f + std::exp(-gi)) * to_float(u[i]));
    }
  }
}

template <class T>
void silu_ref_rows(const LaunchArgs& a, const Problem& p) {
  const auto* x = static_cast<const T*>(a.data[core::kSiluArgX]);
  auto* out = static_cast<T*>(a.data[core::kSiluArgOut]);
  for (int64_t t = 0; t < p.m; ++t) {
    const T* g = x + t * a.ld[core::kSiluArgX];
    T* o = out + t * a.ld[core::kSiluArgOut];
    for (int64_t i = 0; i < p.n; ++i) {
      const float gi = to_float(g[i]);
      store_as(o + i, gi / (1.f + std::exp(-gi)) * to_float(g[p.n + i]));
    }
  }
}

// ------------------------------------------------------------------ ISA entry points

template <int U, class T>
void silu_w4(const LaunchArgs& a, const Problem& p) {
  silu_rows<4, U, T>(a, p);
}
#if KDISPATCH_CPU_X86
template <int U, class T>
KDISPATCH_TARGET_AVX2 void silu_w8(const LaunchArgs& a, const Problem& p) {
  silu_rows<8, U, T>(a, p);
}
template <int U, class T>
KDISPATCH_TARGET_AVX512 void silu_w16(const LaunchArgs& a, const Problem& p) {
  silu_rows<16, U, T>(a, p);
}
#endif

using RowsFn = void (*)(const LaunchArgs&, const Problem&);

/// fn[vec index][unroll index] for vec {4, 8, 16} x unroll {1, 2, 4}; null
/// where the ISA is not compiled in.
struct RowsTable {
  RowsFn fn[3][3] = {};
};

template <class T>
constexpr RowsTable make_table() {
  RowsTable t;
  t.fn[0][0] = &silu_w4<1, T>;
  t.fn[0][1] = &silu_w4<2, T>;
  t.fn[0][2] = &silu_w4<4, T>;
#if KDISPATCH_CPU_X86
  t.fn[1][0] = &silu_w8<1, T>;
  t.fn[1][1] = &silu_w8<2, T>;
  t.fn[1][2] = &silu_w8<4, T>;
  t.fn[2][0] = &silu_w16<1, T>;
  t.fn[2][1] = &silu_w16<2, T>;
  t.fn[2][2] = &silu_w16<4, T>;
#endif
  return t;
}
constexpr RowsTable kF32 = make_table<float>();
constexpr RowsTable kBf16 = make_table<Bf16>();

constexpr int vec_index(int64_t v) { return v == 4 ? 0 : v == 8 ? 1 : v == 16 ? 2 : -1; }
constexpr int unroll_index(int64_t u) { return u == 1 ? 0 : u == 2 ? 1 : u == 4 ? 2 : -1; }

bool host_runs(int64_t vec) noexcept {
  if (vec == 4) return true;
  if (!KDISPATCH_CPU_X86) return false;
  return vec == 8 ? host_isa().avx2 : host_isa().avx512;
}

// ------------------------------------------------------------------ supports / launch

constexpr int64_t kVecs[] = {4, 8, 16};
constexpr int64_t kUnrolls[] = {1, 2, 4};
constexpr ParamDef kVecParams[] = {
    {"vec", ParamKind::integer, kVecs, {}, 8},
    {"unroll", ParamKind::integer, kUnrolls, {}, 2},
};

Status check_problem(const VariantDef& v, const Problem& p) noexcept {
  if (p.op != OpKind::silu_and_mul) return decline(v, StatusCode::unsupported_problem, "not a silu_and_mul problem");
  if (p.device.type != v.backend)
    return decline(v, StatusCode::unsupported_device, "CPU variant, problem is on another device");
  if (p.in_dtype != v.in_dtype || p.out_dtype != v.in_dtype)
    return decline(v, StatusCode::unsupported_problem,
                   v.in_dtype == DType::fp32 ? "dtype must be fp32" : "dtype must be bf16");
  if (p.n < 1) return decline(v, StatusCode::invalid_argument, "d must be >= 1");
  return Status::Ok();
}

template <const VariantDef& V>
Status vec_supports(const Problem& p, const int64_t* prm, const DeviceInfo&) {
  if (Status s = check_problem(V, p); !s.ok()) return s;
  if (!params_in_space(V, prm))
    return decline(V, StatusCode::invalid_argument, "a param value is outside its config space");
  if (!host_runs(prm[kSiluVec]))
    return decline(
        V, StatusCode::unsupported_problem,
        prm[kSiluVec] == 8 ? "vec 8 needs AVX2, which this host lacks" : "vec 16 needs AVX-512, which this host lacks");
  return Status::Ok();
}

template <const VariantDef& V>
Status ref_supports(const Problem& p, const int64_t*, const DeviceInfo&) {
  return check_problem(V, p);
}

Status check_args(const LaunchArgs& a) noexcept {
  if (a.data[core::kSiluArgOut] == nullptr || a.data[core::kSiluArgX] == nullptr)
    return make_status(StatusCode::invalid_argument, "silu_and_mul: out and x must not be null");
  return Status::Ok();
}

Status vec_launch(const LaunchArgs& a, const Problem& p, const int64_t* prm) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(a); !s.ok()) return s;
  const int vi = vec_index(prm[kSiluVec]), ui = unroll_index(prm[kSiluUnroll]);
  const RowsTable& t = p.in_dtype == DType::fp32 ? kF32 : kBf16;
  RowsFn fn = vi < 0 || ui < 0 ? nullptr : t.fn[vi][ui];
  if (fn == nullptr || !host_runs(prm[kSiluVec]))
    return make_status(StatusCode::unsupported_problem,
                       "silu_and_mul: the plan's vec width needs an ISA this host lacks");
  fn(a, p);
  return Status::Ok();
}

Status ref_launch(const LaunchArgs& a, const Problem& p, const int64_t*) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(a); !s.ok()) return s;
  if (p.in_dtype == DType::fp32)
    silu_ref_rows<float>(a, p);
  else
    silu_ref_rows<Bf16>(a, p);
  return Status::Ok();
}

}  // namespace

// ------------------------------------------------------------------ the list

constinit const core::VariantDef kSiluFp32Vec{
    "silu_and_mul_fp32__vec",    OpKind::silu_and_mul, DeviceType::cpu, DType::fp32, kVecParams, 0, 1,
    &vec_supports<kSiluFp32Vec>, &vec_launch};
constinit const core::VariantDef kSiluBf16Vec{
    "silu_and_mul_bf16__vec",    OpKind::silu_and_mul, DeviceType::cpu, DType::bf16, kVecParams, 0, 1,
    &vec_supports<kSiluBf16Vec>, &vec_launch};
constinit const core::VariantDef kSiluFp32Ref{
    "silu_and_mul_fp32__ref",    OpKind::silu_and_mul, DeviceType::cpu, DType::fp32, {}, core::kVariantReference, 1,
    &ref_supports<kSiluFp32Ref>, &ref_launch};
constinit const core::VariantDef kSiluBf16Ref{
    "silu_and_mul_bf16__ref",    OpKind::silu_and_mul, DeviceType::cpu, DType::bf16, {}, core::kVariantReference, 1,
    &ref_supports<kSiluBf16Ref>, &ref_launch};

// The model: a streaming pass (reads 2d, writes d per token) whose exp is a
// dozen vector instructions, so take the widest vector the host runs, no
// wider than d, and unroll 2 (two independent chains) while a step fits in d.
core::Plan silu_default(const core::Problem& p, const DeviceInfo&) noexcept {
  core::Plan plan;
  if (p.op != OpKind::silu_and_mul || p.out_dtype != p.in_dtype) return plan;
  const bool bf16 = p.in_dtype == DType::bf16;
  if (p.in_dtype != DType::fp32 && !bf16) return plan;
  if (p.n < 4) {
    plan.variant = bf16 ? &kSiluBf16Ref : &kSiluFp32Ref;
    return plan;
  }
  int64_t vec = host_runs(16) ? 16 : host_runs(8) ? 8 : 4;
  while (vec > 4 && vec > p.n) vec /= 2;
  const int64_t unroll = vec * 2 <= p.n ? 2 : 1;
  plan.variant = bf16 ? &kSiluBf16Vec : &kSiluFp32Vec;
  plan.params[kSiluVec] = vec;
  plan.params[kSiluUnroll] = unroll;
  return plan;
}

}  // namespace dispatch::cpu
