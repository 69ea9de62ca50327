// SPDX-License-Identifier: Apache-2.0
// fused_moe_fp8_tensor and fused_moe_fp8_channel on the CPU, beyond what
// every op gets from tests/test_ops.cpp (every variant against the float64
// reference, the key round trip, pretune, the C ABI's refusals): results
// worked by hand for static and dynamic scales in both layouts and an
// expert that is not local, the grouped variant equal to the reference bit
// for bit, a1_scale without a2_scale refused by name, the key, and
// SGLang's fp8_w8a8 files (real ones, ../shared/data) shaping the default.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api/engine_rows.hpp"
#include "backends/registry.hpp"
#include "core/numeric.hpp"
#include "core/routing.hpp"
#include "dispatch/dispatch.hpp"
#include "ops/specs.hpp"
#include "test_util.hpp"

using namespace dispatch;

namespace {

// E = 2 experts, H = 2, I = 1, one token x = (2, -1) routed to both
// (weights 0.75, 0.25). Expert 0: w1 = [[1, 0], [0, 1]] (gate x0, up x1),
// w2 = [[1], [2]]; expert 1: w1 = [[0, 1], [1, 0]], w2 = [[-1], [0.5]]
// (all exact in e4m3fn). x is exact under a1_scale 1 and under the dynamic
// scale 2 / 448 (codes 448, -224).
struct Tiny {
  std::vector<float> hidden{2.f, -1.f};
  std::vector<uint8_t> w1, w2;
  std::vector<float> tw{0.75f, 0.25f};
  std::vector<int32_t> ids{0, 1};
  std::vector<float> out{std::nanf(""), std::nanf("")};
  std::vector<float> s1, s2, a1{1.f}, a2{1.f};
  Tiny() {
    for (float v : {1.f, 0.f, 0.f, 1.f, 0.f, 1.f, 1.f, 0.f}) w1.push_back(core::float_to_fp8(v, core::kE4m3fn, true));
    for (float v : {1.f, 2.f, -1.f, 0.5f}) w2.push_back(core::float_to_fp8(v, core::kE4m3fn, true));
  }
  /// The call; channel: w1_scale [2, 2] and w2_scale [2, 2], else [2] each.
  FusedMoeFp8Args args(std::vector<float> w1_scale, std::vector<float> w2_scale, bool channel, bool stat) {
    s1 = std::move(w1_scale), s2 = std::move(w2_scale);
    FusedMoeFp8Args a;
    a.hidden = make_tensor_2d(hidden.data(), DType::fp32, 1, 2, 2);
    a.w1 = kdtest::tensor_3d(w1.data(), DType::fp8_e4m3fn, 2, 2, 2);
    a.w2 = kdtest::tensor_3d(w2.data(), DType::fp8_e4m3fn, 2, 2, 1);
    a.topk_weights = make_tensor_2d(tw.data(), DType::fp32, 1, 2, 2);
    a.topk_ids = make_tensor_2d(ids.data(), DType::int32, 1, 2, 2);
    a.out = make_tensor_2d(out.data(), DType::fp32, 1, 2, 2);
    a.w1_scale = channel ? make_tensor_2d(s1.data(), DType::fp32, 2, 2, 2) : make_tensor_1d(s1.data(), DType::fp32, 2);
    a.w2_scale = channel ? make_tensor_2d(s2.data(), DType::fp32, 2, 2, 2) : make_tensor_1d(s2.data(), DType::fp32, 2);
    if (stat) {
      a.a1_scale = make_tensor_1d(a1.data(), DType::fp32, 1);
      a.a2_scale = make_tensor_1d(a2.data(), DType::fp32, 1);
    }
    return a;
  }
};

bool near(const std::vector<float>& got, std::initializer_list<double> want) {
  if (got.size() != want.size()) return false;
  size_t i = 0;
  for (double w : want)
    if (!(std::fabs(got[i++] - w) <= 1e-5 * std::fabs(w))) return false;
  return true;
}

std::unique_ptr<Runtime> quiet_runtime() {
  RuntimeOptions o = kdtest::options_for({});
  o.tune.mode = TuneMode::off;
  return kdtest::make_runtime(o);
}

double silu(double g) { return g / (1.0 + std::exp(-g)); }

}  // namespace

