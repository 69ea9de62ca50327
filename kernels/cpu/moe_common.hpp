// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — what the MoE GEMM variants share (fused_moe.cpp,
// moe_gemm.cpp, moe_gemm_fp8.cpp): element loads of fp32, bf16 and e4m3fn
// weights, the activations' 1x128 group quantisation, a block-scaled row
// dot and moe_gemm's view of a call.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/numeric.hpp"
#include "cpu/cpu_common.hpp"
#include "cpu/cpu_simd.hpp"
#include "ops/fused_moe.hpp"
#include "ops/moe_gemm.hpp"
#include "ops/moe_gemm_fp8.hpp"
#include "ops/quant_fp8.hpp"

namespace dispatch::cpu::moe_cpu {

using simd::Bf16;
using simd::to_float;
inline constexpr int G = core::kMoeBlock;

constexpr std::array<float, 256> make_lut() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) t[static_cast<size_t>(b)] = core::fp8_to_float(static_cast<uint8_t>(b), core::kE4m3fn);
  return t;
}
inline constexpr std::array<float, 256> kLut = make_lut();

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const Bf16* p, int64_t i) { return to_float(p[i]); }
inline float load(const uint8_t* p, int64_t i) { return kLut[p[i]]; }

/// `x` (n values) quantised in 128-wide groups as quant_fp8_group does,
/// dequantised in place.
inline void quantise_groups(float* x, int64_t n) {
  for (int64_t g0 = 0; g0 < n; g0 += G) {
    const int64_t g1 = g0 + G < n ? g0 + G : n;
    float amax = 0.f;
    for (int64_t i = g0; i < g1; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float scale = std::fmax(amax, core::kQuantMinAmax) / 448.f;
    for (int64_t i = g0; i < g1; ++i) x[i] = kLut[core::float_to_fp8(x[i] / scale, core::kE4m3fn, true)] * scale;
  }
}

/// Rows of x ([rows, K], dense) quantised in place as the fp8_w8a8 ops do
/// (core::moe_gemm_fp8_common::quantise_rows, the same fp32 arithmetic and
/// the engines' clamp: a NaN gives +448): static (`given`),
/// dynamic per tensor over the rows `use` marks (all when null), or per
/// token; each value becomes its e4m3fn code's value, sa[row] its scale.
inline void quantise_rows(float* x, int64_t rows, int64_t K, const float* given, bool per_token, const char* use,
                          float* sa) {
  const float fmax = core::kE4m3fn.max_finite();
  auto amax_of = [&](int64_t r0, int64_t r1) {
    float amax = 0.f;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < K && (use == nullptr || use[r] != 0); ++c)
        amax = std::fmax(amax, std::fabs(x[r * K + c]));
    return std::fmax(amax, core::kQuantMinAmax) / fmax;
  };
  const float whole = given != nullptr ? given[0] : per_token ? 1.f : amax_of(0, rows);
  for (int64_t r = 0; r < rows; ++r) {
    const float sc = given == nullptr && per_token ? amax_of(r, r + 1) : whole;
    sa[r] = sc;
    for (int64_t c = 0; c < K; ++c)
      x[r * K + c] =
          kLut[core::float_to_fp8(std::fmax(std::fmin(x[r * K + c] / sc, fmax), -fmax), core::kE4m3fn, true)];
  }
}

/// One expert's weight [rows, cols] (row stride ld) and, for fp8, its block
/// scales [ceil(rows/128), ceil(cols/128)] (row stride sld).
template <class W>
struct Weight {
  const W* w = nullptr;
  int64_t ld = 0;
  const float* s = nullptr;
  int64_t sld = 0;
  /// row r of the weight dotted with `x` (cols values), each 128-wide group
  /// scaled by its block scale (fp8) — in fp32.
  float dot(int64_t r, const float* x, int64_t cols, float* row) const {
    decode(r, cols, row);
    return dot_decoded(r, row, x, cols);
  }
  /// Row r's cols values in fp32, and their dot with x once decoded.
  void decode(int64_t r, int64_t cols, float* row) const {
    for (int64_t c = 0; c < cols; ++c) row[c] = load(w, r * ld + c);
  }
  float dot_decoded(int64_t r, const float* row, const float* x, int64_t cols) const {
    float acc = 0.f;
    for (int64_t g0 = 0; g0 < cols; g0 += G) {
      const int64_t g1 = g0 + G < cols ? g0 + G : cols;
      float part = 0.f;
      for (int64_t c = g0; c < g1; ++c) part += row[c] * x[c];
      acc += s ? part * s[(r / G) * sld + g0 / G] : part;
    }
    return acc;
  }
};

