// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — GEMM D[M,N] = A[M,K] · B[N,K]^T (+ bias[N]): the
// families of our own kernels, their config spaces and how a config point
// becomes a launch. Plain C++ (no GPU headers): the variant list (host code),
// the kernels' launchers and the tests share it.
//
// Families (the cuBLASLt family, CUDA only, is in kernels/cuda/cublaslt.hpp):
//
//   skinny  decode-time GEMV-like shapes (M <= 16 or so): the weight B is
//           streamed once at full bandwidth with 16-byte loads, each warp
//           owning `rows_per_warp` rows of B (columns of D) and the block's
//           `split_k` warps splitting K between them; the split-K partial
//           sums are added in a fixed order through shared memory inside the
//           block (no atomics, no workspace: deterministic). A, the few
//           activation rows, is re-read from L1/L2 by every warp. M is
//           processed in chunks of `m_tile` rows (compile time: 1, 2, 4, 8,
//           16; the launcher picks the smallest chunk that covers M, and
//           gridDim.y covers chunks of 16 above — correct for any M up to
//           2^20, fast for small).
//             rows_per_warp  {1, 2, 4}     (compile time)
//             split_k        {1, 2, 4, 8}  warps per block along K (runtime)
//           Needs K % 8 == 0, 16-byte aligned A and B rows (lda, ldb % 8 == 0
//           and 16-byte aligned pointers): checked by supports() (K) and at
//           the call (pointers, strides; Problem::align_bytes).
//   tiled   (CUDA only) tensor cores through mma.sync.m16n8k16 with a
//           cp.async multi-stage shared-memory pipeline and ldmatrix; fp32
//           accumulation. A block computes a BLOCK_SIZE_M x BLOCK_SIZE_N tile
//           of D with num_warps warps; num_stages K-tiles of BLOCK_SIZE_K are
//           in flight. split_k > 1 splits K over gridDim.z: each split writes
//           an fp32 partial tile to the caller's workspace and a second
//           kernel adds the splits in order (deterministic), adds the bias
//           and converts. Only the (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
//           num_warps) shapes of kTiledShapes are compiled (each with
//           num_stages 2, 3, 4): supports() declines the other points of the
//           space. Needs K % 8 == 0 and 16-byte aligned rows, like skinny.
//             BLOCK_SIZE_M {64, 128, 256}  BLOCK_SIZE_N {64, 128, 256}
//             BLOCK_SIZE_K {32, 64}        num_warps {4, 8}
//             num_stages {2, 3, 4}         split_k {1, 2, 4}
//   wgmma   (CUDA, sm_90a only) Hopper's wgmma + TMA (kernels/cuda/
//           wgmma_gemm.cuh): a persistent, warp-specialised kernel, one
//           block of 3 warpgroups per SM (a TMA producer, two wgmma
//           consumers of 64 rows each) over 128 x BLOCK_SIZE_N tiles in the
//           GROUP_SIZE_M order, K-tiles of 64 through num_stages
//           shared-memory stages on mbarriers; fp32 accumulation, the
//           epilogue (bias, conversion) from registers. BLOCK_SIZE_N is
//           compile time (two kernels per dtype); num_stages and
//           GROUP_SIZE_M are runtime. Needs K % 8 == 0 and 16-byte aligned
//           A and B rows (the TMA's row stride), an sm_90a device.
//             BLOCK_SIZE_N {128, 256}  num_stages {3, 4, 5, 6} (what fits)
//             GROUP_SIZE_M {8, 16}
//   reference  one thread per output element, scalar fp32 accumulation in
//           K order, any M/N/K, any alignment and row stride: the tuner's
//           validation baseline (kVariantReference) and the last resort of
//           get_default.
//
// dtypes: A and B bf16 or fp16 (the same); D bf16, fp16 (= input dtype) or
// fp32; bias (optional) the dtype of D. Accumulation is fp32 everywhere.
#pragma once

#include <cstdint>

