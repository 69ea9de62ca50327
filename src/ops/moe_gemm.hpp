// SPDX-License-Identifier: Apache-2.0
// The moe_gemm op: one grouped GEMM of a Mixture-of-Experts layer over
// moe_align's sorted pairs, the contract of SGLang's and vLLM's
// fused_moe_kernel (invoke_fused_moe_kernel), what an engine that keeps its
// own align, activation and top-k sum calls for each projection:
//
//   for each block b < ceil(total / block_size), e = expert_ids[b], and each
//   s = sorted_token_ids[i], b * block_size <= i < (b + 1) * block_size,
//   with 0 <= s < M * top_k (the padding M * top_k is skipped):
//     out[s, :] = (a[s / top_k] · w[e]^T) * (mul_routed_weight ? topk_weights[s / top_k, s % top_k] : 1)
//   and out[s, :] = 0 when e is outside [0, E) (-1: an expert that is not
//   local under expert parallelism). total = num_tokens_post_pad[0],
//   clamped to what the buffers hold (readable()). Rows of out no block
//   lists are left as they are.
//
// SGLang's two calls: the up projection, a = hidden [M, H], w = w1 [E, 2I,
// H], top_k = the router's, out [M, top_k, 2I], mul_routed_weight false;
// the down projection, a = the activated intermediate [M * top_k, I], w = w2
// [E, H, I], top_k = 1, out [M * top_k, 1, H] and topk_weights [M * top_k,
// 1] (views of its [M, top_k, ...] tensors), mul_routed_weight true. The
// activation between them (silu_and_mul) and the top-k sum after (moe_sum)
// are ops of their own.
//
// - a [M, K]: the activations, the dtype of out (bf16, fp16 or fp32).
// - w [E, N, K]: the experts' weights, row-major as nn.Linear stores them,
//   stacked densely (rank 3); the op's input dtype: as a, or fp8_e4m3fn
//   with w_scale [E, ceil(N/128), ceil(K/128)] fp32 (block fp8, SGLang's
//   layout). a is then quantised as the op runs, 1x128 groups along K per
//   row (quant_fp8_group's rule), as SGLang's kernel call does.
// - topk_weights [M, top_k] fp32: the router's weights (SGLang indexes
//   them flat by s); read only when mul_routed_weight.
// - sorted_token_ids, expert_ids, num_tokens_post_pad: moe_align's outputs
//   for block_size (int32; at least moe_align's sizes for M * top_k pairs
//   among E, longer where the engine aligned over more experts: vLLM's
//   expert parallelism aligns over the global experts, expert_ids then
//   holding local ids or -1).
// - out [M, top_k, N]: written, the dtype of a (pair s is row s of the
//   dense [M * top_k, N]); it may not overlap an input.
// - top_k, block_size: whole numbers in [1, 2^24]; block_size is the one
//   the align used (SGLang's BLOCK_SIZE_M).
// - mul_routed_weight: false (0) or true (1).
//
// Dims: M (rows of a), N, K, E, top_k, block_size. Key: E, N, K, top_k,
// block_size, dtype [, out_dtype] [, block_shape=[128,128]]
// [, mul_routed_weight] [, stride].
#pragma once

#include <algorithm>
#include <vector>

#include "core/op_spec.hpp"
#include "ops/fused_moe.hpp"
#include "ops/moe_align.hpp"

