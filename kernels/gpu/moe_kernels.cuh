// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — fused_moe's decode kernels (src/ops/fused_moe.hpp),
// written once for CUDA and HIP (gpu/port.hpp); bf16 and fp16 weights and
// activations, fp32 accumulation. Two launches whatever M is:
//
//   moe_up    grid (pairs P = M * top_k, ceil(I / (warps * R))): block (p, tile)
//             streams its expert's gate and up rows of the tile (w1[e][i] and
//             w1[e][I + i]) against the token's hidden row, one warp per R
//             i-values, and writes a[p, i] = act(gate) * up in fp32 to the
//             workspace [P, I]. A pair whose id is outside [0, E) writes 0.
//   moe_down  grid (M, ceil(H / (warps * R))): block (t, tile) computes, for
//             the tile's output rows c, sum_j topk_weights[t, j] * (w2[e_j][c]
//             · a[(t, j)]) over the token's choices in order (deterministic,
//             no atomics), times routed_scaling_factor, rounded once into out.
//
// The dots: a lane reads 16 bytes (8 elements) of a weight row per step
// (VEC: rows of a multiple of 8 elements and 16-byte aligned rows), all R
// rows' loads issued before their FMAs; else one element at a time (the
// reference variant, and rows no 16-byte chunk fits). Decode reads each
// touched expert's weights once per token that chose it; the grouped
// tensor-core path (part 2) reads them once per expert.
#pragma once

#include "gpu/elem.cuh"
#include "gpu/port.hpp"

