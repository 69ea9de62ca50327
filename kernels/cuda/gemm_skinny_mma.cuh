// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the skinny_mma GEMM family: decode-time shapes
// (M <= 16) as a weight stream with the multiply on tensor cores. The
// CUDA-core skinny kernel re-reads the activation rows per weight chunk and
// becomes L1- then FMA-bound from M ~ 4; here the activation rows ride along
// with the weights and the multiply is mma.sync, so the kernel stays a read
// of B up to M = 16. CUDA only; one TU per input dtype.
//
// The transposed product D^T[N, M] = B[N, K] · A^T: weight rows are mma's
// 16-row "A" operand, activation rows its 8-column "B" operand (M <= 8: one
// n-tile; 9..16: two).
//
// A block's warps form split_k groups of warps_n warps. A group owns a
// contiguous range of K (64-element chunks) for the block's
// warps_n * 16 * RT rows of B, each warp 16 * RT of them, and streams it
// through the group's ring of S stages in shared memory: a stage holds 128
// bytes (64 elements) of every B row of the group and of every A row of the
// tile, so the activation rows are read once per group, not once per warp
// (at M = 16 with one warp per group they are as many bytes as the weights'),
// at the cost of a barrier of the group's warps per stage (none when
// warps_n = 1: __syncwarp). Stages are loaded with
// cp.async.cg 16 bytes per lane (8 lanes read one row's whole 128-byte line;
// B with an L2 evict-first policy, it is read once), chunk c of row r stored
// at chunk c ^ (r & 7) so that ldmatrix reads are free of bank conflicts.
// The loads of stage it + S - 1 are issued before stage it is used, so S - 1
// stages per group are in flight. Bytes past K and rows past N or M are
// zero-filled by cp.async (src-size 0..16), never read.
//
// A block's split_k groups cover consecutive K ranges; a cluster of
// cluster_k blocks (gridDim.y, thread-block cluster (1, cluster_k, 1))
// covers consecutive ranges of the same rows again. Partial tiles are added
// in group order through shared memory, then in cluster-rank order: each
// rank owns a slice of the tile's outputs and every rank pushes its sums of
// that slice into the owner's shared memory (distributed shared memory, one
// cluster barrier): deterministic, no workspace. M above 16 runs in chunks
// of 16 (gridDim.z): correct for any M, fast for M <= 16.
//
// Measured on an H200 (scratch harness, cold L2): 88-97% of a same-size read
// at M <= 8 and 80-91% at M = 16 over the Llama-3 8B/70B-TP8 weight shapes;
// the tuner picks per shape (bench/results/h200_gemm.md).
#pragma once

#include <cooperative_groups.h>

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/backend_decls.hpp"
#include "gpu/gemm_kernels.cuh"
#include "gpu/gemm_launch.hpp"
#include "gpu/gemm_plan.hpp"
#include "gpu/launch_util.hpp"

namespace dispatch::cuda::gemm_skinny_mma {

using gemm::Args;

inline constexpr int kRowBytes = 128;  // bytes of one row in a stage: 64 bf16/fp16 or 128 fp8 elements of K
inline constexpr int kMaxWarps = 8;    // split_k * warps_n <= 8

KDISPATCH_DEVICE_INLINE uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

/// 16 bytes global -> shared, of which `src_bytes` (0..16) are read and the
/// rest zero-filled; `policy`: an L2 cache policy (createpolicy).
KDISPATCH_DEVICE_INLINE void cp_async16(uint32_t dst, const void* src, int src_bytes, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes), "l"(policy));
#endif
}
KDISPATCH_DEVICE_INLINE void cp_async16(uint32_t dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
#endif
}
/// 4 bytes global -> shared (src_bytes 0 or 4; 0 zero-fills).
KDISPATCH_DEVICE_INLINE void cp_async4(uint32_t dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
#endif
}
KDISPATCH_DEVICE_INLINE void cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
KDISPATCH_DEVICE_INLINE void cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}
/// Barrier `id` (1..15; 0 is __syncthreads) of `threads` threads, a multiple of 32.
KDISPATCH_DEVICE_INLINE void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
KDISPATCH_DEVICE_INLINE void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

