// SPDX-License-Identifier: Apache-2.0
// moe_gemm on fp8 weights with SGLang's per-tensor and per-channel scales
// (its fused-MoE files' dtype=fp8_w8a8 without block_shape, and with
// per_channel_quant=True): moe_gemm (src/ops/moe_gemm.hpp) with
//
//   out[s, :] = (q(a[t]) · w[e]^T) * sa(t) * sw(e, :) * (mul_routed_weight ? topk_weights[t, s % top_k] : 1),
//   t = s / top_k, and out[s, :] = 0 where e is not local,
//
//   moe_gemm_fp8_tensor   w_scale [E]: one scale per expert (SGLang's
//                         per-tensor w13_weight_scale / w2_weight_scale)
//   moe_gemm_fp8_channel  w_scale [E, N]: one per expert and output channel
//                         (SGLang's [E, N, 1] viewed as [E, N])
//
// - w [E, N, K] fp8_e4m3fn; a [M, K] and out [M, top_k, N] bf16 or fp32
//   (the same dtype); the other slots as moe_gemm's.
// - a_scale [1] fp32, optional. Given (static, SGLang's a1_scale /
//   a2_scale): q(a) = e4m3fn(clamp(a / a_scale, -448, 448)) and sa =
//   a_scale. Absent (dynamic, computed as the op runs): the tensor op one
//   scale for the whole of a (quant_fp8_tensor's rule, max(amax, 1e-10) /
//   448), the channel op one per row of a (quant_fp8_token's): what
//   SGLang's scaled_fp8_quant(A, None, use_per_token_if_dynamic =
//   per_channel_quant) computes before its kernel.
// - fp32 accumulation, the scales applied once to each sum, rounded once to
//   out's dtype.
//
// Two ops, not a scale field on moe_gemm: each layout has its own w_scale
// shape (gemm_fp8's reason). Key: E, N, K, block_size, dtype, [a_scale =
// static], [mul_routed_weight], [out_dtype], [stride], top_k.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <span>
#include <string_view>
#include <vector>

#include "core/numeric.hpp"
#include "ops/moe_gemm.hpp"
#include "ops/quant_fp8.hpp"

