// SPDX-License-Identifier: Apache-2.0
// The fused-MoE composition's wiring (kernels/gpu/fused_moe_compose.hpp:
// moe_align, moe_gemm_fp8 up, silu_and_mul, moe_gemm_fp8 down, moe_sum, on
// the call's stream) checked without a GPU: the header compiled into a
// namespace of its own whose sub-op lists and defaults are the CPU
// backend's, so every slot, row stride, scalar, block size, workspace part
// and zeroing it passes is exercised by real kernels, against
// fused_moe_fp8's float64 reference within its tolerance. The workspace is
// poisoned first and a pair is routed to an expert that is not local (id
// -1): its rows of c1 and c3 must be zeroed (the dynamic per-tensor amax
// and the top-k sum read them). The GPU kernels themselves are checked on
// a GPU (tests/gpu/test_gpu_moe.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backends/registry.hpp"
#include "core/numeric.hpp"
#include "ops/specs.hpp"
#include "test_util.hpp"

#define KDISPATCH_GPU_NS compose_on_cpu
#define KDISPATCH_GPU_HAS_TILED 1
#include "gpu/fused_moe_compose.hpp"

namespace dispatch::compose_on_cpu {
namespace {
std::span<const core::VariantDef* const> cpu_list(core::OpKind op) {
  static std::vector<const core::VariantDef*> lists[3];
  const int i = op == core::OpKind::moe_gemm ? 0 : op == core::OpKind::moe_gemm_fp8_tensor ? 1 : 2;
  if (lists[i].empty()) lists[i] = core::variants_for(op, DeviceType::cpu);
  return lists[i];
}
}  // namespace

// What the composition asks of its backend, answered by the CPU's.
/// moe_gemm's CPU variants, and a copy of each dtype's first named
/// "moe_gemm_<dt>__wgmma" (the composition's fused_moe path looks its wgmma
/// variant up by name).
std::span<const core::VariantDef* const> moe_gemm_variants() noexcept {
  static const std::vector<const core::VariantDef*> list = [] {
    static std::vector<core::VariantDef> copies;
    static std::vector<std::string> names;
    std::vector<const core::VariantDef*> l(cpu_list(core::OpKind::moe_gemm).begin(),
                                           cpu_list(core::OpKind::moe_gemm).end());
    copies.reserve(l.size()), names.reserve(l.size());
    for (const core::VariantDef* v : cpu_list(core::OpKind::moe_gemm)) {
      bool seen = false;
      for (const core::VariantDef& c : copies) seen = seen || c.in_dtype == v->in_dtype;
      if (seen || (v->flags & core::kVariantReference) != 0) continue;
      names.push_back("moe_gemm_" + std::string(dtype_name(v->in_dtype)) + "__wgmma");
      copies.push_back(*v);
      copies.back().name = names.back();
    }
    for (const core::VariantDef& c : copies) l.push_back(&c);
    return l;
  }();
  return list;
}
std::span<const core::VariantDef* const> moe_gemm_fp8_tensor_variants() noexcept {
  return cpu_list(core::OpKind::moe_gemm_fp8_tensor);
}
std::span<const core::VariantDef* const> moe_gemm_fp8_channel_variants() noexcept {
  return cpu_list(core::OpKind::moe_gemm_fp8_channel);
}
core::Plan moe_gemm_scaled_default(const core::Problem& p, const DeviceInfo& dev) noexcept {
  return core::get_default(p, dev);
}
core::Plan moe_align_default(const core::Problem& p, const DeviceInfo& dev) noexcept {
  return core::get_default(p, dev);
}
core::Plan silu_default(const core::Problem& p, const DeviceInfo& dev) noexcept { return core::get_default(p, dev); }
core::Plan moe_sum_default(const core::Problem& p, const DeviceInfo& dev) noexcept { return core::get_default(p, dev); }
const DeviceState* device_state(int32_t) noexcept {
  static const DeviceState st = [] {
    DeviceState s{};
    s.info = cpu_device_info();
    return s;
  }();
  return &st;
}
Status moe_zero_async(void* d, int64_t bytes, const core::LaunchArgs&, const core::Problem&) noexcept {
  std::memset(d, 0, static_cast<size_t>(bytes));
  return Status();
}
Status moe_copy_rows_async(void* dst, const void* src, int64_t rows, int64_t row_bytes, int64_t src_pitch,
                           const core::LaunchArgs&, const core::Problem&) noexcept {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<uint8_t*>(dst) + r * row_bytes, static_cast<const uint8_t*>(src) + r * src_pitch,
                static_cast<size_t>(row_bytes));
  return Status();
}
}  // namespace dispatch::compose_on_cpu

