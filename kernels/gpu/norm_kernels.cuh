// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — RMSNorm and fused add + RMSNorm kernels, written
// once for CUDA and HIP (gpu/port.hpp). Each kernels/<backend>/<op>_<dtype>
// translation unit instantiates them for one (op, dtype) with
// KDISPATCH_NORM_TU, so a build compiles 12 kernels per TU and 6 TUs per
// backend in parallel (families and params: gpu/norm_plan.hpp).
//
//   rmsnorm:            y = x / sqrt(mean(x^2) + eps) * w
//   fused_add_rmsnorm:  z = x + residual in fp32, rounded to the storage
//                       dtype and stored to residual; x = rmsnorm(z as stored) * w
//   (sum of squares in fp32; the output is (v * inv_rms) * w in fp32, rounded
//   once; the same order as the CPU backend)
//
// Why the kernels look the way they do. The op moves hidden x tokens x
// (2 or 4) bytes x (1 read + 1 write; 2 + 2 for the fused op) and computes
// almost nothing, so:
//  - at many tokens it is a copy: the vector families use 16-byte accesses
//    and keep the row in registers between the sum of squares and the scale
//    (x is read once, not twice); every load of a thread's part of the row,
//    and its weight chunks, is issued before the first use, so unroll x 16
//    bytes (x 2 or 3) are in flight per thread;
//  - at few tokens it is latency: one pass, shuffles only for the warp
//    family, a single barrier for the block family (each warp writes its
//    partial, one barrier, every warp re-reduces the partials: no second
//    barrier, no broadcast); the sum of squares is accumulated in `vec`
//    independent chains so its dependency chain is unroll long, not
//    unroll x vec;
//  - the weight goes through the read-only path (it is re-read by every row
//    and stays in L1/L2); x and the residual use plain coherent loads because
//    the op may write them in place;
//  - on sm_90+ every kernel is launched with programmatic dependent launch
//    and starts with griddepcontrol.wait + launch_dependents: back-to-back
//    kernels (a CUDA graph of a model's layers) overlap the next launch with
//    the current kernel, the largest single gain at few tokens (graph replay
//    geomean vs the best peer 1.09x without, 1.23x with, tokens <= 1024 on an
//    H200). KDISPATCH_PDL=0 turns it off.
#pragma once

#include <climits>

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/backend_decls.hpp"
#include "gpu/elem.cuh"
#include "gpu/launch_util.hpp"
#include "gpu/norm_launch.hpp"
#include "gpu/norm_plan.hpp"
#include "ops/fused_add_rmsnorm.hpp"
#include "ops/rmsnorm.hpp"

