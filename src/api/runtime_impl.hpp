// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — what a Runtime holds.
#pragma once

#include <atomic>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>
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
}
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
  std::string shipped_dir;           ///< resolved shipped-configs dir ("" = none)

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
  /// True when (key, m) is served by a row whose M is within 2x of m.
  bool covered(const std::string& key, int64_t m) const;
  /// Stale cache files already reported (reported once per process).
  /// Guarded by table.mu.
  std::set<std::string> reported_stale;
  /// Rebuilds the table from its inputs and publishes it. Caller holds table.mu.
  void rebuild_locked(std::vector<std::string>* notes);

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