TEST_CASE("fused_moe_fp8: per-tensor and per-channel, static and dynamic scales, worked by hand") {
  auto rt = quiet_runtime();
  // Expert 0: h = (2, -1), a = silu(2) * -1 = -1.7616; expert 1: h = (-1, 2),
  // a = silu(-1) * 2 = -0.5379.
  const double a0 = -silu(2.0), a1 = 2.0 * silu(-1.0);
  {
    // Static, scales 1: q2(a0) = -1.75, q2(a1) = -0.5625 (the nearest codes).
    // w2_scale (2, 4): y = 0.75 * 2 * (-1.75, -3.5) + 0.25 * 4 * (0.5625, -0.28125).
    Tiny t;
    FusedMoeFp8TensorArgs g{t.args({1.f, 1.f}, {2.f, 4.f}, false, true)};
    const Status st = fused_moe_fp8_tensor(*rt, g);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    CHECK(near(t.out, {-2.0625, -5.53125}));
  }
  {
    // Dynamic per tensor: the intermediate's scale is |a0| / 448, so a0 is
    // exact and a1 / scale = -136.8 takes the code -144.
    Tiny t;
    FusedMoeFp8TensorArgs g{t.args({1.f, 1.f}, {2.f, 4.f}, false, false)};
    const Status st = fused_moe_fp8_tensor(*rt, g);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    const double q1 = -144.0 * -a0 / 448.0;
    CHECK(near(t.out, {0.75 * 2 * a0 + 0.25 * 4 * -q1, 0.75 * 2 * 2 * a0 + 0.25 * 4 * 0.5 * q1}));
  }
  {
    // Per channel, dynamic per token and per pair (each pair's own scale:
    // exact). w1_scale [[1, 0.5], [1, 1]]: expert 0's up row halved, a =
    // silu(2) * -0.5; w2_scale [[1, 10], [100, 1000]].
    Tiny t;
    FusedMoeFp8ChannelArgs g{t.args({1.f, 0.5f, 1.f, 1.f}, {1.f, 10.f, 100.f, 1000.f}, true, false)};
    const Status st = fused_moe_fp8_channel(*rt, g);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    const double h0 = a0 / 2;
    CHECK(near(t.out, {0.75 * h0 + 0.25 * 100 * -a1, 0.75 * 20 * h0 + 0.25 * 1000 * 0.5 * a1}));
    // Expert 1 not local (expert parallelism): expert 0's share alone.
    t.ids = {0, -1};
    const Status st2 = fused_moe_fp8_channel(*rt, g);
    REQUIRE_MESSAGE(st2.ok(), st2.to_string());
    CHECK(near(t.out, {0.75 * h0, 0.75 * 20 * h0}));
  }
  {
    // routed_scaling_factor and a static a1_scale of 1/64 (x * 64 = 128,
    // -64: exact) beside a2_scale 1.
    Tiny t;
    t.a1 = {1.f / 64};
    FusedMoeFp8TensorArgs g{t.args({1.f, 1.f}, {2.f, 4.f}, false, true)};
    g.routed_scaling_factor = 2.5f;
    const Status st = fused_moe_fp8_tensor(*rt, g);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    CHECK(near(t.out, {2.5 * -2.0625, 2.5 * -5.53125}));
  }
}

