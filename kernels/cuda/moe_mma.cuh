// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — fused_moe's grouped tensor-core kernels (bf16 and
// fp16; mma.sync m16n8k16, sm_80+): the (token, choice) pairs sorted by
// expert, each expert's weight rows read once per tile of up to kMmaPairs of
// its pairs instead of once per pair (the per-pair kernels' cost when many
// tokens share an expert: decode at M >= 16, and prefill).
//
//   moe_sort_kernel    one block: the pairs per expert (ids outside [0, E)
//                      left out), the pairs in expert order, and the work
//                      list: one item (expert, first, count) per kMmaPairs
//                      of an expert's pairs.
//   moe_ring_kernel<DT, Up>  the up (Up) or down GEMM of the staged plans
//                      (the default), below: grid (row tile groups, max
//                      items), a block's 4 warps on 128 weight rows of the
//                      item's expert (up: 64 gate rows and their up rows),
//                      through a ring of 128-byte K chunks in shared memory.
//   moe_up_mma_kernel  (the direct plans) grid (ceil(I / (kMmaWarps * 16)),
//                      max items): warp w
//                      of block (slab, item) computes gate rows i0..i0+15 and
//                      up rows I+i0.. of the item's expert against its pairs'
//                      hidden rows, then a[p, i] = act(gate) * up, rounded to
//                      the dtype, into the workspace [P, I].
//   moe_down_mma_kernel grid (ceil(H / (kMmaWarps * 32)), max items): y[p, c]
//                      = w2[e][c] · a[p] in fp32 into the workspace [P, H].
//   moe_reduce_kernel  grid (M, ceil(H / 256)): out[t, c] = rsf * sum_j
//                      topk_weights[t, j] * y[(t, j), c] over the token's
//                      valid choices in order (deterministic).
// The multiply is transposed (swap-AB): 16 weight rows are mma's A operand,
// 8 pairs its B operand, so a tile of a few pairs still fills the
// instruction. The direct kernels: a lane loads 16 bytes (8 elements of K)
// of a weight row and of a token row per 32-element step straight into
// registers (mma_loop), and the mma's
// K order is permuted to match: for lane (g = lane / 4,
// q = lane % 4) the logical k pair {2q, 2q+1} of step s is the physical pair
// 8q + 4s + {0, 1} and {2q+8, 2q+9} is 8q + 4s + {2, 3} — one bijection of
// the step's 32 elements used by A and B alike, so the sums are those of the
// plain order. The ring kernels read plain-order fragments with ldmatrix.
// The pairs' order inside an item does not change any output:
// each pair's result is one column of the mma, summed over K in a fixed order.
#pragma once

#include "cuda/gemm_skinny_mma.cuh"  // mma<DT>
#include "gpu/elem.cuh"
#include "gpu/moe_kernels.cuh"

