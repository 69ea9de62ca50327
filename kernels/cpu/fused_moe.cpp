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
// as SGLang's block kernel orders it.
//
//   fused_moe_fp8_tensor_fp8_e4m3fn__grouped/__ref, fused_moe_fp8_channel_...:
//                            src/ops/fused_moe_fp8.hpp in passes (hidden
//                            quantised, every pair's up GEMM and
//                            activation, the intermediate quantised, the
//                            down GEMM, the sum), BLOCK_M as above; each
//                            GEMM sum scaled once by its row's and the
//                            expert's (channel's) scale.
//
// The GPU is where this op is meant to
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
#include "ops/fused_moe_fp8.hpp"
#include "ops/quant_fp8.hpp"

namespace dispatch::cpu {
namespace {

using namespace core::variant_names;
using namespace simd;
using namespace moe_cpu;
using core::MoeFp8Scales;

float activate(float g, int act) {
  return act == core::kMoeActGelu ? 0.5f * g * (1.f + std::erf(g * 0.70710678f)) : g / (1.f + std::exp(-g));
}

/// The (token, choice) pairs q = t * top_k + j in the order they are
/// computed: bm = 0, all of them in order (the reference meets non-local
/// experts too); else the local ones sorted by expert (moe_align's order: a
/// counting sort, stable, so a token's pairs keep their order).
std::vector<int64_t> pair_order(const int32_t* ids, int64_t ldi, int64_t M, int64_t K, int64_t E, int64_t bm) {
  std::vector<int64_t> order;
  if (bm == 0) {
    order.reserve(static_cast<size_t>(M * K));
    for (int64_t q = 0; q < M * K; ++q) order.push_back(q);
    return order;
  }
  std::vector<int64_t> count(static_cast<size_t>(E + 1), 0);
  for (int64_t t = 0; t < M; ++t)
    for (int64_t j = 0; j < K; ++j)
      if (const int32_t e = ids[t * ldi + j]; e >= 0 && e < E) ++count[static_cast<size_t>(e) + 1];
  for (int64_t e = 0; e < E; ++e) count[static_cast<size_t>(e) + 1] += count[static_cast<size_t>(e)];
  order.assign(static_cast<size_t>(count[static_cast<size_t>(E)]), 0);
  for (int64_t t = 0; t < M; ++t)
    for (int64_t j = 0; j < K; ++j)
      if (const int32_t e = ids[t * ldi + j]; e >= 0 && e < E)
        order[static_cast<size_t>(count[static_cast<size_t>(e)]++)] = t * K + j;
  return order;
}

/// Calls fn(e, first, n) for each block of `order`: up to blk consecutive
/// pairs of one local expert e (order[first .. first + n)); pairs of a
/// non-local expert are skipped.
template <class Fn>
void for_each_block(const std::vector<int64_t>& order, const int32_t* ids, int64_t ldi, int64_t K, int64_t E,
                    int64_t blk, Fn&& fn) {
  for (size_t q0 = 0; q0 < order.size();) {
    const int64_t e = ids[(order[q0] / K) * ldi + order[q0] % K];
    if (e < 0 || e >= E) {
      ++q0;
      continue;
    }
    int64_t n = 0;
    while (q0 + static_cast<size_t>(n) < order.size() && n < blk) {
      const int64_t q = order[q0 + static_cast<size_t>(n)];
      if (ids[(q / K) * ldi + q % K] != e) break;
      ++n;
    }
    fn(e, q0, n);
    q0 += static_cast<size_t>(n);
  }
}

/// out[t] = rsf * the sum over t's computed choices (in choice order) of
/// topk_weights times res [M * top_k, H].
template <class X>
void sum_choices(const LaunchArgs& a, const Problem& p, const std::vector<float>& res, const std::vector<char>& done) {
  const int64_t M = p.m, H = p.k, K = p.extra[1];
  const float* tw = a.ptr<const float>(core::kMoeArgTopkWeights);
  X* out = a.ptr<X>(core::kMoeArgOut);
  const int64_t ldw = a.ld[core::kMoeArgTopkWeights], ldo = a.ld[core::kMoeArgOut];
  for (int64_t t = 0; t < M; ++t)
    for (int64_t c = 0; c < H; ++c) {
      float y = 0.f;
      for (int64_t j = 0; j < K; ++j)
        if (done[static_cast<size_t>(t * K + j)]) y += tw[t * ldw + j] * res[static_cast<size_t>((t * K + j) * H + c)];
      store_as(&out[t * ldo + c], a.scalar[0] * y);
    }
}

/// The whole op (fused_moe). BM = 0: the reference order (token by token);
/// else the pairs sorted by expert, BM at a time per decoded weight row.
template <class W, class X>
Status run(const LaunchArgs& a, const Problem& p, int64_t bm) {
  const int64_t M = p.m, H = p.k, I = p.n, E = p.extra[0], K = p.extra[1];
  const int act = static_cast<int>(a.scalar[1]);
  const bool fp8 = a.data[core::kMoeArgW1Scale] != nullptr;
  const X* hidden = a.ptr<const X>(core::kMoeArgHidden);
  const int32_t* ids = a.ptr<const int32_t>(core::kMoeArgTopkIds);
  const int64_t ldh = a.ld[core::kMoeArgHidden], ldi = a.ld[core::kMoeArgTopkIds];
  try {
    // The pairs in the order they are computed, and each token's choices'
    // results kept apart (summed per token in choice order at the end).
    const std::vector<int64_t> order = pair_order(ids, ldi, M, K, E, bm);
    const int64_t blk = bm == 0 ? 1 : bm;
    std::vector<float> x(static_cast<size_t>(blk * H)), h(static_cast<size_t>(blk * 2 * I)),
        act_in(static_cast<size_t>(blk * I)), row(static_cast<size_t>(H > 2 * I ? H : 2 * I)),
        res(static_cast<size_t>(M * K * H), 0.f);
    std::vector<char> done(static_cast<size_t>(M * K), 0);
    for_each_block(order, ids, ldi, K, E, blk, [&](int64_t e, size_t q0, int64_t n) {
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
    });
    sum_choices<X>(a, p, res, done);
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "fused_moe: the CPU variant's buffers");
  }
  return Status::Ok();
}

/// The fp8_w8a8 ops (fused_moe_fp8_tensor / _channel) in passes: hidden
/// quantised; every local pair's up GEMM and activation; the intermediate
/// quantised (a dynamic per-tensor scale needs all of it first); the down
/// GEMM; the top-k sum. Each GEMM sum is scaled once by its row's and the
/// expert's (channel's) scale.
template <MoeFp8Scales L, class X>
Status run_scaled(const LaunchArgs& a, const Problem& p, int64_t bm) {
  const int64_t M = p.m, H = p.k, I = p.n, E = p.extra[0], K = p.extra[1], P = M * K;
  const bool channel = L == MoeFp8Scales::channel;
  const int act = static_cast<int>(a.scalar[1]);
  const X* hidden = a.ptr<const X>(core::kMoeArgHidden);
  const int32_t* ids = a.ptr<const int32_t>(core::kMoeArgTopkIds);
  const int64_t ldh = a.ld[core::kMoeArgHidden], ldi = a.ld[core::kMoeArgTopkIds];
  // The expert's (channel's) weight scale of row r of slot's weight.
  auto sw = [&](int slot, int64_t e, int64_t r) {
    const float* s = a.ptr<const float>(slot);
    return channel ? s[e * a.ld[slot] + r] : s[e];
  };
  try {
    const std::vector<int64_t> order = pair_order(ids, ldi, M, K, E, bm);
    const int64_t blk = bm == 0 ? 1 : bm;
    std::vector<float> x(static_cast<size_t>(M * H)), sa1(static_cast<size_t>(M)), inter(static_cast<size_t>(P * I)),
        sa2(static_cast<size_t>(P)), h(static_cast<size_t>(blk * 2 * I)), row(static_cast<size_t>(H > I ? H : I)),
        res(static_cast<size_t>(P * H), 0.f);
    std::vector<char> done(static_cast<size_t>(P), 0);
    for (int64_t t = 0; t < M; ++t)
      for (int64_t c = 0; c < H; ++c) x[static_cast<size_t>(t * H + c)] = load(hidden, t * ldh + c);
    quantise_rows(x.data(), M, H, a.ptr<const float>(core::kMoeArgA1Scale), channel, nullptr, sa1.data());
    // Up: each decoded w1 row serves the block's pairs (h: their 2I values).
    for_each_block(order, ids, ldi, K, E, blk, [&](int64_t e, size_t q0, int64_t n) {
      const Weight<uint8_t> w1 = expert<uint8_t>(a, core::kMoeArgW1, -1, e, 2 * I, H);
      for (int64_t r = 0; r < 2 * I; ++r) {
        w1.decode(r, H, row.data());
        const float s1 = sw(core::kMoeArgW1Scale, e, r);
        for (int64_t b = 0; b < n; ++b) {
          const int64_t t = order[q0 + static_cast<size_t>(b)] / K;
          h[static_cast<size_t>(b * 2 * I + r)] = stored_value(
              w1.dot_decoded(r, row.data(), &x[static_cast<size_t>(t * H)], H) * sa1[static_cast<size_t>(t)] * s1,
              static_cast<X*>(nullptr));  // SGLang's intermediate_cache1: out's dtype
        }
      }
      for (int64_t b = 0; b < n; ++b) {
        const int64_t q = order[q0 + static_cast<size_t>(b)];
        const float* hb = &h[static_cast<size_t>(b * 2 * I)];
        for (int64_t i = 0; i < I; ++i)  // its intermediate_cache2: out's dtype
          inter[static_cast<size_t>(q * I + i)] =
              stored_value(activate(hb[i], act) * hb[I + i], static_cast<X*>(nullptr));
        done[static_cast<size_t>(q)] = 1;
      }
    });
    quantise_rows(inter.data(), P, I, a.ptr<const float>(core::kMoeArgA2Scale), channel, done.data(), sa2.data());
    // Down: each decoded w2 row dotted with the block's pairs.
    for_each_block(order, ids, ldi, K, E, blk, [&](int64_t e, size_t q0, int64_t n) {
      const Weight<uint8_t> w2 = expert<uint8_t>(a, core::kMoeArgW2, -1, e, H, I);
      for (int64_t c = 0; c < H; ++c) {
        w2.decode(c, I, row.data());
        const float s2 = sw(core::kMoeArgW2Scale, e, c);
        for (int64_t b = 0; b < n; ++b) {
          const int64_t q = order[q0 + static_cast<size_t>(b)];
          res[static_cast<size_t>(q * H + c)] =
              w2.dot_decoded(c, row.data(), &inter[static_cast<size_t>(q * I)], I) * sa2[static_cast<size_t>(q)] * s2;
        }
      }
    });
    sum_choices<X>(a, p, res, done);
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "fused_moe_fp8: the CPU variant's buffers");
  }
  return Status::Ok();
}

