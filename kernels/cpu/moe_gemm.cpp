// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — moe_gemm (src/ops/moe_gemm.hpp):
//
//   moe_gemm_<w>__blocked   block by block of the sorted pairs: each weight
//                           row of the block's expert decoded once, dotted
//                           with PAIRS of the block's rows at a time.
//     PAIRS {1, 8, 64}      rows of a held (quantised) at once
//   moe_gemm_<w>__ref       pair by pair (the validation baseline)
//   moe_gemm_fp8_tensor_fp8_e4m3fn__blocked/__ref, moe_gemm_fp8_channel_...:
//                           the same loop for src/ops/moe_gemm_fp8.hpp: a
//                           quantised first (static a_scale, or dynamic per
//                           tensor / per token), each pair's sum times its
//                           row's scale and the expert's (channel's) scale
//
// <w> is the weights' dtype: fp32 (a fp32), bf16 (a bf16) or fp8_e4m3fn
// (block fp8: a and out bf16 or fp32, a quantised per row and 128-wide
// group as quant_fp8_group does, each group's sum scaled by its block
// scale). Both accumulate in fp32 and round out once; a pair's row is the
// same sum in both, so they agree bit for bit.
#include <cstdint>
#include <vector>

#include "cpu/cpu_common.hpp"
#include "cpu/moe_common.hpp"
#include "cpu/moe_gemm_list.hpp"
#include "ops/moe_gemm.hpp"
#include "ops/moe_gemm_fp8.hpp"

namespace dispatch::cpu {
namespace {

using namespace core::variant_names;
using namespace simd;
using namespace moe_cpu;
using core::MoeFp8Scales;

/// The moe_gemm_fp8 ops' a: q(a) dequantised (x [M, K]) and each row's
/// scale (sa [M]): static (a_scale), or dynamic per tensor or per token.
template <MoeFp8Scales L, class X>
void quantise_a(const LaunchArgs& a, const Problem& p, std::vector<float>* x, std::vector<float>* sa) {
  const X* ap = a.ptr<const X>(core::kMoeGemmArgA);
  const int64_t M = p.m, K = p.k, lda = a.ld[core::kMoeGemmArgA];
  x->resize(static_cast<size_t>(M * K));
  sa->resize(static_cast<size_t>(M));
  for (int64_t t = 0; t < M; ++t)
    for (int64_t k = 0; k < K; ++k) (*x)[static_cast<size_t>(t * K + k)] = load(ap + t * lda, k);
  quantise_rows(x->data(), M, K, a.ptr<const float>(core::kMoeGemmArgAScale), L == MoeFp8Scales::channel, nullptr,
                sa->data());
}

/// The op; chunk = 0: pair by pair (the reference), else each decoded
/// weight row dotted with `chunk` of a block's pairs at a time.
template <class W, class X, Mode D = Mode::plain>
Status run(const LaunchArgs& a, const Problem& p, int64_t chunk) {
  const GemmCall c = call_of(a, p);
  const X* ap = a.ptr<const X>(core::kMoeGemmArgA);
  X* out = a.ptr<X>(core::kMoeGemmArgOut);
  const int64_t lda = a.ld[core::kMoeGemmArgA], ldo = a.ld[core::kMoeGemmArgOut];
  const bool fp8 = D == Mode::plain && a.data[core::kMoeGemmArgWScale] != nullptr;  // block fp8
  const auto* ws = a.ptr<const float>(core::kMoeGemmArgWScale);
  const int64_t ldws = a.ld[core::kMoeGemmArgWScale];
  const int64_t hold = chunk < 1 ? 1 : chunk;
  try {
    std::vector<float> x(static_cast<size_t>(hold * c.K)), row(static_cast<size_t>(c.K)), xa, sa;
    if constexpr (D != Mode::plain) quantise_a<scales_of(D), X>(a, p, &xa, &sa);
    std::vector<int64_t> rows;  // the chunk's pairs
    for (int64_t b = 0; b < c.blocks; ++b) {
      const int32_t e = c.experts[b];
      const bool local = e >= 0 && e < c.E;
      const Weight<W> w =
          expert<W>(a, core::kMoeGemmArgW, D == Mode::plain ? core::kMoeGemmArgWScale : -1, local ? e : 0, c.N, c.K);
      for (int64_t i0 = b * c.bs; i0 < (b + 1) * c.bs && i0 < c.cap; i0 += hold) {
        rows.clear();
        for (int64_t i = i0; i < i0 + hold && i < (b + 1) * c.bs && i < c.cap; ++i)
          if (const int32_t s = c.sorted[i]; s >= 0 && s < c.pairs) rows.push_back(s);
        const auto n = static_cast<int64_t>(rows.size());
        if (n == 0) continue;
        for (int64_t q = 0; q < n && local; ++q) {
          float* xq = &x[static_cast<size_t>(q * c.K)];
          const int64_t t = rows[static_cast<size_t>(q)] / c.top_k;
          if constexpr (D != Mode::plain)
            std::copy_n(&xa[static_cast<size_t>(t * c.K)], c.K, xq);
          else
            for (int64_t k = 0; k < c.K; ++k) xq[k] = load(ap + t * lda, k);
          if (fp8) quantise_groups(xq, c.K);
        }
        for (int64_t r = 0; r < c.N; ++r) {
          if (local) w.decode(r, c.K, row.data());
          // moe_gemm_fp8: the expert's (channel's) scale, times each row's below
          const float sw = D == Mode::plain || !local ? 1.f : D == Mode::tensor ? ws[e] : ws[e * ldws + r];
          for (int64_t q = 0; q < n; ++q) {
            const int64_t s = rows[static_cast<size_t>(q)];
            float v = local ? w.dot_decoded(r, row.data(), &x[static_cast<size_t>(q * c.K)], c.K) * c.weight(s) : 0.f;
            if constexpr (D != Mode::plain) v *= sa[static_cast<size_t>(s / c.top_k)] * sw;
            store_as(&out[s * ldo + r], v);
          }
        }
      }
    }
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "moe_gemm: the CPU variant's buffers");
  }
  return Status::Ok();
}

Status check_problem(const VariantDef& v, const Problem& p) noexcept {
  if (Status s = check_moe_dtypes(v, p, "a"); !s.ok()) return s;
  if (p.n < 1 || p.k < 1 || p.extra[0] < 1 || p.extra[1] < 1 || p.extra[2] < 1)
    return decline(v, StatusCode::invalid_argument, "E, N, K, top_k and block_size must be >= 1");
  // int32 ids: the padded pair count must fit (a key from a file may name any size).
  if (const int64_t cap = core::moe_gemm_spec::sorted_extent(core::dims_of(p).data()); cap > INT32_MAX || cap < 0)
    return decline(v, StatusCode::unsupported_problem, "M*top_k + min(E, M*top_k)*(block_size - 1) exceeds int32");
  return Status::Ok();
}

template <class W, Mode D = Mode::plain>
Status launch_as(const LaunchArgs& a, const Problem& p, int64_t chunk) {
  if (p.m < 1) return Status::Ok();
  for (int i : {core::kMoeGemmArgA, core::kMoeGemmArgW, core::kMoeGemmArgOut, core::kMoeGemmArgSorted,
                core::kMoeGemmArgExpertIds, core::kMoeGemmArgTotal})
    if (a.data[i] == nullptr) return make_status(StatusCode::invalid_argument, "moe_gemm: a tensor is null");
  if (D != Mode::plain && a.data[core::kMoeGemmArgWScale] == nullptr)
    return make_status(StatusCode::invalid_argument, "moe_gemm_fp8: w_scale is null");
  if (a.scalar[2] != 0.f && a.data[core::kMoeGemmArgTopkWeights] == nullptr)
    return make_status(StatusCode::invalid_argument, "moe_gemm: mul_routed_weight without topk_weights");
  return p.out_dtype == DType::fp32 ? run<W, float, D>(a, p, chunk) : run<W, Bf16, D>(a, p, chunk);
}

constexpr int64_t kPairs[] = {1, 8, 64};
constexpr ParamDef kBlockedParams[] = {{"PAIRS", ParamKind::integer, kPairs, {}, 8}};

}  // namespace

