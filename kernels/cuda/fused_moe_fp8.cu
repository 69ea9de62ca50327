// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — fused_moe's block-fp8 kernels: e4m3fn weights with
// 128x128 block scales, bf16 activations (the split kernels and the
// reference: kernels/gpu/moe_kernels.cuh; the tensor-core ones:
// kernels/cuda/moe_mma.cuh).
#include "gpu/moe_tu.cuh"

namespace dispatch::cuda {

Status launch_fused_moe_split_fp8(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  return moe_tu::launch_split<DType::fp8_e4m3fn, DType::bf16>(la, p);
}
Status launch_fused_moe_ref_fp8(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  return moe_tu::launch_fp8_ref<DType::bf16>(la, p);
}
Status launch_fused_moe_mma_fp8(const core::LaunchArgs& la, const core::Problem& p, bool staged) noexcept {
  return moe_tu::launch_mma<DType::fp8_e4m3fn, DType::bf16>(la, p, staged, false);
}
Status moe_zero_async(void* d, int64_t bytes, const core::LaunchArgs& la, const core::Problem& p) noexcept {
  const LaunchScope on(la, p);
  return port::status(cudaMemsetAsync(d, 0, static_cast<size_t>(bytes), on.stream), "fused_moe: zeroing rows");
}
Status moe_copy_rows_async(void* dst, const void* src, int64_t rows, int64_t row_bytes, int64_t src_pitch,
                           const core::LaunchArgs& la, const core::Problem& p) noexcept {
  const LaunchScope on(la, p);
  return port::status(
      cudaMemcpy2DAsync(dst, static_cast<size_t>(row_bytes), src, static_cast<size_t>(src_pitch),
                        static_cast<size_t>(row_bytes), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, on.stream),
      "fused_moe: topk_weights rows");
}
void probe_fused_moe_fp8(KernelImage* out, const ProbeEnv&) noexcept {
  out[0] = image_of(moe::moe_up_split_kernel<DType::fp8_e4m3fn, DType::bf16>);
  out[1] = image_of(moe::moe_down_split_kernel<DType::fp8_e4m3fn, DType::bf16>);
  out[2] = image_of(moe::moe_up_fp8_ref_kernel<DType::bf16>);
  out[3] = image_of(moe::moe_down_fp8_ref_kernel<DType::bf16>);
  out[4] = image_of(moe_mma::moe_sort_kernel<DType::fp8_e4m3fn>);
  out[5] = image_of(moe_mma::moe_quant_kernel<uint16_t>);
  out[6] = image_of(moe_mma::moe_up_mma_fp8_kernel<DType::bf16>);
  out[7] = image_of(moe_mma::moe_quant_kernel<float>);
  out[8] = image_of(moe_mma::moe_down_mma_fp8_kernel<DType::bf16>);
  out[9] = image_of(moe_mma::moe_reduce_kernel<DType::bf16>);
  out[10] = moe_tu::ring_image(moe_mma::moe_ring_kernel<DType::fp8_e4m3fn, true>);
  out[11] = moe_tu::ring_image(moe_mma::moe_ring_kernel<DType::fp8_e4m3fn, false>);
}

}  // namespace dispatch::cuda
