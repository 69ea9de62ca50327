// SPDX-License-Identifier: Apache-2.0
// The fused_add_rmsnorm op, in place as vLLM/SGLang define it:
//   residual[t, :] += x[t, :]  (the sum rounded to the storage dtype);
//   x[t, :] = rmsnorm(residual[t, :]) * w.
// x, residual [tokens, hidden] (must not overlap), w [hidden]; one dtype.
// Key: hidden, dtype [, stride].
#pragma once

#include <vector>

#include "core/numeric.hpp"
#include "core/op_spec.hpp"
#include "ops/rmsnorm.hpp"

namespace dispatch::core {

inline constexpr int kFusedArgX = 0, kFusedArgResidual = 1, kFusedArgW = 2;

namespace fused_add_rmsnorm_spec {

inline constexpr ArgSlot kSlots[] = {
    {.name = "x", .role = Role::read_write, .rows = {Dim::m}, .cols = {Dim::n}, .dtype = SlotDType::in},
    {.name = "residual", .role = Role::read_write, .rows = {Dim::m}, .cols = {Dim::n}, .dtype = SlotDType::in},
    {.name = "w", .role = Role::read, .rank = 1, .cols = {Dim::n}, .dtype = SlotDType::in, .fill = Fill::near_one},
};
inline constexpr int8_t kOrder[] = {kFusedArgX, kFusedArgResidual, kFusedArgW};

inline void reference(const Problem& p, const RefArgs& r) {
  double* x = r.data[kFusedArgX];
  double* res = r.data[kFusedArgResidual];
  const int64_t ldx = r.ld[kFusedArgX], ldr = r.ld[kFusedArgResidual];
  for (int64_t t = 0; t < p.m; ++t)
    for (int64_t i = 0; i < p.n; ++i) {
      // The sum in fp32, rounded to the storage dtype (vLLM's kernel).
      const float sum = static_cast<float>(x[t * ldx + i]) + static_cast<float>(res[t * ldr + i]);
      res[t * ldr + i] = p.in_dtype == DType::bf16   ? round_to_bf16(sum)
                         : p.in_dtype == DType::fp16 ? fp16_to_float(float_to_fp16(sum))
                                                     : sum;
    }
  rmsnorm_spec::rms_rows(p.m, p.n, res, ldr, r.data[kFusedArgW], r.scalar[0], x, ldx);
}

inline constexpr OpSpec kSpec{
    .op = OpKind::fused_add_rmsnorm,
    .name = "fused_add_rmsnorm",
    .summary = "In place, as vLLM/SGLang: residual += x (rounded to its dtype); x = rmsnorm(residual) * w.",
    .slots = kSlots,
    .scalars = rmsnorm_spec::kScalars,
    .fields = rmsnorm_spec::kFields,
    .order = kOrder,
    .in_dtype_slot = kFusedArgX,
    .out_dtype_slot = kFusedArgX,
    .same_dtype = kOrder,
    .positive = {.slot = kFusedArgX, .dims = 1u << int(Dim::n), .text = "hidden must be >= 1, got shape "},
    .dim_names = {"", "tokens", "hidden", "", "", ""},
    .tolerance = {{1e-5, 1e-4}, {1e-3, 2e-3}, {8e-3, 1.6e-2}},
    .flops = [](const Problem& p) { return 4.0 * p.m * p.n; },
    .reference = &reference,
};

}  // namespace fused_add_rmsnorm_spec

}  // namespace dispatch::core
