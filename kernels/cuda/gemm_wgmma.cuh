// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the "wgmma" GEMM family (contract:
// gpu/gemm_plan.hpp): the launcher and image probe around the Hopper kernel
// of kernels/cuda/wgmma_gemm.cuh, one translation unit per input dtype
// (KDISPATCH_GEMM_WGMMA_TU). CUDA only; the kernels run on sm_90a alone.
//
// Per call the launcher encodes the two TMA tensor maps (A: [M][K] with row
// stride lda, boxes 64 x 128; B: [N][K] with row stride ldb, boxes 64 x
// BLOCK_SIZE_N) through the driver's cuTensorMapEncodeTiled, found once
// through the runtime (cudaGetDriverEntryPointByVersion; no link against
// libcuda), and passes them by value (__grid_constant__), so a captured
// graph replays the same maps. The grid is min(tiles, SMs) blocks of 384
// threads.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "cuda/wgmma_gemm.cuh"
#include "gpu/backend_decls.hpp"
#include "gpu/gemm_launch.hpp"
#include "gpu/gemm_plan.hpp"
#include "gpu/launch_util.hpp"
#include "ops/gemm.hpp"

#if KDISPATCH_GPU_HIP
#error "kernels/cuda/gemm_wgmma.cuh is CUDA only"
#endif

