// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the Hopper (sm_90a) prefill kernel of moe_gemm
// (SGLang's fused_moe_kernel contract) on wgmma: for each processed sorted
// block b (expert e = expert_ids[b]) and each sorted id s of the block with
// 0 <= s < M * top_k,
//   out[s, :] = (a[s / top_k, :] · w[e]^T) * (mul_routed_weight ? topk_weights[s / top_k][s % top_k] : 1)
// a [M][K] (row stride lda), w [E][N][K] (K contiguous, row stride ldw,
// expert stride N * ldw), out [M * top_k][N] (row stride ldo), all bf16 (or
// all fp16), fp32 accumulation; topk_weights [M][top_k] (row stride ldtw).
// A block whose expert is not local (< 0 or >= E) writes zeros to its valid
// rows. Only blocks b < ceil(total / bs) are processed, total =
// *num_tokens_post_pad (read on the device). The sort's block_size bs is 128
// (kd_wgmma::kBM: one M tile = one sorted block = one expert) or 64 (one M
// tile = two sorted blocks: each consumer half its block's expert, a stage
// one B box per distinct local expert).
//
// The structure is kd_wgmma::gemm_kernel's (cuda/wgmma_gemm.cuh, whose
// primitives this header reuses): persistent, 384 threads, warpgroup 0 the
// producer (setmaxnreg 40), warpgroups 1 and 2 the consumers (setmaxnreg 232,
// rows [64 c, 64 c + 64) of the 128 x BN tile each), BK = 64, 128-byte
// swizzled K-major stages, `full` / `empty` mbarriers, wgmma.m64n<BN>k16,
// wait_group 1 pipelining, epilogue from registers. The differences:
//
//   B (the expert's weights) by TMA, as in the dense kernel, from one 2D
//     tensor map over w viewed as [E * N][K]: the N tile n0 of expert e is
//     the box at row e * N + n0. A tile that runs past N reads the next
//     expert's rows (or the TMA's zero fill past E * N); those columns are
//     never stored.
//   A (the gathered token rows) by cp.async: the TMA cannot gather rows on
//     Hopper, so all 128 producer threads copy the stage's 128 rows x 128
//     bytes as 1024 16-byte chunks, 8 a thread: thread p owns chunk
//     c = p % 8 of rows p / 8 + 16 i (i = 0..7; a warp reads 4 whole
//     128-byte rows a step, coalesced). The chunk goes to byte
//     r * 128 + ((c ^ (r % 8)) * 16) of the 1024-aligned stage: the layout
//     CU_TENSOR_MAP_SWIZZLE_128B writes (PTX ISA, "Tensor ... swizzling
//     modes": the 128B mode XORs address bits [4:6], the 16-byte chunk, with
//     bits [7:9], the row mod 8 for 128-byte rows of a 1024-aligned base),
//     hence the one the wgmma descriptors (swizzle mode 1) expect. Padding
//     rows (s >= M * top_k) and chunks past K are zero-filled by cp.async
//     with src-size 0 (no global read).
//   Stage completion: `full` counts 128 + 1 arrivals: the 128 producer
//     threads' cp.async.mbarrier.arrive.noinc (each fires when all of the
//     thread's earlier cp.async have landed; .noinc: that asynchronous
//     arrival is one of the init count, not an extra pending one) and the
//     elected thread's mbarrier.arrive.expect_tx for the B box's bytes
//     (whose TMA then completes the transaction count). `empty` counts 2,
//     one per consumer warpgroup, as in the dense kernel.
//   The proxy fence: see consume_fence() below.
//   Tiles: (sorted block, N tile) in the dense kernel's GROUP_SIZE_M order:
//     group_m consecutive sorted blocks (mostly one expert, or a few) walk
//     their N tiles together, so a B tile is read from DRAM once per group
//     and the group's gathered A rows stay in L2 across the N tiles.
//   Dead halves: a consumer whose 64 rows are all padding (an expert's last
//     block is padded at its end: with block_size 128 that is common) keeps
//     the pipeline's phases (waits `full`, releases `empty`) but issues no
//     wgmma and stores nothing. The decision is warpgroup-uniform (a
//     bar.red.or over the warpgroup: wgmma is .aligned) and taken as the
//     trip count of the wgmma K loop, not a branch around the wgmma (which
//     ptxas would serialize, C7518).
//   Non-local expert: producer and consumers both skip the tile's K loop
//     (no stage used, phases stay in step); the consumers store zeros.
//   Epilogue: row = the sorted id s, skipped for padding; times
//     topk_weights[s / top_k][s % top_k] where mul_routed_weight.
//
// Block fp8 (the FP8 instance, out bf16): a is the op's quantised copy (the
// launcher's pass: e4m3 codes [M][K] and one scale per row and 128-wide K
// group, quant_fp8_group's rule), w e4m3 [E][N][K] with one scale per
// 128 x 128 block. A stage holds 128 bytes of K as before, now 128
// elements: one scale group. Tiles are 128 x 128 (one weight block wide).
// Each consumer sums a K-tile with four wgmma.m64n128k32.e4m3 into a second
// accumulator set, waits for them (wait_group 0; its stage is released at
// once) and adds it times a's scale of the row and w's of the block into
// the first (the promotion DeepGEMM uses): fp32 throughout, as the
// reference. K must be a multiple of 128.
#pragma once