namespace {

using namespace dispatch;
namespace compose = dispatch::compose_on_cpu::fused_moe_compose;

struct Case {
  core::OpKind op;
  bool stat;
  int64_t M, E, H, I, top_k;
  int64_t tw_pad = 0;  ///< topk_weights' rows this much longer than top_k (NaN there)
};

/// A pointer of Args' slots: void* (a call's LaunchArgs), double* (RefArgs).
template <class Args>
using Slot = std::remove_reference_t<decltype(std::declval<Args&>().data[0])>;

/// fused_moe's slots of a call or of its reference, the same strides either
/// way (the scales' rows: ld1, ld2; topk_weights' row stride: ldtw), then
/// routed_scaling_factor 1 and silu.
template <class Args>
void wire(Args& a, const Case& c, Slot<Args> hidden, Slot<Args> w1, Slot<Args> w2, Slot<Args> tw, int64_t ldtw,
          Slot<Args> ids, Slot<Args> out, Slot<Args> s1, int64_t ld1, Slot<Args> s2, int64_t ld2) {
  a.data[core::kMoeArgHidden] = hidden, a.ld[core::kMoeArgHidden] = c.H;
  a.data[core::kMoeArgW1] = w1, a.ld[core::kMoeArgW1] = c.H;
  a.data[core::kMoeArgW2] = w2, a.ld[core::kMoeArgW2] = c.I;
  a.data[core::kMoeArgTopkWeights] = tw, a.ld[core::kMoeArgTopkWeights] = ldtw;
  a.data[core::kMoeArgTopkIds] = ids, a.ld[core::kMoeArgTopkIds] = c.top_k;
  a.data[core::kMoeArgOut] = out, a.ld[core::kMoeArgOut] = c.H;
  a.data[core::kMoeArgW1Scale] = s1, a.ld[core::kMoeArgW1Scale] = ld1;
  a.data[core::kMoeArgW2Scale] = s2, a.ld[core::kMoeArgW2Scale] = ld2;
  a.scalar[0] = 1.f, a.scalar[1] = 0.f;
}

/// Runs the composition (`how`, block `block`: 0 its own rule) on one case;
/// "" when out matches the float64 reference, else the first mismatch.
std::string run_case(const Case& c, compose::Gemms how, int64_t block, std::mt19937& rng) {
  const bool channel = c.op == core::OpKind::fused_moe_fp8_channel;
  const int64_t P = c.M * c.top_k;
  std::uniform_real_distribution<float> u(-1.f, 1.f), code(-4.f, 4.f), sc(0.02f, 0.06f);
  std::vector<uint16_t> hidden(size_t(c.M * c.H)), out(size_t(c.M * c.H), 0x7fc0);  // out: NaN
  std::vector<uint8_t> w1(size_t(c.E * 2 * c.I * c.H)), w2(size_t(c.E * c.H * c.I));
  std::vector<float> s1(size_t(channel ? c.E * 2 * c.I : c.E)), s2(size_t(channel ? c.E * c.H : c.E)),
      tw(static_cast<size_t>(P)), as{1.2f / 448.f, 0.01f};
  std::vector<int32_t> ids(static_cast<size_t>(P));
  for (auto& v : hidden) v = core::float_to_bf16(u(rng));
  for (auto& v : w1) v = core::float_to_fp8(code(rng), core::kE4m3fn, true);
  for (auto& v : w2) v = core::float_to_fp8(code(rng), core::kE4m3fn, true);
  for (auto& v : s1) v = sc(rng);
  for (auto& v : s2) v = sc(rng);
  for (auto& v : tw) v = 0.1f + 0.9f * std::fabs(u(rng));
  for (int64_t q = 0; q < P; ++q) ids[size_t(q)] = int32_t((q * 7 + q / c.top_k) % c.E);  // distinct per token
  ids[size_t(P - 1)] = -1;                                                                // an expert that is not local

  core::Problem p;
  p.op = c.op;
  p.device = Device{DeviceType::cpu, 0};
  p.in_dtype = DType::fp8_e4m3fn, p.out_dtype = DType::bf16, p.has_bias = c.stat;
  p.m = c.M, p.n = c.I, p.k = c.H, p.extra[0] = c.E, p.extra[1] = c.top_k;
  p.align_bytes = 16;
  const int64_t prm[] = {block};
  const compose::Parts parts = compose::parts_of(p, how, block > 0 ? prm : nullptr);
  std::vector<unsigned char> ws(size_t(parts.bytes + 256), 0x7f);  // poisoned
  void* const base = ws.data() + (256 - reinterpret_cast<uintptr_t>(ws.data()) % 256) % 256;

  core::LaunchArgs la;
  const int64_t ldtw = c.top_k + c.tw_pad;  // strided rows: copied dense into the workspace first
  std::vector<float> tws(size_t(c.M * ldtw), std::nanf(""));
  for (int64_t q = 0; q < P; ++q) tws[size_t(q / c.top_k * ldtw + q % c.top_k)] = tw[size_t(q)];
  const int64_t ld1 = channel ? 2 * c.I : 0, ld2 = channel ? c.H : 0;
  wire(la, c, hidden.data(), w1.data(), w2.data(), tws.data(), ldtw, ids.data(), out.data(), s1.data(), ld1, s2.data(),
       ld2);
  if (c.stat) la.data[core::kMoeArgA1Scale] = as.data(), la.data[core::kMoeArgA2Scale] = as.data() + 1;
  la.workspace = base, la.workspace_bytes = parts.bytes;
  const Status st = compose::launch(la, p, how, block > 0 ? prm : nullptr);
  if (!st.ok()) return "launch: " + st.to_string();

  // The float64 reference on the inputs as stored.
  auto dbl = [](auto& v, auto f) {
    std::vector<double> d(v.size());
    for (size_t i = 0; i < v.size(); ++i) d[i] = f(v[i]);
    return d;
  };
  std::vector<double> rh = dbl(hidden, [](uint16_t h) { return double(core::bf16_to_float(h)); }),
                      r1 = dbl(w1, [](uint8_t b) { return double(core::fp8_to_float(b, core::kE4m3fn)); }),
                      r2 = dbl(w2, [](uint8_t b) { return double(core::fp8_to_float(b, core::kE4m3fn)); }),
                      rs1 = dbl(s1, [](float f) { return double(f); }),
                      rs2 = dbl(s2, [](float f) { return double(f); }),
                      rtw = dbl(tw, [](float f) { return double(f); }),
                      rids = dbl(ids, [](int32_t i) { return double(i); }),
                      ras = dbl(as, [](float f) { return double(f); }), want(size_t(c.M * c.H));
  core::RefArgs ra;
  wire(ra, c, rh.data(), r1.data(), r2.data(), rtw.data(), c.top_k, rids.data(), want.data(), rs1.data(), ld1,
       rs2.data(), ld2);
  if (c.stat) ra.data[core::kMoeArgA1Scale] = ras.data(), ra.data[core::kMoeArgA2Scale] = ras.data() + 1;
  const core::OpSpec& spec = core::spec_of(c.op);
  spec.reference(p, ra);
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  const core::Tolerance tol = core::tolerance_of(spec, p, DType::fp8_e4m3fn);
  std::string first;
  int64_t bad = 0;
  for (int64_t i = 0; i < c.M * c.H; ++i) {
    const double g = core::bf16_to_float(out[size_t(i)]), w = want[size_t(i)];
    if (!(std::fabs(g - w) <= tol.atol_rel * scale + tol.rtol * std::fabs(w)) && bad++ == 0)
      first = "out[" + std::to_string(i / c.H) + ", " + std::to_string(i % c.H) + "] = " + std::to_string(g) +
              ", want " + std::to_string(w);
  }
  return bad == 0 ? ""
                  : first + " (" + std::to_string(bad) + " of " + std::to_string(c.M * c.H) + " off; scale " +
                        std::to_string(scale) + ", atol_rel " + std::to_string(tol.atol_rel) + ")";
}

}  // namespace

