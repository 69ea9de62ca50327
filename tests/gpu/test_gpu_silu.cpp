// SPDX-License-Identifier: Apache-2.0
// GPU silu_and_mul kernels: every variant and every point of its space
// against the op spec's float64 reference on random inputs, with the spec's
// tolerance (tune::validation_tolerance), outputs poisoned before each run
// and every element checked written (and every padding element untouched);
// tokens 1 .. 4097, d not a multiple of the vector, padded row strides and
// misaligned bases (the vector family declines them, in supports() by the
// problem's align_bytes and at launch by the pointers), a grid of more than
// 65535 row groups, all three dtypes; get_default on a grid of shapes; the
// op through a Runtime on device tensors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
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
using dispatch::core::kSiluArgOut;
using dispatch::core::kSiluArgX;
using dispatch::core::LaunchArgs;
using dispatch::core::OpKind;
using dispatch::core::Plan;
using dispatch::core::Problem;
using dispatch::core::VariantDef;

constexpr const dispatch::core::OpSpec& kSpec = dispatch::core::OpSpecOf<OpKind::silu_and_mul>::value;

struct Shape {
  int64_t tokens, d;
  int64_t ldx_pad = 0, ldo_pad = 0;      ///< row strides: x 2d + ldx_pad, out d + ldo_pad
  int64_t x_offset = 0, out_offset = 0;  ///< elements into their allocations (misaligned bases)
};

std::string shape_text(const Shape& s) {
  return "tokens=" + std::to_string(s.tokens) + " d=" + std::to_string(s.d) +
         " ldx=" + std::to_string(2 * s.d + s.ldx_pad) + " ldo=" + std::to_string(s.d + s.ldo_pad) +
         (s.x_offset ? " x_offset=" + std::to_string(s.x_offset) : std::string()) +
         (s.out_offset ? " out_offset=" + std::to_string(s.out_offset) : std::string());
}

/// The shapes: the whole grid tokens {1, 3, 64, 4097} x d {1, 7, 64, 4864,
/// 14336} contiguous; padded strides that keep 16-byte rows and ones that
/// break them; misaligned bases of x and of out.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int64_t t : {1, 3, 64, 4097})
    for (int64_t d : {1, 7, 64, 4864, 14336}) out.push_back({t, d});
  for (int64_t t : {1, 3, 64})
    for (int64_t d : {1, 7, 64, 4864, 14336}) {
      out.push_back({t, d, 8, 16});       // padded, rows stay 16-byte aligned (bf16/fp16; fp32 too)
      out.push_back({t, d, 3, 5});        // padded, rows misaligned
      out.push_back({t, d, 0, 0, 1, 0});  // x one element off
      out.push_back({t, d, 0, 0, 0, 3});  // out three elements off
    }
  out.push_back({4097, 4864, 8, 8});
  out.push_back({4097, 4864, 0, 0, 1, 1});
  return out;
}

std::vector<const VariantDef*> variants(DeviceType t, DType dt) {
  std::vector<const VariantDef*> out;
  for (const VariantDef* v : dispatch::core::variants_for(OpKind::silu_and_mul, t))
    if (v->in_dtype == dt) out.push_back(v);
  return out;
}

const DeviceInfo& dev_of(DeviceType t) { return *dispatch::backends::find(t)->device_info(0); }
dispatch::tune::DeviceMemory* mem_of(DeviceType t) { return dispatch::core::backend_memory(t); }

/// Problem::align_bytes as the entry point computes it: the smallest
/// alignment of out's and x's bases and (with more than one row) row strides.
uint8_t align_of(const LaunchArgs& la, int64_t rows, size_t es) {
  uintptr_t bits = 0;
  for (int i : {kSiluArgOut, kSiluArgX}) {
    bits |= reinterpret_cast<uintptr_t>(la.data[i]);
    if (rows > 1) bits |= static_cast<uintptr_t>(la.ld[i]) * es;
  }
  uint8_t al = 16;
  while (al > 1 && (bits & (al - 1u)) != 0) al = static_cast<uint8_t>(al / 2);
  return al;
}

