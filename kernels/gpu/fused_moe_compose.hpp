// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — fused_moe by composition: the library's own ops
// on the call's stream, as SGLang's fused_experts launches them:
//
//   moe_align   topk_ids sorted by expert in blocks of `block`     (its get_default)
//   moe_gemm    up:   c1 [P, 2I] = hidden · w1[e]^T               (see Gemms)
//   silu_and_mul      c2 [P, I]  = silu(c1[:, :I]) * c1[:, I:]   (its get_default)
//   moe_gemm    down: c3 [P, H]  = c2 · w2[e]^T * topk_weights    (see Gemms)
//   moe_sum           out [M, H] = routed_scaling_factor * sum_j c3[t, j]   (its get_default)
//
// P = M * top_k. Two users:
// - fused_moe_<dt>__wgmma (Gemms::wgmma): fused_moe's prefill on moe_gemm's
//   wgmma variant, blocks of 128. Block fp8 (w1/w2 e4m3fn with their
//   128x128 scales): each moe_gemm call quantises its a per 1x128 group into
//   the gemm part of the workspace, as moe_gemm does alone.
// - fused_moe_fp8_tensor / _channel's __compose and __cuda_ref
//   (Gemms::scaled, Gemms::scaled_reference): SGLang's fp8_w8a8 without
//   block_shape on moe_gemm_fp8_tensor / _channel's get_default (wgmma from
//   16 pairs per expert, blocks of 128 there, else of 16; below that the
//   ring where it runs, else the split kernels) or their
//   reference variants. silu only: a gelu problem has no CUDA variant (the
//   CPU's serve it).
//   Each call quantises its own a (ops/moe_gemm_fp8.hpp): a1_scale /
//   a2_scale where given, else the tensor op's one scale over all of hidden
//   and all of c2, the channel op's per row. c2's rows of dropped pairs
//   must then hold zeros, not the workspace's stale bytes (they would join
//   the per-tensor amax): c1 is zeroed first for the dynamic tensor op.
// The intermediates are the out dtype (bf16 or fp16): c1 and c2 are
// rounded as SGLang's intermediate caches (the fp8_w8a8 ops' reference
// rounds them the same way; c3, rounded before the top-k sum, is within
// the tolerance). Each
// sub-op's plan is checked by its own supports(). A topk_ids entry outside
// [0, E) (-1 under expert parallelism) is dropped by moe_align, so c3 is
// zeroed before the down call (its row stays 0 and moe_sum adds nothing).
//
// GPU-tested (bench/results/h200.md, 2026-12-06 at 9f846cb: `gpu fused_moe`
// 207 runs and `gpu fused_moe_fp8` 160 (variant, shape, mode) runs against
// the float64 reference, H200); its speed and e2e_moe.py's prefill are not
// measured yet.
// Plain host C++: included by gpu/fused_moe_variants.inc with
// KDISPATCH_GPU_NS defined.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"
#include "gpu/moe_gemm_launch.hpp"
#include "gpu/moe_launch.hpp"
#include "ops/fused_moe.hpp"
#include "ops/moe_align.hpp"
#include "ops/moe_gemm.hpp"
#include "ops/fused_moe_fp8.hpp"
#include "ops/moe_gemm_fp8.hpp"
#include "ops/moe_sum.hpp"
#include "ops/silu_and_mul.hpp"

