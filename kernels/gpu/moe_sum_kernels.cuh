// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — moe_sum kernels, written once for CUDA and HIP
// (gpu/port.hpp). Each kernels/<backend>/moe_sum_<dtype> translation unit
// instantiates them for one dtype with KDISPATCH_MOE_SUM_TU (3 kernels per
// TU; families and params: gpu/moe_sum_plan.hpp).
//
//   out[t, h] = routed_scaling_factor * sum_{j < top_k} input[t, j, h],
//   in fp32, j ascending, rounded once to the dtype.
//
// Why the kernels look the way they do. Per token the op reads top_k rows
// and writes one, one add per element read: a copy.
//  - One kernel template, sum_kernel<DT, kVec16>, serves both portable
//    families: 16-byte accesses (uint4 through the read-only path) where
//    hidden and the alignment allow (vec), one element per access
//    elsewhere (generic). A thread owns one access of hidden and walks the
//    tokens (blockIdx.y, grid-stride): no index arithmetic but a multiply
//    per token, and every warp-wide access is contiguous. It issues kChunk
//    choices' loads before their adds, so kChunk * 16 bytes are in flight
//    per thread; the adds stay in ascending j (deterministic, and the
//    order of the CPU variants and of the reference kernel).
//  - Blocks are whole warps (port::kWarpSize: 32 on NVIDIA, 64 on CDNA);
//    nothing is exchanged between threads.
//  - On sm_90+ every kernel is launched with programmatic dependent launch
//    and starts with griddepcontrol.wait + launch_dependents (KDISPATCH_PDL=0
//    turns it off), as the other memory-bound kernels.
#pragma once

#include <climits>

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/backend_decls.hpp"
#include "gpu/elem.cuh"
#include "gpu/launch_util.hpp"
#include "gpu/moe_sum_launch.hpp"
#include "gpu/moe_sum_plan.hpp"
#include "ops/moe_sum.hpp"

namespace dispatch::KDISPATCH_GPU_NS::moe_sum {

using gpu::moe_sum::Family;
using gpu::moe_sum::Launch;

static_assert(gpu::moe_sum::kMaxBlockThreads % port::kWarpSize == 0, "blocks are whole warps");
static_assert(gpu::moe_sum::kKernelsPerDtype <= kMaxImagesPerTu);

/// Kernel parameters, by value.
struct Args {
  const void* in;    ///< [tokens * top_k][ldi]: token t's choice j is row t * top_k + j
  void* out;         ///< [tokens][ldo]
  int64_t ldi, ldo;  ///< row strides in elements
  int64_t tokens;
  int64_t hidden;    ///< elements per row
  int32_t top_k;     ///< choices per token
  int32_t accesses;  ///< accesses per row (hidden / elements per access)
  float scale;       ///< routed_scaling_factor
};

/// One access of `W` elements: its raw load, its fp32 add and its store.
template <DType DT, bool kVec16>
struct Access;

/// 16 bytes: Elem<DT>::kVec elements.
template <DType DT>
struct Access<DT, true> {
  using E = Elem<DT>;
  using S = typename E::S;
  using Raw = uint4;
  static constexpr int W = E::kVec;
  static KDISPATCH_DEVICE_INLINE Raw load(const S* p) { return port::load16_ro(p); }
  static KDISPATCH_DEVICE_INLINE void set(const Raw& r, float (&acc)[W]) { E::unpack(r, acc); }
  static KDISPATCH_DEVICE_INLINE void add(const Raw& r, float (&acc)[W]) {
    float f[W];
    E::unpack(r, f);
#pragma unroll
    for (int w = 0; w < W; ++w) acc[w] += f[w];
  }
  static KDISPATCH_DEVICE_INLINE void store(S* p, const float (&acc)[W]) { port::store16(p, E::pack(acc)); }
};

/// One element.
template <DType DT>
struct Access<DT, false> {
  using E = Elem<DT>;
  using S = typename E::S;
  using Raw = S;
  static constexpr int W = 1;
  static KDISPATCH_DEVICE_INLINE Raw load(const S* p) { return *p; }
  static KDISPATCH_DEVICE_INLINE void set(const Raw& r, float (&acc)[1]) { acc[0] = E::load1(&r); }
  static KDISPATCH_DEVICE_INLINE void add(const Raw& r, float (&acc)[1]) { acc[0] += E::load1(&r); }
  static KDISPATCH_DEVICE_INLINE void store(S* p, const float (&acc)[1]) { E::store1(p, acc[0]); }
};

// ------------------------------------------------------------------ the portable kernel

/// vec (kVec16) and generic: grid (ceil(accesses / blockDim.x), tokens).
template <DType DT, bool kVec16>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(gpu::moe_sum::kMaxBlockThreads) sum_kernel(Args a) {
  using A = Access<DT, kVec16>;
  constexpr int C = gpu::moe_sum::kChunk;
  port::grid_dependency_wait_and_release();
  const int64_t col = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * A::W;
  if (col >= int64_t{a.accesses} * A::W) return;
  const auto* in = static_cast<const typename A::S*>(a.in) + col;
  auto* out = static_cast<typename A::S*>(a.out) + col;
  for (int64_t t = blockIdx.y; t < a.tokens; t += gridDim.y) {
    const auto* src = in + t * a.top_k * a.ldi;
    float acc[A::W];
    A::set(A::load(src), acc);
    for (int j = 1; j < a.top_k; j += C) {
      typename A::Raw r[C];
#pragma unroll
      for (int u = 0; u < C; ++u)
        if (j + u < a.top_k) r[u] = A::load(src + (j + u) * a.ldi);
#pragma unroll
      for (int u = 0; u < C; ++u)
        if (j + u < a.top_k) A::add(r[u], acc);
    }
#pragma unroll
    for (int w = 0; w < A::W; ++w) acc[w] *= a.scale;
    A::store(out + t * a.ldo, acc);
  }
}

// ------------------------------------------------------------------ reference kernel

/// The validation baseline: deliberately plain (every (token, element)
/// grid-stride along x, a rolled loop over the choices), sharing nothing
/// with sum_kernel beyond the element conversions.
template <DType DT>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(gpu::moe_sum::kReferenceThreads) reference_kernel(Args a) {
  using E = Elem<DT>;
  port::grid_dependency_wait_and_release();
  const int64_t n = a.tokens * a.hidden;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const int64_t t = e / a.hidden, h = e % a.hidden;
    const typename E::S* x = static_cast<const typename E::S*>(a.in) + t * a.top_k * a.ldi + h;
    float acc = E::load1(x);
    for (int j = 1; j < a.top_k; ++j) acc += E::load1(x + j * a.ldi);
    E::store1(static_cast<typename E::S*>(a.out) + t * a.ldo + h, acc * a.scale);
  }
}