/// How the fp8 GEMMs scale the products (src/ops/gemm_fp8.hpp); `none` for bf16/fp16.
enum class Scales : int { none, tensor, rowwise, block };

/// The fp8 GEMMs' scales (unused when Scales::none): sa and sb with their row
/// strides in elements (the block layout's: sa [ceil(K/128), M] M-major,
/// sb [ceil(N/128), ceil(K/128)]).
struct ScaleArgs {
  const float* sa = nullptr;
  const float* sb = nullptr;
  int64_t ldsa = 0, ldsb = 0;
};

/// Bytes per element of an input dtype (fp8: 1).
template <DType DT>
inline constexpr int kElemBytes = DT == DType::fp8_e4m3fn ? 1 : 2;

/// One k16 step of 16-bit inputs or one k32 step of fp8 (e4m3) inputs: the
/// same 32 bytes of each row and the same register layout (each register
/// holds 4 consecutive bytes of K), so the ldmatrix addressing is shared.
template <DType DT>
KDISPATCH_DEVICE_INLINE void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  if constexpr (DT == DType::fp8_e4m3fn) {
    asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    return;
  }
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // Not volatile: a pure function of its operands.
  if constexpr (DT == DType::fp8_e4m3fn) {
    __trap();  // no fp8 mma below sm_89 (the launcher declines it)
  } else if constexpr (DT == DType::bf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
#else
  __trap();
#endif
}

/// The split cluster barrier (sm_90): every thread arrives (no memory
/// ordering) / waits for every thread of the cluster to have arrived.
KDISPATCH_DEVICE_INLINE void cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}
KDISPATCH_DEVICE_INLINE void cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#endif
}

/// Byte offset of (row, 16-byte chunk) in a stage (chunk swizzled by row).
KDISPATCH_DEVICE_INLINE uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// ------------------------------------------------------------------ the kernel's pieces
//
// skinny_mma_kernel below, in pieces (all forced inline): they compile to
// the SASS of the kernel written in one piece (checked with ptxas -v and
// the .text of every instantiation when it was split). What keeps it so:
// the kernel's arrays (accumulators, copy sources, scales) and its
// pipeline loop stay in the kernel; the pieces take them by reference.

/// x = 0: a set of skinny_mma_kernel's accumulators.
template <int RT, int NT>
KDISPATCH_DEVICE_INLINE void zero(float (&x)[2][RT][NT][4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[h][r][j][e] = 0.f;
}

/// Where this lane copies from, for rows first + 4i (i < N) of a row-major
/// operand of `rows` rows, `ld` elements of EB bytes apart: src[i] the row
/// (row 0 past the end) and ok[i] whether it is one.
template <int EB, int N>
KDISPATCH_DEVICE_INLINE void row_sources(const unsigned char* (&src)[N], bool (&ok)[N], const unsigned char* base,
                                         int64_t first, int64_t rows, int64_t ld) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int64_t row = first + 4 * i;
    ok[i] = row < rows;
    src[i] = base + (ok[i] ? row : 0) * ld * EB;
  }
}

/// out[0] += (sum[0] + sum[1]) * sa * sb: a stage's block-scaled sums
/// (SC == block) joining the accumulators.
template <int RT, int NT>
KDISPATCH_DEVICE_INLINE void add_scaled(float (&out)[2][RT][NT][4], const float (&sum)[2][RT][NT][4],
                                        const float (&sa)[NT][2], float sb) {
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[0][r][j][e] += (sum[0][r][j][e] + sum[1][r][j][e]) * (sa[j][e & 1] * sb);
}

