// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — moe_sum: the families, their config spaces and
// how a config point becomes a launch. Plain C++ (no GPU headers): the
// variant list (host code), the kernels' launchers and the tests share it,
// for CUDA and HIP alike.
//
//   out[t, h] = routed_scaling_factor * sum_{j < top_k} input[t, j, h]
//   input [M, top_k, hidden] (row t * top_k + j of the [M * top_k, hidden]
//   matrix, row stride ldi), out [M, hidden]
//
// A copy that reads top_k rows and writes one per token: at many tokens it
// runs at the memory's speed, at few at its latency. The portable kernel's
// grid is (blocks along hidden, tokens): a thread owns one access (16 bytes
// or one element) of hidden and walks the tokens grid-stride along y (past
// 65535 of them); it loads kChunk choices before adding them, adds in
// ascending j in fp32, scales and stores once. The reference walks every
// (token, element) grid-stride along x, one at a time.
//
// Families (one kernel template, two access widths; kernels/gpu/moe_sum_kernels.cuh):
//
//   vec        16-byte accesses (8 bf16/fp16, 4 fp32 elements): hidden a
//              multiple of the vector, 16-byte aligned bases and row strides
//              of input and out (Problem::align_bytes).
//                threads {64, 128, 256, 512}   a multiple of the warp
//   generic    one element per access: any hidden, any alignment.
//                threads {64, 128, 256, 512}
//   reference  one element per thread, a plain loop: the tuner's validation
//              baseline (kVariantReference).
//
// Every family adds in the same order (j ascending, fp32) and scales once:
// their outputs agree bit for bit.
#pragma once

#include <cstdint>

#include "core/op.hpp"

namespace dispatch::gpu::moe_sum {

/// The op these kernels compute.
inline constexpr core::OpKind kOp = core::OpKind::moe_sum;

/// The families, in kernel-image order (kernel_index).
enum class Family : uint8_t { vec = 0, generic = 1, reference = 2 };
constexpr int kernel_index(Family f) { return static_cast<int>(f); }
/// Kernels per dtype (one per family) and the param slot of `threads`.
inline constexpr int kKernelsPerDtype = 3, kThreads = 0;
inline constexpr int64_t kThreadValues[] = {64, 128, 256, 512};
/// The reference's block, the portable kernel's launch bound, and the
/// choices it loads before their adds (compile time).
inline constexpr int kReferenceThreads = 256, kMaxBlockThreads = 512, kChunk = 4;
/// gridDim.y's range (tokens past it are walked grid-stride) and the
/// reference's largest grid.
inline constexpr int64_t kMaxGridY = 65535, kMaxReferenceBlocks = int64_t{1} << 20;

/// One launch, resolved from (family, params, hidden, element size).
struct Launch {
  Family family = Family::reference;
  int32_t threads = 0;   ///< threads per block
  int32_t width = 1;     ///< elements per access (16 / elem_bytes for vec, else 1)
  int64_t accesses = 0;  ///< accesses per row: hidden / width
};

/// Resolves a config point for rows of `hidden` elements of `elem_bytes`
/// each on a backend whose warp is `warp` threads. `align_bytes`: the
/// problem's alignment of input's and out's bases and row strides
/// (Problem::align_bytes). Returns nullptr and fills `*out` when the point
/// serves the problem, else the reason it declines (a static string: no
/// allocation, so the launch path can call it). Independent of M and top_k.
constexpr const char* resolve(Family f, int64_t hidden, int elem_bytes, int align_bytes, int warp, const int64_t* prm,
                              Launch* out) {
  if (hidden < 1 || hidden > (int64_t{1} << 30)) return "hidden must be in [1, 2^30]";
  Launch l{f, kReferenceThreads, 1, hidden};
  if (f != Family::reference) {
    l.threads = static_cast<int32_t>(prm[kThreads]);
    bool in_space = false;
    for (int64_t v : kThreadValues) in_space = in_space || v == l.threads;
    if (!in_space || l.threads % warp != 0) return "threads is not a point of the space (a multiple of the warp)";
  }
  if (f == Family::vec) {
    l.width = 16 / elem_bytes;
    if (hidden % l.width != 0) return "hidden is not a multiple of the 16-byte vector; the generic variant takes it";
    if (align_bytes < 16) return "input or out is not 16-byte aligned (base or row stride); the generic variant is";
    l.accesses = hidden / l.width;
  }
  *out = l;
  return nullptr;
}

}  // namespace dispatch::gpu::moe_sum
