// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the fp8 GEMMs (w8a8, e4m3fn inputs), one variant
// pair per scale layout (src/ops/gemm_fp8.hpp):
//
//   gemm_fp8_<layout>_e4m3fn__tiled   B's rows decoded to fp32 a tile at a
//                                     time, BLOCK_N output columns per pass
//                                     over a row of A. Params:
//     BLOCK_N {1, 4, 8}   columns of D computed together (rows of B decoded
//                         into a scratch tile on the stack)
//   gemm_fp8_<layout>_e4m3fn__ref     plain loops (the validation baseline)
//
// Both decode fp8 through a 256-entry table (exact), multiply in fp32
// (fp8 x fp8 products are exact in fp32), sum each 128-wide K group in
// fp32, scale the group's sum (sa * sb, computed in fp32) and accumulate
// the groups in fp32, as SGLang's block kernel orders it; D and bias in
// bf16 or fp32, the result rounded once. The GPU is where these ops are
// meant to run; the CPU variants make every surface (tests, tuning, the
// bindings) work everywhere and give the GPU families a second reference.
#include <array>
#include <cstdint>

#include "core/numeric.hpp"
#include "cpu/cpu_common.hpp"
#include "cpu/cpu_simd.hpp"
#include "cpu/gemm_fp8_list.hpp"
#include "ops/gemm_fp8.hpp"

namespace dispatch::cpu {
namespace {

using core::Fp8Scales;
using namespace core::variant_names;
using namespace simd;

/// fp8 e4m3fn bits -> float, every code (NaN codes decode to NaN).
constexpr std::array<float, 256> make_lut() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) t[static_cast<size_t>(b)] = core::fp8_to_float(static_cast<uint8_t>(b), core::kE4m3fn);
  return t;
}
constexpr std::array<float, 256> kE4m3fnLut = make_lut();

constexpr OpKind op_of(Fp8Scales L) {
  return L == Fp8Scales::tensor    ? OpKind::gemm_fp8_tensor
         : L == Fp8Scales::rowwise ? OpKind::gemm_fp8_rowwise
                                   : OpKind::gemm_fp8_block;
}

/// The scale of K group `kb` of row i of A and row j of B.
template <Fp8Scales L>
KDISPATCH_INLINE float group_scale(const LaunchArgs& a, int64_t i, int64_t j, int64_t kb) {
  const float* sa = a.ptr<const float>(core::kFp8ArgSa);
  const float* sb = a.ptr<const float>(core::kFp8ArgSb);
  if constexpr (L == Fp8Scales::tensor) return sa[0] * sb[0];
  if constexpr (L == Fp8Scales::rowwise) return sa[i] * sb[j];
  return sa[core::block_sa_index(kb, i, a.ld[core::kFp8ArgSa])] *
         sb[(j / core::kFp8Block) * a.ld[core::kFp8ArgSb] + kb];
}

template <class Out>
KDISPATCH_INLINE void store_d(const LaunchArgs& a, int64_t i, int64_t j, float acc) {
  Out* d = a.ptr<Out>(core::kFp8ArgD);
  const Out* bias = a.ptr<const Out>(core::kFp8ArgBias);
  if (bias != nullptr) acc += to_float(bias[j]);
  store_as(&d[i * a.ld[core::kFp8ArgD] + j], acc);
}

template <Fp8Scales L, class Out>
void ref_rows(const LaunchArgs& a, const Problem& p) {
  const uint8_t* A = a.ptr<const uint8_t>(core::kFp8ArgA);
  const uint8_t* B = a.ptr<const uint8_t>(core::kFp8ArgB);
  for (int64_t i = 0; i < p.m; ++i)
    for (int64_t j = 0; j < p.n; ++j) {
      float acc = 0.f;
      for (int64_t k0 = 0; k0 < p.k; k0 += core::kFp8Block) {
        const int64_t k1 = k0 + core::kFp8Block < p.k ? k0 + core::kFp8Block : p.k;
        float part = 0.f;
        for (int64_t l = k0; l < k1; ++l)
          part += kE4m3fnLut[A[i * a.ld[core::kFp8ArgA] + l]] * kE4m3fnLut[B[j * a.ld[core::kFp8ArgB] + l]];
        acc += part * group_scale<L>(a, i, j, k0 / core::kFp8Block);
      }
      store_d<Out>(a, i, j, acc);
    }
}

/// BN columns at a time: BN rows of B decoded once per K group into a
/// stack tile, then every row of A against them.
template <Fp8Scales L, class Out, int BN>
void tiled_rows(const LaunchArgs& a, const Problem& p) {
  const uint8_t* A = a.ptr<const uint8_t>(core::kFp8ArgA);
  const uint8_t* B = a.ptr<const uint8_t>(core::kFp8ArgB);
  constexpr int G = core::kFp8Block;
  float bt[BN][G];
  float arow[G];
  for (int64_t j0 = 0; j0 < p.n; j0 += BN) {
    const int nb = p.n - j0 < BN ? static_cast<int>(p.n - j0) : BN;
    for (int64_t i = 0; i < p.m; ++i) {
      float acc[BN] = {};
      for (int64_t k0 = 0; k0 < p.k; k0 += G) {
        const int kn = p.k - k0 < G ? static_cast<int>(p.k - k0) : G;
        // (Re)decoding B's tile per row of A keeps the tile in L1; the
        // decode is a table load per element.
        for (int c = 0; c < nb; ++c)
          for (int l = 0; l < kn; ++l) bt[c][l] = kE4m3fnLut[B[(j0 + c) * a.ld[core::kFp8ArgB] + k0 + l]];
        for (int l = 0; l < kn; ++l) arow[l] = kE4m3fnLut[A[i * a.ld[core::kFp8ArgA] + k0 + l]];
        for (int c = 0; c < nb; ++c) {
          float part = 0.f;
          for (int l = 0; l < kn; ++l) part += arow[l] * bt[c][l];
          acc[c] += part * group_scale<L>(a, i, j0 + c, k0 / G);
        }
      }
      for (int c = 0; c < nb; ++c) store_d<Out>(a, i, j0 + c, acc[c]);
    }
  }
}