/// Where a thread of skinny_mma_kernel works: its warp in the block, the
/// block's rows of B and of A, its group's ring of stages and range of K.
struct Place {
  int lane, warp, warps;
  int groups;      // split_k
  int wn, grp;     // this warp's rows, its group
  int group_rows;  // B rows of the block (and of a stage)
  uint32_t stage_bytes, ring;
  uint32_t b_off;  // this warp's B rows in a stage
  uint32_t a_off;  // the A rows in a stage
  int64_t nb;      // the block's first row of B
  int64_t n0, m0;
  int rank;             // == the block's rank in its (1, cluster_k, 1) cluster
  uint32_t scale_ring;  // the block scales' ring (SC == block)
  int64_t c_begin;      // this group's chunks [c_begin, c_begin + iters) of K
  int iters;
};

/// The Place of this thread (skinny_mma_kernel's arguments).
template <DType DT, int RT, int NT, int S>
KDISPATCH_DEVICE_INLINE Place place_of(const Args& g, int cluster_k, int warps_n, int recv_off, unsigned char* smem) {
  constexpr int kBRows = 16 * RT, kARows = 8 * NT;
  constexpr int kChunk = kRowBytes / kElemBytes<DT>;  // K elements per stage
  Place t;
  t.lane = static_cast<int>(threadIdx.x) & 31, t.warp = static_cast<int>(threadIdx.x) >> 5;
  t.warps = static_cast<int>(blockDim.x) >> 5;
  t.groups = t.warps / warps_n;
  t.wn = t.warp % warps_n, t.grp = t.warp / warps_n;
  t.group_rows = warps_n * kBRows;
  t.stage_bytes = static_cast<uint32_t>((t.group_rows + kARows) * kRowBytes);
  t.ring = smem_addr(smem) + static_cast<uint32_t>(t.grp * S) * t.stage_bytes;
  t.b_off = static_cast<uint32_t>(t.wn * kBRows * kRowBytes);
  t.a_off = static_cast<uint32_t>(t.group_rows * kRowBytes);
  t.nb = static_cast<int64_t>(blockIdx.x) * t.group_rows;
  t.n0 = t.nb + t.wn * kBRows;
  t.m0 = static_cast<int64_t>(blockIdx.z) * kARows;
  t.rank = static_cast<int>(blockIdx.y);
  // The scale ring (SC == block): past the rings, the partials and the
  // cluster's receive area (skinny_mma_smem_bytes with scale_ring).
  t.scale_ring = smem_addr(smem) + static_cast<uint32_t>(recv_off) +
                 static_cast<uint32_t>(cluster_k > 1 ? warps_n * 32 * RT * NT * 16 : 0) +
                 static_cast<uint32_t>(t.grp * S * gpu::gemm::kSkinnyMmaScaleSlotBytes);

  // This group's chunks [c_begin, c_end) of K: worker rank * groups + grp of
  // cluster_k * groups, consecutive ranges.
  const int64_t chunks = (static_cast<int64_t>(g.k) + kChunk - 1) / kChunk;
  const int64_t workers = static_cast<int64_t>(cluster_k) * t.groups;
  const int64_t per = (chunks + workers - 1) / workers;
  const int64_t wk = static_cast<int64_t>(t.rank) * t.groups + t.grp;
  t.c_begin = wk * per < chunks ? wk * per : chunks;
  const int64_t c_end = t.c_begin + per < chunks ? t.c_begin + per : chunks;
  t.iters = static_cast<int>(c_end - t.c_begin);
  return t;
}

/// The loads of one stage of skinny_mma_kernel's pipeline, a closure over
/// the kernel's locals (by reference): `(*this)(slot, chunk)` issues the cp.async copies of
/// K chunk `chunk` into ring slot `slot` of the group: this lane's 16 bytes
/// of each of the warp's B rows (bsrc, bok), of the group's A rows that are
/// this warp's (instruction i, rows prow + 4i: i % warps_n == wn) and, SC ==
/// block, the stage's scales.
template <DType DT, Scales SC, int RT, int NT>
struct StageLoads {
  const Args& g;
  const ScaleArgs& sc;
  const Place& t;
  const int& warps_n;
  const uint64_t& evict_first;
  const int& prow;
  const int& pch;
  const unsigned char* const (&bsrc)[RT * 4];
  const bool (&bok)[RT * 4];
  const unsigned char* const (&asrc)[NT * 2];
  const bool (&aok)[NT * 2];