// ------------------------------------------------------------------ host side

/// Whether the vec family's 16-byte accesses are legal on these tensors:
/// aligned bases and, where there is more than one row, row strides.
inline bool vec_fits(const Args& a, int64_t elem_bytes) noexcept {
  const bool in_rows = a.tokens * a.top_k == 1 || (a.ldi * elem_bytes) % 16 == 0;
  const bool out_rows = a.tokens == 1 || (a.ldo * elem_bytes) % 16 == 0;
  return aligned16(a.in) && aligned16(a.out) && in_rows && out_rows;
}

/// Enqueues one launch on la.stream and checks the launch (not the
/// kernel's completion). The vec family declines (kNeedsFallbackCode: the
/// call runs get_default's plan) on tensors vec_fits refuses; supports()
/// already declines such a problem by its align_bytes.
template <DType DT>
Status launch(const Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  if (p.m < 1) return Status();
  if (p.k > INT_MAX || l.accesses > INT_MAX || l.threads < 1)
    return make_status(StatusCode::invalid_argument, "moe_sum: top_k or hidden beyond one grid");
  const Args a{la.data[core::kMoeSumArgInput],
               la.data[core::kMoeSumArgOut],
               la.ld[core::kMoeSumArgInput],
               la.ld[core::kMoeSumArgOut],
               p.m,
               p.n,
               static_cast<int32_t>(p.k),
               static_cast<int32_t>(l.accesses),
               la.scalar[0]};
  if (a.in == nullptr || a.out == nullptr)
    return make_status(StatusCode::invalid_argument, "moe_sum: input and out must not be null");
  if (l.family == Family::vec && !vec_fits(a, sizeof(typename Elem<DT>::S)))
    return core::needs_fallback("moe_sum vec: input or out (base or row stride) not 16-byte aligned");
  const LaunchScope on(la, p);
  const dim3 block(static_cast<unsigned>(l.threads));
  port::Error e = port::kSuccess;
  if (l.family == Family::reference) {
    const int64_t blocks = (p.m * p.n + l.threads - 1) / l.threads;
    const dim3 grid(
        static_cast<unsigned>(blocks < gpu::moe_sum::kMaxReferenceBlocks ? blocks : gpu::moe_sum::kMaxReferenceBlocks));
    e = port::launch(reference_kernel<DT>, grid, block, on.stream, on.pdl, a);
  } else {
    const dim3 grid(static_cast<unsigned>((l.accesses + l.threads - 1) / l.threads),
                    static_cast<unsigned>(p.m < gpu::moe_sum::kMaxGridY ? p.m : gpu::moe_sum::kMaxGridY));
    e = l.family == Family::vec ? port::launch(sum_kernel<DT, true>, grid, block, on.stream, on.pdl, a)
                                : port::launch(sum_kernel<DT, false>, grid, block, on.stream, on.pdl, a);
  }
  return port::status(e, "moe_sum kernel launch");
}

/// Fills out[kernel_index] for every kernel of DT on the current device.
template <DType DT>
void probe(KernelImage* out) noexcept {
  out[0] = image_of(sum_kernel<DT, true>);
  out[1] = image_of(sum_kernel<DT, false>);
  out[2] = image_of(reference_kernel<DT>);
}

}  // namespace dispatch::KDISPATCH_GPU_NS::moe_sum

/// The body of kernels/<backend>/moe_sum_<dtype>.{cu,hip}: instantiates the
/// kernels of one dtype and defines its launcher and image probe
/// (gpu/moe_sum_launch.hpp, gpu/backend_decls.hpp).
#define KDISPATCH_MOE_SUM_TU(dt)                                                                    \
  dispatch::Status dispatch::KDISPATCH_GPU_NS::launch_moe_sum_##dt(                                 \
      const gpu::moe_sum::Launch& l, const core::LaunchArgs& la, const core::Problem& p) noexcept { \
    return moe_sum::launch<DType::dt>(l, la, p);                                                    \
  }                                                                                                 \
  void dispatch::KDISPATCH_GPU_NS::probe_moe_sum_##dt(KernelImage* out, const ProbeEnv&) noexcept { \
    moe_sum::probe<DType::dt>(out);                                                                 \
  }