namespace dispatch::core {

inline constexpr int kMoeGemmArgAScale = 8;

/// How a moe_gemm_fp8 op scales its weights.
enum class MoeFp8Scales : uint8_t { tensor, channel };

namespace moe_gemm_fp8_common {

/// w_scale: [E] (tensor) or [E, N] (channel), fp32.
constexpr ArgSlot w_scale_slot(MoeFp8Scales l) {
  ArgSlot a{.name = "w_scale", .role = Role::read, .dtype = SlotDType::fixed, .fixed_dtype = DType::fp32};
  a.fill = Fill::near_one;
  if (l == MoeFp8Scales::tensor) {
    a.rank = 1, a.cols = {Dim::extra0};
  } else {
    a.rows = {Dim::extra0}, a.cols = {Dim::n};
  }
  return a;
}
/// a_scale [1] fp32, optional: its presence (Problem::has_bias) is the key's a_scale=static.
constexpr ArgSlot a_scale_slot() {
  return {.name = "a_scale",
          .role = Role::read,
          .rank = 1,
          .optional = true,
          .dtype = SlotDType::fixed,
          .fixed_dtype = DType::fp32,
          .fill = Fill::near_one};
}
template <MoeFp8Scales L>
constexpr auto slots() {
  const ArgSlot* m = moe_gemm_spec::kSlots;
  return std::array<ArgSlot, 9>{m[0], m[1], m[2], m[3], m[4], m[5], m[6], w_scale_slot(L), a_scale_slot()};
}

/// `base`'s key fields with a_scale=static in the flag's place (there the
/// block scales' block_shape; here the optional activation scales').
template <size_t N>
constexpr std::array<KeyField, N> a_scale_fields(const KeyField (&base)[N]) {
  std::array<KeyField, N> f{};
  for (size_t k = 0; k < N; ++k) f[k] = base[k];
  for (KeyField& k : f)
    if (k.kind == FieldKind::flag) k = {.name = "a_scale", .kind = FieldKind::flag, .flag_text = "static"};
  return f;
}
/// `base`'s binding order, then the slots `then`.
template <size_t N, size_t T>
constexpr std::array<int8_t, N + T> order_then(const int8_t (&base)[N], const int8_t (&then)[T]) {
  std::array<int8_t, N + T> o{};
  for (size_t k = 0; k < N; ++k) o[k] = base[k];
  for (size_t k = 0; k < T; ++k) o[N + k] = then[k];
  return o;
}
/// An fp8_w8a8 op's spec: `s` (moe_gemm's or fused_moe's) as op `op`, with
/// its own name, summary, slots, key fields, binding order and reference.
constexpr OpSpec derived_spec(OpSpec s, OpKind op, std::string_view name, std::string_view summary,
                              std::span<const ArgSlot> slots, std::span<const KeyField> fields,
                              std::span<const int8_t> order, void (*ref)(const Problem&, const RefArgs&)) {
  s.op = op, s.name = name, s.summary = summary;
  s.slots = slots, s.fields = fields, s.order = order;
  s.reference = ref;
  return s;
}

inline constexpr auto kFields = a_scale_fields(moe_gemm_spec::kFields);
inline constexpr int8_t kAScaleSlot[] = {kMoeGemmArgAScale};
inline constexpr auto kOrder = order_then(moe_gemm_spec::kOrder, kAScaleSlot);

/// Rows of x ([rows, K], dense) quantised as SGLang's scaled_fp8_quant
/// quantises an fp8_w8a8 kernel's input, in place: static (`given`, a [1]
/// scale: x / given clamped to +-448), dynamic per tensor (one scale,
/// max(amax, 1e-10) / 448 over the rows `use` marks, all rows when null)
/// or per token (`per_token`: one scale per row). Each value becomes its
/// e4m3fn code's value; sa[row] gets the row's scale (q times sa: what
/// the GEMM multiplies). The scale and the quotient are fp32, as every
/// kernel computes them (a quotient a double puts on an e4m3 tie would
/// round apart), and the clamp is the engines' fmax(fmin(v, 448), -448)
/// (a NaN gives +448, as theirs).
inline void quantise_rows(double* x, int64_t rows, int64_t K, const double* given, bool per_token, const char* use,
                          double* sa) {
  const float fmax = kE4m3fn.max_finite();
  auto amax_of = [&](int64_t r0, int64_t r1) {
    float amax = 0.f;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < K && (use == nullptr || use[r] != 0); ++c)
        amax = std::fmax(amax, std::fabs(static_cast<float>(x[r * K + c])));
    return std::fmax(amax, kQuantMinAmax) / fmax;
  };
  const float whole = given != nullptr ? static_cast<float>(given[0]) : per_token ? 1.f : amax_of(0, rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = given == nullptr && per_token ? amax_of(r, r + 1) : whole;
    sa[r] = s;
    for (int64_t c = 0; c < K; ++c) {
      const float v = std::fmax(std::fmin(static_cast<float>(x[r * K + c]) / s, fmax), -fmax);
      x[r * K + c] = fp8_to_float(float_to_fp8(v, kE4m3fn, true), kE4m3fn);
    }
  }
}

/// The activations' scales, one per row of a (sa(t)), and q(a) in place in
/// `x` ([M, K], row stride K): static (a_scale given), or dynamic per
/// tensor (the tensor op) or per token (the channel op).
template <MoeFp8Scales L>
void quantise_a(const Problem& p, const RefArgs& r, std::vector<double>* x, std::vector<double>* sa) {
  const int64_t M = p.m, K = p.k, lda = r.ld[kMoeGemmArgA];
  x->assign(static_cast<size_t>(M * K), 0.0);
  sa->assign(static_cast<size_t>(M), 1.0);
  for (int64_t t = 0; t < M; ++t)
    for (int64_t c = 0; c < K; ++c) (*x)[t * K + c] = r.data[kMoeGemmArgA][t * lda + c];
  quantise_rows(x->data(), M, K, r.data[kMoeGemmArgAScale], L == MoeFp8Scales::channel, nullptr, sa->data());
}

/// The float64 reference: a quantised as the op's rule says, each pair's
/// sum scaled by sa(t) * sw(e, n) (and its routing weight).
template <MoeFp8Scales L>
void reference(const Problem& p, const RefArgs& r) {
  const int64_t N = p.n, K = p.k, top_k = p.extra[1];
  const bool mul = r.scalar[2] != 0.f;
  std::vector<double> x, sa;
  quantise_a<L>(p, r, &x, &sa);
  const double* w = r.data[kMoeGemmArgW];
  const double* ws = r.data[kMoeGemmArgWScale];
  const int64_t ldw = r.ld[kMoeGemmArgW], ldo = r.ld[kMoeGemmArgOut], ldws = r.ld[kMoeGemmArgWScale];
  moe_gemm_spec::for_each_pair(p, r, [&](int64_t s, int64_t e) {
    const int64_t t = s / top_k;
    double* o = r.data[kMoeGemmArgOut] + s * ldo;
    if (e < 0) {
      std::fill(o, o + N, 0.0);
      return;
    }
    const double rw = mul ? r.data[kMoeGemmArgTopkWeights][t * r.ld[kMoeGemmArgTopkWeights] + s % top_k] : 1.0;
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      const double* wr = w + (e * N + n) * ldw;
      for (int64_t c = 0; c < K; ++c) acc += wr[c] * x[t * K + c];
      const double sw = L == MoeFp8Scales::tensor ? ws[e] : ws[e * ldws + n];
      o[n] = acc * sa[t] * sw * rw;
    }
  });
}