namespace dispatch::KDISPATCH_GPU_NS::moe {

inline constexpr int kWarps = 8;  ///< warps per block of both kernels
/// Lanes of a warp: 32 on NVIDIA, the wavefront (64 on CDNA) on HIP.
inline constexpr int kLanes = port::kWarpSize;
inline constexpr int kThreads = kWarps * kLanes;

/// This thread's warp in its block and lane in its warp.
KDISPATCH_DEVICE_INLINE int warp_id() { return static_cast<int>(threadIdx.x / unsigned{kLanes}); }
KDISPATCH_DEVICE_INLINE int lane_id() { return static_cast<int>(threadIdx.x % unsigned{kLanes}); }

KDISPATCH_DEVICE_INLINE float act_of(float g, int act) {
  return act == 1 ? 0.5f * g * (1.f + erff(g * 0.70710678118654752f)) : g / (1.f + expf(-g));
}

/// 8 consecutive values of an fp32 or T vector (16- or 32-byte aligned) as floats.
template <DType DT, class X>
KDISPATCH_DEVICE_INLINE void load8(const X* x, float (&xv)[8]) {
  if constexpr (sizeof(X) == 4) {
    const float4 a = *reinterpret_cast<const float4*>(x), b = *reinterpret_cast<const float4*>(x + 4);
    xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
  } else {
    Elem<DT>::unpack(*reinterpret_cast<const uint4*>(x), xv);
  }
}

/// R dot products of weight rows with the fp32 or T vector x (n elements),
/// summed over the warp: every lane's out[r] holds them. The rows: w + r *
/// ldw, or with HALF > 0 two groups, rows r < HALF at w + r * ldw and the
/// rest at w + (gap + r - HALF) * ldw (gate and up rows, all loads in flight
/// together).
/// Rows past `last` (fewer rows than R in the matrix) read row `last` again.
template <DType DT, class X, int R, bool VEC, int HALF = 0>
KDISPATCH_DEVICE_INLINE void warp_dots(const typename Elem<DT>::S* w, int64_t ldw, const X* x, int64_t n,
                                       float (&out)[R], int64_t gap = 0, int last = R - 1) {
  const typename Elem<DT>::S* rp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rp[r] = w + (HALF == 0 || r < HALF ? int64_t{r < last ? r : last} : gap + r - HALF) * ldw;
  auto row = [&](int r) { return rp[r]; };
  using E = Elem<DT>;
  const int lane = lane_id();
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = 0.f;
  if constexpr (VEC) {
    constexpr int V = E::kVec;  // 8
    for (int64_t c = int64_t{lane} * V; c < n; c += kLanes * V) {
      uint4 chunk[R];
#pragma unroll
      for (int r = 0; r < R; ++r) chunk[r] = *reinterpret_cast<const uint4*>(row(r) + c);
      float xv[V];
      load8<DT>(x + c, xv);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wv[V];
        E::unpack(chunk[r], wv);
#pragma unroll
        for (int v = 0; v < V; ++v) out[r] = fmaf(wv[v], xv[v], out[r]);
      }
    }
  } else {
    for (int64_t c = lane; c < n; c += kLanes) {
      float xv;
      if constexpr (sizeof(X) == 4)
        xv = x[c];
      else
        xv = E::load1(reinterpret_cast<const typename E::S*>(x + c));
#pragma unroll
      for (int r = 0; r < R; ++r) out[r] = fmaf(E::load1(row(r) + c), xv, out[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = port::warp_sum(out[r]);
}

/// One call's arguments, every kernel of the family (the per-pair ones use
/// a, not y and the counters).
struct MoeArgs {
  const void* hidden;
  const void* w1;
  const void* w2;
  const int32_t* ids;
  const float* tw;
  float* a;            ///< workspace [P, I]
  float* y;            ///< workspace [P, H]
  uint32_t* counters;  ///< workspace [ceil(H / down tile)]
  void* out;
  int64_t ldh, ldw1, ldw2, ldi, ldtw, ldo;
  int64_t M, H, I, E, top_k;
  int64_t down_tiles;
  int act;
  float rsf;
  const float* s1 = nullptr;  ///< block fp8: w1_scale [E * ceil(2I/128), lds1]
  const float* s2 = nullptr;  ///< block fp8: w2_scale [E * ceil(H/128), lds2]
  int64_t lds1 = 0, lds2 = 0;
};

template <DType DT, int R, bool VEC>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_up_kernel(MoeArgs g) {
  port::grid_dependency_wait_and_release();
  using S = typename Elem<DT>::S;
  const int64_t p = blockIdx.x, t = p / g.top_k, j = p % g.top_k;
  const int warp = warp_id(), lane = lane_id();
  const int64_t i0 = (int64_t{blockIdx.y} * kWarps + warp) * R;
  if (i0 >= g.I) return;
  const int32_t e = g.ids[t * g.ldi + j];
  float* a = g.a + p * g.I;
  if (e < 0 || e >= g.E) {
    if (lane == 0)
      for (int r = 0; r < R && i0 + r < g.I; ++r) a[i0 + r] = 0.f;
    return;
  }
  const S* x = static_cast<const S*>(g.hidden) + t * g.ldh;
  const S* w = static_cast<const S*>(g.w1) + e * 2 * g.I * g.ldw1;
  // A partial last group of rows: its first rows again (their results unused).
  const int64_t base = i0 + R <= g.I ? i0 : g.I - R >= 0 ? g.I - R : 0;
  float both[2 * R];  // gate rows, then up rows
  if (g.I >= R) {
    warp_dots<DT, S, 2 * R, VEC, R>(w + base * g.ldw1, g.ldw1, x, g.H, both, g.I);
  } else {
    for (int64_t i = i0; i < g.I; ++i) {
      float g1[1], u1[1];
      warp_dots<DT, S, 1, VEC>(w + i * g.ldw1, g.ldw1, x, g.H, g1);
      warp_dots<DT, S, 1, VEC>(w + (g.I + i) * g.ldw1, g.ldw1, x, g.H, u1);
      if (lane == 0) a[i] = act_of(g1[0], g.act) * u1[0];
    }
    return;
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (base + r >= i0 && base + r < g.I) a[base + r] = act_of(both[r], g.act) * both[R + r];
}

/// moe_down: block (t, tile of R rows); its warps split the token's (choice
/// j, slice of I) units, unit u to warp u % kWarps, each warp summing its
/// units in order; the warps' sums are then added in warp order: a fixed
/// order whatever the timing (deterministic). With top_k < kWarps, I is cut
/// into kWarps / top_k slices so that every warp streams rows.
template <DType DT, int R, bool VEC>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_down_kernel(MoeArgs g) {
  port::grid_dependency_wait_and_release();
  using S = typename Elem<DT>::S;
  __shared__ float part[kWarps][R];
  const int64_t t = blockIdx.x;
  const int warp = warp_id(), lane = lane_id();
  const int64_t c0 = int64_t{blockIdx.y} * R;
  const int64_t base = c0 + R <= g.H ? c0 : g.H >= R ? g.H - R : 0;
  const int last = static_cast<int>(g.H - 1 - base < R - 1 ? g.H - 1 - base : R - 1);  // H < R: rows repeat
  const int64_t slices = g.top_k >= kWarps ? 1 : kWarps / g.top_k;
  const int64_t slice = ((g.I + slices - 1) / slices + 7) / 8 * 8;  // a multiple of 8: 16-byte aligned starts
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int64_t u = warp; u < g.top_k * slices; u += kWarps) {
    const int64_t j = u / slices, s0 = (u % slices) * slice;
    const int32_t e = g.ids[t * g.ldi + j];
    if (e < 0 || e >= g.E || s0 >= g.I) continue;
    const int64_t len = g.I - s0 < slice ? g.I - s0 : slice;
    const float wt = g.tw[t * g.ldtw + j];
    const float* a = g.a + (t * g.top_k + j) * g.I + s0;
    const S* w = static_cast<const S*>(g.w2) + e * g.H * g.ldw2 + s0;
    float d[R];
    warp_dots<DT, float, R, VEC>(w + base * g.ldw2, g.ldw2, a, len, d, 0, last);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = fmaf(wt, d[r], acc[r]);
  }
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r) part[warp][r] = acc[r];
  __syncthreads();
  if (threadIdx.x < R && base + threadIdx.x >= c0 && base + threadIdx.x < g.H) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += part[w][threadIdx.x];
    Elem<DT>::store1(static_cast<S*>(g.out) + t * g.ldo + base + threadIdx.x, g.rsf * sum);
  }
}

// ------------------------------------------------------------------ split over K
//
//   moe_up_split    grid (P, I / kSplitRows): block (p, tile) computes the
//                   tile's kSplitRows gate and up rows for pair p; its warps
//                   take the kSplitStep-element steps of H (256 on NVIDIA)
//                   in turn (step s to warp
//                   s % kWarps, so that a short grid still has every warp
//                   streaming), then add their sums in warp order and write
//                   a[p, i] = act(gate) * up in fp32 to the workspace [P, I].
//   moe_down_split  grid (M, H / kSplitDownRows): block (t, tile): its warps
//                   take the token's (choice j, 256-element step of I) units
//                   in turn, each adding topk_weights[t, j] * (rows · a) in
//                   unit order; the warps' sums are added in warp order (a
//                   fixed order: deterministic), times routed_scaling_factor.
// A lane reads 8 consecutive weights of each row per step (16 bytes, or 8
// for fp8) and 8 activations, every row's load issued before the FMAs.
//
// Block fp8 (W = fp8_e4m3fn, X the activations' dtype): a step's kLanes * 8
// elements (256 on NVIDIA) are 128-groups of 16 lanes each; the activations
// are quantised per group as the op does (amax over the 16 lanes, scale =
// max(amax, 1e-10) / 448, e4m3fn round to nearest even) and each lane's
// products, exact in fp32, join its sums times w_scale * scale (a tile's
// rows lie in one 128-row block of the weight scales).

inline constexpr int kSplitRows = 8, kSplitDownRows = 16, kSplitStep = kLanes * 8;

/// The weights of the split kernels: 8 consecutive elements of a row.
template <DType W>
struct WeightRow {
  using S = typename Elem<W>::S;
  using Raw = uint4;
  static constexpr bool kFp8 = false;
  static KDISPATCH_DEVICE_INLINE void widen(const Raw& r, float (&f)[8]) { Elem<W>::unpack(r, f); }
};
template <>
struct WeightRow<DType::fp8_e4m3fn> {
  using S = uint8_t;
  using Raw = uint2;
  static constexpr bool kFp8 = true;
  static KDISPATCH_DEVICE_INLINE void widen(const Raw& r, float (&f)[8]) {
    const uint32_t w[2] = {r.x, r.y};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = e4m3x2_to_float2(w[i >> 1] >> (16 * (i & 1)));
      f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
  }
};

/// Max over each `Width` consecutive lanes of a warp (an xor butterfly).
template <int Width>
KDISPATCH_DEVICE_INLINE float lanes_max(float v) {
#pragma unroll
  for (int o = Width / 2; o > 0; o >>= 1) {
#if KDISPATCH_GPU_HIP
    v = fmaxf(v, __shfl_xor(v, o));
#else
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
#endif
  }
  return v;
}
/// Max over each 16 lanes of a warp (a 128-group of 8 elements a lane).
KDISPATCH_DEVICE_INLINE float half_warp_max(float v) { return lanes_max<16>(v); }
/// Max over the whole warp (kLanes lanes).
KDISPATCH_DEVICE_INLINE float warp_max(float v) { return lanes_max<kLanes>(v); }

/// Block fp8: xv (this lane's 8 activations of a 128-group) quantised in
/// place to e4m3fn values; returns the group's scale. Every lane of the
/// warp takes part (a lane past the end holds zeros).
KDISPATCH_DEVICE_INLINE float quantise8(float (&xv)[8]) {
  float amax = 0.f;
#pragma unroll
  for (int v = 0; v < 8; ++v) amax = fmaxf(amax, fabsf(xv[v]));
  const float scale = fmaxf(half_warp_max(amax), 1e-10f) / 448.f, inv = 1.f / scale;
#pragma unroll
  for (int v = 0; v < 8; v += 2) {
    const float2 q = e4m3_round2(xv[v] * inv, xv[v + 1] * inv);
    xv[v] = q.x, xv[v + 1] = q.y;
  }
  return scale;
}

template <int N>
KDISPATCH_DEVICE_INLINE float dot8(const float (&a)[N], const float (&b)[N]) {
  float d = 0.f;
#pragma unroll
  for (int v = 0; v < N; ++v) d = fmaf(a[v], b[v], d);
  return d;
}

template <DType W, DType X>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_up_split_kernel(MoeArgs g) {
  port::grid_dependency_wait_and_release();
  constexpr int R = kSplitRows;
  using WR = WeightRow<W>;
  __shared__ float part[kWarps][2 * R];
  const int64_t p = blockIdx.x, t = p / g.top_k, j = p % g.top_k;
  const int warp = warp_id(), lane = lane_id();
  const int64_t i0 = int64_t{blockIdx.y} * R;
  const int32_t e = g.ids[t * g.ldi + j];
  if (e < 0 || e >= g.E) return;  // the whole block: the down kernel skips the pair
  const auto* x = static_cast<const typename Elem<X>::S*>(g.hidden) + t * g.ldh;
  const auto* w = static_cast<const typename WR::S*>(g.w1) + (e * 2 * g.I + i0) * g.ldw1;
  const int64_t up = g.I * g.ldw1;  // gate row i -> up row I + i
  const float *sg = nullptr, *su = nullptr;
  if constexpr (WR::kFp8) {
    const int64_t blocks = (2 * g.I + 127) / 128;
    sg = g.s1 + (e * blocks + i0 / 128) * g.lds1;
    su = g.s1 + (e * blocks + (g.I + i0) / 128) * g.lds1;
  }
  float acc[2 * R];
#pragma unroll
  for (int r = 0; r < 2 * R; ++r) acc[r] = 0.f;
  for (int64_t s0 = int64_t{warp} * kSplitStep; s0 < g.H; s0 += int64_t{kWarps} * kSplitStep) {
    const int64_t c = s0 + lane * 8;
    const bool ok = c < g.H;
    typename WR::Raw raw[2 * R];
    float xv[8];
#pragma unroll
    for (int v = 0; v < 8; ++v) xv[v] = 0.f;
    if (ok) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        raw[r] = *reinterpret_cast<const typename WR::Raw*>(w + r * g.ldw1 + c);
        raw[R + r] = *reinterpret_cast<const typename WR::Raw*>(w + up + r * g.ldw1 + c);
      }
      load8<X>(x + c, xv);
    }
    float cg = 1.f, cu = 1.f;
    if constexpr (WR::kFp8) {
      const float scale = quantise8(xv);
      if (ok) cg = sg[c / 128] * scale, cu = su[c / 128] * scale;
    }
    if (!ok) continue;
#pragma unroll
    for (int r = 0; r < 2 * R; ++r) {
      float wv[8];
      WR::widen(raw[r], wv);
      if constexpr (WR::kFp8)
        acc[r] = fmaf(dot8(wv, xv), r < R ? cg : cu, acc[r]);
      else
        acc[r] += dot8(wv, xv);
    }
  }
#pragma unroll
  for (int r = 0; r < 2 * R; ++r) acc[r] = port::warp_sum(acc[r]);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < 2 * R; ++r) part[warp][r] = acc[r];
  __syncthreads();
  if (threadIdx.x < R) {
    float gate = 0.f, upv = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) gate += part[k][threadIdx.x], upv += part[k][R + threadIdx.x];
    g.a[p * g.I + i0 + threadIdx.x] = act_of(gate, g.act) * upv;
  }
}

