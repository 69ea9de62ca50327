// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — the silu_and_mul family's launchers: one per dtype
// TU (kernels/<backend>/silu_and_mul_<dt>.{cu,hip}, which defines it through
// gpu/silu_kernels.cuh), called by the variant list (gpu/silu_variants.inc).
// Included with KDISPATCH_GPU_NS defined. Plain C++.
#pragma once

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"
#include "gpu/silu_plan.hpp"

namespace dispatch::KDISPATCH_GPU_NS {

#define KDISPATCH_DECLARE_SILU_LAUNCH(dt)                                                 \
  Status launch_silu_and_mul_##dt(const gpu::silu::Launch& l, const core::LaunchArgs& la, \
                                  const core::Problem& p) noexcept;
KDISPATCH_DECLARE_SILU_LAUNCH(fp32)
KDISPATCH_DECLARE_SILU_LAUNCH(fp16)
KDISPATCH_DECLARE_SILU_LAUNCH(bf16)
#undef KDISPATCH_DECLARE_SILU_LAUNCH

}  // namespace dispatch::KDISPATCH_GPU_NS