#include "cuda/wgmma_gemm.cuh"

namespace kd_wgmma_moe {

using kd_wgmma::kBK;
using kd_wgmma::kBM;
using kd_wgmma::kStageBytesA;
using kd_wgmma::kThreads;

/// The sort's block sizes this kernel takes: 128 (a tile is one sorted
/// block) and 64 (a tile is two: each consumer half its own expert).
inline constexpr int kBlockSize = kBM, kHalfBlockSize = kBM / 2;

/// Dynamic shared memory of a launch (bytes): the dense kernel's layout, b_boxes B boxes a stage.
__host__ __device__ constexpr int smem_bytes(int bn, int stages, int b_boxes) {
  return kd_wgmma::smem_bytes(bn, stages, b_boxes);
}

/// Kernel parameters (besides B's tensor map), by value.
struct Args {
  void* out;                           ///< [M * top_k][N], the input dtype, row stride ldo
  const void* a;                       ///< [M][K], row stride lda
  const int32_t* sorted_token_ids;     ///< [cap]: positions >= cap are never read (padding)
  const int32_t* expert_ids;           ///< [max_blocks]
  const int32_t* num_tokens_post_pad;  ///< [1]: total, clamped to [0, cap] as the op's contract says
  const float* topk_weights;           ///< [M][top_k], row stride ldtw (read where mul_routed_weight)
  int64_t ldo;
  int32_t lda, ldtw;
  int32_t m, n, k;
  int32_t num_experts, top_k, mul_routed_weight;
  int32_t cap;         ///< the sorted positions the buffers hold (the op's readable extent)
  int32_t max_blocks;  ///< ceil(cap / bs)
  int32_t bs;          ///< the sort's block_size: 128, or 64 (a tile's halves two sorted blocks)
  int32_t b_boxes;     ///< B boxes a stage: 1 (bs 128), 2 (bs 64: each half's expert)
  int32_t tiles_n, k_tiles;
  int32_t stages;    ///< shared-memory pipeline depth
  int32_t group_m;   ///< sorted blocks per group of the tile order
  int32_t out_vec2;  ///< two consecutive output elements may be stored as one 4-byte access
  // Block fp8 only (the kernel's FP8 instance; null otherwise): a is then the
  // quantised codes [M][K] (e4m3, row stride lda bytes), a_scales their
  // 1x128-group scales [M][k_tiles], w_scales the weights' 128x128 block
  // scales [E][tiles_n][ldws] (the kernel's 128-wide N tile is one block).
  const float* a_scales;
  const float* w_scales;
  int32_t ldws;
  // fp8_w8a8 per channel (moe_gemm_fp8_channel; null otherwise): w's scales
  // [E][N] (row stride ldcs), each output column's applied as it is stored
  // (the block scales then all 1, a's per token).
  const float* col_scales;
  int64_t ldcs;
};

// ------------------------------------------------------------------ device primitives

/// 16-byte cp.async (L2 only: .cg) of global `src` to shared `dst`; src_bytes
/// 0 writes 16 zeros and reads nothing.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t src_bytes) {
#if KD_WGMMA_ENABLED
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
#else
  (void)dst, (void)src, (void)src_bytes;
#endif
}

