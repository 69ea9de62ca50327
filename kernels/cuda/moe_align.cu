// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the moe_align kernels (int32, the op's one
// translation unit). The kernels themselves are the portable ones in
// kernels/gpu/moe_align_kernels.cuh.
#include "gpu/moe_align_kernels.cuh"

KDISPATCH_MOE_ALIGN_TU()