namespace dispatch::cuda::moe_mma {

inline constexpr int kMmaWarps = 4;                 ///< warps per block of the GEMM kernels
inline constexpr int kMmaThreads = kMmaWarps * 32;  ///< and their threads
inline constexpr int kMmaTiles = 4;                 ///< 8-pair mma tiles per item
inline constexpr int kMmaPairs = 8 * kMmaTiles;     ///< pairs per item
inline constexpr int kDownRowTiles = 2;             ///< 16-row tiles per warp of the down kernel
// The ring kernels (moe_ring_kernel, the "staged" plans): a stage holds 128
// bytes of K of each warp's 32 weight rows and of the item's kMmaPairs
// activation rows, plus (block fp8) the stage's scales.
inline constexpr int kRingStages = 3;
inline constexpr int kRingRowBytes = 128;
inline constexpr int kRingWeightRows = 32;  ///< per warp: up 16 gate + 16 up rows, down 2 tiles of 16
/// A stage of the ring kernels whose items hold up to PT 8-pair tiles, its
/// scales (block fp8: the pairs' [8 PT], then the weights' [2]), and the
/// kernels' dynamic shared memory (over 48 KiB: the probe raises their
/// limit).
template <int PT>
inline constexpr int kRingStageBytesOf = (kMmaWarps * kRingWeightRows + 8 * PT) * kRingRowBytes;
template <int PT>
inline constexpr int kRingScaleBytesOf = PT <= 4 ? 256 : 512;
template <int PT>
inline constexpr int kRingSmemBytesOf = kRingStages*(kRingStageBytesOf<PT> + kRingScaleBytesOf<PT>);
inline constexpr int kRingStageBytes = kRingStageBytesOf<kMmaTiles>;
inline constexpr int kRingScaleBytes = kRingScaleBytesOf<kMmaTiles>;
inline constexpr int kRingSmemBytes = kRingSmemBytesOf<kMmaTiles>;
/// The wide items (bf16/fp16): 8 8-pair tiles, 64 pairs, each expert's rows
/// read once per 64 of its pairs (the launchers' rules: moe_tu.cuh,
/// moe_gemm_kernels.cuh).
inline constexpr int kWideTiles = 8;
static_assert(kDownRowTiles == 2 && kRingSmemBytes <= 75 * 1024 && kRingSmemBytesOf<kWideTiles> <= 75 * 1024,
              "3 blocks an sm_90 SM (228 KiB), wide items too");
inline constexpr int kSortThreads = 1024;
static_assert(kSortThreads == 32 * 32, "moe_sort_kernel scans the warps' totals in one warp");
inline constexpr int kReduceThreads = 256;

/// One call's arguments (moe::MoeArgs) and the workspace's parts.
struct MmaArgs {
  moe::MoeArgs g;
  int32_t* n_items;   ///< [1]
  int32_t* sorted;    ///< [P]: the pairs in expert order
  int4* items;        ///< [max_items]: (expert, first in sorted, count, 0)
  void* a;            ///< [P, I] in the dtype (block fp8: fp32)
  float* y;           ///< [P, H]
  int32_t max_items;  ///< the grid's items
  // Block fp8: the activations quantised (e4m3fn codes and their per-row
  // 1x128-group scales): hidden [M, H] and a [P, I].
  uint8_t* xq = nullptr;
  float* xs = nullptr;
  uint8_t* aq = nullptr;
  float* as = nullptr;
};

template <DType DT, int PT = kMmaTiles>  // (per dtype only so that each TU has its own copy)
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kSortThreads) moe_sort_kernel(MmaArgs m) {
  constexpr int kPairs = 8 * PT;  // an item's pairs at most
  port::grid_dependency_wait_and_release();
  extern __shared__ int32_t sm[];  // count[E], cursor[E]
  const moe::MoeArgs& g = m.g;
  const int E = static_cast<int>(g.E), k = static_cast<int>(g.top_k), P = static_cast<int>(g.M * g.top_k);
  int32_t* count = sm;
  int32_t* cursor = sm + E;
  for (int e = static_cast<int>(threadIdx.x); e < E; e += kSortThreads) count[e] = 0;
  __syncthreads();
  for (int q = static_cast<int>(threadIdx.x); q < P; q += kSortThreads) {
    const int32_t e = g.ids[(q / k) * g.ldi + q % k];
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  {  // offsets and the work list: thread e takes expert e (E <= kSortThreads), a block scan of the counts
     // and of the items per expert (one thread's serial walk over E experts measured 20 us on the H100)
    __shared__ int32_t warp_pairs[kSortThreads / 32], warp_items[kSortThreads / 32];
    const int e = static_cast<int>(threadIdx.x), lane = e & 31, wid = e >> 5;
    const int32_t c = e < E ? count[e] : 0, n = (c + kPairs - 1) / kPairs;
    int32_t sc = c, sn = n;  // inclusive scans within the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t a = __shfl_up_sync(0xffffffffu, sc, o), b = __shfl_up_sync(0xffffffffu, sn, o);
      if (lane >= o) sc += a, sn += b;
    }
    if (lane == 31) warp_pairs[wid] = sc, warp_items[wid] = sn;
    __syncthreads();
    if (wid == 0) {  // the warps' totals, scanned by warp 0 (kSortThreads / 32 == 32)
      int32_t a = warp_pairs[lane], b = warp_items[lane];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int32_t x = __shfl_up_sync(0xffffffffu, a, o), y = __shfl_up_sync(0xffffffffu, b, o);
        if (lane >= o) a += x, b += y;
      }
      warp_pairs[lane] = a, warp_items[lane] = b;
    }
    __syncthreads();
    const int32_t first = (wid > 0 ? warp_pairs[wid - 1] : 0) + sc - c;
    const int32_t item0 = (wid > 0 ? warp_items[wid - 1] : 0) + sn - n;
    if (e < E) {
      cursor[e] = first;
      for (int32_t s = 0, i = item0; s < c; s += kPairs, ++i)
        m.items[i] = make_int4(e, first + s, c - s < kPairs ? c - s : kPairs, 0);
    }
    if (e == kSortThreads - 1) *m.n_items = item0 + n;  // the last thread's inclusive sum: every item
  }
  __syncthreads();
  for (int q = static_cast<int>(threadIdx.x); q < P; q += kSortThreads) {
    const int32_t e = g.ids[(q / k) * g.ldi + q % k];
    if (e >= 0 && e < E) m.sorted[atomicAdd(&cursor[e], 1)] = q;
  }
}

/// The A fragment of step s (0, 1) from the 16-byte loads of rows g and g + 8.
KDISPATCH_DEVICE_INLINE void frag_a(const uint4& r0, const uint4& r8, int s, uint32_t (&a)[4]) {
  a[0] = s ? r0.z : r0.x;
  a[1] = s ? r8.z : r8.x;
  a[2] = s ? r0.w : r0.y;
  a[3] = s ? r8.w : r8.y;
}

/// The mma of one 16-byte step of K (32 bf16/fp16 or 64 fp8 elements): RT
/// 16-row tiles (r0: the lane's 16 bytes of row g, r8: of row g + 8)
/// against the first nt 8-pair tiles b: acc[t][j] += their products (two
/// mma<DT> each; nt is the same in every lane).
template <DType DT, int RT>
KDISPATCH_DEVICE_INLINE void mma_regs(const uint4 (&r0)[RT], const uint4 (&r8)[RT], const uint4 (&b)[kMmaTiles], int nt,
                                      float (&acc)[RT][kMmaTiles][4]) {
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int t = 0; t < RT; ++t) {
      uint32_t fa[4];
      frag_a(r0[t], r8[t], s, fa);
#pragma unroll
      for (int j = 0; j < kMmaTiles; ++j)
        if (j < nt) gemm_skinny_mma::mma<DT>(acc[t][j], fa, s ? b[j].z : b[j].x, s ? b[j].w : b[j].y);
    }
}

KDISPATCH_DEVICE_INLINE uint4 ld16(const void* p) { return *reinterpret_cast<const uint4*>(p); }

