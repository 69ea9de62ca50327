// SPDX-License-Identifier: Apache-2.0
// The silu_and_mul op, the activation after a fused gate_up projection as
// vLLM and SGLang run it:
//   out[t, i] = silu(x[t, i]) * x[t, d + i],  silu(g) = g / (1 + exp(-g)),
// out [tokens, d], x [tokens, 2d]; one dtype (fp32, bf16, fp16), computed
// in fp32. Argument order as vLLM's silu_and_mul(out, input).
// Key: d, dtype [, stride].
#pragma once

#include <cmath>

#include "core/op_spec.hpp"

namespace dispatch::core {

inline constexpr int kSiluArgOut = 0, kSiluArgX = 1;

namespace silu_and_mul_spec {

inline constexpr ArgSlot kSlots[] = {
    {.name = "out", .role = Role::write, .rows = {Dim::m}, .cols = {Dim::n}, .dtype = SlotDType::out},
    {.name = "x",
     .role = Role::read,
     .rows = {Dim::m},
     .cols = {Dim::n, 2},
     .dtype = SlotDType::in,
     .fill = Fill::wide},
};
inline constexpr KeyField kFields[] = {
    {.name = "d", .kind = FieldKind::dim, .dim = Dim::n, .file_pos = 0},
    {.name = "dtype", .kind = FieldKind::in_dtype},
    {.name = "stride", .kind = FieldKind::stride},
};
inline constexpr int8_t kOrder[] = {kSiluArgOut, kSiluArgX};

inline void reference(const Problem& p, const RefArgs& r) {
  const double* x = r.data[kSiluArgX];
  double* out = r.data[kSiluArgOut];
  for (int64_t t = 0; t < p.m; ++t)
    for (int64_t i = 0; i < p.n; ++i) {
      const double g = x[t * r.ld[kSiluArgX] + i], u = x[t * r.ld[kSiluArgX] + p.n + i];
      out[t * r.ld[kSiluArgOut] + i] = g / (1.0 + std::exp(-g)) * u;
    }
}

inline constexpr OpSpec kSpec{
    .op = OpKind::silu_and_mul,
    .name = "silu_and_mul",
    .summary =
        "out[t, i] = silu(x[t, i]) * x[t, d + i]: the activation after a fused gate_up projection (vLLM/SGLang "
        "silu_and_mul(out, input)).",
    .slots = kSlots,
    .scalars = {},
    .fields = kFields,
    .order = kOrder,
    .in_dtype_slot = kSiluArgX,
    .out_dtype_slot = kSiluArgOut,
    .same_dtype = kOrder,
    .positive = {.slot = kSiluArgOut, .dims = 1u << int(Dim::n), .text = "d must be >= 1, got shape "},
    .dim_names = {"", "tokens", "d", "", "", ""},
    .align_slots = (1u << kSiluArgOut) | (1u << kSiluArgX),
    // Elementwise in fp32 from the same inputs: variants differ by the
    // exp's and the division's last bits, then one rounding to the dtype.
    .tolerance = {{1e-6, 1e-5}, {1e-3, 2e-3}, {8e-3, 1.6e-2}},
    .flops = [](const Problem& p) { return 5.0 * p.m * p.n; },  // exp, add, divide, two multiplies
    .reference = &reference,
};

}  // namespace silu_and_mul_spec

}  // namespace dispatch::core
