// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the fp8 GEMMs (w8a8 e4m3fn, src/ops/gemm_fp8.hpp),
// one translation unit per scale layout (kernels/cuda/gemm_fp8_<layout>.cu):
//
//   skinny_mma  the decode-time weight stream of kernels/cuda/
//               gemm_skinny_mma.cuh with fp8 inputs: a ring stage holds 128
//               bytes of each row, i.e. one 128-wide K group, multiplied by
//               mma.sync m16n8k32 e4m3 (sm_89+), the block layout's scales
//               applied per stage in registers, the tensor and rowwise
//               scales once per output; deterministic split-K and cluster
//               reduction as the bf16 kernels. Same config space as the
//               bf16 family (row_tiles, split_k, num_stages, cluster_k,
//               warps_n); K must be a multiple of 16 (16-byte copies).
//   reference   one thread per output, each 128-wide K group summed in fp32
//               in K order and scaled, as the CPU variants order it: any
//               shape, stride and alignment; the validation baseline.
#pragma once

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "cuda/gemm_skinny_mma.cuh"
#include "cuda/fp8_launch.hpp"
#include "gpu/elem.cuh"
#include "gpu/fp8_plan.hpp"
#include "ops/gemm_fp8.hpp"

namespace dispatch::cuda::gemm_fp8 {

using gemm::Args;
using gemm_skinny_mma::ScaleArgs;
using gemm_skinny_mma::Scales;

template <Scales SC>
KDISPATCH_DEVICE_INLINE float group_scale(const ScaleArgs& sc, int64_t m, int64_t n, int64_t kb) {
  if constexpr (SC == Scales::tensor) return sc.sa[0] * sc.sb[0];
  if constexpr (SC == Scales::rowwise) return sc.sa[m] * sc.sb[n];
  // ldsa < 0: a K-major scale_a (core::block_sa_index).
  return sc.sa[sc.ldsa >= 0 ? kb * sc.ldsa + m : m * -sc.ldsa + kb] * sc.sb[(n / core::kFp8Block) * sc.ldsb + kb];
}

/// Rows [0, rows) of a block scale_a in either layout (ld >= 0 M-major, ld < 0
/// K-major) -> dst M-major [kbs][ld_dst]: the canonical copy cuBLASLt's VEC128
/// mode and the skinny_mma scale ring read. Templated only to keep the
/// kernel out of the other layouts' objects.
/// Groups kb >= kbs of dst (up to kbs_dst) are zero.
template <Scales SC>
__global__ void __launch_bounds__(256) fp8_pack_scale_a_kernel(const float* src, int64_t ld, float* dst, int64_t ld_dst,
                                                               int64_t rows, int64_t kbs, int64_t kbs_dst) {
  port::grid_dependency_wait_and_release();
  const int64_t total = rows * kbs_dst;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t kb = t / rows, m = t - kb * rows;
    dst[kb * ld_dst + m] = kb < kbs ? src[ld >= 0 ? kb * ld + m : m * -ld + kb] : 0.f;
  }
}

/// dst[r, c] = c < cols ? src[r, c] : 0 for r < rows, c < cols_dst, in units
/// of T (uint4: 16 fp8 bytes; float: scales).
template <class T>
__global__ void __launch_bounds__(256) fp8_pad_cols_kernel(const T* src, int64_t ld, T* dst, int64_t ld_dst,
                                                           int64_t rows, int64_t cols, int64_t cols_dst) {
  port::grid_dependency_wait_and_release();
  const int64_t total = rows * cols_dst;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = t / cols_dst, c = t - r * cols_dst;
    T v{};
    if (c < cols) v = src[r * ld + c];
    dst[r * ld_dst + c] = v;
  }
}

/// Packs rows [m0, m0 + rows) of the call's block scale_a into dst (device
/// memory of kbs * ld_dst floats, ld_dst >= rows), on the call's stream.
template <Scales SC>
Status pack_scale_a(const core::LaunchArgs& la, const core::Problem& p, int64_t m0, int64_t rows, float* dst,
                    int64_t ld_dst) noexcept {
  const int64_t ld = la.ld[core::kFp8ArgSa];
  const float* src = la.ptr<const float>(core::kFp8ArgSa);
  if (src == nullptr || dst == nullptr || rows < 1 || ld_dst < rows)
    return make_status(StatusCode::invalid_argument, "gemm_fp8_block: scale_a pack: bad arguments");
  src += ld >= 0 ? m0 : m0 * -ld;
  const int64_t kbs = (p.k + core::kFp8Block - 1) / core::kFp8Block;
  const int64_t blocks = std::min<int64_t>((rows * kbs + 255) / 256, 1024);
  DeviceGuard guard(p.device.ordinal);
  const port::Error e = port::launch(fp8_pack_scale_a_kernel<SC>, dim3(static_cast<unsigned>(blocks)), dim3(256),
                                     static_cast<port::Stream>(la.stream), pdl_enabled(p.device.ordinal), src, ld, dst,
                                     ld_dst, rows, kbs, kbs);
  return port::status(e, "gemm_fp8_block scale_a pack kernel launch");
}

