// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — moe_gemm kernels (src/ops/moe_gemm.hpp), written
// once for CUDA and HIP (gpu/port.hpp). Each kernels/<backend>/moe_gemm_<w>
// translation unit instantiates them for one weight dtype with
// KDISPATCH_MOE_GEMM_TU (3 kernels per TU: gpu/moe_gemm_launch.hpp).
//
//   out[s] = (a[s / top_k] · w[e]^T) * (mul_routed_weight ? topk_weights[s] : 1)
//   for the pairs s of each block of moe_align's sorted ids, 0 where the
//   block's expert is not local.
//
// The kernels:
//  - split (vec and generic): grid (ceil(N / 16), blocks of the sort, at
//    most 65535, grid-stride). A block of 4 warps takes 16 weight rows of
//    the block's expert (4 a warp) and walks the block's pairs 4 at a time:
//    each lane reads 8 consecutive elements of K of each of its warp's 4
//    weight rows and of the 4 pairs' rows of a per step (16 bytes, or 8 for
//    fp8 weights: vec; element by element where K or the rows do not allow
//    it: generic), products summed in fp32 per lane, then over the warp.
//    Block fp8: each step's 128-groups (16 lanes) quantise a's values as
//    the op does (moe_kernels.cuh quantise8) and each lane's group sum is
//    scaled by its weight block scale and the group's scale.
//  - reference: one thread per (sorted position, output column), the same
//    sums in K order (the validation baseline).
//  - ring (CUDA): tensor cores on fused_moe's ring (below); block fp8 takes
//    a workspace for a quantised once (moe_gemm_fp8_ring_workspace_bytes).
// No atomics: each output row is written by one block.
#pragma once

#include <climits>

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/backend_decls.hpp"
#include "gpu/elem.cuh"
#include "gpu/launch_util.hpp"
#include "gpu/moe_gemm_launch.hpp"
#include "gpu/moe_kernels.cuh"
#include "ops/moe_gemm.hpp"
#include "ops/moe_gemm_fp8.hpp"
#if KDISPATCH_GPU_HAS_TILED
#include "cuda/moe_mma.cuh"
#include "cuda/wgmma_moe.cuh"
#endif

namespace dispatch::KDISPATCH_GPU_NS::moe_gemm {

using moe::kLanes;
using moe::lane_id;
using moe::warp_id;
inline constexpr int kWarps = 4, kRows = 4, kPairs = 4, kThreads = kWarps * kLanes;
inline constexpr int kRefThreads = gpu::moe_gemm::kRefThreads;
inline constexpr int kAmaxThreads = gpu::moe_gemm::kAmaxThreads;
static_assert(kWarps * kRows == gpu::moe_gemm::kRowsPerBlock && kWarps == gpu::moe_gemm::kSplitWarps,
              "the list's grid");

/// Kernel parameters, by value.
struct Args {
  const void* a;
  const void* w;
  void* out;
  const float* tw;  ///< null unless mul_routed_weight
  const int32_t* sorted;
  const int32_t* experts;
  const int32_t* total;
  const float* ws;  ///< block fp8's weight scales [E, ceil(N/128), ceil(K/128)]; fp8_w8a8's [E] or [E, N]
  int64_t lda, ldw, ldo, ldtw, ldws;
  int64_t N, K, E, top_k, bs, pairs, cap;
  /// fp8_w8a8 (moe_gemm_fp8_tensor / _channel, src/ops/moe_gemm_fp8.hpp):
  /// the activations' scale source (as_mode: kAsBlock for moe_gemm's block
  /// fp8) and whether ws is per channel ([E, N], row stride ldws) or per
  /// expert ([E]).
  const float* as = nullptr;
  int32_t as_mode = 0;
  int32_t ws_channel = 0;
  /// moe_gemm_fp8_channel on block fp8's tensor-core kernels: w_scale [E,
  /// N] (row stride ldwc), applied by the epilogue per output column (ws
  /// then points at block scales of 1); null otherwise.
  const float* wc = nullptr;
  int64_t ldwc = 0;
};
/// Args::as_mode: block fp8 (1x128 groups in the kernel); a_scale given
/// (as[0] is the scale); dynamic per tensor (as[0] holds the amax of all of
/// a, the workspace's); dynamic per token (each row's amax, in the kernel);
/// dynamic per token computed by a pass first (as[t] is row t's scale, the
/// workspace's: the split kernels' blocks then do not each re-read the row).
inline constexpr int32_t kAsBlock = 0, kAsStatic = 1, kAsTensorAmax = 2, kAsToken = 3, kAsRowScales = 4;

/// The blocks a call walks (moe_gemm_spec::walked_blocks, on the device).
KDISPATCH_DEVICE_INLINE int64_t walked(const Args& g) {
  const int64_t total = *g.total, t = total < 0 ? 0 : total > g.cap ? g.cap : total;
  return (t + g.bs - 1) / g.bs;
}

/// Lane `lane`'s 8 elements of row `p` at column c (zeros past K): a vector
/// load (vec: K a multiple of 8, 16-byte rows) or one element at a time.
template <DType DT, bool kVec>
KDISPATCH_DEVICE_INLINE void load8(const typename moe::WeightRow<DT>::S* p, int64_t c, int64_t K, float (&f)[8]) {
  if constexpr (DT == DType::fp8_e4m3fn) {
    if (kVec && c < K) {
      moe::WeightRow<DT>::widen(*reinterpret_cast<const uint2*>(p + c), f);
      return;
    }
#pragma unroll
    for (int v = 0; v < 8; ++v) f[v] = c + v < K ? e4m3_to_float(p[c + v]) : 0.f;
  } else {
    if (kVec && c < K) {
      Elem<DT>::unpack(*reinterpret_cast<const uint4*>(p + c), f);
      return;
    }
#pragma unroll
    for (int v = 0; v < 8; ++v) f[v] = c + v < K ? Elem<DT>::load1(p + c + v) : 0.f;
  }
}

/// fp8_w8a8: the activation scale of a's row x (K elements): a_scale, the
/// tensor's amax, or the row's own amax (every lane of the warp takes part),
/// max(amax, 1e-10) / 448 (quant_fp8's rule).
template <DType X, bool kVec>
KDISPATCH_DEVICE_INLINE float row_scale(const Args& g, const typename Elem<X>::S* x) {
  if (g.as_mode == kAsStatic) return g.as[0];
  float amax = 0.f;
  if (g.as_mode == kAsTensorAmax) {
    amax = g.as[0];
  } else {
    for (int64_t c = int64_t{lane_id()} * 8; c < g.K; c += int64_t{kLanes} * 8) {
      float f[8];
      load8<X, kVec>(x, c, g.K, f);
#pragma unroll
      for (int v = 0; v < 8; ++v) amax = fmaxf(amax, fabsf(f[v]));
    }
    amax = moe::warp_max(amax);
  }
  return fmaxf(amax, 1e-10f) / 448.f;
}
/// fp8_w8a8: one of a's values over its scale, clamped as the engines
/// clamp (fmax(fmin(v, 448), -448): a NaN gives +448, as the reference).
KDISPATCH_DEVICE_INLINE float clamp448(float v) { return fmaxf(fminf(v, 448.f), -448.f); }
/// fp8_w8a8: v (8 of a's values) as their e4m3fn codes' values under scale sa.
KDISPATCH_DEVICE_INLINE void quantise8_by(float (&v)[8], float sa) {
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    const float2 q = e4m3_round2(clamp448(v[i] / sa), clamp448(v[i + 1] / sa));
    v[i] = q.x, v[i + 1] = q.y;
  }
}
/// fp8_w8a8: the weight scale of expert e's row n.
KDISPATCH_DEVICE_INLINE float weight_scale(const Args& g, int64_t e, int64_t n) {
  return g.ws_channel != 0 ? g.ws[e * g.ldws + n] : g.ws[e];
}

