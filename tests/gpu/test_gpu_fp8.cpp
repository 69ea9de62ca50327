// SPDX-License-Identifier: Apache-2.0
// GPU fp8 ops (issue 21): every fp8 GEMM variant — every point of the
// skinny_mma space, every cuBLASLt candidate, the reference — in each scale
// layout against a float64 reference of the dequantised inputs, outputs
// poisoned first (every element checked written): M in {1, 3, 5, 16, 17, 64,
// 65, 1023}, N and K not multiples of 128 (partial blocks), bias, bf16 /
// fp16 / fp32 outputs, a padded block scale_a; get_default on every shape;
// zero / inf / NaN scales as documented; fast accumulation (accum=fast,
// cuBLASLt's FAST_ACCUM): every cuBLASLt candidate of the fast key within the
// spec's fast tolerance, the block layout served or declined (never an
// error), the op and pretune under the accum=fast key. The quantisation ops: every
// variant and point, in all three input dtypes, bit for bit against the
// same arithmetic on the host (scale = max(amax, 1e-10) / 448 in fp32, then
// x / scale or x * (1 / scale), clamp, round to nearest even).
#include <cstdlib>
#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "gpu_test_util.hpp"
#include "ops/gemm_fp8.hpp"
#include "ops/quant_fp8.hpp"

namespace {

using namespace kdgpu;
using dispatch::Device;
using dispatch::DeviceInfo;
using dispatch::Status;
using dispatch::core::Fp8Scales;
using dispatch::core::LaunchArgs;
using dispatch::core::OpKind;
using dispatch::core::Plan;
using dispatch::core::Problem;
using dispatch::core::VariantDef;
namespace core = dispatch::core;

const DeviceInfo& dev_of(DeviceType t) { return *dispatch::backends::find(t)->device_info(0); }
dispatch::tune::DeviceMemory* mem_of(DeviceType t) { return dispatch::core::backend_memory(t); }

constexpr int64_t kB = core::kFp8Block;
int64_t blocks(int64_t x) { return (x + kB - 1) / kB; }

OpKind gemm_op(Fp8Scales l) {
  return l == Fp8Scales::tensor    ? OpKind::gemm_fp8_tensor
         : l == Fp8Scales::rowwise ? OpKind::gemm_fp8_rowwise
                                   : OpKind::gemm_fp8_block;
}
const char* layout_name(Fp8Scales l) {
  return l == Fp8Scales::tensor ? "tensor" : l == Fp8Scales::rowwise ? "rowwise" : "block";
}

struct Fp8Shape {
  int64_t m, n, k;
  bool bias = false;
  DType out = DType::bf16;
  int64_t sa_pad = 0;  ///< block layout: scale_a's row stride M + sa_pad
  /// block layout: scale_a K-major (SGLang's per_token_group_quant_fp8
  /// layout: [M, ceil(K/128)] row-major, row stride ceil(K/128) + sa_pad),
  /// passed as the column-major view LaunchArgs::ld < 0.
  bool sa_kmajor = false;
};

std::string text(Fp8Scales l, const Fp8Shape& s) {
  return std::string(layout_name(l)) + " M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) +
         " K=" + std::to_string(s.k) + (s.bias ? " bias" : "") + " out=" + std::string(dispatch::dtype_name(s.out)) +
         (s.sa_pad ? " sa_pad=" + std::to_string(s.sa_pad) : "") + (s.sa_kmajor ? " sa K-major" : "");
}

/// One fp8 GEMM problem on the device, with its float64 reference.
struct Fp8Case {
  Fp8Scales l;
  Fp8Shape s;
  HostTensor a, b, sa, sb, bias, d;
  std::vector<double> want, absdot;
  DeviceBuffer da, db, dsa, dsb, dbias, dd, ws;
  static constexpr int64_t kWs = int64_t{32} << 20;

  static HostTensor sa_of(Fp8Scales l, const Fp8Shape& s) {
    if (l == Fp8Scales::tensor) return HostTensor(DType::fp32, 1, 1, 1);
    if (l == Fp8Scales::rowwise) return HostTensor(DType::fp32, 1, s.m, s.m);
    if (s.sa_kmajor) return HostTensor(DType::fp32, s.m, blocks(s.k), blocks(s.k) + s.sa_pad);
    return HostTensor(DType::fp32, blocks(s.k), s.m, s.m + s.sa_pad);
  }
  static HostTensor sb_of(Fp8Scales l, const Fp8Shape& s) {
    if (l == Fp8Scales::tensor) return HostTensor(DType::fp32, 1, 1, 1);
    if (l == Fp8Scales::rowwise) return HostTensor(DType::fp32, 1, s.n, s.n);
    return HostTensor(DType::fp32, blocks(s.n), blocks(s.k), blocks(s.k));
  }
  double scale(int64_t i, int64_t j, int64_t kb) const {
    if (l == Fp8Scales::tensor) return double(sa.get(0, 0)) * sb.get(0, 0);
    if (l == Fp8Scales::rowwise) return double(sa.get(0, i)) * sb.get(0, j);
    return double(s.sa_kmajor ? sa.get(i, kb) : sa.get(kb, i)) * sb.get(j / kB, kb);
  }

