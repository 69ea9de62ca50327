// SPDX-License-Identifier: Apache-2.0
// moe_gemm on the CPU, beyond what every op gets from tests/test_ops.cpp
// (every variant against the float64 reference, the key round trip,
// pretune): a result worked by hand (padding, a dropped pair left alone, a
// non-local expert's zeros, the routed weight), both variants equal bit for
// bit on random routings, SGLang's decomposition (align, up, silu_and_mul,
// down, moe_sum) equal to fused_moe, the errors that name the argument, the
// key and file name, the C ABI and a tune on the CPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/registry.hpp"
#include "core/numeric.hpp"
#include "core/routing.hpp"
#include "dispatch/c_api.h"
#include "dispatch/dispatch.hpp"
#include "dispatch/dlpack.hpp"
#include "ops/moe_gemm.hpp"
#include "store/filename.hpp"
#include "test_util.hpp"

using namespace dispatch;

namespace {

std::unique_ptr<Runtime> quiet_runtime() {
  RuntimeOptions o = kdtest::options_for({});
  o.tune.mode = TuneMode::off;
  return kdtest::make_runtime(o);
}

// moe_align's tiny case (tests/test_moe_align.cpp): M = 3 tokens, top_k =
// 2, E = 4, block_size = 4; pairs 0: e2, 1: e0, 2: e2, 3: e3, 4: dropped,
// 5: e2. Blocks: e0 [1, 6, 6, 6], e2 [0, 2, 5, 6], e3 [3, 6, 6, 6]; total 12.
// a [3, 2] = rows (1, 2), (3, 4), (5, 6); w[e] = [[e + 1, 0], [0, 1]], so
// out[s] = ((e + 1) * a[s / 2][0], a[s / 2][1]).
struct Tiny {
  std::vector<float> a{1, 2, 3, 4, 5, 6};
  std::vector<float> w{1, 0, 0, 1, 2, 0, 0, 1, 3, 0, 0, 1, 4, 0, 0, 1};
  std::vector<float> out = std::vector<float>(12, 99.f);
  std::vector<float> tw{0.5f, 1.f, 2.f, 0.25f, 9.f, 1.f};
  std::vector<int32_t> sorted{1, 6, 6, 6, 0, 2, 5, 6, 3, 6, 6, 6, 6, 6, 6, 6, 6, 6};
  std::vector<int32_t> experts{0, 2, 3, -1, -1};
  std::vector<int32_t> total{12};
  MoeGemmArgs args(int32_t mul = 0) {
    MoeGemmArgs g;
    g.a = make_tensor_2d(a.data(), DType::fp32, 3, 2, 2);
    g.w = kdtest::tensor_3d(w.data(), DType::fp32, 4, 2, 2);
    g.out = kdtest::tensor_3d(out.data(), DType::fp32, 3, 2, 2);
    g.topk_weights = make_tensor_2d(tw.data(), DType::fp32, 3, 2, 2);
    g.sorted_token_ids = make_tensor_1d(sorted.data(), DType::int32, 18);
    g.expert_ids = make_tensor_1d(experts.data(), DType::int32, 5);
    g.num_tokens_post_pad = make_tensor_1d(total.data(), DType::int32, 1);
    g.top_k = 2;
    g.block_size = 4;
    g.mul_routed_weight = mul;
    return g;
  }
};

// A random problem's buffers: a [M, K], w [E, N, K] (fp8 codes with block
// scales, or floats), moe_align's outputs for a uniform routing.
struct Random {
  int64_t M, N, K, E, top_k, bs;
  DType wt;
  std::vector<float> a, tw, scale;
  std::vector<char> w;
  std::vector<int32_t> sorted, experts, total{0};
  Random(int64_t m, int64_t n, int64_t k, int64_t e, int64_t tk, int64_t b, DType t, uint32_t seed)
      : M(m), N(n), K(k), E(e), top_k(tk), bs(b), wt(t) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    a.resize(static_cast<size_t>(M * K));
    for (float& v : a) v = u(rng);
    tw.resize(static_cast<size_t>(M * top_k));
    for (float& v : tw) v = 0.5f + 0.5f * std::fabs(u(rng));
    const int64_t n_w = E * N * K;
    w.resize(static_cast<size_t>(n_w) * (t == DType::fp8_e4m3fn ? 1 : 4));
    for (int64_t i = 0; i < n_w; ++i) {
      const float v = u(rng);
      if (t == DType::fp8_e4m3fn)
        w[static_cast<size_t>(i)] = static_cast<char>(core::float_to_fp8(v * 400.f, core::kE4m3fn, true));
      else
        std::memcpy(w.data() + i * 4, &v, 4);
    }
    scale.resize(static_cast<size_t>(E * ((N + 127) / 128) * ((K + 127) / 128)));
    for (float& v : scale) v = (1.f + 0.1f * u(rng)) / 400.f;
    std::vector<int32_t> ids(static_cast<size_t>(M * top_k));
    core::fill_expert_ids(ids.data(), M, top_k, top_k, E, core::Routing::uniform, rng);
    core::Problem p;
    p.m = M, p.extra[0] = E, p.extra[1] = top_k, p.extra[2] = bs;
    const core::Dims d = core::dims_of(p);
    sorted.resize(static_cast<size_t>(core::moe_gemm_spec::sorted_extent(d.data())));
    experts.resize(static_cast<size_t>(core::moe_gemm_spec::blocks_extent(d.data())));
    core::moe_gemm_spec::fill_aligned(core::Fill::aligned_sorted, ids.data(), p, sorted.data());
    core::moe_gemm_spec::fill_aligned(core::Fill::aligned_experts, ids.data(), p, experts.data());
    core::moe_gemm_spec::fill_aligned(core::Fill::aligned_total, ids.data(), p, total.data());
  }
  MoeGemmArgs args(std::vector<float>& out, int32_t mul) {
    MoeGemmArgs g;
    g.a = make_tensor_2d(a.data(), DType::fp32, M, K, K);
    g.w = kdtest::tensor_3d(w.data(), wt, E, N, K);
    out.assign(static_cast<size_t>(M * top_k * N), -7.f);
    g.out = kdtest::tensor_3d(out.data(), DType::fp32, M, top_k, N);
    g.topk_weights = make_tensor_2d(tw.data(), DType::fp32, M, top_k, top_k);
    g.sorted_token_ids = make_tensor_1d(sorted.data(), DType::int32, static_cast<int64_t>(sorted.size()));
    g.expert_ids = make_tensor_1d(experts.data(), DType::int32, static_cast<int64_t>(experts.size()));
    g.num_tokens_post_pad = make_tensor_1d(total.data(), DType::int32, 1);
    if (wt == DType::fp8_e4m3fn)
      g.w_scale = kdtest::tensor_3d(scale.data(), DType::fp32, E, (N + 127) / 128, (K + 127) / 128);
    g.top_k = static_cast<int32_t>(top_k);
    g.block_size = static_cast<int32_t>(bs);
    g.mul_routed_weight = mul;
    return g;
  }
};