/// W: the weights' dtype; X: a's and out's (W, or bf16 under fp8 weights).
/// fp8 weights: block fp8 (as_mode kAsBlock), or fp8_w8a8 (each pair's row
/// quantised by its one scale, each sum times that scale and the weight's).
template <DType W, DType X, bool kVec>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kThreads) moe_gemm_split_kernel(Args g) {
  port::grid_dependency_wait_and_release();
  constexpr bool kFp8 = W == DType::fp8_e4m3fn;
  using WS = typename moe::WeightRow<W>::S;
  using XS = typename Elem<X>::S;
  const int lane = lane_id();
  const int64_t r0 = (int64_t{blockIdx.x} * kWarps + warp_id()) * kRows;
  const int64_t blocks = walked(g), nb = (g.N + 127) / 128;
  for (int64_t b = blockIdx.y; b < blocks; b += gridDim.y) {
    const int32_t e = g.experts[b];
    const bool local = e >= 0 && e < g.E;
    const int64_t end = (b + 1) * g.bs < g.cap ? (b + 1) * g.bs : g.cap;
    for (int64_t i0 = b * g.bs; i0 < end; i0 += kPairs) {
      int64_t s[kPairs];
      bool any = false;
#pragma unroll
      for (int q = 0; q < kPairs; ++q) {
        s[q] = i0 + q < end ? g.sorted[i0 + q] : -1;
        if (s[q] < 0 || s[q] >= g.pairs) s[q] = -1;
        any = any || s[q] >= 0;
      }
      if (!any) continue;  // the same for every thread of the block
      float acc[kRows][kPairs] = {};
      // fp8_w8a8: each pair's activation scale (uniform over the block)
      const bool scaled = kFp8 && g.as_mode != kAsBlock;
      float sa[kPairs];
#pragma unroll
      for (int q = 0; q < kPairs; ++q)
        sa[q] = !(scaled && local && s[q] >= 0) ? 1.f
                : g.as_mode == kAsRowScales
                    ? g.as[s[q] / g.top_k]
                    : row_scale<X, kVec>(g, static_cast<const XS*>(g.a) + (s[q] / g.top_k) * g.lda);
      if (local) {
        const WS* wr[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
          wr[r] = static_cast<const WS*>(g.w) + (e * g.N + (r0 + r < g.N ? r0 + r : 0)) * g.ldw;
        // Every lane steps to the same bound (fp8's group max takes all 16 lanes).
        for (int64_t k0 = 0; k0 < g.K; k0 += int64_t{kLanes} * 8) {
          const int64_t c = k0 + int64_t{lane} * 8;
          float x[kPairs][8], scale[kPairs];
#pragma unroll
          for (int q = 0; q < kPairs; ++q) {
            load8<X, kVec>(static_cast<const XS*>(g.a) + (s[q] >= 0 ? s[q] / g.top_k : 0) * g.lda, c, g.K, x[q]);
            if constexpr (kFp8) {
              if (scaled)
                quantise8_by(x[q], sa[q]);
              else
                scale[q] = moe::quantise8(x[q]);
            }
          }
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            float wv[8];
            load8<W, kVec>(wr[r], c, g.K, wv);
            float ws = 1.f;
            if constexpr (kFp8)
              if (!scaled) ws = c < g.K ? g.ws[(e * nb + (r0 + r < g.N ? r0 + r : 0) / 128) * g.ldws + c / 128] : 0.f;
#pragma unroll
            for (int q = 0; q < kPairs; ++q) {
              const float part = moe::dot8(wv, x[q]);
              if (kFp8 && !scaled)
                acc[r][q] = fmaf(part, ws * scale[q], acc[r][q]);
              else
                acc[r][q] += part;
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int q = 0; q < kPairs; ++q) {
          const float v = port::warp_sum(acc[r][q]);
          if (lane == (r * kPairs + q) % kLanes && s[q] >= 0 && r0 + r < g.N) {
            const float rw = g.tw != nullptr && local ? g.tw[(s[q] / g.top_k) * g.ldtw + s[q] % g.top_k] : 1.f;
            const float sw = scaled && local ? sa[q] * weight_scale(g, e, r0 + r) : 1.f;
            Elem<X>::store1(static_cast<XS*>(g.out) + s[q] * g.ldo + r0 + r, v * sw * rw);
          }
        }
    }
  }
}

/// One thread per (sorted position i, column n), grid-stride.
template <DType W, DType X>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kRefThreads) moe_gemm_ref_kernel(Args g) {
  port::grid_dependency_wait_and_release();
  constexpr bool kFp8 = W == DType::fp8_e4m3fn;
  using WS = typename moe::WeightRow<W>::S;
  using XS = typename Elem<X>::S;
  const int64_t walked_rows = walked(g) * g.bs, rows = walked_rows < g.cap ? walked_rows : g.cap;
  const int64_t nb = (g.N + 127) / 128;
  for (int64_t q = int64_t{blockIdx.x} * kRefThreads + threadIdx.x; q < rows * g.N;
       q += int64_t{gridDim.x} * kRefThreads) {
    const int64_t i = q / g.N, n = q % g.N;
    const int64_t s = g.sorted[i];
    if (s < 0 || s >= g.pairs) continue;
    const int32_t e = g.experts[i / g.bs];
    float acc = 0.f;
    bool scaled = false;
    if constexpr (kFp8)
      if (g.as_mode != kAsBlock && e >= 0 && e < g.E) {  // fp8_w8a8: one scale for the row
        scaled = true;
        const XS* x = static_cast<const XS*>(g.a) + (s / g.top_k) * g.lda;
        const WS* w = static_cast<const WS*>(g.w) + (e * g.N + n) * g.ldw;
        float amax = g.as_mode == kAsTensorAmax ? g.as[0] : 0.f;
        if (g.as_mode == kAsToken)
          for (int64_t k = 0; k < g.K; ++k) amax = fmaxf(amax, fabsf(Elem<X>::load1(x + k)));
        const float sa = g.as_mode == kAsStatic ? g.as[0] : fmaxf(amax, 1e-10f) / 448.f;
        for (int64_t k = 0; k < g.K; ++k)
          acc = fmaf(e4m3_to_float(w[k]), e4m3_round2(clamp448(Elem<X>::load1(x + k) / sa), 0.f).x, acc);
        acc *= sa * weight_scale(g, e, n);
        if (g.tw != nullptr) acc *= g.tw[(s / g.top_k) * g.ldtw + s % g.top_k];
      }
    if (!scaled && e >= 0 && e < g.E) {
      const XS* x = static_cast<const XS*>(g.a) + (s / g.top_k) * g.lda;
      const WS* w = static_cast<const WS*>(g.w) + (e * g.N + n) * g.ldw;
      for (int64_t k0 = 0; k0 < g.K; k0 += 128) {
        const int64_t k1 = k0 + 128 < g.K ? k0 + 128 : g.K;
        float scale = 1.f, part = 0.f;
        if constexpr (kFp8) {
          float amax = 0.f;
          for (int64_t k = k0; k < k1; ++k) amax = fmaxf(amax, fabsf(Elem<X>::load1(x + k)));
          scale = fmaxf(amax, 1e-10f) / 448.f;
          for (int64_t k = k0; k < k1; ++k)
            part = fmaf(e4m3_to_float(w[k]), e4m3_round2(Elem<X>::load1(x + k) / scale, 0.f).x, part);
          acc = fmaf(part, g.ws[(e * nb + n / 128) * g.ldws + k0 / 128] * scale, acc);
        } else {
          for (int64_t k = k0; k < k1; ++k) part = fmaf(Elem<W>::load1(w + k), Elem<X>::load1(x + k), part);
          acc += part;
        }
      }
      if (g.tw != nullptr) acc *= g.tw[(s / g.top_k) * g.ldtw + s % g.top_k];
    }
    Elem<X>::store1(static_cast<XS*>(g.out) + s * g.ldo + n, acc);
  }
}

/// moe_gemm_fp8_channel's dynamic scale on the split kernels: row
/// blockIdx.x's max(amax, 1e-10) / 448 into out[row] (the row read once,
/// not once per block of the GEMM's grid).
template <DType X>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kAmaxThreads)
    moe_gemm_row_scales_kernel(const void* a, int64_t lda, int64_t K, float* out) {
  port::grid_dependency_wait_and_release();
  __shared__ float part[kAmaxThreads / kLanes];
  const auto* x = static_cast<const typename Elem<X>::S*>(a) + int64_t{blockIdx.x} * lda;
  float m = 0.f;
  for (int64_t k = threadIdx.x; k < K; k += kAmaxThreads) m = fmaxf(m, fabsf(Elem<X>::load1(x + k)));
  m = moe::warp_max(m);
  if (threadIdx.x % kLanes == 0) part[threadIdx.x / kLanes] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kAmaxThreads / kLanes; ++w) m = fmaxf(m, part[w]);
    out[blockIdx.x] = fmaxf(m, 1e-10f) / 448.f;
  }
}

