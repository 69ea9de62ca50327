// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the online tuner of one Runtime: sync tuning on a
// miss, the background thread, pretune, freeze, persistence and publishing.
//
// Where it sits: the op path calls note_miss() on a miss (always: misses are
// recorded for export) and, in sync mode, tune_on_caller() before launching.
// The background thread pops miss events, ranks shapes by miss count, tunes
// the most-missed one on its own scratch buffers (same shape, strides and
// dtypes; never the caller's), within a time budget per shape, a duty
// cycle and a scratch-memory budget, then persists the winner (atomic,
// merged, claimed — store/writer.hpp) and publishes a new table through
// the runtime. Stopping the runtime stops the thread, mid-search included.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "table/snapshot.hpp"
#include "tune/capture.hpp"
#include "tune/queue.hpp"
#include "tune/routing_file.hpp"
#include "tune/search.hpp"
#include "tune/verify.hpp"

namespace dispatch::tune {

/// A committed row to verify on this machine (tune/verify.hpp).
struct VerifyRow {
  std::string key;          ///< the canonical static key
  core::Problem problem;    ///< at the row's M, on device 0 of its backend
  core::Plan plan;          ///< the row's plan
  Config config;            ///< as written
  std::string config_text;  ///< config_to_json(config): what its verdict is recorded for
  std::string source, source_dir;
  /// CPU rows: the CPU the file records it was tuned on ("AuthenticAMD
  /// family 25"; "" not recorded); foreign: of another vendor or family
  /// than this host's, or not recorded (verified first, noted by lookup).
  std::string tuned_on;
  bool foreign = false;
  std::string id() const { return row_id(key, problem.m); }
};

/// One verification: the search's result (verify_plan) and the verdict.
struct VerifyOutcome {
  SearchResult search;
  Outcome outcome = Outcome::within_margin;
  double mean_ratio = 0.0;  ///< row / floor over the placements (0: the row failed)
  Verdict verdict;          ///< after this verification
  std::string recorded_in;  ///< the verdict file ("" when kept in memory: no cache dir)
};

/// What the tuner needs from its runtime.
struct TunerHooks {
  /// Adds tuned rows to the in-process tuning layer and publishes a table.
  /// Returns false when the runtime is frozen (nothing published).
  std::function<bool(std::vector<table::TableInput>)> publish;
  /// Interns a (dir, relative path) source, returning its id.
  std::function<uint32_t(const std::string&, const std::string&)> intern;
  /// True when the current table already serves (key, m) from a row whose
  /// M is near m (tune/rules.hpp: near_tuned; tuning it again would gain little).
  std::function<bool(const std::string& key, int64_t m)> covered;
  /// Re-reads the config dirs (to pick up another process's results).
  std::function<void()> reload;
  /// The committed rows to verify (Runtime::Impl::committed_rows), for
  /// RuntimeOptions::tune.verify_shipped, when the config dirs were loaded
  /// again since *seen (which it updates); false: unchanged.
  std::function<bool(uint64_t* seen, std::vector<VerifyRow>* out)> committed_rows;
  /// A verdict changed: rebuild the table with the verdict cache applied.
  std::function<void()> verdicts_changed;
  /// Where verdicts go when there is no cache dir (the runtime's).
  std::shared_ptr<MemoryVerdicts> memory_verdicts;
};

/// One shape's outcome.
struct ShapeOutcome {
  core::Plan plan;
  SearchResult search;
  bool persisted = false;
  uint32_t source_id = 0;  ///< the published row's source (cache file)
};

/// One op call as the tuner's hook on the op path sees it (Tuner::observe).
struct ObservedCall {
  const core::Problem& problem;
  const core::LaunchArgs& la;
  void* stream;           ///< the call's stream handle (null: the legacy default stream)
  bool capturing;         ///< CallOptions::capturing: the caller says its stream captures
  const DeviceInfo& dev;  ///< the tensors' device
  uint64_t key_hash;      ///< hash of the call's binary key (table/key.hpp: OwnKey)
};

/// The sync search's winner, when Tuner::observe searched the call's shape.
struct TunedNow {
  bool tuned = false;  ///< false: the call keeps its choice
  core::Plan plan;
  uint32_t source_id = 0;  ///< the published row's source
};

class Tuner {
 public:
  /// `routing`: the loaded TuneOptions::routing (null: uniform).
  Tuner(const RuntimeOptions& options, std::string cache_dir, TunerHooks hooks,
        std::shared_ptr<const Routing> routing = nullptr);
  ~Tuner();
  Tuner(const Tuner&) = delete;
  Tuner& operator=(const Tuner&) = delete;

