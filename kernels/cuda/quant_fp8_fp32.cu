// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — fp8 activation quantisation of fp32 inputs (one
// translation unit per input dtype): kernels/cuda/quant_fp8.cuh.
#include "quant_fp8.cuh"

KDISPATCH_QUANT_FP8_TU(fp32)