/// An arrive-on `bar` that fires when all of this thread's earlier cp.async
/// have completed; .noinc: the arrival is one of the barrier's init count.
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* bar) {
#if KD_WGMMA_ENABLED
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
#else
  (void)bar;
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#if KD_WGMMA_ENABLED
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

/// The cross-proxy fence a consumer thread executes after observing a
/// stage's `full` phase and before its wgmma read the stage.
///
/// Why: cp.async (the non-bulk copy) writes shared memory in the *generic*
/// proxy; wgmma.mma_async reads its shared-memory operands in the *async*
/// proxy (PTX ISA, wgmma "Async Proxy": "Accessing the same memory location
/// across multiple proxies needs a cross-proxy fence. For the async proxy,
/// fence.proxy.async should be used ..."; "An async proxy fence must be used
/// to establish an ordering between prior writes to shared memory matrices
/// and subsequent reads of the same matrices in a wgmma.mma_async
/// instruction"). B's TMA writes are async-proxy writes and need no fence
/// (same proxy, ordered by the mbarrier's complete_tx), but A's need one.
///
/// Where, and by whom: in the memory consistency model a write X in one
/// proxy is ordered before a read Y in another when a proxy fence sits on
/// the causality path from X to Y (causality order through "proxy-preserved
/// base causality order"; Lustig, Cooksey, Giroux, "Mixed-proxy extensions
/// for the NVIDIA PTX memory consistency model", ISCA 2022). The path here
/// is: the producer thread's cp.async writes -> their completion triggers
/// the thread's cp.async.mbarrier.arrive on `full` (release at CTA scope)
/// -> the consumer thread's mbarrier.try_wait.parity that observes the
/// phase (acquire at CTA scope, the default) -> program order in the
/// consumer thread -> fence.proxy.async.shared::cta -> program order -> the
/// consumer's wgmma.mma_async. So the fence belongs in the consumer, after
/// the wait and before the wgmma, in the thread (and CTA) that performs the
/// async-proxy access, which the paper names as the place for it. The
/// producer cannot fence instead: its cp.async complete asynchronously, and
/// a generic-to-async fence only orders writes that precede it, so the
/// producer would first have to cp.async.wait_group each stage (a stall per
/// K-tile). Every consumer thread executes it (each is one of the wgmma's
/// issuing threads and did its own acquire); the cost is one fence per
/// thread per K-tile.
///
/// The reverse direction (wgmma's reads of a stage, then the producer's
/// cp.async overwriting it) needs no fence: "the completion of a
/// wgmma.mma_async operation is followed by an implicit generic-async proxy
/// fence", the consumer observes that completion with wgmma.wait_group
/// before its release-arrive on `empty`, and the producer acquires `empty`
/// before issuing the cp.async.
__device__ __forceinline__ void consume_fence() {
#if KD_WGMMA_ENABLED
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);  // fence.proxy.async.shared::cta
#endif
}

/// Whether any thread of the calling warpgroup passes a nonzero `v`
/// (bar.red.or over the warpgroup's 128 threads on named barrier ID; an
/// immediate, so that ptxas reserves only the barriers used).
template <int ID>
__device__ __forceinline__ bool warpgroup_any(bool v) {
  uint32_t r = 0;
#if KD_WGMMA_ENABLED
  asm volatile("{\n.reg .pred q, p;\nsetp.ne.u32 q, %1, 0;\nbar.red.or.pred p, %2, 128, q;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(r)
               : "r"(static_cast<uint32_t>(v)), "n"(ID)
               : "memory");
#else
  r = v;
#endif
  return r != 0;
}

/// Tile t of the GROUP_SIZE_M order over `tiles_m` sorted blocks: its sorted
/// block and N tile.
__device__ __forceinline__ void tile_of(int t, int tiles_m, const Args& a, int& blk, int& tn) {
  const int per_group = a.group_m * a.tiles_n;
  const int g = t / per_group;
  const int first = g * a.group_m;
  const int size = min(tiles_m - first, a.group_m);
  const int r = t - g * per_group;
  blk = first + r % size;
  tn = r / size;
}

