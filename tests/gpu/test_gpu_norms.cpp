// SPDX-License-Identifier: Apache-2.0
// GPU norm kernels: every variant and every point of its space against a
// float64 reference on random inputs, outputs poisoned before each run and
// every element checked written (and every padding element untouched);
// tokens = 1, hidden not a power of two, strided and misaligned rows, the
// fused op's in-place semantics (residual bit-exact to the rounded sum), all
// three dtypes; then the op through a Runtime on device tensors and a sync
// tuning run on device buffers.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "gpu_test_util.hpp"

namespace {

namespace fs = std::filesystem;
using namespace kdgpu;
using dispatch::Device;
using dispatch::DeviceInfo;
using dispatch::Status;
using dispatch::core::LaunchArgs;
using dispatch::core::OpKind;
using dispatch::core::Plan;
using dispatch::core::Problem;
using dispatch::core::VariantDef;

struct Shape {
  int64_t tokens, hidden;
  int64_t ldx_pad = 0, ldy_pad = 0;  ///< row stride = hidden + pad (ldy: y or residual)
  int64_t x_offset = 0;              ///< x starts this many elements into its allocation
};

const Shape kShapes[] = {
    {1, 4096},
    {1, 16384},
    {3, 1000},
    {5, 512},
    {7, 4104},
    {4, 5120},
    {3, 7168},
    {2, 8192},
    {67, 2048},
    {129, 1536},
    {2, 16384, 8, 24},
    {3, 1},
    {2, 7},
    {3, 37, 5, 3},
    {9, 896, 8, 16},
    {5, 4096, 3, 1},
    {4, 2048, 0, 0, 1},
    {2, 32768},
    {33, 4096, 64, 0},
};

std::string shape_text(const Shape& s) {
  return "tokens=" + std::to_string(s.tokens) + " hidden=" + std::to_string(s.hidden) +
         " ldx=" + std::to_string(s.hidden + s.ldx_pad) + " ld2=" + std::to_string(s.hidden + s.ldy_pad) +
         (s.x_offset ? " x_offset=" + std::to_string(s.x_offset) : std::string());
}

std::vector<const VariantDef*> variants(DeviceType t, OpKind op, DType dt) {
  std::vector<const VariantDef*> out;
  for (const VariantDef* v : dispatch::core::variants_for(op, t))
    if (v->in_dtype == dt) out.push_back(v);
  return out;
}

/// Every point a variant accepts, plus the reference (which has no params).
std::vector<Plan> points(const VariantDef& v, const Problem& p, const DeviceInfo& dev) {
  return dispatch::core::config_space(v, p, dev);
}

const DeviceInfo& dev_of(DeviceType t) { return *dispatch::backends::find(t)->device_info(0); }
dispatch::tune::DeviceMemory* mem_of(DeviceType t) { return dispatch::core::backend_memory(t); }

struct Counters {
  int points = 0;
};

void check_rmsnorm(DeviceType bt, DType dt, const Shape& s, std::mt19937& rng, Counters* cnt) {
  const DeviceInfo& dev = dev_of(bt);
  auto* mem = mem_of(bt);
  const int64_t ldx = s.hidden + s.ldx_pad, ldy = s.hidden + s.ldy_pad;
  HostTensor x(dt, s.tokens, s.hidden, ldx), w(dt, 1, s.hidden, s.hidden), y(dt, s.tokens, s.hidden, ldy);
  x.poison_all();
  x.fill_uniform(rng, -2.f, 2.f);
  w.fill_uniform(rng, 0.5f, 1.5f);
  const size_t es = dispatch::dtype_size(dt);
  DeviceBuffer dx(mem, x.bytes(), size_t(s.x_offset) * es), dw(mem, w.bytes()), dy(mem, y.bytes());
  REQUIRE((dx.ok() && dw.ok() && dy.ok()));
  REQUIRE(dx.upload(x).ok());
  REQUIRE(dw.upload(w).ok());
  // float64 reference.
  std::vector<double> want(size_t(s.tokens * s.hidden));
  std::vector<double> scale(size_t(s.tokens));
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::vector<double> row(static_cast<size_t>(s.hidden));
    for (int64_t h = 0; h < s.hidden; ++h) row[size_t(h)] = x.get(t, h);
    const double inv = inv_rms(row, 1e-6);
    for (int64_t h = 0; h < s.hidden; ++h) {
      want[size_t(t * s.hidden + h)] = row[size_t(h)] * inv * double(w.get(0, h));
      scale[size_t(t)] = std::max(scale[size_t(t)], std::fabs(want[size_t(t * s.hidden + h)]));
    }
  }
  Problem p;
  p.op = OpKind::rmsnorm;
  p.device = Device{bt, 0};
  p.in_dtype = p.out_dtype = dt;
  p.m = s.tokens;
  p.n = s.hidden;
  LaunchArgs la;
  la.data[dispatch::core::kNormArgX] = dx.get();
  la.ld[dispatch::core::kNormArgX] = ldx;
  la.data[dispatch::core::kNormArgY] = dy.get();
  la.ld[dispatch::core::kNormArgY] = ldy;
  la.data[dispatch::core::kNormArgW] = dw.get();
  la.scalar[0] = 1e-6f;
  int here = 0;
  for (const VariantDef* v : variants(bt, OpKind::rmsnorm, dt)) {
    for (const Plan& plan : points(*v, p, dev)) {
      const std::string what = dispatch::core::plan_to_string(plan) + " " + shape_text(s);
      INFO(what);
      ++here;
      y.poison_all();
      REQUIRE(dy.upload(y).ok());
      const Status st = v->launch(la, p, plan.params);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      const Status ds = dy.download(&y);
      REQUIRE_MESSAGE(ds.ok(), ds.to_string());
      int64_t bad = 0;
      std::string first;
      for (int64_t t = 0; t < s.tokens; ++t) {
        for (int64_t h = 0; h < ldy; ++h) {
          if (h >= s.hidden) {  // padding: never written
            if (!y.is_poison(t, h) && bad++ == 0)
              first = "padding (" + std::to_string(t) + "," + std::to_string(h) + ") written";
            continue;
          }
          if (y.is_poison(t, h)) {
            if (bad++ == 0) first = "(" + std::to_string(t) + "," + std::to_string(h) + ") not written";
            continue;
          }
          const double wv = want[size_t(t * s.hidden + h)];
          const double got = y.get(t, h);
          if (!(std::fabs(got - wv) <= tolerance(dt, wv, scale[size_t(t)])) && bad++ == 0)
            first = "(" + std::to_string(t) + "," + std::to_string(h) + ") got " + std::to_string(got) + " want " +
                    std::to_string(wv);
        }
      }
      CHECK_MESSAGE(bad == 0, bad, " bad elements, first: ", first);
    }
  }
  // x is read only.
  HostTensor x_after = x;
  REQUIRE(dx.download(&x_after).ok());
  CHECK(x_after.bits == x.bits);
  CHECK(here > 0);
  cnt->points += here;
}