// A runtime that serves `variant` for every moe_gemm call.
std::unique_ptr<Runtime> forced(const std::string& variant) {
  RuntimeOptions o = kdtest::options_for({});
  o.tune.mode = TuneMode::off;
  o.force = {"moe_gemm=" + variant};
  return kdtest::make_runtime(o);
}

}  // namespace

TEST_CASE("moe_gemm: a result worked by hand: padding skipped, a dropped pair left alone, the routed weight") {
  auto rt = quiet_runtime();
  Tiny t;
  DispatchInfo info;
  CallOptions o;
  o.info = &info;
  REQUIRE(moe_gemm(*rt, t.args(), {}, o).ok());
  CHECK(std::string(info.variant) == "moe_gemm_fp32__blocked");
  CHECK(t.out == std::vector<float>{3, 2, 1, 2, 9, 4, 12, 4, 99, 99, 15, 6});
  t.out.assign(12, 99.f);
  REQUIRE(moe_gemm(*rt, t.args(1)).ok());
  CHECK(t.out == std::vector<float>{1.5f, 1, 1, 2, 18, 8, 3, 1, 99, 99, 15, 6});
  // Expert 0 not local (expert_map gave it -1): its block's pair is zeros.
  t.experts[0] = -1;
  t.out.assign(12, 99.f);
  REQUIRE(moe_gemm(*rt, t.args()).ok());
  CHECK(t.out == std::vector<float>{3, 2, 0, 0, 9, 4, 12, 4, 99, 99, 15, 6});
  // num_tokens_post_pad 4: only the first block is walked.
  t.experts[0] = 0;
  t.total[0] = 4;
  t.out.assign(12, 99.f);
  REQUIRE(moe_gemm(*forced("moe_gemm_fp32__ref"), t.args()).ok());
  CHECK(t.out == std::vector<float>{99, 99, 1, 2, 99, 99, 99, 99, 99, 99, 99, 99});
  // A total past the buffers' size is clamped to it, never read past.
  t.total[0] = 1 << 20;
  t.out.assign(12, 99.f);
  REQUIRE(moe_gemm(*rt, t.args()).ok());
  CHECK(t.out == std::vector<float>{3, 2, 1, 2, 9, 4, 12, 4, 99, 99, 15, 6});
}