/// The sorted positions the call walks: those of its ceil(total / bs)
/// blocks, total clamped to [0, cap] first (no int32 overflow whatever it
/// holds), and none at or past cap.
__device__ __forceinline__ int walked_end(const Args& a) {
  const int total = min(max(__ldg(a.num_tokens_post_pad), 0), a.cap);
  const int64_t end = (static_cast<int64_t>(total) + a.bs - 1) / a.bs * a.bs;
  return static_cast<int>(min(end, static_cast<int64_t>(a.cap)));
}

__device__ __forceinline__ bool expert_local(int e, const Args& a) { return e >= 0 && e < a.num_experts; }

/// The experts of M-tile blk's two 64-row halves (consumer h's rows): that
/// of the sorted block holding position 128 blk + 64 h (the same block for
/// both at block_size 128), -1 past `end`; whether each is local; whether
/// the tile takes two B boxes (two different local experts). Box 0 holds
/// the first local half's expert, box 1 the second's where they differ.
struct Halves {
  int e[2];
  bool local[2];
  bool two;
};
__device__ __forceinline__ Halves halves_of(const Args& a, int blk, int end) {
  Halves h;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int pos = blk * kBM + 64 * i;
    h.e[i] = pos < end ? __ldg(a.expert_ids + pos / a.bs) : -1;
    h.local[i] = expert_local(h.e[i], a);
  }
  h.two = h.local[0] && h.local[1] && h.e[0] != h.e[1];
  return h;
}

/// Stores one consumer's 64 x BN tile: thread rows s0 and s1 (sorted ids;
/// >= M * top_k: padding, skipped), accumulators times the rows' routing
/// weights and, where `cs` (the expert's per-channel scales), the columns'
/// scales, or zeros where `zero`.
template <bool BF16, int BN>
__device__ __forceinline__ void store_tile(const float (&acc)[BN / 2], const Args& a, int s0, int s1, int col0,
                                           bool zero, const float* cs = nullptr) {
  using T = typename kd_wgmma::Out<BF16>::T;
  using T2 = typename kd_wgmma::Out<BF16>::T2;
  const int lane = threadIdx.x % 32;
  const int mk = a.m * a.top_k;
  const int srow[2] = {s0, s1};
  float scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    scale[h] = zero
                   ? 0.f
                   : (a.mul_routed_weight && srow[h] < mk
                          ? __ldg(a.topk_weights + static_cast<int64_t>(srow[h] / a.top_k) * a.ldtw + srow[h] % a.top_k)
                          : 1.f);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (srow[h] >= mk) continue;
    T* const row = static_cast<T*>(a.out) + static_cast<int64_t>(srow[h]) * a.ldo;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int col = col0 + 8 * j + 2 * (lane % 4);
      if (col >= a.n) continue;
      // zero: write 0 * 0, not 0 * acc (acc may hold a previous tile's values, even NaN).
      float v0 = zero ? 0.f : acc[4 * j + 2 * h] * scale[h];
      float v1 = zero ? 0.f : acc[4 * j + 2 * h + 1] * scale[h];
      if (cs != nullptr && !zero) {
        v0 *= __ldg(cs + col);
        if (col + 1 < a.n) v1 *= __ldg(cs + col + 1);
      }
      if (col + 1 < a.n && a.out_vec2) {
        T2 v;
        v.x = static_cast<T>(v0);
        v.y = static_cast<T>(v1);
        *reinterpret_cast<T2*>(row + col) = v;
      } else {
        row[col] = static_cast<T>(v0);
        if (col + 1 < a.n) row[col + 1] = static_cast<T>(v1);
      }
    }
  }
}

