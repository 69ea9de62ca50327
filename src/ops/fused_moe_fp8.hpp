// SPDX-License-Identifier: Apache-2.0
// fused_moe on fp8 weights with SGLang's per-tensor and per-channel scales
// (its fused-MoE files' dtype=fp8_w8a8 without block_shape, and with
// per_channel_quant=True): fused_moe (src/ops/fused_moe.hpp) whose two
// GEMMs are the moe_gemm_fp8 ops' (src/ops/moe_gemm_fp8.hpp):
//
//   x = q1(hidden[t])                                 (scale sa1)
//   h = (w1[e] · x) * sa1 * sw1(e, :)                 (2I values: gate | up)
//   a = q2(act(h[0:I]) * h[I:2I])                     (scale sa2)
//   y[t] += topk_weights[t, j] * (w2[e] · a) * sa2 * sw2(e, :)
//   out[t] = routed_scaling_factor * y[t]
//
//   fused_moe_fp8_tensor   w1_scale [E], w2_scale [E]: one scale per expert
//                          (SGLang's w13_weight_scale / w2_weight_scale of a
//                          per-tensor checkpoint, after its loader folds w1's
//                          and w3's into one)
//   fused_moe_fp8_channel  w1_scale [E, 2I], w2_scale [E, H]: one per expert
//                          and output channel (SGLang's [E, N, 1] viewed as
//                          [E, N])
//
// - hidden [M, H] and out bf16 or fp32; w1 [E, 2I, H], w2 [E, H, I]
//   fp8_e4m3fn; topk_weights, topk_ids, routed_scaling_factor, activation:
//   as fused_moe.
// - a1_scale, a2_scale [1] fp32, optional, given together (static, an
//   activation_scheme "static" checkpoint's input scales): q(v) =
//   e4m3fn(clamp(v / scale, -448, 448)), sa = scale. Absent (dynamic): the
//   tensor op one scale for all of hidden (q1) and one for the whole
//   intermediate of the local pairs (q2), the channel op one per token (q1)
//   and one per pair (q2), each max(amax, 1e-10) / 448: what SGLang's
//   scaled_fp8_quant(x, scale, use_per_token_if_dynamic=per_channel_quant)
//   computes before each of its two kernels.
// - fp32 accumulation. With bf16 out, h and act(h[0:I]) * h[I:2I] are
//   rounded to bf16 before the next step, as SGLang stores them
//   (intermediate_cache1 and _cache2, the hidden dtype): a variant that kept
//   them in fp32 would flip about one e4m3 code of the intermediate in 64
//   (bf16's step is 2^-9 of a value, e4m3's 2^-3), past the tolerance where
//   I is small. With fp32 out nothing is rounded between the steps.
//
// Key: E, K, N, activation, [a_scale=static], dtype, [out_dtype], [stride],
// top_k. SGLang's file of the tensor op: E=<E>,N=<I>,dtype=fp8_w8a8; of
// the channel op: ...,dtype=fp8_w8a8,per_channel_quant=True (its
// BLOCK_SIZE_M shapes the default as fused_moe's files do).
#pragma once

#include <array>
#include <cstdio>
#include <iterator>
#include <string_view>
#include <vector>

#include "ops/fused_moe.hpp"
#include "ops/moe_gemm_fp8.hpp"

