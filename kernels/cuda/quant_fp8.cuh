// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — fp8 activation quantisation (src/ops/quant_fp8.hpp),
// one translation unit per input dtype (kernels/cuda/quant_fp8_<dt>.cu):
// x (fp32, fp16, bf16) -> q e4m3fn plus fp32 scales,
//   scale = max(amax, 1e-10) / 448 over the layout's group,
//   q = e4m3fn(fmin(fmax(x / scale, -448), 448)) (Mul: x * (1 / scale)),
// rounded to nearest even (cvt.rn.satfinite), as the CPU variants and the
// spec's reference.
//
//   token   one block of num_warps warps per row: the row's amax (block
//           reduction), then the row quantised (re-read from L1/L2)
//   group   one warp per (row, 128-wide K group), 4 elements per lane;
//           consecutive warps take consecutive rows of one group, so the
//           M-major scales are written together
//   tensor  a zeroed scale, an amax pass (grid-stride; each block's max
//           joins scale[0] by an integer atomicMax, which orders
//           non-negative floats), the quantisation pass reading that amax,
//           and a one-thread pass turning it into the scale: four stream-
//           ordered steps, graph-capturable; at M = 0 the zeroed scale
//           and the finish pass alone (scale_of(0): the op's launch when
//           empty)
#pragma once

#include <cuda_fp8.h>

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/backend_decls.hpp"
#include "gpu/elem.cuh"
#include "cuda/fp8_launch.hpp"
#include "gpu/fp8_plan.hpp"
#include "gpu/launch_util.hpp"
#include "ops/quant_fp8.hpp"

namespace dispatch::cuda::quant_fp8 {

inline constexpr float kMax = 448.f;

struct Args {
  uint8_t* q;
  const void* x;
  float* scale;
  int64_t ldq, ldx, lds;
  int64_t m, k;
};

KDISPATCH_DEVICE_INLINE float scale_of(float amax) { return fmaxf(amax, core::kQuantMinAmax) / kMax; }

template <bool Mul>
KDISPATCH_DEVICE_INLINE uint8_t quantise(float x, float scale, float inv) {
  const float v = fminf(fmaxf(Mul ? x * inv : x / scale, -kMax), kMax);
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

KDISPATCH_DEVICE_INLINE float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Max over the block (every thread gets it); `red` holds 32 floats.
KDISPATCH_DEVICE_INLINE float block_max(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < warps ? red[lane] : 0.f;
  return warp_max(v);
}

template <DType DT, bool Mul>
__global__ void __launch_bounds__(256) token_kernel(Args g) {
  port::grid_dependency_wait_and_release();
  using E = Elem<DT>;
  __shared__ float red[32];
  const int64_t m = blockIdx.x;
  const auto* x = static_cast<const typename E::S*>(g.x) + m * g.ldx;
  float amax = 0.f;
  for (int64_t l = threadIdx.x; l < g.k; l += blockDim.x) amax = fmaxf(amax, fabsf(E::load1(x + l)));
  amax = block_max(amax, red);
  const float scale = scale_of(amax), inv = 1.f / scale;
  uint8_t* q = g.q + m * g.ldq;
  for (int64_t l = threadIdx.x; l < g.k; l += blockDim.x) q[l] = quantise<Mul>(E::load1(x + l), scale, inv);
  if (threadIdx.x == 0) g.scale[m] = scale;
}

template <DType DT, bool Mul>
__global__ void __launch_bounds__(256) group_kernel(Args g) {
  port::grid_dependency_wait_and_release();
  using E = Elem<DT>;
  constexpr int G = core::kQuantGroup;
  const int lane = threadIdx.x & 31;
  const int64_t groups = (g.k + G - 1) / G;
  const int64_t gi = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (gi >= groups * g.m) return;
  const int64_t kb = gi / g.m, m = gi % g.m;
  const auto* x = static_cast<const typename E::S*>(g.x) + m * g.ldx + kb * G;
  const int64_t n = g.k - kb * G < G ? g.k - kb * G : G;
  float v[4];
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t l = lane + 32 * j;
    v[j] = l < n ? E::load1(x + l) : 0.f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  amax = warp_max(amax);
  const float scale = scale_of(amax), inv = 1.f / scale;
  uint8_t* q = g.q + m * g.ldq + kb * G;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t l = lane + 32 * j;
    if (l < n) q[l] = quantise<Mul>(v[j], scale, inv);
  }
  if (lane == 0) g.scale[kb * g.lds + m] = scale;
}

template <DType DT>
__global__ void __launch_bounds__(256) tensor_amax_kernel(Args g) {
  port::grid_dependency_wait_and_release();
  using E = Elem<DT>;
  __shared__ float red[32];
  const int64_t total = g.m * g.k, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float amax = 0.f;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step)
    amax = fmaxf(amax, fabsf(E::load1(static_cast<const typename E::S*>(g.x) + (i / g.k) * g.ldx + i % g.k)));
  amax = block_max(amax, red);
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<int*>(g.scale), __float_as_int(amax));
}

template <DType DT, bool Mul>
__global__ void __launch_bounds__(256) tensor_quant_kernel(Args g) {
  port::grid_dependency_wait_and_release();
  using E = Elem<DT>;
  const float scale = scale_of(*g.scale), inv = 1.f / scale;  // scale[0] holds the amax here
  const int64_t total = g.m * g.k, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t m = i / g.k, l = i % g.k;
    g.q[m * g.ldq + l] = quantise<Mul>(E::load1(static_cast<const typename E::S*>(g.x) + m * g.ldx + l), scale, inv);
  }
}

