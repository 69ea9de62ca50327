// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the fp8 GEMM variant lists (gemm_fp8.cpp), one
// per op (scale layout), in priority order with the references last.
#pragma once

#include <span>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

/// Index of the tiled variants' param in Plan::params.
inline constexpr int kFp8BlockN = 0;

extern const core::VariantDef kFp8TensorTiled;
extern const core::VariantDef kFp8TensorRef;
extern const core::VariantDef kFp8RowwiseTiled;
extern const core::VariantDef kFp8RowwiseRef;
extern const core::VariantDef kFp8BlockTiled;
extern const core::VariantDef kFp8BlockRef;

inline constexpr const core::VariantDef* kGemmFp8TensorVariants[] = {&kFp8TensorTiled, &kFp8TensorRef};
inline constexpr const core::VariantDef* kGemmFp8RowwiseVariants[] = {&kFp8RowwiseTiled, &kFp8RowwiseRef};
inline constexpr const core::VariantDef* kGemmFp8BlockVariants[] = {&kFp8BlockTiled, &kFp8BlockRef};

/// Analytical default plan for a CPU fp8 GEMM problem (any of the three
/// ops); an invalid Plan for formats no CPU variant computes.
core::Plan gemm_fp8_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