Status check_problem(const VariantDef& v, const Problem& p) noexcept {
  if (Status s = check_moe_dtypes(v, p, "hidden"); !s.ok()) return s;
  if (p.n < 1 || p.k < 1 || p.extra[0] < 1) return decline(v, StatusCode::invalid_argument, "E, H and I must be >= 1");
  return Status::Ok();
}

template <class W, Mode D = Mode::plain>
Status launch_as(const LaunchArgs& a, const Problem& p, int64_t bm) {
  if (p.m < 1) return Status::Ok();
  for (int i : {core::kMoeArgHidden, core::kMoeArgW1, core::kMoeArgW2, core::kMoeArgTopkWeights, core::kMoeArgTopkIds,
                core::kMoeArgOut})
    if (a.data[i] == nullptr) return make_status(StatusCode::invalid_argument, "fused_moe: a tensor is null");
  if constexpr (D != Mode::plain) {
    if (a.data[core::kMoeArgW1Scale] == nullptr || a.data[core::kMoeArgW2Scale] == nullptr)
      return make_status(StatusCode::invalid_argument, "fused_moe_fp8: w1_scale or w2_scale is null");
    constexpr MoeFp8Scales L = scales_of(D);
    return p.out_dtype == DType::fp32 ? run_scaled<L, float>(a, p, bm) : run_scaled<L, Bf16>(a, p, bm);
  }
  return p.out_dtype == DType::fp32 ? run<W, float>(a, p, bm) : run<W, Bf16>(a, p, bm);
}

