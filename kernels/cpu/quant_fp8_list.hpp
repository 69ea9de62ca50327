// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the fp8 activation-quantisation variant lists
// (quant_fp8.cpp), one per op (scale layout), references last.
#pragma once

#include <span>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

extern const core::VariantDef kQuantTensorFp32Mul, kQuantTensorBf16Mul, kQuantTensorFp32Ref, kQuantTensorBf16Ref;
extern const core::VariantDef kQuantTokenFp32Mul, kQuantTokenBf16Mul, kQuantTokenFp32Ref, kQuantTokenBf16Ref;
extern const core::VariantDef kQuantGroupFp32Mul, kQuantGroupBf16Mul, kQuantGroupFp32Ref, kQuantGroupBf16Ref;

inline constexpr const core::VariantDef* kQuantFp8TensorVariants[] = {&kQuantTensorFp32Mul, &kQuantTensorBf16Mul,
                                                                      &kQuantTensorFp32Ref, &kQuantTensorBf16Ref};
inline constexpr const core::VariantDef* kQuantFp8TokenVariants[] = {&kQuantTokenFp32Mul, &kQuantTokenBf16Mul,
                                                                     &kQuantTokenFp32Ref, &kQuantTokenBf16Ref};
inline constexpr const core::VariantDef* kQuantFp8GroupVariants[] = {&kQuantGroupFp32Mul, &kQuantGroupBf16Mul,
                                                                     &kQuantGroupFp32Ref, &kQuantGroupBf16Ref};

/// Analytical default plan for a CPU fp8 quantisation problem (any of the
/// three ops): the multiply variant of the input dtype; invalid for others.
core::Plan quant_fp8_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
