// SPDX-License-Identifier: Apache-2.0
// fused_moe on the CPU, beyond what every op gets from tests/test_ops.cpp
// (every variant and config point against the float64 reference, the key
// round trip, pretune, the C ABI's refusals): results worked by hand (silu
// and gelu, routed_scaling_factor, an expert that is not local), the
// grouped variant equal to the reference bit for bit, the errors that name
// the argument (block scales with the wrong weights, a strided expert
// batch, an activation outside its labels), the key a call builds and the
// stride field over all eight operands.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api/engine_rows.hpp"
#include "core/numeric.hpp"
#include "core/routing.hpp"
#include "dispatch/dispatch.hpp"
#include "backends/registry.hpp"
#include "ops/specs.hpp"
#include "store/filename.hpp"
#include "test_util.hpp"

using namespace dispatch;

namespace {

std::unique_ptr<Runtime> quiet_runtime() {
  RuntimeOptions o = kdtest::options_for({});
  o.tune.mode = TuneMode::off;
  return kdtest::make_runtime(o);
}

// E = 2 experts, H = 2, I = 1: expert 0 w1 = [[1, 0], [0, 1]] (gate, up),
// w2 = [[1], [2]]; expert 1 w1 = [[0, 1], [1, 0]], w2 = [[-1], [0.5]].
// One token x = [1, 2] routed to both, weights 0.75 and 0.25.
struct Tiny {
  std::vector<float> hidden{1.f, 2.f};
  std::vector<float> w1{1.f, 0.f, 0.f, 1.f, 0.f, 1.f, 1.f, 0.f};
  std::vector<float> w2{1.f, 2.f, -1.f, 0.5f};
  std::vector<float> tw{0.75f, 0.25f};
  std::vector<int32_t> ids{0, 1};
  std::vector<float> out{std::nanf(""), std::nanf("")};
  FusedMoeArgs args(float rsf = 1.f, int32_t act = 0) {
    FusedMoeArgs a;
    a.hidden = make_tensor_2d(hidden.data(), DType::fp32, 1, 2, 2);
    a.w1 = kdtest::tensor_3d(w1.data(), DType::fp32, 2, 2, 2);
    a.w2 = kdtest::tensor_3d(w2.data(), DType::fp32, 2, 2, 1);
    a.topk_weights = make_tensor_2d(tw.data(), DType::fp32, 1, 2, 2);
    a.topk_ids = make_tensor_2d(ids.data(), DType::int32, 1, 2, 2);
    a.out = make_tensor_2d(out.data(), DType::fp32, 1, 2, 2);
    a.routed_scaling_factor = rsf;
    a.activation = act;
    return a;
  }
};

/// Runs t's call on rt and returns what served it (the call must succeed).
DispatchInfo served_info(Runtime& rt, Tiny& t) {
  DispatchInfo info;
  CallOptions o;
  o.info = &info;
  REQUIRE(fused_moe(rt, t.args(), {}, o).ok());
  return info;
}

}  // namespace

