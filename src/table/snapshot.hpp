// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the immutable dispatch table (Snapshot).
//
// Problem: every op call must map (static key, M) to a launch plan in tens of
// nanoseconds, from any number of threads, while a loader, a hot reload or
// the tuner replaces the table underneath.
//
// Shape: a Snapshot is built once and never changed. XXH3-64 of the
// canonical key text -> open-addressed slot array (load factor <= 1/2,
// linear probing, hash and bucket index side by side) -> Bucket with the
// full key (compared on a hit: a hash collision can never serve a wrong
// table) -> M keys sorted ascending beside their rows -> Row with a Plan
// resolved when the table was built. A lookup is one hash, a probe or two,
// a key compare and a binary search: no lock, no allocation, no syscall.
// The Runtime holds the current snapshot in an atomic pointer; publishing a
// new one is a release store, and replaced snapshots are reclaimed through
// per-thread epochs (table/epoch.hpp).
//
// Nearest M: the key with the smallest |k - M|; a tie goes to the smaller
// key, whatever the order of keys in the file (SGLang breaks ties by file
// order: the one place kdispatch differs on purpose). Optional bounded
// policy: M outside [min/ratio, max*ratio] is a miss.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/op.hpp"
#include "table/key.hpp"
#include "dispatch/config.hpp"

namespace dispatch::table {

struct Row {
  core::Plan plan;             ///< valid for own ops of a compiled backend
  uint32_t source_id = 0;      ///< file the row came from (Runtime source registry)
  uint32_t config_index = 0;   ///< the row as written, in Snapshot::configs_
};

struct Bucket {
  std::string key;              ///< canonical static key
  uint64_t hash = 0;
  bool has_own_key = false;     ///< an own-op key: also reachable by find_own()
  OwnKey own_key;
  std::string device_name;      ///< the key's device_name (own-op keys)
  std::vector<int64_t> ms;      ///< M keys, ascending
  std::vector<Row> rows;        ///< parallel to ms
  std::string note;             ///< how the bucket was assembled (version folder, merged sources)
};

struct NearestPolicy {
  bool bounded = false;
  double ratio = 2.0;
};

/// One file's contribution, as the loader hands it to the builder.
struct TableInput {
  struct InputRow {
    int64_t m = 0;
    uint32_t config = 0;  ///< index into TableInput::configs
    core::Plan plan;
  };
  /// The input's distinct row configs (rows that are alike share one).
  std::vector<Config> configs;
  const Config& config(const InputRow& r) const { return configs[r.config]; }
  /// Appends a row with its own config (tuned rows, tests).
  void add_row(int64_t m, Config c, const core::Plan& plan = {}) {
    configs.push_back(std::move(c));
    rows.push_back(InputRow{m, static_cast<uint32_t>(configs.size() - 1), plan});
  }
  std::string key;
  /// Own-op inputs: the binary key (OwnKey) and the device_name, so the op
  /// hot path finds the bucket without text (see find_own).
  bool has_own_key = false;
  OwnKey own_key;
  std::string device_name;
  int32_t source_rank = 0;       ///< 0 = highest precedence
  bool versioned = false;        ///< found under a triton_X_Y_Z/ folder
  std::vector<int> version;      ///< that folder's version
  std::string version_folder;    ///< "triton_3_5_1"
  uint32_t source_id = 0;
  std::string path;              ///< for notes
  std::vector<InputRow> rows;
};

class Snapshot {
 public:
  /// Builds a snapshot. Version folders: per key and source, the folder of
  /// exactly `backend_version` first, else the newest older, else the newest
  /// newer (noted); no version given = the newest. Sources merge per M, the
  /// lower source_rank winning on the same M. Notes go to `notes`.
  static std::unique_ptr<Snapshot> build(const std::vector<const TableInput*>& inputs,
                                         const std::vector<int>& backend_version,
                                         std::vector<std::string>* notes);
  /// Convenience: the same over owned inputs.
  static std::unique_ptr<Snapshot> build(std::vector<TableInput> inputs,
                                         const std::vector<int>& backend_version,
                                         std::vector<std::string>* notes);

  /// An empty table.
  static std::unique_ptr<Snapshot> empty();

  /// The bucket of `key` (with `hash == key_hash(key)`), or nullptr.
  /// Lock-free, allocation-free.
  const Bucket* find(std::string_view key, uint64_t hash) const noexcept {
    if (slots_.empty()) return nullptr;
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.bucket == 0) return nullptr;
      if (s.hash == hash) {
        const Bucket& b = buckets_[s.bucket - 1];
        if (b.key == key) return &b;
      }
    }
  }

  /// The bucket of an own-op binary key (`hash == own_key_hash(k)`) on the
  /// device named `device_name`, or nullptr. Lock-free, allocation-free.
  const Bucket* find_own(const OwnKey& k, uint64_t hash, std::string_view device_name) const noexcept {
    if (own_slots_.empty()) return nullptr;
    const size_t mask = own_slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      const Slot& s = own_slots_[i];
      if (s.bucket == 0) return nullptr;
      if (s.hash == hash) {
        const Bucket& b = buckets_[s.bucket - 1];
        if (std::memcmp(&b.own_key, &k, sizeof k) == 0 && b.device_name == device_name) return &b;
      }
    }
  }

  /// Nearest-M row of a bucket (see file comment), or nullptr under the
  /// bounded policy. `*index` receives the row's index in the bucket.
  static const Row* nearest(const Bucket& b, int64_t m, const NearestPolicy& policy,
                            size_t* index) noexcept;

  const Config& config(const Row& r) const noexcept { return configs_[r.config_index]; }
  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  int64_t row_count() const noexcept { return rows_; }
  /// "<backend>/<op>" prefixes present in the table, sorted.
  const std::vector<std::string>& ops() const noexcept { return ops_; }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t bucket = 0;  ///< index + 1; 0 = empty slot
  };
  std::vector<Slot> slots_;
  std::vector<Slot> own_slots_;  ///< own_key_hash -> bucket, own-op buckets only
  std::vector<Bucket> buckets_;
  std::vector<Config> configs_;
  std::vector<std::string> ops_;
  int64_t rows_ = 0;
};

}  // namespace dispatch::table
