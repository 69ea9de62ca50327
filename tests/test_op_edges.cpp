// SPDX-License-Identifier: Apache-2.0
// Edges of the op spec found by review: dims past 2^40 (refused before any
// extent or byte count could overflow), rank-1 arguments overlapping a
// written one (refused: a weight or bias read while the output is written
// is a wrong answer, and on a GPU a read-only-cache hazard), silu_and_mul's
// vector kernels at gate values past fp32's exp range, stride fields of the
// wrong rank in a file name, the C ABI's NULL arrays.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/silu_list.hpp"
#include "dispatch/c_api.h"
#include "dispatch/dispatch.hpp"
#include "ops/specs.hpp"
#include "store/filename.hpp"
#include "test_util.hpp"

using namespace dispatch;

namespace {

std::unique_ptr<Runtime> quiet_runtime(const std::string& cache) {
  RuntimeOptions o = kdtest::options_for({});
  o.tune.cache_dir = cache;
  return kdtest::make_runtime(o);
}

}  // namespace

TEST_CASE("op edges: dims past 2^40 are refused by validation, keys and pretune, never tuned") {
  kdtest::TempDir cache;
  auto rt = quiet_runtime(cache.str());
  // A key with a huge d: the field is refused by name (it used to crash the tuner's scratch fill).
  auto r = pretune_key(*rt, "silu_and_mul", "d=9223372036854775807,dtype=bf16", 1);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::invalid_argument);
  CHECK(r.status().message() == "field d='9223372036854775807' is not an integer in [1, 2^40]");
  CHECK(describe_key("silu_and_mul", "d=1099511627776,dtype=bf16", 1).ok());  // 2^40 itself is allowed
  CHECK_FALSE(describe_key("silu_and_mul", "d=1099511627777,dtype=bf16", 1).ok());
  auto m = describe_key("gemm", "N=16,K=16,dtype=fp32", int64_t{1} << 41);
  REQUIRE_FALSE(m.ok());
  CHECK(m.status().message() == "M must be in [1, 2^40], got 2199023255552");
  // The largest key describes without overflow: bytes saturate.
  auto big = describe_key("silu_and_mul", "d=1099511627776,dtype=bf16", int64_t{1} << 40);
  REQUIRE(big.ok());
  CHECK(big->bytes == std::numeric_limits<int64_t>::max());

  // pretune from tensors without data (a description): N = INT64_MAX.
  GemmArgs g;
  g.a = make_tensor_2d(nullptr, DType::fp32, 1, 1, 1);
  g.b = make_tensor_2d(nullptr, DType::fp32, std::numeric_limits<int64_t>::max(), 1, 1);
  g.d =
      make_tensor_2d(nullptr, DType::fp32, 1, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max());
  auto p = pretune(*rt, g);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message() ==
        "b: shape [9223372036854775807, 1]: N = 9223372036854775807 is over the largest "
        "supported size, 2^40");

  // A call: out [1, 2^62], x [1, 2^63 - 1] is refused by name (the extent 2*d is never computed).
  std::vector<float> buf(8, 0.f);
  SiluAndMulArgs s;
  s.out = make_tensor_2d(buf.data(), DType::fp32, 1, int64_t{1} << 62, int64_t{1} << 62);
  s.x = make_tensor_2d(buf.data() + 4, DType::fp32, 1, std::numeric_limits<int64_t>::max(),
                       std::numeric_limits<int64_t>::max());
  Status st = silu_and_mul(*rt, s);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK(st.message() ==
        "out: shape [1, 4611686018427387904]: d = 4611686018427387904 is over the largest "
        "supported size, 2^40");
  CHECK(rt->tune_stats().shapes_tuned == 0);
}