/// The producer warpgroup (all 128 threads, after setmaxnreg): the B boxes
/// by TMA (thread 0) and a's gathered rows by cp.async, stage by stage.
/// FP8: 1-byte elements, 128 of them a stage row (the same 128 bytes).
template <int BN, bool FP8>
__device__ __forceinline__ void produce(const CUtensorMap& tma_w, const Args& a, uint8_t* const sa, uint8_t* const sb,
                                        uint64_t* const full, uint64_t* const empty, const int tiles_m, const int tiles,
                                        const int mk, const int end) {
  using E = typename std::conditional<FP8, uint8_t, __nv_bfloat16>::type;  // a's element (16-bit: bf16 or fp16)
  constexpr int kBKe = FP8 ? kd_wgmma::kBK8 : kBK, kChunkE = 16 / static_cast<int>(sizeof(E));
  const int stages = a.stages;
  constexpr int kStageBytesB = BN * 128;
  const int p = threadIdx.x;
  const int chunk = p % 8;  // this thread's 16-byte chunk of each 128-byte row
  const int row0 = p / 8;   // and its rows: row0 + 16 i
  // Swizzled offset of (row0 + 16 i, chunk): (row0 + 16 i) % 8 == row0 % 8.
  const uint32_t dst0 = static_cast<uint32_t>(__cvta_generic_to_shared(sa)) + row0 * 128 + ((chunk ^ (row0 % 8)) * 16);
  const E* const abase = static_cast<const E*>(a.a);
  int s = 0;
  uint32_t phase = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    int blk, tn;
    tile_of(t, tiles_m, a, blk, tn);
    const Halves hv = halves_of(a, blk, end);
    if (!hv.local[0] && !hv.local[1]) continue;  // the consumers skip it too
    // The rows' element offsets in a (token * lda; M * lda <= INT_MAX, checked
    // by the launcher), -1 for padding: 32-bit, so that the producer fits
    // its 40 registers without spilling.
    int32_t off[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {  // rows 0-63 (i < 4) are half 0's; a non-local half's rows are not read
      const int pos = blk * kBM + row0 + 16 * i;  // past the walked positions: padding, not read
      const int sid = pos < end && hv.local[i / 4] ? __ldg(a.sorted_token_ids + pos) : -1;
      off[i] = sid >= 0 && sid < mk ? sid / a.top_k * a.lda : -1;
    }
    // (only local experts' rows: an id past E would overflow the product)
    const int32_t wrow0 = (hv.local[0] ? hv.e[0] : hv.e[1]) * a.n + tn * BN,
                  wrow1 = hv.two ? hv.e[1] * a.n + tn * BN : 0;
    for (int kt = 0; kt < a.k_tiles; ++kt) {
      kd_wgmma::mbar_wait(&empty[s], phase ^ 1);
      if (p == 0) {
        uint8_t* const b = sb + s * (a.b_boxes * kStageBytesB);
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             &full[s], static_cast<uint32_t>((hv.two ? 2 : 1) * kStageBytesB));
        const int32_t cb0[2] = {kt * kBKe, wrow0};
        cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, b, &tma_w, cb0, &full[s]);
        if (hv.two) {
          const int32_t cb1[2] = {kt * kBKe, wrow1};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, b + kStageBytesB, &tma_w,
                                          cb1, &full[s]);
        }
      }
      const int kc = kt * kBKe + chunk * kChunkE;
      const bool kin = kc < a.k;  // K % 8 == 0 (FP8: % 128): a chunk is all in or all out
      const uint32_t dst = dst0 + s * kStageBytesA;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const bool ok = kin && off[i] >= 0;
        const void* src = ok ? static_cast<const void*>(abase + (static_cast<uint32_t>(off[i]) + kc)) : a.a;
        cp_async16(dst + i * 16 * 128, src, ok ? 16u : 0u);
      }
      cp_async_arrive_noinc(&full[s]);
      if (++s == stages) {
        s = 0;
        phase ^= 1;
      }
    }
  }
  cp_async_wait_all();  // no copy outlives its thread (the consumers wait for them anyway)
}

/// One K-tile of block fp8 (FP8): 4 wgmma k32 into `part`, waited, the
/// stage released, then promoted into acc with the K-group's scales, a's
/// of the thread's two rows (f[h]) times w's of the tile.
template <int BN>
__device__ __forceinline__ void fp8_k_tile(float (&acc)[BN / 2], float (&part)[BN / 2], const uint8_t* ta,
                                           const uint8_t* tb, uint64_t* empty_s, bool lead, float f0, float f1) {
  kd_wgmma::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    kd_wgmma::wgmma_k32_e4m3<BN>(part, kd_wgmma::smem_desc(ta + 32 * kk), kd_wgmma::smem_desc(tb + 32 * kk),
                                 kk > 0 ? 1 : 0);
  kd_wgmma::wgmma_commit();
  kd_wgmma::wgmma_wait<0>();
  if (lead) cuda::ptx::mbarrier_arrive(empty_s);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    acc[4 * j] = fmaf(part[4 * j], f0, acc[4 * j]);
    acc[4 * j + 1] = fmaf(part[4 * j + 1], f0, acc[4 * j + 1]);
    acc[4 * j + 2] = fmaf(part[4 * j + 2], f1, acc[4 * j + 2]);
    acc[4 * j + 3] = fmaf(part[4 * j + 3], f1, acc[4 * j + 3]);
  }
}

