// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — moe_gemm_fp8_tensor and moe_gemm_fp8_channel
// (src/ops/moe_gemm_fp8.hpp): fp8 weights with one scale per expert or per
// expert and output channel, a quantised first (static a_scale, or dynamic
// per tensor / per token), each pair's fp32 sum scaled once.
//
//   moe_gemm_fp8_<layout>_fp8_e4m3fn__blocked   block by block of the sorted
//       pairs: each weight row of the block's expert decoded once, dotted
//       with PAIRS of the block's rows at a time (PAIRS {1, 8, 64})
//   moe_gemm_fp8_<layout>_fp8_e4m3fn__ref       pair by pair (the validation baseline)
//
// a and out bf16 or fp32. Both sum in fp32 in the same order: they agree
// bit for bit.
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu/cpu_common.hpp"
#include "cpu/moe_common.hpp"
#include "cpu/moe_gemm_fp8_list.hpp"
#include "ops/moe_gemm_fp8.hpp"

namespace dispatch::cpu {
namespace {

using namespace core::variant_names;
using namespace simd;
using namespace moe_cpu;
using core::MoeFp8Scales;

/// q(a) dequantised (x [M, K]) and the scale of each row (sa [M]): static
/// (a_scale), or dynamic per tensor or per token, quant_fp8's rule.
template <MoeFp8Scales L, class X>
void quantise_a(const LaunchArgs& a, const Problem& p, std::vector<float>* x, std::vector<float>* sa) {
  const X* ap = a.ptr<const X>(core::kMoeGemmArgA);
  const int64_t M = p.m, K = p.k, lda = a.ld[core::kMoeGemmArgA];
  const float fmax = core::kE4m3fn.max_finite();
  x->resize(static_cast<size_t>(M * K));
  sa->resize(static_cast<size_t>(M));
  auto amax_rows = [&](int64_t t0, int64_t t1) {
    float amax = 0.f;
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t k = 0; k < K; ++k) amax = std::fmax(amax, std::fabs(load(ap + t * lda, k)));
    return std::fmax(amax, core::kQuantMinAmax) / fmax;
  };
  const auto* given = a.ptr<const float>(core::kMoeGemmArgAScale);
  const float whole = given != nullptr ? given[0] : L == MoeFp8Scales::tensor ? amax_rows(0, M) : 1.f;
  for (int64_t t = 0; t < M; ++t) {
    const float s = given == nullptr && L == MoeFp8Scales::channel ? amax_rows(t, t + 1) : whole;
    (*sa)[static_cast<size_t>(t)] = s;
    for (int64_t k = 0; k < K; ++k) {
      const float v = std::fmin(std::fmax(load(ap + t * lda, k) / s, -fmax), fmax);
      (*x)[static_cast<size_t>(t * K + k)] = kLut[core::float_to_fp8(v, core::kE4m3fn, true)];
    }
  }
}

/// The op; chunk = 0: pair by pair (the reference), else each decoded
/// weight row dotted with `chunk` of a block's pairs at a time.
template <MoeFp8Scales L, class X>
Status run(const LaunchArgs& a, const Problem& p, int64_t chunk) {
  const GemmCall c = call_of(a, p);
  X* out = a.ptr<X>(core::kMoeGemmArgOut);
  const auto* w = a.ptr<const uint8_t>(core::kMoeGemmArgW);
  const auto* ws = a.ptr<const float>(core::kMoeGemmArgWScale);
  const int64_t ldo = a.ld[core::kMoeGemmArgOut], ldw = a.ld[core::kMoeGemmArgW], ldws = a.ld[core::kMoeGemmArgWScale];
  const int64_t hold = chunk < 1 ? 1 : chunk;
  try {
    std::vector<float> x, sa, row(static_cast<size_t>(c.K));
    quantise_a<L, X>(a, p, &x, &sa);
    std::vector<int64_t> rows;  // the chunk's pairs
    for (int64_t b = 0; b < c.blocks; ++b) {
      const int32_t e = c.experts[b];
      const bool local = e >= 0 && e < c.E;
      for (int64_t i0 = b * c.bs; i0 < (b + 1) * c.bs && i0 < c.cap; i0 += hold) {
        rows.clear();
        for (int64_t i = i0; i < i0 + hold && i < (b + 1) * c.bs && i < c.cap; ++i)
          if (const int32_t s = c.sorted[i]; s >= 0 && s < c.pairs) rows.push_back(s);
        for (int64_t r = 0; r < c.N && !rows.empty(); ++r) {
          float sw = 0.f;
          if (local) {
            const uint8_t* wr = w + (e * c.N + r) * ldw;
            for (int64_t k = 0; k < c.K; ++k) row[static_cast<size_t>(k)] = kLut[wr[k]];
            sw = L == MoeFp8Scales::tensor ? ws[e] : ws[e * ldws + r];
          }
          for (const int64_t s : rows) {
            float acc = 0.f;
            const float* xr = &x[static_cast<size_t>((s / c.top_k) * c.K)];
            for (int64_t k = 0; k < c.K && local; ++k) acc += row[static_cast<size_t>(k)] * xr[k];
            const float v = local ? acc * sa[static_cast<size_t>(s / c.top_k)] * sw * c.weight(s) : 0.f;
            store_as(&out[s * ldo + r], v);
          }
        }
      }
    }
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "moe_gemm_fp8: the CPU variant's buffers");
  }
  return Status::Ok();
}

