// SPDX-License-Identifier: Apache-2.0
// GPU fused_moe kernels: every variant against the op spec's float64
// reference (the spec's tolerance) on uniform and skewed routings, with an
// expert that is not local (id -1), shapes from decode (M = 1) to many
// pairs per expert (the grouped kernels' chunks of 256 pairs), H and I not
// multiples of the 16-byte vector (the vector variants decline them), the
// output poisoned before each run and every element checked written; a
// workspace too small falls back with the fallback code and writes nothing.
// Block fp8: e4m3fn weights with random 128x128 block scales, bf16
// activations, against the reference that quantises them as the op does.
// SGLang's fp8_w8a8 (fused_moe_fp8_tensor / _channel): per-expert or
// per-channel weight scales, static or dynamic activation scales.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/routing.hpp"
#include "gpu_test_util.hpp"
#include "ops/fused_moe.hpp"
#include "ops/fused_moe_fp8.hpp"

namespace {

using namespace kdgpu;
using dispatch::Device;
using dispatch::DeviceInfo;
using dispatch::Status;
using dispatch::core::LaunchArgs;
using dispatch::core::OpKind;
using dispatch::core::Plan;
using dispatch::core::Problem;
using dispatch::core::VariantDef;
namespace core = dispatch::core;

/// Runs per variant name in this backend's pass (every variant must run).
std::map<std::string, int> runs_of;

struct Shape {
  int64_t M, E, H, I, top_k;
  bool skewed = false;
  int64_t pad = 0;  ///< extra elements past each row of hidden, w1, w2, out and (block fp8) the scales, poisoned
};

std::string shape_text(const Shape& s) {
  return "M=" + std::to_string(s.M) + " E=" + std::to_string(s.E) + " H=" + std::to_string(s.H) +
         " I=" + std::to_string(s.I) + " top_k=" + std::to_string(s.top_k) + (s.skewed ? " skewed" : "") +
         (s.pad ? " pad=" + std::to_string(s.pad) : "");
}

/// Bytes of an int32 or fp32 host vector on the device.
template <class T>
bool upload(dispatch::tune::DeviceMemory* mem, void* dst, const std::vector<T>& v) {
  return mem->from_host(dst, v.data(), v.size() * sizeof(T)).ok();
}

/// Block fp8's weight scales [E * ceil(rows/128), ceil(cols/128)] with row
/// stride ld (>= ceil(cols/128); the padding NaN), random.
std::vector<float> block_scales(int64_t E, int64_t rows, int64_t cols, int64_t ld, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.02f, 0.06f);
  const int64_t n = (cols + 127) / 128;
  std::vector<float> v(size_t(E * ((rows + 127) / 128) * ld), std::numeric_limits<float>::quiet_NaN());
  for (size_t r = 0; r < v.size() / size_t(ld); ++r)
    for (int64_t c = 0; c < n; ++c) v[r * size_t(ld) + size_t(c)] = u(rng);
  return v;
}

/// fp8_w8a8's weight scales [E] (tensor: ld E) or [E, rows] with row stride
/// ld (>= rows; the padding NaN), random.
std::vector<float> w8a8_scales(bool channel, int64_t E, int64_t rows, int64_t ld, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0.02f, 0.06f);
  std::vector<float> v(size_t(channel ? E * ld : E), std::numeric_limits<float>::quiet_NaN());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < (channel ? rows : 1); ++r) v[size_t(channel ? e * ld + r : e)] = u(rng);
  return v;
}

