// SPDX-License-Identifier: Apache-2.0
// The moe_sum op: the top-k reduction after a Mixture-of-Experts layer's
// down projection, when the routed weights were applied inside it (vLLM's
// moe_sum, SGLang's moe_sum_reduce):
//
//   out[t, h] = routed_scaling_factor * sum_{j = 0 .. top_k-1} input[t, j, h]
//
// - input [M, top_k, hidden]: each token's top_k expert outputs (rank 3, the
//   tokens stacked densely: token stride = top_k * row stride; unit stride
//   along hidden); bf16, fp16 or fp32.
// - out [M, hidden]: written, the dtype of input; it may not overlap input.
// - routed_scaling_factor (> 0, default 1): DeepSeek's, as SGLang's
//   moe_sum_reduce takes it (vLLM's moe_sum is the factor 1).
//
// Deterministic: every variant sums j in ascending order in fp32, multiplies
// by the factor in fp32 and rounds once to the out dtype, so the variants of
// one backend agree bit for bit (no atomics, no split of top_k).
//
// Argument order (input, out): vLLM's moe_sum(Tensor input, Tensor! output)
// and the order of its sibling fused_moe (the inputs, then out); the op list
// follows the engine's own order where it has one (silu_and_mul(out, input)
// is vLLM's too).
// Dims: M tokens (the batch dim), hidden = n, top_k = k. Key: hidden, top_k,
// dtype [, stride].
#pragma once

#include <algorithm>
#include <functional>

#include "core/op_spec.hpp"

namespace dispatch::core {

inline constexpr int kMoeSumArgInput = 0, kMoeSumArgOut = 1;

namespace moe_sum_spec {

inline constexpr ArgSlot kSlots[] = {
    {.name = "input",
     .role = Role::read,
     .rank = 3,
     .batch = {Dim::m},
     .rows = {Dim::k},
     .cols = {Dim::n},
     .dtype = SlotDType::in},
    {.name = "out", .role = Role::write, .rows = {Dim::m}, .cols = {Dim::n}, .dtype = SlotDType::out},
};
inline constexpr ScalarSlot kScalars[] = {
    {.name = "routed_scaling_factor", .default_value = 1.f, .positive = true},
};
inline constexpr KeyField kFields[] = {
    {.name = "dtype", .kind = FieldKind::in_dtype},
    {.name = "hidden", .kind = FieldKind::dim, .dim = Dim::n, .file_pos = 0},
    {.name = "stride", .kind = FieldKind::stride},
    {.name = "top_k", .kind = FieldKind::dim, .dim = Dim::k, .file_pos = 1},
};
inline constexpr int8_t kOrder[] = {kMoeSumArgInput, kMoeSumArgOut};

/// input is [M * top_k, hidden] past validation: token t's choice j is row
/// t * top_k + j. Each output row is the running sum of its choices' rows,
/// j ascending, then scaled.
inline void reference(const Problem& p, const RefArgs& r) {
  const int64_t ldi = r.ld[kMoeSumArgInput], ldo = r.ld[kMoeSumArgOut];
  for (int64_t t = 0; t < p.m; ++t) {
    double* sum = r.data[kMoeSumArgOut] + t * ldo;
    const double* choice = r.data[kMoeSumArgInput] + t * p.k * ldi;
    std::copy(choice, choice + p.n, sum);
    for (int64_t j = 1; j < p.k; ++j) std::transform(sum, sum + p.n, choice + j * ldi, sum, std::plus<double>());
    std::transform(sum, sum + p.n, sum, [&](double v) { return v * r.scalar[0]; });
  }
}

inline double flops(const Problem& p) { return static_cast<double>(p.m) * static_cast<double>(p.k) * p.n; }

/// The spec, assembled field by field.
constexpr OpSpec make_spec() {
  OpSpec s{};
  s.op = OpKind::moe_sum, s.name = "moe_sum";
  s.summary =
      "out[t, h] = routed_scaling_factor * sum_j input[t, j, h], j ascending: the top-k reduction of a "
      "Mixture-of-Experts layer (vLLM's moe_sum(input, output), SGLang's moe_sum_reduce).";
  s.slots = kSlots, s.scalars = kScalars, s.fields = kFields;
  // input binds M, top_k and hidden; out is checked against them; one dtype.
  s.order = s.same_dtype = kOrder;
  s.in_dtype_slot = kMoeSumArgInput, s.out_dtype_slot = kMoeSumArgOut;
  s.positive = {kMoeSumArgInput, (1u << int(Dim::n)) | (1u << int(Dim::k)),
                "hidden and top_k must be >= 1, got shape "};
  s.dim_names[int(Dim::m)] = "M", s.dim_names[int(Dim::n)] = "hidden", s.dim_names[int(Dim::k)] = "top_k";
  s.align_slots = (1u << kMoeSumArgInput) | (1u << kMoeSumArgOut);
  // top_k fp32 additions (2^-24 each, against max|ref|), then one rounding
  // to the out dtype (2^-11 fp16, 2^-9 bf16 of |want|).
  s.tolerance[int(DType::fp32)] = {2e-6, 2e-6};
  s.tolerance[int(DType::fp16)] = {1e-4, 1e-3};
  s.tolerance[int(DType::bf16)] = {1e-3, 4e-3};
  s.flops = &flops, s.reference = &reference;
  return s;
}
inline constexpr OpSpec kSpec = make_spec();

}  // namespace moe_sum_spec

}  // namespace dispatch::core