TEST_CASE("fused_moe composition: the fp8_w8a8 wiring on the CPU's sub-ops matches the float64 reference") {
  std::mt19937 rng(38);
  int runs = 0;
  for (core::OpKind op : {core::OpKind::fused_moe_fp8_tensor, core::OpKind::fused_moe_fp8_channel})
    for (bool stat : {true, false})
      for (const Case& c : {Case{op, stat, 1, 4, 64, 32, 2}, Case{op, stat, 7, 8, 128, 64, 3},
                            Case{op, stat, 40, 4, 64, 40, 2}, Case{op, stat, 9, 4, 64, 32, 2, 3}})
        for (compose::Gemms how : {compose::Gemms::scaled, compose::Gemms::scaled_reference})
          for (int64_t block : {int64_t{0}, int64_t{16}, int64_t{128}}) {
            if (how == compose::Gemms::scaled_reference && block != 0) continue;  // the reference has no block_m
            const std::string label =
                std::string(core::op_name(op)) + (stat ? " static" : " dynamic") + " M=" + std::to_string(c.M) +
                " E=" + std::to_string(c.E) + " H=" + std::to_string(c.H) + " I=" + std::to_string(c.I) +
                " top_k=" + std::to_string(c.top_k) + " tw_pad=" + std::to_string(c.tw_pad) +
                (how == compose::Gemms::scaled ? " compose" : " reference") + " block=" + std::to_string(block);
            INFO(label);
            CHECK(run_case(c, how, block, rng) == "");
            ++runs;
          }
  CHECK(runs == 2 * 2 * 4 * 4);
}