/// dt: the weights' dtype (bf16, fp16, or fp8_e4m3fn: block fp8 with bf16
/// activations, or with op fused_moe_fp8_tensor / _channel SGLang's
/// fp8_w8a8, a1_scale and a2_scale given where `stat`).
int check_shape(DeviceType bt, DType dt, const Shape& s, std::mt19937& rng, OpKind op = OpKind::fused_moe,
                bool stat = false) {
  dispatch::tune::DeviceMemory* mem = core::backend_memory(bt);
  const DeviceInfo& dev = *dispatch::backends::find(bt)->device_info(0);
  const bool fp8 = dt == DType::fp8_e4m3fn, w8a8 = op != OpKind::fused_moe,
             channel = op == OpKind::fused_moe_fp8_channel;
  const core::OpSpec& spec = core::spec_of(op);
  const DType xt = fp8 ? DType::bf16 : dt;
  const int64_t ldh = s.H + s.pad, ldw2 = s.I + s.pad;  // padded rows: the padding poisoned (NaN), never read
  HostTensor hidden(xt, s.M, s.H, ldh), w1(dt, s.E * 2 * s.I, s.H, ldh), w2(dt, s.E * s.H, s.I, ldw2),
      out(xt, s.M, s.H, ldh);
  hidden.poison_all(), w1.poison_all(), w2.poison_all();
  hidden.fill_uniform(rng, -1.f, 1.f);
  w1.fill_uniform(rng, fp8 ? -4.f : -0.1f, fp8 ? 4.f : 0.1f);  // fp8: codes across the range, scaled below
  w2.fill_uniform(rng, fp8 ? -4.f : -0.1f, fp8 ? 4.f : 0.1f);
  const int64_t lds1 = w8a8 ? (channel ? 2 * s.I + s.pad : s.E) : (s.H + 127) / 128 + (s.pad ? 1 : 0),
                lds2 = w8a8 ? (channel ? s.H + s.pad : s.E) : (s.I + 127) / 128 + (s.pad ? 1 : 0);
  const std::vector<float> s1 = w8a8  ? w8a8_scales(channel, s.E, 2 * s.I, lds1, rng)
                                : fp8 ? block_scales(s.E, 2 * s.I, s.H, lds1, rng)
                                      : std::vector<float>{},
                           s2 = w8a8  ? w8a8_scales(channel, s.E, s.H, lds2, rng)
                                : fp8 ? block_scales(s.E, s.H, s.I, lds2, rng)
                                      : std::vector<float>{};
  // Static activation scales: hidden in [-1, 1] unclamped; the intermediate clamped past 4.48.
  const std::vector<float> as{1.2f / 448.f, 0.01f};
  std::vector<int32_t> ids(size_t(s.M * s.top_k));
  std::vector<float> tw(size_t(s.M * s.top_k));
  core::fill_expert_ids(ids.data(), s.M, s.top_k, s.top_k, s.E,
                        s.skewed ? core::Routing::skewed : core::Routing::uniform, rng);
  core::fill_routing_weights(tw.data(), s.M, s.top_k, s.top_k, rng);
  if (s.M > 2) ids.back() = -1;  // not a local expert
  DeviceBuffer dh(mem, hidden.bytes()), dw1(mem, w1.bytes()), dw2(mem, w2.bytes()), dout(mem, out.bytes()),
      dids(mem, ids.size() * 4), dtw(mem, tw.size() * 4);
  REQUIRE((dh.ok() && dw1.ok() && dw2.ok() && dout.ok() && dids.ok() && dtw.ok()));
  REQUIRE((dh.upload(hidden).ok() && dw1.upload(w1).ok() && dw2.upload(w2).ok()));
  REQUIRE((upload(mem, dids.get(), ids) && upload(mem, dtw.get(), tw)));
  DeviceBuffer ds1(mem, fp8 ? s1.size() * 4 : 4), ds2(mem, fp8 ? s2.size() * 4 : 4);
  REQUIRE((ds1.ok() && ds2.ok()));
  if (fp8) REQUIRE((upload(mem, ds1.get(), s1) && upload(mem, ds2.get(), s2)));
  DeviceBuffer das(mem, as.size() * 4);
  REQUIRE((das.ok() && upload(mem, das.get(), as)));
  // The float64 reference on the inputs as stored.
  std::vector<double> rh(size_t(s.M * s.H)), r1(size_t(s.E * 2 * s.I * s.H)), r2(size_t(s.E * s.H * s.I)),
      rids(ids.begin(), ids.end()), rtw(tw.begin(), tw.end()), want(size_t(s.M * s.H)), rs1(s1.begin(), s1.end()),
      rs2(s2.begin(), s2.end()), ras(as.begin(), as.end());
  for (int64_t r = 0; r < s.M; ++r)
    for (int64_t c = 0; c < s.H; ++c) rh[size_t(r * s.H + c)] = hidden.get(r, c);
  for (int64_t r = 0; r < s.E * 2 * s.I; ++r)
    for (int64_t c = 0; c < s.H; ++c) r1[size_t(r * s.H + c)] = w1.get(r, c);
  for (int64_t r = 0; r < s.E * s.H; ++r)
    for (int64_t c = 0; c < s.I; ++c) r2[size_t(r * s.I + c)] = w2.get(r, c);
  Problem p;
  p.op = op;
  p.device = Device{bt, 0};
  p.in_dtype = dt, p.out_dtype = xt;
  p.has_bias = w8a8 ? stat : fp8;  // a1_scale and a2_scale; the block scales
  p.m = s.M, p.n = s.I, p.k = s.H, p.extra[0] = s.E, p.extra[1] = s.top_k;
  p.align_bytes = (s.H % 8 == 0 && s.I % 8 == 0) ? 16 : 2;
  core::RefArgs ra;
  ra.data[core::kMoeArgHidden] = rh.data(), ra.ld[core::kMoeArgHidden] = s.H;
  ra.data[core::kMoeArgW1] = r1.data(), ra.ld[core::kMoeArgW1] = s.H;
  ra.data[core::kMoeArgW2] = r2.data(), ra.ld[core::kMoeArgW2] = s.I;
  ra.data[core::kMoeArgTopkIds] = rids.data(), ra.ld[core::kMoeArgTopkIds] = s.top_k;
  ra.data[core::kMoeArgTopkWeights] = rtw.data(), ra.ld[core::kMoeArgTopkWeights] = s.top_k;
  ra.data[core::kMoeArgOut] = want.data(), ra.ld[core::kMoeArgOut] = s.H;
  if (fp8) {
    ra.data[core::kMoeArgW1Scale] = rs1.data(), ra.ld[core::kMoeArgW1Scale] = lds1;
    ra.data[core::kMoeArgW2Scale] = rs2.data(), ra.ld[core::kMoeArgW2Scale] = lds2;
  }
  if (w8a8 && stat) ra.data[core::kMoeArgA1Scale] = ras.data(), ra.data[core::kMoeArgA2Scale] = ras.data() + 1;
  ra.scalar[0] = 1.f;
  spec.reference(p, ra);
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  const core::Tolerance tol = core::tolerance_of(spec, p, dt);
  LaunchArgs la;
  la.data[core::kMoeArgHidden] = dh.get(), la.ld[core::kMoeArgHidden] = ldh;
  la.data[core::kMoeArgW1] = dw1.get(), la.ld[core::kMoeArgW1] = ldh;
  la.data[core::kMoeArgW2] = dw2.get(), la.ld[core::kMoeArgW2] = ldw2;
  la.data[core::kMoeArgTopkIds] = dids.get(), la.ld[core::kMoeArgTopkIds] = s.top_k;
  la.data[core::kMoeArgTopkWeights] = dtw.get(), la.ld[core::kMoeArgTopkWeights] = s.top_k;
  la.data[core::kMoeArgOut] = dout.get(), la.ld[core::kMoeArgOut] = ldh;
  if (fp8) {
    la.data[core::kMoeArgW1Scale] = ds1.get(), la.ld[core::kMoeArgW1Scale] = lds1;
    la.data[core::kMoeArgW2Scale] = ds2.get(), la.ld[core::kMoeArgW2Scale] = lds2;
  }
  if (w8a8 && stat) {
    la.data[core::kMoeArgA1Scale] = das.get(), la.ld[core::kMoeArgA1Scale] = 1;
    la.data[core::kMoeArgA2Scale] = static_cast<char*>(das.get()) + 4, la.ld[core::kMoeArgA2Scale] = 1;
  }
  la.scalar[0] = 1.f, la.scalar[1] = 0.f;
  int runs = 0;
  for (const VariantDef* v : core::variants_for(op, bt)) {
    if (v->in_dtype != dt) continue;
    const std::vector<Plan> pts = core::config_space(*v, p, dev);
    const bool vec = std::string_view(v->name).find("__cuda_ref") == std::string_view::npos;
    if (!vec) CHECK(!pts.empty());
    for (const Plan& plan : pts) {
      INFO(core::plan_to_string(plan), " ", dispatch::dtype_name(dt), " ", shape_text(s), stat ? " static" : "");
      ++runs;
      ++runs_of[std::string(v->name)];
      const int64_t need = v->workspace_bytes ? v->workspace_bytes(p, plan.params) : 0;
      DeviceBuffer ws(mem, size_t(need > 0 ? need : 1));
      REQUIRE(ws.ok());
      // The workspace poisoned (0x7f bytes: bf16 3.4e38, fp32 3.4e38): a composition's rows of dropped
      // pairs must be zeroed before the per-tensor amax and the top-k sum read them.
      const std::vector<unsigned char> junk(size_t(need > 0 ? need : 1), 0x7f);
      REQUIRE(mem->from_host(ws.get(), junk.data(), junk.size()).ok());
      out.poison_all();
      REQUIRE(dout.upload(out).ok());
      // A workspace one byte short: the fallback code, nothing written. (The
      // tensor-core variants run the split kernels when those fit: short of
      // the split kernels' M * top_k * I floats too, for them.)
      const bool mma = std::string_view(v->name).find("__mma") != std::string_view::npos;
      const int64_t split_need = s.M * s.top_k * s.I * 4;
      LaunchArgs small = la;
      small.workspace = ws.get(), small.workspace_bytes = (mma ? std::min(need, split_need) : need) - 1;
      if (need > 0) CHECK(v->launch(small, p, plan.params).code() == core::kNeedsFallbackCode);
      LaunchArgs run = la;
      run.workspace = ws.get(), run.workspace_bytes = need;
      const Status st = v->launch(run, p, plan.params);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      REQUIRE(dout.download(&out).ok());
      int64_t bad = 0;
      std::string first;
      for (int64_t t = 0; t < s.M; ++t)
        for (int64_t c = 0; c < s.H; ++c) {
          const double w = want[size_t(t * s.H + c)], g = out.get(t, c);
          if (out.is_poison(t, c) || !(std::fabs(g - w) <= tol.atol_rel * scale + tol.rtol * std::fabs(w)))
            if (bad++ == 0)
              first = "(" + std::to_string(t) + "," + std::to_string(c) + ") got " + std::to_string(g) + " want " +
                      std::to_string(w);
        }
      for (int64_t t = 0; t < s.M; ++t)  // the rows' padding stays as poisoned
        for (int64_t c = s.H; c < ldh; ++c)
          if (!out.is_poison(t, c) && bad++ == 0)
            first = "padding (" + std::to_string(t) + "," + std::to_string(c) + ") written";
      CHECK_MESSAGE(bad == 0, first, " (", bad, " elements off)");
    }
  }
  return runs;
}

}  // namespace

