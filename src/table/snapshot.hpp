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
#include <utility>
#include <vector>

#include "core/op.hpp"
#include "table/key.hpp"
#include "dispatch/config.hpp"

namespace dispatch::table {

struct Row {
  uint32_t source_id = 0;     ///< file the row came from (Runtime source registry)
  uint32_t config_index = 0;  ///< the row as written, in Snapshot::configs_
};

/// A read-only array whose storage may be shared by several snapshots (an
/// incremental build copies an unchanged key's bucket without copying its
/// rows). Reads go through a plain pointer: no reference count is touched
/// on the lookup path.
template <class T>
class SharedArray {
 public:
  SharedArray() = default;
  explicit SharedArray(std::vector<T> v)
      : owner_(std::make_shared<const std::vector<T>>(std::move(v))), data_(owner_->data()), size_(owner_->size()) {}
  size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  const T& operator[](size_t i) const noexcept { return data_[i]; }
  const T& front() const noexcept { return data_[0]; }
  const T& back() const noexcept { return data_[size_ - 1]; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }

 private:
  std::shared_ptr<const std::vector<T>> owner_;
  const T* data_ = nullptr;
  size_t size_ = 0;
};

struct Bucket {
  std::string key;  ///< canonical static key
  uint64_t hash = 0;
  bool has_own_key = false;  ///< an own-op key: also reachable by find_own()
  OwnKey own_key;
  std::string device_name;  ///< the key's device_name (own-op keys)
  SharedArray<int64_t> ms;  ///< M keys, ascending
  SharedArray<Row> rows;    ///< parallel to ms
  /// Parallel to ms: each row's resolved plan (valid for own ops of a
  /// compiled backend); empty when no row has one (an engine's table: a
  /// million rows of a fused-MoE file carry no 104-byte Plan each).
  SharedArray<core::Plan> plans;
  std::string note;  ///< how the bucket was assembled (version folder, merged sources)
  /// The build notes this bucket gave (version folder, several files of a
  /// key): said again when a later build reuses the bucket.
  std::vector<std::string> build_notes;
  /// Identity of the inputs the bucket was built from ((rank, serial) of
  /// each, in order); empty = not reusable. A later build whose inputs for
  /// this key are the same copies the bucket instead of rebuilding it.
  std::vector<uint64_t> inputs;
};

struct NearestPolicy {
  bool bounded = false;
  double ratio = 2.0;
};

/// One file's contribution, as the loader hands it to the builder.
struct TableInput {
  static constexpr uint32_t kNoPlan = UINT32_MAX;
  struct InputRow {
    int64_t m = 0;
    uint32_t config = 0;      ///< index into TableInput::configs
    uint32_t plan = kNoPlan;  ///< index into TableInput::plans, or kNoPlan
  };
  /// The input's distinct row configs (rows that are alike share one).
  std::vector<Config> configs;
  const Config& config(const InputRow& r) const { return configs[r.config]; }
  /// Resolved plans of own-op rows (engine tables have none).
  std::vector<core::Plan> plans;
  /// The row's plan, or nullptr.
  const core::Plan* plan(const InputRow& r) const { return r.plan == kNoPlan ? nullptr : &plans[r.plan]; }
  /// Appends a row with its own config (tuned rows, tests).
  void add_row(int64_t m, Config c, const core::Plan& plan = {}) {
    configs.push_back(std::move(c));
    uint32_t pi = kNoPlan;
    if (plan.valid()) {
      plans.push_back(plan);
      pi = static_cast<uint32_t>(plans.size() - 1);
    }
    rows.push_back(InputRow{m, static_cast<uint32_t>(configs.size() - 1), pi});
  }
  std::string key;
  /// Own-op inputs: the binary key (OwnKey) and the device_name, so the op
  /// hot path finds the bucket without text (see find_own).
  bool has_own_key = false;
  OwnKey own_key;
  std::string device_name;
  int32_t source_rank = 0;     ///< 0 = highest precedence
  bool versioned = false;      ///< found under a triton_X_Y_Z/ folder
  std::vector<int> version;    ///< that folder's version
  std::string version_folder;  ///< "triton_3_5_1"
  uint32_t source_id = 0;
  std::string path;  ///< for notes
  std::vector<InputRow> rows;
  /// CPU own-op files: the CPU the rows were tuned on, the "cpu" object of
  /// the file's "kdispatch" metadata as JsonWriter writes it ("" = not
  /// recorded), and the rows its "cpu_by_m" records another for ("" = not
  /// recorded). Read by the verification of committed rows, never by a build.
  std::string tuned_on;
  std::vector<std::pair<int64_t, std::string>> tuned_on_by_m;
  /// The CPU row at M was tuned on (tuned_on, or its tuned_on_by_m entry).
  const std::string& tuned_on_at(int64_t m) const {
    for (const auto& [k, v] : tuned_on_by_m)
      if (k == m) return v;
    return tuned_on;
  }
  /// Identity of this input's content, unique in the process (next_serial());
  /// whoever changes an input gives it a new serial. 0 = unknown: a key with
  /// such an input is always rebuilt.
  uint64_t serial = 0;
};

/// A process-wide unique, never-0 TableInput serial.
uint64_t next_serial() noexcept;

class Snapshot {
 public:
  /// Builds a snapshot. Version folders: per key and source, the folder of
  /// exactly `backend_version` first, else the newest older, else the newest
  /// newer (noted); no version given = the newest. Sources merge per M, the
  /// lower source_rank winning on the same M. Notes go to `notes`.
  ///
  /// Incremental build: with `previous` (a snapshot built by this function
  /// with the same backend_version), a key whose inputs all carry the same
  /// serials and ranks as when `previous` built it is copied from
  /// `previous` (rows, notes and configs included) instead of being merged
  /// again: a reload after one file changed rebuilds one key. Every 64th
  /// incremental build is a full one (configs no longer used are dropped).
  static std::unique_ptr<Snapshot> build(const std::vector<const TableInput*>& inputs,
                                         const std::vector<int>& backend_version, std::vector<std::string>* notes,
                                         const Snapshot* previous = nullptr);
  /// Convenience: the same over shared inputs (store::LoadOutput's).
  static std::unique_ptr<Snapshot> build(const std::vector<std::shared_ptr<const TableInput>>& inputs,
                                         const std::vector<int>& backend_version, std::vector<std::string>* notes);
  /// Convenience: the same over owned inputs.
  static std::unique_ptr<Snapshot> build(std::vector<TableInput> inputs, const std::vector<int>& backend_version,
                                         std::vector<std::string>* notes);

