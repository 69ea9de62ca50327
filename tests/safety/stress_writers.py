#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writer-safety stress (issue 17): real processes through every write path.

  concurrent  N rounds; each round starts, at the same moment, into one fresh
              dir: `kdispatch tune --emit` (rmsnorm and fused_add_rmsnorm),
              the pretune probe (both ops), `kdispatch replay --tune sync`
              and `kdispatch replay --tune background`, each with its own M
              values, all writing the same files. After the round: every file
              parses, every row a process reported as committed is in its
              file, no lock, temp or claim file is left.
  kill        K kill -9s: writers (`tune --emit` and the pretune probe, both
              ops, fresh M values) start into one dir shared by the whole run
              and are killed at seeded random moments. After each kill: every
              file parses (0 torn). At the end: every row reported as
              committed before a kill is in its file; then one more write per
              file, after which no lock, temp or dead claim file is left.

--scheme fragments runs every writer with KDISPATCH_CACHE_LOCKING=fragments
(each process writes its own <key>.json.d/<host>-<pid>.json, as where flock
is not honoured); a table's rows are then those of its file and of all its
fragments, as the loader reads them.

A row is "committed" when its writer said so after the write returned: the
probe's "committed <key> M=<m>", tune's "[i/n] <shape> M=<m> -> ..." line,
the tuner's "kdispatch: tuned <key> M=<m> -> ..." (info level) without a
"could not persist" for it. The seed is printed; --seed replays a run.
Exit 0 when nothing was lost, torn or left behind; 1 otherwise.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

HIDDEN = 896
DTYPE = "bf16"
NORM_OPS = ("rmsnorm", "fused_add_rmsnorm")
SCHEME_ENV = {}  # --scheme fragments: {"KDISPATCH_CACHE_LOCKING": "fragments"}


def norm_key(op):
    return (op, frozenset({f"hidden={HIDDEN}", f"dtype={DTYPE}"}))


def key_from_text(key):
    """'cpu/gemm|CPU_x|K=896,N=896,dtype=bf16' -> ('gemm', {fields})."""
    prefix, _device, fields = key.split("|")
    return (prefix.split("/")[1], frozenset(f for f in fields.split(",") if f))


def key_from_file(rel):
    """'cpu/gemm/N=896,K=896,device_name=X,dtype=bf16.json' -> ('gemm', {fields}); a fragment
    '.../<key>.json.d/<host>-<pid>.json' is its table's."""
    parts = rel.split("/")
    if len(parts) >= 2 and parts[-2].endswith(".json.d"):
        parts = parts[:-2] + [parts[-2][: -len(".d")]]
    fields = parts[-1][: -len(".json")].split(",")
    return (parts[-2], frozenset(f for f in fields if not f.startswith("device_name=")))


class Writer:
    """One writer process and what it reported as committed."""

    def __init__(self, kind, argv, env=None, op=None):
        self.kind, self.argv, self.op = kind, argv, op
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **SCHEME_ENV, **(env or {})})
        self.out = self.err = ""
        self.killed = False

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.killed = True

    def wait(self, timeout=300):
        self.out, self.err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode

    def committed(self):
        rows = set()
        text = self.out + "\n" + self.err
        lines = text.split("\n")
        if self.killed:  # the last line may be cut mid-way
            lines = lines[:-1]
        for line in lines:
            m = re.match(r"committed (\S+) M=(\d+)$", line)
            if m:
                rows.add((key_from_text(m.group(1)), int(m.group(2))))
            m = re.match(r"\[\s*\d+/\d+\] hidden=(\d+),(\w+) M=(\d+) -> (.*)$", line)
            if m and "FAILED" not in m.group(4):
                rows.add((norm_key(self.op), int(m.group(3))))
        tuned = set(re.findall(r"^kdispatch: tuned (\S+) M=(\d+) -> ", text, re.M))
        unsaved = set(re.findall(r"^kdispatch: tuned (\S+) M=(\d+) but could not persist", text, re.M))
        for k, m in tuned - unsaved:
            rows.add((key_from_text(k), int(m)))
        return rows