  Fp8Case(DeviceType bt, Fp8Scales layout, const Fp8Shape& sh, std::mt19937& rng)
      : l(layout),
        s(sh),
        a(DType::fp8_e4m3fn, sh.m, sh.k, sh.k),
        b(DType::fp8_e4m3fn, sh.n, sh.k, sh.k),
        sa(sa_of(layout, sh)),
        sb(sb_of(layout, sh)),
        bias(sh.out, 1, sh.n, sh.n),
        d(sh.out, sh.m, sh.n, sh.n),
        da(mem_of(bt), a.bytes()),
        db(mem_of(bt), b.bytes()),
        dsa(mem_of(bt), sa.bytes()),
        dsb(mem_of(bt), sb.bytes()),
        dbias(mem_of(bt), bias.bytes()),
        dd(mem_of(bt), d.bytes()),
        ws(mem_of(bt), size_t(kWs)) {
    a.fill_uniform(rng, -8.f, 8.f);  // rounded to e4m3fn by set()
    b.fill_uniform(rng, -2.f, 2.f);
    sa.fill_uniform(rng, 0.01f, 0.05f);
    sb.fill_uniform(rng, 0.001f, 0.01f);
    bias.fill_uniform(rng, -1.f, 1.f);
    REQUIRE((da.ok() && db.ok() && dsa.ok() && dsb.ok() && dbias.ok() && dd.ok() && ws.ok()));
    REQUIRE(da.upload(a).ok());
    REQUIRE(db.upload(b).ok());
    REQUIRE(dsa.upload(sa).ok());
    REQUIRE(dsb.upload(sb).ok());
    REQUIRE(dbias.upload(bias).ok());
    reference();
  }
  void reference() {
    want.assign(size_t(s.m * s.n), 0.0);
    absdot.assign(size_t(s.m * s.n), 0.0);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double acc = 0, aa = 0;
        for (int64_t kb = 0; kb < blocks(s.k); ++kb) {
          double part = 0, pa = 0;
          for (int64_t k = kb * kB; k < std::min(s.k, (kb + 1) * kB); ++k) {
            const double t = double(a.get(i, k)) * double(b.get(j, k));
            part += t;
            pa += std::fabs(t);
          }
          const double sc = scale(i, j, kb);
          acc += part * sc;
          aa += pa * std::fabs(sc);
        }
        if (s.bias) acc += bias.get(0, j), aa += std::fabs(bias.get(0, j));
        want[size_t(i * s.n + j)] = acc;
        absdot[size_t(i * s.n + j)] = aa;
      }
  }
  Problem problem(DeviceType bt, core::Accum accum = core::Accum::precise) const {
    Problem p;
    p.accum = accum;
    p.op = gemm_op(l);
    p.device = Device{bt, 0};
    p.in_dtype = DType::fp8_e4m3fn;
    p.out_dtype = s.out;
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.has_bias = s.bias;
    return p;
  }
  LaunchArgs args() const {
    LaunchArgs la;
    la.data[core::kFp8ArgA] = da.get();
    la.ld[core::kFp8ArgA] = s.k;
    la.data[core::kFp8ArgB] = db.get();
    la.ld[core::kFp8ArgB] = s.k;
    la.data[core::kFp8ArgD] = dd.get();
    la.ld[core::kFp8ArgD] = s.n;
    la.data[core::kFp8ArgSa] = dsa.get();
    la.ld[core::kFp8ArgSa] = l != Fp8Scales::block ? 0 : s.sa_kmajor ? -sa.ld : sa.ld;
    la.data[core::kFp8ArgSb] = dsb.get();
    la.ld[core::kFp8ArgSb] = l == Fp8Scales::block ? sb.ld : 0;
    la.data[core::kFp8ArgBias] = s.bias ? dbias.get() : nullptr;
    la.workspace = ws.get();
    la.workspace_bytes = kWs;
    return la;
  }
  void poison() {
    d.poison_all();
    REQUIRE(dd.upload(d).ok());
  }
  /// "" when D matches the reference; *worst: the largest |got - want| / absdot.
  /// `acc_rel`: the accumulation's error bound relative to sum |a b s|:
  /// 1e-5 for our kernels (mma.sync e4m3 accumulates in fp32), 1e-4 for
  /// cuBLASLt, whose Hopper fp8 kernels accumulate in the tensor cores'
  /// reduced-precision fp32 between promotions (the H200 measured up to
  /// 1.3e-5: 2% of an output near zero; well inside the tuner's bf16
  /// validation tolerance).
  std::string mismatch(double* worst = nullptr, double acc_rel = 1e-5) {
    if (Status st = dd.download(&d); !st.ok()) return "download: " + st.to_string();
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        const std::string where = "[" + std::to_string(i) + "," + std::to_string(j) + "]";
        if (d.is_poison(i, j)) return where + " left unwritten";
        const double w = want[size_t(i * s.n + j)], g = d.get(i, j), ad = absdot[size_t(i * s.n + j)];
        int e = 0;
        std::frexp(std::max(std::fabs(w), 1e-30), &e);
        const double ulp = s.out == DType::fp32   ? std::ldexp(1.0, e - 24)
                           : s.out == DType::bf16 ? std::ldexp(1.0, e - 8)
                                                  : std::ldexp(1.0, e - 11);
        // fp8 x fp8 products are exact in fp32; the sums' order and the
        // scales' fp32 products: a few fp32 ulps of the absolute sum.
        const double tol = ulp + acc_rel * ad + 1e-30;
        if (worst && ad > 0) *worst = std::max(*worst, std::fabs(g - w) / ad);
        if (!(std::fabs(g - w) <= tol))
          return where + " got " + std::to_string(g) + " want " + std::to_string(w) + " (tol " + std::to_string(tol) +
                 ")";
      }
    return {};
  }
  /// The tuner's check (core::Tolerance): |got - want| <= atol_rel *
  /// max|want| + rtol * |want| at every element, none left unwritten. *worst
  /// (when given): the largest |got - want| / max|want|.
  std::string mismatch_tol(double atol_rel, double rtol, double* worst = nullptr) {
    if (Status st = dd.download(&d); !st.ok()) return "download: " + st.to_string();
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        const std::string where = "[" + std::to_string(i) + "," + std::to_string(j) + "]";
        if (d.is_poison(i, j)) return where + " left unwritten";
        const double w = want[size_t(i * s.n + j)], g = d.get(i, j);
        const double tol = atol_rel * scale + rtol * std::fabs(w);
        if (worst && scale > 0) *worst = std::max(*worst, std::fabs(g - w) / scale);
        if (!(std::fabs(g - w) <= tol))
          return where + " got " + std::to_string(g) + " want " + std::to_string(w) + " (tol " + std::to_string(tol) +
                 ")";
      }
    return {};
  }
};

