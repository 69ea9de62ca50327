// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — element types of the memory-bound kernels (the
// norms, silu_and_mul), written once for CUDA and HIP (gpu/port.hpp): a
// 16-byte chunk unpacked to floats and packed back (rounded to nearest
// even), and one element at a time. 16-bit floats are raw bits (uint16_t).
#pragma once

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#if !KDISPATCH_GPU_HIP
#include <cuda_fp8.h>
#endif

namespace dispatch::KDISPATCH_GPU_NS {

template <DType DT>
struct Elem;

template <>
struct Elem<DType::fp32> {
  using S = float;
  static constexpr int kVec = 4;  // elements per 16-byte chunk
  static KDISPATCH_DEVICE_INLINE void unpack(const uint4& c, float (&f)[4]) {
    f[0] = port::bits_to_float(c.x), f[1] = port::bits_to_float(c.y);
    f[2] = port::bits_to_float(c.z), f[3] = port::bits_to_float(c.w);
  }
  static KDISPATCH_DEVICE_INLINE uint4 pack(const float (&f)[4]) {
    return make_uint4(port::float_to_bits(f[0]), port::float_to_bits(f[1]), port::float_to_bits(f[2]),
                      port::float_to_bits(f[3]));
  }
  static KDISPATCH_DEVICE_INLINE float load1(const S* p) { return *p; }
  static KDISPATCH_DEVICE_INLINE void store1(S* p, float v) { *p = v; }
  static KDISPATCH_DEVICE_INLINE float round1(float v) { return v; }
};

template <float2 (*kWiden)(uint32_t), uint32_t (*kNarrow)(float, float)>
struct Half16 {
  using S = uint16_t;
  static constexpr int kVec = 8;
  static KDISPATCH_DEVICE_INLINE void unpack(const uint4& c, float (&f)[8]) {
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = kWiden(w[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
  static KDISPATCH_DEVICE_INLINE uint4 pack(const float (&f)[8]) {
    return make_uint4(kNarrow(f[0], f[1]), kNarrow(f[2], f[3]), kNarrow(f[4], f[5]), kNarrow(f[6], f[7]));
  }
  static KDISPATCH_DEVICE_INLINE float load1(const S* p) { return kWiden(static_cast<uint32_t>(*p)).x; }
  static KDISPATCH_DEVICE_INLINE void store1(S* p, float v) { *p = static_cast<S>(kNarrow(v, 0.f) & 0xffffu); }
  static KDISPATCH_DEVICE_INLINE float round1(float v) { return kWiden(kNarrow(v, 0.f) & 0xffffu).x; }
};

template <>
struct Elem<DType::bf16> : Half16<port::bf16x2_to_float2, port::float2_to_bf16x2> {};
template <>
struct Elem<DType::fp16> : Half16<port::fp16x2_to_float2, port::float2_to_fp16x2> {};

// ------------------------------------------------------------------ fp8 e4m3fn
//
// The block-fp8 kernels' conversions: exact widening, and the quantisation
// rule of core::float_to_fp8 (round to nearest even, saturated to +-448).
// CUDA: the cvt instructions (sm_89+; cuda_fp8.h's software path below);
// HIP: bit operations.

/// e4m3fn bits (low byte of v) -> float, exactly (NaN codes to NaN).
KDISPATCH_DEVICE_INLINE float e4m3_to_float(uint32_t v) {
  const uint32_t s = (v & 0x80u) << 24, e = (v >> 3) & 15u, m = v & 7u;
  if (e == 15u && m == 7u) return port::bits_to_float(0x7fc00000u | s);
  if (e == 0u) {  // subnormal: m * 2^-9
    const float f = static_cast<float>(m) * 0x1p-9f;
    return s ? -f : f;
  }
  return port::bits_to_float(s | ((e + 120u) << 23) | (m << 20));
}

/// Two e4m3fn codes (bytes 0 and 1 of v) -> two floats, exactly.
KDISPATCH_DEVICE_INLINE float2 e4m3x2_to_float2(uint32_t v) {
#if KDISPATCH_GPU_HIP
  return make_float2(e4m3_to_float(v & 0xffu), e4m3_to_float((v >> 8) & 0xffu));
#else
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  __half2 h;
  memcpy(&h, &r, sizeof h);
  return __half22float2(h);
#endif
}

/// a and b rounded to e4m3fn values (nearest, ties to even, saturated to
/// +-448), as floats: the values their codes hold.
KDISPATCH_DEVICE_INLINE float2 e4m3_round2(float a, float b) {
#if KDISPATCH_GPU_HIP
  auto one = [](float v) {
    v = fminf(fmaxf(v, -448.f), 448.f);
    if (fabsf(v) < 0x1p-6f) return rintf(v * 512.f) * 0x1p-9f;  // subnormals: steps of 2^-9
    const uint32_t u = port::float_to_bits(v);
    return port::bits_to_float((u + 0x7ffffu + ((u >> 20) & 1u)) & 0xfff00000u);  // 3 mantissa bits
  };
  return make_float2(one(a), one(b));
#else
  return e4m3x2_to_float2(__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3));
#endif
}

}  // namespace dispatch::KDISPATCH_GPU_NS
