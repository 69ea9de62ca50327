// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the search: config space -> constraint prune ->
// optional perf-model top-k -> benchmark -> validate -> pick.
//
// Why this is the core of the library: an autotuner that benchmarks an
// in-place kernel on live buffers measures garbage and hands the caller
// corrupted data (fused add+RMSNorm applied N times), and one that times a
// candidate without checking its output can crown a kernel that skips half
// its work. So, per candidate, on the same inputs:
//   1. restore every argument the op or the variant modifies in place
//      (restore_value) from a snapshot taken before the search, and zero
//      every argument the variant accumulates into (reset_to_zero);
//   2. poison the pure outputs (a NaN bit pattern no arithmetic produces);
//   3. run once and compare every written element with the reference
//      variant's output (tolerance per dtype); a poison pattern left over
//      (an unwritten element) or a NaN the reference does not have rejects
//      the candidate; a launch error skips it (never aborts the search);
//   4. time it with the shared harness (warm-up, repeats, median and spread,
//      cold cache before each rep), restoring/zeroing before every rep.
// After the search every written argument is restored to what the caller
// had, so the caller's real launch (with reset_to_zero args zeroed first)
// sees its own data exactly once.
#pragma once

#include <atomic>
#include <memory>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype_table.hpp"
#include "core/op.hpp"
#include "dispatch/device.hpp"
#include "backends/memory.hpp"
#include "tune/harness.hpp"

