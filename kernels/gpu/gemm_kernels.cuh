// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — the portable GEMM kernels (CUDA and HIP through
// gpu/port.hpp): the skinny family and the reference. Families, spaces and
// requirements: gpu/gemm_plan.hpp. Each kernels/<backend>/gemm_skinny_<dt>
// translation unit instantiates them for one input dtype with
// KDISPATCH_GEMM_SKINNY_TU (15 skinny kernels + 1 reference per TU).
//
//   D[m, n] = sum_k A[m, k] * B[n, k]  (+ bias[n]),  fp32 accumulation,
//   A [M, K] row stride lda, B [N, K] row stride ldb (nn.Linear's weight),
//   D [M, N] row stride ldd; D and bias bf16, fp16 or fp32 (runtime).
//
// skinny: at decode time (M <= 16) a GEMM is a read of the weight: N*K*2
// bytes against 2*M*N*K flops, far below the tensor cores' balance point. So
// the kernel is a streaming reduction, tuned like the norm kernels for bytes
// in flight: every lane loads 16-byte chunks of `R` weight rows for U chunks
// before it uses any (R x U x 16 bytes in flight per lane), then multiplies
// them with the matching chunks of the M activation rows (tiny: they stay in
// L1/L2 and are re-read by every warp). A block of `split_k` warps shares the
// same R rows and splits K between its warps (chunk c of K goes to warp c %
// split_k); the warps' partial sums meet in shared memory and are added in
// warp order, so the result does not depend on scheduling. Few rows of B
// (N = 1280) still fill the machine through split_k; many rows (N = 28672)
// need none.
#pragma once

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/backend_decls.hpp"
#include "gpu/gemm_launch.hpp"
#include "gpu/gemm_plan.hpp"
#include "gpu/launch_util.hpp"
#include "ops/gemm.hpp"