/// The K loop of the direct kernels (the plans with staged = false):
/// `steps` 16-byte steps (step s at element s * step_elems of every row) of
/// 2 16-row tiles (rows w[t] and, 8 below, w[t] + r8) against the item's
/// kMmaTiles 8-pair tiles (rows bp[j]), loaded straight from global memory
/// into registers: mma_regs, then after(s).
template <DType DT, class S, class After>
KDISPATCH_DEVICE_INLINE void mma_loop(const S* const (&w)[2], int64_t r8, const S* const (&bp)[kMmaTiles],
                                      int64_t steps, int64_t step_elems, float (&acc)[2][kMmaTiles][4], After after) {
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t k0 = s * step_elems;
    uint4 r0[2], rr8[2], b[kMmaTiles];
#pragma unroll
    for (int t = 0; t < 2; ++t) r0[t] = ld16(w[t] + k0), rr8[t] = ld16(w[t] + r8 + k0);
#pragma unroll
    for (int j = 0; j < kMmaTiles; ++j) b[j] = ld16(bp[j] + k0);
    mma_regs<DT, 2>(r0, rr8, b, kMmaTiles, acc);
    after(s);
  }
}

/// Where a lane of the GEMM kernels works: the block's item (expert, first,
/// count), its warp's first output row, the lane's mma coordinates (gr =
/// lane / 4, q = lane % 4); items of up to PT 8-pair tiles.
template <int PT = kMmaTiles>
struct LaneT {
  int4 it;
  int64_t row0;
  int gr, q;

  /// The item's 8-pair tiles that hold a pair (1..PT).
  KDISPATCH_DEVICE_INLINE int nt() const { return (it.z + 7) / 8; }

  /// The pair of B column j * 8 + gr (the item's first past its count: its
  /// results are not written).
  KDISPATCH_DEVICE_INLINE int64_t b_pair(const MmaArgs& m, int j) const {
    const int c = j * 8 + gr;
    return m.sorted[it.y + (c < it.z ? c : 0)];
  }
  /// f(j, e, pair, row) for each accumulator e of tile j that is one of the
  /// item's pairs (C layout: c0, c1 = row gr, columns 2q, 2q + 1; c2, c3 =
  /// row gr + 8); row relative to the tile's first.
  template <class F>
  KDISPATCH_DEVICE_INLINE void each_out(const MmaArgs& m, F f) const {
#pragma unroll
    for (int j = 0; j < PT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = j * 8 + 2 * q + (e & 1);
        if (c < it.z) f(j, e, int64_t{m.sorted[it.y + c]}, gr + (e >= 2 ? 8 : 0));
      }
  }
};
using Lane = LaneT<>;
/// The lane's place, warps taking `rows` output rows each of `extent`;
/// false when the block is past the call's items or the warp past extent.
/// (Waits on the previous kernel first: the kernels' first statement.)
KDISPATCH_DEVICE_INLINE bool lane_of(const MmaArgs& m, int rows, int64_t extent, Lane* l) {
  port::grid_dependency_wait_and_release();
  if (static_cast<int32_t>(blockIdx.y) >= *m.n_items) return false;
  l->it = m.items[blockIdx.y];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  l->row0 = (int64_t{blockIdx.x} * kMmaWarps + (static_cast<int>(threadIdx.x) >> 5)) * rows;
  l->gr = lane >> 2, l->q = lane & 3;
  return l->row0 < extent;
}

template <DType DT>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kMmaThreads) moe_up_mma_kernel(MmaArgs m) {
  Lane l;
  if (!lane_of(m, 16, m.g.I, &l)) return;  // I a multiple of 16 (the list checks)
  const int64_t i0 = l.row0;
  const moe::MoeArgs& g = m.g;
  using S = typename Elem<DT>::S;
  const S* wg = static_cast<const S*>(g.w1) + (int64_t{l.it.x} * 2 * g.I + i0 + l.gr) * g.ldw1 + 8 * l.q;
  const int64_t r8 = 8 * g.ldw1, up = g.I * g.ldw1;
  const S* xb[kMmaTiles];
#pragma unroll
  for (int j = 0; j < kMmaTiles; ++j)
    xb[j] = static_cast<const S*>(g.hidden) + (l.b_pair(m, j) / g.top_k) * g.ldh + 8 * l.q;
  const S* const rows[2] = {wg, wg + up};  // gate, up
  float acc[2][kMmaTiles][4] = {};
  mma_loop<DT>(rows, r8, xb, g.H / 32, 32, acc, [](int64_t) {});  // H a multiple of 32
  S* a = static_cast<S*>(m.a);
  l.each_out(m, [&](int j, int e, int64_t p, int r) {
    Elem<DT>::store1(a + p * g.I + i0 + r, moe::act_of(acc[0][j][e], g.act) * acc[1][j][e]);
  });
}

