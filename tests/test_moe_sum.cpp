// SPDX-License-Identifier: Apache-2.0
// moe_sum on the CPU, beyond what every op gets from tests/test_ops.cpp
// (every variant and config point against the float64 reference, the key
// round trip, pretune, the C ABI's refusals): results worked by hand (the
// sum in ascending j, routed_scaling_factor, top_k = 1, one bf16 rounding),
// every variant and point equal to the reference bit for bit on padded
// rows, the errors that name the argument, and the key and file name of a
// call (a row of one top_k never serves another).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/registry.hpp"
#include "core/numeric.hpp"
#include "dispatch/c_api.h"
#include "dispatch/dispatch.hpp"
#include "dispatch/dlpack.hpp"
#include "ops/moe_sum.hpp"
#include "store/filename.hpp"
#include "test_util.hpp"

using namespace dispatch;

namespace {

std::unique_ptr<Runtime> quiet_runtime(std::vector<std::string> dirs = {}) {
  RuntimeOptions o = kdtest::options_for(std::move(dirs));
  o.tune.mode = TuneMode::off;
  return kdtest::make_runtime(o);
}

// M = 2 tokens, top_k = 3, hidden = 5 (one 4-lane vector and a tail), fp32:
//   token 0: [1, 2, 3, 4, 5] + [0.5, -1, 0.25, 2, -5] + [10, 0, -3, 1, 0.125]
//          = [11.5, 1, 0.25, 7, 0.125]
//   token 1: [-1, -2, -3, -4, -5] + [1, 1, 1, 1, 1] + [0.125, 0.25, 0.5, 1, 2]
//          = [0.125, -0.75, -1.5, -2, -2]
// every value exact in fp32.
struct Tiny {
  std::vector<float> in{1.f,  2.f,  3.f,  4.f,  5.f,  0.5f, -1.f, 0.25f, 2.f, -5.f, 10.f,   0.f,   -3.f, 1.f, 0.125f,
                        -1.f, -2.f, -3.f, -4.f, -5.f, 1.f,  1.f,  1.f,   1.f, 1.f,  0.125f, 0.25f, 0.5f, 1.f, 2.f};
  std::vector<float> out = std::vector<float>(10, std::nanf(""));
  MoeSumArgs args(float rsf = 1.f, int64_t top_k = 3) {
    MoeSumArgs a;
    a.input = kdtest::tensor_3d(in.data(), DType::fp32, 2, top_k, 5);
    a.out = make_tensor_2d(out.data(), DType::fp32, 2, 5, 5);
    a.routed_scaling_factor = rsf;
    return a;
  }
};

}  // namespace

TEST_CASE("moe_sum: results worked by hand: the sum, routed_scaling_factor, top_k = 1") {
  auto rt = quiet_runtime();
  Tiny t;
  DispatchInfo info;
  CallOptions o;
  o.info = &info;
  REQUIRE(moe_sum(*rt, t.args(), {}, o).ok());
  CHECK(std::string(info.variant) == "moe_sum_fp32__vec");  // hidden >= 4: the vector rows
  const std::vector<float> want{11.5f, 1.f, 0.25f, 7.f, 0.125f, 0.125f, -0.75f, -1.5f, -2.f, -2.f};
  CHECK(t.out == want);
  // DeepSeek's routed_scaling_factor scales the sum (2.5: exact here).
  REQUIRE(moe_sum(*rt, t.args(2.5f)).ok());
  const std::vector<float> scaled{28.75f, 2.5f, 0.625f, 17.5f, 0.3125f, 0.3125f, -1.875f, -3.75f, -5.f, -5.f};
  CHECK(t.out == scaled);
  // top_k = 1 (input [2, 1, 5]: the first 10 values): out = factor * input.
  REQUIRE(moe_sum(*rt, t.args(2.f, 1)).ok());
  const std::vector<float> copied{2.f, 4.f, 6.f, 8.f, 10.f, 1.f, -2.f, 0.5f, 4.f, -10.f};
  CHECK(t.out == copied);
}

TEST_CASE("moe_sum: bf16 sums in fp32 and rounds once to bf16") {
  // Choices 1, 3 * 2^-10, 3 * 2^-10 (each exact in bf16): the fp32 sum
  // 1.005859375 rounds once to bf16's 1.0078125; rounding after each add
  // (1 + 3 * 2^-10 -> 1, twice) would give 1. Eight columns: the vector
  // rows, then the same in column 0 of a 1-column call (the reference).
  auto rt = quiet_runtime();
  for (int64_t hidden : {8, 1}) {
    CAPTURE(hidden);
    std::vector<uint16_t> in(static_cast<size_t>(3 * hidden)), out(static_cast<size_t>(hidden), 0xffff);
    for (int64_t h = 0; h < hidden; ++h) {
      in[static_cast<size_t>(h)] = core::float_to_bf16(1.f);
      in[static_cast<size_t>(hidden + h)] = core::float_to_bf16(3.f / 1024.f);
      in[static_cast<size_t>(2 * hidden + h)] = core::float_to_bf16(3.f / 1024.f);
    }
    MoeSumArgs a;
    a.input = kdtest::tensor_3d(in.data(), DType::bf16, 1, 3, hidden);
    a.out = make_tensor_2d(out.data(), DType::bf16, 1, hidden, hidden);
    REQUIRE(moe_sum(*rt, a).ok());
    for (uint16_t v : out) CHECK(core::bf16_to_float(v) == 1.0078125f);
  }
}

