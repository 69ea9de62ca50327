// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — argument validation: TensorRefs -> (Problem, LaunchArgs).
// Every error names the argument. Runs on every call: no allocation unless
// an error message is built.
#pragma once

#include "core/op.hpp"
#include "dispatch/ops.hpp"

namespace dispatch::api {

/// Validates gemm arguments. On success fills `p` (m, n, k, dtypes, bias,
/// stride classes, device) and `la`. `*empty` is set for M == 0 (a no-op).
/// `require_data` = false (pretune) accepts null data pointers.
Status validate_gemm(const GemmArgs& a, core::Problem* p, core::LaunchArgs* la, bool* empty,
                     bool require_data = true) noexcept;
/// validate_gemm's checks one by one, each with its message (its slow path,
/// taken when its combined test fails); Status() when all pass. Exposed so
/// tests can hold the two paths equal.
Status check_gemm_detailed(const GemmArgs& a, bool require_data = true) noexcept;
Status validate_rmsnorm(const RmsNormArgs& a, core::Problem* p, core::LaunchArgs* la, bool* empty,
                        bool require_data = true) noexcept;
Status validate_fused_add_rmsnorm(const FusedAddRmsNormArgs& a, core::Problem* p, core::LaunchArgs* la,
                                  bool* empty, bool require_data = true) noexcept;

/// Stride class of dimension `dim` of a rank-2 tensor (see StrideClass).
StrideClass stride_class_2d(const TensorRef& t, int dim) noexcept;

}  // namespace dispatch::api
