// SPDX-License-Identifier: Apache-2.0
// kdispatch HIP backend — fused_add_rmsnorm kernels for fp32 (one translation unit per
// op and dtype, so a parallel build compiles them side by side). The kernels
// themselves are the portable ones in kernels/gpu/norm_kernels.cuh.
#include "gpu/norm_kernels.cuh"

KDISPATCH_NORM_TU(fused_add_rmsnorm, fp32, true)