template <DType DT>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kMmaThreads) moe_down_mma_kernel(MmaArgs m) {
  Lane l;
  if (!lane_of(m, 16 * kDownRowTiles, m.g.H, &l)) return;  // H a multiple of 32
  using S = typename Elem<DT>::S;
  const moe::MoeArgs& g = m.g;
  const int64_t c0 = l.row0;
  const S* w = static_cast<const S*>(g.w2) + (int64_t{l.it.x} * g.H + c0 + l.gr) * g.ldw2 + 8 * l.q;
  const int64_t r8 = 8 * g.ldw2;
  const S* ab[kMmaTiles];
#pragma unroll
  for (int j = 0; j < kMmaTiles; ++j) ab[j] = static_cast<const S*>(m.a) + l.b_pair(m, j) * g.I + 8 * l.q;
  const S* const rows[kDownRowTiles] = {w, w + 16 * g.ldw2};
  float acc[kDownRowTiles][kMmaTiles][4] = {};
  mma_loop<DT>(rows, r8, ab, g.I / 32, 32, acc, [](int64_t) {});  // I a multiple of 32
#pragma unroll
  for (int t = 0; t < kDownRowTiles; ++t)
    l.each_out(m, [&](int j, int e, int64_t p, int r) { m.y[p * g.H + c0 + t * 16 + r] = acc[t][j][e]; });
}

// ------------------------------------------------------------------ block fp8
//
// e4m3fn weights with 128x128 block scales (H and I multiples of 128): the
// activations are quantised first, per row and 1x128 group (the op's rule:
// scale = max(amax, 1e-10) / 448, e4m3fn round to nearest even), hidden by
// moe_quant_kernel into xq/xs, the up kernel's fp32 a into aq/as; the GEMMs
// run mma.sync m16n8k32 e4m3 (a 16-byte load is 16 elements of K, the same
// permutation at 4-byte granularity), each 128-group's sums joining the
// accumulators times w_scale (the tile's rows lie in one 128-row block) x
// the column's activation scale. Launches: sort, quant, up, quant, down, sum.

/// Row r of src [rows, cols] (ld elements; T bf16 or fp32) quantised per
/// 1x128 group into q [rows, cols] (ldq bytes) and s [rows, cols / 128]
/// (lds): grid (rows, ceil(cols / 128 / 8)), a warp per group, 4 values a lane.
template <class T>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(256)
    moe_quant_kernel(const T* src, int64_t ld, int64_t cols, uint8_t* q, int64_t ldq, float* s, int64_t lds) {
  port::grid_dependency_wait_and_release();
  const int64_t r = blockIdx.x, g0 = (int64_t{blockIdx.y} * 8 + (threadIdx.x >> 5)) * 128;
  if (g0 >= cols) return;  // cols a multiple of 128
  const int64_t c = g0 + (threadIdx.x & 31) * 4;
  float v[4];
  if constexpr (sizeof(T) == 4) {
    const float4 f = *reinterpret_cast<const float4*>(src + r * ld + c);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    const uint2 u = *reinterpret_cast<const uint2*>(src + r * ld + c);
    const float2 lo = port::bf16x2_to_float2(u.x), hi = port::bf16x2_to_float2(u.y);
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = fmaxf(amax, 1e-10f) / 448.f, inv = 1.f / scale;
  const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v[0] * inv, v[1] * inv), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v[2] * inv, v[3] * inv), __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint32_t*>(q + r * ldq + c) = lo | (hi << 16);
  if ((threadIdx.x & 31) == 0) s[r * lds + g0 / 128] = scale;
}

/// acc += part * sw * (the activation scale of each accumulator's column):
/// sa[j][0], sa[j][1] of columns 2q, 2q + 1 of tile j.
template <int NT>
KDISPATCH_DEVICE_INLINE void add_group(float (&acc)[NT][4], float (&part)[NT][4], const float (&sa)[NT][2], float sw) {
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[j][e] = fmaf(part[j][e], sw * sa[j][e & 1], acc[j][e]);
      part[j][e] = 0.f;
    }
}

/// The activation scales of this lane's accumulator columns for group gi:
/// rows[j][parity] into s (lds per row).
KDISPATCH_DEVICE_INLINE void group_scales(const float* s, int64_t lds, const int64_t (&rows)[kMmaTiles][2], int64_t gi,
                                          float (&sa)[kMmaTiles][2]) {
#pragma unroll
  for (int j = 0; j < kMmaTiles; ++j) sa[j][0] = s[rows[j][0] * lds + gi], sa[j][1] = s[rows[j][1] * lds + gi];
}

/// The rows (of hidden: tokens; of a: pairs) of this lane's accumulator
/// columns 2q, 2q + 1 of each tile (the item's first pair past its count).
KDISPATCH_DEVICE_INLINE void column_rows(const MmaArgs& m, const Lane& l, bool tokens, int64_t (&rows)[kMmaTiles][2]) {
#pragma unroll
  for (int j = 0; j < kMmaTiles; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = j * 8 + 2 * l.q + h;
      const int64_t p = m.sorted[l.it.y + (c < l.it.z ? c : 0)];
      rows[j][h] = tokens ? p / m.g.top_k : p;
    }
}

