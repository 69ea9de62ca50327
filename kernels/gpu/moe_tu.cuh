// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — fused_moe's launchers and image probe for one
// dtype (KDISPATCH_MOE_TU(dt) in kernels/<backend>/fused_moe_<dt>.{cu,hip};
// block fp8 and the tensor-core kernels: CUDA only).
#pragma once

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/launch_util.hpp"
#include "gpu/moe_kernels.cuh"
#include "gpu/moe_launch.hpp"
#include "ops/fused_moe.hpp"
#if KDISPATCH_GPU_HAS_TILED
#include "cuda/moe_mma.cuh"
#endif

namespace dispatch::KDISPATCH_GPU_NS::moe_tu {

inline constexpr int kUpRows = 4, kDownRows = 2;
/// Rows per block of the per-pair down kernel (every warp on all of them).
inline constexpr int kPairDownRows = 4;
static_assert(int64_t{moe::kWarps} * kDownRows == kMoeDownTile, "the grouped down kernel's tile");
static_assert(moe::kSplitDownRows == kMoeSplitDownRows && moe::kSplitRows == 8,
              "the list's checks of the split kernels");

/// The call's arguments; a, y and counters in the workspace (the grouped
/// kernels' layout, moe_grouped_workspace_bytes; the per-pair ones use a).
inline moe::MoeArgs args_of(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  char* ws = static_cast<char*>(la.workspace);
  const int64_t P = p.m * p.extra[1], a_bytes = moe_round256(P * p.n * 4);
  moe::MoeArgs g{la.data[core::kMoeArgHidden],
                 la.data[core::kMoeArgW1],
                 la.data[core::kMoeArgW2],
                 static_cast<const int32_t*>(la.data[core::kMoeArgTopkIds]),
                 static_cast<const float*>(la.data[core::kMoeArgTopkWeights]),
                 reinterpret_cast<float*>(ws),
                 reinterpret_cast<float*>(ws + a_bytes),
                 reinterpret_cast<uint32_t*>(ws + a_bytes + moe_round256(P * p.k * 4)),
                 la.data[core::kMoeArgOut],
                 la.ld[core::kMoeArgHidden],
                 la.ld[core::kMoeArgW1],
                 la.ld[core::kMoeArgW2],
                 la.ld[core::kMoeArgTopkIds],
                 la.ld[core::kMoeArgTopkWeights],
                 la.ld[core::kMoeArgOut],
                 p.m,
                 p.k,
                 p.n,
                 p.extra[0],
                 p.extra[1],
                 (p.k + kMoeDownTile - 1) / kMoeDownTile,
                 static_cast<int>(la.scalar[1]),
                 la.scalar[0]};
  g.s1 = static_cast<const float*>(la.data[core::kMoeArgW1Scale]);
  g.s2 = static_cast<const float*>(la.data[core::kMoeArgW2Scale]);
  g.lds1 = la.ld[core::kMoeArgW1Scale], g.lds2 = la.ld[core::kMoeArgW2Scale];
  return g;
}

/// The workspace check of a launch needing `need` bytes.
inline Status workspace_ok(const core::LaunchArgs& la, int64_t need, std::string_view what) noexcept {
  if (need >= 0 && need < INT64_MAX && la.workspace != nullptr && la.workspace_bytes >= need &&
      (reinterpret_cast<uintptr_t>(la.workspace) & 15u) == 0)
    return Status();
  return core::needs_fallback("fused_moe: the workspace holds " + std::to_string(la.workspace_bytes) + " bytes, " +
                              std::string(what) + " need " + std::to_string(need));
}

/// Both kernels on the call's stream.
template <class Up, class Down>
Status launch_two(const core::LaunchArgs& la, const core::Problem& p, Up up, dim3 gu, Down down, dim3 gd,
                  const moe::MoeArgs& g) noexcept {
  const LaunchScope on(la, p);
  port::Error e = port::launch(up, gu, dim3(moe::kThreads), on.stream, on.pdl, g);
  if (e != port::kSuccess) return port::status(e, "fused_moe up kernel launch");
  e = port::launch(down, gd, dim3(moe::kThreads), on.stream, on.pdl, g);
  return port::status(e, "fused_moe down kernel launch");
}

template <DType DT, bool VEC>
Status launch(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  if (p.m < 1) return Status();
  if (Status s = workspace_ok(la, moe_decode_workspace_bytes(p), "the per-pair kernels"); !s.ok()) return s;
  constexpr int64_t up_tile = int64_t{moe::kWarps} * kUpRows;
  const dim3 gu(static_cast<unsigned>(p.m * p.extra[1]), static_cast<unsigned>((p.n + up_tile - 1) / up_tile));
  const dim3 gd(static_cast<unsigned>(p.m), static_cast<unsigned>((p.k + kPairDownRows - 1) / kPairDownRows));
  return launch_two(la, p, moe::moe_up_kernel<DT, kUpRows, VEC>, gu, moe::moe_down_kernel<DT, kPairDownRows, VEC>, gd,
                    args_of(la, p));
}

#if KDISPATCH_GPU_HAS_TILED
template <DType DT>
Status launch_grouped(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  if (p.m < 1) return Status();
  if (Status s = workspace_ok(la, moe_grouped_workspace_bytes(p), "the grouped kernels"); !s.ok()) return s;
  const moe::MoeArgs g = args_of(la, p);
  const int64_t P = p.m * p.extra[1], slots = P < p.extra[0] ? P : p.extra[0];
  constexpr int64_t up_tile = int64_t{moe::kWarps} * kUpRows;
  const dim3 gu(static_cast<unsigned>(slots), static_cast<unsigned>((p.n + up_tile - 1) / up_tile));
  const dim3 gd(static_cast<unsigned>(slots), static_cast<unsigned>(g.down_tiles));
  return launch_two(la, p, moe::moe_up_grouped_kernel<DT, kUpRows>, gu, moe::moe_down_grouped_kernel<DT, kDownRows>, gd,
                    g);
}
#endif

/// The split kernels (weights W, activations X; moe_kernels.cuh): I a
/// multiple of kSplitRows, H of kSplitDownRows (the list checks).
template <DType W, DType X>
Status launch_split(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  if (p.m < 1) return Status();
  if (Status s = workspace_ok(la, moe_decode_workspace_bytes(p), "the split kernels"); !s.ok()) return s;
  const dim3 gu(static_cast<unsigned>(p.m * p.extra[1]), static_cast<unsigned>(p.n / moe::kSplitRows));
  const dim3 gd(static_cast<unsigned>(p.m), static_cast<unsigned>(p.k / moe::kSplitDownRows));
  return launch_two(la, p, moe::moe_up_split_kernel<W, X>, gu, moe::moe_down_split_kernel<W, X>, gd, args_of(la, p));
}

/// Block fp8's reference kernels (one thread per output).
template <DType X>
Status launch_fp8_ref(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  if (p.m < 1) return Status();
  if (Status s = workspace_ok(la, moe_decode_workspace_bytes(p), "the reference kernels"); !s.ok()) return s;
  const int64_t up = (p.m * p.extra[1] * p.n + moe::kThreads - 1) / moe::kThreads;
  const int64_t down = (p.m * p.k + moe::kThreads - 1) / moe::kThreads;
  if (up > 0x7fffffff || down > 0x7fffffff) return core::needs_fallback("fused_moe fp8 reference: too many outputs");
  return launch_two(la, p, moe::moe_up_fp8_ref_kernel<X>, dim3(static_cast<unsigned>(up)),
                    moe::moe_down_fp8_ref_kernel<X>, dim3(static_cast<unsigned>(down)), args_of(la, p));
}

#if KDISPATCH_GPU_HAS_TILED
/// The image of a ring kernel (moe_mma.cuh), its dynamic shared memory limit
/// raised to `smem` bytes (kRingSmemBytes: 32-pair items) on the current
/// device.
template <class K>
KernelImage ring_image(K* k, int64_t smem = moe_mma::kRingSmemBytes) noexcept {
  return image_with_smem(k, smem);
}

/// The tensor-core kernels (moe_mma.cuh): sort, up, down, reduce; block fp8
/// (W = fp8_e4m3fn, X = bf16): sort, quantise hidden, up, quantise a, down,
/// reduce. W = X = bf16 or fp16 otherwise.
template <DType W, DType X>
Status launch_mma(const core::LaunchArgs& la, const core::Problem& p, bool staged, bool wide) noexcept {
  static_assert(moe_mma::kMmaPairs == kMoeMmaPairs, "the workspace's items");
  static_assert(moe_mma::kRingSmemBytes == kMoeRingSmemBytes, "the list's rule (kMoeRingTwoBlocksOptin)");
  static_assert(moe_mma::kMmaThreads == kMoeMmaThreads && moe_mma::kSortThreads == kMoeSortThreads &&
                    moe_mma::kReduceThreads == kMoeReduceThreads,
                "the list's image checks (moe_image_threads)");
  constexpr bool kFp8 = W == DType::fp8_e4m3fn;
  if (p.m < 1) return Status();
  const int64_t need = kFp8 ? moe_mma_fp8_workspace_bytes(p) : moe_mma_workspace_bytes(p);
  const int64_t P = p.m * p.extra[1], items = moe_mma_max_items(p), H = p.k, I = p.n;
  // A workspace too small for these kernels, or more work items than a grid
  // takes: the split kernels (their shapes are a subset of these kernels'),
  // not the fallback's element-wise reference, when their workspace fits.
  if (items > 65535 || !workspace_ok(la, need, "the tensor-core kernels").ok()) {
    if (workspace_ok(la, moe_decode_workspace_bytes(p), "the split kernels").ok()) return launch_split<W, X>(la, p);
    if (items > 65535) return core::needs_fallback("fused_moe tensor-core kernels: over 65535 work items");
    return workspace_ok(la, need, "the tensor-core kernels");
  }
  char* ws = static_cast<char*>(la.workspace);
  auto take = [&ws](int64_t bytes) {
    char* at = ws;
    ws += moe_round256(bytes);
    return at;
  };
  moe_mma::MmaArgs m{};
  m.g = args_of(la, p);
  m.n_items = reinterpret_cast<int32_t*>(take(4));
  m.sorted = reinterpret_cast<int32_t*>(take(P * 4));
  m.items = reinterpret_cast<int4*>(take(items * 16));
  if (kFp8) {
    m.xq = reinterpret_cast<uint8_t*>(take(p.m * H));
    m.xs = reinterpret_cast<float*>(take(p.m * (H / 128) * 4));
  }
  m.a = take(P * I * (kFp8 ? 4 : 2));
  if (kFp8) {
    m.aq = reinterpret_cast<uint8_t*>(take(P * I));
    m.as = reinterpret_cast<float*>(take(P * (I / 128) * 4));
  }
  m.y = reinterpret_cast<float*>(take(P * H * 4));
  m.max_items = static_cast<int32_t>(items);
  const LaunchScope on(la, p);
  const auto grid_y = static_cast<unsigned>(items);
  constexpr int64_t up_rows = 16 * moe_mma::kMmaWarps, down_rows = up_rows * moe_mma::kDownRowTiles;
  const size_t smem = staged ? moe_mma::kRingSmemBytes : 0;  // the ring kernels' stages
  const int64_t up_tiles = (I + up_rows - 1) / up_rows, down_tiles = (H + down_rows - 1) / down_rows;
  const int tu = staged ? moe_mma::ring_tiles(H * (kFp8 ? 1 : 2), up_tiles) : 1,
            td = staged ? moe_mma::ring_tiles(I * (kFp8 ? 1 : 2), down_tiles) : 1;
  const dim3 gemm_block(moe_mma::kMmaThreads), gu(static_cast<unsigned>((up_tiles + tu - 1) / tu), grid_y),
      gd(static_cast<unsigned>((down_tiles + td - 1) / td), grid_y);
  // The plan's block_m = 64 (bf16/fp16, staged; the variant declines it
  // elsewhere): the wide items (64 pairs, moe_mma::kWideTiles), each
  // expert's rows read once per 64 of its pairs.
  wide = wide && !kFp8 && staged;
  auto sort = moe_mma::moe_sort_kernel<W>;
  if constexpr (!kFp8)
    if (wide) sort = moe_mma::moe_sort_kernel<W, moe_mma::kWideTiles>;
  port::Error e = port::launch_smem(sort, dim3(1), dim3(moe_mma::kSortThreads), static_cast<size_t>(2 * p.extra[0] * 4),
                                    on.stream, on.pdl, m);
  if (e != port::kSuccess) return port::status(e, "fused_moe sort kernel launch");
  if constexpr (kFp8) {
    e = port::launch(moe_mma::moe_quant_kernel<uint16_t>,
                     dim3(static_cast<unsigned>(p.m), static_cast<unsigned>((H / 128 + 7) / 8)), dim3(kMoeQuantThreads),
                     on.stream, on.pdl, static_cast<const uint16_t*>(m.g.hidden), m.g.ldh, H, m.xq, H, m.xs, H / 128);
    if (e == port::kSuccess)
      e = staged ? port::launch_smem(moe_mma::moe_ring_kernel<W, true>, gu, gemm_block, smem, on.stream, on.pdl, m, tu)
                 : port::launch(moe_mma::moe_up_mma_fp8_kernel<X>, gu, gemm_block, on.stream, on.pdl, m);
    if (e == port::kSuccess)
      e = port::launch(moe_mma::moe_quant_kernel<float>,
                       dim3(static_cast<unsigned>(P), static_cast<unsigned>((I / 128 + 7) / 8)), dim3(kMoeQuantThreads),
                       on.stream, on.pdl, static_cast<const float*>(m.a), I, I, m.aq, I, m.as, I / 128);
    if (e == port::kSuccess)
      e = staged ? port::launch_smem(moe_mma::moe_ring_kernel<W, false>, gd, gemm_block, smem, on.stream, on.pdl, m, td)
                 : port::launch(moe_mma::moe_down_mma_fp8_kernel<X>, gd, gemm_block, on.stream, on.pdl, m);
  } else if (wide) {  // the sort above made items of up to 64 pairs
    constexpr int kW = moe_mma::kWideTiles;
    constexpr size_t kWideSmem = moe_mma::kRingSmemBytesOf<kW>;
    e = port::launch_smem(moe_mma::moe_ring_kernel<W, true, kW>, gu, gemm_block, kWideSmem, on.stream, on.pdl, m, tu);
    if (e == port::kSuccess)
      e = port::launch_smem(moe_mma::moe_ring_kernel<W, false, kW>, gd, gemm_block, kWideSmem, on.stream, on.pdl, m,
                            td);
  } else {
    e = staged ? port::launch_smem(moe_mma::moe_ring_kernel<W, true>, gu, gemm_block, smem, on.stream, on.pdl, m, tu)
               : port::launch(moe_mma::moe_up_mma_kernel<W>, gu, gemm_block, on.stream, on.pdl, m);
    if (e == port::kSuccess)
      e = staged ? port::launch_smem(moe_mma::moe_ring_kernel<W, false>, gd, gemm_block, smem, on.stream, on.pdl, m, td)
                 : port::launch(moe_mma::moe_down_mma_kernel<W>, gd, gemm_block, on.stream, on.pdl, m);
  }
  if (e != port::kSuccess) return port::status(e, "fused_moe tensor-core kernel launch");
  e = port::launch(moe_mma::moe_reduce_kernel<X>,
                   dim3(static_cast<unsigned>(p.m),
                        static_cast<unsigned>((H + moe_mma::kReduceThreads - 1) / moe_mma::kReduceThreads)),
                   dim3(moe_mma::kReduceThreads), on.stream, on.pdl, m);
  return port::status(e, "fused_moe reduce kernel launch");
}
#endif

static_assert(moe::kThreads == kMoeThreads, "the list's image checks assume 8 warps of 32 (CUDA) or 64 (HIP) lanes");

template <DType DT>
void probe(KernelImage* out) noexcept {
  out[0] = image_of(moe::moe_up_kernel<DT, kUpRows, true>);
  out[1] = image_of(moe::moe_down_kernel<DT, kPairDownRows, true>);
  out[2] = image_of(moe::moe_up_kernel<DT, kUpRows, false>);
  out[3] = image_of(moe::moe_down_kernel<DT, kPairDownRows, false>);
#if KDISPATCH_GPU_HAS_TILED
  out[4] = image_of(moe::moe_up_grouped_kernel<DT, kUpRows>);
  out[5] = image_of(moe::moe_down_grouped_kernel<DT, kDownRows>);
#endif
  out[6] = image_of(moe::moe_up_split_kernel<DT, DT>);
  out[7] = image_of(moe::moe_down_split_kernel<DT, DT>);
#if KDISPATCH_GPU_HAS_TILED
  out[8] = image_of(moe_mma::moe_sort_kernel<DT>);
  out[9] = image_of(moe_mma::moe_up_mma_kernel<DT>);
  out[10] = image_of(moe_mma::moe_down_mma_kernel<DT>);
  out[11] = image_of(moe_mma::moe_reduce_kernel<DT>);
  out[12] = ring_image(moe_mma::moe_ring_kernel<DT, true>);
  out[13] = ring_image(moe_mma::moe_ring_kernel<DT, false>);
  out[14] = image_of(moe_mma::moe_sort_kernel<DT, moe_mma::kWideTiles>);
  out[15] = ring_image(moe_mma::moe_ring_kernel<DT, true, moe_mma::kWideTiles>,
                       moe_mma::kRingSmemBytesOf<moe_mma::kWideTiles>);
  out[16] = ring_image(moe_mma::moe_ring_kernel<DT, false, moe_mma::kWideTiles>,
                       moe_mma::kRingSmemBytesOf<moe_mma::kWideTiles>);
#endif
}

}  // namespace dispatch::KDISPATCH_GPU_NS::moe_tu