def start_writer(kind, args, work, ms, tag):
    kd, probe = args.kdispatch, args.probe
    budget = str(args.budget_ms)
    if kind in ("emit-rmsnorm", "emit-fused_add_rmsnorm"):
        op = kind.split("-", 1)[1]
        csv = os.path.join(args.scratch, f"shapes-{tag}.csv")
        with open(csv, "w") as f:
            f.write("M,hidden\n" + "".join(f"{m},{HIDDEN}\n" for m in ms))
        return Writer(kind, [kd, "tune", "--shapes", csv, "--op", op, "--dtype", DTYPE, "--emit", work,
                             "--budget-ms", budget, "--reps", "2", "--no-cold-cache"], op=op)
    if kind in ("pretune-rmsnorm", "pretune-fused_add_rmsnorm"):
        op = kind.split("-", 1)[1]
        return Writer(kind, [probe, "--cache-dir", work, "--op", op, "--hidden", str(HIDDEN), "--dtype", DTYPE,
                             "--m", ",".join(map(str, ms)), "--budget-ms", budget], op=op)
    if kind in ("replay-sync", "replay-background"):
        trace = os.path.join(args.scratch, f"trace-{tag}.txt")
        with open(trace, "w") as f:
            f.write("\n".join(map(str, ms)) + "\n")
        return Writer(kind, [kd, "replay", "--tune", kind.split("-")[1], "--trace", trace, "--steps", "1",
                             "--no-shipped-configs", "--cache-dir", work, "--budget-ms", budget, "--no-cold-cache",
                             "--max-seconds", "30", "--json"], env={"KDISPATCH_LOG_LEVEL": "info"})
    raise ValueError(kind)


def read_files(work):
    """{key: set of M} of every config file; [problems] for files that do not parse, and for a file
    the scheme does not write (a table file under --scheme fragments, a fragment otherwise)."""
    tables, problems = {}, []
    fragments = SCHEME_ENV.get("KDISPATCH_CACHE_LOCKING") == "fragments"
    for root, _dirs, files in os.walk(work):
        for name in files:
            if not name.endswith(".json") or name.startswith("."):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, work)
            if root.endswith(".json.d") != fragments:
                problems.append(f"{rel}: a {'fragment' if not fragments else 'table file'} under the "
                                f"{'fragments' if fragments else 'flock'} scheme")
            try:
                with open(path) as f:
                    doc = json.load(f)
                if not isinstance(doc, dict):
                    raise ValueError("not an object")
                ms = {int(k) for k in doc if k != "kdispatch"}
                tables.setdefault(key_from_file(rel), set()).update(ms)  # a file and its fragments: one table
            except Exception as e:  # torn or garbage
                problems.append(f"{rel}: {e}")
    return tables, problems


def leftovers(work, dead_claims_only=False):
    """Lock, temp and claim files under work."""
    out = []
    for root, _dirs, files in os.walk(work):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), work)
            if name.endswith(".lock") or ".tmp." in name:
                out.append(rel)
            elif name.endswith(".claim"):
                if dead_claims_only:
                    with open(os.path.join(root, name)) as f:
                        pid = int(f.read().split()[0])
                    try:
                        os.kill(pid, 0)
                        continue
                    except ProcessLookupError:
                        pass
                out.append(rel)
    return out


def check_committed(committed, tables):
    lost = []
    for key, m in sorted(committed, key=lambda r: (r[0][0], sorted(r[0][1]), r[1])):
        if m not in tables.get(key, set()):
            lost.append(f"{key[0]} {','.join(sorted(key[1]))} M={m}")
    return lost


def run_concurrent(args, rng):
    kinds = ["emit-rmsnorm", "emit-fused_add_rmsnorm", "pretune-rmsnorm", "pretune-fused_add_rmsnorm",
             "replay-sync", "replay-background"]
    total_rows = total_lost = 0
    failures = []
    for rnd in range(args.rounds):
        t0 = time.time()
        work = tempfile.mkdtemp(prefix=f"round{rnd}-", dir=args.scratch)
        base = 10  # a fresh dir each round: the same M values, in a new seeded order
        writers = []
        for i, kind in enumerate(kinds):
            # Replays run the whole model at their M on the CPU: small M
            # (2 and 3; nobody else writes those). The rest: their own block.
            ms = [2 + i - 4] if kind.startswith("replay") else [base + i * 100 + j for j in range(args.rows)]
            rng.shuffle(ms)
            writers.append(start_writer(kind, args, work, ms, f"r{rnd}-{i}"))
        committed = set()
        for w in writers:
            rc = w.wait()
            if rc != 0:
                failures.append(f"round {rnd}: {w.kind} exited {rc}: {w.err[-400:]}")
            committed |= w.committed()
        tables, problems = read_files(work)
        lost = check_committed(committed, tables)
        left = leftovers(work)
        rc = subprocess.run([args.kdispatch, "validate", work], capture_output=True, text=True).returncode
        if rc != 0:
            problems.append(f"kdispatch validate {work} exited {rc}")
        per_kind = {w.kind: len(w.committed()) for w in writers}
        print(f"round {rnd:2d}: {len(committed)} rows committed by 6 writers {per_kind}, "
              f"{len(lost)} lost, {len(problems)} files not parsing, {len(left)} left over; {time.time() - t0:.1f} s",
              flush=True)
        for x in lost + problems + left:
            print("   ", x)
        if any(c == 0 for c in per_kind.values()):
            failures.append(f"round {rnd}: a writer committed nothing: {per_kind}")
        total_rows += len(committed)
        total_lost += len(lost)
        failures += [f"round {rnd}: {x}" for x in problems + left]
    print(f"concurrent: {args.rounds} rounds, 6 writers a round (tune --emit x2, pretune x2, replay --tune sync, "
          f"replay --tune background), {total_rows} rows committed, {total_lost} lost, "
          f"{len(failures)} other failures")
    return total_lost == 0 and not failures