TEST_CASE("op edges: a weight or bias inside a written argument is refused") {
  auto rt = kdtest::make_runtime(std::vector<std::string>{});
  float x[8] = {1, 2, 3, 4, 1, 2, 3, 4}, y[8] = {2, 2, 2, 2, 0, 0, 0, 0};
  RmsNormArgs a;
  a.x = make_tensor_2d(x, DType::fp32, 2, 4, 4);
  a.y = make_tensor_2d(y, DType::fp32, 2, 4, 4);
  a.w = make_tensor_1d(y, DType::fp32, 4);  // w is y's first row
  Status s = rmsnorm(*rt, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "y: overlaps an input (w)");
  CHECK(y[4] == 0.f);  // nothing written

  float r[8] = {1, 1, 1, 1, 2, 2, 2, 2};
  FusedAddRmsNormArgs f;
  f.x = make_tensor_2d(x, DType::fp32, 2, 4, 4);
  f.residual = make_tensor_2d(r, DType::fp32, 2, 4, 4);
  f.w = make_tensor_1d(r + 4, DType::fp32, 4);  // w is residual's second row
  s = fused_add_rmsnorm(*rt, f);
  CHECK(s.message() == "residual: overlaps an input (w)");
  CHECK(r[0] == 1.f);

  float am[8] = {1, 1, 1, 1, 1, 1, 1, 1}, bm[8] = {1, 1, 1, 1, 1, 1, 1, 1}, d[4] = {0, 0, 0, 0};
  GemmArgs g;
  g.a = make_tensor_2d(am, DType::fp32, 2, 4, 4);
  g.b = make_tensor_2d(bm, DType::fp32, 2, 4, 4);
  g.d = make_tensor_2d(d, DType::fp32, 2, 2, 2);
  g.bias = make_tensor_1d(d + 2, DType::fp32, 2);  // bias inside d
  s = gemm(*rt, g);
  CHECK(s.message() == "d: overlaps an input (bias)");
  g.bias = make_tensor_1d(am, DType::fp32, 2);  // bias inside a: both only read, fine
  REQUIRE(gemm(*rt, g).ok());
  CHECK(d[0] == 5.f);  // 4 + bias 1
  CHECK(d[3] == 5.f);
}

TEST_CASE("op edges: silu_and_mul's vector variants past fp32's exp range agree with the reference") {
  // gate values where e^-g overflows (g < -88.3), at the clamp's edges, and the specials.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> gates = {-1e30f, -100.f, -88.5f, -88.2f, -87.f, -inf, 87.5f,
                                    100.f,  1e30f,  inf,    nan,    -0.f,  0.f,  1.f};
  const std::vector<float> ups = {1.f, 3e38f};
  const int64_t d = static_cast<int64_t>(gates.size() * ups.size());  // not a multiple of 16: the tail too
  std::vector<float> x(static_cast<size_t>(2 * d));
  for (size_t u = 0; u < ups.size(); ++u)
    for (size_t i = 0; i < gates.size(); ++i) {
      x[u * gates.size() + i] = gates[i];
      x[static_cast<size_t>(d) + u * gates.size() + i] = ups[u];
    }
  core::Problem p;
  p.op = core::OpKind::silu_and_mul;
  p.device = Device{DeviceType::cpu, 0};
  p.in_dtype = p.out_dtype = DType::fp32;
  p.m = 1;
  p.n = d;
  core::LaunchArgs la;
  la.data[core::kSiluArgX] = x.data();
  la.ld[core::kSiluArgX] = 2 * d;
  la.ld[core::kSiluArgOut] = d;
  auto run = [&](const core::VariantDef& v, const int64_t* params) {
    std::vector<float> out(static_cast<size_t>(d), 12345.f);
    la.data[core::kSiluArgOut] = out.data();
    REQUIRE(v.launch(la, p, params).ok());
    return out;
  };
  const int64_t none[core::kMaxParams] = {};
  const std::vector<float> want = run(cpu::kSiluFp32Ref, none);
  // The reference itself: g / (1 + exp(-g)) * u.
  CHECK(want[0] == 0.f);
  CHECK(std::signbit(want[0]));  // -1e30 -> -0
  CHECK(std::isnan(want[5]));    // -inf -> -inf / inf
  CHECK(want[9] == inf);         // +inf
  for (int64_t vec : {4, 8, 16})
    for (int64_t unroll : {1, 2, 4}) {
      int64_t prm[core::kMaxParams] = {};
      prm[cpu::kSiluVec] = vec;
      prm[cpu::kSiluUnroll] = unroll;
      const std::vector<float> got = run(cpu::kSiluFp32Vec, prm);
      for (int64_t i = 0; i < d; ++i) {
        CAPTURE(vec);
        CAPTURE(unroll);
        CAPTURE(i);
        CAPTURE(x[static_cast<size_t>(i)]);
        const float w = want[static_cast<size_t>(i)], v = got[static_cast<size_t>(i)];
        if (std::isnan(w)) {
          CHECK(std::isnan(v));
        } else if (std::isinf(w) || w == 0.f) {
          CHECK(v == w);
          CHECK(std::signbit(v) == std::signbit(w));
        } else {
          CHECK(std::fabs(v - w) <= 1e-6f * std::fabs(w) + 1e-30f);
        }
      }
    }
}