/// One shape's buffers, the float64 reference and the checker.
struct SiluCase {
  DeviceType bt;
  DType dt;
  Shape s;
  int64_t ldx, ldo;
  HostTensor x, out;
  DeviceBuffer dx, dout;
  std::vector<double> want;  ///< tokens x d
  double scale = 0;          ///< max |want| (the spec tolerance's atol is relative to it)
  double atol = 0, rtol = 0;

  SiluCase(DeviceType b, DType t, const Shape& sh, std::mt19937& rng)
      : bt(b),
        dt(t),
        s(sh),
        ldx(2 * sh.d + sh.ldx_pad),
        ldo(sh.d + sh.ldo_pad),
        x(t, sh.tokens, 2 * sh.d, ldx),
        out(t, sh.tokens, sh.d, ldo),
        dx(mem_of(b), x.bytes(), size_t(sh.x_offset) * dispatch::dtype_size(t)),
        dout(mem_of(b), out.bytes(), size_t(sh.out_offset) * dispatch::dtype_size(t)) {
    x.poison_all();
    x.fill_uniform(rng, -4.f, 4.f);  // the spec's fill for x (Fill::wide): silu bends in there
    // A few large magnitudes: exp(-g) overflows (g -> -inf: 0) and vanishes (g -> +inf: g).
    // (Small up values keep the outputs, and so the tolerance's scale, in range.)
    if (sh.d >= 7) {
      x.set(0, 0, -100.f);
      x.set(0, 1, 90.f);
      x.set(0, sh.d + 1, 0.015625f);
      x.set(0, 2, -20.f);
    }
    REQUIRE((dx.ok() && dout.ok()));
    REQUIRE(dx.upload(x).ok());
    dispatch::tune::validation_tolerance(OpKind::silu_and_mul, t, &atol, &rtol);
    // float64 reference through the spec, on the inputs as stored.
    std::vector<double> xd(size_t(sh.tokens * ldx), 0.0), od(size_t(sh.tokens * sh.d), 0.0);
    for (int64_t r = 0; r < sh.tokens; ++r)
      for (int64_t c = 0; c < 2 * sh.d; ++c) xd[size_t(r * ldx + c)] = x.get(r, c);
    dispatch::core::RefArgs ra;
    ra.data[kSiluArgX] = xd.data();
    ra.ld[kSiluArgX] = ldx;
    ra.data[kSiluArgOut] = od.data();
    ra.ld[kSiluArgOut] = sh.d;
    kSpec.reference(problem(), ra);
    want = std::move(od);
    for (double v : want)
      if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
  }

  Problem problem() const {
    Problem p;
    p.op = OpKind::silu_and_mul;
    p.device = Device{bt, 0};
    p.in_dtype = p.out_dtype = dt;
    p.m = s.tokens;
    p.n = s.d;
    return p;
  }
  LaunchArgs args() const {
    LaunchArgs la;
    la.data[kSiluArgOut] = dout.get();
    la.ld[kSiluArgOut] = ldo;
    la.data[kSiluArgX] = dx.get();
    la.ld[kSiluArgX] = ldx;
    return la;
  }
  Problem aligned_problem() const {
    Problem p = problem();
    p.align_bytes = align_of(args(), s.tokens, dispatch::dtype_size(dt));
    return p;
  }
  void poison() {
    out.poison_all();
    REQUIRE(dout.upload(out).ok());
  }
  /// "" when every logical element is written and within the spec
  /// tolerance and every padding element kept its poison; else the first
  /// problem and how many elements are off.
  std::string mismatch() {
    const Status ds = dout.download(&out);
    if (!ds.ok()) return ds.to_string();
    int64_t bad = 0;
    std::string first;
    for (int64_t t = 0; t < s.tokens; ++t)
      for (int64_t i = 0; i < ldo; ++i) {
        const std::string at = "(" + std::to_string(t) + "," + std::to_string(i) + ")";
        if (i >= s.d) {
          if (!out.is_poison(t, i) && bad++ == 0) first = "padding " + at + " written";
          continue;
        }
        if (out.is_poison(t, i)) {
          if (bad++ == 0) first = at + " not written";
          continue;
        }
        const double w = want[size_t(t * s.d + i)];
        const double g = out.get(t, i);
        if (!(std::fabs(g - w) <= atol * scale + rtol * std::fabs(w)) && bad++ == 0)
          first = at + " got " + std::to_string(g) + " want " + std::to_string(w);
      }
    return bad == 0 ? std::string() : first + " (" + std::to_string(bad) + " elements off)";
  }
};

