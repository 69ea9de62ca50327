// SPDX-License-Identifier: Apache-2.0
// kdispatch HIP backend — the floor of the bf16/fp16 GEMM: hipBLASLt called
// as torch's F.linear calls it on ROCm (issue 32, item 1; COMPILE-CHECKED
// ONLY: no AMD GPU has run it).
//
// The floor is the plan every search races and get_default serves where no
// evidence says one of our families wins: what the engine would run without
// us. On ROCm, torch's F.linear / addmm on gfx90a and gfx94x take hipBLASLt
// (its preferred BLAS backend there): gemm_and_bias with the bias epilogue,
// else gemm_internal_cublaslt. This variant, `gemm_<dt>__hipblaslt` (no
// params), runs the same call: a matmul descriptor of compute type
// HIPBLAS_COMPUTE_32F and scale type fp32, TN layouts (our row-major
// D[M,N] = A[M,K] B[N,K]^T as column-major D^T = op(B)^T A^T, as
// cublaslt.hpp), HIPBLASLT_EPILOGUE_BIAS with a bias (in D's dtype), and the
// heuristic's first algorithm asked with one preference, the workspace torch
// offers (CUBLASLT_WORKSPACE_SIZE, else HIPBLASLT_WORKSPACE_SIZE, KiB,
// default 76 MiB; capped at the call's workspace, so a call with less
// workspace than torch's may get another algorithm). The pick is cached per
// exact call shape (the heuristic is asked once per shape); the descriptors
// are created and destroyed per call (hipBLASLt has no in-place init).
//
// libhipblaslt is opened at run time (dlopen of libhipblaslt.so.0, or
// KDISPATCH_HIPBLASLT=<path>; "0" turns the floor off and get_default's
// rule serves), never linked, and its API is declared here, not included:
// Debian's HIP 5.2 ships no hipBLASLt. The declarations are those of
// hipBLASLt >= 0.6 (ROCm >= 6.0: hipDataType and hipblasComputeType_t in
// its API); an older library (hipblasLtGetVersion < 600) is not used.
// Handles: one per (thread, device), kept for the thread's life, handed to
// the next thread when it ends. Thread-safe.
#pragma once

#include <string>

#include "core/op.hpp"

namespace dispatch::hip::blaslt {

/// True when libhipblaslt was opened, is >= 0.6 and has every entry point.
bool available() noexcept;
/// "hipBLASLt 1000 (/path/libhipblaslt.so.0)" or why it is unavailable.
const std::string& describe() noexcept;

/// The floor's launch of a gemm problem (see the header comment), on
/// p.device.ordinal (made current for the call). Errors: kNeedsFallbackCode
/// when hipBLASLt is unavailable, has no algorithm for the call, or refuses
/// it (row strides below the row length, sizes of 2^31 or more, an fp32 D
/// with a bias); backend_error for a failing hipBLASLt call.
Status gemm(const core::LaunchArgs& la, const core::Problem& p) noexcept;

}  // namespace dispatch::hip::blaslt
