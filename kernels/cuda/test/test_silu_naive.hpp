// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend, test-only (KDISPATCH_TEST_OPS=ON) — a family of
// one kernel built to show what a GPU op costs: these three files, one row
// in kernels/gpu/families.inc (its TU) and one in kernels/gpu/ops.inc (its
// variant list), and no other file. It computes silu_and_mul in fp32 one
// grid-stride element per thread (out[t, i] = silu(x[t, i]) * x[t, d + i]),
// a correct and slow variant, "silu_and_mul_fp32__test_naive".
// Plain C++: the launcher the TU (test_silu_naive_fp32.cu) defines and the
// list (test_silu_naive_list.cpp) calls.
#pragma once

#ifndef KDISPATCH_GPU_NS
#define KDISPATCH_GPU_NS cuda
#endif

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"

namespace dispatch::cuda {

/// Threads per block of the one kernel (its launch bound).
inline constexpr int kTestSiluNaiveThreads = 256;

/// Enqueues the kernel on la.stream for an fp32 silu_and_mul problem
/// (p.m tokens, p.n = d; slots as ops/silu_and_mul.hpp).
Status launch_test_silu_naive_fp32(const core::LaunchArgs& la, const core::Problem& p) noexcept;

}  // namespace dispatch::cuda