  KDISPATCH_DEVICE_INLINE void operator()(int slot, int64_t chunk) const {
    constexpr int kARows = 8 * NT;
    constexpr int kEB = kElemBytes<DT>;      // bytes per element
    constexpr int kChunk = kRowBytes / kEB;  // K elements per stage
    constexpr int kLaneElems = 16 / kEB;     // K elements of one 16-byte copy
    const uint32_t st = t.ring + static_cast<uint32_t>(slot) * t.stage_bytes;
    const int64_t k = chunk * kChunk + pch * kLaneElems;  // this lane's first element
    const int bytes = k < g.k ? static_cast<int>(g.k - k < kLaneElems ? g.k - k : kLaneElems) * kEB : 0;
    const int64_t off = bytes ? k * kEB : 0;  // a valid address even when nothing is read
#pragma unroll
    for (int i = 0; i < RT * 4; ++i)
      cp_async16(st + t.b_off + swz(prow + 4 * i, pch), bsrc[i] + off, bok[i] ? bytes : 0, evict_first);
#pragma unroll
    for (int i = 0; i < NT * 2; ++i)
      if ((i & (warps_n - 1)) == t.wn)
        cp_async16(st + t.a_off + swz(prow + 4 * i, pch), asrc[i] + off, aok[i] ? bytes : 0);
    if constexpr (SC == Scales::block) {
      if (t.wn == 0) {
        const uint32_t slot_addr = t.scale_ring + static_cast<uint32_t>(slot * gpu::gemm::kSkinnyMmaScaleSlotBytes);
        if (t.lane < kARows) {
          const int64_t m = t.m0 + t.lane;
          cp_async4(slot_addr + 4u * t.lane, sc.sa + chunk * sc.ldsa + (m < g.m ? m : 0), m < g.m ? 4 : 0);
        } else if (t.lane == 16) {
          const int64_t nblk = (t.nb < g.n ? t.nb : g.n - 1) / kChunk;
          cp_async4(slot_addr + 64u, sc.sb + nblk * sc.ldsb + chunk, 4);
        }
      }
    }
  }
};

/// Writes output o of a skinny_mma_kernel block's tile (the kernel's
/// reduction numbers them) with value v, scaled (tensor, rowwise) and plus
/// the bias, to D.
template <Scales SC, int RT, int NT>
KDISPATCH_DEVICE_INLINE void finish_out(const Args& g, const ScaleArgs& sc, const Place& t, int warps_n, int o,
                                        float v) {
  constexpr int kBRows = 16 * RT;
  const int ln = o & 31, w = (o >> 5) % warps_n, q = (o >> 5) / warps_n;
  const int r = q / (NT * 4), j = (q / 4) % NT, e = q % 4;
  // mma C layout: c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = row g + 8.
  const int64_t n = t.nb + w * kBRows + r * 16 + (ln >> 2) + (e >= 2 ? 8 : 0);
  const int64_t m = t.m0 + j * 8 + 2 * (ln & 3) + (e & 1);
  if (n >= g.n || m >= g.m) return;
  if constexpr (SC == Scales::tensor) v *= sc.sa[0] * sc.sb[0];
  if constexpr (SC == Scales::rowwise) v *= sc.sa[m] * sc.sb[n];
  if (g.bias) v += gemm::load_out(g.bias, g.out_dtype, n);
  gemm::store_out(g.d, g.out_dtype, m * g.ldd + n, v);
}