TEST_CASE("moe_gemm: the blocked variant equals the pair-by-pair one bit for bit on random routings") {
  struct Case {
    int64_t m, n, k, e, top_k, bs;
    DType w;
  };
  for (const Case c : {Case{5, 24, 40, 8, 2, 4, DType::fp32}, Case{3, 16, 8, 64, 4, 16, DType::fp32},
                       Case{9, 130, 256, 4, 2, 64, DType::fp8_e4m3fn}, Case{1, 8, 4, 2, 1, 1, DType::fp32}}) {
    CAPTURE(c.m);
    CAPTURE(c.e);
    CAPTURE(c.bs);
    Random r(c.m, c.n, c.k, c.e, c.top_k, c.bs, c.w, 11u);
    const std::string w = c.w == DType::fp32 ? "fp32" : "fp8_e4m3fn";
    std::vector<float> got, want;
    for (int32_t mul : {0, 1}) {
      REQUIRE(moe_gemm(*forced("moe_gemm_" + w + "__ref"), r.args(want, mul)).ok());
      REQUIRE(moe_gemm(*forced("moe_gemm_" + w + "__blocked"), r.args(got, mul)).ok());
      CHECK(got == want);
      CHECK(std::count(got.begin(), got.end(), -7.f) == 0);  // every pair listed, every row written
    }
  }
}

