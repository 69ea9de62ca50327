// SPDX-License-Identifier: Apache-2.0
// The fp8 GEMM ops (gemm_fp8_tensor, gemm_fp8_rowwise, gemm_fp8_block) on
// the CPU, beyond what every op gets from tests/test_ops.cpp: a result
// worked by hand, every scale layout at M in {1, 3, 5, 17, 65, 1023} with
// partial 128-blocks along N and K, the M-major scale_a with a padded row
// stride, what zero, inf and NaN scales give, the errors that name the
// argument, and the fast_accum switch (key accum=fast).
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "api/validate.hpp"
#include "core/numeric.hpp"
#include "dispatch/dispatch.hpp"
#include "ops/specs.hpp"
#include "store/filename.hpp"
#include "table/key.hpp"
#include "test_util.hpp"
#include "tune/search.hpp"

using namespace dispatch;

namespace {

std::unique_ptr<Runtime> quiet_runtime() {
  RuntimeOptions o = kdtest::options_for({});
  o.tune.mode = TuneMode::off;
  return kdtest::make_runtime(o);
}

uint8_t e4m3(float v) { return core::float_to_fp8(v, core::kE4m3fn, true); }
float dec(uint8_t b) { return core::fp8_to_float(b, core::kE4m3fn); }

enum class Layout { tensor, rowwise, block };

// One problem's host data: a [M, K] and b [N, K] e4m3fn bits, the scales in
// the layout's shapes (block: scale_a [ceil(K/128), lda_s] with lda_s >= M,
// the padding NaN so a read of it shows), d fp32, and the float64 answer.
struct Case {
  Layout layout;
  int64_t m, n, k, sa_ld;
  bool fast = false;  ///< GemmFp8Args::fast_accum of args()
  std::vector<uint8_t> a, b;
  std::vector<float> sa, sb, bias, d;
  std::vector<double> want;

  Case(Layout l, int64_t m_, int64_t n_, int64_t k_, std::mt19937& rng, bool with_bias = false, int64_t pad = 0)
      : layout(l), m(m_), n(n_), k(k_) {
    std::uniform_real_distribution<float> u(-2.f, 2.f), s(0.25f, 2.f);
    a.resize(static_cast<size_t>(m * k));
    b.resize(static_cast<size_t>(n * k));
    for (auto& x : a) x = e4m3(u(rng));
    for (auto& x : b) x = e4m3(u(rng));
    const int64_t kb = (k + 127) / 128, nb = (n + 127) / 128;
    sa_ld = m + pad;
    if (l == Layout::tensor) sa = {s(rng)}, sb = {s(rng)};
    if (l == Layout::rowwise) {
      sa.resize(static_cast<size_t>(m));
      sb.resize(static_cast<size_t>(n));
    }
    if (l == Layout::block) {
      sa.assign(static_cast<size_t>(kb * sa_ld), std::numeric_limits<float>::quiet_NaN());
      for (int64_t g = 0; g < kb; ++g)
        for (int64_t i = 0; i < m; ++i) sa[static_cast<size_t>(g * sa_ld + i)] = s(rng);
      sb.resize(static_cast<size_t>(nb * kb));
    }
    if (l != Layout::tensor) {
      if (l == Layout::rowwise)
        for (auto& x : sa) x = s(rng);
      for (auto& x : sb) x = s(rng);
    }
    if (with_bias) {
      bias.resize(static_cast<size_t>(n));
      for (auto& x : bias) x = u(rng);
    }
    d.assign(static_cast<size_t>(m * n), std::numeric_limits<float>::quiet_NaN());
    want.resize(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t l0 = 0; l0 < k; ++l0) {
          const int64_t g = l0 / 128;
          const double scale = l == Layout::tensor    ? double(sa[0]) * sb[0]
                               : l == Layout::rowwise ? double(sa[static_cast<size_t>(i)]) * sb[static_cast<size_t>(j)]
                                                      : double(sa[static_cast<size_t>(g * sa_ld + i)]) *
                                                            sb[static_cast<size_t>((j / 128) * kb + g)];
          acc += double(dec(a[static_cast<size_t>(i * k + l0)])) * dec(b[static_cast<size_t>(j * k + l0)]) * scale;
        }
        if (with_bias) acc += bias[static_cast<size_t>(j)];
        want[static_cast<size_t>(i * n + j)] = acc;
      }
  }

  GemmFp8Args args() {
    GemmFp8Args g;
    g.a = make_tensor_2d(a.data(), DType::fp8_e4m3fn, m, k, k);
    g.b = make_tensor_2d(b.data(), DType::fp8_e4m3fn, n, k, k);
    g.d = make_tensor_2d(d.data(), DType::fp32, m, n, n);
    const int64_t kb = (k + 127) / 128, nb = (n + 127) / 128;
    if (layout == Layout::tensor) {
      g.scale_a = make_tensor_1d(sa.data(), DType::fp32, 1);
      g.scale_b = make_tensor_1d(sb.data(), DType::fp32, 1);
    } else if (layout == Layout::rowwise) {
      g.scale_a = make_tensor_1d(sa.data(), DType::fp32, m);
      g.scale_b = make_tensor_1d(sb.data(), DType::fp32, n);
    } else {
      g.scale_a = make_tensor_2d(sa.data(), DType::fp32, kb, m, sa_ld);
      g.scale_b = make_tensor_2d(sb.data(), DType::fp32, nb, kb, kb);
    }
    if (!bias.empty()) g.bias = make_tensor_1d(bias.data(), DType::fp32, n);
    g.fast_accum = fast;
    return g;
  }

  Status run(Runtime& rt, const CallOptions& opts = {}) {
    GemmFp8Args g = args();
    switch (layout) {
      case Layout::tensor: return gemm_fp8_tensor(rt, GemmFp8TensorArgs{g}, {}, opts);
      case Layout::rowwise: return gemm_fp8_rowwise(rt, GemmFp8RowwiseArgs{g}, {}, opts);
      case Layout::block: return gemm_fp8_block(rt, GemmFp8BlockArgs{g}, {}, opts);
    }
    return Status();
  }