TEST_CASE("moe_sum: every CPU variant and point equals the reference bit for bit, on padded rows") {
  const int64_t M = 17, K = 6, H = 37, ldi = 40, ldo = 41;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  std::vector<float> in(static_cast<size_t>(M * K * ldi));
  for (float& x : in) x = u(rng);
  std::vector<uint16_t> in_bf(in.size());
  for (size_t i = 0; i < in.size(); ++i) in_bf[i] = core::float_to_bf16(in[i]);
  const DeviceInfo& dev = cpu_device_info();
  for (DType dt : {DType::fp32, DType::bf16}) {
    CAPTURE(dtype_name(dt));
    const size_t es = dt == DType::fp32 ? 4 : 2;
    core::Problem p;
    p.op = core::OpKind::moe_sum;
    p.device = Device{DeviceType::cpu, 0};
    p.in_dtype = p.out_dtype = dt;
    p.m = M, p.n = H, p.k = K;
    auto run = [&](const core::VariantDef& v, const int64_t* prm) {
      std::vector<char> out(static_cast<size_t>(M * ldo) * es, '\x7f');
      core::LaunchArgs la;
      la.data[core::kMoeSumArgInput] = dt == DType::fp32 ? static_cast<void*>(in.data()) : in_bf.data();
      la.ld[core::kMoeSumArgInput] = ldi;
      la.data[core::kMoeSumArgOut] = out.data();
      la.ld[core::kMoeSumArgOut] = ldo;
      la.scalar[0] = 0.75f;
      REQUIRE(v.launch(la, p, prm).ok());
      return out;
    };
    const core::VariantDef* ref = core::reference_variant(core::OpKind::moe_sum, DeviceType::cpu, dt);
    REQUIRE(ref != nullptr);
    const std::vector<char> want = run(*ref, nullptr);
    int points = 0;
    for (const core::VariantDef* v : core::variants_for(core::OpKind::moe_sum, DeviceType::cpu)) {
      if (v->in_dtype != dt || v == ref) continue;
      for (int64_t vec : {4, 8, 16})
        for (int64_t unroll : {1, 2, 4}) {
          const int64_t prm[core::kMaxParams] = {vec, unroll};
          if (!v->supports(p, prm, dev).ok()) continue;  // a vec width this host lacks
          CAPTURE(vec);
          CAPTURE(unroll);
          CHECK(run(*v, prm) == want);  // the padding between rows untouched too
          ++points;
        }
    }
    CHECK(points >= 3);  // vec 4 (the x86-64 baseline) x 3 unrolls at least
  }
}

TEST_CASE("moe_sum: errors name the argument: rank, dtypes, shapes, top_k, routed_scaling_factor") {
  auto rt = quiet_runtime();
  Tiny t;
  MoeSumArgs a = t.args();
  // input as a 2-D [M * top_k, hidden] matrix: the op wants the 3-D tensor.
  a.input = make_tensor_2d(t.in.data(), DType::fp32, 6, 5, 5);
  Status s = moe_sum(*rt, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "input: must be rank 3, got rank 2");
  // out of another dtype than input.
  std::vector<uint16_t> ob(10, 0);
  a = t.args();
  a.out = make_tensor_2d(ob.data(), DType::bf16, 2, 5, 5);
  s = moe_sum(*rt, a);
  CHECK(s.code() == StatusCode::unsupported_problem);
  CHECK(kdtest::contains(s.message(), "input"));
  CHECK(kdtest::contains(s.message(), "out"));
  CHECK(ob[0] == 0);
  // out of another hidden, of another M.
  a = t.args();
  a.out = make_tensor_2d(t.out.data(), DType::fp32, 2, 4, 5);
  s = moe_sum(*rt, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message().rfind("out: shape [2, 4]", 0) == 0);
  a.out = make_tensor_2d(t.out.data(), DType::fp32, 1, 5, 5);
  s = moe_sum(*rt, a);
  CHECK(s.message().rfind("out: shape [1, 5]", 0) == 0);
  // top_k = 0 (nothing to sum) and hidden = 0.
  s = moe_sum(*rt, t.args(1.f, 0));
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "input: hidden and top_k must be >= 1, got shape [2, 0, 5]");
  // The tokens' choices not stacked densely (every other choice row of a larger tensor).
  a = t.args(1.f, 1);
  a.input.strides[0] = 10;
  s = moe_sum(*rt, a);
  CHECK(s.message().rfind("input: batch stride 10 must be rows * row stride = 5", 0) == 0);
  // out overlapping input.
  a = t.args();
  a.out = make_tensor_2d(t.in.data() + 3, DType::fp32, 2, 5, 5);
  s = moe_sum(*rt, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(kdtest::contains(s.message(), "overlap"));
  // routed_scaling_factor must be > 0 and finite (inf made the sum inf).
  for (float rsf : {0.f, -1.f, std::nanf(""), std::numeric_limits<float>::infinity()}) {
    CAPTURE(rsf);
    s = moe_sum(*rt, t.args(rsf));
    CHECK(s.code() == StatusCode::invalid_argument);
    CHECK(s.message().rfind("routed_scaling_factor: must be > 0", 0) == 0);
  }
  CHECK(moe_sum(*rt, t.args(std::numeric_limits<float>::infinity())).message() ==
        "routed_scaling_factor: must be > 0 and finite, got inf");
  CHECK(std::isnan(t.out[0]));  // nothing refused ever wrote
}