TEST_CASE("fused_moe_fp8: the grouped variant equals the reference bit for bit, both layouts, static and dynamic") {
  const int64_t M = 21, H = 48, I = 24, E = 5, K = 2;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f), pos(0.5f, 2.f);
  std::vector<float> hidden(static_cast<size_t>(M * H)), tw(static_cast<size_t>(M * K)),
      s1(static_cast<size_t>(E * 2 * I)), s2(static_cast<size_t>(E * H)), a1{0.01f}, a2{0.02f};
  std::vector<uint8_t> w1(static_cast<size_t>(E * 2 * I * H)), w2(static_cast<size_t>(E * H * I));
  for (float& x : hidden) x = u(rng);
  for (auto* w : {&w1, &w2})
    for (uint8_t& x : *w) x = core::float_to_fp8(u(rng), core::kE4m3fn, true);
  for (auto* s : {&s1, &s2})
    for (float& x : *s) x = pos(rng);
  std::vector<int32_t> ids(static_cast<size_t>(M * K));
  core::fill_expert_ids(ids.data(), M, K, K, E, core::Routing::skewed, rng);
  core::fill_routing_weights(tw.data(), M, K, K, rng);
  ids[3] = -1;  // a choice whose expert is not local
  for (const bool channel : {false, true})
    for (const bool stat : {false, true}) {
      const std::string op = channel ? "fused_moe_fp8_channel" : "fused_moe_fp8_tensor";
      std::vector<std::vector<float>> outs;
      for (const std::string v : {"__ref", "__grouped:BLOCK_M=1", "__grouped:BLOCK_M=16"}) {
        const std::string force = op + "=" + op + "_fp8_e4m3fn" + v;
        CAPTURE(force);
        RuntimeOptions ro = kdtest::options_for({});
        ro.tune.mode = TuneMode::off;
        ro.force = {force};
        auto frt = kdtest::make_runtime(ro);
        std::vector<float> out(static_cast<size_t>(M * H), std::nanf(""));
        FusedMoeFp8Args a;
        a.hidden = make_tensor_2d(hidden.data(), DType::fp32, M, H, H);
        a.w1 = kdtest::tensor_3d(w1.data(), DType::fp8_e4m3fn, E, 2 * I, H);
        a.w2 = kdtest::tensor_3d(w2.data(), DType::fp8_e4m3fn, E, H, I);
        a.topk_weights = make_tensor_2d(tw.data(), DType::fp32, M, K, K);
        a.topk_ids = make_tensor_2d(ids.data(), DType::int32, M, K, K);
        a.out = make_tensor_2d(out.data(), DType::fp32, M, H, H);
        a.w1_scale = channel ? make_tensor_2d(s1.data(), DType::fp32, E, 2 * I, 2 * I)
                             : make_tensor_1d(s1.data(), DType::fp32, E);
        a.w2_scale =
            channel ? make_tensor_2d(s2.data(), DType::fp32, E, H, H) : make_tensor_1d(s2.data(), DType::fp32, E);
        if (stat) {
          a.a1_scale = make_tensor_1d(a1.data(), DType::fp32, 1);
          a.a2_scale = make_tensor_1d(a2.data(), DType::fp32, 1);
        }
        DispatchInfo info;
        CallOptions o;
        o.info = &info;
        const Status st = channel ? fused_moe_fp8_channel(*frt, FusedMoeFp8ChannelArgs{a}, {}, o)
                                  : fused_moe_fp8_tensor(*frt, FusedMoeFp8TensorArgs{a}, {}, o);
        REQUIRE_MESSAGE(st.ok(), st.to_string());
        CHECK(force.find(std::string(info.variant)) != std::string::npos);
        for (float x : out) REQUIRE(std::isfinite(x));
        outs.push_back(out);
      }
      for (size_t i = 1; i < outs.size(); ++i)
        CHECK(std::memcmp(outs[i].data(), outs[0].data(), outs[0].size() * sizeof(float)) == 0);
    }
}

TEST_CASE("fused_moe_fp8: a1_scale without a2_scale is refused by name, and the key says a_scale=static") {
  auto rt = quiet_runtime();
  Tiny t;
  FusedMoeFp8TensorArgs g{t.args({1.f, 1.f}, {2.f, 4.f}, false, true)};
  g.a2_scale = TensorRef{};
  Status st = fused_moe_fp8_tensor(*rt, g);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK(st.message() == "a2_scale: missing: a1_scale is given, and the two come together (static scales)");
  g = FusedMoeFp8TensorArgs{t.args({1.f, 1.f}, {2.f, 4.f}, false, true)};
  g.a1_scale = TensorRef{};
  st = fused_moe_fp8_tensor(*rt, g);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK(st.message() == "a2_scale: given without a1_scale: the two come together (static scales)");
  // The channel op's [E, H] w2_scale given to the tensor op: refused by name
  // (w2's operands are checked first: they bind I).
  FusedMoeFp8TensorArgs bad{t.args({1.f, 1.f, 1.f, 1.f}, {2.f, 4.f}, true, false)};
  st = fused_moe_fp8_tensor(*rt, bad);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK(st.message() == "w2_scale: must be rank 1, got rank 2");

  DispatchInfo info;
  std::string key;
  info.key = &key;
  CallOptions o;
  o.info = &info;
  FusedMoeFp8ChannelArgs c{t.args({1.f, 1.f, 1.f, 1.f}, {1.f, 1.f, 1.f, 1.f}, true, true)};
  st = fused_moe_fp8_channel(*rt, c, {}, o);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(std::string(info.variant) == "fused_moe_fp8_channel_fp8_e4m3fn__grouped");
  CHECK(key == "cpu/fused_moe_fp8_channel|" + cpu_device_info().device_name +
                   "|E=2,K=2,N=1,a_scale=static,dtype=fp8_e4m3fn,out_dtype=fp32,top_k=2");
}

