// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the two rules the tuner and the op path share, each
// written once:
//
//   near_tuned   a call at M is near a tuned row at M' when each is within
//                2x of the other (M' in [M/2, 2M]): served by that row by
//                nearest-M, and not worth tuning again. The op path samples
//                hits that are not near their row (api/ops.cpp, observe);
//                the tuner skips a shape the table serves near
//                (Runtime::Impl::covered, TunerHooks::covered).
//   excluded_by_determinism
//                deterministic serving (RuntimeOptions::deterministic)
//                never runs a scheduling-dependent variant: not from the
//                table nor as get_default's pick on the op path, and never
//                a candidate of a search.
//
// Header-only and constexpr/inline: both run on the op path (a memo hit
// asks near_tuned), where they must cost what the expression costs.
#pragma once

#include <cstdint>

#include "core/op.hpp"

namespace dispatch::tune {

/// True when a row tuned at `row_m` is near a call at `m`: each within 2x
/// of the other (row_m in [m/2, 2m]).
constexpr bool near_tuned(int64_t row_m, int64_t m) noexcept { return row_m * 2 >= m && m * 2 >= row_m; }

/// True when deterministic serving (`deterministic`: RuntimeOptions::
/// deterministic) excludes variant `v`: its results depend on scheduling
/// (core::kVariantNondeterministic).
inline bool excluded_by_determinism(bool deterministic, const core::VariantDef& v) noexcept {
  return deterministic && (v.flags & core::kVariantNondeterministic);
}

}  // namespace dispatch::tune