namespace dispatch::KDISPATCH_GPU_NS::norm {

using gpu::norm::Family;
using gpu::norm::Launch;
using port::kWarpSize;

/// Kernel parameters, by value (one 80-byte constant-bank block).
struct Args {
  const void* x;
  void* y;  ///< the output: y (rmsnorm) or x (fused, in place)
  void* r;  ///< residual (fused only)
  const void* w;
  int64_t ldx, ldy, ldr;  ///< row strides in elements
  int32_t rows, hidden;
  float eps;
};

// ------------------------------------------------------------------ reductions

/// Sum over the block; every thread gets it. One barrier: each warp writes
/// its partial, then every warp reduces all partials itself. `red` holds
/// one float per warp; used once per block (one row per block).
KDISPATCH_DEVICE_INLINE float block_sum(float v, float* red) {
  v = port::warp_sum(v);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int wid = static_cast<int>(threadIdx.x) / kWarpSize;
  const int nw = static_cast<int>(blockDim.x) / kWarpSize;
  if (lane == 0) red[wid] = v;
  __syncthreads();
  v = lane < nw ? red[lane] : 0.f;
  return port::warp_sum(v);
}

// ------------------------------------------------------------------ register-resident kernel

/// warp / block families: 16-byte chunks, the row held in registers.
template <DType DT, int U, bool kWarp, bool kFused>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(gpu::norm::max_threads_for_unroll(U, kWarp))
    resident_kernel(Args a) {
  using E = Elem<DT>;
  using S = typename E::S;
  constexpr int V = E::kVec;
  port::grid_dependency_wait_and_release();
  int row, lane, width;
  if constexpr (kWarp) {
    row = static_cast<int>(blockIdx.x) * (static_cast<int>(blockDim.x) / kWarpSize) +
          static_cast<int>(threadIdx.x) / kWarpSize;
    if (row >= a.rows) return;  // whole warps leave: the shuffles below see full warps
    lane = static_cast<int>(threadIdx.x) % kWarpSize;
    width = kWarpSize;
  } else {
    row = static_cast<int>(blockIdx.x);
    lane = static_cast<int>(threadIdx.x);
    width = static_cast<int>(blockDim.x);
  }
  const int nvec = a.hidden / V;
  const S* xr = static_cast<const S*>(a.x) + row * a.ldx;
  const S* wr = static_cast<const S*>(a.w);
  S* rr = kFused ? static_cast<S*>(a.r) + row * a.ldr : nullptr;
  S* yr = static_cast<S*>(a.y) + row * (kFused ? a.ldx : a.ldy);

  uint4 xv[U], wv[U];
  uint4 rv[kFused ? U : 1];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = lane + u * width;
    if (i < nvec) {
      xv[u] = port::load16(xr + i * V);
      if constexpr (kFused) rv[u] = port::load16(rr + i * V);
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = lane + u * width;
    if (i < nvec) wv[u] = port::load16_ro(wr + i * V);
  }

  float acc[V];
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = 0.f;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = lane + u * width;
    if (i < nvec) {
      float f[V];
      E::unpack(xv[u], f);
      if constexpr (kFused) {
        float g[V];
        E::unpack(rv[u], g);
#pragma unroll
        for (int j = 0; j < V; ++j) f[j] += g[j];
        xv[u] = E::pack(f);  // z rounded to the storage dtype ...
        port::store16(rr + i * V, xv[u]);
        E::unpack(xv[u], f);  // ... and the norm is taken of z as stored
      }
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += f[j] * f[j];
    }
  }
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < V; ++j) ss += acc[j];
  if constexpr (kWarp) {
    ss = port::warp_sum(ss);
  } else {
    __shared__ float red[gpu::norm::kMaxBlockThreads / kWarpSize];
    ss = block_sum(ss, red);
  }
  const float inv = port::rsqrt(ss / static_cast<float>(a.hidden) + a.eps);

#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = lane + u * width;
    if (i < nvec) {
      float f[V], g[V];
      E::unpack(xv[u], f);
      E::unpack(wv[u], g);
#pragma unroll
      for (int j = 0; j < V; ++j) f[j] = f[j] * inv * g[j];
      port::store16(yr + i * V, E::pack(f));
    }
  }
}

// ------------------------------------------------------------------ generic kernel

/// Any hidden, any alignment: one element per access, two passes over the
/// row (pass 2 re-reads x, or the residual as stored, mostly from L1/L2).
/// Each thread re-reads in pass 2 exactly the elements it wrote in pass 1.
template <DType DT, bool kFused>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(gpu::norm::kMaxBlockThreads) generic_kernel(Args a) {
  using E = Elem<DT>;
  using S = typename E::S;
  __shared__ float red[gpu::norm::kMaxBlockThreads / kWarpSize];
  port::grid_dependency_wait_and_release();
  const int row = static_cast<int>(blockIdx.x);
  const int n = a.hidden;
  const int step = static_cast<int>(blockDim.x);
  const S* xr = static_cast<const S*>(a.x) + row * a.ldx;
  const S* wr = static_cast<const S*>(a.w);
  S* rr = kFused ? static_cast<S*>(a.r) + row * a.ldr : nullptr;
  S* yr = static_cast<S*>(a.y) + row * (kFused ? a.ldx : a.ldy);
  float acc0 = 0.f, acc1 = 0.f;
  int i = static_cast<int>(threadIdx.x);
  for (; i + step < n; i += 2 * step) {
    float f0 = E::load1(xr + i), f1 = E::load1(xr + i + step);
    if constexpr (kFused) {
      f0 = E::round1(f0 + E::load1(rr + i));
      f1 = E::round1(f1 + E::load1(rr + i + step));
      E::store1(rr + i, f0);
      E::store1(rr + i + step, f1);
    }
    acc0 += f0 * f0;
    acc1 += f1 * f1;
  }
  if (i < n) {
    float f = E::load1(xr + i);
    if constexpr (kFused) {
      f = E::round1(f + E::load1(rr + i));
      E::store1(rr + i, f);
    }
    acc0 += f * f;
  }
  const float ss = block_sum(acc0 + acc1, red);
  const float inv = port::rsqrt(ss / static_cast<float>(n) + a.eps);
  const S* src = kFused ? rr : xr;
#pragma unroll 4
  for (int j = static_cast<int>(threadIdx.x); j < n; j += step)
    E::store1(yr + j, E::load1(src + j) * inv * E::load1(wr + j));
}