template <DType DT>  // one copy per translation unit (per input dtype)
__global__ void tensor_finish_kernel(float* scale) {
  port::grid_dependency_wait_and_release();
  *scale = scale_of(*scale);
}

inline Status fill_args(const core::LaunchArgs& la, const core::Problem& p, Args* g) {
  using namespace core;
  if (!la.data[kQuantArgQ] || !la.data[kQuantArgX] || !la.data[kQuantArgScale])
    return make_status(StatusCode::invalid_argument, "quant_fp8: q, x and scale must not be null");
  g->q = la.ptr<uint8_t>(kQuantArgQ);
  g->x = la.data[kQuantArgX];
  g->scale = la.ptr<float>(kQuantArgScale);
  g->ldq = la.ld[kQuantArgQ];
  g->ldx = la.ld[kQuantArgX];
  g->lds = la.ld[kQuantArgScale];
  g->m = p.m;
  g->k = p.k;
  return Status();
}

/// Layout index (gpu::fp8): 0 tensor, 1 token, 2 group.
template <DType DT, bool Mul>
Status launch(int layout, int warps, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  Args g;
  if (p.m < 1) {  // the per-tensor scale is still written (OpSpec::launches_when_empty): scale_of(0)
    if (layout != 0) return Status();
    float* scale = la.ptr<float>(core::kQuantArgScale);
    if (scale == nullptr) return make_status(StatusCode::invalid_argument, "quant_fp8_tensor: scale must not be null");
    const LaunchScope on(la, p);
    port::Error e = cudaMemsetAsync(scale, 0, sizeof(float), on.stream);
    if (e == port::kSuccess) e = port::launch(tensor_finish_kernel<DT>, dim3(1), dim3(1), on.stream, on.pdl, scale);
    if (e != port::kSuccess) (void)cudaGetLastError();
    return port::status(e, "quant_fp8 kernel launch");
  }
  if (Status st = fill_args(la, p, &g); !st.ok()) return st;
  const LaunchScope on(la, p);
  const dim3 block(static_cast<unsigned>(32 * warps));
  port::Error e = port::kSuccess;
  if (layout == 1) {
    if (p.m > INT32_MAX) return make_status(StatusCode::unsupported_problem, "quant_fp8_token: M must be < 2^31");
    e = port::launch(token_kernel<DT, Mul>, dim3(static_cast<unsigned>(p.m)), block, on.stream, on.pdl, g);
  } else if (layout == 2) {
    const int64_t groups = (p.k + core::kQuantGroup - 1) / core::kQuantGroup * p.m;
    const int64_t blocks = (groups + warps - 1) / warps;
    if (blocks > INT32_MAX) return make_status(StatusCode::unsupported_problem, "quant_fp8_group: too many groups");
    e = port::launch(group_kernel<DT, Mul>, dim3(static_cast<unsigned>(blocks)), block, on.stream, on.pdl, g);
  } else {
    const int64_t want = (p.m * p.k + 32 * warps * 8 - 1) / (32 * warps * 8);
    const dim3 grid(static_cast<unsigned>(want < 1024 ? want : 1024));
    e = cudaMemsetAsync(g.scale, 0, sizeof(float), on.stream);
    if (e == port::kSuccess) e = port::launch(tensor_amax_kernel<DT>, grid, block, on.stream, on.pdl, g);
    if (e == port::kSuccess) e = port::launch(tensor_quant_kernel<DT, Mul>, grid, block, on.stream, on.pdl, g);
    if (e == port::kSuccess) e = port::launch(tensor_finish_kernel<DT>, dim3(1), dim3(1), on.stream, on.pdl, g.scale);
  }
  if (e != port::kSuccess) (void)cudaGetLastError();
  return port::status(e, "quant_fp8 kernel launch");
}

/// out[layout * kQuantKernels + (0 multiply, 1 division)]: the images of the kernels a point
/// of that layout launches (the tensor layout's amax and finish kernels
/// folded into its entries).
template <DType DT>
void probe(KernelImage* out) noexcept {
  constexpr int Q = gpu::fp8::kQuantKernels;
  auto both = [](KernelImage a, KernelImage b) { return a.loadable ? b : a; };
  const KernelImage shared = both(image_of(tensor_amax_kernel<DT>), image_of(tensor_finish_kernel<DT>));
  out[0 * Q + 0] = both(shared, image_of(tensor_quant_kernel<DT, true>));
  out[0 * Q + 1] = both(shared, image_of(tensor_quant_kernel<DT, false>));
  out[1 * Q + 0] = image_of(token_kernel<DT, true>);
  out[1 * Q + 1] = image_of(token_kernel<DT, false>);
  out[2 * Q + 0] = image_of(group_kernel<DT, true>);
  out[2 * Q + 1] = image_of(group_kernel<DT, false>);
}

}  // namespace dispatch::cuda::quant_fp8

/// The body of kernels/cuda/quant_fp8_<dt>.cu.
#define KDISPATCH_QUANT_FP8_TU(dt)                                                                            \
  namespace dispatch::cuda {                                                                                  \
  Status launch_quant_fp8_##dt(int layout, int warps, bool mul, const core::LaunchArgs& la,                   \
                               const core::Problem& p) noexcept {                                             \
    return mul ? quant_fp8::launch<DType::dt, true>(layout, warps, la, p)                                     \
               : quant_fp8::launch<DType::dt, false>(layout, warps, la, p);                                   \
  }                                                                                                           \
  static_assert(gpu::fp8::kLayouts * gpu::fp8::kQuantKernels <= kMaxImagesPerTu);                             \
  void probe_quant_fp8_##dt(KernelImage* out, const ProbeEnv&) noexcept { quant_fp8::probe<DType::dt>(out); } \
  }