namespace dispatch::KDISPATCH_GPU_NS::gemm {

using port::kWarpSize;

/// Kernel parameters, by value.
struct Args {
  const void* a;
  const void* b;
  void* d;
  const void* bias;  ///< null: no bias
  int64_t lda, ldb, ldd;
  int32_t m, n, k;
  int32_t out_dtype;  ///< DType of D and bias
};

template <DType DT>
struct In;
template <>
struct In<DType::bf16> {
  static KDISPATCH_DEVICE_INLINE float2 widen(uint32_t u) { return port::bf16x2_to_float2(u); }
  static KDISPATCH_DEVICE_INLINE float one(uint16_t h) { return port::bits_to_float(static_cast<uint32_t>(h) << 16); }
};
template <>
struct In<DType::fp16> {
  static KDISPATCH_DEVICE_INLINE float2 widen(uint32_t u) { return port::fp16x2_to_float2(u); }
  static KDISPATCH_DEVICE_INLINE float one(uint16_t h) { return port::fp16x2_to_float2(h).x; }
};

/// Loads element n of the bias (dtype of D) as float.
KDISPATCH_DEVICE_INLINE float load_out(const void* p, int32_t dt, int64_t i) {
  if (dt == static_cast<int32_t>(DType::fp32)) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  if (dt == static_cast<int32_t>(DType::bf16)) return port::bits_to_float(static_cast<uint32_t>(h) << 16);
  return port::fp16x2_to_float2(h).x;
}

/// Stores v as D's dtype (round to nearest even).
KDISPATCH_DEVICE_INLINE void store_out(void* p, int32_t dt, int64_t i, float v) {
  if (dt == static_cast<int32_t>(DType::fp32)) {
    static_cast<float*>(p)[i] = v;
  } else if (dt == static_cast<int32_t>(DType::bf16)) {
    static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(port::float2_to_bf16x2(v, 0.f) & 0xffffu);
  } else {
    static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(port::float2_to_fp16x2(v, 0.f) & 0xffffu);
  }
}

/// Dot product of two 16-byte chunks of 8 elements, added to acc.
template <DType DT>
KDISPATCH_DEVICE_INLINE float dot8(const uint4& x, const uint4& y, float acc) {
  const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
  const uint32_t ys[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = In<DT>::widen(xs[i]);
    const float2 b = In<DT>::widen(ys[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

// ------------------------------------------------------------------ skinny

/// Chunks of K per lane per loop trip (loads in flight before use).
template <int MT>
struct SkinnyUnroll {
  static constexpr int value = MT <= 4 ? 4 : 2;
};

/// One block: rows [n0, n0 + R) of B (columns of D), M rows [m0, m0 + MT)
/// of A (blockIdx.y chunk), split_k = blockDim.x / warp warps along K.
/// Launch bound: split_k <= 8 warps (256 threads on NVIDIA, 512 on CDNA's
/// 64-wide wavefronts).
template <DType DT, int MT, int R>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(8 * port::kWarpSize) skinny_kernel(Args g) {
  constexpr int U = SkinnyUnroll<MT>::value;
  constexpr int kChunk = 8;  // elements per 16-byte load
  port::grid_dependency_wait_and_release();
  extern __shared__ float partial[];  // [split_k][MT * R]
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int split_k = static_cast<int>(blockDim.x) / kWarpSize;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * R;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * MT;
  const auto* A = static_cast<const uint16_t*>(g.a);
  const auto* B = static_cast<const uint16_t*>(g.b);

  // Rows of B past N read row N-1 (their sums are discarded); rows of A past
  // M read row M-1 likewise: no branch inside the loop.
  const uint16_t* brow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) brow[r] = B + (n0 + r < g.n ? n0 + r : g.n - 1) * g.ldb;
  const uint16_t* arow[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) arow[i] = A + (m0 + i < g.m ? m0 + i : g.m - 1) * g.lda;

  float acc[MT][R];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.f;

  // Chunk c (8 elements) of K is loaded by lane (c % warp) of warp
  // ((c / warp) % split_k); a trip covers U chunks per lane.
  const int64_t stride = static_cast<int64_t>(kWarpSize) * split_k * kChunk;  // elements per "row" of chunks
  int64_t k0 = (static_cast<int64_t>(warp) * kWarpSize + lane) * kChunk;
  for (; k0 < g.k; k0 += stride * U) {
    uint4 bv[U][R];
    // No branch around a load (it would split the trip into basic blocks and
    // the loads would stop overlapping): the offset is clamped to this
    // trip's first chunk (in range), the value zeroed after.
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = k0 + u * stride;
      const int64_t kc = k < g.k ? k : k0;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint4 v = port::load16_ro(brow[r] + kc);
        bv[u][r] = k < g.k ? v : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int i = 0; i < MT; ++i) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t k = k0 + u * stride;
        const int64_t kc = k < g.k ? k : k0;
        const uint4 av0 = port::load16_ro(arow[i] + kc);
        const uint4 av = k < g.k ? av0 : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[i][r] = dot8<DT>(av, bv[u][r], acc[i][r]);
      }
    }
  }

  // Warp sums, then the warps' partials in warp order.
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = port::warp_sum(acc[i][r]);
      if (lane == 0) partial[warp * (MT * R) + i * R + r] = v;
    }
  __syncthreads();
  for (int t = static_cast<int>(threadIdx.x); t < MT * R; t += static_cast<int>(blockDim.x)) {
    const int i = t / R, r = t % R;
    const int64_t m = m0 + i, n = n0 + r;
    if (m >= g.m || n >= g.n) continue;
    float v = 0.f;
    for (int w = 0; w < split_k; ++w) v += partial[w * (MT * R) + t];
    if (g.bias) v += load_out(g.bias, g.out_dtype, n);
    store_out(g.d, g.out_dtype, m * g.ldd + n, v);
  }
}

// ------------------------------------------------------------------ reference

inline constexpr int kRefTile = 16;

