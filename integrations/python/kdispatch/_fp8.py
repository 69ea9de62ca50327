# SPDX-License-Identifier: Apache-2.0
"""fp8 arrays for numpy users: numpy has no fp8 dtype, so fp8 data lives
in uint8 arrays (one byte per element, the format's bit pattern) and is
passed to kdispatch through `fp8(array, format)`, which names the format:

    a8 = kdispatch.to_fp8(a, "e4m3fn")            # float -> uint8 bits (saturating)
    rt.gemm_fp8_tensor(kdispatch.fp8(a8), kdispatch.fp8(b8), d, sa, sb, None)
    kdispatch.from_fp8(a8, "e4m3fn")              # uint8 bits -> float32 (exact)

Formats: "e4m3fn" (Hopper's, torch.float8_e4m3fn; max 448), "e4m3fnuz"
(gfx94x's; max 240), "e5m2" (max 57344). Rounding is to nearest, ties to
even, as the library's own conversion (src/core/numeric.hpp): saturating
(the default: the clamp vLLM's and SGLang's quantisation kernels apply; a
NaN stays NaN) or overflowing as torch's `.to(torch.float8_*)` (NaN for
the finite formats, inf for e5m2; e4m3fn's tie at 464 rounds to 448).
"""

import numpy as np

# name -> (exponent bits, bias, finite (no inf), unsigned zero, DLPack 1.1 type code)
FORMATS = {
    "e4m3fn": (4, 7, True, False, 10),
    "e4m3fnuz": (4, 8, True, True, 11),
    "e5m2": (5, 15, False, False, 12),
}
_ALIASES = {"fp8_e4m3fn": "e4m3fn", "float8_e4m3fn": "e4m3fn", "fp8_e4m3fnuz": "e4m3fnuz",
            "float8_e4m3fnuz": "e4m3fnuz", "fp8_e5m2": "e5m2", "float8_e5m2": "e5m2"}


def _format(name):
    key = _ALIASES.get(name, name)
    if key not in FORMATS:
        raise ValueError(f"fp8 format {name!r} is not one of {', '.join(FORMATS)}")
    return key


def _decode_table(name):
    """float32[256]: every code's value (NaN codes decode to NaN)."""
    e_bits, bias, fn, uz, _ = FORMATS[name]
    m_bits = 7 - e_bits
    out = np.empty(256, np.float64)
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> m_bits) & ((1 << e_bits) - 1)
        m = b & ((1 << m_bits) - 1)
        e_max = (1 << e_bits) - 1
        if uz and b == 0x80:
            v = np.nan
        elif not fn and e == e_max:
            v = sign * np.inf if m == 0 else np.nan
        elif fn and not uz and e == e_max and m == (1 << m_bits) - 1:
            v = np.nan
        elif e == 0:
            v = sign * m * 2.0 ** (1 - bias - m_bits)
        else:
            v = sign * (1 + m / (1 << m_bits)) * 2.0 ** (e - bias)
        out[b] = v
    return out.astype(np.float32)


_TABLES = {name: _decode_table(name) for name in FORMATS}


def max_finite(format="e4m3fn"):
    """The largest finite value of the format (448, 240, 57344)."""
    t = _TABLES[_format(format)]
    return float(np.nanmax(t[np.isfinite(t)]))


def from_fp8(bits, format="e4m3fn"):
    """uint8 fp8 bit patterns -> float32 values (exact)."""
    b = np.asarray(bits)
    if b.dtype not in (np.uint8, np.int8):
        raise TypeError(f"fp8 bits must be uint8 (or int8), got {b.dtype}")
    return _TABLES[_format(format)][b.view(np.uint8)]


def to_fp8(x, format="e4m3fn", saturate=True):
    """Float values -> uint8 fp8 bit patterns, round to nearest even.
    saturate=True: beyond the largest finite value (and +-inf) -> +-max;
    False: overflow as torch (NaN, or inf for e5m2). NaN -> NaN."""
    name = _format(format)
    _, _, fn, uz, _ = FORMATS[name]
    table = _TABLES[name]
    x = np.asarray(x, np.float32)
    # The non-negative finite codes, ascending (codes 0..max in order).
    pos = np.arange(128)
    pos = pos[np.isfinite(table[pos])]
    vals = table[pos].astype(np.float64)
    mx = vals[-1]
    a = np.abs(x.astype(np.float64))
    nan = np.isnan(a)
    half_ulp = (vals[-1] - vals[-2]) / 2
    # The tie past max goes to the even code: max itself when its code is even (e4m3fn's 0x7e).
    over = ((a > mx + half_ulp) | ((a == mx + half_ulp) & (pos[-1] % 2 == 1))) & ~nan
    a = np.where(nan, 0.0, np.minimum(a, mx))
    hi = np.clip(np.searchsorted(vals, a, side="left"), 0, len(vals) - 1)
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - vals[lo], vals[hi] - a
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (pos[hi] % 2 == 0))
    code = np.where(take_hi, pos[hi], pos[lo]).astype(np.uint8)
    neg = np.signbit(x)
    if uz:
        code = np.where(neg & (code != 0), code | 0x80, code)
    else:
        code = np.where(neg, code | 0x80, code)
    if not saturate:
        over_code = (np.uint8(0x80) if uz else np.where(neg, 0xFF, 0x7F)) if fn else np.where(neg, 0xFC, 0x7C)
        code = np.where(over, over_code, code)
    nan_code = np.uint8(0x80) if uz else np.where(np.signbit(x), 0xFF, 0x7F)
    return np.where(nan, nan_code, code).astype(np.uint8)


class Fp8:
    """A uint8 array whose bytes are fp8 values of `format`: what the ops'
    fp8 arguments take from numpy (the array is passed as it is, no copy)."""

    __slots__ = ("array", "format", "dl_code")
    _kdispatch_fp8 = True  # what the bindings look for

    def __init__(self, array, format="e4m3fn"):
        name = _format(format)
        if getattr(array, "dtype", None) is None or getattr(array.dtype, "itemsize", 0) != 1:
            raise TypeError(f"fp8({format!r}): the array must have 1-byte elements (uint8), got "
                            f"{getattr(array, 'dtype', type(array).__name__)}")
        self.array = array
        self.format = name
        self.dl_code = FORMATS[name][4]

    @property
    def shape(self):
        return self.array.shape

    def __repr__(self):
        return f"kdispatch.fp8({self.format}, shape={tuple(self.array.shape)})"


def fp8(array, format="e4m3fn"):
    """`array` (uint8 bit patterns) as fp8 `format` for a kdispatch op."""
    return Fp8(array, format)
