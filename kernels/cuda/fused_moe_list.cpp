// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — fused_moe's variant list (kernels/cuda/fused_moe.hpp;
// its list function is named by its row of kernels/gpu/ops.inc). Plain C++.
//
//   fused_moe_<dt>__pairs      the two per-pair decode kernels with 16-byte
//                              loads: the default
//   fused_moe_<dt>__experts    the pairs grouped by expert: each touched
//                              expert's rows read once per 8 of its pairs
//                              (E <= 1024); a candidate only (slower than
//                              __pairs at every measured point, 2026-12-04)
//                              (H and I multiples of 8, 16-byte aligned rows)
//   fused_moe_<dt>__cuda_ref   the same kernels one element at a time: the
//                              GPU reference the tuner validates against
//
// Both take a workspace of M * top_k * I floats (moe_decode_workspace_bytes);
// a call given less falls back, and the fallback says how much it needs.
#include <span>

#include "cuda/fused_moe.hpp"
#include "gpu/variant_checks.hpp"
#include "ops/fused_moe.hpp"

namespace dispatch::cuda {
namespace {

int64_t workspace_bytes(const core::Problem& p, const int64_t*) { return moe_decode_workspace_bytes(p); }
int64_t grouped_workspace_bytes(const core::Problem& p, const int64_t*) { return moe_grouped_workspace_bytes(p); }

enum class Kind { decode, ref, grouped };

template <Kind K>
Status check(const core::VariantDef& v, const core::Problem& p, const DeviceInfo& dev) {
  constexpr bool VEC = K != Kind::ref;
  if (p.op != core::OpKind::fused_moe)
    return core::decline(v, StatusCode::unsupported_problem, "not a fused_moe problem");
  if (Status s = check_device_and_dtype(v, p); !s.ok()) return s;
  if (p.out_dtype != p.in_dtype)
    return core::decline(v, StatusCode::unsupported_problem, "hidden and out must have the weights' dtype");
  if (p.has_bias) return core::decline(v, StatusCode::unsupported_problem, "block scales: fp8 weights only");
  if (p.n < 1 || p.k < 1 || p.extra[0] < 1 || p.extra[1] < 1)
    return core::decline(v, StatusCode::invalid_argument, "E, H, I and top_k must be >= 1");
  if (p.m * p.extra[1] > 0x7fffffff)
    return core::decline(v, StatusCode::unsupported_problem, "M * top_k over 2^31 pairs");
  if (VEC && (p.k % 8 != 0 || p.n % 8 != 0 || p.align_bytes < 16))
    return core::decline(v, StatusCode::unsupported_problem,
                         "16-byte loads need H and I multiples of 8 and 16-byte aligned rows");
  if (K == Kind::grouped && (p.extra[0] > kMoeMaxExperts || p.n < 2 || p.k < kMoeDownTile))
    return core::decline(v, StatusCode::unsupported_problem,
                         "the grouped kernels take E <= " + std::to_string(kMoeMaxExperts) +
                             ", I >= 2 and H >= " + std::to_string(kMoeDownTile));
  if (const DeviceState* st = probed(dev, DeviceType::cuda)) {
    const KernelTu tu = v.in_dtype == DType::bf16 ? KernelTu::fused_moe_bf16 : KernelTu::fused_moe_fp16;
    const int first = K == Kind::decode ? 0 : K == Kind::ref ? 2 : 4;
    for (int k = first; k < first + 2; ++k)
      if (Status s = image_fits(v, st->image(tu, k), *st, kMoeThreads); !s.ok()) return s;
  }
  return Status();
}

template <DType DT, Kind K>
Status launch(const core::LaunchArgs& la, const core::Problem& p, const int64_t*) {
  if (K == Kind::grouped)
    return DT == DType::bf16 ? launch_fused_moe_grouped_bf16(la, p) : launch_fused_moe_grouped_fp16(la, p);
  return DT == DType::bf16 ? launch_fused_moe_bf16(la, p, K == Kind::decode)
                           : launch_fused_moe_fp16(la, p, K == Kind::decode);
}

template <const core::VariantDef& V, Kind K>
Status supports(const core::Problem& p, const int64_t*, const DeviceInfo& dev) {
  return check<K>(V, p, dev);
}

#define KD_MOE_VARIANT(Var, kName, DT, K, kFlags, kWorkspace)         \
  extern const core::VariantDef Var;                                  \
  constinit const core::VariantDef Var{.name = kName,                 \
                                       .op = core::OpKind::fused_moe, \
                                       .backend = DeviceType::cuda,   \
                                       .in_dtype = DT,                \
                                       .params = {},                  \
                                       .flags = kFlags,               \
                                       .schema_version = 1,           \
                                       .supports = &supports<Var, K>, \
                                       .launch = &launch<DT, K>,      \
                                       .workspace_bytes = &kWorkspace};
KD_MOE_VARIANT(kMoeBf16Grouped, "fused_moe_bf16__experts", DType::bf16, Kind::grouped, 0, grouped_workspace_bytes)
KD_MOE_VARIANT(kMoeFp16Grouped, "fused_moe_fp16__experts", DType::fp16, Kind::grouped, 0, grouped_workspace_bytes)
KD_MOE_VARIANT(kMoeBf16Decode, "fused_moe_bf16__pairs", DType::bf16, Kind::decode, 0, workspace_bytes)
KD_MOE_VARIANT(kMoeFp16Decode, "fused_moe_fp16__pairs", DType::fp16, Kind::decode, 0, workspace_bytes)
KD_MOE_VARIANT(kMoeBf16Ref, "fused_moe_bf16__cuda_ref", DType::bf16, Kind::ref, core::kVariantReference,
               workspace_bytes)
KD_MOE_VARIANT(kMoeFp16Ref, "fused_moe_fp16__cuda_ref", DType::fp16, Kind::ref, core::kVariantReference,
               workspace_bytes)
#undef KD_MOE_VARIANT

constexpr const core::VariantDef* kRows[] = {&kMoeBf16Grouped, &kMoeFp16Grouped, &kMoeBf16Decode,
                                             &kMoeFp16Decode,  &kMoeBf16Ref,     &kMoeFp16Ref};

}  // namespace

std::span<const core::VariantDef* const> fused_moe_variants() noexcept { return kRows; }

/// The per-pair kernels where their loads fit, else the element-wise ones.
/// (The expert-grouped kernels read each expert's rows once, yet measured
/// slower at every point on the H200, bench/results/h200_moe.md: they are a
/// candidate for tuning, not the default.)
core::Plan fused_moe_default(const core::Problem& p, const DeviceInfo& dev) noexcept {
  core::Plan plan;
  const bool bf16 = p.in_dtype == DType::bf16;
  if (!bf16 && p.in_dtype != DType::fp16) return plan;
  const core::VariantDef& vec = bf16 ? kMoeBf16Decode : kMoeFp16Decode;
  const core::VariantDef& ref = bf16 ? kMoeBf16Ref : kMoeFp16Ref;
  plan.variant = vec.supports(p, plan.params, dev).ok() ? &vec : &ref;
  if (plan.variant == &ref && !ref.supports(p, plan.params, dev).ok()) return {};  // e.g. fp16 hidden, bf16 weights
  return plan;
}

}  // namespace dispatch::cuda
