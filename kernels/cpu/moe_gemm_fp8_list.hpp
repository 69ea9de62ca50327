// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the moe_gemm_fp8_tensor and moe_gemm_fp8_channel
// variant lists (moe_gemm_fp8.cpp), in priority order with the references last.
#pragma once

#include <span>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

/// Index of the blocked variants' param in Plan::params.
inline constexpr int kMoeGemmFp8Pairs = 0;

extern const core::VariantDef kMoeGemmFp8TensorBlocked, kMoeGemmFp8TensorRef;
extern const core::VariantDef kMoeGemmFp8ChannelBlocked, kMoeGemmFp8ChannelRef;

inline constexpr const core::VariantDef* kMoeGemmFp8TensorVariants[] = {&kMoeGemmFp8TensorBlocked,
                                                                        &kMoeGemmFp8TensorRef};
inline constexpr const core::VariantDef* kMoeGemmFp8ChannelVariants[] = {&kMoeGemmFp8ChannelBlocked,
                                                                         &kMoeGemmFp8ChannelRef};

/// Analytical default plan of both ops: the blocked variant, PAIRS from
/// block_size; an invalid Plan for dtypes it does not compute.
core::Plan moe_gemm_fp8_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
