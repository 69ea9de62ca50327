// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the "tiled" tensor-core GEMM family (contract:
// gpu/gemm_plan.hpp): D[M,N] = A[M,K] · B[N,K]^T (+ bias[N]), A and B bf16 or
// fp16 (one translation unit per input dtype, KDISPATCH_GEMM_TILED_TU), D the
// input dtype or fp32 (a runtime branch of the epilogue), fp32 accumulation.
// sm_80+ instructions only (mma.sync, ldmatrix, cp.async); built as sm_90a
// SASS + compute_90 PTX. CUDA only.
//
// Block, warps. A block computes a BM x BN tile of D with WARPS warps laid
// out WM x WN (warp w: row w / WN, column w % WN); each warp owns a
// WTM x WTN = (BM / WM) x (BN / WN) sub-tile, i.e. MI = WTM / 16 by
// NI = WTN / 8 mma tiles of 16 x 8, MI * NI * 4 fp32 accumulators per lane:
//   128x128 4 warps: 2x2, 64x64      128x128 8 warps: 2x4, 64x32
//   128x256 8 warps: 2x4, 64x64      256x128 8 warps: 4x2, 64x64
//    64x128 4 warps: 2x2, 32x64      128x64  4 warps: 2x2, 64x32
//    64x64  4 warps: 2x2, 32x32 (BK 64)
// The grid is 1-D over the tiles, grouped by 8 M-tiles (Triton's
// GROUP_SIZE_M order: consecutive blocks share B tiles and a few A tiles in
// L2); blockIdx.z is the split-K index.
//
// Shared memory (dynamic, tiled_smem_bytes = STAGES * (BM + BN) * BK * 2):
// STAGES A stages [BM][BK], then STAGES B stages [BN][BK] (B as stored, one
// row per column n of D, K contiguous). A row is BK / 8 = CPR 16-byte chunks;
// chunk c of row r lives at chunk position c ^ swz(r) of that row, with
//   swz(r) = r % 8           (BK 64: 128-byte rows)
//   swz(r) = (r / 2) % 4     (BK 32: 64-byte rows, two rows per 128 bytes)
// so the 8 row addresses of one ldmatrix 8x8 matrix (8 consecutive rows, one
// chunk column) and the 8 chunks one phase of a cp.async wave writes fall in
// 8 distinct 16-byte bank groups: no bank conflicts either way.
//
// Pipeline. cp.async.cg 16 B global -> shared, src-size 0 (zero fill) for rows
// >= M (A) or >= N (B) and for the chunks past K (K % 8 == 0, so a chunk is
// all in or all out; the tail K-tile is zero-filled). The prologue issues
// K-tiles 0..STAGES-2, one commit group each (always committed, possibly
// empty, so the group arithmetic holds). Main loop over the split's K-tiles,
// BK / 16 k-steps each, fragments double-buffered in registers: at k-step ks
// the fragments of ks + 1 are read (ldmatrix) while the mma of ks run; at
// ks == 0 the loads of K-tile it + STAGES - 1 are issued into the stage read
// during the previous K-tile; at the last k-step cp.async.wait_group
// <STAGES-2> + __syncthreads make the next K-tile visible (and order the
// reads of the stage about to be overwritten before its refill) before its
// first fragments are read.
//
// Fragments (mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}; g = lane / 4,
// t = lane % 4; a 32-bit register holds two consecutive k):
//   A (16 x 16, rows m, k): a0 = A[g][2t..], a1 = A[g+8][2t..],
//     a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]. ldmatrix.x4: lanes 8i..8i+7
//     give the row addresses of matrix i = rows (i % 2) * 8 + lane % 8, k
//     chunk i / 2; matrix i lands in register i, thread lane holding row
//     lane / 4, elements 2 (lane % 4) + {0, 1}: exactly a0..a3.
//   B (16 x 8, k x n, "col"): b0 = B[k = 2t..][n = g], b1 = B[k = 2t+8..][n = g].
//     B is stored n-major (Bs[n][k]), so a non-transposed ldmatrix of 8 rows
//     n (k chunk c) gives thread lane Bs[n0 + lane / 4][8c + 2 (lane % 4)..]:
//     b0 for chunk 2ks, b1 for chunk 2ks + 1. One ldmatrix.x4 serves two n8
//     tiles: matrix i = rows n0 + (i / 2) * 8 + lane % 8, chunk i % 2 ->
//     {b[2j][0], b[2j][1], b[2j+1][0], b[2j+1][1]}.
//   C: c0, c1 = D[g][2t, 2t+1], c2, c3 = D[g+8][2t, 2t+1] of the 16 x 8 tile.
//
// Epilogue. split_k == 1: acc (+ bias[col], the dtype of D) converted and
// stored from the registers, predicated on row < M, col < N; a pair of
// columns is stored as one 4- or 8-byte access when D's pointer and ldd
// allow it, else element by element. split_k > 1: split s covers K-tiles
// [s * kt / split_k, (s + 1) * kt / split_k) and stores its fp32 partial tile
// (no bias) to workspace[s][M][N] (dense, row stride N); a second kernel sums
// the splits in the order 0..split_k-1 (deterministic), adds the bias,
// converts and stores D. Every kernel starts with
// grid_dependency_wait_and_release (programmatic dependent launch).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/backend_decls.hpp"
#include "gpu/gemm_launch.hpp"
#include "gpu/gemm_plan.hpp"
#include "gpu/launch_util.hpp"
#include "ops/gemm.hpp"