template <DType W, DType X>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_down_split_kernel(MoeArgs g) {
  port::grid_dependency_wait_and_release();
  constexpr int R = kSplitDownRows;
  using WR = WeightRow<W>;
  __shared__ float part[kWarps][R];
  const int64_t t = blockIdx.x, c0 = int64_t{blockIdx.y} * R;
  const int warp = warp_id(), lane = lane_id();
  const int64_t steps = (g.I + kSplitStep - 1) / kSplitStep;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int64_t u = warp; u < g.top_k * steps; u += kWarps) {
    const int64_t j = u / steps, c = (u % steps) * kSplitStep + lane * 8;
    const int32_t e = g.ids[t * g.ldi + j];
    if (e < 0 || e >= g.E) continue;  // the whole warp
    const bool ok = c < g.I;
    typename WR::Raw raw[R];
    float av[8];
#pragma unroll
    for (int v = 0; v < 8; ++v) av[v] = 0.f;
    if (ok) {
      const auto* w = static_cast<const typename WR::S*>(g.w2) + (e * g.H + c0) * g.ldw2 + c;
#pragma unroll
      for (int r = 0; r < R; ++r) raw[r] = *reinterpret_cast<const typename WR::Raw*>(w + r * g.ldw2);
      load8<DType::fp32>(g.a + (t * g.top_k + j) * g.I + c, av);
    }
    float cs = g.tw[t * g.ldtw + j];
    if constexpr (WR::kFp8) {
      const float scale = quantise8(av);
      if (ok) cs *= g.s2[(e * ((g.H + 127) / 128) + c0 / 128) * g.lds2 + c / 128] * scale;
    }
    if (!ok) continue;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float wv[8];
      WR::widen(raw[r], wv);
      acc[r] = fmaf(dot8(wv, av), cs, acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = port::warp_sum(acc[r]);
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r) part[warp][r] = acc[r];
  __syncthreads();
  if (threadIdx.x < R) {
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) sum += part[k][threadIdx.x];
    Elem<X>::store1(static_cast<typename Elem<X>::S*>(g.out) + t * g.ldo + c0 + threadIdx.x, g.rsf * sum);
  }
}

