// SPDX-License-Identifier: Apache-2.0
// kdispatch — the Runtime: config dirs, options, the published dispatch table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch/config.hpp"
#include "dispatch/device.hpp"
#include "dispatch/export.hpp"
#include "dispatch/status.hpp"
#include "dispatch/types.hpp"

namespace dispatch {

/// The library version, "MAJOR.MINOR.PATCH".
KDISPATCH_API const char* version() noexcept;

/// Verbosity of the messages kdispatch writes to stderr. Nothing on the
/// dispatch hot path logs; loading, tuning and reloads do.
enum class LogLevel : uint8_t { off = 0, error = 1, warn = 2, info = 3, debug = 4 };

/// Online tuning mode.
enum class TuneMode : uint8_t {
  /// Table lookup + get_default only (the default).
  off = 0,
  /// A miss is tuned on the first call, on the caller's thread and buffers
  /// (arguments modified in place are restored, so the call's result is
  /// exactly one application of the op); for development.
  sync = 1,
  /// A miss returns at once on get_default's plan; the shape is queued
  /// (bounded, lock-free; dropped and counted when full) and one background
  /// thread tunes queued shapes on its own scratch buffers, most-missed
  /// first, and publishes a new table.
  background = 2,
};
/// "off" | "sync" | "background".
KDISPATCH_API const char* tune_mode_name(TuneMode m) noexcept;

/// Tuning knobs. Every field has a working default; the environment
/// variables in brackets set them on the default runtime.
struct TuneOptions {
  TuneMode mode = TuneMode::off;  ///< [KDISPATCH_TUNE]
  /// Where winners are persisted and read back from, in the config-file
  /// format. Empty: $KDISPATCH_CACHE_DIR, else $XDG_CACHE_HOME/kdispatch,
  /// else ~/.cache/kdispatch; with none of them set, a per-user fallback:
  /// $XDG_RUNTIME_DIR/kdispatch, else ${TMPDIR:-/tmp}/kdispatch-<uid>,
  /// created 0700 and refused when it is a symbolic link, owned by another
  /// uid or group/world-writable. A dir given here or in the environment is
  /// refused when world-writable, or owned by another uid (not root) and not
  /// group-writable by a group of this process. A refused dir is neither
  /// read nor written (tuning still
  /// runs, its winners live in memory only); load_report().notes names the
  /// dir and why. Dirs kdispatch creates in it are 0700.
  ///                                               [KDISPATCH_CACHE_DIR]
  std::string cache_dir;
  bool persist = true;     ///< write winners to the cache dir
  bool load_cache = true;  ///< serve valid (same-fingerprint) cached winners
  /// Scratch memory the background tuner may hold for one shape, bytes;
  /// a shape needing more is skipped and counted.  [KDISPATCH_TUNE_MEM]
  int64_t memory_budget_bytes = 1LL << 30;
  /// The expert ids a Mixture-of-Experts op (fused_moe) is tuned on:
  /// "uniform" (or empty; every expert equally likely, SGLang's tuner's
  /// assumption), "skewed" (a few hot experts take most tokens), or the path
  /// of an .npy file of int32 [tokens, top_k] ids dumped from a server
  /// (numpy '<i4', C order; read and checked by Runtime::create, which
  /// refuses a bad one naming the file; a problem whose top_k or E the file
  /// does not fit is refused when it is tuned).   [KDISPATCH_TUNE_ROUTING]
  std::string routing;
  /// Time spent searching one shape before the best so far wins, ms.
  double time_budget_ms = 2000.0;
  /// Busy fraction of the background tuner thread (0 < d <= 1).
  double duty_cycle = 0.5;
  /// Timed repeats per candidate (after one warm-up); median wins.
  int32_t reps = 5;
  /// How much faster than the floor (the plan the engine would run without
  /// us: cuBLAS / cuBLASLt as torch calls them on CUDA; get_default's plan
  /// elsewhere) a candidate must be, on the confirmation's mean ratio and on
  /// every placement, to replace it; otherwise the row records the floor.
  /// 0.02 = 2%.  [KDISPATCH_TUNE_MARGIN; tune --margin]
  double margin = 0.02;
  /// Time the confirmation in serving mode as well (GPU): the winner and the
  /// floor each back to back in a CUDA graph, the weights rotated past L2;
  /// a winner must win cold and in the graph. Off: cold only. The row's
  /// metadata says which ("timing": "cold" | "cold+graph").
  ///                                               [KDISPATCH_TUNE_GRAPH=0|1]
  bool graph_timing = true;
  /// Perf-model top-k (variants with a model): points kept per variant.
  int32_t max_candidates = 96;
  /// Capacity of the background miss queue (rounded up to a power of 2).
  int32_t queue_capacity = 1024;
  /// Compare every candidate's output with the reference variant's.
  bool validate = true;
  /// Make the caches cold before every timed rep (the published benchmarks'
  /// method); off only for quick tests.
  bool cold_cache = true;
  /// When persisting into a file written by another build (a different
  /// fingerprint), keep its rows instead of dropping them as stale. For
  /// dirs of committed configs (`kdispatch tune --emit`), which are checked
  /// by variant and config space at load, not by fingerprint.
  bool keep_rows_of_other_builds = false;
  /// Tensor-parallel ranks sharing a cache dir tune each shape once:
  /// a shape is claimed in the cache dir before tuning.
  bool claim_shapes = true;
  /// Re-verify committed rows on this machine: a background thread (the
  /// background tuner's, started for this in any mode), when it has no miss
  /// to tune, times each committed row of this machine's devices (config
  /// dirs and shipped configs; CPU rows tuned on another vendor or family
  /// first) against the floor, one at a time, with the duty cycle, and
  /// records the verdict in the cache dir (.verify/); a row that lost by
  /// more than `margin` in two verifications is demoted (the floor serves
  /// its M) and a new table is published. Readers never wait for it.
  /// verify_rows() and `kdispatch verify` do the same on demand
  /// (docs/tuning.md#verifying-shipped-rows).   [KDISPATCH_VERIFY_SHIPPED=1]
  bool verify_shipped = false;
};

/// How a Runtime is set up. Every field has a working default.
struct RuntimeOptions {
  /// Extra config dirs, highest precedence first. They outrank the shipped
  /// configs (and, once tuning lands, the tuning cache) on the same M.
  /// Each dir is read recursively; SGLang/vLLM trees can be given as they are.
  std::vector<std::string> config_dirs;
  /// Load the configs shipped with kdispatch (the repo's configs/, or
  /// <prefix>/share/kdispatch/configs once installed).
  bool load_shipped_configs = true;
  /// Override for where the shipped configs live; empty = built-in path.
  std::string shipped_configs_dir;
  /// Version of the engine's kernel compiler, used to pick version folders
  /// `triton_X_Y_Z/` ("3.5.1"): the exact folder first, then the newest older
  /// one, then the newest newer one (reported). Empty = newest folder.
  std::string backend_version;
  /// Extra device-name aliases (see resolve_device_name).
  std::vector<DeviceAlias> device_aliases;
  /// Nearest-M policy. Unbounded (default): the nearest key always serves,
  /// as in SGLang. Bounded: an M outside [min_key / bound_ratio,
  /// max_key * bound_ratio] of a table is a miss (default config served).
  bool bounded_nearest = false;
  double bound_ratio = 2.0;
  LogLevel log_level = LogLevel::warn;
  /// Reload automatically when files in the config dirs change (inotify on
  /// Linux; changes are coalesced for ~100 ms).          [KDISPATCH_WATCH=1]
  bool watch = false;
  /// Forced plans, for debugging and A/B runs: "<op>=<variant>" or
  /// "<op>=<variant>:<param>=<value>,<param>=<value>" (e.g.
  /// "rmsnorm=rmsnorm_bf16__vec:vec=8,unroll=2"). A forced variant serves
  /// every call of that op whose dtype it computes; lookup's "why" shows it.
  /// Errors at create: no_variant / config_error naming the entry.
  ///                                         [KDISPATCH_FORCE, ';'-separated]
  std::vector<std::string> force;
  /// Deterministic serving: variants whose results depend on scheduling
  /// (atomics, split-K reductions) are never served or tuned; table rows
  /// naming one fall back to get_default.       [KDISPATCH_DETERMINISTIC=1]
  bool deterministic = false;
  TuneOptions tune;
};

/// Options from the KDISPATCH_* environment, on top of `base`:
/// KDISPATCH_CONFIG_DIRS (':'-separated, highest precedence first),
/// KDISPATCH_SHIPPED_CONFIGS (a dir, or "0" to load none),
/// KDISPATCH_BACKEND_VERSION, KDISPATCH_LOG_LEVEL (off|error|warn|info|debug),
/// KDISPATCH_WATCH, KDISPATCH_FORCE, KDISPATCH_DETERMINISTIC, KDISPATCH_TUNE
/// (off|sync|background), KDISPATCH_CACHE_DIR, KDISPATCH_TUNE_MEM (bytes,
/// K/M/G suffixes), KDISPATCH_TUNE_BUDGET_MS, KDISPATCH_TUNE_MARGIN,
/// KDISPATCH_VERIFY_SHIPPED (0 or 1); KDISPATCH_CACHE_LOCKING
/// (auto|flock|fragments) is checked here and read by the writer
/// (cache_locking). A KDISPATCH_CONFIG_DIRS entry that does not exist or is
/// not a directory is skipped (the other dirs serve), and said once per
/// process and dir on stderr at warn ("kdispatch:
/// KDISPATCH_CONFIG_DIRS='<value>': config dir '<dir>' does not exist;
/// serving without it"; KDISPATCH_LOG_LEVEL, else base.log_level): failing
/// would fail the default runtime and every call through it. Thread-safe.
/// Errors: invalid_argument naming the variable and its value.
KDISPATCH_API Result<RuntimeOptions> options_from_env(RuntimeOptions base = {}) noexcept;

/// How tuning results are written into a cache or emit dir
/// (docs/tuning.md#storage-a-cluster-shares).
struct CacheLocking {
  /// false: each <key>.json is merged under a per-file flock; true: each
  /// process writes its own fragment <key>.json.d/<host>-<pid>.json, which
  /// the loader reads together with <key>.json as one table.
  bool fragments = false;
  /// Why: what the flock check saw, or "KDISPATCH_CACHE_LOCKING=...".
  std::string reason;
};

/// The scheme the writer uses in `dir`: KDISPATCH_CACHE_LOCKING=flock or
/// =fragments forces one; otherwise (unset, "auto") a check that a second
/// exclusive flock on one file is refused while the first is held, run
/// once per process per dir and cached. The check creates `dir` (0700) if
/// absent and a probe file in it, removed at once. Errors:
/// invalid_argument for another KDISPATCH_CACHE_LOCKING value, io_error
/// naming the probe file when it cannot be created (a read-only dir).
KDISPATCH_API Result<CacheLocking> cache_locking(const std::string& dir) noexcept;

/// Tuning counters of a runtime (a snapshot; values only grow).
struct TuneStats {
  int64_t misses = 0;               ///< calls that found no table row (served by get_default)
  int64_t queued = 0;               ///< miss events queued for the background tuner
  int64_t dropped = 0;              ///< miss events dropped: queue full
  int64_t shapes_tuned = 0;         ///< shapes searched and published
  int64_t shapes_skipped = 0;       ///< over the memory budget, claimed by another process, or failed
  int64_t candidates_run = 0;       ///< candidate configs benchmarked
  int64_t candidates_rejected = 0;  ///< failed validation
  int64_t candidates_failed = 0;    ///< failed to launch
  int64_t publishes = 0;            ///< tables published by the tuner
  int64_t pending = 0;              ///< distinct shapes waiting in the tuner
  double tune_seconds = 0.0;        ///< wall time spent searching
  bool frozen = false;
  /// Sync mode: misses seen while their stream was being captured into a
  /// graph, waiting to be searched by the next miss outside a capture.
  int64_t deferred = 0;
  /// Background mode: times the tuner waited for a graph capture (on a
  /// stream a miss was seen capturing) to end before a search.
  int64_t capture_waits = 0;
  /// TuneOptions::verify_shipped: committed rows verified against the floor
  /// by the background thread, rows it demoted, and rows still to verify.
  int64_t rows_verified = 0;
  int64_t rows_demoted = 0;
  int64_t rows_to_verify = 0;
};

/// A loaded, immutable dispatch table plus the options it was built from.
///
/// Thread-safety: every const method and every op/lookup call may run
/// concurrently from any number of threads. Readers take no lock, allocate
/// nothing and make no syscall on a table hit. `reload()` may run
/// concurrently with readers: it builds a new table and publishes it with
/// one atomic release store; readers see either the old or the new table,
/// never a mix. Destroying a Runtime while calls are in flight on it is
/// undefined behaviour.
class KDISPATCH_API Runtime {
 public:
  /// Builds a runtime and loads its config dirs. A bad or foreign config file
  /// never fails creation: it is skipped and listed in load_report().
  /// Errors: invalid_argument (a config dir that does not exist or is not a
  /// directory, naming it), out_of_memory.
  static Result<std::unique_ptr<Runtime>> create(RuntimeOptions options = {}) noexcept;

  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const RuntimeOptions& options() const noexcept;