template <DType X>  // X: the activations' dtype (bf16), a template to stay out of other TUs
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kMmaThreads) moe_up_mma_fp8_kernel(MmaArgs m) {
  Lane l;
  if (!lane_of(m, 16, m.g.I, &l)) return;
  const moe::MoeArgs& g = m.g;
  const int64_t i0 = l.row0, H = g.H, blocks = (2 * g.I + 127) / 128;
  const uint8_t* wg = static_cast<const uint8_t*>(g.w1) + (int64_t{l.it.x} * 2 * g.I + i0 + l.gr) * g.ldw1 + 16 * l.q;
  const int64_t r8 = 8 * g.ldw1, up = g.I * g.ldw1;
  const float* sg = g.s1 + (int64_t{l.it.x} * blocks + i0 / 128) * g.lds1;
  const float* su = g.s1 + (int64_t{l.it.x} * blocks + (g.I + i0) / 128) * g.lds1;
  const uint8_t* xb[kMmaTiles];
#pragma unroll
  for (int j = 0; j < kMmaTiles; ++j) xb[j] = m.xq + (l.b_pair(m, j) / g.top_k) * H + 16 * l.q;
  int64_t rows[kMmaTiles][2];
  column_rows(m, l, true, rows);
  const uint8_t* const wrows[2] = {wg, wg + up};  // gate, up
  float acc[2][kMmaTiles][4] = {}, part[2][kMmaTiles][4] = {};
  // Two 64-element steps per 128-group; after the second, the group's sums join acc.
  mma_loop<DType::fp8_e4m3fn>(wrows, r8, xb, H / 64, 64, part, [&](int64_t s) {
    if ((s & 1) == 0) return;
    const int64_t gi = s / 2;
    float sa[kMmaTiles][2];
    group_scales(m.xs, H / 128, rows, gi, sa);
    add_group(acc[0], part[0], sa, sg[gi]);
    add_group(acc[1], part[1], sa, su[gi]);
  });
  float* a = static_cast<float*>(m.a);
  l.each_out(m, [&](int j, int e, int64_t p, int r) {
    a[p * g.I + i0 + r] = moe::act_of(acc[0][j][e], g.act) * acc[1][j][e];
  });
}

template <DType X>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kMmaThreads) moe_down_mma_fp8_kernel(MmaArgs m) {
  Lane l;
  if (!lane_of(m, 16 * kDownRowTiles, m.g.H, &l)) return;
  const moe::MoeArgs& g = m.g;
  const int64_t c0 = l.row0, I = g.I;
  const uint8_t* w = static_cast<const uint8_t*>(g.w2) + (int64_t{l.it.x} * g.H + c0 + l.gr) * g.ldw2 + 16 * l.q;
  const int64_t r8 = 8 * g.ldw2;
  const float* sw = g.s2 + (int64_t{l.it.x} * ((g.H + 127) / 128) + c0 / 128) * g.lds2;
  const uint8_t* ab[kMmaTiles];
#pragma unroll
  for (int j = 0; j < kMmaTiles; ++j) ab[j] = m.aq + l.b_pair(m, j) * I + 16 * l.q;
  int64_t rows[kMmaTiles][2];
  column_rows(m, l, false, rows);
  const uint8_t* const wrows[kDownRowTiles] = {w, w + 16 * g.ldw2};
  float acc[kDownRowTiles][kMmaTiles][4] = {}, part[kDownRowTiles][kMmaTiles][4] = {};
  mma_loop<DType::fp8_e4m3fn>(wrows, r8, ab, I / 64, 64, part, [&](int64_t s) {
    if ((s & 1) == 0) return;
    const int64_t gi = s / 2;
    float sa[kMmaTiles][2];
    group_scales(m.as, I / 128, rows, gi, sa);
#pragma unroll
    for (int t = 0; t < kDownRowTiles; ++t) add_group(acc[t], part[t], sa, sw[gi]);
  });
#pragma unroll
  for (int t = 0; t < kDownRowTiles; ++t)
    l.each_out(m, [&](int j, int e, int64_t p, int r) { m.y[p * g.H + c0 + t * 16 + r] = acc[t][j][e]; });
}

// ------------------------------------------------------------------ the ring kernels
//
// moe_ring_kernel<DT, Up>: the up (Up) or down GEMM of the plans with
// staged = true, the grid and the outputs of moe_up_mma_kernel /
// moe_down_mma_kernel (block fp8: of their fp8 forms). The block streams K
// through a ring of kRingStages stages in shared memory, each 128 bytes of K
// (64 bf16/fp16 or 128 fp8 elements: block fp8's 128-group) of every warp's
// 32 weight rows and of the item's pairs' activation rows (once per block,
// not once per warp), loaded as the skinny_mma GEMM loads: cp.async.cg 16
// bytes a lane, 8 lanes a 128-byte row line, chunk c of row r at c ^ (r & 7)
// (gemm_skinny_mma::swz) so that the ldmatrix reads are free of bank
// conflicts, the weights with an L2 evict-first policy (read once a call
// per item). The loads of stage c + kRingStages - 1 are issued before stage
// c is used, one barrier of the block per stage. Block fp8: the stage's
// activation scales (one per pair) and weight scales (up: gate and up; a
// block's rows lie in one 128-row block) ride the ring beside the data, and
// each stage's sums join the accumulators times both. Bytes past K are
// zero-filled (bf16/fp16 K a multiple of 32), pairs past the item's count
// zero-filled and not written, the 8-pair tiles past them not multiplied.