  // The largest |got - want| over max|want|.
  double rel_err() const {
    double scale = 0, worst = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    for (size_t i = 0; i < d.size(); ++i) worst = std::max(worst, std::fabs(double(d[i]) - want[i]));
    return worst / scale;
  }
};

const char* layout_name(Layout l) {
  return l == Layout::tensor ? "tensor" : l == Layout::rowwise ? "rowwise" : "block";
}

}  // namespace

TEST_CASE("gemm_fp8: a result worked by hand, per-tensor scales, bf16 out with a bias") {
  auto rt = quiet_runtime();
  // a = [[1, 2], [-0.5, 4]], b = [[3, 0.25], [1, 1]] (all exact in e4m3fn).
  uint8_t a[4] = {e4m3(1), e4m3(2), e4m3(-0.5f), e4m3(4)};
  uint8_t b[4] = {e4m3(3), e4m3(0.25f), e4m3(1), e4m3(1)};
  float sa = 0.5f, sb = 4.f;
  uint16_t d[4] = {}, bias[2] = {core::float_to_bf16(1.f), core::float_to_bf16(-2.f)};
  GemmFp8TensorArgs g;
  g.a = make_tensor_2d(a, DType::fp8_e4m3fn, 2, 2, 2);
  g.b = make_tensor_2d(b, DType::fp8_e4m3fn, 2, 2, 2);
  g.d = make_tensor_2d(d, DType::bf16, 2, 2, 2);
  g.scale_a = make_tensor_1d(&sa, DType::fp32, 1);
  g.scale_b = make_tensor_1d(&sb, DType::fp32, 1);
  g.bias = make_tensor_1d(bias, DType::bf16, 2);
  DispatchInfo info;
  REQUIRE(gemm_fp8_tensor(*rt, g, {}, {.info = &info}).ok());
  // row 0: (1*3 + 2*0.25) * 2 + 1 = 8, (1 + 2) * 2 - 2 = 4; row 1: (-1.5 + 1) * 2 + 1 = 0, (3.5) * 2 - 2 = 5.
  CHECK(core::bf16_to_float(d[0]) == 8.f);
  CHECK(core::bf16_to_float(d[1]) == 4.f);
  CHECK(core::bf16_to_float(d[2]) == 0.f);
  CHECK(core::bf16_to_float(d[3]) == 5.f);
  CHECK(info.source == PlanSource::fallback);
}

TEST_CASE("gemm_fp8: every scale layout at M in {1, 3, 5, 17, 65, 1023}, partial 128-blocks along N and K") {
  auto rt = quiet_runtime();
  std::mt19937 rng(2026);
  for (Layout l : {Layout::tensor, Layout::rowwise, Layout::block})
    for (int64_t m : {1, 3, 5, 17, 65, 1023}) {
      CAPTURE(layout_name(l));
      CAPTURE(m);
      // N = 136 and K = 264: two 128-blocks and a partial third along K, a partial second along N.
      Case c(l, m, 136, 264, rng, /*with_bias=*/m % 2 == 1, /*pad=*/l == Layout::block ? 3 : 0);
      REQUIRE(c.run(*rt).ok());
      CHECK(c.rel_err() < 1e-5);
    }
}

TEST_CASE("gemm_fp8_block: scale_a M-major with a padded row stride, the padding never read") {
  auto rt = quiet_runtime();
  std::mt19937 rng(7);
  Case c(Layout::block, 5, 130, 300, rng, false, /*pad=*/3);  // ld 8: cuBLASLt's multiple of 4
  REQUIRE(c.run(*rt).ok());
  CHECK(c.rel_err() < 1e-5);  // a NaN in the padding would have spread into d
  for (float v : c.d) CHECK(std::isfinite(v));
}

TEST_CASE("gemm_fp8: zero scales give zeros, inf and NaN scales reach exactly the outputs they scale") {
  auto rt = quiet_runtime();
  std::mt19937 rng(3);
  Case c(Layout::rowwise, 4, 8, 16, rng);
  // Every product sum nonzero: a and b all ones.
  std::fill(c.a.begin(), c.a.end(), e4m3(1.f));
  std::fill(c.b.begin(), c.b.end(), e4m3(1.f));
  c.sa = {0.f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 1.f};
  c.sb = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f};
  REQUIRE(c.run(*rt).ok());
  for (int64_t j = 0; j < 8; ++j) {
    CAPTURE(j);
    CHECK(c.d[static_cast<size_t>(0 * 8 + j)] == 0.f);                  // a zero scale: zeros
    CHECK(std::isinf(c.d[static_cast<size_t>(1 * 8 + j)]));             // inf: inf (the sum is 16)
    CHECK(std::isnan(c.d[static_cast<size_t>(2 * 8 + j)]));             // NaN: NaN
    CHECK(c.d[static_cast<size_t>(3 * 8 + j)] == 16.f * float(j + 1));  // untouched rows exact
  }
  // A zero product sum times an inf scale is NaN (0 * inf), as in torch._scaled_mm.
  std::fill(c.a.begin(), c.a.begin() + 16, e4m3(0.f));
  c.sa = {std::numeric_limits<float>::infinity(), 1.f, 1.f, 1.f};
  REQUIRE(c.run(*rt).ok());
  CHECK(std::isnan(c.d[0]));
}

