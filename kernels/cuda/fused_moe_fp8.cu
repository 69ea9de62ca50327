// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — fused_moe's block-fp8 kernels: e4m3fn weights with
// 128x128 block scales, bf16 activations (the kernels are
// kernels/gpu/moe_kernels.cuh: the split kernels and the reference).
#include "cuda/fused_moe.cuh"

namespace dispatch::cuda {

Status launch_fused_moe_split_fp8(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  return moe_tu::launch_split<DType::fp8_e4m3fn, DType::bf16>(la, p);
}
Status launch_fused_moe_ref_fp8(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  return moe_tu::launch_fp8_ref<DType::bf16>(la, p);
}
void probe_fused_moe_fp8(KernelImage* out, const ProbeEnv&) noexcept {
  out[0] = image_of(moe::moe_up_split_kernel<DType::fp8_e4m3fn, DType::bf16>);
  out[1] = image_of(moe::moe_down_split_kernel<DType::fp8_e4m3fn, DType::bf16>);
  out[2] = image_of(moe::moe_up_fp8_ref_kernel<DType::bf16>);
  out[3] = image_of(moe::moe_down_fp8_ref_kernel<DType::bf16>);
}

}  // namespace dispatch::cuda
