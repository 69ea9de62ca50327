// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — fused_moe (src/ops/fused_moe.hpp):
//
//   fused_moe_<w>__grouped   the (token, choice) pairs sorted by expert
//                            (moe_align's order: a counting sort, stable,
//                            so a token's pairs keep their order), then per
//                            expert BLOCK_M pairs at a time against each
//                            weight row decoded once. Params:
//     BLOCK_M {1, 4, 16}     pairs computed together per decoded row
//   fused_moe_<w>__ref       token by token, choice by choice (the
//                            validation baseline)
//
// <w> is the weights' dtype: fp32 (hidden fp32), bf16 (hidden bf16) or
// fp8_e4m3fn (block fp8: hidden and out bf16 or fp32). Both accumulate in
// fp32, keep the intermediate in fp32, sum each token's choices in fp32 in
// choice order (per token: deterministic) and round out once. With fp8
// weights the activations are quantised per token and 128-wide group as
// quant_fp8_group does (hidden before w1, the activated intermediate
// before w2) and each 128-wide K group's sum is scaled by its block scale,
// as SGLang's block kernel orders it. The GPU is where this op is meant to
// run; these make every surface work everywhere and are the GPU families'
// second reference.
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/numeric.hpp"
#include "cpu/cpu_common.hpp"
#include "cpu/cpu_simd.hpp"
#include "cpu/fused_moe_list.hpp"
#include "cpu/moe_common.hpp"
#include "ops/fused_moe.hpp"
#include "ops/quant_fp8.hpp"

namespace dispatch::cpu {
namespace {

using namespace core::variant_names;
using namespace simd;
using namespace moe_cpu;

float activate(float g, int act) {
  return act == core::kMoeActGelu ? 0.5f * g * (1.f + std::erf(g * 0.70710678f)) : g / (1.f + std::exp(-g));
}

/// The whole op. BM = 0: the reference order (token by token); else the
/// pairs sorted by expert, BM at a time per decoded weight row.
template <class W, class X>
Status run(const LaunchArgs& a, const Problem& p, int64_t bm) {
  const int64_t M = p.m, H = p.k, I = p.n, E = p.extra[0], K = p.extra[1];
  const int act = static_cast<int>(a.scalar[1]);
  const float rsf = a.scalar[0];
  const bool fp8 = a.data[core::kMoeArgW1Scale] != nullptr;
  const X* hidden = a.ptr<const X>(core::kMoeArgHidden);
  const int32_t* ids = a.ptr<const int32_t>(core::kMoeArgTopkIds);
  const float* tw = a.ptr<const float>(core::kMoeArgTopkWeights);
  X* out = a.ptr<X>(core::kMoeArgOut);
  const int64_t ldh = a.ld[core::kMoeArgHidden], ldo = a.ld[core::kMoeArgOut], ldi = a.ld[core::kMoeArgTopkIds],
                ldw = a.ld[core::kMoeArgTopkWeights];
  try {
    // The pairs (t, j) in the order they are computed, and each token's
    // choices' results kept apart (summed per token in choice order at the end).
    std::vector<int64_t> order;
    order.reserve(static_cast<size_t>(M * K));
    if (bm == 0) {
      for (int64_t q = 0; q < M * K; ++q) order.push_back(q);
    } else {
      std::vector<int64_t> count(static_cast<size_t>(E + 1), 0);
      for (int64_t t = 0; t < M; ++t)
        for (int64_t j = 0; j < K; ++j) {
          const int32_t e = ids[t * ldi + j];
          if (e >= 0 && e < E) ++count[static_cast<size_t>(e) + 1];
        }
      for (int64_t e = 0; e < E; ++e) count[static_cast<size_t>(e) + 1] += count[static_cast<size_t>(e)];
      order.assign(static_cast<size_t>(count[static_cast<size_t>(E)]), 0);
      for (int64_t t = 0; t < M; ++t)
        for (int64_t j = 0; j < K; ++j) {
          const int32_t e = ids[t * ldi + j];
          if (e >= 0 && e < E) order[static_cast<size_t>(count[static_cast<size_t>(e)]++)] = t * K + j;
        }
    }
    const int64_t blk = bm == 0 ? 1 : bm;
    std::vector<float> x(static_cast<size_t>(blk * H)), h(static_cast<size_t>(blk * 2 * I)),
        act_in(static_cast<size_t>(blk * I)), row(static_cast<size_t>(H > 2 * I ? H : 2 * I)),
        res(static_cast<size_t>(M * K * H), 0.f);
    std::vector<char> done(static_cast<size_t>(M * K), 0);
    for (size_t q0 = 0; q0 < order.size();) {
      const int64_t e = ids[(order[q0] / K) * ldi + order[q0] % K];
      if (e < 0 || e >= E) {  // the reference order meets non-local experts too
        ++q0;
        continue;
      }
      // A block: up to blk pairs of expert e, consecutive in `order`.
      int64_t n = 0;
      while (q0 + static_cast<size_t>(n) < order.size() && n < blk) {
        const int64_t q = order[q0 + static_cast<size_t>(n)];
        if (ids[(q / K) * ldi + q % K] != e) break;
        ++n;
      }
      for (int64_t b = 0; b < n; ++b) {
        const int64_t t = order[q0 + static_cast<size_t>(b)] / K;
        for (int64_t c = 0; c < H; ++c) x[static_cast<size_t>(b * H + c)] = load(hidden, t * ldh + c);
        if (fp8) quantise_groups(&x[static_cast<size_t>(b * H)], H);
      }
      const Weight<W> w1 = expert<W>(a, core::kMoeArgW1, core::kMoeArgW1Scale, e, 2 * I, H);
      const Weight<W> w2 = expert<W>(a, core::kMoeArgW2, core::kMoeArgW2Scale, e, H, I);
      for (int64_t r = 0; r < 2 * I; ++r)
        for (int64_t b = 0; b < n; ++b)
          h[static_cast<size_t>(b * 2 * I + r)] = w1.dot(r, &x[static_cast<size_t>(b * H)], H, row.data());
      for (int64_t b = 0; b < n; ++b) {
        float* ai = &act_in[static_cast<size_t>(b * I)];
        const float* hb = &h[static_cast<size_t>(b * 2 * I)];
        for (int64_t i = 0; i < I; ++i) ai[i] = activate(hb[i], act) * hb[I + i];
        if (fp8) quantise_groups(ai, I);
      }
      for (int64_t c = 0; c < H; ++c)
        for (int64_t b = 0; b < n; ++b) {
          const int64_t q = order[q0 + static_cast<size_t>(b)];
          res[static_cast<size_t>(q * H + c)] = w2.dot(c, &act_in[static_cast<size_t>(b * I)], I, row.data());
        }
      for (int64_t b = 0; b < n; ++b) done[static_cast<size_t>(order[q0 + static_cast<size_t>(b)])] = 1;
      q0 += static_cast<size_t>(n);
    }
    for (int64_t t = 0; t < M; ++t)
      for (int64_t c = 0; c < H; ++c) {
        float y = 0.f;
        for (int64_t j = 0; j < K; ++j)
          if (done[static_cast<size_t>(t * K + j)])
            y += tw[t * ldw + j] * res[static_cast<size_t>((t * K + j) * H + c)];
        store_as(&out[t * ldo + c], rsf * y);
      }
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "fused_moe: the CPU variant's buffers");
  }
  return Status::Ok();
}

Status check_problem(const VariantDef& v, const Problem& p) noexcept {
  if (Status s = check_moe_dtypes(v, p, "hidden"); !s.ok()) return s;
  if (p.n < 1 || p.k < 1 || p.extra[0] < 1) return decline(v, StatusCode::invalid_argument, "E, H and I must be >= 1");
  return Status::Ok();
}

template <class W>
Status launch_as(const LaunchArgs& a, const Problem& p, int64_t bm) {
  if (p.m < 1) return Status::Ok();
  for (int i : {core::kMoeArgHidden, core::kMoeArgW1, core::kMoeArgW2, core::kMoeArgTopkWeights, core::kMoeArgTopkIds,
                core::kMoeArgOut})
    if (a.data[i] == nullptr) return make_status(StatusCode::invalid_argument, "fused_moe: a tensor is null");
  return p.out_dtype == DType::fp32 ? run<W, float>(a, p, bm) : run<W, Bf16>(a, p, bm);
}

template <class W>
Status ref_launch(const LaunchArgs& a, const Problem& p, const int64_t*) {
  return launch_as<W>(a, p, 0);
}
template <class W>
Status grouped_launch(const LaunchArgs& a, const Problem& p, const int64_t* prm) {
  if (prm[kMoeBlockM] < 1) return make_status(StatusCode::invalid_argument, "fused_moe: BLOCK_M must be >= 1");
  return launch_as<W>(a, p, prm[kMoeBlockM]);
}

constexpr int64_t kBlockMs[] = {1, 4, 16};
constexpr ParamDef kGroupedParams[] = {{"BLOCK_M", ParamKind::integer, kBlockMs, {}, 4}};

}  // namespace