  TuneMode mode() const noexcept { return mode_; }
  const std::string& cache_dir() const noexcept { return cache_dir_; }
  /// The source rank of in-process tuned rows.
  void set_rank(int32_t rank) noexcept { rank_ = rank; }

  /// The op path's one hook (tune/observe.cpp), after choose and before the
  /// launch, for a call whose plan came from `source` (a table row tuned at
  /// `table_m`, get_default's pick, or a forced plan). A miss is recorded
  /// (for export), queued in background mode and, in sync mode, searched
  /// on the caller's buffers unless a graph capture is in the way (then
  /// deferred); a table hit far from the call's M (not near_tuned) is
  /// sampled; a forced plan teaches nothing. *now gets the sync search's
  /// winner. Errors: the caller's stream failing to synchronise before the
  /// search.
  Status observe(const ObservedCall& call, PlanSource source, int64_t table_m, TunedNow* now) noexcept;

  /// Op path, on a miss (or a far nearest-M hit while tuning): record the
  /// shape; in background mode queue it. Lock-free; never blocks.
  void note_miss(const core::Problem& p, const core::LaunchArgs& la, uint64_t key_hash, bool queue) noexcept;

  /// Op path, background mode, on a miss: the call's stream, which the
  /// tuner asks about before each search (it waits while it captures).
  void note_stream(DeviceType backend, void* stream) noexcept { captures_.note(backend, stream); }
  /// True while a stream a miss was noted on is being captured.
  bool capture_in_progress() noexcept { return captures_.any_capturing(); }
  /// Op path, sync mode, on a miss whose stream is being captured into a
  /// graph: the shape is deferred (no search inside a capture).
  void note_capture(const core::Problem& p, const core::LaunchArgs& la, uint64_t key_hash) noexcept;
  /// Sync mode, on a miss outside a capture: searches the shapes deferred
  /// during captures (scratch buffers, this thread), once each, except the
  /// calling shape (key_hash, m), which the caller searches on its own
  /// buffers next. Returns how many were published.
  int drain_deferred(uint64_t key_hash, int64_t m) noexcept;

  /// Sync mode: search on the caller's buffers (restoring them), persist
  /// and publish. Returns the winner, or an error (the caller then runs
  /// get_default). Only one sync search runs at a time; a concurrent miss
  /// gets failed_precondition and serves the default.
  Result<ShapeOutcome> tune_on_caller(const core::Problem& p, const core::LaunchArgs& la, const DeviceInfo& dev,
                                      const std::string& key) noexcept;

  /// Tunes on scratch buffers laid out as `ld` (pretune and the background
  /// thread). Blocking.
  Result<ShapeOutcome> tune_on_scratch(const MissEvent& ev, const DeviceInfo& dev, const std::string& key,
                                       bool background = false) noexcept;

  /// One plan's times by time_on_scratch(): ok and one median (µs) per
  /// round, or why the plan could not be timed (a launch failure, an output
  /// that differs from the reference's).
  struct PlanTiming {
    Status status;
    std::vector<double> round_us;
  };
  /// Times each of `plans` (resolved and accepted by supports() for
  /// ev.problem) on scratch buffers laid out and filled as tune_on_scratch()
  /// lays them out, with the search this tuner runs (validation against the
  /// reference, then the harness with the tuning options' reps and cold
  /// cache) over one plan at a time, no confirmation: `rounds` rounds, the
  /// plans in order on even rounds and in reverse order on odd ones (so no
  /// plan is always timed first). Persists and publishes nothing (so it runs
  /// when frozen too): `kdispatch merge --retime`. Blocking. Errors: the
  /// scratch's (over the memory budget, out of memory), the runtime
  /// stopping; a failing plan is reported in its PlanTiming.
  Result<std::vector<PlanTiming>> time_on_scratch(const MissEvent& ev, const DeviceInfo& dev, const std::string& key,
                                                  const std::vector<core::Plan>& plans, int rounds) noexcept;

