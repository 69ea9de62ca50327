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
inline constexpr int kThreads = kWarps * 32;

KDISPATCH_DEVICE_INLINE float act_of(float g, int act) {
  return act == 1 ? 0.5f * g * (1.f + erff(g * 0.70710678118654752f)) : g / (1.f + expf(-g));
}

/// R dot products of weight rows w + r * ldw (n elements) with the fp32 or
/// T vector x (n elements), summed over the warp: lane 0's out[r] hold them.
template <DType DT, class X, int R, bool VEC>
KDISPATCH_DEVICE_INLINE void warp_dots(const typename Elem<DT>::S* w, int64_t ldw, const X* x, int64_t n,
                                       float (&out)[R]) {
  using E = Elem<DT>;
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = 0.f;
  if constexpr (VEC) {
    constexpr int V = E::kVec;  // 8
    for (int64_t c = int64_t{lane} * V; c < n; c += 32 * V) {
      uint4 chunk[R];
#pragma unroll
      for (int r = 0; r < R; ++r) chunk[r] = *reinterpret_cast<const uint4*>(w + r * ldw + c);
      float xv[V];
      if constexpr (sizeof(X) == 4) {
        const float4 a = *reinterpret_cast<const float4*>(x + c), b = *reinterpret_cast<const float4*>(x + c + 4);
        xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w, xv[4] = b.x, xv[5] = b.y, xv[6] = b.z, xv[7] = b.w;
      } else {
        E::unpack(*reinterpret_cast<const uint4*>(x + c), xv);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wv[V];
        E::unpack(chunk[r], wv);
#pragma unroll
        for (int v = 0; v < V; ++v) out[r] = fmaf(wv[v], xv[v], out[r]);
      }
    }
  } else {
    for (int64_t c = lane; c < n; c += 32) {
      float xv;
      if constexpr (sizeof(X) == 4)
        xv = x[c];
      else
        xv = E::load1(reinterpret_cast<const typename E::S*>(x + c));
#pragma unroll
      for (int r = 0; r < R; ++r) out[r] = fmaf(E::load1(w + r * ldw + c), xv, out[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) out[r] = port::warp_sum(out[r]);
}

struct UpArgs {
  const void* hidden;
  const void* w1;
  const int32_t* ids;
  float* a;  ///< workspace [P, I]
  int64_t ldh, ldw1, ldi;
  int64_t H, I, E, top_k;
  int act;
};

template <DType DT, int R, bool VEC>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_up_kernel(UpArgs g) {
  port::grid_dependency_wait_and_release();
  using S = typename Elem<DT>::S;
  const int64_t p = blockIdx.x, t = p / g.top_k, j = p % g.top_k;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
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
  float gate[R], up[R];
  if (g.I >= R) {
    warp_dots<DT, S, R, VEC>(w + base * g.ldw1, g.ldw1, x, g.H, gate);
    warp_dots<DT, S, R, VEC>(w + (g.I + base) * g.ldw1, g.ldw1, x, g.H, up);
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
      if (base + r >= i0 && base + r < g.I) a[base + r] = act_of(gate[r], g.act) * up[r];
}

struct DownArgs {
  const void* w2;
  const int32_t* ids;
  const float* tw;
  const float* a;  ///< workspace [P, I]
  void* out;
  int64_t ldw2, ldi, ldtw, ldo;
  int64_t H, I, E, top_k;
  float rsf;
};

template <DType DT, int R, bool VEC>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_down_kernel(DownArgs g) {
  port::grid_dependency_wait_and_release();
  using S = typename Elem<DT>::S;
  const int64_t t = blockIdx.x;
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int64_t c0 = (int64_t{blockIdx.y} * kWarps + warp) * R;
  if (c0 >= g.H) return;
  const int64_t base = c0 + R <= g.H ? c0 : g.H - R >= 0 ? g.H - R : 0;
  const int rows = g.H >= R ? R : static_cast<int>(g.H - c0);
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int64_t j = 0; j < g.top_k; ++j) {
    const int32_t e = g.ids[t * g.ldi + j];
    if (e < 0 || e >= g.E) continue;
    const float wt = g.tw[t * g.ldtw + j];
    const float* a = g.a + (t * g.top_k + j) * g.I;
    const S* w = static_cast<const S*>(g.w2) + e * g.H * g.ldw2;
    if (g.H >= R) {
      float d[R];
      warp_dots<DT, float, R, VEC>(w + base * g.ldw2, g.ldw2, a, g.I, d);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = fmaf(wt, d[r], acc[r]);
    } else {
      for (int r = 0; r < rows; ++r) {
        float d[1];
        warp_dots<DT, float, 1, VEC>(w + (c0 + r) * g.ldw2, g.ldw2, a, g.I, d);
        acc[r] = fmaf(wt, d[0], acc[r]);
      }
    }
  }
  if (lane == 0) {
    S* out = static_cast<S*>(g.out) + t * g.ldo;
    if (g.H >= R) {
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (base + r >= c0) Elem<DT>::store1(out + base + r, g.rsf * acc[r]);
    } else {
      for (int r = 0; r < rows; ++r) Elem<DT>::store1(out + c0 + r, g.rsf * acc[r]);
    }
  }
}

}  // namespace dispatch::KDISPATCH_GPU_NS::moe
