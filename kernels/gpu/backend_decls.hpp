// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — what the pieces of one GPU backend (CUDA or HIP)
// declare to each other. Included with KDISPATCH_GPU_NS defined: by
// gpu/port.hpp in the device translation units, by hand in the plain C++ ones
// (kernels/cuda/norm_list.cpp, kernels/hip/norm_list.cpp). Plain C++: no GPU
// headers.
//
//   kernels/<backend>/<op>_<dtype>.{cu,hip}   the kernels of one (op, dtype),
//                                             their launcher and image probe
//   kernels/<backend>/<op>_list.cpp           an op's variant list, supports(),
//                                             launch(), get_default()
//   kernels/cuda/cublaslt.{hpp,cpp}           the cuBLASLt GEMM family (CUDA)
//   src/backends/gpu/<backend>_device.{cu,hip} device probe, tuner memory and
//                                             clock, the backend's entry table
#pragma once

#ifndef KDISPATCH_GPU_NS
#error "define KDISPATCH_GPU_NS (cuda or hip) before including gpu/backend_decls.hpp"
#endif

#include <cstdint>
#include <span>

#include "core/op.hpp"
#include "dispatch/device.hpp"
#include "gpu/fp8_plan.hpp"
#include "gpu/gemm_plan.hpp"
#include "gpu/norm_plan.hpp"
#include "gpu/silu_plan.hpp"

namespace dispatch::backends {
class Backend;
}

// The tiled tensor-core GEMM family exists on CUDA only.
#ifndef KDISPATCH_GPU_HAS_TILED
#if defined(__HIP__) || defined(__HIPCC__) || defined(KDISPATCH_GPU_IS_HIP)
#define KDISPATCH_GPU_HAS_TILED 0
#else
#define KDISPATCH_GPU_HAS_TILED 1
#endif
#endif

namespace dispatch::KDISPATCH_GPU_NS {

/// Whether a compiled kernel has a loadable image on a device, and what the
/// runtime says about it (cudaFuncGetAttributes / hipFuncGetAttributes).
struct KernelImage {
  bool loadable = false;
  int32_t max_threads = 0;  ///< launch bound honoured by the compiler
  int32_t num_regs = 0;
  int32_t error = 0;        ///< native error of the query when not loadable
  int64_t local_bytes = 0;  ///< stack frame per thread (spills)
};

/// One device as probed once: the public description plus the kernel images.
struct DeviceState {
  DeviceInfo info;
  /// Launch with programmatic dependent launch (see pdl_enabled()).
  bool pdl = false;
  /// [op: 0 rmsnorm, 1 fused][dtype: DType order][gpu::norm::kernel_index]
  KernelImage norm[gpu::norm::kNormOps][gpu::norm::kNormDtypes][gpu::norm::kKernelsPerDtype];
  /// GEMM kernels per input dtype [0 fp16, 1 bf16] (gemm_dtype_index).
  KernelImage gemm_skinny[2][gpu::gemm::kSkinnyKernels];
  KernelImage gemm_ref[2];
  KernelImage gemm_tiled[2][gpu::gemm::kTiledKernels];           ///< CUDA only (all unloadable on HIP)
  KernelImage gemm_skinny_mma[2][gpu::gemm::kSkinnyMmaKernels];  ///< CUDA only
  /// silu_and_mul [dtype: DType order][gpu::silu::kernel_index]
  KernelImage silu[gpu::silu::kSiluDtypes][gpu::silu::kKernelsPerDtype];
  /// fp8 GEMMs per scale layout (gpu::fp8): skinny_mma kernels and the
  /// reference (CUDA only; all unloadable on HIP).
  KernelImage gemm_fp8_skinny_mma[gpu::fp8::kLayouts][gpu::gemm::kSkinnyMmaKernels];
  KernelImage gemm_fp8_ref[gpu::fp8::kLayouts];
  /// fp8 quantisation [input dtype: DType order][layout][multiply, division] (CUDA only).
  KernelImage quant_fp8[gpu::fp8::kQuantDtypes][gpu::fp8::kLayouts][gpu::fp8::kQuantKernels];
  int64_t smem_optin = 0;  ///< opt-in shared memory per block (bytes)
  int cc_major = 0;        ///< compute capability major (CUDA; 0 on HIP)
};

/// Index of a GEMM input dtype in DeviceState's gemm tables: fp16 0, bf16 1, -1 else.
constexpr int gemm_dtype_index(DType t) { return t == DType::fp16 ? 0 : t == DType::bf16 ? 1 : -1; }

/// The probed state of a device (probed on first use, once), or nullptr when
/// the backend has no usable device of that ordinal. Thread-safe.
const DeviceState* device_state(int32_t ordinal) noexcept;

/// The description of ordinal 0, or of why the backend is unavailable
/// (available = false, one-line unavailable_reason). Thread-safe.
const DeviceInfo& backend_status() noexcept;

/// True when the process sees more than one device of this backend (the
/// launchers then make the tensor's device current around a launch).
bool multi_device() noexcept;

/// True when launches on device `ordinal` use programmatic dependent launch
/// (CUDA on compute capability >= 9.0, unless KDISPATCH_PDL=0): a kernel's
/// launch then overlaps the tail of the previous kernel in the stream (one
/// griddepcontrol.wait in the kernel keeps the order). False on HIP.
bool pdl_enabled(int32_t ordinal) noexcept;

/// The backend as one object (src/backends/backend.hpp).
const backends::Backend& backend() noexcept;

// ---- norm kernels: one launcher and one image probe per (op, dtype) TU.
#define KDISPATCH_DECLARE_NORM_TU(op, dt)                                                                             \
  Status launch_##op##_##dt(const gpu::norm::Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept; \
  void probe_##op##_##dt(KernelImage* out) noexcept;
KDISPATCH_DECLARE_NORM_TU(rmsnorm, fp32)
KDISPATCH_DECLARE_NORM_TU(rmsnorm, fp16)
KDISPATCH_DECLARE_NORM_TU(rmsnorm, bf16)
KDISPATCH_DECLARE_NORM_TU(fused_add_rmsnorm, fp32)
KDISPATCH_DECLARE_NORM_TU(fused_add_rmsnorm, fp16)
KDISPATCH_DECLARE_NORM_TU(fused_add_rmsnorm, bf16)
#undef KDISPATCH_DECLARE_NORM_TU

// ---- GEMM kernels: one TU per (family, input dtype). The skinny TU also
// holds the reference kernel. out: kSkinnyKernels images, then the reference.
#define KDISPATCH_DECLARE_GEMM_SKINNY_TU(dt)                                                \
  Status launch_gemm_skinny_##dt(const gpu::gemm::Skinny& s, const core::LaunchArgs& la,    \
                                 const core::Problem& p) noexcept;                          \
  Status launch_gemm_ref_##dt(const core::LaunchArgs& la, const core::Problem& p) noexcept; \
  void probe_gemm_skinny_##dt(KernelImage* skinny, KernelImage* ref) noexcept;