  /// Verifies a committed row against the floor on scratch buffers laid out
  /// as pretune_key() lays them out (tune::verify_plan, the tuning options'
  /// reps, cold cache and margin; the duty cycle when `background`), and
  /// records the outcome in the verdict cache (tune/verify.hpp) of the cache
  /// dir, or in memory when there is none. Runs when frozen too (it
  /// publishes nothing; the caller republishes). Errors: the scratch's, the
  /// floor failing here, a confirmation that could not be completed (a stop
  /// request): nothing is recorded then.
  Result<VerifyOutcome> verify_row(const VerifyRow& row, const DeviceInfo& dev, bool background = false) noexcept;

  /// Searches `candidates` of a target that is not a built-in op (tests, and
  /// kernels a caller wraps itself) with the same search, validation and
  /// publishing as every op: the winner is published under `key` at the
  /// target's problem.m. Not persisted.
  Result<ShapeOutcome> tune_custom(TuneTarget& target, const std::vector<core::Plan>& candidates,
                                   const core::Plan& reference, const DeviceInfo& dev, const std::string& key) noexcept;

  void freeze(bool f) noexcept { frozen_.store(f, std::memory_order_release); }
  bool frozen() const noexcept { return frozen_.load(std::memory_order_acquire); }

  TuneStats stats() const noexcept;
  bool wait_idle(double timeout_s) noexcept;
  /// Misses so far, with counts.
  std::vector<std::pair<MissEvent, int64_t>> misses() const { return misses_.snapshot(); }

  /// The key builder the tuner uses (same as the op path).
  static std::string key_of(const core::Problem& p, const DeviceInfo& dev);

 private:
  Result<ShapeOutcome> tune_target(TuneTarget& target, const DeviceInfo& dev, const std::string& key,
                                   bool background) noexcept;
  SearchOptions search_options(const DeviceInfo& dev, bool background) const;
  Result<ShapeOutcome> search_and_publish(TuneTarget& target, const std::vector<core::Plan>& cands,
                                          const core::Plan& ref, const DeviceInfo& dev, const std::string& key,
                                          const SearchOptions& so, int32_t space, int32_t pruned);
  void background_loop();
  /// Background thread, idle: verifies the next committed row (verify_shipped);
  /// false when none was left to verify.
  bool verify_next_shipped(const std::function<void(DeviceType)>& prepare_gpu);
  /// Background thread: waits while a noted stream captures (stop ends it).
  void wait_for_captures();
  bool persist_and_publish(const std::string& key, const core::Problem& p, const core::Plan& plan,
                           const SearchResult& sr, std::string* why, uint32_t* source_id);

  const RuntimeOptions options_;
  const std::shared_ptr<const Routing> routing_;  ///< never null
  const TuneMode mode_;
  const std::string cache_dir_;
  TunerHooks hooks_;
  int32_t rank_ = 0;

  BoundedQueue<MissEvent> queue_;
  MissTable misses_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> frozen_{false};
  std::atomic<bool> aa_warned_{false};  ///< the A/A-above-margin warning was given
  std::atomic<bool> busy_{false};       ///< the background thread is between pop and publish
  std::mutex sync_mu_;                  ///< one sync search (or background verification) at a time
  CaptureWatch captures_;
  std::mutex deferred_mu_;
  std::vector<MissEvent> deferred_;  ///< sync mode: misses seen during a capture (bounded: 256)

  // Verification (verify_row; background: verify_next_shipped).
  struct VerifyQueue {
    std::vector<VerifyRow> rows;      ///< still to verify in this pass, in order
    std::map<std::string, int> done;  ///< row id + config -> verifications by this thread
    uint64_t loads_seen = 0;          ///< the runtime's load count the list was made at
  };
  VerifyQueue verify_queue_;  ///< the background thread's only

  // Counters (relaxed; read by stats()).
  std::atomic<int64_t> n_deferred_{0}, n_capture_waits_{0};
  std::atomic<int64_t> n_misses_{0}, n_queued_{0}, n_dropped_{0}, n_tuned_{0}, n_skipped_{0}, n_run_{0}, n_rejected_{0},
      n_failed_{0}, n_publishes_{0}, n_pending_{0};
  std::atomic<int64_t> tune_us_{0};
  std::atomic<int64_t> n_verified_{0}, n_demoted_{0}, n_verify_pending_{0};

  std::thread thread_;
};

}  // namespace dispatch::tune
