// SPDX-License-Identifier: Apache-2.0
#include "c_api/in_flight.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

namespace dispatch::capi {

namespace {

struct Slots {
  CallSlot slot[kCallSlots];
  /// Highest slot index ever taken + 1: close scans only that far.
  std::atomic<size_t> high_water{0};
};

// Never destroyed: a thread may still call (and exit, giving its slot back)
// while the process runs its static destructors.
Slots& slots() noexcept {
  static Slots* s = new Slots();
  return *s;
}

// Gives this thread's slot back when the thread exits. Constructed (and
// its destructor registered) only on the thread's first call.
struct SlotOwner {
  ~SlotOwner() {
    if (CallSlot* s = t_call_slot) {
      t_call_slot = nullptr;  // a call after this takes a slot again
      s->in.store(nullptr, std::memory_order_release);
      s->taken.store(false, std::memory_order_release);
    }
  }
};

// The fork child: only the forking thread exists; every other slot's call
// is gone with its thread, and its slot is free again.
void clear_other_slots_in_child() {
  Slots& all = slots();
  for (size_t i = 0; i < kCallSlots; ++i) {
    CallSlot& s = all.slot[i];
    if (&s == t_call_slot) continue;
    s.in.store(nullptr, std::memory_order_relaxed);
    s.taken.store(false, std::memory_order_relaxed);
  }
}

std::atomic<pthread_t> g_exiting_thread{};
std::atomic<bool> g_exiting_set{false};

}  // namespace

int64_t park_calls_at_exit(double timeout_s) noexcept {
  g_exiting_thread.store(pthread_self(), std::memory_order_relaxed);
  g_exiting_set.store(true, std::memory_order_release);
  g_park_at_exit.store(true, std::memory_order_seq_cst);
  // Every call that made its record before the flag: wait until it parked
  // (its destructor) or returned. One made after it parks at entry.
  using clock = std::chrono::steady_clock;
  const auto end = clock::now() + std::chrono::duration<double>(std::max(timeout_s, 0.0));
  Slots& all = slots();
  for (;;) {
    int64_t n = 0;
    const size_t hw = std::min(all.high_water.load(std::memory_order_seq_cst), kCallSlots);
    for (size_t i = 0; i < hw; ++i)
      if (&all.slot[i] != t_call_slot && all.slot[i].in.load(std::memory_order_seq_cst) != nullptr) ++n;
    if (n == 0 || clock::now() >= end) return n;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void park_at_entry() noexcept {
  if (!g_exiting_set.load(std::memory_order_acquire) ||
      pthread_equal(pthread_self(), g_exiting_thread.load(std::memory_order_relaxed)))
    return;
  if (CallSlot* s = t_call_slot) s->in.store(nullptr, std::memory_order_seq_cst);
  for (;;) ::pause();
}

void park_unless_exiting() noexcept {
  if (!g_exiting_set.load(std::memory_order_acquire) ||
      pthread_equal(pthread_self(), g_exiting_thread.load(std::memory_order_relaxed)))
    return;
  for (;;) ::pause();
}

CallSlot* acquire_call_slot() noexcept {
  static thread_local SlotOwner owner;
  (void)&owner;
  static const bool atfork = [] { return ::pthread_atfork(nullptr, nullptr, &clear_other_slots_in_child) == 0; }();
  (void)atfork;
  Slots& all = slots();
  for (size_t i = 0; i < kCallSlots; ++i) {
    CallSlot& s = all.slot[i];
    bool expected = false;
    if (!s.taken.load(std::memory_order_relaxed) &&
        s.taken.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
      // seq_cst, as table/epoch.cpp's high-water mark: the raise is ordered
      // before this thread's first seq_cst slot store in the single total
      // order, so a close that reads an older mark reads the flag after it
      // and this call sees the flag.
      size_t hw = all.high_water.load(std::memory_order_seq_cst);
      while (hw < i + 1 && !all.high_water.compare_exchange_weak(hw, i + 1, std::memory_order_seq_cst)) {
      }
      s.in.store(nullptr, std::memory_order_relaxed);
      t_call_slot = &s;
      return &s;
    }
  }
  return nullptr;  // every slot taken: this thread counts in the handle's overflow counter
}

int64_t calls_in_flight(const void* handle, const Gate& gate) noexcept {
  Slots& all = slots();
  int64_t n = gate.overflow_calls.load(std::memory_order_seq_cst);
  const size_t hw = std::min(all.high_water.load(std::memory_order_seq_cst), kCallSlots);
  for (size_t i = 0; i < hw; ++i)
    if (all.slot[i].in.load(std::memory_order_seq_cst) == handle) ++n;
  return n;
}

int64_t wait_calls_done(const void* handle, const Gate& gate, double timeout_s) noexcept {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto limit = std::chrono::duration<double>(std::isfinite(timeout_s) ? std::max(timeout_s, 0.0) : 1e9);
  auto pause = std::chrono::microseconds(20);
  for (int round = 0;; ++round) {
    const int64_t n = calls_in_flight(handle, gate);
    if (n == 0) return 0;
    if (clock::now() - start >= limit) return n;
    // A call on the CPU takes microseconds: yield first, then back off to 1 ms.
    if (round < 16) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
}

}  // namespace dispatch::capi