const Fp8Shape kShapes[] = {
    {1, 256, 512},
    {1, 4096, 4096, true},
    {3, 136, 272, true, DType::fp32},
    {5, 2112, 7168},
    {16, 384, 1024, false, DType::fp16},
    {17, 640, 384, true},
    {64, 1024, 2048, false, DType::bf16, 4},
    {65, 264, 400, true, DType::fp32},
    {1023, 256, 512},
    {1024, 512, 1024, true},
    // K-major scale_a (block only; the other layouts ignore it): converted
    // by skinny_mma and cuBLASLt into the workspace, read by the reference.
    {1, 4096, 4096, false, DType::bf16, 0, true},
    {5, 2112, 7168, true, DType::bf16, 3, true},
    {64, 1024, 2048, false, DType::fp16, 0, true},
    {1023, 256, 1152, false, DType::bf16, 0, true},
    // ceil(K/128) % 4 != 0 (SGLang's K = 2304): cuBLASLt's block mode reads a
    // copy of scale_b with its rows padded to 20 floats.
    {64, 512, 2304, true},
};

constexpr Fp8Scales kLayouts[] = {Fp8Scales::tensor, Fp8Scales::rowwise, Fp8Scales::block};

}  // namespace

TEST_CASE("gpu fp8 gemm: every variant, every point and every cuBLASLt candidate matches the float64 reference") {
  for (DeviceType bt : usable_backends()) {
    if (bt != DeviceType::cuda) continue;
    const DeviceInfo& dev = dev_of(bt);
    std::mt19937 rng(21);
    for (Fp8Scales l : kLayouts) {
      // KD_FP8_TEST_LAYOUTS=block (a comma list): only those layouts (a short device run)
      if (const char* only = std::getenv("KD_FP8_TEST_LAYOUTS");
          only && *only &&
          std::string(",").append(only).append(",").find(std::string(",") + layout_name(l) + ",") == std::string::npos)
        continue;
      int points = 0, lt_candidates = 0;
      double worst_mma = 0, worst_lt = 0, worst_ref = 0;
      for (const Fp8Shape& sh : kShapes) {
        Fp8Case c(bt, l, sh, rng);
        const Problem p = c.problem(bt);
        int accepted = 0;
        for (const VariantDef* v : dispatch::core::variants_for(p.op, bt)) {
          std::vector<Plan> pts = dispatch::core::config_space(*v, p, dev);
          if (v->params.empty()) {
            Plan pl;
            pl.variant = v;
            pts = {pl};
          }
          const bool lt = (v->flags & dispatch::core::kVariantDynamicSpace) != 0;
          if (lt) lt_candidates += int(pts.size());
          for (const Plan& pl : pts) {
            INFO(text(l, sh), " ", dispatch::core::plan_to_string(pl));
            c.poison();
            const Status st = v->launch(c.args(), p, pl.params);
            if (st.code() == core::kNeedsFallbackCode) {
              MESSAGE("declined at launch: ", st.to_string());
              continue;
            }
            REQUIRE_MESSAGE(st.ok(), st.to_string());
            double w = 0;
            CHECK(c.mismatch(&w, lt ? 1e-4 : 1e-5) == "");
            (lt                                               ? worst_lt
             : (v->flags & dispatch::core::kVariantReference) ? worst_ref
                                                              : worst_mma) =
                std::max(w, lt                                               ? worst_lt
                            : (v->flags & dispatch::core::kVariantReference) ? worst_ref
                                                                             : worst_mma);
            ++points;
            ++accepted;
          }
        }
        CHECK(accepted >= 1);
      }
      MESSAGE(std::string(layout_name(l)), ": ", points, " runs checked, ", lt_candidates,
              " cuBLASLt candidates; largest |err| / sum|a b s|: skinny_mma ", worst_mma, ", cuBLASLt ", worst_lt,
              ", reference ", worst_ref);
    }
  }
}