TEST_CASE("fused_moe: results worked by hand: silu, gelu, routed_scaling_factor, an expert not local") {
  auto rt = quiet_runtime();
  // silu(1) = 0.7310585786, silu(2) = 1.7615941560: expert 0 gives a =
  // 2 silu(1) = 1.4621171573, y0 = [1.4621171573, 2.9242343145]; expert 1
  // a = silu(2) * 1, y1 = [-1.7615941560, 0.8807970780]; out = 0.75 y0 + 0.25 y1.
  Tiny t;
  REQUIRE(fused_moe(*rt, t.args()).ok());
  CHECK(t.out[0] == doctest::Approx(0.6561893289).epsilon(1e-6));
  CHECK(t.out[1] == doctest::Approx(2.4133750054).epsilon(1e-6));
  // DeepSeek's routed_scaling_factor scales the sum.
  REQUIRE(fused_moe(*rt, t.args(2.f)).ok());
  CHECK(t.out[0] == doctest::Approx(1.3123786578).epsilon(1e-6));
  CHECK(t.out[1] == doctest::Approx(4.8267500108).epsilon(1e-6));
  // gelu (erf): gelu(1) = 0.8413447461, gelu(2) = 1.9544997361.
  REQUIRE(fused_moe(*rt, t.args(2.f, 1)).ok());
  CHECK(t.out[0] == doctest::Approx(1.5467843702).epsilon(1e-6));
  CHECK(t.out[1] == doctest::Approx(5.5366934104).epsilon(1e-6));
  // Expert 1 not local (id -1, expert parallelism): only expert 0's share.
  t.ids[1] = -1;
  REQUIRE(fused_moe(*rt, t.args(2.f)).ok());
  CHECK(t.out[0] == doctest::Approx(2.1931757359).epsilon(1e-6));
  CHECK(t.out[1] == doctest::Approx(4.3863514718).epsilon(1e-6));
  // An id past E contributes nothing either (never read out of bounds).
  t.ids[1] = 7;
  REQUIRE(fused_moe(*rt, t.args(2.f)).ok());
  CHECK(t.out[0] == doctest::Approx(2.1931757359).epsilon(1e-6));
}

TEST_CASE("fused_moe: the grouped variant (pairs sorted by expert) equals the reference bit for bit") {
  const int64_t M = 33, H = 40, I = 24, E = 6, K = 3;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> hidden(static_cast<size_t>(M * H)), w1(static_cast<size_t>(E * 2 * I * H)),
      w2(static_cast<size_t>(E * H * I)), tw(static_cast<size_t>(M * K));
  for (auto* v : {&hidden, &w1, &w2})
    for (float& x : *v) x = u(rng);
  std::vector<int32_t> ids(static_cast<size_t>(M * K));
  core::fill_expert_ids(ids.data(), M, K, K, E, core::Routing::skewed, rng);
  core::fill_routing_weights(tw.data(), M, K, K, rng);
  std::vector<std::vector<float>> outs;
  for (const std::string force :
       {"fused_moe=fused_moe_fp32__ref", "fused_moe=fused_moe_fp32__grouped:BLOCK_M=1",
        "fused_moe=fused_moe_fp32__grouped:BLOCK_M=4", "fused_moe=fused_moe_fp32__grouped:BLOCK_M=16"}) {
    CAPTURE(force);
    RuntimeOptions ro = kdtest::options_for({});
    ro.tune.mode = TuneMode::off;
    ro.force = {force};
    auto frt = kdtest::make_runtime(ro);
    std::vector<float> out(static_cast<size_t>(M * H), std::nanf(""));
    FusedMoeArgs a;
    a.hidden = make_tensor_2d(hidden.data(), DType::fp32, M, H, H);
    a.w1 = kdtest::tensor_3d(w1.data(), DType::fp32, E, 2 * I, H);
    a.w2 = kdtest::tensor_3d(w2.data(), DType::fp32, E, H, I);
    a.topk_weights = make_tensor_2d(tw.data(), DType::fp32, M, K, K);
    a.topk_ids = make_tensor_2d(ids.data(), DType::int32, M, K, K);
    a.out = make_tensor_2d(out.data(), DType::fp32, M, H, H);
    DispatchInfo info;
    CallOptions o;
    o.info = &info;
    REQUIRE(fused_moe(*frt, a, {}, o).ok());
    CHECK(force.find(std::string(info.variant)) != std::string::npos);
    outs.push_back(out);
  }
  REQUIRE(outs.size() == 4);
  for (size_t i = 1; i < outs.size(); ++i)
    CHECK(std::memcmp(outs[i].data(), outs[0].data(), outs[0].size() * sizeof(float)) == 0);
}

