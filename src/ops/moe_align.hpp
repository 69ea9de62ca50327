// SPDX-License-Identifier: Apache-2.0
// The moe_align op: a Mixture-of-Experts layer's (token, choice) pairs
// sorted by expert and padded to whole blocks, what a grouped GEMM over
// experts walks (vLLM's and SGLang's moe_align_block_size):
//
//   pair i = t * top_k + j routes to e = topk_ids[t, j]; an e outside
//   [0, E) is dropped (an expert that is not local). Expert e's pairs, i
//   ascending, fill ceil(count_e / block_size) blocks, the experts in
//   order, the tail of each expert's last block padded with M * top_k:
//     sorted_token_ids[0 .. total)   the pairs, padded (total = the sum of
//                                    the padded counts)
//     expert_ids[b], b < total / block_size   e of block b, or expert_map[e]
//                                    when the map is given (-1: not local)
//     num_tokens_post_pad[0]         total
//   Past total: sorted_token_ids holds M * top_k, expert_ids -1, up to the
//   op's sizes below; elements past those are left as they are.
//
// - topk_ids [M, top_k] int32: the router's choice.
// - sorted_token_ids [at least P] int32, P = M*top_k + min(E, M*top_k) *
//   (block_size - 1): the most a routing can need (vLLM's buffer, and
//   SGLang's (E + 1) * (block_size - 1) + M*top_k, are larger or equal).
// - expert_ids [at least ceil(P / block_size)] int32.
// - num_tokens_post_pad [1] int32.
// - expert_map [E] int32, optional: local id of each global expert, -1 when
//   not local (vLLM's expert_map applied to expert_ids).
// - num_experts = E and block_size (the GEMM's BLOCK_SIZE_M): whole numbers.
//
// Deterministic: a pair's place depends only on topk_ids (an expert's
// pairs in ascending order), so every variant writes the same bits (vLLM's
// kernel places an expert's pairs in atomic order).
// Dims: M tokens, top_k, E (extra0), block_size (n). Key: E, block_size,
// top_k [, expert_map].
#pragma once

#include <algorithm>

#include "core/op_spec.hpp"

