// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — moe_align variants (src/ops/moe_align.hpp):
//
//   moe_align_int32__count   a counting sort: count per expert, place the
//                            pairs in order (moe_align_spec::align)
//   moe_align_int32__ref     per expert, a scan of every pair (E passes):
//                            another algorithm, the validation baseline
//
// Both place an expert's pairs in ascending order, so they agree bit for bit.
#include <cstdint>
#include <vector>

#include "cpu/cpu_common.hpp"
#include "cpu/moe_align_list.hpp"
#include "ops/moe_align.hpp"

namespace dispatch::cpu {

namespace {

using core::LaunchArgs;
using core::OpKind;
using core::Problem;
using core::VariantDef;

/// The op's views of one call: the ids, the outputs and their sizes.
struct AlignCall {
  const int32_t* ids;
  int64_t ld;
  const int32_t* map;  ///< null: no expert map
  int32_t* sorted;
  int32_t* expert_ids;
  int32_t* total;
  int64_t sorted_n, blocks_n;
};
AlignCall call_of(const LaunchArgs& a, const Problem& p) noexcept {
  const core::Dims dims_all = core::dims_of(p);
  const int64_t* dims = dims_all.data();
  return {a.ptr<const int32_t>(core::kAlignArgTopkIds),   a.ld[core::kAlignArgTopkIds],
          a.ptr<const int32_t>(core::kAlignArgExpertMap), a.ptr<int32_t>(core::kAlignArgSorted),
          a.ptr<int32_t>(core::kAlignArgExpertIds),       a.ptr<int32_t>(core::kAlignArgTotal),
          core::moe_align_spec::sorted_extent(dims),      core::moe_align_spec::blocks_extent(dims)};
}

/// m = 0: num_tokens_post_pad = 0 (vLLM's kernel writes it; the op launches
/// when empty, OpSpec::launches_when_empty), nothing else.
Status empty_call(const AlignCall& c) noexcept {
  if (c.total == nullptr) return make_status(StatusCode::invalid_argument, "moe_align: num_tokens_post_pad is null");
  c.total[0] = 0;
  return Status::Ok();
}

/// A null tensor: invalid_argument.
Status check_call(const AlignCall& c, const Problem& p) noexcept {
  if (c.ids == nullptr || c.sorted == nullptr || c.expert_ids == nullptr || c.total == nullptr)
    return make_status(StatusCode::invalid_argument, "moe_align: topk_ids and the outputs must not be null");
  return p.extra[0] < 1 || p.n < 1 ? make_status(StatusCode::invalid_argument, "moe_align: E and block_size >= 1")
                                   : Status::Ok();
}

Status count_launch(const LaunchArgs& a, const Problem& p, const int64_t*) {
  const AlignCall c = call_of(a, p);
  if (p.m < 1) return empty_call(c);
  if (Status s = check_call(c, p); !s.ok()) return s;
  try {
    std::vector<int64_t> scratch(static_cast<size_t>(2 * p.extra[0]));
    core::moe_align_spec::align(c.ids, p.m, p.extra[1], c.ld, p.extra[0], p.n, c.map, c.sorted, c.sorted_n,
                                c.expert_ids, c.blocks_n, c.total, scratch.data(), scratch.data() + p.extra[0]);
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "moe_align: the CPU variant's counts");
  }
  return Status::Ok();
}

Status ref_launch(const LaunchArgs& a, const Problem& p, const int64_t*) {
  const AlignCall c = call_of(a, p);
  if (p.m < 1) return empty_call(c);
  if (Status s = check_call(c, p); !s.ok()) return s;
  const int64_t top_k = p.extra[1], pairs = p.m * top_k, block = p.n;
  int64_t at = 0;
  for (int64_t s = 0; s < c.sorted_n; ++s) c.sorted[s] = static_cast<int32_t>(pairs);
  for (int64_t e = 0; e < p.extra[0]; ++e) {
    const int64_t first = at;
    for (int64_t i = 0; i < pairs; ++i)
      if (c.ids[(i / top_k) * c.ld + i % top_k] == e) c.sorted[at++] = static_cast<int32_t>(i);
    at = first + (at - first + block - 1) / block * block;
    for (int64_t b = first / block; b < at / block; ++b) c.expert_ids[b] = c.map != nullptr ? c.map[e] : int32_t(e);
  }
  for (int64_t b = at / block; b < c.blocks_n; ++b) c.expert_ids[b] = -1;
  c.total[0] = static_cast<int32_t>(at);
  return Status::Ok();
}

template <const VariantDef& V>
Status align_supports(const Problem& p, const int64_t*, const DeviceInfo&) {
  if (p.op != OpKind::moe_align) return decline(V, StatusCode::unsupported_problem, "not a moe_align problem");
  if (p.device.type != V.backend)
    return decline(V, StatusCode::unsupported_device, "CPU variant, problem is on another device");
  if (p.in_dtype != DType::int32) return decline(V, StatusCode::unsupported_problem, "topk_ids must be int32");
  if (p.n < 1 || p.extra[0] < 1 || p.extra[1] < 1)
    return decline(V, StatusCode::invalid_argument, "E, block_size and top_k must be >= 1");
  // A key read from a file may name any size up to 2^40; a call's are at most 2^24 (ScalarKind::dim).
  if (p.n > int64_t{1} << 24 || p.extra[0] > int64_t{1} << 24)
    return decline(V, StatusCode::unsupported_problem, "E and block_size must be <= 2^24");
  // int32 outputs: the padded count must fit.
  if (const int64_t cap = core::moe_align_spec::padded_capacity(p.m, p.extra[1], p.extra[0], p.n);
      cap < 0 || cap > INT32_MAX)
    return decline(V, StatusCode::unsupported_problem, "M*top_k + min(E, M*top_k)*(block_size - 1) exceeds int32");
  return Status::Ok();
}

}  // namespace

constinit const VariantDef kMoeAlignCount{
    "moe_align_int32__count",        OpKind::moe_align, DeviceType::cpu, DType::int32, {}, 0, 1,
    &align_supports<kMoeAlignCount>, &count_launch};
constinit const VariantDef kMoeAlignRef{
    "moe_align_int32__ref",        OpKind::moe_align, DeviceType::cpu, DType::int32, {}, core::kVariantReference, 1,
    &align_supports<kMoeAlignRef>, &ref_launch};

core::Plan moe_align_default(const core::Problem& p, const DeviceInfo& dev) noexcept {
  core::Plan plan;
  plan.variant = &kMoeAlignCount;
  if (!align_supports<kMoeAlignCount>(p, plan.params, dev).ok()) return {};
  return plan;
}

}  // namespace dispatch::cpu
