#!/usr/bin/env python3
"""Builds the fuzz seed corpus (tests/fuzz/corpus) from real config files.

Each seed is one harness input: the file's path relative to its config dir on
the first line, then the file's content cut to its first --rows rows (the
metadata keys kept), so the corpus stays small. Sources: the SGLang tuning
files in ../shared/data (read in place; only these excerpts are committed)
and this repository's configs/. Every seed's origin is written to
tests/fuzz/ORIGINS.tsv. After writing, minimise with libFuzzer:
  build/fuzz/tests/fuzz/fuzz_config -merge=1 tests/fuzz/corpus /tmp/candidates
Usage: tests/fuzz/make_seeds.py --shared ../shared --out /tmp/candidates
"""
import argparse
import hashlib
import json
import os
import sys


def excerpt(text, rows):
    try:
        doc = json.loads(text)
    except ValueError:
        return text  # keep broken files whole: they are seeds too
    if not isinstance(doc, dict):
        return text
    out, n = {}, 0
    for k, v in doc.items():
        if k.strip().isdigit():
            if n >= rows:
                continue
            n += 1
        out[k] = v
    return json.dumps(out, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "../../../shared"))
    ap.add_argument("--repo", default=os.path.join(os.path.dirname(__file__), "../.."))
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", type=int, default=3)
    a = ap.parse_args()
    roots = [(os.path.join(a.shared, "data/sglang-configs"), "shared/data/sglang-configs"),
             (os.path.join(a.repo, "configs"), "configs")]
    os.makedirs(a.out, exist_ok=True)
    origins = []
    for root, label in roots:
        if not os.path.isdir(root):
            sys.exit(f"make_seeds.py: {root} is not a directory")
        for dirpath, _, files in sorted(os.walk(root)):
            for f in sorted(files):
                if not f.endswith(".json"):
                    continue
                full = os.path.join(dirpath, f)
                rel = os.path.relpath(full, root)
                # The loader sees a path relative to the config dir: keep the
                # last three components (backend/op/name, triton_X/name).
                parts = rel.split(os.sep)[-3:]
                with open(full, encoding="utf-8", errors="replace") as fh:
                    body = excerpt(fh.read(), a.rows)
                data = ("/".join(parts) + "\n" + body).encode()
                name = hashlib.sha1(data).hexdigest()
                with open(os.path.join(a.out, name), "wb") as fh:
                    fh.write(data)
                origins.append(f"{name}\t{label}/{rel}")
    with open(os.path.join(a.out, "ORIGINS.tsv"), "w") as fh:
        fh.write("seed\torigin (first %d rows of)\n" % a.rows)
        fh.write("\n".join(origins) + "\n")
    print(f"{len(origins)} candidate seeds in {a.out}")


if __name__ == "__main__":
    main()
