// SPDX-License-Identifier: Apache-2.0
// GPU GEMM: every variant the tuner may pick — every point of the skinny and
// tiled spaces, every candidate cuBLASLt's heuristic offers — against a
// float64 reference on random inputs with the output poisoned first (every
// element checked written, the row padding checked untouched): M = 1 and M
// not a multiple of any tile, N and K at their minimum alignment (8), odd K
// (cuBLASLt and the reference only), padded row strides, with and without
// bias, bf16 and fp32 outputs, fp16 inputs. Then the cuBLASLt round trip
// (heuristic -> JSON file -> a Runtime's table -> the same result, bit for
// bit), and the op through a Runtime: misaligned operands and a missing
// workspace fall back inside the call.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "gpu_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using namespace kdgpu;
using dispatch::Device;
using dispatch::DeviceInfo;
using dispatch::Status;
using dispatch::core::kGemmArgA;
using dispatch::core::kGemmArgB;
using dispatch::core::kGemmArgBias;
using dispatch::core::kGemmArgD;
using dispatch::core::LaunchArgs;
using dispatch::core::OpKind;
using dispatch::core::Plan;
using dispatch::core::Problem;
using dispatch::core::VariantDef;

const DeviceInfo& dev_of(DeviceType t) { return *dispatch::backends::find(t)->device_info(0); }
dispatch::tune::DeviceMemory* mem_of(DeviceType t) { return dispatch::core::backend_memory(t); }

struct GemmShape {
  int64_t m, n, k;
  int64_t lda_pad = 0, ldd_pad = 0;
  bool bias = false;
  DType out = DType::bf16;
  DType in = DType::bf16;
};

std::string text(const GemmShape& s) {
  return "M=" + std::to_string(s.m) + " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) +
         " lda=" + std::to_string(s.k + s.lda_pad) + " ldd=" + std::to_string(s.n + s.ldd_pad) +
         (s.bias ? " bias" : "") + " in=" + std::string(dispatch::dtype_name(s.in)) +
         " out=" + std::string(dispatch::dtype_name(s.out));
}

/// One problem on the device: inputs, the float64 reference, the output.
struct GemmCase {
  GemmShape s;
  HostTensor a, b, bias, d;
  std::vector<double> want, absdot;
  DeviceBuffer da, db, dbias, dd, ws;
  // The split-K families need split_k * M * N * 4 bytes (split_k <= 4 in the
  // tiled family's space, 8 in skinny's); at least 32 MiB for cuBLASLt.
  static int64_t ws_for(const GemmShape& sh) { return std::max<int64_t>(int64_t{32} << 20, 8 * sh.m * sh.n * 4); }