TEST_CASE("fused_moe: errors name the argument: block scales, a strided expert batch, the activation, top_k") {
  auto rt = quiet_runtime();
  Tiny t;
  // fp8 weights without their block scales; fp32 weights with scales.
  std::vector<uint8_t> w1q(8, 0x38), w2q(4, 0x38);
  std::vector<float> s1(2, 1.f), s2(2, 1.f);
  FusedMoeArgs a = t.args();
  a.w1 = kdtest::tensor_3d(w1q.data(), DType::fp8_e4m3fn, 2, 2, 2);
  a.w2 = kdtest::tensor_3d(w2q.data(), DType::fp8_e4m3fn, 2, 2, 1);
  Status s = fused_moe(*rt, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "w1_scale: missing: w1 is fp8_e4m3fn, whose block scales it is");
  a.w1_scale = kdtest::tensor_3d(s1.data(), DType::fp32, 2, 1, 1);
  a.w2_scale = kdtest::tensor_3d(s2.data(), DType::fp32, 2, 1, 1);
  CHECK(fused_moe(*rt, a).ok());  // block fp8, as SGLang lays it out
  a = t.args();
  a.w1_scale = kdtest::tensor_3d(s1.data(), DType::fp32, 2, 1, 1);
  s = fused_moe(*rt, a);
  CHECK(s.message() == "w1_scale: given, but w1 is fp32: scales go with fp8 weights only");
  // A strided expert batch (every other expert of a larger stack) is refused, named.
  std::vector<float> big(16, 0.f);
  a = t.args();
  a.w1 = kdtest::tensor_3d(big.data(), DType::fp32, 2, 2, 2);
  a.w1.strides[0] = 8;
  s = fused_moe(*rt, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().rfind("w1: batch stride 8 must be rows * row stride = 4", 0) == 0);
  // An activation outside its labels.
  s = fused_moe(*rt, t.args(1.f, 2));
  CHECK(s.message() == "activation: must be one of 0 (silu), 1 (gelu), got 2");
  CHECK(fused_moe(*rt, t.args(0.f)).message().rfind("routed_scaling_factor: must be > 0", 0) == 0);
  // A fractional activation is refused, never truncated to a label (0.5 is not silu).
  {
    const float sc[2] = {1.f, 0.5f};
    std::vector<TensorRef> ts;
    const FusedMoeArgs f = t.args();
    for (const TensorRef* r : {&f.hidden, &f.w1, &f.w2, &f.topk_weights, &f.topk_ids, &f.out, &f.w1_scale, &f.w2_scale})
      ts.push_back(*r);
    s = call_op(*rt, "fused_moe", ts, sc);
    CHECK(s.message() == "activation: must be one of 0 (silu), 1 (gelu), got 0.5");
  }
  // bf16 activations with fp32 weights: no variant computes it, refused (never run on the wrong bits).
  {
    std::vector<uint16_t> hb(2, 0x3f80), ob(2, 0);
    a = t.args();
    a.hidden = make_tensor_2d(hb.data(), DType::bf16, 1, 2, 2);
    a.out = make_tensor_2d(ob.data(), DType::bf16, 1, 2, 2);
    s = fused_moe(*rt, a);
    CHECK(s.code() == StatusCode::unsupported_problem);
    CHECK(ob[0] == 0);
  }
  // topk_ids with another top_k than topk_weights; w2 of another I than w1.
  a = t.args();
  a.topk_ids = make_tensor_2d(t.ids.data(), DType::int32, 2, 1, 1);
  s = fused_moe(*rt, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().rfind("topk_ids: shape [2, 1]", 0) == 0);
  a = t.args();
  a.w1 = kdtest::tensor_3d(t.w1.data(), DType::fp32, 2, 1, 2);
  s = fused_moe(*rt, a);
  CHECK(s.message().rfind("w1: shape [2, 1, 2] must be [E, 2*I, H] = [2, 2, 2]", 0) == 0);
}