/// The end of skinny_mma_kernel's reduction when the cluster has more than
/// one block (cluster_k > 1): once every rank has pushed its sums, each adds
/// its slice of the outputs (`slice` of them, recv[rank][slice]) in rank
/// order and finishes them (`finish(o, v)`).
template <class Finish>
KDISPATCH_DEVICE_INLINE void cluster_finish(const Finish& finish, const float* recv, int cluster_k, int slice, int rank,
                                            int threads) {
  if (cluster_k == 1) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::this_cluster().sync();  // every rank's sums of every slice have landed
  for (int o = static_cast<int>(threadIdx.x); o < slice; o += threads) {
    float v = 0.f;
    for (int rk = 0; rk < cluster_k; ++rk) v += recv[rk * slice + o];
    finish(rank * slice + o, v);
  }
#else
  __trap();  // no clusters in this image: never drop the other ranks' sums
#endif
}

/// DT the input dtype (bf16, fp16 or fp8 e4m3fn), SC how fp8 products are
/// scaled: tensor and rowwise scale each output once at the end; block
/// scales each stage's sums (a stage is one 128-wide K group of fp8) by
/// sa[kb, m] * sb[n / 128, kb] before they join the accumulators. The
/// block scales ride the same pipeline as the data: the group's first warp
/// copies the stage's 8 NT values of sa and its one sb (a group's rows lie
/// in one 128-row block) into the stage's slot of a scale ring (cp.async,
/// 4 bytes per lane, zero past M), so they are S - 1 stages ahead too
/// (loading them from global memory per stage cost ~10% at M = 1).
/// RT 16-row tiles of B per warp, NT 8-row tiles of A, S ring stages;
/// warps_n (1, 2 or 4) warps per group along N.
/// Launch: grid (ceil(N / (16 RT warps_n)), cluster_k, ceil(M / 8NT)),
/// 32 * split_k * warps_n threads, skinny_mma_smem_bytes(RT, NT, S, split_k,
/// warps_n, cluster_k) of dynamic shared memory, cluster (1, cluster_k, 1) when
/// cluster_k > 1; recv_off = skinny_mma_recv_offset(RT, NT, S, split_k,
/// warps_n), where the cluster reduction's receive area starts.
///
/// The reduction: partial tiles are added up in group order, then in
/// cluster-rank order (the same order of additions whatever the block
/// shape: deterministic). Shared layout element-major, [kAcc][warps][32
/// lanes], so the stores and the loads of the sums are free of bank
/// conflicts. Output element o = (q * warps_n + w) * 32 + ln is lane ln's
/// accumulator q of the group warps' w-th warp. Its group sum goes straight
/// to D when the block is the whole cluster; else rank r owns the outputs
/// [r * slice, (r + 1) * slice) and every rank pushes its sums of them into
/// the owner's `recv` area (past the rings and the partials, so a rank still
/// streaming is not disturbed), one cluster barrier, then each owner adds
/// its slice in rank order: one barrier, no remote reads, and every rank
/// finishes a slice.
template <DType DT, Scales SC, int RT, int NT, int S>
__global__ void __launch_bounds__(32 * kMaxWarps)
    skinny_mma_kernel(Args g, ScaleArgs sc, int cluster_k, int warps_n, int recv_off) {
  constexpr int kEB = kElemBytes<DT>;  // bytes per element
  constexpr int kAcc = RT * NT * 4;
  // A cluster's blocks write into each other's shared memory at the end; the
  // writes wait on this arrival of every thread (all blocks have started, as
  // the CUDA guide asks before distributed shared memory is touched).
  if (cluster_k > 1) cluster_arrive_relaxed();
  port::grid_dependency_wait();  // released after the stream (port.hpp says why)
  extern __shared__ __align__(128) unsigned char smem[];
  const Place t = place_of<DT, RT, NT, S>(g, cluster_k, warps_n, recv_off, smem);
  const int iters = t.iters;  // locals: the pipeline loop's bounds compile as in one piece
  const int64_t c_begin = t.c_begin;

  uint64_t evict_first = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(evict_first));
