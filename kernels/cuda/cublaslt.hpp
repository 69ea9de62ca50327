// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — cuBLASLt as a dynamic variant family of gemm.
//
// libcublasLt is opened at run time (dlopen of libcublasLt.so.<major of the
// CUDA headers we built with>, or KDISPATCH_CUBLASLT=<path>; "0" turns the
// family off), never linked: libkdispatch.so keeps loading on a machine
// without the CUDA toolkit, and inside a PyTorch process the dlopen finds the
// libcublasLt torch already loaded (same soname), so both use one library.
//
// A candidate is one cuBLASLt algorithm, written into a config row by its
// algorithm config attributes (CUBLASLT_ALGO_CONFIG_ID, TILE_ID, STAGES_ID,
// SPLITK_NUM, REDUCTION_SCHEME, CTA_SWIZZLING, CUSTOM_OPTION,
// INNER_SHAPE_ID, CLUSTER_SHAPE_ID), the workspace it needs and the
// cublasLtGetVersion() it was found with. Rebuilding it is
// cublasLtMatmulAlgoInit + ConfigSetAttribute, on the stack. A row is valid
// only for the cuBLASLt version that wrote it (supports() declines another),
// and only where cublasLtMatmulAlgoCheck accepts it for the row's shape
// (checked at load). At a call, a row that cuBLASLt refuses for the call's M
// (or whose workspace does not fit the call's) returns kNeedsFallback and
// the op runs get_default instead, in the same call.
//
// Hot path: the matmul descriptor and the layouts are initialised in place
// (cublasLt*Init, opaque structs on the stack: no heap allocation, no
// heuristic query). The heuristic is asked only by enumerate() (tuning) and
// by the get_default plan (algo_id = -1: "the heuristic's first pick"),
// whose answers are cached per exact shape, so a shape asks once.
//
// Layout: our row-major D[M,N] = A[M,K] B[N,K]^T is cuBLASLt's column-major
// D^T[N,M] = op(B)[N,K] A^T[K,M] with op = transpose: "A" = B (K x N, ld
// ldb, transa T), "B" = A (K x M, ld lda), C = D = (N x M, ld ldd): the TN
// layout torch's F.linear uses. Bias: CUBLASLT_EPILOGUE_BIAS (a per-row
// vector of D^T, i.e. bias[n]) in D's dtype. An fp8 problem with
// Problem::accum == fast (key accum=fast) sets CUBLASLT_MATMUL_DESC_FAST_ACCUM
// on every descriptor (heuristic, check, launch); a refusal declines.
#pragma once

#include <cstdint>
#include <string>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::cuda::lt {

/// Param slots of the cuBLASLt family (Plan::params).
enum Param : int {
  kAlgoId = 0,    ///< CUBLASLT_ALGO_CONFIG_ID; -1 = the heuristic's first pick (get_default)
  kTile,          ///< CUBLASLT_ALGO_CONFIG_TILE_ID
  kStages,        ///< CUBLASLT_ALGO_CONFIG_STAGES_ID
  kSplitK,        ///< CUBLASLT_ALGO_CONFIG_SPLITK_NUM
  kReduction,     ///< CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME
  kSwizzle,       ///< CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING
  kCustom,        ///< CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION
  kInnerShape,    ///< CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID
  kClusterShape,  ///< CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID
  kWorkspace,     ///< workspace bytes the algorithm needs
  kVersion,       ///< cublasLtGetVersion() the row was tuned with
  kParamCount
};

/// algo_id values that are not an algorithm: asked of the heuristic at the
/// call, per exact shape (cached). kDefaultPick (get_default's cuBLASLt
/// plan): our preferences (no split-K reduced in a 16-bit output type).
/// kTorchPick (the floor, cublas.hpp): the preferences torch sets for the
/// same call (addmm's bias epilogue, torch._scaled_mm), nothing more, so the
/// same library returns the same algorithm torch runs.
inline constexpr int64_t kDefaultPick = -1;
inline constexpr int64_t kTorchPick = -2;

/// True when libcublasLt was opened and a handle created (once, thread-safe).
bool available() noexcept;
/// cublasLtGetVersion() of the opened library (e.g. 130100), 0 when none.
int64_t version() noexcept;
/// "cuBLASLt 130100 (/path/libcublasLt.so.13)" or why it is unavailable.
const std::string& describe() noexcept;

/// Workspace bytes the tuner offers candidates, and that Runtime::attach_stream
/// allocates by default: 32 MiB (torch's cuBLAS default on Hopper).
inline constexpr int64_t kDefaultWorkspaceBytes = int64_t{32} << 20;

/// The algorithm check of a row for a problem: Status() when cuBLASLt
/// accepts it (cublasLtMatmulAlgoCheck), else unsupported_problem saying why
/// (version differs, not available, the check's status).
Status check(const core::Problem& p, const int64_t* params) noexcept;

/// Enqueues the matmul (see the header comment). kNeedsFallback when the
/// algorithm is refused for this call or its workspace does not fit.
Status launch(const core::LaunchArgs& la, const core::Problem& p, const int64_t* params) noexcept;

/// The heuristic's top results for `p` (up to `cap`), offered
/// `workspace_bytes` of workspace, as param rows (kMaxParams each, out).
int enumerate(const core::Problem& p, int64_t workspace_bytes, int64_t* out, int cap) noexcept;

}  // namespace dispatch::cuda::lt