template <class W>
Weight<W> expert(const core::LaunchArgs& a, int slot, int scale_slot, int64_t e, int64_t rows, int64_t cols) {
  Weight<W> w;
  w.ld = a.ld[slot];
  w.w = a.ptr<const W>(slot) + e * rows * w.ld;
  if (scale_slot >= 0 && a.data[scale_slot] != nullptr) {  // -1: no block scales
    w.sld = a.ld[scale_slot];
    w.s = a.ptr<const float>(scale_slot) + e * ((rows + G - 1) / G) * w.sld;
  }
  (void)cols;
  return w;
}

/// moe_gemm's (and moe_gemm_fp8_*'s: the same slots 0-6) view of a call.
struct GemmCall {
  int64_t M, N, K, E, top_k, bs, pairs, cap, blocks;
  const int32_t* sorted;
  const int32_t* experts;
  const float* tw;  ///< null unless mul_routed_weight
  int64_t ldw;      ///< tw's row stride
  float weight(int64_t s) const { return tw != nullptr ? tw[(s / top_k) * ldw + s % top_k] : 1.f; }
};
inline GemmCall call_of(const core::LaunchArgs& a, const core::Problem& p) {
  GemmCall c{p.m,
             p.n,
             p.k,
             p.extra[0],
             p.extra[1],
             p.extra[2],
             p.m * p.extra[1],
             0,
             0,
             nullptr,
             nullptr,
             nullptr,
             a.ld[core::kMoeGemmArgTopkWeights]};
  const core::Dims dims = core::dims_of(p);
  c.cap = core::moe_gemm_spec::readable(dims.data(), a.ld[core::kMoeGemmArgSorted], a.ld[core::kMoeGemmArgExpertIds]);
  c.sorted = a.ptr<const int32_t>(core::kMoeGemmArgSorted);
  c.experts = a.ptr<const int32_t>(core::kMoeGemmArgExpertIds);
  c.blocks = core::moe_gemm_spec::walked_blocks(a.ptr<const int32_t>(core::kMoeGemmArgTotal)[0], c.cap, c.bs);
  if (a.scalar[2] != 0.f) c.tw = a.ptr<const float>(core::kMoeGemmArgTopkWeights);
  return c;
}

/// The decline of a problem the CPU MoE GEMM variant `v` does not
/// compute: another op, device or weight dtype, or activations (named
/// `acts` in the message) in a dtype it does not take (the weights', or
/// bf16 or fp32 under fp8 weights).
inline Status check_moe_dtypes(const core::VariantDef& v, const core::Problem& p, std::string_view acts) {
  if (p.op != v.op)
    return decline(v, StatusCode::unsupported_problem, "not a " + std::string(core::op_name(v.op)) + " problem");
  if (p.device.type != v.backend)
    return decline(v, StatusCode::unsupported_device, "CPU variant, problem is on another device");
  if (p.in_dtype != v.in_dtype)
    return decline(v, StatusCode::unsupported_problem, "computes " + std::string(dtype_name(v.in_dtype)) + " weights");
  const bool fp8 = v.in_dtype == DType::fp8_e4m3fn;
  if (fp8 ? (p.out_dtype != DType::fp32 && p.out_dtype != DType::bf16) : p.out_dtype != p.in_dtype)
    return decline(
        v, StatusCode::unsupported_problem,
        std::string(acts) + (fp8 ? " and out must be bf16 or fp32 on the CPU" : " must have the weights' dtype"));
  return Status::Ok();
}

/// Which op a MoE GEMM launch computes: the plain op (block fp8 where its
/// block scales are given), or an fp8_w8a8 op (core::MoeFp8Scales + 1).
enum class Mode : int { plain = 0, tensor = 1, channel = 2 };
constexpr core::MoeFp8Scales scales_of(Mode m) {
  return m == Mode::tensor ? core::MoeFp8Scales::tensor : core::MoeFp8Scales::channel;
}