namespace dispatch::KDISPATCH_GPU_NS::fused_moe_compose {

/// How the composition picks its two moe_gemm plans.
enum class Gemms : uint8_t {
  wgmma,             ///< fused_moe: moe_gemm's wgmma variant (bf16, fp16, block fp8)
  scaled,            ///< fused_moe_fp8_<layout>: moe_gemm_fp8_<layout>'s get_default
  scaled_reference,  ///< fused_moe_fp8_<layout>: moe_gemm_fp8_<layout>'s reference variant
};

/// The wgmma kernel's tile of sorted pairs.
inline constexpr int64_t kWideBlock = 128;
/// The sort's block at decode (the fp8_w8a8 split kernels: SGLang's decode BLOCK_SIZE_M).
inline constexpr int64_t kDecodeBlock = 16;
/// From this many pairs per expert the fp8_w8a8 tensor op's get_default
/// runs block fp8's tensor-core kernels (moe_gemm_variants.inc wgmma_default).
inline constexpr int64_t kScaledWidePairsPerExpert = 16;

/// The sort's block size of problem p (fused_moe's: m = M, n = I, k = H,
/// extra = {E, top_k}): 128 for wgmma; the fp8_w8a8 composition's plan
/// param block_m (prm[0], SGLang's BLOCK_SIZE_M), else 128 from 16 pairs
/// an expert and 16 below.
constexpr int64_t block_of(const core::Problem& p, Gemms g, const int64_t* prm = nullptr) noexcept {
  if (g == Gemms::wgmma) return kWideBlock;
  if (g == Gemms::scaled && prm != nullptr && prm[0] > 0) return prm[0];  // the plan's block_m (kBlockMValues)
  return moe_pairs(p) >= MoeWide{kScaledWidePairsPerExpert} * p.extra[0] ? kWideBlock : kDecodeBlock;
}

/// The alignment (bytes, a power of 2 up to 16) of rows `row_bytes` long
/// in the workspace (each part 256-byte aligned), at most `cap`.
constexpr uint8_t row_align(int64_t row_bytes, uint8_t cap = 16) noexcept {
  const uint8_t a = row_bytes % 16 == 0  ? 16
                    : row_bytes % 8 == 0 ? 8
                    : row_bytes % 4 == 0 ? 4
                    : row_bytes % 2 == 0 ? 2
                                         : 1;
  return a < cap ? a : cap;
}

/// The moe_gemm problem of one of the two calls (up: a = hidden [M, H], w =
/// w1 [E, 2I, H], top_k; down: a = c2 [P, I], w = w2 [E, H, I], top_k 1,
/// the routed weight): moe_gemm, or for the fp8_w8a8 ops moe_gemm_fp8 of
/// the same layout (has_bias: a_scale given, as in the fused op).
constexpr core::Problem gemm_problem(const core::Problem& p, bool up, Gemms how,
                                     const int64_t* prm = nullptr) noexcept {
  core::Problem g = p;
  g.op = how == Gemms::wgmma                           ? core::OpKind::moe_gemm
         : p.op == core::OpKind::fused_moe_fp8_channel ? core::OpKind::moe_gemm_fp8_channel
                                                       : core::OpKind::moe_gemm_fp8_tensor;
  g.m = up ? p.m : p.m * p.extra[1];
  g.n = up ? 2 * p.n : p.k;
  g.k = up ? p.k : p.n;
  g.extra[1] = up ? p.extra[1] : 1;
  g.extra[2] = block_of(p, how, prm);
  g.choice = up ? 0 : 1;  // mul_routed_weight
  g.stride_code = 0;
  // The workspace's rows: the up call's out c1 [P, 2I]; the down call's a c2 [P, I] and out c3 [P, H] (bf16).
  g.align_bytes = up ? row_align(4 * p.n, p.align_bytes) : row_align(2 * p.n, row_align(2 * p.k, p.align_bytes));
  return g;
}

/// Whether the dynamic per-tensor scale of the down call reads c2 whole:
/// its rows of dropped pairs must be zeros (c1 zeroed before the up call).
constexpr bool zero_c1(const core::Problem& p) noexcept {
  return p.op == core::OpKind::fused_moe_fp8_tensor && !p.has_bias;
}

/// The workspace's parts (byte offsets, each 256-byte aligned) for problem p.
struct Parts {
  int64_t sorted = 0, experts = 0, total = 0, tw = 0, c1 = 0, c2 = 0, c3 = 0, gemm = 0, bytes = 0;
  int64_t block = 0, cap = 0, blocks = 0;  ///< the sort's block, sorted positions and blocks of moe_align's buffers
};
constexpr Parts parts_of(const core::Problem& p, Gemms how, const int64_t* prm = nullptr) noexcept {
  Parts w;
  const MoeWide P = moe_pairs(p), E = p.extra[0], eb = 2;  // the intermediates: bf16 or fp16
  w.block = block_of(p, how, prm);
  const MoeWide cap = P + (P < E ? P : E) * (w.block - 1);
  w.cap = moe_saturate(cap), w.blocks = moe_saturate((cap + w.block - 1) / w.block);
  MoeWide at = 0;
  auto take = [&](MoeWide bytes) {
    const MoeWide here = at;
    at += moe_round256w(bytes);
    return moe_saturate(here);
  };
  w.sorted = take(cap * 4), w.experts = take(MoeWide{w.blocks} * 4), w.total = take(4);
  w.tw = take(P * 4);  // topk_weights with dense rows, where the caller's are strided
  w.c1 = take(P * 2 * p.n * eb), w.c2 = take(P * p.n * eb), w.c3 = take(P * p.k * eb);
  // One moe_gemm call's workspace at a time (the up call's, then the down call's).
  MoeWide gemm = 0;
  if (how == Gemms::wgmma && p.in_dtype == DType::fp8_e4m3fn) {  // block fp8: a quantised per 1x128 group
    const MoeWide up = MoeWide{p.m} * p.k + moe_round256w(MoeWide{p.m} * (p.k / 128) * 4) + 256,
                  down = P * p.n + moe_round256w(P * (p.n / 128) * 4) + 256;
    gemm = up > down ? up : down;
  } else if (how != Gemms::wgmma) {
    // the fp8_w8a8 ops on block fp8's kernels (their largest need; the split kernels take 256 bytes or none)
    const MoeWide up = moe_gemm_fp8_tensor_ring_workspace_bytes(gemm_problem(p, true, how, prm)),
                  down = moe_gemm_fp8_tensor_ring_workspace_bytes(gemm_problem(p, false, how, prm));
    gemm = up > down ? up : down;
  }
  w.gemm = take(gemm);
  w.bytes = moe_saturate(at);
  return w;
}

/// moe_gemm's wgmma variant for weights `w` (null where this build has none).
inline const core::VariantDef* wgmma_gemm(DType w) noexcept {
  for (const core::VariantDef* v : moe_gemm_variants())
    if (v->in_dtype == w && std::string_view(v->name).ends_with("__wgmma")) return v;
  return nullptr;
}

/// Variant v with its params' defaults (Plan's other slots 0).
inline core::Plan with_defaults(const core::VariantDef* v) noexcept {
  core::Plan pl{v, {}};
  for (size_t i = 0; i < v->params.size(); ++i) pl.params[i] = v->params[i].default_value;
  return pl;
}

/// The plan of one moe_gemm call (sub-problem gp), invalid where none takes it.
inline core::Plan gemm_plan(const core::Problem& gp, Gemms how, const DeviceInfo& dev) noexcept {
  if (how == Gemms::scaled) return moe_gemm_scaled_default(gp, dev);
  const std::span<const core::VariantDef* const> list = how == Gemms::wgmma ? moe_gemm_variants()
                                                        : gp.op == core::OpKind::moe_gemm_fp8_channel
                                                            ? moe_gemm_fp8_channel_variants()
                                                            : moe_gemm_fp8_tensor_variants();
  for (const core::VariantDef* v : list) {
    const bool want = how == Gemms::wgmma ? v->in_dtype == gp.in_dtype && std::string_view(v->name).ends_with("__wgmma")
                                          : (v->flags & core::kVariantReference) != 0;
    if (!want) continue;
    if (const core::Plan pl = with_defaults(v); v->supports(gp, pl.params, dev).ok()) return pl;
  }
  return {};
}

/// Whether the composition takes p (before the workspace): silu, and a
/// plan for each moe_gemm call that its own supports() takes (wgmma:
/// sm_90a, K of each a multiple of 8 or, block fp8, of 128; the fp8_w8a8
/// ops: bf16 hidden and out).
inline Status check(const core::VariantDef& v, const core::Problem& p, const DeviceInfo& dev, Gemms how,
                    const int64_t* prm = nullptr) noexcept {
  if (p.choice != 0) return core::decline(v, StatusCode::unsupported_problem, "silu only (moe_gemm + silu_and_mul)");
  for (bool up : {true, false}) {
    const core::Problem gp = gemm_problem(p, up, how, prm);
    if (const core::Plan pl = gemm_plan(gp, how, dev); !pl.valid()) {
      const core::VariantDef* g = how == Gemms::wgmma ? wgmma_gemm(v.in_dtype) : nullptr;
      const std::string why = g != nullptr ? g->supports(gp, with_defaults(g).params, dev).message()
                                           : "no " + std::string(core::op_name(gp.op)) + " variant takes it";
      return core::decline(v, StatusCode::unsupported_problem,
                           std::string(up ? "the up " : "the down ") + std::string(core::op_name(gp.op)) + ": " + why);
    }
  }
  return Status();
}

/// Runs plan `pl` of sub-problem `sp` with `sla`, or says which step failed.
inline Status run(const char* step, const core::Plan& pl, const core::LaunchArgs& sla,
                  const core::Problem& sp) noexcept {
  if (!pl.valid())
    return make_status(StatusCode::unsupported_problem, std::string("fused_moe composition: no plan for ") + step);
  const Status s = pl.variant->launch(sla, sp, pl.params);
  if (s.ok()) return s;
  return Status(s.code(), std::string("fused_moe composition: ") + step + ": " + s.message());
}

/// Enqueues the five launches (and the zeroing) on la.stream (slots as
/// ops/fused_moe.hpp and, the fp8_w8a8 ops, ops/fused_moe_fp8.hpp).
inline Status launch(const core::LaunchArgs& la, const core::Problem& p, Gemms how,
                     const int64_t* prm = nullptr) noexcept {
  if (p.m < 1) return Status();
  const Parts w = parts_of(p, how, prm);
  if (la.workspace == nullptr || reinterpret_cast<uintptr_t>(la.workspace) % 256 != 0 || la.workspace_bytes < w.bytes)
    return core::needs_fallback("fused_moe composition: a 256-byte aligned workspace of " + std::to_string(w.bytes) +
                                " bytes");
  const DeviceState* st = device_state(p.device.ordinal);
  if (st == nullptr) return make_status(StatusCode::backend_error, "fused_moe composition: the device is not probed");
  const DeviceInfo& dev = st->info;
  auto* base = static_cast<uint8_t*>(la.workspace);
  void* const sorted = base + w.sorted;
  void* const experts = base + w.experts;
  void* const total = base + w.total;
  void* const c1 = base + w.c1;
  void* const c2 = base + w.c2;
  void* const c3 = base + w.c3;
  const int64_t P = p.m * p.extra[1];
  // The down call views topk_weights [M, top_k] as [P, 1]: rows of a larger
  // stride are copied dense into the workspace first.
  void* tw = la.data[core::kMoeArgTopkWeights];
  if (const int64_t ld = la.ld[core::kMoeArgTopkWeights]; ld != p.extra[1] && p.m > 1) {
    if (Status s = moe_copy_rows_async(base + w.tw, tw, p.m, p.extra[1] * 4, ld * 4, la, p); !s.ok()) return s;
    tw = base + w.tw;
  }
  core::LaunchArgs sla = la;  // the stream and its flags
  auto reset = [&] {
    sla = la;
    for (int i = 0; i < core::kMaxArgs; ++i) sla.data[i] = nullptr, sla.ld[i] = 0;
    sla.workspace = nullptr, sla.workspace_bytes = 0;
  };

  // 1. moe_align: M tokens of top_k choices among E experts, blocks of w.block.
  core::Problem pa = p;
  pa.op = core::OpKind::moe_align;
  pa.in_dtype = pa.out_dtype = DType::int32;
  pa.n = w.block, pa.k = 0, pa.extra[2] = 0, pa.has_bias = false, pa.choice = 0, pa.stride_code = 0;
  reset();
  sla.data[core::kAlignArgTopkIds] = la.data[core::kMoeArgTopkIds];
  sla.ld[core::kAlignArgTopkIds] = la.ld[core::kMoeArgTopkIds];
  sla.data[core::kAlignArgSorted] = sorted, sla.ld[core::kAlignArgSorted] = w.cap;
  sla.data[core::kAlignArgExpertIds] = experts, sla.ld[core::kAlignArgExpertIds] = w.blocks;
  sla.data[core::kAlignArgTotal] = total, sla.ld[core::kAlignArgTotal] = 1;
  sla.scalar[0] = static_cast<float>(p.extra[0]), sla.scalar[1] = static_cast<float>(w.block);
  if (Status s = run("moe_align", moe_align_default(pa, dev), sla, pa); !s.ok()) return s;

  // 2, 4. The two moe_gemm calls.
  const bool scales = p.in_dtype == DType::fp8_e4m3fn, fp8_w8a8 = how != Gemms::wgmma;
  auto gemm = [&](bool up) {
    const core::Problem gp = gemm_problem(p, up, how, prm);
    reset();
    sla.data[core::kMoeGemmArgA] = up ? la.data[core::kMoeArgHidden] : c2;
    sla.ld[core::kMoeGemmArgA] = up ? la.ld[core::kMoeArgHidden] : p.n;
    sla.data[core::kMoeGemmArgW] = la.data[up ? core::kMoeArgW1 : core::kMoeArgW2];
    sla.ld[core::kMoeGemmArgW] = la.ld[up ? core::kMoeArgW1 : core::kMoeArgW2];
    sla.data[core::kMoeGemmArgOut] = up ? c1 : c3;
    sla.ld[core::kMoeGemmArgOut] = up ? 2 * p.n : p.k;
    // down: topk_weights [M, top_k] viewed as [P, 1] (dense: row stride 1)
    sla.data[core::kMoeGemmArgTopkWeights] = up ? la.data[core::kMoeArgTopkWeights] : tw;
    sla.ld[core::kMoeGemmArgTopkWeights] = up ? la.ld[core::kMoeArgTopkWeights] : 1;
    sla.data[core::kMoeGemmArgSorted] = sorted, sla.ld[core::kMoeGemmArgSorted] = w.cap;
    sla.data[core::kMoeGemmArgExpertIds] = experts, sla.ld[core::kMoeGemmArgExpertIds] = w.blocks;
    sla.data[core::kMoeGemmArgTotal] = total, sla.ld[core::kMoeGemmArgTotal] = 1;
    if (scales) {
      sla.data[core::kMoeGemmArgWScale] = la.data[up ? core::kMoeArgW1Scale : core::kMoeArgW2Scale];
      sla.ld[core::kMoeGemmArgWScale] = la.ld[up ? core::kMoeArgW1Scale : core::kMoeArgW2Scale];
      sla.workspace = base + w.gemm, sla.workspace_bytes = w.bytes - w.gemm;
    }
    if (fp8_w8a8) {  // a1_scale / a2_scale [1] where given (static)
      sla.data[core::kMoeGemmArgAScale] = la.data[up ? core::kMoeArgA1Scale : core::kMoeArgA2Scale];
      sla.ld[core::kMoeGemmArgAScale] = sla.data[core::kMoeGemmArgAScale] != nullptr ? 1 : 0;
    }
    sla.scalar[0] = static_cast<float>(gp.extra[1]), sla.scalar[1] = static_cast<float>(w.block);
    sla.scalar[2] = up ? 0.f : 1.f;
    return run(up ? "the up moe_gemm" : "the down moe_gemm", gemm_plan(gp, how, dev), sla, gp);
  };
  if (zero_c1(p))  // c2's rows of dropped pairs join the down call's amax: zeros
    if (Status s = moe_zero_async(c1, P * 2 * p.n * 2, la, p); !s.ok()) return s;
  if (Status s = gemm(true); !s.ok()) return s;

  // 3. silu_and_mul: c2 [P, I] from c1 [P, 2I].
  core::Problem ps = p;
  ps.op = core::OpKind::silu_and_mul;
  ps.in_dtype = ps.out_dtype = p.out_dtype;
  ps.m = P, ps.n = p.n, ps.k = 0, ps.extra[0] = ps.extra[1] = ps.extra[2] = 0;
  ps.has_bias = false, ps.choice = 0, ps.stride_code = 0,
  ps.align_bytes = row_align(2 * p.n);  // c2's rows (c1's twice)
  reset();
  sla.data[core::kSiluArgOut] = c2, sla.ld[core::kSiluArgOut] = p.n;
  sla.data[core::kSiluArgX] = c1, sla.ld[core::kSiluArgX] = 2 * p.n;
  if (Status s = run("silu_and_mul", silu_default(ps, dev), sla, ps); !s.ok()) return s;

  {  // c3's rows of dropped pairs (ids outside [0, E)) stay 0
    if (Status s = moe_zero_async(c3, P * p.k * 2, la, p); !s.ok()) return s;
  }
  if (Status s = gemm(false); !s.ok()) return s;

  // 5. moe_sum: out [M, H] = routed_scaling_factor * the sum of c3 [M, top_k, H] over top_k.
  core::Problem pm = p;
  pm.op = core::OpKind::moe_sum;
  pm.in_dtype = pm.out_dtype = p.out_dtype;
  pm.n = p.k, pm.k = p.extra[1], pm.extra[0] = pm.extra[1] = pm.extra[2] = 0;
  pm.has_bias = false, pm.choice = 0, pm.stride_code = 0;
  pm.align_bytes = row_align(2 * p.k, p.align_bytes);  // c3's rows and out's
  reset();
  sla.data[core::kMoeSumArgInput] = c3, sla.ld[core::kMoeSumArgInput] = p.k;
  sla.data[core::kMoeSumArgOut] = la.data[core::kMoeArgOut], sla.ld[core::kMoeSumArgOut] = la.ld[core::kMoeArgOut];
  sla.scalar[0] = la.scalar[0];  // routed_scaling_factor
  return run("moe_sum", moe_sum_default(pm, dev), sla, pm);
}

}  // namespace dispatch::KDISPATCH_GPU_NS::fused_moe_compose
