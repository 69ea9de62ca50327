// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — fused_moe's family (kernels/gpu/moe_kernels.cuh,
// and on CUDA the tensor-core kernels/cuda/moe_mma.cuh): the workspace
// sizes, and the launchers its TUs (kernels/<backend>/fused_moe_<dt>.{cu,hip}
// through gpu/moe_tu.cuh) define and its list (gpu/fused_moe_variants.inc)
// calls. Included with KDISPATCH_GPU_NS defined. Plain C++.
#pragma once

#include <cstdint>

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"

namespace dispatch::KDISPATCH_GPU_NS {

/// Threads per block of the decode kernels: 8 warps (wave64 on HIP's
/// CDNA devices).
inline constexpr int kMoeThreads = KDISPATCH_GPU_HAS_TILED ? 8 * 32 : 8 * 64;
/// Kernel images of the bf16/fp16 TUs: [0] up, [1] down (vector loads); [2]
/// up, [3] down (one element at a time); [4] up, [5] down (grouped by
/// expert); [6] up, [7] down (split over K); CUDA only: [8] sort, [9] up,
/// [10] down, [11] reduce, [12] up, [13] down (tensor cores: direct, then
/// the ring kernels of staged plans). The fp8 TU (CUDA only): [0] up, [1]
/// down (split over K); [2] up, [3] down (its reference); [4] sort, [5]
/// quantise hidden, [6] up, [7] quantise a, [8] down, [9] reduce, [10] up,
/// [11] down (tensor cores, as bf16's). bf16/fp16 also: [14] sort, [15] up,
/// [16] down (the ring kernels' wide items, 64 pairs).
inline constexpr int kMoeImages = 17;
/// Threads per block of the tensor-core kernels (moe_mma.cuh): the sort,
/// the GEMMs, the quantisation and the top-k sum.
inline constexpr int kMoeSortThreads = 1024, kMoeMmaThreads = 128, kMoeQuantThreads = 256, kMoeReduceThreads = 256;
/// The threads a launch gives image `k` of a TU (fp8: the fp8 TU).
constexpr int moe_image_threads(bool fp8, int k) noexcept {
  const int first_mma = fp8 ? 4 : 8;
  if (k < first_mma) return kMoeThreads;
  const int i = k - first_mma;  // sort, [quant,] up, [quant,] down, reduce, ring up, ring down
  if (i == 0 || (!fp8 && i == 6)) return kMoeSortThreads;  // the sort kernels (bf16/fp16: [8], [14])
  if (fp8) return i == 1 || i == 3 ? kMoeQuantThreads : i == 5 ? kMoeReduceThreads : kMoeMmaThreads;
  return i == 3 ? kMoeReduceThreads : kMoeMmaThreads;
}

// The workspace sizes are computed in 128 bits and saturate at INT64_MAX
// (a shape whose workspace int64 cannot hold asks for more than any buffer:
// the launch's check refuses it, workspace_bytes() says INT64_MAX).
using MoeWide = __int128;
constexpr int64_t moe_saturate(MoeWide b) noexcept {
  return b < 0 || b > MoeWide{INT64_MAX} ? INT64_MAX : static_cast<int64_t>(b);
}
constexpr MoeWide moe_round256w(MoeWide b) noexcept { return (b + 255) / 256 * 256; }
constexpr MoeWide moe_pairs(const core::Problem& p) noexcept { return MoeWide{p.m} * p.extra[1]; }

/// The workspace a launch needs: the activated intermediate [M * top_k, I] in fp32.
constexpr int64_t moe_decode_workspace_bytes(const core::Problem& p) noexcept {
  return moe_saturate(moe_pairs(p) * p.n * 4);
}

/// The grouped kernels' tile of output rows of the down projection, and
/// their workspace: a [P, I] and y [P, H] in fp32, then one counter per
/// down tile, each part 256-byte aligned (P = M * top_k).
inline constexpr int64_t kMoeDownTile = 8 * 2;
constexpr int64_t moe_round256(int64_t b) noexcept { return (b + 255) / 256 * 256; }
constexpr int64_t moe_grouped_workspace_bytes(const core::Problem& p) noexcept {
  const MoeWide P = moe_pairs(p);
  return moe_saturate(moe_round256w(P * p.n * 4) + moe_round256w(P * p.k * 4) +
                      MoeWide{(p.k + kMoeDownTile - 1) / kMoeDownTile} * 4);
}
/// Output rows per block of the split down kernel (H a multiple of it).
inline constexpr int64_t kMoeSplitDownRows = 16;
/// The tensor-core kernels (moe_mma.cuh): pairs per work item, the most
/// items a call can have, and the workspace: the item count, the sorted
/// pairs [P] (int32), the items (16 bytes each), a [P, I] in the dtype
/// (2 bytes) and y [P, H] in fp32, each part 256-byte aligned.
inline constexpr int64_t kMoeMmaPairs = 32;
constexpr int64_t moe_mma_max_items(const core::Problem& p) noexcept {
  const MoeWide P = moe_pairs(p);
  return moe_saturate(P / kMoeMmaPairs + (P < p.extra[0] ? P : MoeWide{p.extra[0]}) + 1);
}
constexpr int64_t moe_mma_workspace_bytes(const core::Problem& p) noexcept {
  const MoeWide P = moe_pairs(p);
  return moe_saturate(moe_round256w(4) + moe_round256w(P * 4) + moe_round256w(MoeWide{moe_mma_max_items(p)} * 16) +
                      moe_round256w(P * p.n * 2) + moe_round256w(P * p.k * 4));
}
/// Block fp8's tensor-core kernels: the same parts, a [P, I] in fp32, plus
/// the quantised activations: hidden's codes [M, H] and scales [M, H/128],
/// a's codes [P, I] and scales [P, I/128] (H and I multiples of 128).
constexpr int64_t moe_mma_fp8_workspace_bytes(const core::Problem& p) noexcept {
  const MoeWide P = moe_pairs(p), M = p.m;
  return moe_saturate(moe_round256w(4) + moe_round256w(P * 4) + moe_round256w(MoeWide{moe_mma_max_items(p)} * 16) +
                      moe_round256w(M * p.k) + moe_round256w(M * (p.k / 128) * 4) + moe_round256w(P * p.n * 4) +
                      moe_round256w(P * p.n) + moe_round256w(P * (p.n / 128) * 4) + moe_round256w(P * p.k * 4));
}
/// The ring kernels' dynamic shared memory (moe_mma.cuh kRingSmemBytes: 3
/// stages of 128 weight rows and 32 pair rows, 128 bytes each, and their
/// scales), and the opt-in limit per block from which 2 of their blocks fit
/// an SM (each block also takes 1 KiB the runtime reserves): sm_80 and
/// sm_90 have it, sm_86 and sm_89 (99 KiB) do not.
inline constexpr int64_t kMoeRingSmemBytes = 3 * (160 * 128 + 256);
inline constexpr int64_t kMoeRingTwoBlocksOptin = 2 * (kMoeRingSmemBytes + 1024) - 1024;
/// Pairs per expert (M * top_k / E) from which get_default gives the
/// bf16/fp16 tensor-core plans block_m = 64: the ring kernels take items of
/// 64 pairs (moe_mma.cuh kWideTiles) instead of 32, each expert's rows read
/// once per 64 of its pairs (Mixtral-8x7B M = 256, 64 per expert, and
/// prefill). Measured with block_m forced (bench/results/h200_moe.md,
/// 2026-12-06): Mixtral-8x7B M = 256 (64 per expert) on an H100 768 us wide
/// vs 988 us with 32-pair items; Qwen3-30B-A3B M = 1024 (64 per expert) on
/// an H200 574 vs 581 us (an A/A spread of 1 %). The tuner races both.
inline constexpr int64_t kMoeWidePairsPerExpert = 32;
/// Pairs (M * top_k) per expert from which fused_moe's tensor-core kernels
/// serve (its get_default; moe_gemm's takes its ring at every count).
/// Measured with the ring kernels on an H100 (bench/results/h200_moe.md,
/// 2026-12-05, commit 9017a82), each forced beside the default: they beat
/// the split kernels from 2.24 pairs per expert (DeepSeek-V3 block fp8 M =
/// 64: 556 vs 750 us; Qwen3-30B-A3B block fp8 M = 64, 4 per expert: 243 vs
/// 576 us) and lose at one (Qwen3-30B-A3B bf16 M = 16: 285 vs 266 us; block
/// fp8: 174 vs 168 us; Mixtral-8x7B bf16 M = 4: 369 vs 346 us).
inline constexpr int64_t kMoeMmaPairsPerExpert = 2;
/// Experts the grouped kernels take (a bitmap in shared memory).
inline constexpr int64_t kMoeMaxExperts = 1024;

/// Enqueues fused_moe's two kernels on la.stream (bf16 or fp16 weights and
/// activations; slots as ops/fused_moe.hpp). vec: 16-byte loads (rows of a
/// multiple of 8 elements, 16-byte aligned), else one element at a time.
Status launch_fused_moe_bf16(const core::LaunchArgs& la, const core::Problem& p, bool vec) noexcept;
Status launch_fused_moe_fp16(const core::LaunchArgs& la, const core::Problem& p, bool vec) noexcept;
/// The split kernels (moe_kernels.cuh; I a multiple of 8, H of 16, 16-byte
/// aligned rows): bf16 or fp16 throughout, or (fp8) e4m3fn weights with
/// block scales and bf16 activations; and block fp8's reference kernels.
Status launch_fused_moe_split_bf16(const core::LaunchArgs& la, const core::Problem& p) noexcept;
Status launch_fused_moe_split_fp16(const core::LaunchArgs& la, const core::Problem& p) noexcept;
Status launch_fused_moe_split_fp8(const core::LaunchArgs& la, const core::Problem& p) noexcept;
Status launch_fused_moe_ref_fp8(const core::LaunchArgs& la, const core::Problem& p) noexcept;
/// Block fp8's tensor-core kernels (H and I multiples of 128, E <= 1024).
/// `staged`: the ring kernels (moe_mma.cuh moe_ring_kernel), else the direct ones.
Status launch_fused_moe_mma_fp8(const core::LaunchArgs& la, const core::Problem& p, bool staged) noexcept;
/// The tensor-core kernels (moe_mma.cuh; I and H multiples of 32, E <= 1024,
/// 16-byte aligned rows). `wide` (the plan's block_m = 64, staged only):
/// items of 64 pairs, else 32.
Status launch_fused_moe_mma_bf16(const core::LaunchArgs& la, const core::Problem& p, bool staged, bool wide) noexcept;
Status launch_fused_moe_mma_fp16(const core::LaunchArgs& la, const core::Problem& p, bool staged, bool wide) noexcept;
/// Zeroes `bytes` at d on la.stream (CUDA: defined by the fp8 TU; the wgmma
/// composition's rows of dropped pairs, gpu/fused_moe_compose.hpp).
Status moe_zero_async(void* d, int64_t bytes, const core::LaunchArgs& la, const core::Problem& p) noexcept;
/// Copies `rows` rows of `row_bytes` from src (rows `src_pitch` bytes apart)
/// to dense rows at dst on la.stream (CUDA: the fp8 TU; the composition's
/// strided topk_weights).
Status moe_copy_rows_async(void* dst, const void* src, int64_t rows, int64_t row_bytes, int64_t src_pitch,
                           const core::LaunchArgs& la, const core::Problem& p) noexcept;
/// The grouped kernels (16-byte loads only).
Status launch_fused_moe_grouped_bf16(const core::LaunchArgs& la, const core::Problem& p) noexcept;
Status launch_fused_moe_grouped_fp16(const core::LaunchArgs& la, const core::Problem& p) noexcept;

}  // namespace dispatch::KDISPATCH_GPU_NS