namespace dispatch::core {

inline constexpr int kMoeArgA1Scale = 8, kMoeArgA2Scale = 9;

namespace fused_moe_fp8_common {

/// w1_scale / w2_scale: [E] (tensor) or [E, rows] (channel), fp32.
constexpr ArgSlot w_scale_slot(std::string_view name, MoeFp8Scales l, DimExpr rows) {
  ArgSlot a{.name = name, .role = Role::read, .dtype = SlotDType::fixed, .fixed_dtype = DType::fp32};
  a.fill = Fill::near_one;
  if (l == MoeFp8Scales::tensor) {
    a.rank = 1, a.cols = {Dim::extra0};
  } else {
    a.rows = {Dim::extra0}, a.cols = rows;
  }
  return a;
}
/// a1_scale / a2_scale [1] fp32, optional, given together: their presence
/// (Problem::has_bias) is the key's a_scale=static.
constexpr ArgSlot a_scale_slot(std::string_view name, int8_t with) {
  ArgSlot a = moe_gemm_fp8_common::a_scale_slot();
  a.name = name;
  a.given_with = with;
  return a;
}
template <MoeFp8Scales L>
constexpr auto slots() {
  const ArgSlot* f = fused_moe_spec::kSlots;
  return std::array<ArgSlot, 10>{f[0],
                                 f[1],
                                 f[2],
                                 f[3],
                                 f[4],
                                 f[5],
                                 w_scale_slot("w1_scale", L, {Dim::n, 2}),
                                 w_scale_slot("w2_scale", L, {Dim::k}),
                                 a_scale_slot("a1_scale", -1),
                                 a_scale_slot("a2_scale", kMoeArgA1Scale)};
}

inline constexpr auto kFields = moe_gemm_fp8_common::a_scale_fields(fused_moe_spec::kFields);
inline constexpr int8_t kAScaleSlots[] = {kMoeArgA1Scale, kMoeArgA2Scale};
inline constexpr auto kOrder = moe_gemm_fp8_common::order_then(fused_moe_spec::kOrder, kAScaleSlots);

/// The float64 reference: hidden quantised, the up GEMM scaled per token and
/// channel, the activated intermediate of every local pair quantised (a
/// per-tensor scale over all of them), the down GEMM, the top-k sum; the
/// intermediates rounded to out's dtype as SGLang's caches (above).
template <MoeFp8Scales L>
void reference(const Problem& p, const RefArgs& r) {
  const int64_t M = p.m, H = p.k, I = p.n, E = p.extra[0], top_k = p.extra[1], P = M * top_k;
  const bool channel = L == MoeFp8Scales::channel;
  const int act = static_cast<int>(r.scalar[1]);
  std::vector<double> x(static_cast<size_t>(M * H)), sa1(static_cast<size_t>(M)), inter(static_cast<size_t>(P * I)),
      sa2(static_cast<size_t>(P)), h(static_cast<size_t>(2 * I)), y(static_cast<size_t>(H));
  std::vector<char> local(static_cast<size_t>(P), 0);
  for (int64_t t = 0; t < M; ++t)
    for (int64_t c = 0; c < H; ++c) x[t * H + c] = r.data[kMoeArgHidden][t * r.ld[kMoeArgHidden] + c];
  moe_gemm_fp8_common::quantise_rows(x.data(), M, H, r.data[kMoeArgA1Scale], channel, nullptr, sa1.data());
  auto sw = [&](int slot, int64_t e, int64_t n) {
    return channel ? r.data[slot][e * r.ld[slot] + n] : r.data[slot][e];
  };
  auto expert = [&](int64_t q) {
    const double id = r.data[kMoeArgTopkIds][(q / top_k) * r.ld[kMoeArgTopkIds] + q % top_k];
    return id >= 0.0 && id < static_cast<double>(E) ? static_cast<int64_t>(id) : int64_t{-1};  // -1: not local
  };
  const double* w1 = r.data[kMoeArgW1];
  const double* w2 = r.data[kMoeArgW2];
  auto stored = [&](double v) {  // an intermediate as SGLang's caches hold it: out's dtype
    return p.out_dtype == DType::bf16 ? double(round_to_bf16(static_cast<float>(v))) : v;
  };
  for (int64_t q = 0; q < P; ++q) {
    const int64_t e = expert(q), t = q / top_k;
    if (e < 0) continue;
    local[static_cast<size_t>(q)] = 1;
    for (int64_t n = 0; n < 2 * I; ++n) {
      double acc = 0.0;
      for (int64_t c = 0; c < H; ++c) acc += w1[(e * 2 * I + n) * r.ld[kMoeArgW1] + c] * x[t * H + c];
      h[n] = stored(acc * sa1[t] * sw(kMoeArgW1Scale, e, n));
    }
    for (int64_t i = 0; i < I; ++i) inter[q * I + i] = stored(fused_moe_spec::activate(h[i], act) * h[I + i]);
  }
  moe_gemm_fp8_common::quantise_rows(inter.data(), P, I, r.data[kMoeArgA2Scale], channel, local.data(), sa2.data());
  for (int64_t t = 0; t < M; ++t) {
    std::fill(y.begin(), y.end(), 0.0);
    for (int64_t q = t * top_k; q < (t + 1) * top_k; ++q) {
      const int64_t e = expert(q);
      if (e < 0) continue;
      const double w = r.data[kMoeArgTopkWeights][t * r.ld[kMoeArgTopkWeights] + q % top_k];
      for (int64_t c = 0; c < H; ++c) {
        double acc = 0.0;
        for (int64_t i = 0; i < I; ++i) acc += w2[(e * H + c) * r.ld[kMoeArgW2] + i] * inter[q * I + i];
        y[c] += w * acc * sa2[q] * sw(kMoeArgW2Scale, e, c);
      }
    }
    for (int64_t c = 0; c < H; ++c) r.data[kMoeArgOut][t * r.ld[kMoeArgOut] + c] = r.scalar[0] * y[c];
  }
}

/// SGLang's fused-MoE file key of a problem (EngineRows::fields), in the
/// table's canonical order (byte order of the names).
template <MoeFp8Scales L>
size_t sglang_fields(const Problem& p, char* buf, size_t cap) noexcept {
  const int n = std::snprintf(buf, cap, "E=%lld,N=%lld,dtype=fp8_w8a8%s", static_cast<long long>(p.extra[0]),
                              static_cast<long long>(p.n), L == MoeFp8Scales::channel ? ",per_channel_quant=True" : "");
  return n > 0 && static_cast<size_t>(n) < cap ? static_cast<size_t>(n) : 0;
}

inline constexpr std::string_view kSummaries[] = {
    "fused_moe on fp8 weights with one scale per expert (w1_scale, w2_scale [E]) and per-tensor activation scales, "
    "static (a1_scale, a2_scale [1]) or dynamic: SGLang's fp8_w8a8 fused experts without block_shape.",
    "fused_moe on fp8 weights with one scale per expert and output channel (w1_scale [E, 2I], w2_scale [E, H]) and "
    "activation scales per token (dynamic) or per tensor (a1_scale, a2_scale [1]): SGLang's fp8_w8a8 fused experts "
    "with per_channel_quant."};

/// Layout L's slots (static storage: the spec's span points into them).
template <MoeFp8Scales L>
inline constexpr auto kSlotsOf = slots<L>();

/// The op of layout L: fused_moe's spec with these slots, fields, order,
/// reference and engine key.
template <MoeFp8Scales L>
constexpr OpSpec spec_of() {
  const bool tensor = L == MoeFp8Scales::tensor;
  OpSpec s = moe_gemm_fp8_common::derived_spec(fused_moe_spec::kSpec,
                                               tensor ? OpKind::fused_moe_fp8_tensor : OpKind::fused_moe_fp8_channel,
                                               tensor ? "fused_moe_fp8_tensor" : "fused_moe_fp8_channel",
                                               kSummaries[tensor ? 0 : 1], kSlotsOf<L>, kFields, kOrder, &reference<L>);
  s.engine_rows.fields = &sglang_fields<L>;
  return s;
}

}  // namespace fused_moe_fp8_common

namespace fused_moe_fp8_tensor_spec {
inline constexpr OpSpec kSpec = fused_moe_fp8_common::spec_of<MoeFp8Scales::tensor>();
}
namespace fused_moe_fp8_channel_spec {
inline constexpr OpSpec kSpec = fused_moe_fp8_common::spec_of<MoeFp8Scales::channel>();
}

}  // namespace dispatch::core
