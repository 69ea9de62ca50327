// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — moe_gemm kernels for fp16 weights and activations
// (one translation unit per weight dtype). The kernels themselves are the
// portable ones in kernels/gpu/moe_gemm_kernels.cuh.
#include "gpu/moe_gemm_kernels.cuh"

KDISPATCH_MOE_GEMM_TU(fp16, fp16)
