// SPDX-License-Identifier: Apache-2.0
// The rmsnorm op: y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w, per
// token t. x, y [tokens, hidden] (y may be x: in place, with equal row
// strides), w [hidden]; one dtype (fp32, bf16, fp16). Key: hidden, dtype
// [, stride].
#pragma once

#include <cmath>

#include "core/op_spec.hpp"

namespace dispatch::core {

inline constexpr int kNormArgY = 0, kNormArgX = 1, kNormArgW = 2;

namespace rmsnorm_spec {

inline constexpr ArgSlot kSlots[] = {
    {.name = "y",
     .role = Role::write,
     .rows = {Dim::m},
     .cols = {Dim::n},
     .dtype = SlotDType::out,
     .alias_of = kNormArgX},
    {.name = "x", .role = Role::read, .rows = {Dim::m}, .cols = {Dim::n}, .dtype = SlotDType::in},
    {.name = "w", .role = Role::read, .rank = 1, .cols = {Dim::n}, .dtype = SlotDType::in, .fill = Fill::near_one},
};
inline constexpr ScalarSlot kScalars[] = {{.name = "eps", .default_value = 1e-6f, .positive = true}};
inline constexpr KeyField kFields[] = {
    {.name = "dtype", .kind = FieldKind::in_dtype},
    {.name = "hidden", .kind = FieldKind::dim, .dim = Dim::n, .file_pos = 0},
    {.name = "stride", .kind = FieldKind::stride},
};
inline constexpr int8_t kOrder[] = {kNormArgX, kNormArgY, kNormArgW};

/// y = x * rsqrt(mean(x^2) + eps) * w of rows `rows` x `h`, in double.
inline void rms_rows(int64_t rows, int64_t h, const double* x, int64_t ldx, const double* w, double eps, double* y,
                     int64_t ldy) {
  for (int64_t t = 0; t < rows; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < h; ++i) ss += x[t * ldx + i] * x[t * ldx + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(h) + eps);
    for (int64_t i = 0; i < h; ++i) y[t * ldy + i] = x[t * ldx + i] * inv * w[i];
  }
}

inline void reference(const Problem& p, const RefArgs& r) {
  rms_rows(p.m, p.n, r.data[kNormArgX], r.ld[kNormArgX], r.data[kNormArgW], r.scalar[0], r.data[kNormArgY],
           r.ld[kNormArgY]);
}

inline constexpr OpSpec kSpec{
    .op = OpKind::rmsnorm,
    .name = "rmsnorm",
    .summary = "y = x / sqrt(mean(x**2, -1) + eps) * w, per row of [tokens, hidden] (y may be x).",
    .slots = kSlots,
    .scalars = kScalars,
    .fields = kFields,
    .order = kOrder,
    .in_dtype_slot = kNormArgX,
    .out_dtype_slot = kNormArgY,
    .same_dtype = kOrder,
    .positive = {.slot = kNormArgX, .dims = 1u << int(Dim::n), .text = "hidden must be >= 1, got shape "},
    .dim_names = {"", "tokens", "hidden", "", "", ""},
    .tolerance = {{1e-5, 1e-4}, {1e-3, 2e-3}, {8e-3, 1.6e-2}},
    .flops = [](const Problem& p) { return 4.0 * p.m * p.n; },
    .reference = &reference,
};

}  // namespace rmsnorm_spec

}  // namespace dispatch::core
