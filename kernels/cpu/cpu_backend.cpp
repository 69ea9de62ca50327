// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the backend's variant list and its default rule.
//
// variants() is the compile-time concatenation of the per-op lists
// (gemm_list.hpp, norm_list.hpp), in op order and, within an op, in each
// list's priority order (references last): adding a row to an op's list is
// the only step that registers a variant. get_default() hands each op to its
// own model, which lives next to the kernels it reasons about.
#include "cpu/cpu_backend.hpp"

#include <algorithm>
#include <array>
#include <cstddef>

#include "cpu/fused_moe_list.hpp"
#include "cpu/gemm_fp8_list.hpp"
#include "cpu/gemm_list.hpp"
#include "cpu/moe_align_list.hpp"
#include "cpu/moe_gemm_list.hpp"
#include "cpu/moe_sum_list.hpp"
#include "cpu/norm_list.hpp"
#include "cpu/quant_fp8_list.hpp"
#include "cpu/silu_list.hpp"

namespace dispatch::cpu {
namespace {

template <std::size_t... N>
constexpr auto concat(const core::VariantDef* const (&... lists)[N]) {
  std::array<const core::VariantDef*, (N + ...)> all{};
  std::size_t i = 0;
  ((std::copy(lists, lists + N, all.begin() + i), i += N), ...);
  return all;
}

constexpr auto kAllVariants = concat(
    kGemmVariants, kRmsnormVariants, kFusedAddRmsnormVariants, kSiluAndMulVariants, kGemmFp8TensorVariants,
    kGemmFp8RowwiseVariants, kGemmFp8BlockVariants, kQuantFp8TensorVariants, kQuantFp8TokenVariants,
    kQuantFp8GroupVariants, kFusedMoeVariants, kMoeSumVariants, kMoeAlignVariants, kMoeGemmVariants,
    kMoeGemmFp8TensorVariants, kMoeGemmFp8ChannelVariants, kFusedMoeFp8TensorVariants, kFusedMoeFp8ChannelVariants);

/// The backend's table of ops: each op's variant list and default rule.
using DefaultFn = core::Plan (*)(const core::Problem&, const DeviceInfo&) noexcept;
struct OpEntry {
  core::OpKind op;
  std::span<const core::VariantDef* const> variants;
  DefaultFn get_default;
};
constexpr OpEntry kOps[] = {
    {core::OpKind::gemm, kGemmVariants, &gemm_default},
    {core::OpKind::rmsnorm, kRmsnormVariants, &norm_default},
    {core::OpKind::fused_add_rmsnorm, kFusedAddRmsnormVariants, &norm_default},
    {core::OpKind::silu_and_mul, kSiluAndMulVariants, &silu_default},
    {core::OpKind::gemm_fp8_tensor, kGemmFp8TensorVariants, &gemm_fp8_default},
    {core::OpKind::gemm_fp8_rowwise, kGemmFp8RowwiseVariants, &gemm_fp8_default},
    {core::OpKind::gemm_fp8_block, kGemmFp8BlockVariants, &gemm_fp8_default},
    {core::OpKind::quant_fp8_tensor, kQuantFp8TensorVariants, &quant_fp8_default},
    {core::OpKind::quant_fp8_token, kQuantFp8TokenVariants, &quant_fp8_default},
    {core::OpKind::quant_fp8_group, kQuantFp8GroupVariants, &quant_fp8_default},
    {core::OpKind::fused_moe, kFusedMoeVariants, &fused_moe_default},
    {core::OpKind::moe_sum, kMoeSumVariants, &moe_sum_default},
    {core::OpKind::moe_align, kMoeAlignVariants, &moe_align_default},
    {core::OpKind::moe_gemm, kMoeGemmVariants, &moe_gemm_default},
    {core::OpKind::moe_gemm_fp8_tensor, kMoeGemmFp8TensorVariants, &moe_gemm_default},
    {core::OpKind::moe_gemm_fp8_channel, kMoeGemmFp8ChannelVariants, &moe_gemm_default},
    {core::OpKind::fused_moe_fp8_tensor, kFusedMoeFp8TensorVariants, &fused_moe_default},
    {core::OpKind::fused_moe_fp8_channel, kFusedMoeFp8ChannelVariants, &fused_moe_default},
};

}  // namespace

std::span<const core::VariantDef* const> variants() noexcept { return kAllVariants; }

std::span<const core::VariantDef* const> variants_of(core::OpKind op) noexcept {
  for (const OpEntry& e : kOps)
    if (e.op == op) return e.variants;
  return {};
}

core::Plan get_default(const core::Problem& p, const DeviceInfo& dev) noexcept {
  for (const OpEntry& e : kOps)
    if (e.op == p.op) return e.get_default(p, dev);
  return {};
}

}  // namespace dispatch::cpu