TEST_CASE("op edges: a stride field needs one class per dim of each operand") {
  auto f = store::parse_key_fields("d=64,dtype=fp32,stride=1_1");
  REQUIRE(f.ok());
  auto p = store::own_problem_from_fields(core::OpKind::silu_and_mul, *f);
  REQUIRE_FALSE(p.ok());
  CHECK(p.status().message() ==
        "field stride='1_1' is not 2 operands of classes [01o] joined by '_', one class per dim of each");
  f = store::parse_key_fields("d=64,dtype=fp32,stride=o1_01");  // x broadcast over rows: a real layout
  REQUIRE(f.ok());
  CHECK(store::own_problem_from_fields(core::OpKind::silu_and_mul, *f).ok());
}

TEST_CASE("op edges: the C ABI names a NULL tensor or scalar array") {
  kdispatch_options o;
  kdispatch_options_init(&o);
  o.load_shipped_configs = 0;
  o.log_level = 0;
  kdispatch_runtime* rt = nullptr;
  REQUIRE(kdispatch_runtime_create(&o, &rt) == KDISPATCH_OK);
  CHECK(kdispatch_op_call(rt, "silu_and_mul", nullptr, 2, nullptr, 0, nullptr, 0, nullptr, 0, nullptr) ==
        KDISPATCH_INVALID_ARGUMENT);
  CHECK(std::string(kdispatch_last_error_message()) == "tensors is NULL (silu_and_mul takes 2)");
  float buf[8] = {};
  int64_t shape[2] = {1, 4};
  DLTensor t{buf, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, shape, nullptr, 0};
  const DLTensor* ts[3] = {&t, &t, &t};
  CHECK(kdispatch_op_call(rt, "rmsnorm", ts, 3, nullptr, 1, nullptr, 0, nullptr, 0, nullptr) ==
        KDISPATCH_INVALID_ARGUMENT);
  CHECK(std::string(kdispatch_last_error_message()) == "scalars is NULL (rmsnorm takes 1)");
  kdispatch_runtime_destroy(rt);
}

TEST_CASE("op edges: an empty tensor's strides say nothing, and strides past int64 are refused, never wrapped") {
  auto rt = kdtest::make_runtime(std::vector<std::string>{});
  // An empty output with row stride 0 (numpy's zeros((3, 0))): the shape
  // rule answers, as for a contiguous one (it was "y: an output cannot have
  // row stride 0").
  float x[12] = {}, y[12] = {}, w[4] = {1, 1, 1, 1};
  RmsNormArgs a;
  a.x = make_tensor_2d(x, DType::fp32, 3, 0, 0);
  a.y = make_tensor_2d(y, DType::fp32, 3, 0, 0);
  a.w = make_tensor_1d(w, DType::fp32, 0);
  CHECK(rmsnorm(*rt, a).message() == "x: hidden must be >= 1, got shape [3, 0]");
  a.y.strides[0] = 0;
  CHECK(rmsnorm(*rt, a).message() == "x: hidden must be >= 1, got shape [3, 0]");
  // An empty weight stack as torch makes it ([2, 0, 4]: batch stride 4).
  std::vector<float> big(64, 0.f);
  MoeSumArgs m;
  m.input = kdtest::tensor_3d(big.data(), DType::fp32, 2, 0, 4);
  m.input.strides[0] = 4;
  m.out = make_tensor_2d(big.data() + 32, DType::fp32, 2, 4, 4);
  CHECK(moe_sum(*rt, m).message() == "input: hidden and top_k must be >= 1, got shape [2, 0, 4]");
  // Strides whose span is past 2^60 elements are refused by name: rows *
  // row stride wrapped to 0 (16 * 2^60) and passed the dense-batch check
  // (UBSan: signed overflow); a batch of 4 matrices of 2 rows of stride 2^61
  // (2^64 elements) was accepted and the kernel's index wrapped.
  m.input = kdtest::tensor_3d(big.data(), DType::fp32, 2, 16, 4);
  m.input.strides[1] = int64_t{1} << 60, m.input.strides[0] = 0;
  CHECK(moe_sum(*rt, m).message() ==
        "input: row stride 1152921504606846976 over 16 rows of 2 matrices spans past 2^60 elements (no tensor spans "
        "that)");
  m.input = kdtest::tensor_3d(big.data() + 16, DType::fp32, 4, 2, 4);
  m.input.strides[1] = int64_t{1} << 61, m.input.strides[0] = int64_t{1} << 62;
  m.out = make_tensor_2d(big.data(), DType::fp32, 4, 4, 4);
  CHECK(moe_sum(*rt, m).message() ==
        "input: row stride 2305843009213693952 over 2 rows of 4 matrices spans past 2^60 elements (no tensor spans "
        "that)");
  // The same for 2-D operands: 3 rows of stride 2^62 were accepted where no
  // output sat above them in memory (the overlap check's span, saturated).
  std::vector<float> buf(24, 1.f);
  a.x = make_tensor_2d(buf.data() + 8, DType::fp32, 3, 4, int64_t{1} << 62);
  a.y = make_tensor_2d(buf.data(), DType::fp32, 3, 4, 4);
  a.w = make_tensor_1d(w, DType::fp32, 4);
  CHECK(rmsnorm(*rt, a).message() ==
        "x: row stride 4611686018427387904 over 3 rows spans past 2^60 elements (no tensor spans that)");
}

