// SPDX-License-Identifier: Apache-2.0
// GPU moe_gemm kernels through a Runtime on device tensors: every variant
// (forced) and get_default against the spec's float64 reference
// (moe_gemm_spec::reference, the tolerance of the op's spec) on uniform
// and skewed routings aligned on the host (moe_align_spec::align), bf16,
// fp16 and block fp8 (CUDA), the up call (top_k 8, no routed weight) and
// the down call (top_k 1, routed weight), block sizes 1 .. 128, K not a
// multiple of 8 (the element-wise kernel only), an expert that is not
// local (zeros), padded a rows; out poisoned before each run, the rows of
// pairs the sort drops checked unwritten; each call given the workspace its
// variants take (block fp8's ring). Every variant must run. The per-tensor
// and per-channel fp8 ops (moe_gemm_fp8_*) on the same shapes and checks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backends/registry.hpp"
#include "core/routing.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "gpu_test_util.hpp"
#include "ops/moe_gemm.hpp"
#include "ops/moe_gemm_fp8.hpp"
#include "ops/specs.hpp"

namespace {

using namespace kdgpu;
using dispatch::Device;
using dispatch::Status;
namespace core = dispatch::core;
namespace spec = dispatch::core::moe_gemm_spec;

std::map<std::string, int> gemm_runs;

/// A contiguous rank-3 device tensor [batch, rows, cols].
dispatch::TensorRef tensor_3d(void* data, DType dt, int64_t batch, int64_t rows, int64_t cols, Device d) {
  dispatch::TensorRef t;
  t.data = data, t.dtype = dt, t.rank = 3, t.device = d;
  t.shape[0] = batch, t.shape[1] = rows, t.shape[2] = cols;
  t.strides[0] = rows * cols, t.strides[1] = cols, t.strides[2] = 1;
  return t;
}

/// A runtime serving `variant` for `op` ("" : get_default), no shipped configs.
auto runtime_for(const std::string& variant, std::string_view op = "moe_gemm") {
  dispatch::RuntimeOptions o;
  o.load_shipped_configs = false;
  o.log_level = dispatch::LogLevel::off;
  if (!variant.empty()) o.force = {std::string(op) + "=" + variant};
  return dispatch::Runtime::create(o);
}

struct GemmShape {
  int64_t M, N, K, E, top_k, bs;
  bool mul = false;
  bool skewed = false;
  int64_t lda_pad = 0;
  bool drop = false;       ///< the last pair's id -1: dropped by the sort, its out row unwritten
  bool not_local = false;  ///< expert_ids[0] = -1: its block's rows zeros
};

std::string text(const GemmShape& s) {
  return "M=" + std::to_string(s.M) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
         " E=" + std::to_string(s.E) + " top_k=" + std::to_string(s.top_k) + " bs=" + std::to_string(s.bs) +
         (s.mul ? " mul" : "") + (s.skewed ? " skewed" : "") + (s.drop ? " drop" : "") +
         (s.not_local ? " not_local" : "");
}

/// One call's host and device tensors, the problem and the reference:
/// moe_gemm, or (op) moe_gemm_fp8_tensor / _channel with a static a_scale
/// (`stat`) or a dynamic one.
struct GemmCase {
  GemmShape s;
  DType w, x;
  core::OpKind op;
  bool stat;
  core::Problem p;
  HostTensor a, wt, out, tw, ws, as;
  std::vector<int32_t> ids, sorted, experts, total{0};
  std::vector<double> want;  ///< [pairs * N]; NaN: a row left as it is
  GemmCase(DeviceType bt, const GemmShape& shape, DType wd, std::mt19937& rng,
           core::OpKind kind = core::OpKind::moe_gemm, bool static_scale = false)
      : s(shape), w(wd), op(kind), stat(static_scale) {
    x = w == DType::fp8_e4m3fn ? DType::bf16 : w;
    p.op = op, p.device = Device{bt, 0}, p.in_dtype = w, p.out_dtype = x;
    p.m = s.M, p.n = s.N, p.k = s.K, p.extra[0] = s.E, p.extra[1] = s.top_k, p.extra[2] = s.bs;
    p.has_bias = op == core::OpKind::moe_gemm ? w == DType::fp8_e4m3fn : stat;
    const int64_t P = s.M * s.top_k;
    a = HostTensor(x, s.M, s.K, s.K + s.lda_pad);
    a.fill_uniform(rng, -1.f, 1.f);
    wt = HostTensor(w, s.E * s.N, s.K, s.K);
    wt.fill_uniform(rng, w == DType::fp8_e4m3fn ? -400.f : -1.f, w == DType::fp8_e4m3fn ? 400.f : 1.f);
    ws = op == core::OpKind::moe_gemm_fp8_tensor ? HostTensor(DType::fp32, 1, s.E, s.E)
         : op == core::OpKind::moe_gemm_fp8_channel
             ? HostTensor(DType::fp32, s.E, s.N, s.N)
             : HostTensor(DType::fp32, s.E * ((s.N + 127) / 128), (s.K + 127) / 128, (s.K + 127) / 128);
    ws.fill_uniform(rng, 0.9f / 400.f, 1.1f / 400.f);
    as = HostTensor(DType::fp32, 1, 1, 1);
    as.set(0, 0, 1.2f / 448.f);  // a in [-1, 1]: codes up to 373, none clamped
    tw = HostTensor(DType::fp32, s.M, s.top_k, s.top_k);
    tw.fill_uniform(rng, 0.1f, 1.f);
    out = HostTensor(x, P, s.N, s.N);
    ids.resize(static_cast<size_t>(P));
    core::fill_expert_ids(ids.data(), s.M, s.top_k, s.top_k, s.E,
                          s.skewed ? core::Routing::skewed : core::Routing::uniform, rng);
    if (s.drop) ids.back() = -1;
    const core::Dims d = core::dims_of(p);
    sorted.resize(static_cast<size_t>(spec::sorted_extent(d.data())));
    experts.resize(static_cast<size_t>(spec::blocks_extent(d.data())));
    spec::fill_aligned(core::Fill::aligned_sorted, ids.data(), p, sorted.data());
    spec::fill_aligned(core::Fill::aligned_experts, ids.data(), p, experts.data());
    spec::fill_aligned(core::Fill::aligned_total, ids.data(), p, total.data());
    if (s.not_local) experts[0] = -1;
    reference();
  }
  void reference() {
    const int64_t P = s.M * s.top_k;
    auto dbl = [](const HostTensor& t) {
      std::vector<double> v(t.elems());
      for (int64_t r = 0; r < t.rows; ++r)
        for (int64_t c = 0; c < t.cols; ++c) v[size_t(r * t.ld + c)] = t.get(r, c);
      return v;
    };
    std::vector<double> da = dbl(a), dw = dbl(wt), dws = dbl(ws), dtw = dbl(tw);
    std::vector<double> ds(sorted.begin(), sorted.end()), de(experts.begin(), experts.end()), dt{double(total[0])};
    want.assign(size_t(P * s.N), std::nan(""));
    core::RefArgs r;
    r.data[core::kMoeGemmArgA] = da.data(), r.ld[core::kMoeGemmArgA] = a.ld;
    r.data[core::kMoeGemmArgW] = dw.data(), r.ld[core::kMoeGemmArgW] = wt.ld;
    r.data[core::kMoeGemmArgOut] = want.data(), r.ld[core::kMoeGemmArgOut] = s.N;
    r.data[core::kMoeGemmArgTopkWeights] = dtw.data(), r.ld[core::kMoeGemmArgTopkWeights] = s.top_k;
    r.data[core::kMoeGemmArgSorted] = ds.data();
    r.data[core::kMoeGemmArgExpertIds] = de.data();
    r.data[core::kMoeGemmArgTotal] = dt.data();
    if (w == DType::fp8_e4m3fn) r.data[core::kMoeGemmArgWScale] = dws.data(), r.ld[core::kMoeGemmArgWScale] = ws.ld;
    std::vector<double> das{double(as.get(0, 0))};
    if (stat) r.data[core::kMoeGemmArgAScale] = das.data();
    r.scalar[0] = float(s.top_k), r.scalar[1] = float(s.bs), r.scalar[2] = s.mul ? 1.f : 0.f;
    core::spec_of(op).reference(p, r);
  }
  /// Runs `variant` ("" = get_default) through the Runtime; "" when out
  /// matches the reference within the spec's tolerance and unlisted rows
  /// stay poisoned, else the first mismatch.
  std::string run(dispatch::tune::DeviceMemory* mem, const std::string& variant, std::string* served,
                  bool no_workspace = false) {
    auto rt = runtime_for(variant, core::op_name(op));
    if (!rt.ok()) return "runtime: " + rt.status().to_string();
    const Device d = p.device;
    DeviceBuffer da(mem, a.bytes()), dw(mem, wt.bytes()), dout(mem, out.bytes()), dtw(mem, tw.bytes()),
        dws(mem, ws.bytes()), dsorted(mem, sorted.size() * 4), dexp(mem, experts.size() * 4), dtot(mem, 4), das(mem, 4);
    REQUIRE(das.upload(as).ok());
    out.poison_all();
    REQUIRE(da.upload(a).ok());
    REQUIRE(dw.upload(wt).ok());
    REQUIRE(dout.upload(out).ok());
    REQUIRE(dtw.upload(tw).ok());
    REQUIRE(dws.upload(ws).ok());
    REQUIRE(mem->from_host(dsorted.get(), sorted.data(), sorted.size() * 4).ok());
    REQUIRE(mem->from_host(dexp.get(), experts.data(), experts.size() * 4).ok());
    REQUIRE(mem->from_host(dtot.get(), total.data(), 4).ok());
    dispatch::MoeGemmArgs g;
    g.a = dispatch::make_tensor_2d(da.get(), x, s.M, s.K, a.ld, d);
    g.w = tensor_3d(dw.get(), w, s.E, s.N, s.K, d);
    g.out = tensor_3d(dout.get(), x, s.M, s.top_k, s.N, d);
    g.topk_weights = dispatch::make_tensor_2d(dtw.get(), DType::fp32, s.M, s.top_k, s.top_k, d);
    g.sorted_token_ids = dispatch::make_tensor_1d(dsorted.get(), DType::int32, int64_t(sorted.size()), d);
    g.expert_ids = dispatch::make_tensor_1d(dexp.get(), DType::int32, int64_t(experts.size()), d);
    g.num_tokens_post_pad = dispatch::make_tensor_1d(dtot.get(), DType::int32, 1, d);
    if (w == DType::fp8_e4m3fn)
      g.w_scale = tensor_3d(dws.get(), DType::fp32, s.E, (s.N + 127) / 128, (s.K + 127) / 128, d);
    if (op == core::OpKind::moe_gemm_fp8_tensor) g.w_scale = dispatch::make_tensor_1d(dws.get(), DType::fp32, s.E, d);
    if (op == core::OpKind::moe_gemm_fp8_channel)
      g.w_scale = dispatch::make_tensor_2d(dws.get(), DType::fp32, s.E, s.N, s.N, d);
    g.top_k = int32_t(s.top_k), g.block_size = int32_t(s.bs), g.mul_routed_weight = s.mul ? 1 : 0;
    dispatch::MoeGemmFp8Args f8;
    static_cast<dispatch::MoeGemmArgs&>(f8) = g;
    if (stat) f8.a_scale = dispatch::make_tensor_1d(das.get(), DType::fp32, 1, d);
    dispatch::DispatchInfo info;
    dispatch::CallOptions o;
    o.info = &info;
    // What the op's variants take (block fp8's ring: a quantised once); 0 for the others.
    const int64_t need = no_workspace ? 0 : core::max_workspace_bytes(p);
    DeviceBuffer dwork(mem, size_t(need > 0 ? need : 1));
    o.workspace = need > 0 ? dwork.get() : nullptr, o.workspace_bytes = need;
    const Status st =
        op == core::OpKind::moe_gemm_fp8_tensor
            ? dispatch::moe_gemm_fp8_tensor(**rt, dispatch::MoeGemmFp8TensorArgs{f8}, dispatch::Stream{nullptr}, o)
        : op == core::OpKind::moe_gemm_fp8_channel
            ? dispatch::moe_gemm_fp8_channel(**rt, dispatch::MoeGemmFp8ChannelArgs{f8}, dispatch::Stream{nullptr}, o)
            : dispatch::moe_gemm(**rt, g, dispatch::Stream{nullptr}, o);
    if (!st.ok()) return "call: " + st.to_string();
    *served = info.variant;
    if (Status sd = dout.download(&out); !sd.ok()) return "download: " + sd.to_string();
    double ref_max = 0.0;
    for (double v : want)
      if (!std::isnan(v)) ref_max = std::max(ref_max, std::fabs(v));
    const core::Tolerance tol = core::tolerance_of(core::spec_of(op), p, x);
    for (int64_t r = 0; r < out.rows; ++r)
      for (int64_t c = 0; c < s.N; ++c) {
        const double wv = want[size_t(r * s.N + c)];
        if (std::isnan(wv)) {
          if (!out.is_poison(r, c)) return "row " + std::to_string(r) + " written, no block lists it";
          continue;
        }
        const double got = out.get(r, c);
        if (!(std::fabs(got - wv) <= tol.atol_rel * ref_max + tol.rtol * std::fabs(wv)))
          return "out[" + std::to_string(r) + ", " + std::to_string(c) + "] = " + std::to_string(got) + ", want " +
                 std::to_string(wv);
      }
    return "";
  }
};

std::vector<GemmShape> gemm_shapes() {
  return {
      {1, 256, 512, 128, 8, 16},                               // decode, Qwen3-30B-like up (scaled down)
      {4, 96, 128, 8, 2, 4, true},                             // down-like, routed weight
      {16, 2 * 96, 256, 8, 1, 64, true, true},                 // skewed, top_k 1 (SGLang's down call)
      {3, 40, 36, 4, 2, 1, false, false, 8, true},             // K % 8 != 0 (element-wise), padded a, a drop
      {33, 130, 384, 16, 4, 16, true, false, 0, false, true},  // N past a tile, a block not local
      // ring: one 64-position item a block (bs 64), row tiles 128 + 32, K 200 (a partial 128-byte
      // chunk, 2 row tiles a block), a drop and a block not local
      {48, 160, 200, 4, 4, 64, true, false, 8, true, true},
      // ring: 2 wide items a block (bs 128), the second of padding only where an expert has <= 64 pairs
      {40, 160, 200, 4, 4, 128, true},
      // ring: 2 32-position items a block (bs 48), the second partial, skewed
      {24, 96, 136, 6, 3, 48, false, true},
      // block fp8's ring too (N and K multiples of 128): skewed with the routed weight; padded a
      // rows, a drop and a block not local (every dtype runs them)
      {64, 256, 384, 8, 4, 32, true, true},
      {40, 384, 256, 4, 2, 16, false, false, 8, true, true},
      // wgmma (the sort's block_size 128): N past a 256-column tile (256 wide), K past a 64 K-tile,
      // skewed, padded a rows, the routed weight, a drop and a block not local; then 128 wide with
      // whole consumer halves of padding
      {300, 640, 264, 8, 4, 128, true, true, 8, true, true},
      {130, 160, 512, 4, 2, 128},
      // wgmma's persistent loop: 264 sorted blocks x 2 tiles of 256 columns > 132 SMs, so a block
      // walks several tiles (phases carried, live, dead-half and non-local tiles in a row), K 72
      {4096, 512, 72, 8, 8, 128, true, false, 0, true, true},
      // block fp8's wgmma too (K a multiple of 128): 128 sorted blocks (top_k = E: 2048 pairs an
      // expert) x 2 tiles of 128 columns > 132 SMs, two K-tiles (scale groups), the routed weight, a
      // drop and a block not local
      {2048, 256, 256, 8, 8, 128, true, false, 0, true, true},
      // wgmma at the sort's block_size 64 (a tile's halves two sorted blocks: of two experts where an
      // expert's block count is odd, two B boxes; a non-local half beside a local one): N 576 past a
      // 128-column tile, skewed, padded a rows, a drop; then
      // top_k < E with ~512 pairs an expert: ~140 blocks, ~70 tiles x 2 > 132 SMs (phases carried)
      {300, 576, 384, 8, 4, 64, true, true, 8, true, true},
      {2048, 256, 256, 16, 4, 64, true, false, 0, true, true},
  };
}

}  // namespace