// ------------------------------------------------------------------ block fp8's reference
//
// One thread per output, one element at a time, the activations quantised
// per 128-group as the op does (each thread redoes its groups' amax): the
// GPU baseline the tuner validates the fp8 kernels against.

template <DType X>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_up_fp8_ref_kernel(MoeArgs g) {
  const int64_t q = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (q >= g.M * g.top_k * g.I) return;
  const int64_t p = q / g.I, i = q % g.I, t = p / g.top_k, j = p % g.top_k;
  const int32_t e = g.ids[t * g.ldi + j];
  if (e < 0 || e >= g.E) return;
  const auto* x = static_cast<const typename Elem<X>::S*>(g.hidden) + t * g.ldh;
  const auto* wg = static_cast<const uint8_t*>(g.w1) + (e * 2 * g.I + i) * g.ldw1;
  const uint8_t* wu = wg + g.I * g.ldw1;
  const int64_t blocks = (2 * g.I + 127) / 128;
  const float* sg = g.s1 + (e * blocks + i / 128) * g.lds1;
  const float* su = g.s1 + (e * blocks + (g.I + i) / 128) * g.lds1;
  float gate = 0.f, upv = 0.f;
  for (int64_t k0 = 0; k0 < g.H; k0 += 128) {
    const int64_t k1 = k0 + 128 < g.H ? k0 + 128 : g.H;
    float amax = 0.f;
    for (int64_t k = k0; k < k1; ++k) amax = fmaxf(amax, fabsf(Elem<X>::load1(x + k)));
    const float scale = fmaxf(amax, 1e-10f) / 448.f;
    float pg = 0.f, pu = 0.f;
    for (int64_t k = k0; k < k1; ++k) {
      const float xq = e4m3_round2(Elem<X>::load1(x + k) / scale, 0.f).x;
      pg = fmaf(e4m3_to_float(wg[k]), xq, pg);
      pu = fmaf(e4m3_to_float(wu[k]), xq, pu);
    }
    gate = fmaf(pg, sg[k0 / 128] * scale, gate);
    upv = fmaf(pu, su[k0 / 128] * scale, upv);
  }
  g.a[p * g.I + i] = act_of(gate, g.act) * upv;
}