TEST_CASE("gpu fp8 gemm: get_default serves every shape in every layout") {
  for (DeviceType bt : usable_backends()) {
    if (bt != DeviceType::cuda) continue;
    const DeviceInfo& dev = dev_of(bt);
    std::mt19937 rng(5);
    for (Fp8Scales l : kLayouts)
      for (const Fp8Shape& sh : kShapes) {
        Fp8Case c(bt, l, sh, rng);
        const Problem p = c.problem(bt);
        const Plan plan = dispatch::core::get_default(p, dev);
        REQUIRE(plan.valid());
        INFO(text(l, sh), " ", dispatch::core::plan_to_string(plan));
        // Without a workspace (get_default's plan needs none), then with the
        // op's (the production path: cuBLASLt's copies at M % 4 != 0 and
        // ceil(K/128) % 4 != 0 go into it).
        for (bool with_ws : {false, true}) {
          INFO("workspace: ", std::string(with_ws ? "yes" : "none"));
          c.poison();
          LaunchArgs la = c.args();
          if (!with_ws) {
            la.workspace = nullptr;
            la.workspace_bytes = 0;
          }
          Plan run = plan;
          Status st = plan.variant->launch(la, p, plan.params);
          if (st.code() == core::kNeedsFallbackCode) {
            // As the op does: the reference serves the call (cuBLASLt's
            // heuristic may have nothing without a workspace).
            MESSAGE("get_default's plan declined at launch (", st.to_string(), "): the reference serves");
            // Not for want of room for cuBLASLt's scale_b copy (ceil(K/128) % 4
            // != 0): get_default's plan must not hand such calls (a stream
            // first seen in a graph capture has no workspace) to the reference.
            CHECK_MESSAGE(st.message().find("reads scale_b padded") == std::string::npos, st.to_string());
            // Only a K-major scale_a without room for its M-major copy is
            // left to the reference: a call cuBLASLt's heuristic has no
            // algorithm for (fp32 output with bias at N = 264 on 13.1) runs
            // skinny_mma inside get_default's cuBLASLt plan.
            CHECK_MESSAGE((sh.sa_kmajor && !with_ws), st.to_string());
            for (const VariantDef* v : dispatch::core::variants_for(p.op, bt))
              if (v->flags & dispatch::core::kVariantReference) run.variant = v;
            st = run.variant->launch(la, p, run.params);
          }
          REQUIRE_MESSAGE(st.ok(), st.to_string());
          CHECK(c.mismatch(nullptr, (run.variant->flags & dispatch::core::kVariantDynamicSpace) ? 1e-4 : 1e-5) == "");
        }
      }
  }
}

