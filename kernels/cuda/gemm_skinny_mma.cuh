// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the skinny_mma GEMM family: decode-time shapes
// (M <= 16) on tensor cores, a weight stream like the skinny family but with
// the multiply on mma.sync, so it stays a stream up to M = 16 (the CUDA-core
// skinny kernel re-reads the activation rows from L1 per weight chunk and
// becomes L1-bound from M ~ 4: 108 µs instead of 14 µs at M = 16, N = K =
// 4096 on an H200). CUDA only (mma.sync); one TU per input dtype.
//
// The transposed product: D^T[N, M] = B[N, K] · A^T — the weight rows are
// mma's 16-row "A" operand, the activation rows its 8-column "B" operand
// (M <= 8: one n-tile; 9..16: two). No shared memory staging and no
// ldmatrix: a dot product does not care in which order K is visited, so the
// fragments use a K permutation both operands share. In a 32-wide chunk of
// K, lane (g = lane / 4, t = lane % 4) loads 16 bytes (8 elements, physical
// k 8t..8t+7) of weight rows g and g + 8 and of activation row g; the mma's
// logical columns {2t, 2t+1} and {2t+8, 2t+9} of the first k-step are
// physical 8t+{0,1} and 8t+{2,3}, of the second step 8t+{4,5}, 8t+{6,7}:
//   step 1: a = {w.x, v.x, w.y, v.y}, b = {x.x, x.y}
//   step 2: a = {w.z, v.z, w.w, v.w}, b = {x.z, x.w}
// (w, v: the 16-byte loads of rows g and g + 8; x: of activation row g).
// Every load is 16 bytes, 4 lanes read a row's 64 contiguous bytes.
// Accumulator c0, c1 = D^T[g][2t, 2t+1], c2, c3 = D^T[g+8][2t, 2t+1].
//
// Config: row_tiles (16-row tiles of B per warp: 1, 2) and split_k (warps
// per block along K, each a contiguous range of 32-element chunks); the warps'
// partial tiles meet in shared memory and are added in warp order
// (deterministic). M above 16 runs in chunks of 16 (gridDim.y): correct for
// any M, fast for M <= 16.
#pragma once

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/backend_decls.hpp"
#include "gpu/gemm_kernels.cuh"
#include "gpu/gemm_plan.hpp"
#include "gpu/launch_util.hpp"

namespace dispatch::cuda::gemm_skinny_mma {

using gemm::Args;

template <DType DT>
KDISPATCH_DEVICE_INLINE void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                 uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // Not volatile: a pure function of its operands, so the compiler may keep
  // every load of a trip in flight ahead of the first mma.
  if constexpr (DT == DType::bf16) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#else
  __trap();
#endif
}

/// Chunks of 32 K per warp per loop trip (loads in flight before use).
template <int RT, int NT>
struct Unroll {
  static constexpr int value = RT * 2 + NT <= 3 ? 8 : RT * 2 + NT <= 4 ? 4 : 2;
};

/// RT 16-row tiles of B per warp, NT 8-row tiles of A (M chunk 8 * NT).
template <DType DT, int RT, int NT>
__global__ void __launch_bounds__(256) skinny_mma_kernel(Args g) {
  constexpr int U = Unroll<RT, NT>::value;
  constexpr int kAcc = RT * NT * 4;
  port::grid_dependency_wait_and_release();
  extern __shared__ float partial[];  // [split_k][32 lanes][kAcc]
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int split_k = static_cast<int>(blockDim.x) / 32;
  const int gq = lane / 4, t = lane % 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * (16 * RT);
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * (8 * NT);
  const auto* A = static_cast<const uint16_t*>(g.a);
  const auto* B = static_cast<const uint16_t*>(g.b);

  // Rows past N / M read the last row (their sums are never stored).
  const uint16_t* brow[RT][2];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + r * 16 + h * 8 + gq;
      brow[r][h] = B + (n < g.n ? n : g.n - 1) * g.ldb + 8 * t;
    }
  const uint16_t* arow[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int64_t m = m0 + j * 8 + gq;
    arow[j] = A + (m < g.m ? m : g.m - 1) * g.lda + 8 * t;
  }

  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.f;

  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  // Warp w owns a contiguous range of K (whole 32-element chunks), so each
  // weight row is read in long runs (U x 64 bytes per trip and row): with
  // 16 rows per warp and every row of B in flight at once, short
  // interleaved pieces per row cost DRAM page locality.
  const int64_t chunks = (static_cast<int64_t>(g.k) + 31) / 32;
  const int64_t per_warp = (chunks + split_k - 1) / split_k;
  const int64_t k_begin = per_warp * warp * 32;
  const int64_t k_end = k_begin + per_warp * 32 < g.k ? k_begin + per_warp * 32 : static_cast<int64_t>(g.k);
  constexpr int64_t stride = 32;  // K elements between a warp's consecutive chunks
  for (int64_t k0 = k_begin; k0 < k_end; k0 += stride * U) {
    uint4 w[U][RT][2], x[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // Loads without a branch around them (a branch per load splits the
      // trip into basic blocks and the loads stop overlapping: 2x slower on
      // an H200): the offset is clamped into the row, the value zeroed after.
      const int64_t k = k0 + u * stride + 8 * t;  // this lane's first element
      const bool in = k < k_end;
      const int64_t off = in ? k0 + u * stride : k_begin - 8 * t;  // k_begin + lane piece: in range
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint4 v = port::load16_ro(brow[r][h] + off);
          w[u][r][h] = in ? v : zero;
        }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint4 v = port::load16_ro(arow[j] + off);
        x[u][j] = in ? v : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint4& wv = w[u][r][0];
          const uint4& vv = w[u][r][1];
          const uint4& xv = x[u][j];
          mma<DT>(acc[r][j], wv.x, vv.x, wv.y, vv.y, xv.x, xv.y);
          mma<DT>(acc[r][j], wv.z, vv.z, wv.w, vv.w, xv.z, xv.w);
        }
  }

  // The warps' partial tiles, summed in warp order.
  float* mine = partial + (static_cast<int64_t>(warp) * 32 + lane) * kAcc;
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(r * NT + j) * 4 + e] = acc[r][j][e];
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < 32 * kAcc; idx += static_cast<int>(blockDim.x)) {
    const int ln = idx / kAcc, q = idx % kAcc;
    const int r = q / (NT * 4), j = (q / 4) % NT, e = q % 4;
    const int lg = ln / 4, lt = ln % 4;
    const int64_t n = n0 + r * 16 + lg + (e >= 2 ? 8 : 0);
    const int64_t m = m0 + j * 8 + 2 * lt + (e & 1);
    if (n >= g.n || m >= g.m) continue;
    float v = 0.f;
    for (int wi = 0; wi < split_k; ++wi) v += partial[(static_cast<int64_t>(wi) * 32 + ln) * kAcc + q];
    if (g.bias) v += gemm::load_out(g.bias, g.out_dtype, n);
    gemm::store_out(g.d, g.out_dtype, m * g.ldd + n, v);
  }
}

