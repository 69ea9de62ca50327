# SPDX-License-Identifier: Apache-2.0
"""The GPU timing method shared by kdispatch's GPU benchmarks and the regression
gate (the same method as ../shared/peers/README.md):

- cold(fn): CUDA events around each call, each call preceded by a 256 MiB read
  that evicts L2; calls enqueued in chunks behind a GPU sleep kernel that outlasts
  the host's enqueue time, so host launch cost never enters the interval; median.
- cold_interleaved(fns): cold() of several implementations in turns (chunks of
  each, order rotated per round), so slow drift affects all of them alike.
- graph(calls): the calls captured back to back in one CUDA graph; median replay
  time / number of nodes (the inter-kernel gap inside a graph, no host cost).
"""
import time


def q(vals, p):
    vals = sorted(vals)
    if not vals:
        return float("nan")
    return vals[min(len(vals) - 1, max(0, int(round(p * (len(vals) - 1)))))]


class Timer:
    def __init__(self, torch, device="cuda", flush_bytes=256 * 2**20):
        self.torch = torch
        self.flush_buf = torch.empty(flush_bytes // 4, dtype=torch.float32, device=device).normal_()
        self.flush()
        torch.cuda.synchronize()
        s, e = self.ev(), self.ev()
        s.record()
        for _ in range(10):
            self.flush()
        e.record()
        torch.cuda.synchronize()
        self.flush_ms = s.elapsed_time(e) / 10

    def ev(self):
        return self.torch.cuda.Event(enable_timing=True)

    def flush(self):
        self.flush_buf.sum()

    def _probe(self, fn):
        """Warms fn up; returns (GPU ms per call back to back, host ms to enqueue one call)."""
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        s, e = self.ev(), self.ev()
        s.record()
        for _ in range(3):
            fn()
        e.record()
        torch.cuda.synchronize()
        est_ms = max(s.elapsed_time(e) / 3.0, 1e-3)
        t0 = time.perf_counter()
        for _ in range(5):
            fn()
        host_ms = (time.perf_counter() - t0) / 5 * 1e3
        torch.cuda.synchronize()
        return est_ms, host_ms

    def cold(self, fn, rep_ms=20.0, chunk=25, max_iters=200, min_iters=10):
        torch = self.torch
        est_ms, host_ms = self._probe(fn)
        n = int(min(max_iters, max(min_iters, rep_ms / (est_ms + self.flush_ms))))
        sleep_cycles = int((chunk * (host_ms + 0.03) * 1.5 + 0.05) * 1e-3 * 2.0e9)
        ss = [self.ev() for _ in range(n)]
        ee = [self.ev() for _ in range(n)]
        for i in range(n):
            if i % chunk == 0:
                torch.cuda._sleep(sleep_cycles)
            self.flush()
            ss[i].record()
            fn()
            ee[i].record()
        torch.cuda.synchronize()
        t = [a.elapsed_time(b) * 1e3 for a, b in zip(ss, ee)]
        return {"us": q(t, 0.5), "p20": q(t, 0.2), "p80": q(t, 0.8), "n": n}

    def cold_interleaved(self, fns, rep_ms=20.0, chunk=5, max_iters=200, min_iters=30):
        """cold() for several implementations of one call, measured in turns:
        chunks of `chunk` calls of each, the order rotated every round, so a
        drift of the clocks or of the memory system over the run falls on all
        of them alike (ratios between them are what the tables report).
        At least 30 calls each (6 rounds): a GEMM of milliseconds runs at the
        power limit, and its times spread over two clock levels.
        fns: {name: fn}; returns {name: cold()'s dict}."""
        torch = self.torch
        names = list(fns)
        est, host = {}, {}
        for nm in names:
            est[nm], host[nm] = self._probe(fns[nm])
        # the same number of calls of each, as many as the slowest allows
        n = int(min(max_iters, max(min_iters, rep_ms / (max(est.values()) + self.flush_ms))))
        n = max(chunk, (n + chunk - 1) // chunk * chunk)
        sleep_cycles = int((chunk * len(names) * (max(host.values()) + 0.03) * 1.5 + 0.05) * 1e-3 * 2.0e9)
        ss = {nm: [self.ev() for _ in range(n)] for nm in names}
        ee = {nm: [self.ev() for _ in range(n)] for nm in names}
        for r in range(n // chunk):
            torch.cuda._sleep(sleep_cycles)
            k = r % len(names)
            for nm in names[k:] + names[:k]:
                fn = fns[nm]
                for i in range(r * chunk, (r + 1) * chunk):
                    self.flush()
                    ss[nm][i].record()
                    fn()
                    ee[nm][i].record()
        torch.cuda.synchronize()
        out = {}
        for nm in names:
            t = [a.elapsed_time(b) * 1e3 for a, b in zip(ss[nm], ee[nm])]
            out[nm] = {"us": q(t, 0.5), "p20": q(t, 0.2), "p80": q(t, 0.8), "n": n, "interleaved": len(names)}
        return out

    def graph(self, calls, target_ms=8.0):
        torch = self.torch
        st = torch.cuda.Stream()
        st.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(st):
            for c in calls[:2]:
                c()
        torch.cuda.current_stream().wait_stream(st)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for c in calls:
                c()
        g.replay()
        torch.cuda.synchronize()
        s, e = self.ev(), self.ev()
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        est = max(s.elapsed_time(e), 1e-3)
        ts = []
        for _ in range(int(min(20, max(3, target_ms / est)))):
            s.record()
            g.replay()
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) * 1e3 / len(calls))
        del g
        return {"us": q(ts, 0.5), "nodes": len(calls)}
