// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — fused_moe's launcher and image probe for one
// dtype (KDISPATCH_MOE_TU(dt) in kernels/cuda/fused_moe_<dt>.cu).
#pragma once

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "cuda/fused_moe.hpp"
#include "gpu/launch_util.hpp"
#include "gpu/moe_kernels.cuh"
#include "ops/fused_moe.hpp"

namespace dispatch::cuda::moe_tu {

inline constexpr int kUpRows = 4, kDownRows = 2;
/// Rows per block of the per-pair down kernel (every warp on all of them).
inline constexpr int kPairDownRows = 4;
static_assert(int64_t{moe::kWarps} * kDownRows == kMoeDownTile, "the grouped down kernel's tile");

template <DType DT, bool VEC>
Status launch(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  if (p.m < 1) return Status();
  const int64_t P = p.m * p.extra[1];
  if (la.workspace == nullptr || la.workspace_bytes < moe_decode_workspace_bytes(p))
    return core::needs_fallback("fused_moe: the workspace holds " + std::to_string(la.workspace_bytes) +
                                " bytes, the call needs " + std::to_string(moe_decode_workspace_bytes(p)));
  moe::UpArgs u{la.data[core::kMoeArgHidden],
                la.data[core::kMoeArgW1],
                static_cast<const int32_t*>(la.data[core::kMoeArgTopkIds]),
                static_cast<float*>(la.workspace),
                la.ld[core::kMoeArgHidden],
                la.ld[core::kMoeArgW1],
                la.ld[core::kMoeArgTopkIds],
                p.k,
                p.n,
                p.extra[0],
                p.extra[1],
                static_cast<int>(la.scalar[1])};
  moe::DownArgs d{la.data[core::kMoeArgW2],
                  static_cast<const int32_t*>(la.data[core::kMoeArgTopkIds]),
                  static_cast<const float*>(la.data[core::kMoeArgTopkWeights]),
                  static_cast<const float*>(la.workspace),
                  la.data[core::kMoeArgOut],
                  la.ld[core::kMoeArgW2],
                  la.ld[core::kMoeArgTopkIds],
                  la.ld[core::kMoeArgTopkWeights],
                  la.ld[core::kMoeArgOut],
                  p.k,
                  p.n,
                  p.extra[0],
                  p.extra[1],
                  la.scalar[0]};
  constexpr int64_t up_tile = int64_t{moe::kWarps} * kUpRows;
  const dim3 gu(static_cast<unsigned>(P), static_cast<unsigned>((p.n + up_tile - 1) / up_tile));
  const dim3 gd(static_cast<unsigned>(p.m), static_cast<unsigned>((p.k + kPairDownRows - 1) / kPairDownRows));
  const LaunchScope on(la, p);
  port::Error e = port::launch(moe::moe_up_kernel<DT, kUpRows, VEC>, gu, dim3(moe::kThreads), on.stream, on.pdl, u);
  if (e != port::kSuccess) return port::status(e, "fused_moe up kernel launch");
  e = port::launch(moe::moe_down_kernel<DT, kPairDownRows, VEC>, gd, dim3(moe::kThreads), on.stream, on.pdl, d);
  return port::status(e, "fused_moe down kernel launch");
}

template <DType DT>
Status launch_grouped(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  if (p.m < 1) return Status();
  const int64_t need = moe_grouped_workspace_bytes(p), P = p.m * p.extra[1];
  if (la.workspace == nullptr || la.workspace_bytes < need)
    return core::needs_fallback("fused_moe: the workspace holds " + std::to_string(la.workspace_bytes) +
                                " bytes, the grouped kernels need " + std::to_string(need));
  char* ws = static_cast<char*>(la.workspace);
  const int64_t tiles = (p.k + kMoeDownTile - 1) / kMoeDownTile;
  moe::GroupedArgs g{la.data[core::kMoeArgHidden],
                     la.data[core::kMoeArgW1],
                     la.data[core::kMoeArgW2],
                     static_cast<const int32_t*>(la.data[core::kMoeArgTopkIds]),
                     static_cast<const float*>(la.data[core::kMoeArgTopkWeights]),
                     reinterpret_cast<float*>(ws),
                     reinterpret_cast<float*>(ws + moe_round256(P * p.n * 4)),
                     reinterpret_cast<uint32_t*>(ws + moe_round256(P * p.n * 4) + moe_round256(P * p.k * 4)),
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
                     tiles,
                     static_cast<int>(la.scalar[1]),
                     la.scalar[0]};
  const int64_t slots = P < p.extra[0] ? P : p.extra[0];
  constexpr int64_t up_tile = int64_t{moe::kWarps} * kUpRows;
  const dim3 gu(static_cast<unsigned>(slots), static_cast<unsigned>((p.n + up_tile - 1) / up_tile));
  const dim3 gd(static_cast<unsigned>(slots), static_cast<unsigned>(tiles));
  const LaunchScope on(la, p);
  port::Error e = port::launch(moe::moe_up_grouped_kernel<DT, kUpRows>, gu, dim3(moe::kThreads), on.stream, on.pdl, g);
  if (e != port::kSuccess) return port::status(e, "fused_moe grouped up kernel launch");
  e = port::launch(moe::moe_down_grouped_kernel<DT, kDownRows>, gd, dim3(moe::kThreads), on.stream, on.pdl, g);
  return port::status(e, "fused_moe grouped down kernel launch");
}

template <DType DT>
void probe(KernelImage* out) noexcept {
  out[0] = image_of(moe::moe_up_kernel<DT, kUpRows, true>);
  out[1] = image_of(moe::moe_down_kernel<DT, kPairDownRows, true>);
  out[2] = image_of(moe::moe_up_kernel<DT, kUpRows, false>);
  out[3] = image_of(moe::moe_down_kernel<DT, kPairDownRows, false>);
  out[4] = image_of(moe::moe_up_grouped_kernel<DT, kUpRows>);
  out[5] = image_of(moe::moe_down_grouped_kernel<DT, kDownRows>);
}

}  // namespace dispatch::cuda::moe_tu

#define KDISPATCH_MOE_TU(dt)                                                                               \
  namespace dispatch::cuda {                                                                               \
  Status launch_fused_moe_##dt(const core::LaunchArgs& la, const core::Problem& p, bool vec) noexcept {    \
    return vec ? moe_tu::launch<DType::dt, true>(la, p) : moe_tu::launch<DType::dt, false>(la, p);         \
  }                                                                                                        \
  Status launch_fused_moe_grouped_##dt(const core::LaunchArgs& la, const core::Problem& p) noexcept {      \
    return moe_tu::launch_grouped<DType::dt>(la, p);                                                       \
  }                                                                                                        \
  void probe_fused_moe_##dt(KernelImage* out, const ProbeEnv&) noexcept { moe_tu::probe<DType::dt>(out); } \
  }