TEST_CASE("gpu fused_moe: every variant matches the spec's float64 reference, decode to many pairs per expert") {
  std::mt19937 rng(35);
  for (DeviceType bt : usable_backends()) {
    if (core::variants_for(OpKind::fused_moe, bt).empty()) continue;
    runs_of.clear();
    int runs = 0;
    for (DType dt : {DType::bf16, DType::fp16, DType::fp8_e4m3fn})
      for (const Shape& s :
           {Shape{1, 8, 256, 64, 2}, Shape{3, 16, 128, 96, 4}, Shape{5, 4, 72, 40, 2, true}, Shape{64, 8, 256, 128, 2},
            Shape{300, 4, 64, 32, 2, true}, Shape{2, 6, 3, 5, 3}, Shape{17, 128, 512, 64, 8, true},
            Shape{4, 16, 1024, 256, 9}, Shape{9, 32, 640, 384, 4, true}, Shape{200, 4, 256, 128, 2, true},
            // The ring kernels' edges: H = 32 (a down block of one live warp, an up K of half a chunk), I % 64 ==
            // 32 in a block of 2 row tiles; padded rows (hidden, weights, out, scales) at a block-fp8 shape.
            Shape{40, 4, 32, 96, 2, true}, Shape{33, 8, 384, 256, 4, false, 16}})
        runs += check_shape(bt, dt, s, rng);
    MESSAGE(dispatch::device_type_name(bt), " fused_moe: ", runs, " (variant, shape, dtype) runs checked");
    CHECK(runs > 0);
    // Every variant ran somewhere: one that declines every shape (a launch
    // bound its check gets wrong) is a failure, not a silent skip.
    for (const VariantDef* v : core::variants_for(OpKind::fused_moe, bt)) {
      INFO(v->name);
      CHECK(runs_of[std::string(v->name)] > 0);
    }
  }
}