template <DType X>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_down_fp8_ref_kernel(MoeArgs g) {
  const int64_t q = int64_t{blockIdx.x} * kThreads + threadIdx.x;
  if (q >= g.M * g.H) return;
  const int64_t t = q / g.H, c = q % g.H;
  float acc = 0.f;
  for (int64_t j = 0; j < g.top_k; ++j) {
    const int32_t e = g.ids[t * g.ldi + j];
    if (e < 0 || e >= g.E) continue;
    const float* a = g.a + (t * g.top_k + j) * g.I;
    const uint8_t* w = static_cast<const uint8_t*>(g.w2) + (e * g.H + c) * g.ldw2;
    const float* sw = g.s2 + (e * ((g.H + 127) / 128) + c / 128) * g.lds2;
    float y = 0.f;
    for (int64_t k0 = 0; k0 < g.I; k0 += 128) {
      const int64_t k1 = k0 + 128 < g.I ? k0 + 128 : g.I;
      float amax = 0.f;
      for (int64_t k = k0; k < k1; ++k) amax = fmaxf(amax, fabsf(a[k]));
      const float scale = fmaxf(amax, 1e-10f) / 448.f;
      float part = 0.f;
      for (int64_t k = k0; k < k1; ++k) part = fmaf(e4m3_to_float(w[k]), e4m3_round2(a[k] / scale, 0.f).x, part);
      y = fmaf(part, sw[k0 / 128] * scale, y);
    }
    acc = fmaf(g.tw[t * g.ldtw + j], y, acc);
  }
  Elem<X>::store1(static_cast<typename Elem<X>::S*>(g.out) + t * g.ldo + c, g.rsf * acc);
}

