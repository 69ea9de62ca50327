// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the C ABI's record of the calls in flight on each
// runtime handle, so that kdispatch_runtime_close() can refuse new calls,
// wait for the ones in flight and only then destroy the runtime.
//
// The record is per thread, as the table's epochs are (table/epoch.hpp): a
// fixed array of cache-line slots, one per calling thread (taken on the
// thread's first call, given back when it exits). A call stores the handle
// it is in into its own slot (seq_cst), then reads the handle's closed flag
// (seq_cst); close sets the flag (seq_cst), then reads the slots until none
// holds the handle. In the single total order of seq_cst operations either
// the call sees the flag (and backs out: FAILED_PRECONDITION) or close sees
// the slot (and waits) — the Dekker pattern. A call writes only its own
// cache line: no shared atomic write on the hot path. Past kSlots threads a
// thread counts itself in the handle's shared counter instead.
//
// A call inside another on the same thread (none today) keeps the outer
// record: the inner one restores it when it leaves.
//
// fork(): the child has one thread, but its copy of the slots still holds
// the parent's other threads' calls in flight, which would never end (a
// close in the child would wait out its timeout and never free the
// runtime). A pthread_atfork child handler, installed with the first slot,
// clears every slot but the forking thread's and the overflow counts are
// not touched (past kCallSlots threads only).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace dispatch::capi {

/// The closing state of one handle: the flag calls read, and the shared
/// count of calls by threads that found no free slot.
struct Gate {
  std::atomic<bool> closed{false};
  mutable std::atomic<int64_t> overflow_calls{0};
};

struct alignas(64) CallSlot {
  std::atomic<const void*> in{nullptr};  ///< the handle this thread's call is in, or null
  std::atomic<bool> taken{false};
};

inline constexpr size_t kCallSlots = 4096;

/// This thread's slot; null until its first call (or when every slot was
/// taken). Plain TLS, constant-initialised (so no TLS wrapper call): one load.
inline thread_local constinit CallSlot* t_call_slot = nullptr;

/// Set by kdispatch_park_calls_at_exit(): from then on a call on any thread
/// but the one that set it blocks forever, at its start or, when it was in
/// flight, at its end, instead of running or returning (a language
/// binding's interpreter exit: a daemon thread that returned would take the
/// interpreter lock back during finalization and be ended by a forced
/// unwind, which a C++ noexcept frame of the caller's turns into
/// std::terminate; one still running while the process runs its static
/// destructors would use what they free). Read twice per call: a shared
/// read, never written on a call.
inline constinit std::atomic<bool> g_park_at_exit{false};

/// Records the calling thread as the exiting one, sets g_park_at_exit, and
/// waits (at most `timeout_s`) until no other thread has a call in flight:
/// each has parked or returned. Returns the calls still in flight.
int64_t park_calls_at_exit(double timeout_s) noexcept;
/// Blocks forever unless this thread is the exiting one. Cold.
[[gnu::cold]] void park_unless_exiting() noexcept;
/// park_unless_exiting for a call that has just made its record: clears it
/// first (a parked call is not in flight). Cold.
[[gnu::cold]] void park_at_entry() noexcept;

/// Takes a slot for this thread (into t_call_slot) and arranges its release
/// at thread exit; null when all kCallSlots are taken. Cold.
CallSlot* acquire_call_slot() noexcept;

/// One call on a handle: entered() is false when the handle was closed
/// (the call must not touch the runtime then).
class InFlight {
 public:
  [[gnu::always_inline]] InFlight(const void* handle, const Gate& gate) noexcept : gate_(&gate) {
    CallSlot* s = t_call_slot;
    if (s == nullptr) [[unlikely]]
      s = acquire_call_slot();
    slot_ = s;
    if (s != nullptr) [[likely]] {
      prev_ = s->in.load(std::memory_order_relaxed);
      s->in.store(handle, std::memory_order_seq_cst);
    } else {
      gate.overflow_calls.fetch_add(1, std::memory_order_seq_cst);
    }
    entered_ = !gate.closed.load(std::memory_order_seq_cst);
    // After the record is made (the Dekker pattern with park_calls_at_exit's
    // flag store and slot scan): a call that starts once the process exits
    // parks before it touches anything.
    if (g_park_at_exit.load(std::memory_order_seq_cst)) [[unlikely]]
      park_at_entry();
  }
  [[gnu::always_inline]] ~InFlight() {
    if (slot_ != nullptr) [[likely]]
      slot_->in.store(prev_, std::memory_order_release);
    else
      gate_->overflow_calls.fetch_sub(1, std::memory_order_release);
    // After the record is cleared: a parked thread never holds up a close.
    if (g_park_at_exit.load(std::memory_order_relaxed)) [[unlikely]]
      park_unless_exiting();
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

  bool entered() const noexcept { return entered_; }

 private:
  CallSlot* slot_;
  const void* prev_ = nullptr;
  const Gate* gate_;
  bool entered_;
};

/// The number of calls in flight on `handle` now (its slots plus its
/// overflow count). Close side; call after setting the gate's flag.
int64_t calls_in_flight(const void* handle, const Gate& gate) noexcept;

/// Waits until no call is in flight on `handle` or `timeout_s` passed;
/// returns the calls still in flight (0: none). Close side.
int64_t wait_calls_done(const void* handle, const Gate& gate, double timeout_s) noexcept;

}  // namespace dispatch::capi