TEST_CASE("moe_gemm: SGLang's decomposition (align, up, silu_and_mul, down, moe_sum) equals fused_moe") {
  auto rt = quiet_runtime();
  const int64_t M = 6, H = 32, I = 16, E = 4, top_k = 2, bs = 4;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> hidden(M * H), w1(E * 2 * I * H), w2(E * H * I), tw(M * top_k), want(M * H), got(M * H);
  for (auto* v : {&hidden, &w1, &w2})
    for (float& x : *v) x = u(rng);
  std::vector<int32_t> ids(M * top_k);
  core::fill_expert_ids(ids.data(), M, top_k, top_k, E, core::Routing::uniform, rng);
  core::fill_routing_weights(tw.data(), M, top_k, top_k, rng);
  FusedMoeArgs f;
  f.hidden = make_tensor_2d(hidden.data(), DType::fp32, M, H, H);
  f.w1 = kdtest::tensor_3d(w1.data(), DType::fp32, E, 2 * I, H);
  f.w2 = kdtest::tensor_3d(w2.data(), DType::fp32, E, H, I);
  f.topk_weights = make_tensor_2d(tw.data(), DType::fp32, M, top_k, top_k);
  f.topk_ids = make_tensor_2d(ids.data(), DType::int32, M, top_k, top_k);
  f.out = make_tensor_2d(want.data(), DType::fp32, M, H, H);
  REQUIRE(fused_moe(*rt, f).ok());

  const int64_t P = M * top_k + std::min(E, M * top_k) * (bs - 1);
  std::vector<int32_t> sorted(P), experts((P + bs - 1) / bs), total(1);
  MoeAlignArgs al;
  al.topk_ids = f.topk_ids;
  al.sorted_token_ids = make_tensor_1d(sorted.data(), DType::int32, P);
  al.expert_ids = make_tensor_1d(experts.data(), DType::int32, static_cast<int64_t>(experts.size()));
  al.num_tokens_post_pad = make_tensor_1d(total.data(), DType::int32, 1);
  al.num_experts = E;
  al.block_size = bs;
  REQUIRE(moe_align(*rt, al).ok());
  std::vector<float> c1(M * top_k * 2 * I), c2(M * top_k * I), c3(M * top_k * H);
  MoeGemmArgs up;
  up.a = f.hidden, up.w = f.w1;
  up.out = kdtest::tensor_3d(c1.data(), DType::fp32, M, top_k, 2 * I);
  up.topk_weights = f.topk_weights;
  up.sorted_token_ids = al.sorted_token_ids, up.expert_ids = al.expert_ids;
  up.num_tokens_post_pad = al.num_tokens_post_pad;
  up.top_k = top_k, up.block_size = bs;
  REQUIRE(moe_gemm(*rt, up).ok());
  SiluAndMulArgs act;
  act.out = make_tensor_2d(c2.data(), DType::fp32, M * top_k, I, I);
  act.x = make_tensor_2d(c1.data(), DType::fp32, M * top_k, 2 * I, 2 * I);
  REQUIRE(silu_and_mul(*rt, act).ok());
  MoeGemmArgs down = up;
  down.a = act.out, down.w = f.w2;
  down.out = kdtest::tensor_3d(c3.data(), DType::fp32, M * top_k, 1, H);
  down.topk_weights = make_tensor_2d(tw.data(), DType::fp32, M * top_k, 1, 1);
  down.top_k = 1, down.mul_routed_weight = 1;
  REQUIRE(moe_gemm(*rt, down).ok());
  MoeSumArgs sum;
  sum.input = kdtest::tensor_3d(c3.data(), DType::fp32, M, top_k, H);
  sum.out = make_tensor_2d(got.data(), DType::fp32, M, H, H);
  REQUIRE(moe_sum(*rt, sum).ok());
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  CHECK(scale > 0.1);
  CHECK(worst <= 1e-5 * scale);
}

TEST_CASE("moe_gemm: errors name the argument: a short buffer, top_k, mul_routed_weight, w_scale") {
  auto rt = quiet_runtime();
  Tiny t;
  MoeGemmArgs g = t.args();
  g.sorted_token_ids.shape[0] = 17;
  Status s = moe_gemm(*rt, g);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() ==
        "sorted_token_ids: must have at least 18 elements (M*top_k + min(E, M*top_k)*(block_size - 1)), has 17");
  g = t.args();
  g.top_k = 0;
  CHECK(moe_gemm(*rt, g).message() == "top_k: must be a whole number in [1, 16777216], got 0");
  g = t.args();
  g.mul_routed_weight = 2;
  CHECK(moe_gemm(*rt, g).code() == StatusCode::invalid_argument);
  CHECK(moe_gemm(*rt, g).message().find("mul_routed_weight") == 0);
  g = t.args();
  g.out.shape[1] = 3;
  CHECK(moe_gemm(*rt, g).message().find("out: ") == 0);
  g = t.args();
  g.w_scale = g.topk_weights;
  CHECK(moe_gemm(*rt, g).message().find("w_scale") != std::string::npos);
  // An empty w as torch makes it ([4, 0, 2]: batch stride 2, not 0) is
  // refused by its shape, not by strides that say nothing (it was "w: batch
  // stride 2 must be rows * row stride = 0 ...").
  g = t.args();
  g.w.shape[1] = 0, g.w.strides[0] = 2, g.w.strides[1] = 2;
  g.out.shape[2] = 0, g.out.strides[0] = 2, g.out.strides[1] = 1;
  CHECK(moe_gemm(*rt, g).message() == "w: E, N and K must be >= 1, got shape [4, 0, 2]");
}

