// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — moe_align kernels, written once for CUDA and HIP
// (gpu/port.hpp). The op's one translation unit per backend,
// kernels/<backend>/moe_align.{cu,hip}, instantiates them with
// KDISPATCH_MOE_ALIGN_TU (2 kernels; families and params:
// gpu/moe_align_plan.hpp).
//
//   sorted_token_ids, expert_ids, num_tokens_post_pad: the (token, choice)
//   pairs of topk_ids sorted by expert, an expert's pairs ascending, padded
//   to blocks (moe_align_spec::align writes the same bits).
//
// Why the kernels look the way they do. The op moves a few thousand int32
// at decode: one launch of one block, whose cost is its latency.
//  - block_kernel: warp w owns a contiguous segment of the pairs. It counts
//    them per expert in count[w][E] (shared atomics: counts do not depend
//    on the order). Then each thread takes a contiguous range of experts:
//    it turns count[.][e] into each warp's offset within expert e and sums
//    the experts' padded sizes; one block scan of those sums gives every
//    expert its start, and count[w][e] becomes warp w's write cursor of
//    expert e. The blocks' expert ids follow from a binary search of the
//    starts. Last, each warp walks its segment warp-wide: a lane's rank
//    among the lanes of the same expert (a match of the lanes: CUDA's
//    __match_any_sync, a ballot per distinct value on HIP) is its place
//    after the cursor, and the cursor advances by their number. Segments in
//    warp order and ranks in lane order keep every expert's pairs in
//    ascending order, whatever the scheduling: deterministic.
//  - reference_kernel: one warp, the experts in order, each a ballot over
//    every pair (E passes): no shared memory, any E, nothing in common with
//    block_kernel but the ballot.
//  - On sm_90+ both are launched with programmatic dependent launch and
//    start with griddepcontrol.wait + launch_dependents (KDISPATCH_PDL=0
//    turns it off), as every kernel here.
#pragma once

#include <climits>

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/launch_util.hpp"  // and gpu/backend_decls.hpp
#include "gpu/moe_align_launch.hpp"
#include "ops/moe_align.hpp"

