// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — element types of the memory-bound kernels (the
// norms, silu_and_mul), written once for CUDA and HIP (gpu/port.hpp): a
// 16-byte chunk unpacked to floats and packed back (rounded to nearest
// even), and one element at a time. 16-bit floats are raw bits (uint16_t).
#pragma once

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

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

}  // namespace dispatch::KDISPATCH_GPU_NS