TEST_CASE("gpu fp8 gemm: zero scales give zeros, an inf or NaN scale gives NaN where it applies") {
  for (DeviceType bt : usable_backends()) {
    if (bt != DeviceType::cuda) continue;
    const DeviceInfo& dev = dev_of(bt);
    std::mt19937 rng(3);
    const Fp8Shape sh{4, 256, 512};
    Fp8Case c(bt, Fp8Scales::block, sh, rng);
    const Problem p = c.problem(bt);
    // scale_b's block (0, 0) zero, block (1, 1) NaN; scale_a's group 2 of row 3 inf.
    c.sb.set(0, 0, 0.f);
    c.sb.set(1, 1, std::numeric_limits<float>::quiet_NaN());
    c.sa.set(2, 3, std::numeric_limits<float>::infinity());
    REQUIRE(c.dsa.upload(c.sa).ok());
    REQUIRE(c.dsb.upload(c.sb).ok());
    for (const VariantDef* v : dispatch::core::variants_for(p.op, bt)) {
      std::vector<Plan> pts = dispatch::core::config_space(*v, p, dev);
      if (v->params.empty()) {
        Plan pl;
        pl.variant = v;
        pts = {pl};
      }
      for (const Plan& pl : pts) {
        INFO(dispatch::core::plan_to_string(pl));
        c.poison();
        const Status st = v->launch(c.args(), p, pl.params);
        if (st.code() == core::kNeedsFallbackCode) continue;
        REQUIRE(st.ok());
        REQUIRE(c.dd.download(&c.d).ok());
        // Rows < 128 of B, row 0..2 of A: K group 0 scaled by 0, groups 1..3 finite: finite.
        CHECK(std::isfinite(c.d.get(0, 5)));
        // Columns 128..255 (B block row 1) meet the NaN in K group 1: NaN.
        CHECK(std::isnan(c.d.get(0, 130)));
        // Row 3 of A meets inf in K group 2: inf or NaN (inf times a sum that may be 0 or of either sign).
        CHECK(!std::isfinite(c.d.get(3, 5)));
      }
    }
  }
}

// ---------------------------------------------------------------- fast accumulation

TEST_CASE(
    "gpu fp8 gemm fast_accum: tensor and rowwise, every cuBLASLt candidate of the accum=fast key within the fast "
    "tolerance of float64") {
  for (DeviceType bt : usable_backends()) {
    if (bt != DeviceType::cuda) continue;
    const DeviceInfo& dev = dev_of(bt);
    std::mt19937 rng(25);
    for (Fp8Scales l : {Fp8Scales::tensor, Fp8Scales::rowwise}) {
      int runs = 0, candidates = 0, differ = 0;
      double worst = 0;
      for (const Fp8Shape& sh : kShapes) {
        if (sh.sa_kmajor) continue;  // a block-only layout: the same problem again here
        Fp8Case c(bt, l, sh, rng);
        const Problem p = c.problem(bt, core::Accum::fast);
        double atol = 0, rtol = 0;
        dispatch::tune::validation_tolerance(p, sh.out, &atol, &rtol);
        CHECK(atol == 2e-2);
        CHECK(rtol == 3.2e-2);
        for (const VariantDef* v : dispatch::core::variants_for(p.op, bt)) {
          if (!(v->flags & dispatch::core::kVariantDynamicSpace)) continue;
          // enumerate() asks the heuristic with FAST_ACCUM set: these are
          // fast algorithms, checked (supports) and launched fast.
          const std::vector<Plan> pts = dispatch::core::config_space(*v, p, dev);
          candidates += int(pts.size());
          for (const Plan& pl : pts) {
            INFO(text(l, sh), " accum=fast ", dispatch::core::plan_to_string(pl));
            c.poison();
            const Status st = v->launch(c.args(), p, pl.params);
            if (st.code() == core::kNeedsFallbackCode) {
              MESSAGE("declined at launch: ", st.to_string());
              continue;
            }
            REQUIRE_MESSAGE(st.ok(), st.to_string());
            double w = 0;
            CHECK(c.mismatch_tol(atol, rtol, &w) == "");
            worst = std::max(worst, w);
            // For the record: does FAST_ACCUM change the bits against the
            // precise tolerance (fp32 accumulation's 1e-4 of sum|a b s|)?
            if (c.mismatch(nullptr, 1e-4) != "") ++differ;
            ++runs;
          }
        }
      }
      MESSAGE(std::string(layout_name(l)), " accum=fast: ", runs, " runs of ", candidates,
              " cuBLASLt candidates; largest |err| / max|want| ", worst, "; ", differ,
              " runs outside the precise bound (1e-4 of sum|a b s|)");
      CHECK(candidates > 0);  // cuBLASLt offers FAST_ACCUM algorithms in these scale modes on sm_90
      CHECK(runs > 0);
    }
  }
}

