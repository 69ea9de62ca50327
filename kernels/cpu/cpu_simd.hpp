// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — W-lane float vectors written once with GCC vector
// extensions (`float __attribute__((vector_size))`), shared by the
// elementwise and row kernels (rmsnorm.cpp, silu_and_mul.cpp).
//
// The bodies are always-inline templates on the width W; the kernels
// instantiate them inside functions carrying a target attribute (W=4
// baseline, W=8 AVX2, W=16 AVX-512; cpu_common.hpp), so each width is
// lowered to native instructions while the library stays baseline x86-64.
// Generic vectors (not intrinsics) are what make the single body possible:
// an intrinsic cannot be inlined into a function of a narrower target.
// Vectors are passed by reference between helpers, so no vector crosses a
// call boundary of the default target (no -Wpsabi ABI change).
//
// bf16: loads widen exactly (a 16-bit shift); stores round to nearest even
// with NaN kept (the rule of core/numeric.hpp, in SIMD).
#pragma once

#include <cstdint>
#include <utility>

#include "core/numeric.hpp"

#define KDISPATCH_INLINE [[gnu::always_inline]] inline
/// The same for a lambda (after its parameter list).
#define KDISPATCH_LAMBDA_INLINE __attribute__((always_inline))

namespace dispatch::cpu::simd {

using Bf16 = uint16_t;

inline float to_float(float v) noexcept { return v; }
inline float to_float(Bf16 v) noexcept { return core::bf16_to_float(v); }
inline void store_as(float* d, float v) noexcept { *d = v; }
inline void store_as(Bf16* d, float v) noexcept { *d = core::float_to_bf16(v); }
/// The value a float becomes once stored as T (identity for fp32).
inline float stored_value(float v, float*) noexcept { return v; }
inline float stored_value(float v, Bf16*) noexcept { return core::round_to_bf16(v); }

// ------------------------------------------------------------------ W-lane vectors

template <int W>
struct Vec {
  typedef float F __attribute__((vector_size(W * 4)));
  typedef uint32_t U __attribute__((vector_size(W * 4)));
  typedef uint16_t H __attribute__((vector_size(W * 2)));  // W bf16 values
  typedef int32_t I __attribute__((vector_size(W * 4)));
  typedef int16_t S __attribute__((vector_size(W * 2)));
};

// bf16 <-> fp32 as lane shuffles and a signed narrowing, which every ISA
// lowers to a few instructions; the obvious unsigned __builtin_convertvector
// forms get scalarised on SSE2 (no unsigned pack before SSE4.1). Needs
// __builtin_shufflevector: GCC >= 12 or Clang.

/// The W bf16 values as the high halves of W 32-bit lanes (little endian).
template <int W, int... I>
KDISPATCH_INLINE void widen_bf16(typename Vec<W>::F& v, const typename Vec<W>::H& h, std::integer_sequence<int, I...>) {
  const typename Vec<W>::H zero = {};
  v = reinterpret_cast<typename Vec<W>::F>(__builtin_shufflevector(zero, h, ((I & 1) ? W + I / 2 : I / 2)...));
}

/// The high half of each 32-bit lane of u. The arithmetic shift keeps every
/// lane within int16, so the narrowing is exact (packssdw on SSE2).
template <int W>
KDISPATCH_INLINE void high_halves(typename Vec<W>::H& h, const typename Vec<W>::U& u) {
  h = reinterpret_cast<typename Vec<W>::H>(
      __builtin_convertvector(reinterpret_cast<typename Vec<W>::I>(u) >> 16, typename Vec<W>::S));
}

template <int W>
KDISPATCH_INLINE void vload(typename Vec<W>::F& v, const float* p) {
  __builtin_memcpy(&v, p, sizeof v);
}
template <int W>
KDISPATCH_INLINE void vload(typename Vec<W>::F& v, const Bf16* p) {
  typename Vec<W>::H h;
  __builtin_memcpy(&h, p, sizeof h);
  widen_bf16<W>(v, h, std::make_integer_sequence<int, 2 * W>{});
}

/// v rounded to bf16, kept as the high half of each lane (the low half is
/// garbage): round to nearest even, NaN quietened.
template <int W>
KDISPATCH_INLINE void round_bf16_high(typename Vec<W>::U& bits, const typename Vec<W>::F& v) {
  using U = typename Vec<W>::U;
  const U u = reinterpret_cast<U>(v);
  const U rounded = u + 0x7fffu + ((u >> 16) & 1u);
  const U quiet = u | 0x400000u;
  bits = (v != v) ? quiet : rounded;
}

template <int W>
KDISPATCH_INLINE void vstore(float* p, const typename Vec<W>::F& v) {
  __builtin_memcpy(p, &v, sizeof v);
}
template <int W>
KDISPATCH_INLINE void vstore(Bf16* p, const typename Vec<W>::F& v) {
  typename Vec<W>::U bits;
  round_bf16_high<W>(bits, v);
  typename Vec<W>::H h;
  high_halves<W>(h, bits);
  __builtin_memcpy(p, &h, sizeof h);
}

/// Stores v as T at p and replaces v by the value stored (v rounded to T).
template <int W>
KDISPATCH_INLINE void store_rounded(float* p, typename Vec<W>::F& v) {
  vstore<W>(p, v);
}
template <int W>
KDISPATCH_INLINE void store_rounded(Bf16* p, typename Vec<W>::F& v) {
  typename Vec<W>::U bits;
  round_bf16_high<W>(bits, v);
  typename Vec<W>::H h;
  high_halves<W>(h, bits);
  __builtin_memcpy(p, &h, sizeof h);
  v = reinterpret_cast<typename Vec<W>::F>(bits & 0xffff0000u);
}

template <int W>
KDISPATCH_INLINE float hsum(const typename Vec<W>::F& v) {
  float s = 0.f;
  for (int i = 0; i < W; ++i) s += v[i];
  return s;
}

// ------------------------------------------------------------------ rows

/// The vector walk of a row of `n` elements every row kernel makes: U
/// independent W-lane vectors per step (body(i, u) for u = 0..U-1, at
/// i = h + u * W), then the whole vectors left one by one (u = 0). Returns
/// where the scalar tail starts.
template <int W, int U, class Body>
KDISPATCH_INLINE int64_t for_each_vector(int64_t n, Body&& body) {
  int64_t h = 0;
  for (; h + W * U <= n; h += W * U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) body(h + u * W, u);
  }
  for (; h + W <= n; h += W) body(h, 0);
  return h;
}

/// The sum of U accumulator chains' lanes.
template <int W, int U>
KDISPATCH_INLINE float hsum_chains(typename Vec<W>::F (&acc)[U]) {
#pragma GCC unroll 4
  for (int u = 1; u < U; ++u) acc[0] += acc[u];
  return hsum<W>(acc[0]);
}

}  // namespace dispatch::cpu::simd