  /// The report of the most recent (re)load. Allocates a copy.
  /// Thread-safe.
  /// Not noexcept: throws std::bad_alloc (only) when memory runs out.
  LoadReport load_report() const;

  /// Re-reads every config dir, builds a new table and publishes it
  /// atomically. On a failure the old table keeps serving. Readers are never
  /// blocked. Errors: out_of_memory, internal.
  Status reload() noexcept;

  /// The device description for `device` (probed once per ordinal).
  /// Errors: unsupported_device when the device's backend is not compiled
  /// in or the ordinal does not exist.
  Result<DeviceInfo> device_info(Device device) const noexcept;

  /// Path of a config source (file relative to its dir) by the id found in
  /// DispatchInfo::source_id; "" for an unknown id. Ids stay valid for the
  /// runtime's lifetime. Thread-safe.
  /// Not noexcept: throws std::bad_alloc (only) when memory runs out.
  std::string source_path(uint32_t source_id) const;

  /// The config dir (as given, or the shipped-configs dir) of a source id;
  /// "" for an unknown id. Thread-safe.
  /// Not noexcept: throws std::bad_alloc (only) when memory runs out.
  std::string source_dir(uint32_t source_id) const;

  /// Gives `stream` of a GPU device a gemm workspace of `workspace_bytes`
  /// (device memory allocated now, on `device`, kept until the runtime is
  /// destroyed): calls on that stream then run plans that need one
  /// (cuBLASLt's split-K algorithms, the tiled family's split_k > 1).
  /// Call it when the stream is set up, or at its first call inside a graph
  /// capture (CUDA: the allocation runs in relaxed capture mode and is not
  /// captured, as torch's caching allocator allocates during a capture);
  /// the workspace is used in stream order, so one stream's
  /// calls never race on it. A stream attached again keeps its first
  /// workspace. Up to 64 streams per runtime. Default size 32 MiB (torch's
  /// cuBLAS workspace on Hopper). Thread-safe; calls may run meanwhile.
  /// Errors: invalid_argument (a CPU device, bytes < 0), unsupported_device
  /// (backend not available), out_of_memory (the allocation, or 64 streams
  /// already attached).
  Status attach_stream(Device device, Stream stream, int64_t workspace_bytes = int64_t{32} << 20) noexcept;