void check_fused(DeviceType bt, DType dt, const Shape& s, std::mt19937& rng, Counters* cnt) {
  const DeviceInfo& dev = dev_of(bt);
  auto* mem = mem_of(bt);
  const int64_t ldx = s.hidden + s.ldx_pad, ldr = s.hidden + s.ldy_pad;
  HostTensor x0(dt, s.tokens, s.hidden, ldx), r0(dt, s.tokens, s.hidden, ldr), w(dt, 1, s.hidden, s.hidden);
  x0.poison_all();
  r0.poison_all();
  x0.fill_uniform(rng, -2.f, 2.f);
  r0.fill_uniform(rng, -2.f, 2.f);
  w.fill_uniform(rng, 0.5f, 1.5f);
  const size_t es = dispatch::dtype_size(dt);
  DeviceBuffer dx(mem, x0.bytes(), size_t(s.x_offset) * es), dr(mem, r0.bytes()), dw(mem, w.bytes());
  REQUIRE((dx.ok() && dr.ok() && dw.ok()));
  REQUIRE(dw.upload(w).ok());
  // Reference: z = x + r in fp32, rounded to the storage dtype (bit-exact
  // target of the residual); x = z as stored, normalised, times w (float64).
  HostTensor z(dt, s.tokens, s.hidden, ldr);
  z.poison_all();
  std::vector<double> want(size_t(s.tokens * s.hidden)), scale(size_t(s.tokens));
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::vector<double> row(static_cast<size_t>(s.hidden));
    for (int64_t h = 0; h < s.hidden; ++h) {
      z.set(t, h, x0.get(t, h) + r0.get(t, h));  // fp32 add, then round to dt
      row[size_t(h)] = z.get(t, h);
    }
    const double inv = inv_rms(row, 1e-6);
    for (int64_t h = 0; h < s.hidden; ++h) {
      want[size_t(t * s.hidden + h)] = row[size_t(h)] * inv * double(w.get(0, h));
      scale[size_t(t)] = std::max(scale[size_t(t)], std::fabs(want[size_t(t * s.hidden + h)]));
    }
  }
  Problem p;
  p.op = OpKind::fused_add_rmsnorm;
  p.device = Device{bt, 0};
  p.in_dtype = p.out_dtype = dt;
  p.m = s.tokens;
  p.n = s.hidden;
  LaunchArgs la;
  la.data[dispatch::core::kFusedArgX] = dx.get();
  la.ld[dispatch::core::kFusedArgX] = ldx;
  la.data[dispatch::core::kFusedArgResidual] = dr.get();
  la.ld[dispatch::core::kFusedArgResidual] = ldr;
  la.data[dispatch::core::kFusedArgW] = dw.get();
  la.scalar[0] = 1e-6f;
  int here = 0;
  for (const VariantDef* v : variants(bt, OpKind::fused_add_rmsnorm, dt)) {
    CHECK(v->restore_args == ((1u << dispatch::core::kFusedArgX) | (1u << dispatch::core::kFusedArgResidual)));
    for (const Plan& plan : points(*v, p, dev)) {
      const std::string what = dispatch::core::plan_to_string(plan) + " " + shape_text(s);
      INFO(what);
      ++here;
      REQUIRE(dx.upload(x0).ok());  // fresh in-place buffers, padding poisoned
      REQUIRE(dr.upload(r0).ok());
      const Status st = v->launch(la, p, plan.params);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      HostTensor x = x0, r = r0;
      REQUIRE(dx.download(&x).ok());
      REQUIRE(dr.download(&r).ok());
      int64_t bad_r = 0, bad_x = 0;
      std::string first_r, first_x;
      for (int64_t t = 0; t < s.tokens; ++t) {
        for (int64_t h = 0; h < std::max(ldx, ldr); ++h) {
          if (h >= s.hidden) {
            if (h < ldx && !x.is_poison(t, h) && bad_x++ == 0) first_x = "x padding written";
            if (h < ldr && !r.is_poison(t, h) && bad_r++ == 0) first_r = "residual padding written";
            continue;
          }
          if (r.bits[size_t(t * ldr + h)] != z.bits[size_t(t * ldr + h)] && bad_r++ == 0)
            first_r = "residual(" + std::to_string(t) + "," + std::to_string(h) + ") got " +
                      std::to_string(r.get(t, h)) + " want " + std::to_string(z.get(t, h));
          const double wv = want[size_t(t * s.hidden + h)];
          const double got = x.get(t, h);
          if (!(std::fabs(got - wv) <= tolerance(dt, wv, scale[size_t(t)])) && bad_x++ == 0)
            first_x = "x(" + std::to_string(t) + "," + std::to_string(h) + ") got " + std::to_string(got) + " want " +
                      std::to_string(wv);
        }
      }
      CHECK_MESSAGE(bad_r == 0, bad_r, " residual elements differ from the rounded sum, first: ", first_r);
      CHECK_MESSAGE(bad_x == 0, bad_x, " bad x elements, first: ", first_x);
    }
  }
  CHECK(here > 0);
  cnt->points += here;
}

}  // namespace