constexpr int64_t kBlockMs[] = {1, 4, 16};
constexpr ParamDef kGroupedParams[] = {{"BLOCK_M", ParamKind::integer, kBlockMs, {}, 4}};

}  // namespace

#define KD_MOE_PAIR(Grouped, Ref, w, DT, W) \
  KD_CPU_MOE_PARAM_VARIANTS(Grouped, Ref, fused_moe, "grouped", w, DT, kGroupedParams, kMoeBlockM, W, Mode::plain)
KD_MOE_PAIR(kMoeFp32Grouped, kMoeFp32Ref, "fp32", DType::fp32, float)
KD_MOE_PAIR(kMoeBf16Grouped, kMoeBf16Ref, "bf16", DType::bf16, Bf16)
KD_MOE_PAIR(kMoeFp8Grouped, kMoeFp8Ref, "fp8_e4m3fn", DType::fp8_e4m3fn, uint8_t)
#undef KD_MOE_PAIR
KD_CPU_MOE_FP8_VARIANTS(kMoeFp8TensorGrouped, kMoeFp8TensorRef, fused_moe_fp8_tensor, "grouped", Mode::tensor,
                        kGroupedParams, kMoeBlockM)
KD_CPU_MOE_FP8_VARIANTS(kMoeFp8ChannelGrouped, kMoeFp8ChannelRef, fused_moe_fp8_channel, "grouped", Mode::channel,
                        kGroupedParams, kMoeBlockM)

// The model: a decoded weight row serves BLOCK_M pairs; tokens per expert
// (M * top_k / E on uniform routing) bound how many a block can hold.
core::Plan fused_moe_default(const core::Problem& p, const DeviceInfo&) noexcept {
  core::Plan plan;
  plan.variant = moe_variant(p, {OpKind::fused_moe_fp8_tensor, OpKind::fused_moe_fp8_channel},
                             {&kMoeFp8TensorGrouped, &kMoeFp8ChannelGrouped},
                             {&kMoeFp32Grouped, &kMoeBf16Grouped, &kMoeFp8Grouped});
  if (plan.variant == nullptr) return plan;
  const int64_t per_expert = p.extra[0] > 0 ? p.m * p.extra[1] / p.extra[0] : 1;
  plan.params[kMoeBlockM] = per_expert >= 16 ? 16 : per_expert >= 4 ? 4 : 1;
  // A dtype combination the variant does not compute (fp16 hidden with
  // bf16 weights): no plan, so the call is refused, never run on the wrong bits.
  if (!check_problem(*plan.variant, p).ok()) return {};
  return plan;
}

}  // namespace dispatch::cpu