KDISPATCH_DECLARE_GEMM_SKINNY_TU(fp16)
KDISPATCH_DECLARE_GEMM_SKINNY_TU(bf16)
#undef KDISPATCH_DECLARE_GEMM_SKINNY_TU
#if KDISPATCH_GPU_HAS_TILED
// The tiled (mma.sync) family, CUDA only: kernels/cuda/gemm_tiled_<dt>.cu.
// probe: kTiledKernels images, in tiled_kernel_index order; it also raises
// each kernel's dynamic shared memory limit (cudaFuncSetAttribute) once.
#define KDISPATCH_DECLARE_GEMM_TILED_TU(dt)                                            \
  Status launch_gemm_tiled_##dt(const gpu::gemm::Tiled& t, const core::LaunchArgs& la, \
                                const core::Problem& p) noexcept;                      \
  void probe_gemm_tiled_##dt(KernelImage* out) noexcept;
KDISPATCH_DECLARE_GEMM_TILED_TU(fp16)
KDISPATCH_DECLARE_GEMM_TILED_TU(bf16)
#undef KDISPATCH_DECLARE_GEMM_TILED_TU
// The skinny_mma family (tensor-core weight stream), CUDA only:
// kernels/cuda/gemm_skinny_mma_<dt>.cu; probe: kSkinnyMmaKernels images.
#define KDISPATCH_DECLARE_GEMM_SKINNY_MMA_TU(dt)                                                \
  Status launch_gemm_skinny_mma_##dt(const gpu::gemm::SkinnyMma& s, const core::LaunchArgs& la, \
                                     const core::Problem& p) noexcept;                          \
  void probe_gemm_skinny_mma_##dt(KernelImage* out, int64_t smem_optin) noexcept;
KDISPATCH_DECLARE_GEMM_SKINNY_MMA_TU(fp16)
KDISPATCH_DECLARE_GEMM_SKINNY_MMA_TU(bf16)
#undef KDISPATCH_DECLARE_GEMM_SKINNY_MMA_TU
// The fp8 GEMMs, CUDA only: kernels/cuda/gemm_fp8_<layout>.cu; probe:
// kSkinnyMmaKernels images, then the reference's.
#define KDISPATCH_DECLARE_GEMM_FP8_TU(layout)                                                                  \
  Status launch_gemm_fp8_skinny_mma_##layout(const gpu::gemm::SkinnyMma& s, const core::LaunchArgs& la,        \
                                             const core::Problem& p) noexcept;                                 \
  Status launch_gemm_fp8_ref_##layout(const core::LaunchArgs& la, const core::Problem& p) noexcept;            \
  void probe_gemm_fp8_##layout(KernelImage* skinny, KernelImage* ref, int64_t smem_optin) noexcept;            \
  /* rows [m0, m0 + rows) of a block scale_a (LaunchArgs ld < 0: K-major) -> dst M-major, row stride ld_dst */ \
  Status launch_gemm_fp8_pack_scale_a_##layout(const core::LaunchArgs& la, const core::Problem& p, int64_t m0, \
                                               int64_t rows, float* dst, int64_t ld_dst) noexcept;             \
  /* scale_b's rows zero-padded to ld_dst floats into dst (block: cuBLASLt's BLK128x128 row stride) */         \
  Status launch_gemm_fp8_pad_scale_b_##layout(const core::LaunchArgs& la, const core::Problem& p, float* dst,  \
                                              int64_t ld_dst) noexcept;