/// fp8_w8a8 dynamic per tensor: the amax of all of a [M, K] (row stride
/// lda) joined into *amax (zeroed before) by an integer atomicMax, which
/// orders non-negative floats. Grid-stride, 256 threads.
template <DType X>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kAmaxThreads)
    moe_gemm_amax_kernel(const void* a, int64_t lda, int64_t M, int64_t K, float* amax) {
  port::grid_dependency_wait_and_release();
  __shared__ float red[kAmaxThreads / 32];
  float v = 0.f;
  for (int64_t i = int64_t{blockIdx.x} * kAmaxThreads + threadIdx.x; i < M * K; i += int64_t{gridDim.x} * kAmaxThreads)
    v = fmaxf(v, fabsf(Elem<X>::load1(static_cast<const typename Elem<X>::S*>(a) + (i / K) * lda + i % K)));
  v = moe::warp_max(v);
  constexpr int kPerWarp = kLanes < 32 ? 32 : kLanes;
  if (threadIdx.x % kPerWarp == 0) red[threadIdx.x / kPerWarp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kAmaxThreads / kPerWarp; ++w) v = fmaxf(v, red[w]);
    atomicMax(reinterpret_cast<int*>(amax), __float_as_int(v));
  }
}

/// The amax of all of a joined into *amax (zeroed first): the dynamic
/// per-tensor scale's pass (moe_gemm_fp8_tensor without a_scale).
template <DType X>
port::Error tensor_amax(const core::Problem& p, const Args& g, const LaunchScope& on, float* amax) noexcept {
  const int64_t want = (p.m * g.K + kAmaxThreads * 8 - 1) / (kAmaxThreads * 8);
  const dim3 grid(static_cast<unsigned>(want < 1024 ? (want < 1 ? 1 : want) : 1024));
#if KDISPATCH_GPU_HIP
  port::Error e = hipMemsetAsync(amax, 0, sizeof(float), on.stream);
#else
  port::Error e = cudaMemsetAsync(amax, 0, sizeof(float), on.stream);
#endif
  if (e == port::kSuccess)
    e = port::launch(moe_gemm_amax_kernel<X>, grid, dim3(kAmaxThreads), on.stream, on.pdl, g.a, g.lda, p.m, g.K, amax);
  return e;
}

#if KDISPATCH_GPU_HAS_TILED
namespace mm = moe_mma;

/// The fp8_w8a8 ops on the block-fp8 kernels: row blockIdx.x of a [M, K]
/// as e4m3fn codes by its one scale, that scale written for each of its
/// K / 128 groups (block fp8's layout: xq [M, K], xs [M, K / 128]). The
/// scale by `mode`: 0 static (scale[0]), 1 dynamic per tensor (from the
/// amax scale[0] holds), 2 dynamic per token (the row's own amax; scale
/// not read): max(amax, 1e-10) / 448.
template <DType X>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kAmaxThreads)
    moe_gemm_quant_rows_kernel(const void* a, int64_t lda, int64_t K, const float* scale, int mode, uint8_t* xq,
                               float* xs) {
  port::grid_dependency_wait_and_release();
  const int64_t t = blockIdx.x, groups = K / 128;
  const auto* x = static_cast<const typename Elem<X>::S*>(a) + t * lda;
  float s = 0.f;
  if (mode == 2) {  // the row's amax: each warp's, then the block's
    __shared__ float part[kAmaxThreads / kLanes];
    float m = 0.f;
    for (int64_t k = threadIdx.x; k < K; k += kAmaxThreads) m = fmaxf(m, fabsf(Elem<X>::load1(x + k)));
    m = moe::warp_max(m);
    if (threadIdx.x % kLanes == 0) part[threadIdx.x / kLanes] = m;
    __syncthreads();
    m = 0.f;
    for (int w = 0; w < kAmaxThreads / kLanes; ++w) m = fmaxf(m, part[w]);
    s = fmaxf(m, 1e-10f) / 448.f;
  } else {
    s = mode == 1 ? fmaxf(scale[0], 1e-10f) / 448.f : scale[0];
  }
  for (int64_t k = threadIdx.x; k < K; k += kAmaxThreads)
    xq[t * K + k] =
        static_cast<uint8_t>(__nv_cvt_float_to_fp8(clamp448(Elem<X>::load1(x + k) / s), __NV_SATFINITE, __NV_E4M3));
  for (int64_t g = threadIdx.x; g < groups; g += kAmaxThreads) xs[t * groups + g] = s;
}

/// The fp8_w8a8 ops on the block-fp8 kernels: ws [E] spread to block
/// scales out [E, nb, kb] (each of expert e's blocks ws[e]), or ones where
/// ws is null (per channel: the columns' scales applied as the kernel
/// stores). Grid-stride. (A template, as every kernel of this header: one
/// definition per TU.)
template <DType X>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kAmaxThreads)
    moe_gemm_spread_ws_kernel(const float* ws, int64_t E, int64_t per_expert, float* out) {
  port::grid_dependency_wait_and_release();
  for (int64_t i = int64_t{blockIdx.x} * kAmaxThreads + threadIdx.x; i < E * per_expert;
       i += int64_t{gridDim.x} * kAmaxThreads)
    out[i] = ws != nullptr ? ws[i / per_expert] : 1.f;
}

