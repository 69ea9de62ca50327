// SPDX-License-Identifier: Apache-2.0
#include "table/epoch.hpp"

#include <algorithm>
#include <limits>

namespace dispatch::table {

struct EpochDomain::ThreadState {
  EpochDomain::Slot* slot = nullptr;
  int depth = 0;
  bool overflow = false;
  ~ThreadState() {
    if (slot) {
      slot->epoch.store(kIdle, std::memory_order_release);
      slot->taken.store(false, std::memory_order_release);
    }
  }
};

namespace {
// Highest slot index ever taken + 1: writers scan only that far.
std::atomic<size_t> g_high_water{0};

struct DomainHolder {
  // The domain lives for the whole process; retired objects still pending at
  // exit are freed by its destructor.
  ~DomainHolder();
};
}  // namespace

EpochDomain& EpochDomain::global() noexcept {
  static EpochDomain* d = new EpochDomain();  // never destroyed: reader slots outlive statics
  static DomainHolder holder;
  return *d;
}

DomainHolder::~DomainHolder() {
  EpochDomain& d = EpochDomain::global();
  d.drop_owner(nullptr);
}

EpochDomain::ThreadState& EpochDomain::thread_state() noexcept {
  thread_local ThreadState ts;
  return ts;
}

EpochDomain::Slot* EpochDomain::acquire_slot() noexcept {
  for (size_t i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (!slots_[i].taken.load(std::memory_order_relaxed) &&
        slots_[i].taken.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      // seq_cst (here and in min_active_epoch): the raise must be ordered
      // before this thread's first seq_cst epoch store and snapshot load in
      // the single total order, or a writer could read a stale high-water
      // mark, skip this slot and free a snapshot this reader still holds
      // (allowed by the C++ model with acq_rel/acquire, e.g. LDAPR on ARM).
      size_t hw = g_high_water.load(std::memory_order_seq_cst);
      while (hw < i + 1 && !g_high_water.compare_exchange_weak(hw, i + 1, std::memory_order_seq_cst)) {
      }
      return &slots_[i];
    }
  }
  return nullptr;
}

EpochDomain::Guard::Guard(EpochDomain& d) noexcept : domain_(&d) {
  ThreadState& ts = thread_state();
  if (ts.depth++ > 0) return;
  if (ts.slot == nullptr && !ts.overflow) ts.slot = d.acquire_slot();
  if (ts.slot != nullptr) {
    // seq_cst: ordered before the caller's (seq_cst) load of the snapshot
    // pointer, and against the writer's publish / epoch advance / slot scan.
    ts.slot->epoch.store(d.global_epoch_.load(std::memory_order_seq_cst), std::memory_order_seq_cst);
  } else {
    ts.overflow = true;
    d.overflow_readers_.fetch_add(1, std::memory_order_seq_cst);
  }
}

EpochDomain::Guard::~Guard() {
  ThreadState& ts = thread_state();
  if (--ts.depth > 0) return;
  if (ts.slot != nullptr) {
    ts.slot->epoch.store(kIdle, std::memory_order_release);
  } else if (ts.overflow) {
    domain_->overflow_readers_.fetch_sub(1, std::memory_order_release);
    ts.overflow = false;
  }
}

uint64_t EpochDomain::min_active_epoch() const noexcept {
  uint64_t m = std::numeric_limits<uint64_t>::max();
  const size_t n = std::min(g_high_water.load(std::memory_order_seq_cst), kSlots);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t e = slots_[i].epoch.load(std::memory_order_seq_cst);
    if (e != kIdle) m = std::min(m, e);
  }
  return m;
}

void EpochDomain::retire(void* p, void (*deleter)(void*), const void* owner) {
  const uint64_t e = global_epoch_.fetch_add(1, std::memory_order_seq_cst) + 1;
  {
    std::lock_guard<std::mutex> lock(retired_mu_);
    retired_.push_back(Retired{p, deleter, owner, e});
  }
  reclaim();
}

void EpochDomain::reclaim() {
  std::vector<Retired> to_free;
  {
    std::lock_guard<std::mutex> lock(retired_mu_);
    if (retired_.empty()) return;
    if (overflow_readers_.load(std::memory_order_seq_cst) != 0) return;
    const uint64_t min_active = min_active_epoch();
    auto keep =
        std::partition(retired_.begin(), retired_.end(), [&](const Retired& r) { return r.epoch > min_active; });
    to_free.assign(keep, retired_.end());
    retired_.erase(keep, retired_.end());
  }
  for (const Retired& r : to_free) r.deleter(r.p);
}

void EpochDomain::drop_owner(const void* owner) {
  std::vector<Retired> to_free;
  {
    std::lock_guard<std::mutex> lock(retired_mu_);
    auto keep = std::partition(retired_.begin(), retired_.end(),
                               [&](const Retired& r) { return owner != nullptr && r.owner != owner; });
    to_free.assign(keep, retired_.end());
    retired_.erase(keep, retired_.end());
  }
  for (const Retired& r : to_free) r.deleter(r.p);
}

size_t EpochDomain::pending() const {
  std::lock_guard<std::mutex> lock(retired_mu_);
  return retired_.size();
}

}  // namespace dispatch::table