TEST_CASE("fused_moe: a call's key, its file name, and the stride field over all eight operands") {
  auto rt = quiet_runtime();
  Tiny t;
  std::string key;
  DispatchInfo info;
  info.key = &key;
  CallOptions o;
  o.info = &info;
  REQUIRE(fused_moe(*rt, t.args(1.f, 1), {}, o).ok());
  const std::string dev = cpu_device_info().device_name;
  CHECK(key == "cpu/fused_moe|" + dev + "|E=2,K=2,N=1,activation=gelu,dtype=fp32,top_k=2");
  auto f = store::parse_key_fields("E=2,K=2,N=1,activation=gelu,dtype=fp32,top_k=2");
  REQUIRE(f.ok());
  auto p = store::own_problem_from_fields(core::OpKind::fused_moe, *f);
  REQUIRE(p.ok());
  CHECK(p->extra[0] == 2);
  CHECK(p->extra[1] == 2);
  CHECK(p->choice == 1);
  CHECK(
      store::own_file_name(core::OpKind::fused_moe, "E=2,K=2,N=1,activation=gelu,dtype=fp32,top_k=2", "NVIDIA_H200") ==
      "E=2,N=1,K=2,top_k=2,device_name=NVIDIA_H200,activation=gelu,dtype=fp32.json");
  // A broadcast hidden (row stride 0, one token's activations for three
  // rows): its class enters the key, every other operand's too.
  std::vector<float> out3(6), tw3(6, 0.5f);
  std::vector<int32_t> ids3{0, 1, 1, 0, 0, 1};
  FusedMoeArgs a = t.args();
  a.hidden = make_tensor_2d(t.hidden.data(), DType::fp32, 3, 2, 0);
  a.topk_weights = make_tensor_2d(tw3.data(), DType::fp32, 3, 2, 2);
  a.topk_ids = make_tensor_2d(ids3.data(), DType::int32, 3, 2, 2);
  a.out = make_tensor_2d(out3.data(), DType::fp32, 3, 2, 2);
  REQUIRE(fused_moe(*rt, a, {}, o).ok());
  CHECK(key == "cpu/fused_moe|" + dev + "|E=2,K=2,N=1,dtype=fp32,stride=01_o1_o1_o1_o1_o1_o1_o1,top_k=2");
  for (int r = 0; r < 3; ++r)
    CHECK(out3[static_cast<size_t>(2 * r + 1)] == doctest::Approx(0.5 * (2.9242343145 + 0.8807970780)).epsilon(1e-6));
  auto f2 = store::parse_key_fields("E=2,K=2,N=1,dtype=fp32,stride=01_o1_o1_o1_o1_o1_o1_o1,top_k=2");
  REQUIRE(f2.ok());
  auto p2 = store::own_problem_from_fields(core::OpKind::fused_moe, *f2);
  REQUIRE_MESSAGE(p2.ok(), p2.status().to_string());
  CHECK(core::stride_class(p2->stride_code, 0, 0, 2) == StrideClass::zero);
  CHECK(core::stride_class(p2->stride_code, 7, 1, 3) == StrideClass::unit);
  // Four operands are not eight: refused, saying what it wants.
  auto f3 = store::parse_key_fields("E=2,K=2,N=1,dtype=fp32,stride=01_o1_o1_o1,top_k=2");
  REQUIRE(f3.ok());
  auto p3 = store::own_problem_from_fields(core::OpKind::fused_moe, *f3);
  REQUIRE_FALSE(p3.ok());
  CHECK(kdtest::contains(p3.status().message(), "is not 8 operands"));
}

