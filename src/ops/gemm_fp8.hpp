// SPDX-License-Identifier: Apache-2.0
// The fp8 GEMM ops (w8a8), one per scale layout:
//   D[M,N] = (A[M,K] ⊙ sa) · (B[N,K] ⊙ sb)^T (+ bias[N]),
// A and B fp8 (e4m3fn), fp32 scales, fp32 accumulation, D and bias bf16,
// fp16 or fp32. B row-major as torch.nn.Linear stores its weight.
// fast_accum (a switch scalar, off by default) asks for fast accumulation:
// cuBLASLt's FAST_ACCUM, the fp8 tensor-core sums kept at ~fp22 on Hopper
// (torch._scaled_mm's use_fast_accum). A key field, `accum=fast`: rows
// tuned for one accumulation never serve the other, and the tuner only tunes
// what the call asked for. Variants that always accumulate in fp32
// (skinny_mma, the references, the CPU variants) serve fast calls as they
// are: more precise than asked is allowed.
//
//   gemm_fp8_tensor   sa [1], sb [1]: one scale per tensor (torch._scaled_mm's
//                     default; vLLM's per-tensor cutlass_scaled_mm)
//   gemm_fp8_rowwise  sa [M] per token, sb [N] per output channel (torch's
//                     "rowwise"; vLLM's per-token x per-channel)
//   gemm_fp8_block    DeepSeek-V3's block scales: 1x128 groups of A along K
//                     per token, 128x128 blocks of B. The one canonical
//                     layout: sb [ceil(N/128), ceil(K/128)] row-major;
//                     sa M-major, as SGLang's column-major scales and
//                     cuBLASLt's VEC128 mode store it: [ceil(K/128), M] row-
//                     major, each K-group's M scales contiguous, its row
//                     stride (the padded M; cuBLASLt wants a multiple of 4)
//                     free. Also K-major (SGLang's per_token_group_quant_fp8
//                     layout) as the column-major view of [ceil(K/128), M]:
//                     same key, LaunchArgs::ld < 0 (block_sa_index). A K or
//                     N that is not a multiple of 128 has a partial last
//                     block, as SGLang's kernel.
//
// Why three ops and not one op with a `scale` key field: each layout has
// its own scale shapes, and every generic layer (validation, the tuner's
// scratch, the bindings' shape rules) reads a slot's shape from its spec.
// The layout is still part of every key and file name: it is the op.
// Key: N, K, dtype (the fp8 format), out_dtype, [accum=fast], [bias], [stride].
#pragma once

#include "core/op_spec.hpp"