TEST_CASE("gpu device: the probe describes the device and every kernel has an image") {
  for (DeviceType bt : usable_backends()) {
    const DeviceInfo& d = dev_of(bt);
    INFO(dispatch::device_type_name(bt), " ", d.reported_name, " ", d.arch);
    CHECK(d.available);
    CHECK(d.unavailable_reason.empty());
    CHECK(!d.device_name.empty());
    CHECK(d.device_name.find(' ') == std::string::npos);  // SGLang's spelling
    CHECK(d.compute_units > 0);
    CHECK(d.memory_bytes > 0);
    CHECK(d.smem_per_block_bytes > 0);
    CHECK((d.warp_size == 32 || d.warp_size == 64));
    MESSAGE(dispatch::device_type_name(bt), ": ", d.device_name, " (", d.reported_name, ") arch ", d.arch, ", ",
            d.compute_units, " SMs, ", d.memory_bytes >> 20, " MiB, L2 ", d.l2_bytes >> 10, " KiB, smem/block ",
            d.smem_per_block_bytes, ", warp ", d.warp_size);
    if (bt == DeviceType::cuda && d.reported_name.find("H100") != std::string::npos) CHECK(d.arch == "sm_90a");
    if (bt == DeviceType::cuda && d.reported_name.find("H200") != std::string::npos) {
      CHECK(d.arch == "sm_90a");
      CHECK(d.device_name == "NVIDIA_H200");
    }
    // Every variant's default point has a kernel image and registers without spills.
    const dispatch::Result<std::unique_ptr<dispatch::Runtime>> rt = dispatch::Runtime::create();
    REQUIRE(rt.ok());
    auto info = (*rt)->device_info(Device{bt, 0});
    REQUIRE(info.ok());
    CHECK(info->device_name == d.device_name);
    auto none = (*rt)->device_info(Device{bt, 63});
    CHECK(none.status().code() == dispatch::StatusCode::unsupported_device);
  }
}