template <class T>
port::Error pad_cols(const core::Problem& p, const core::LaunchArgs& la, const T* src, int64_t ld, T* dst,
                     int64_t ld_dst, int64_t rows, int64_t cols, int64_t cols_dst) noexcept {
  const int64_t blocks = std::min<int64_t>((rows * cols_dst + 255) / 256, 4096);
  return port::launch(fp8_pad_cols_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(256),
                      static_cast<port::Stream>(la.stream), pdl_enabled(p.device.ordinal), src, ld, dst, ld_dst, rows,
                      cols, cols_dst);
}

/// The block layout's scale_b [ceil(N/128), ceil(K/128)] with each row
/// zero-padded to ld_dst floats (ld_dst >= ceil(K/128)) into dst, for
/// cuBLASLt: its BLK128x128 mode reads the weight's scales with a row
/// stride of ceil(K/128) rounded up to a multiple of 4 (16 bytes). Measured
/// with cuBLASLt 13.1 on the H200 at SGLang's K = 256, 1152, 2304: the
/// unpadded rows give a relative error of ~0.5, the padded ones 1.7e-3.
template <Scales SC>
Status pad_scale_b(const core::LaunchArgs& la, const core::Problem& p, float* dst, int64_t ld_dst) noexcept {
  using namespace core;
  const int64_t kbs = (p.k + kFp8Block - 1) / kFp8Block, nb = (p.n + kFp8Block - 1) / kFp8Block;
  const float* src = la.ptr<const float>(kFp8ArgSb);
  if (src == nullptr || dst == nullptr || ld_dst < kbs)
    return make_status(StatusCode::invalid_argument, "gemm_fp8_block: scale_b pad: bad arguments");
  DeviceGuard guard(p.device.ordinal);
  return port::status(pad_cols(p, la, src, nb > 1 ? la.ld[kFp8ArgSb] : kbs, dst, ld_dst, nb, kbs, ld_dst),
                      "gemm_fp8_block scale_b pad kernel launch");
}

/// Bytes of a packed M-major copy of `rows` rows of scale_a (row stride
/// rounded up to 4 floats, the whole rounded up to 256 bytes).
inline int64_t packed_scale_a_bytes(const core::Problem& p, int64_t rows) noexcept {
  const int64_t kbs = (p.k + core::kFp8Block - 1) / core::kFp8Block;
  return ((kbs * ((rows + 3) / 4 * 4) * 4) + 255) / 256 * 256;
}

inline constexpr int kRefTile = 16;

/// 16 x 16 outputs per block, one per thread: each K group of 128 summed in
/// fp32 in K order, times its scale (sa * sb in fp32), the groups added in
/// order, bias, one rounding.
template <Scales SC>
__global__ void __launch_bounds__(kRefTile* kRefTile) fp8_reference_kernel(Args g, ScaleArgs sc) {
  port::grid_dependency_wait_and_release();
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kRefTile + threadIdx.x % kRefTile;
  const int64_t m = static_cast<int64_t>(blockIdx.y) * kRefTile + threadIdx.x / kRefTile;
  if (m >= g.m || n >= g.n) return;
  const auto* a = static_cast<const uint8_t*>(g.a) + m * g.lda;
  const auto* b = static_cast<const uint8_t*>(g.b) + n * g.ldb;
  float acc = 0.f;
  for (int64_t k0 = 0; k0 < g.k; k0 += core::kFp8Block) {
    const int64_t k1 = k0 + core::kFp8Block < g.k ? k0 + core::kFp8Block : g.k;
    float part = 0.f;
    for (int64_t l = k0; l < k1; ++l) part += e4m3_to_float(a[l]) * e4m3_to_float(b[l]);
    acc += part * group_scale<SC>(sc, m, n, k0 / core::kFp8Block);
  }
  if (g.bias) acc += gemm::load_out(g.bias, g.out_dtype, n);
  gemm::store_out(g.d, g.out_dtype, m * g.ldd + n, acc);
}

/// The fp8 ops' slots as the kernels' arguments.
inline Status fill_args(const core::LaunchArgs& la, const core::Problem& p, Args* g, ScaleArgs* sc) {
  using namespace core;
  if (!la.data[kFp8ArgA] || !la.data[kFp8ArgB] || !la.data[kFp8ArgD] || !la.data[kFp8ArgSa] || !la.data[kFp8ArgSb])
    return make_status(StatusCode::invalid_argument, "gemm_fp8: a, b, d, scale_a and scale_b must not be null");
  if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX)
    return make_status(StatusCode::unsupported_problem, "gemm_fp8: M, N and K must be < 2^31");
  g->a = la.data[kFp8ArgA];
  g->b = la.data[kFp8ArgB];
  g->d = la.data[kFp8ArgD];
  g->bias = la.data[kFp8ArgBias];
  g->lda = la.ld[kFp8ArgA];
  g->ldb = la.ld[kFp8ArgB];
  g->ldd = la.ld[kFp8ArgD];
  g->m = static_cast<int32_t>(p.m);
  g->n = static_cast<int32_t>(p.n);
  g->k = static_cast<int32_t>(p.k);
  g->out_dtype = static_cast<int32_t>(p.out_dtype);
  sc->sa = la.ptr<const float>(kFp8ArgSa);
  sc->sb = la.ptr<const float>(kFp8ArgSb);
  sc->ldsa = la.ld[kFp8ArgSa];
  sc->ldsb = la.ld[kFp8ArgSb];
  return Status();
}