TEST_CASE("moe_sum: a call's key and file name, padded rows, and a row of one top_k never serves another") {
  const std::string dev = cpu_device_info().device_name;
  kdtest::TempDir dir;
  // A row for top_k = 3 that forces the reference, as a config file would.
  kdtest::write_text(dir / ("cpu/moe_sum/hidden=5,top_k=3,device_name=" + dev + ",dtype=fp32.json"),
                     "{\"2\": {\"variant\": \"moe_sum_fp32__ref\"}}");
  auto rt = quiet_runtime({dir.str()});
  Tiny t;
  std::string key;
  DispatchInfo info;
  info.key = &key;
  CallOptions o;
  o.info = &info;
  REQUIRE(moe_sum(*rt, t.args(), {}, o).ok());
  CHECK(key == "cpu/moe_sum|" + dev + "|dtype=fp32,hidden=5,top_k=3");
  CHECK(info.source == PlanSource::table);
  CHECK(std::string(info.variant) == "moe_sum_fp32__ref");
  // top_k = 2 has its own key: the top_k = 3 row does not serve it.
  REQUIRE(moe_sum(*rt, t.args(1.f, 2), {}, o).ok());
  CHECK(key == "cpu/moe_sum|" + dev + "|dtype=fp32,hidden=5,top_k=2");
  CHECK(info.source == PlanSource::fallback);
  // The file name grammar, both ways.
  CHECK(store::own_file_name(core::OpKind::moe_sum, "dtype=bf16,hidden=7168,top_k=8", "NVIDIA_H200") ==
        "hidden=7168,top_k=8,device_name=NVIDIA_H200,dtype=bf16.json");
  auto f = store::parse_key_fields("dtype=bf16,hidden=7168,top_k=8");
  REQUIRE(f.ok());
  auto p = store::own_problem_from_fields(core::OpKind::moe_sum, *f);
  REQUIRE_MESSAGE(p.ok(), p.status().to_string());
  CHECK(p->n == 7168);
  CHECK(p->k == 8);
  CHECK(p->in_dtype == DType::bf16);
  // Padded rows of input (row stride 8 > hidden 5) are the default layout's
  // class: the same key, served by the same row.
  std::vector<float> padded(2 * 3 * 8, 1.f);
  MoeSumArgs a = t.args();
  a.input.strides[1] = 8;
  a.input.strides[0] = 24;
  a.input.data = padded.data();
  REQUIRE(moe_sum(*rt, a, {}, o).ok());
  CHECK(key == "cpu/moe_sum|" + dev + "|dtype=fp32,hidden=5,top_k=3");
  CHECK(info.source == PlanSource::table);
  CHECK(t.out[0] == 3.f);
}

TEST_CASE("moe_sum: the C ABI's kdispatch_moe_sum takes (input, out, routed_scaling_factor)") {
  Tiny t;
  int64_t in_shape[3] = {2, 3, 5}, out_shape[2] = {2, 5};
  DLTensor in{}, out{};
  in.data = t.in.data();
  in.device = {kDLCPU, 0};
  in.ndim = 3;
  in.dtype = {kDLFloat, 32, 1};
  in.shape = in_shape;
  out = in;
  out.data = t.out.data();
  out.ndim = 2;
  out.shape = out_shape;
  kdispatch_options opts;
  kdispatch_options_init(&opts);
  opts.load_shipped_configs = 0;
  opts.log_level = KDISPATCH_LOG_OFF;
  kdispatch_runtime* rt = nullptr;
  REQUIRE(kdispatch_runtime_create(&opts, &rt) == KDISPATCH_OK);
  CHECK(kdispatch_moe_sum(rt, &in, &out, 2.f, nullptr, 0, nullptr) == KDISPATCH_OK);
  CHECK(t.out[0] == 23.f);
  CHECK(t.out[9] == -4.f);
  CHECK(kdispatch_moe_sum(rt, &in, &out, 0.f, nullptr, 0, nullptr) == KDISPATCH_INVALID_ARGUMENT);
  kdispatch_runtime_destroy(rt);
}