TEST_CASE("moe_gemm: a call's key and file name: block_size, top_k and the routed weight are fields") {
  const std::string dev = cpu_device_info().device_name;
  auto rt = quiet_runtime();
  Tiny t;
  std::string key;
  DispatchInfo info;
  info.key = &key;
  CallOptions o;
  o.info = &info;
  REQUIRE(moe_gemm(*rt, t.args(), {}, o).ok());
  CHECK(key == "cpu/moe_gemm|" + dev + "|E=4,K=2,N=2,block_size=4,dtype=fp32,top_k=2");
  REQUIRE(moe_gemm(*rt, t.args(1), {}, o).ok());
  CHECK(key == "cpu/moe_gemm|" + dev + "|E=4,K=2,N=2,block_size=4,dtype=fp32,mul_routed_weight=true,top_k=2");
  CHECK(store::own_file_name(core::OpKind::moe_gemm, "E=128,K=2048,N=1536,block_size=16,dtype=bf16,top_k=8",
                             "NVIDIA_H200") ==
        "E=128,N=1536,K=2048,top_k=8,block_size=16,device_name=NVIDIA_H200,dtype=bf16.json");
  auto f = store::parse_key_fields("E=257,K=256,N=7168,block_size=64,dtype=fp8_e4m3fn,block_shape=[128,128],top_k=1");
  REQUIRE(f.ok());
  auto p = store::own_problem_from_fields(core::OpKind::moe_gemm, *f);
  REQUIRE_MESSAGE(p.ok(), p.status().to_string());
  CHECK(p->extra[0] == 257);
  CHECK(p->n == 7168);
  CHECK(p->k == 256);
  CHECK(p->extra[1] == 1);
  CHECK(p->extra[2] == 64);
  CHECK(p->has_bias);
}

TEST_CASE("moe_gemm: the C ABI's kdispatch_moe_gemm takes (a, w, out, topk_weights, aligned ids, w_scale, ...)") {
  Tiny t;
  int64_t a_shape[2] = {3, 2}, w_shape[3] = {4, 2, 2}, out_shape[3] = {3, 2, 2}, tw_shape[2] = {3, 2},
          sorted_shape[1] = {18}, blocks_shape[1] = {5}, one[1] = {1};
  DLTensor a{}, w{}, out{}, tw{}, sorted{}, experts{}, total{};
  a.data = t.a.data();
  a.device = {kDLCPU, 0};
  a.ndim = 2;
  a.dtype = {kDLFloat, 32, 1};
  a.shape = a_shape;
  w = a, w.data = t.w.data(), w.ndim = 3, w.shape = w_shape;
  out = a, out.data = t.out.data(), out.ndim = 3, out.shape = out_shape;
  tw = a, tw.data = t.tw.data(), tw.shape = tw_shape;
  sorted = a, sorted.ndim = 1, sorted.dtype = {kDLInt, 32, 1}, sorted.data = t.sorted.data(),
  sorted.shape = sorted_shape;
  experts = sorted, experts.data = t.experts.data(), experts.shape = blocks_shape;
  total = sorted, total.data = t.total.data(), total.shape = one;
  kdispatch_options opts;
  kdispatch_options_init(&opts);
  opts.load_shipped_configs = 0;
  opts.log_level = KDISPATCH_LOG_OFF;
  kdispatch_runtime* rt = nullptr;
  REQUIRE(kdispatch_runtime_create(&opts, &rt) == KDISPATCH_OK);
  CHECK(kdispatch_moe_gemm(rt, &a, &w, &out, &tw, &sorted, &experts, &total, nullptr, 2.f, 4.f, 1.f, nullptr, 0,
                           nullptr) == KDISPATCH_OK);
  CHECK(t.out == std::vector<float>{1.5f, 1, 1, 2, 18, 8, 3, 1, 99, 99, 15, 6});
  CHECK(kdispatch_moe_gemm(rt, &a, &w, &out, &tw, &sorted, &experts, &total, nullptr, 2.f, 4.f, 0.5f, nullptr, 0,
                           nullptr) == KDISPATCH_INVALID_ARGUMENT);
  kdispatch_runtime_destroy(rt);
}