// ------------------------------------------------------------------ grouped by expert
//
//   moe_up_grouped    grid (min(P, E), ceil(I / (warps * R))): block (s, tile)
//                     takes the s-th expert the routing touches (ascending id;
//                     a block past the last exits), gathers its pairs CH at a
//                     time and streams each weight row once per NT of them.
//                     Block (0, 0) also zeroes the down kernel's tile counters.
//   moe_down_grouped  grid (min(P, E), ceil(H / (warps * R))): y[p, c] = w2[e][c]
//                     · a[p] for the expert's pairs into the workspace [P, H];
//                     the last block to finish a tile (a counter per tile) sums
//                     each token's choices in order: out[t, c] = rsf * sum_j
//                     topk_weights[t, j] * y[(t, j), c] (deterministic).
// Experts up to kMaxExperts (a bitmap in shared memory).

inline constexpr int kMaxExperts = 1024;
inline constexpr int kChunk = 256;  ///< pairs gathered per pass (shared memory)
inline constexpr int kTokens = 8;   ///< pairs per weight-row pass (NT)

/// The expert the block serves (the blockIdx.x-th touched one, ascending)
/// and how many the routing touches; -1 past the last.
KDISPATCH_DEVICE_INLINE int32_t nth_expert(const int32_t* ids, int64_t M, int64_t top_k, int64_t ldi, int64_t E,
                                           int* n_distinct) {
  __shared__ uint32_t bits[kMaxExperts / 32];
  __shared__ int32_t found;
  __shared__ int total;
  const int words = static_cast<int>((E + 31) / 32);
  for (int w = static_cast<int>(threadIdx.x); w < words; w += blockDim.x) bits[w] = 0;
  __syncthreads();
  const int P = static_cast<int>(M * top_k), k = static_cast<int>(top_k);  // < 2^31 (supports)
  for (int q = static_cast<int>(threadIdx.x); q < P; q += static_cast<int>(blockDim.x)) {
    const int32_t e = ids[(q / k) * ldi + q % k];
    if (e >= 0 && e < E) atomicOr(&bits[e >> 5], 1u << (e & 31));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int seen = 0;
    int32_t hit = -1;
    const int want = static_cast<int>(blockIdx.x);
    for (int w = 0; w < words; ++w) {
      const uint32_t b = bits[w];
      const int c = __popc(b);
      if (hit < 0 && seen + c > want) {
        uint32_t rest = b;
        for (int k = want - seen; k > 0; --k) rest &= rest - 1;  // drop the lower set bits
        hit = w * 32 + (__ffs(static_cast<int>(rest)) - 1);
      }
      seen += c;
    }
    found = hit;
    total = seen;
  }
  __syncthreads();
  *n_distinct = total;
  return found;
}