template <DType DT, int RT, int NT>
port::Error launch_rt_nt(dim3 grid, dim3 block, size_t smem, port::Stream s, bool pdl, const Args& g) {
  return port::launch_smem(skinny_mma_kernel<DT, RT, NT>, grid, block, smem, s, pdl, g);
}

template <DType DT>
Status launch(const gpu::gemm::SkinnyMma& sk, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  Args g;
  if (Status st = gemm::fill_args(la, p, &g); !st.ok()) return st;
  if (!gemm::vector_aligned(la, p))
    return make_status(StatusCode::unsupported_problem,
                       std::string(core::kNeedsFallback) + "skinny_mma: A/B pointers or row strides not 16-byte aligned");
  const int nt = p.m <= 8 ? 1 : 2;
  const int rt = sk.row_tiles;
  const dim3 grid(static_cast<unsigned>((p.n + 16 * rt - 1) / (16 * rt)), static_cast<unsigned>((p.m + 8 * nt - 1) / (8 * nt)));
  if (grid.y > 65535u) return make_status(StatusCode::unsupported_problem, "skinny_mma: M too large");
  const dim3 block(static_cast<unsigned>(32 * sk.split_k));
  const size_t smem = sizeof(float) * static_cast<size_t>(sk.split_k) * 32 * static_cast<size_t>(rt * nt * 4);
  const port::Stream s = static_cast<port::Stream>(la.stream);
  DeviceGuard guard(p.device.ordinal);
  const bool pdl = pdl_enabled(p.device.ordinal);
  port::Error e;
  if (rt == 1) e = nt == 1 ? launch_rt_nt<DT, 1, 1>(grid, block, smem, s, pdl, g) : launch_rt_nt<DT, 1, 2>(grid, block, smem, s, pdl, g);
  else e = nt == 1 ? launch_rt_nt<DT, 2, 1>(grid, block, smem, s, pdl, g) : launch_rt_nt<DT, 2, 2>(grid, block, smem, s, pdl, g);
  return port::status(e, "gemm skinny_mma kernel launch");
}

template <DType DT>
void probe(KernelImage* out) noexcept {
  using gpu::gemm::skinny_mma_kernel_index;
  out[skinny_mma_kernel_index(1, 1)] = image_of(skinny_mma_kernel<DT, 1, 1>);
  out[skinny_mma_kernel_index(1, 2)] = image_of(skinny_mma_kernel<DT, 1, 2>);
  out[skinny_mma_kernel_index(2, 1)] = image_of(skinny_mma_kernel<DT, 2, 1>);
  out[skinny_mma_kernel_index(2, 2)] = image_of(skinny_mma_kernel<DT, 2, 2>);
}

}  // namespace dispatch::cuda::gemm_skinny_mma

/// The body of kernels/cuda/gemm_skinny_mma_<dtype>.cu.
#define KDISPATCH_GEMM_SKINNY_MMA_TU(dt)                                                                  \
  namespace dispatch::cuda {                                                                              \
  Status launch_gemm_skinny_mma_##dt(const gpu::gemm::SkinnyMma& s, const core::LaunchArgs& la,           \
                                     const core::Problem& p) noexcept {                                    \
    return gemm_skinny_mma::launch<DType::dt>(s, la, p);                                                  \
  }                                                                                                       \
  void probe_gemm_skinny_mma_##dt(KernelImage* out) noexcept { gemm_skinny_mma::probe<DType::dt>(out); } \
  }
