// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — the moe_sum kernels' launchers: one per dtype TU
// (kernels/<backend>/moe_sum_<dt>.{cu,hip}, which defines it through
// gpu/moe_sum_kernels.cuh), called by the variant list
// (gpu/moe_sum_variants.inc). Included with KDISPATCH_GPU_NS defined. Plain
// C++.
#pragma once

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"
#include "gpu/moe_sum_plan.hpp"

namespace dispatch::KDISPATCH_GPU_NS {

/// Enqueues launch `l` of moe_sum for one dtype on la.stream.
Status launch_moe_sum_fp32(const gpu::moe_sum::Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept;
Status launch_moe_sum_fp16(const gpu::moe_sum::Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept;
Status launch_moe_sum_bf16(const gpu::moe_sum::Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept;

}  // namespace dispatch::KDISPATCH_GPU_NS
