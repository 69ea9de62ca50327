// SPDX-License-Identifier: Apache-2.0
// The activation-quantisation ops an engine runs right before an fp8 GEMM,
// one per scale layout (the layouts of src/ops/gemm_fp8.hpp's scale_a):
//   scale = max(amax, 1e-10) / 448 over the layout's group,
//   q = e4m3fn(clamp(x / scale, -448, 448)), round to nearest even,
// as SGLang's per_token_group_quant_fp8 and vLLM's dynamic quantisation:
//
//   quant_fp8_tensor  one dynamic scale [1] for the whole of x (written at
//                     M = 0 too: an empty x's amax is 0, scale 1e-10 / 448)
//   quant_fp8_token   a scale per token [M]
//   quant_fp8_group   a scale per token and 128-wide group along K, written
//                     M-major: [ceil(K/128), M] with a free row stride, the
//                     layout gemm_fp8_block reads (the last group partial)
//
// x [M, K] fp32 or bf16 (fp16 on GPUs), q [M, K] fp8 e4m3fn, scale fp32.
// Argument order as vLLM's scaled_fp8_quant(out, input, scale).
// Key: K, dtype, out_dtype, [stride].
#pragma once

#include <cmath>

#include "core/numeric.hpp"
#include "core/op_spec.hpp"

namespace dispatch::core {

inline constexpr int kQuantArgQ = 0, kQuantArgX = 1, kQuantArgScale = 2;
/// The group along K of quant_fp8_group (gemm_fp8_block's 1x128).
inline constexpr int kQuantGroup = 128;
/// The smallest amax a scale is computed from (SGLang's eps): an all-zero
/// group gets scale 1e-10 / 448 and zeros.
inline constexpr float kQuantMinAmax = 1e-10f;

enum class QuantScales : uint8_t { tensor, token, group };

namespace quant_fp8_common {

inline constexpr KeyField kFields[] = {
    {.name = "K", .kind = FieldKind::dim, .dim = Dim::k, .file_pos = 0},
    {.name = "dtype", .kind = FieldKind::in_dtype},
    {.name = "out_dtype", .kind = FieldKind::out_dtype, .csv_name = "outdtype"},
    {.name = "stride", .kind = FieldKind::stride},
};
inline constexpr int8_t kOrder[] = {kQuantArgX, kQuantArgQ, kQuantArgScale};

constexpr ArgSlot q_slot() {
  return {.name = "q", .role = Role::write, .rows = {Dim::m}, .cols = {Dim::k}, .dtype = SlotDType::out};
}
constexpr ArgSlot x_slot() {
  return {
      .name = "x", .role = Role::read, .rows = {Dim::m}, .cols = {Dim::k}, .dtype = SlotDType::in, .fill = Fill::wide};
}
constexpr ArgSlot scale_slot(int8_t rank, DimExpr rows, DimExpr cols) {
  return {.name = "scale",
          .role = Role::write,
          .rank = rank,
          .rows = rows,
          .cols = cols,
          .dtype = SlotDType::fixed,
          .fixed_dtype = DType::fp32};
}

/// The float64 reference: each group's scale from its amax, then q.
template <QuantScales L>
void reference(const Problem& p, const RefArgs& r) {
  const double* x = r.data[kQuantArgX];
  double* q = r.data[kQuantArgQ];
  double* s = r.data[kQuantArgScale];
  const int64_t lx = r.ld[kQuantArgX], lq = r.ld[kQuantArgQ];
  const int64_t gk = L == QuantScales::group ? kQuantGroup : p.k;
  const double fmax = kE4m3fn.max_finite();
  auto quantise = [&](int64_t i0, int64_t i1, int64_t k0, int64_t k1) {
    double amax = 0;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t l = k0; l < k1; ++l) amax = std::fmax(amax, std::fabs(x[i * lx + l]));
    const double scale = std::fmax(amax, double(kQuantMinAmax)) / fmax;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t l = k0; l < k1; ++l) {
        const double v = std::fmin(std::fmax(x[i * lx + l] / scale, -fmax), fmax);
        q[i * lq + l] = fp8_to_float(float_to_fp8(static_cast<float>(v), kE4m3fn, true), kE4m3fn);
      }
    return scale;
  };
  if constexpr (L == QuantScales::tensor) {
    s[0] = quantise(0, p.m, 0, p.k);
  } else {
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t k0 = 0; k0 < p.k; k0 += gk) {
        const double scale = quantise(i, i + 1, k0, k0 + gk < p.k ? k0 + gk : p.k);
        if constexpr (L == QuantScales::token)
          s[i] = scale;
        else
          s[(k0 / gk) * r.ld[kQuantArgScale] + i] = scale;
      }
  }
}