#if KDISPATCH_GPU_HIP
#error "kernels/cuda/gemm_tiled.cuh is CUDA only"
#endif

namespace dispatch::KDISPATCH_GPU_NS::gemm_tiled {

/// Kernel parameters, by value.
struct Args {
  const uint16_t* a;  ///< [M][lda], 16-byte aligned rows
  const uint16_t* b;  ///< [N][ldb], 16-byte aligned rows
  void* d;            ///< [M][ldd], the output dtype (split_k == 1)
  const void* bias;   ///< [N] or null, the output dtype (split_k == 1)
  float* ws;          ///< [split_k][M][N] fp32 partials (split_k > 1)
  int64_t lda, ldb, ldd;
  int32_t m, n, k;
  int32_t tiles_m, tiles_n;
  int32_t k_tiles;  ///< ceil(K / BK)
  int32_t split_k;
  int32_t out_fp32;  ///< D (and bias) fp32, else the input dtype
  int32_t d_vec2;    ///< two consecutive D elements may be stored as one access
  int32_t ws_vec2;   ///< the same for the workspace
};

/// Split-K reduction parameters.
struct ReduceArgs {
  const float* ws;
  void* d;
  const void* bias;
  int64_t ldd;
  int32_t m, n, split_k;
  int32_t out_fp32;
  int32_t ws_vec4;  ///< N % 4 == 0 and the workspace 16-byte aligned
  int32_t d_vec4;   ///< four consecutive D elements may be stored as one access
};

inline constexpr int kGroupM = 8;           ///< M-tiles per group of the tile order
inline constexpr int kReduceThreads = 256;  ///< split-K reduction block
/// Largest M, N, K: the kernels index rows, columns and K in int32 (a tile
/// edge past M, N or K must not overflow).
inline constexpr int64_t kMaxDim = INT_MAX - 1024;

/// Warps along M of a block shape (see the table at the top).
__host__ __device__ constexpr int warps_m(int bm, int bn, int warps) { return warps == 4 ? 2 : (bm >= 2 * bn ? 4 : 2); }

// ------------------------------------------------------------------ device helpers

KDISPATCH_DEVICE_INLINE uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

/// 16 bytes global -> shared, bypassing L1 (with a 128-byte L2 prefetch hint);
/// zero-filled when !valid (src-size 0: nothing is read).
KDISPATCH_DEVICE_INLINE void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n) : "memory");
}
KDISPATCH_DEVICE_INLINE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
KDISPATCH_DEVICE_INLINE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

KDISPATCH_DEVICE_INLINE void ldmatrix_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