/// A consumer warpgroup (after setmaxnreg): wgmma on each stage, then the
/// tile's rows stored. FP8 (block fp8): each K-tile is one 128-wide scale
/// group, summed apart and promoted (fp8_k_tile), its stage released at
/// once (wait_group 0: the other consumer keeps the tensor cores busy).
template <bool BF16, int BN, bool FP8>
__device__ __forceinline__ void consume(const Args& a, const uint8_t* const sa, const uint8_t* const sb,
                                        uint64_t* const full, uint64_t* const empty, const int tiles_m, const int tiles,
                                        const int mk, const int end, const int wg) {
  const int stages = a.stages;
  constexpr int kStageBytesB = BN * 128;
  const int c = wg - 1;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const bool lead = threadIdx.x % 128 == 0;
  const int rloc = 64 * c + 16 * warp + lane / 4;  // the thread's rows rloc, rloc + 8 of the tile
  float acc[BN / 2];
  [[maybe_unused]] float part[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  int s = 0;
  uint32_t phase = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    int blk, tn;
    tile_of(t, tiles_m, a, blk, tn);
    const Halves hv = halves_of(a, blk, end);
    const int e = c == 0 ? hv.e[0] : hv.e[1];  // (not hv.e[c]: a dynamic index puts hv on the stack)
    const bool local = c == 0 ? hv.local[0] : hv.local[1];
    if constexpr (FP8) {  // promoted K-tile by K-tile into zeros
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    }
    const int p0 = blk * kBM + rloc;  // positions past the walked ones: padding, not read
    int s0 = p0 < end ? __ldg(a.sorted_token_ids + p0) : mk;
    int s1 = p0 + 8 < end ? __ldg(a.sorted_token_ids + p0 + 8) : mk;
    if (s0 < 0) s0 = mk;  // treat any out-of-range id as padding
    if (s1 < 0) s1 = mk;
    // The warpgroup's 128 threads cover its 64 rows (4 threads a row).
    // Named barriers 1 and 2 (0 is __syncthreads').
    const bool any_row = s0 < mk || s1 < mk;
    const bool rows = c == 0 ? warpgroup_any<1>(any_row) : warpgroup_any<2>(any_row);
    if (!hv.local[0] && !hv.local[1]) {  // the producer skips the tile: no stage
      if (rows) store_tile<BF16, BN>(acc, a, s0, s1, tn * BN, true);
      continue;
    }
    // A live warpgroup (rows, a local expert) runs the K loop with its
    // wgmma; a dead one (all its rows padding, or its half's expert not
    // local) the same waits and releases without them. Two loops, not an
    // `if (live)` around the wgmma: ptxas serializes wgmma that sit in a
    // branch it cannot prove warpgroup-uniform (C7518), but not a loop
    // whose trip count differs.
    const bool live = rows && local;
    int prev = -1;
    const int kt_live = live ? a.k_tiles : 0;
    const int box = c == 1 && hv.two ? kStageBytesB : 0;  // this half's B box in the stage
    // FP8: the scales of the rows' tokens (padding: token 0's, times zeros)
    // and of the expert's tile.
    [[maybe_unused]] const float *sa0 = nullptr, *sa1 = nullptr, *sw = nullptr;
    if constexpr (FP8) {
      sa0 = a.a_scales + static_cast<int64_t>(s0 < mk ? s0 / a.top_k : 0) * a.k_tiles;
      sa1 = a.a_scales + static_cast<int64_t>(s1 < mk ? s1 / a.top_k : 0) * a.k_tiles;
      sw = a.w_scales + (static_cast<int64_t>(local ? e : 0) * a.tiles_n + tn) * a.ldws;
    }
    for (int kt = 0; kt < kt_live; ++kt) {
      // FP8: the K-group's scales, loaded before the stage's wait (in flight
      // during it and the wgmma: ncu showed L1TEX scoreboard stalls).
      [[maybe_unused]] float f0 = 0.f, f1 = 0.f;
      if constexpr (FP8) {
        const float w = __ldg(sw + kt);
        f0 = w * __ldg(sa0 + kt), f1 = w * __ldg(sa1 + kt);
      }
      kd_wgmma::mbar_wait(&full[s], phase);
      consume_fence();
      const uint8_t* ta = sa + s * kStageBytesA + c * (64 * 128);
      const uint8_t* tb = sb + s * (a.b_boxes * kStageBytesB) + box;
      if constexpr (FP8) {
        fp8_k_tile<BN>(acc, part, ta, tb, &empty[s], lead, f0, f1);
        if (++s == stages) {
          s = 0;
          phase ^= 1;
        }
        continue;
      }
      kd_wgmma::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
        kd_wgmma::wgmma_k16<BF16, BN>(acc, kd_wgmma::smem_desc(ta + 32 * kk), kd_wgmma::smem_desc(tb + 32 * kk),
                                      (kt > 0 || kk > 0) ? 1 : 0);
      kd_wgmma::wgmma_commit();
      kd_wgmma::wgmma_wait<1>();
      if (prev >= 0 && lead) cuda::ptx::mbarrier_arrive(&empty[prev]);
      prev = s;
      if (++s == stages) {
        s = 0;
        phase ^= 1;
      }
    }
    kd_wgmma::wgmma_wait<0>();  // (none pending where dead)
    for (int kt = kt_live; kt < a.k_tiles; ++kt) {
      kd_wgmma::mbar_wait(&full[s], phase);
      if (prev >= 0 && lead) cuda::ptx::mbarrier_arrive(&empty[prev]);
      prev = s;
      if (++s == stages) {
        s = 0;
        phase ^= 1;
      }
    }
    if (prev >= 0 && lead) cuda::ptx::mbarrier_arrive(&empty[prev]);
    // fp8_w8a8 per channel: the expert's column scales (FP8 only).
    const float* cs =
        FP8 && a.col_scales != nullptr && local ? a.col_scales + static_cast<int64_t>(e) * a.ldcs : nullptr;
    if (rows) store_tile<BF16, BN>(acc, a, s0, s1, tn * BN, !local, cs);
  }
}

