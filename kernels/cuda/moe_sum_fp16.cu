// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — moe_sum kernels for fp16 (one translation unit per
// dtype, so a parallel build compiles them side by side). The kernels
// themselves are the portable ones in kernels/gpu/moe_sum_kernels.cuh.
#include "gpu/moe_sum_kernels.cuh"

KDISPATCH_MOE_SUM_TU(fp16)
