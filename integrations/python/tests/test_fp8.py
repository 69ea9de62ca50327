# SPDX-License-Identifier: Apache-2.0
"""fp8 from numpy: kdispatch.to_fp8 / from_fp8 (uint8 bit patterns) against
known values and every code, and the fp8 GEMMs through kdispatch.fp8 views
against a numpy float64 reference of the dequantised inputs."""

import unittest

import numpy as np

import kdispatch
from support import TempDirTest


class Fp8Conversion(unittest.TestCase):
    def test_known_values(self):
        self.assertEqual(kdispatch.to_fp8(np.float32([1.0, -2.0, 0.1, 448.0, 1e6]), "e4m3fn").tolist(),
                         [0x38, 0xC0, 0x1D, 0x7E, 0x7E])  # 0.1 -> 0.1015625; 1e6 saturates to 448
        self.assertEqual(kdispatch.to_fp8(np.float32([464.0, 465.0, -1e6]), "e4m3fn", saturate=False).tolist(),
                         [0x7E, 0x7F, 0xFF])  # the tie at 464 goes to the even code (448), as torch
        self.assertEqual(kdispatch.to_fp8(np.float32([1.0, 240.0, -0.0, 248.0]), "e4m3fnuz", saturate=False).tolist(),
                         [0x40, 0x7F, 0x00, 0x80])  # no -0; 0x80 is the one NaN
        self.assertEqual(kdispatch.to_fp8(np.float32([1.0, 57344.0, 61440.0, -np.inf]), "e5m2", saturate=False).tolist(),
                         [0x3C, 0x7B, 0x7C, 0xFC])
        self.assertTrue(np.isnan(kdispatch.from_fp8(kdispatch.to_fp8(np.float32([np.nan])), "e4m3fn")).all())
        self.assertEqual(kdispatch.from_fp8(np.uint8([0x01]), "e4m3fn")[0], 2.0 ** -9)

    def test_every_code_round_trips_and_midpoints_go_to_even(self):
        for fmt in ("e4m3fn", "e4m3fnuz", "e5m2"):
            codes = np.arange(256, dtype=np.uint8)
            vals = kdispatch.from_fp8(codes, fmt)
            ok = np.isfinite(vals) & ~((fmt == "e4m3fnuz") & (codes == 0x80))
            np.testing.assert_array_equal(kdispatch.to_fp8(vals[ok], fmt), codes[ok], err_msg=fmt)
            # Midpoints between consecutive positive codes: the even code.
            pos = codes[(codes < 0x80) & np.isfinite(vals)]
            lo, hi = pos[:-1], pos[1:]
            mid = ((vals[lo].astype(np.float64) + vals[hi]) / 2).astype(np.float32)
            want = np.where(lo % 2 == 0, lo, hi)
            np.testing.assert_array_equal(kdispatch.to_fp8(mid, fmt), want, err_msg=fmt)

    def test_views_need_one_byte_elements(self):
        with self.assertRaises(TypeError):
            kdispatch.fp8(np.zeros(4, np.float32))
        with self.assertRaises(ValueError):
            kdispatch.fp8(np.zeros(4, np.uint8), "e3m4")
        self.assertEqual(kdispatch.fp8(np.zeros((2, 3), np.uint8)).shape, (2, 3))