TEST_CASE("moe_gemm: pretune on the CPU fills one alignment and keeps a plan that matches the reference") {
  kdtest::TempDir cache;
  RuntimeOptions o = kdtest::options_for({});
  o.tune.mode = TuneMode::off;
  o.tune.cache_dir = cache.str();
  auto rt = kdtest::make_runtime(o);
  Random r(24, 32, 64, 8, 2, 16, DType::fp32, 3u);
  std::vector<float> out;
  auto res = pretune(*rt, r.args(out, 1));
  REQUIRE_MESSAGE(res.ok(), res.status().to_string());
  CHECK(res->key.find("cpu/moe_gemm|") == 0);
  CHECK(res->key.find("mul_routed_weight=true") != std::string::npos);
  CHECK(res->variant == "moe_gemm_fp32__blocked");
  CHECK(res->rejected == 0);
  CHECK(res->persisted);  // into the test's own cache dir, never the user's
}

// vLLM's expert-parallel flow, which kdispatch's own moe_align supports
// (expert_map): align over the E_global experts with the map, then the
// grouped GEMM over the local weights [E_local, N, K]. The align's buffers
// and its total are sized for E_global, past moe_gemm's P of E_local: the
// op reads what the buffers hold (an attack found it clamped to P
// and skipped the local experts' blocks past it).
TEST_CASE("moe_gemm: under expert parallelism (align over the global experts) every local pair is computed") {
  auto rt = quiet_runtime();
  const int64_t M = 4, top_k = 2, Eg = 8, El = 2, bs = 4, N = 2, K = 2;
  // Pair i = t * 2 + j goes to global expert i: every pair its own expert.
  std::vector<int32_t> ids{0, 1, 2, 3, 4, 5, 6, 7};
  // Global experts 6 and 7 are this rank's local experts 0 and 1.
  std::vector<int32_t> map{-1, -1, -1, -1, -1, -1, 0, 1};
  const int64_t P = M * top_k + std::min(Eg, M * top_k) * (bs - 1);  // 32: the align's buffers
  std::vector<int32_t> sorted(P), experts((P + bs - 1) / bs), total(1);
  MoeAlignArgs al;
  al.topk_ids = make_tensor_2d(ids.data(), DType::int32, M, top_k, top_k);
  al.sorted_token_ids = make_tensor_1d(sorted.data(), DType::int32, P);
  al.expert_ids = make_tensor_1d(experts.data(), DType::int32, static_cast<int64_t>(experts.size()));
  al.num_tokens_post_pad = make_tensor_1d(total.data(), DType::int32, 1);
  al.expert_map = make_tensor_1d(map.data(), DType::int32, Eg);
  al.num_experts = static_cast<int32_t>(Eg);
  al.block_size = static_cast<int32_t>(bs);
  REQUIRE(moe_align(*rt, al).ok());
  REQUIRE(total[0] == 32);
  REQUIRE(experts == std::vector<int32_t>{-1, -1, -1, -1, -1, -1, 0, 1});

  std::vector<float> a{1, 2, 3, 4, 5, 6, 7, 8};  // [M, K]
  std::vector<float> w{1, 0, 0, 1, 2, 0, 0, 1};  // local experts: [[e + 1, 0], [0, 1]]
  std::vector<float> out(static_cast<size_t>(M * top_k * N), 99.f), tw(static_cast<size_t>(M * top_k), 1.f);
  MoeGemmArgs g;
  g.a = make_tensor_2d(a.data(), DType::fp32, M, K, K);
  g.w = kdtest::tensor_3d(w.data(), DType::fp32, El, N, K);
  g.out = kdtest::tensor_3d(out.data(), DType::fp32, M, top_k, N);
  g.topk_weights = make_tensor_2d(tw.data(), DType::fp32, M, top_k, top_k);
  g.sorted_token_ids = al.sorted_token_ids;
  g.expert_ids = al.expert_ids;
  g.num_tokens_post_pad = al.num_tokens_post_pad;
  g.top_k = static_cast<int32_t>(top_k);
  g.block_size = static_cast<int32_t>(bs);
  REQUIRE(moe_gemm(*rt, g).ok());
  // Pairs 0..5: non-local experts, zeros. Pair 6 (token 3, local expert 0):
  // (1 * 7, 8); pair 7 (token 3, local expert 1): (2 * 7, 8).
  CHECK(out == std::vector<float>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 8, 14, 8});
}