namespace dispatch::tune {

// The search's view of a backend's memory (src/backends/memory.hpp).
using backends::ArgBuffer;
using backends::DeviceMemory;
using backends::host_memory;
using backends::kPoisonBf16;
using backends::kPoisonFp16;
using backends::kPoisonFp32;

/// Validation tolerance of an output dtype of `op` (its spec; see compare())
/// for a precise problem.
void validation_tolerance(core::OpKind op, DType t, double* atol_rel, double* rtol) noexcept;
/// ... of problem `p`: widened to the spec's fast_accum_tolerance when p asks
/// for fast accumulation (core::tolerance_of).
void validation_tolerance(const core::Problem& p, DType t, double* atol_rel, double* rtol) noexcept;

/// The memory of `backend` (host memory for the CPU; a GPU backend's when
/// compiled in; nullptr otherwise).
DeviceMemory* memory_for(DeviceType backend) noexcept;

/// What a search runs on: the buffers, and how to launch a plan on them.
struct TuneTarget {
  core::Problem problem;
  std::vector<ArgBuffer> args;  ///< in the op's argument-slot order
  std::function<Status(const core::Plan&)> launch;
  /// launch() with the arguments at `ptrs` (one per args entry, same layout)
  /// instead of args[i].ptr: the confirmation times the winner and the
  /// default on fresh copies of the read-only inputs (other physical pages).
  /// Empty: the confirmation stays on the original buffers.
  std::function<Status(const core::Plan&, const std::vector<void*>& ptrs)> launch_at;
  /// launch_at() on `stream` instead of the target's own (the graph mode
  /// captures on a stream of the clock's: Clock::time_graph). Empty: the
  /// graph mode launches through launch_at / launch, on the target's stream
  /// (a host target, a test's).
  std::function<Status(const core::Plan&, const std::vector<void*>& ptrs, void* stream)> launch_on;
  /// Where the buffers live; nullptr = host memory.
  DeviceMemory* mem = nullptr;
};

/// The target of a built-in op over the buffers of `la` (the caller's, or
/// scratch buffers laid out the same way).
TuneTarget make_target(const core::Problem& p, const core::LaunchArgs& la);

/// The confirmation's default margin (SearchOptions::margin,
/// TuneOptions::margin): a winner must be this much faster than the
/// incumbent (the floor where the backend has one) on the mean of its
/// per-placement ratios (0.02 = 2%).
inline constexpr double kConfirmMargin = 0.02;
/// Placements of the read-only inputs the confirmation times the winner
/// and the default on (two rounds each, both orders); see search().
inline constexpr int kConfirmPlacements = 4;
/// The graph mode (SearchOptions::graph): calls per graph (at least; more
/// when more copies rotate), calls when the default's cold time is above
/// kGraphLongUs (a long kernel's back-to-back effects are small, its
/// replays are not), replays timed per graph, and the most copies of the
/// read-only inputs.
inline constexpr int kGraphCalls = 20;
inline constexpr int kGraphCallsLong = 5;
inline constexpr double kGraphLongUs = 200.0;
inline constexpr int kGraphReps = 5;
inline constexpr int kGraphMaxSets = 64;
/// The TimingHook's placement for the graph mode's median on confirmation
/// placement p: kGraphHookPlacement + p.
inline constexpr int kGraphHookPlacement = 100;

struct SearchOptions {
  const DeviceInfo* device = nullptr;
  MeasureOptions measure;
  /// Stop starting new candidates after this long (the default plan is
  /// always measured first). Milliseconds.
  double time_budget_ms = 2000.0;
  /// Perf-model top-k: when a variant has estimate_us and the space is
  /// larger, keep the k best estimates. 0 = keep all.
  int max_candidates = 96;
  /// Compare each candidate's output with the reference variant's.
  bool validate = true;
  /// Measure the winner and the default again, two rounds (both orders) on
  /// each of kConfirmPlacements placements of the read-only inputs (fresh
  /// copies when the target has launch_at, else the same buffers), and keep
  /// the default unless the winner is faster on every placement and
  /// > `margin` faster on the mean ratio (winner's curse; placement of
  /// the weights; the order of measurement).
  bool confirm = true;
  /// The confirmation's margin (0.02 = a winner must be 2% faster).
  double margin = kConfirmMargin;
  /// Time the confirmation in serving mode too, where the clock can
  /// (Clock::time_graph: a GPU clock): per placement, after its cold rounds,
  /// the winner and the incumbent each back to back in a graph
  /// (kGraphCalls calls, the read-only inputs rotated over copies totalling
  /// > 2x the device's L2 where the copy budget allows), in the round's
  /// order; the winner must then win in both modes by `margin` (every
  /// placement and the mean, as cold). Off: cold only.
  bool graph = true;
  /// Bytes the confirmation may allocate for its copies of the read-only
  /// inputs, all placements together; an argument whose copy would pass it
  /// stays on its original buffer (the tuner passes its scratch memory
  /// budget, RuntimeOptions::tune.memory_budget_bytes).
  int64_t confirm_copy_bytes = int64_t{1} << 30;
  /// Exclude variants whose results depend on scheduling.
  bool deterministic = false;
  /// Busy fraction of the tuning thread (1 = flat out). After each
  /// candidate the search sleeps busy_time * (1 - d) / d.
  double duty_cycle = 1.0;
  /// Checked between reps: a set flag ends the search early.
  const std::atomic<bool>* stop = nullptr;
};

struct CandidateResult {
  core::Plan plan;
  Status status;  ///< launch failure or validation failure (with the reason)
  Timing timing;  ///< valid when status is ok
};

struct SearchResult {
  core::Plan best;
  double best_us = 0.0;
  core::Plan default_plan;
  double default_us = 0.0;  ///< the default plan's median (0 when it failed)
  std::vector<CandidateResult> tried;
  int32_t space = 0;  ///< points after constraint prune
  int32_t pruned_by_model = 0;
  int32_t rejected = 0;       ///< failed validation
  int32_t failed = 0;         ///< failed to launch
  bool stopped = false;       ///< ended by the stop flag
  bool out_of_time = false;   ///< the time budget ran out before the space did
  bool confirmed = false;     ///< the winner was measured again against the default
  bool kept_default = false;  ///< ... and lost a round or was not > margin faster: the default stays
  /// The A/A spread of the confirmation: (max - min) / mean of the
  /// incumbent's own per-placement times (0: not confirmed). A spread above
  /// the margin means the margin cannot tell a win from noise here.
  double aa_spread = 0.0;
  /// The clock's screening so far in this process (Clock::screen_note: the
  /// SM clock's median and how many batches were re-timed; "" without one).
  std::string clock_note;
  /// Winner / default per confirmation placement (the two rounds' summed
  /// medians; empty: not confirmed).
  std::vector<double> confirm_ratios;
  /// The confirmation's mean time of the challenger (the search's winner, or
  /// verify_plan's row), µs; 0: not confirmed.
  double challenger_us = 0.0;
  /// How the confirmation timed: "cold" (caches made cold before every rep)
  /// or "cold+graph" (a GPU clock that also times back to back in a graph).
  std::string timing = "cold";
  /// Winner / default per confirmation placement in the graph mode (each a
  /// median of kGraphReps replays, µs per call); empty: no graph timing.
  std::vector<double> graph_ratios;
  /// The graph mode's mean µs per call of the default and the challenger
  /// (0: no graph timing), and how many copies of the read-only inputs the
  /// calls rotated over (1: no rotation) and their bytes in all.
  double graph_default_us = 0.0;
  double graph_challenger_us = 0.0;
  int32_t graph_sets = 0;
  int64_t graph_set_bytes = 0;
  /// The challenger ran cold but could not be captured and timed in a graph
  /// (the floor could): it is not served (an engine runs it in a graph), and
  /// a verification counts it lost.
  bool challenger_not_in_graph = false;
  /// Why the result holds its plan, one line for the row's metadata:
  /// "beat floor by 7.3% (margin 2%)", "floor kept: won by 1.1% < margin 2%",
  /// "floor kept: lost a placement", "floor kept: no candidate beat it in the
  /// search", ... ("" when nothing was decided: a stopped search).
  std::string why;
};

/// Candidate plans for a problem, in search order: the default plan first,
/// then the rest of every accepting variant's space ordered by the perf
/// model when present, else by closeness to the default (fewest differing
/// params first). References and, in deterministic mode, nondeterministic
/// variants are left out.
std::vector<core::Plan> candidates_for(const core::Problem& p, const DeviceInfo& dev, const core::Plan& default_plan,
                                       const SearchOptions& o, int32_t* space, int32_t* pruned);

/// Runs the search over `candidates` (first = the baseline) with
/// `reference` as the validation baseline. On return every written
/// argument holds what it held before the call. Errors: only when the
/// reference itself cannot run (backend_error/...) or out_of_memory; a
/// failing candidate is recorded, never fatal.
Result<SearchResult> search(TuneTarget& target, const std::vector<core::Plan>& candidates, const core::Plan& reference,
                            const SearchOptions& o) noexcept;

/// Times a committed row's plan against the floor on `target` with the
/// search's own stages (verification of docs/tuning.md#verifying-shipped-rows):
/// both validated against `reference` and timed, then the confirmation with
/// the floor as the incumbent and the row as the challenger, whatever the
/// first timings said: kConfirmPlacements placements, two rounds each in both
/// orders. The result's confirm_ratios are row / floor per placement,
/// default_us and challenger_us the floor's and the row's confirmation means,
/// aa_spread the floor's own spread, kept_default whether the row failed to
/// beat the floor by o.margin on every placement. A row that fails to launch
/// or to validate is in tried[1] with its status (confirmed stays false).
/// Errors: the floor itself failing (no verdict is possible), and search()'s.
Result<SearchResult> verify_plan(TuneTarget& target, const core::Plan& floor, const core::Plan& row,
                                 const core::Plan& reference, const SearchOptions& o) noexcept;

/// Test hook: every median the search and the confirmation take goes
/// through `hook(plan, placement, measured_us)` (placement -1: the search's
/// own timing; 0.. the confirmation's cold rounds; kGraphHookPlacement + p
/// its graph mode on placement p) and the hook's answer is used in its
/// place; an empty function removes it. For tests that need a verdict
/// (tests/test_verify.cpp); never set otherwise.
using TimingHook = std::function<double(const core::Plan& plan, int placement, double measured_us)>;
void set_timing_hook_for_testing(TimingHook hook);

/// Zeroes the reset_to_zero arguments of `plan` in `target` (the real launch
/// does this too, so a call gives the same answer whether or not it tuned).
void zero_reset_args(const TuneTarget& target, const core::Plan& plan) noexcept;

}  // namespace dispatch::tune
