// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — GEMM skinny_mma family for fp16 inputs (one
// translation unit per family and dtype): kernels/cuda/gemm_skinny_mma.cuh.
#include "gemm_skinny_mma.cuh"

KDISPATCH_GEMM_SKINNY_MMA_TU(fp16)
