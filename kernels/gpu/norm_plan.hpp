// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — RMSNorm / fused add + RMSNorm: the families, their
// config spaces and how a config point becomes a launch. Plain C++ (no GPU
// headers): the variant list (host code), the kernels' launchers and the
// tests share it, for CUDA and HIP alike.
//
// Families (one kernel template each, kernels/gpu/norm_kernels.cuh):
//
//   warp    one warp (wavefront) per row, `rows_per_block` rows per block,
//           16-byte accesses; the row stays in registers between the sum of
//           squares and the scale (one read of x), reduction by shuffles
//           only (no barrier). For short rows / few tokens.
//             rows_per_block {1, 2, 4, 8, 16}   warps per block (runtime)
//             unroll         {1, 2, 4, 8, 16}   16-byte chunks a lane holds
//                            (compile time); only the smallest that holds the
//                            row is accepted, so the point is just rows_per_block
//   block   one block per row, 16-byte accesses, row in registers; the thread
//           count follows from the unroll: threads = ceil(hidden/vec/unroll)
//           rounded up to whole warps, so every unroll is a different
//           (threads, registers per thread) trade-off.
//             unroll         {1, 2, 4, 8, 16}
//   generic one block per row, one element per access (any hidden >= 1, any
//           alignment, any row stride); two passes over x (the second mostly
//           from L1/L2). Also what the vector families fall back to, at
//           launch, when a pointer or a row stride is not 16-byte aligned.
//             threads        {64, 128, 256, 512, 1024}
//   reference  one block of 256 threads per row, scalar, shared-memory tree
//           reduction: the tuner's validation baseline (kVariantReference).
//
// The vector families need hidden % vec == 0 (vec = 16 bytes: 8 bf16/fp16,
// 4 fp32). Unrolls over 4 carry a tighter launch bound (see
// max_threads_for_unroll) so that the row, the weight chunks and the fused
// op's residual chunks fit in registers without spilling.
#pragma once

#include <cstdint>

namespace dispatch::gpu::norm {

enum class Family : uint8_t { warp = 0, block = 1, generic = 2, reference = 3 };

inline constexpr int64_t kUnrollValues[] = {1, 2, 4, 8, 16};
inline constexpr int64_t kRowsPerBlockValues[] = {1, 2, 4, 8, 16};
inline constexpr int64_t kGenericThreadValues[] = {64, 128, 256, 512, 1024};
inline constexpr int kReferenceThreads = 256;
inline constexpr int kMaxBlockThreads = 1024;

/// Param slots (Plan::params) per family.
inline constexpr int kWarpRowsPerBlock = 0, kWarpUnroll = 1;
inline constexpr int kBlockUnroll = 0;
inline constexpr int kGenericThreads = 0;

/// Kernels per (op, dtype): warp x 5 unrolls, block x 5 unrolls, generic, reference.
inline constexpr int kKernelsPerDtype = 12;
/// Kernel tables: op (rmsnorm, fused) x dtype (fp32, fp16, bf16, DType order).
inline constexpr int kNormOps = 2, kNormDtypes = 3;

/// The launch bound of the register-resident kernels for an unroll:
/// 64 registers per thread at 1024 threads, 128 at 512, 255 at 256. The warp
/// family needs a few more registers per thread (its row index): at unroll 8
/// it gets 255 (ptxas spilled 24 bytes of the fused fp32 kernel at 128).
constexpr int max_threads_for_unroll(int64_t unroll, bool warp = false) {
  return unroll <= 4 ? 1024 : (unroll == 8 && !warp) ? 512 : 256;
}

constexpr int unroll_index(int64_t u) { return u == 1 ? 0 : u == 2 ? 1 : u == 4 ? 2 : u == 8 ? 3 : u == 16 ? 4 : -1; }

/// Index of a kernel in its (op, dtype) table.
constexpr int kernel_index(Family f, int64_t unroll) {
  switch (f) {
    case Family::warp: return unroll_index(unroll);
    case Family::block: return unroll_index(unroll) < 0 ? -1 : 5 + unroll_index(unroll);
    case Family::generic: return 10;
    case Family::reference: return 11;
  }
  return -1;
}

/// One launch, resolved from (family, params, hidden, element size).
struct Launch {
  Family family = Family::reference;
  int32_t unroll = 1;          ///< 16-byte chunks per thread held in registers (warp/block)
  int32_t threads = 0;         ///< threads per block
  int32_t rows_per_block = 1;  ///< rows one block handles (warp family), else 1
};

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
constexpr bool in_set(int64_t v, const int64_t* s, int n) {
  for (int i = 0; i < n; ++i)
    if (s[i] == v) return true;
  return false;
}

/// Resolves a config point for a row of `hidden` elements of `elem_bytes`
/// each on a device with `warp`-wide warps. Returns nullptr and fills `*out`
/// when the point serves the row; otherwise the reason it declines (a
/// static string: no allocation, so the launch path can call it).
constexpr const char* resolve(Family f, int64_t hidden, int elem_bytes, int warp, const int64_t* prm, Launch* out) {
  Launch l;
  l.family = f;
  if (hidden < 1) return "hidden must be >= 1";
  if (hidden > (int64_t{1} << 30)) return "hidden above 2^30 elements";
  const int64_t vec = 16 / elem_bytes;
  switch (f) {
    case Family::reference: l.threads = kReferenceThreads; break;
    case Family::generic: {
      const int64_t t = prm[kGenericThreads];
      if (!in_set(t, kGenericThreadValues, 5)) return "threads is not a point of the generic space";
      if (t > 64 && t / 2 >= hidden)
        return "more than twice as many threads as elements: a smaller block does the same";
      l.threads = static_cast<int32_t>(t);
      break;
    }
    case Family::warp:
    case Family::block: {
      if (hidden % vec != 0)
        return elem_bytes == 4
                   ? "hidden must be a multiple of 4 (16-byte vectors); the generic variant takes any hidden"
                   : "hidden must be a multiple of 8 (16-byte vectors); the generic variant takes any hidden";
      const int64_t nvec = hidden / vec;
      const int64_t u = f == Family::warp ? prm[kWarpUnroll] : prm[kBlockUnroll];
      if (!in_set(u, kUnrollValues, 5)) return "unroll is not a point of the space";
      l.unroll = static_cast<int32_t>(u);
      int64_t threads = 0;
      if (f == Family::warp) {
        const int64_t rpb = prm[kWarpRowsPerBlock];
        if (!in_set(rpb, kRowsPerBlockValues, 5)) return "rows_per_block is not a point of the space";
        if (nvec > warp * u)
          return "the row does not fit in one warp's registers at this unroll (warp x unroll x vec elements)";
        threads = rpb * warp;
        l.rows_per_block = static_cast<int32_t>(rpb);
      } else {
        threads = round_up(ceil_div(nvec, u), warp);
        if (threads > max_threads_for_unroll(u))
          return "the row needs more threads at this unroll than the kernel's launch bound allows";
      }
      // Every lane must use more than half its chunks, else a smaller unroll
      // holds the same row in fewer registers (more blocks per SM).
      const int64_t lanes = f == Family::warp ? warp : threads;
      if (u > 1 && ceil_div(nvec, lanes) * 2 <= u) return "unroll oversized for this row: a smaller unroll holds it";
      if (threads > max_threads_for_unroll(u, f == Family::warp))
        return "rows_per_block x warp size exceeds the kernel's launch bound at this unroll";
      l.threads = static_cast<int32_t>(threads);
      break;
    }
  }
  *out = l;
  return nullptr;
}

}  // namespace dispatch::gpu::norm
