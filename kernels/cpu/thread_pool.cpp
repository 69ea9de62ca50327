// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the persistent thread pool (see thread_pool.hpp).
#include "cpu/thread_pool.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace dispatch::cpu {
namespace {

/// How long an idle thread polls before it sleeps in a futex.
constexpr auto kSpin = std::chrono::microseconds(20);

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Returns the value of `a` once it differs from `old`: polls for kSpin,
/// then sleeps in std::atomic::wait.
template <class T>
T wait_change(const std::atomic<T>& a, T old) noexcept {
  T v = a.load(std::memory_order_acquire);
  if (v != old) return v;
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    cpu_relax();
    v = a.load(std::memory_order_acquire);
    if (v != old) return v;
    if ((i & 63) == 0 && std::chrono::steady_clock::now() >= until) break;
  }
  for (;;) {
    a.wait(old, std::memory_order_acquire);
    v = a.load(std::memory_order_acquire);
    if (v != old) return v;
  }
}

struct alignas(64) Ticket {
  std::atomic<uint32_t> value{0};
};

class Pool {
 public:
  Pool() : max_helpers_(std::max(0, hardware_threads() - 1)) {
    tickets_ = std::make_unique<Ticket[]>(static_cast<std::size_t>(std::max(1, max_helpers_)));
    workers_.reserve(static_cast<std::size_t>(max_helpers_));
    instance_.store(this, std::memory_order_release);
    ::pthread_atfork(nullptr, nullptr, &Pool::after_fork_in_child);
  }

  ~Pool() {
    instance_.store(nullptr, std::memory_order_release);
    if (forked_.load(std::memory_order_acquire)) {
      abandon_workers();  // they do not exist in this (child) process
      return;
    }
    stop_.store(true, std::memory_order_release);
    for (int i = 0; i < started_; ++i) {
      tickets_[i].value.fetch_add(1, std::memory_order_release);
      tickets_[i].value.notify_one();
    }
    for (std::thread& t : workers_)
      if (t.joinable()) t.join();
  }

  int run(int tasks, int threads, PoolTaskFn fn, void* ctx) noexcept {
    int helpers = std::min({threads, tasks, max_helpers_ + 1}) - 1;
    if (helpers <= 0 || busy_.exchange(true, std::memory_order_acquire)) return run_inline(tasks, fn, ctx);
    if (forked_.load(std::memory_order_acquire)) reset_after_fork();
    while (started_ < helpers && start_helper()) {
    }
    helpers = std::min(helpers, started_);
    if (helpers <= 0) {
      busy_.store(false, std::memory_order_release);
      return run_inline(tasks, fn, ctx);
    }
    fn_ = fn;
    ctx_ = ctx;
    tasks_ = tasks;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(helpers, std::memory_order_relaxed);
    for (int i = 0; i < helpers; ++i) {
      tickets_[i].value.fetch_add(1, std::memory_order_release);  // publishes fn_, ctx_, tasks_
      tickets_[i].value.notify_one();                             // no syscall unless the helper sleeps
    }
    drain();
    for (int left = pending_.load(std::memory_order_acquire); left != 0;
         left = pending_.load(std::memory_order_acquire))
      wait_change(pending_, left);
    busy_.store(false, std::memory_order_release);
    return helpers + 1;
  }

 private:
  static int run_inline(int tasks, PoolTaskFn fn, void* ctx) noexcept {
    for (int t = 0; t < tasks; ++t) fn(ctx, t);
    return 1;
  }

  void drain() noexcept {
    for (int t = next_.fetch_add(1, std::memory_order_relaxed); t < tasks_;
         t = next_.fetch_add(1, std::memory_order_relaxed))
      fn_(ctx_, t);
  }

  bool start_helper() noexcept {
    const int idx = started_;
    try {
      // The helper starts from the ticket's current value, read here: a
      // bump made before the thread first runs still counts as a new job.
      workers_.emplace_back(&Pool::helper, this, idx, tickets_[idx].value.load(std::memory_order_relaxed));
    } catch (...) {
      return false;  // the remaining tasks run on the threads we have
    }
    ++started_;
    return true;
  }

  void helper(int idx, uint32_t seen) noexcept {
    for (;;) {
      seen = wait_change(tickets_[idx].value, seen);
      if (stop_.load(std::memory_order_acquire)) return;
      drain();
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  // fork(): only the forking thread exists in the child. Its handler may only
  // do async-signal-safe things, so it just flags the pool; the child's first
  // call (or the destructor) drops the parent's helpers.
  static void after_fork_in_child() noexcept {
    if (Pool* p = instance_.load(std::memory_order_acquire)) {
      p->forked_.store(true, std::memory_order_release);
      p->busy_.store(false, std::memory_order_release);
    }
  }

  void abandon_workers() noexcept {
    // std::thread objects of threads that do not exist here can be neither
    // joined nor destroyed (joinable -> std::terminate): leak them.
    auto* gone = new (std::nothrow) std::vector<std::thread>(std::move(workers_));
    (void)gone;
    workers_ = std::vector<std::thread>();
    started_ = 0;
  }

  void reset_after_fork() noexcept {
    abandon_workers();
    try {
      workers_.reserve(static_cast<std::size_t>(max_helpers_));
    } catch (...) {
    }
    pending_.store(0, std::memory_order_relaxed);
    forked_.store(false, std::memory_order_release);
  }

  static inline std::atomic<Pool*> instance_{nullptr};

  const int max_helpers_;
  std::unique_ptr<Ticket[]> tickets_;
  std::vector<std::thread> workers_;
  int started_ = 0;  ///< helpers running; changed only by the job owner (busy_)

  alignas(64) std::atomic<bool> busy_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> forked_{false};
  // The current job (written by the owner before the tickets are bumped).
  PoolTaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int tasks_ = 0;
  alignas(64) std::atomic<int> next_{0};
  alignas(64) std::atomic<int> pending_{0};
};

Pool& pool() noexcept {
  static Pool p;
  return p;
}

}  // namespace

int hardware_threads() noexcept {
  static const int n = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof set, &set) == 0) {
      const int c = CPU_COUNT(&set);
      if (c > 0) return c;
    }
    const unsigned h = std::thread::hardware_concurrency();
    return h > 0 ? static_cast<int>(h) : 1;
  }();
  return n;
}

int parallel_for(int tasks, int threads, PoolTaskFn fn, void* ctx) noexcept {
  if (tasks <= 0) return 0;
  if (threads <= 1 || tasks == 1 || hardware_threads() <= 1) {
    for (int t = 0; t < tasks; ++t) fn(ctx, t);
    return 1;
  }
  return pool().run(tasks, threads, fn, ctx);
}

}  // namespace dispatch::cpu
