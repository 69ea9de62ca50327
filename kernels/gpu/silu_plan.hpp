// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — silu_and_mul: the families, their config spaces
// and how a config point becomes a launch. Plain C++ (no GPU headers): the
// variant list (host code), the kernels' launchers and the tests share it,
// for CUDA and HIP alike.
//
//   out[t, i] = silu(x[t, i]) * x[t, d + i],  out [tokens, d], x [tokens, 2d]
//
// The op is a copy with a little arithmetic: it reads 2d and writes d
// elements per token, so at many tokens it runs at the memory's speed and
// at few tokens at its latency. A launch tiles tokens x d with a 2-D grid:
// blockIdx.x walks a row in tiles of `cols` accesses, blockIdx.y walks the
// rows in groups of `rows_per_block` (grid-stride when there are more than
// 65535 groups). A block of `threads` threads is `rows_per_block` rows of
// `lanes` threads; a lane makes `unroll` accesses per row, `lanes` apart
// (every warp-wide access is contiguous), all loads issued before the first
// use. When a row needs fewer lanes than the block has threads (a short d),
// the block takes several rows: lanes = the power of two >= the accesses a
// row needs / unroll, rows_per_block = threads / lanes.
//
// Families (one kernel template each, kernels/gpu/silu_kernels.cuh):
//
//   vec      16-byte accesses (8 bf16/fp16, 4 fp32 elements): needs d a
//            multiple of the vector and 16-byte aligned bases and row
//            strides of out and x (Problem::align_bytes).
//              threads {128, 256, 512, 1024}
//              unroll  {1, 2}     16-byte vectors per thread per row tile
//                                 (2 x unroll loads in flight per thread)
//   generic  one element per access, four per thread: any d, any
//            alignment, any row stride.
//              threads {128, 256, 512}
//   reference  one element per thread, IEEE expf and division: the tuner's
//            validation baseline (kVariantReference).
//
// Math (vec and generic): fp32, silu(g) = g / (1 + exp(-g)) with the fast
// exp (ex2.approx of a pre-scaled argument: __expf) and the fast division
// (__fdividef), times u, rounded once to the output dtype.
#pragma once

#include <cstdint>

#include "core/op.hpp"

namespace dispatch::gpu::silu {

/// The op these kernels compute.
inline constexpr core::OpKind kOp = core::OpKind::silu_and_mul;

enum class Family : uint8_t { vec = 0, generic = 1, reference = 2 };

inline constexpr int64_t kVecThreadValues[] = {128, 256, 512, 1024};
inline constexpr int64_t kVecUnrollValues[] = {1, 2};
inline constexpr int64_t kGenericThreadValues[] = {128, 256, 512};
/// Elements one generic thread handles per row tile (compile time).
inline constexpr int kGenericUnroll = 4;
inline constexpr int kReferenceThreads = 256;
inline constexpr int kMaxBlockThreads = 1024;
/// blockIdx.y range: more row groups than this are walked grid-stride.
inline constexpr int64_t kMaxGridY = 65535;

/// Param slots (Plan::params) per family.
inline constexpr int kVecThreads = 0, kVecUnroll = 1;
inline constexpr int kGenericThreads = 0;

/// Kernels per dtype: vec x {unroll 1, 2}, generic, reference.
inline constexpr int kKernelsPerDtype = 4;
/// Kernel tables by dtype, in DType order (fp32, fp16, bf16).
inline constexpr int kSiluDtypes = 3;

constexpr int kernel_index(Family f, int64_t unroll) {
  switch (f) {
    case Family::vec: return unroll == 1 ? 0 : unroll == 2 ? 1 : -1;
    case Family::generic: return 2;
    case Family::reference: return 3;
  }
  return -1;
}

/// One launch, resolved from (family, params, d, element size).
struct Launch {
  Family family = Family::reference;
  int32_t threads = 0;         ///< threads per block
  int32_t unroll = 1;          ///< accesses per thread per row tile (vec: the param; generic: kGenericUnroll)
  int32_t lanes = 0;           ///< threads per row (a power of two <= threads)
  int32_t rows_per_block = 1;  ///< threads / lanes
  int32_t width = 1;           ///< elements per access (16 / elem_bytes for vec, else 1)
  int64_t accesses = 0;        ///< accesses per row: d / width
  int64_t tiles_x = 0;         ///< blocks along a row: ceil(accesses / (lanes * unroll))
};

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr bool in_set(int64_t v, const int64_t* s, int n) {
  for (int i = 0; i < n; ++i)
    if (s[i] == v) return true;
  return false;
}
constexpr int64_t pow2_at_least(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

/// The block shape of `threads` threads over rows of `accesses` accesses of
/// `unroll` per thread.
constexpr void shape(Launch& l, int64_t threads, int64_t unroll, int64_t accesses) {
  l.threads = static_cast<int32_t>(threads);
  l.unroll = static_cast<int32_t>(unroll);
  l.accesses = accesses;
  const int64_t need = pow2_at_least(ceil_div(accesses, unroll));
  l.lanes = static_cast<int32_t>(need < threads ? need : threads);
  l.rows_per_block = static_cast<int32_t>(threads / l.lanes);
  l.tiles_x = ceil_div(accesses, int64_t{l.lanes} * unroll);
}

/// Resolves a config point for rows of `d` elements of `elem_bytes` each.
/// `align_bytes`: the problem's alignment of out's and x's bases and row
/// strides (Problem::align_bytes). Returns nullptr and fills `*out` when
/// the point serves the problem; otherwise the reason it declines (a static
/// string: no allocation, so the launch path can call it). Does not depend
/// on the number of tokens.
constexpr const char* resolve(Family f, int64_t d, int elem_bytes, int align_bytes, const int64_t* prm, Launch* out) {
  Launch l;
  l.family = f;
  if (d < 1) return "d must be >= 1";
  if (d > (int64_t{1} << 30)) return "d above 2^30 elements";
  switch (f) {
    case Family::reference:
      l.width = 1;
      shape(l, kReferenceThreads, 1, d);
      break;
    case Family::generic: {
      const int64_t t = prm[kGenericThreads];
      if (!in_set(t, kGenericThreadValues, 3)) return "threads is not a point of the generic space";
      l.width = 1;
      shape(l, t, kGenericUnroll, d);
      break;
    }
    case Family::vec: {
      const int64_t vec = 16 / elem_bytes;
      if (d % vec != 0)
        return elem_bytes == 4 ? "d must be a multiple of 4 (16-byte vectors); the generic variant takes any d"
                               : "d must be a multiple of 8 (16-byte vectors); the generic variant takes any d";
      if (align_bytes < 16)
        return "out and x (bases and row strides) are not 16-byte aligned; the generic variant takes any alignment";
      const int64_t t = prm[kVecThreads], u = prm[kVecUnroll];
      if (!in_set(t, kVecThreadValues, 4)) return "threads is not a point of the space";
      if (!in_set(u, kVecUnrollValues, 2)) return "unroll is not a point of the space";
      const int64_t acc = d / vec;
      if (u > 1 && acc < u) return "unroll oversized for this row: the row has fewer vectors than one thread's unroll";
      l.width = static_cast<int32_t>(vec);
      shape(l, t, u, acc);
      break;
    }
  }
  *out = l;
  return nullptr;
}

}  // namespace dispatch::gpu::silu