TEST_CASE("gpu moe_gemm: every variant and get_default against the float64 reference, both calls, both routings") {
  if (!why_no_gpu().empty()) return;
  for (DeviceType bt : usable_backends()) {
    dispatch::tune::DeviceMemory* mem = core::backend_memory(bt);
    REQUIRE(mem != nullptr);
    std::mt19937 rng(35);
    std::vector<DType> dts{DType::bf16, DType::fp16};
    if (bt == DeviceType::cuda) dts.push_back(DType::fp8_e4m3fn);
    for (DType w : dts)
      for (const GemmShape& s : gemm_shapes()) {
        GemmCase c(bt, s, w, rng);
        for (const core::VariantDef* v : dispatch::core::variants_for(core::OpKind::moe_gemm, bt)) {
          if (v->in_dtype != w) continue;
          // split_vec and ring load 16 bytes: K a multiple of 8 and 16-byte rows of a, w and out (else
          // they decline: the H100 run of 2026-12-06 showed N = 130 bf16 and K = 200 fp8 declining).
          const auto xb = static_cast<int64_t>(dispatch::dtype_size(c.x)),
                     wb = static_cast<int64_t>(dispatch::dtype_size(w));
          const bool element_only =
              s.K % 8 != 0 || (s.K * wb) % 16 != 0 || (c.a.ld * xb) % 16 != 0 || (s.N * xb) % 16 != 0;
          if (element_only && std::string(v->name).find("split_vec") != std::string::npos) continue;
          const bool ring_declines =
              element_only || s.N % 32 != 0 || (w == DType::fp8_e4m3fn && (s.N % 128 != 0 || s.K % 128 != 0));
          if (ring_declines && std::string(v->name).find("ring") != std::string::npos) continue;
          const bool wgmma_declines =
              element_only || (s.bs != 128 && s.bs != 64) || (w == DType::fp8_e4m3fn && s.K % 128 != 0);
          if (wgmma_declines && std::string(v->name).find("wgmma") != std::string::npos) continue;
          std::string served;
          INFO(text(s), " ", dispatch::dtype_name(w), " ", v->name);
          CHECK(c.run(mem, std::string(v->name), &served) == "");
          CHECK(served == v->name);
          ++gemm_runs[std::string(v->name)];
          // Block fp8's ring and wgmma given no workspace (the C entry point's case): the split kernels, correct.
          if (w == DType::fp8_e4m3fn && (std::string(v->name).find("ring") != std::string::npos ||
                                         std::string(v->name).find("wgmma") != std::string::npos))
            CHECK(c.run(mem, std::string(v->name), &served, true) == "");
        }
        std::string served;
        INFO(text(s), " ", dispatch::dtype_name(w), " default");
        CHECK(c.run(mem, "", &served) == "");
        CHECK(served.find("_ref") == std::string::npos);
      }
    for (const core::VariantDef* v : dispatch::core::variants_for(core::OpKind::moe_gemm, bt)) {
      INFO(v->name);
      CHECK(gemm_runs[std::string(v->name)] > 0);
    }
  }
}

