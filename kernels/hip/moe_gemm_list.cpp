// SPDX-License-Identifier: Apache-2.0
// kdispatch HIP backend — the moe_gemm variant list (plain C++; the kernels
// are in kernels/hip/moe_gemm_<w>.hip). The list itself is
// backend-neutral: kernels/gpu/moe_gemm_variants.inc. Names carry "hip_"
// after the "__" so they stay unique next to the CUDA ones in a build with
// both backends.
#define KDISPATCH_GPU_NS hip
#define KDISPATCH_GPU_BACKEND DeviceType::hip
#define KDISPATCH_GPU_NAME(how) "hip_" how
#define KDISPATCH_GPU_REF_NAME "hip_ref"
#define KDISPATCH_GPU_HAS_TILED 0  // plain C++ (no __HIP__): say it, so DeviceState is hip_device.hip's
#include "gpu/moe_gemm_variants.inc"
