// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the fused_moe variant list (fused_moe.cpp), in
// priority order with the references last.
#pragma once

#include <span>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

/// Index of the grouped variants' param in Plan::params.
inline constexpr int kMoeBlockM = 0;

extern const core::VariantDef kMoeFp32Grouped, kMoeBf16Grouped, kMoeFp8Grouped;
extern const core::VariantDef kMoeFp32Ref, kMoeBf16Ref, kMoeFp8Ref;

inline constexpr const core::VariantDef* kFusedMoeVariants[] = {&kMoeFp32Grouped, &kMoeBf16Grouped, &kMoeFp8Grouped,
                                                                &kMoeFp32Ref,     &kMoeBf16Ref,     &kMoeFp8Ref};

/// Analytical default plan for a CPU fused_moe problem: the grouped variant
/// of the weights' dtype, BLOCK_M from the tokens per expert; an invalid
/// Plan for dtypes no CPU variant computes.
core::Plan fused_moe_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