// fused_moe's composition on moe_gemm's "wgmma" variant (here the CPU's
// moe_gemm under that name): bf16 and block fp8 against fused_moe's
// reference, a pair not local, the workspace poisoned.
TEST_CASE("fused_moe composition: the wgmma path's wiring on the CPU's sub-ops matches the float64 reference") {
  std::mt19937 rng(39);
  for (DType w : {DType::bf16, DType::fp8_e4m3fn})
    for (const Case& c : {Case{core::OpKind::fused_moe, false, 3, 4, 256, 128, 2},
                          Case{core::OpKind::fused_moe, false, 40, 8, 128, 256, 3}}) {
      const bool fp8 = w == DType::fp8_e4m3fn;
      const int64_t P = c.M * c.top_k, nb1 = 2 * c.I / 128, nb2 = c.H / 128, kb1 = c.H / 128, kb2 = c.I / 128;
      std::uniform_real_distribution<float> u(-1.f, 1.f), code(-4.f, 4.f), sc(0.02f, 0.06f);
      std::vector<uint16_t> hidden(size_t(c.M * c.H)), out(size_t(c.M * c.H), 0x7fc0);
      std::vector<uint16_t> w1b(fp8 ? 0 : size_t(c.E * 2 * c.I * c.H)), w2b(fp8 ? 0 : size_t(c.E * c.H * c.I));
      std::vector<uint8_t> w1q(fp8 ? size_t(c.E * 2 * c.I * c.H) : 0), w2q(fp8 ? size_t(c.E * c.H * c.I) : 0);
      std::vector<float> s1(fp8 ? size_t(c.E * nb1 * kb1) : 0), s2(fp8 ? size_t(c.E * nb2 * kb2) : 0);
      std::vector<float> tw(static_cast<size_t>(P));
      std::vector<int32_t> ids(static_cast<size_t>(P));
      for (auto& v : hidden) v = core::float_to_bf16(u(rng));
      for (auto& v : w1b) v = core::float_to_bf16(0.1f * u(rng));
      for (auto& v : w2b) v = core::float_to_bf16(0.1f * u(rng));
      for (auto& v : w1q) v = core::float_to_fp8(code(rng), core::kE4m3fn, true);
      for (auto& v : w2q) v = core::float_to_fp8(code(rng), core::kE4m3fn, true);
      for (auto& v : s1) v = sc(rng);
      for (auto& v : s2) v = sc(rng);
      for (auto& v : tw) v = 0.1f + 0.9f * std::fabs(u(rng));
      for (int64_t q = 0; q < P; ++q) ids[size_t(q)] = int32_t((q * 7 + q / c.top_k) % c.E);
      ids[size_t(P - 1)] = -1;
      core::Problem p;
      p.op = core::OpKind::fused_moe;
      p.device = Device{DeviceType::cpu, 0};
      p.in_dtype = w, p.out_dtype = DType::bf16, p.has_bias = fp8;
      p.m = c.M, p.n = c.I, p.k = c.H, p.extra[0] = c.E, p.extra[1] = c.top_k;
      p.align_bytes = 16;
      const compose::Parts parts = compose::parts_of(p, compose::Gemms::wgmma);
      std::vector<unsigned char> ws(size_t(parts.bytes + 256), 0x7f);
      void* const base = ws.data() + (256 - reinterpret_cast<uintptr_t>(ws.data()) % 256) % 256;
      core::LaunchArgs la;
      wire(la, c, hidden.data(), fp8 ? static_cast<void*>(w1q.data()) : w1b.data(),
           fp8 ? static_cast<void*>(w2q.data()) : w2b.data(), tw.data(), c.top_k, ids.data(), out.data(),
           fp8 ? s1.data() : nullptr, fp8 ? kb1 : 0, fp8 ? s2.data() : nullptr, fp8 ? kb2 : 0);
      la.workspace = base, la.workspace_bytes = parts.bytes;
      INFO(dtype_name(w), " M=", c.M, " E=", c.E, " H=", c.H, " I=", c.I);
      const Status st = compose::launch(la, p, compose::Gemms::wgmma);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      auto dbl = [](auto& v, auto f) {
        std::vector<double> d(v.size());
        for (size_t i = 0; i < v.size(); ++i) d[i] = f(v[i]);
        return d;
      };
      auto bf = [](uint16_t h) { return double(core::bf16_to_float(h)); };
      auto f8 = [](uint8_t b) { return double(core::fp8_to_float(b, core::kE4m3fn)); };
      auto fl = [](float f) { return double(f); };
      std::vector<double> rh = dbl(hidden, bf), r1 = fp8 ? dbl(w1q, f8) : dbl(w1b, bf),
                          r2 = fp8 ? dbl(w2q, f8) : dbl(w2b, bf), rs1 = dbl(s1, fl), rs2 = dbl(s2, fl),
                          rtw = dbl(tw, fl), rids = dbl(ids, [](int32_t i) { return double(i); }),
                          want(size_t(c.M * c.H));
      core::RefArgs ra;
      wire(ra, c, rh.data(), r1.data(), r2.data(), rtw.data(), c.top_k, rids.data(), want.data(),
           fp8 ? rs1.data() : nullptr, fp8 ? kb1 : 0, fp8 ? rs2.data() : nullptr, fp8 ? kb2 : 0);
      const core::OpSpec& spec = core::spec_of(core::OpKind::fused_moe);
      spec.reference(p, ra);
      double scale = 0;
      for (double v : want) scale = std::max(scale, std::fabs(v));
      const core::Tolerance tol = core::tolerance_of(spec, p, w);
      int64_t bad = 0;
      double worst = 0;
      for (int64_t i = 0; i < c.M * c.H; ++i) {
        const double g = core::bf16_to_float(out[size_t(i)]), wv = want[size_t(i)];
        const double err = std::fabs(g - wv) / (tol.atol_rel * scale + tol.rtol * std::fabs(wv));
        worst = std::max(worst, err);
        bad += !(err <= 1.0);
      }
      CHECK_MESSAGE(bad == 0, bad, " of ", c.M * c.H, " off, the worst at ", worst, " of the tolerance");
    }
}
