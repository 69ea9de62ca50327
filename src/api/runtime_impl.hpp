// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — what a Runtime holds.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/runtime.hpp"
#include "table/snapshot.hpp"

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
