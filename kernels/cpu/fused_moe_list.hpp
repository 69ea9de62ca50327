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

/// fused_moe_fp8_tensor and fused_moe_fp8_channel (fused_moe.cpp's passes; BLOCK_M as above).
extern const core::VariantDef kMoeFp8TensorGrouped, kMoeFp8TensorRef;
extern const core::VariantDef kMoeFp8ChannelGrouped, kMoeFp8ChannelRef;
inline constexpr const core::VariantDef* kFusedMoeFp8TensorVariants[] = {&kMoeFp8TensorGrouped, &kMoeFp8TensorRef};
inline constexpr const core::VariantDef* kFusedMoeFp8ChannelVariants[] = {&kMoeFp8ChannelGrouped, &kMoeFp8ChannelRef};

/// Analytical default plan for a CPU fused_moe (or fused_moe_fp8_*) problem:
/// the grouped variant of the weights' dtype (of the op), BLOCK_M from the tokens per expert; an invalid
/// Plan for dtypes no CPU variant computes.
core::Plan fused_moe_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