namespace dispatch::core {

inline constexpr int kAlignArgTopkIds = 0, kAlignArgSorted = 1, kAlignArgExpertIds = 2, kAlignArgTotal = 3,
                     kAlignArgExpertMap = 4;

namespace moe_align_spec {

/// P: the sorted ids a routing of M tokens x top_k among E experts can need
/// with blocks of `block`: M*top_k + min(E, M*top_k) * (block - 1). -1 past 2^40.
constexpr int64_t padded_capacity(int64_t m, int64_t top_k, int64_t experts, int64_t block) noexcept {
  const __int128 pairs = static_cast<__int128>(m) * top_k;
  const __int128 v = pairs + std::min<__int128>(experts, pairs) * (block - 1);
  return v < 0 || v > kMaxDim ? -1 : static_cast<int64_t>(v);
}
constexpr int64_t sorted_extent(const int64_t* d) noexcept {
  return padded_capacity(d[int(Dim::m)], d[int(Dim::extra1)], d[int(Dim::extra0)], d[int(Dim::n)]);
}
constexpr int64_t blocks_extent(const int64_t* d) noexcept {
  const int64_t p = sorted_extent(d);
  return p < 0 || d[int(Dim::n)] < 1 ? -1 : (p + d[int(Dim::n)] - 1) / d[int(Dim::n)];
}

/// An int32 slot of the op: topk_ids [M, top_k], a rank-1 output, expert_map.
constexpr ArgSlot int_slot(std::string_view name, Role role, DimExpr cols, bool optional = false) {
  ArgSlot a{.name = name, .role = role, .rank = 1, .optional = optional, .cols = cols};
  a.dtype = SlotDType::fixed, a.fixed_dtype = DType::int32;
  return a;
}
constexpr ArgSlot ids_slot() {
  ArgSlot a = int_slot("topk_ids", Role::read, {Dim::extra1});
  a.rank = 2, a.rows = {Dim::m}, a.fill = Fill::expert_ids;
  return a;
}

inline constexpr ArgSlot kSlots[] = {
    ids_slot(),
    int_slot("sorted_token_ids", Role::write,
             {.fn = &sorted_extent, .at_least = true, .text = "M*top_k + min(E, M*top_k)*(block_size - 1)"}),
    int_slot("expert_ids", Role::write,
             {.fn = &blocks_extent,
              .at_least = true,
              .text = "ceil((M*top_k + min(E, M*top_k)*(block_size - 1))/block_size)"}),
    int_slot("num_tokens_post_pad", Role::write, {}),
    int_slot("expert_map", Role::read, {Dim::extra0}, true),
};
inline constexpr ScalarSlot kScalars[] = {
    // No usable default: 0, so a call that leaves it out is refused by name.
    {.name = "num_experts", .default_value = 0.f, .kind = ScalarKind::dim, .dim = Dim::extra0},
    {.name = "block_size", .default_value = 64.f, .kind = ScalarKind::dim, .dim = Dim::n},
};
inline constexpr KeyField kFields[] = {
    {.name = "E", .kind = FieldKind::dim, .dim = Dim::extra0, .file_pos = 0},
    {.name = "block_size", .kind = FieldKind::dim, .dim = Dim::n, .file_pos = 1},
    {.name = "expert_map", .kind = FieldKind::flag},
    {.name = "top_k", .kind = FieldKind::dim, .dim = Dim::extra1, .file_pos = 2},
};
inline constexpr int8_t kOrder[] = {kAlignArgTopkIds, kAlignArgSorted, kAlignArgExpertIds, kAlignArgTotal,
                                    kAlignArgExpertMap};

/// The alignment of `ids` (M * top_k int32 ids, row i's at i * ld) into the
/// outputs, as every variant computes it. `count` and `cursor`: E scratch
/// int64 each. Works on any integer-like element type (the reference's
/// doubles, the CPU variant's int32).
template <class In, class Out>
void align(const In* ids, int64_t m, int64_t top_k, int64_t ld, int64_t experts, int64_t block, const In* map,
           Out* sorted, int64_t sorted_n, Out* expert_ids, int64_t blocks_n, Out* total, int64_t* count,
           int64_t* cursor) {
  const int64_t pairs = m * top_k;
  auto expert_of = [&](int64_t i) -> int64_t {
    const In v = ids[(i / top_k) * ld + i % top_k];
    return v >= 0 && v < static_cast<In>(experts) ? static_cast<int64_t>(v) : -1;
  };
  std::fill(count, count + experts, int64_t{0});
  for (int64_t i = 0; i < pairs; ++i)
    if (const int64_t e = expert_of(i); e >= 0) ++count[e];
  int64_t at = 0;
  for (int64_t e = 0; e < experts; ++e) {
    cursor[e] = at;
    const int64_t padded = (count[e] + block - 1) / block * block;
    for (int64_t b = at / block; b < (at + padded) / block; ++b)
      expert_ids[b] = static_cast<Out>(map != nullptr ? static_cast<int64_t>(map[e]) : e);
    at += padded;
  }
  std::fill(sorted, sorted + sorted_n, static_cast<Out>(pairs));
  for (int64_t b = at / block; b < blocks_n; ++b) expert_ids[b] = static_cast<Out>(-1);
  for (int64_t i = 0; i < pairs; ++i)
    if (const int64_t e = expert_of(i); e >= 0) sorted[cursor[e]++] = static_cast<Out>(i);
  total[0] = static_cast<Out>(at);
}

inline void reference(const Problem& p, const RefArgs& r) {
  const Dims dims_all = dims_of(p);
  const int64_t* dims = dims_all.data();
  int64_t* scratch = new int64_t[static_cast<size_t>(2 * p.extra[0])];
  align(r.data[kAlignArgTopkIds], p.m, p.extra[1], r.ld[kAlignArgTopkIds], p.extra[0], p.n, r.data[kAlignArgExpertMap],
        r.data[kAlignArgSorted], sorted_extent(dims), r.data[kAlignArgExpertIds], blocks_extent(dims),
        r.data[kAlignArgTotal], scratch, scratch + p.extra[0]);
  delete[] scratch;
}

/// No arithmetic: the pairs it moves (what --max-flops compares).
inline double flops(const Problem& p) { return static_cast<double>(p.m) * static_cast<double>(p.extra[1]); }

inline constexpr std::string_view kSummary =
    "sorted_token_ids, expert_ids, num_tokens_post_pad = the (token, choice) pairs of topk_ids sorted by expert and "
    "padded to blocks of block_size (vLLM's and SGLang's moe_align_block_size).";
inline constexpr std::string_view kDimNames[kDimCount] = {"", "M", "block_size", "", "E", "top_k"};

constexpr OpSpec make_spec() {
  OpSpec s{};
  s.op = OpKind::moe_align, s.name = "moe_align", s.summary = kSummary;
  s.slots = kSlots, s.scalars = kScalars, s.fields = kFields, s.order = kOrder;
  s.in_dtype_slot = kAlignArgTopkIds, s.out_dtype_slot = kAlignArgSorted;
  s.positive = {kAlignArgTopkIds, 1u << int(Dim::extra1), "top_k must be >= 1, got shape "};
  std::copy(std::begin(kDimNames), std::end(kDimNames), s.dim_names);
  s.launches_when_empty = true;                // M = 0 writes num_tokens_post_pad = 0
  s.flops = &flops, s.reference = &reference;  // integers: exact, every dtype's zero tolerance
  return s;
}
inline constexpr OpSpec kSpec = make_spec();

}  // namespace moe_align_spec

}  // namespace dispatch::core