  GemmCase(DeviceType bt, const GemmShape& sh, std::mt19937& rng, size_t a_offset_bytes = 0)
      : s(sh),
        a(sh.in, sh.m, sh.k, sh.k + sh.lda_pad),
        b(sh.in, sh.n, sh.k, sh.k),
        bias(sh.out, 1, sh.n, sh.n),
        d(sh.out, sh.m, sh.n, sh.n + sh.ldd_pad),
        da(mem_of(bt), a.bytes(), a_offset_bytes),
        db(mem_of(bt), b.bytes()),
        dbias(mem_of(bt), bias.bytes()),
        dd(mem_of(bt), d.bytes()),
        ws(mem_of(bt), size_t(ws_for(sh))) {
    a.fill_uniform(rng, -1.f, 1.f);
    b.fill_uniform(rng, -0.5f, 0.5f);
    bias.fill_uniform(rng, -1.f, 1.f);
    REQUIRE((da.ok() && db.ok() && dbias.ok() && dd.ok() && ws.ok()));
    REQUIRE(da.upload(a).ok());
    REQUIRE(db.upload(b).ok());
    REQUIRE(dbias.upload(bias).ok());
    want.assign(size_t(s.m * s.n), 0.0);
    absdot.assign(size_t(s.m * s.n), 0.0);
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double acc = 0, aa = 0;
        for (int64_t k = 0; k < s.k; ++k) {
          const double t = double(a.get(i, k)) * double(b.get(j, k));
          acc += t;
          aa += std::fabs(t);
        }
        if (s.bias) acc += bias.get(0, j), aa += std::fabs(bias.get(0, j));
        want[size_t(i * s.n + j)] = acc;
        absdot[size_t(i * s.n + j)] = aa;
      }
  }

  Problem problem(DeviceType bt) const {
    Problem p;
    p.op = OpKind::gemm;
    p.device = Device{bt, 0};
    p.in_dtype = s.in;
    p.out_dtype = s.out;
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.has_bias = s.bias;
    return p;
  }
  LaunchArgs args(bool with_ws = true) const {
    LaunchArgs la;
    la.data[kGemmArgA] = da.get();
    la.ld[kGemmArgA] = s.k + s.lda_pad;
    la.data[kGemmArgB] = db.get();
    la.ld[kGemmArgB] = s.k;
    la.data[kGemmArgD] = dd.get();
    la.ld[kGemmArgD] = s.n + s.ldd_pad;
    la.data[kGemmArgBias] = s.bias ? dbias.get() : nullptr;
    la.workspace = with_ws ? ws.get() : nullptr;
    la.workspace_bytes = with_ws ? ws_for(s) : 0;
    return la;
  }
  void poison() {
    d.poison_all();
    REQUIRE(dd.upload(d).ok());
  }
  /// "" when D matches the reference (and the padding kept its poison).
  std::string mismatch() {
    if (Status st = dd.download(&d); !st.ok()) return "download: " + st.to_string();
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < d.ld; ++j) {
        const std::string where = "[" + std::to_string(i) + "," + std::to_string(j) + "]";
        if (j >= s.n) {
          if (!d.is_poison(i, j)) return where + " (row padding) was written";
          continue;
        }
        if (d.is_poison(i, j)) return where + " left unwritten";
        const double w = want[size_t(i * s.n + j)];
        const double g = d.get(i, j);
        // One ulp of the output format at the value (the fp32 sum rounds
        // once, either way of a boundary) + fp32 summation-order slack.
        int e = 0;
        std::frexp(std::max(std::fabs(w), 1e-30), &e);
        const double ulp = s.out == DType::fp32   ? std::ldexp(1.0, e - 24)
                           : s.out == DType::bf16 ? std::ldexp(1.0, e - 8)
                                                  : std::ldexp(1.0, e - 11);
        const double tol = ulp + 2e-6 * absdot[size_t(i * s.n + j)] + 1e-30;
        if (!(std::fabs(g - w) <= tol))
          return where + " got " + std::to_string(g) + " want " + std::to_string(w) + " (tol " + std::to_string(tol) +
                 ")";
      }
    }
    return {};
  }
};

const GemmShape kShapes[] = {
    {1, 8, 8},
    {1, 4096, 4096},
    {3, 24, 40, 8, 0, true},
    {7, 1280, 8192},
    {16, 136, 264, 0, 8, true},
    {17, 264, 136, 16, 0, false, DType::fp32},
    {77, 4104, 1024, 0, 0, true},
    {300, 130, 264, 8, 6},
    {1000, 8, 40},
    {256, 512, 1024, 0, 0, true, DType::fp32},
    {5, 100, 4095},  // odd K: cuBLASLt and the reference only
    {2, 1000, 4104, 0, 0, false, DType::fp16, DType::fp16},
    {130, 264, 512, 0, 0, true, DType::fp32, DType::fp16},
    // M 9..16 (two 8-row tiles of A) on the decode families: bias and padded
    // strides, N not a multiple of any row tile, fp32 output.
    {16, 1032, 4096, 8, 8, true},
    {12, 2056, 2048, 0, 0, false, DType::fp32},
    {9, 1280, 8192, 0, 0, true},
    // The wgmma family's persistent loop: more 128 x BLOCK_SIZE_N tiles than
    // SMs at both BLOCK_SIZE_N (18 x 9 = 162, 18 x 17 = 306 > 132), so a block
    // walks several tiles and the mbarrier ring's phases carry across them;
    // 18 M-tiles cross a GROUP_SIZE_M group of 8 and of 16 (a partial last
    // group); K = 200 is no multiple of 64 (a zero-filled K-tile tail); an
    // odd ldd (2057) takes the scalar store path (d_vec2 = 0).
    {2200, 2056, 200, 8, 1, true},
};

}  // namespace