/// 16 x 16 outputs per block, K in shared-memory tiles of 16, each output
/// summed in K order in fp32: any shape, stride and alignment.
template <DType DT>
__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kRefTile* kRefTile) reference_kernel(Args g) {
  port::grid_dependency_wait_and_release();
  __shared__ float as[kRefTile][kRefTile + 1];
  __shared__ float bs[kRefTile][kRefTile + 1];
  const int tx = static_cast<int>(threadIdx.x) % kRefTile, ty = static_cast<int>(threadIdx.x) / kRefTile;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kRefTile + tx;
  const int64_t m = static_cast<int64_t>(blockIdx.y) * kRefTile + ty;
  const auto* A = static_cast<const uint16_t*>(g.a);
  const auto* B = static_cast<const uint16_t*>(g.b);
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < g.k; k0 += kRefTile) {
    // as[ty][tx] = A[m][k0 + tx];  bs[ty][tx] = B[n_of_row ty][k0 + tx]
    const int64_t am = static_cast<int64_t>(blockIdx.y) * kRefTile + ty;
    const int64_t bn = static_cast<int64_t>(blockIdx.x) * kRefTile + ty;
    as[ty][tx] = (am < g.m && k0 + tx < g.k) ? In<DT>::one(A[am * g.lda + k0 + tx]) : 0.f;
    bs[ty][tx] = (bn < g.n && k0 + tx < g.k) ? In<DT>::one(B[bn * g.ldb + k0 + tx]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kRefTile; ++kk) acc = fmaf(as[ty][kk], bs[tx][kk], acc);
    __syncthreads();
  }
  if (m < g.m && n < g.n) {
    if (g.bias) acc += load_out(g.bias, g.out_dtype, n);
    store_out(g.d, g.out_dtype, m * g.ldd + n, acc);
  }
}

// ------------------------------------------------------------------ host side

inline Status fill_args(const core::LaunchArgs& la, const core::Problem& p, Args* g) {
  using core::kGemmArgA, core::kGemmArgB, core::kGemmArgD;
  if (la.data[kGemmArgA] == nullptr || la.data[kGemmArgB] == nullptr || la.data[kGemmArgD] == nullptr)
    return make_status(StatusCode::invalid_argument, "gemm: a, b and d must not be null");
  if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX)
    return make_status(StatusCode::unsupported_problem, "gemm: M, N and K must be < 2^31");
  g->a = la.data[core::kGemmArgA];
  g->b = la.data[core::kGemmArgB];
  g->d = la.data[core::kGemmArgD];
  g->bias = la.data[core::kGemmArgBias];
  g->lda = la.ld[core::kGemmArgA];
  g->ldb = la.ld[core::kGemmArgB];
  g->ldd = la.ld[core::kGemmArgD];
  g->m = static_cast<int32_t>(p.m);
  g->n = static_cast<int32_t>(p.n);
  g->k = static_cast<int32_t>(p.k);
  g->out_dtype = static_cast<int32_t>(p.out_dtype);
  return Status();
}

/// The 16-byte alignment the vector families need: A and B base pointers
/// and row strides (D is stored element by element).
inline bool vector_aligned(const core::LaunchArgs& la, const core::Problem& p) {
  return aligned16(la.data[core::kGemmArgA]) && aligned16(la.data[core::kGemmArgB]) &&
         (p.m == 1 || la.ld[core::kGemmArgA] % 8 == 0) && (p.n == 1 || la.ld[core::kGemmArgB] % 8 == 0);
}

template <DType DT, int MT, int R>
port::Error launch_skinny_mt(dim3 grid, dim3 block, size_t smem, port::Stream s, bool pdl, const Args& g) {
  return port::launch_smem(skinny_kernel<DT, MT, R>, grid, block, smem, s, pdl, g);
}

template <DType DT, int MT>
port::Error launch_skinny_r(int r, dim3 grid, dim3 block, size_t smem, port::Stream s, bool pdl, const Args& g) {
  switch (r) {
    case 1: return launch_skinny_mt<DT, MT, 1>(grid, block, smem, s, pdl, g);
    case 2: return launch_skinny_mt<DT, MT, 2>(grid, block, smem, s, pdl, g);
    default: return launch_skinny_mt<DT, MT, 4>(grid, block, smem, s, pdl, g);
  }
}