TEST_CASE(
    "gemm_fp8_block: a K-major scale_a (the column-major view [K/128, M]) gives the M-major result bit for bit under "
    "the same key") {
  auto rt = quiet_runtime();
  std::mt19937 rng(11);
  for (int64_t m : {1, 3, 5, 17}) {
    INFO("M=", m);
    Case c(Layout::block, m, 130, 300, rng, true);
    std::string key_m, key_k;
    DispatchInfo info;
    info.key = &key_m;
    REQUIRE(c.run(*rt, {.info = &info}).ok());
    const std::vector<float> d_m = c.d;
    CHECK(c.rel_err() < 1e-5);
    // SGLang's per_token_group_quant_fp8 layout: [M, K/128] row-major, here
    // with one NaN of padding per row that must never be read.
    const int64_t kb = (c.k + 127) / 128, ld = kb + 1;
    std::vector<float> km(static_cast<size_t>(m * ld), std::numeric_limits<float>::quiet_NaN());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t g = 0; g < kb; ++g) km[static_cast<size_t>(i * ld + g)] = c.sa[static_cast<size_t>(g * c.sa_ld + i)];
    GemmFp8BlockArgs g{c.args()};
    g.scale_a.data = km.data();
    g.scale_a.strides[0] = 1;  // the transpose of [M, K/128]: torch's x_s.t()
    g.scale_a.strides[1] = ld;
    std::fill(c.d.begin(), c.d.end(), std::numeric_limits<float>::quiet_NaN());
    info.key = &key_k;
    REQUIRE(gemm_fp8_block(*rt, g, {}, {.info = &info}).ok());
    CHECK(c.d == d_m);  // the same variant, the same arithmetic
    CHECK(key_k == key_m);
    CHECK(!key_m.empty());
    // A column-major view needs unit row stride, and columns that do not
    // overlap (at M = 1 there is one column: any row stride is a layout).
    if (m > 1) {
      GemmFp8BlockArgs bad_rows = g;
      bad_rows.scale_a.strides[0] = 2;
      Status s = gemm_fp8_block(*rt, bad_rows);
      CHECK(s.code() == StatusCode::invalid_argument);
      CHECK(s.message().rfind("scale_a:", 0) == 0);
      CHECK(s.message().find("column-major") != std::string::npos);
      GemmFp8BlockArgs overlap = g;
      overlap.scale_a.strides[1] = kb - 1;
      s = gemm_fp8_block(*rt, overlap);
      CHECK(s.code() == StatusCode::invalid_argument);
      CHECK(s.message().find("column stride") != std::string::npos);
    }
  }
}

TEST_CASE("gemm_fp8_block: the sync tuner's copy of a K-major scale_a at K <= 128 covers what the variants read") {
  // One K group: x_s [M, 4] padded, scale_a = x_s[:, :1].t(), a [1, M] view
  // with column stride 4. The tuner copies extent_bytes() of it and runs
  // candidates on the copy with ld = -4 (found by the review: the copy was
  // M floats, the variants read (M - 1) * 4 + 1).
  const int64_t M = 8, N = 4, K = 128, s = 4;
  std::vector<uint8_t> a(M * K, 0x38), b(N * K, 0x38);
  std::vector<float> d(M * N), sb(1, 1.f), sa(M * s, 1.f);
  GemmFp8BlockArgs g;
  g.a = make_tensor_2d(a.data(), DType::fp8_e4m3fn, M, K, K);
  g.b = make_tensor_2d(b.data(), DType::fp8_e4m3fn, N, K, K);
  g.d = make_tensor_2d(d.data(), DType::fp32, M, N, N);
  g.scale_b = make_tensor_2d(sb.data(), DType::fp32, 1, 1, 1);
  g.scale_a.data = sa.data();
  g.scale_a.dtype = DType::fp32;
  g.scale_a.rank = 2;
  g.scale_a.shape[0] = 1, g.scale_a.shape[1] = M;
  g.scale_a.strides[0] = 1, g.scale_a.strides[1] = s;
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  REQUIRE(api::validate_gemm_fp8_block(g, &p, &la, &empty).ok());
  REQUIRE(la.ld[core::kFp8ArgSa] == -s);
  const tune::TuneTarget t = tune::make_target(p, la);
  CHECK(t.args[core::kFp8ArgSa].ld == -s);
  CHECK(t.args[core::kFp8ArgSa].extent_bytes() == static_cast<size_t>(((M - 1) * s + 1) * 4));
  // And the call itself, sync-tuned on its own buffers: 1 * 1 * 1 * 1 summed over K.
  auto rt = quiet_runtime();
  REQUIRE(gemm_fp8_block(*rt, g).ok());
  for (float v : d) CHECK(v == float(K));
}

TEST_CASE("gemm_fp8: errors name the argument: scale shapes, scale dtype, mixed formats, no fp8 on a float op") {
  auto rt = quiet_runtime();
  std::mt19937 rng(5);
  Case c(Layout::block, 3, 130, 200, rng);
  GemmFp8BlockArgs g{c.args()};
  // scale_a as a K-major [M, ceil(K/128)] (SGLang's default layout): refused, naming the shape.
  GemmFp8BlockArgs k_major = g;
  k_major.scale_a = make_tensor_2d(c.sa.data(), DType::fp32, 3, 2, 2);
  Status s = gemm_fp8_block(*rt, k_major);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().rfind("scale_a:", 0) == 0);
  // scale_b with one block too few along N.
  GemmFp8BlockArgs short_b = g;
  short_b.scale_b = make_tensor_2d(c.sb.data(), DType::fp32, 1, 2, 2);
  s = gemm_fp8_block(*rt, short_b);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().rfind("scale_b:", 0) == 0);
  // bf16 scales.
  std::vector<uint16_t> sa16(c.sa.size());
  GemmFp8BlockArgs bf = g;
  bf.scale_a = make_tensor_2d(sa16.data(), DType::bf16, 2, 3, 3);
  s = gemm_fp8_block(*rt, bf);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "scale_a: dtype bf16 must be fp32");
  // a in e5m2, b in e4m3fn.
  GemmFp8BlockArgs mixed = g;
  mixed.a.dtype = DType::fp8_e5m2;
  s = gemm_fp8_block(*rt, mixed);
  CHECK(s.code() == StatusCode::unsupported_problem);
  CHECK(s.message() == "a is fp8_e5m2 but b is fp8_e4m3fn: mixed input dtypes are not supported");
  // fp32 inputs: no variant (fp8 ops take fp8).
  std::vector<float> af(3 * 200), bfl(130 * 200);
  GemmFp8BlockArgs f32 = g;
  f32.a = make_tensor_2d(af.data(), DType::fp32, 3, 200, 200);
  f32.b = make_tensor_2d(bfl.data(), DType::fp32, 130, 200, 200);
  s = gemm_fp8_block(*rt, f32);
  CHECK(s.code() == StatusCode::unsupported_problem);
  CHECK(s.message().find("fp32 inputs") != std::string::npos);
  // And fp8 into the bf16/fp32 gemm: refused, not misread.
  GemmArgs plain;
  plain.a = g.a;
  plain.b = g.b;
  plain.d = g.d;
  s = gemm(*rt, plain);
  CHECK(s.code() == StatusCode::unsupported_problem);
  CHECK(s.message().find("fp8_e4m3fn inputs") != std::string::npos);
}