namespace dispatch::KDISPATCH_GPU_NS::gemm_wgmma {

static_assert(kd_wgmma::kBM == gpu::gemm::kWgmmaBM && kd_wgmma::kBK == gpu::gemm::kWgmmaBK);
static_assert(kd_wgmma::smem_bytes(256, 4) == gpu::gemm::wgmma_smem_bytes(256, 4));

using KernelFn = void (*)(CUtensorMap, CUtensorMap, kd_wgmma::Args);

/// The kernels of DT in the plan's index order (BLOCK_SIZE_N 128, 256).
template <DType DT>
inline const KernelFn* kernels() noexcept {
  static constexpr KernelFn t[] = {&kd_wgmma::gemm_kernel<DT == DType::bf16, 128>,
                                   &kd_wgmma::gemm_kernel<DT == DType::bf16, 256>};
  static_assert(std::size(t) == gpu::gemm::kWgmmaKernels);
  return t;
}

using core::needs_fallback;

inline bool aligned_to(const void* p, uintptr_t n) noexcept { return (reinterpret_cast<uintptr_t>(p) % n) == 0; }

/// Enqueues the GEMM on la.stream.
template <DType DT>
Status launch(const gpu::gemm::Wgmma& w, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  const void* const A = la.data[core::kGemmArgA];
  const void* const B = la.data[core::kGemmArgB];
  void* const D = la.data[core::kGemmArgD];
  const int64_t lda = la.ld[core::kGemmArgA], ldb = la.ld[core::kGemmArgB], ldd = la.ld[core::kGemmArgD];
  if (w.kernel < 0 || w.kernel >= gpu::gemm::kWgmmaKernels)
    return make_status(StatusCode::invalid_argument, "gemm wgmma: kernel index out of range");
  bool nothing = false;
  if (Status s = check_tile_gemm_call(la, p, DT, "gemm wgmma", &nothing); !s.ok() || nothing) return s;
  // The TMA's row stride is a multiple of 16 bytes (one row: any stride).
  const int64_t sa = p.m > 1 ? lda : p.k, sb = p.n > 1 ? ldb : p.k;
  if (sa % 8 != 0 || sb % 8 != 0 || sa < p.k || sb < p.k)
    return needs_fallback("gemm wgmma: lda and ldb must be multiples of 8 elements, at least K");
  const kd_wgmma::EncodeTiledFn enc = kd_wgmma::encode_fn();
  if (enc == nullptr) return needs_fallback("gemm wgmma: the driver has no cuTensorMapEncodeTiled");
  const DeviceState* st = device_state(p.device.ordinal);
  const int sms = st != nullptr && st->info.compute_units > 0 ? st->info.compute_units : 132;

  const bool bf16 = DT == DType::bf16;
  CUtensorMap ta, tb;
  if (kd_wgmma::encode_operand(enc, &ta, A, p.m, p.k, sa, kd_wgmma::kBM, bf16) != CUDA_SUCCESS ||
      kd_wgmma::encode_operand(enc, &tb, B, p.n, p.k, sb, w.bn, bf16) != CUDA_SUCCESS)
    return needs_fallback("gemm wgmma: cuTensorMapEncodeTiled refused the operands");

  const bool out_f32 = p.out_dtype == DType::fp32;
  const int64_t tiles_m = (p.m + kd_wgmma::kBM - 1) / kd_wgmma::kBM, tiles_n = (p.n + w.bn - 1) / w.bn;
  if (tiles_m * tiles_n > INT_MAX / 2)
    return make_status(StatusCode::unsupported_problem, "gemm wgmma: too many tiles for one grid");
  kd_wgmma::Args a{};
  a.d = D;
  a.bias = la.data[core::kGemmArgBias];
  a.ldd = ldd;
  a.m = static_cast<int32_t>(p.m);
  a.n = static_cast<int32_t>(p.n);
  a.k = static_cast<int32_t>(p.k);
  a.tiles_m = static_cast<int32_t>(tiles_m);
  a.tiles_n = static_cast<int32_t>(tiles_n);
  a.k_tiles = static_cast<int32_t>((p.k + kd_wgmma::kBK - 1) / kd_wgmma::kBK);
  a.stages = w.stages;
  a.group_m = w.group_m;
  a.out_fp32 = out_f32 ? 1 : 0;
  a.d_vec2 = (ldd % 2 == 0 || p.m == 1) && aligned_to(D, out_f32 ? 8 : 4) ? 1 : 0;

  const port::Stream stream = static_cast<port::Stream>(la.stream);
  DeviceGuard guard(p.device.ordinal);
  const int64_t grid = std::min<int64_t>(tiles_m * tiles_n, sms);
  const port::Error e =
      port::launch_smem(kernels<DT>()[w.kernel], dim3(static_cast<unsigned>(grid)), dim3(kd_wgmma::kThreads),
                        static_cast<size_t>(gpu::gemm::wgmma_smem_bytes(w.bn, w.stages)), stream,
                        pdl_enabled(p.device.ordinal), ta, tb, a);
  return port::status(e, "gemm wgmma kernel launch");
}

/// Fills out[kernel] for both kernels of DT: loadable only where the
/// device runs this TU's sm_90a code (kd_wgmma::sm90a_code_runs: not the
/// compute_90 PTX, whose body is a trap, on a newer device or under
/// CUDA_FORCE_PTX_JIT=1) and the driver has the tensor-map encoder, with
/// the dynamic shared memory limit raised to the largest stage count that fits.
template <DType DT>
void probe(KernelImage* out, const ProbeEnv& env) noexcept {
  const int64_t limit = env.smem_optin > 0 ? env.smem_optin : 227 * 1024;
  const bool runs = kd_wgmma::sm90a_code_runs();
  for (int i = 0; i < gpu::gemm::kWgmmaKernels; ++i) {
    const int64_t bn = gpu::gemm::kWgmmaBlockNValues[i];
    int64_t smem = 0;
    for (int64_t s : gpu::gemm::kWgmmaStagesValues)
      if (gpu::gemm::wgmma_smem_bytes(bn, s) <= limit) smem = gpu::gemm::wgmma_smem_bytes(bn, s);
    out[i] = wgmma_image(kernels<DT>()[i], smem, runs);
  }
}

}  // namespace dispatch::KDISPATCH_GPU_NS::gemm_wgmma

/// The body of kernels/cuda/gemm_wgmma_<dt>.cu: instantiates the wgmma
/// kernels of one input dtype and defines its launcher and image probe.
#define KDISPATCH_GEMM_WGMMA_TU(dt) KDISPATCH_GEMM_FAMILY_TU(wgmma, Wgmma, gpu::gemm::kWgmmaKernels, dt)
