// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — fused_moe's decode family (kernels/gpu/moe_kernels.cuh):
// the launchers its TUs (fused_moe_<dtype>.cu) define and its list
// (fused_moe_list.cpp) calls. Plain C++.
#pragma once

#ifndef KDISPATCH_GPU_NS
#define KDISPATCH_GPU_NS cuda
#endif

#include <cstdint>

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"

namespace dispatch::cuda {

/// Threads per block of both kernels.
inline constexpr int kMoeThreads = 256;
/// Kernel images per TU: [0] up, [1] down (vector loads); [2] up, [3] down (one element at a time).
inline constexpr int kMoeImages = 4;

/// The workspace a launch needs: the activated intermediate [M * top_k, I] in fp32.
constexpr int64_t moe_decode_workspace_bytes(const core::Problem& p) noexcept { return p.m * p.extra[1] * p.n * 4; }

/// Enqueues fused_moe's two kernels on la.stream (bf16 or fp16 weights and
/// activations; slots as ops/fused_moe.hpp). vec: 16-byte loads (rows of a
/// multiple of 8 elements, 16-byte aligned), else one element at a time.
Status launch_fused_moe_bf16(const core::LaunchArgs& la, const core::Problem& p, bool vec) noexcept;
Status launch_fused_moe_fp16(const core::LaunchArgs& la, const core::Problem& p, bool vec) noexcept;

}  // namespace dispatch::cuda