TEST_CASE("quant_fp8_token: scales from each token's amax, values worked by hand, an all-zero token") {
  auto rt = quiet_runtime();
  float x[8] = {896.f, -1.f, 0.5f, 0.f, 0.f, 0.f, 0.f, 0.f};
  uint8_t q[8] = {};
  float scale[2] = {};
  QuantFp8TokenArgs g;
  g.q = make_tensor_2d(q, DType::fp8_e4m3fn, 2, 4, 4);
  g.x = make_tensor_2d(x, DType::fp32, 2, 4, 4);
  g.scale = make_tensor_1d(scale, DType::fp32, 2);
  REQUIRE(quant_fp8_token(*rt, g).ok());
  CHECK(scale[0] == 2.f);  // 896 / 448
  CHECK(q[0] == 0x7e);     // 448
  CHECK(q[1] == 0xb0);     // -0.5
  CHECK(q[2] == 0x28);     // 0.25
  CHECK(q[3] == 0x00);
  CHECK(scale[1] == core::kQuantMinAmax / 448.f);  // SGLang's eps: no division by zero
  for (int i = 4; i < 8; ++i) CHECK(q[i] == 0x00);
}

TEST_CASE("quant_fp8_tensor: M = 0 still writes the scale of an empty x, the other layouts write nothing") {
  auto rt = quiet_runtime();
  float scale[2] = {99.f, 99.f};
  QuantFp8TensorArgs g;
  g.q = make_tensor_2d(nullptr, DType::fp8_e4m3fn, 0, 4, 4);  // torch.empty(0, K) may have no storage
  g.x = make_tensor_2d(nullptr, DType::bf16, 0, 4, 4);
  g.scale = make_tensor_1d(scale, DType::fp32, 1);
  DispatchInfo info;
  REQUIRE(quant_fp8_tensor(*rt, g, {}, {.info = &info}).ok());
  CHECK(scale[0] == core::kQuantMinAmax / 448.f);  // amax 0: SGLang's eps, as the reference
  CHECK(scale[1] == 99.f);
  CHECK(std::string(info.variant) == "quant_fp8_tensor_bf16__mul");
  g.scale = make_tensor_1d(nullptr, DType::fp32, 1);  // the one output it writes must be there
  CHECK(quant_fp8_tensor(*rt, g).message() == "scale: data is null");
  // Per token: the scales are [0] too, nothing is written.
  QuantFp8TokenArgs t;
  t.q = g.q, t.x = g.x, t.scale = make_tensor_1d(nullptr, DType::fp32, 0);
  CHECK(quant_fp8_token(*rt, t).ok());
}

TEST_CASE("quant_fp8_group then gemm_fp8_block: the engine's fp8 path stays within fp8's precision of fp32") {
  auto rt = quiet_runtime();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  const int64_t m = 7, n = 136, k = 264, kb = 3, nb = 2, lds = 8;  // scale row stride 8: a multiple of 4
  std::vector<float> x(static_cast<size_t>(m * k)), w(static_cast<size_t>(n * k));
  for (auto& v : x) v = u(rng);
  for (auto& v : w) v = u(rng) * 0.05f;
  // Activations through the op; weights quantised per 128x128 block here.
  std::vector<uint8_t> xq(static_cast<size_t>(m * k)), wq(static_cast<size_t>(n * k));
  std::vector<float> xs(static_cast<size_t>(kb * lds), std::numeric_limits<float>::quiet_NaN()),
      ws(static_cast<size_t>(nb * kb));
  QuantFp8GroupArgs qa;
  qa.q = make_tensor_2d(xq.data(), DType::fp8_e4m3fn, m, k, k);
  qa.x = make_tensor_2d(x.data(), DType::fp32, m, k, k);
  qa.scale = make_tensor_2d(xs.data(), DType::fp32, kb, m, lds);
  REQUIRE(quant_fp8_group(*rt, qa).ok());
  for (int64_t bj = 0; bj < nb; ++bj)
    for (int64_t g = 0; g < kb; ++g) {
      float amax = 0;
      for (int64_t j = bj * 128; j < std::min(n, bj * 128 + 128); ++j)
        for (int64_t l = g * 128; l < std::min(k, g * 128 + 128); ++l)
          amax = std::max(amax, std::fabs(w[static_cast<size_t>(j * k + l)]));
      const float s = amax / 448.f;
      ws[static_cast<size_t>(bj * kb + g)] = s;
      for (int64_t j = bj * 128; j < std::min(n, bj * 128 + 128); ++j)
        for (int64_t l = g * 128; l < std::min(k, g * 128 + 128); ++l)
          wq[static_cast<size_t>(j * k + l)] = e4m3(w[static_cast<size_t>(j * k + l)] / s);
    }
  std::vector<float> d(static_cast<size_t>(m * n)), ref(static_cast<size_t>(m * n));
  GemmFp8BlockArgs ga;
  ga.a = qa.q;
  ga.b = make_tensor_2d(wq.data(), DType::fp8_e4m3fn, n, k, k);
  ga.d = make_tensor_2d(d.data(), DType::fp32, m, n, n);
  ga.scale_a = qa.scale;
  ga.scale_b = make_tensor_2d(ws.data(), DType::fp32, nb, kb, kb);
  REQUIRE(gemm_fp8_block(*rt, ga).ok());
  GemmArgs fa;
  fa.a = make_tensor_2d(x.data(), DType::fp32, m, k, k);
  fa.b = make_tensor_2d(w.data(), DType::fp32, n, k, k);
  fa.d = make_tensor_2d(ref.data(), DType::fp32, m, n, n);
  REQUIRE(gemm(*rt, fa).ok());
  double scale = 0, worst = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    scale = std::max(scale, std::fabs(double(ref[i])));
    worst = std::max(worst, std::fabs(double(d[i]) - ref[i]));
  }
  MESSAGE("fp8 path vs fp32: max error " << worst / scale << " of max |d|");
  CHECK(worst / scale < 0.05);  // e4m3 keeps 3 mantissa bits: 2^-4 relative per element, averaged down by the sums
  CHECK(worst / scale > 1e-4);  // and it is fp8, not a float path in disguise
}

