// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — the norm family's launchers: one per (op, dtype)
// TU (kernels/<backend>/<op>_<dt>.{cu,hip}, which defines it through
// gpu/norm_kernels.cuh), called by the variant list (gpu/norm_variants.inc).
// Included with KDISPATCH_GPU_NS defined. Plain C++.
#pragma once

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"
#include "gpu/norm_plan.hpp"

namespace dispatch::KDISPATCH_GPU_NS {

#define KDISPATCH_DECLARE_NORM_LAUNCH(op, dt) \
  Status launch_##op##_##dt(const gpu::norm::Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept;
KDISPATCH_DECLARE_NORM_LAUNCH(rmsnorm, fp32)
KDISPATCH_DECLARE_NORM_LAUNCH(rmsnorm, fp16)
KDISPATCH_DECLARE_NORM_LAUNCH(rmsnorm, bf16)
KDISPATCH_DECLARE_NORM_LAUNCH(fused_add_rmsnorm, fp32)
KDISPATCH_DECLARE_NORM_LAUNCH(fused_add_rmsnorm, fp16)
KDISPATCH_DECLARE_NORM_LAUNCH(fused_add_rmsnorm, bf16)
#undef KDISPATCH_DECLARE_NORM_LAUNCH

}  // namespace dispatch::KDISPATCH_GPU_NS