namespace dispatch::core {

/// Argument slots, shared by the three ops.
inline constexpr int kFp8ArgA = 0, kFp8ArgB = 1, kFp8ArgD = 2, kFp8ArgSa = 3, kFp8ArgSb = 4, kFp8ArgBias = 5;
/// The block ops' group along K (A: 1x128, B: 128x128).
inline constexpr int kFp8Block = 128;

/// scale_a[group kb, row m] of the block layout in LaunchArgs terms: ld >= 0
/// M-major (the canonical layout, row stride ld); ld < 0 K-major (a column-
/// major view of [ceil(K/128), M], as SGLang's per_token_group_quant_fp8
/// writes it: row m's groups contiguous, -ld apart).
constexpr int64_t block_sa_index(int64_t kb, int64_t m, int64_t ld) { return ld >= 0 ? kb * ld + m : m * -ld + kb; }

/// How sa and sb are laid out (the three ops).
enum class Fp8Scales : uint8_t { tensor, rowwise, block };

namespace gemm_fp8_common {

/// The shared slots with the layout's scale shapes.
constexpr ArgSlot a_slot() {
  return {.name = "a", .role = Role::read, .rows = {Dim::m}, .cols = {Dim::k}, .dtype = SlotDType::in};
}
constexpr ArgSlot b_slot() {
  return {.name = "b", .role = Role::read, .rows = {Dim::n}, .cols = {Dim::k}, .dtype = SlotDType::in};
}
constexpr ArgSlot d_slot() {
  return {.name = "d", .role = Role::write, .rows = {Dim::m}, .cols = {Dim::n}, .dtype = SlotDType::out};
}
constexpr ArgSlot bias_slot() {
  return {.name = "bias",
          .role = Role::read,
          .rank = 1,
          .optional = true,
          .cols = {Dim::n},
          .dtype = SlotDType::out,
          .dtype_like = kFp8ArgD};
}
constexpr ArgSlot scale_slot(std::string_view name, int8_t rank, DimExpr rows, DimExpr cols,
                             bool col_major_ok = false) {
  return {.name = name,
          .role = Role::read,
          .rank = rank,
          .rows = rows,
          .cols = cols,
          .dtype = SlotDType::fixed,
          .fixed_dtype = DType::fp32,
          .fill = Fill::near_one,
          .col_major_ok = col_major_ok};
}

/// The switch: 1 asks for fast accumulation (Problem::accum).
inline constexpr ScalarSlot kScalars[] = {{.name = "fast_accum", .default_value = 0.f, .kind = ScalarKind::accum}};

inline constexpr KeyField kFields[] = {
    {.name = "K", .kind = FieldKind::dim, .dim = Dim::k, .file_pos = 1},
    {.name = "N", .kind = FieldKind::dim, .dim = Dim::n, .file_pos = 0},
    {.name = "accum", .kind = FieldKind::accum},
    {.name = "bias", .kind = FieldKind::flag},
    {.name = "dtype", .kind = FieldKind::in_dtype},
    {.name = "out_dtype", .kind = FieldKind::out_dtype, .csv_name = "outdtype"},
    {.name = "stride", .kind = FieldKind::stride},
};
// Every required slot; the stride key field covers the first four.
inline constexpr int8_t kOrder[] = {kFp8ArgA, kFp8ArgB, kFp8ArgD, kFp8ArgSa, kFp8ArgSb};
inline constexpr int8_t kSameDType[] = {kFp8ArgA, kFp8ArgB};

/// The float64 reference of layout L: each 128-wide K group's product sum
/// times its scales (the per-tensor and rowwise scales do not vary along K).
template <Fp8Scales L>
void reference(const Problem& p, const RefArgs& r) {
  const double* a = r.data[kFp8ArgA];
  const double* b = r.data[kFp8ArgB];
  const double* sa = r.data[kFp8ArgSa];
  const double* sb = r.data[kFp8ArgSb];
  const double* bias = r.data[kFp8ArgBias];
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      double acc = 0.0;
      for (int64_t k0 = 0; k0 < p.k; k0 += kFp8Block) {
        double part = 0.0;
        const int64_t k1 = k0 + kFp8Block < p.k ? k0 + kFp8Block : p.k;
        for (int64_t l = k0; l < k1; ++l) part += a[i * r.ld[kFp8ArgA] + l] * b[j * r.ld[kFp8ArgB] + l];
        const int64_t kb = k0 / kFp8Block;
        double s = 1.0;
        if constexpr (L == Fp8Scales::tensor) s = sa[0] * sb[0];
        if constexpr (L == Fp8Scales::rowwise) s = sa[i] * sb[j];
        if constexpr (L == Fp8Scales::block)
          s = sa[block_sa_index(kb, i, r.ld[kFp8ArgSa])] * sb[(j / kFp8Block) * r.ld[kFp8ArgSb] + kb];
        acc += part * s;
      }
      if (bias) acc += bias[j];
      r.data[kFp8ArgD][i * r.ld[kFp8ArgD] + j] = acc;
    }
}

// Tolerances (in the specs below): fp8 products are exact in fp32 and each
// 128-wide group sums in fp32, so variants differ by summation order and the
// scales' roundings; bf16/fp16 outputs by a rounding step or two of the
// final conversion.
// Fast accumulation (accum=fast; cuBLASLt's FAST_ACCUM on sm_90): the fp8
// MMAs keep their running sum in the tensor cores' accumulator format
// (~fp22: 13 mantissa bits, truncated) and never promote it to fp32
// ("intermediate results will not periodically be promoted", cublasLt.h),
// so each 32-deep MMA step may drop up to 2^-13 of the running sum: <= 4 x
// 2^-13 = 4.9e-4 of the partial sums over a 128-wide K-chunk, and K =
// 4096's 128 steps bound it at 1.6% of the largest partial sum if every
// step truncates the same way (DeepSeek-V3 reports ~2% relative error at
// K = 4096 without promotion; sums of random sign stay far below the bound).
// The fast budget, for every output dtype: |got - want| <= 2e-2 x max|ref|
// + 3.2e-2 x |want|, 2.5x and 2x the bf16 budget (2000x the fp32 one); a
// wrong scale or K group (errors of 10-50%) still fails. A model, not yet a
// measurement: tests/gpu/test_gpu_fp8.cpp's accum=fast cases print the
// largest error they see.
inline constexpr Tolerance kFastAccumTolerance{2e-2, 3.2e-2};
inline double flops(const Problem& p) { return 2.0 * p.m * p.n * p.k; }

/// The spec every layout shares but for its name, summary, slots and reference.
constexpr OpSpec spec_of_layout(OpKind op, std::string_view name, std::string_view summary,
                                std::span<const ArgSlot> slots, void (*ref)(const Problem&, const RefArgs&)) {
  return OpSpec{
      .op = op,
      .name = name,
      .summary = summary,
      .slots = slots,
      .scalars = kScalars,
      .fields = kFields,
      .order = kOrder,
      .in_dtype_slot = kFp8ArgA,
      .out_dtype_slot = kFp8ArgD,
      .same_dtype = kSameDType,
      .positive = {.slot = kFp8ArgB,
                   .dims = (1u << int(Dim::n)) | (1u << int(Dim::k)),
                   .text = "N and K must be >= 1, got "},
      .dim_names = {"", "M", "N", "K", "", ""},
      .align_slots = (1u << kFp8ArgA) | (1u << kFp8ArgB),
      .uses_workspace = true,
      .default_out_dtype = static_cast<int8_t>(DType::bf16),
      .tolerance = {{1e-5, 1e-4}, {1e-3, 2e-3}, {8e-3, 1.6e-2}},
      .fast_accum_tolerance = kFastAccumTolerance,
      .flops = &flops,
      .reference = ref,
  };
}

}  // namespace gemm_fp8_common