#endif
  // Lane l copies chunk (l & 7) of rows (l >> 3) + 4i: 8 lanes per row line.
  const int prow = t.lane >> 3, pch = t.lane & 7;
  const auto* A = static_cast<const unsigned char*>(g.a);
  const auto* B = static_cast<const unsigned char*>(g.b);
  const unsigned char* bsrc[RT * 4];
  bool bok[RT * 4];
  row_sources<kEB>(bsrc, bok, B, t.n0 + prow, g.n, g.ldb);
  const unsigned char* asrc[NT * 2];
  bool aok[NT * 2];
  row_sources<kEB>(asrc, aok, A, t.m0 + prow, g.m, g.lda);
  const StageLoads<DT, SC, RT, NT> issue{g, sc, t, warps_n, evict_first, prow, pch, bsrc, bok, asrc, aok};

  // Two accumulator sets (even and odd k16 steps): half the mma dependency chain.
  float acc[2][RT][NT][4];
  zero(acc);

#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < iters) issue(s, c_begin + s);
    cp_commit();  // empty groups keep the wait_group count uniform
  }
  // ldmatrix.x4 lane addresses: B (mma A operand) rows lane & 15 of a 16-row
  // tile, chunk + (lane >> 4); A (mma B operand) row lane & 7, chunk + (lane >> 3).
  const int lane = t.lane;
  const int b_row = (lane & 7) + ((lane >> 3) & 1) * 8, b_ch = lane >> 4;
  const int a_row = lane & 7, a_ch = lane >> 3;
  int slot = 0;
  for (int it = 0; it < iters; ++it) {
    cp_wait<S - 2>();  // stage `it` has landed (this lane's copies) ...
    // ... and every lane's of the group; the slot of it - 1 is free.
    if (warps_n == 1)
      __syncwarp();
    else
      named_barrier(1 + t.grp, 32 * warps_n);
    {
      int next = slot + S - 1;
      if (next >= S) next -= S;
      if (it + S - 1 < iters) issue(next, c_begin + it + S - 1);
      cp_commit();
    }
    const uint32_t st = t.ring + static_cast<uint32_t>(slot) * t.stage_bytes;
    // Block scales (SC == block): this thread's outputs are rows n0 + 16r +
    // (lane >> 2) (+ 8) of B, all in the group's 128-row block, and columns
    // m0 + 8j + 2(lane & 3) (+ 1) of A: sa[8j + 2(lane & 3) + e] and sb of
    // the stage's scale slot.
    float sa_cur[NT][2] = {}, sb_cur = 0.f;
    if constexpr (SC == Scales::block) {
      const auto* ss = reinterpret_cast<const float*>(
          smem + (t.scale_ring - smem_addr(smem)) + static_cast<uint32_t>(slot * gpu::gemm::kSkinnyMmaScaleSlotBytes));
#pragma unroll
      for (int j = 0; j < NT; ++j)
        sa_cur[j][0] = ss[8 * j + 2 * (lane & 3)], sa_cur[j][1] = ss[8 * j + 2 * (lane & 3) + 1];
      sb_cur = ss[16];
    }
    // Block scales: the stage's sums start from zero and join the
    // accumulators scaled (the compiler drops the copy otherwise).
    float(&out)[2][RT][NT][4] = acc;
    float stage_acc[2][RT][NT][4];
    if constexpr (SC == Scales::block) zero(stage_acc);
    float(&sum)[2][RT][NT][4] = SC == Scales::block ? stage_acc : acc;
#pragma unroll
    for (int kp = 0; kp < 2; ++kp) {  // two k16 (fp8: k32) steps per A load: chunks 4kp .. 4kp + 3
      uint32_t b[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) ldsm_x4(st + t.a_off + swz(j * 8 + a_row, 4 * kp + a_ch), b[j]);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          uint32_t a[4];
          ldsm_x4(st + t.b_off + swz(r * 16 + b_row, 4 * kp + 2 * h + b_ch), a);
#pragma unroll
          for (int j = 0; j < NT; ++j) mma<DT>(sum[h][r][j], a, b[j][2 * h], b[j][2 * h + 1]);
        }
    }
    if constexpr (SC == Scales::block) add_scaled(out, sum, sa_cur, sb_cur);
    if (++slot == S) slot = 0;
    // The slot just read is refilled one trip later, after that trip's
    // barrier: every lane of the group has finished reading it by then.
  }
  cp_wait<0>();
  port::grid_dependency_release();
  __syncthreads();  // the rings are reused for the reduction

  // Partial tiles to shared memory, then added up (the reduction above).
  const int threads = static_cast<int>(blockDim.x);
  float* part = reinterpret_cast<float*>(smem);  // [kAcc][warps * 32]
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        part[((r * NT + j) * 4 + e) * threads + threadIdx.x] = acc[0][r][j][e] + acc[1][r][j][e];
  __syncthreads();
  const int outs = kAcc * warps_n * 32;
  const int slice = outs / cluster_k;  // outs is a multiple of 32, cluster_k of 1, 2 or 4
  // recv[rank][slice] of cluster_k > 1: past the rings and the partials, at
  // the end of the launch's shared memory (skinny_mma_smem_bytes reserves it).
  float* recv = reinterpret_cast<float*>(smem + recv_off);
  auto finish = [&](int o, float v) { finish_out<SC, RT, NT>(g, sc, t, warps_n, o, v); };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  if (cluster_k > 1) cluster_wait();  // every block of the cluster has started (the arrival at the top)
