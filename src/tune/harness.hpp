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

#include "dispatch/status.hpp"

namespace dispatch::tune {

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

/// A clock and cache policy for one backend.
class Clock {
 public:
  virtual ~Clock() = default;
  /// Makes the caches cold for the next rep.
  virtual void flush() = 0;
  /// Runs `fn` once and returns its duration in µs, or a failed Status
  /// from fn.
  virtual Result<double> time_us(const std::function<Status()>& fn) = 0;
  /// `n` timed reps of `fn`, each after `prepare` (when set) and, when
  /// `cold`, flush(); durations in µs in rep order. The default runs
  /// time_us() per rep. A GPU clock enqueues all n behind a lead of GPU
  /// work and waits once (the peers' method, bench/gpu/gpu_timing.py): a
  /// host wait after every rep left the GPU idle before each flush, and on
  /// the H200 that timed our decode kernels ~0.45 µs (3-5%) faster than the
  /// grid bench does, cuBLASLt's not (bench/results/h200_gemm_fixed.md).
  virtual Result<std::vector<double>> time_reps(const std::function<Status()>& prepare,
                                                const std::function<Status()>& fn, int n, bool cold);
  /// Serving-mode timing (issue 32, item 3): `calls` launches back to back
  /// captured into one graph on the clock's stream (thread-local capture
  /// mode on a non-blocking stream of the clock's own, so that neither an
  /// engine thread's global-mode capture nor its work on the legacy default
  /// stream meets it), `fn(i, stream)` enqueuing call i on `stream` (the
  /// caller rotates its read-only inputs over copies, so the weights come
  /// from memory as in a model's layers); the graph is replayed `reps`
  /// times on the tuner's stream, each replay behind a cache flush; the
  /// result is each replay's time divided by `calls`, µs per call. `fn` must
  /// only enqueue work on `stream` (no allocation, no synchronization).
  /// unsupported_problem: this clock cannot capture (the CPU; HIP until its
  /// tuner has a stream of its own); a failure of `fn`, or of the capture,
  /// is returned as it came.
  virtual Result<std::vector<double>> time_graph(const std::function<Status(int, void*)>& fn, int calls, int reps);
  /// Whether time_graph can work here at all (asked before the caller
  /// spends memory on copies for it); false in this base class.
  virtual bool has_graph() const { return false; }
  /// What the clock screened so far (ClockScreen::note), "" when it does
  /// not screen (the CPU clock).
  virtual std::string screen_note() const { return {}; }
};

/// The SM clock screen of a run (issue 32, item 3): the clock reading (MHz)
/// of each timed batch, taken while the batch runs. A batch whose reading
/// is below `ratio` x the median of the readings before it (once there are
/// `min_history` of them) is refused: the clock times it again. Readings of
/// 0 (no reading: no NVML) are accepted and not recorded. The last 256
/// readings make the median. One per device per process (a run's median
/// spans every search of the process); thread-safe.
class ClockScreen {
 public:
  explicit ClockScreen(double ratio = 0.9, int min_history = 5) : ratio_(ratio), min_history_(min_history) {}
  /// Records `mhz`; whether the batch it was read during is accepted.
  /// `last_try`: accepted whatever the reading (counted as kept throttled).
  bool accept(unsigned mhz, bool last_try = false);
  int64_t batches() const;
  int64_t discarded() const;
  int64_t kept_throttled() const;
  double median_mhz() const;  ///< of the kept readings; 0 before any
  /// "SM clock (<source>): median M MHz over B batches, D re-timed below
  /// 0.9x[, K kept throttled]", or "" when no reading was taken.
  std::string note(const std::string& source) const;

 private:
  double median_locked() const;
  mutable std::mutex mu_;
  double ratio_;
  int min_history_;
  std::vector<unsigned> ring_;
  size_t next_ = 0;
  int64_t batches_ = 0, discarded_ = 0, kept_throttled_ = 0;
};

/// The CPU clock: steady_clock around the call; flush() reads a buffer of
/// 3x the last-level cache, clamped to [8, 96] MiB (allocated once per
/// process, shared read-only).
class CpuClock final : public Clock {
 public:
  explicit CpuClock(int64_t llc_bytes);
  void flush() override;
  Result<double> time_us(const std::function<Status()>& fn) override;

 private:
  int64_t llc_bytes_ = 0;
  const std::vector<uint64_t>* sweep_ = nullptr;
  volatile uint64_t sink_ = 0;
};

/// The clock screen of a device (its PCI bus id, or any stable name), one
/// per process, created on first use (a run's median spans every search).
/// Defined here, in plain C++: the GPU TUs only call it (clang 15's HIP
/// device pass crashes instantiating a map of these). Thread-safe.
ClockScreen& clock_screen_of(const std::string& device);

/// Measures `fn`: `prepare` runs before every (warm-up and timed) rep, then
/// the clock's flush when cold_cache is set. Timed reps go to the clock in
/// batches (3, then up to 8 at a time; Clock::time_reps), the early stops
/// checked after each batch. Errors: the first failure of `fn` or `prepare`.
Result<Timing> measure(Clock& clock, const std::function<Status()>& prepare, const std::function<Status()>& fn,
                       const MeasureOptions& o);

/// Median/percentiles of samples (µs). Empty input gives zeros.
Timing summarize(std::vector<double> samples_us);

}  // namespace dispatch::tune
