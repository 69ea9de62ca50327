// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the norm variant list (plain C++; the kernels are
// in kernels/cuda/<op>_<dtype>.cu). The list itself is backend-neutral:
// kernels/gpu/norm_variants.inc.
#define KDISPATCH_GPU_NS cuda
#define KDISPATCH_GPU_BACKEND DeviceType::cuda
#define KDISPATCH_GPU_WARP 32
#define KDISPATCH_GPU_NAME(how) how
#define KDISPATCH_GPU_REF_NAME "cuda_ref"
#include "gpu/norm_variants.inc"