/// The copies of a ring kernel's stages: operator()(slot, tile, chunk)
/// issues this thread's cp.async copies of K chunk `chunk` (128 bytes of
/// every row) of the block's row tile `tile` into ring slot `slot`: its
/// warp's weight rows (8 a lane), its 2 of the pairs' rows, block fp8 the
/// scales (warp 0: the pairs' activation scales; warp 1 lanes 0, 1: the
/// tile's weight scales, gate and up).
template <DType DT, bool Up, int PT = kMmaTiles>
struct RingLoads {
  static constexpr bool kFp8 = DT == DType::fp8_e4m3fn;
  static_assert(!kFp8 || PT == kMmaTiles, "block fp8's ring: 32-pair items (its scales, its registers)");
  static constexpr int kBRows = PT / 2;  ///< pair rows a thread copies: (tid >> 3) + 16h
  static constexpr int kEB = kFp8 ? 1 : 2;
  static constexpr int64_t kTileRows = kMmaWarps * (Up ? 16 : 32);  ///< a block tile's rows (up: gate rows)
  const MmaArgs* m;  // block fp8's scales (null in moe_gemm's kernel: no fp8)
  int warp, lane, nt;
  int64_t kbytes, ldw, tile0;  // tile0: the block's first row tile
  int64_t extent;              // the weight rows there are (up: I gate rows, down: H; moe_gemm: N)
  uint32_t ring, scales;
  uint64_t evict_first;
  const unsigned char* wsrc[8];       // rows (lane >> 3) + 4i of the warp in the block's first tile
  const unsigned char* bsrc[kBRows];  // pair rows (tid >> 3) + 16h
  bool bok[kBRows];
  const float* asrc;  // warp 0: lane's pair's activation scales (block fp8)
  bool aok;
  int64_t expert;  // the item's

  /// The first row of this warp's rows in row tile `tile` (up: gate rows).
  KDISPATCH_DEVICE_INLINE int64_t warp_row(int64_t tile) const { return tile * kTileRows + warp * (Up ? 16 : 32); }

  KDISPATCH_DEVICE_INLINE void operator()(int slot, int64_t tile, int64_t chunk) const {
    namespace sk = gemm_skinny_mma;
    const uint32_t st = ring + static_cast<uint32_t>(slot * kRingStageBytesOf<PT>);
    const int pch = lane & 7;
    const int64_t kb = chunk * kRingRowBytes + pch * 16;
    const int bytes = kb < kbytes ? static_cast<int>(kbytes - kb < 16 ? kbytes - kb : 16) : 0;
    const int64_t off = bytes ? kb : 0;  // a valid address even when nothing is read
    if (warp_row(tile) < extent) {
      const int64_t shift = (tile - tile0) * kTileRows * ldw + off;
#pragma unroll
      for (int i = 0; i < 8; ++i)
        sk::cp_async16(
            st + static_cast<uint32_t>(warp * kRingWeightRows * kRingRowBytes) + sk::swz((lane >> 3) + 4 * i, pch),
            wsrc[i] + shift, bytes, evict_first);
    }
    const int brow = warp * 4 + (lane >> 3);
#pragma unroll
    for (int h = 0; h < kBRows; ++h)
      if (brow + 16 * h < 8 * nt)
        sk::cp_async16(
            st + static_cast<uint32_t>(kMmaWarps * kRingWeightRows * kRingRowBytes) + sk::swz(brow + 16 * h, pch),
            bsrc[h] + off, bok[h] ? bytes : 0);
    if constexpr (kFp8) {
      const moe::MoeArgs& g = m->g;
      const uint32_t ss = scales + static_cast<uint32_t>(slot * kRingScaleBytes);
      if (warp == 0) {
        sk::cp_async4(ss + 4u * static_cast<uint32_t>(lane), asrc + (aok ? chunk : 0), aok ? 4 : 0);
      } else if (warp == 1 && lane < (Up ? 2 : 1)) {  // the tile's rows lie in one 128-row block
        const int64_t rb = ((lane == 1 ? g.I : 0) + tile * kTileRows) / 128;
        const float* ws =
            Up ? g.s1 + (expert * (2 * g.I / 128) + rb) * g.lds1 : g.s2 + (expert * (g.H / 128) + rb) * g.lds2;
        sk::cp_async4(ss + 128u + 4u * static_cast<uint32_t>(lane), ws + chunk, 4);
      }
    }
  }
};

/// An L2 evict-first cache policy for the weight stream (0 before sm_80).
KDISPATCH_DEVICE_INLINE uint64_t evict_first_policy() {
  uint64_t p = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
#endif
  return p;
}

/// The RingLoads of this thread: block (tile group blockIdx.x, item
/// blockIdx.y), `tiles` row tiles a block.
template <DType DT, bool Up, int PT>
KDISPATCH_DEVICE_INLINE RingLoads<DT, Up, PT> ring_loads(const MmaArgs& m, const LaneT<PT>& l, int tiles,
                                                         uint32_t ring) {
  using R = RingLoads<DT, Up, PT>;
  const moe::MoeArgs& g = m.g;
  R d;
  d.m = &m;
  d.lane = static_cast<int>(threadIdx.x) & 31, d.warp = static_cast<int>(threadIdx.x) >> 5, d.nt = l.nt();
  d.kbytes = (Up ? g.H : g.I) * R::kEB, d.ldw = (Up ? g.ldw1 : g.ldw2) * R::kEB;
  d.tile0 = int64_t{blockIdx.x} * tiles;
  d.expert = l.it.x;
  d.extent = Up ? g.I : g.H;
  d.ring = ring, d.scales = ring + kRingStages * kRingStageBytesOf<PT>;
  d.evict_first = evict_first_policy();
  const unsigned char* wexp =
      static_cast<const unsigned char*>(Up ? g.w1 : g.w2) + d.expert * (Up ? 2 * g.I : g.H) * d.ldw;
  const int64_t row0 = d.warp_row(d.tile0);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = (d.lane >> 3) + 4 * i;  // up: rows 0..15 gate, 16..31 up
    const int64_t row = Up ? (r < 16 ? row0 + r : g.I + row0 + r - 16) : row0 + r;
    d.wsrc[i] = wexp + row * d.ldw;  // past the extent: never read
  }
  int64_t ldb;  // the pairs' rows: up hidden (block fp8: xq) by token, down a (aq) by pair
  const unsigned char* bbase;
  if constexpr (R::kFp8) {
    ldb = Up ? g.H : g.I;
    bbase = Up ? m.xq : m.aq;
  } else {
    ldb = Up ? g.ldh * 2 : g.I * 2;
    bbase = static_cast<const unsigned char*>(Up ? g.hidden : m.a);
  }
