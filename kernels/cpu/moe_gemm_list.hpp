// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the moe_gemm variant list (moe_gemm.cpp), in
// priority order with the references last.
#pragma once

#include <span>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

/// Index of the blocked variants' param in Plan::params.
inline constexpr int kMoeGemmPairs = 0;

extern const core::VariantDef kMoeGemmFp32Blocked, kMoeGemmBf16Blocked, kMoeGemmFp8Blocked;
extern const core::VariantDef kMoeGemmFp32Ref, kMoeGemmBf16Ref, kMoeGemmFp8Ref;

/// moe_gemm_fp8_tensor and moe_gemm_fp8_channel (moe_gemm.cpp's loop; PAIRS as above).
extern const core::VariantDef kMoeGemmFp8TensorBlocked, kMoeGemmFp8TensorRef;
extern const core::VariantDef kMoeGemmFp8ChannelBlocked, kMoeGemmFp8ChannelRef;
inline constexpr const core::VariantDef* kMoeGemmFp8TensorVariants[] = {&kMoeGemmFp8TensorBlocked,
                                                                        &kMoeGemmFp8TensorRef};
inline constexpr const core::VariantDef* kMoeGemmFp8ChannelVariants[] = {&kMoeGemmFp8ChannelBlocked,
                                                                         &kMoeGemmFp8ChannelRef};

inline constexpr const core::VariantDef* kMoeGemmVariants[] = {&kMoeGemmFp32Blocked, &kMoeGemmBf16Blocked,
                                                               &kMoeGemmFp8Blocked,  &kMoeGemmFp32Ref,
                                                               &kMoeGemmBf16Ref,     &kMoeGemmFp8Ref};

/// Analytical default plan for a CPU moe_gemm (or moe_gemm_fp8_*) problem:
/// the blocked variant of the weights' dtype (of the op), PAIRS from
/// block_size; an invalid Plan for dtypes no CPU variant computes.
core::Plan moe_gemm_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