namespace dispatch::core {

inline constexpr int kMoeGemmArgA = 0, kMoeGemmArgW = 1, kMoeGemmArgOut = 2, kMoeGemmArgTopkWeights = 3,
                     kMoeGemmArgSorted = 4, kMoeGemmArgExpertIds = 5, kMoeGemmArgTotal = 6, kMoeGemmArgWScale = 7;

namespace moe_gemm_spec {

/// moe_align's buffers for M * top_k pairs among E experts in blocks of block_size.
constexpr int64_t sorted_extent(const int64_t* d) noexcept {
  return moe_align_spec::padded_capacity(d[int(Dim::m)], d[int(Dim::extra1)], d[int(Dim::extra0)], d[int(Dim::extra2)]);
}
constexpr int64_t blocks_extent(const int64_t* d) noexcept {
  const int64_t p = sorted_extent(d), b = d[int(Dim::extra2)];
  return p < 0 || b < 1 ? -1 : (p + b - 1) / b;
}

/// A rank-1 int32 slot of moe_align's outputs, filled by the tuner from one
/// alignment of its routing.
constexpr ArgSlot aligned_slot(std::string_view name, DimExpr cols, Fill fill) {
  ArgSlot a = moe_align_spec::int_slot(name, Role::read, cols);
  a.fill = fill;
  return a;
}

/// out [M, top_k, N]: SGLang's intermediate cache (its down call's [M *
/// top_k, 1, H]), pair s its row s.
constexpr ArgSlot pairs_slot() {
  ArgSlot a = fused_moe_spec::token_slot("out", Role::write);
  a.rank = 3, a.batch = {Dim::m}, a.rows = {Dim::extra1}, a.cols = {Dim::n};
  return a;
}

inline constexpr ArgSlot kSlots[] = {
    fused_moe_spec::token_slot("a", Role::read, kMoeGemmArgOut),
    fused_moe_spec::expert_slot("w", {Dim::n}, {Dim::k}, false),
    pairs_slot(),
    fused_moe_spec::routing_slot("topk_weights", DType::fp32, Fill::routing_weights),
    aligned_slot("sorted_token_ids",
                 {.fn = &sorted_extent, .at_least = true, .text = "M*top_k + min(E, M*top_k)*(block_size - 1)"},
                 Fill::aligned_sorted),
    aligned_slot("expert_ids",
                 {.fn = &blocks_extent,
                  .at_least = true,
                  .text = "ceil((M*top_k + min(E, M*top_k)*(block_size - 1))/block_size)"},
                 Fill::aligned_experts),
    aligned_slot("num_tokens_post_pad", {}, Fill::aligned_total),
    fused_moe_spec::expert_slot("w_scale", {Dim::n}, {Dim::k}, true),
};
inline constexpr std::string_view kRoutedWeight[] = {"false", "true"};
inline constexpr ScalarSlot kScalars[] = {
    // No usable default: 0, so a call that leaves it out is refused by name.
    {.name = "top_k", .default_value = 0.f, .kind = ScalarKind::dim, .dim = Dim::extra1},
    {.name = "block_size", .default_value = 64.f, .kind = ScalarKind::dim, .dim = Dim::extra2},
    {.name = "mul_routed_weight", .default_value = 0.f, .kind = ScalarKind::choice, .labels = kRoutedWeight},
};
inline constexpr KeyField kFields[] = {
    fused_moe_spec::kFieldE,
    fused_moe_spec::kFieldK,
    fused_moe_spec::kFieldN,
    fused_moe_spec::kFieldBlockShape,
    {.name = "block_size", .kind = FieldKind::dim, .dim = Dim::extra2, .file_pos = 4},
    fused_moe_spec::kFieldDtype,
    {.name = "mul_routed_weight", .kind = FieldKind::choice},
    fused_moe_spec::kFieldOutDtype,
    fused_moe_spec::kFieldStride,
    fused_moe_spec::kFieldTopK,
};
// w binds E, N and K; a binds M (its K checked against w's).
inline constexpr int8_t kOrder[] = {kMoeGemmArgW,         kMoeGemmArgA,     kMoeGemmArgTopkWeights, kMoeGemmArgSorted,
                                    kMoeGemmArgExpertIds, kMoeGemmArgTotal, kMoeGemmArgOut,         kMoeGemmArgWScale};

/// The sorted positions a call may read: what its buffers hold, the
/// shorter of sorted_token_ids (its length as given, LaunchArgs::ld; 0:
/// the op's size P) and expert_ids' blocks of block_size. An engine under
/// expert parallelism aligns over its global experts (vLLM's expert_map):
/// its buffers, and its total, are then longer than P of the local E.
constexpr int64_t readable(const int64_t* d, int64_t sorted_len, int64_t blocks_len) noexcept {
  const int64_t s = sorted_len > 0 ? sorted_len : sorted_extent(d);
  const int64_t b = (blocks_len > 0 ? blocks_len : blocks_extent(d)) * d[int(Dim::extra2)];
  return s < b ? s : b;
}

/// The blocks a call walks: ceil(total / block_size), total =
/// num_tokens_post_pad[0] clamped to [0, capacity] (readable()). What
/// every variant reads; rows i of block b past the capacity are not read.
constexpr int64_t walked_blocks(int64_t total, int64_t capacity, int64_t block) noexcept {
  const int64_t t = total < 0 ? 0 : total > capacity ? capacity : total;
  return (t + block - 1) / block;
}

/// Fills `out`, the slot `which` (Fill::aligned_sorted, aligned_experts or
/// aligned_total) of problem p, with moe_align's output for `ids`: the
/// expert of each of the M * top_k pairs, pair by pair. The tuner's and the
/// tests' scratch: the three slots hold one alignment of one routing.
inline void fill_aligned(Fill which, const int32_t* ids, const Problem& p, int32_t* out) {
  const Dims d = dims_of(p);
  const int64_t cap = sorted_extent(d.data()), blocks = blocks_extent(d.data()), E = p.extra[0];
  std::vector<int32_t> sorted(static_cast<size_t>(cap)), experts(static_cast<size_t>(blocks));
  std::vector<int64_t> scratch(static_cast<size_t>(2 * E));
  int32_t total = 0;
  moe_align_spec::align(ids, p.m * p.extra[1], int64_t{1}, int64_t{1}, E, p.extra[2],
                        static_cast<const int32_t*>(nullptr), sorted.data(), cap, experts.data(), blocks, &total,
                        scratch.data(), scratch.data() + E);
  if (which == Fill::aligned_sorted) std::copy(sorted.begin(), sorted.end(), out);
  if (which == Fill::aligned_experts) std::copy(experts.begin(), experts.end(), out);
  if (which == Fill::aligned_total) out[0] = total;
}

/// The float64 references' walk (this op's and the moe_gemm_fp8 ops'):
/// fn(s, e) for each pair s a walked block lists (padding skipped), e the
/// block's expert, -1 where it is not local.
template <class Fn>
void for_each_pair(const Problem& p, const RefArgs& r, Fn&& fn) {
  const int64_t E = p.extra[0], bs = p.extra[2], pairs = p.m * p.extra[1];
  const Dims dims = dims_of(p);
  const int64_t cap = readable(dims.data(), r.ld[kMoeGemmArgSorted], r.ld[kMoeGemmArgExpertIds]);
  const int64_t blocks = walked_blocks(static_cast<int64_t>(r.data[kMoeGemmArgTotal][0]), cap, bs);
  for (int64_t b = 0; b < blocks; ++b) {
    const double ed = r.data[kMoeGemmArgExpertIds][b];
    const int64_t e = ed >= 0.0 && ed < static_cast<double>(E) ? static_cast<int64_t>(ed) : -1;
    for (int64_t i = b * bs; i < (b + 1) * bs && i < cap; ++i) {
      const double sd = r.data[kMoeGemmArgSorted][i];
      if (sd >= 0.0 && sd < static_cast<double>(pairs)) fn(static_cast<int64_t>(sd), e);  // else padding
    }
  }
}

inline void reference(const Problem& p, const RefArgs& r) {
  const int64_t N = p.n, K = p.k, top_k = p.extra[1];
  const bool fp8 = r.data[kMoeGemmArgWScale] != nullptr, mul = r.scalar[2] != 0.f;
  const double* a = r.data[kMoeGemmArgA];
  const double* w = r.data[kMoeGemmArgW];
  const int64_t lda = r.ld[kMoeGemmArgA], ldw = r.ld[kMoeGemmArgW], ldo = r.ld[kMoeGemmArgOut];
  const int64_t nb = (N + kMoeBlock - 1) / kMoeBlock;
  double* x = new double[static_cast<size_t>(K)];
  for_each_pair(p, r, [&](int64_t s, int64_t e) {
    double* o = r.data[kMoeGemmArgOut] + s * ldo;
    if (e < 0) {
      std::fill(o, o + N, 0.0);
      return;
    }
    std::copy(a + (s / top_k) * lda, a + (s / top_k) * lda + K, x);
    if (fp8) fused_moe_spec::quantise_groups(x, K);
    const double rw =
        mul ? r.data[kMoeGemmArgTopkWeights][(s / top_k) * r.ld[kMoeGemmArgTopkWeights] + s % top_k] : 1.0;
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      const double* wr = w + (e * N + n) * ldw;
      for (int64_t c = 0; c < K; ++c) {
        const double sc =
            fp8 ? r.data[kMoeGemmArgWScale][(e * nb + n / kMoeBlock) * r.ld[kMoeGemmArgWScale] + c / kMoeBlock] : 1.0;
        acc += wr[c] * sc * x[c];
      }
      o[n] = acc * rw;
    }
  });
  delete[] x;
}

inline double flops(const Problem& p) { return 2.0 * p.m * p.extra[1] * p.n * p.k; }

inline constexpr std::string_view kSummary =
    "out[s] = (a[s / top_k] @ w[e]^T) * (mul_routed_weight ? topk_weights[s] : 1) for the pairs s of each block of "
    "moe_align's sorted_token_ids, e = expert_ids[block] (0 where e is not local): one grouped GEMM of a "
    "Mixture-of-Experts layer (SGLang's and vLLM's fused_moe_kernel).";
inline constexpr std::string_view kDimNames[kDimCount] = {"", "M", "N", "K", "E", "top_k", "block_size"};

constexpr OpSpec make_spec() {
  OpSpec s{};
  s.op = OpKind::moe_gemm, s.name = "moe_gemm", s.summary = kSummary;
  s.slots = kSlots, s.scalars = kScalars, s.fields = kFields, s.order = kOrder;
  s.in_dtype_slot = kMoeGemmArgW, s.out_dtype_slot = kMoeGemmArgOut;
  s.positive = {kMoeGemmArgW, (1u << int(Dim::n)) | (1u << int(Dim::k)) | (1u << int(Dim::extra0)),
                "E, N and K must be >= 1, got shape "};
  std::copy(std::begin(kDimNames), std::end(kDimNames), s.dim_names);
  s.align_slots = (1u << kMoeGemmArgA) | (1u << kMoeGemmArgW) | (1u << kMoeGemmArgOut);
  // Block fp8's wgmma and ring kernels quantise a once into the call's workspace (CUDA; a
  // call given less runs the split kernels).
  s.uses_workspace = true;
  // One GEMM over K in fp32, rounded once to the out dtype (gemm's budget).
  s.tolerance[int(DType::fp32)] = {1e-5, 1e-4};
  s.tolerance[int(DType::fp16)] = {1e-3, 2e-3};
  s.tolerance[int(DType::bf16)] = {8e-3, 1.6e-2};
  // Block fp8: a quantised as the reference does; fused_moe's budget.
  s.quantized_tolerance = {3e-2, 3e-2};
  s.flops = &flops, s.reference = &reference;
  return s;
}
inline constexpr OpSpec kSpec = make_spec();

}  // namespace moe_gemm_spec

}  // namespace dispatch::core