TEST_CASE("gemm_fp8 and quant_fp8_group: the contiguous M-major scales of M = 1 give the key of every other M") {
  // scale_a / scale [ceil(K/128), M] at M = 1 is a one-column matrix with row
  // stride 1: the contiguous layout, not a "unit row stride" layout (the key
  // of M = 1 gained a stride field, so tuned M = 1 rows were never hit).
  auto rt = quiet_runtime();
  constexpr int64_t N = 256, K = 384, KB = 3, NB = 2;
  std::vector<std::string> gemm_keys, quant_keys;
  for (int64_t M : {1, 4}) {
    std::vector<uint8_t> a(static_cast<size_t>(M * K), e4m3(1)), b(static_cast<size_t>(N * K), e4m3(0.5f)), q(a.size());
    std::vector<uint16_t> d(static_cast<size_t>(M * N)), x(static_cast<size_t>(M * K), core::float_to_bf16(1.f));
    std::vector<float> sa(static_cast<size_t>(KB * M), 1.f), sb(static_cast<size_t>(NB * KB), 1.f), s(sa.size());
    GemmFp8BlockArgs g;
    g.a = make_tensor_2d(a.data(), DType::fp8_e4m3fn, M, K, K);
    g.b = make_tensor_2d(b.data(), DType::fp8_e4m3fn, N, K, K);
    g.d = make_tensor_2d(d.data(), DType::bf16, M, N, N);
    g.scale_a = make_tensor_2d(sa.data(), DType::fp32, KB, M, M);
    g.scale_b = make_tensor_2d(sb.data(), DType::fp32, NB, KB, KB);
    DispatchInfo info;
    std::string key;
    info.key = &key;
    REQUIRE(gemm_fp8_block(*rt, g, {}, {.info = &info}).ok());
    CHECK(core::bf16_to_float(d[0]) == float(K) * 0.5f);
    gemm_keys.push_back(key);
    QuantFp8GroupArgs qa;
    qa.q = make_tensor_2d(q.data(), DType::fp8_e4m3fn, M, K, K);
    qa.x = make_tensor_2d(x.data(), DType::bf16, M, K, K);
    qa.scale = make_tensor_2d(s.data(), DType::fp32, KB, M, M);
    DispatchInfo qi;
    std::string qkey;
    qi.key = &qkey;
    REQUIRE(quant_fp8_group(*rt, qa, {}, {.info = &qi}).ok());
    CHECK(s[0] == 1.f / 448.f);
    quant_keys.push_back(qkey);
  }
  CHECK(gemm_keys[0] == gemm_keys[1]);
  CHECK(gemm_keys[0].find("stride") == std::string::npos);
  CHECK(quant_keys[0] == quant_keys[1]);
  CHECK(quant_keys[0].find("stride") == std::string::npos);
}

TEST_CASE("review: M = 1 scales as a column slice (row stride 7) share the contiguous key and give the same result") {
  // The one-column key fix maps [KB, 1] with row stride 1 and with row stride
  // 7 (a column of a wider scale buffer) to one key: the kernels must read
  // the runtime row stride, not assume the contiguous one.
  auto rt = quiet_runtime();
  constexpr int64_t N = 256, K = 384, KB = 3, NB = 2, M = 1;
  std::vector<uint16_t> x(static_cast<size_t>(M * K));
  for (size_t i = 0; i < x.size(); ++i) x[i] = core::float_to_bf16(0.25f * float(int(i % 13) - 6) * float(1 + i / 128));
  std::vector<uint8_t> b(static_cast<size_t>(N * K));
  for (size_t i = 0; i < b.size(); ++i) b[i] = e4m3(0.125f * float(int(i % 7) - 3));
  std::vector<float> sb(static_cast<size_t>(NB * KB));
  for (size_t i = 0; i < sb.size(); ++i) sb[i] = 0.5f + 0.25f * float(i);
  std::vector<std::string> keys;
  std::vector<std::vector<uint16_t>> outs;
  for (int64_t ld : {1, 7}) {
    std::vector<uint8_t> q(static_cast<size_t>(M * K));
    std::vector<float> s(static_cast<size_t>(KB * ld), -1.f);
    QuantFp8GroupArgs qa;
    qa.q = make_tensor_2d(q.data(), DType::fp8_e4m3fn, M, K, K);
    qa.x = make_tensor_2d(x.data(), DType::bf16, M, K, K);
    qa.scale = make_tensor_2d(s.data(), DType::fp32, KB, M, ld);
    REQUIRE(quant_fp8_group(*rt, qa, {}, {}).ok());
    for (int64_t kb = 0; kb < KB; ++kb) CHECK(s[static_cast<size_t>(kb * ld)] > 0.f);
    if (ld > 1) CHECK(s[1] == -1.f);  // the gap is not written
    std::vector<uint16_t> d(static_cast<size_t>(M * N));
    GemmFp8BlockArgs g;
    g.a = qa.q;
    g.b = make_tensor_2d(b.data(), DType::fp8_e4m3fn, N, K, K);
    g.d = make_tensor_2d(d.data(), DType::bf16, M, N, N);
    g.scale_a = qa.scale;
    g.scale_b = make_tensor_2d(sb.data(), DType::fp32, NB, KB, KB);
    DispatchInfo info;
    std::string key;
    info.key = &key;
    REQUIRE(gemm_fp8_block(*rt, g, {}, {.info = &info}).ok());
    keys.push_back(key);
    outs.push_back(d);
  }
  CHECK(keys[0] == keys[1]);
  CHECK(outs[0] == outs[1]);
}

