# SPDX-License-Identifier: Apache-2.0
"""The child process of test_close.py (not a test module): races of
Runtime.close() against calls on other threads, and an interpreter exit
with daemon threads still calling. Run as

    close_race_child.py race ROUNDS          # 4 threads call rt.rmsnorm, the main thread closes
    close_race_child.py torch-race ROUNDS    # the same through torch.ops.kdispatch.rmsnorm
    close_race_child.py exit owned|default|torch-owned|torch-default
    close_race_child.py exit-control         # the same exit with torch's own op, no kdispatch call

A race prints one JSON line of counts last; a crash (a signal) is the
parent's finding: the exit status."""

import json
import sys
import threading
import time

import numpy as np

import kdispatch

CALLERS = 4


def refused(e):
    """A call refused because the runtime was closed: kdispatch.Error
    failed_precondition (the layers), or torch's RuntimeError with the
    status name (the native torch ops)."""
    text = str(e)
    if isinstance(e, kdispatch.Error):
        return e.code == kdispatch.StatusCode.failed_precondition and "the runtime was closed" in text
    return "failed_precondition" in text and "the runtime was closed" in text


def race(rounds):
    x = np.random.default_rng(0).random((4, 64), dtype=np.float32)
    w = np.ones(64, np.float32)
    counts = {"rounds": 0, "ok_calls": 0, "refused": 0, "other": [], "late_call_refused": 0}
    for _ in range(rounds):
        rt = kdispatch.Runtime(shipped_configs=False, log_level="off")
        started = threading.Semaphore(0)
        lock = threading.Lock()

        def caller():
            y = np.empty_like(x)
            n = 0
            while True:
                try:
                    rt.rmsnorm(y, x, w, 1e-6)
                    n += 1
                    if n == 1:
                        started.release()
                except Exception as e:  # noqa: BLE001 (counted: anything but the refusal fails the test)
                    with lock:
                        counts["ok_calls"] += n
                        if refused(e):
                            counts["refused"] += 1
                        else:
                            counts["other"].append(repr(e))
                    if n == 0:
                        started.release()
                    return

        threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
        for t in threads:
            t.start()
        for _ in threads:
            started.acquire()
        rt.close()
        for t in threads:
            t.join()
        try:
            rt.rmsnorm(np.empty_like(x), x, w, 1e-6)
        except kdispatch.Error as e:
            counts["late_call_refused"] += refused(e)
        counts["rounds"] += 1
    print(json.dumps(counts))


def torch_race(rounds):
    import torch
    import kdispatch.torch_ops as ops
    x = torch.rand(4, 64, generator=torch.Generator().manual_seed(0))
    w = torch.ones(64)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    counts = {"rounds": 0, "ok_calls": 0, "refused": 0, "wrong": 0, "other": []}
    for r in range(rounds):
        rt = kdispatch.Runtime(shipped_configs=False, log_level="off")
        ops.set_runtime(rt)
        started = threading.Semaphore(0)
        stop = threading.Event()
        lock = threading.Lock()
        # Even rounds: Runtime.close() (the ops go back to the default runtime
        # first, so calls keep succeeding). Odd rounds: the handle alone is
        # closed under the ops, which keep it: every thread ends refused.
        keep_handle = r % 2 == 1

        def caller():
            n = 0
            while not stop.is_set():
                try:
                    y = torch.ops.kdispatch.rmsnorm(x, w, 1e-6)
                    n += 1
                    if n == 1:
                        started.release()
                    if not torch.allclose(y, want, rtol=1e-4, atol=1e-5):
                        with lock:
                            counts["wrong"] += 1
                except Exception as e:  # noqa: BLE001
                    with lock:
                        if refused(e):
                            counts["refused"] += 1
                        else:
                            counts["other"].append(repr(e))
                    if n == 0:
                        started.release()
                    if keep_handle or not refused(e):
                        break
            with lock:
                counts["ok_calls"] += n

        threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
        for t in threads:
            t.start()
        for _ in threads:
            started.acquire()
        if keep_handle:
            rt._h.close()
        else:
            rt.close()
            time.sleep(0.001)
            stop.set()
        for t in threads:
            t.join()
        ops.set_runtime(None)
        rt.close()
        counts["rounds"] += 1
    print(json.dumps(counts))


def exit_with_daemon_threads(mode):
    """Starts 4 daemon threads calling, then returns: the interpreter exits
    under them (atexit handlers, module teardown, the runtime's handle
    released, C++ static destructors)."""
    torch_ops = mode.startswith("torch")
    owned = mode.endswith("owned")
    rt = kdispatch.Runtime(shipped_configs=False, log_level="off") if owned else kdispatch.default_runtime()
    if torch_ops:
        import torch
        import kdispatch.torch_ops as ops
        if owned:
            ops.set_runtime(rt)
        xt, wt = torch.rand(4, 64), torch.ones(64)

        def call():
            torch.ops.kdispatch.rmsnorm(xt, wt, 1e-6)
    else:
        x = np.random.default_rng(0).random((4, 64), dtype=np.float32)
        w = np.ones(64, np.float32)

        def call():
            rt.rmsnorm(np.empty_like(x), x, w, 1e-6)

    exit_under_callers(call)


def exit_under_callers(call):
    """Starts CALLERS daemon threads calling `call` in a loop (a thread ends
    when a call raises: refused at exit) and returns once each has called."""
    started = threading.Semaphore(0)

    def caller():
        first = True
        while True:
            try:
                call()
            except Exception:  # noqa: BLE001 (refused at exit: the thread ends)
                return
            if first:
                first = False
                started.release()

    for _ in range(CALLERS):
        threading.Thread(target=caller, daemon=True).start()
    for _ in range(CALLERS):
        started.acquire()
    time.sleep(0.005)
    print("exiting with 4 daemon threads calling")


def exit_control():
    """The control of the torch modes: 4 daemon threads calling a torch op
    of torch's own (F.rms_norm; layer_norm where torch has none) while the
    interpreter exits, no kdispatch call at all. torch 2.11 aborts here
    (8 of 8 runs on the H200, 2026-12-03), and so does Debian's torch 1.13
    ("terminate called without an active exception")."""
    import torch
    import torch.nn.functional as F
    x, w = torch.rand(4, 64), torch.ones(64)
    op = getattr(F, "rms_norm", None) or F.layer_norm
    exit_under_callers(lambda: op(x, (64,), w, eps=1e-6))


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "race":
        race(int(sys.argv[2]))
    elif what == "torch-race":
        torch_race(int(sys.argv[2]))
    elif what == "exit":
        exit_with_daemon_threads(sys.argv[2])
    elif what == "exit-control":
        exit_control()
    else:
        sys.exit(f"unknown mode {what}")
