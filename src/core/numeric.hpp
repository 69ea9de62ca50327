// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — scalar conversions between fp32 and the 16-bit float
// formats, on raw uint16_t storage (no dependency on a compiler's __bf16 or
// _Float16, so every TU, test and tool can use them on any x86-64 or aarch64).
//
// - bf16: round-to-nearest-even; NaN stays NaN (quietened, sign and top
//   payload bits kept); ±inf and signed zeros exact; subnormals kept
//   (no flush to zero).
// - fp16: IEEE binary16, round-to-nearest-even, overflow to ±inf, gradual
//   underflow to subnormals, NaN stays NaN (quietened, top payload bits kept).
//
// Both directions are constexpr and branch-light; the CPU kernels have their
// own SIMD versions of the same rules (kernels/cpu/*), and the tests compare
// those against these.
#pragma once

#include <bit>
#include <cstdint>

namespace dispatch::core {

/// bf16 bits -> float (exact).
constexpr float bf16_to_float(uint16_t h) noexcept { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

/// float -> bf16 bits, round to nearest even; NaN preserved (quiet bit set).
constexpr uint16_t float_to_bf16(float f) noexcept {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the lowest kept bit rounds ties to even; a carry out
  // of the mantissa correctly bumps the exponent (up to inf).
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// Rounds a float to the nearest bf16 value, returned as a float.
constexpr float round_to_bf16(float f) noexcept { return bf16_to_float(float_to_bf16(f)); }

/// fp16 bits -> float (exact, subnormals included).
constexpr float fp16_to_float(uint16_t h) noexcept {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in fp32.
  const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
}

/// float -> fp16 bits, round to nearest even (F. Giesen's float_to_half_fast3_rtne).
constexpr uint16_t float_to_fp16(float f) noexcept {
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t out = 0;
  if (u >= (127u + 16u) << 23) {  // >= 65536 (rounds to inf), inf or NaN
    out = u > 0x7f800000u ? (0x7e00u | ((u >> 13) & 0x3ffu)) : 0x7c00u;
  } else if (u < (127u - 14u) << 23) {  // result is subnormal or zero
    // Adding 0.5 (as a float with the exponent that puts fp16's subnormal
    // unit at fp32's last mantissa bit) lets the FPU do the RNE rounding.
    constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    const float sum = std::bit_cast<float>(u) + std::bit_cast<float>(kDenormMagic);
    out = std::bit_cast<uint32_t>(sum) - kDenormMagic;
  } else {  // normal: rebias the exponent and round the 13 dropped bits to even
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    u += mant_odd;
    out = u >> 13;  // a carry into the exponent overflows to inf, as it should
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

/// fp8 bits -> float (exact): e4m3fn (bias 7, no inf, NaN = S.1111.111),
/// e4m3fnuz (bias 8, no inf, no -0: 0x80 is the NaN), e5m2 (bias 15, IEEE-like).
constexpr float fp8_to_float(uint8_t b, int exp_bits, int bias, bool fn, bool uz) noexcept {
  if (uz && b == 0x80u) return std::bit_cast<float>(0x7fc00000u);
  const int man_bits = 7 - exp_bits;
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const int e = (b >> man_bits) & ((1 << exp_bits) - 1);
  const uint32_t m = b & ((1u << man_bits) - 1u);
  const int e_max = (1 << exp_bits) - 1;
  if (!fn && e == e_max) return std::bit_cast<float>(sign | 0x7f800000u | (m << (23 - man_bits)));  // inf / NaN
  if (fn && !uz && e == e_max && m == (1u << man_bits) - 1u) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (e != 0) return std::bit_cast<float>(sign | static_cast<uint32_t>(e - bias + 127) << 23 | (m << (23 - man_bits)));
  float mag = static_cast<float>(m);  // subnormal: m * 2^(1 - bias - man_bits)
  for (int i = 0; i < bias - 1 + man_bits; ++i) mag *= 0.5f;
  return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
}

/// An fp8 format's parameters, as fp8_to_float and float_to_fp8 take them.
struct Fp8Format {
  int exp_bits = 4;
  int bias = 7;
  bool fn = true;   ///< finite: no inf (e4m3fn, e4m3fnuz)
  bool uz = false;  ///< unsigned zero: no -0, 0x80 is the one NaN (e4m3fnuz)
  /// The largest finite magnitude: 448 (e4m3fn), 240 (e4m3fnuz), 57344 (e5m2).
  constexpr float max_finite() const noexcept {
    const int man_bits = 7 - exp_bits;
    const int e_max = (1 << exp_bits) - 1;
    // e4m3fn: the top exponent holds numbers but its all-ones mantissa is
    // NaN; e4m3fnuz: the top exponent is all numbers; e5m2: IEEE-like.
    const int e = fn ? e_max : e_max - 1;
    const int m = fn && !uz ? (1 << man_bits) - 2 : (1 << man_bits) - 1;
    float v = 1.0f + static_cast<float>(m) / static_cast<float>(1 << man_bits);
    for (int i = 0; i < e - bias; ++i) v *= 2.0f;
    return v;
  }
};
inline constexpr Fp8Format kE4m3fn{4, 7, true, false};
inline constexpr Fp8Format kE4m3fnuz{4, 8, true, true};
inline constexpr Fp8Format kE5m2{5, 15, false, false};

constexpr float fp8_to_float(uint8_t b, const Fp8Format& f) noexcept {
  return fp8_to_float(b, f.exp_bits, f.bias, f.fn, f.uz);
}

/// float -> fp8 bits, round to nearest even.
/// - saturate = true (what vLLM's and SGLang's quantisation kernels do, and
///   Hopper's cvt.rn.satfinite): a finite value beyond the largest finite
///   one and ±inf give ±max_finite; NaN gives NaN.
/// - saturate = false (torch's `.to(torch.float8_*)`): a magnitude that
///   rounds past max_finite overflows: to NaN for the finite formats, to
///   ±inf for e5m2. The tie at max_finite + half an ulp goes to the even
///   code: e4m3fn's max (0x7e) is even, so 464 gives 448 and above 464 is
///   NaN, as torch; e4m3fnuz's and e5m2's maxima are odd codes, so 248 and
///   61440 overflow.
/// For finite values and infinities the saturating mode is the clamp
/// vLLM's and SGLang's kernels apply; a NaN stays NaN here (their
/// fminf/fmaxf clamp turns it into +max).
/// e4m3fnuz has no -0: negative values that round to zero give 0x00.
constexpr uint8_t float_to_fp8(float x, const Fp8Format& f, bool saturate) noexcept {
  const int man_bits = 7 - f.exp_bits;
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint8_t nan = f.uz ? uint8_t{0x80} : static_cast<uint8_t>(sign | 0x7fu);  // e5m2: S.11111.11, as torch
  if ((u & 0x7fffffffu) > 0x7f800000u) return nan;
  const float max = f.max_finite();
  // The top binade's unit in the last place, halved: max has exponent e_top.
  float half_ulp = max;
  {
    const uint32_t mb = std::bit_cast<uint32_t>(max);
    half_ulp = std::bit_cast<float>(mb & 0x7f800000u);  // 2^e_top
    for (int i = 0; i <= man_bits; ++i) half_ulp *= 0.5f;
  }
  const float mag_in = std::bit_cast<float>(u & 0x7fffffffu);
  float mag = mag_in;
  if (mag > max) {
    if (saturate) {
      mag = max;
    } else if (mag > max + half_ulp || (mag == max + half_ulp && !(f.fn && !f.uz))) {
      // Past the tie, or on it when max's code is odd (e4m3fnuz, e5m2): the
      // tie rounds to even, which for e4m3fn is max itself (0x7e).
      return f.fn ? nan : static_cast<uint8_t>(sign | 0x7cu);  // NaN, or e5m2's inf
    }
  }
  // The quantum of mag's binade (subnormal binade below 2^(1 - bias)), then
  // an exact division by a power of two and a round to nearest even.
  const uint32_t mbits = std::bit_cast<uint32_t>(mag);
  int e = static_cast<int>(mbits >> 23) - 127;  // fp32 subnormals: far below any fp8 value
  if (e < 1 - f.bias) e = 1 - f.bias;
  float q = 1.0f;  // 2^(e - man_bits)
  for (int i = 0; i < man_bits - e; ++i) q *= 0.5f;
  for (int i = 0; i < e - man_bits; ++i) q *= 2.0f;
  const float t = mag / q;  // exact: mag has 24 bits, q a power of two in range
  uint32_t n = static_cast<uint32_t>(t);
  const float frac = t - static_cast<float>(n);
  if (frac > 0.5f || (frac == 0.5f && (n & 1u))) ++n;
  // n = the significand in units of q: below 2^man_bits only in the
  // subnormal binade; code = (biased exponent << man_bits) + mantissa, and
  // both cases (and a carry to the next binade) are this one sum.
  const uint32_t base =
      e == 1 - f.bias && n < (1u << man_bits) ? 0u : static_cast<uint32_t>(e + f.bias - 1) << man_bits;
  const uint32_t code = base + n;
  if (code == 0) return f.uz ? uint8_t{0} : sign;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace dispatch::core
