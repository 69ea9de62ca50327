// SPDX-License-Identifier: Apache-2.0
// GPU moe_sum kernels: every variant and every point of its space on random
// inputs, outputs poisoned before each run, every element checked written
// and every padding element untouched, each result (1) bit for bit the host's
// fp32 arithmetic (choices added in ascending order, scaled, rounded once:
// the op is deterministic, so every variant and point gives the same bits)
// and (2) within the spec's tolerance of its float64 reference; tokens 1 ..
// 1025, top_k 1 .. 8, hidden not a multiple of the vector, padded row
// strides and misaligned bases (the vector family declines them, in
// supports() by the problem's align_bytes and at launch by the pointers), a
// grid of more than 65535 tokens, all three dtypes; get_default on a
// grid of shapes; the op through a Runtime on device tensors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "gpu_test_util.hpp"

namespace {

using namespace kdgpu;
using dispatch::Device;
using dispatch::DeviceInfo;
using dispatch::Status;
using dispatch::core::kMoeSumArgInput;
using dispatch::core::kMoeSumArgOut;
using dispatch::core::LaunchArgs;
using dispatch::core::OpKind;
using dispatch::core::Plan;
using dispatch::core::Problem;
using dispatch::core::VariantDef;

constexpr const dispatch::core::OpSpec& kSpec = dispatch::core::OpSpecOf<OpKind::moe_sum>::value;

struct SumShape {
  int64_t tokens, top_k, hidden;
  int64_t ldi_pad = 0, ldo_pad = 0;       ///< row strides: input hidden + ldi_pad, out hidden + ldo_pad
  int64_t in_offset = 0, out_offset = 0;  ///< elements into their allocations (misaligned bases)
};

std::string text(const SumShape& s) {
  return "tokens=" + std::to_string(s.tokens) + " top_k=" + std::to_string(s.top_k) +
         " hidden=" + std::to_string(s.hidden) + " ldi=" + std::to_string(s.hidden + s.ldi_pad) +
         " ldo=" + std::to_string(s.hidden + s.ldo_pad) + " offsets=" + std::to_string(s.in_offset) + "," +
         std::to_string(s.out_offset);
}

/// tokens {1, 3, 64, 1025} x top_k {1, 3, 8} x hidden {1, 7, 64, 7168}
/// contiguous; then padded strides that keep 16-byte rows and ones that
/// break them, and misaligned bases.
std::vector<SumShape> sum_shapes() {
  std::vector<SumShape> out;
  for (int64_t t : {1, 3, 64, 1025})
    for (int64_t k : {1, 3, 8})
      for (int64_t h : {1, 7, 64, 7168}) out.push_back({t, k, h});
  for (int64_t t : {1, 3, 64})
    for (int64_t h : {7, 64, 7168}) {
      out.push_back({t, 8, h, 8, 16});
      out.push_back({t, 8, h, 3, 5});
      out.push_back({t, 8, h, 0, 0, 1, 0});
      out.push_back({t, 8, h, 0, 0, 0, 3});
    }
  return out;
}

const DeviceInfo& device_of(DeviceType t) { return *dispatch::backends::find(t)->device_info(0); }

/// One shape's buffers, the expected bits and the float64 reference.
struct SumCase {
  DeviceType bt;
  DType dt;
  SumShape s;
  float rsf;
  int64_t ldi, ldo;
  HostTensor in, out;
  DeviceBuffer din, dout;
  std::vector<uint32_t> bits;  ///< tokens x hidden: the host's fp32 arithmetic, stored
  std::vector<double> want;    ///< tokens x hidden: the spec's float64 reference
  double scale = 0, atol = 0, rtol = 0;

  SumCase(DeviceType b, DType t, const SumShape& sh, float factor, std::mt19937& rng)
      : bt(b),
        dt(t),
        s(sh),
        rsf(factor),
        ldi(sh.hidden + sh.ldi_pad),
        ldo(sh.hidden + sh.ldo_pad),
        in(t, sh.tokens * sh.top_k, sh.hidden, ldi),
        out(t, sh.tokens, sh.hidden, ldo),
        din(dispatch::core::backend_memory(b), in.bytes(), size_t(sh.in_offset) * dispatch::dtype_size(t)),
        dout(dispatch::core::backend_memory(b), out.bytes(), size_t(sh.out_offset) * dispatch::dtype_size(t)) {
    in.poison_all();
    in.fill_uniform(rng, -1.f, 1.f);
    REQUIRE((din.ok() && dout.ok()));
    REQUIRE(din.upload(in).ok());
    dispatch::tune::validation_tolerance(OpKind::moe_sum, t, &atol, &rtol);
    std::vector<double> id(size_t(sh.tokens * sh.top_k * ldi), 0.0), od(size_t(sh.tokens * sh.hidden), 0.0);
    for (int64_t r = 0; r < sh.tokens * sh.top_k; ++r)
      for (int64_t c = 0; c < sh.hidden; ++c) id[size_t(r * ldi + c)] = in.get(r, c);
    dispatch::core::RefArgs ra;
    ra.data[kMoeSumArgInput] = id.data();
    ra.ld[kMoeSumArgInput] = ldi;
    ra.data[kMoeSumArgOut] = od.data();
    ra.ld[kMoeSumArgOut] = sh.hidden;
    ra.scalar[0] = rsf;
    kSpec.reference(problem(), ra);
    want = std::move(od);
    for (double v : want) scale = std::max(scale, std::fabs(v));
    bits.resize(want.size());
    for (int64_t t0 = 0; t0 < sh.tokens; ++t0)
      for (int64_t h = 0; h < sh.hidden; ++h) {
        float acc = in.get(t0 * sh.top_k, h);
        for (int64_t j = 1; j < sh.top_k; ++j) acc += in.get(t0 * sh.top_k + j, h);
        bits[size_t(t0 * sh.hidden + h)] = out.from_float(acc * rsf);
      }
  }

