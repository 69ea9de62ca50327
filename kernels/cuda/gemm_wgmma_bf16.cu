// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the wgmma + TMA GEMM kernels for bf16 inputs (one
// translation unit per input dtype). The kernel is in
// kernels/cuda/wgmma_gemm.cuh, its launcher in kernels/cuda/gemm_wgmma.cuh.
#include "gemm_wgmma.cuh"

KDISPATCH_GEMM_WGMMA_TU(bf16)