// ------------------------------------------------------------------ reference kernel

/// The validation baseline: deliberately plain (scalar, shared-memory tree
/// reduction, IEEE division and square root), sharing no code path with
/// the fast kernels beyond the element conversions.
template <DType DT, bool kFused>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(gpu::norm::kReferenceThreads) reference_kernel(Args a) {
  using E = Elem<DT>;
  using S = typename E::S;
  constexpr int T = gpu::norm::kReferenceThreads;
  __shared__ float part[T];
  port::grid_dependency_wait_and_release();
  const int row = static_cast<int>(blockIdx.x);
  const int tid = static_cast<int>(threadIdx.x);
  const S* xr = static_cast<const S*>(a.x) + row * a.ldx;
  const S* wr = static_cast<const S*>(a.w);
  S* rr = kFused ? static_cast<S*>(a.r) + row * a.ldr : nullptr;
  S* yr = static_cast<S*>(a.y) + row * (kFused ? a.ldx : a.ldy);
  float ss = 0.f;
  for (int i = tid; i < a.hidden; i += T) {
    float f = E::load1(xr + i);
    if constexpr (kFused) {
      E::store1(rr + i, f + E::load1(rr + i));
      f = E::load1(rr + i);
    }
    ss += f * f;
  }
  part[tid] = ss;
  __syncthreads();
  for (int s = T / 2; s > 0; s >>= 1) {
    if (tid < s) part[tid] += part[tid + s];
    __syncthreads();
  }
  const float inv = 1.f / sqrtf(part[0] / static_cast<float>(a.hidden) + a.eps);
  for (int i = tid; i < a.hidden; i += T) {
    const float f = kFused ? E::load1(rr + i) : E::load1(xr + i);
    E::store1(yr + i, f * inv * E::load1(wr + i));
  }
}

// ------------------------------------------------------------------ host side

/// Generic-kernel threads for a row: the smallest power of two >= hidden/4
/// in [64, 1024] (about four elements per thread and pass).
inline int32_t generic_threads_for(int64_t hidden) noexcept {
  int32_t t = 64;
  while (t < gpu::norm::kMaxBlockThreads && int64_t{t} * 4 < hidden) t *= 2;
  return t;
}

template <DType DT, int U, bool kFused>
inline port::Error launch_resident(bool warp, dim3 grid, dim3 block, port::Stream s, bool pdl, const Args& a) {
  return warp ? port::launch(resident_kernel<DT, U, true, kFused>, grid, block, s, pdl, a)
              : port::launch(resident_kernel<DT, U, false, kFused>, grid, block, s, pdl, a);
}