TEST_CASE("fused_moe_fp8: SGLang's fp8_w8a8 and per_channel_quant=True files (shared data) are the ops' engine rows") {
  // The engine key of each op's problem on an H200 ...
  auto engine = [](core::OpKind op, int64_t E, int64_t I) {
    core::Problem p;
    p.op = op;
    p.device = Device{DeviceType::cuda, 0};
    p.in_dtype = DType::fp8_e4m3fn, p.out_dtype = DType::bf16;
    p.m = 64, p.n = I, p.k = 4096, p.extra[0] = E, p.extra[1] = 8;
    char buf[160];
    const size_t n = api::engine_key(core::spec_of(op), p, "NVIDIA_H200", buf, sizeof buf);
    return std::string(buf, n);
  };
  const std::string tensor = engine(core::OpKind::fused_moe_fp8_tensor, 8, 7168);
  const std::string channel = engine(core::OpKind::fused_moe_fp8_channel, 161, 192);
  CHECK(tensor == "triton/triton_fused_moe|NVIDIA_H200|E=8,N=7168,dtype=fp8_w8a8");
  CHECK(channel == "triton/triton_fused_moe|NVIDIA_H200|E=161,N=192,dtype=fp8_w8a8,per_channel_quant=True");
  // ... is the key of SGLang's real files (Mixtral-8x7B at TP2 per tensor;
  // E = 161, N = 192 per channel), whose rows the loader reads: the files'
  // BLOCK_SIZE_M at these M, by hand.
  RuntimeOptions o = kdtest::options_for({kdtest::moe_dir().string()});
  o.backend_version = "3.5.1";
  o.tune.mode = TuneMode::off;
  auto rt = kdtest::make_runtime(o);
  struct Want {
    const char* fields;
    int64_t M, block_size_m;
    const std::string* key;
  };
  const Want wants[] = {{"E=8,N=7168,dtype=fp8_w8a8", 1, 64, &tensor},
                        {"E=8,N=7168,dtype=fp8_w8a8", 4096, 128, &tensor},
                        {"E=161,N=192,dtype=fp8_w8a8,per_channel_quant=True", 8, 16, &channel},
                        {"E=161,N=192,dtype=fp8_w8a8,per_channel_quant=True", 1024, 64, &channel}};
  for (const Want& w : wants) {
    CAPTURE(w.fields);
    CAPTURE(w.M);
    auto r = lookup(*rt, kdtest::query(w.fields, "NVIDIA H200", w.M));
    REQUIRE_MESSAGE(r.ok(), r.status().to_string());
    CHECK(r->match == LookupResult::Match::exact);
    CHECK(r->key == *w.key);
    REQUIRE(config_find(r->config, "BLOCK_SIZE_M") != nullptr);
    CHECK(config_find(r->config, "BLOCK_SIZE_M")->i == w.block_size_m);
  }
}