TEST_CASE("gpu rmsnorm: every variant and config point matches the float64 reference") {
  std::mt19937 rng(1234);
  for (DeviceType bt : usable_backends()) {
    Counters c;
    for (DType dt : {DType::bf16, DType::fp16, DType::fp32})
      for (const Shape& s : kShapes) check_rmsnorm(bt, dt, s, rng, &c);
    MESSAGE(dispatch::device_type_name(bt), " rmsnorm: ", c.points, " (variant, point, shape, dtype) runs checked");
  }
}

TEST_CASE("gpu fused_add_rmsnorm: every variant and point, residual bit-exact to the rounded sum") {
  std::mt19937 rng(4321);
  for (DeviceType bt : usable_backends()) {
    Counters c;
    for (DType dt : {DType::bf16, DType::fp16, DType::fp32})
      for (const Shape& s : kShapes) check_fused(bt, dt, s, rng, &c);
    MESSAGE(dispatch::device_type_name(bt), " fused_add_rmsnorm: ", c.points, " runs checked");
  }
}

TEST_CASE("gpu fused_add_rmsnorm: ties round to even before the norm, as vLLM stores the residual") {
  // x = 1, r = 2^-8: z = 1 + 2^-8 is a bf16 tie that rounds to 1.0; the
  // residual must hold 1.0 and the norm must be taken of 1.0.
  for (DeviceType bt : usable_backends()) {
    std::mt19937 rng(5);
    const int64_t H = 256;
    HostTensor x(DType::bf16, 1, H, H), r(DType::bf16, 1, H, H), w(DType::bf16, 1, H, H);
    for (int64_t h = 0; h < H; ++h) {
      x.set(0, h, h % 2 == 0 ? 1.0f : 1.5f);
      r.set(0, h, h % 2 == 0 ? 0.00390625f : 0.0f);
      w.set(0, h, 1.0f + float(h % 128) / 128.0f);
    }
    auto* mem = mem_of(bt);
    DeviceBuffer dx(mem, x.bytes()), dr(mem, r.bytes()), dw(mem, w.bytes());
    REQUIRE(dw.upload(w).ok());
    Problem p;
    p.op = OpKind::fused_add_rmsnorm;
    p.device = Device{bt, 0};
    p.in_dtype = p.out_dtype = DType::bf16;
    p.m = 1;
    p.n = H;
    LaunchArgs la;
    la.data[dispatch::core::kFusedArgX] = dx.get();
    la.ld[dispatch::core::kFusedArgX] = H;
    la.data[dispatch::core::kFusedArgResidual] = dr.get();
    la.ld[dispatch::core::kFusedArgResidual] = H;
    la.data[dispatch::core::kFusedArgW] = dw.get();
    la.scalar[0] = 1e-6f;
    for (const VariantDef* v : variants(bt, OpKind::fused_add_rmsnorm, DType::bf16)) {
      for (const Plan& plan : points(*v, p, dev_of(bt))) {
        INFO(dispatch::core::plan_to_string(plan));
        REQUIRE(dx.upload(x).ok());
        REQUIRE(dr.upload(r).ok());
        REQUIRE(v->launch(la, p, plan.params).ok());
        HostTensor rr = r, xx = x;
        REQUIRE(dr.download(&rr).ok());
        REQUIRE(dx.download(&xx).ok());
        CHECK(rr.get(0, 0) == 1.0f);
        CHECK(rr.get(0, 1) == 1.5f);
        // Norm of the stored z: mean(z^2) = (1 + 2.25) / 2.
        const double inv = 1.0 / std::sqrt(1.625 + 1e-6);
        for (int64_t h = 0; h < H; ++h) {
          const double want = (h % 2 == 0 ? 1.0 : 1.5) * inv * w.get(0, h);
          CHECK(std::fabs(xx.get(0, h) - want) <= tolerance(DType::bf16, want, 2.0));
        }
      }
    }
  }
}