namespace dispatch::KDISPATCH_GPU_NS::moe_align {

namespace plan = gpu::moe_align;
static_assert(plan::kMaxBlockThreads % port::kWarpSize == 0 && plan::kKernels <= kMaxImagesPerTu);

/// Kernel parameters, by value.
struct Args {
  const int32_t* ids;  ///< topk_ids [M][ld]: pair i = t * top_k + j at t * ld + j
  int64_t ld;
  const int32_t* map;   ///< expert_map [E], or null
  int32_t* sorted;      ///< [sorted_n]
  int32_t* expert_ids;  ///< [blocks_n]
  int32_t* total;       ///< [1]
  int32_t pairs;        ///< M * top_k, also the padding value
  int32_t top_k, experts, block;
  int32_t sorted_n, blocks_n;  ///< P and ceil(P / block)
};

// ------------------------------------------------------------------ warp helpers

/// A lane mask of one warp.
#if KDISPATCH_GPU_HIP
using Mask = unsigned long long;
#else
using Mask = uint32_t;
#endif
/// Every lane of a warp.
inline constexpr int kMaskBits = 8 * sizeof(Mask);
inline constexpr Mask kAllLanes =
    port::kWarpSize == kMaskBits ? ~Mask{0} : (Mask{1} << (port::kWarpSize % kMaskBits)) - 1;

KDISPATCH_DEVICE_INLINE int popc(Mask m) {
#if KDISPATCH_GPU_HIP
  return static_cast<int>(__popcll(m));
#else
  return __popc(m);
#endif
}
/// The lanes whose `pred` holds (every lane of the warp calls).
KDISPATCH_DEVICE_INLINE Mask ballot(bool pred) {
#if KDISPATCH_GPU_HIP
  return __ballot(pred) & kAllLanes;
#else
  return __ballot_sync(kAllLanes, pred);
#endif
}
KDISPATCH_DEVICE_INLINE int32_t shfl_up(int32_t v, int d) {
#if KDISPATCH_GPU_HIP
  return __shfl_up(v, static_cast<unsigned>(d));
#else
  return __shfl_up_sync(kAllLanes, v, static_cast<unsigned>(d));
#endif
}
/// The warp's shared memory accesses before it are done and visible to
/// its lanes after it (CUDA's lanes may diverge; HIP's wavefront runs in
/// lockstep, the fences keep the compiler's order).
KDISPATCH_DEVICE_INLINE void warp_sync() {
#if KDISPATCH_GPU_HIP
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
  __builtin_amdgcn_wave_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#else
  __syncwarp(kAllLanes);
#endif
}
/// The lanes holding the same `v` as this one, itself included (every lane
/// of the warp calls). HIP has no match: a ballot per distinct value, the
/// lowest lane left naming it.
KDISPATCH_DEVICE_INLINE Mask peers(int32_t v) {
#if KDISPATCH_GPU_HIP
  Mask left = kAllLanes, mine = 0;
  while (left != 0) {
    const int32_t x = __shfl(v, static_cast<int>(__ffsll(left)) - 1);
    const Mask same = ballot(v == x);
    if (v == x) mine = same;
    left &= ~same;
  }
  return mine;
#else
  return __match_any_sync(kAllLanes, v);
#endif
}
KDISPATCH_DEVICE_INLINE Mask lanes_below(int lane) { return (Mask{1} << lane) - 1; }

/// Pair i's expert, or -1 for an id outside [0, E) (dropped).
KDISPATCH_DEVICE_INLINE int32_t expert_of(const Args& a, uint32_t i) {
  const uint32_t t = i / static_cast<uint32_t>(a.top_k);
  const int32_t v = a.ids[static_cast<int64_t>(t) * a.ld + (i - t * static_cast<uint32_t>(a.top_k))];
  return static_cast<uint32_t>(v) < static_cast<uint32_t>(a.experts) ? v : -1;
}
/// n rounded up to whole blocks (<= P: fits int32).
KDISPATCH_DEVICE_INLINE int32_t padded(int32_t n, int32_t block) {
  return static_cast<int32_t>((static_cast<int64_t>(n) + block - 1) / block * block);
}

/// The sum of `v` over the block's threads before this one (every thread
/// calls; `warp_total`: one int32 per warp of shared memory).
KDISPATCH_DEVICE_INLINE int32_t block_exclusive_sum(int32_t v, int32_t* warp_total) {
  const int lane = static_cast<int>(threadIdx.x) % port::kWarpSize,
            warp = static_cast<int>(threadIdx.x) / port::kWarpSize;
  int32_t x = v;
#pragma unroll
  for (int d = 1; d < port::kWarpSize; d *= 2) {
    const int32_t y = shfl_up(x, d);
    if (lane >= d) x += y;
  }
  if (lane == port::kWarpSize - 1) warp_total[warp] = x;
  __syncthreads();
  int32_t before = x - v;
  for (int w = 0; w < warp; ++w) before += warp_total[w];
  return before;
}

// ------------------------------------------------------------------ the block kernel

/// One block of blockDim.x threads (whole warps), dynamic shared memory
/// plan::smem_bytes(E, blockDim.x, warp).
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(plan::kMaxBlockThreads) block_kernel(Args a) {
  port::grid_dependency_wait_and_release();
  extern __shared__ int32_t sm[];
  const int E = a.experts, threads = static_cast<int>(blockDim.x), tid = static_cast<int>(threadIdx.x);
  const int lane = tid % port::kWarpSize, warp = tid / port::kWarpSize, warps = threads / port::kWarpSize;
  int32_t* count = sm;                  // [warps][E]: the warp's pairs of e, then its cursor in e
  int32_t* start = sm + warps * E;      // [E + 1]: the experts' first slots; start[E] = total
  int32_t* warp_total = start + E + 1;  // [warps]: the scan's
  for (int q = tid; q < warps * E; q += threads) count[q] = 0;
  for (int64_t s = tid; s < a.sorted_n; s += threads) a.sorted[s] = a.pairs;
  __syncthreads();

  // The warp's segment of pairs [lo, hi): whole warps of pairs, in warp order.
  const uint32_t per_warp = (static_cast<uint32_t>(a.pairs) + warps - 1) / warps;
  const uint32_t seg = (per_warp + port::kWarpSize - 1) / port::kWarpSize * port::kWarpSize;
  const uint32_t pairs = static_cast<uint32_t>(a.pairs);
  const uint32_t lo = min(static_cast<uint32_t>(warp) * seg, pairs), hi = min(lo + seg, pairs);
  int32_t* mine = count + warp * E;
  for (uint32_t i = lo + lane; i < hi; i += port::kWarpSize)
    if (const int32_t e = expert_of(a, i); e >= 0) atomicAdd(&mine[e], 1);
  __syncthreads();

  // The thread's experts [e0, e1): count[w][e] -> the pairs of e in the
  // warps before w; start[e] holds e's count until the scan.
  const int per_thread = (E + threads - 1) / threads;
  const int e0 = min(tid * per_thread, E), e1 = min(e0 + per_thread, E);
  int32_t sum = 0;
  for (int e = e0; e < e1; ++e) {
    int32_t n = 0;
    for (int w = 0; w < warps; ++w) {
      const int32_t c = count[w * E + e];
      count[w * E + e] = n;
      n += c;
    }
    start[e] = n;
    sum += padded(n, a.block);
  }
  int32_t at = block_exclusive_sum(sum, warp_total);
  for (int e = e0; e < e1; ++e) {
    const int32_t n = start[e];
    start[e] = at;
    for (int w = 0; w < warps; ++w) count[w * E + e] += at;
    at += padded(n, a.block);
  }
  if (tid == threads - 1) start[E] = at;  // the last thread's experts end the list
  __syncthreads();

  // Block b's expert: the last e whose start is at or before b's first slot
  // (an expert with no blocks has the start of the next); -1 past total.
  const int32_t total = start[E];
  if (tid == 0) *a.total = total;
  for (int64_t b = tid; b < a.blocks_n; b += threads) {
    const int64_t first = b * a.block;
    int32_t label = -1;
    if (first < total) {
      int l = 0, r = E - 1;
      while (l < r) {
        const int mid = (l + r + 1) / 2;
        if (start[mid] <= first)
          l = mid;
        else
          r = mid - 1;
      }
      label = a.map != nullptr ? a.map[l] : l;
    }
    a.expert_ids[b] = label;
  }

  // The warp's segment placed, a warp of pairs at a time (uniform loop).
  for (uint32_t base = lo; base < hi; base += port::kWarpSize) {
    const uint32_t i = base + static_cast<uint32_t>(lane);
    const int32_t e = i < hi ? expert_of(a, i) : -1;
    const Mask same = peers(e);
    const int n = popc(same), rank = popc(same & lanes_below(lane));
    const int32_t cursor = e >= 0 ? mine[e] : 0;
    warp_sync();
    if (e >= 0) {
      a.sorted[cursor + rank] = static_cast<int32_t>(i);
      if (rank == n - 1) mine[e] = cursor + n;
    }
    warp_sync();
  }
}

// ------------------------------------------------------------------ reference kernel

/// The validation baseline: one warp; per expert in order, a ballot over
/// every pair places its pairs in ascending order (the CPU __ref's E
/// passes), then its blocks' ids.
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(port::kWarpSize) reference_kernel(Args a) {
  port::grid_dependency_wait_and_release();
  const int lane = static_cast<int>(threadIdx.x);
  for (int64_t s = lane; s < a.sorted_n; s += port::kWarpSize) a.sorted[s] = a.pairs;
  __syncthreads();
  int64_t at = 0;
  for (int32_t e = 0; e < a.experts; ++e) {
    const int64_t first = at;
    for (int64_t c = 0; c < a.pairs; c += port::kWarpSize) {
      const int64_t i = c + lane;
      const bool hit = i < a.pairs && a.ids[(i / a.top_k) * a.ld + i % a.top_k] == e;
      const Mask m = ballot(hit);
      if (hit) a.sorted[at + popc(m & lanes_below(lane))] = static_cast<int32_t>(i);
      at += popc(m);
    }
    at = first + (at - first + a.block - 1) / a.block * a.block;
    for (int64_t b = first / a.block + lane; b < at / a.block; b += port::kWarpSize)
      a.expert_ids[b] = a.map != nullptr ? a.map[e] : e;
  }
  for (int64_t b = at / a.block + lane; b < a.blocks_n; b += port::kWarpSize) a.expert_ids[b] = -1;
  if (lane == 0) *a.total = static_cast<int32_t>(at);
}

// ------------------------------------------------------------------ host side

/// Enqueues one launch on la.stream and checks the launch (not the
/// kernel's completion).
inline Status launch(const plan::Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  const core::Dims dims_all = core::dims_of(p);
  const int64_t* dims = dims_all.data();
  const int64_t sorted_n = core::moe_align_spec::sorted_extent(dims);
  if (sorted_n < 0 || sorted_n > INT32_MAX || l.threads < 1)
    return make_status(StatusCode::invalid_argument, "moe_align: the padded count exceeds int32");
  const Args a{la.ptr<const int32_t>(core::kAlignArgTopkIds),
               la.ld[core::kAlignArgTopkIds],
               la.ptr<const int32_t>(core::kAlignArgExpertMap),
               la.ptr<int32_t>(core::kAlignArgSorted),
               la.ptr<int32_t>(core::kAlignArgExpertIds),
               la.ptr<int32_t>(core::kAlignArgTotal),
               static_cast<int32_t>(p.m * p.extra[1]),
               static_cast<int32_t>(p.extra[1]),
               static_cast<int32_t>(p.extra[0]),
               static_cast<int32_t>(p.n),
               static_cast<int32_t>(sorted_n),
               static_cast<int32_t>(core::moe_align_spec::blocks_extent(dims))};
  // M = 0 launches too (OpSpec::launches_when_empty): the kernels then write
  // num_tokens_post_pad = 0 and read nothing else, so empty tensors may be null.
  if (a.total == nullptr || (a.pairs > 0 && (a.ids == nullptr || a.sorted == nullptr || a.expert_ids == nullptr)))
    return make_status(StatusCode::invalid_argument, "moe_align: topk_ids and the outputs must not be null");
  const LaunchScope on(la, p);
  const port::Error e = l.family == plan::Family::reference
                            ? port::launch(reference_kernel, dim3(1), dim3(port::kWarpSize), on.stream, on.pdl, a)
                            : port::launch_smem(block_kernel, dim3(1), dim3(static_cast<unsigned>(l.threads)),
                                                static_cast<size_t>(l.smem_bytes), on.stream, on.pdl, a);
  return port::status(e, "moe_align kernel launch");
}

/// Fills out[kernel_index] for both kernels on the current device.
inline void probe(KernelImage* out) noexcept {
  out[plan::kernel_index(plan::Family::block)] = image_of(block_kernel);
  out[plan::kernel_index(plan::Family::reference)] = image_of(reference_kernel);
}

}  // namespace dispatch::KDISPATCH_GPU_NS::moe_align

/// The body of kernels/<backend>/moe_align.{cu,hip}: defines the op's
/// launcher and image probe (gpu/moe_align_launch.hpp, gpu/backend_decls.hpp).
#define KDISPATCH_MOE_ALIGN_TU()                                                                      \
  dispatch::Status dispatch::KDISPATCH_GPU_NS::launch_moe_align(                                      \
      const gpu::moe_align::Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept { \
    return moe_align::launch(l, la, p);                                                               \
  }                                                                                                   \
  void dispatch::KDISPATCH_GPU_NS::probe_moe_align(KernelImage* out, const ProbeEnv&) noexcept {      \
    moe_align::probe(out);                                                                            \
  }