TEST_CASE("fused_moe: workspace_bytes covers every variant of a backend at the largest M, and the host takes none") {
  const std::string key = "E=8,K=64,N=32,dtype=bf16,top_k=2";
  auto cpu = workspace_bytes("fused_moe", key, 16, DeviceType::cpu);
  REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
  CHECK(*cpu == 0);
  auto cuda = workspace_bytes("fused_moe", key, 16, DeviceType::cuda);
  REQUIRE_MESSAGE(cuda.ok(), cuda.status().to_string());
  if (core::variants_for(core::OpKind::fused_moe, DeviceType::cuda).empty()) {
    CHECK(*cuda == 0);  // no CUDA backend in this build
  } else {
    // M * top_k = 32 pairs: the wgmma composition's (fused_moe_compose.hpp)
    // moe_align buffers for blocks of 128 (1048 sorted ids: 4352 bytes, 9
    // expert ids and the total: 256 each), dense topk_weights (128 -> 256) and its
    // bf16 intermediates c1 [32, 64], c2 [32, 32] and c3 [32, 64] (4096 + 2048 +
    // 4096): 15360, more than the
    // expert-grouped kernels' 12304, the per-pair kernels' 4096 and the
    // tensor-core ones' 11008.
    CHECK(*cuda == 15360);
  }
  // The same problem as a call's tensors (no data: descriptors only), as a
  // binding sizes the workspace it allocates for one call: the same bytes.
  const Device gpu{DeviceType::cuda, 0};
  std::vector<TensorRef> t(8);
  t[0] = make_tensor_2d(nullptr, DType::bf16, 16, 64, 64, gpu);  // hidden [M, H]
  t[1] = kdtest::tensor_3d(nullptr, DType::bf16, 8, 64, 64);     // w1 [E, 2I, H]
  t[2] = kdtest::tensor_3d(nullptr, DType::bf16, 8, 64, 32);     // w2 [E, H, I]
  t[1].device = t[2].device = gpu;
  t[3] = make_tensor_2d(nullptr, DType::fp32, 16, 2, 2, gpu);    // topk_weights
  t[4] = make_tensor_2d(nullptr, DType::int32, 16, 2, 2, gpu);   // topk_ids
  t[5] = make_tensor_2d(nullptr, DType::bf16, 16, 64, 64, gpu);  // out
  auto of_call = workspace_bytes("fused_moe", t, std::vector<float>{1.f, 0.f});
  REQUIRE_MESSAGE(of_call.ok(), of_call.status().to_string());
  CHECK(*of_call == *cuda);
  for (TensorRef& x : t) x.device = Device{};
  auto host_call = workspace_bytes("fused_moe", t, std::vector<float>{1.f, 0.f});
  REQUIRE_MESSAGE(host_call.ok(), host_call.status().to_string());
  CHECK(*host_call == 0);
  t[4].dtype = DType::fp32;  // ids must be int32: the op's own sentence
  auto bad_ids = workspace_bytes("fused_moe", t, std::vector<float>{1.f, 0.f});
  REQUIRE_FALSE(bad_ids.ok());
  CHECK(kdtest::contains(bad_ids.status().message(), "topk_ids"));
  // A workspace int64 cannot hold saturates (it never wraps to a small number
  // a short buffer would pass): 65536 tokens x top-32768 x I = 2^30.
  auto huge = workspace_bytes("fused_moe", "E=1,K=8,N=1073741824,dtype=bf16,top_k=32768", 65536, DeviceType::cuda);
  REQUIRE_MESSAGE(huge.ok(), huge.status().to_string());
  CHECK(*huge == (core::variants_for(core::OpKind::fused_moe, DeviceType::cuda).empty() ? 0 : INT64_MAX));
  auto bad = workspace_bytes("fused_moe", "E=8,N=32,dtype=bf16,top_k=2", 16, DeviceType::cuda);
  REQUIRE(!bad.ok());
  CHECK(bad.status().code() == StatusCode::invalid_argument);
  CHECK(bad.status().message().find("K") != std::string::npos);
}