// ---------------------------------------------------------------- fast_accum

namespace {

std::string fp8_op_name(Layout l) { return std::string("gemm_fp8_") + layout_name(l); }

}  // namespace

TEST_CASE(
    "gemm_fp8 fast_accum: a fast call's key is the precise key plus accum=fast, and the CPU variants give the precise "
    "output bit for bit") {
  const std::string dev = cpu_device_info().device_name;
  RuntimeOptions forced = kdtest::options_for({});
  forced.tune.mode = TuneMode::off;
  forced.force = {"gemm_fp8_tensor=gemm_fp8_tensor_e4m3fn__ref", "gemm_fp8_rowwise=gemm_fp8_rowwise_e4m3fn__ref",
                  "gemm_fp8_block=gemm_fp8_block_e4m3fn__ref"};
  auto rt = quiet_runtime();
  auto ref_rt = kdtest::make_runtime(forced);
  std::mt19937 rng(21);
  for (Layout l : {Layout::tensor, Layout::rowwise, Layout::block}) {
    CAPTURE(layout_name(l));
    const std::string op = fp8_op_name(l);
    for (Runtime* r : {rt.get(), ref_rt.get()}) {
      const bool ref = r == ref_rt.get();
      CAPTURE(ref);
      Case c(l, 3, 136, 264, rng, /*with_bias=*/true);
      std::string key_precise, key_fast;
      DispatchInfo info;
      info.key = &key_precise;
      REQUIRE(c.run(*r, {.info = &info}).ok());
      const std::string variant_precise = info.variant;
      const std::vector<float> d_precise = c.d;
      CHECK(c.rel_err() < 1e-5);
      c.fast = true;
      std::fill(c.d.begin(), c.d.end(), std::numeric_limits<float>::quiet_NaN());
      info.key = &key_fast;
      REQUIRE(c.run(*r, {.info = &info}).ok());
      CHECK(key_precise == "cpu/" + op + "|" + dev + "|K=264,N=136,bias=true,dtype=fp8_e4m3fn,out_dtype=fp32");
      CHECK(key_fast == "cpu/" + op + "|" + dev + "|K=264,N=136,accum=fast,bias=true,dtype=fp8_e4m3fn,out_dtype=fp32");
      // The same variant serves both (fp32 accumulation is a valid fast
      // accumulation), with the same arithmetic.
      CHECK(std::string(info.variant) == variant_precise);
      CHECK(variant_precise == (ref ? op + "_e4m3fn__ref" : op + "_e4m3fn__tiled"));
      CHECK(c.d == d_precise);
    }
  }
}

TEST_CASE(
    "gemm_fp8 fast_accum: a precise key names the committed configs/cuda/gemm_fp8_block file byte for byte, accum=fast "
    "names another") {
  namespace fs = std::filesystem;
  core::Problem p;
  p.op = core::OpKind::gemm_fp8_block;
  p.n = 1536;
  p.k = 7168;
  p.in_dtype = DType::fp8_e4m3fn;
  p.out_dtype = DType::bf16;
  table::KeyBuffer precise, fast;
  table::append_own_fields(p, &precise);
  const std::string precise_name = store::own_file_name(p.op, precise.view(), "NVIDIA_H200");
  CHECK(precise.view() == "K=7168,N=1536,dtype=fp8_e4m3fn,out_dtype=bf16");
  CHECK(precise_name == "N=1536,K=7168,device_name=NVIDIA_H200,dtype=fp8_e4m3fn,out_dtype=bf16.json");
  CHECK(fs::is_regular_file(fs::path(KDISPATCH_SOURCE_DIR) / "configs" / "cuda" / "gemm_fp8_block" / precise_name));
  p.accum = core::Accum::fast;
  table::append_own_fields(p, &fast);
  CHECK(fast.view() == "K=7168,N=1536,accum=fast,dtype=fp8_e4m3fn,out_dtype=bf16");
  const std::string fast_name = store::own_file_name(p.op, fast.view(), "NVIDIA_H200");
  CHECK(fast_name == "N=1536,K=7168,device_name=NVIDIA_H200,accum=fast,dtype=fp8_e4m3fn,out_dtype=bf16.json");
  // Both parse back to their accumulation; "precise" may be spelled out (the
  // precise key), anything else is named.
  for (const auto& [name, want] :
       {std::pair<std::string, core::Accum>{precise_name, core::Accum::precise},
        {fast_name, core::Accum::fast},
        {"N=1536,K=7168,device_name=NVIDIA_H200,accum=precise,dtype=fp8_e4m3fn,out_dtype=bf16.json",
         core::Accum::precise}}) {
    CAPTURE(name);
    auto fk = store::parse_file_name(name);
    REQUIRE(fk.ok());
    auto back = store::own_problem_from_fields(p.op, fk->fields);
    REQUIRE(back.ok());
    CHECK(back->accum == want);
    table::KeyBuffer again;
    table::append_own_fields(*back, &again);
    CHECK(again.view() == (want == core::Accum::fast ? fast.view() : precise.view()));
  }
  auto slow = store::parse_file_name("N=1536,K=7168,device_name=NVIDIA_H200,accum=slow,dtype=fp8_e4m3fn.json");
  REQUIRE(slow.ok());
  auto bad = store::own_problem_from_fields(p.op, slow->fields);
  CHECK(bad.status().code() == StatusCode::invalid_argument);
  CHECK(bad.status().message() == "field accum='slow' is not fast/precise");
  auto norm =
      store::own_problem_from_fields(core::OpKind::rmsnorm, {{"accum", "fast"}, {"dtype", "bf16"}, {"hidden", "8"}});
  CHECK(norm.status().message() == "unknown field 'accum' for op rmsnorm");
  // The shipped rows serve the precise key exactly as before; the fast key
  // has no row (the tuner never wrote one): the default.
  RuntimeOptions o = kdtest::options_for({});
  o.load_shipped_configs = true;
  o.tune.mode = TuneMode::off;
  auto rt = kdtest::make_runtime(o);
  LookupQuery q;
  q.op = "gemm_fp8_block";
  q.key = "N=1536,K=7168,dtype=fp8_e4m3fn,out_dtype=bf16";
  q.device = "NVIDIA H200";
  q.M = 64;
  auto hit = lookup(*rt, q);
  REQUIRE_MESSAGE(hit.ok(), hit.status().to_string());
  CHECK(hit->key == "cuda/gemm_fp8_block|NVIDIA_H200|K=7168,N=1536,dtype=fp8_e4m3fn,out_dtype=bf16");
  CHECK(hit->match == LookupResult::Match::exact);
  CHECK(hit->table_m == 64);
  CHECK(hit->source == "cuda/gemm_fp8_block/" + precise_name);
  CHECK(hit->variant == "gemm_fp8_block_e4m3fn__cublaslt");
  REQUIRE(config_find(hit->config, "algo_id") != nullptr);
  CHECK(config_find(hit->config, "algo_id")->i == 66);
  q.key += ",accum=fast";
  auto miss = lookup(*rt, q);
  if (miss.ok()) {  // a build with the CUDA backend: its get_default
    CHECK(miss->key == "cuda/gemm_fp8_block|NVIDIA_H200|K=7168,N=1536,accum=fast,dtype=fp8_e4m3fn,out_dtype=bf16");
    CHECK(miss->match == LookupResult::Match::fallback);
    CHECK(miss->table_m == -1);
  } else {
    CHECK(miss.status().code() == StatusCode::not_found);
    CHECK(miss.status().message() ==
          "no table row for cuda/gemm_fp8_block|NVIDIA_H200|K=7168,N=1536,accum=fast,dtype=fp8_e4m3fn,out_dtype=bf16, "
          "and no cuda backend in this build to compute a default");
  }
}

