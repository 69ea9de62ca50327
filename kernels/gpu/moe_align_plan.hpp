// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — moe_align: the families, their config space and
// how a config point becomes a launch. Plain C++ (no GPU headers): the
// variant list (host code), the kernels' launcher and the tests share it,
// for CUDA and HIP alike.
//
//   the M * top_k (token, choice) pairs of topk_ids [M, top_k] sorted by
//   expert, an expert's pairs in ascending pair order, padded to blocks of
//   block_size (src/ops/moe_align.hpp: moe_align_spec::align's bits)
//
// Tiny work (M * top_k pairs, a few thousand at decode), all of it on one
// block: the latency of one launch is the cost.
//
// Families (kernels/gpu/moe_align_kernels.cuh):
//
//   block      one launch of one block of `threads`: each warp owns a
//              contiguous segment of the pairs and counts them per expert in
//              shared memory (count[warp][E]); a block scan of the padded
//              counts gives each (warp, expert) its first slot; the blocks'
//              expert ids come from a binary search of the experts' starts;
//              each warp then places its segment warp-wide, a pair's rank
//              among its warp's equal experts from a match of the lanes. A
//              pair's slot depends only on topk_ids: deterministic.
//                threads {256, 512, 1024}   a multiple of the warp
//              Shared memory 4 * (E * (warps + 1) + warps + 1) bytes, at
//              most 48 KiB: E up to 371 at 1024 threads on CUDA (32 warps),
//              721 on HIP's 64-wide wavefronts; more at fewer threads.
//   reference  one warp, the experts in order, each a ballot over every
//              pair (E passes, as the CPU's __ref): any E; the tuner's
//              validation baseline (kVariantReference).
#pragma once

#include <cstdint>

#include "core/op.hpp"
#include "ops/moe_align.hpp"

namespace dispatch::gpu::moe_align {

/// The op these kernels compute.
inline constexpr core::OpKind kOp = core::OpKind::moe_align;

/// The families, in kernel-image order (kernel_index).
enum class Family : uint8_t { block = 0, reference = 1 };
constexpr int kernel_index(Family f) { return static_cast<int>(f); }
/// Kernels in the TU (one per family) and the param slot of `threads`.
inline constexpr int kKernels = 2, kThreads = 0;
inline constexpr int64_t kThreadValues[] = {256, 512, 1024};
/// The block kernel's launch bound; the shared memory it may take (the
/// limit without an opt-in on CUDA).
inline constexpr int kMaxBlockThreads = 1024;
inline constexpr int64_t kMaxSmemBytes = 48 * 1024;

/// The block kernel's shared memory: count[warps][E], start[E + 1] and
/// the scan's warp totals [warps], int32 each.
constexpr int64_t smem_bytes(int64_t experts, int64_t threads, int warp) {
  const int64_t warps = threads / warp;
  return 4 * (experts * (warps + 1) + warps + 1);
}

/// One launch, resolved from (family, params, the problem's dims).
struct Launch {
  Family family = Family::reference;
  int32_t threads = 0;     ///< threads of the one block (the reference: one warp)
  int64_t smem_bytes = 0;  ///< dynamic shared memory (the block kernel)
};

/// Resolves a config point for M tokens of top_k choices among `experts`
/// experts in blocks of `block` on a backend whose warp is `warp` threads.
/// Returns nullptr and fills `*out` when the point serves the problem, else
/// the reason it declines (a static string: no allocation, so the launch
/// path can call it).
constexpr const char* resolve(Family f, int64_t m, int64_t top_k, int64_t experts, int64_t block, int warp,
                              const int64_t* prm, Launch* out) {
  if (experts < 1 || block < 1 || top_k < 1) return "E, block_size and top_k must be >= 1";
  if (experts > int64_t{1} << 24 || block > int64_t{1} << 24) return "E and block_size must be <= 2^24";
  // int32 outputs: the pairs' indices and the padded count must fit.
  const int64_t p = core::moe_align_spec::padded_capacity(m, top_k, experts, block);
  if (p < 0 || p > INT32_MAX) return "M*top_k + min(E, M*top_k)*(block_size - 1) exceeds int32";
  Launch l{f, warp, 0};
  if (f == Family::block) {
    l.threads = static_cast<int32_t>(prm[kThreads]);
    bool in_space = false;
    for (int64_t v : kThreadValues) in_space = in_space || v == l.threads;
    if (!in_space || l.threads % warp != 0) return "threads is not a point of the space (a multiple of the warp)";
    l.smem_bytes = smem_bytes(experts, l.threads, warp);
    if (l.smem_bytes > kMaxSmemBytes)
      return "E experts' per-warp counts exceed 48 KiB of shared memory at these threads (fewer threads, or the "
             "reference)";
  }
  *out = l;
  return nullptr;
}

}  // namespace dispatch::gpu::moe_align