  /// An empty table.
  static std::unique_ptr<Snapshot> empty();

  /// The bucket of `key` (with `hash == key_hash(key)`), or nullptr.
  /// Lock-free, allocation-free.
  const Bucket* find(std::string_view key, uint64_t hash) const noexcept {
    return probe(slots_, hash, [&](const Bucket& b) { return b.key == key; });
  }

  /// The bucket of an own-op binary key (`hash == own_key_hash(k)`) on the
  /// device named `device_name`, or nullptr. Lock-free, allocation-free.
  const Bucket* find_own(const OwnKey& k, uint64_t hash, std::string_view device_name) const noexcept {
    return probe(own_slots_, hash, [&](const Bucket& b) {
      return std::memcmp(&b.own_key, &k, sizeof k) == 0 && b.device_name == device_name;
    });
  }

  /// Nearest-M row of a bucket (see file comment), or nullptr under the
  /// bounded policy. `*index` receives the row's index in the bucket.
  static const Row* nearest(const Bucket& b, int64_t m, const NearestPolicy& policy, size_t* index) noexcept;

  const Config& config(const Row& r) const noexcept { return configs_[r.config_index]; }
  /// Row `i`'s resolved plan (an invalid Plan when the bucket has none).
  static const core::Plan& plan(const Bucket& b, size_t i) noexcept {
    static const core::Plan kNone{};
    return b.plans.empty() ? kNone : b.plans[i];
  }
  const std::vector<Bucket>& buckets() const noexcept { return buckets_; }
  int64_t row_count() const noexcept { return rows_; }
  /// "<backend>/<op>" prefixes present in the table, sorted.
  const std::vector<std::string>& ops() const noexcept { return ops_; }

 private:
  std::vector<Bucket> buckets_;
  std::vector<Config> configs_;
  std::vector<std::string> ops_;
  int64_t rows_ = 0;
  std::vector<int> backend_version_;  ///< what it was built for (incremental builds)
  int incremental_builds_ = 0;        ///< builds since the last full one
  int64_t reused_buckets_ = 0;

 public:
  /// Buckets copied from the previous snapshot by an incremental build.
  int64_t reused_buckets() const noexcept { return reused_buckets_; }
  /// A slot of the open-addressed indexes (public for the builder's helpers).
  struct Slot {
    uint64_t hash = 0;
    uint32_t bucket = 0;  ///< index + 1; 0 = empty slot
  };

 private:
  std::vector<Slot> slots_;
  std::vector<Slot> own_slots_;  ///< own_key_hash -> bucket, own-op buckets only

  /// The open-addressed lookup of find and find_own: from `hash`'s slot on,
  /// the bucket of the first slot holding `hash` that `same` accepts, or
  /// nullptr at the first empty slot (an index is never full).
  template <class Same>
  const Bucket* probe(const std::vector<Slot>& slots, uint64_t hash, Same same) const noexcept {
    if (slots.empty()) return nullptr;
    const size_t mask = slots.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      const Slot& s = slots[i];
      if (s.bucket == 0) return nullptr;
      if (s.hash == hash) {
        const Bucket& b = buckets_[s.bucket - 1];
        if (same(b)) return &b;
      }
    }
  }
};

}  // namespace dispatch::table
