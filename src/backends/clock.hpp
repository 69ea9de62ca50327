// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — a backend's benchmark clock, as the tuner and the
// benchmarks (bench/) time through it: the base class every backend's clock
// derives from (the CPU's: steady_clock; a GPU's: events, an L2-evicting read
// before each cold rep, graphs), and the SM-clock screen the GPU clocks share.
// The tuner's harness (tune/harness.hpp) drives a clock; a backend never
// includes the tuner.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "dispatch/status.hpp"

namespace dispatch::backends {

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

/// The clock screen of a device (its PCI bus id, or any stable name), one
/// per process, created on first use (a run's median spans every search).
/// Defined here, in plain C++: the GPU TUs only call it (clang 15's HIP
/// device pass crashes instantiating a map of these). Thread-safe.
ClockScreen& clock_screen_of(const std::string& device);

}  // namespace dispatch::backends
