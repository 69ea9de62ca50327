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
//   fused_moe_<dt>__split      per pair as __pairs, each block's warps
//                              splitting K (H for the up kernel, the token's
//                              (choice, I) for the down one): every warp
//                              streams when the grid is short (M = 1)
//                              (I a multiple of 8, H of 16)
//   fused_moe_<dt>__mma        the pairs sorted by expert, each expert's rows
//                              read once per 32 of its pairs, the multiply on
//                              tensor cores (mma.sync, swap-AB; moe_mma.cuh):
//                              four launches (sort, up, down, top-k sum); for
//                              many pairs per expert (decode at M >= 16,
//                              prefill); a candidate until measured (written
//                              2026-12-04 with no device lent)
//                              (H and I multiples of 32, E <= 1024; block
//                              fp8 too: fused_moe_fp8_e4m3fn__mma, the
//                              activations quantised first, mma e4m3,
//                              H and I multiples of 128)
//   fused_moe_fp8_e4m3fn__split   the split kernels on block-fp8 weights
//                              (e4m3fn, 128x128 block scales) with bf16
//                              activations quantised per 1x128 group as
//                              they are read: block fp8's default
//   fused_moe_<dt>__cuda_ref   the same kernels one element at a time (fp8:
//                              one thread per output): the GPU reference
//                              the tuner validates against
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
int64_t mma_workspace_bytes(const core::Problem& p, const int64_t*) { return moe_mma_workspace_bytes(p); }
int64_t mma_fp8_workspace_bytes(const core::Problem& p, const int64_t*) { return moe_mma_fp8_workspace_bytes(p); }

enum class Kind { decode, ref, grouped, split, mma };

/// Where a variant's two kernels are among its TU's images (fused_moe.hpp).
int first_image(const core::VariantDef& v, Kind k) {
  if (v.in_dtype == DType::fp8_e4m3fn) return k == Kind::split ? 0 : k == Kind::ref ? 2 : 4;
  return k == Kind::decode ? 0 : k == Kind::ref ? 2 : k == Kind::grouped ? 4 : k == Kind::split ? 6 : 8;
}

KernelTu tu_of(DType dt) {
  return dt == DType::bf16   ? KernelTu::fused_moe_bf16
         : dt == DType::fp16 ? KernelTu::fused_moe_fp16
                             : KernelTu::fused_moe_fp8;
}

/// The dtypes: bf16/fp16 throughout, or block fp8 (e4m3fn weights with their
/// scales, bf16 activations).
Status check_dtypes(const core::VariantDef& v, const core::Problem& p) {
  if (v.in_dtype == DType::fp8_e4m3fn) {
    if (p.out_dtype != DType::bf16)
      return core::decline(v, StatusCode::unsupported_problem, "block fp8: hidden and out must be bf16");
    if (!p.has_bias)
      return core::decline(v, StatusCode::unsupported_problem, "block fp8: w1_scale and w2_scale are required");
    return Status();
  }
  if (p.out_dtype != p.in_dtype)
    return core::decline(v, StatusCode::unsupported_problem, "hidden and out must have the weights' dtype");
  if (p.has_bias) return core::decline(v, StatusCode::unsupported_problem, "block scales: fp8 weights only");
  return Status();
}

template <Kind K>
Status check(const core::VariantDef& v, const core::Problem& p, const DeviceInfo& dev) {
  const bool vec = K != Kind::ref;
  if (p.op != core::OpKind::fused_moe)
    return core::decline(v, StatusCode::unsupported_problem, "not a fused_moe problem");
  if (Status s = check_device_and_dtype(v, p); !s.ok()) return s;
  if (Status s = check_dtypes(v, p); !s.ok()) return s;
  if (p.n < 1 || p.k < 1 || p.extra[0] < 1 || p.extra[1] < 1)
    return core::decline(v, StatusCode::invalid_argument, "E, H, I and top_k must be >= 1");
  if (p.m * p.extra[1] > 0x7fffffff)
    return core::decline(v, StatusCode::unsupported_problem, "M * top_k over 2^31 pairs");
  if (vec && (p.k % 8 != 0 || p.n % 8 != 0 || p.align_bytes < 16))
    return core::decline(v, StatusCode::unsupported_problem,
                         "16-byte loads need H and I multiples of 8 and 16-byte aligned rows");
  if (K == Kind::grouped && (p.extra[0] > kMoeMaxExperts || p.n < 2 || p.k < kMoeDownTile))
    return core::decline(v, StatusCode::unsupported_problem,
                         "the grouped kernels take E <= " + std::to_string(kMoeMaxExperts) +
                             ", I >= 2 and H >= " + std::to_string(kMoeDownTile));
  const int64_t mult = v.in_dtype == DType::fp8_e4m3fn ? 128 : 32;
  if (K == Kind::mma && (p.n % mult != 0 || p.k % mult != 0 || p.extra[0] > kMoeMaxExperts))
    return core::decline(v, StatusCode::unsupported_problem,
                         "the tensor-core kernels take H and I multiples of " + std::to_string(mult) +
                             " and E <= " + std::to_string(kMoeMaxExperts));
  if (K == Kind::split && p.k % kMoeSplitDownRows != 0)
    return core::decline(v, StatusCode::unsupported_problem,
                         "the split kernels take H a multiple of " + std::to_string(kMoeSplitDownRows));
  if (const DeviceState* st = probed(dev, DeviceType::cuda)) {
    const int first = first_image(v, K);
    const int images = K != Kind::mma ? 2 : v.in_dtype == DType::fp8_e4m3fn ? 6 : 4;
    for (int k = first; k < first + images; ++k)
      if (Status s = image_fits(v, st->image(tu_of(v.in_dtype), k), *st, kMoeThreads); !s.ok()) return s;
  }
  return Status();
}