/// c += a · b on one 16 x 8 x 16 tile, fp32 accumulation.
template <DType DT>
KDISPATCH_DEVICE_INLINE void mma16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (DT == DType::bf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

/// The 16-bit output element of input dtype DT.
template <DType DT>
struct Half {
  static KDISPATCH_DEVICE_INLINE float widen(uint16_t u) {
    if constexpr (DT == DType::bf16)
      return port::bits_to_float(static_cast<uint32_t>(u) << 16);
    else
      return port::fp16x2_to_float2(static_cast<uint32_t>(u)).x;
  }
  /// Two floats -> two 16-bit values (x in the low half), round to nearest even.
  static KDISPATCH_DEVICE_INLINE uint32_t pack2(float x, float y) {
    if constexpr (DT == DType::bf16)
      return port::float2_to_bf16x2(x, y);
    else
      return port::float2_to_fp16x2(x, y);
  }
};

/// The output element: fp32 (OutF32) or the 16-bit input dtype.
template <DType DT, bool OutF32>
struct Out {
  using T = typename std::conditional<OutF32, float, uint16_t>::type;
  static KDISPATCH_DEVICE_INLINE float load(const T* p) {
    if constexpr (OutF32)
      return *p;
    else
      return Half<DT>::widen(*p);
  }
  /// q[0] = x and, when `two`, q[1] = y; one access when `two && vec`.
  static KDISPATCH_DEVICE_INLINE void store2(T* q, float x, float y, bool two, bool vec) {
    if constexpr (OutF32) {
      if (two && vec) {
        *reinterpret_cast<float2*>(q) = make_float2(x, y);
      } else {
        q[0] = x;
        if (two) q[1] = y;
      }
    } else {
      const uint32_t u = Half<DT>::pack2(x, y);
      if (two && vec) {
        *reinterpret_cast<uint32_t*>(q) = u;
      } else {
        q[0] = static_cast<uint16_t>(u & 0xffffu);
        if (two) q[1] = static_cast<uint16_t>(u >> 16);
      }
    }
  }
  /// q[0..3] = v[0..3]; one access when `vec` (q then aligned to 4 elements).
  static KDISPATCH_DEVICE_INLINE void store4(T* q, const float (&v)[4], bool vec) {
    if (vec) {
      if constexpr (OutF32) {
        *reinterpret_cast<float4*>(q) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
        *reinterpret_cast<uint2*>(q) = make_uint2(Half<DT>::pack2(v[0], v[1]), Half<DT>::pack2(v[2], v[3]));
      }
    } else {
      store2(q, v[0], v[1], true, false);
      store2(q + 2, v[2], v[3], true, false);
    }
  }
};

/// The split-K-free epilogue: acc + bias, converted, stored to D.
template <DType DT, bool OutF32, int MI, int NI>
KDISPATCH_DEVICE_INLINE void store_d(const Args& p, const float (&acc)[MI][NI][4], int row0, int col0) {
  using O = Out<DT, OutF32>;
  using T = typename O::T;
  T* d = static_cast<T*>(p.d);
  const T* bias = static_cast<const T*>(p.bias);
  const bool vec = p.d_vec2 != 0;
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
    const int col = col0 + ni * 8;
    if (col >= p.n) continue;
    const bool two = col + 1 < p.n;
    float b0 = 0.f, b1 = 0.f;
    if (bias != nullptr) {
      b0 = O::load(bias + col);
      if (two) b1 = O::load(bias + col + 1);
    }
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + mi * 16 + h * 8;
        if (row >= p.m) continue;
        O::store2(d + static_cast<int64_t>(row) * p.ldd + col, acc[mi][ni][2 * h] + b0, acc[mi][ni][2 * h + 1] + b1,
                  two, vec);
      }
    }
  }
}