/// Gathers into `list` the pairs q in [q0, q0 + kChunk) routed to expert e; returns how many.
KDISPATCH_DEVICE_INLINE int gather(const int32_t* ids, int64_t P, int64_t top_k, int64_t ldi, int32_t e, int64_t q0,
                                   int32_t* list) {
  __shared__ int count;
  __syncthreads();
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  const int k = static_cast<int>(top_k);
  for (int q = static_cast<int>(q0) + static_cast<int>(threadIdx.x); q < P && q < q0 + kChunk;
       q += static_cast<int>(blockDim.x))
    if (ids[(q / k) * ldi + q % k] == e) list[atomicAdd(&count, 1)] = q;
  __syncthreads();
  return count;
}

/// Rows w + r * ldw (r < R) against the n (<= kTokens) vectors xs[t], all
/// over a warp: out[r][t] (every lane).
template <DType DT, class X, int R>
KDISPATCH_DEVICE_INLINE void warp_block_dots(const typename Elem<DT>::S* w, int64_t ldw, const X* const (&xs)[kTokens],
                                             int n, int64_t len, float (&out)[R][kTokens]) {
  using E = Elem<DT>;
  constexpr int V = E::kVec;
  const int lane = lane_id();
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < kTokens; ++t) out[r][t] = 0.f;
  for (int64_t c = int64_t{lane} * V; c < len; c += kLanes * V) {
    float wv[R][V];
#pragma unroll
    for (int r = 0; r < R; ++r) E::unpack(*reinterpret_cast<const uint4*>(w + r * ldw + c), wv[r]);
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      if (t >= n) break;
      const X* x = xs[t];
      float xv[V];
      load8<DT>(x + c, xv);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int v = 0; v < V; ++v) out[r][t] = fmaf(wv[r][v], xv[v], out[r][t]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < kTokens; ++t)
      if (t < n) out[r][t] = port::warp_sum(out[r][t]);
}

template <DType DT, int R>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_up_grouped_kernel(MoeArgs g) {
  port::grid_dependency_wait_and_release();
  using S = typename Elem<DT>::S;
  if (blockIdx.x == 0 && blockIdx.y == 0)
    for (int64_t i = threadIdx.x; i < g.down_tiles; i += blockDim.x) g.counters[i] = 0;
  int n_distinct = 0;
  const int32_t e = nth_expert(g.ids, g.M, g.top_k, g.ldi, g.E, &n_distinct);
  if (e < 0) return;
  __shared__ int32_t list[kChunk];
  const int warp = warp_id(), lane = lane_id();
  const int64_t i0 = (int64_t{blockIdx.y} * kWarps + warp) * R;
  const int64_t base = i0 + R <= g.I ? i0 : g.I - R;  // I >= R (supports): a partial group redoes rows
  const S* w = static_cast<const S*>(g.w1) + e * 2 * g.I * g.ldw1;
  const int64_t P = g.M * g.top_k;
  for (int64_t q0 = 0; q0 < P; q0 += kChunk) {
    const int n = gather(g.ids, P, g.top_k, g.ldi, e, q0, list);
    if (i0 >= g.I) continue;  // (after gather: every thread takes part in its barriers)
    for (int t0 = 0; t0 < n; t0 += kTokens) {
      const int nt = n - t0 < kTokens ? n - t0 : kTokens;
      const S* xs[kTokens];
#pragma unroll
      for (int t = 0; t < kTokens; ++t)
        xs[t] = static_cast<const S*>(g.hidden) + (t < nt ? list[t0 + t] / static_cast<int>(g.top_k) : 0) * g.ldh;
      float gate[R][kTokens], up[R][kTokens];
      warp_block_dots<DT, S, R>(w + base * g.ldw1, g.ldw1, xs, nt, g.H, gate);
      warp_block_dots<DT, S, R>(w + (g.I + base) * g.ldw1, g.ldw1, xs, nt, g.H, up);
      // Lane (r, t) writes one result.
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < kTokens; ++t)
          if (lane == r * kTokens + t && t < nt && base + r >= i0)
            g.a[int64_t{list[t0 + t]} * g.I + base + r] = act_of(gate[r][t], g.act) * up[r][t];
    }
  }
}