template <DType DT, Kind K>
Status launch(const core::LaunchArgs& la, const core::Problem& p, const int64_t*) {
  if constexpr (DT == DType::fp8_e4m3fn)
    return K == Kind::split ? launch_fused_moe_split_fp8(la, p)
           : K == Kind::mma ? launch_fused_moe_mma_fp8(la, p)
                            : launch_fused_moe_ref_fp8(la, p);
  if (K == Kind::split)
    return DT == DType::bf16 ? launch_fused_moe_split_bf16(la, p) : launch_fused_moe_split_fp16(la, p);
  if (K == Kind::mma) return DT == DType::bf16 ? launch_fused_moe_mma_bf16(la, p) : launch_fused_moe_mma_fp16(la, p);
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
KD_MOE_VARIANT(kMoeBf16Split, "fused_moe_bf16__split", DType::bf16, Kind::split, 0, workspace_bytes)
KD_MOE_VARIANT(kMoeFp16Split, "fused_moe_fp16__split", DType::fp16, Kind::split, 0, workspace_bytes)
KD_MOE_VARIANT(kMoeFp8Split, "fused_moe_fp8_e4m3fn__split", DType::fp8_e4m3fn, Kind::split, 0, workspace_bytes)
KD_MOE_VARIANT(kMoeBf16Mma, "fused_moe_bf16__mma", DType::bf16, Kind::mma, 0, mma_workspace_bytes)
KD_MOE_VARIANT(kMoeFp16Mma, "fused_moe_fp16__mma", DType::fp16, Kind::mma, 0, mma_workspace_bytes)
KD_MOE_VARIANT(kMoeFp8Mma, "fused_moe_fp8_e4m3fn__mma", DType::fp8_e4m3fn, Kind::mma, 0, mma_fp8_workspace_bytes)
KD_MOE_VARIANT(kMoeBf16Ref, "fused_moe_bf16__cuda_ref", DType::bf16, Kind::ref, core::kVariantReference,
               workspace_bytes)
KD_MOE_VARIANT(kMoeFp16Ref, "fused_moe_fp16__cuda_ref", DType::fp16, Kind::ref, core::kVariantReference,
               workspace_bytes)
KD_MOE_VARIANT(kMoeFp8Ref, "fused_moe_fp8_e4m3fn__cuda_ref", DType::fp8_e4m3fn, Kind::ref, core::kVariantReference,
               workspace_bytes)
#undef KD_MOE_VARIANT

constexpr const core::VariantDef* kRows[] = {
    &kMoeBf16Grouped, &kMoeFp16Grouped, &kMoeBf16Mma,  &kMoeFp16Mma, &kMoeFp8Mma,  &kMoeBf16Decode, &kMoeFp16Decode,
    &kMoeBf16Split,   &kMoeFp16Split,   &kMoeFp8Split, &kMoeBf16Ref, &kMoeFp16Ref, &kMoeFp8Ref};

}  // namespace

std::span<const core::VariantDef* const> fused_moe_variants() noexcept { return kRows; }

/// bf16/fp16: the per-pair kernels where their loads fit, else the
/// element-wise ones; block fp8: the split kernels, else its reference
/// kernels. (The expert-grouped kernels read each expert's rows once, yet
/// measured slower at every point on the H200, bench/results/h200_moe.md:
/// a candidate for tuning, not the default. The bf16/fp16 split kernels
/// are a candidate until they are measured: written 2026-12-04 with no
/// device lent, compiled, not yet run.)
core::Plan fused_moe_default(const core::Problem& p, const DeviceInfo& dev) noexcept {
  const core::VariantDef* order[2];
  if (p.in_dtype == DType::fp8_e4m3fn)
    order[0] = &kMoeFp8Split, order[1] = &kMoeFp8Ref;
  else if (p.in_dtype == DType::bf16)
    order[0] = &kMoeBf16Decode, order[1] = &kMoeBf16Ref;
  else if (p.in_dtype == DType::fp16)
    order[0] = &kMoeFp16Decode, order[1] = &kMoeFp16Ref;
  else
    return {};
  core::Plan plan;
  for (const core::VariantDef* v : order)
    if (v->supports(p, plan.params, dev).ok()) {
      plan.variant = v;
      return plan;
    }
  return {};  // e.g. fp16 hidden with bf16 weights
}

}  // namespace dispatch::cuda
