// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — moe_gemm's family (kernels/gpu/moe_gemm_kernels.cuh):
// its kernels' indices and the launchers its TUs (kernels/<backend>/
// moe_gemm_<w>.{cu,hip}) define and its list (gpu/moe_gemm_variants.inc)
// calls. Included with KDISPATCH_GPU_NS defined. Plain C++.
#pragma once

#include <cstdint>

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"
#include "gpu/moe_launch.hpp"

namespace dispatch::gpu::moe_gemm {

inline constexpr core::OpKind kOp = core::OpKind::moe_gemm;
/// The kernels of a TU, by image index: split with vector loads, split
/// one element at a time, the reference; ring (CUDA: the bf16, fp16 and
/// fp8 TUs): the tensor-core kernel.
enum class Family : uint8_t { vec = 0, generic = 1, reference = 2, ring = 3, wgmma = 5 };
constexpr int kernel_index(Family f) { return static_cast<int>(f); }
/// Weight rows per block of the split kernels (4 warps of 4 rows), their
/// threads on a 32-wide warp, and the reference's threads.
inline constexpr int64_t kRowsPerBlock = 16;
inline constexpr int kSplitWarps = 4, kRefThreads = 256;
/// Kernel images a TU has: the families', then [4] ring with 64-position
/// items (ring: CUDA's bf16 and fp16 only; its threads and shared memory
/// are fused_moe's ring kernels', gpu/moe_launch.hpp).
/// The fp8 TU's [4] is its quantisation kernel (block fp8's ring: no wide
/// items).
/// [5] and [6] (CUDA's bf16 and fp16 TUs, sm_90a): wgmma 128 and 256
/// columns wide (cuda/wgmma_moe.cuh; the sort's block_size 128 or 64); the
/// fp8 TU's [5]: block fp8's wgmma, 128 wide; [6]-[9] the fp8_w8a8 ops'
/// passes (below).
inline constexpr int kImages = 10;
inline constexpr int kWideRingImage = 4, kFp8QuantImage = 4, kWgmmaImage = 5;
inline constexpr int kWgmmaThreads = 384;  ///< the wgmma kernel's block (3 warpgroups)
/// The fp8 TU's [6]: the fp8_w8a8 ops' per-tensor amax kernel, and its
/// block; [7] and [8]: moe_gemm_fp8_tensor's ring and wgmma preparation (a
/// quantised by its one scale, w_scale spread to block scales).
inline constexpr int kAmaxImage = 6, kAmaxThreads = 256, kRowsQuantImage = 7, kSpreadImage = 8;
/// [9]: moe_gemm_fp8_channel's dynamic per-row scales before the split kernels.
inline constexpr int kRowScalesImage = 9;

}  // namespace dispatch::gpu::moe_gemm

namespace dispatch::KDISPATCH_GPU_NS {

/// Block fp8's ring workspace: a [M, K] quantised once, e4m3fn codes and
/// their 1x128-group scales [M, K / 128] fp32, each part 256-byte aligned
/// (kernels/gpu/moe_gemm_kernels.cuh launch_ring; saturates).
constexpr int64_t moe_gemm_fp8_ring_workspace_bytes(const core::Problem& p) noexcept {
  const MoeWide codes = MoeWide{p.m} * p.k, scales = MoeWide{p.m} * ((p.k + 127) / 128) * 4;
  return moe_saturate(moe_round256w(codes) + moe_round256w(scales));
}

/// moe_gemm_fp8_channel's dynamic scale on the split kernels: one fp32
/// scale per row of a, computed by a pass first (256-byte aligned; a call
/// given less computes each row's in the kernel).
constexpr int64_t moe_gemm_fp8_row_scales_bytes(const core::Problem& p) noexcept {
  return moe_saturate(moe_round256w(MoeWide{p.m} * 4));
}

/// moe_gemm_fp8_tensor's ring and wgmma (the block-fp8 kernels): block
/// fp8's workspace (a's codes, quantised by its one scale, and that scale
/// per 128-group), then w_scale spread to block scales [E, ceil(N/128),
/// ceil(K/128)] fp32 and the dynamic scale's amax, each part 256-byte
/// aligned (saturates).
constexpr int64_t moe_gemm_fp8_tensor_ring_workspace_bytes(const core::Problem& p) noexcept {
  const MoeWide codes = MoeWide{p.m} * p.k, scales = MoeWide{p.m} * ((p.k + 127) / 128) * 4,
                blocks = MoeWide{p.extra[0]} * ((p.n + 127) / 128) * ((p.k + 127) / 128) * 4;
  return moe_saturate(moe_round256w(codes) + moe_round256w(scales) + moe_round256w(blocks) + 256);
}

/// Enqueues family `f` of moe_gemm on la.stream: bf16 or fp16 weights and
/// activations, or (fp8, CUDA only) e4m3fn weights with block scales and
/// bf16 activations.
Status launch_moe_gemm_bf16(gpu::moe_gemm::Family f, const core::LaunchArgs& la, const core::Problem& p) noexcept;
Status launch_moe_gemm_fp16(gpu::moe_gemm::Family f, const core::LaunchArgs& la, const core::Problem& p) noexcept;
Status launch_moe_gemm_fp8_e4m3fn(gpu::moe_gemm::Family f, const core::LaunchArgs& la, const core::Problem& p) noexcept;

}  // namespace dispatch::KDISPATCH_GPU_NS
