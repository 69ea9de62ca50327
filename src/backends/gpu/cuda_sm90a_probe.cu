// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — is this build's sm_90a image what runs here?
//
// This file alone is compiled for sm_90a SASS only (no PTX; see
// cmake/backends.cmake), so its kernel has a loadable image exactly on a
// compute capability 9.0 device (H100, H200) running this build's sm_90a
// code. The device probe names such a device's arch "sm_90a"; anything else
// (a CC 9.0 device on a build without sm_90a, or a newer device running the
// compute_90 PTX through the driver's JIT) is "sm_<major><minor>".
#include <cuda_runtime.h>

namespace dispatch::cuda {
namespace {
__global__ void sm90a_probe_kernel() {}
}  // namespace

bool sm90a_image_loads() noexcept {
  cudaFuncAttributes a{};
  const cudaError_t e = cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(&sm90a_probe_kernel));
  if (e != cudaSuccess) (void)cudaGetLastError();
  return e == cudaSuccess;
}
}  // namespace dispatch::cuda