TEST_CASE("fused_moe: an SGLang row shapes the default where kdispatch has none, and says so (k_source)") {
  kdtest::TempDir dir;
  const std::string dev = cpu_device_info().device_name;
  const std::string file = "E=2,N=1,device_name=" + dev + ".json";
  kdtest::write_text(dir / file,
                     R"({"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,)"
                     R"( "num_warps": 4, "num_stages": 3},)"
                     R"( "64": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,)"
                     R"( "num_warps": 4, "num_stages": 3}})");
  RuntimeOptions opt = kdtest::options_for({dir.str()});
  opt.tune.mode = TuneMode::off;
  auto rt = kdtest::make_runtime(opt);
  Tiny t;
  const DispatchInfo info = served_info(*rt, t);
  // Still get_default's variant (the CPU's have no block_m): a default that
  // names the SGLang row (M = 1 of that file) and what it does not know.
  CHECK(info.source == PlanSource::fallback);
  CHECK(std::string(info.k_source) == "sglang file without K");
  CHECK(info.table_m == 1);
  CHECK(kdtest::contains(rt->source_path(info.source_id), file));
  CHECK(t.out[1] == doctest::Approx(2.4133750054).epsilon(1e-6));  // the worked result above

  LookupQuery q;
  q.op = "fused_moe";
  q.key = "E=2,K=2,N=1,dtype=fp32,top_k=2";
  q.device = dev;
  q.M = 40;
  auto r = lookup(*rt, q);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->match == LookupResult::Match::fallback);
  CHECK(r->engine_key == "triton/triton_fused_moe|" + dev + "|E=2,N=1");
  CHECK(r->engine_m == 64);  // nearest to 40
  CHECK(r->k_source == "sglang file without K");
  REQUIRE(config_find(r->engine_config, "BLOCK_SIZE_M") != nullptr);
  CHECK(config_find(r->engine_config, "BLOCK_SIZE_M")->i == 64);
  CHECK(kdtest::contains(r->why,
                         "; BLOCK_SIZE_M = 64 maps to block_m, which " + r->variant + " does not have: not used"));
  const std::string json = lookup_result_to_json(*r);
  INFO(json);
  CHECK(kdtest::contains(json, R"("engine_row": {"key": "triton/triton_fused_moe|)"));
  CHECK(kdtest::contains(json, R"("k_source": "sglang file without K")"));

  // A row of fused_moe's own key (with K and top_k) beside SGLang's file outranks it.
  kdtest::write_text(
      dir / "cpu" / "fused_moe" / store::own_file_name(core::OpKind::fused_moe, "E=2,K=2,N=1,dtype=fp32,top_k=2", dev),
      R"({"kdispatch": {"tool": "kdispatch 0.1.0"}, "1": {"variant": "fused_moe_fp32__ref"}})");
  auto own = kdtest::make_runtime(opt);
  const DispatchInfo info3 = served_info(*own, t);
  CHECK(info3.source == PlanSource::table);
  CHECK(std::string(info3.variant) == "fused_moe_fp32__ref");
  CHECK(std::string(info3.k_source).empty());

  // Without the file: a plain default, no engine row named.
  auto plain = kdtest::make_runtime([] {
    RuntimeOptions p = kdtest::options_for({});
    p.tune.mode = TuneMode::off;
    return p;
  }());
  const DispatchInfo info2 = served_info(*plain, t);
  CHECK(std::string(info2.k_source).empty());
  CHECK(info2.table_m == -1);
}

