// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend, test-only — the variant list of the test_silu_naive
// family (kernels/cuda/test/test_silu_naive.hpp): one variant,
// "silu_and_mul_fp32__test_naive", no params; its list function is named by
// its row of kernels/gpu/ops.inc. Plain C++.
#include <span>

#include "cuda/test/test_silu_naive.hpp"
#include "gpu/variant_checks.hpp"
#include "ops/silu_and_mul.hpp"

namespace dispatch::cuda {
namespace {

Status supports(const core::Problem& p, const int64_t*, const DeviceInfo& dev);
Status launch(const core::LaunchArgs& la, const core::Problem& p, const int64_t*) {
  return launch_test_silu_naive_fp32(la, p);
}

constinit const core::VariantDef kTestSiluNaive{"silu_and_mul_fp32__test_naive",
                                                core::OpKind::silu_and_mul,
                                                DeviceType::cuda,
                                                DType::fp32,
                                                {},
                                                0,
                                                1,
                                                &supports,
                                                &launch,
                                                0,
                                                0,
                                                nullptr};

Status supports(const core::Problem& p, const int64_t*, const DeviceInfo& dev) {
  const core::VariantDef& v = kTestSiluNaive;
  if (p.op != core::OpKind::silu_and_mul)
    return core::decline(v, StatusCode::unsupported_problem, "not a silu_and_mul problem");
  if (Status s = check_device_and_dtype(v, p); !s.ok()) return s;
  if (p.out_dtype != p.in_dtype)
    return core::decline(v, StatusCode::unsupported_problem, "the output dtype must be the input dtype");
  if (p.n < 1) return core::decline(v, StatusCode::invalid_argument, "d must be >= 1");
  if (const DeviceState* st = probed(dev, DeviceType::cuda))
    return image_fits(v, st->image(KernelTu::test_silu_naive_fp32, 0), *st, kTestSiluNaiveThreads);
  return Status();
}

constexpr const core::VariantDef* kRows[] = {&kTestSiluNaive};

}  // namespace

std::span<const core::VariantDef* const> test_silu_naive_variants() noexcept { return kRows; }

}  // namespace dispatch::cuda