TEST_CASE("gpu norms: a NaN in a row gives NaN in that row only") {
  for (DeviceType bt : usable_backends()) {
    for (DType dt : {DType::bf16, DType::fp16, DType::fp32}) {
      const int64_t T = 3, H = 1024;
      std::mt19937 rng(9);
      HostTensor x(dt, T, H, H), w(dt, 1, H, H), y(dt, T, H, H);
      x.fill_uniform(rng, -1, 1);
      w.fill_uniform(rng, 0.5f, 1.5f);
      x.set(1, 333, std::numeric_limits<float>::quiet_NaN());
      auto* mem = mem_of(bt);
      DeviceBuffer dx(mem, x.bytes()), dw(mem, w.bytes()), dy(mem, y.bytes());
      REQUIRE(dx.upload(x).ok());
      REQUIRE(dw.upload(w).ok());
      Problem p;
      p.op = OpKind::rmsnorm;
      p.device = Device{bt, 0};
      p.in_dtype = p.out_dtype = dt;
      p.m = T;
      p.n = H;
      LaunchArgs la;
      la.data[dispatch::core::kNormArgX] = dx.get();
      la.ld[dispatch::core::kNormArgX] = H;
      la.data[dispatch::core::kNormArgY] = dy.get();
      la.ld[dispatch::core::kNormArgY] = H;
      la.data[dispatch::core::kNormArgW] = dw.get();
      la.scalar[0] = 1e-6f;
      for (const VariantDef* v : variants(bt, OpKind::rmsnorm, dt)) {
        for (const Plan& plan : points(*v, p, dev_of(bt))) {
          INFO(dispatch::core::plan_to_string(plan), " ", dispatch::dtype_name(dt));
          REQUIRE(v->launch(la, p, plan.params).ok());
          REQUIRE(dy.download(&y).ok());
          int64_t wrong = 0;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t h = 0; h < H; ++h) wrong += std::isnan(y.get(t, h)) != (t == 1);
          CHECK(wrong == 0);
        }
      }
    }
  }
}

