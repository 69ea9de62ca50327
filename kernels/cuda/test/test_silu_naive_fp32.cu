// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend, test-only — the kernel of the test_silu_naive
// family (kernels/cuda/test/test_silu_naive.hpp), its launcher and its image
// probe (declared by its row of kernels/gpu/families.inc).
#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "cuda/test/test_silu_naive.hpp"
#include "gpu/launch_util.hpp"
#include "ops/silu_and_mul.hpp"

namespace dispatch::cuda {
namespace {

__global__ void KDISPATCH_KERNEL_HIDDEN __launch_bounds__(kTestSiluNaiveThreads)
    test_silu_naive_kernel(const float* x, float* out, int64_t ldx, int64_t ldo, int64_t rows, int64_t d) {
  port::grid_dependency_wait_and_release();
  const int64_t n = rows * d;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n; e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = e / d, i = e % d;
    const float g = x[t * ldx + i];
    out[t * ldo + i] = g / (1.f + expf(-g)) * x[t * ldx + d + i];
  }
}

}  // namespace

Status launch_test_silu_naive_fp32(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  if (p.m < 1 || p.n < 1) return Status();
  const auto* x = static_cast<const float*>(la.data[core::kSiluArgX]);
  auto* out = static_cast<float*>(la.data[core::kSiluArgOut]);
  if (x == nullptr || out == nullptr) return make_status(StatusCode::invalid_argument, "test_silu_naive: null tensor");
  const int64_t n = p.m * p.n;
  const int64_t blocks = (n + kTestSiluNaiveThreads - 1) / kTestSiluNaiveThreads;
  const dim3 grid(static_cast<unsigned>(blocks < 65535 ? blocks : 65535));
  const LaunchScope on(la, p);
  const port::Error e = port::launch(test_silu_naive_kernel, grid, dim3(kTestSiluNaiveThreads), on.stream, on.pdl, x,
                                     out, la.ld[core::kSiluArgX], la.ld[core::kSiluArgOut], p.m, p.n);
  return port::status(e, "test_silu_naive kernel launch");
}

void probe_test_silu_naive_fp32(KernelImage* out, const ProbeEnv&) noexcept {
  out[0] = image_of(test_silu_naive_kernel);
}

}  // namespace dispatch::cuda