/// Enqueues one launch on la.stream. Checks the launch (not the kernel's
/// completion). The vector families fall back to the generic kernel when a
/// pointer or a row stride is not 16-byte aligned.
template <DType DT, bool kFused>
Status launch(const Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  using E = Elem<DT>;
  if (p.m < 1) return Status();
  if (p.m > INT_MAX || p.n > INT_MAX)
    return make_status(StatusCode::invalid_argument, "norm: tokens and hidden must be below 2^31");
  // Argument slots: rmsnorm (y, x, w), fused_add_rmsnorm (x, residual, w).
  constexpr int kX = kFused ? core::kFusedArgX : core::kNormArgX;
  constexpr int kW = kFused ? core::kFusedArgW : core::kNormArgW;
  Args a;
  a.x = la.data[kX];
  a.y = kFused ? la.data[core::kFusedArgX] : la.data[core::kNormArgY];
  a.r = kFused ? la.data[core::kFusedArgResidual] : nullptr;
  a.w = la.data[kW];
  a.ldx = la.ld[kX];
  a.ldy = kFused ? 0 : la.ld[core::kNormArgY];
  a.ldr = kFused ? la.ld[core::kFusedArgResidual] : 0;
  a.rows = static_cast<int32_t>(p.m);
  a.hidden = static_cast<int32_t>(p.n);
  a.eps = la.scalar[0];
  if (a.x == nullptr || a.w == nullptr || (kFused ? a.r == nullptr : a.y == nullptr))
    return make_status(StatusCode::invalid_argument, kFused ? "fused_add_rmsnorm: x, residual and w must not be null"
                                                            : "rmsnorm: x, y and w must not be null");
  Launch k = l;
  if (k.family == Family::warp || k.family == Family::block) {
    constexpr int64_t es = sizeof(typename E::S);
    const bool ok =
        aligned16(a.x) && aligned16(a.y) && aligned16(a.w) && (!kFused || aligned16(a.r)) &&
        (p.m == 1 || ((a.ldx * es) % 16 == 0 && (kFused ? (a.ldr * es) % 16 == 0 : (a.ldy * es) % 16 == 0)));
    if (!ok) {
      k.family = Family::generic;
      k.threads = generic_threads_for(p.n);
    }
  }
  const LaunchScope on(la, p);
  port::Error e = port::kSuccess;
  switch (k.family) {
    case Family::warp:
    case Family::block: {
      const bool warp = k.family == Family::warp;
      const dim3 block(static_cast<unsigned>(k.threads));
      const dim3 grid(static_cast<unsigned>(warp ? gpu::norm::ceil_div(p.m, k.rows_per_block) : p.m));
      switch (k.unroll) {
        case 1: e = launch_resident<DT, 1, kFused>(warp, grid, block, on.stream, on.pdl, a); break;
        case 2: e = launch_resident<DT, 2, kFused>(warp, grid, block, on.stream, on.pdl, a); break;
        case 4: e = launch_resident<DT, 4, kFused>(warp, grid, block, on.stream, on.pdl, a); break;
        case 8: e = launch_resident<DT, 8, kFused>(warp, grid, block, on.stream, on.pdl, a); break;
        case 16: e = launch_resident<DT, 16, kFused>(warp, grid, block, on.stream, on.pdl, a); break;
        default: return make_status(StatusCode::invalid_argument, "norm: unroll is not one of 1, 2, 4, 8, 16");
      }
      return port::status(e, warp ? "norm warp kernel launch" : "norm block kernel launch");
    }
    case Family::generic:
      e = port::launch(generic_kernel<DT, kFused>, dim3(static_cast<unsigned>(p.m)),
                       dim3(static_cast<unsigned>(k.threads)), on.stream, on.pdl, a);
      return port::status(e, "norm generic kernel launch");
    case Family::reference:
      e = port::launch(reference_kernel<DT, kFused>, dim3(static_cast<unsigned>(p.m)),
                       dim3(gpu::norm::kReferenceThreads), on.stream, on.pdl, a);
      return port::status(e, "norm reference kernel launch");
  }
  return make_status(StatusCode::internal, "norm: unknown family");
}

/// Fills out[kernel_index] for every kernel of (DT, kFused) on the current device.
template <DType DT, bool kFused>
void probe(KernelImage* out) noexcept {
  using gpu::norm::kernel_index;
  out[kernel_index(Family::warp, 1)] = image_of(resident_kernel<DT, 1, true, kFused>);
  out[kernel_index(Family::warp, 2)] = image_of(resident_kernel<DT, 2, true, kFused>);
  out[kernel_index(Family::warp, 4)] = image_of(resident_kernel<DT, 4, true, kFused>);
  out[kernel_index(Family::warp, 8)] = image_of(resident_kernel<DT, 8, true, kFused>);
  out[kernel_index(Family::warp, 16)] = image_of(resident_kernel<DT, 16, true, kFused>);
  out[kernel_index(Family::block, 1)] = image_of(resident_kernel<DT, 1, false, kFused>);
  out[kernel_index(Family::block, 2)] = image_of(resident_kernel<DT, 2, false, kFused>);
  out[kernel_index(Family::block, 4)] = image_of(resident_kernel<DT, 4, false, kFused>);
  out[kernel_index(Family::block, 8)] = image_of(resident_kernel<DT, 8, false, kFused>);
  out[kernel_index(Family::block, 16)] = image_of(resident_kernel<DT, 16, false, kFused>);
  out[kernel_index(Family::generic, 0)] = image_of(generic_kernel<DT, kFused>);
  out[kernel_index(Family::reference, 0)] = image_of(reference_kernel<DT, kFused>);
}

}  // namespace dispatch::KDISPATCH_GPU_NS::norm

/// The body of kernels/<backend>/<op>_<dtype>.{cu,hip}: instantiates the
/// kernels of one (op, dtype) and defines its launcher and image probe.
#define KDISPATCH_NORM_TU(op, dt, fused)                                                                               \
  namespace dispatch::KDISPATCH_GPU_NS {                                                                               \
  Status launch_##op##_##dt(const gpu::norm::Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept { \
    return norm::launch<DType::dt, fused>(l, la, p);                                                                   \
  }                                                                                                                    \
  static_assert(gpu::norm::kKernelsPerDtype <= kMaxImagesPerTu);                                                       \
  void probe_##op##_##dt(KernelImage* out, const ProbeEnv&) noexcept { norm::probe<DType::dt, fused>(out); }           \
  }
