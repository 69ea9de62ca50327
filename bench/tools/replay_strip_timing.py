#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Usage: bench/tools/replay_strip_timing.py replay.json > stripped.json (issue 34 item 6).
# Drops the timing fields of `kdispatch replay --json` (us_per_call, init_s, warmup_s,
# run_s) and writes the config paths relative to their configs/ dir.
import json, re, sys
T = {"us_per_call", "init_s", "run_s", "warmup_s"}
def strip(o):
    if isinstance(o, dict):
        return {re.sub(r"^/.*?/configs/", "configs/", k): strip(v) for k, v in o.items() if k not in T}
    if isinstance(o, list):
        return [strip(v) for v in o]
    if isinstance(o, str):
        return re.sub(r"^/.*?/configs/", "configs/", o)
    return o
json.dump(strip(json.load(open(sys.argv[1]))), sys.stdout, indent=1, sort_keys=True)
