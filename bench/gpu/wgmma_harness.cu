// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU bench — the wgmma kernels alone (kernels/cuda/wgmma_gemm.cuh,
// kernels/cuda/wgmma_moe.cuh), outside the library: each launch checked
// against cuBLAS (fp32 output) and timed with cudaEvents (median of 5 rounds
// of 10 back-to-back launches). For a kernel change before the library's
// tests, and for a hang: it prints each step before it runs (unbuffered),
// and run_h200.sh's `wgmma-harness` section builds it with
// -DKD_WGMMA_WATCHDOG_NS, so a wait past that traps with the block, thread
// and barrier instead of hanging.
//
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90a,code=sm_90a -I kernels
//        [-DKD_WGMMA_WATCHDOG_NS=5000000000] bench/gpu/wgmma_harness.cu -lcublas -o wgmma_harness
//   ./wgmma_harness [dense|moe|all]
//
// dense: D = A · B^T at the family's points (BLOCK_SIZE_N 256/128, stages,
// GROUP_SIZE_M) on square and model shapes, beside cublasGemmEx (bf16 out).
// moe: random top-k routing, moe_align's sorted ids in blocks of 128 built
// on the host with the op's exact buffer length (M*top_k + min(E, M*top_k)
// * 127: not a multiple of 128), the wgmma kernel at both widths against a
// per-expert cuBLAS reference of the routed rows.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/wgmma_moe.cuh"

#define CK(x)                                                                         \
  do {                                                                                \
    const cudaError_t e_ = (x);                                                       \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

using bf16 = __nv_bfloat16;

__global__ void fill_kernel(bf16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t x = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull + seed;
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    p[i] = __float2bfloat16(static_cast<float>(x >> 40) * (2.f / 16777216.f) - 1.f);
  }
}

/// dst[r] = src[rows[r] / top_k] (K elements a row).
__global__ void gather_kernel(bf16* dst, const bf16* src, const int32_t* rows, int n_rows, int k, int top_k) {
  const int r = blockIdx.x;
  if (r >= n_rows) return;
  for (int c = threadIdx.x; c < k; c += blockDim.x) dst[int64_t{r} * k + c] = src[int64_t{rows[r] / top_k} * k + c];
}

/// ref[rows[r]] = part[r] * weight[rows[r]] (N columns).
__global__ void scatter_kernel(float* ref, const float* part, const int32_t* rows, const float* w, int n_rows, int n) {
  const int r = blockIdx.x;
  if (r >= n_rows) return;
  for (int c = threadIdx.x; c < n; c += blockDim.x)
    ref[int64_t{rows[r]} * n + c] = part[int64_t{r} * n + c] * w[rows[r]];
}

/// Max |got - ref| (NaN: infinite) and max |ref| over n elements, on the host.
void compare(const bf16* d_got, const float* d_ref, int64_t n, double* err, double* ref_max) {
  std::vector<bf16> got(n);
  std::vector<float> ref(n);
  CK(cudaMemcpy(got.data(), d_got, n * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(ref.data(), d_ref, n * 4, cudaMemcpyDeviceToHost));
  *err = 0, *ref_max = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(__bfloat162float(got[i])) - ref[i]);
    *err = std::isnan(d) ? INFINITY : std::max(*err, d);
    *ref_max = std::max(*ref_max, static_cast<double>(std::fabs(ref[i])));
  }
}

/// Median over 5 rounds of 10 back-to-back calls of fn, µs a call.
template <class F>
double time_us(F&& fn) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> v;
  for (int r = 0; r < 5; ++r) {
    fn();
    CK(cudaEventRecord(e0));
    for (int i = 0; i < 10; ++i) fn();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    v.push_back(ms * 100.f);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  std::sort(v.begin(), v.end());
  return v[2];
}

/// cublasGemmEx of row-major D[m][n] = A[m][k] · B[n][k]^T.
void cublas_gemm(cublasHandle_t h, const bf16* a, const bf16* b, void* d, cudaDataType dt, int m, int n, int k) {
  const float one = 1.f, zero = 0.f;
  if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, k, a, CUDA_R_16BF, k, &zero, d, dt, n,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
    std::printf("cublasGemmEx failed\n");
    std::exit(1);
  }
}