/// The split-K epilogue: the fp32 partial tile of split `split` to the workspace.
template <int MI, int NI>
KDISPATCH_DEVICE_INLINE void store_partial(const Args& p, const float (&acc)[MI][NI][4], int split, int row0,
                                           int col0) {
  float* ws = p.ws + static_cast<int64_t>(split) * p.m * p.n;
  const bool vec = p.ws_vec2 != 0;
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) {
    const int col = col0 + ni * 8;
    if (col >= p.n) continue;
    const bool two = col + 1 < p.n;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + mi * 16 + h * 8;
        if (row >= p.m) continue;
        Out<DType::fp32, true>::store2(ws + static_cast<int64_t>(row) * p.n + col, acc[mi][ni][2 * h],
                                       acc[mi][ni][2 * h + 1], two, vec);
      }
    }
  }
}

// tiled_kernel's pieces (forced inline; the kernel compiles to the SASS it
// had in one piece, checked with ptxas when it was split).

/// The epilogue of tiled_kernel: the partial tile to the workspace
/// (split_k > 1) or acc + bias to D.
template <DType DT, int MI, int NI>
KDISPATCH_DEVICE_INLINE void store_tile(const Args& p, const float (&acc)[MI][NI][4], int split, int row0, int col0) {
  if (p.split_k > 1)
    store_partial<MI, NI>(p, acc, split, row0, col0);
  else if (p.out_fp32)
    store_d<DT, true, MI, NI>(p, acc, row0, col0);
  else
    store_d<DT, false, MI, NI>(p, acc, row0, col0);
}

/// The prologue and the main loop of tiled_kernel over the split's K-tiles
/// [kt_begin, kt_begin + num_kt): `load_tile(kt, stage)` issues the copies of
/// a K-tile, `load_frags(buf, stage, ks)` reads the fragments of a k-step
/// into af[buf] and bf[buf]; the products accumulate in acc.
template <DType DT, int MI, int NI, int KSTEPS, int STAGES, class LoadTile, class LoadFrags>
KDISPATCH_DEVICE_INLINE void pipeline(float (&acc)[MI][NI][4], uint32_t (&af)[2][MI][4], uint32_t (&bf)[2][NI][2],
                                      const LoadTile& load_tile, const LoadFrags& load_frags, int kt_begin,
                                      int num_kt) {
  // Prologue: K-tiles 0..STAGES-2 in flight, one commit group each.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < num_kt) load_tile(kt_begin + s, s);
    cp_async_commit();
  }
  cp_async_wait<STAGES - 2>();
  __syncthreads();

  int read_stage = 0, write_stage = STAGES - 1;
  load_frags(0, 0, 0);

#pragma unroll 1
  for (int it = 0; it < num_kt; ++it) {
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
      if (ks == KSTEPS - 1) {
        // K-tile it + 1 landed (its group and all before it) and every warp
        // is done reading the stage that the next refill overwrites.
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        read_stage = read_stage + 1 == STAGES ? 0 : read_stage + 1;
      }
      load_frags((ks + 1) & 1, read_stage, (ks + 1) % KSTEPS);
      if (ks == 0) {
        if (it + STAGES - 1 < num_kt) load_tile(kt_begin + it + STAGES - 1, write_stage);
        cp_async_commit();
        write_stage = write_stage + 1 == STAGES ? 0 : write_stage + 1;
      }
#pragma unroll
      for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
          const int nn = (mi & 1) ? NI - 1 - ni : ni;  // serpentine: reuse the B registers
          mma16816<DT>(acc[mi][nn], af[ks & 1][mi], bf[ks & 1][nn]);
        }
    }
  }
}

// ------------------------------------------------------------------ the GEMM kernel

