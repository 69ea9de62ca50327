// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — silu_and_mul kernels, written once for CUDA and
// HIP (gpu/port.hpp). Each kernels/<backend>/silu_and_mul_<dtype>
// translation unit instantiates them for one dtype with KDISPATCH_SILU_TU
// (4 kernels per TU; families and params: gpu/silu_plan.hpp).
//
//   out[t, i] = silu(g) * u,  g = x[t, i], u = x[t, d + i],
//   silu(g) = g / (1 + exp(-g)), in fp32, rounded once to the dtype.
//
// Why the kernels look the way they do. Per token the op reads 2d and
// writes d elements and does ~6 flops per element, so it is a copy:
//  - the vec family makes 16-byte accesses only (8 bf16/fp16, 4 fp32), and
//    each thread issues all its loads (unroll gate vectors, unroll up
//    vectors) before the first use, so 32 or 64 bytes per thread are in
//    flight; x goes through the read-only path (the op never writes it: out
//    may not overlap x); the result is stored with plain stores so the next
//    kernel (the down projection) finds it in L2;
//  - the math stays off the critical path: ex2.approx of a pre-scaled
//    argument (__expf) and the approximate division (__fdividef): two MUFU
//    ops per element, ~40% of an H200's MUFU rate at full memory speed;
//    __fdividef(g, inf) = 0 keeps the g -> -inf limit (0) exact;
//  - short rows (d = 64) would leave most of a block idle at one row per
//    block: a block then takes several rows (gpu/silu_plan.hpp: lanes,
//    rows_per_block); many rows are walked grid-stride along y (more than
//    65535 row groups);
//  - on sm_90+ every kernel is launched with programmatic dependent launch
//    and starts with griddepcontrol.wait + launch_dependents, as the norms
//    (KDISPATCH_PDL=0 turns it off).
#pragma once

#include <climits>

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/backend_decls.hpp"
#include "gpu/elem.cuh"
#include "gpu/launch_util.hpp"
#include "gpu/silu_launch.hpp"
#include "gpu/silu_plan.hpp"
#include "ops/silu_and_mul.hpp"