  /// Stops (true) or resumes (false) all tuning and all table changes:
  /// no search starts, the tuner's queue is ignored, reload() and the
  /// watcher publish nothing. For deterministic serving. Thread-safe.
  void freeze(bool frozen = true) noexcept;
  bool frozen() const noexcept;

  /// Tuning counters. Thread-safe.
  TuneStats tune_stats() const noexcept;

  /// Waits until the background tuner has nothing queued or in flight, or
  /// `timeout_s` passed. True when idle. For tools and tests.
  bool wait_tuner_idle(double timeout_s) noexcept;

  /// Writes the shapes that missed the table so far as an untuned-shapes CSV
  /// (aiter's offline loop): one row per (op, dtype, shape, M) with the
  /// miss count. Errors: io_error naming the path.
  Status export_misses(const std::string& path) const noexcept;

  /// The tuning cache dir in use ("" when tuning and the cache are off, or
  /// when the resolved dir was refused: see TuneOptions::cache_dir).
  /// Thread-safe.
  /// Not noexcept: throws std::bad_alloc (only) when memory runs out.
  std::string cache_dir() const;

  /// Internal (src/api/runtime_impl.hpp). Hidden: a nested class would
  /// otherwise inherit the exported visibility of Runtime, and its methods
  /// would become ABI of libkdispatch.so. Code that reaches into it links
  /// the static kdispatch_internal.
#if defined(__GNUC__) && !defined(_WIN32)
  struct [[gnu::visibility("hidden")]] Impl;
#else
  struct Impl;
#endif
  Impl& impl() noexcept { return *impl_; }
  const Impl& impl() const noexcept { return *impl_; }

 private:
  explicit Runtime(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

/// The process-wide runtime configured from the environment
/// (options_from_env()), built on first use and kept until exit. Every call
/// returns the same runtime; when building it failed, every call returns
/// that error. Thread-safe.
KDISPATCH_API Result<Runtime*> default_runtime() noexcept;

}  // namespace dispatch
