# SPDX-License-Identifier: Apache-2.0
"""Demotes the committed rows that lose to the floor (issue 32, "committed
shapes"): from a `bench_any_model.py --grid committed` run (committed.json),
each point whose served row is slower than torch by more than the margin
(2 %) beyond that point's A/A spread in either timing mode (the tuner's rule:
a plan must win cold *and* in a graph to replace the floor) has its row in
configs/cuda rewritten to the floor plan (cuBLAS as F.linear calls it;
cuBLASLt asked as torch._scaled_mm asks it), as `tune` writes a "floor kept"
row. The file's metadata gains "demoted": {M: why} and loses that M's "us" /
"default_us" (times of the plan that no longer serves). Rows at Ms the run did
not measure are left as they are.

  python3 bench/gpu/demote_committed.py committed.json [--configs configs/cuda] [--margin 0.02] [--date YYYY-MM-DD] [--dry-run]
"""
import argparse
import json
import os
import sys
import time

FLOOR = {
    "bf16": ("gemm", "dtype=bf16", {"variant": "gemm_bf16__cublas"}),
}
for _L in ("tensor", "rowwise", "block"):
    FLOOR[_L] = (f"gemm_fp8_{_L}", None, {
        "variant": f"gemm_fp8_{_L}_e4m3fn__cublaslt", "algo_id": -2, "tile_id": 0, "stages_id": 0, "split_k": 0,
        "reduction_scheme": 0, "cta_swizzling": 0, "custom_option": 0, "inner_shape_id": 0, "cluster_shape_id": 0,
        "workspace_bytes": 0, "cublaslt_version": 0})


def losing(r, margin):
    """The worse mode's ratio and A/A when the row loses beyond both; else None."""
    if "error" in r or "cold_ratio" not in r:
        return None
    worst = None
    for m in ("cold", "graph"):
        ratio, aa = r[f"{m}_ratio"], r[f"{m}_aa"]
        if ratio < 1 - margin and ratio < 1 - margin / 2 - aa and (worst is None or ratio < worst[1]):
            worst = (m, ratio, aa)
    return worst


def table_file(root, op, n, k, extra):
    d = os.path.join(root, op)
    want = f"N={n},K={k},"
    hits = [f for f in sorted(os.listdir(d)) if f.startswith(want) and "device_name=NVIDIA_H200" in f
            and (extra is None or extra in f) and "bias=" not in f and "accum=" not in f]
    return os.path.join(d, hits[0]) if len(hits) == 1 else None


def dump(doc):
    """The layout configs/ holds: one key per line, each value on one line."""
    lines = [f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in doc.items()]
    return "{\n" + ",\n".join(lines) + "\n}\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--configs", default="configs/cuda")
    ap.add_argument("--margin", type=float, default=0.02)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--date", default=time.strftime("%Y-%m-%d"), help="the run's date, written in each why")
    a = ap.parse_args()
    res = json.load(open(a.results))
    date = a.date
    changed = {}
    for r in res["rows"]:
        w = losing(r, a.margin)
        if not w:
            continue
        op, extra, floor = FLOOR[r["kind"]]
        path = table_file(a.configs, op, r["N"], r["K"], extra)
        if path is None:
            print(f"no single committed file for {r['kind']} N={r['N']} K={r['K']}", file=sys.stderr)
            return 1
        doc = changed.get(path) or json.load(open(path))
        m = str(r["M"])
        if m not in doc:
            print(f"{path}: no row at M={m} (served from a neighbour): left alone", file=sys.stderr)
            continue
        old = doc[m].get("variant", "?")
        doc[m] = dict(floor)
        meta = doc["kdispatch"]
        meta.setdefault("schema", {}).setdefault(floor["variant"], 1)
        for key in ("us", "default_us"):
            meta.get(key, {}).pop(m, None)
        fr = r.get(f"{w[0]}_floor_ratio")
        why = (f"demoted to the floor{(' ' + date) if date else ''}: {old} ran {w[1]:.3f}x torch {w[0]} "
               f"(A/A {w[2]:.3f}; cold {r['cold_ratio']:.3f}x, graph {r['graph_ratio']:.3f}x) on the H200, "
               f"the floor {fr:.3f}x there (bench/results/h200_any_model.md, committed shapes)")
        meta.setdefault("demoted", {})[m] = why
        changed[path] = doc
        print(f"{os.path.relpath(path, a.configs)} M={m}: {why}")
    if not a.dry_run:
        for path, doc in changed.items():
            with open(path, "w") as f:
                f.write(dump(doc))
    print(f"{sum(len(d['kdispatch']['demoted']) for d in changed.values())} row(s) demoted in {len(changed)} file(s)"
          + (" (dry run)" if a.dry_run else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
