// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the vectorised row families (rmsnorm.cpp,
// silu_and_mul.cpp): their (vec, unroll) config space, the table of ISA
// entry points a plan picks from, and the checks of a point.
//
// A row body is a struct K with an always-inline
// `template <int W, int U> static void run(const LaunchArgs&, const Problem&)`
// over every row of the call (W fp32 lanes per vector, U vectors per loop
// step; cpu_simd.hpp). make_rows_table<K>() instantiates it inside three thin
// entry points carrying a target attribute — W=4 baseline (SSE2 on x86-64,
// NEON elsewhere), W=8 AVX2, W=16 AVX-512 — so each width is lowered to
// native instructions while the library stays baseline x86-64.
#pragma once

#include <cstdint>

#include "core/op.hpp"
#include "cpu/cpu_common.hpp"
#include "cpu/cpu_rows_list.hpp"

namespace dispatch::cpu {

/// The slots of the `vec` and `unroll` params in Plan::params (every row
/// family declares them first, in this order).
inline constexpr int kRowsVec = 0, kRowsUnroll = 1;

/// The `vec` param's space: fp32 lanes per vector (4 = SSE2, the x86-64
/// baseline; 8 = AVX2; 16 = AVX-512).
inline constexpr int64_t kRowsVecValues[] = {4, 8, 16};
/// The `unroll` param's space: vectors per loop step.
inline constexpr int64_t kRowsUnrollValues[] = {1, 2, 4};

/// The (vec, unroll) params of a row family whose point depends on the row
/// length alone (silu_and_mul, moe_sum), in Plan::params order, with the
/// defaults rows_default() picks on an AVX2 host's long rows.
inline constexpr core::ParamDef kRowsParams[] = {
    {"vec", core::ParamKind::integer, kRowsVecValues, {}, 8},
    {"unroll", core::ParamKind::integer, kRowsUnrollValues, {}, 2},
};

/// Index of a vec / unroll value in kRowsVecValues / kRowsUnrollValues; -1 when outside.
constexpr int vec_index(int64_t v) { return v == 4 ? 0 : v == 8 ? 1 : v == 16 ? 2 : -1; }
constexpr int unroll_index(int64_t u) { return u == 1 ? 0 : u == 2 ? 1 : u == 4 ? 2 : -1; }

/// Whether the host runs `vec`-lane code.
inline bool host_runs_vec(int64_t vec) noexcept {
  if (vec == 4) return true;
  if (!KDISPATCH_CPU_X86) return false;
  return vec == 8 ? host_isa().avx2 : host_isa().avx512;
}

/// The widest vec the host runs that is no wider than a row of `n`
/// elements (4 at the least): what the row families' defaults take.
inline int64_t widest_vec(int64_t n) noexcept {
  int64_t vec = host_runs_vec(16) ? 16 : host_runs_vec(8) ? 8 : 4;
  while (vec > 4 && vec > n) vec /= 2;
  return vec;
}

/// The default plan of a row family whose vec point depends on the row
/// length `n` alone (silu_and_mul's d, moe_sum's hidden): a streaming pass,
/// so the widest vector the host runs, no wider than the row, unrolled 2
/// while a step fits in the row (two independent chains); rows shorter than
/// 4 elements take the reference. `list` is the op's row list
/// (KDISPATCH_CPU_ROWS_LIST: fp32 vec, bf16 vec, fp32 ref, bf16 ref). An
/// invalid Plan for another op, another dtype, or an output dtype of its own.
inline core::Plan rows_default(const core::Problem& p, core::OpKind op, const core::VariantDef* const (&list)[4],
                               int64_t n) noexcept {
  core::Plan plan;
  const bool bf16 = p.in_dtype == DType::bf16;
  if (p.op != op || p.out_dtype != p.in_dtype || (!bf16 && p.in_dtype != DType::fp32)) return plan;
  plan.variant = list[(n < 4 ? 2 : 0) + (bf16 ? 1 : 0)];
  if (n >= 4) {
    plan.params[kRowsVec] = widest_vec(n);
    plan.params[kRowsUnroll] = plan.params[kRowsVec] * 2 <= n ? 2 : 1;
  }
  return plan;
}

/// One instance of a row body: every row of the call.
using RowsFn = void (*)(const core::LaunchArgs&, const core::Problem&);

/// fn[vec index][unroll index]; null where the ISA is not compiled in.
struct RowsTable {
  RowsFn fn[3][3] = {};
};

template <class K, int U>
void rows_w4(const core::LaunchArgs& a, const core::Problem& p) {
  K::template run<4, U>(a, p);
}
#if KDISPATCH_CPU_X86
template <class K, int U>
KDISPATCH_TARGET_AVX2 void rows_w8(const core::LaunchArgs& a, const core::Problem& p) {
  K::template run<8, U>(a, p);
}
template <class K, int U>
KDISPATCH_TARGET_AVX512 void rows_w16(const core::LaunchArgs& a, const core::Problem& p) {
  K::template run<16, U>(a, p);
}
#endif

/// The table of row body K: every (vec, unroll) the build compiles.
template <class K>
constexpr RowsTable make_rows_table() {
  RowsTable t;
  t.fn[0][0] = &rows_w4<K, 1>;
  t.fn[0][1] = &rows_w4<K, 2>;
  t.fn[0][2] = &rows_w4<K, 4>;
#if KDISPATCH_CPU_X86
  t.fn[1][0] = &rows_w8<K, 1>;
  t.fn[1][1] = &rows_w8<K, 2>;
  t.fn[1][2] = &rows_w8<K, 4>;
  t.fn[2][0] = &rows_w16<K, 1>;
  t.fn[2][1] = &rows_w16<K, 2>;
  t.fn[2][2] = &rows_w16<K, 4>;
#endif
  return t;
}

/// A problem check of a row family (op, device, dtypes, sizes): the decline, or Ok.
using RowsProblemCheck = Status (*)(const core::VariantDef& v, const core::Problem& p) noexcept;

/// The checks a one-dtype row family's problem check starts with, in this
/// order: the op (else `not_op`), the device, input and output of the
/// variant's dtype (else `dtype_fp32` / `dtype_bf16`). Ok, or the decline.
inline Status rows_check_op_and_dtype(const core::VariantDef& v, const core::Problem& p, const char* not_op,
                                      const char* dtype_fp32, const char* dtype_bf16) noexcept {
  if (p.op != v.op) return decline(v, StatusCode::unsupported_problem, not_op);
  if (p.device.type != v.backend)
    return decline(v, StatusCode::unsupported_device, "CPU variant, problem is on another device");
  if (p.in_dtype != v.in_dtype || p.out_dtype != v.in_dtype)
    return decline(v, StatusCode::unsupported_problem, v.in_dtype == DType::fp32 ? dtype_fp32 : dtype_bf16);
  return Status::Ok();
}

/// supports() of the vec variant V: its problem check, every param in its
/// space, and the vec width an ISA the host has.
template <const core::VariantDef& V, RowsProblemCheck Check>
Status rows_vec_supports(const core::Problem& p, const int64_t* prm, const DeviceInfo&) {
  if (Status s = Check(V, p); !s.ok()) return s;
  if (!params_in_space(V, prm))
    return decline(V, StatusCode::invalid_argument, "a param value is outside its config space");
  if (!host_runs_vec(prm[kRowsVec]))
    return decline(
        V, StatusCode::unsupported_problem,
        prm[kRowsVec] == 8 ? "vec 8 needs AVX2, which this host lacks" : "vec 16 needs AVX-512, which this host lacks");
  return Status::Ok();
}

/// supports() of the reference variant V: its problem check.
template <const core::VariantDef& V, RowsProblemCheck Check>
Status rows_ref_supports(const core::Problem& p, const int64_t*, const DeviceInfo&) {
  return Check(V, p);
}

/// Runs the plan's (vec, unroll) entry of table `t` over every row;
/// `no_isa` (unsupported_problem) when the host cannot run it.
inline Status run_rows(const RowsTable& t, const int64_t* prm, const core::LaunchArgs& a, const core::Problem& p,
                       const char* no_isa) {
  const int vi = vec_index(prm[kRowsVec]), ui = unroll_index(prm[kRowsUnroll]);
  RowsFn fn = vi < 0 || ui < 0 ? nullptr : t.fn[vi][ui];
  if (fn == nullptr || !host_runs_vec(prm[kRowsVec])) return make_status(StatusCode::unsupported_problem, no_isa);
  fn(a, p);
  return Status::Ok();
}

}  // namespace dispatch::cpu
