// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the RMSNorm and fused add + RMSNorm variant lists.
//
//   rmsnorm:            y[t,h] = x[t,h] / sqrt(mean_h(x[t,:]^2) + eps) * w[h]
//   fused_add_rmsnorm:  z = x + residual (fp32, rounded to the storage dtype);
//                       residual = z; x = rmsnorm(z as stored) * w   (vLLM's kernel)
//
// One list per op (kRmsnormVariants, kFusedAddRmsnormVariants), in
// priority order with the references last; registration, the correctness
// test over every config point and the benchmarks iterate them.
//
//   <op>_fp32__vec / <op>_bf16__vec   SIMD, params in Plan::params order:
//     vec     {4, 8, 16}  fp32 lanes per vector: 4 = SSE2 (baseline x86-64),
//                         8 = AVX2, 16 = AVX-512 (declined when the host lacks it)
//     unroll  {1, 2, 4}   vectors per loop step (independent sum-of-squares chains)
//   <op>_fp32__ref / <op>_bf16__ref   plain loops (validation baseline)
//
// Every variant takes any hidden >= 1 (elements past the last full vector run
// scalar) and any row strides. Sum of squares in fp32; bf16 output is the fp32
// product x * inv_rms * w rounded once (round-to-nearest-even). rmsnorm takes
// bf16 in with fp32 or bf16 out; the fused op writes x, so out == in.
#pragma once

#include <span>

#include "core/op.hpp"
#include "cpu/cpu_rows_list.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cpu {

/// Index of each vectorised-norm param in Plan::params.
inline constexpr int kNormVec = 0;
inline constexpr int kNormUnroll = 1;

/// The rmsnorm list and the fused_add_rmsnorm list, each in priority order
/// (references last).
KDISPATCH_CPU_ROWS_LIST(Rmsnorm, kRmsnormVariants)
KDISPATCH_CPU_ROWS_LIST(FusedAddRmsnorm, kFusedAddRmsnormVariants)

inline std::span<const core::VariantDef* const> rmsnorm_variants() noexcept { return kRmsnormVariants; }
inline std::span<const core::VariantDef* const> fused_add_rmsnorm_variants() noexcept {
  return kFusedAddRmsnormVariants;
}

/// Analytical default plan for a CPU rmsnorm / fused_add_rmsnorm problem; an
/// invalid Plan for dtypes no CPU variant computes.
core::Plan norm_default(const core::Problem& p, const DeviceInfo& dev) noexcept;

}  // namespace dispatch::cpu