/// The tensor-core kernel (CUDA; bf16/fp16, and block fp8 below): fused_moe's down ring
/// (moe_mma.cuh ring_loop: cp.async stages, ldmatrix, mma.sync swap-AB) on
/// moe_align's blocks. Grid (ceil(N / 128 / tiles), min(items, 65535),
/// grid-stride over the items): item y is item y % per_block of aligned
/// block y / per_block (8 PT consecutive sorted positions), against `tiles`
/// 128-row tiles of N of the block's expert; a position holding a padding
/// id (outside [0, pairs)) reads zeros and writes nothing, an item of
/// padding only is skipped, a non-local expert's block writes zeros. N a
/// multiple of 32, K of 8, rows 16-byte aligned (ring_fits).
// Block fp8 (DT fp8_e4m3fn, 32-position items): a quantised first into
// the workspace (Quant: xq [M, K] e4m3fn codes, xs [M, K / 128] scales, the
// op's 1x128-group rule, moe_mma::moe_quant_kernel), the ring's stages one
// 128-group each with the pairs' and the row tile's scales beside the data
// (fused_moe's down ring: `fp8` the MmaArgs it reads them from); out bf16.
// N and K multiples of 128.
struct Quant {
  const uint8_t* xq = nullptr;
  const float* xs = nullptr;
};

template <DType DT, int PT>
KDISPATCH_DEVICE_INLINE void ring_item(const Args& g, const Quant& qa, const mm::MmaArgs* fp8, int tiles, int per_block,
                                       int64_t y, unsigned char* ring_smem, int* last) {
  namespace sk = gemm_skinny_mma;
  constexpr bool kFp8 = DT == DType::fp8_e4m3fn;
  using O = Elem<kFp8 ? DType::bf16 : DT>;  // a's and out's
  using S = typename O::S;
  using R = mm::RingLoads<DT, false, PT>;
  constexpr int64_t kEB = kFp8 ? 1 : 2;  // bytes of a weight element (and of a quantised a element)
  constexpr int kPairs = 8 * PT;
  const int64_t b = y / per_block;
  const int64_t first = b * g.bs + (y % per_block) * kPairs;
  const int64_t end = (b + 1) * g.bs < g.cap ? (b + 1) * g.bs : g.cap;
  if (b >= walked(g) || first >= end) return;  // the whole block
  int count = static_cast<int>(end - first < kPairs ? end - first : kPairs);
  auto pair = [&](int c) -> int64_t {  // the id at the item's position c, -1 past it or for a padding id
    const int64_t s = c < count ? g.sorted[first + c] : -1;
    return s >= 0 && s < g.pairs ? s : -1;
  };
  // The item ends at its last real id (padding may lie anywhere); padding only: nothing to do.
  if (threadIdx.x == 0) *last = 0;
  __syncthreads();
  if (static_cast<int>(threadIdx.x) < count && pair(static_cast<int>(threadIdx.x)) >= 0)
    atomicMax(last, static_cast<int>(threadIdx.x) + 1);
  __syncthreads();
  count = *last;
  if (count == 0) return;  // the whole block
  const int lane = lane_id(), warp = warp_id(), gr = lane >> 2, q = lane & 3;
  const int32_t e = g.experts[b];
  const int64_t tile0 = int64_t{blockIdx.x} * tiles;
  if (e < 0 || e >= g.E) {  // not local: zeros in the block's rows
    const int64_t r0 = tile0 * R::kTileRows,
                  r1 = (tile0 + tiles) * R::kTileRows < g.N ? (tile0 + tiles) * R::kTileRows : g.N;
    for (int c = 0; c < count; ++c)
      if (const int64_t s = pair(c); s >= 0)
        for (int64_t r = r0 + static_cast<int64_t>(threadIdx.x); r < r1; r += mm::kMmaThreads)
          O::store1(static_cast<S*>(g.out) + s * g.ldo + r, 0.f);
    return;
  }
  R ld;
  ld.m = fp8, ld.lane = lane, ld.warp = warp, ld.nt = (count + 7) / 8;
  ld.kbytes = g.K * kEB, ld.ldw = g.ldw * kEB, ld.tile0 = tile0, ld.extent = g.N, ld.expert = e;
  ld.ring = sk::smem_addr(ring_smem), ld.scales = ld.ring + mm::kRingStages * mm::kRingStageBytesOf<PT>;
  ld.evict_first = mm::evict_first_policy();
  const auto* wexp = static_cast<const unsigned char*>(g.w) + e * g.N * ld.ldw;
  const int64_t row0 = ld.warp_row(tile0);
#pragma unroll
  for (int i = 0; i < 8; ++i) ld.wsrc[i] = wexp + (row0 + (lane >> 3) + 4 * i) * ld.ldw;  // past N: never read
#pragma unroll
  for (int h = 0; h < R::kBRows; ++h) {
    const int64_t s = pair(warp * 4 + (lane >> 3) + 16 * h);
    ld.bok[h] = s >= 0;
    const int64_t t = s >= 0 ? s / g.top_k : 0;
    ld.bsrc[h] = kFp8 ? qa.xq + t * g.K : static_cast<const unsigned char*>(g.a) + t * g.lda * 2;
  }
  ld.asrc = nullptr, ld.aok = false;
  if constexpr (kFp8) {  // warp 0's lane c: the scales of position c's token
    const int64_t s = pair(lane);
    ld.aok = s >= 0;
    ld.asrc = qa.xs + (s >= 0 ? s / g.top_k : 0) * (g.K / 128);
  }
  // fp8_w8a8 per channel: the expert's column scales (out's columns are the tile's rows r + gr + ...).
  const float* const cs = kFp8 && g.wc != nullptr ? g.wc + e * g.ldwc : nullptr;
  // The epilogue reads each C column's id and weight again (L1) rather than holding 2 PT of them in registers.
  mm::ring_loop<DT, false, PT>(ld, q, tiles, ring_smem, [&](int64_t r, const float(&acc)[2][PT][4]) {
    float sc[2][2] = {{1.f, 1.f}, {1.f, 1.f}};  // [t][half]: the columns r + gr + 16 t (+ 8)
    if (cs != nullptr)
#pragma unroll
      for (int t = 0; t < 2; ++t) sc[t][0] = cs[r + gr + t * 16], sc[t][1] = cs[r + gr + t * 16 + 8];
#pragma unroll
    for (int j = 0; j < PT; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {  // C layout: acc[.][j][c] row gr, column 2q + c; acc[.][j][c + 2] row gr + 8
        const int64_t s = pair(j * 8 + 2 * q + c);
        if (s < 0) continue;
        const float w = g.tw != nullptr ? g.tw[(s / g.top_k) * g.ldtw + s % g.top_k] : 1.f;
        S* o = static_cast<S*>(g.out) + s * g.ldo + r + gr;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          O::store1(o + t * 16, acc[t][j][c] * w * sc[t][0]);
          O::store1(o + t * 16 + 8, acc[t][j][c + 2] * w * sc[t][1]);
        }
      }
  });
}

template <DType DT, int PT>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(mm::kMmaThreads, 3)
    moe_gemm_ring_kernel(Args g, Quant qa, int tiles, int per_block, int64_t items) {
  port::grid_dependency_wait_and_release();
  extern __shared__ __align__(128) unsigned char ring_smem[];
  __shared__ int last;
  mm::MmaArgs fp8{};  // block fp8: what fused_moe's down ring reads its weight scales from
  if constexpr (DT == DType::fp8_e4m3fn)
    fp8.g.s2 = g.ws, fp8.g.lds2 = g.ldws, fp8.g.H = g.N;  // the down ring's rows: N, its scales [E, N/128, ..]
  for (int64_t y = blockIdx.y; y < items; y += gridDim.y) {
    ring_item<DT, PT>(g, qa, &fp8, tiles, per_block, y, ring_smem, &last);
    __syncthreads();  // every warp past the item's ring and its `last` before the next item's
  }
}
#endif