#pragma unroll
  for (int h = 0; h < R::kBRows; ++h) {
    const int c = d.warp * 4 + (d.lane >> 3) + 16 * h;
    d.bok[h] = c < l.it.z;
    const int64_t p = m.sorted[l.it.y + (d.bok[h] ? c : 0)];
    d.bsrc[h] = bbase + (Up ? p / g.top_k : p) * ldb;
  }
  d.aok = d.lane < l.it.z;
  d.asrc = nullptr;
  if constexpr (R::kFp8) {
    const int64_t p = m.sorted[l.it.y + (d.aok ? d.lane : 0)];
    d.asrc = Up ? m.xs + (p / g.top_k) * (g.H / 128) : m.as + p * (g.I / 128);
  }
  return d;
}

/// One stage of a ring kernel: the warp's 2 16-row tiles against the item's
/// first nt 8-pair tiles, 128 bytes of K (sum += the products).
template <DType DT, int PT>
KDISPATCH_DEVICE_INLINE void ring_stage(uint32_t st, int warp, int lane, int nt, float (&sum)[2][PT][4]) {
  namespace sk = gemm_skinny_mma;
  // ldmatrix.x4 lane addresses (as skinny_mma's): weight rows (mma A) lane & 15
  // of a 16-row tile, chunk + (lane >> 4); pair rows (mma B) lane & 7, chunk + (lane >> 3).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_ch = lane >> 4, b_row = lane & 7, b_ch = lane >> 3;
  const uint32_t w_at = st + static_cast<uint32_t>(warp * kRingWeightRows * kRingRowBytes),
                 b_at = st + static_cast<uint32_t>(kMmaWarps * kRingWeightRows * kRingRowBytes);
#pragma unroll
  for (int kp = 0; kp < 2; ++kp) {  // two k16 (fp8: k32) steps a pair-row load: chunks 4kp .. 4kp + 3
    uint32_t b[PT][4];
#pragma unroll
    for (int j = 0; j < PT; ++j)
      if (j < nt)
        sk::ldsm_x4(b_at + sk::swz(j * 8 + b_row, 4 * kp + b_ch), b[j]);
      else
        b[j][0] = b[j][1] = b[j][2] = b[j][3] = 0u;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        uint32_t a[4];
        sk::ldsm_x4(w_at + sk::swz(t * 16 + a_row, 4 * kp + 2 * h + a_ch), a);
#pragma unroll
        for (int j = 0; j < PT; ++j)
          if (j < nt) sk::mma<DT>(sum[t][j], a, b[j][2 * h], b[j][2 * h + 1]);
      }
  }
}

/// A ring kernel's outputs of one row tile (l.row0: the warp's first row).
template <DType DT, bool Up, int PT>
KDISPATCH_DEVICE_INLINE void ring_out(const MmaArgs& m, const LaneT<PT>& l, const float (&acc)[2][PT][4]) {
  const moe::MoeArgs& g = m.g;
  if constexpr (Up && DT == DType::fp8_e4m3fn) {
    float* a = static_cast<float*>(m.a);
    l.each_out(m, [&](int j, int e, int64_t p, int r) {
      a[p * g.I + l.row0 + r] = moe::act_of(acc[0][j][e], g.act) * acc[1][j][e];
    });
  } else if constexpr (Up) {
    auto* a = static_cast<typename Elem<DT>::S*>(m.a);
    l.each_out(m, [&](int j, int e, int64_t p, int r) {
      Elem<DT>::store1(a + p * g.I + l.row0 + r, moe::act_of(acc[0][j][e], g.act) * acc[1][j][e]);
    });
  } else {
#pragma unroll
    for (int t = 0; t < 2; ++t)
      l.each_out(m, [&](int j, int e, int64_t p, int r) { m.y[p * g.H + l.row0 + t * 16 + r] = acc[t][j][e]; });
  }
}

