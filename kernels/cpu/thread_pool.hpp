// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — a small persistent thread pool for the kernels
// that split one call over several cores (gemm_fp32__splitk).
//
// The job: run fn(ctx, t) for t in [0, tasks) on up to `threads` threads and
// return when all are done. The calling thread is one of the threads (no
// hand-off latency for its share, no idle caller); helpers take tasks from
// one atomic counter, so uneven tasks balance themselves.
//
// Choices, and why:
// - One process-wide pool, started lazily: helper threads are created the
//   first time a call needs them, up to hardware threads - 1 (the affinity
//   mask's count, so a container limited to 2 CPUs gets 1 helper). After
//   that a call allocates nothing and makes no syscall except the futex
//   wake/wait of helpers that went to sleep.
// - Per-helper wake tickets (one cache line each) rather than one shared
//   generation word: a helper only ever sees jobs it is part of, so there is
//   no "was that job for me?" race when jobs follow each other quickly.
// - Idle helpers spin ~20 µs before sleeping (std::atomic::wait, a futex),
//   so back-to-back calls (one per layer) do not pay a wake-up each; the
//   caller spins the same way before waiting for stragglers.
// - One job at a time. A second caller (another engine thread) or a call
//   from inside a task finds the pool busy and runs all its tasks itself:
//   never blocks on another caller's job, never deadlocks, same results up
//   to the order of the work.
// - fork(): helpers do not survive into a child; a pthread_atfork handler
//   marks the pool so the child starts fresh helpers on its first call.
#pragma once

namespace dispatch::cpu {

/// fn(ctx, task): one task of a job. Must not throw.
using PoolTaskFn = void (*)(void* ctx, int task) noexcept;

/// Runs fn(ctx, t) for every t in [0, tasks) on min(threads, tasks,
/// hardware_threads()) threads, the caller included, and returns when every
/// task has finished. Tasks run in no fixed order and concurrently. When the
/// pool is busy, or a helper cannot be started, the caller runs the
/// remaining tasks itself. Returns the number of threads that took part.
int parallel_for(int tasks, int threads, PoolTaskFn fn, void* ctx) noexcept;

/// CPUs this process may run on (sched_getaffinity), at least 1; probed once.
int hardware_threads() noexcept;

}  // namespace dispatch::cpu