template <DType DT>
Status launch_skinny(const gpu::gemm::Skinny& sk, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  Args g;
  if (Status st = fill_args(la, p, &g); !st.ok()) return st;
  if (!vector_aligned(la, p)) return core::needs_fallback("skinny: A/B pointers or row strides not 16-byte aligned");
  const int mt = gpu::gemm::skinny_mtile_for(p.m);
  const dim3 grid(static_cast<unsigned>((p.n + sk.rows_per_warp - 1) / sk.rows_per_warp),
                  static_cast<unsigned>((p.m + mt - 1) / mt));
  if (grid.y > 65535u) return core::needs_fallback("skinny: M too large");
  const dim3 block(static_cast<unsigned>(kWarpSize * sk.split_k));
  const size_t smem = sizeof(float) * static_cast<size_t>(sk.split_k * mt * sk.rows_per_warp);
  const LaunchScope on(la, p);
  port::Error e;
  switch (mt) {
    case 1: e = launch_skinny_r<DT, 1>(sk.rows_per_warp, grid, block, smem, on.stream, on.pdl, g); break;
    case 2: e = launch_skinny_r<DT, 2>(sk.rows_per_warp, grid, block, smem, on.stream, on.pdl, g); break;
    case 4: e = launch_skinny_r<DT, 4>(sk.rows_per_warp, grid, block, smem, on.stream, on.pdl, g); break;
    case 8: e = launch_skinny_r<DT, 8>(sk.rows_per_warp, grid, block, smem, on.stream, on.pdl, g); break;
    default: e = launch_skinny_r<DT, 16>(sk.rows_per_warp, grid, block, smem, on.stream, on.pdl, g); break;
  }
  return port::status(e, "gemm skinny kernel launch");
}

template <DType DT>
Status launch_reference(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  Args g;
  if (Status st = fill_args(la, p, &g); !st.ok()) return st;
  const dim3 grid(static_cast<unsigned>((p.n + kRefTile - 1) / kRefTile),
                  static_cast<unsigned>((p.m + kRefTile - 1) / kRefTile));
  if (grid.y > 65535u) return make_status(StatusCode::unsupported_problem, "gemm reference: M too large (> 1048560)");
  const LaunchScope on(la, p);
  const port::Error e = port::launch(reference_kernel<DT>, grid, dim3(kRefTile * kRefTile), on.stream, on.pdl, g);
  return port::status(e, "gemm reference kernel launch");
}

template <DType DT, int MT>
void probe_mt(KernelImage* out) noexcept {
  using gpu::gemm::skinny_kernel_index;
  out[skinny_kernel_index(MT, 1)] = image_of(skinny_kernel<DT, MT, 1>);
  out[skinny_kernel_index(MT, 2)] = image_of(skinny_kernel<DT, MT, 2>);
  out[skinny_kernel_index(MT, 4)] = image_of(skinny_kernel<DT, MT, 4>);
}

template <DType DT>
void probe(KernelImage* skinny, KernelImage* ref) noexcept {
  probe_mt<DT, 1>(skinny);
  probe_mt<DT, 2>(skinny);
  probe_mt<DT, 4>(skinny);
  probe_mt<DT, 8>(skinny);
  probe_mt<DT, 16>(skinny);
  *ref = image_of(reference_kernel<DT>);
}

}  // namespace dispatch::KDISPATCH_GPU_NS::gemm

/// The body of kernels/<backend>/gemm_skinny_<dtype>.{cu,hip}.
#define KDISPATCH_GEMM_SKINNY_TU(dt)                                                         \
  namespace dispatch::KDISPATCH_GPU_NS {                                                     \
  Status launch_gemm_skinny_##dt(const gpu::gemm::Skinny& s, const core::LaunchArgs& la,     \
                                 const core::Problem& p) noexcept {                          \
    return gemm::launch_skinny<DType::dt>(s, la, p);                                         \
  }                                                                                          \
  Status launch_gemm_ref_##dt(const core::LaunchArgs& la, const core::Problem& p) noexcept { \
    return gemm::launch_reference<DType::dt>(la, p);                                         \
  }                                                                                          \
  static_assert(kGemmRefImage + 1 <= kMaxImagesPerTu);                                       \
  void probe_gemm_skinny_##dt(KernelImage* out, const ProbeEnv&) noexcept {                  \
    gemm::probe<DType::dt>(out, out + kGemmRefImage);                                        \
  }                                                                                          \
  }
