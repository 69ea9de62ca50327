// SPDX-License-Identifier: Apache-2.0
// kdispatch HIP backend — the GEMM variant list (plain C++; the kernels are
// in kernels/hip/gemm_skinny_<dtype>.hip). The list itself is backend-neutral:
// kernels/gpu/gemm_variants.inc. HIP has the skinny family, the floor
// (hipBLASLt as torch calls it on ROCm) and the reference: the tiled family
// is mma.sync (NVIDIA), cuBLASLt is NVIDIA's.
#define KDISPATCH_GPU_NS hip
#define KDISPATCH_GPU_BACKEND DeviceType::hip
#define KDISPATCH_GPU_WARP 64  // CDNA (gfx90a, gfx940) wavefronts
#define KDISPATCH_GPU_NAME(how) "hip_" how
#define KDISPATCH_GPU_REF_NAME "hip_ref"
#define KDISPATCH_GPU_HAS_TILED 0
#define KDISPATCH_GPU_HAS_HIPBLASLT 1  // the floor: hipBLASLt as torch calls it (kernels/hip/hipblaslt.hpp)
#include "gpu/gemm_variants.inc"