/// Runs every variant and point of `bt`/`dt` on shape `s`; returns the runs.
int check_shape(DeviceType bt, DType dt, const Shape& s, std::mt19937& rng) {
  SiluCase c(bt, dt, s, rng);
  const Problem p = c.aligned_problem();
  const LaunchArgs la = c.args();
  const DeviceInfo& dev = dev_of(bt);
  int runs = 0;
  for (const VariantDef* v : variants(bt, dt)) {
    const std::vector<Plan> pts = dispatch::core::config_space(*v, p, dev);
    // The vector family serves exactly the aligned problems with d a
    // multiple of the vector; the others serve every problem.
    const bool vec = std::string_view(v->name).find("vec") != std::string_view::npos;
    const int64_t width = 16 / int64_t(dispatch::dtype_size(dt));
    if (vec)
      CHECK((pts.empty()) == (p.align_bytes < 16 || s.d % width != 0));
    else
      CHECK(!pts.empty());
    for (const Plan& plan : pts) {
      INFO(dispatch::core::plan_to_string(plan), " ", dispatch::dtype_name(dt), " ", shape_text(s));
      ++runs;
      c.poison();
      const Status st = v->launch(la, p, plan.params);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      CHECK(c.mismatch() == "");
    }
    // A vector plan launched on misaligned data (a table row tuned on aligned
    // buffers) declines with the fallback code, writing nothing.
    if (vec && s.d % width == 0 && p.align_bytes < 16) {
      Problem aligned = p;
      aligned.align_bytes = 16;
      const std::vector<Plan> apts = dispatch::core::config_space(*v, aligned, dev);
      REQUIRE(!apts.empty());
      const Status st = v->launch(la, p, apts.front().params);
      INFO(shape_text(s), " ", st.to_string());
      CHECK(st.code() == dispatch::core::kNeedsFallbackCode);
    }
  }
  return runs;
}

}  // namespace

TEST_CASE("gpu silu_and_mul: every variant and config point matches the spec's float64 reference") {
  std::mt19937 rng(2718);
  for (DeviceType bt : usable_backends()) {
    int runs = 0;
    for (DType dt : {DType::bf16, DType::fp16, DType::fp32})
      for (const Shape& s : shapes()) runs += check_shape(bt, dt, s, rng);
    MESSAGE(dispatch::device_type_name(bt), " silu_and_mul: ", runs, " (variant, point, shape, dtype) runs checked");
  }
}

TEST_CASE("gpu silu_and_mul: more than 65535 row groups are walked grid-stride") {
  // d = 64 bf16: 8 vectors per row, so a 128-thread vec block takes 16 rows,
  // a generic block 8, a reference block 4: 1,120,005 tokens are 70,001
  // groups or more for those, past the grid's y limit.
  std::mt19937 rng(31);
  for (DeviceType bt : usable_backends()) {
    const Shape s{1120005, 64};
    int runs = check_shape(bt, DType::bf16, s, rng);
    CHECK(runs > 0);
  }
}