template <DType DT, int BM, int BN, int BK, int WARPS, int STAGES>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(WARPS * 32, 1) tiled_kernel(Args p) {
  constexpr int T = WARPS * 32;
  constexpr int WM = warps_m(BM, BN, WARPS), WN = WARPS / WM;
  constexpr int WTM = BM / WM, WTN = BN / WN;  // warp tile
  constexpr int MI = WTM / 16, NI = WTN / 8;   // mma tiles per warp
  constexpr int CPR = BK / 8;                  // 16-byte chunks per shared row
  constexpr int KSTEPS = BK / 16;
  constexpr int ROW_BYTES = BK * 2;
  constexpr int A_STAGE = BM * ROW_BYTES, B_STAGE = BN * ROW_BYTES;
  constexpr int A_ITERS = BM * CPR / T, B_ITERS = BN * CPR / T;
  constexpr int RSTEP = T / CPR;  // rows between one thread's successive chunks
  static_assert(WM * WN == WARPS && WTM * WM == BM && WTN * WN == BN, "warp layout");
  static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tile: 16-row A and 16-column B ldmatrix.x4 steps");
  static_assert(CPR == 4 || CPR == 8, "BLOCK_SIZE_K 32 or 64");
  static_assert(KSTEPS % 2 == 0, "fragment double buffer: an even number of k-steps per K-tile");
  static_assert(T % CPR == 0 && RSTEP % 8 == 0, "a thread's chunks share one swizzle");
  static_assert(A_ITERS * T == BM * CPR && B_ITERS * T == BN * CPR, "the load waves cover the tiles");
  static_assert(STAGES >= 2, "at least two stages");

  extern __shared__ __align__(128) unsigned char smem[];
  port::grid_dependency_wait_and_release();

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WN, wn = warp % WN;

  // Tile of this block: groups of kGroupM M-tiles, column-major inside a group.
  const int pid = static_cast<int>(blockIdx.x);
  const int in_group = kGroupM * p.tiles_n;
  const int first_m = (pid / in_group) * kGroupM;
  const int group_m = min(p.tiles_m - first_m, kGroupM);
  const int pid_m = first_m + (pid % in_group) % group_m;
  const int pid_n = (pid % in_group) / group_m;
  const int m0 = pid_m * BM, n0 = pid_n * BN;

  // K-tiles of this split.
  const int split = static_cast<int>(blockIdx.z);
  const int kt_begin = static_cast<int>(static_cast<int64_t>(split) * p.k_tiles / p.split_k);
  const int kt_end = static_cast<int>(static_cast<int64_t>(split + 1) * p.k_tiles / p.split_k);
  const int num_kt = kt_end - kt_begin;

  const uint32_t s_a = smem_u32(smem);
  const uint32_t s_b = s_a + STAGES * A_STAGE;

  // Global -> shared: thread tid copies chunk ld_c of rows ld_row + i * RSTEP.
  const int ld_row = tid / CPR, ld_c = tid % CPR;
  const int ld_swz = CPR == 8 ? (ld_row & 7) : ((ld_row >> 1) & 3);
  const uint32_t st_off = static_cast<uint32_t>(ld_row * ROW_BYTES + ((ld_c ^ ld_swz) << 4));
  const int k_chunk = ld_c * 8;
  uint32_t a_rows_ok = 0, b_rows_ok = 0;
#pragma unroll
  for (int i = 0; i < A_ITERS; ++i)
    if (m0 + ld_row + i * RSTEP < p.m) a_rows_ok |= 1u << i;
#pragma unroll
  for (int i = 0; i < B_ITERS; ++i)
    if (n0 + ld_row + i * RSTEP < p.n) b_rows_ok |= 1u << i;
  const uint16_t* a_src = p.a + (a_rows_ok & 1u ? static_cast<int64_t>(m0 + ld_row) * p.lda + k_chunk : 0);
  const uint16_t* b_src = p.b + (b_rows_ok & 1u ? static_cast<int64_t>(n0 + ld_row) * p.ldb + k_chunk : 0);
  const int64_t a_step = static_cast<int64_t>(RSTEP) * p.lda, b_step = static_cast<int64_t>(RSTEP) * p.ldb;

  auto load_tile = [&](int kt, int stage) {
    const int kk = kt * BK;
    const bool k_ok = kk + k_chunk < p.k;
    const uint32_t da = s_a + static_cast<uint32_t>(stage * A_STAGE) + st_off;
    const uint32_t db = s_b + static_cast<uint32_t>(stage * B_STAGE) + st_off;
#pragma unroll
    for (int i = 0; i < A_ITERS; ++i) {
      const bool ok = k_ok && ((a_rows_ok >> i) & 1u);
      cp_async16(da + i * RSTEP * ROW_BYTES, ok ? a_src + i * a_step + kk : p.a, ok);
    }
#pragma unroll
    for (int i = 0; i < B_ITERS; ++i) {
      const bool ok = k_ok && ((b_rows_ok >> i) & 1u);
      cp_async16(db + i * RSTEP * ROW_BYTES, ok ? b_src + i * b_step + kk : p.b, ok);
    }
  };

  // Shared -> registers (ldmatrix.x4), see the fragment notes at the top.
  const int j8 = lane & 7;
  const int f_swz = CPR == 8 ? j8 : (j8 >> 1);  // swz() of every row this lane addresses
  const uint32_t a_ld = static_cast<uint32_t>((wm * WTM + j8 + ((lane >> 3) & 1) * 8) * ROW_BYTES);
  const uint32_t b_ld = static_cast<uint32_t>((wn * WTN + j8 + ((lane >> 4) & 1) * 8) * ROW_BYTES);
  const int a_cx = (lane >> 4) ^ f_swz;        // chunk 2ks + (lane>>4), swizzled: (2ks) ^ a_cx
  const int b_cx = ((lane >> 3) & 1) ^ f_swz;  // chunk 2ks + ((lane>>3)&1), swizzled: (2ks) ^ b_cx

  uint32_t af[2][MI][4];
  uint32_t bf[2][NI][2];
  float acc[MI][NI][4];
#pragma unroll
  for (int mi = 0; mi < MI; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0.f;

  auto load_frags = [&](int buf, int stage, int ks) {
    const uint32_t pa =
        s_a + static_cast<uint32_t>(stage * A_STAGE) + a_ld + (static_cast<uint32_t>(a_cx ^ (2 * ks)) << 4);
    const uint32_t pb =
        s_b + static_cast<uint32_t>(stage * B_STAGE) + b_ld + (static_cast<uint32_t>(b_cx ^ (2 * ks)) << 4);
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
      ldmatrix_x4(af[buf][mi][0], af[buf][mi][1], af[buf][mi][2], af[buf][mi][3], pa + mi * 16 * ROW_BYTES);
#pragma unroll
    for (int nj = 0; nj < NI / 2; ++nj)
      ldmatrix_x4(bf[buf][2 * nj][0], bf[buf][2 * nj][1], bf[buf][2 * nj + 1][0], bf[buf][2 * nj + 1][1],
                  pb + nj * 16 * ROW_BYTES);
  };

  pipeline<DT, MI, NI, KSTEPS, STAGES>(acc, af, bf, load_tile, load_frags, kt_begin, num_kt);
  cp_async_wait<0>();  // only empty groups can be pending here

  const int row0 = m0 + wm * WTM + (lane >> 2);
  const int col0 = n0 + wn * WTN + 2 * (lane & 3);
  store_tile<DT, MI, NI>(p, acc, split, row0, col0);
#else
  __trap();  // compiled for sm_80+ only
#endif
}

// ------------------------------------------------------------------ split-K reduction

template <DType DT, bool OutF32>
KDISPATCH_DEVICE_INLINE void reduce_body(const ReduceArgs& r) {
  using O = Out<DT, OutF32>;
  using T = typename O::T;
  T* d = static_cast<T*>(r.d);
  const T* bias = static_cast<const T*>(r.bias);
  const int64_t mn = static_cast<int64_t>(r.m) * r.n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r.ws_vec4) {  // N % 4 == 0: four consecutive elements of one row
    const int64_t items = mn / 4;
    const float4* ws = reinterpret_cast<const float4*>(r.ws);
    for (; i < items; i += stride) {
      float4 s = ws[i];
      for (int sp = 1; sp < r.split_k; ++sp) {
        const float4 v = ws[sp * (mn / 4) + i];
        s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
      }
      const int64_t row = (i * 4) / r.n;
      const int col = static_cast<int>(i * 4 - row * r.n);
      float v[4] = {s.x, s.y, s.z, s.w};
      if (bias != nullptr) {
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] += O::load(bias + col + j);
      }
      O::store4(d + row * r.ldd + col, v, r.d_vec4 != 0);
    }
  } else {
    for (; i < mn; i += stride) {
      float s = r.ws[i];
      for (int sp = 1; sp < r.split_k; ++sp) s += r.ws[sp * mn + i];
      const int64_t row = i / r.n;
      const int col = static_cast<int>(i - row * r.n);
      if (bias != nullptr) s += O::load(bias + col);
      O::store2(d + row * r.ldd + col, s, 0.f, false, false);
    }
  }
}