TEST_CASE("gpu gemm: every variant, every point and every cuBLASLt candidate matches the float64 reference") {
  for (DeviceType bt : usable_backends()) {
    const DeviceInfo& dev = dev_of(bt);
    std::mt19937 rng(11);
    int points = 0, lt_candidates = 0;
    for (const GemmShape& sh : kShapes) {
      GemmCase c(bt, sh, rng);
      const Problem p = c.problem(bt);
      int accepted = 0;
      for (const VariantDef* v : dispatch::core::variants_for(OpKind::gemm, bt)) {
        if (v->in_dtype != sh.in) continue;
        std::vector<Plan> pts = dispatch::core::config_space(*v, p, dev);
        if (v->params.empty()) {
          Plan pl;
          pl.variant = v;
          pts = {pl};
        }
        if (v->flags & dispatch::core::kVariantDynamicSpace) lt_candidates += int(pts.size());
        for (const Plan& pl : pts) {
          INFO(text(sh), " ", dispatch::core::plan_to_string(pl));
          c.poison();
          const Status st = v->launch(c.args(), p, pl.params);
          REQUIRE_MESSAGE(st.ok(), st.to_string());
          CHECK(c.mismatch() == "");
          ++points;
          ++accepted;
        }
      }
      CHECK(accepted >= 2);  // at least one family and the reference
    }
    MESSAGE(dispatch::device_type_name(bt), ": ", points, " (variant, point, shape) runs checked, ", lt_candidates,
            " of them cuBLASLt candidates");
    if (bt == DeviceType::cuda) CHECK(lt_candidates > 0);
  }
}

TEST_CASE("gpu gemm: get_default serves every shape, at minimum alignment and with a misaligned A") {
  for (DeviceType bt : usable_backends()) {
    const DeviceInfo& dev = dev_of(bt);
    std::mt19937 rng(5);
    for (const GemmShape& sh : kShapes) {
      GemmCase c(bt, sh, rng);
      Problem p = c.problem(bt);
      const Plan plan = dispatch::core::get_default(p, dev);
      REQUIRE(plan.valid());
      INFO(text(sh), " ", dispatch::core::plan_to_string(plan));
      c.poison();
      // get_default's plan needs no workspace.
      const Status st = plan.variant->launch(c.args(false), p, plan.params);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      CHECK(c.mismatch() == "");
    }
  }
}

TEST_CASE("gpu gemm: the op through a Runtime: aligned, misaligned A, no workspace; fallbacks stay correct") {
  for (DeviceType bt : usable_backends()) {
    auto rt = dispatch::Runtime::create([] {
      dispatch::RuntimeOptions o;
      o.load_shipped_configs = false;
      o.log_level = dispatch::LogLevel::off;
      return o;
    }());
    REQUIRE(rt.ok());
    std::mt19937 rng(9);
    const Device d{bt, 0};
    for (size_t a_off : {size_t{0}, size_t{2}}) {  // 2 bytes: A one bf16 element off 16-byte alignment
      for (const GemmShape& sh :
           {GemmShape{4, 4096, 4096, 0, 0, true}, GemmShape{64, 1280, 8192}, GemmShape{33, 136, 264, 8, 8}}) {
        GemmCase c(bt, sh, rng, a_off);
        c.poison();
        const LaunchArgs la = c.args(false);
        dispatch::GemmArgs g{
            dispatch::make_tensor_2d(la.data[kGemmArgA], sh.in, sh.m, sh.k, la.ld[kGemmArgA], d),
            dispatch::make_tensor_2d(la.data[kGemmArgB], sh.in, sh.n, sh.k, la.ld[kGemmArgB], d),
            dispatch::make_tensor_2d(la.data[kGemmArgD], sh.out, sh.m, sh.n, la.ld[kGemmArgD], d),
            sh.bias ? dispatch::make_tensor_1d(la.data[kGemmArgBias], sh.out, sh.n, d) : dispatch::TensorRef{}};
        dispatch::DispatchInfo info;
        dispatch::CallOptions opts;
        opts.info = &info;
        const Status st = dispatch::gemm(**rt, g, dispatch::Stream{nullptr}, opts);
        INFO(text(sh), " a_offset=", a_off);
        REQUIRE_MESSAGE(st.ok(), st.to_string());
        MESSAGE(text(sh), " a_offset=", a_off, ": ", std::string(info.variant));
        CHECK(c.mismatch() == "");
        if (a_off != 0) {
          // Misaligned A: never a 16-byte vector family.
          const std::string v = info.variant;
          CHECK(v.find("skinny") == std::string::npos);
          CHECK(v.find("tiled") == std::string::npos);
        }
      }
    }
  }
}