// CUDA only: the tensor-core kernels, and the grouped ones (slower than the
// per-pair kernels at every point measured on the H200, so not ported).
#if KDISPATCH_GPU_HAS_TILED
#define KDISPATCH_MOE_TU_MMA(dt)                                                                      \
  Status launch_fused_moe_mma_##dt(const core::LaunchArgs& la, const core::Problem& p, bool staged,   \
                                   bool wide) noexcept {                                              \
    return moe_tu::launch_mma<DType::dt, DType::dt>(la, p, staged, wide);                             \
  }                                                                                                   \
  Status launch_fused_moe_grouped_##dt(const core::LaunchArgs& la, const core::Problem& p) noexcept { \
    return moe_tu::launch_grouped<DType::dt>(la, p);                                                  \
  }
#else
#define KDISPATCH_MOE_TU_MMA(dt)
#endif

#define KDISPATCH_MOE_TU(dt)                                                                               \
  namespace dispatch::KDISPATCH_GPU_NS {                                                                   \
  Status launch_fused_moe_##dt(const core::LaunchArgs& la, const core::Problem& p, bool vec) noexcept {    \
    return vec ? moe_tu::launch<DType::dt, true>(la, p) : moe_tu::launch<DType::dt, false>(la, p);         \
  }                                                                                                        \
  Status launch_fused_moe_split_##dt(const core::LaunchArgs& la, const core::Problem& p) noexcept {        \
    return moe_tu::launch_split<DType::dt, DType::dt>(la, p);                                              \
  }                                                                                                        \
  KDISPATCH_MOE_TU_MMA(dt)                                                                                 \
  void probe_fused_moe_##dt(KernelImage* out, const ProbeEnv&) noexcept { moe_tu::probe<DType::dt>(out); } \
  }