TEST_CASE(
    "gpu fp8 gemm fast_accum: the block layout is served within the fast tolerance or declined, never an error, and "
    "get_default serves every layout") {
  for (DeviceType bt : usable_backends()) {
    if (bt != DeviceType::cuda) continue;
    const DeviceInfo& dev = dev_of(bt);
    std::mt19937 rng(27);
    for (Fp8Scales l : kLayouts) {
      int served = 0, declined = 0, unsupported = 0;
      for (const Fp8Shape& sh : kShapes) {
        if (sh.sa_kmajor && l != Fp8Scales::block) continue;
        Fp8Case c(bt, l, sh, rng);
        const Problem p = c.problem(bt, core::Accum::fast);
        double atol = 0, rtol = 0;
        dispatch::tune::validation_tolerance(p, sh.out, &atol, &rtol);
        for (const VariantDef* v : dispatch::core::variants_for(p.op, bt)) {
          if (!(v->flags & dispatch::core::kVariantDynamicSpace)) continue;
          // A concrete row of the precise key, asked for the fast problem:
          // accepted (FAST_ACCUM on) or declined with a reason.
          for (const Plan& pl : dispatch::core::config_space(*v, c.problem(bt), dev)) {
            INFO(text(l, sh), " accum=fast on a precise candidate ", dispatch::core::plan_to_string(pl));
            if (Status s = v->supports(p, pl.params, dev); !s.ok()) {
              CHECK(s.code() == dispatch::StatusCode::unsupported_problem);
              ++unsupported;
              continue;
            }
            c.poison();
            const Status st = v->launch(c.args(), p, pl.params);
            if (st.code() == core::kNeedsFallbackCode) {
              ++declined;
              continue;
            }
            REQUIRE_MESSAGE(st.ok(), st.to_string());
            CHECK(c.mismatch_tol(atol, rtol) == "");
            ++served;
          }
        }
        // get_default for the fast problem, with the op's fallback to the reference.
        const Plan plan = dispatch::core::get_default(p, dev);
        REQUIRE(plan.valid());
        INFO(text(l, sh), " accum=fast get_default ", dispatch::core::plan_to_string(plan));
        c.poison();
        Plan run = plan;
        Status st = plan.variant->launch(c.args(), p, plan.params);
        if (st.code() == core::kNeedsFallbackCode) {
          MESSAGE("get_default's plan declined the fast call (", st.to_string(), "): the reference serves");
          // accum=fast permits FAST_ACCUM, it does not demand it: where
          // cuBLASLt has no fast algorithm (the block modes, fp32 output with
          // bias on 13.1) the heuristic plan runs precise; with the
          // workspace here nothing is left to the reference.
          CHECK_MESSAGE(false, st.to_string());
          for (const VariantDef* v : dispatch::core::variants_for(p.op, bt))
            if (v->flags & dispatch::core::kVariantReference) run.variant = v;
          st = run.variant->launch(c.args(), p, run.params);
        }
        REQUIRE_MESSAGE(st.ok(), st.to_string());
        CHECK(c.mismatch_tol(atol, rtol) == "");
      }
      MESSAGE(std::string(layout_name(l)), " accum=fast on the precise key's cuBLASLt rows: ", served, " served, ",
              declined, " declined at launch, ", unsupported, " declined by supports()");
    }
  }
}

