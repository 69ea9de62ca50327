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

#include "core/op.hpp"
#include "dispatch/runtime.hpp"
#include "table/snapshot.hpp"

namespace dispatch::tune {
class Tuner;
}
namespace dispatch::api {
class DirWatcher;
}

namespace dispatch {

struct Runtime::Impl {
  RuntimeOptions options;
  std::vector<int> backend_version;  ///< parsed options.backend_version
  table::NearestPolicy policy;
  std::string shipped_dir;           ///< resolved shipped-configs dir ("" = none)

  /// The published table. Readers: seq_cst load inside an epoch guard.
  std::atomic<const table::Snapshot*> current{nullptr};

  /// Serialises writers (reload, publish). Never taken by a reader.
  mutable std::mutex mu;
  /// Guards `report` (held only to copy or swap it, never during a load).
  mutable std::mutex report_mu;
  LoadReport report;
  /// Source registry: id - 1 -> (dir, path relative to dir). Append-only;
  /// `sources_mu` is held only for one push or one read.
  mutable std::mutex sources_mu;
  std::vector<std::pair<std::string, std::string>> sources;
  std::map<std::pair<std::string, std::string>, uint32_t> source_ids;

  /// (dir, path) of a source id, or empty strings.
  std::pair<std::string, std::string> source(uint32_t id) const;

  /// Table inputs of the last load from disk, and rows tuned in this process
  /// (kept so a publish can rebuild the table without re-reading files).
  std::vector<table::TableInput> base_inputs;
  std::vector<table::TableInput> tuned_inputs;

  /// Forced plans per op (RuntimeOptions::force), empty when none.
  std::vector<core::Plan> forced[core::kOpCount];
  /// Entries of RuntimeOptions::force, as given (for lookup's "why").
  std::vector<std::string> forced_text[core::kOpCount];

  /// The tuning cache dir ("" = none, or refused) and the source ranks.
  std::string cache_dir;
  /// Why the resolved cache dir was refused ("" = it was not): a note of
  /// every load report, and a warning at create (store/private_fs.hpp).
  std::string cache_dir_refused;
  int32_t tuned_rank = 0;
  int32_t cache_rank = 0;
  int32_t shipped_rank = 0;

  std::atomic<bool> frozen{false};

  /// Streams given a gemm workspace (attach_stream): slots [0, n_streams)
  /// are complete and never change once published (n_streams is stored
  /// with release after the slot is written); the op reads them lock-free.
  struct StreamSlot {
    Device device{};
    void* stream = nullptr;
    void* workspace = nullptr;
    int64_t bytes = 0;
  };
  static constexpr int kMaxStreams = 64;
  // What a memoised table hit reads (ops.cpp), kept in one cache line with
  // the first stream slots: behind a GPU launch the host caches are cold,
  // and the hit path's cost is the lines it touches.
  /// The published table's generation: a process-wide unique number (never
  /// 0, never reused by another table or Runtime), stored with release
  /// after `current`. The op hot path keeps a per-thread memo of recent
  /// table hits tagged with it (ops.cpp: HitMemo); a publish invalidates
  /// every memo at once.
  alignas(64) std::atomic<uint64_t> table_gen{0};
  std::atomic<int> n_streams{0};
  bool any_forced = false;
  StreamSlot streams[kMaxStreams];
  std::mutex streams_mu;  ///< serialises attach_stream
  /// The slot of (device, stream), or nullptr. Hot path: a few loads.
  const StreamSlot* stream_slot(Device d, void* stream) const noexcept {
    const int n = n_streams.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i)
      if (streams[i].stream == stream && streams[i].device.ordinal == d.ordinal && streams[i].device.type == d.type)
        return &streams[i];
    return nullptr;
  }
  /// key_hash(device_name) of each (backend, ordinal < 16), computed on
  /// first use (the op hot path hashes the device name into its binary
  /// key); 0 = not yet. Relaxed: every thread computes the same value.
  mutable std::atomic<uint64_t> name_hashes[3][16] = {};
  /// key_hash(dev.device_name) of the tensors' device `d`.
  uint64_t device_name_hash(Device d, const DeviceInfo& dev) const noexcept;
  std::unique_ptr<tune::Tuner> tuner;
  std::unique_ptr<api::DirWatcher> watcher;

  /// Adds tuned rows and publishes a rebuilt table (false when frozen).
  bool publish_tuned(std::vector<table::TableInput> rows);
  /// True when (key, m) is served by a row whose M is within 2x of m.
  bool covered(const std::string& key, int64_t m) const;
  /// Interns a (dir, path) config source; returns its id (>= 1).
  uint32_t intern(const std::string& dir, const std::string& rel);
  /// Parses RuntimeOptions::force into `forced`.
  Status parse_forced(const RuntimeOptions& o);
  /// Stale cache files already reported (reported once per process).
  std::set<std::string> reported_stale;
  /// base_inputs then tuned_inputs, as pointers (no copy).
  std::vector<const table::TableInput*> all_inputs() const;
  /// Rebuilds the table from base_inputs + tuned_inputs and publishes it.
  /// Caller holds `mu`.
  void rebuild_locked(std::vector<std::string>* notes);

  ~Impl();

  /// The device description for a tensor's device, or nullptr when its
  /// backend is unavailable. Hot path: no allocation.
  const DeviceInfo* device_for(Device d) const noexcept;

  /// Loads every source and publishes the new table. Caller holds `mu`.
  Status load_and_publish_locked();

  /// Publishes `snap` (release store) and retires the previous table.
  /// Caller holds `mu`.
  void publish_locked(std::unique_ptr<table::Snapshot> snap);

  /// The config dirs in precedence order (runtime dirs, then shipped).
  std::vector<std::pair<std::string, int32_t>> source_dirs() const;
};

}  // namespace dispatch