inline Args args_of(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  const core::Dims d = core::dims_of(p);
  Args g{};
  g.a = la.data[core::kMoeGemmArgA];
  g.w = la.data[core::kMoeGemmArgW];
  g.out = la.data[core::kMoeGemmArgOut];
  g.tw = la.scalar[2] != 0.f ? static_cast<const float*>(la.data[core::kMoeGemmArgTopkWeights]) : nullptr;
  g.sorted = static_cast<const int32_t*>(la.data[core::kMoeGemmArgSorted]);
  g.experts = static_cast<const int32_t*>(la.data[core::kMoeGemmArgExpertIds]);
  g.total = static_cast<const int32_t*>(la.data[core::kMoeGemmArgTotal]);
  g.ws = static_cast<const float*>(la.data[core::kMoeGemmArgWScale]);
  g.lda = la.ld[core::kMoeGemmArgA], g.ldw = la.ld[core::kMoeGemmArgW], g.ldo = la.ld[core::kMoeGemmArgOut];
  g.ldtw = la.ld[core::kMoeGemmArgTopkWeights], g.ldws = la.ld[core::kMoeGemmArgWScale];
  g.N = p.n, g.K = p.k, g.E = p.extra[0], g.top_k = p.extra[1], g.bs = p.extra[2];
  g.pairs = p.m * p.extra[1];
  g.cap = core::moe_gemm_spec::readable(d.data(), la.ld[core::kMoeGemmArgSorted], la.ld[core::kMoeGemmArgExpertIds]);
  if (p.op == core::OpKind::moe_gemm_fp8_tensor || p.op == core::OpKind::moe_gemm_fp8_channel) {
    g.as = static_cast<const float*>(la.data[core::kMoeGemmArgAScale]);
    g.as_mode = g.as != nullptr ? kAsStatic : p.op == core::OpKind::moe_gemm_fp8_tensor ? kAsTensorAmax : kAsToken;
    g.ws_channel = p.op == core::OpKind::moe_gemm_fp8_channel ? 1 : 0;
  }
  return g;
}

/// Whether the vec kernel's loads fit the call's tensors: K a multiple of
/// 8 and every row of a and w 16-byte aligned (8 bytes for fp8 weights).
template <DType W, DType X>
bool vec_fits(const Args& g) noexcept {
  const int64_t wb = sizeof(typename moe::WeightRow<W>::S) * 8, xb = sizeof(typename Elem<X>::S) * 8;
  auto aligned = [](const void* p, int64_t bytes) { return reinterpret_cast<uintptr_t>(p) % uintptr_t(bytes) == 0; };
  return g.K % 8 == 0 && aligned(g.w, wb) && aligned(g.a, xb) &&
         (g.ldw * sizeof(typename moe::WeightRow<W>::S)) % wb == 0 && (g.lda * sizeof(typename Elem<X>::S)) % xb == 0;
}

#if KDISPATCH_GPU_HAS_TILED
/// Whether the ring kernel takes the call: N a multiple of 32, K of 8, a
/// and w 16-byte aligned with 16-byte rows (a's row stride unread at M = 1).
inline bool ring_fits(const Args& g) noexcept {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return g.N % 32 == 0 && g.K % 8 == 0 && aligned(g.a) && aligned(g.w) && (g.ldw * 2) % 16 == 0 &&
         (g.pairs == g.top_k || (g.lda * 2) % 16 == 0);
}
/// Block fp8's ring: N and K multiples of 128, w 16-byte aligned with
/// 16-byte rows, a 8-byte aligned with 8-byte rows (the quantisation's
/// loads), and a workspace of moe_gemm_fp8_ring_workspace_bytes.
inline bool fp8_workspace_fits(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  return la.workspace != nullptr && reinterpret_cast<uintptr_t>(la.workspace) % 256 == 0 &&
         la.workspace_bytes >= (p.op == core::OpKind::moe_gemm_fp8_tensor || p.op == core::OpKind::moe_gemm_fp8_channel
                                    ? moe_gemm_fp8_tensor_ring_workspace_bytes(p)
                                    : moe_gemm_fp8_ring_workspace_bytes(p));
}
inline bool ring_fits_fp8(const core::LaunchArgs& la, const core::Problem& p, const Args& g) noexcept {
  auto aligned = [](const void* q, uintptr_t b) { return reinterpret_cast<uintptr_t>(q) % b == 0; };
  return g.N % 128 == 0 && g.K % 128 == 0 && aligned(g.w, 16) && g.ldw % 16 == 0 && aligned(g.a, 8) &&
         (p.m == 1 || (g.lda * 2) % 8 == 0) && fp8_workspace_fits(la, p);
}

/// Block fp8: a quantised per 1x128 group into the workspace (xq [M, K]
/// codes, then xs [M, K / 128] scales, 256-byte aligned), on `on`'s stream.
/// moe_gemm_fp8_tensor (per tensor, static or dynamic): a quantised by its
/// one scale into the same layout, and w_scale spread to block scales
/// after them (g->ws, g->ldws then point there): the block kernels compute
/// the per-tensor op (moe_gemm_fp8_tensor_ring_workspace_bytes).
/// moe_gemm_fp8_channel: a per token (or by its static scale), the block
/// scales all 1; the caller keeps w_scale [E, N] in Args::wc for the
/// kernels' epilogues.
inline port::Error quantise(const core::LaunchArgs& la, const core::Problem& p, Args* g, const LaunchScope& on,
                            Quant* qa) noexcept {
  auto* xq = static_cast<uint8_t*>(la.workspace);
  auto* xs = reinterpret_cast<float*>(xq + moe_round256(p.m * g->K));
  qa->xq = xq, qa->xs = xs;
  if (g->as_mode == kAsBlock)
    return port::launch(mm::moe_quant_kernel<uint16_t>,
                        dim3(static_cast<unsigned>(p.m), static_cast<unsigned>((g->K / 128 + 7) / 8)),
                        dim3(kMoeQuantThreads), on.stream, on.pdl, static_cast<const uint16_t*>(g->a), g->lda, g->K, xq,
                        g->K, xs, g->K / 128);
  const int64_t nb = (g->N + 127) / 128, kb = g->K / 128;
  auto* wsb = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(xs) + moe_round256(p.m * kb * 4));
  auto* amax = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(wsb) + moe_round256(g->E * nb * kb * 4));
  port::Error e = port::kSuccess;
  const bool dynamic = g->as_mode == kAsTensorAmax;
  if (dynamic) e = tensor_amax<DType::bf16>(p, *g, on, amax);
  const int mode = dynamic ? 1 : g->as_mode == kAsToken ? 2 : 0;  // moe_gemm_quant_rows_kernel's
  if (e == port::kSuccess)
    e = port::launch(moe_gemm_quant_rows_kernel<DType::bf16>, dim3(static_cast<unsigned>(p.m)), dim3(kAmaxThreads),
                     on.stream, on.pdl, g->a, g->lda, g->K, dynamic ? static_cast<const float*>(amax) : g->as, mode, xq,
                     xs);
  const int64_t spread = (g->E * nb * kb + kAmaxThreads - 1) / kAmaxThreads;
  if (e == port::kSuccess)
    e = port::launch(moe_gemm_spread_ws_kernel<DType::bf16>, dim3(static_cast<unsigned>(spread < 1024 ? spread : 1024)),
                     dim3(kAmaxThreads), on.stream, on.pdl, g->ws_channel != 0 ? nullptr : g->ws, g->E, nb * kb, wsb);
  g->ws = wsb, g->ldws = kb;
  return e;
}

