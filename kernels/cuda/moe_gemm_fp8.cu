// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — moe_gemm kernels for block-fp8 weights (e4m3fn,
// 128x128 block scales) and bf16 activations. The kernels themselves are
// the portable ones in kernels/gpu/moe_gemm_kernels.cuh; the fp8 list row
// is CUDA only, as fused_moe's.
#include "gpu/moe_gemm_kernels.cuh"

KDISPATCH_MOE_GEMM_TU(fp8_e4m3fn, bf16)