TEST_CASE(
    "gpu fp8 gemm fast_accum: the op and pretune through a Runtime use the accum=fast key, the precise key stays as it "
    "was") {
  for (DeviceType bt : usable_backends()) {
    if (bt != DeviceType::cuda) continue;
    char tmpl[] = "/tmp/kdispatch-gpu-fp8-fast-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    const std::string cache = tmpl;
    auto rt = dispatch::Runtime::create([&] {
      dispatch::RuntimeOptions o;
      o.load_shipped_configs = false;
      o.log_level = dispatch::LogLevel::off;
      o.tune.mode = dispatch::TuneMode::off;
      o.tune.cache_dir = cache;
      o.tune.time_budget_ms = 500;
      return o;
    }());
    REQUIRE(rt.ok());
    const DeviceInfo& dev = dev_of(bt);
    std::mt19937 rng(29);
    const Device d{bt, 0};
    for (Fp8Scales l : {Fp8Scales::tensor, Fp8Scales::rowwise}) {
      const Fp8Shape sh{1024, 4096, 4096};
      Fp8Case c(bt, l, sh, rng);
      const LaunchArgs la = c.args();
      dispatch::GemmFp8Args g;
      g.a = dispatch::make_tensor_2d(la.data[core::kFp8ArgA], DType::fp8_e4m3fn, sh.m, sh.k, sh.k, d);
      g.b = dispatch::make_tensor_2d(la.data[core::kFp8ArgB], DType::fp8_e4m3fn, sh.n, sh.k, sh.k, d);
      g.d = dispatch::make_tensor_2d(la.data[core::kFp8ArgD], sh.out, sh.m, sh.n, sh.n, d);
      const int64_t na = l == Fp8Scales::tensor ? 1 : sh.m, nb = l == Fp8Scales::tensor ? 1 : sh.n;
      g.scale_a = dispatch::make_tensor_1d(la.data[core::kFp8ArgSa], DType::fp32, na, d);
      g.scale_b = dispatch::make_tensor_1d(la.data[core::kFp8ArgSb], DType::fp32, nb, d);
      for (bool fast : {false, true}) {
        g.fast_accum = fast;
        std::string key;
        dispatch::DispatchInfo info;
        info.key = &key;
        dispatch::CallOptions opts;
        opts.info = &info;
        opts.workspace = c.ws.get();
        opts.workspace_bytes = Fp8Case::kWs;
        c.poison();
        const Status st = l == Fp8Scales::tensor
                              ? dispatch::gemm_fp8_tensor(**rt, dispatch::GemmFp8TensorArgs{g}, {}, opts)
                              : dispatch::gemm_fp8_rowwise(**rt, dispatch::GemmFp8RowwiseArgs{g}, {}, opts);
        INFO(text(l, sh), fast ? " accum=fast " : " precise ", std::string(info.variant));
        REQUIRE_MESSAGE(st.ok(), st.to_string());
        const std::string fields = fast ? "|K=4096,N=4096,accum=fast,dtype=fp8_e4m3fn,out_dtype=bf16"
                                        : "|K=4096,N=4096,dtype=fp8_e4m3fn,out_dtype=bf16";
        CHECK(key == "cuda/gemm_fp8_" + std::string(layout_name(l)) + "|" + dev.device_name + fields);
        double atol = 0, rtol = 0;
        dispatch::tune::validation_tolerance(c.problem(bt, fast ? core::Accum::fast : core::Accum::precise), sh.out,
                                             &atol, &rtol);
        CHECK(c.mismatch_tol(atol, rtol) == "");
        MESSAGE(text(l, sh), fast ? " accum=fast: " : " precise: ", std::string(info.variant));
        // The tuner searches the fast key's candidates (validated with the
        // fast tolerance: none rejected) and keeps its row under that key.
        if (fast) {
          auto r = l == Fp8Scales::tensor ? dispatch::pretune(**rt, dispatch::GemmFp8TensorArgs{g})
                                          : dispatch::pretune(**rt, dispatch::GemmFp8RowwiseArgs{g});
          REQUIRE_MESSAGE(r.ok(), r.status().to_string());
          CHECK(r->key == key);
          CHECK(r->rejected == 0);
          MESSAGE(text(l, sh), " accum=fast pretune: ", r->variant, " ", r->best_us, " us (default ", r->default_us,
                  " us), ", r->candidates, " candidates, ", r->rejected, " rejected, ", r->failed, " failed");
          c.poison();
          const Status again = l == Fp8Scales::tensor
                                   ? dispatch::gemm_fp8_tensor(**rt, dispatch::GemmFp8TensorArgs{g}, {}, opts)
                                   : dispatch::gemm_fp8_rowwise(**rt, dispatch::GemmFp8RowwiseArgs{g}, {}, opts);
          REQUIRE_MESSAGE(again.ok(), again.to_string());
          CHECK(info.source == dispatch::PlanSource::table);
          CHECK(c.mismatch_tol(atol, rtol) == "");
        }
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(cache, ec);
  }
}

// ---------------------------------------------------------------- quantisation

namespace {

OpKind quant_op(int l) {
  return l == 0 ? OpKind::quant_fp8_tensor : l == 1 ? OpKind::quant_fp8_token : OpKind::quant_fp8_group;
}

/// The kernels' arithmetic on the host: q and the scales of x.
void quant_host(int l, bool mul, const HostTensor& x, HostTensor* q, HostTensor* s) {
  const int64_t gk = l == 2 ? core::kQuantGroup : x.cols;
  auto group = [&](int64_t i0, int64_t i1, int64_t k0, int64_t k1) {
    float amax = 0.f;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t k = k0; k < k1; ++k) amax = std::fmax(amax, std::fabs(x.get(i, k)));
    const float scale = std::fmax(amax, core::kQuantMinAmax) / 448.f, inv = 1.f / scale;
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t k = k0; k < k1; ++k) {
        const float v = std::fmin(std::fmax(mul ? x.get(i, k) * inv : x.get(i, k) / scale, -448.f), 448.f);
        q->bits[size_t(i * q->ld + k)] = core::float_to_fp8(v, core::kE4m3fn, true);
      }
    return scale;
  };
  if (l == 0) {
    s->set(0, 0, group(0, x.rows, 0, x.cols));
    return;
  }
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t k0 = 0; k0 < x.cols; k0 += gk) {
      const float sc = group(i, i + 1, k0, std::min(x.cols, k0 + gk));
      if (l == 1)
        s->set(0, i, sc);
      else
        s->set(k0 / gk, i, sc);
    }
}

}  // namespace