void dense(cublasHandle_t h, int sms) {
  struct Point {
    int bn, stages, group;
  };
  const int shapes[][3] = {{8192, 8192, 8192}, {4096, 4096, 4096}, {1024, 4096, 4096},
                           {2200, 2056, 200},  {1000, 1000, 1000}, {257, 520, 136}};
  for (const auto& s : shapes) {
    const int M = s[0], N = s[1], K = s[2];
    std::printf("dense M=%d N=%d K=%d\n", M, N, K);
    bf16 *a, *b, *d;
    float* ref;
    CK(cudaMalloc(&a, int64_t{M} * K * 2));
    CK(cudaMalloc(&b, int64_t{N} * K * 2));
    CK(cudaMalloc(&d, int64_t{M} * N * 2));
    CK(cudaMalloc(&ref, int64_t{M} * N * 4));
    fill_kernel<<<1024, 256>>>(a, int64_t{M} * K, 1);
    fill_kernel<<<1024, 256>>>(b, int64_t{N} * K, 2);
    cublas_gemm(h, a, b, ref, CUDA_R_32F, M, N, K);
    CK(cudaDeviceSynchronize());
    const double t_cublas = time_us([&] { cublas_gemm(h, a, b, d, CUDA_R_16BF, M, N, K); });
    for (const Point pt : {Point{256, 4, 8}, Point{256, 3, 16}, Point{128, 6, 8}}) {
      CUtensorMap ta, tb;
      if (kd_wgmma::encode_operand(kd_wgmma::encode_fn(), &ta, a, M, K, K, kd_wgmma::kBM, true) != CUDA_SUCCESS ||
          kd_wgmma::encode_operand(kd_wgmma::encode_fn(), &tb, b, N, K, K, pt.bn, true) != CUDA_SUCCESS) {
        std::printf("  cuTensorMapEncodeTiled failed\n");
        std::exit(1);
      }
      kd_wgmma::Args args{};
      args.d = d, args.ldd = N, args.m = M, args.n = N, args.k = K;
      args.tiles_m = (M + 127) / 128, args.tiles_n = (N + pt.bn - 1) / pt.bn, args.k_tiles = (K + 63) / 64;
      args.stages = pt.stages, args.group_m = pt.group, args.d_vec2 = N % 2 == 0;
      const int grid = std::min(args.tiles_m * args.tiles_n, sms);
      const int smem = kd_wgmma::smem_bytes(pt.bn, pt.stages);
      auto kern = pt.bn == 256 ? &kd_wgmma::gemm_kernel<true, 256> : &kd_wgmma::gemm_kernel<true, 128>;
      CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      auto run = [&] { kern<<<grid, kd_wgmma::kThreads, smem>>>(ta, tb, args); };
      std::printf("  BLOCK_SIZE_N %d, %d stages, GROUP_SIZE_M %d: launching\n", pt.bn, pt.stages, pt.group);
      CK(cudaMemset(d, 0xFF, int64_t{M} * N * 2));
      run();
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      double err, ref_max;
      compare(d, ref, int64_t{M} * N, &err, &ref_max);
      const double t = time_us(run);
      std::printf("    max err %.3g of max|ref| %.3g%s; %.1f us, %.0f TFLOP/s, %.3fx cuBLAS (%.1f us)\n", err, ref_max,
                  err <= 1e-2 * ref_max ? "" : "  <-- FAIL", t, 2.0 * M * N * double(K) / t / 1e6, t_cublas / t,
                  t_cublas);
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(d));
    CK(cudaFree(ref));
  }
}

struct MoeShape {
  const char* name;
  int m, e, top_k, n, k;
  int nonlocal;  ///< an expert whose blocks get expert id -1, or -1
  int bs = 128;  ///< the sort's block_size: 128, or 64 (a tile's halves two sorted blocks, two B boxes)
};

