// SPDX-License-Identifier: Apache-2.0
// The security model's claim, tested (docs/security.md): whoever can write a
// config dir can make kdispatch choose among its valid variants and config
// points, and nothing else. Every row below is hostile — params outside the
// variant's space, negative, 2^40, INT64_MAX, wrong types, variants of another
// op, dtype or backend, unknown names — and each is dropped at load and
// reported; the calls then give the reference's answer and never write
// outside their output (guard words around every buffer).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "backends/registry.hpp"
#include "core/op.hpp"
#include "dispatch/dispatch.hpp"
#include "test_util.hpp"

using namespace dispatch;
using kdtest::TempDir;

namespace {

// Hostile rows for every CPU variant of `op` computing fp32: each param of
// each variant set to values outside its space, one row per (variant,
// param, value), M = 1, 2, 3, ...; then rows naming other variants. Returns
// the file's JSON and the number of rows.
std::string hostile_rows(core::OpKind op, int64_t* n) {
  std::string json = "{";
  int64_t m = 0;
  auto row = [&](const std::string& body) {
    if (m > 0) json += ", ";
    ++m;
    json += "\"" + std::to_string(m) + "\": {" + body + "}";
  };
  for (const core::VariantDef* v : core::all_variants()) {
    if (v->op != op || v->backend != DeviceType::cpu || v->in_dtype != DType::fp32) continue;
    const std::string name = "\"variant\": \"" + std::string(v->name) + "\"";
    for (const core::ParamDef& p : v->params) {
      int64_t hi = std::numeric_limits<int64_t>::min();
      for (int64_t x : p.values) hi = std::max(hi, x);
      const std::string k = "\"" + std::string(p.name) + "\": ";
      for (const std::string& bad :
           {std::to_string(hi + 1), std::string("-1"), std::string("1099511627776"), std::string("9223372036854775807"),
            std::string("-9223372036854775808"), std::string("\"abc\""), std::string("1.5"), std::string("true")})
        row(name + ", " + k + bad);
    }
  }
  for (const core::VariantDef* v : core::all_variants())  // right op, wrong dtype or backend; other ops
    if (v->op != op || v->in_dtype != DType::fp32 || v->backend != DeviceType::cpu)
      row("\"variant\": \"" + std::string(v->name) + "\"");
  row("\"variant\": \"no_such_variant\"");
  row("\"variant\": 7");
  json += "}";
  *n = m;
  return json;
}

// A buffer of `n` floats between guard words; data() is the inside.
struct Guarded {
  static constexpr float kGuard = -12345.f;
  explicit Guarded(size_t n, float fill = 0.f) : v(n + 64, kGuard) {
    for (size_t i = 0; i < n; ++i) v[32 + i] = fill;
    size = n;
  }
  float* data() { return v.data() + 32; }
  bool guards_intact() const {
    for (size_t i = 0; i < 32; ++i)
      if (v[i] != kGuard || v[32 + size + i] != kGuard) return false;
    return true;
  }
  std::vector<float> v;
  size_t size;
};

}  // namespace

TEST_CASE(
    "hostile configs: rows outside every variant's space are dropped and reported, and calls stay correct and in "
    "bounds") {
  const std::string device = cpu_device_info().device_name;
  TempDir dir;
  const int64_t H = 48, N = 40, K = 56;
  int64_t n_norm = 0, n_gemm = 0;
  kdtest::write_text(dir / ("cpu/rmsnorm/hidden=" + std::to_string(H) + ",device_name=" + device + ",dtype=fp32.json"),
                     hostile_rows(core::OpKind::rmsnorm, &n_norm));
  kdtest::write_text(dir / ("cpu/gemm/N=" + std::to_string(N) + ",K=" + std::to_string(K) + ",device_name=" + device +
                            ",dtype=fp32.json"),
                     hostile_rows(core::OpKind::gemm, &n_gemm));
  REQUIRE(n_norm > 20);
  REQUIRE(n_gemm > 20);
  RuntimeOptions o;
  o.config_dirs = {dir.str()};
  o.load_shipped_configs = false;
  o.tune.load_cache = o.tune.persist = false;
  o.log_level = LogLevel::off;
  auto rt = Runtime::create(o).value();
  const LoadReport rep = rt->load_report();
  REQUIRE(rep.files.size() == 2);
  int64_t problems = 0;
  for (const FileReport& f : rep.files) {
    CAPTURE(f.path);
    CHECK(f.state == FileReport::State::skipped);  // no row survives
    CHECK(f.rows == 0);
    problems += static_cast<int64_t>(f.problems.size());
  }
  CHECK(problems >= n_norm + n_gemm);  // every hostile row reported (plus the file's "no usable rows")
  CHECK(rep.rows == 0);

  for (int64_t M : {1, 2, 7, 64, 200}) {
    CAPTURE(M);
    // rmsnorm, in place and out of place
    Guarded x(static_cast<size_t>(M * H)), y(static_cast<size_t>(M * H)), w(static_cast<size_t>(H));
    for (int64_t i = 0; i < M * H; ++i) x.data()[i] = std::sin(0.37f * static_cast<float>(i)) * 3.f;
    for (int64_t i = 0; i < H; ++i) w.data()[i] = 0.5f + 0.01f * static_cast<float>(i);
    DispatchInfo info;
    REQUIRE(rmsnorm(*rt,
                    {make_tensor_2d(y.data(), DType::fp32, M, H, H), make_tensor_2d(x.data(), DType::fp32, M, H, H),
                     make_tensor_1d(w.data(), DType::fp32, H), 1e-6f},
                    {}, {.info = &info})
                .ok());
    CHECK(info.source == PlanSource::fallback);
    double err = 0;
    for (int64_t t = 0; t < M; ++t) {
      double ss = 0;
      for (int64_t h = 0; h < H; ++h) ss += double(x.data()[t * H + h]) * x.data()[t * H + h];
      const double inv = 1.0 / std::sqrt(ss / H + 1e-6);
      for (int64_t h = 0; h < H; ++h)
        err = std::max(err, std::fabs(y.data()[t * H + h] - x.data()[t * H + h] * inv * w.data()[h]));
    }
    CHECK(err < 1e-4);
    CHECK(x.guards_intact());
    CHECK(y.guards_intact());
    CHECK(w.guards_intact());
    // gemm
    Guarded a(static_cast<size_t>(M * K)), b(static_cast<size_t>(N * K)), d(static_cast<size_t>(M * N));
    for (int64_t i = 0; i < M * K; ++i) a.data()[i] = std::cos(0.11f * static_cast<float>(i));
    for (int64_t i = 0; i < N * K; ++i) b.data()[i] = std::sin(0.07f * static_cast<float>(i));
    REQUIRE(gemm(*rt, {make_tensor_2d(a.data(), DType::fp32, M, K, K),
                       make_tensor_2d(b.data(), DType::fp32, N, K, K),
                       make_tensor_2d(d.data(), DType::fp32, M, N, N),
                       {}})
                .ok());
    double gerr = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += double(a.data()[i * K + k]) * b.data()[j * K + k];
        gerr = std::max(gerr, std::fabs(d.data()[i * N + j] - s));
      }
    CHECK(gerr < 1e-3);
    CHECK(a.guards_intact());
    CHECK(b.guards_intact());
    CHECK(d.guards_intact());
  }
}