TEST_CASE("gpu fp8 quantisation: every variant and point, bit for bit against the host arithmetic") {
  for (DeviceType bt : usable_backends()) {
    if (bt != DeviceType::cuda) continue;
    const DeviceInfo& dev = dev_of(bt);
    std::mt19937 rng(17);
    int runs = 0;
    for (int l = 0; l < 3; ++l)
      for (DType dt : {DType::fp32, DType::fp16, DType::bf16})
        for (auto [m, k] :
             {std::pair<int64_t, int64_t>{1, 7}, {3, 128}, {5, 300}, {17, 7168}, {64, 4096}, {1023, 512}}) {
          HostTensor x(dt, m, k, k + 8), q(DType::fp8_e4m3fn, m, k, k), want_q(DType::fp8_e4m3fn, m, k, k);
          const int64_t sld = l == 2 ? m + 3 : std::max<int64_t>(m, 1);
          HostTensor s(DType::fp32, l == 2 ? (k + 127) / 128 : 1, l == 0 ? 1 : m, l == 0 ? 1 : sld), want_s = s;
          x.fill_uniform(rng, -3.f, 3.f);
          for (int64_t c = 0; c < k; c += 5) x.set(m / 2, c, x.get(m / 2, c) * 100.f);  // one loud row
          DeviceBuffer dx(mem_of(bt), x.bytes()), dq(mem_of(bt), q.bytes()), ds(mem_of(bt), s.bytes());
          REQUIRE(dx.upload(x).ok());
          Problem p;
          p.op = quant_op(l);
          p.device = Device{bt, 0};
          p.in_dtype = dt;
          p.out_dtype = DType::fp8_e4m3fn;
          p.m = m;
          p.k = k;
          LaunchArgs la;
          la.data[core::kQuantArgQ] = dq.get();
          la.ld[core::kQuantArgQ] = k;
          la.data[core::kQuantArgX] = dx.get();
          la.ld[core::kQuantArgX] = k + 8;
          la.data[core::kQuantArgScale] = ds.get();
          la.ld[core::kQuantArgScale] = l == 2 ? sld : 0;
          for (const VariantDef* v : dispatch::core::variants_for(p.op, bt)) {
            if (v->in_dtype != dt) continue;
            const bool mul = !(v->flags & dispatch::core::kVariantReference);
            quant_host(l, mul, x, &want_q, &want_s);
            std::vector<Plan> pts = dispatch::core::config_space(*v, p, dev);
            if (v->params.empty()) {
              Plan pl;
              pl.variant = v;
              pts = {pl};
            }
            for (const Plan& pl : pts) {
              INFO("M=", m, " K=", k, " ", dispatch::core::plan_to_string(pl));
              q.poison_all();
              REQUIRE(dq.upload(q).ok());
              const Status st = v->launch(la, p, pl.params);
              REQUIRE_MESSAGE(st.ok(), st.to_string());
              REQUIRE(dq.download(&q).ok());
              REQUIRE(ds.download(&s).ok());
              int64_t bad = 0;
              std::string first;
              for (int64_t i = 0; i < m; ++i)
                for (int64_t c = 0; c < k; ++c)
                  if (q.bits[size_t(i * k + c)] != want_q.bits[size_t(i * k + c)] && bad++ == 0)
                    first = "q[" + std::to_string(i) + "," + std::to_string(c) +
                            "] = " + std::to_string(q.bits[size_t(i * k + c)]) + " want " +
                            std::to_string(want_q.bits[size_t(i * k + c)]);
              CHECK_MESSAGE(bad == 0, bad, " q elements differ; first ", first);
              for (int64_t r = 0; r < s.rows; ++r)
                for (int64_t c = 0; c < s.cols; ++c) CHECK(s.get(r, c) == want_s.get(r, c));
              ++runs;
            }
          }
        }
    MESSAGE(runs, " quantisation runs checked bit for bit");
  }
}

TEST_CASE("gpu fp8 quantisation: quant_fp8_tensor at M = 0 writes the scale of an empty x, x and q null") {
  for (DeviceType bt : usable_backends()) {
    if (bt != DeviceType::cuda) continue;
    HostTensor s(DType::fp32, 1, 1, 1);
    DeviceBuffer ds(mem_of(bt), s.bytes());
    Problem p;
    p.op = OpKind::quant_fp8_tensor;
    p.device = Device{bt, 0};
    p.out_dtype = DType::fp8_e4m3fn;
    p.k = 64;
    LaunchArgs la;
    la.data[core::kQuantArgScale] = ds.get();
    int runs = 0;
    for (const VariantDef* v : dispatch::core::variants_for(p.op, bt)) {
      INFO(v->name);
      p.in_dtype = v->in_dtype;
      int64_t prm[core::kMaxParams] = {};
      for (size_t i = 0; i < v->params.size(); ++i) prm[i] = v->params[i].default_value;
      s.set(0, 0, 99.f);
      REQUIRE(ds.upload(s).ok());
      const Status st = v->launch(la, p, prm);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      REQUIRE(ds.download(&s).ok());
      CHECK(s.get(0, 0) == core::kQuantMinAmax / 448.f);
      ++runs;
    }
    CHECK(runs > 0);
  }
}
