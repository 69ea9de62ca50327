// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — the fp8 ops' config spaces and kernel tables
// (plain C++, no GPU headers): the fp8 GEMMs (src/ops/gemm_fp8.hpp) and the
// activation quantisation (src/ops/quant_fp8.hpp). CUDA only for now
// (e4m3fn mma needs sm_89+; gfx94x's e4m3fnuz has room).
//
//   gemm_fp8_<layout>_e4m3fn__skinny_mma  the bf16 skinny_mma space
//                                         (gpu/gemm_plan.hpp), K % 16 == 0
//   gemm_fp8_<layout>_e4m3fn__cublaslt    cuBLASLt's fp8 algorithms
//   gemm_fp8_<layout>_e4m3fn__cuda_ref    the validation baseline
//   quant_fp8_<layout>_<dt>__cuda         num_warps {1, 2, 4, 8} per block:
//                                         token: one row per block; group:
//                                         one 128-wide group per warp;
//                                         tensor: the warps of each block of
//                                         the amax pass and the quantisation
//   quant_fp8_<layout>_<dt>__cuda_ref     x / scale (SGLang's form), 4 warps
#pragma once

#include <cstdint>

namespace dispatch::gpu::fp8 {

/// Scale layouts, in OpKind order (gemm_fp8_tensor, _rowwise, _block;
/// quant_fp8_tensor, _token, _group): the index of a DeviceState table.
inline constexpr int kLayouts = 3;
/// Input dtypes of the quantisation kernels: fp32, fp16, bf16 (DType order).
inline constexpr int kQuantDtypes = 3;
/// Kernels per (layout, input dtype): the multiply form and the division
/// form (the reference).
inline constexpr int kQuantKernels = 2;

inline constexpr int64_t kQuantWarpsValues[] = {1, 2, 4, 8};
inline constexpr int kQuantWarps = 0;  ///< param slot of num_warps

/// Checks a quantisation point: nullptr, or why it is declined.
inline const char* resolve_quant(const int64_t* params, int* warps) {
  const int64_t w = params[kQuantWarps];
  if (w != 1 && w != 2 && w != 4 && w != 8) return "num_warps must be 1, 2, 4 or 8";
  *warps = static_cast<int>(w);
  return nullptr;
}

}  // namespace dispatch::gpu::fp8