TEST_CASE("gpu silu_and_mul: NaN and infinities propagate as the reference has them") {
  for (DeviceType bt : usable_backends())
    for (DType dt : {DType::bf16, DType::fp16, DType::fp32}) {
      std::mt19937 rng(8);
      const Shape s{3, 64};
      SiluCase c(bt, dt, s, rng);
      c.x.set(1, 5, std::numeric_limits<float>::quiet_NaN());       // gate NaN
      c.x.set(2, 64 + 9, std::numeric_limits<float>::quiet_NaN());  // up NaN
      REQUIRE(c.dx.upload(c.x).ok());
      const Problem p = c.aligned_problem();
      const LaunchArgs la = c.args();
      for (const VariantDef* v : variants(bt, dt))
        for (const Plan& plan : dispatch::core::config_space(*v, p, dev_of(bt))) {
          INFO(dispatch::core::plan_to_string(plan), " ", dispatch::dtype_name(dt));
          c.poison();
          REQUIRE(v->launch(la, p, plan.params).ok());
          REQUIRE(c.dout.download(&c.out).ok());
          int64_t wrong = 0;
          for (int64_t t = 0; t < s.tokens; ++t)
            for (int64_t i = 0; i < s.d; ++i)
              wrong += std::isnan(c.out.get(t, i)) != ((t == 1 && i == 5) || (t == 2 && i == 9));
          CHECK(wrong == 0);
        }
    }
}

TEST_CASE("gpu silu_and_mul get_default: a supported, non-reference plan on a grid of shapes") {
  for (DeviceType bt : usable_backends()) {
    const DeviceInfo& dev = dev_of(bt);
    for (DType dt : {DType::bf16, DType::fp16, DType::fp32})
      for (int64_t d : {1, 7, 8, 64, 1000, 4864, 11008, 14336, 18944, 28672})
        for (int64_t tokens : {1, 8, 64, 132, 512, 4096, 16384, 1 << 20})
          for (uint8_t align : {uint8_t{16}, uint8_t{2}}) {
            Problem p;
            p.op = OpKind::silu_and_mul;
            p.device = Device{bt, 0};
            p.in_dtype = p.out_dtype = dt;
            p.m = tokens;
            p.n = d;
            p.align_bytes = align;
            const Plan plan = dispatch::core::get_default(p, dev);
            INFO(dispatch::dtype_name(dt), " d=", d, " tokens=", tokens, " align=", int(align));
            REQUIRE(plan.valid());
            CHECK(plan.variant->supports(p, plan.params, dev).ok());
            CHECK((plan.variant->flags & dispatch::core::kVariantReference) == 0);
            const int64_t width = 16 / int64_t(dispatch::dtype_size(dt));
            const bool vec = std::string_view(plan.variant->name).find("vec") != std::string_view::npos;
            CHECK(vec == (align == 16 && d % width == 0));
          }
  }
}

TEST_CASE("gpu runtime: dispatch::silu_and_mul on device tensors runs the default plan") {
  for (DeviceType bt : usable_backends()) {
    auto rt = dispatch::Runtime::create([] {
      dispatch::RuntimeOptions o;
      o.load_shipped_configs = false;
      o.log_level = dispatch::LogLevel::off;
      return o;
    }());
    REQUIRE(rt.ok());
    std::mt19937 rng(12);
    for (const Shape& s : {Shape{5, 4864}, Shape{3, 7}, Shape{4, 64, 0, 0, 1, 0}}) {
      SiluCase c(bt, DType::bf16, s, rng);
      c.poison();
      const Device d{bt, 0};
      dispatch::SiluAndMulArgs args{dispatch::make_tensor_2d(c.dout.get(), DType::bf16, s.tokens, s.d, c.ldo, d),
                                    dispatch::make_tensor_2d(c.dx.get(), DType::bf16, s.tokens, 2 * s.d, c.ldx, d)};
      dispatch::DispatchInfo info;
      std::string key;
      info.key = &key;
      dispatch::CallOptions opts;
      opts.info = &info;
      const Status st = dispatch::silu_and_mul(**rt, args, dispatch::Stream{nullptr}, opts);
      INFO(shape_text(s));
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      CHECK(info.source == dispatch::PlanSource::fallback);
      CHECK(key.rfind(std::string(dispatch::device_type_name(bt)) + "/silu_and_mul|" + dev_of(bt).device_name + "|",
                      0) == 0);
      MESSAGE("default plan: ", std::string(info.variant), " key ", key);
      CHECK(c.mismatch() == "");
    }
  }
}