class Fp8Gemm(TempDirTest):
    def test_block_scales_against_numpy(self):
        rng = np.random.default_rng(1)
        m, n, k = 5, 136, 264  # partial 128-blocks along N and K
        a8 = kdispatch.to_fp8(rng.uniform(-2, 2, (m, k)).astype(np.float32))
        b8 = kdispatch.to_fp8(rng.uniform(-2, 2, (n, k)).astype(np.float32))
        kb, nb = -(-k // 128), -(-n // 128)
        sa = np.full((kb, 8), np.nan, np.float32)  # M-major, row stride 8 (a multiple of 4); padding unread
        sa[:, :m] = rng.uniform(0.5, 2, (kb, m))
        sb = rng.uniform(0.5, 2, (nb, kb)).astype(np.float32)
        d = np.full((m, n), np.nan, np.float32)
        rt = self.quiet_runtime()
        rt.gemm_fp8_block(kdispatch.fp8(a8), kdispatch.fp8(b8), d, sa[:, :m], sb, None)
        af, bf = kdispatch.from_fp8(a8).astype(np.float64), kdispatch.from_fp8(b8).astype(np.float64)
        want = np.zeros((m, n))
        for g in range(kb):
            s = slice(g * 128, min(k, (g + 1) * 128))
            want += (af[:, s] @ bf[:, s].T) * sa[g, :m][:, None] * np.repeat(sb[:, g], 128)[:n][None, :]
        np.testing.assert_allclose(d, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())

    def test_fast_accum_switch(self):
        """fast_accum: a keyword after bias (default False) of the fp8 GEMM
        methods. The CPU accumulates in fp32 either way (the same bits); a
        fast call has its own key (accum=fast) and its own tuned row; a
        value other than 0/1 is refused, naming it."""
        import inspect
        rt = self.quiet_runtime()
        params = inspect.signature(rt.gemm_fp8_tensor).parameters
        self.assertEqual(list(params)[:7], ["a", "b", "d", "scale_a", "scale_b", "bias", "fast_accum"])
        self.assertIs(params["fast_accum"].default, False)
        from kdispatch._runtime import ops
        self.assertEqual(ops()["gemm_fp8_block"]["scalars"],
                         [{"name": "fast_accum", "default": 0, "kind": "bool"}])
        rng = np.random.default_rng(3)
        m, n, k = 3, 64, 256
        a8 = kdispatch.fp8(kdispatch.to_fp8(rng.uniform(-2, 2, (m, k)).astype(np.float32)))
        b8 = kdispatch.fp8(kdispatch.to_fp8(rng.uniform(-2, 2, (n, k)).astype(np.float32)))
        sa, sb = np.float32([0.5]), np.float32([2.0])
        d0, d1 = np.full((m, n), np.nan, np.float32), np.full((m, n), np.nan, np.float32)
        i0 = rt.gemm_fp8_tensor(a8, b8, d0, sa, sb, info=True)
        i1 = rt.gemm_fp8_tensor(a8, b8, d1, sa, sb, fast_accum=True, info=True)
        np.testing.assert_array_equal(d0, d1)
        self.assertEqual(i0["variant"], i1["variant"])
        r = rt.pretune("gemm_fp8_tensor", a8, b8, d1, sa, sb, fast_accum=True)
        self.assertTrue(r["key"].endswith("|K=256,N=64,accum=fast,dtype=fp8_e4m3fn,out_dtype=fp32"), r["key"])
        self.assertEqual(rt.gemm_fp8_tensor(a8, b8, d1, sa, sb, None, True, info=True)["source"], "table")
        self.assertEqual(rt.gemm_fp8_tensor(a8, b8, d0, sa, sb, info=True)["source"], "default")
        with self.assertRaises(kdispatch.Error) as c:
            rt.gemm_fp8_tensor(a8, b8, d0, sa, sb, fast_accum=0.5)
        self.assertIs(c.exception.code, kdispatch.StatusCode.invalid_argument)
        self.assertIn("fast_accum: must be 0 or 1", str(c.exception))

    def test_formats_are_the_librarys_fp8_dtypes(self):
        """FORMATS and _ALIASES keep their own list of the library's fp8
        dtypes (its dtype table, src/core/dtype_table.hpp): each format's
        DLPack code must be read as the dtype fp8_<format>, which the
        library names in its mixed-dtype error. (tests/test_dtype_table.cpp
        compares the rest of each format with the table: exponent bits, bias,
        finiteness, unsigned zero, the aliases.)"""
        from kdispatch._fp8 import FORMATS, _ALIASES
        rt = self.quiet_runtime()
        b = np.zeros((4, 16), np.float32)
        d = np.zeros((2, 4), np.float32)
        for fmt in FORMATS:
            with self.assertRaises(kdispatch.Error) as c:
                rt.gemm(kdispatch.fp8(np.zeros((2, 16), np.uint8), fmt), b, d)
            self.assertIn(f"a is fp8_{fmt} but b is fp32: mixed input dtypes", str(c.exception))
        for alias, fmt in _ALIASES.items():
            self.assertEqual(alias.split("_", 1)[1], fmt)
            self.assertEqual(kdispatch.fp8(np.zeros(1, np.uint8), alias).format, fmt)

    def test_fp8_needs_the_view(self):
        rt = self.quiet_runtime()
        a = np.zeros((2, 16), np.uint8)
        d = np.zeros((2, 4), np.float32)
        s = np.ones(1, np.float32)
        with self.assertRaises(kdispatch.Error) as c:  # raw uint8: not taken for fp8
            rt.gemm_fp8_tensor(a, np.zeros((4, 16), np.uint8), d, s, s, None)
        self.assertIn('needs its format named (Python: kdispatch.fp8(array, "e4m3fn"))', str(c.exception))


if __name__ == "__main__":
    unittest.main()