/// The ring kernel's launch: (ceil(N / 128 / tiles), min(items, 65535)),
/// items of 64 positions (moe_mma::kWideTiles) where block_size is 64 or
/// more, else of 32.
template <DType DT>
Status launch_ring(const core::LaunchArgs& la, const core::Problem& p, Args g, int64_t blocks) noexcept {
  static_assert(mm::kRingSmemBytes == kMoeRingSmemBytes && mm::kMmaThreads == kMoeMmaThreads, "the list's image check");
  constexpr bool kFp8 = DT == DType::fp8_e4m3fn;
  const bool wide = !kFp8 && g.bs >= 8 * mm::kWideTiles;  // block fp8: 32-position items (its ring's scales)
  const int64_t pairs = wide ? 8 * mm::kWideTiles : mm::kMmaPairs;
  const int64_t per_block = (g.bs + pairs - 1) / pairs, items = blocks * per_block;
  const int64_t row_tiles = (g.N + mm::RingLoads<DT, false>::kTileRows - 1) / mm::RingLoads<DT, false>::kTileRows;
  const int tiles = mm::ring_tiles(g.K * (kFp8 ? 1 : 2), row_tiles);
  if (items < 1) return Status();
  const LaunchScope on(la, p);
  Quant qa;
  port::Error e = port::kSuccess;
  if constexpr (kFp8)
    if (e = quantise(la, p, &g, on, &qa); e != port::kSuccess)
      return port::status(e, "moe_gemm quantisation kernel launch");
  const dim3 grid(static_cast<unsigned>((row_tiles + tiles - 1) / tiles),
                  static_cast<unsigned>(items < 65535 ? items : 65535));
  if (wide) {
    if constexpr (!kFp8)
      e = port::launch_smem(moe_gemm_ring_kernel<DT, mm::kWideTiles>, grid, dim3(mm::kMmaThreads),
                            mm::kRingSmemBytesOf<mm::kWideTiles>, on.stream, on.pdl, g, qa, tiles,
                            static_cast<int>(per_block), items);
  } else {
    e = port::launch_smem(moe_gemm_ring_kernel<DT, mm::kMmaTiles>, grid, dim3(mm::kMmaThreads), mm::kRingSmemBytes,
                          on.stream, on.pdl, g, qa, tiles, static_cast<int>(per_block), items);
  }
  return port::status(e, "moe_gemm ring kernel launch");
}

/// The wgmma kernel's tile: 128 sorted ids by 256 columns (4 stages) where
/// N has two such tiles, else by 128 (6 stages); image kWgmmaImage + 0 is
/// 128 wide, + 1 256. Measured on an H100 (2026-12-06, moe_gemm's two calls
/// beside the peer in one process, bench/results/wgmma.md): this rule ran at
/// 1.01/0.89/0.93/0.92x the peer on Qwen3-30B-A3B M 1024/4096 and Mixtral
/// M 1024/4096, 128 wide everywhere at 1.04/0.84/0.84/0.79x.
/// The sort's block_size 64 (two sorted blocks a tile, each consumer half
/// its own expert: two B boxes a stage) takes 128 wide, 4 stages.
inline int wgmma_bn(int64_t n, int64_t bs = 128) noexcept { return n >= 512 && bs == 128 ? 256 : 128; }
inline int wgmma_stages(int bn, int b_boxes = 1) noexcept { return bn == 256 || b_boxes == 2 ? 4 : 6; }
/// Whether the wgmma kernel takes the sort's block_size.
inline bool wgmma_block_size(int64_t bs) noexcept {
  return bs == kd_wgmma_moe::kBlockSize || bs == kd_wgmma_moe::kHalfBlockSize;
}

/// Whether the wgmma kernel (cuda/wgmma_moe.cuh) takes the call: 16-bit
/// weights, the sort's block_size 128 or 64, K a multiple of 8, a and w 16-byte
/// aligned with 16-byte rows, a's rows within int32 elements (the producer's
/// offsets), E * N rows within int32 (the TMA's coordinate), the driver's
/// tensor-map encoder present.
inline bool wgmma_fits(const Args& g, const core::Problem& p) noexcept {
  auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  const int64_t lda = p.m > 1 ? g.lda : g.K;
  return wgmma_block_size(g.bs) && g.K % 8 == 0 && aligned(g.a) && aligned(g.w) && lda % 8 == 0 && g.ldw % 8 == 0 &&
         g.ldw >= g.K && p.m * lda <= INT32_MAX && g.E * g.N + 256 <= INT32_MAX && g.ldtw <= INT32_MAX &&
         kd_wgmma::encode_fn() != nullptr;
}

/// Block fp8's wgmma kernel: K a multiple of 128 (a K-tile is a scale
/// group), w 16-byte aligned with 16-byte rows, a's rows 8-byte aligned (the
/// quantisation's loads), M * K and E * N within int32, the workspace of
/// moe_gemm_fp8_ring_workspace_bytes and the encoder.
inline bool wgmma_fits_fp8(const core::LaunchArgs& la, const core::Problem& p, const Args& g) noexcept {
  auto aligned = [](const void* q, uintptr_t b) { return reinterpret_cast<uintptr_t>(q) % b == 0; };
  return wgmma_block_size(g.bs) && g.K % 128 == 0 && aligned(g.w, 16) && g.ldw % 16 == 0 && g.ldw >= g.K &&
         aligned(g.a, 8) && (p.m == 1 || (g.lda * 2) % 8 == 0) && p.m * g.K <= INT32_MAX &&
         g.E * g.N + 256 <= INT32_MAX && g.ldtw <= INT32_MAX && g.ldws <= INT32_MAX && fp8_workspace_fits(la, p) &&
         kd_wgmma::encode_fn() != nullptr;
}

