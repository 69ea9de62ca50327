// SPDX-License-Identifier: Apache-2.0
// kdispatch HIP backend — GEMM skinny family and reference kernels for fp16
// inputs (one translation unit per family and dtype). The kernels are the
// portable ones in kernels/gpu/gemm_kernels.cuh.
#include "gpu/gemm_kernels.cuh"

KDISPATCH_GEMM_SKINNY_TU(fp16)