TEST_CASE("fused_moe: SGLang's BLOCK_SIZE_M maps onto the CUDA tensor-core plans' block_m, the nearest value") {
  const core::VariantDef* bf16 = core::find_variant("fused_moe_bf16__mma");
  const core::VariantDef* fp8 = core::find_variant("fused_moe_fp8_e4m3fn__mma");
  if (bf16 == nullptr || fp8 == nullptr) return;  // no CUDA backend in this build
  const core::OpSpec& spec = core::spec_of(core::OpKind::fused_moe);
  // SGLang's key of a call: E and N = I, block fp8 with its block_shape and dtype.
  core::Problem p;
  p.op = core::OpKind::fused_moe;
  p.device = Device{DeviceType::cuda, 0};
  p.in_dtype = p.out_dtype = DType::bf16;
  p.m = 256, p.n = 768, p.k = 2048, p.extra[0] = 128, p.extra[1] = 8;
  p.align_bytes = 16;
  char buf[128];
  size_t n = api::engine_key(spec, p, "NVIDIA_H200", buf, sizeof buf);
  CHECK(std::string(buf, n) == "triton/triton_fused_moe|NVIDIA_H200|E=128,N=768");
  core::Problem q = p;
  q.in_dtype = DType::fp8_e4m3fn, q.has_bias = true, q.extra[0] = 257, q.n = 256, q.k = 7168;
  n = api::engine_key(spec, q, "NVIDIA_H200", buf, sizeof buf);
  CHECK(std::string(buf, n) == "triton/triton_fused_moe|NVIDIA_H200|E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8");
  CHECK(api::engine_key(spec, q, "NVIDIA_H200", buf, 40) == 0);  // does not fit: no key

  const DeviceInfo dev = cpu_device_info();  // not a probed GPU: supports() checks the problem alone
  auto row = [](int64_t bm) {
    return Config{{"BLOCK_SIZE_M", ConfigValue::integer(bm)}, {"num_warps", ConfigValue::integer(4)}};
  };
  const core::Plan narrow{bf16, {1, 32}};
  std::string why;
  core::Plan got = api::shape_by_engine_row(spec, narrow, row(128), p, dev, &why);
  CHECK(got.params[0] == 1);
  CHECK(got.params[1] == 64);
  CHECK(why == "; BLOCK_SIZE_M = 128 -> block_m = 64 (the nearest compiled value)");
  CHECK(api::shape_by_engine_row(spec, narrow, row(16), p, dev, nullptr).params[1] == 32);
  CHECK(api::shape_by_engine_row(spec, narrow, row(48), p, dev, nullptr).params[1] == 32);  // a tie: the smaller
  CHECK(api::shape_by_engine_row(spec, core::Plan{bf16, {1, 64}}, row(32), p, dev, nullptr).params[1] == 32);
  // The direct kernels (staged = false) have no wide items: the default's plan serves.
  why.clear();
  got = api::shape_by_engine_row(spec, core::Plan{bf16, {0, 32}}, row(64), p, dev, &why);
  CHECK(got.params[1] == 32);
  CHECK(kdtest::contains(why, "; fused_moe_bf16__mma declines that: "));
  CHECK(kdtest::contains(why, "block_m = 64 (items of 64 pairs) runs on the bf16/fp16 ring kernels only"));
  CHECK(kdtest::contains(why, "; the default's plan serves"));
  // Block fp8: 32-pair items only.
  CHECK(api::shape_by_engine_row(spec, core::Plan{fp8, {1, 32}}, row(64), q, dev, nullptr).params[1] == 32);
  // A row without the field: the default's value.
  why.clear();
  got = api::shape_by_engine_row(spec, narrow, Config{{"num_warps", ConfigValue::integer(4)}}, p, dev, &why);
  CHECK(got.params[1] == 32);
  CHECK(why == "; the row has no integer BLOCK_SIZE_M: block_m stays");
}

// A sync tune of such a call serves its own new row at once: no engine row
// named then (the attack of 2026-12-06 found k_source kept).
TEST_CASE("fused_moe: a sync tune beside an SGLang row serves its own row, k_source empty") {
  kdtest::TempDir dir, cache;
  const std::string dev = cpu_device_info().device_name;
  kdtest::write_text(dir / ("E=2,N=1,device_name=" + dev + ".json"), R"({"1": {"BLOCK_SIZE_M": 64, "num_warps": 4}})");
  RuntimeOptions opt = kdtest::options_for({dir.str()});
  opt.tune.mode = TuneMode::sync;
  opt.tune.cache_dir = cache.str();
  opt.tune.time_budget_ms = 20;
  opt.tune.cold_cache = false;
  auto rt = kdtest::make_runtime(opt);
  Tiny t;
  const DispatchInfo info = served_info(*rt, t);
  CHECK(info.tuned_now);
  CHECK(info.source == PlanSource::table);
  CHECK(std::string(info.k_source).empty());
  CHECK(t.out[1] == doctest::Approx(2.4133750054).epsilon(1e-6));
}

