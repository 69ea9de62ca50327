// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the parts a Runtime is made of, each with its own
// lock (or none, where it never changes after create):
//
//   PublishedTable    the table readers see (one atomic pointer, lock-free,
//                     per-thread epochs) and the inputs it is rebuilt from;
//                     writers (load, reload, tuned rows) serialise on its lock
//   SourceIds         config sources (dir, file) <-> the ids rows carry
//   StreamWorkspaces  the GPU workspaces attach_stream gave (lock-free reads)
//   ForcedPlans       RuntimeOptions::force, parsed at create (immutable)
//   LoadReports       the last load's report
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/op.hpp"
#include "dispatch/config.hpp"
#include "store/loader.hpp"
#include "dispatch/device.hpp"
#include "dispatch/status.hpp"
#include "table/snapshot.hpp"

namespace dispatch::api {

/// The published table. Readers: an acquire load of `gen` (the per-thread
/// hit memo's tag), then a seq_cst load of `current` inside an epoch guard;
/// no lock. Writers hold `mu` (load, reload, a tuned row, freeze).
struct PublishedTable {
  /// The table's generation: a process-wide unique number (never 0, never
  /// reused by another table or Runtime), stored with release after
  /// `current`. The op hot path keeps a per-thread memo of recent table hits
  /// tagged with it (ops.cpp: HitMemo); a publish invalidates every memo at
  /// once. First in its cache line: a memoised hit reads it first.
  alignas(64) std::atomic<uint64_t> gen{0};
  std::atomic<const table::Snapshot*> current{nullptr};
  /// Serialises writers. Never taken by a reader.
  mutable std::mutex mu;
  /// Table inputs of the last load from disk, and rows tuned in this process
  /// (kept so a publish can rebuild the table without re-reading files).
  /// Guarded by `mu`.
  std::vector<std::shared_ptr<const table::TableInput>> base_inputs;
  std::vector<table::TableInput> tuned_inputs;  ///< each gets a new serial when it changes
  /// The inputs as the last load read them (base_inputs is these with the
  /// verdict cache applied: a demoted row's M holds the floor there).
  /// Guarded by `mu`.
  std::vector<std::shared_ptr<const table::TableInput>> loaded_inputs;
  /// The loader's per-file cache: a reload reads only changed files.
  store::FileCache file_cache;

  PublishedTable() = default;
  PublishedTable(const PublishedTable&) = delete;
  PublishedTable& operator=(const PublishedTable&) = delete;
  ~PublishedTable();

  /// base_inputs then tuned_inputs, as pointers (no copy). Caller holds mu.
  std::vector<const table::TableInput*> all_inputs() const;
  /// Publishes `snap` (release store of a fresh generation) and retires the
  /// previous table to the epoch domain (`owner` tags it). Caller holds mu.
  void publish_locked(std::unique_ptr<table::Snapshot> snap, const void* owner);
  /// Adds tuned rows (one row per (key, M): a re-tune replaces the old one).
  /// Caller holds mu.
  void add_tuned_locked(std::vector<table::TableInput> rows);
};

/// Config sources: (dir, path relative to dir) <-> id >= 1, as table rows
/// carry them. Append-only; the lock is held for one push or one read.
class SourceIds {
 public:
  uint32_t intern(const std::string& dir, const std::string& rel);
  /// (dir, path) of an id, or empty strings.
  std::pair<std::string, std::string> get(uint32_t id) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> list_;
  std::map<std::pair<std::string, std::string>, uint32_t> ids_;
};

/// Streams given a GPU workspace (Runtime::attach_stream): slots [0, count)
/// are complete and never change once published (the count is stored with
/// release after the slot is written); find() is a few loads, no lock.
class StreamWorkspaces {
 public:
  struct Slot {
    Device device{};
    void* stream = nullptr;
    void* workspace = nullptr;
    int64_t bytes = 0;
  };
  static constexpr int kMax = 64;

  /// The slot of (device, stream), or nullptr. Hot path.
  const Slot* find(Device d, void* stream) const noexcept {
    const int n = n_.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i)
      if (slots_[i].stream == stream && slots_[i].device.ordinal == d.ordinal && slots_[i].device.type == d.type)
        return &slots_[i];
    return nullptr;
  }
  /// Adds (device, stream) with a workspace from `alloc(bytes)` (none for
  /// 0 bytes); a stream already there keeps its first workspace.
  /// Errors: out_of_memory (the allocation, or kMax streams already).
  Status attach(Device d, void* stream, int64_t bytes,
                const std::function<void*(int32_t ordinal, int64_t bytes)>& alloc) noexcept;
  /// Frees every workspace with `free_fn(device, workspace)`.
  void release_all(void (*free_fn)(Device d, void* workspace)) noexcept;

 private:
  std::atomic<int> n_{0};
  Slot slots_[kMax];
  std::mutex mu_;  ///< serialises attach
};

/// RuntimeOptions::force, parsed at create: immutable afterwards (no lock).
class ForcedPlans {
 public:
  /// "<op>=<variant>" or "<op>=<variant>:<param>=<value>,...". Errors:
  /// config_error / no_variant naming the entry.
  Status parse(const std::vector<std::string>& entries);
  bool any() const noexcept { return any_; }
  std::span<const core::Plan> of(core::OpKind op) const noexcept { return plans_[static_cast<int>(op)]; }
  std::span<const std::string> texts(core::OpKind op) const noexcept { return texts_[static_cast<int>(op)]; }

 private:
  bool any_ = false;
  std::vector<core::Plan> plans_[core::kOpCount];
  std::vector<std::string> texts_[core::kOpCount];
};

/// The report of the most recent (re)load; the lock is held only to copy
/// or swap it.
class LoadReports {
 public:
  LoadReport get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return report_;
  }
  void set(LoadReport r) {
    std::lock_guard<std::mutex> lock(mu_);
    report_ = std::move(r);
  }
  void set_counts(int64_t keys, int64_t rows) {
    std::lock_guard<std::mutex> lock(mu_);
    report_.keys = keys;
    report_.rows = rows;
  }

 private:
  mutable std::mutex mu_;
  LoadReport report_;
};

}  // namespace dispatch::api
