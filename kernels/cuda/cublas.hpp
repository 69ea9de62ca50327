// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the floor of the bf16/fp16 GEMM: cuBLAS called
// as torch's F.linear calls it.
//
// The floor is the plan every search races and get_default serves where no
// evidence says one of our families wins (issue 32): what the engine would
// run without us, so a call we serve is never behind the torch call it
// replaces. It is the variant `gemm_<dt>__cublas` (no params), which runs:
//  - no bias: cublasGemmEx(T, N, N, M, K, alpha 1, B (ld ldb), A (ld lda),
//    beta 0, D (ld ldd), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)
//    on a handle whose math mode is CUBLAS_DEFAULT_MATH (torch's default:
//    reduced-precision split-K reduction allowed for bf16 and fp16), whose
//    stream is the call's and whose workspace is the call's (torch sets
//    32 MiB on sm_90: Runtime::attach_stream's default), as at::mm does;
//  - a bias (N > 1, K > 1, D in the input dtype): cuBLASLt with
//    CUBLASLT_EPILOGUE_BIAS and the heuristic's first pick asked with
//    torch's preferences (cublaslt.hpp, algo_id kTorchPick), as torch's
//    addmm does (gemm_and_bias) — at M = 1 too: torch 2.11 on the H200 gave
//    a result bitwise equal to this and not to the bias copy + beta 1 path
//    older torch sources take at M = 1 (TorchFloorCudaTest, 2026-12-03);
//  - a bias otherwise (N or K = 1, an fp32 D, or cuBLASLt declining): the bias
//    copied into D's rows (log2 M copies), then cublasGemmEx with beta 1, as
//    torch's addmm does where it does not take cuBLASLt.
//
// libcublas is opened at run time like libcublasLt (dlopen of
// libcublas.so.<major of the headers we built with>, or KDISPATCH_CUBLAS=
// <path>; "0" turns the floor off and get_default serves the cuBLASLt pick
// instead). Inside a PyTorch process the dlopen finds the libcublas torch
// loaded (same soname): the same library, so the same kernel for the same
// call. Handles: one per (thread, device), created on first use and kept
// for the thread's life (cuBLAS handles are not shared between threads);
// the first call of a thread on a device creates it, so that first call
// must not be inside a global-mode stream capture (torch warms up before it
// captures for the same reason). Thread-safe.
#pragma once

#include <string>

#include "core/op.hpp"

namespace dispatch::cuda::blas {

/// True when libcublas was opened with every entry point the floor uses.
bool available() noexcept;
/// "cuBLAS 130100 (/path/libcublas.so.13)" or why it is unavailable.
const std::string& describe() noexcept;

/// The floor's launch of a gemm problem (see the header comment), on
/// p.device.ordinal (made current for the call). Errors: kNeedsFallbackCode
/// when cuBLAS is unavailable or refuses the call (rows that overlap, sizes
/// of 2^31 or more: the family's supports() refuses the knowable ones, a
/// zero row stride; the rest run the reference in the same call),
/// backend_error for a failing cuBLAS call.
Status gemm(const core::LaunchArgs& la, const core::Problem& p) noexcept;

}  // namespace dispatch::cuda::blas