  Problem problem() const {
    Problem p;
    p.op = OpKind::moe_sum;
    p.device = Device{bt, 0};
    p.in_dtype = p.out_dtype = dt;
    p.m = s.tokens;
    p.n = s.hidden;
    p.k = s.top_k;
    return p;
  }
  LaunchArgs args() const {
    LaunchArgs la;
    la.data[kMoeSumArgInput] = din.get();
    la.ld[kMoeSumArgInput] = ldi;
    la.data[kMoeSumArgOut] = dout.get();
    la.ld[kMoeSumArgOut] = ldo;
    la.scalar[0] = rsf;
    return la;
  }
  /// Problem::align_bytes as the entry point computes it.
  Problem aligned_problem() const {
    const LaunchArgs la = args();
    const uintptr_t es = dispatch::dtype_size(dt);
    uintptr_t b =
        reinterpret_cast<uintptr_t>(la.data[kMoeSumArgInput]) | reinterpret_cast<uintptr_t>(la.data[kMoeSumArgOut]);
    if (s.tokens * s.top_k > 1) b |= static_cast<uintptr_t>(ldi) * es;
    if (s.tokens > 1) b |= static_cast<uintptr_t>(ldo) * es;
    Problem p = problem();
    p.align_bytes = 16;
    while (p.align_bytes > 1 && (b & (p.align_bytes - 1u)) != 0)
      p.align_bytes = static_cast<uint8_t>(p.align_bytes / 2);
    return p;
  }
  void poison() {
    out.poison_all();
    REQUIRE(dout.upload(out).ok());
  }
  /// "" when every element is written with the expected bits (and within
  /// the spec's tolerance) and every padding element kept its poison.
  std::string mismatch() {
    if (const Status st = dout.download(&out); !st.ok()) return st.to_string();
    int64_t bad = 0;
    std::string first;
    for (int64_t t0 = 0; t0 < s.tokens; ++t0)
      for (int64_t h = 0; h < ldo; ++h) {
        const std::string at = "(" + std::to_string(t0) + "," + std::to_string(h) + ")";
        const uint32_t got = out.bits[size_t(t0 * ldo + h)];
        if (h >= s.hidden) {
          if (!out.is_poison(t0, h) && bad++ == 0) first = "padding " + at + " written";
          continue;
        }
        const size_t i = size_t(t0 * s.hidden + h);
        const double g = out.get(t0, h);
        const bool in_tol = std::fabs(g - want[i]) <= atol * scale + rtol * std::fabs(want[i]);
        if ((got != bits[i] || !in_tol) && bad++ == 0)
          first = at + " got " + std::to_string(g) + " want " + std::to_string(want[i]);
      }
    return bad == 0 ? std::string() : first + " (" + std::to_string(bad) + " elements off)";
  }
};

/// Runs every variant and point of `bt`/`dt` on shape `s`; returns the runs.
int check_sum_shape(DeviceType bt, DType dt, const SumShape& s, float rsf, std::mt19937& rng) {
  SumCase c(bt, dt, s, rsf, rng);
  const Problem p = c.aligned_problem();
  const LaunchArgs la = c.args();
  const DeviceInfo& dev = device_of(bt);
  const int64_t width = 16 / int64_t(dispatch::dtype_size(dt));
  int runs = 0;
  for (const VariantDef* v : dispatch::core::variants_for(OpKind::moe_sum, bt)) {
    if (v->in_dtype != dt) continue;
    const std::vector<Plan> pts = dispatch::core::config_space(*v, p, dev);
    const bool vec = std::string_view(v->name).find("vec") != std::string_view::npos;
    if (vec)
      CHECK(pts.empty() == (p.align_bytes < 16 || s.hidden % width != 0));
    else
      CHECK(!pts.empty());
    for (const Plan& plan : pts) {
      INFO(dispatch::core::plan_to_string(plan), " ", dispatch::dtype_name(dt), " ", text(s));
      ++runs;
      c.poison();
      const Status st = v->launch(la, p, plan.params);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      CHECK(c.mismatch() == "");
    }
    // A vector plan on misaligned data (a row tuned on aligned buffers)
    // declines with the fallback code.
    if (vec && s.hidden % width == 0 && p.align_bytes < 16) {
      Problem aligned = p;
      aligned.align_bytes = 16;
      const std::vector<Plan> apts = dispatch::core::config_space(*v, aligned, dev);
      REQUIRE(!apts.empty());
      const Status st = v->launch(la, p, apts.front().params);
      INFO(text(s), " ", st.to_string());
      CHECK(st.code() == dispatch::core::kNeedsFallbackCode);
    }
  }
  return runs;
}

}  // namespace

