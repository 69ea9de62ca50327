// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the GEMM variant list: D[M,N] = A[M,K] · B[N,K]^T (+ bias[N]).
//
// One list (kGemmVariants, in priority order, references last) drives
// registration (cpu::variants()), the correctness test over every config
// point (tests/test_cpu_kernels.cpp) and the benchmarks.
//
//   gemm_fp32__blocked  A,B fp32 -> D fp32
//   gemm_bf16__blocked  A,B bf16 -> D bf16 or fp32 (fp32 accumulate)
//   gemm_fp32__splitk   A,B fp32 -> D fp32, K split over a thread pool (gemm_splitk.cpp);
//                       flagged nondeterministic: partial sums reach D in finish order
//   gemm_fp32__ref      plain loops, fp32 accumulate (validation baseline)
//   gemm_bf16__ref      plain loops, fp32 accumulate (validation baseline)
//
// Blocked params, in Plan::params order (see gemm.cpp for the loop nest):
//   BLOCK_SIZE_M  {8, 32, 128}       rows of A per macro tile (its K slab stays in L2)
//   BLOCK_SIZE_N  {16, 64, 256}      rows of B per macro tile (the B panel reused over M)
//   BLOCK_SIZE_K  {128, 512, 2048}   K slab per pass (register tile's A/B slivers stay in L1)
//   ukernel       the register tile, picked at run time (declined when the host lacks the ISA):
//                 "scalar" 2x4 portable C++, "avx2" 2x4 AVX2+FMA, "avx512" 4x4 AVX-512,
//                 and for bf16 in "avx512bf16" 4x4 VDPBF16PS (no pack_b)
//   pack_b        bf16 only (boolean): convert each B panel to fp32 once and reuse it over M
//
// Any M >= 1, N >= 1, K >= 1, any strides (lda may be 0); dtypes: fp32 -> fp32,
// bf16 -> bf16 or fp32; bias (optional) in the output dtype. fp16 is declined.
#pragma once

#include <cstdint>
#include <span>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

/// Index of each blocked-GEMM param in Plan::params.
inline constexpr int kGemmBlockM = 0;
inline constexpr int kGemmBlockN = 1;
inline constexpr int kGemmBlockK = 2;
inline constexpr int kGemmUkernel = 3;
inline constexpr int kGemmPackB = 4;  ///< gemm_bf16__blocked only

/// Stored values of the `ukernel` enumeration (index into its labels).
enum class GemmUkernel : int64_t { scalar = 0, avx2 = 1, avx512 = 2, avx512bf16 = 3 };

extern const core::VariantDef kGemmFp32Blocked;
extern const core::VariantDef kGemmBf16Blocked;
extern const core::VariantDef kGemmFp32Ref;
extern const core::VariantDef kGemmBf16Ref;

/// Index of each split-K param in Plan::params.
inline constexpr int kSplitKSlices = 0;
inline constexpr int kSplitKUkernel = 1;

extern const core::VariantDef kGemmFp32SplitK;

/// The list: every CPU GEMM variant, in priority order (references last).
/// (OpenBLAS's family, gemm_fp32__openblas, is not here: it lives in a
/// plugin module that the registry loads at run time, kernels/cpu/openblas.)
inline constexpr const core::VariantDef* kGemmVariants[] = {
    &kGemmFp32Blocked, &kGemmBf16Blocked, &kGemmFp32SplitK, &kGemmFp32Ref, &kGemmBf16Ref,
};

inline std::span<const core::VariantDef* const> gemm_variants() noexcept { return kGemmVariants; }

/// Analytical default plan for a CPU GEMM problem; an invalid Plan for
/// dtypes no CPU GEMM computes (fp16).
core::Plan gemm_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

/// One fp32 block product for kernels built on the blocked loop nest
/// (gemm_fp32__splitk): c[i*ldc + j] += sum_{k < K} a[i*lda + k] * b[j*ldb + k]
/// for i < m, j < n, with BLOCK_SIZE_M/N/K = bm/bn/bk. c is the caller's
/// fp32 buffer (nothing is allocated).
struct GemmAccumulate {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  int64_t bm = 32, bn = 64, bk = 512;
};

/// Runs `g` with micro-kernel `uk`; false when the host lacks its ISA (or a
/// block size is < 1).
bool gemm_fp32_accumulate(const GemmAccumulate& g, GemmUkernel uk) noexcept;

/// Rows of A per register tile of micro-kernel `uk` (MR).
int gemm_ukernel_mr(GemmUkernel uk) noexcept;

}  // namespace dispatch::cpu