TEST_CASE("gpu get_default: a supported plan on every shape of the benchmark grid and beyond") {
  for (DeviceType bt : usable_backends()) {
    const DeviceInfo& dev = dev_of(bt);
    for (OpKind op : {OpKind::rmsnorm, OpKind::fused_add_rmsnorm})
      for (DType dt : {DType::bf16, DType::fp16, DType::fp32})
        for (int64_t hidden : {1, 7, 512, 1000, 1001, 2048, 4096, 4104, 5120, 7168, 8192, 16384, 32768, 65536})
          for (int64_t tokens : {1, 16, 128, 132, 133, 1024, 8192, 32768}) {
            Problem p;
            p.op = op;
            p.device = Device{bt, 0};
            p.in_dtype = p.out_dtype = dt;
            p.m = tokens;
            p.n = hidden;
            const Plan plan = dispatch::core::get_default(p, dev);
            INFO(dispatch::core::op_name(op), " ", dispatch::dtype_name(dt), " hidden=", hidden, " tokens=", tokens);
            REQUIRE(plan.valid());
            CHECK(plan.variant->supports(p, plan.params, dev).ok());
            CHECK((plan.variant->flags & dispatch::core::kVariantReference) == 0);
          }
  }
}

TEST_CASE("gpu runtime: dispatch::rmsnorm on device tensors runs the default plan") {
  for (DeviceType bt : usable_backends()) {
    auto rt = dispatch::Runtime::create([] {
      dispatch::RuntimeOptions o;
      o.load_shipped_configs = false;
      o.log_level = dispatch::LogLevel::off;
      return o;
    }());
    REQUIRE(rt.ok());
    const int64_t T = 5, H = 4096;
    std::mt19937 rng(3);
    HostTensor x(DType::bf16, T, H, H), w(DType::bf16, 1, H, H), y(DType::bf16, T, H, H);
    x.fill_uniform(rng, -2, 2);
    w.fill_uniform(rng, 0.5f, 1.5f);
    y.poison_all();
    auto* mem = mem_of(bt);
    DeviceBuffer dx(mem, x.bytes()), dw(mem, w.bytes()), dy(mem, y.bytes());
    REQUIRE(dx.upload(x).ok());
    REQUIRE(dw.upload(w).ok());
    REQUIRE(dy.upload(y).ok());
    const Device d{bt, 0};
    dispatch::RmsNormArgs args{dispatch::make_tensor_2d(dy.get(), DType::bf16, T, H, H, d),
                               dispatch::make_tensor_2d(dx.get(), DType::bf16, T, H, H, d),
                               dispatch::make_tensor_1d(dw.get(), DType::bf16, H, d), 1e-6f};
    dispatch::DispatchInfo info;
    std::string key;
    info.key = &key;
    dispatch::CallOptions opts;
    opts.info = &info;
    const Status st = dispatch::rmsnorm(**rt, args, dispatch::Stream{nullptr}, opts);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    CHECK(info.source == dispatch::PlanSource::fallback);
    CHECK(std::string(dispatch::plan_source_name(info.source)) == "default");
    CHECK(key.rfind(std::string(dispatch::device_type_name(bt)) + "/rmsnorm|" + dev_of(bt).device_name + "|", 0) == 0);
    MESSAGE("default plan: ", std::string(info.variant), " key ", key);
    REQUIRE(dy.download(&y).ok());
    CHECK(rmsnorm_mismatch(x, w, y, 1e-6, 8.0) == "");
    // A device ordinal that does not exist is refused, never run elsewhere.
    dispatch::RmsNormArgs bad = args;
    bad.x.device = bad.y.device = bad.w.device = Device{bt, 63};
    CHECK(dispatch::rmsnorm(**rt, bad, dispatch::Stream{nullptr}).code() == dispatch::StatusCode::unsupported_device);
  }
}

