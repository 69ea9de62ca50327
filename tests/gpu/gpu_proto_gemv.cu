// SPDX-License-Identifier: Apache-2.0
// A prototype for kdispatch_gpu_gemm_bench --proto: a decode GEMM (M <= 16,
// bf16) whose weights go from global memory straight into mma.sync's A
// registers, no shared-memory ring. The K order inside a 32-wide block is
// permuted so that one lane's 16-byte load of a weight row holds the
// elements its mma fragments need for two k16 steps (logical k 2t, 2t+1,
// 2t+8, 2t+9 of step s = physical 8t + 4s + 0..3); the activation rows are
// loaded with the same permutation, so the dot products are unchanged. A
// warp owns 16 * RT weight rows and a contiguous range of K; U blocks of 32 K
// are in flight per warp. Warps of a block and blocks of a (1, cluster_k, 1)
// cluster split K; partial tiles are added in a fixed order (shared memory,
// then distributed shared memory by rank 0), as skinny_mma does.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

__device__ __forceinline__ uint4 ld_weight(const uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_act(const uint16_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <int RT, int NT, int U>
__global__ void __launch_bounds__(256) gemv_mma_kernel(const uint16_t* __restrict__ A, const uint16_t* __restrict__ B,
                                                       __nv_bfloat16* __restrict__ D, int M, int N, int K,
                                                       int cluster_k) {
  constexpr int kAcc = RT * NT * 4;
  extern __shared__ __align__(16) float red[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * (16 * RT);
  const int rank = blockIdx.y;
  const int blocks = (K + 31) / 32;
  const int workers = cluster_k * warps;
  const int per = (blocks + workers - 1) / workers;
  const int wk = rank * warps + warp;
  const int b_begin = min(wk * per, blocks), b_end = min(b_begin + per, blocks);

  const uint16_t* brow[RT][2];
  bool bok[RT][2];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + 16 * r + g + 8 * h;
      bok[r][h] = n < N;
      brow[r][h] = B + (bok[r][h] ? n : 0) * K + 8 * t;
    }
  const uint16_t* arow[NT];
  bool aok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int m = 8 * j + g;
    aok[j] = m < M;
    arow[j] = A + static_cast<int64_t>(aok[j] ? m : 0) * K + 8 * t;
  }
  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.f;

  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int b = b_begin; b < b_end; b += U) {
    uint4 wv[U][RT][2], av[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = static_cast<int64_t>(b + u) * 32;
      const bool kin = b + u < b_end && k + 8 * t < K;
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[u][r][h] = kin && bok[r][h] ? ld_weight(brow[r][h] + k) : zero;
#pragma unroll
      for (int j = 0; j < NT; ++j) av[u][j] = kin && aok[j] ? ld_act(arow[j] + k) : zero;
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          mma_bf16(acc[r][j], wv[u][r][0].x, wv[u][r][1].x, wv[u][r][0].y, wv[u][r][1].y, av[u][j].x, av[u][j].y);
          mma_bf16(acc[r][j], wv[u][r][0].z, wv[u][r][1].z, wv[u][r][0].w, wv[u][r][1].w, av[u][j].z, av[u][j].w);
        }
  }

  // Partial tiles: warps in order, then cluster ranks in order.
  float* mine = red + (warp * 32 + lane) * kAcc;
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(r * NT + j) * 4 + e] = acc[r][j][e];
  __syncthreads();
  constexpr int kTile = 32 * kAcc;
  float* block_sum = red + warps * kTile;
  for (int idx = threadIdx.x; idx < kTile; idx += blockDim.x) {
    float v = 0.f;
    for (int w = 0; w < warps; ++w) v += red[w * kTile + idx];
    block_sum[idx] = v;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  if (cluster_k > 1) cg::this_cluster().sync();
  else __syncthreads();
#else
  if (cluster_k > 1) __trap();
  __syncthreads();
#endif
  if (rank == 0) {
    for (int idx = threadIdx.x; idx < kTile; idx += blockDim.x) {
      float v = block_sum[idx];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      for (int rk = 1; rk < cluster_k; ++rk) v += cg::this_cluster().map_shared_rank(block_sum, rk)[idx];
#endif
      const int ln = idx / kAcc, q = idx % kAcc;
      const int r = q / (NT * 4), j = (q / 4) % NT, e = q % 4;
      const int64_t n = n0 + r * 16 + (ln >> 2) + (e >= 2 ? 8 : 0);
      const int m = j * 8 + 2 * (ln & 3) + (e & 1);
      if (n < N && m < M) D[static_cast<int64_t>(m) * N + n] = __float2bfloat16_rn(v);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (cluster_k > 1) cg::this_cluster().sync();
#endif
}

template <int RT, int NT, int U>
cudaError_t launch_t(const void* a, const void* b, void* d, int m, int n, int k, int warps, int ck, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3((n + 16 * RT - 1) / (16 * RT), ck, 1);
  cfg.blockDim = dim3(32 * warps);
  cfg.dynamicSmemBytes = (warps + 1) * 32 * RT * NT * 4 * sizeof(float);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = ck;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = ck > 1 ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, gemv_mma_kernel<RT, NT, U>, static_cast<const uint16_t*>(a),
                            static_cast<const uint16_t*>(b), static_cast<__nv_bfloat16*>(d), m, n, k, ck);
}

template <int RT, int NT>
cudaError_t launch_u(const void* a, const void* b, void* d, int m, int n, int k, int warps, int ck, int u,
                     cudaStream_t s) {
  switch (u) {
    case 2: return launch_t<RT, NT, 2>(a, b, d, m, n, k, warps, ck, s);
    case 4: return launch_t<RT, NT, 4>(a, b, d, m, n, k, warps, ck, s);
    default: return launch_t<RT, NT, 8>(a, b, d, m, n, k, warps, ck, s);
  }
}

__global__ void fill_kernel(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32) * 40503u;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    const float f = (static_cast<float>(x & 0xffffff) / 16777216.f - 0.5f) * 0.5f;
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
}

}  // namespace

/// D[m, n] = A[m, K] . B[n, K]^T, bf16, contiguous rows, M <= 16, K % 8 == 0.
cudaError_t kd_launch_gemv_mma(const void* a, const void* b, void* d, int m, int n, int k, int rt, int warps, int ck,
                               int u, cudaStream_t s) {
  const bool two = m > 8;
  if (rt == 1) return two ? launch_u<1, 2>(a, b, d, m, n, k, warps, ck, u, s) : launch_u<1, 1>(a, b, d, m, n, k, warps, ck, u, s);
  return two ? launch_u<2, 2>(a, b, d, m, n, k, warps, ck, u, s) : launch_u<2, 1>(a, b, d, m, n, k, warps, ck, u, s);
}

cudaError_t kd_fill_bf16(void* p, int64_t n, uint32_t seed, cudaStream_t s) {
  fill_kernel<<<1024, 256, 0, s>>>(static_cast<uint16_t*>(p), n, seed);
  return cudaGetLastError();
}
