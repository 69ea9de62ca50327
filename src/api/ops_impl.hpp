// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — what the op entry points' files share:
//   ops.cpp      the call path (validate -> choose -> observe -> launch), the
//                op entry points and call_op (one TU: the hot path inlines
//                as one piece)
//   op_info.cpp  the op list for bindings (op_list), plan_source_name
//   op_keys.cpp  the calls from a key or that tune: describe_key,
//                pretune_key, time_configs, pretune (per op, pretune_op)
// Header-only helpers are inline: call_op is a binding's hot path.
#pragma once

#include <cmath>
#include <span>
#include <string>
#include <string_view>

#include "api/runtime_impl.hpp"
#include "api/validate.hpp"
#include "core/op_spec.hpp"
#include "dispatch/ops.hpp"

namespace dispatch::api {

/// What the op call refuses after validation, before any table or plan:
/// no backend for the tensors' device, or no variant for the problem's
/// dtype combination (the call path's answers, word for word). Pretune asks
/// it before any scratch is made or row persisted, so that it never tunes
/// (launches the reference on) a problem the op would refuse. *dev: the
/// tensors' device when there is one. (ops.cpp)
Status refuse_as_the_op(Runtime::Impl& impl, const core::Problem& p, const DeviceInfo** dev) noexcept;

/// The spec of the op called `op`, or nullptr.
inline const core::OpSpec* spec_named(std::string_view op) noexcept { return core::find_spec(op); }

/// The scalars a caller must give: all but the trailing switches (left out:
/// off, as callers wrote before the op had them).
inline size_t required_scalars(const core::OpSpec& s) noexcept {
  size_t n = s.scalars.size();
  while (n > 0 && s.scalars[n - 1].kind == core::ScalarKind::accum) --n;
  return n;
}

/// The args struct of `op` from slot-ordered tensors and scalars.
[[gnu::cold]] inline Status count_error(const core::OpSpec& s, size_t nt, size_t ns) {
  const size_t need = required_scalars(s);
  return make_status(StatusCode::invalid_argument, std::string(s.name) + " takes " + std::to_string(s.slots.size()) +
                                                       " tensors and " +
                                                       (need == s.scalars.size() ? "" : std::to_string(need) + " to ") +
                                                       std::to_string(s.scalars.size()) + " scalars, got " +
                                                       std::to_string(nt) + " and " + std::to_string(ns));
}

/// The op's scalars in full (left-out switches: their defaults), each switch
/// checked to be 0 or 1 before it becomes a bool member. Errors name it.
inline Status full_scalars(const core::OpSpec& s, std::span<const float> given,
                           float (&out)[core::kMaxScalars]) noexcept {
  for (size_t j = 0; j < s.scalars.size(); ++j) {
    out[j] = j < given.size() ? given[j] : s.scalars[j].default_value;
    if (s.scalars[j].kind == core::ScalarKind::accum && out[j] != 0.f && out[j] != 1.f)
      return make_status(StatusCode::invalid_argument, std::string(s.scalars[j].name) + ": " + switch_text(out[j]));
    // An integer member (a choice's index, a size) given a fraction, NaN,
    // an infinity or a whole number past 2^24 is refused here, with the
    // value as given (set_scalar would make it -1).
    const bool integer = s.scalars[j].kind == core::ScalarKind::choice || s.scalars[j].kind == core::ScalarKind::dim;
    if (integer && !(out[j] == std::trunc(out[j]) && std::fabs(out[j]) <= core::kMaxDimScalar))
      return make_status(StatusCode::invalid_argument,
                         std::string(s.scalars[j].name) + ": " + integer_scalar_text(s.scalars[j], out[j]));
  }
  return Status();
}

/// The op called `op` (*s) and its scalars in full, for a call by name
/// (call_op, pretune_op): unknown ops, the tensor and scalar counts and the
/// switches' values checked.
inline Status named_op_args(std::string_view op, size_t n_tensors, std::span<const float> scalars,
                            const core::OpSpec** s, float (&full)[core::kMaxScalars]) noexcept {
  *s = spec_named(op);
  if (*s == nullptr) return make_status(StatusCode::invalid_argument, "unknown op '" + std::string(op) + "'");
  if (n_tensors != (*s)->slots.size() || scalars.size() > (*s)->scalars.size() ||
      scalars.size() < required_scalars(**s))
    return count_error(**s, n_tensors, scalars.size());
  return full_scalars(**s, scalars, full);
}

inline void set_scalar(float& member, float v) noexcept { member = v; }
inline void set_scalar(bool& member, float v) noexcept { member = v != 0.f; }
/// A choice scalar's index or a size (validated later, by the op). A value
/// that is not a whole number in [-2^24, 2^24] becomes -1 (refused, never
/// truncated to a label or a size).
inline void set_scalar(int32_t& member, float v) noexcept {
  member = v >= -core::kMaxDimScalar && v <= core::kMaxDimScalar && v == static_cast<float>(static_cast<int32_t>(v))
               ? static_cast<int32_t>(v)
               : -1;
}

}  // namespace dispatch::api

// `Args args` of one row of core/op_list.hpp from `tensors` (slot order)
// and `full` (named_op_args's scalars), in a switch case over the op list.
#define KD_ARG_FROM_SPAN(x) args.x = tensors[i++];
#define KD_SCALAR_FROM_SPAN(x) ::dispatch::api::set_scalar(args.x, full[j++]);
#define KD_ARGS_FROM_SPANS(Args, tensors_, scalars_)           \
  Args args;                                                   \
  size_t i = 0, j = 0;                                         \
  KD_PP_FOR_EACH(KD_ARG_FROM_SPAN, KD_PP_NOTHING, tensors_)    \
  KD_PP_FOR_EACH(KD_SCALAR_FROM_SPAN, KD_PP_NOTHING, scalars_) \
  (void)i, (void)j;