#if KDISPATCH_HAVE_CUDA
TEST_CASE("gpu gemm: cuBLASLt round trip: heuristic -> JSON -> table -> the same result, bit for bit") {
  if (!dispatch::backends::find(DeviceType::cuda) || !dispatch::backends::find(DeviceType::cuda)->status().available)
    return;
  const DeviceType bt = DeviceType::cuda;
  const DeviceInfo& dev = dev_of(bt);
  const VariantDef* lt = dispatch::core::find_variant("gemm_bf16__cublaslt");
  REQUIRE(lt != nullptr);
  const fs::path dir = fs::temp_directory_path() / ("kd-gemm-roundtrip-" + std::to_string(::getpid()));
  std::mt19937 rng(21);
  int checked = 0;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{4096, 4096}, {1280, 8192}, {8192, 1024}}) {
    for (int64_t m : {1, 16, 128, 1024}) {
      GemmCase c(bt, GemmShape{m, n, k}, rng);
      const Problem p = c.problem(bt);
      const std::vector<Plan> cands = dispatch::core::config_space(*lt, p, dev);
      REQUIRE(!cands.empty());
      for (const Plan& pl : cands) {
        INFO("M=", m, " N=", n, " K=", k, " ", dispatch::core::plan_to_string(pl));
        // Direct launch of the heuristic's algorithm.
        c.poison();
        REQUIRE(lt->launch(c.args(), p, pl.params).ok());
        REQUIRE(c.mismatch() == "");
        const std::vector<uint32_t> direct = c.d.bits;
        // To a config file, through a Runtime's loader, out of its table.
        fs::remove_all(dir);
        fs::create_directories(dir / "cuda" / "gemm");
        std::string row = "{\"" + std::to_string(m) + "\": {\"variant\": \"gemm_bf16__cublaslt\"";
        const dispatch::Config cfg = dispatch::core::plan_to_config(pl);
        for (const auto& [name, value] : cfg)
          if (name != "variant") row += ", \"" + name + "\": " + std::to_string(value.i);
        row += "}}\n";
        const std::string file = "N=" + std::to_string(n) + ",K=" + std::to_string(k) +
                                 ",device_name=" + dev.device_name + ",dtype=bf16.json";
        std::ofstream(dir / "cuda" / "gemm" / file) << row;
        auto rt = dispatch::Runtime::create([&] {
          dispatch::RuntimeOptions o;
          o.load_shipped_configs = false;
          o.config_dirs = {dir.string()};
          o.log_level = dispatch::LogLevel::off;
          return o;
        }());
        REQUIRE(rt.ok());
        const auto rep = (*rt)->load_report();
        REQUIRE(rep.files.size() == 1u);
        std::string problems;
        for (const std::string& pr : rep.files[0].problems) problems += pr + "; ";
        CHECK_MESSAGE(rep.files[0].problems.empty(), problems);
        REQUIRE((*rt)->attach_stream(Device{bt, 0}, dispatch::Stream{nullptr}).ok());
        const LaunchArgs la = c.args(false);
        const Device d{bt, 0};
        dispatch::GemmArgs g{dispatch::make_tensor_2d(la.data[kGemmArgA], DType::bf16, m, k, la.ld[kGemmArgA], d),
                             dispatch::make_tensor_2d(la.data[kGemmArgB], DType::bf16, n, k, la.ld[kGemmArgB], d),
                             dispatch::make_tensor_2d(la.data[kGemmArgD], DType::bf16, m, n, la.ld[kGemmArgD], d),
                             dispatch::TensorRef{}};
        dispatch::DispatchInfo info;
        dispatch::CallOptions opts;
        opts.info = &info;
        c.poison();
        const Status st = dispatch::gemm(**rt, g, dispatch::Stream{nullptr}, opts);
        REQUIRE_MESSAGE(st.ok(), st.to_string());
        CHECK(info.source == dispatch::PlanSource::table);
        CHECK(std::string(info.variant) == "gemm_bf16__cublaslt");
        REQUIRE(c.mismatch() == "");
        CHECK(c.d.bits == direct);
        ++checked;
      }
    }
  }
  fs::remove_all(dir);
  MESSAGE(checked, " cuBLASLt heuristic results round-tripped through a config file");
}
#endif