#endif
  for (int o = static_cast<int>(threadIdx.x); o < outs; o += threads) {
    const int ln = o & 31, w = (o >> 5) % warps_n, q = (o >> 5) / warps_n;
    const float* src = part + q * threads + w * 32 + ln;  // group gi's warp: gi * warps_n + w
    float p[kMaxWarps];
#pragma unroll
    for (int gi = 0; gi < kMaxWarps; ++gi) p[gi] = gi < t.groups ? src[gi * warps_n * 32] : 0.f;  // loads together
    float v = 0.f;
#pragma unroll
    for (int gi = 0; gi < kMaxWarps; ++gi)
      if (gi < t.groups) v += p[gi];
    if (cluster_k == 1) {
      finish(o, v);
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      const int owner = o / slice;
      cg::this_cluster().map_shared_rank(recv, owner)[t.rank * slice + (o - owner * slice)] = v;
#endif
    }
  }
  cluster_finish(finish, recv, cluster_k, slice, t.rank, threads);
}

using KernelFn = void (*)(Args, ScaleArgs, int, int, int);

template <DType DT, Scales SC, int RT, int NT>
constexpr KernelFn kernel_for_stages(int stages) {
  return stages == 3   ? skinny_mma_kernel<DT, SC, RT, NT, 3>
         : stages == 4 ? skinny_mma_kernel<DT, SC, RT, NT, 4>
                       : skinny_mma_kernel<DT, SC, RT, NT, 6>;
}

/// The compiled kernels of (DT, SC) in skinny_mma_kernel_index order.
template <DType DT, Scales SC>
const KernelFn* kernels() {
  static const KernelFn k[gpu::gemm::kSkinnyMmaKernels] = {
      kernel_for_stages<DT, SC, 1, 1>(3), kernel_for_stages<DT, SC, 1, 1>(4), kernel_for_stages<DT, SC, 1, 1>(6),
      kernel_for_stages<DT, SC, 1, 2>(3), kernel_for_stages<DT, SC, 1, 2>(4), kernel_for_stages<DT, SC, 1, 2>(6),
      kernel_for_stages<DT, SC, 2, 1>(3), kernel_for_stages<DT, SC, 2, 1>(4), kernel_for_stages<DT, SC, 2, 1>(6),
      kernel_for_stages<DT, SC, 2, 2>(3), kernel_for_stages<DT, SC, 2, 2>(4), kernel_for_stages<DT, SC, 2, 2>(6)};
  return k;
}