TEST_CASE(
    "gemm_fp8 fast_accum: a file named accum=fast loads and serves the fast calls only, the precise file the precise "
    "ones") {
  const std::string dev = cpu_device_info().device_name;
  kdtest::TempDir dir;
  const std::string fast_file = "N=136,K=264,device_name=" + dev + ",accum=fast,dtype=fp8_e4m3fn,out_dtype=fp32.json";
  const std::string precise_file = "N=136,K=264,device_name=" + dev + ",dtype=fp8_e4m3fn,out_dtype=fp32.json";
  kdtest::write_text(dir / ("cpu/gemm_fp8_rowwise/" + fast_file),
                     R"({"4": {"variant": "gemm_fp8_rowwise_e4m3fn__ref"}})");
  kdtest::write_text(dir / ("cpu/gemm_fp8_rowwise/" + precise_file),
                     R"({"16": {"variant": "gemm_fp8_rowwise_e4m3fn__tiled", "BLOCK_N": 1}})");
  RuntimeOptions o = kdtest::options_for({dir.str()});
  o.tune.mode = TuneMode::off;
  auto rt = kdtest::make_runtime(o);
  std::mt19937 rng(4);
  Case c(Layout::rowwise, 3, 136, 264, rng);
  DispatchInfo info;
  c.fast = true;
  REQUIRE(c.run(*rt, {.info = &info}).ok());
  CHECK(info.source == PlanSource::table);
  CHECK(info.table_m == 4);
  CHECK(std::string(info.variant) == "gemm_fp8_rowwise_e4m3fn__ref");
  CHECK(rt->source_path(info.source_id) == "cpu/gemm_fp8_rowwise/" + fast_file);
  CHECK(c.rel_err() < 1e-5);
  c.fast = false;
  REQUIRE(c.run(*rt, {.info = &info}).ok());
  CHECK(info.source == PlanSource::table);
  CHECK(info.table_m == 16);
  CHECK(std::string(info.variant) == "gemm_fp8_rowwise_e4m3fn__tiled");
  CHECK(rt->source_path(info.source_id) == "cpu/gemm_fp8_rowwise/" + precise_file);
  CHECK(c.rel_err() < 1e-5);
  // Without the precise file the precise call is a miss, never the fast row.
  std::filesystem::remove(dir / ("cpu/gemm_fp8_rowwise/" + precise_file));
  REQUIRE(rt->reload().ok());
  REQUIRE(c.run(*rt, {.info = &info}).ok());
  CHECK(info.source == PlanSource::fallback);
  CHECK(info.table_m == -1);
  CHECK(std::string(info.variant) == "gemm_fp8_rowwise_e4m3fn__tiled");
  c.fast = true;
  REQUIRE(c.run(*rt, {.info = &info}).ok());
  CHECK(info.source == PlanSource::table);
  CHECK(std::string(info.variant) == "gemm_fp8_rowwise_e4m3fn__ref");
  // lookup() sees the same: the fast key's exact row, the precise key's default.
  LookupQuery q;
  q.op = "gemm_fp8_rowwise";
  q.key = "N=136,K=264,dtype=fp8_e4m3fn,out_dtype=fp32,accum=fast";
  q.M = 4;
  auto r = lookup(*rt, q);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->match == LookupResult::Match::exact);
  CHECK(r->source == "cpu/gemm_fp8_rowwise/" + fast_file);
  CHECK(config_to_json(r->config) == R"({"variant": "gemm_fp8_rowwise_e4m3fn__ref"})");
  q.key = "N=136,K=264,dtype=fp8_e4m3fn,out_dtype=fp32";
  r = lookup(*rt, q);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->match == LookupResult::Match::fallback);
}

