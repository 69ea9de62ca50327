// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the moe_align variant list (moe_align.cpp), in
// priority order with the reference last.
#pragma once

#include <span>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

extern const core::VariantDef kMoeAlignCount, kMoeAlignRef;

inline constexpr const core::VariantDef* kMoeAlignVariants[] = {&kMoeAlignCount, &kMoeAlignRef};

/// The default plan of a CPU moe_align problem: the counting sort.
core::Plan moe_align_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
