// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the fp8 families' launchers: the fp8 GEMMs, one TU
// per scale layout (kernels/cuda/gemm_fp8_<layout>.cu, through
// cuda/gemm_fp8.cuh), and the fp8 quantisation, one TU per input dtype
// (kernels/cuda/quant_fp8_<dt>.cu, through cuda/quant_fp8.cuh); called by
// the variant lists (kernels/cuda/fp8_list.cpp) and the cuBLASLt family
// (kernels/cuda/cublaslt.cpp). Plain C++.
#pragma once

#ifndef KDISPATCH_GPU_NS
#define KDISPATCH_GPU_NS cuda
#endif

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"
#include "gpu/fp8_plan.hpp"
#include "gpu/gemm_plan.hpp"

namespace dispatch::cuda {

// The fp8 GEMMs. Images: kSkinnyMmaKernels, then the reference's
// (kFp8RefImage).
#define KDISPATCH_DECLARE_GEMM_FP8_LAUNCH(layout)                                                              \
  Status launch_gemm_fp8_skinny_mma_##layout(const gpu::gemm::SkinnyMma& s, const core::LaunchArgs& la,        \
                                             const core::Problem& p) noexcept;                                 \
  Status launch_gemm_fp8_ref_##layout(const core::LaunchArgs& la, const core::Problem& p) noexcept;            \
  /* rows [m0, m0 + rows) of a block scale_a (LaunchArgs ld < 0: K-major) -> dst M-major, row stride ld_dst */ \
  Status launch_gemm_fp8_pack_scale_a_##layout(const core::LaunchArgs& la, const core::Problem& p, int64_t m0, \
                                               int64_t rows, float* dst, int64_t ld_dst) noexcept;             \
  /* scale_b's rows zero-padded to ld_dst floats into dst (block: cuBLASLt's BLK128x128 row stride) */         \
  Status launch_gemm_fp8_pad_scale_b_##layout(const core::LaunchArgs& la, const core::Problem& p, float* dst,  \
                                              int64_t ld_dst) noexcept;
KDISPATCH_DECLARE_GEMM_FP8_LAUNCH(tensor)
KDISPATCH_DECLARE_GEMM_FP8_LAUNCH(rowwise)
KDISPATCH_DECLARE_GEMM_FP8_LAUNCH(block)
#undef KDISPATCH_DECLARE_GEMM_FP8_LAUNCH
/// The image of an fp8 GEMM TU's reference kernel (after its skinny_mma kernels).
inline constexpr int kFp8RefImage = gpu::gemm::kSkinnyMmaKernels;

// fp8 quantisation. layout 0 tensor, 1 token, 2 group; mul: x * (1 / scale),
// else x / scale. Images: layout * kQuantKernels + (mul ? 0 : 1).
#define KDISPATCH_DECLARE_QUANT_FP8_LAUNCH(dt)                                              \
  Status launch_quant_fp8_##dt(int layout, int warps, bool mul, const core::LaunchArgs& la, \
                               const core::Problem& p) noexcept;
KDISPATCH_DECLARE_QUANT_FP8_LAUNCH(fp32)
KDISPATCH_DECLARE_QUANT_FP8_LAUNCH(fp16)
KDISPATCH_DECLARE_QUANT_FP8_LAUNCH(bf16)
#undef KDISPATCH_DECLARE_QUANT_FP8_LAUNCH

}  // namespace dispatch::cuda