KDISPATCH_DECLARE_GEMM_FP8_TU(tensor)
KDISPATCH_DECLARE_GEMM_FP8_TU(rowwise)
KDISPATCH_DECLARE_GEMM_FP8_TU(block)
#undef KDISPATCH_DECLARE_GEMM_FP8_TU
// fp8 quantisation, CUDA only: kernels/cuda/quant_fp8_<dt>.cu. layout 0
// tensor, 1 token, 2 group; mul: x * (1 / scale), else x / scale.
#define KDISPATCH_DECLARE_QUANT_FP8_TU(dt)                                                  \
  Status launch_quant_fp8_##dt(int layout, int warps, bool mul, const core::LaunchArgs& la, \
                               const core::Problem& p) noexcept;                            \
  void probe_quant_fp8_##dt(KernelImage(*out)[gpu::fp8::kQuantKernels]) noexcept;
KDISPATCH_DECLARE_QUANT_FP8_TU(fp32)
KDISPATCH_DECLARE_QUANT_FP8_TU(fp16)
KDISPATCH_DECLARE_QUANT_FP8_TU(bf16)
#undef KDISPATCH_DECLARE_QUANT_FP8_TU
#endif

// ---- silu_and_mul kernels: one launcher and one image probe per dtype TU
// (kernels/<backend>/silu_and_mul_<dt>); probe: kKernelsPerDtype images.
#define KDISPATCH_DECLARE_SILU_TU(dt)                                                     \
  Status launch_silu_and_mul_##dt(const gpu::silu::Launch& l, const core::LaunchArgs& la, \
                                  const core::Problem& p) noexcept;                       \
  void probe_silu_and_mul_##dt(KernelImage* out) noexcept;
KDISPATCH_DECLARE_SILU_TU(fp32)
KDISPATCH_DECLARE_SILU_TU(fp16)
KDISPATCH_DECLARE_SILU_TU(bf16)
#undef KDISPATCH_DECLARE_SILU_TU

/// Every GEMM variant of this backend (skinny, tiled and cuBLASLt on CUDA, reference last).
std::span<const core::VariantDef* const> gemm_variants() noexcept;

/// The analytical default plan for a GEMM problem on this backend.
core::Plan gemm_default(const core::Problem& p, const DeviceInfo& dev) noexcept;
/// The floor of a GEMM problem: what the engine would run without us (CUDA:
/// gemm_<dt>__cublas, kernels/cuda/cublas.hpp), the incumbent of every
/// search; get_default's plan where the backend has no floor of its own.
core::Plan gemm_floor(const core::Problem& p, const DeviceInfo& dev) noexcept;

/// Every norm variant of this backend, in list order (references last per op).
std::span<const core::VariantDef* const> norm_variants() noexcept;
/// The part of norm_variants() of one op (rmsnorm, fused_add_rmsnorm).
std::span<const core::VariantDef* const> rmsnorm_variants() noexcept;
std::span<const core::VariantDef* const> fused_add_rmsnorm_variants() noexcept;

/// The analytical default plan for a norm problem on this backend.
core::Plan norm_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

/// Every silu_and_mul variant of this backend (kernels/gpu/silu_variants.inc).
std::span<const core::VariantDef* const> silu_variants() noexcept;

/// The analytical default plan for a silu_and_mul problem on this backend.
core::Plan silu_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

#if KDISPATCH_GPU_HAS_TILED
/// The fp8 ops' variants (kernels/cuda/fp8_list.cpp), per op, and their
/// default rules (CUDA only).
std::span<const core::VariantDef* const> gemm_fp8_tensor_variants() noexcept;
std::span<const core::VariantDef* const> gemm_fp8_rowwise_variants() noexcept;
std::span<const core::VariantDef* const> gemm_fp8_block_variants() noexcept;
std::span<const core::VariantDef* const> quant_fp8_tensor_variants() noexcept;
std::span<const core::VariantDef* const> quant_fp8_token_variants() noexcept;
std::span<const core::VariantDef* const> quant_fp8_group_variants() noexcept;
core::Plan gemm_fp8_default(const core::Problem& p, const DeviceInfo& dev) noexcept;
/// The fp8 GEMMs' floor: cuBLASLt asked as torch._scaled_mm asks (algo_id -2).
core::Plan gemm_fp8_floor(const core::Problem& p, const DeviceInfo& dev) noexcept;
core::Plan quant_fp8_default(const core::Problem& p, const DeviceInfo& dev) noexcept;
#endif

}  // namespace dispatch::KDISPATCH_GPU_NS
