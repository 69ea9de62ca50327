// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — argument validation: TensorRefs -> (Problem,
// LaunchArgs), driven by the op's spec (core/op_spec.hpp). Every error
// names the argument. Runs on every call: no allocation unless an error
// message is built.
//
// Two paths that must agree: validate_slots<Op> tests every condition at
// once (instantiated per op from its constexpr spec, so the hot path is a
// few straight-line compares) and derives the Problem; only when that fails
// does check_detailed run the same checks one by one, each with its message.
#pragma once

#include <string>

#include "core/op.hpp"
#include "core/op_spec.hpp"
#include "dispatch/ops.hpp"

namespace dispatch::api {

/// The checks of `spec` one by one, with the message of the first that
/// fails; Status() when all pass. `t[i]` is slot i (an absent optional slot
/// a TensorRef without data), `scalars` the op's scalars in order.
/// `require_data` = false (pretune) accepts null data pointers (and takes a
/// data-less optional slot of the right rank as present).
Status check_detailed(const core::OpSpec& spec, const TensorRef* const* t, const float* scalars,
                      bool require_data = true) noexcept;

/// Validates a call of the op `Op` and fills `p` (dims, dtypes, bias,
/// stride classes, device, alignment) and `la`. `*empty` is set for M == 0
/// (a no-op). Defined in api/validate_impl.hpp (instantiated by the op
/// entry points).
template <core::OpKind Op>
Status validate_slots(const TensorRef* const* t, const float* scalars, core::Problem* p, core::LaunchArgs* la,
                      bool* empty, bool require_data = true) noexcept;

/// validate_<op>(const <Args>&, ...) and check_<op>_detailed(const <Args>&):
/// the two paths on an op's public args struct, one pair per row of
/// core/op_list.hpp.
#define KD_VALIDATE_DECL(op, Args, tensors, scalars)                                          \
  Status validate_##op(const Args& args, core::Problem* p, core::LaunchArgs* la, bool* empty, \
                       bool require_data = true) noexcept;                                    \
  Status check_##op##_detailed(const Args& args, bool require_data = true) noexcept;
KDISPATCH_OP_LIST(KD_VALIDATE_DECL)
#undef KD_VALIDATE_DECL

/// Why `v` is refused for an integer scalar `s` (ScalarKind::dim or choice):
/// "must be a whole number in [1, 16777216], got 0.5" / "must be one of
/// 0 (silu), 1 (gelu), got nan", the messages of the op's own checks (the
/// value in its shortest exact text).
std::string integer_scalar_text(const core::ScalarSlot& s, float v);

/// Why `v` is refused for a switch scalar (ScalarKind::accum, fp8's
/// fast_accum): "must be 0 or 1 (false or true: 1 asks for fast
/// accumulation), got 0.5" (the value in its shortest exact text).
std::string switch_text(float v);

/// Stride class of dimension `dim` of a rank-2 tensor (see StrideClass).
StrideClass stride_class_2d(const TensorRef& t, int dim) noexcept;

}  // namespace dispatch::api
