#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Loading SGLang's config trees: kdispatch (C++) beside Python's json.load.

Python side: what SGLang does with these files, for the whole tree: walk it
(os.walk, sorted) and `with open(p) as f: json.load(f)` every *.json file
(SGLang's get_moe_configs / get_w8a8_block_fp8_configs read them one by one).
C++ side: bench_load (Google Benchmark), run with --benchmark_format=json:
BM_LoadAndBuild (store::load_config_dirs + table::Snapshot::build), and
beside it BM_RuntimeCreate (dispatch::Runtime::create, shipped configs off)
and the floor BM_Floor_ReadParse (read + simdjson DOM parse of every file).

The machine is shared, so the two sides are measured in rounds, back to
back: each round takes Python's best of 3 loads, then one bench_load run
(mean over its iterations, --min-time seconds). Reported: best and median
over the rounds, and the median of the per-round ratios Python / C++. Page
cache warm for both (the tree is loaded once before the first round).

Usage (Debian's python3; no third-party module needed):
  /usr/bin/python3 bench/load_vs_python.py [--bench build-bench/bench/bench_load]
      [--dir ../shared/data/sglang-configs] [--runs 9] [--min-time 0.2] [--json]

Target: the C++ load >= 2x faster than Python.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def python_load(root):
    """One SGLang-style load of every *.json under root. Returns (files, top-level keys)."""
    files = keys = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if not name.endswith(".json") or name.startswith("."):
                continue
            path = os.path.join(dirpath, name)
            with open(path) as f:
                data = json.load(f)
            files += 1
            keys += len(data)  # use the result
    return files, keys


def time_python_once(root, loads):
    """Best of `loads` consecutive loads, ms."""
    best = float("inf")
    files = 0
    for _ in range(loads):
        t0 = time.perf_counter()
        files, _keys = python_load(root)
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return files, best


def time_cpp_once(bench, root, min_time):
    """One bench_load run: {benchmark: mean ms per load over its iterations}, files, context."""
    env = dict(os.environ, KDISPATCH_BENCH_CONFIG_DIR=root)
    cmd = [bench, "--benchmark_filter=^(BM_LoadAndBuild|BM_RuntimeCreate|BM_Floor_ReadParse)$",
           f"--benchmark_min_time={min_time}", "--benchmark_format=json"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    doc = json.loads(out)
    per, files = {}, {}
    for b in doc["benchmarks"]:
        assert b["time_unit"] == "ms", b["time_unit"]
        per[b["run_name"]] = b["real_time"]
        if "files" in b:
            files[b["run_name"]] = int(b["files"])
    return per, files, doc.get("context", {})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build-bench", "bench", "bench_load"))
    ap.add_argument("--dir", default=os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "sglang-configs")))
    ap.add_argument("--runs", type=int, default=9, help="rounds (each: Python best of 3 loads, one bench_load run)")
    ap.add_argument("--min-time", type=float, default=0.2, help="bench_load --benchmark_min_time per round (s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    a = ap.parse_args()
    if not os.path.isdir(a.dir):
        sys.exit(f"no config dir {a.dir}")
    if not os.access(a.bench, os.X_OK):
        sys.exit(f"no bench_load at {a.bench} (build it: ninja -C build-bench bench_load)")

    # Rounds, Python and C++ back to back in each, so a change in the
    # machine's load (shared with other builds) hits both sides alike.
    python_load(a.dir)  # warm the page cache and the interpreter
    py, per, ratios = [], {}, []
    files, ctx, py_files = {}, {}, 0
    for _ in range(a.runs):
        py_files, t = time_python_once(a.dir, 3)
        py.append(t)
        cpp, files, ctx = time_cpp_once(a.bench, a.dir, a.min_time)
        for name, v in cpp.items():
            per.setdefault(name, []).append(v)
        ratios.append(t / cpp["BM_LoadAndBuild"])

    def stats(v):
        return {"best_ms": min(v), "median_ms": statistics.median(v), "runs": len(v)}

    res = {
        "dir": a.dir,
        "load_avg": os.getloadavg(),
        "python": dict(stats(py), files=py_files, version=sys.version.split()[0], executable=sys.executable),
        "cpp": {name: dict(stats(v), files=files.get(name)) for name, v in per.items()},
        "cpp_library_build_type": ctx.get("library_build_type"),
    }
    main_cpp = res["cpp"]["BM_LoadAndBuild"]
    res["ratio_median"] = statistics.median(ratios)  # median of the per-round ratios
    res["ratio_best"] = res["python"]["best_ms"] / main_cpp["best_ms"]
    res["target_2x_met"] = res["ratio_median"] >= 2.0
    if a.json:
        print(json.dumps(res, indent=2))
        return
    print(f"config tree: {a.dir} ({py_files} *.json files); load average {res['load_avg'][0]:.2f}")
    print(f"{'':38} {'best ms':>9} {'median ms':>10}  runs")
    print(f"{'python json.load (' + res['python']['version'] + ')':38} {res['python']['best_ms']:9.2f} "
          f"{res['python']['median_ms']:10.2f}  {a.runs}")
    labels = {"BM_LoadAndBuild": "C++ load_config_dirs + Snapshot::build",
              "BM_RuntimeCreate": "C++ Runtime::create",
              "BM_Floor_ReadParse": "C++ floor: read + simdjson DOM parse"}
    for name in ("BM_LoadAndBuild", "BM_RuntimeCreate", "BM_Floor_ReadParse"):
        if name in res["cpp"]:
            c = res["cpp"][name]
            print(f"{labels[name]:38} {c['best_ms']:9.2f} {c['median_ms']:10.2f}  {c['runs']}")
    print(f"ratio python / C++ load (median): {res['ratio_median']:.2f}x  (best: {res['ratio_best']:.2f}x); "
          f"target >= 2x: {'met' if res['target_2x_met'] else 'NOT met'}")


if __name__ == "__main__":
    main()