/// The wgmma kernel's launch: min(blocks * N tiles, SMs) persistent blocks;
/// the blocks past the call's total exit on the device. Block fp8: a
/// quantised first (quantise), 128-wide tiles.
template <DType DT>
Status launch_wgmma(const core::LaunchArgs& la, const core::Problem& p, Args g, int64_t blocks) noexcept {
  static_assert(gpu::moe_gemm::kWgmmaThreads == kd_wgmma::kThreads, "the list's image check");
  constexpr bool kBf16 = DT != DType::fp16, kFp8 = DT == DType::fp8_e4m3fn;
  const int bn = kFp8 ? 128 : wgmma_bn(g.N, g.bs), boxes = g.bs == kd_wgmma_moe::kBlockSize ? 1 : 2,
            stages = wgmma_stages(bn, boxes);
  CUtensorMap tw;
  const CUresult enc =
      kFp8 ? kd_wgmma::encode_operand_e4m3(kd_wgmma::encode_fn(), &tw, g.w, g.E * g.N, g.K, g.ldw, bn)
           : kd_wgmma::encode_operand(kd_wgmma::encode_fn(), &tw, g.w, g.E * g.N, g.K, g.ldw, bn, kBf16);
  if (enc != CUDA_SUCCESS) return core::needs_fallback("moe_gemm wgmma: cuTensorMapEncodeTiled refused w");
  kd_wgmma_moe::Args a{};
  a.out = g.out;
  a.a = g.a;
  a.sorted_token_ids = g.sorted;
  a.expert_ids = g.experts;
  a.num_tokens_post_pad = g.total;
  a.topk_weights = g.tw;
  a.ldo = g.ldo;
  a.lda = static_cast<int32_t>(p.m > 1 ? g.lda : g.K);
  a.ldtw = static_cast<int32_t>(g.ldtw);
  a.m = static_cast<int32_t>(p.m);
  a.n = static_cast<int32_t>(g.N);
  a.k = static_cast<int32_t>(g.K);
  a.num_experts = static_cast<int32_t>(g.E);
  a.top_k = static_cast<int32_t>(g.top_k);
  a.mul_routed_weight = g.tw != nullptr ? 1 : 0;
  a.cap = static_cast<int32_t>(g.cap);
  a.max_blocks = static_cast<int32_t>(blocks);
  a.bs = static_cast<int32_t>(g.bs);
  a.b_boxes = boxes;
  a.tiles_n = static_cast<int32_t>((g.N + bn - 1) / bn);
  a.k_tiles = static_cast<int32_t>(kFp8 ? g.K / kd_wgmma::kBK8 : (g.K + kd_wgmma::kBK - 1) / kd_wgmma::kBK);
  a.stages = stages;
  a.group_m = 8;
  a.out_vec2 = g.ldo % 2 == 0 && reinterpret_cast<uintptr_t>(g.out) % 4 == 0 ? 1 : 0;
  const DeviceState* st = device_state(p.device.ordinal);
  const int64_t sms = st != nullptr && st->info.compute_units > 0 ? st->info.compute_units : 132;
  const int64_t tiles = (blocks * g.bs + kd_wgmma::kBM - 1) / kd_wgmma::kBM * a.tiles_n;
  if (tiles < 1) return Status();
  const LaunchScope on(la, p);
  const dim3 grid(static_cast<unsigned>(tiles < sms ? tiles : sms));
  const size_t smem = static_cast<size_t>(kd_wgmma::smem_bytes(bn, stages, boxes));
  port::Error e = port::kSuccess;
  if constexpr (kFp8) {                    // the codes [M][K] (row stride K bytes) and their scales [M][K / 128]
    a.col_scales = g.wc, a.ldcs = g.ldwc;  // per channel: w_scale [E, N] in the epilogue (else null)
    Quant qa;
    if (e = quantise(la, p, &g, on, &qa); e != port::kSuccess)
      return port::status(e, "moe_gemm quantisation kernel launch");
    a.a = qa.xq, a.lda = static_cast<int32_t>(g.K), a.a_scales = qa.xs;
    a.w_scales = g.ws, a.ldws = static_cast<int32_t>(g.ldws);
    e = port::launch_smem(kd_wgmma_moe::moe_gemm_kernel<true, 128, true>, grid, dim3(kd_wgmma::kThreads), smem,
                          on.stream, on.pdl, tw, a);
  } else {
    e = bn == 256 ? port::launch_smem(kd_wgmma_moe::moe_gemm_kernel<kBf16, 256>, grid, dim3(kd_wgmma::kThreads), smem,
                                      on.stream, on.pdl, tw, a)
                  : port::launch_smem(kd_wgmma_moe::moe_gemm_kernel<kBf16, 128>, grid, dim3(kd_wgmma::kThreads), smem,
                                      on.stream, on.pdl, tw, a);
  }
  return port::status(e, "moe_gemm wgmma kernel launch");
}
#endif

/// The split kernel (vec or element by element) or the reference one of
/// (W, X) over the call's sorted blocks, on `on`'s stream.
template <DType W, DType X>
Status launch_split_or_ref(gpu::moe_gemm::Family f, const Args& g, const LaunchScope& on) noexcept {
  using gpu::moe_gemm::Family;
  const int64_t blocks = (g.cap + g.bs - 1) / g.bs;
  port::Error e = port::kSuccess;
  if (f == Family::reference) {
    const int64_t n = (g.cap * g.N + kRefThreads - 1) / kRefThreads;
    const dim3 grid(static_cast<unsigned>(n < (int64_t{1} << 20) ? n : int64_t{1} << 20));
    e = port::launch(moe_gemm_ref_kernel<W, X>, grid, dim3(kRefThreads), on.stream, on.pdl, g);
  } else {
    const int64_t tiles = (g.N + gpu::moe_gemm::kRowsPerBlock - 1) / gpu::moe_gemm::kRowsPerBlock;
    if (tiles > INT_MAX) return make_status(StatusCode::invalid_argument, "moe_gemm: N beyond one grid");
    const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
    e = f == Family::vec ? port::launch(moe_gemm_split_kernel<W, X, true>, grid, dim3(kThreads), on.stream, on.pdl, g)
                         : port::launch(moe_gemm_split_kernel<W, X, false>, grid, dim3(kThreads), on.stream, on.pdl, g);
  }
  return port::status(e, "moe_gemm kernel launch");
}

/// The fp8_w8a8 ops (moe_gemm_fp8_tensor / _channel) on the split and
/// reference kernels (the ring and wgmma families run split here), after
/// the amax pass of a dynamic per-tensor scale into the call's workspace.
template <DType X>
Status launch_scaled(gpu::moe_gemm::Family f, const core::LaunchArgs& la, const core::Problem& p, Args g) noexcept {
  using gpu::moe_gemm::Family;
  constexpr DType W = DType::fp8_e4m3fn;
  if (f == Family::ring || f == Family::wgmma) f = vec_fits<W, X>(g) ? Family::vec : Family::generic;
  if (f == Family::vec && !vec_fits<W, X>(g))
    return core::needs_fallback("moe_gemm_fp8 vec: K not a multiple of 8, or a or w rows not aligned");
  const LaunchScope on(la, p);
  port::Error e = port::kSuccess;
  if (g.as_mode == kAsTensorAmax) {
    if (la.workspace == nullptr || la.workspace_bytes < 4 || reinterpret_cast<uintptr_t>(la.workspace) % 4 != 0)
      return make_status(StatusCode::invalid_argument,
                         "moe_gemm_fp8_tensor: a dynamic scale (no a_scale) takes the call's workspace "
                         "(4 bytes: workspace_bytes, CallOptions::workspace or the stream's)");
    auto* amax = static_cast<float*>(la.workspace);
    if (e = tensor_amax<X>(p, g, on, amax); e != port::kSuccess)
      return port::status(e, "moe_gemm_fp8 amax kernel launch");
    g.as = amax;
  }
  // The channel op's dynamic scale on the split kernels: each row's by a pass
  // into the workspace where the call gives M floats, else in the kernel.
  if (g.as_mode == kAsToken && f != Family::reference && la.workspace != nullptr &&
      la.workspace_bytes >= moe_gemm_fp8_row_scales_bytes(p) && reinterpret_cast<uintptr_t>(la.workspace) % 4 == 0 &&
      p.m <= INT32_MAX) {
    auto* scales = static_cast<float*>(la.workspace);
    if (e = port::launch(moe_gemm_row_scales_kernel<X>, dim3(static_cast<unsigned>(p.m)), dim3(kAmaxThreads), on.stream,
                         on.pdl, g.a, g.lda, g.K, scales);
        e != port::kSuccess)
      return port::status(e, "moe_gemm_fp8 row scales kernel launch");
    g.as = scales, g.as_mode = kAsRowScales;
  }
  return launch_split_or_ref<W, X>(f, g, on);
}

