// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the fp8 GEMM kernels of the tensor scale layout (one
// translation unit per layout): kernels/cuda/gemm_fp8.cuh.
#include "gemm_fp8.cuh"

KDISPATCH_GEMM_FP8_TU(tensor)
