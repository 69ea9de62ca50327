// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the benchmark harness shared by the tuner and the
// published benchmarks (bench/), so a tuned pick reproduces in the tables.
//
// Method: warm up, then repeat; before every rep run `prepare` (restore
// in-place arguments, zero accumulators) and make the cache cold; time the
// launch alone; report the median and the spread (p10/p90, min/max).
// CPU: "cold" = read a buffer several times the last-level cache before the
// rep (so neither inputs nor weights are cache-resident, as in a serving
// loop between layers) and time with steady_clock around the call, which
// runs to completion. The GPU backends plug their own clock in (CUDA events,
// a 256 MiB L2-evicting read before each rep, as ../shared/peers/README.md).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "backends/clock.hpp"
#include "backends/cpu/host.hpp"
#include "dispatch/status.hpp"

namespace dispatch::tune {

// The clocks are the backends' (src/backends/clock.hpp): the tuner times
// through them.
using backends::Clock;
using backends::clock_screen_of;
using backends::ClockScreen;
using backends::CpuClock;

struct Timing {
  double median_us = 0.0;
  double p10_us = 0.0;
  double p90_us = 0.0;
  double min_us = 0.0;
  double max_us = 0.0;
  int32_t reps = 0;
};

struct MeasureOptions {
  int32_t warmup = 1;  ///< untimed runs first
  int32_t reps = 5;    ///< timed runs
  /// Stop repeating once this much time went into timed reps (µs); at least
  /// 3 reps are always taken. 0 = no limit.
  double max_total_us = 0.0;
  /// Stop early when, after 3 reps, the median is above this (µs): a
  /// candidate already 1.5x slower than the best need not be timed exactly.
  double abandon_above_us = 0.0;
  bool cold_cache = true;
};

/// Measures `fn`: `prepare` runs before every (warm-up and timed) rep, then
/// the clock's flush when cold_cache is set. Timed reps go to the clock in
/// batches (3, then up to 8 at a time; Clock::time_reps), the early stops
/// checked after each batch. Errors: the first failure of `fn` or `prepare`.
Result<Timing> measure(Clock& clock, const std::function<Status()>& prepare, const std::function<Status()>& fn,
                       const MeasureOptions& o);

/// Median/percentiles of samples (µs). Empty input gives zeros.
Timing summarize(std::vector<double> samples_us);

}  // namespace dispatch::tune
