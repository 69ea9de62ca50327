// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — lock-free structures the op path writes on a miss.
//
// BoundedQueue: Dmitry Vyukov's bounded MPMC ring (a sequence number per
// cell; producers claim a slot with one CAS on the enqueue index). Used with
// many producers (op calls that missed) and one consumer (the tuner thread).
// When full, push() fails at once and the caller counts a drop: a miss never
// waits for the tuner.
//
// MissTable: a fixed-size open-addressed set of (key hash, M) -> count, for
// exporting untuned shapes. An insert claims an empty cell with one CAS and
// publishes its payload with a release store; later misses of the same
// shape are one fetch_add. Full table: the miss is counted as dropped.
// The tuner thread marks a cell settled once the shape is tuned or given up
// on, so its idle sweep (which re-finds shapes whose queue notification was
// dropped or whose search failed) skips it in one load.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/op.hpp"

namespace dispatch::tune {

/// A miss as the tuner needs it: the problem and the operands' row strides
/// (scratch buffers are laid out the same way).
struct MissEvent {
  core::Problem problem;
  int64_t ld[core::kMaxArgs] = {};  ///< row stride per argument slot (0: contiguous)
  uint64_t key_hash = 0;
  int64_t count = 1;  ///< misses of this shape so far (set when queued)
};

template <class T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) {
    size_t cap = 2;
    while (cap < capacity) cap <<= 1;
    cells_.reset(new Cell[cap]);
    mask_ = cap - 1;
    for (size_t i = 0; i < cap; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }

  /// Non-blocking; false when full.
  bool push(const T& v) noexcept {
    size_t pos = enq_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      const size_t seq = c.seq.load(std::memory_order_acquire);
      const intptr_t dif = static_cast<intptr_t>(seq) - static_cast<intptr_t>(pos);
      if (dif == 0) {
        if (enq_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.value = v;
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (dif < 0) {
        return false;  // full
      } else {
        pos = enq_.load(std::memory_order_relaxed);
      }
    }
  }

  /// Non-blocking; false when empty.
  bool pop(T* out) noexcept {
    size_t pos = deq_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      const size_t seq = c.seq.load(std::memory_order_acquire);
      const intptr_t dif = static_cast<intptr_t>(seq) - static_cast<intptr_t>(pos + 1);
      if (dif == 0) {
        if (deq_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          *out = c.value;
          c.seq.store(pos + mask_ + 1, std::memory_order_release);
          return true;
        }
      } else if (dif < 0) {
        return false;  // empty
      } else {
        pos = deq_.load(std::memory_order_relaxed);
      }
    }
  }

  bool empty() const noexcept { return enq_.load(std::memory_order_acquire) == deq_.load(std::memory_order_acquire); }

 private:
  struct Cell {
    std::atomic<size_t> seq{0};
    T value{};
  };
  std::unique_ptr<Cell[]> cells_;
  size_t mask_ = 0;
  alignas(64) std::atomic<size_t> enq_{0};
  alignas(64) std::atomic<size_t> deq_{0};
};

class MissTable {
 public:
  static constexpr size_t kCapacity = 4096;

  /// Counts one miss of (event.key_hash, event.problem.m); returns the
  /// shape's count after it (0 when the table is full).
  int64_t record(const MissEvent& ev) noexcept {
    const uint64_t h = mix(ev.key_hash, ev.problem.m);
    for (size_t probe = 0; probe < 64; ++probe) {
      Entry& e = entries_[(h + probe) & (kCapacity - 1)];
      uint64_t cur = e.hash.load(std::memory_order_acquire);
      if (cur == 0) {
        if (e.hash.compare_exchange_strong(cur, h, std::memory_order_acq_rel)) {
          e.event = ev;
          e.ready.store(true, std::memory_order_release);
          return e.count.fetch_add(1, std::memory_order_relaxed) + 1;
        }
      }
      if (cur == h) return e.count.fetch_add(1, std::memory_order_relaxed) + 1;
    }
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }

  /// Every recorded shape with its count (readers see only published cells).
  std::vector<std::pair<MissEvent, int64_t>> snapshot() const {
    std::vector<std::pair<MissEvent, int64_t>> out;
    for (const Entry& e : entries_)
      if (e.ready.load(std::memory_order_acquire)) out.emplace_back(e.event, e.count.load(std::memory_order_relaxed));
    return out;
  }

  int64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }

  /// Calls f(cell index, event, count) for every published, unsettled shape.
  template <class F>
  void for_each_unsettled(F&& f) const {
    for (size_t i = 0; i < kCapacity; ++i) {
      const Entry& e = entries_[i];
      if (e.ready.load(std::memory_order_acquire) && !e.settled.load(std::memory_order_relaxed))
        f(i, e.event, e.count.load(std::memory_order_relaxed));
    }
  }

  /// Marks the shape of (key_hash, m) settled (tuned, covered or given up).
  void settle(uint64_t key_hash, int64_t m) noexcept {
    const uint64_t h = mix(key_hash, m);
    for (size_t probe = 0; probe < 64; ++probe) {
      Entry& e = entries_[(h + probe) & (kCapacity - 1)];
      const uint64_t cur = e.hash.load(std::memory_order_acquire);
      if (cur == 0) return;
      if (cur == h) {
        e.settled.store(true, std::memory_order_relaxed);
        return;
      }
    }
  }

 private:
  static uint64_t mix(uint64_t h, int64_t m) noexcept {
    uint64_t x = h ^ (static_cast<uint64_t>(m) * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    return x | 1;  // never 0 (0 marks an empty cell)
  }
  struct Entry {
    std::atomic<uint64_t> hash{0};
    std::atomic<bool> ready{false};
    std::atomic<int64_t> count{0};
    std::atomic<bool> settled{false};
    MissEvent event;
  };
  Entry entries_[kCapacity];
  std::atomic<int64_t> dropped_{0};
};

}  // namespace dispatch::tune