TEST_CASE("op edges: a size past 2^40 from a doubled dim keeps its span and batch checks") {
  auto rt = kdtest::make_runtime(std::vector<std::string>{});
  // silu_and_mul's x is [M, 2*d]: d = 2^40 is allowed, so x [3, 2^41] is
  // within the dims' rule; its span was not checked (a size past 2^40 was
  // left to that rule) and a row stride of 2^62 reached the kernel's ld.
  // Validation refuses it before any launch: the buffers are never read.
  std::vector<uint16_t> buf(64, 0);
  const int64_t d = int64_t{1} << 40;
  SiluAndMulArgs s;
  s.out = make_tensor_2d(buf.data(), DType::bf16, 3, d, d);
  s.x = make_tensor_2d(buf.data() + 32, DType::bf16, 3, 2 * d, int64_t{1} << 62);
  CHECK(silu_and_mul(*rt, s).message() ==
        "x: row stride 4611686018427387904 over 3 rows spans past 2^60 elements (no tensor spans that)");
  // fused_moe's w1 is [E, 2*I, H]: I = 2^39 + 1 (from w2) makes w1's rows
  // 2^40 + 2; its batch stride of -5 (expert 1 below w1's data, where the
  // overlap check does not look) was accepted.
  const int64_t I = (int64_t{1} << 39) + 1;
  FusedMoeArgs f;
  f.hidden = make_tensor_2d(buf.data(), DType::bf16, 1, 1, 1);
  f.out = make_tensor_2d(buf.data() + 8, DType::bf16, 1, 1, 1);
  float tw = 1.f;
  int32_t ids = 0;
  f.topk_weights = make_tensor_2d(&tw, DType::fp32, 1, 1, 1);
  f.topk_ids = make_tensor_2d(&ids, DType::int32, 1, 1, 1);
  f.w2 = kdtest::tensor_3d(buf.data() + 40, DType::bf16, 2, 1, I);
  f.w1 = kdtest::tensor_3d(buf.data() + 24, DType::bf16, 2, 2 * I, 1);
  f.w1.strides[0] = -5;
  CHECK(fused_moe(*rt, f).message() ==
        "w1: batch stride -5 must be rows * row stride = 1099511627778 (the matrices stacked densely, as a contiguous "
        "[E, N, K] weight); a strided batch is not supported: pass a contiguous copy");
  // A size past 2^60 is still left to the dims' rule, which names the dim.
  s.out = make_tensor_2d(buf.data(), DType::bf16, 1, int64_t{1} << 61, int64_t{1} << 61);
  s.x = make_tensor_2d(buf.data() + 32, DType::bf16, 1, int64_t{1} << 62, int64_t{1} << 62);
  CHECK(silu_and_mul(*rt, s).message() ==
        "out: shape [1, 2305843009213693952]: d = 2305843009213693952 is over the largest supported size, 2^40");
}