// The CUDA composition on moe_gemm's wgmma kernel (kernels/gpu/fused_moe_compose.hpp):
// get_default takes it from 64 pairs an expert (block fp8 16), its checks name the
// sub-op that declines, and its workspace is its parts.
TEST_CASE("fused_moe: the wgmma composition serves prefill, declines gelu and odd K by the sub-op's name") {
  const core::VariantDef* w = core::find_variant("fused_moe_bf16__wgmma");
  const core::VariantDef* w8 = core::find_variant("fused_moe_fp8_e4m3fn__wgmma");
  if (w == nullptr || w8 == nullptr) return;  // no CUDA backend in this build
  const DeviceInfo dev = cpu_device_info();   // not a probed GPU: supports() checks the problem alone
  // Qwen3-30B-A3B: E 128, top_k 8, H 2048, I 768.
  auto moe = [](int64_t m, DType dt = DType::bf16, int64_t h = 2048) {
    core::Problem p;
    p.op = core::OpKind::fused_moe;
    p.device = Device{DeviceType::cuda, 0};
    p.in_dtype = dt, p.out_dtype = DType::bf16, p.has_bias = dt == DType::fp8_e4m3fn;
    p.m = m, p.n = 768, p.k = h, p.extra[0] = 128, p.extra[1] = 8;
    p.align_bytes = 16;
    return p;
  };
  auto served = [&](const core::Problem& p) { return std::string(core::get_default(p, dev).variant->name); };
  CHECK(served(moe(1024)) == "fused_moe_bf16__wgmma");  // 64 pairs an expert
  CHECK(served(moe(1023)) == "fused_moe_bf16__mma");
  CHECK(served(moe(256, DType::fp8_e4m3fn)) == "fused_moe_fp8_e4m3fn__wgmma");  // 16 pairs an expert
  CHECK(served(moe(255, DType::fp8_e4m3fn)) == "fused_moe_fp8_e4m3fn__mma");
  core::Problem gelu = moe(1024);
  gelu.choice = 1;
  CHECK(kdtest::contains(w->supports(gelu, nullptr, dev).message(), "silu only"));
  CHECK(served(gelu) == "fused_moe_bf16__mma");
  // H = 2000: the up call's K is no multiple of 128 for block fp8's wgmma.
  CHECK(kdtest::contains(
      w8->supports(moe(1024, DType::fp8_e4m3fn, 2000), nullptr, dev).message(),
      "the up moe_gemm: moe_gemm_fp8_e4m3fn__wgmma: block fp8's wgmma kernel takes K a multiple of 128"));
  // Its workspace at M 1024 (P = 8192 pairs), 256-byte parts: the sorted ids, 8192 + 128 * 127 = 24448
  // of them (97792 bytes); 191 expert ids (768); the total (256); P dense topk_weights (32768, used where
  // the caller's rows are strided); c1 [P, 1536], c2 [P, 768] and c3 [P, 2048] in bf16 (25165824 +
  // 12582912 + 33554432).
  CHECK(w->workspace_bytes(moe(1024), nullptr) == 97792 + 768 + 256 + 32768 + 25165824 + 12582912 + 33554432);
  // Block fp8 adds the larger of the two calls' quantised a: hidden's codes [1024, 2048] and
  // scales [1024, 16] (2097152 + 65536 + 256) against c2's [8192, 768] and [8192, 6]
  // (6291456 + 196608 + 256).
  CHECK(w8->workspace_bytes(moe(1024, DType::fp8_e4m3fn), nullptr) ==
        97792 + 768 + 256 + 32768 + 25165824 + 12582912 + 33554432 + 6291456 + 196608 + 256);
}
