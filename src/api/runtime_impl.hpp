// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — what a Runtime holds.
#pragma once

#include <atomic>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "api/runtime_parts.hpp"
#include "core/op.hpp"
#include "dispatch/runtime.hpp"
#include "table/snapshot.hpp"

namespace dispatch::store {
struct LoadOutput;
}

namespace dispatch::tune {
class Tuner;
struct VerifyRow;
class MemoryVerdicts;
struct Verdicts;
}  // namespace dispatch::tune
namespace dispatch::store {
class DirWatcher;
}

namespace dispatch {

/// Bumped in every child of fork() (a pthread_atfork handler): a runtime
/// made in another generation runs in a forked child, where its watcher
/// and tuner threads do not exist and any lock they held stays held.
uint64_t fork_generation() noexcept;

struct Runtime::Impl {
  RuntimeOptions options;
  /// fork_generation() when the runtime was made.
  uint64_t made_in_generation = 0;
  /// Made before a fork(), used in the child: it serves its table and the
  /// defaults (lock-free), and refuses what needs its threads or locks
  /// (tuning, reload, misses export, stream workspaces).
  bool forked_child() const noexcept { return made_in_generation != fork_generation(); }
  Status refuse_in_child(const char* what) const;
  /// In a forked child, the first call that would tune (a miss, or a far
  /// table row, with tuning on) logs once per process, at warn, why tuning
  /// is off there; later calls stay silent. Thread-safe.
  void note_no_tuning_in_child() const noexcept;
  /// The fork_generation() in which note_no_tuning_in_child last logged
  /// (made_in_generation at create: nothing logged).
  mutable std::atomic<uint64_t> child_tuning_noted{0};
  /// The pid that created the runtime (named by that note).
  int made_in_pid = 0;
  std::vector<int> backend_version;  ///< parsed options.backend_version
  table::NearestPolicy policy;
  std::string shipped_dir;  ///< resolved shipped-configs dir ("" = none)

  // ---- the parts (api/runtime_parts.hpp), each with its own lock
  /// The published table; first, so its generation word starts the object's
  /// first cache line (a memoised hit reads it, then `forced.any()`).
  api::PublishedTable table;
  api::ForcedPlans forced;
  api::StreamWorkspaces streams;
  api::SourceIds sources;
  api::LoadReports reports;

  /// The tuning cache dir ("" = none, or refused) and the source ranks.
  std::string cache_dir;
  /// Why the resolved cache dir was refused ("" = it was not): a note of
  /// every load report, and a warning at create (store/private_fs.hpp).
  std::string cache_dir_refused;
  int32_t tuned_rank = 0;
  int32_t cache_rank = 0;
  int32_t shipped_rank = 0;

  std::atomic<bool> frozen{false};
  /// key_hash(device_name) of each (backend, ordinal < 16), computed on
  /// first use (the op hot path hashes the device name into its binary
  /// key); 0 = not yet. Relaxed: every thread computes the same value.
  mutable std::atomic<uint64_t> name_hashes[3][16] = {};
  /// key_hash(dev.device_name) of the tensors' device `d`.
  uint64_t device_name_hash(Device d, const DeviceInfo& dev) const noexcept;
  std::unique_ptr<tune::Tuner> tuner;
  std::unique_ptr<store::DirWatcher> watcher;

  /// Adds tuned rows and publishes a rebuilt table (false when frozen).
  bool publish_tuned(std::vector<table::TableInput> rows);
  /// True when (key, m) is served by a row whose M is near m (tune::near_tuned).
  bool covered(const std::string& key, int64_t m) const;
  /// Stale cache files already reported (reported once per process).
  /// Guarded by table.mu.
  std::set<std::string> reported_stale;
  /// Rebuilds the table from its inputs and publishes it. Caller holds table.mu.
  void rebuild_locked(std::vector<std::string>* notes);

  // ---- verification of committed rows (src/api/verify.cpp, tune/verify.hpp)
  /// Verdicts where there is no usable cache dir (shared with the tuner).
  std::shared_ptr<tune::MemoryVerdicts> memory_verdicts;
  /// What lookup notes on a row, set by apply_verdicts_locked (per input
  /// and per verdict, never per row: a reload of a large tree pays for its
  /// files, not for its rows). Its own lock, held to swap or read.
  struct RowNotes {
    mutable std::mutex mu;
    /// Committed CPU own-op inputs of this host's ISA class, by source id.
    std::unordered_map<uint32_t, std::shared_ptr<const table::TableInput>> cpu_inputs;
    std::shared_ptr<const tune::Verdicts> cpu_verdicts;
    /// Demoted rows: (key, M) -> (source id, note).
    std::map<std::pair<std::string, int64_t>, std::pair<uint32_t, std::string>> demoted;
  } row_notes;
  /// lookup's note on the row at (key, m) from `source_id` holding `config`
  /// (demoted; a CPU row tuned on another CPU), or "".
  std::string row_note(const std::string& key, int64_t m, uint32_t source_id, const Config& config) const;
  /// Bumped by every load of the config dirs: the committed rows may differ.
  std::atomic<uint64_t> loads{0};
  /// table.base_inputs from table.loaded_inputs with the verdict cache
  /// applied: the M of a demoted committed row holds the floor's plan (one
  /// copy of that input; the others are shared), and the row notes lookup
  /// shows are set. Caller holds table.mu. Never on the op path: the table
  /// built from it is what the op path reads.
  void apply_verdicts_locked();
  /// apply_verdicts_locked() and a rebuilt table, published (after a
  /// verification). False when frozen (nothing changes).
  bool publish_verdicts();
  /// The committed rows (config dirs and shipped configs, not the tuning
  /// cache) of own ops on this machine's devices that serve, one per (key,
  /// M), with a plan that is not the floor itself; `op` "" = every op.
  /// Rows tuned on another CPU (or an unrecorded one) first. Takes table.mu.
  std::vector<tune::VerifyRow> committed_rows(std::string_view op, int64_t* floor_rows = nullptr) const;
  /// committed_rows("") when a load happened since *seen (then *seen is
  /// updated and true returned); false, nothing computed, otherwise.
  bool committed_rows_since(uint64_t* seen, std::vector<tune::VerifyRow>* out) const;

  ~Impl();

  /// The device description for a tensor's device, or nullptr when its
  /// backend is unavailable. Hot path: no allocation.
  const DeviceInfo* device_for(Device d) const noexcept;

  /// Loads every source and publishes the new table. Caller holds table.mu.
  void keep_rows_of_broken_files(store::LoadOutput* out) const;
  Status load_and_publish_locked();

  /// The config dirs in precedence order (runtime dirs, then shipped).
  std::vector<std::pair<std::string, int32_t>> source_dirs() const;
};

}  // namespace dispatch
