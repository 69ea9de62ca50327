// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the silu_and_mul variant list (silu_and_mul.cpp),
// in priority order with the references last; registration, the
// correctness test over every config point and the benchmarks iterate it.
#pragma once

#include <span>

#include "core/op.hpp"
#include "cpu/cpu_rows_list.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

/// Index of each vectorised param in Plan::params.
inline constexpr int kSiluVec = 0;
inline constexpr int kSiluUnroll = 1;

/// The list, in priority order (references last).
KDISPATCH_CPU_ROWS_LIST(Silu, kSiluAndMulVariants)

/// Analytical default plan for a CPU silu_and_mul problem; an invalid Plan
/// for dtypes no CPU variant computes.
core::Plan silu_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
