# SPDX-License-Identifier: Apache-2.0
"""Fits where get_default's decode rule (our skinny families) may serve instead
of the floor (issue 32, item 2), from the synthetic-grid run
(bench_any_model.py --grid fit: fit.json) — never from the benchmark's
projections.

A cell is (kind, t bin, M tier): t = ceil(N/16) / SMs (16-row weight tiles per
SM), bins bounded at the geometric midpoints of the grid's t values; M tiers
1, 2, 3-4, 5-8, 9-16 (bf16; the grid's M 1, 2, 4, 8, 16) and 1-4, 5-8, 9-16
(fp8; M 1, 8, 16). The rule serves a cell when, over the grid points in it
(every K of the grid), the rule's time against the floor's has a geomean >=
1.03x and no point below 0.95x (0.90x in the first fit) in CUDA graphs and,
where the run timed it (--fit-modes cold,graph, since 2026-12-04), cold too:
the tuner's rule for a winner (both modes); otherwise the floor serves.

  python3 bench/gpu/fit_defaults.py fit.json [--csv OUT.csv] [--apply kernels/cuda/default_fit.hpp]
prints the C++ table of kernels/cuda/default_fit.hpp and the cells' numbers;
--apply also writes the table's lines (kTBounds, k*Rule) into that header.
"""
import argparse
import json
import math
import re
from collections import defaultdict

SMS = 132
GEO, MIN = 1.03, 0.95
TIERS = {"bf16": [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16)], "fp8": [(1, 4), (5, 8), (9, 16)]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fit")
    ap.add_argument("--csv")
    ap.add_argument("--apply", help="rewrite the kTBounds / k*Rule lines of this header")
    a = ap.parse_args()
    table = []
    rows = [r for r in json.load(open(a.fit))["rows"] if "graph_kd_us" in r]
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("kind,N,K,M,rule_variant,rule_graph_us,floor_graph_us,torch_graph_us\n")
            for r in rows:
                # torch's time is empty where the sweep did not call torch (bench_any_model.py Point.torch_ok)
                torch_us = f"{r['graph_torch_us']:.3f}" if "graph_torch_us" in r else ""
                f.write(f"{r['kind']},{r['N']},{r['K']},{r['M']},{r['kd_variant']},{r['graph_kd_us']:.3f},"
                        f"{r['graph_floor_us']:.3f},{torch_us}\n")
    ts = sorted({math.ceil(r["N"] / 16) / SMS for r in rows})
    bounds = [math.sqrt(ts[i] * ts[i + 1]) for i in range(len(ts) - 1)]
    print("// t bin upper bounds:", ", ".join(f"{b:.2f}" for b in bounds))
    for fam, kinds in (("bf16", ["bf16"]), ("fp8_tensor", ["tensor"]), ("fp8_rowwise", ["rowwise"]),
                       ("fp8_block", ["block"])):
        tiers = TIERS["bf16" if fam == "bf16" else "fp8"]
        cells = defaultdict(list)
        for r in rows:
            if r["kind"] not in kinds:
                continue
            t = math.ceil(r["N"] / 16) / SMS
            b = sum(1 for x in bounds if t >= x)
            ti = next(i for i, (lo, hi) in enumerate(tiers) if lo <= r["M"] <= hi)
            cells[(b, ti)].append((r["graph_floor_us"] / r["graph_kd_us"],
                                   r["cold_floor_us"] / r["cold_kd_us"] if r.get("cold_kd_us") else None))
        masks = []
        for b in range(len(ts)):
            m = 0
            notes = []
            for ti in range(len(tiers)):
                v = cells.get((b, ti))
                if not v:
                    notes.append("   -     ")
                    continue
                gv = [x for x, _ in v]
                cv = [c for _, c in v if c is not None]
                g = math.exp(sum(map(math.log, gv)) / len(gv))
                ok = g >= GEO and min(gv) >= MIN
                note = f"{min(gv):.2f}/{g:.2f}"
                if cv:  # cold timed too: the cell must win there as well
                    gc = math.exp(sum(map(math.log, cv)) / len(cv))
                    ok = ok and gc >= GEO and min(cv) >= MIN
                    note += f" c{min(cv):.2f}/{gc:.2f}"
                m |= (1 << ti) if ok else 0
                notes.append(f"{'Y' if ok else '.'} {note}")
            masks.append(m)
            print(f"// {fam:11} t~{ts[b]:5.2f}: " + " ".join(notes))
        table.append(f"inline constexpr uint8_t k{''.join(w.capitalize() for w in fam.split('_'))}Rule[] = "
                     f"{{{', '.join(f'0x{m:02x}' for m in masks)}}};")
        print(table[-1])
    table.append("inline constexpr double kTBounds[] = {" + ", ".join(f"{b:.3f}" for b in bounds) + "};")
    print(table[-1])
    print(f"// every rule table has {len(bounds) + 1} entries (kTBounds + 1; default_fit.hpp static_asserts it)")
    if a.apply:
        apply(a.apply, table)


def apply(header, table):
    """Replaces each `inline constexpr ... kName[] = {...};` line of header
    with the fitted one of the same name; every name must be there once."""
    text = open(header).read()
    for line in table:
        name = line.split("[]")[0].split()[-1]
        pat = re.compile(r"^inline constexpr [a-z0-9_]+ " + name + r"\[\] = \{[^}]*\};$", re.M)
        text, n = pat.subn(line, text)
        if n != 1:
            raise SystemExit(f"fit_defaults.py --apply: {header} has {n} lines defining {name} (want 1)")
    with open(header, "w") as f:
        f.write(text)
    print(f"// wrote {len(table)} table lines into {header}")


if __name__ == "__main__":
    main()