/// Launches the point `sk` on filled arguments (the bf16/fp16 GEMM's or an
/// fp8 GEMM's, whose launchers check their own slots first).
template <DType DT, Scales SC>
Status launch_args(const gpu::gemm::SkinnyMma& sk, const core::LaunchArgs& la, const core::Problem& p, const Args& g,
                   const ScaleArgs& sc) noexcept {
  const int nt = gpu::gemm::skinny_mma_n_tiles(p.m);
  const int rt = sk.row_tiles, wn = sk.warps_n;
  const int64_t mchunks = (p.m + 8 * nt - 1) / (8 * nt);
  if (mchunks > 65535) return core::needs_fallback("skinny_mma: M too large");
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>((p.n + 16 * rt * wn - 1) / (16 * rt * wn)),
                     static_cast<unsigned>(sk.cluster_k), static_cast<unsigned>(mchunks));
  cfg.blockDim = dim3(static_cast<unsigned>(32 * sk.split_k * wn));
  cfg.dynamicSmemBytes = static_cast<size_t>(
      gpu::gemm::skinny_mma_smem_bytes(rt, nt, sk.stages, sk.split_k, wn, sk.cluster_k, SC == Scales::block));
  cfg.stream = static_cast<port::Stream>(la.stream);
  DeviceGuard guard(p.device.ordinal);
  cudaLaunchAttribute attr[2];
  int na = 0;
  if (pdl_enabled(p.device.ordinal)) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  if (sk.cluster_k > 1) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = 1;
    attr[na].val.clusterDim.y = static_cast<unsigned>(sk.cluster_k);
    attr[na].val.clusterDim.z = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = static_cast<unsigned>(na);
  const KernelFn k = kernels<DT, SC>()[gpu::gemm::skinny_mma_kernel_index(rt, nt, sk.stages)];
  const int recv_off = static_cast<int>(gpu::gemm::skinny_mma_recv_offset(rt, nt, sk.stages, sk.split_k, wn));
  const port::Error e = cudaLaunchKernelEx(&cfg, k, g, sc, sk.cluster_k, wn, recv_off);
  if (e != port::kSuccess) (void)cudaGetLastError();
  return port::status(e, "gemm skinny_mma kernel launch");
}

template <DType DT>
Status launch(const gpu::gemm::SkinnyMma& sk, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  Args g;
  if (Status st = gemm::fill_args(la, p, &g); !st.ok()) return st;
  if (!gemm::vector_aligned(la, p))
    return core::needs_fallback("skinny_mma: A/B pointers or row strides not 16-byte aligned");
  return launch_args<DT, Scales::none>(sk, la, p, g, ScaleArgs{});
}

/// Fills out[skinny_mma_kernel_index] on the current device and raises each
/// kernel's dynamic shared memory limit to the device's opt-in maximum (the
/// space's resolve checks each launch against it).
template <DType DT, Scales SC = Scales::none>
void probe(KernelImage* out, int64_t smem_optin) noexcept {
  const KernelFn* k = kernels<DT, SC>();
  for (int i = 0; i < gpu::gemm::kSkinnyMmaKernels; ++i)
    out[i] = smem_optin > 48 * 1024 ? image_with_smem(k[i], smem_optin) : image_of(k[i]);
}
template <DType DT>
void probe(KernelImage* out, const ProbeEnv& env) noexcept {
  probe<DT, Scales::none>(out, env.smem_optin);
}

}  // namespace dispatch::cuda::gemm_skinny_mma

/// The body of kernels/cuda/gemm_skinny_mma_<dtype>.cu.
#define KDISPATCH_GEMM_SKINNY_MMA_TU(dt) \
  KDISPATCH_GEMM_FAMILY_TU(skinny_mma, SkinnyMma, gpu::gemm::kSkinnyMmaKernels, dt)
