// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the moe_sum variant list (moe_sum.cpp), in
// priority order with the references last; registration, the correctness
// test over every config point and the benchmarks iterate it.
#pragma once

#include <span>

#include "core/op.hpp"
#include "cpu/cpu_rows_list.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

/// The list, in priority order (references last).
KDISPATCH_CPU_ROWS_LIST(MoeSum, kMoeSumVariants)

/// Analytical default plan for a CPU moe_sum problem; an invalid Plan for
/// dtypes no CPU variant computes.
core::Plan moe_sum_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