template <Scales SC>
Status launch_ref(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  Args g{};
  ScaleArgs sc;
  if (Status st = fill_args(la, p, &g, &sc); !st.ok()) return st;
  const dim3 grid(static_cast<unsigned>((p.n + kRefTile - 1) / kRefTile),
                  static_cast<unsigned>((p.m + kRefTile - 1) / kRefTile));
  if (grid.y > 65535u)
    return make_status(StatusCode::unsupported_problem, "gemm_fp8 reference: M too large (> 1048560)");
  DeviceGuard guard(p.device.ordinal);
  const port::Error e = port::launch(fp8_reference_kernel<SC>, grid, dim3(kRefTile * kRefTile),
                                     static_cast<port::Stream>(la.stream), pdl_enabled(p.device.ordinal), g, sc);
  return port::status(e, "gemm_fp8 reference kernel launch");
}

template <Scales SC>
Status launch_skinny_mma(const gpu::gemm::SkinnyMma& sk, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  Args g{};
  ScaleArgs sc;
  if (Status st = fill_args(la, p, &g, &sc); !st.ok()) return st;
  // 16-byte copies of A and B rows: 16-byte aligned bases and row strides.
  if (!aligned16(g.a) || !aligned16(g.b) || (p.m > 1 && g.lda % 16 != 0) || (p.n > 1 && g.ldb % 16 != 0))
    return core::needs_fallback("skinny_mma fp8: A/B pointers or row strides not 16-byte aligned");
  if constexpr (SC == Scales::block) {
    if (sc.ldsa < 0) {
      // A K-major scale_a: the scale ring reads each K group's M scales
      // contiguous, so an M-major copy goes first, into the call's workspace
      // (stream-ordered; this family uses no other workspace).
      const int64_t bytes = packed_scale_a_bytes(p, p.m);
      if (la.workspace == nullptr || la.workspace_bytes < bytes)
        return core::needs_fallback("skinny_mma fp8: a K-major scale_a needs " + std::to_string(bytes) +
                                    " bytes of workspace for its M-major copy");
      const int64_t ld_dst = (p.m + 3) / 4 * 4;
      if (Status st = pack_scale_a<SC>(la, p, 0, p.m, static_cast<float*>(la.workspace), ld_dst); !st.ok()) return st;
      sc.sa = static_cast<const float*>(la.workspace);
      sc.ldsa = ld_dst;
    }
  }
  return gemm_skinny_mma::launch_args<DType::fp8_e4m3fn, SC>(sk, la, p, g, sc);
}

template <Scales SC>
void probe(KernelImage* skinny, KernelImage* ref, int64_t smem_optin) noexcept {
  gemm_skinny_mma::probe<DType::fp8_e4m3fn, SC>(skinny, smem_optin);
  *ref = image_of(fp8_reference_kernel<SC>);
}

}  // namespace dispatch::cuda::gemm_fp8

/// The body of kernels/cuda/gemm_fp8_<layout>.cu (layout: tensor, rowwise, block).
#define KDISPATCH_GEMM_FP8_TU(layout)                                                                          \
  namespace dispatch::cuda {                                                                                   \
  Status launch_gemm_fp8_skinny_mma_##layout(const gpu::gemm::SkinnyMma& s, const core::LaunchArgs& la,        \
                                             const core::Problem& p) noexcept {                                \
    return gemm_fp8::launch_skinny_mma<gemm_fp8::Scales::layout>(s, la, p);                                    \
  }                                                                                                            \
  Status launch_gemm_fp8_ref_##layout(const core::LaunchArgs& la, const core::Problem& p) noexcept {           \
    return gemm_fp8::launch_ref<gemm_fp8::Scales::layout>(la, p);                                              \
  }                                                                                                            \
  static_assert(kFp8RefImage + 1 <= kMaxImagesPerTu);                                                          \
  void probe_gemm_fp8_##layout(KernelImage* out, const ProbeEnv& env) noexcept {                               \
    gemm_fp8::probe<gemm_fp8::Scales::layout>(out, out + kFp8RefImage, env.smem_optin);                        \
  }                                                                                                            \
  Status launch_gemm_fp8_pack_scale_a_##layout(const core::LaunchArgs& la, const core::Problem& p, int64_t m0, \
                                               int64_t rows, float* dst, int64_t ld_dst) noexcept {            \
    return gemm_fp8::pack_scale_a<gemm_fp8::Scales::layout>(la, p, m0, rows, dst, ld_dst);                     \
  }                                                                                                            \
  Status launch_gemm_fp8_pad_scale_b_##layout(const core::LaunchArgs& la, const core::Problem& p, float* dst,  \
                                              int64_t ld_dst) noexcept {                                       \
    return gemm_fp8::pad_scale_b<gemm_fp8::Scales::layout>(la, p, dst, ld_dst);                                \
  }                                                                                                            \
  }
