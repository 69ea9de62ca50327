// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — fp8 activation quantisation (src/ops/quant_fp8.hpp),
// x fp32 or bf16 -> q e4m3fn plus fp32 scales, per layout:
//
//   quant_fp8_<layout>_<dt>__mul   q = e4m3fn(clamp(x * (1 / scale))): one
//                                  division per group (vLLM's form)
//   quant_fp8_<layout>_<dt>__ref   q = e4m3fn(clamp(x / scale)) (SGLang's
//                                  form; the validation baseline)
//
// scale = max(amax, 1e-10) / 448 in fp32 over the layout's group (the whole
// tensor, a token, a token's 128-wide K group); the two forms can differ by
// one e4m3fn step where x * (1 / scale) and x / scale round apart.
#include <cmath>
#include <cstdint>

#include "core/numeric.hpp"
#include "cpu/cpu_common.hpp"
#include "cpu/cpu_simd.hpp"
#include "cpu/quant_fp8_list.hpp"
#include "ops/quant_fp8.hpp"

namespace dispatch::cpu {
namespace {

using namespace core::variant_names;
using core::QuantScales;
using namespace simd;

constexpr OpKind op_of(QuantScales L) {
  return L == QuantScales::tensor  ? OpKind::quant_fp8_tensor
         : L == QuantScales::token ? OpKind::quant_fp8_token
                                   : OpKind::quant_fp8_group;
}

/// Quantises rows [i0, i1) x cols [k0, k1) of x with one scale; returns it.
template <class In, bool Mul>
float quantise(const LaunchArgs& a, int64_t i0, int64_t i1, int64_t k0, int64_t k1) {
  const In* x = a.ptr<const In>(core::kQuantArgX);
  uint8_t* q = a.ptr<uint8_t>(core::kQuantArgQ);
  const int64_t lx = a.ld[core::kQuantArgX], lq = a.ld[core::kQuantArgQ];
  const float fmax = core::kE4m3fn.max_finite();
  float amax = 0.f;
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t l = k0; l < k1; ++l) amax = std::fmax(amax, std::fabs(to_float(x[i * lx + l])));
  const float scale = std::fmax(amax, core::kQuantMinAmax) / fmax;
  const float inv = 1.f / scale;
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t l = k0; l < k1; ++l) {
      const float v = Mul ? to_float(x[i * lx + l]) * inv : to_float(x[i * lx + l]) / scale;
      q[i * lq + l] = core::float_to_fp8(std::fmin(std::fmax(v, -fmax), fmax), core::kE4m3fn, true);
    }
  return scale;
}

template <QuantScales L, class In, bool Mul>
void quant_rows(const LaunchArgs& a, const Problem& p) {
  float* s = a.ptr<float>(core::kQuantArgScale);
  if constexpr (L == QuantScales::tensor) {
    s[0] = quantise<In, Mul>(a, 0, p.m, 0, p.k);
  } else {
    const int64_t g = L == QuantScales::group ? core::kQuantGroup : p.k;
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t k0 = 0; k0 < p.k; k0 += g) {
        const float scale = quantise<In, Mul>(a, i, i + 1, k0, k0 + g < p.k ? k0 + g : p.k);
        if constexpr (L == QuantScales::token)
          s[i] = scale;
        else
          s[(k0 / g) * a.ld[core::kQuantArgScale] + i] = scale;
      }
  }
}

Status check_problem(const VariantDef& v, QuantScales L, const Problem& p) noexcept {
  if (p.op != op_of(L)) return decline(v, StatusCode::unsupported_problem, "another op's problem");
  if (p.device.type != v.backend)
    return decline(v, StatusCode::unsupported_device, "CPU variant, problem is on another device");
  if (p.in_dtype != v.in_dtype)
    return decline(v, StatusCode::unsupported_problem, v.in_dtype == DType::fp32 ? "x must be fp32" : "x must be bf16");
  if (p.out_dtype != DType::fp8_e4m3fn) return decline(v, StatusCode::unsupported_problem, "q must be fp8_e4m3fn");
  if (p.k < 1) return decline(v, StatusCode::invalid_argument, "K must be >= 1");
  return Status::Ok();
}