/// The spec every layout shares but for its name, summary, slots and reference.
constexpr OpSpec spec_of_layout(OpKind op, std::string_view name, std::string_view summary,
                                std::span<const ArgSlot> slots, void (*ref)(const Problem&, const RefArgs&)) {
  // Tolerances: the scale (fp32) from the same amax in float or double;
  // q within one e4m3fn step (2^-3 relative), since x / scale computed in
  // fp32 can land on the other side of a rounding boundary than in fp64.
  OpSpec s{
      .op = op,
      .name = name,
      .summary = summary,
      .slots = slots,
      .scalars = {},
      .fields = kFields,
      .order = kOrder,
      .in_dtype_slot = kQuantArgX,
      .out_dtype_slot = kQuantArgQ,
      .same_dtype = {},
      .positive = {.slot = kQuantArgX, .dims = 1u << int(Dim::k), .text = "K must be >= 1, got shape "},
      .dim_names = {"", "M", "", "K", "", ""},
      .align_slots = (1u << kQuantArgX) | (1u << kQuantArgQ),
      .uses_workspace = false,
      .default_out_dtype = static_cast<int8_t>(DType::fp8_e4m3fn),
      .tolerance = {},
      .flops = [](const Problem& p) { return 3.0 * p.m * p.k; },  // |x|, max, divide
      .reference = ref,
  };
  s.tolerance[static_cast<int>(DType::fp32)] = {1e-6, 1e-5};
  s.tolerance[static_cast<int>(DType::fp8_e4m3fn)] = {1e-3, 0.13};
  return s;
}

}  // namespace quant_fp8_common

namespace quant_fp8_tensor_spec {
using namespace quant_fp8_common;
inline constexpr ArgSlot kSlots[] = {q_slot(), x_slot(), scale_slot(1, {}, {Dim::none})};
constexpr OpSpec make_spec() {
  OpSpec s = spec_of_layout(OpKind::quant_fp8_tensor, "quant_fp8_tensor",
                            "q[M,K] = e4m3fn(x / scale), scale[0] = max|x| / 448: dynamic per-tensor fp8 quantisation "
                            "(vLLM's scaled_fp8_quant(out, input, scale)).",
                            kSlots, &reference<QuantScales::tensor>);
  s.launches_when_empty = true;  // M = 0 still writes scale[0] (an empty x's amax is 0: 1e-10 / 448)
  return s;
}
inline constexpr OpSpec kSpec = make_spec();
}  // namespace quant_fp8_tensor_spec

namespace quant_fp8_token_spec {
using namespace quant_fp8_common;
inline constexpr ArgSlot kSlots[] = {q_slot(), x_slot(), scale_slot(1, {}, {Dim::m})};
inline constexpr OpSpec kSpec = spec_of_layout(OpKind::quant_fp8_token, "quant_fp8_token",
                                               "q[M,K] = e4m3fn(x / scale[M, None]), scale[i] = max|x[i]| / 448: "
                                               "per-token fp8 quantisation (the rowwise GEMM's scale_a).",
                                               kSlots, &reference<QuantScales::token>);
}  // namespace quant_fp8_token_spec

namespace quant_fp8_group_spec {
using namespace quant_fp8_common;
inline constexpr ArgSlot kSlots[] = {q_slot(), x_slot(), scale_slot(2, {Dim::k, 1, kQuantGroup}, {Dim::m})};
inline constexpr OpSpec kSpec = spec_of_layout(
    OpKind::quant_fp8_group, "quant_fp8_group",
    "q[M,K] = e4m3fn(x / scale), one scale per token and 128-wide K group, written M-major [ceil(K/128), M]: the block "
    "GEMM's scale_a (SGLang's per_token_group_quant_fp8 with column-major scales).",
    kSlots, &reference<QuantScales::group>);
}  // namespace quant_fp8_group_spec

}  // namespace dispatch::core