TEST_CASE(
    "gemm_fp8 fast_accum: pretune tunes what the call asks under its own key and file, validated with the fast "
    "tolerance") {
  const std::string dev = cpu_device_info().device_name;
  kdtest::TempDir cache;
  RuntimeOptions o = kdtest::options_for({});
  o.tune.cache_dir = cache.str();
  o.tune.mode = TuneMode::off;
  o.tune.cold_cache = false;
  o.tune.time_budget_ms = 20;
  o.tune.reps = 2;
  auto rt = kdtest::make_runtime(o);
  std::mt19937 rng(9);
  Case c(Layout::tensor, 5, 136, 264, rng);
  c.fast = true;
  auto r = pretune(*rt, GemmFp8TensorArgs{c.args()});
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->key == "cpu/gemm_fp8_tensor|" + dev + "|K=264,N=136,accum=fast,dtype=fp8_e4m3fn,out_dtype=fp32");
  CHECK(r->persisted);
  CHECK(r->rejected == 0);
  CHECK(std::filesystem::is_regular_file(cache / ("cpu/gemm_fp8_tensor/N=136,K=264,device_name=" + dev +
                                                  ",accum=fast,dtype=fp8_e4m3fn,out_dtype=fp32.json")));
  DispatchInfo info;
  REQUIRE(c.run(*rt, {.info = &info}).ok());
  CHECK(info.source == PlanSource::table);
  CHECK(info.table_m == 5);
  c.fast = false;  // the precise call: not served by the fast row
  REQUIRE(c.run(*rt, {.info = &info}).ok());
  CHECK(info.source == PlanSource::fallback);
  // By key, as `kdispatch tune` runs a shape list's row.
  auto k = pretune_key(*rt, "gemm_fp8_tensor", "N=136,K=264,dtype=fp8_e4m3fn,out_dtype=fp32,accum=fast", 7);
  REQUIRE_MESSAGE(k.ok(), k.status().to_string());
  CHECK(k->key == "cpu/gemm_fp8_tensor|" + dev + "|K=264,N=136,accum=fast,dtype=fp8_e4m3fn,out_dtype=fp32");
  auto dk = describe_key("gemm_fp8_tensor", "accum=fast,K=264,N=136,dtype=fp8_e4m3fn,out_dtype=fp32", 7);
  REQUIRE(dk.ok());
  CHECK(dk->key_fields == "N=136,K=264,accum=fast,dtype=fp8_e4m3fn,out_dtype=fp32");
  // The validation tolerance: the spec's per dtype for a precise problem,
  // the fast budget (atol 2e-2 x max|ref|, rtol 3.2e-2) for a fast one.
  core::Problem p;
  p.op = core::OpKind::gemm_fp8_block;
  double atol = 0, rtol = 0;
  tune::validation_tolerance(p, DType::fp32, &atol, &rtol);
  CHECK(atol == 1e-5);
  CHECK(rtol == 1e-4);
  tune::validation_tolerance(p, DType::bf16, &atol, &rtol);
  CHECK(atol == 8e-3);
  CHECK(rtol == 1.6e-2);
  p.accum = core::Accum::fast;
  for (DType t : {DType::fp32, DType::fp16, DType::bf16}) {
    tune::validation_tolerance(p, t, &atol, &rtol);
    CHECK(atol == 2e-2);
    CHECK(rtol == 3.2e-2);
  }
}

TEST_CASE("gemm_fp8 fast_accum: call_op takes the switch as 0 or 1 or leaves it out, and names a bad value") {
  auto rt = quiet_runtime();
  std::mt19937 rng(13);
  Case c(Layout::block, 3, 136, 264, rng);
  GemmFp8Args g = c.args();
  const std::vector<TensorRef> tensors = {g.a, g.b, g.d, g.scale_a, g.scale_b, g.bias};
  std::string key;
  DispatchInfo info;
  info.key = &key;
  const float on[] = {1.f}, half[] = {0.5f}, two[] = {0.f, 0.f};
  REQUIRE(call_op(*rt, "gemm_fp8_block", tensors, on, {}, {.info = &info}).ok());
  CHECK(key.find("|K=264,N=136,accum=fast,dtype=fp8_e4m3fn,out_dtype=fp32") != std::string::npos);
  REQUIRE(call_op(*rt, "gemm_fp8_block", tensors, {}, {}, {.info = &info}).ok());
  CHECK(key.find("|K=264,N=136,dtype=fp8_e4m3fn,out_dtype=fp32") != std::string::npos);
  Status s = call_op(*rt, "gemm_fp8_block", tensors, half);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "fast_accum: must be 0 or 1 (false or true: 1 asks for fast accumulation), got 0.5");
  const float near_one[] = {1.00000012f};  // printed so it is not read as 1
  CHECK(call_op(*rt, "gemm_fp8_block", tensors, near_one).message() ==
        "fast_accum: must be 0 or 1 (false or true: 1 asks for fast accumulation), got 1.0000001");
  s = call_op(*rt, "gemm_fp8_block", tensors, two);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "gemm_fp8_block takes 6 tensors and 0 to 1 scalars, got 6 and 2");
  auto pr = pretune_op(*rt, "gemm_fp8_block", tensors, half);
  CHECK(pr.status().message() == "fast_accum: must be 0 or 1 (false or true: 1 asks for fast accumulation), got 0.5");
  // The op list says what it is.
  for (const OpInfo& op : op_list())
    if (op.name.rfind("gemm_fp8_", 0) == 0) {
      CAPTURE(op.name);
      REQUIRE(op.scalars.size() == 1);
      CHECK(op.scalars[0].name == "fast_accum");
      CHECK(op.scalars[0].kind == "bool");
      CHECK(op.scalars[0].default_value == 0.f);
    } else {
      for (const OpScalarInfo& sc : op.scalars)  // moe_align's and moe_gemm's sizes are ints
        CHECK(sc.kind == (!sc.labels.empty()                                          ? "choice"
                          : op.name == "moe_align" || op.name.starts_with("moe_gemm") ? "int"
                                                                                      : "float"));
    }
}