/// The default's variant of a CPU MoE problem: the fp8_w8a8 op's own
/// (`fp8_ops`: the tensor op, then the channel op, with their variants), or
/// the plain op's of the weights' dtype (`by_dtype`: fp32, bf16, fp8);
/// null where none computes it.
inline const core::VariantDef* moe_variant(const core::Problem& p, const core::OpKind (&fp8_ops)[2],
                                           const core::VariantDef* const (&fp8_variants)[2],
                                           const core::VariantDef* const (&by_dtype)[3]) {
  for (int i = 0; i < 2; ++i)
    if (p.op == fp8_ops[i]) return p.in_dtype == DType::fp8_e4m3fn ? fp8_variants[i] : nullptr;
  switch (p.in_dtype) {
    case DType::fp32: return by_dtype[0];
    case DType::bf16: return by_dtype[1];
    case DType::fp8_e4m3fn: return by_dtype[2];
    default: return nullptr;
  }
}

/// A CPU MoE family's launches: Launch (its launch_as<W, D>) with the
/// plan's param `P` (the fast variant: pairs held per decoded weight row,
/// >= 1), or with 0 (the reference order).
template <Status (*Launch)(const core::LaunchArgs&, const core::Problem&, int64_t), int P>
Status param_launch(const core::LaunchArgs& a, const core::Problem& p, const int64_t* prm) {
  if (prm[P] < 1)
    return make_status(
        StatusCode::invalid_argument,
        std::string(core::op_name(p.op)) + ": the variant's param must be >= 1, got " + std::to_string(prm[P]));
  return Launch(a, p, prm[P]);
}
template <Status (*Launch)(const core::LaunchArgs&, const core::Problem&, int64_t)>
Status ref_order_launch(const core::LaunchArgs& a, const core::Problem& p, const int64_t*) {
  return Launch(a, p, 0);
}

/// supports() of a CPU MoE variant: Check (its op's problem checks), then
/// its params in their config space.
template <const core::VariantDef& V, Status (*Check)(const core::VariantDef&, const core::Problem&) noexcept>
Status moe_supports(const core::Problem& p, const int64_t* prm, const DeviceInfo&) {
  if (Status s = Check(V, p); !s.ok()) return s;
  if (!V.params.empty() && !params_in_space(V, prm))
    return decline(V, StatusCode::invalid_argument, "a param value is outside its config space");
  return Status::Ok();
}

}  // namespace dispatch::cpu::moe_cpu

/// The two CPU variants of fp8_w8a8 op `op` (Mode D) of a MoE family.
#define KD_CPU_MOE_FP8_VARIANTS(Fast, Ref, op, family, D, params, param) \
  KD_CPU_MOE_PARAM_VARIANTS(Fast, Ref, op, family, "fp8_e4m3fn", DType::fp8_e4m3fn, params, param, uint8_t, D)
/// The two CPU variants of op `op` for weights `w` (DType DT, element W)
/// in Mode D: the including file's launch_as<W, D> with its param `param`,
/// and in the reference order.
#define KD_CPU_MOE_PARAM_VARIANTS(Fast, Ref, op, family, w, DT, params, param, W, D)                          \
  KD_CPU_MOE_VARIANTS(Fast, Ref, op, family, w, DT, params, (moe_cpu::param_launch<&launch_as<W, D>, param>), \
                      (moe_cpu::ref_order_launch<&launch_as<W, D>>))

/// The two CPU variants of MoE op `op` for weights `w` (DType DT): `Fast`,
/// "<op>_<w>__<family>" with its params and launch, and `Ref`,
/// "<op>_<w>__ref", the validation baseline; both check the problem with
/// the including file's check_problem.
#define KD_CPU_MOE_VARIANTS(Fast, Ref, op, family, w, DT, params, fast_launch, ref_launch)                      \
  constinit const core::VariantDef Fast{                                                                        \
      #op "_" w "__" family, OpKind::op, DeviceType::cpu, DT, params, 0, 1, &moe_supports<Fast, check_problem>, \
      &fast_launch};                                                                                            \
  constinit const core::VariantDef Ref{#op "_" w "__ref",                                                       \
                                       OpKind::op,                                                              \
                                       DeviceType::cpu,                                                         \
                                       DT,                                                                      \
                                       {},                                                                      \
                                       core::kVariantReference,                                                 \
                                       1,                                                                       \
                                       &moe_supports<Ref, check_problem>,                                       \
                                       &ref_launch};