Status check_problem(const VariantDef& v, const Problem& p) noexcept {
  if (Status s = check_moe_dtypes(v, p, "a"); !s.ok()) return s;
  if (p.n < 1 || p.k < 1 || p.extra[0] < 1 || p.extra[1] < 1 || p.extra[2] < 1)
    return decline(v, StatusCode::invalid_argument, "E, N, K, top_k and block_size must be >= 1");
  if (const int64_t cap = core::moe_gemm_spec::sorted_extent(core::dims_of(p).data()); cap > INT32_MAX || cap < 0)
    return decline(v, StatusCode::unsupported_problem, "M*top_k + min(E, M*top_k)*(block_size - 1) exceeds int32");
  return Status::Ok();
}

template <MoeFp8Scales L>
Status launch_as(const LaunchArgs& a, const Problem& p, int64_t chunk) {
  if (p.m < 1) return Status::Ok();
  for (int i : {core::kMoeGemmArgA, core::kMoeGemmArgW, core::kMoeGemmArgOut, core::kMoeGemmArgSorted,
                core::kMoeGemmArgExpertIds, core::kMoeGemmArgTotal, core::kMoeGemmArgWScale})
    if (a.data[i] == nullptr) return make_status(StatusCode::invalid_argument, "moe_gemm_fp8: a tensor is null");
  if (a.scalar[2] != 0.f && a.data[core::kMoeGemmArgTopkWeights] == nullptr)
    return make_status(StatusCode::invalid_argument, "moe_gemm_fp8: mul_routed_weight without topk_weights");
  return p.out_dtype == DType::fp32 ? run<L, float>(a, p, chunk) : run<L, Bf16>(a, p, chunk);
}

template <MoeFp8Scales L>
Status ref_launch(const LaunchArgs& a, const Problem& p, const int64_t*) {
  return launch_as<L>(a, p, 0);
}
template <MoeFp8Scales L>
Status blocked_launch(const LaunchArgs& a, const Problem& p, const int64_t* prm) {
  if (prm[kMoeGemmFp8Pairs] < 1) return make_status(StatusCode::invalid_argument, "moe_gemm_fp8: PAIRS must be >= 1");
  return launch_as<L>(a, p, prm[kMoeGemmFp8Pairs]);
}

constexpr int64_t kPairs[] = {1, 8, 64};
constexpr ParamDef kBlockedParams[] = {{"PAIRS", ParamKind::integer, kPairs, {}, 8}};

}  // namespace

KD_CPU_MOE_VARIANTS(kMoeGemmFp8TensorBlocked, kMoeGemmFp8TensorRef, moe_gemm_fp8_tensor, "blocked", "fp8_e4m3fn",
                    DType::fp8_e4m3fn, kBlockedParams, blocked_launch<MoeFp8Scales::tensor>,
                    ref_launch<MoeFp8Scales::tensor>)
KD_CPU_MOE_VARIANTS(kMoeGemmFp8ChannelBlocked, kMoeGemmFp8ChannelRef, moe_gemm_fp8_channel, "blocked", "fp8_e4m3fn",
                    DType::fp8_e4m3fn, kBlockedParams, blocked_launch<MoeFp8Scales::channel>,
                    ref_launch<MoeFp8Scales::channel>)

// As moe_gemm's: a decoded weight row serves the block's pairs held.
core::Plan moe_gemm_fp8_default(const core::Problem& p, const DeviceInfo&) noexcept {
  core::Plan plan;
  if (p.in_dtype != DType::fp8_e4m3fn) return plan;
  plan.variant = p.op == OpKind::moe_gemm_fp8_tensor ? &kMoeGemmFp8TensorBlocked : &kMoeGemmFp8ChannelBlocked;
  const int64_t per_block = p.extra[2];
  plan.params[kMoeGemmFp8Pairs] = per_block >= 64 ? 64 : per_block >= 8 ? 8 : 1;
  if (!check_problem(*plan.variant, p).ok()) return {};
  return plan;
}

}  // namespace dispatch::cpu