// SGLang's per-tensor and per-channel fp8 (moe_gemm_fp8_tensor / _channel,
// CUDA): every variant (forced) and get_default, static and dynamic
// activation scales, on the shapes above (the up and down calls, K not a
// multiple of 8, padded a rows, a drop, a block not local; the tensor op's
// ring and wgmma: block fp8's kernels on the spread scales, their
// persistent loops), each call given the workspace its variants take and,
// for the dynamic per-tensor split, none (refused by name); the dynamic
// per-channel default with none (the split kernels' in-kernel row scales).
TEST_CASE("gpu moe_gemm_fp8: per-tensor and per-channel, static and dynamic, every variant against the reference") {
  if (!why_no_gpu().empty()) return;
  const std::vector<DeviceType> backends = usable_backends();
  if (std::find(backends.begin(), backends.end(), DeviceType::cuda) == backends.end()) return;
  dispatch::tune::DeviceMemory* mem = core::backend_memory(DeviceType::cuda);
  REQUIRE(mem != nullptr);
  std::mt19937 rng(36);
  std::map<std::string, int> runs;
  const std::vector<GemmShape> shapes = gemm_shapes();
  for (core::OpKind op : {core::OpKind::moe_gemm_fp8_tensor, core::OpKind::moe_gemm_fp8_channel})
    for (bool stat : {true, false})
      for (const GemmShape& s : shapes) {
        GemmCase c(DeviceType::cuda, s, DType::fp8_e4m3fn, rng, op, stat);
        // (w's fp8 rows are K bytes: 16-byte rows need K a multiple of 16, else split_vec declines)
        const bool element_only = s.K % 16 != 0 || (c.a.ld * 2) % 16 != 0 || (s.N * 2) % 16 != 0;
        for (const core::VariantDef* v : dispatch::core::variants_for(op, DeviceType::cuda)) {
          const std::string name(v->name);
          if (element_only && name.find("split_vec") != std::string::npos) continue;
          // The tensor op on block fp8's kernels: the ring N and K multiples of 128, wgmma K and
          // the sort's block_size 64 or 128.
          if ((element_only || s.N % 128 != 0 || s.K % 128 != 0) && name.find("ring") != std::string::npos) continue;
          if ((element_only || s.K % 128 != 0 || (s.bs != 64 && s.bs != 128)) &&
              name.find("wgmma") != std::string::npos)
            continue;
          std::string served;
          INFO(text(s), " ", core::op_name(op), stat ? " static " : " dynamic ", v->name);
          CHECK(c.run(mem, std::string(v->name), &served) == "");
          CHECK(served == v->name);
          ++runs[std::string(v->name)];
        }
        std::string served;
        INFO(text(s), " ", core::op_name(op), stat ? " static" : " dynamic", " default");
        CHECK(c.run(mem, "", &served) == "");
        CHECK(served.find("_ref") == std::string::npos);
        if (op == core::OpKind::moe_gemm_fp8_tensor && !stat)
          CHECK(c.run(mem, "", &served, true).find("takes the call's workspace") != std::string::npos);
        if (op == core::OpKind::moe_gemm_fp8_channel && !stat)  // no workspace: each row's scale in the kernel
          CHECK(c.run(mem, "", &served, true) == "");
      }
  for (core::OpKind op : {core::OpKind::moe_gemm_fp8_tensor, core::OpKind::moe_gemm_fp8_channel})
    for (const core::VariantDef* v : dispatch::core::variants_for(op, DeviceType::cuda)) {
      INFO(v->name);
      CHECK(runs[std::string(v->name)] > 0);
    }
}