/// A ring kernel's block: `tiles` row tiles of RingLoads::kTileRows from
/// ld.tile0 (fewer past ld.extent), streamed as one run of stages (tile by
/// tile, K chunk by chunk) so that a short K (DeepSeek-V3's down GEMM: 2
/// chunks of fp8) still keeps kRingStages - 1 stages in flight past a
/// tile's end; out(row0, acc) after each tile's last chunk in each warp
/// whose rows exist (row0: the warp's first row; extent a multiple of 32).
/// q: the lane's mma column quad (lane % 4; block fp8's scales).
template <DType DT, bool Up, int PT, class Out>
KDISPATCH_DEVICE_INLINE void ring_loop(const RingLoads<DT, Up, PT>& ld, int q, int tiles, const unsigned char* smem,
                                       Out out) {
  namespace sk = gemm_skinny_mma;
  constexpr bool kFp8 = DT == DType::fp8_e4m3fn;
  constexpr int S = kRingStages;
  using R = RingLoads<DT, Up, PT>;
  const int64_t extent = ld.extent, row_tiles = (extent + R::kTileRows - 1) / R::kTileRows;
  const int64_t chunks = (ld.kbytes + kRingRowBytes - 1) / kRingRowBytes;
  const int64_t my_tiles = row_tiles - ld.tile0 < tiles ? row_tiles - ld.tile0 : tiles;
  const int64_t steps = my_tiles * chunks;   // step u: tile tile0 + u / chunks, chunk u % chunks
  int64_t it_tile = ld.tile0, it_chunk = 0;  // the next step to issue
  auto issue_next = [&](int slot) {
    ld(slot, it_tile, it_chunk);
    if (++it_chunk == chunks) it_chunk = 0, ++it_tile;
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < steps) issue_next(s);
    sk::cp_commit();  // empty groups keep the wait_group count uniform
  }
  float acc[2][PT][4] = {};
  int slot = 0;
  int64_t tile = ld.tile0, chunk = 0;
  for (int64_t u = 0; u < steps; ++u) {
    sk::cp_wait<S - 2>();  // stage u has landed (this thread's copies) ...
    __syncthreads();       // ... and every thread's; the slot of u - 1 is free
    if (u + S - 1 < steps) issue_next(slot == 0 ? S - 1 : slot - 1);
    sk::cp_commit();
    const int64_t row0 = ld.warp_row(tile);
    const bool live = row0 < extent;  // extent a multiple of 32: a live warp's rows all exist
    if (live) {
      const uint32_t st = ld.ring + static_cast<uint32_t>(slot * kRingStageBytesOf<PT>);
      float part[2][PT][4] = {};  // block fp8: the stage's sums, scaled below
      float(&sum)[2][PT][4] = kFp8 ? part : acc;
      ring_stage<DT, PT>(st, ld.warp, ld.lane, ld.nt, sum);
      if constexpr (kFp8) {
        const auto* ss = reinterpret_cast<const float*>(smem + S * kRingStageBytes + slot * kRingScaleBytes);
        float sa[kMmaTiles][2];
#pragma unroll
        for (int j = 0; j < kMmaTiles; ++j) sa[j][0] = ss[8 * j + 2 * q], sa[j][1] = ss[8 * j + 2 * q + 1];
        add_group(acc[0], part[0], sa, ss[32]);
        add_group(acc[1], part[1], sa, ss[Up ? 33 : 32]);
      }
    }
    if (++slot == S) slot = 0;
    if (++chunk == chunks) {  // the tile's last chunk: its outputs, then the next tile's sums from zero
      if (live) out(row0, acc);
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < PT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[t][j][e] = 0.f;
      chunk = 0, ++tile;
    }
  }
  sk::cp_wait<0>();
}

/// Grid (ceil(row tiles / tiles), max items): the item blockIdx.y's pairs
/// against `tiles` row tiles of its expert (ring_loop).
template <DType DT, bool Up, int PT = kMmaTiles>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kMmaThreads, 3) moe_ring_kernel(MmaArgs m, int tiles) {
  namespace sk = gemm_skinny_mma;
  port::grid_dependency_wait_and_release();
  if (static_cast<int32_t>(blockIdx.y) >= *m.n_items) return;  // the whole block
  extern __shared__ __align__(128) unsigned char ring_smem[];
  LaneT<PT> l;
  l.it = m.items[blockIdx.y];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  l.gr = lane >> 2, l.q = lane & 3;
  const RingLoads<DT, Up, PT> ld = ring_loads<DT, Up, PT>(m, l, tiles, sk::smem_addr(ring_smem));
  ring_loop<DT, Up, PT>(ld, l.q, tiles, ring_smem, [&](int64_t row0, const float(&acc)[2][PT][4]) {
    l.row0 = row0;
    ring_out<DT, Up, PT>(m, l, acc);
  });
}

/// Row tiles a ring kernel's block streams (ring_loop): enough that a block
/// runs kRingMinChunks 128-byte chunks of K or more (a row of `kbytes`
/// bytes), at most the `row_tiles` there are. (Host code.)
inline constexpr int64_t kRingMinChunks = 12;
inline int ring_tiles(int64_t kbytes, int64_t row_tiles) noexcept {
  const int64_t chunks = (kbytes + kRingRowBytes - 1) / kRingRowBytes;
  const int64_t t = (kRingMinChunks + chunks - 1) / chunks;
  return static_cast<int>(t < row_tiles ? t : row_tiles < 1 ? 1 : row_tiles);
}

template <DType DT>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kReduceThreads) moe_reduce_kernel(MmaArgs m) {
  port::grid_dependency_wait_and_release();
  using S = typename Elem<DT>::S;
  const moe::MoeArgs& g = m.g;
  const int64_t t = blockIdx.x, c = int64_t{blockIdx.y} * kReduceThreads + threadIdx.x;
  if (c >= g.H) return;
  float acc = 0.f;
  for (int64_t j = 0; j < g.top_k; ++j) {
    const int32_t e = g.ids[t * g.ldi + j];
    if (e < 0 || e >= g.E) continue;
    acc = fmaf(g.tw[t * g.ldtw + j], m.y[(t * g.top_k + j) * g.H + c], acc);
  }
  Elem<DT>::store1(static_cast<S*>(g.out) + t * g.ldo + c, g.rsf * acc);
}

}  // namespace dispatch::cuda::moe_mma
