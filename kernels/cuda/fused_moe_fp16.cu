// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — fused_moe's decode kernels for fp16 (one
// translation unit per dtype); the kernels are kernels/gpu/moe_kernels.cuh,
// the launchers gpu/moe_tu.cuh.
#include "gpu/moe_tu.cuh"

KDISPATCH_MOE_TU(fp16)
