// SPDX-License-Identifier: Apache-2.0
// kdispatch HIP backend — fused_moe's decode kernels for bf16 (one translation
// unit per dtype); the kernels are the portable ones in
// kernels/gpu/moe_kernels.cuh, the launchers kernels/gpu/moe_tu.cuh.
#include "gpu/moe_tu.cuh"

KDISPATCH_MOE_TU(bf16)
