// SPDX-License-Identifier: Apache-2.0
// The gemm op: D[M,N] = A[M,K] · B[N,K]^T (+ bias[N]); B as torch.nn.Linear
// stores it. Inputs bf16/fp16/fp32, fp32 accumulation, D and bias in the
// output dtype. Key: N, K, dtype [, out_dtype] [, bias=true] [, stride].
#pragma once

#include "core/op_spec.hpp"

namespace dispatch::core {

/// Argument slots.
inline constexpr int kGemmArgA = 0, kGemmArgB = 1, kGemmArgD = 2, kGemmArgBias = 3;

namespace gemm_spec {

inline constexpr ArgSlot kSlots[] = {
    {.name = "a", .role = Role::read, .rows = {Dim::m}, .cols = {Dim::k}, .dtype = SlotDType::in},
    {.name = "b", .role = Role::read, .rows = {Dim::n}, .cols = {Dim::k}, .dtype = SlotDType::in},
    {.name = "d", .role = Role::write, .rows = {Dim::m}, .cols = {Dim::n}, .dtype = SlotDType::out},
    {.name = "bias",
     .role = Role::read,
     .rank = 1,
     .optional = true,
     .cols = {Dim::n},
     .dtype = SlotDType::out,
     .dtype_like = kGemmArgD},
};
inline constexpr KeyField kFields[] = {
    {.name = "K", .kind = FieldKind::dim, .dim = Dim::k, .file_pos = 1},
    {.name = "N", .kind = FieldKind::dim, .dim = Dim::n, .file_pos = 0},
    {.name = "bias", .kind = FieldKind::flag},
    {.name = "dtype", .kind = FieldKind::in_dtype},
    {.name = "out_dtype", .kind = FieldKind::out_dtype, .csv_name = "outdtype"},
    {.name = "stride", .kind = FieldKind::stride},
};
inline constexpr int8_t kOrder[] = {kGemmArgA, kGemmArgB, kGemmArgD};
inline constexpr int8_t kSameDType[] = {kGemmArgA, kGemmArgB};

inline void reference(const Problem& p, const RefArgs& r) {
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      double acc = 0.0;
      for (int64_t l = 0; l < p.k; ++l)
        acc += r.data[kGemmArgA][i * r.ld[kGemmArgA] + l] * r.data[kGemmArgB][j * r.ld[kGemmArgB] + l];
      if (r.data[kGemmArgBias]) acc += r.data[kGemmArgBias][j];
      r.data[kGemmArgD][i * r.ld[kGemmArgD] + j] = acc;
    }
}

inline constexpr OpSpec kSpec{
    .op = OpKind::gemm,
    .name = "gemm",
    .summary = "d[M,N] = a[M,K] @ b[N,K].T (+ bias[N]); b as torch.nn.Linear stores its weight; fp32 accumulation.",
    .slots = kSlots,
    .scalars = {},
    .fields = kFields,
    .order = kOrder,
    .in_dtype_slot = kGemmArgA,
    .out_dtype_slot = kGemmArgD,
    .same_dtype = kSameDType,
    .positive = {.slot = kGemmArgB,
                 .dims = (1u << int(Dim::n)) | (1u << int(Dim::k)),
                 .text = "N and K must be >= 1, got "},
    .dim_names = {"", "M", "N", "K", "", ""},
    .align_slots = (1u << kGemmArgA) | (1u << kGemmArgB),
    .uses_workspace = true,
    // fp32 outputs differ between variants only by summation order; bf16/fp16
    // by a rounding step or two of the final conversion.
    .tolerance = {{1e-5, 1e-4}, {1e-3, 2e-3}, {8e-3, 1.6e-2}},
    .flops = [](const Problem& p) { return 2.0 * p.m * p.n * p.k; },
    .reference = &reference,
};

}  // namespace gemm_spec

}  // namespace dispatch::core