template <DType DT>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kReduceThreads) splitk_reduce_kernel(ReduceArgs r) {
  port::grid_dependency_wait_and_release();
  if (r.out_fp32)
    reduce_body<DT, true>(r);
  else
    reduce_body<DT, false>(r);
}

// ------------------------------------------------------------------ host side

using KernelFn = void (*)(Args);

/// The kernel of tiled_kernel_index KI: shape KI / 3, num_stages KI % 3 + 2.
template <DType DT, int KI>
constexpr KernelFn kernel_at() {
  constexpr gpu::gemm::TiledShape s = gpu::gemm::kTiledShapes[KI / gpu::gemm::kTiledStageCount];
  return &tiled_kernel<DT, s.bm, s.bn, s.bk, s.warps, KI % gpu::gemm::kTiledStageCount + 2>;
}

template <DType DT, int... I>
inline const KernelFn* kernel_table(std::integer_sequence<int, I...>) noexcept {
  static constexpr KernelFn t[] = {kernel_at<DT, I>()...};
  return t;
}

/// Every kernel of DT, in tiled_kernel_index order.
template <DType DT>
inline const KernelFn* kernels() noexcept {
  static_assert(gpu::gemm::kTiledKernels == gpu::gemm::kTiledShapeCount * 3, "num_stages 2, 3, 4");
  return kernel_table<DT>(std::make_integer_sequence<int, gpu::gemm::kTiledKernels>{});
}