TEST_CASE("op edges: moe_align at M = 0 still writes, so its buffers' overlaps are still checked") {
  // moe_align launches at M = 0 (num_tokens_post_pad = 0); the overlap
  // checks were skipped at M = 0, so a num_tokens_post_pad inside the
  // read-only expert_map was accepted and expert_map[2] set to 0.
  auto rt = kdtest::make_runtime(std::vector<std::string>{});
  int32_t ids[1] = {0}, sorted[8] = {}, experts[8] = {}, expert_map[4] = {10, 11, 12, 13};
  MoeAlignArgs a;
  a.topk_ids = make_tensor_2d(ids, DType::int32, 0, 1, 1);
  a.sorted_token_ids = make_tensor_1d(sorted, DType::int32, 8);
  a.expert_ids = make_tensor_1d(experts, DType::int32, 8);
  a.num_tokens_post_pad = make_tensor_1d(expert_map + 2, DType::int32, 1);
  a.expert_map = make_tensor_1d(expert_map, DType::int32, 4);
  a.num_experts = 4;
  a.block_size = 2;
  CHECK(moe_align(*rt, a).message() == "num_tokens_post_pad: overlaps an input (expert_map)");
  CHECK(expert_map[2] == 12);
  a.expert_map = TensorRef{};
  a.num_tokens_post_pad = make_tensor_1d(sorted + 3, DType::int32, 1);  // inside sorted_token_ids
  CHECK(moe_align(*rt, a).message() == "sorted_token_ids: overlaps num_tokens_post_pad (both are written)");
  // Apart, M = 0 runs as before: num_tokens_post_pad = 0.
  int32_t post = 7;
  a.num_tokens_post_pad = make_tensor_1d(&post, DType::int32, 1);
  REQUIRE(moe_align(*rt, a).ok());
  CHECK(post == 0);
}

TEST_CASE("op edges: the column halves of one buffer do not overlap, one column more does") {
  // x = t[:, :4] and y = t[:, 4:] of one [3, 8] buffer (row stride 8): their
  // bounding spans cross, their bytes do not; this was refused as "y:
  // partially overlaps x".
  auto rt = kdtest::make_runtime(std::vector<std::string>{});
  float t[24], w[4] = {1, 1, 1, 1};
  for (int i = 0; i < 24; ++i) t[i] = static_cast<float>(i % 8 < 4 ? 2 : -1);
  RmsNormArgs a;
  a.x = make_tensor_2d(t, DType::fp32, 3, 4, 8);
  a.y = make_tensor_2d(t + 4, DType::fp32, 3, 4, 8);
  a.w = make_tensor_1d(w, DType::fp32, 4);
  REQUIRE(rmsnorm(*rt, a).ok());
  for (int r = 0; r < 3; ++r) {
    CHECK(t[8 * r] == 2.f);                                     // x is as it was
    CHECK(t[8 * r + 4] == doctest::Approx(1.f).epsilon(1e-5));  // y = 2 / rms(2) = 1
  }
  // y below x (t[:, 4:] read, t[:, :4] written) as well.
  a.x = make_tensor_2d(t + 4, DType::fp32, 3, 4, 8);
  a.y = make_tensor_2d(t, DType::fp32, 3, 4, 8);
  CHECK(rmsnorm(*rt, a).ok());
  // One column into x's rows: refused, nothing written.
  for (int i = 0; i < 24; ++i) t[i] = 5.f;
  a.x = make_tensor_2d(t, DType::fp32, 3, 4, 8);
  a.y = make_tensor_2d(t + 3, DType::fp32, 3, 4, 8);
  CHECK(rmsnorm(*rt, a).message() ==
        "y: partially overlaps x (in place is allowed only with y == x and equal row strides)");
  // y's last column past the stride (it wraps into x's next row): refused.
  a.y = make_tensor_2d(t + 5, DType::fp32, 3, 4, 8);
  CHECK(rmsnorm(*rt, a).message() ==
        "y: partially overlaps x (in place is allowed only with y == x and equal row strides)");
  CHECK(t[5] == 5.f);
  // Row strides that differ: the bounding spans decide (conservative).
  float u[40];
  a.x = make_tensor_2d(u, DType::fp32, 3, 4, 8);
  a.y = make_tensor_2d(u + 4, DType::fp32, 3, 4, 12);
  CHECK(rmsnorm(*rt, a).message() ==
        "y: partially overlaps x (in place is allowed only with y == x and equal row strides)");
}