/// Enqueues family `f` (gpu::moe_gemm::Family) on la.stream.
template <DType W, DType X>
Status launch(gpu::moe_gemm::Family f, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  using gpu::moe_gemm::Family;
  if (p.m < 1) return Status();
  const Args g = args_of(la, p);
  if (g.a == nullptr || g.w == nullptr || g.out == nullptr || g.sorted == nullptr || g.experts == nullptr ||
      g.total == nullptr || (la.scalar[2] != 0.f && g.tw == nullptr))
    return make_status(StatusCode::invalid_argument, "moe_gemm: a tensor is null");
  if (W == DType::fp8_e4m3fn && g.ws == nullptr)
    return make_status(StatusCode::invalid_argument, "moe_gemm: fp8 weights without w_scale");
  if (g.cap < 0 || g.cap > INT_MAX) return make_status(StatusCode::invalid_argument, "moe_gemm: too many pairs");
#if KDISPATCH_GPU_HAS_TILED
  // moe_gemm_fp8_tensor on block fp8's wgmma and ring kernels (a quantised
  // by its one scale, w_scale spread to block scales) where they take the
  // call; else the split kernels (launch_scaled), as block fp8 falls back.
  // moe_gemm_fp8_channel too: a per token, block scales of 1, w_scale
  // applied per column by the kernels' epilogues (Args::wc).
  if constexpr (W == DType::fp8_e4m3fn)
    if (g.as_mode != kAsBlock && (f == Family::wgmma || f == Family::ring)) {
      Args gc = g;
      if (g.ws_channel != 0) gc.wc = g.ws, gc.ldwc = g.ldws;
      const int64_t walked_blocks = (g.cap + g.bs - 1) / g.bs;
      if (f == Family::wgmma && wgmma_fits_fp8(la, p, gc))
        if (Status s = launch_wgmma<W>(la, p, gc, walked_blocks); s.code() != core::kNeedsFallbackCode) return s;
      if (ring_fits_fp8(la, p, gc)) return launch_ring<W>(la, p, gc, walked_blocks);
    }
#endif
  if constexpr (W == DType::fp8_e4m3fn)
    if (g.as_mode != kAsBlock) return launch_scaled<X>(f, la, p, g);
  if (f == Family::vec && !vec_fits<W, X>(g))
    return core::needs_fallback("moe_gemm vec: K not a multiple of 8, or a or w rows not aligned for 8-element loads");
#if KDISPATCH_GPU_HAS_TILED
  const int64_t blocks = (g.cap + g.bs - 1) / g.bs;
  // wgmma where it fits the call; else the ring's path below (and its
  // split fallback), in this launch: wgmma is get_default's plan from 16 or
  // 64 pairs an expert, and a needs_fallback from the default would run the
  // reference kernel (api/ops.cpp).
  if constexpr (W == X && W != DType::fp8_e4m3fn)
    if (f == Family::wgmma) {
      if (wgmma_fits(g, p))  // an encoder refusing the map: nothing enqueued yet, the ring's path
        if (Status s = launch_wgmma<W>(la, p, g, blocks); s.code() != core::kNeedsFallbackCode) return s;
      f = Family::ring;
    }
  if constexpr (W == X && W != DType::fp8_e4m3fn)
    if (f == Family::ring && ring_fits(g)) return launch_ring<W>(la, p, g, blocks);
  if constexpr (W == DType::fp8_e4m3fn)
    if (f == Family::wgmma) {
      if (wgmma_fits_fp8(la, p, g))  // as above
        if (Status s = launch_wgmma<W>(la, p, g, blocks); s.code() != core::kNeedsFallbackCode) return s;
      f = Family::ring;
    }
  if constexpr (W == DType::fp8_e4m3fn)
    if (f == Family::ring && ring_fits_fp8(la, p, g)) return launch_ring<W>(la, p, g, blocks);
#endif
  if (f == Family::ring || f == Family::wgmma) f = vec_fits<W, X>(g) ? Family::vec : Family::generic;
  return launch_split_or_ref<W, X>(f, g, LaunchScope(la, p));
}

/// Fills out[kernel_index] for the kernels of (W, X) on the current device.
template <DType W, DType X>
void probe(KernelImage* out) noexcept {
  out[0] = image_of(moe_gemm_split_kernel<W, X, true>);
  out[1] = image_of(moe_gemm_split_kernel<W, X, false>);
  out[2] = image_of(moe_gemm_ref_kernel<W, X>);
#if KDISPATCH_GPU_HAS_TILED
  if constexpr (W == X && W != DType::fp8_e4m3fn) {
    out[3] = image_with_smem(moe_gemm_ring_kernel<W, mm::kMmaTiles>, mm::kRingSmemBytes);
    out[4] = image_with_smem(moe_gemm_ring_kernel<W, mm::kWideTiles>, mm::kRingSmemBytesOf<mm::kWideTiles>);
    // [5], [6]: wgmma 128 and 256 wide (sm_90a only: loadable where the device runs this TU's sm_90a code).
    const bool runs = kd_wgmma::sm90a_code_runs();
    out[5] = wgmma_image(kd_wgmma_moe::moe_gemm_kernel<W == DType::bf16, 128>, kd_wgmma::smem_bytes(128, 6), runs);
    out[6] = wgmma_image(kd_wgmma_moe::moe_gemm_kernel<W == DType::bf16, 256>, kd_wgmma::smem_bytes(256, 4), runs);
  }
  if constexpr (W == DType::fp8_e4m3fn) {  // [4]: the quantisation kernel (no wide items in fp8)
    out[3] = image_with_smem(moe_gemm_ring_kernel<W, mm::kMmaTiles>, mm::kRingSmemBytes);
    out[4] = image_of(mm::moe_quant_kernel<uint16_t>);
    // [5]: wgmma, 128 wide (sm_90a only)
    out[5] = wgmma_image(kd_wgmma_moe::moe_gemm_kernel<true, 128, true>, kd_wgmma::smem_bytes(128, wgmma_stages(128)),
                         kd_wgmma::sm90a_code_runs());
    out[6] = image_of(moe_gemm_amax_kernel<X>);        // [6]: the fp8_w8a8 ops' per-tensor amax
    out[7] = image_of(moe_gemm_quant_rows_kernel<X>);  // [7], [8]: moe_gemm_fp8_tensor on the block kernels
    out[8] = image_of(moe_gemm_spread_ws_kernel<X>);
    out[9] = image_of(moe_gemm_row_scales_kernel<X>);  // [9]: moe_gemm_fp8_channel's row scales (split)
  }
#endif
}

}  // namespace dispatch::KDISPATCH_GPU_NS::moe_gemm

/// The body of kernels/<backend>/moe_gemm_<w>.{cu,hip}: instantiates the
/// kernels of weights `w` and activations `x` and defines its launcher and
/// image probe (gpu/moe_gemm_launch.hpp, gpu/backend_decls.hpp).
#define KDISPATCH_MOE_GEMM_TU(w, x)                                                                 \
  dispatch::Status dispatch::KDISPATCH_GPU_NS::launch_moe_gemm_##w(                                 \
      gpu::moe_gemm::Family f, const core::LaunchArgs& la, const core::Problem& p) noexcept {       \
    return moe_gemm::launch<DType::w, DType::x>(f, la, p);                                          \
  }                                                                                                 \
  void dispatch::KDISPATCH_GPU_NS::probe_moe_gemm_##w(KernelImage* out, const ProbeEnv&) noexcept { \
    moe_gemm::probe<DType::w, DType::x>(out);                                                       \
  }