inline constexpr std::string_view kSummaries[] = {
    "moe_gemm on fp8 weights with one scale per expert (w_scale [E]) and a per-tensor activation scale, static "
    "(a_scale [1]) or dynamic: SGLang's fp8_w8a8 fused_moe_kernel without block_shape.",
    "moe_gemm on fp8 weights with one scale per expert and output channel (w_scale [E, N]) and an activation scale "
    "per token (dynamic) or per tensor (a_scale [1]): SGLang's fp8_w8a8 fused_moe_kernel with per_channel_quant."};

/// The op of layout L: moe_gemm's spec with these slots, fields, order and reference.
template <MoeFp8Scales L>
struct Spec {
  static constexpr auto kSlots = slots<L>();
  static constexpr OpSpec make() {
    const bool tensor = L == MoeFp8Scales::tensor;
    OpSpec s =
        derived_spec(moe_gemm_spec::make_spec(), tensor ? OpKind::moe_gemm_fp8_tensor : OpKind::moe_gemm_fp8_channel,
                     tensor ? "moe_gemm_fp8_tensor" : "moe_gemm_fp8_channel", kSummaries[tensor ? 0 : 1], kSlots,
                     kFields, kOrder, &reference<L>);
    // The quantised copy of a goes in the call's workspace on a GPU; the
    // tolerances are moe_gemm's (a quantised as the reference does).
    s.uses_workspace = true;
    return s;
  }
  static constexpr OpSpec kSpec = make();
};

}  // namespace moe_gemm_fp8_common

namespace moe_gemm_fp8_tensor_spec {
inline constexpr const OpSpec& kSpec = moe_gemm_fp8_common::Spec<MoeFp8Scales::tensor>::kSpec;
}
namespace moe_gemm_fp8_channel_spec {
inline constexpr const OpSpec& kSpec = moe_gemm_fp8_common::Spec<MoeFp8Scales::channel>::kSpec;
}

}  // namespace dispatch::core
