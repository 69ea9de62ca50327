// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — silu_and_mul kernels for fp32 (one translation unit
// per dtype, so a parallel build compiles them side by side). The kernels
// themselves are the portable ones in kernels/gpu/silu_kernels.cuh.
#include "gpu/silu_kernels.cuh"

KDISPATCH_SILU_TU(fp32)