namespace dispatch::gpu::gemm {

// ------------------------------------------------------------------ skinny

inline constexpr int64_t kSkinnyRowsPerWarpValues[] = {1, 2, 4};
inline constexpr int64_t kSkinnySplitKValues[] = {1, 2, 4, 8};
inline constexpr int kSkinnyMTiles[] = {1, 2, 4, 8, 16};
inline constexpr int kSkinnyMaxMTile = 16;
/// Param slots (Plan::params) of the skinny family.
inline constexpr int kSkinnyRowsPerWarp = 0, kSkinnySplitK = 1;
/// Kernels per input dtype: m_tile (5) x rows_per_warp (3).
inline constexpr int kSkinnyKernels = 15;

constexpr int skinny_rpw_index(int64_t r) { return r == 1 ? 0 : r == 2 ? 1 : r == 4 ? 2 : -1; }
constexpr int skinny_mtile_index(int m) { return m == 1 ? 0 : m == 2 ? 1 : m == 4 ? 2 : m == 8 ? 3 : m == 16 ? 4 : -1; }
/// The chunk of M rows one skinny launch covers: the smallest m_tile >= m, 16 above.
constexpr int skinny_mtile_for(int64_t m) { return m <= 1 ? 1 : m <= 2 ? 2 : m <= 4 ? 4 : m <= 8 ? 8 : 16; }
constexpr int skinny_kernel_index(int mtile, int64_t rows_per_warp) {
  return skinny_mtile_index(mtile) * 3 + skinny_rpw_index(rows_per_warp);
}

/// A skinny launch: a block of 32 * split_k threads (warp size 32; 64 on
/// CDNA) covers 32/64-lane warps x rows_per_warp rows of B.
struct Skinny {
  int rows_per_warp = 1;
  int split_k = 1;
  int m_tile = 1;
};

/// Resolves skinny params for (N, K); nullptr when accepted, else why not.
inline const char* resolve_skinny(int64_t n, int64_t k, const int64_t* params, Skinny* out) {
  const int64_t rpw = params[kSkinnyRowsPerWarp], sk = params[kSkinnySplitK];
  if (skinny_rpw_index(rpw) < 0) return "rows_per_warp must be 1, 2 or 4";
  if (sk != 1 && sk != 2 && sk != 4 && sk != 8) return "split_k must be 1, 2, 4 or 8";
  if (k % 8 != 0) return "K must be a multiple of 8 (16-byte loads)";
  if (n < 1 || k < 1) return "N and K must be >= 1";
  out->rows_per_warp = static_cast<int>(rpw);
  out->split_k = static_cast<int>(sk);
  return nullptr;
}

// ------------------------------------------------------------------ skinny_mma (CUDA)
//
//   skinny_mma  a weight stream for decode shapes (M <= 16) with the multiply
//           on tensor cores: a group of warps_n warps streams its own
//           contiguous range of K for warps_n * 16 * row_tiles rows of B
//           (each warp 16 * row_tiles) and the activation rows, which the
//           group shares, through a cp.async ring of num_stages 64-wide
//           chunks in shared memory (whole 128-byte lines per row, B with L2
//           evict-first), then ldmatrix + mma.sync on the transposed product
//           D^T = B A^T (kernels/cuda/gemm_skinny_mma.cuh). The K ranges of
//           split_k groups of a block and of cluster_k blocks of a
//           thread-block cluster are added in a fixed order (groups in
//           shared memory, blocks through distributed shared memory), so the
//           result does not depend on scheduling.
//             row_tiles   {1, 2}        16-row tiles of B per warp (compile time)
//             split_k     {1, 2, 4, 8}  warp groups per block along K (runtime)
//             num_stages  {3, 4, 6}     cp.async ring depth (compile time)
//             cluster_k   {1, 2, 4}     blocks per cluster along K (runtime;
//                                       > 1 needs compute capability 9.0)
//             warps_n     {1, 2, 4}     warps per group along N sharing one
//                                       copy of the activation rows (runtime;
//                                       split_k * warps_n <= 8 warps a block)
//           Needs K % 8 == 0 and 16-byte aligned A and B rows, like skinny.
//           M above 16 runs in chunks of 16 (correct, not fast).

inline constexpr int64_t kSkinnyMmaRowTilesValues[] = {1, 2};
inline constexpr int64_t kSkinnyMmaSplitKValues[] = {1, 2, 4, 8};
inline constexpr int64_t kSkinnyMmaStagesValues[] = {3, 4, 6};
inline constexpr int64_t kSkinnyMmaClusterValues[] = {1, 2, 4};
inline constexpr int64_t kSkinnyMmaWarpsNValues[] = {1, 2, 4};
inline constexpr int kSkinnyMmaRowTiles = 0, kSkinnyMmaSplitK = 1, kSkinnyMmaStages = 2, kSkinnyMmaCluster = 3,
                     kSkinnyMmaWarpsN = 4;
/// Kernels per input dtype: row_tiles (2) x n-tiles of A (1: M <= 8, 2: 9..16) x num_stages (3).
inline constexpr int kSkinnyMmaKernels = 12;
constexpr int skinny_mma_stage_index(int stages) { return stages == 3 ? 0 : stages == 4 ? 1 : 2; }
constexpr int skinny_mma_kernel_index(int row_tiles, int n_tiles, int stages) {
  return ((row_tiles - 1) * 2 + (n_tiles - 1)) * 3 + skinny_mma_stage_index(stages);
}
/// 8-row tiles of A a launch for M rows uses (1: M <= 8, else 2).
constexpr int skinny_mma_n_tiles(int64_t m) { return m <= 8 ? 1 : 2; }
/// Bytes of one ring stage of a group: 64 K elements (128 bytes) of every B
/// row of its warps_n warps and of every A row.
constexpr int64_t skinny_mma_stage_bytes(int row_tiles, int n_tiles, int warps_n = 1) {
  return (16 * row_tiles * warps_n + 8 * n_tiles) * 128;
}
/// Byte offset of the cluster reduction's receive area in a launch's dynamic
/// shared memory: past the split_k rings and the split_k * warps_n warp
/// tiles of fp32 partial sums that reuse them.
constexpr int64_t skinny_mma_recv_offset(int row_tiles, int n_tiles, int stages, int split_k, int warps_n = 1) {
  const int64_t ring = split_k * stages * skinny_mma_stage_bytes(row_tiles, n_tiles, warps_n);
  const int64_t part = split_k * warps_n * 32 * row_tiles * n_tiles * 4 * 4;
  return ring > part ? ring : part;
}
/// Dynamic shared memory of a launch: the rings (the partial sums reuse
/// them), then, with cluster_k > 1, the receive area: one warp tile of fp32
/// sums per warp of a group (the cluster's ranks' sums of this block's slice
/// of the outputs).
/// The fp8 block-scaled GEMM adds a ring of its own per group, at the end:
/// one 128-byte slot per stage holding that K group's scales (sa of the
/// tile's 8 * n_tiles rows, then sb of the group's block row).
inline constexpr int kSkinnyMmaScaleSlotBytes = 128;
constexpr int64_t skinny_mma_smem_bytes(int row_tiles, int n_tiles, int stages, int split_k, int warps_n = 1,
                                        int cluster_k = 1, bool scale_ring = false) {
  return skinny_mma_recv_offset(row_tiles, n_tiles, stages, split_k, warps_n) +
         (cluster_k > 1 ? warps_n * 32 * row_tiles * n_tiles * 4 * 4 : 0) +
         (scale_ring ? int64_t{split_k} * stages * kSkinnyMmaScaleSlotBytes : 0);
}

struct SkinnyMma {
  int row_tiles = 1;
  int split_k = 1;
  int stages = 4;
  int cluster_k = 1;
  int warps_n = 1;
};

/// Checks a skinny_mma point for (N, K): nullptr, or why it is declined.
/// smem_optin: the device's opt-in shared memory per block (0: unknown, not
/// checked); cc_major: its compute capability (0: unknown, not checked).
/// Independent of M (a row tuned at one M serves others by nearest-M): the
/// shared memory is checked for the larger launch, two 8-row tiles of A.
inline const char* resolve_skinny_mma(int64_t n, int64_t k, const int64_t* params, int64_t smem_optin, int cc_major,
                                      SkinnyMma* out) {
  const int64_t rt = params[kSkinnyMmaRowTiles], sk = params[kSkinnyMmaSplitK];
  const int64_t st = params[kSkinnyMmaStages], ck = params[kSkinnyMmaCluster];
  const int64_t wn = params[kSkinnyMmaWarpsN];
  if (rt != 1 && rt != 2) return "row_tiles must be 1 or 2";
  if (sk != 1 && sk != 2 && sk != 4 && sk != 8) return "split_k must be 1, 2, 4 or 8";
  if (st != 3 && st != 4 && st != 6) return "num_stages must be 3, 4 or 6";
  if (ck != 1 && ck != 2 && ck != 4) return "cluster_k must be 1, 2 or 4";
  if (wn != 1 && wn != 2 && wn != 4) return "warps_n must be 1, 2 or 4";
  if (sk * wn > 8) return "split_k x warps_n must be <= 8 (warps per block)";
  if (k % 8 != 0) return "K must be a multiple of 8 (16-byte loads)";
  if (n < 1 || k < 1) return "N and K must be >= 1";
  if (ck > 1 && cc_major > 0 && cc_major < 9)
    return "cluster_k > 1 needs thread-block clusters (compute capability 9.0)";
  if (smem_optin > 0 && skinny_mma_smem_bytes(static_cast<int>(rt), 2, static_cast<int>(st), static_cast<int>(sk),
                                              static_cast<int>(wn), static_cast<int>(ck)) > smem_optin)
    return "split_k x num_stages x stage bytes exceed the device's shared memory per block";
  out->row_tiles = static_cast<int>(rt);
  out->split_k = static_cast<int>(sk);
  out->stages = static_cast<int>(st);
  out->cluster_k = static_cast<int>(ck);
  out->warps_n = static_cast<int>(wn);
  return nullptr;
}

// ------------------------------------------------------------------ tiled (CUDA)

inline constexpr int64_t kTiledBlockMValues[] = {64, 128, 256};
inline constexpr int64_t kTiledBlockNValues[] = {64, 128, 256};
inline constexpr int64_t kTiledBlockKValues[] = {32, 64};
inline constexpr int64_t kTiledWarpsValues[] = {4, 8};
inline constexpr int64_t kTiledStagesValues[] = {2, 3, 4};
inline constexpr int64_t kTiledSplitKValues[] = {1, 2, 4};
/// Param slots of the tiled family.
inline constexpr int kTiledBM = 0, kTiledBN = 1, kTiledBK = 2, kTiledWarps = 3, kTiledStages = 4, kTiledSplitK = 5;

/// The compiled block shapes (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K,
/// num_warps); each is compiled for num_stages 2, 3 and 4.
struct TiledShape {
  int bm, bn, bk, warps;
};
inline constexpr TiledShape kTiledShapes[] = {
    {128, 128, 32, 4}, {128, 128, 32, 8}, {128, 256, 32, 8}, {256, 128, 32, 8},
    {64, 128, 32, 4},  {128, 64, 32, 4},  {64, 64, 64, 4},
};
inline constexpr int kTiledShapeCount = 7;
inline constexpr int kTiledStageCount = 3;  // 2, 3, 4
/// Kernels per input dtype (the split-K reduction kernel not counted).
inline constexpr int kTiledKernels = kTiledShapeCount * kTiledStageCount;

constexpr int tiled_shape_index(int64_t bm, int64_t bn, int64_t bk, int64_t warps) {
  for (int i = 0; i < kTiledShapeCount; ++i)
    if (kTiledShapes[i].bm == bm && kTiledShapes[i].bn == bn && kTiledShapes[i].bk == bk &&
        kTiledShapes[i].warps == warps)
      return i;
  return -1;
}
constexpr int tiled_kernel_index(int shape, int64_t stages) {
  return shape < 0 || stages < 2 || stages > 4 ? -1 : shape * kTiledStageCount + static_cast<int>(stages - 2);
}
/// Shared memory of one block (bytes): the A and B stage buffers (2-byte
/// elements). The launcher opts in to > 48 KiB where needed.
constexpr int64_t tiled_smem_bytes(int64_t bm, int64_t bn, int64_t bk, int64_t stages) {
  return stages * (bm + bn) * bk * 2;
}

/// A tiled launch, resolved.
struct Tiled {
  int shape = 0;  ///< index into kTiledShapes
  int bm = 0, bn = 0, bk = 0, warps = 0, stages = 0, split_k = 1;
  int kernel = 0;  ///< tiled_kernel_index
};

/// Resolves tiled params for (N, K); nullptr when accepted, else why not.
/// The smem limit is the device's opt-in maximum per block (0 = unknown:
/// 227 KiB, an H100/H200).
inline const char* resolve_tiled(int64_t n, int64_t k, const int64_t* params, int64_t smem_optin, Tiled* out) {
  const int shape = tiled_shape_index(params[kTiledBM], params[kTiledBN], params[kTiledBK], params[kTiledWarps]);
  if (shape < 0) return "(BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, num_warps) is not a compiled block shape";
  const int64_t st = params[kTiledStages], sk = params[kTiledSplitK];
  if (st < 2 || st > 4) return "num_stages must be 2, 3 or 4";
  if (sk != 1 && sk != 2 && sk != 4) return "split_k must be 1, 2 or 4";
  if (k % 8 != 0) return "K must be a multiple of 8 (16-byte cp.async)";
  if (n < 1 || k < 1) return "N and K must be >= 1";
  const int64_t limit = smem_optin > 0 ? smem_optin : 227 * 1024;
  if (tiled_smem_bytes(params[kTiledBM], params[kTiledBN], params[kTiledBK], st) > limit)
    return "the stages do not fit the device's shared memory";
  // Each split must get at least one K-tile.
  if (sk > 1 && k < sk * params[kTiledBK]) return "split_k leaves a split without a K-tile";
  out->shape = shape;
  out->bm = static_cast<int>(params[kTiledBM]);
  out->bn = static_cast<int>(params[kTiledBN]);
  out->bk = static_cast<int>(params[kTiledBK]);
  out->warps = static_cast<int>(params[kTiledWarps]);
  out->stages = static_cast<int>(st);
  out->split_k = static_cast<int>(sk);
  out->kernel = tiled_kernel_index(shape, st);
  return nullptr;
}

/// Workspace (bytes) a tiled launch needs: the fp32 partial tiles of split_k
/// > 1 (split_k x M x N x 4), 0 without split-K.
constexpr int64_t tiled_workspace_bytes(int64_t m, int64_t n, int split_k) {
  return split_k > 1 ? int64_t{split_k} * m * n * 4 : 0;
}

// ------------------------------------------------------------------ wgmma (CUDA, sm_90a)

inline constexpr int64_t kWgmmaBlockNValues[] = {128, 256};
inline constexpr int64_t kWgmmaStagesValues[] = {3, 4, 5, 6};
inline constexpr int64_t kWgmmaGroupMValues[] = {8, 16};
/// Param slots of the wgmma family.
inline constexpr int kWgmmaBN = 0, kWgmmaStages = 1, kWgmmaGroupM = 2;
/// Kernels per input dtype: BLOCK_SIZE_N 128 (index 0) and 256 (index 1).
inline constexpr int kWgmmaKernels = 2;
inline constexpr int kWgmmaBM = 128, kWgmmaBK = 64;

/// Shared memory of one block (bytes): 1024 bytes of alignment slack, the A
/// and B stages (2-byte elements), two mbarriers a stage.
constexpr int64_t wgmma_smem_bytes(int64_t bn, int64_t stages) {
  return 1024 + stages * (kWgmmaBM + bn) * kWgmmaBK * 2 + 16 * stages;
}

/// A wgmma launch, resolved.
struct Wgmma {
  int bn = 0, stages = 0, group_m = 0;
  int kernel = 0;  ///< 0: BLOCK_SIZE_N 128, 1: 256
};

/// Resolves wgmma params for (N, K); nullptr when accepted, else why not.
/// The smem limit as for resolve_tiled.
inline const char* resolve_wgmma(int64_t n, int64_t k, const int64_t* params, int64_t smem_optin, Wgmma* out) {
  const int64_t bn = params[kWgmmaBN], st = params[kWgmmaStages], g = params[kWgmmaGroupM];
  if (bn != 128 && bn != 256) return "BLOCK_SIZE_N must be 128 or 256";
  if (st < 3 || st > 6) return "num_stages must be 3, 4, 5 or 6";
  if (g != 8 && g != 16) return "GROUP_SIZE_M must be 8 or 16";
  if (n < 1 || k < 1) return "N and K must be >= 1";
  if (k % 8 != 0) return "K must be a multiple of 8 (the TMA's 16-byte row stride)";
  const int64_t limit = smem_optin > 0 ? smem_optin : 227 * 1024;
  if (wgmma_smem_bytes(bn, st) > limit) return "the stages do not fit the device's shared memory";
  out->bn = static_cast<int>(bn);
  out->stages = static_cast<int>(st);
  out->group_m = static_cast<int>(g);
  out->kernel = bn == 256 ? 1 : 0;
  return nullptr;
}

}  // namespace dispatch::gpu::gemm