def run_kill(args, rng):
    work = os.path.join(args.scratch, "kill-dir")
    os.makedirs(work, exist_ok=True)
    kinds = ["emit-rmsnorm", "emit-fused_add_rmsnorm", "pretune-rmsnorm", "pretune-fused_add_rmsnorm"]
    committed, torn, kills, it, inside = set(), [], 0, 0, 0
    next_m = 2
    t0 = time.time()
    # Big files make every write long (re-read, merge, render, fsync), so
    # that the kills land inside writes: one real row per op, then
    # --preload more rows in the same file (same metadata, so the same
    # fingerprint); those count as committed too.
    for op in NORM_OPS:
        w = start_writer(f"pretune-{op}", args, work, [1], f"seed-{op}")
        if w.wait() != 0:
            print(f"could not seed {op}: {w.out} {w.err}")
            return False
        committed |= w.committed()
    for root, _dirs, files in os.walk(work):
        for name in files:
            if name.endswith(".json"):
                path = os.path.join(root, name)
                with open(path) as f:
                    doc = json.load(f)
                row = doc["1"]
                for m in range(1_000_000, 1_000_000 + args.preload):
                    doc[str(m)] = row
                with open(path, "w") as f:
                    json.dump(doc, f)
                key = key_from_file(os.path.relpath(path, work))
                committed |= {(key, m) for m in range(1_000_000, 1_000_000 + args.preload)}
    while kills < args.kills:
        it += 1
        writers = []
        for i in range(3):
            kind = rng.choice(kinds)
            ms = list(range(next_m, next_m + args.rows))
            next_m += args.rows
            writers.append(start_writer(kind, args, work, ms, f"k{it}-{i}"))
        delay = rng.uniform(0.0, args.max_delay)
        time.sleep(delay)
        for w in writers:
            w.kill()
        for w in writers:
            w.wait()
            kills += w.killed
            committed |= w.committed()
        _tables, problems = read_files(work)
        torn += [f"after kill round {it} (delay {delay:.3f} s): {p}" for p in problems]
        inside += bool(leftovers(work, dead_claims_only=True))
    tables, problems = read_files(work)
    lost = check_committed(committed, tables)
    before = leftovers(work, dead_claims_only=True)
    # The next write into every file: temps of dead writers, their lock
    # files and claims must go.
    for op in NORM_OPS:
        w = start_writer(f"pretune-{op}", args, work, [next_m], f"final-{op}")
        next_m += 1
        if w.wait() != 0:
            problems.append(f"final write of {op} failed: {w.out} {w.err}")
    after = leftovers(work, dead_claims_only=True)
    print(f"kill: {kills} kill -9s of writers in {it} rounds (3 writers a round, killed after a seeded random "
          f"0-{args.max_delay:.2f} s), {len(committed)} rows committed before a kill, {len(lost)} lost, "
          f"{len(torn)} torn files seen after a kill, {inside} rounds whose kills left a lock/temp/claim file "
          f"(killed inside a write; cleaned by a later write), {len(before)} such files at the end, {len(after)} left "
          f"after the next write; {time.time() - t0:.1f} s")
    for x in lost + torn + problems + after:
        print("   ", x)
    return not lost and not torn and not problems and not after


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["concurrent", "kill"])
    ap.add_argument("--kdispatch", required=True, help="the kdispatch CLI")
    ap.add_argument("--probe", required=True, help="kdispatch_writer_probe (tests/safety/writer_probe.cpp)")
    ap.add_argument("--seed", type=int, default=None, help="default: random, printed")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--rows", type=int, default=8, help="M values per tune/pretune writer")
    ap.add_argument("--budget-ms", type=int, default=5)
    ap.add_argument("--preload", type=int, default=3000, help="kill mode: rows put in each file before the kills")
    ap.add_argument("--max-delay", type=float, default=0.25, help="kill mode: latest kill, s after the start")
    ap.add_argument("--scheme", choices=["auto", "flock", "fragments"], default="auto",
                    help="the writers' scheme (KDISPATCH_CACHE_LOCKING; auto: the flock check decides, flock on a "
                         "local disk); fragments: one file per writer process")
    args = ap.parse_args()
    if args.scheme != "auto":
        SCHEME_ENV["KDISPATCH_CACHE_LOCKING"] = args.scheme
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"stress_writers.py {args.mode} --scheme {args.scheme}: seed {seed} (replay: --seed {seed})", flush=True)
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="kdispatch-stress-") as scratch:
        args.scratch = scratch
        ok = run_concurrent(args, rng) if args.mode == "concurrent" else run_kill(args, rng)
    print("PASS" if ok else f"FAIL (seed {seed})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
