// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — safe reclamation of replaced snapshots: per-thread
// epochs (epoch-based reclamation, EBR).
//
// Problem: a reader that loaded the snapshot pointer may still be walking it
// when a writer publishes a replacement. Freeing the old one at once would
// be a use-after-free; never freeing it leaks one table per reload for the
// life of a server that hot-reloads configs for weeks.
//
// Alternatives and costs (x86-64): a std::shared_mutex around the table costs
// every reader an atomic RMW on one shared line (~20-100 ns once two cores
// contend: bench/bench_lookup.cpp measures it beside ours); a reference count
// per snapshot is the same shared write; hazard pointers cost a store and a
// re-validate per read. EBR costs a reader one seq_cst store to its *own*
// cache line on entry and one release store on exit, with nothing shared
// written.
//
// Scheme: a global epoch counter; a fixed array of cache-line-sized slots,
// one per reader thread (taken on a thread's first read, given back when the
// thread exits). A reader announces the global epoch in its slot (seq_cst)
// before loading the snapshot pointer, and clears it when done. A writer
// publishes the new pointer, advances the global epoch to E, and retires the
// old snapshot tagged E. A retired object is freed once every slot is idle
// or announces an epoch >= E: such a reader entered after the publish and
// cannot hold the old pointer. Writers reclaim on every retire; a Runtime
// frees what it still has retired when it is destroyed (no reader may be in
// flight on it then). Nested guards on one thread are counted.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace dispatch::table {

class EpochDomain {
 public:
  /// The process-wide domain (all runtimes share reader slots).
  static EpochDomain& global() noexcept;

  /// RAII read-side critical section. Cheap: no shared write.
  class Guard {
   public:
    explicit Guard(EpochDomain& d) noexcept;
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    EpochDomain* domain_;
  };

  /// Retires `p` (freed by `deleter(p)` once no reader can hold it).
  /// `owner` groups objects for drop_owner(). Writer side; takes a mutex.
  void retire(void* p, void (*deleter)(void*), const void* owner);

  /// Frees everything whose grace period has passed. Writer side.
  void reclaim();

  /// Frees every retired object of `owner` now. Only when no reader can be
  /// in flight on the owner's objects (its Runtime is being destroyed).
  void drop_owner(const void* owner);

  /// Number of objects retired and not yet freed (tests, stats).
  size_t pending() const;

  static constexpr size_t kSlots = 4096;
  static constexpr uint64_t kIdle = 0;

  struct alignas(64) Slot {
    std::atomic<uint64_t> epoch{kIdle};
    std::atomic<bool> taken{false};
  };

 private:
  EpochDomain() = default;
  struct ThreadState;
  static ThreadState& thread_state() noexcept;
  Slot* acquire_slot() noexcept;
  uint64_t min_active_epoch() const noexcept;

  struct Retired {
    void* p;
    void (*deleter)(void*);
    const void* owner;
    uint64_t epoch;
  };

  std::atomic<uint64_t> global_epoch_{1};
  Slot slots_[kSlots];
  /// Readers that found every slot taken: counted here instead (a shared
  /// write, only past kSlots concurrent reader threads).
  std::atomic<int64_t> overflow_readers_{0};
  mutable std::mutex retired_mu_;
  std::vector<Retired> retired_;

  friend class Guard;
};

}  // namespace dispatch::table