#define KD_MOE_PAIR(Grouped, Ref, w, DT, W) \
  KD_CPU_MOE_VARIANTS(Grouped, Ref, fused_moe, "grouped", w, DT, kGroupedParams, grouped_launch<W>, ref_launch<W>)
KD_MOE_PAIR(kMoeFp32Grouped, kMoeFp32Ref, "fp32", DType::fp32, float)
KD_MOE_PAIR(kMoeBf16Grouped, kMoeBf16Ref, "bf16", DType::bf16, Bf16)
KD_MOE_PAIR(kMoeFp8Grouped, kMoeFp8Ref, "fp8_e4m3fn", DType::fp8_e4m3fn, uint8_t)
#undef KD_MOE_PAIR

// The model: a decoded weight row serves BLOCK_M pairs; tokens per expert
// (M * top_k / E on uniform routing) bound how many a block can hold.
core::Plan fused_moe_default(const core::Problem& p, const DeviceInfo&) noexcept {
  core::Plan plan;
  switch (p.in_dtype) {
    case DType::fp32: plan.variant = &kMoeFp32Grouped; break;
    case DType::bf16: plan.variant = &kMoeBf16Grouped; break;
    case DType::fp8_e4m3fn: plan.variant = &kMoeFp8Grouped; break;
    default: return plan;
  }
  const int64_t per_expert = p.extra[0] > 0 ? p.m * p.extra[1] / p.extra[0] : 1;
  plan.params[kMoeBlockM] = per_expert >= 16 ? 16 : per_expert >= 4 ? 4 : 1;
  // A dtype combination the variant does not compute (fp16 hidden with
  // bf16 weights): no plan, so the call is refused, never run on the wrong bits.
  if (!check_problem(*plan.variant, p).ok()) return {};
  return plan;
}

}  // namespace dispatch::cpu