TEST_CASE("gpu moe_sum: every variant and point gives the host's fp32 bits, within the float64 reference") {
  std::mt19937 rng(1618);
  for (DeviceType bt : usable_backends()) {
    int runs = 0;
    for (DType dt : {DType::bf16, DType::fp16, DType::fp32})
      for (const SumShape& s : sum_shapes()) runs += check_sum_shape(bt, dt, s, s.tokens == 3 ? 2.5f : 1.f, rng);
    MESSAGE(dispatch::device_type_name(bt), " moe_sum: ", runs, " (variant, point, shape, dtype) runs checked");
  }
}

TEST_CASE("gpu moe_sum: more than 65535 tokens are walked grid-stride") {
  // The portable kernel's grid has a row of blocks per token, at most 65535
  // (gridDim.y); 100,001 tokens are walked grid-stride past it. The
  // reference's grid stride over (token, element) pairs is covered too.
  std::mt19937 rng(5);
  for (DeviceType bt : usable_backends()) CHECK(check_sum_shape(bt, DType::bf16, {100001, 2, 64}, 1.f, rng) > 0);
}

TEST_CASE("gpu moe_sum get_default: a supported, non-reference plan on a grid of shapes") {
  for (DeviceType bt : usable_backends()) {
    const DeviceInfo& dev = device_of(bt);
    for (DType dt : {DType::bf16, DType::fp16, DType::fp32})
      for (int64_t hidden : {1, 7, 8, 64, 2048, 4096, 5120, 7168})
        for (int64_t top_k : {1, 2, 6, 8})
          for (int64_t tokens : {1, 8, 132, 4096, 1 << 20})
            for (uint8_t align : {uint8_t{16}, uint8_t{2}}) {
              Problem p;
              p.op = OpKind::moe_sum;
              p.device = Device{bt, 0};
              p.in_dtype = p.out_dtype = dt;
              p.m = tokens, p.n = hidden, p.k = top_k;
              p.align_bytes = align;
              const Plan plan = dispatch::core::get_default(p, dev);
              INFO(dispatch::dtype_name(dt), " hidden=", hidden, " top_k=", top_k, " tokens=", tokens,
                   " align=", int(align));
              REQUIRE(plan.valid());
              CHECK(plan.variant->supports(p, plan.params, dev).ok());
              CHECK((plan.variant->flags & dispatch::core::kVariantReference) == 0);
              const int64_t width = 16 / int64_t(dispatch::dtype_size(dt));
              const bool vec = std::string_view(plan.variant->name).find("vec") != std::string_view::npos;
              CHECK(vec == (align == 16 && hidden % width == 0));
            }
  }
}

TEST_CASE("gpu runtime: dispatch::moe_sum on device tensors runs the default plan") {
  for (DeviceType bt : usable_backends()) {
    auto rt = dispatch::Runtime::create([] {
      dispatch::RuntimeOptions o;
      o.load_shipped_configs = false;
      o.log_level = dispatch::LogLevel::off;
      return o;
    }());
    REQUIRE(rt.ok());
    std::mt19937 rng(21);
    for (const SumShape& s : {SumShape{5, 8, 7168}, SumShape{3, 2, 7}, SumShape{4, 6, 64, 0, 0, 1, 0}}) {
      SumCase c(bt, DType::bf16, s, 2.5f, rng);
      c.poison();
      const Device d{bt, 0};
      dispatch::TensorRef input;
      input.data = c.din.get();
      input.dtype = DType::bf16;
      input.rank = 3;
      input.shape[0] = s.tokens, input.shape[1] = s.top_k, input.shape[2] = s.hidden;
      input.strides[0] = s.top_k * c.ldi, input.strides[1] = c.ldi, input.strides[2] = 1;
      input.device = d;
      dispatch::MoeSumArgs args{
          input, dispatch::make_tensor_2d(c.dout.get(), DType::bf16, s.tokens, s.hidden, c.ldo, d), 2.5f};
      dispatch::DispatchInfo info;
      std::string key;
      info.key = &key;
      dispatch::CallOptions opts;
      opts.info = &info;
      const Status st = dispatch::moe_sum(**rt, args, dispatch::Stream{nullptr}, opts);
      INFO(text(s));
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      CHECK(info.source == dispatch::PlanSource::fallback);
      CHECK(key.rfind(std::string(dispatch::device_type_name(bt)) + "/moe_sum|" + device_of(bt).device_name + "|", 0) ==
            0);
      MESSAGE("default plan: ", std::string(info.variant), " key ", key);
      CHECK(c.mismatch() == "");
    }
  }
}