/// Dynamic shared memory of kernel `ki` (bytes).
constexpr int smem_of(int ki) {
  const gpu::gemm::TiledShape s = gpu::gemm::kTiledShapes[ki / gpu::gemm::kTiledStageCount];
  return static_cast<int>(gpu::gemm::tiled_smem_bytes(s.bm, s.bn, s.bk, ki % gpu::gemm::kTiledStageCount + 2));
}

using core::needs_fallback;  // kNeedsFallbackCode: the call runs get_default's plan

inline bool aligned_to(const void* p, uintptr_t n) noexcept { return (reinterpret_cast<uintptr_t>(p) % n) == 0; }

/// Enqueues the GEMM (and, for split_k > 1, the reduction) on la.stream.
template <DType DT>
Status launch(const gpu::gemm::Tiled& t, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  using namespace gpu::gemm;
  const void* const A = la.data[core::kGemmArgA];
  const void* const B = la.data[core::kGemmArgB];
  void* const D = la.data[core::kGemmArgD];
  const void* const bias = la.data[core::kGemmArgBias];
  const int64_t lda = la.ld[core::kGemmArgA], ldb = la.ld[core::kGemmArgB], ldd = la.ld[core::kGemmArgD];
  if (t.kernel < 0 || t.kernel >= kTiledKernels)
    return make_status(StatusCode::invalid_argument, "gemm tiled: kernel index out of range");
  if (t.split_k != 1 && t.split_k != 2 && t.split_k != 4)
    return make_status(StatusCode::invalid_argument, "gemm tiled: split_k must be 1, 2 or 4");
  static_assert(kMaxDim == int64_t{INT32_MAX} - 1024, "check_tile_gemm_call's limit");
  bool nothing = false;
  if (Status s = check_tile_gemm_call(la, p, DT, "gemm tiled", &nothing); !s.ok() || nothing) return s;
  if ((p.m > 1 && lda % 8 != 0) || (p.n > 1 && ldb % 8 != 0))
    return needs_fallback("gemm tiled: lda and ldb must be multiples of 8 elements");

  const int ki = t.kernel;
  const TiledShape& s = kTiledShapes[ki / kTiledStageCount];
  const int split = t.split_k;
  const bool out_f32 = p.out_dtype == DType::fp32;
  const int64_t esize = out_f32 ? 4 : 2;
  const int64_t tiles_m = (p.m + s.bm - 1) / s.bm, tiles_n = (p.n + s.bn - 1) / s.bn;
  if (tiles_m * tiles_n > INT_MAX || tiles_n * kGroupM > INT_MAX)
    return make_status(StatusCode::unsupported_problem, "gemm tiled: too many tiles for one grid");
  if (split > 1 && (la.workspace == nullptr || la.workspace_bytes < tiled_workspace_bytes(p.m, p.n, split)))
    return needs_fallback("gemm tiled: split_k needs a workspace of split_k * M * N * 4 bytes");

  Args a;
  a.a = static_cast<const uint16_t*>(A);
  a.b = static_cast<const uint16_t*>(B);
  a.d = D;
  a.bias = bias;
  a.ws = static_cast<float*>(la.workspace);
  a.lda = lda;
  a.ldb = ldb;
  a.ldd = ldd;
  a.m = static_cast<int32_t>(p.m);
  a.n = static_cast<int32_t>(p.n);
  a.k = static_cast<int32_t>(p.k);
  a.tiles_m = static_cast<int32_t>(tiles_m);
  a.tiles_n = static_cast<int32_t>(tiles_n);
  a.k_tiles = static_cast<int32_t>((p.k + s.bk - 1) / s.bk);
  a.split_k = split;
  a.out_fp32 = out_f32 ? 1 : 0;
  a.d_vec2 = (ldd % 2 == 0 || p.m == 1) && aligned_to(D, 2 * esize) ? 1 : 0;
  a.ws_vec2 = p.n % 2 == 0 && aligned_to(la.workspace, 8) ? 1 : 0;

  const port::Stream stream = static_cast<port::Stream>(la.stream);
  DeviceGuard guard(p.device.ordinal);
  const bool pdl = pdl_enabled(p.device.ordinal);
  const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), 1, static_cast<unsigned>(split));
  const dim3 block(static_cast<unsigned>(s.warps * 32));
  port::Error e = port::launch_smem(kernels<DT>()[ki], grid, block, static_cast<size_t>(smem_of(ki)), stream, pdl, a);
  if (e != port::kSuccess || split == 1) return port::status(e, "gemm tiled kernel launch");

  ReduceArgs r;
  r.ws = a.ws;
  r.d = D;
  r.bias = bias;
  r.ldd = ldd;
  r.m = a.m;
  r.n = a.n;
  r.split_k = split;
  r.out_fp32 = a.out_fp32;
  r.ws_vec4 = p.n % 4 == 0 && aligned16(la.workspace) ? 1 : 0;
  r.d_vec4 = (ldd % 4 == 0 || p.m == 1) && aligned_to(D, 4 * esize) ? 1 : 0;
  const int64_t items = r.ws_vec4 ? p.m * p.n / 4 : p.m * p.n;
  const int64_t blocks = std::min<int64_t>((items + kReduceThreads - 1) / kReduceThreads, int64_t{1} << 20);
  e = port::launch_smem(splitk_reduce_kernel<DT>, dim3(static_cast<unsigned>(blocks)), dim3(kReduceThreads), 0, stream,
                        pdl, r);
  return port::status(e, "gemm tiled split-K reduction launch");
}

/// Fills out[tiled_kernel_index] for every kernel of DT on the current device
/// and raises each one's dynamic shared memory limit to what it launches with.
template <DType DT>
void probe(KernelImage* out, const ProbeEnv&) noexcept {
  const KernelFn* k = kernels<DT>();
  for (int i = 0; i < gpu::gemm::kTiledKernels; ++i) out[i] = image_with_smem(k[i], smem_of(i));
}

}  // namespace dispatch::KDISPATCH_GPU_NS::gemm_tiled

/// The body of kernels/cuda/gemm_tiled_<dt>.cu: instantiates the tiled kernels
/// of one input dtype and defines its launcher and image probe.
#define KDISPATCH_GEMM_TILED_TU(dt) KDISPATCH_GEMM_FAMILY_TU(tiled, Tiled, gpu::gemm::kTiledKernels, dt)