template <DType DT, int R>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_down_grouped_kernel(MoeArgs g) {
  port::grid_dependency_wait_and_release();
  using S = typename Elem<DT>::S;
  int n_distinct = 0;
  const int32_t e = nth_expert(g.ids, g.M, g.top_k, g.ldi, g.E, &n_distinct);
  if (n_distinct == 0 && blockIdx.x == 0) {  // no pair routed to a local expert: zeros
    const int64_t tile = int64_t{blockIdx.y} * kWarps * R;
    const int64_t rows = g.H - tile < int64_t{kWarps} * R ? g.H - tile : int64_t{kWarps} * R;
    for (int64_t k = threadIdx.x; k < g.M * rows; k += blockDim.x)
      Elem<DT>::store1(static_cast<S*>(g.out) + (k / rows) * g.ldo + tile + k % rows, 0.f);
  }
  if (e < 0) return;
  __shared__ int32_t list[kChunk];
  __shared__ bool last;
  const int warp = warp_id(), lane = lane_id();
  const int64_t tile0 = int64_t{blockIdx.y} * kWarps * R;
  const int64_t c0 = tile0 + int64_t{warp} * R;
  const int64_t base = c0 + R <= g.H ? c0 : g.H - R;  // H >= R (supports)
  const S* w = static_cast<const S*>(g.w2) + e * g.H * g.ldw2;
  const int64_t P = g.M * g.top_k;
  for (int64_t q0 = 0; q0 < P; q0 += kChunk) {
    const int n = gather(g.ids, P, g.top_k, g.ldi, e, q0, list);
    if (c0 >= g.H) continue;
    for (int t0 = 0; t0 < n; t0 += kTokens) {
      const int nt = n - t0 < kTokens ? n - t0 : kTokens;
      const float* as[kTokens];
#pragma unroll
      for (int t = 0; t < kTokens; ++t) as[t] = g.a + int64_t{t < nt ? list[t0 + t] : 0} * g.I;
      float d[R][kTokens];
      warp_block_dots<DT, float, R>(w + base * g.ldw2, g.ldw2, as, nt, g.I, d);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < kTokens; ++t)
          if (lane == r * kTokens + t && t < nt && base + r >= c0)
            g.y[int64_t{list[t0 + t]} * g.H + base + r] = d[r][t];
    }
  }
  // The tile's last block sums each token's choices, in order.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&g.counters[blockIdx.y], 1u) == static_cast<uint32_t>(n_distinct - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int64_t rows = g.H - tile0 < int64_t{kWarps} * R ? g.H - tile0 : int64_t{kWarps} * R;
  for (int64_t k = threadIdx.x; k < g.M * rows; k += blockDim.x) {
    const int64_t t = k / rows, c = tile0 + k % rows;
    float acc = 0.f;
    for (int64_t j = 0; j < g.top_k; ++j) {
      const int32_t ej = g.ids[t * g.ldi + j];
      if (ej < 0 || ej >= g.E) continue;
      acc = fmaf(g.tw[t * g.ldtw + j], port::load_coherent(g.y + (t * g.top_k + j) * g.H + c), acc);
    }
    Elem<DT>::store1(static_cast<S*>(g.out) + t * g.ldo + c, g.rsf * acc);
  }
}

}  // namespace dispatch::KDISPATCH_GPU_NS::moe
