// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the GEMM variant list (plain C++; the kernels are
// in kernels/cuda/gemm_<family>_<dtype>.cu, cuBLASLt in kernels/cuda/cublaslt.cpp).
// The list itself is backend-neutral: kernels/gpu/gemm_variants.inc.
#define KDISPATCH_GPU_NS cuda
#define KDISPATCH_GPU_BACKEND DeviceType::cuda
#define KDISPATCH_GPU_WARP 32
#define KDISPATCH_GPU_NAME(how) how
#define KDISPATCH_GPU_REF_NAME "cuda_ref"
#define KDISPATCH_GPU_HAS_TILED 1
#define KDISPATCH_GPU_HAS_HIPBLASLT 0  // (the HIP floor: kernels/hip/hipblaslt.hpp)
#include "gpu/gemm_variants.inc"
