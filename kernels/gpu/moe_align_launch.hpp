// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — the moe_align kernels' launcher: defined by the
// op's one TU (kernels/<backend>/moe_align.{cu,hip}, through
// gpu/moe_align_kernels.cuh), called by the variant list
// (gpu/moe_align_variants.inc). Included with KDISPATCH_GPU_NS defined.
// Plain C++.
#pragma once

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"
#include "gpu/moe_align_plan.hpp"

namespace dispatch::KDISPATCH_GPU_NS {

/// Enqueues launch `l` of moe_align (int32) on la.stream.
Status launch_moe_align(const gpu::moe_align::Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept;

}  // namespace dispatch::KDISPATCH_GPU_NS
