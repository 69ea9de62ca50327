// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the list of ops: one row per op, in OpKind order.
//
//   X(name, C++ args struct, (tensor arguments), (float scalars))
//
// The row's names are the public spelling: `dispatch::<name>(Runtime&,
// const <Args>&, ...)`, `kdispatch_<name>(...)`, `kdispatch_pretune_<name>`,
// the Python method and the torch op. The tensor and scalar names are the
// members of the args struct, in the order of the op's argument slots
// (src/ops/<name>.hpp holds the rest of the op's description: roles,
// shapes, key fields, reference, tolerance). Adding an op: a row here, its
// spec row in src/ops/, its kernels, and its public declarations (the C++
// args struct and prototypes in dispatch/ops.hpp, the C prototypes in
// dispatch/c_api.h). Every binding is generated from this row.
//
// A scalar may be a switch (core::ScalarKind::accum: a bool member of the
// args struct, 0 or 1 where scalars travel as floats): each switch's name has
// a KD_SWITCH_<name> line below, which KD_PP_IS_SWITCH reads. The C ABI's
// kdispatch_<name> functions leave switches out of their parameters (their
// `flags` carry them), so a switch added to an op keeps its C signature.
#pragma once

#define KD_SWITCH_fast_accum ~, 1

#define KDISPATCH_OP_LIST(X)                                                                                      \
  X(gemm, GemmArgs, (a, b, d, bias), ())                                                                          \
  X(rmsnorm, RmsNormArgs, (y, x, w), (eps))                                                                       \
  X(fused_add_rmsnorm, FusedAddRmsNormArgs, (x, residual, w), (eps))                                              \
  X(silu_and_mul, SiluAndMulArgs, (out, x), ())                                                                   \
  X(gemm_fp8_tensor, GemmFp8TensorArgs, (a, b, d, scale_a, scale_b, bias), (fast_accum))                          \
  X(gemm_fp8_rowwise, GemmFp8RowwiseArgs, (a, b, d, scale_a, scale_b, bias), (fast_accum))                        \
  X(gemm_fp8_block, GemmFp8BlockArgs, (a, b, d, scale_a, scale_b, bias), (fast_accum))                            \
  X(quant_fp8_tensor, QuantFp8TensorArgs, (q, x, scale), ())                                                      \
  X(quant_fp8_token, QuantFp8TokenArgs, (q, x, scale), ())                                                        \
  X(quant_fp8_group, QuantFp8GroupArgs, (q, x, scale), ())                                                        \
  X(fused_moe, FusedMoeArgs, (hidden, w1, w2, topk_weights, topk_ids, out, w1_scale, w2_scale),                   \
    (routed_scaling_factor, activation))                                                                          \
  X(moe_sum, MoeSumArgs, (input, out), (routed_scaling_factor))                                                   \
  X(moe_align, MoeAlignArgs, (topk_ids, sorted_token_ids, expert_ids, num_tokens_post_pad, expert_map),           \
    (num_experts, block_size))                                                                                    \
  X(moe_gemm, MoeGemmArgs, (a, w, out, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_pad, w_scale), \
    (top_k, block_size, mul_routed_weight))                                                                       \
  X(moe_gemm_fp8_tensor, MoeGemmFp8TensorArgs,                                                                    \
    (a, w, out, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_pad, w_scale, a_scale),               \
    (top_k, block_size, mul_routed_weight))                                                                       \
  X(moe_gemm_fp8_channel, MoeGemmFp8ChannelArgs,                                                                  \
    (a, w, out, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_pad, w_scale, a_scale),               \
    (top_k, block_size, mul_routed_weight))                                                                       \
  X(fused_moe_fp8_tensor, FusedMoeFp8TensorArgs,                                                                  \
    (hidden, w1, w2, topk_weights, topk_ids, out, w1_scale, w2_scale, a1_scale, a2_scale),                        \
    (routed_scaling_factor, activation))                                                                          \
  X(fused_moe_fp8_channel, FusedMoeFp8ChannelArgs,                                                                \
    (hidden, w1, w2, topk_weights, topk_ids, out, w1_scale, w2_scale, a1_scale, a2_scale),                        \
    (routed_scaling_factor, activation))

// ---- preprocessor helpers for the rows' tuples (up to 12 elements: core::kMaxArgs)
#define KD_PP_EXPAND(...) __VA_ARGS__
#define KD_PP_CAT_(a, b) a##b
#define KD_PP_CAT(a, b) KD_PP_CAT_(a, b)
#define KD_PP_NARG_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, N, ...) N
#define KD_PP_NARG(...) KD_PP_NARG_(__VA_ARGS__ __VA_OPT__(, ) 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define KD_PP_FE_0(F, sep)
#define KD_PP_FE_1(F, sep, a) F(a)
#define KD_PP_FE_2(F, sep, a, ...) F(a) sep() KD_PP_FE_1(F, sep, __VA_ARGS__)
#define KD_PP_FE_3(F, sep, a, ...) F(a) sep() KD_PP_FE_2(F, sep, __VA_ARGS__)
#define KD_PP_FE_4(F, sep, a, ...) F(a) sep() KD_PP_FE_3(F, sep, __VA_ARGS__)
#define KD_PP_FE_5(F, sep, a, ...) F(a) sep() KD_PP_FE_4(F, sep, __VA_ARGS__)
#define KD_PP_FE_6(F, sep, a, ...) F(a) sep() KD_PP_FE_5(F, sep, __VA_ARGS__)
#define KD_PP_FE_7(F, sep, a, ...) F(a) sep() KD_PP_FE_6(F, sep, __VA_ARGS__)
#define KD_PP_FE_8(F, sep, a, ...) F(a) sep() KD_PP_FE_7(F, sep, __VA_ARGS__)
#define KD_PP_FE_9(F, sep, a, ...) F(a) sep() KD_PP_FE_8(F, sep, __VA_ARGS__)
#define KD_PP_FE_10(F, sep, a, ...) F(a) sep() KD_PP_FE_9(F, sep, __VA_ARGS__)
#define KD_PP_FE_11(F, sep, a, ...) F(a) sep() KD_PP_FE_10(F, sep, __VA_ARGS__)
#define KD_PP_FE_12(F, sep, a, ...) F(a) sep() KD_PP_FE_11(F, sep, __VA_ARGS__)
/// F(e) for each element of a parenthesised tuple, separated by sep().
#define KD_PP_FOR_EACH(F, sep, tuple) KD_PP_FOR_EACH_(F, sep, KD_PP_EXPAND tuple)
#define KD_PP_FOR_EACH_(F, sep, ...) KD_PP_CAT(KD_PP_FE_, KD_PP_NARG(__VA_ARGS__))(F, sep __VA_OPT__(, ) __VA_ARGS__)
#define KD_PP_COMMA() ,
#define KD_PP_NOTHING()
/// The number of elements of a parenthesised tuple.
#define KD_PP_SIZE(tuple) KD_PP_NARG tuple
/// 1 when scalar `x` is a switch (KD_SWITCH_<x> is defined as "~, 1"), else 0.
#define KD_PP_SECOND_(a, b, ...) b
#define KD_PP_SECOND(...) KD_PP_SECOND_(__VA_ARGS__)
#define KD_PP_IS_SWITCH(x) KD_PP_SECOND(KD_PP_CAT(KD_SWITCH_, x), 0, ~)
