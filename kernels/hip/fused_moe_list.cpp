// SPDX-License-Identifier: Apache-2.0
// kdispatch HIP backend — the fused_moe variant list (plain C++; the kernels
// are in kernels/hip/fused_moe_<dtype>.hip). The list itself is
// backend-neutral: kernels/gpu/fused_moe_variants.inc. HIP has the portable
// kernels (per pair, split over K, the reference) in bf16 and fp16; the
// tensor-core (mma.sync), expert-grouped and block-fp8 ones are CUDA's.
#define KDISPATCH_GPU_NS hip
#define KDISPATCH_GPU_BACKEND DeviceType::hip
#define KDISPATCH_GPU_NAME(how) "hip_" how
#define KDISPATCH_GPU_REF_NAME "hip_ref"
#define KDISPATCH_GPU_HAS_TILED 0
#include "gpu/fused_moe_variants.inc"
