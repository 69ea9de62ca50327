// SPDX-License-Identifier: Apache-2.0
// moe_gemm_fp8_tensor and moe_gemm_fp8_channel on the CPU, beyond what every
// op gets from tests/test_ops.cpp (every variant against the float64
// reference with and without a_scale, the key round trip, pretune, the C
// ABI's refusals): results worked by hand for the static and both dynamic
// activation scales, and the key.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/numeric.hpp"
#include "dispatch/dispatch.hpp"
#include "ops/moe_gemm_fp8.hpp"
#include "test_util.hpp"

using namespace dispatch;

namespace {

// M = 2 tokens, top_k = 1, E = 2, N = 2, K = 2, block_size = 2: token 0 to
// expert 0, token 1 to expert 1 (blocks [0, pad], [1, pad]). a = (2, -1),
// (1, 0.5); w[0] = [[1, 0], [0, 2]], w[1] = [[0.5, 1], [1, 1]] (exact in
// e4m3fn). A dynamic scale of 2 / 448 (amax 2) puts a on 448, -224, 224,
// 112: exact too (its products with sa within fp32's rounding).
struct Tiny {
  std::vector<float> a{2, -1, 1, 0.5f};
  std::vector<uint8_t> w;
  std::vector<float> out = std::vector<float>(4, 99.f);
  std::vector<float> tw{1, 1};
  std::vector<int32_t> sorted{0, 2, 1, 2};
  std::vector<int32_t> experts{0, 1};
  std::vector<int32_t> total{4};
  std::vector<float> ws, as;
  Tiny() {
    for (float v : {1.f, 0.f, 0.f, 2.f, 0.5f, 1.f, 1.f, 1.f}) w.push_back(core::float_to_fp8(v, core::kE4m3fn, true));
  }
  MoeGemmFp8Args args(std::vector<float> w_scale, bool channel, std::vector<float> a_scale = {}) {
    ws = std::move(w_scale), as = std::move(a_scale);
    MoeGemmFp8Args g;
    g.a = make_tensor_2d(a.data(), DType::fp32, 2, 2, 2);
    g.w = kdtest::tensor_3d(w.data(), DType::fp8_e4m3fn, 2, 2, 2);
    g.out = kdtest::tensor_3d(out.data(), DType::fp32, 2, 1, 2);
    g.topk_weights = make_tensor_2d(tw.data(), DType::fp32, 2, 1, 1);
    g.sorted_token_ids = make_tensor_1d(sorted.data(), DType::int32, 4);
    g.expert_ids = make_tensor_1d(experts.data(), DType::int32, 2);
    g.num_tokens_post_pad = make_tensor_1d(total.data(), DType::int32, 1);
    g.w_scale = channel ? make_tensor_2d(ws.data(), DType::fp32, 2, 2, 2) : make_tensor_1d(ws.data(), DType::fp32, 2);
    if (!as.empty()) g.a_scale = make_tensor_1d(as.data(), DType::fp32, 1);
    g.top_k = 1, g.block_size = 2;
    return g;
  }
};

/// Whether got equals want within a few fp32 ulps (a dynamic scale, amax /
/// 448, is no power of two: sa * q(a) is a only to rounding).
bool near(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return false;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= 1e-6f * std::fabs(want[i]))) return false;
  return true;
}

std::unique_ptr<Runtime> quiet_runtime() {
  RuntimeOptions o = kdtest::options_for({});
  o.tune.mode = TuneMode::off;
  return kdtest::make_runtime(o);
}

}  // namespace

