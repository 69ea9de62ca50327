# SPDX-License-Identifier: Apache-2.0
"""Every op of the library's op list, through its generated Python method:
arrays shaped from the op's row (its args' dims), outputs poisoned (NaN),
one call (every output element written, finite, inputs untouched), the
info dict, and pretune then a table hit. An op added to the library is
tested here with no new test code."""

import math
import unittest

import numpy as np

import kdispatch
from kdispatch._runtime import ops as op_rows
from support import TempDirTest


def extent(e, dims):
    if not e["dim"]:
        return None
    v = dims[e["dim"]] * e["mul"]
    return v if e["div"] == 1 else -(-v // e["div"])


def fp8_input(op):
    """Whether `op`'s inputs are fp8 (its only input dtypes are fp8 formats):
    its "in" arguments are then uint8 bit patterns passed as kdispatch.fp8
    views, its "out" arguments float32."""
    return all(t.startswith("fp8_") for t in op["in_dtypes"]) and bool(op["in_dtypes"])


def fp8_arg(op, a):
    """Whether argument `a` of `op` holds fp8 here: an fp8 op's inputs, or
    the outputs of an op whose outputs default to fp8 (the quantisation ops)."""
    if a["dtype"] == "in":
        return fp8_input(op)
    return a["dtype"] == "out" and op["default_out_dtype"].startswith("fp8_")


def arrays_for(op, m=3, other=8, seed=0):
    """{arg name: array} for `op` at batch size m, every other dim `other`;
    outputs full of NaN, inputs random; absent: optional args. float32,
    except an fp8 op's inputs (uint8 e4m3fn bits: wrap with args_of)."""
    rng = np.random.default_rng(seed)
    none = {"dim": "", "mul": 1, "div": 1}
    names = {e["dim"] for a in op["args"] for e in (a.get("batch", none), a["rows"], a["cols"])
             if e["dim"] and not a.get("computed")}
    names |= {x["dim"] for x in op["scalars"] if x.get("kind") == "int"}  # sizes no array carries
    dims = {d: (m if d == op["m_name"] else other) for d in names}
    out = {}
    for a in op["args"]:
        if a["optional"]:
            continue
        if a.get("computed"):  # a size the op computes (moe_align's sorted ids): its formula
            shape = (eval(a["cols"]["dim"], {"min": min, "ceil": math.ceil}, dict(dims)),)
        else:
            shape = tuple(x for x in (extent(a.get("batch", none), dims), extent(a["rows"], dims),
                                      extent(a["cols"], dims)) if x is not None) or (1,)
        if a["dtype"] == "int32" and a["written"]:  # moe_align's outputs: written over -7
            out[a["name"]] = np.full(shape, -7, np.int32)
        elif a["dtype"] == "int32":  # expert ids: in [0, E)
            out[a["name"]] = rng.integers(0, dims["E"], size=shape, dtype=np.int32)
        elif a["written"] and not a["read"]:
            out[a["name"]] = np.full(shape, 0x7F, np.uint8) if fp8_arg(op, a) else np.full(shape, np.nan, np.float32)
        else:
            v = (rng.standard_normal(shape) * 0.5 + (1.0 if a["rank"] == 1 else 0.0)).astype(np.float32)
            out[a["name"]] = kdispatch.to_fp8(v) if fp8_arg(op, a) else v
    if "sorted_token_ids" in out and out["sorted_token_ids"][0] != -7:  # moe_gemm reads moe_align's outputs
        align_into(out, dims["M"], dims["top_k"], dims["E"], dims["block_size"], rng)
    return out


def align_into(out, m, top_k, experts, block, rng):
    """moe_align's outputs (sorted ids, each block's expert, the padded
    count) for a routing of m tokens x top_k distinct experts, written into
    out's arrays: what moe_gemm reads."""
    ids = np.concatenate([rng.permutation(experts)[:top_k] for _ in range(m)])
    sorted_ids, blocks = [], []
    for e in range(experts):
        mine = [i for i in range(len(ids)) if ids[i] == e]
        mine += [m * top_k] * (-len(mine) % block)
        sorted_ids += mine
        blocks += [e] * (len(mine) // block)
    out["sorted_token_ids"][:] = m * top_k
    out["sorted_token_ids"][:len(sorted_ids)] = sorted_ids
    out["expert_ids"][:] = -1
    out["expert_ids"][:len(blocks)] = blocks
    out["num_tokens_post_pad"][:] = len(sorted_ids)


def args_of(op, arrays, optional=True):
    """The op's positional arguments from arrays_for's dict (fp8 inputs as
    kdispatch.fp8 views; absent optional arguments None)."""
    out = []
    for x in op["args"]:
        if x["optional"] and not optional:
            continue
        v = arrays.get(x["name"])
        out.append(kdispatch.fp8(v) if v is not None and fp8_arg(op, x) else v)
    return out


class EveryOp(TempDirTest):
    def test_the_op_list_names_every_op(self):
        rows = op_rows()
        for name in ("gemm", "rmsnorm", "fused_add_rmsnorm", "silu_and_mul"):
            self.assertIn(name, rows)
            self.assertTrue(callable(getattr(kdispatch.Runtime, name)))
            self.assertIn(rows[name]["doc"].split(":")[0][:8], getattr(kdispatch.Runtime, name).__doc__)

    def test_each_op_runs_writes_every_output_and_hits_after_pretune(self):
        rt = self.quiet_runtime(tune_options=dict(time_budget_ms=20, reps=1, cold_cache=False))
        for name, op in op_rows().items():
            with self.subTest(op=name):
                a = arrays_for(op)
                before = {k: v.copy() for k, v in a.items()}
                args = args_of(op, a)
                kw = {x["name"]: 8 for x in op["scalars"] if x.get("kind") == "int"}  # arrays_for's other dims
                info = getattr(rt, name)(*args, info=True, **kw)
                self.assertEqual(info["source"], "default")
                for x in op["args"]:
                    v = a.get(x["name"])
                    if v is None:
                        continue
                    if x["written"]:
                        got = kdispatch.from_fp8(v) if fp8_arg(op, x) else v  # fp8's poison 0x7f decodes to NaN
                        self.assertTrue(np.isfinite(got).all(), f"{name}: {x['name']} has unwritten or non-finite elements")
                        self.assertFalse((got == -7).any() if got.dtype == np.int32 else False, f"{name}: {x['name']}")
                    else:
                        np.testing.assert_array_equal(v, before[x["name"]])
                # pretune (scalars and optional args by keyword), then the same call hits.
                r = rt.pretune(name, *args_of(op, a, optional=False), **kw)
                self.assertTrue(r["persisted"])
                self.assertTrue(r["key"].startswith(f"cpu/{name}|"))
                fresh = arrays_for(op)
                info = getattr(rt, name)(*args_of(op, fresh), info=True, **kw)
                self.assertEqual(info["source"], "table")
                self.assertEqual(info["M"], 3)

    def test_moe_sum_against_numpy(self):
        """rt.moe_sum(input, out, routed_scaling_factor): out = factor * input.sum(1),
        input [M, top_k, hidden], j summed in order in float32 (exact here: small
        integers), top_k = 1 a scaled copy."""
        rt = self.quiet_runtime()
        rng = np.random.default_rng(3)
        for top_k in (1, 3, 8):
            with self.subTest(top_k=top_k):
                x = rng.integers(-8, 8, size=(5, top_k, 37)).astype(np.float32)
                out = np.full((5, 37), np.nan, np.float32)
                rt.moe_sum(x, out, 2.5)
                np.testing.assert_array_equal(out, 2.5 * x.sum(axis=1))
        with self.assertRaises(kdispatch.Error) as c:
            rt.moe_sum(np.ones((2, 3, 4), np.float32), np.empty((2, 5), np.float32), 1.0)
        self.assertIn("out", str(c.exception))

    def test_wrong_argument_counts_are_type_errors(self):
        rt = self.quiet_runtime()
        for name in op_rows():
            with self.subTest(op=name):
                with self.assertRaises(TypeError):
                    getattr(rt, name)()
                with self.assertRaises(TypeError):
                    rt.pretune(name)


if __name__ == "__main__":
    unittest.main()


class CallCost(unittest.TestCase):
    def test_numpy_rmsnorm_call_cost_is_printed(self):
        """rt.rmsnorm(x, x, w, eps), x float32 [1, 64]: the median host time
        per call, kernel included, over 15 rounds of 2000 calls; printed
        (target <= 3 us on the CI machine with the pybind11 layer), never
        asserted. The value check keeps the loop honest."""
        import statistics
        import sys
        import time
        rt = kdispatch.Runtime(shipped_configs=False, log_level="off")
        try:
            x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
            w = np.ones(64, np.float32)
            for _ in range(500):
                rt.rmsnorm(x, x, w, 1e-6)
            per_call = []
            for _ in range(15):
                t0 = time.perf_counter()
                for _ in range(2000):
                    rt.rmsnorm(x, x, w, 1e-6)
                per_call.append((time.perf_counter() - t0) / 2000 * 1e6)
            sys.stderr.write(f"\nnumpy rt.rmsnorm(x, x, w) [1, 64] float32 ({kdispatch.BACKEND} layer): "
                             f"{statistics.median(per_call):.2f} us per call (median of 15 rounds x 2000)\n")
            # the normalised row is a fixed point: rmsnorm of a unit-RMS row with w = 1
            np.testing.assert_allclose(np.sqrt(np.mean(x.astype(np.float64) ** 2)), 1.0, rtol=1e-5)
        finally:
            rt.close()