TEST_CASE("gpu tuning: the backend validates on the device with the host search's rule") {
  for (DeviceType bt : usable_backends()) {
    auto* mem = mem_of(bt);
    for (DType dt : {DType::fp32, DType::fp16, DType::bf16}) {
      INFO(dispatch::device_type_name(bt), " ", dispatch::dtype_name(dt));
      const int64_t R = 37, C = 1000, LD = 1003;  // strided rows; the gaps hold NaNs nobody compares
      const uint32_t poison = dt == DType::fp32   ? dispatch::tune::kPoisonFp32
                              : dt == DType::bf16 ? dispatch::tune::kPoisonBf16
                                                  : dispatch::tune::kPoisonFp16;
      double atol = 0, rtol = 0;
      dispatch::tune::validation_tolerance(OpKind::rmsnorm, dt, &atol, &rtol);
      std::mt19937 rng(5);
      HostTensor ref(dt, R, C, LD);
      ref.poison_all();  // 0xFFFF..: NaN in the gaps between rows
      ref.fill_uniform(rng, -3.f, 3.f);
      ref.set(4, 5, 8.f);  // scale = 8
      DeviceBuffer dref(mem, ref.bytes()), dout(mem, ref.bytes());
      REQUIRE((dref.ok() && dout.ok()));
      REQUIRE(dref.upload(ref).ok());
      dispatch::tune::ArgBuffer a;
      a.name = "y";
      a.ptr = dout.get();
      a.dtype = dt;
      a.rows = R;
      a.cols = C;
      a.ld = LD;
      a.read = false;
      a.written = true;
      auto run = [&](const HostTensor& out, bool check_poison) {
        REQUIRE(dout.upload(out).ok());
        auto m = mem->compare(a, dref.get(), atol, rtol, check_poison);
        REQUIRE_MESSAGE(m.ok(), m.status().to_string());
        return *m;
      };
      // Identical: ok (the search's probe of the reference against itself).
      CHECK(run(ref, true).ok);
      // Within tolerance (atol x scale): ok; beyond it: the element, both values.
      HostTensor out = ref;
      const float base = out.get(20, 300);
      out.set(20, 300, base + float(0.25 * atol * 8.0));
      if (out.get(20, 300) != base) CHECK(run(out, true).ok);
      out = ref;
      out.set(20, 300, base + 1.0f);
      out.set(30, 999, out.get(30, 999) + 1.0f);
      auto m = run(out, true);
      CHECK(!m.ok);
      CHECK(!m.unwritten);
      CHECK(m.row == 20);
      CHECK(m.col == 300);
      CHECK(m.got == doctest::Approx(out.get(20, 300)));
      CHECK(m.want == doctest::Approx(base));
      // The poison pattern left over is "unwritten" (and comes first in row-major order) ...
      out.bits[size_t(2 * LD + 999)] = poison;
      m = run(out, true);
      CHECK(!m.ok);
      CHECK(m.unwritten);
      CHECK(m.row == 2);
      CHECK(m.col == 999);
      // ... and, without the poison check (in-place arguments), a NaN that differs.
      m = run(out, false);
      CHECK(!m.ok);
      CHECK(!m.unwritten);
      CHECK(m.row == 2);
      // A NaN in the reference matches anything; a NaN in the output alone does not.
      HostTensor ref2 = ref;
      ref2.set(0, 0, std::numeric_limits<float>::quiet_NaN());
      REQUIRE(dref.upload(ref2).ok());
      out = ref2;
      out.set(0, 0, 1.f);
      CHECK(run(out, true).ok);
      out = ref2;
      out.set(36, 0, std::numeric_limits<float>::quiet_NaN());
      m = run(out, true);
      CHECK(!m.ok);
      CHECK(m.row == 36);
      CHECK(m.col == 0);
      // One row (a weight-like 1-D output) and an empty one.
      a.rows = 1;
      out = ref2;
      out.set(0, 17, 100.f);
      m = run(out, true);
      CHECK(!m.ok);
      CHECK(m.col == 17);
      a.rows = 0;
      CHECK(run(out, true).ok);
    }
  }
}

