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
#include "cpu/cpu_rows.hpp"
#include "cpu/cpu_simd.hpp"
#include "cpu/silu_list.hpp"
#include "ops/silu_and_mul.hpp"

namespace dispatch::cpu {
namespace {

using namespace core::variant_names;
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

/// The silu_and_mul row body (cpu_rows.hpp).
template <class T>
struct SiluRows {
  template <int W, int U>
  KDISPATCH_INLINE static void run(const LaunchArgs& a, const Problem& p) {
    using F = typename Vec<W>::F;
    const auto* x = static_cast<const T*>(a.data[core::kSiluArgX]);
    auto* out = static_cast<T*>(a.data[core::kSiluArgOut]);
    const int64_t d = p.n;
    for (int64_t t = 0; t < p.m; ++t) {
      const T* g = x + t * a.ld[core::kSiluArgX];
      const T* u = g + d;
      T* o = out + t * a.ld[core::kSiluArgOut];
      int64_t i = for_each_vector<W, U>(d, [&](int64_t j, int) KDISPATCH_LAMBDA_INLINE {
        F gv, uv, ov;
        vload<W>(gv, g + j);
        vload<W>(uv, u + j);
        vsilu_mul<W>(ov, gv, uv);
        vstore<W>(o + j, ov);
      });
      for (; i < d; ++i) {
        const float gi = to_float(g[i]);
        store_as(o + i, gi / (1.f + std::exp(-gi)) * to_float(u[i]));
      }
    }
  }
};

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

constexpr RowsTable kF32 = make_rows_table<SiluRows<float>>();
constexpr RowsTable kBf16 = make_rows_table<SiluRows<Bf16>>();

// ------------------------------------------------------------------ supports / launch

static_assert(kSiluVec == kRowsVec && kSiluUnroll == kRowsUnroll, "the row families' param slots (cpu_rows.hpp)");
Status check_problem(const VariantDef& v, const Problem& p) noexcept {
  if (Status s =
          rows_check_op_and_dtype(v, p, "not a silu_and_mul problem", "dtype must be fp32", "dtype must be bf16");
      !s.ok())
    return s;
  if (p.n < 1) return decline(v, StatusCode::invalid_argument, "d must be >= 1");
  return Status::Ok();
}

Status check_args(const LaunchArgs& a) noexcept {
  if (a.data[core::kSiluArgOut] == nullptr || a.data[core::kSiluArgX] == nullptr)
    return make_status(StatusCode::invalid_argument, "silu_and_mul: out and x must not be null");
  return Status::Ok();
}

Status vec_launch(const LaunchArgs& a, const Problem& p, const int64_t* prm) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(a); !s.ok()) return s;
  return run_rows(p.in_dtype == DType::fp32 ? kF32 : kBf16, prm, a, p,
                  "silu_and_mul: the plan's vec width needs an ISA this host lacks");
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

KDISPATCH_CPU_ROWS_VARIANTS(Silu, "silu_and_mul", OpKind::silu_and_mul, check_problem, kRowsParams, &vec_launch,
                            &ref_launch)

// The model: a streaming pass (reads 2d, writes d per token) whose exp is a
// dozen vector instructions: the row families' default over rows of d
// (cpu_rows.hpp).
core::Plan silu_default(const core::Problem& p, const DeviceInfo&) noexcept {
  return rows_default(p, OpKind::silu_and_mul, kSiluAndMulVariants, p.n);
}

}  // namespace dispatch::cpu