#define KD_MOE_GEMM_PAIR(Blocked, Ref, w, DT, W) \
  KD_CPU_MOE_PARAM_VARIANTS(Blocked, Ref, moe_gemm, "blocked", w, DT, kBlockedParams, kMoeGemmPairs, W, Mode::plain)
KD_MOE_GEMM_PAIR(kMoeGemmFp32Blocked, kMoeGemmFp32Ref, "fp32", DType::fp32, float)
KD_MOE_GEMM_PAIR(kMoeGemmBf16Blocked, kMoeGemmBf16Ref, "bf16", DType::bf16, Bf16)
KD_MOE_GEMM_PAIR(kMoeGemmFp8Blocked, kMoeGemmFp8Ref, "fp8_e4m3fn", DType::fp8_e4m3fn, uint8_t)
#undef KD_MOE_GEMM_PAIR
KD_CPU_MOE_FP8_VARIANTS(kMoeGemmFp8TensorBlocked, kMoeGemmFp8TensorRef, moe_gemm_fp8_tensor, "blocked", Mode::tensor,
                        kBlockedParams, kMoeGemmPairs)
KD_CPU_MOE_FP8_VARIANTS(kMoeGemmFp8ChannelBlocked, kMoeGemmFp8ChannelRef, moe_gemm_fp8_channel, "blocked",
                        Mode::channel, kBlockedParams, kMoeGemmPairs)

// A decoded weight row serves the pairs held: the block's pairs (block_size,
// at most) bound how many are worth holding.
core::Plan moe_gemm_default(const core::Problem& p, const DeviceInfo&) noexcept {
  core::Plan plan;
  plan.variant = moe_variant(p, {OpKind::moe_gemm_fp8_tensor, OpKind::moe_gemm_fp8_channel},
                             {&kMoeGemmFp8TensorBlocked, &kMoeGemmFp8ChannelBlocked},
                             {&kMoeGemmFp32Blocked, &kMoeGemmBf16Blocked, &kMoeGemmFp8Blocked});
  if (plan.variant == nullptr) return plan;
  const int64_t per_block = p.extra[2];
  plan.params[kMoeGemmPairs] = per_block >= 64 ? 64 : per_block >= 8 ? 8 : 1;
  if (!check_problem(*plan.variant, p).ok()) return {};
  return plan;
}

}  // namespace dispatch::cpu