void moe(cublasHandle_t h, int sms, const MoeShape& sh) {
  const int M = sh.m, E = sh.e, TK = sh.top_k, N = sh.n, K = sh.k, MK = M * TK, B = sh.bs;
  std::printf("moe %s: M=%d E=%d top_k=%d N=%d K=%d block_size %d\n", sh.name, M, E, TK, N, K, B);
  std::mt19937 rng(1234u + static_cast<uint32_t>(M * 7 + N));
  std::vector<int> ids(MK), perm(E);
  std::vector<float> weight(MK);
  std::uniform_real_distribution<float> uw(0.05f, 1.f);
  for (int t = 0; t < M; ++t) {
    for (int i = 0; i < E; ++i) perm[i] = i;
    for (int j = 0; j < TK; ++j) {
      std::swap(perm[j], perm[std::uniform_int_distribution<int>(j, E - 1)(rng)]);
      ids[t * TK + j] = perm[j];
      weight[t * TK + j] = uw(rng);
    }
  }
  // moe_align in blocks of B into the op's exact buffer (cap positions).
  const int cap = MK + std::min(E, MK) * (B - 1), blocks = (cap + B - 1) / B;
  std::vector<int32_t> sorted(cap, MK), eids(blocks, -1);
  std::vector<std::vector<int32_t>> rows(E);
  int total = 0;
  for (int e = 0; e < E; ++e) {
    for (int s = 0; s < MK; ++s)
      if (ids[s] == e) rows[e].push_back(s);
    if (rows[e].empty()) continue;
    for (size_t i = 0; i < rows[e].size(); ++i) sorted[total + i] = rows[e][i];
    const int len = (static_cast<int>(rows[e].size()) + B - 1) / B * B;
    for (int b = total / B; b < (total + len) / B; ++b) eids[b] = e == sh.nonlocal ? -1 : e;
    total += len;
  }
  bf16 *a, *w, *out, *ga;
  float *ref, *part, *tw;
  int32_t *d_sorted, *d_eids, *d_total, *d_rows;
  CK(cudaMalloc(&a, int64_t{M} * K * 2));
  CK(cudaMalloc(&w, int64_t{E} * N * K * 2));
  CK(cudaMalloc(&out, int64_t{MK} * N * 2));
  CK(cudaMalloc(&ref, int64_t{MK} * N * 4));
  CK(cudaMalloc(&ga, int64_t{MK} * K * 2));
  CK(cudaMalloc(&part, int64_t{MK} * N * 4));
  CK(cudaMalloc(&tw, MK * 4));
  CK(cudaMalloc(&d_sorted, cap * 4));
  CK(cudaMalloc(&d_eids, blocks * 4));
  CK(cudaMalloc(&d_total, 4));
  CK(cudaMalloc(&d_rows, MK * 4));
  fill_kernel<<<1024, 256>>>(a, int64_t{M} * K, 17u);
  fill_kernel<<<4096, 256>>>(w, int64_t{E} * N * K, 91u);
  CK(cudaMemcpy(tw, weight.data(), MK * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_sorted, sorted.data(), cap * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_eids, eids.data(), blocks * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d_total, &total, 4, cudaMemcpyHostToDevice));
  // The reference: per expert, its rows of a gathered, one cuBLAS GEMM, scattered times the weight.
  CK(cudaMemset(ref, 0, int64_t{MK} * N * 4));
  for (int e = 0; e < E; ++e) {
    const int r = static_cast<int>(rows[e].size());
    if (r == 0 || e == sh.nonlocal) continue;
    CK(cudaMemcpy(d_rows, rows[e].data(), r * 4, cudaMemcpyHostToDevice));
    gather_kernel<<<r, 256>>>(ga, a, d_rows, r, K, TK);
    cublas_gemm(h, ga, w + int64_t{e} * N * K, part, CUDA_R_32F, r, N, K);
    scatter_kernel<<<r, 256>>>(ref, part, d_rows, tw, r, N);
    CK(cudaDeviceSynchronize());
  }
  std::printf("  %d sorted positions in %d blocks, total %d (%.0f%% padding)\n", cap, blocks, total,
              100.0 * (total - MK) / std::max(total, 1));
  for (int bn : {128, 256}) {
    if (B != 128 && bn != 128) continue;  // block_size 64: 128 wide, two B boxes a stage (the launcher's rule)
    const int boxes = B == 128 ? 1 : 2, stages = bn == 128 && boxes == 1 ? 6 : 4,
              smem = kd_wgmma::smem_bytes(bn, stages, boxes);
    CUtensorMap tmw;
    if (kd_wgmma::encode_operand(kd_wgmma::encode_fn(), &tmw, w, int64_t{E} * N, K, K, bn, true) != CUDA_SUCCESS) {
      std::printf("  cuTensorMapEncodeTiled failed\n");
      std::exit(1);
    }
    kd_wgmma_moe::Args args{};
    args.out = out, args.a = a, args.sorted_token_ids = d_sorted, args.expert_ids = d_eids;
    args.num_tokens_post_pad = d_total, args.topk_weights = tw, args.ldo = N, args.lda = K, args.ldtw = TK;
    args.m = M, args.n = N, args.k = K, args.num_experts = E, args.top_k = TK, args.mul_routed_weight = 1;
    args.cap = cap, args.max_blocks = blocks, args.tiles_n = (N + bn - 1) / bn, args.k_tiles = (K + 63) / 64;
    args.bs = B, args.b_boxes = boxes;
    args.stages = stages, args.group_m = 8, args.out_vec2 = N % 2 == 0;
    const int tiles_m = (blocks * B + 127) / 128;
    const int grid = static_cast<int>(std::min<int64_t>(int64_t{tiles_m} * args.tiles_n, sms));
    auto kern = bn == 256 ? &kd_wgmma_moe::moe_gemm_kernel<true, 256> : &kd_wgmma_moe::moe_gemm_kernel<true, 128>;
    CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    auto run = [&] { kern<<<grid, kd_wgmma::kThreads, smem>>>(tmw, args); };
    std::printf("  BLOCK_SIZE_N %d, %d stages, grid %d: launching\n", bn, stages, grid);
    CK(cudaMemset(out, 0xFF, int64_t{MK} * N * 2));  // NaN: an unwritten row fails the check
    run();
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    double err, ref_max;
    compare(out, ref, int64_t{MK} * N, &err, &ref_max);
    const double t = time_us(run);
    std::printf("    max err %.3g of max|ref| %.3g%s; %.1f us, %.0f TFLOP/s\n", err, ref_max,
                err <= 1e-2 * ref_max ? "" : "  <-- FAIL", t, 2.0 * MK * N * double(K) / t / 1e6);
  }
  for (void* p :
       {static_cast<void*>(a), static_cast<void*>(w), static_cast<void*>(out), static_cast<void*>(ref),
        static_cast<void*>(ga), static_cast<void*>(part), static_cast<void*>(tw), static_cast<void*>(d_sorted),
        static_cast<void*>(d_eids), static_cast<void*>(d_total), static_cast<void*>(d_rows)})
    CK(cudaFree(p));
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  const char* what = argc > 1 ? argv[1] : "all";
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp pr{};
  CK(cudaGetDeviceProperties(&pr, 0));
  std::printf("%s, %d SMs; sm_90a image %s\n", pr.name, sms, kd_wgmma::sm90a_code_runs() ? "runs" : "does NOT run");
  if (!kd_wgmma::sm90a_code_runs()) return 1;
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 1;
  if (!std::strcmp(what, "dense") || !std::strcmp(what, "all")) dense(h, sms);
  if (!std::strcmp(what, "moe") || !std::strcmp(what, "all")) {
    const MoeShape shapes[] = {
        {"edge, expert 1 not local", 37, 4, 2, 200, 136, 1},
        {"Qwen3-30B-A3B up", 1024, 128, 8, 1536, 2048, -1},
        {"Qwen3-30B-A3B up", 4096, 128, 8, 1536, 2048, -1},
        {"Mixtral-8x7B TP2 up", 4096, 8, 2, 14336, 4096, -1},
        {"many tiles", 4096, 8, 8, 512, 72, 3},
        // block_size 64 (SGLang's block-fp8 rows use it; here in bf16): tiles of two experts, a
        // non-local half beside a local one
        {"Qwen3-30B-A3B up, block_size 64", 4096, 128, 8, 1536, 2048, -1, 64},
        {"edge, block_size 64, expert 2 not local", 300, 8, 4, 576, 384, 2, 64},
    };
    for (const MoeShape& s : shapes) moe(h, sms, s);
  }
  cublasDestroy(h);
  std::printf("done\n");
  return 0;
}