TEST_CASE("gpu tuning: sync tuning of fused_add_rmsnorm on device buffers applies the op exactly once") {
  for (DeviceType bt : usable_backends()) {
    const fs::path cache = fs::temp_directory_path() / ("kdispatch-gpu-tune-" + std::to_string(::getpid()));
    fs::remove_all(cache);
    dispatch::RuntimeOptions o;
    o.load_shipped_configs = false;
    o.log_level = dispatch::LogLevel::off;
    o.tune.mode = dispatch::TuneMode::sync;
    o.tune.cache_dir = cache.string();
    o.tune.reps = 3;
    o.tune.claim_shapes = false;
    auto rt = dispatch::Runtime::create(o);
    REQUIRE(rt.ok());
    const int64_t T = 37, H = 5120;
    std::mt19937 rng(77);
    HostTensor x0(DType::bf16, T, H, H), r0(DType::bf16, T, H, H), w(DType::bf16, 1, H, H);
    x0.fill_uniform(rng, -2, 2);
    r0.fill_uniform(rng, -2, 2);
    w.fill_uniform(rng, 0.5f, 1.5f);
    auto* mem = mem_of(bt);
    DeviceBuffer dx(mem, x0.bytes()), dr(mem, r0.bytes()), dw(mem, w.bytes());
    REQUIRE(dx.upload(x0).ok());
    REQUIRE(dr.upload(r0).ok());
    REQUIRE(dw.upload(w).ok());
    const Device d{bt, 0};
    dispatch::FusedAddRmsNormArgs args{dispatch::make_tensor_2d(dx.get(), DType::bf16, T, H, H, d),
                                       dispatch::make_tensor_2d(dr.get(), DType::bf16, T, H, H, d),
                                       dispatch::make_tensor_1d(dw.get(), DType::bf16, H, d), 1e-6f};
    dispatch::DispatchInfo info;
    dispatch::CallOptions opts;
    opts.info = &info;
    const Status st = dispatch::fused_add_rmsnorm(**rt, args, dispatch::Stream{nullptr}, opts);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    CHECK(info.tuned_now);
    CHECK(info.source == dispatch::PlanSource::table);
    MESSAGE("sync tuning picked ", std::string(info.variant), "; stats: ", (*rt)->tune_stats().candidates_run,
            " candidates run, ", (*rt)->tune_stats().candidates_rejected, " rejected, ",
            (*rt)->tune_stats().candidates_failed, " failed");
    CHECK((*rt)->tune_stats().candidates_rejected == 0);
    CHECK((*rt)->tune_stats().candidates_failed == 0);
    HostTensor x = x0, r = r0;
    REQUIRE(dx.download(&x).ok());
    REQUIRE(dr.download(&r).ok());
    int64_t bad = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> row(static_cast<size_t>(H));
      for (int64_t h = 0; h < H; ++h) {
        const float z = r.round(x0.get(t, h) + r0.get(t, h));
        bad += r.get(t, h) != z;  // exactly one application: residual = x0 + r0 once
        row[size_t(h)] = z;
      }
      const double inv = inv_rms(row, 1e-6);
      for (int64_t h = 0; h < H; ++h) {
        const double want = row[size_t(h)] * inv * w.get(0, h);
        bad += !(std::fabs(x.get(t, h) - want) <= tolerance(DType::bf16, want, 8.0));
      }
    }
    CHECK(bad == 0);
    // Persisted with the backend's fingerprint; a new runtime serves it from the cache.
    const fs::path dir = cache / dispatch::device_type_name(bt) / "fused_add_rmsnorm";
    CHECK(fs::is_directory(dir));
    dispatch::RuntimeOptions o2 = o;
    o2.tune.mode = dispatch::TuneMode::off;
    auto rt2 = dispatch::Runtime::create(o2);
    REQUIRE(rt2.ok());
    for (const auto& f : (*rt2)->load_report().files) {
      INFO(f.path, " ", dispatch::file_state_name(f.state));
      CHECK(f.state == dispatch::FileReport::State::loaded);
      CHECK(!f.stale);
    }
    dispatch::DispatchInfo info2;
    dispatch::CallOptions opts2;
    opts2.info = &info2;
    REQUIRE(dispatch::fused_add_rmsnorm(**rt2, args, dispatch::Stream{nullptr}, opts2).ok());
    CHECK(info2.source == dispatch::PlanSource::table);
    CHECK(std::string(info2.variant) == info.variant);
    REQUIRE(mem->sync().ok());
    rt2.value().reset();
    rt.value().reset();
    fs::remove_all(cache);
  }
}