TEST_CASE("fused_moe_fp8: an SGLang row shapes the default where kdispatch has none, and says so") {
  kdtest::TempDir dir;
  const std::string dev = cpu_device_info().device_name;
  for (const char* suffix : {"", ",per_channel_quant=True"})
    kdtest::write_text(dir / ("E=2,N=1,device_name=" + dev + ",dtype=fp8_w8a8" + suffix + ".json"),
                       R"({"1": {"BLOCK_SIZE_M": 16, "num_warps": 4}, "64": {"BLOCK_SIZE_M": 64, "num_warps": 4}})");
  RuntimeOptions opt = kdtest::options_for({dir.str()});
  opt.tune.mode = TuneMode::off;
  auto rt = kdtest::make_runtime(opt);
  for (const bool channel : {false, true}) {
    Tiny t;
    DispatchInfo info;
    CallOptions o;
    o.info = &info;
    const Status st =
        channel
            ? fused_moe_fp8_channel(
                  *rt,
                  FusedMoeFp8ChannelArgs{t.args(std::vector<float>(4, 1.f), std::vector<float>(4, 1.f), true, true)},
                  {}, o)
            : fused_moe_fp8_tensor(*rt, FusedMoeFp8TensorArgs{t.args({1.f, 1.f}, {1.f, 1.f}, false, true)}, {}, o);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    CHECK(info.source == PlanSource::fallback);
    CHECK(std::string(info.k_source) == "sglang file without K");
    CHECK(info.table_m == 1);
    CHECK(
        kdtest::contains(rt->source_path(info.source_id), channel ? "per_channel_quant=True" : "dtype=fp8_w8a8.json"));
  }
  // The block-fp8 op's file of the same E and N is not theirs: a plain default.
  kdtest::TempDir other;
  kdtest::write_text(other / ("E=2,N=1,device_name=" + dev + ",dtype=fp8_w8a8,block_shape=[128, 128].json"),
                     R"({"1": {"BLOCK_SIZE_M": 16, "num_warps": 4}})");
  RuntimeOptions opt2 = kdtest::options_for({other.str()});
  opt2.tune.mode = TuneMode::off;
  auto rt2 = kdtest::make_runtime(opt2);
  Tiny t;
  DispatchInfo info;
  CallOptions o;
  o.info = &info;
  REQUIRE(fused_moe_fp8_tensor(*rt2, FusedMoeFp8TensorArgs{t.args({1.f, 1.f}, {1.f, 1.f}, false, false)}, {}, o).ok());
  CHECK(std::string(info.k_source).empty());
  CHECK(info.table_m == -1);
}