namespace gemm_fp8_tensor_spec {
using namespace gemm_fp8_common;
inline constexpr ArgSlot kSlots[] = {
    a_slot(),
    b_slot(),
    d_slot(),
    scale_slot("scale_a", 1, {}, {Dim::none}),
    scale_slot("scale_b", 1, {}, {Dim::none}),
    bias_slot(),
};
inline constexpr OpSpec kSpec = spec_of_layout(
    OpKind::gemm_fp8_tensor, "gemm_fp8_tensor",
    "d[M,N] = (a[M,K] @ b[N,K].T) * scale_a[0] * scale_b[0] (+ bias[N]): fp8 w8a8 with per-tensor scales; fp32 "
    "accumulation (or, with fast_accum, cuBLASLt's fast accumulation where it runs: key accum=fast).",
    kSlots, &reference<Fp8Scales::tensor>);
}  // namespace gemm_fp8_tensor_spec

namespace gemm_fp8_rowwise_spec {
using namespace gemm_fp8_common;
inline constexpr ArgSlot kSlots[] = {
    a_slot(),    b_slot(), d_slot(), scale_slot("scale_a", 1, {}, {Dim::m}), scale_slot("scale_b", 1, {}, {Dim::n}),
    bias_slot(),
};
inline constexpr OpSpec kSpec =
    spec_of_layout(OpKind::gemm_fp8_rowwise, "gemm_fp8_rowwise",
                   "d[M,N] = (a[M,K] @ b[N,K].T) * scale_a[M, None] * scale_b[None, N] (+ bias[N]): fp8 w8a8 with "
                   "per-token and per-channel scales; fp32 accumulation (or, with fast_accum, cuBLASLt's fast "
                   "accumulation where it runs: key accum=fast).",
                   kSlots, &reference<Fp8Scales::rowwise>);
}  // namespace gemm_fp8_rowwise_spec

namespace gemm_fp8_block_spec {
using namespace gemm_fp8_common;
inline constexpr ArgSlot kSlots[] = {
    a_slot(),
    b_slot(),
    d_slot(),
    scale_slot("scale_a", 2, {Dim::k, 1, kFp8Block}, {Dim::m}, true),
    scale_slot("scale_b", 2, {Dim::n, 1, kFp8Block}, {Dim::k, 1, kFp8Block}),
    bias_slot(),
};
inline constexpr OpSpec kSpec =
    spec_of_layout(OpKind::gemm_fp8_block, "gemm_fp8_block",
                   "d[M,N] = sum over 128-wide K groups g of (a[:, g] @ b[:, g].T) * scale_a[g, M] * scale_b[N/128, g] "
                   "(+ bias[N]): fp8 w8a8 with DeepSeek-V3's 1x128 / 128x128 block scales, scale_a M-major [K/128, M] "
                   "(or K-major, SGLang's default, passed as its transpose: a column-major view); fp32 accumulation "
                   "(or, with fast_accum, cuBLASLt's fast accumulation where it runs: key accum=fast).",
                   kSlots, &reference<Fp8Scales::block>);
}  // namespace gemm_fp8_block_spec

}  // namespace dispatch::core