// SGLang's fp8_w8a8 fused experts without block_shape (fused_moe_fp8_tensor /
// _channel, CUDA: the composition on moe_gemm_fp8's get_default and on its
// references), static and dynamic activation scales, on the shapes above
// that reach the split kernels (decode), the tensor op's wgmma and ring
// (from 16 pairs an expert), an expert not local (its c2 row zero before the
// per-tensor amax), odd H and I, padded rows and scales.
TEST_CASE("gpu fused_moe_fp8: per-tensor and per-channel, static and dynamic, every variant against the reference") {
  std::mt19937 rng(37);
  for (DeviceType bt : usable_backends()) {
    if (core::variants_for(OpKind::fused_moe_fp8_tensor, bt).empty()) continue;
    runs_of.clear();
    int runs = 0;
    for (OpKind op : {OpKind::fused_moe_fp8_tensor, OpKind::fused_moe_fp8_channel})
      for (bool stat : {true, false})
        for (const Shape& s : {Shape{1, 8, 256, 64, 2}, Shape{3, 16, 128, 96, 4}, Shape{5, 4, 72, 40, 2, true},
                               Shape{64, 8, 256, 128, 2}, Shape{300, 4, 64, 32, 2, true}, Shape{2, 6, 3, 5, 3},
                               Shape{200, 4, 256, 128, 2, true}, Shape{33, 8, 384, 256, 4, false, 16}})
          runs += check_shape(bt, DType::fp8_e4m3fn, s, rng, op, stat);
    MESSAGE(dispatch::device_type_name(bt), " fused_moe_fp8: ", runs, " (variant, shape, mode) runs checked");
    for (OpKind op : {OpKind::fused_moe_fp8_tensor, OpKind::fused_moe_fp8_channel})
      for (const VariantDef* v : core::variants_for(op, bt)) {
        INFO(v->name);
        CHECK(runs_of[std::string(v->name)] > 0);
      }
  }
}