// The CUDA composition (kernels/gpu/fused_moe_compose.hpp): each GEMM on
// moe_gemm_fp8_<layout>'s get_default, the sort in blocks of the plan's
// block_m (16 at decode, 128 from 16 pairs an expert; SGLang's BLOCK_SIZE_M
// maps onto it), c1 zeroed for the dynamic per-tensor scale; its declines
// name the sub-op, and its workspace is its parts.
TEST_CASE("fused_moe_fp8: the CUDA composition serves both layouts, its workspace is its parts") {
  const core::VariantDef* t = core::find_variant("fused_moe_fp8_tensor_fp8_e4m3fn__compose");
  const core::VariantDef* c = core::find_variant("fused_moe_fp8_channel_fp8_e4m3fn__compose");
  if (t == nullptr || c == nullptr) return;  // no CUDA backend in this build
  const DeviceInfo dev = cpu_device_info();  // not a probed GPU: supports() checks the problem alone
  // Mixtral-8x7B TP2: E 8, top_k 2, H 4096, I 7168.
  auto moe = [](int64_t m, core::OpKind op, bool stat = false) {
    core::Problem p;
    p.op = op;
    p.device = Device{DeviceType::cuda, 0};
    p.in_dtype = DType::fp8_e4m3fn, p.out_dtype = DType::bf16, p.has_bias = stat;
    p.m = m, p.n = 7168, p.k = 4096, p.extra[0] = 8, p.extra[1] = 2;
    p.align_bytes = 16;
    return p;
  };
  constexpr core::OpKind kT = core::OpKind::fused_moe_fp8_tensor, kC = core::OpKind::fused_moe_fp8_channel;
  auto served = [&](const core::Problem& p) {
    const core::Plan plan = core::get_default(p, dev);
    return plan.valid() ? std::string(plan.variant->name) : std::string("none");
  };
  CHECK(served(moe(1, kT)) == "fused_moe_fp8_tensor_fp8_e4m3fn__compose");
  CHECK(served(moe(4096, kT, true)) == "fused_moe_fp8_tensor_fp8_e4m3fn__compose");
  CHECK(served(moe(1, kC)) == "fused_moe_fp8_channel_fp8_e4m3fn__compose");
  core::Problem gelu = moe(1, kT);
  gelu.choice = 1;
  CHECK(kdtest::contains(t->supports(gelu, nullptr, dev).message(), "silu only"));
  core::Problem f32 = moe(1, kC);
  f32.out_dtype = DType::fp32;
  CHECK(kdtest::contains(c->supports(f32, nullptr, dev).message(), "hidden and out must be bf16 on a GPU"));
  // M 1 (2 pairs), 256-byte parts, sized for every block_m (a binding sizes the call's workspace by the
  // default params; an engine row or a tuned row may take another): the largest, 128's, 2 + 2 * 127 = 256
  // sorted ids (1024 bytes), 2 expert ids, the total, dense topk_weights (256), then c1 [2, 14336],
  // c2 [2, 7168] and c3 [2, 4096] in bf16 (57344 + 28672 + 16384), then the larger of the two calls'
  // block-fp8 workspaces, each op's (the up call's: hidden's codes 4096, scales 128 -> 256, w_scale spread to
  // [8, 112, 32] fp32 114688, the amax 256).
  constexpr int64_t kM1 = 1024 + 3 * 256 + 57344 + 28672 + 16384 + 4096 + 256 + 114688 + 256;
  CHECK(c->workspace_bytes(moe(1, kC), nullptr) == kM1);
  CHECK(t->workspace_bytes(moe(1, kT), nullptr) == kM1);
  // M 64 (128 pairs = 16 an expert, blocks of 128): 128 + 8 * 127 = 1144 sorted ids (4608 bytes), 9 blocks,
  // dense topk_weights (512);
  // the down call's workspace is the larger: c2's codes [128, 7168], scales [128, 56], the spread
  // [8, 32, 56], the amax (917504 + 28672 + 57344 + 256).
  CHECK(t->workspace_bytes(moe(64, kT), nullptr) ==
        4608 + 256 + 256 + 512 + 3670016 + 1835008 + 1048576 + 917504 + 28672 + 57344 + 256);
  // The reference composition: moe_gemm_fp8's reference variants, the same parts.
  const core::VariantDef* r = core::find_variant("fused_moe_fp8_tensor_fp8_e4m3fn__cuda_ref");
  REQUIRE(r != nullptr);
  CHECK((r->flags & core::kVariantReference) != 0);
  CHECK(r->supports(moe(64, kT), nullptr, dev).ok());
  CHECK(r->workspace_bytes(moe(64, kT), nullptr) == t->workspace_bytes(moe(64, kT), nullptr));

  // The plan's block_m is the sort's block: get_default's 16 at M 1 and 128 from 16 pairs an expert;
  // the workspace does not depend on it (sized for every block_m, above).
  CHECK(core::get_default(moe(1, kT), dev).params[0] == 16);
  CHECK(core::get_default(moe(64, kT), dev).params[0] == 128);
  const int64_t b128[] = {128};
  CHECK(t->workspace_bytes(moe(1, kT), b128) == kM1);
  // SGLang's BLOCK_SIZE_M (an fp8_w8a8 file's row) maps onto it, the nearest compiled value.
  auto row = [](int64_t bm) { return Config{{"BLOCK_SIZE_M", ConfigValue::integer(bm)}}; };
  const core::Plan dflt = core::get_default(moe(4096, kT), dev);
  std::string why;
  const core::Plan got = api::shape_by_engine_row(core::spec_of(kT), dflt, row(64), moe(4096, kT), dev, &why);
  CHECK(got.variant == t);
  CHECK(got.params[0] == 64);
  CHECK(why == "; BLOCK_SIZE_M = 64 -> block_m = 64");
  CHECK(api::shape_by_engine_row(core::spec_of(kT), dflt, row(48), moe(4096, kT), dev, nullptr).params[0] == 32);
  CHECK(api::shape_by_engine_row(core::spec_of(kC), core::get_default(moe(1, kC), dev), row(256), moe(1, kC), dev,
                                 nullptr)
            .params[0] == 128);
}