TEST_CASE("moe_gemm_fp8: per-tensor and per-channel scales, static and dynamic activations, worked by hand") {
  auto rt = quiet_runtime();
  // a · w[e]^T: token 0 (expert 0): (2, -2); token 1 (expert 1): (1, 1.5).
  {
    Tiny t;  // per tensor, static a_scale 1: q(a) = a; w_scale (3, 0.5)
    MoeGemmFp8TensorArgs g{t.args({3.f, 0.5f}, false, {1.f})};
    {
      const Status st = moe_gemm_fp8_tensor(*rt, g);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
    }
    CHECK(near(t.out, std::vector<float>{6, -6, 0.5f, 0.75f}));
  }
  {
    Tiny t;  // per tensor, dynamic: one scale 2 / 448 for all of a; sa * q(a) = a
    MoeGemmFp8TensorArgs g{t.args({3.f, 0.5f}, false)};
    {
      const Status st = moe_gemm_fp8_tensor(*rt, g);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
    }
    CHECK(near(t.out, std::vector<float>{6, -6, 0.5f, 0.75f}));
  }
  {
    Tiny t;  // per tensor, static a_scale 1/64: 2 * 64 = 128 and 1 * 64 fit; sa * q(a) = a again
    MoeGemmFp8TensorArgs g{t.args({1.f, 1.f}, false, {1.f / 64})};
    {
      const Status st = moe_gemm_fp8_tensor(*rt, g);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
    }
    CHECK(near(t.out, std::vector<float>{2, -2, 1, 1.5f}));
  }
  {
    Tiny t;  // static a_scale 1/448: a * 448 saturates at 448 (clamp), so a reads as (1, -1), (1, 0.5)
    MoeGemmFp8TensorArgs g{t.args({1.f, 1.f}, false, {1.f / 448})};
    {
      const Status st = moe_gemm_fp8_tensor(*rt, g);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
    }
    CHECK(near(t.out, std::vector<float>{1, -2, 1, 1.5f}));
  }
  {
    // A NaN in a: the engines' clamp fmax(fmin(v, 448), -448) makes it +448 (SGLang's and vLLM's
    // scaled_fp8_quant), so the row reads (448, -1): expert 0 gives (448, -2) times w_scale 3.
    Tiny t;
    t.a[0] = std::nanf("");
    MoeGemmFp8TensorArgs g{t.args({3.f, 0.5f}, false, {1.f})};
    {
      const Status st = moe_gemm_fp8_tensor(*rt, g);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
    }
    CHECK(near(t.out, std::vector<float>{1344, -6, 0.5f, 0.75f}));
  }
  {
    Tiny t;  // per channel [E, N] = (1, 10), (100, 1000); dynamic per token (2/448, 1/448)
    MoeGemmFp8ChannelArgs g{t.args({1.f, 10.f, 100.f, 1000.f}, true)};
    {
      const Status st = moe_gemm_fp8_channel(*rt, g);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
    }
    CHECK(near(t.out, std::vector<float>{2, -20, 100, 1500}));
  }
  {
    Tiny t;  // per channel with the routed weight (token 1 times 0.5) and expert 1 not local
    t.tw = {1, 0.5f};
    MoeGemmFp8ChannelArgs g{t.args({1.f, 10.f, 100.f, 1000.f}, true)};
    g.mul_routed_weight = 1;
    {
      const Status st = moe_gemm_fp8_channel(*rt, g);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
    }
    CHECK(near(t.out, std::vector<float>{2, -20, 50, 750}));
    t.experts = {0, -1};
    {
      const Status st = moe_gemm_fp8_channel(*rt, g);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
    }
    CHECK(near(t.out, std::vector<float>{2, -20, 0, 0}));
  }
}

TEST_CASE("moe_gemm_fp8: the key says the layout by its op and a static scale by a_scale=static") {
  auto rt = quiet_runtime();
  Tiny t;
  MoeGemmFp8ChannelArgs g{t.args({1.f, 10.f, 100.f, 1000.f}, true, {1.f})};
  DispatchInfo info;
  std::string key;
  info.key = &key;
  CallOptions o;
  o.info = &info;
  {
    const Status st = moe_gemm_fp8_channel(*rt, g, {}, o);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
  }
  CHECK(std::string(info.variant) == "moe_gemm_fp8_channel_fp8_e4m3fn__blocked");
  CHECK(kdtest::contains(key, "moe_gemm_fp8_channel|"));
  CHECK(kdtest::contains(key, "a_scale=static"));
  CHECK(kdtest::contains(key, "E=2,K=2,N=2"));
  // A wrong w_scale shape is refused by name: the tensor op's [E] given [E, N].
  MoeGemmFp8TensorArgs bad{t.args({1.f, 10.f, 100.f, 1000.f}, true)};
  const Status st = moe_gemm_fp8_tensor(*rt, bad);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK(kdtest::contains(st.message(), "w_scale"));
}