constexpr int64_t kBlockNs[] = {1, 4, 8};
constexpr ParamDef kTiledParams[] = {
    {"BLOCK_N", ParamKind::integer, kBlockNs, {}, 4},
};

Status check_problem(const VariantDef& v, Fp8Scales L, const Problem& p) noexcept {
  if (p.op != op_of(L)) return decline(v, StatusCode::unsupported_problem, "another op's problem");
  if (p.device.type != v.backend)
    return decline(v, StatusCode::unsupported_device, "CPU variant, problem is on another device");
  if (p.in_dtype != DType::fp8_e4m3fn)
    return decline(v, StatusCode::unsupported_problem, "a and b must be fp8_e4m3fn (the CPU decodes e4m3fn only)");
  if (p.out_dtype != DType::fp32 && p.out_dtype != DType::bf16)
    return decline(v, StatusCode::unsupported_problem, "d must be fp32 or bf16 on the CPU");
  if (p.n < 1 || p.k < 1) return decline(v, StatusCode::invalid_argument, "N and K must be >= 1");
  return Status::Ok();
}

Status check_args(const LaunchArgs& a) noexcept {
  for (int i : {core::kFp8ArgA, core::kFp8ArgB, core::kFp8ArgD, core::kFp8ArgSa, core::kFp8ArgSb})
    if (a.data[i] == nullptr)
      return make_status(StatusCode::invalid_argument, "gemm_fp8: a, b, d and the scales must not be null");
  return Status::Ok();
}

template <Fp8Scales L>
Status ref_launch(const LaunchArgs& a, const Problem& p, const int64_t*) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(a); !s.ok()) return s;
  if (p.out_dtype == DType::fp32)
    ref_rows<L, float>(a, p);
  else
    ref_rows<L, Bf16>(a, p);
  return Status::Ok();
}

template <Fp8Scales L>
Status tiled_launch(const LaunchArgs& a, const Problem& p, const int64_t* prm) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(a); !s.ok()) return s;
  const bool f32 = p.out_dtype == DType::fp32;
  switch (prm[kFp8BlockN]) {
    case 1: f32 ? tiled_rows<L, float, 1>(a, p) : tiled_rows<L, Bf16, 1>(a, p); break;
    case 4: f32 ? tiled_rows<L, float, 4>(a, p) : tiled_rows<L, Bf16, 4>(a, p); break;
    case 8: f32 ? tiled_rows<L, float, 8>(a, p) : tiled_rows<L, Bf16, 8>(a, p); break;
    default: return make_status(StatusCode::invalid_argument, "gemm_fp8: BLOCK_N outside {1, 4, 8}");
  }
  return Status::Ok();
}

template <const VariantDef& V, Fp8Scales L>
Status tiled_supports(const Problem& p, const int64_t* prm, const DeviceInfo&) {
  if (Status s = check_problem(V, L, p); !s.ok()) return s;
  if (!params_in_space(V, prm))
    return decline(V, StatusCode::invalid_argument, "a param value is outside its config space");
  return Status::Ok();
}

template <const VariantDef& V, Fp8Scales L>
Status ref_supports(const Problem& p, const int64_t*, const DeviceInfo&) {
  return check_problem(V, L, p);
}

}  // namespace

// ------------------------------------------------------------------ the lists

#define KD_FP8_PAIR(Tiled, Ref, layout, L)                                                                          \
  constinit const core::VariantDef Tiled{                                                                           \
      "gemm_fp8_" layout "_e4m3fn__tiled", op_of(L),        DeviceType::cpu, DType::fp8_e4m3fn, kTiledParams, 0, 1, \
      &tiled_supports<Tiled, L>,           &tiled_launch<L>};                                                       \
  constinit const core::VariantDef Ref{                                                                             \
      "gemm_fp8_" layout "_e4m3fn__ref", op_of(L), DeviceType::cpu,       DType::fp8_e4m3fn, {},                    \
      core::kVariantReference,           1,        &ref_supports<Ref, L>, &ref_launch<L>};
KD_FP8_PAIR(kFp8TensorTiled, kFp8TensorRef, "tensor", Fp8Scales::tensor)
KD_FP8_PAIR(kFp8RowwiseTiled, kFp8RowwiseRef, "rowwise", Fp8Scales::rowwise)
KD_FP8_PAIR(kFp8BlockTiled, kFp8BlockRef, "block", Fp8Scales::block)
#undef KD_FP8_PAIR

// The model: the tiled variant decodes B once per BLOCK_N columns per row
// of A; wider tiles pay off once N has them.
core::Plan gemm_fp8_default(const core::Problem& p, const DeviceInfo&) noexcept {
  core::Plan plan;
  if (p.in_dtype != DType::fp8_e4m3fn || (p.out_dtype != DType::fp32 && p.out_dtype != DType::bf16)) return plan;
  switch (p.op) {
    case OpKind::gemm_fp8_tensor: plan.variant = &kFp8TensorTiled; break;
    case OpKind::gemm_fp8_rowwise: plan.variant = &kFp8RowwiseTiled; break;
    case OpKind::gemm_fp8_block: plan.variant = &kFp8BlockTiled; break;
    default: return plan;
  }
  plan.params[kFp8BlockN] = p.n >= 8 ? 8 : p.n >= 4 ? 4 : 1;
  return plan;
}

}  // namespace dispatch::cpu