// Block fp8's ring (CUDA) quantises a once into the call's workspace: the
// op takes one (the torch op attaches it, the tuner gives one), M * K bytes
// of codes and M * K / 128 fp32 scales, each part 256-byte aligned; the CPU
// and the bf16/fp16 variants take none.
TEST_CASE("moe_gemm: op_list() says it takes a workspace, block fp8's ring's: a quantised once") {
  for (const OpInfo& op : op_list())
    if (op.name == "moe_gemm") CHECK(op.uses_workspace);
  const std::string fp8 = "E=257,K=7168,N=512,block_size=64,dtype=fp8_e4m3fn,block_shape=[128,128],top_k=9";
  auto cpu = workspace_bytes("moe_gemm", fp8, 16, DeviceType::cpu);
  REQUIRE_MESSAGE(cpu.ok(), cpu.status().to_string());
  CHECK(*cpu == 0);
  auto cuda = workspace_bytes("moe_gemm", fp8, 16, DeviceType::cuda);
  REQUIRE_MESSAGE(cuda.ok(), cuda.status().to_string());
  if (!core::variants_for(core::OpKind::moe_gemm, DeviceType::cuda).empty())
    CHECK(*cuda == 16 * 7168 + 16 * 56 * 4);  // 114688 codes + 3584 bytes of scales, both multiples of 256
  auto bf16 = workspace_bytes("moe_gemm", "E=128,K=2048,N=1536,block_size=16,dtype=bf16,top_k=8", 16, DeviceType::cuda);
  REQUIRE_MESSAGE(bf16.ok(), bf16.status().to_string());
  CHECK(*bf16 == 0);
}

// The tuner poisons pure outputs and rejects a candidate that leaves an
// element unwritten, while moe_gemm leaves a dropped pair's rows alone: the
// tuner's alignment lists every pair (an id outside [0, E) becomes i mod E).
TEST_CASE("moe_gemm: pretune where the routing would drop pairs (top_k > E) lists every pair and keeps a plan") {
  kdtest::TempDir cache;
  RuntimeOptions o = kdtest::options_for({});
  o.tune.mode = TuneMode::off;
  o.tune.cache_dir = cache.str();
  auto rt = kdtest::make_runtime(o);
  Random r(6, 16, 32, 2, 4, 4, DType::fp32, 7u);  // E = 2, top_k = 4: two of each token's pairs dropped
  std::vector<float> out;
  REQUIRE(moe_gemm(*rt, r.args(out, 0)).ok());  // the call itself is fine
  auto res = pretune(*rt, r.args(out, 0));
  REQUIRE_MESSAGE(res.ok(), res.status().to_string());
  CHECK(res->rejected == 0);
}
