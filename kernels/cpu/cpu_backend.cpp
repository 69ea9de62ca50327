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

#include "cpu/gemm_list.hpp"
#include "cpu/norm_list.hpp"

namespace dispatch::cpu {
namespace {

template <std::size_t... N>
constexpr auto concat(const core::VariantDef* const (&... lists)[N]) {
  std::array<const core::VariantDef*, (N + ...)> all{};
  std::size_t i = 0;
  ((std::copy(lists, lists + N, all.begin() + i), i += N), ...);
  return all;
}

constexpr auto kAllVariants = concat(kGemmVariants, kRmsnormVariants, kFusedAddRmsnormVariants);

}  // namespace

std::span<const core::VariantDef* const> variants() noexcept { return kAllVariants; }

core::Plan get_default(const core::Problem& p, const DeviceInfo& dev) noexcept {
  switch (p.op) {
    case core::OpKind::gemm:
      return gemm_default(p, dev);
    case core::OpKind::rmsnorm:
    case core::OpKind::fused_add_rmsnorm:
      return norm_default(p, dev);
  }
  return {};
}

}  // namespace dispatch::cpu