namespace dispatch::KDISPATCH_GPU_NS::silu {

using gpu::silu::Family;
using gpu::silu::Launch;

/// Kernel parameters, by value.
struct Args {
  const void* x;        ///< [rows][ldx], gate in [0, d), up in [d, 2d)
  void* out;            ///< [rows][ldo]
  int64_t ldx, ldo;     ///< row strides in elements
  int64_t rows;         ///< tokens
  int64_t row_groups;   ///< ceil(rows / rows_per_block)
  int32_t d;            ///< elements per row of out
  int32_t accesses;     ///< accesses per row (d / elements per access)
  int32_t lanes;        ///< threads per row (a power of two)
  int32_t lanes_shift;  ///< log2(lanes)
  int32_t rows_per_block;
};

/// silu(g) * u, the fast path: __expf and __fdividef.
KDISPATCH_DEVICE_INLINE float silu_mul_fast(float g, float u) { return __fdividef(g, 1.f + __expf(-g)) * u; }

// ------------------------------------------------------------------ vec kernel

/// 16-byte accesses, U per thread per row tile, lanes apart.
template <DType DT, int U>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(gpu::silu::kMaxBlockThreads) vec_kernel(Args a) {
  using E = Elem<DT>;
  using S = typename E::S;
  constexpr int V = E::kVec;
  port::grid_dependency_wait_and_release();
  const int lane = static_cast<int>(threadIdx.x) & (a.lanes - 1);
  const int sub = static_cast<int>(threadIdx.x) >> a.lanes_shift;
  const int col0 = static_cast<int>(blockIdx.x) * (a.lanes * U) + lane;
  for (int64_t g = blockIdx.y; g < a.row_groups; g += gridDim.y) {
    const int64_t row = g * a.rows_per_block + sub;
    if (row >= a.rows) break;  // later groups hold later rows
    const S* gr = static_cast<const S*>(a.x) + row * a.ldx;
    const S* ur = gr + a.d;
    S* orow = static_cast<S*>(a.out) + row * a.ldo;
    uint4 gv[U], uv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = col0 + u * a.lanes;
      if (i < a.accesses) {
        gv[u] = port::load16_ro(gr + i * V);
        uv[u] = port::load16_ro(ur + i * V);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = col0 + u * a.lanes;
      if (i < a.accesses) {
        float f[V], h[V];
        E::unpack(gv[u], f);
        E::unpack(uv[u], h);
#pragma unroll
        for (int j = 0; j < V; ++j) f[j] = silu_mul_fast(f[j], h[j]);
        port::store16(orow + i * V, E::pack(f));
      }
    }
  }
}

// ------------------------------------------------------------------ generic kernel

/// Any d, any alignment, any row stride: one element per access,
/// kGenericUnroll per thread per row tile, lanes apart.
template <DType DT>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(gpu::silu::kMaxBlockThreads) generic_kernel(Args a) {
  using E = Elem<DT>;
  using S = typename E::S;
  constexpr int U = gpu::silu::kGenericUnroll;
  port::grid_dependency_wait_and_release();
  const int lane = static_cast<int>(threadIdx.x) & (a.lanes - 1);
  const int sub = static_cast<int>(threadIdx.x) >> a.lanes_shift;
  const int col0 = static_cast<int>(blockIdx.x) * (a.lanes * U) + lane;
  for (int64_t g = blockIdx.y; g < a.row_groups; g += gridDim.y) {
    const int64_t row = g * a.rows_per_block + sub;
    if (row >= a.rows) break;
    const S* gr = static_cast<const S*>(a.x) + row * a.ldx;
    const S* ur = gr + a.d;
    S* orow = static_cast<S*>(a.out) + row * a.ldo;
    float gv[U], uv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = col0 + u * a.lanes;
      if (i < a.d) {
        gv[u] = E::load1(gr + i);
        uv[u] = E::load1(ur + i);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = col0 + u * a.lanes;
      if (i < a.d) E::store1(orow + i, silu_mul_fast(gv[u], uv[u]));
    }
  }
}

// ------------------------------------------------------------------ reference kernel

/// The validation baseline: deliberately plain (one element per thread,
/// IEEE expf and division), sharing no code path with the fast kernels
/// beyond the element conversions.
template <DType DT>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(gpu::silu::kReferenceThreads) reference_kernel(Args a) {
  using E = Elem<DT>;
  using S = typename E::S;
  port::grid_dependency_wait_and_release();
  const int lane = static_cast<int>(threadIdx.x) & (a.lanes - 1);
  const int sub = static_cast<int>(threadIdx.x) >> a.lanes_shift;
  const int i = static_cast<int>(blockIdx.x) * a.lanes + lane;
  if (i >= a.d) return;
  for (int64_t g = blockIdx.y; g < a.row_groups; g += gridDim.y) {
    const int64_t row = g * a.rows_per_block + sub;
    if (row >= a.rows) break;
    const S* xr = static_cast<const S*>(a.x) + row * a.ldx;
    const float gate = E::load1(xr + i);
    const float up = E::load1(xr + a.d + i);
    E::store1(static_cast<S*>(a.out) + row * a.ldo + i, gate / (1.f + expf(-gate)) * up);
  }
}

// ------------------------------------------------------------------ host side

/// Enqueues one launch on la.stream. Checks the launch (not the kernel's
/// completion). The vec family declines (kNeedsFallbackCode: the call runs
/// get_default's plan) when a pointer or a row stride is not 16-byte
/// aligned; supports() already declines such a problem by its align_bytes.
template <DType DT>
Status launch(const Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  using E = Elem<DT>;
  constexpr int64_t es = sizeof(typename E::S);
  if (p.m < 1) return Status();
  if (p.n > INT_MAX / 2) return make_status(StatusCode::invalid_argument, "silu_and_mul: d must be below 2^30");
  Args a;
  a.x = la.data[core::kSiluArgX];
  a.out = la.data[core::kSiluArgOut];
  a.ldx = la.ld[core::kSiluArgX];
  a.ldo = la.ld[core::kSiluArgOut];
  if (a.x == nullptr || a.out == nullptr)
    return make_status(StatusCode::invalid_argument, "silu_and_mul: out and x must not be null");
  if (l.family == Family::vec) {
    const bool ok = aligned16(a.x) && aligned16(a.out) && p.n % E::kVec == 0 &&
                    (p.m == 1 || ((a.ldx * es) % 16 == 0 && (a.ldo * es) % 16 == 0));
    if (!ok) return core::needs_fallback("silu_and_mul vec: out or x (base or row stride) not 16-byte aligned");
  }
  if (l.lanes < 1 || (l.lanes & (l.lanes - 1)) != 0 || l.rows_per_block < 1 || l.threads != l.lanes * l.rows_per_block)
    return make_status(StatusCode::internal, "silu_and_mul: malformed launch shape");
  a.rows = p.m;
  a.rows_per_block = l.rows_per_block;
  a.row_groups = gpu::silu::ceil_div(p.m, l.rows_per_block);
  a.d = static_cast<int32_t>(p.n);
  a.accesses = static_cast<int32_t>(l.accesses);
  a.lanes = l.lanes;
  a.lanes_shift = 0;
  while ((1 << a.lanes_shift) < l.lanes) ++a.lanes_shift;
  if (l.tiles_x > INT_MAX) return make_status(StatusCode::invalid_argument, "silu_and_mul: d too large for one grid");
  const dim3 grid(static_cast<unsigned>(l.tiles_x),
                  static_cast<unsigned>(a.row_groups < gpu::silu::kMaxGridY ? a.row_groups : gpu::silu::kMaxGridY));
  const dim3 block(static_cast<unsigned>(l.threads));
  const LaunchScope on(la, p);
  port::Error e = port::kSuccess;
  switch (l.family) {
    case Family::vec:
      if (l.unroll == 1)
        e = port::launch(vec_kernel<DT, 1>, grid, block, on.stream, on.pdl, a);
      else if (l.unroll == 2)
        e = port::launch(vec_kernel<DT, 2>, grid, block, on.stream, on.pdl, a);
      else
        return make_status(StatusCode::invalid_argument, "silu_and_mul: unroll is not one of 1, 2");
      return port::status(e, "silu_and_mul vec kernel launch");
    case Family::generic:
      e = port::launch(generic_kernel<DT>, grid, block, on.stream, on.pdl, a);
      return port::status(e, "silu_and_mul generic kernel launch");
    case Family::reference:
      e = port::launch(reference_kernel<DT>, grid, block, on.stream, on.pdl, a);
      return port::status(e, "silu_and_mul reference kernel launch");
  }
  return make_status(StatusCode::internal, "silu_and_mul: unknown family");
}

/// Fills out[kernel_index] for every kernel of DT on the current device.
template <DType DT>
void probe(KernelImage* out) noexcept {
  using gpu::silu::kernel_index;
  out[kernel_index(Family::vec, 1)] = image_of(vec_kernel<DT, 1>);
  out[kernel_index(Family::vec, 2)] = image_of(vec_kernel<DT, 2>);
  out[kernel_index(Family::generic, 0)] = image_of(generic_kernel<DT>);
  out[kernel_index(Family::reference, 0)] = image_of(reference_kernel<DT>);
}

}  // namespace dispatch::KDISPATCH_GPU_NS::silu

/// The body of kernels/<backend>/silu_and_mul_<dtype>.{cu,hip}: instantiates
/// the kernels of one dtype and defines its launcher and image probe.
#define KDISPATCH_SILU_TU(dt)                                                                               \
  namespace dispatch::KDISPATCH_GPU_NS {                                                                    \
  Status launch_silu_and_mul_##dt(const gpu::silu::Launch& l, const core::LaunchArgs& la,                   \
                                  const core::Problem& p) noexcept {                                        \
    return silu::launch<DType::dt>(l, la, p);                                                               \
  }                                                                                                         \
  static_assert(gpu::silu::kKernelsPerDtype <= kMaxImagesPerTu);                                            \
  void probe_silu_and_mul_##dt(KernelImage* out, const ProbeEnv&) noexcept { silu::probe<DType::dt>(out); } \
  }
