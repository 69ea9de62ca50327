// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — the GEMM families' launchers: one TU per (family,
// input dtype) (kernels/<backend>/gemm_<family>_<dt>.{cu,hip}), called by the
// variant list (gpu/gemm_variants.inc). Included with KDISPATCH_GPU_NS
// defined. Plain C++.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"
#include "gpu/gemm_plan.hpp"
#include "ops/gemm.hpp"

namespace dispatch::KDISPATCH_GPU_NS {

/// Index of a GEMM input dtype among the families' TUs: fp16 0, bf16 1, -1 else.
constexpr int gemm_dtype_index(DType t) { return t == DType::fp16 ? 0 : t == DType::bf16 ? 1 : -1; }

// The skinny family (gpu/gemm_kernels.cuh); its TU also holds the reference
// kernel. Images: kSkinnyKernels (skinny_kernel_index), then the reference.
#define KDISPATCH_DECLARE_GEMM_SKINNY_LAUNCH(dt)                                         \
  Status launch_gemm_skinny_##dt(const gpu::gemm::Skinny& s, const core::LaunchArgs& la, \
                                 const core::Problem& p) noexcept;                       \
  Status launch_gemm_ref_##dt(const core::LaunchArgs& la, const core::Problem& p) noexcept;
KDISPATCH_DECLARE_GEMM_SKINNY_LAUNCH(fp16)
KDISPATCH_DECLARE_GEMM_SKINNY_LAUNCH(bf16)
#undef KDISPATCH_DECLARE_GEMM_SKINNY_LAUNCH
/// The image of the skinny TU's reference kernel (after the skinny kernels).
inline constexpr int kGemmRefImage = gpu::gemm::kSkinnyKernels;

#if KDISPATCH_GPU_HAS_TILED
/// The checks the CUDA tensor-core tile launchers (tiled, wgmma) share, in
/// order, each message prefixed with `who` ("gemm tiled"): D the input dtype
/// `dt` or fp32; M or N of 0: `*nothing` set, ok (no launch); K a positive
/// multiple of 8; M, N, K below 2^31 - 1024; a, b and d not null; A and B
/// 16-byte aligned (else needs_fallback: get_default's plan runs the call).
inline Status check_tile_gemm_call(const core::LaunchArgs& la, const core::Problem& p, DType dt, std::string_view who,
                                   bool* nothing) noexcept {
  *nothing = false;
  auto fail = [&](StatusCode code, std::string_view what) {
    try {
      return make_status(code, std::string(who) + ": " + std::string(what));
    } catch (...) {
      return make_status(code, what);
    }
  };
  if (p.out_dtype != dt && p.out_dtype != DType::fp32)
    return fail(StatusCode::unsupported_problem, "D must be the input dtype or fp32");
  if (p.m < 1 || p.n < 1) {
    *nothing = true;
    return Status();
  }
  if (p.k < 1 || p.k % 8 != 0) return fail(StatusCode::unsupported_problem, "K must be a positive multiple of 8");
  constexpr int64_t kMax = int64_t{INT32_MAX} - 1024;
  if (p.m > kMax || p.n > kMax || p.k > kMax)
    return fail(StatusCode::unsupported_problem, "M, N and K must be below 2^31 - 1024");
  const void* const a = la.data[core::kGemmArgA];
  const void* const b = la.data[core::kGemmArgB];
  if (a == nullptr || b == nullptr || la.data[core::kGemmArgD] == nullptr)
    return fail(StatusCode::invalid_argument, "a, b and d must not be null");
  if (((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) & 15u) != 0) {
    Status s = fail(StatusCode::unsupported_problem, "A and B must be 16-byte aligned");
    return core::needs_fallback(s.message());
  }
  return Status();
}

/// The body of kernels/cuda/gemm_<fam>_<dt>.cu for the CUDA tensor-core
/// families (tiled, skinny_mma, wgmma): launch_gemm_<fam>_<dt>, calling
/// gemm_<fam>::launch<DT>(plan, la, p) with the family's resolved plan type
/// gpu::gemm::<PlanT>, and the image probe probe_gemm_<fam>_<dt>, calling
/// gemm_<fam>::probe<DT>(out, env) for its `images` kernels.
#define KDISPATCH_GEMM_FAMILY_TU(fam, PlanT, images, dt)                                    \
  namespace dispatch::KDISPATCH_GPU_NS {                                                    \
  Status launch_gemm_##fam##_##dt(const gpu::gemm::PlanT& plan, const core::LaunchArgs& la, \
                                  const core::Problem& p) noexcept {                        \
    return gemm_##fam::launch<DType::dt>(plan, la, p);                                      \
  }                                                                                         \
  static_assert((images) <= kMaxImagesPerTu);                                               \
  void probe_gemm_##fam##_##dt(KernelImage* out, const ProbeEnv& env) noexcept {            \
    gemm_##fam::probe<DType::dt>(out, env);                                                 \
  }                                                                                         \
  }
// The tiled (mma.sync) family, CUDA only: kernels/cuda/gemm_tiled_<dt>.cu.
// Images: kTiledKernels, in tiled_kernel_index order; the probe also raises
// each kernel's dynamic shared memory limit (cudaFuncSetAttribute) once.
#define KDISPATCH_DECLARE_GEMM_TILED_LAUNCH(dt) \
  Status launch_gemm_tiled_##dt(const gpu::gemm::Tiled& t, const core::LaunchArgs& la, const core::Problem& p) noexcept;
KDISPATCH_DECLARE_GEMM_TILED_LAUNCH(fp16)
KDISPATCH_DECLARE_GEMM_TILED_LAUNCH(bf16)
#undef KDISPATCH_DECLARE_GEMM_TILED_LAUNCH
// The skinny_mma family (tensor-core weight stream), CUDA only:
// kernels/cuda/gemm_skinny_mma_<dt>.cu. Images: kSkinnyMmaKernels.
#define KDISPATCH_DECLARE_GEMM_SKINNY_MMA_LAUNCH(dt)                                            \
  Status launch_gemm_skinny_mma_##dt(const gpu::gemm::SkinnyMma& s, const core::LaunchArgs& la, \
                                     const core::Problem& p) noexcept;
KDISPATCH_DECLARE_GEMM_SKINNY_MMA_LAUNCH(fp16)
KDISPATCH_DECLARE_GEMM_SKINNY_MMA_LAUNCH(bf16)
#undef KDISPATCH_DECLARE_GEMM_SKINNY_MMA_LAUNCH
// The wgmma family (Hopper wgmma + TMA), CUDA only: kernels/cuda/
// gemm_wgmma_<dt>.cu. Images: kWgmmaKernels (BLOCK_SIZE_N 128, 256),
// loadable on an sm_90a device only.
#define KDISPATCH_DECLARE_GEMM_WGMMA_LAUNCH(dt) \
  Status launch_gemm_wgmma_##dt(const gpu::gemm::Wgmma& w, const core::LaunchArgs& la, const core::Problem& p) noexcept;
KDISPATCH_DECLARE_GEMM_WGMMA_LAUNCH(fp16)
KDISPATCH_DECLARE_GEMM_WGMMA_LAUNCH(bf16)
#undef KDISPATCH_DECLARE_GEMM_WGMMA_LAUNCH
#endif

}  // namespace dispatch::KDISPATCH_GPU_NS
