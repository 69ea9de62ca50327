// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the moe_gemm variant list (plain C++; the kernels
// are in kernels/cuda/moe_gemm_<w>.cu). The list itself is
// backend-neutral: kernels/gpu/moe_gemm_variants.inc.
#define KDISPATCH_GPU_NS cuda
#define KDISPATCH_GPU_BACKEND DeviceType::cuda
#define KDISPATCH_GPU_NAME(how) how
#define KDISPATCH_GPU_REF_NAME "cuda_ref"
#include "gpu/moe_gemm_variants.inc"
