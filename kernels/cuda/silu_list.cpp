// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the silu_and_mul variant list (plain C++; the
// kernels are in kernels/cuda/silu_and_mul_<dtype>.cu). The list itself is
// backend-neutral: kernels/gpu/silu_variants.inc.
#define KDISPATCH_GPU_NS cuda
#define KDISPATCH_GPU_BACKEND DeviceType::cuda
#define KDISPATCH_GPU_NAME(how) how
#define KDISPATCH_GPU_REF_NAME "cuda_ref"
#include "gpu/silu_variants.inc"
