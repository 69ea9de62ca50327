// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the tiled tensor-core GEMM kernels for fp16 inputs
// (one translation unit per input dtype, so a parallel build compiles them
// side by side). The kernels themselves are in kernels/cuda/gemm_tiled.cuh.
#include "gemm_tiled.cuh"

KDISPATCH_GEMM_TILED_TU(fp16)