template <QuantScales L, bool Mul>
Status launch(const LaunchArgs& a, const Problem& p, const int64_t*) {
  if (p.m < 1) {  // the per-tensor scale is still written (OpSpec::launches_when_empty)
    if (L != QuantScales::tensor) return Status::Ok();
    if (a.data[core::kQuantArgScale] == nullptr)
      return make_status(StatusCode::invalid_argument, "quant_fp8_tensor: scale must not be null");
    *static_cast<float*>(a.data[core::kQuantArgScale]) = core::kQuantMinAmax / core::kE4m3fn.max_finite();
    return Status::Ok();
  }
  for (int i : {core::kQuantArgQ, core::kQuantArgX, core::kQuantArgScale})
    if (a.data[i] == nullptr)
      return make_status(StatusCode::invalid_argument, "quant_fp8: q, x and scale must not be null");
  if (p.in_dtype == DType::fp32)
    quant_rows<L, float, Mul>(a, p);
  else
    quant_rows<L, Bf16, Mul>(a, p);
  return Status::Ok();
}

template <const VariantDef& V, QuantScales L>
Status supports(const Problem& p, const int64_t*, const DeviceInfo&) {
  return check_problem(V, L, p);
}

}  // namespace

#define KD_QUANT_VARIANT(Def, name, L, dt, mul, flags)                                          \
  constinit const core::VariantDef Def{name, op_of(L),          DeviceType::cpu, dt, {}, flags, \
                                       1,    &supports<Def, L>, &launch<L, mul>};
// The four rows of a layout: "quant_fp8_<layout>_<dt>__mul" (x * (1 / scale))
// and "..._ref" (x / scale, the baseline), dt fp32 and bf16.
#define KD_QUANT_VARIANTS(Layout, layout)                                                                              \
  KD_QUANT_VARIANT(kQuant##Layout##Fp32Mul, "quant_fp8_" #layout "_fp32__mul", QuantScales::layout, DType::fp32, true, \
                   0)                                                                                                  \
  KD_QUANT_VARIANT(kQuant##Layout##Bf16Mul, "quant_fp8_" #layout "_bf16__mul", QuantScales::layout, DType::bf16, true, \
                   0)                                                                                                  \
  KD_QUANT_VARIANT(kQuant##Layout##Fp32Ref, "quant_fp8_" #layout "_fp32__ref", QuantScales::layout, DType::fp32,       \
                   false, core::kVariantReference)                                                                     \
  KD_QUANT_VARIANT(kQuant##Layout##Bf16Ref, "quant_fp8_" #layout "_bf16__ref", QuantScales::layout, DType::bf16,       \
                   false, core::kVariantReference)
KD_QUANT_VARIANTS(Tensor, tensor)
KD_QUANT_VARIANTS(Token, token)
KD_QUANT_VARIANTS(Group, group)
#undef KD_QUANT_VARIANTS
#undef KD_QUANT_VARIANT

core::Plan quant_fp8_default(const core::Problem& p, const DeviceInfo&) noexcept {
  core::Plan plan;
  if (p.out_dtype != DType::fp8_e4m3fn || (p.in_dtype != DType::fp32 && p.in_dtype != DType::bf16)) return plan;
  const bool f32 = p.in_dtype == DType::fp32;
  switch (p.op) {
    case OpKind::quant_fp8_tensor: plan.variant = f32 ? &kQuantTensorFp32Mul : &kQuantTensorBf16Mul; break;
    case OpKind::quant_fp8_token: plan.variant = f32 ? &kQuantTokenFp32Mul : &kQuantTokenBf16Mul; break;
    case OpKind::quant_fp8_group: plan.variant = f32 ? &kQuantGroupFp32Mul : &kQuantGroupBf16Mul; break;
    default: break;
  }
  return plan;
}

}  // namespace dispatch::cpu