// ------------------------------------------------------------------ the kernel

template <bool BF16, int BN, bool FP8 = false>
__global__ void __launch_bounds__(kThreads, 1)
    moe_gemm_kernel(const __grid_constant__ CUtensorMap tma_w, const Args a) {
#if KD_WGMMA_ENABLED
  extern __shared__ uint8_t smem_raw[];
  // 128 cp.async arrivals (noinc) and the expect_tx arrive a stage
  const kd_wgmma::Stages st = kd_wgmma::stages_of<BN>(smem_raw, a.stages, 128 + 1, a.b_boxes);
  uint8_t* const sa = st.a;
  uint8_t* const sb = st.b;
  uint64_t* const full = st.full;
  uint64_t* const empty = st.empty;
  asm volatile("griddepcontrol.wait;" ::: "memory");

  const int end = walked_end(a);
  const int tiles_m = end / kBM + (end % kBM != 0 ? 1 : 0);
  const int tiles = tiles_m * a.tiles_n;
  const int mk = a.m * a.top_k;
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    // ---------------------------------------------------------------- producer
    kd_wgmma::setmaxnreg_dec<40>();
    produce<BN, FP8>(tma_w, a, sa, sb, full, empty, tiles_m, tiles, mk, end);
  } else {
    // ---------------------------------------------------------------- consumers
    kd_wgmma::setmaxnreg_inc<232>();
    consume<BF16, BN, FP8>(a, sa, sb, full, empty, tiles_m, tiles, mk, end, wg);
  }
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
  (void)tma_w, (void)a;
  __trap();
#endif
}

}  // namespace kd_wgmma_moe
