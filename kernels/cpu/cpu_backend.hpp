// SPDX-License-Identifier: Apache-2.0
// kdispatch — the CPU backend: real, tunable CPU kernels for every op, so
// the whole dispatch/tuning machinery runs and is tested without a GPU.
#pragma once

#include <span>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

/// Every CPU variant of every op, in list order (the per-op lists in
/// kernels/cpu/*_list.hpp). Registration, tests and benchmarks iterate this.
/// Variants of CPU plugins (gemm_fp32__openblas, kernels/cpu/openblas) are
/// not here: the registry adds them when their module loads, so tests and
/// benchmarks that must see them iterate core::all_variants().
std::span<const core::VariantDef* const> variants() noexcept;

/// The variants of one op, in its list's order (empty for an op the CPU
/// backend lacks).
std::span<const core::VariantDef* const> variants_of(core::OpKind op) noexcept;

/// Analytical default for a CPU problem (a small model of the machine, not
/// a table in disguise). Never returns an invalid plan for a dtype the CPU
/// backend implements.
core::Plan get_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
