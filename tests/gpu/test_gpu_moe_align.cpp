// SPDX-License-Identifier: Apache-2.0
// GPU moe_align kernels: every variant and every point of its space on
// random routings, bit for bit the host's moe_align_spec::align (the op is
// deterministic: an expert's pairs in ascending order, so every variant
// and point writes the same bits): sorted_token_ids, expert_ids and
// num_tokens_post_pad poisoned before each run, every element up to the
// op's sizes checked and a tail past them (an engine's longer buffer) left
// untouched. E 8 .. 257 (and past the block kernel's shared memory, where
// only the reference serves), top_k 1 .. 9, M 1 .. 1000, block_size 16 ..
// 128, ids of -1 and past E (dropped), a skewed routing, padded topk_ids
// rows, with and without expert_map; every variant must run on some shape.
// get_default on a grid of shapes; the op through a Runtime on device
// tensors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "gpu/moe_align_plan.hpp"
#include "gpu_test_util.hpp"
#include "ops/moe_align.hpp"

namespace {

using namespace kdgpu;
using dispatch::Device;
using dispatch::DeviceInfo;
using dispatch::Status;
namespace core = dispatch::core;
namespace spec = dispatch::core::moe_align_spec;
using core::OpKind, core::Plan, core::Problem;

/// Runs per variant name in this backend's pass (every variant must run).
std::map<std::string, int> runs_of;

/// What the outputs hold before a run: no value the op writes (pair
/// indices, M * top_k, expert ids, -1, the map's values are all small).
constexpr int32_t kPoison = 0x7eadbeef;
/// Elements past the op's sizes in every output buffer: never written.
constexpr int64_t kTail = 37;

struct AlignShape {
  int64_t M, top_k, E, block;
  bool map = false;
  bool skewed = false;  ///< three pairs in four on one expert
  int64_t ld_pad = 0;   ///< topk_ids' row stride: top_k + ld_pad
};

std::string text(const AlignShape& s) {
  return "M=" + std::to_string(s.M) + " top_k=" + std::to_string(s.top_k) + " E=" + std::to_string(s.E) +
         " block_size=" + std::to_string(s.block) + (s.map ? " expert_map" : "") + (s.skewed ? " skewed" : "") +
         " ld=" + std::to_string(s.top_k + s.ld_pad);
}

/// E {8, 128, 257} x top_k {1, 2, 8, 9} x M {1, 5, 64, 1000} x block_size
/// {16, 64, 128}, the map on every other shape, padded rows and a skewed
/// routing on some; then E past what the block kernel's shared memory
/// holds at 1024 threads (CUDA 371, HIP 721) and at every point (4096),
/// and many pairs (32768) on a few experts.
std::vector<AlignShape> align_shapes() {
  std::vector<AlignShape> out;
  int n = 0;
  for (int64_t e : {8, 128, 257})
    for (int64_t k : {1, 2, 8, 9})
      for (int64_t m : {1, 5, 64, 1000})
        for (int64_t b : {16, 64, 128}) {
          ++n;
          out.push_back({m, k, e, b, n % 2 == 0, n % 5 == 0, n % 3 == 0 ? 3 : 0});
        }
  for (bool map : {false, true}) {
    out.push_back({64, 8, 1000, 16, map});
    out.push_back({5, 8, 4096, 64, map, false, 1});
    out.push_back({4096, 8, 16, 64, map, true});
    out.push_back({1, 1, 1, 1, map});
    out.push_back({33, 9, 257, 1, map});
  }
  return out;
}

const DeviceInfo& device_of(DeviceType t) { return *dispatch::backends::find(t)->device_info(0); }

/// int32 host vectors to and from the device.
bool upload(dispatch::tune::DeviceMemory* mem, void* dst, const std::vector<int32_t>& v) {
  return mem->from_host(dst, v.data(), v.size() * sizeof(int32_t)).ok();
}
Status download(dispatch::tune::DeviceMemory* mem, std::vector<int32_t>* v, const void* src) {
  if (Status s = mem->sync(); !s.ok()) return s;
  return mem->to_host(v->data(), src, v->size() * sizeof(int32_t));
}

/// One shape's routing on the device and the host's expected outputs.
struct AlignCase {
  DeviceType bt;
  AlignShape s;
  int64_t ld, pairs, P, blocks;
  std::vector<int32_t> ids, map;
  std::vector<int32_t> want_sorted, want_experts, want_total;  ///< with the tails' poison
  dispatch::tune::DeviceMemory* mem;
  DeviceBuffer dids, dmap, dsorted, dexperts, dtotal;

  AlignCase(DeviceType b, const AlignShape& sh, std::mt19937& rng)
      : bt(b),
        s(sh),
        ld(sh.top_k + sh.ld_pad),
        pairs(sh.M * sh.top_k),
        P(spec::padded_capacity(sh.M, sh.top_k, sh.E, sh.block)),
        blocks((P + sh.block - 1) / sh.block),
        mem(core::backend_memory(b)),
        dids(mem, size_t(sh.M * ld) * 4),
        dmap(mem, size_t(sh.E) * 4),
        dsorted(mem, size_t(P + kTail) * 4),
        dexperts(mem, size_t(blocks + kTail) * 4),
        dtotal(mem, size_t(1 + kTail) * 4) {
    REQUIRE(P > 0);
    REQUIRE((dids.ok() && dmap.ok() && dsorted.ok() && dexperts.ok() && dtotal.ok()));
    // ids in [-1, E] (-1 and E are dropped), one in 50 far out of range;
    // the row padding holds expert 0, which a kernel reading it would place.
    const int32_t E = static_cast<int32_t>(sh.E);
    std::uniform_int_distribution<int32_t> pick(-1, E), skew(0, 3), far(0, 49);
    ids.assign(size_t(sh.M * ld), 0);
    for (int64_t t = 0; t < sh.M; ++t)
      for (int64_t j = 0; j < sh.top_k; ++j) {
        int32_t v = pick(rng);
        if (sh.skewed && skew(rng) != 0) v = E / 2;
        if (far(rng) == 0) v = far(rng) % 2 == 0 ? E + 1000 : -7;
        ids[size_t(t * ld + j)] = v;
      }
    std::uniform_int_distribution<int32_t> local(-1, E - 1);
    map.resize(size_t(sh.E));
    for (int32_t& v : map) v = local(rng);
    REQUIRE(upload(mem, dids.get(), ids));
    REQUIRE(upload(mem, dmap.get(), map));
    want_sorted.assign(size_t(P + kTail), kPoison);
    want_experts.assign(size_t(blocks + kTail), kPoison);
    want_total.assign(size_t(1 + kTail), kPoison);
    std::vector<int64_t> scratch(size_t(2 * sh.E));
    spec::align(ids.data(), sh.M, sh.top_k, ld, sh.E, sh.block, sh.map ? map.data() : nullptr, want_sorted.data(), P,
                want_experts.data(), blocks, want_total.data(), scratch.data(), scratch.data() + sh.E);
  }

  Problem problem() const {
    Problem p;
    p.op = OpKind::moe_align;
    p.device = Device{bt, 0};
    p.in_dtype = p.out_dtype = DType::int32;
    p.m = s.M, p.n = s.block, p.extra[0] = s.E, p.extra[1] = s.top_k;
    p.has_bias = s.map;  // the expert_map flag
    return p;
  }
  core::LaunchArgs args() const {
    core::LaunchArgs la;
    la.data[core::kAlignArgTopkIds] = dids.get(), la.ld[core::kAlignArgTopkIds] = ld;
    la.data[core::kAlignArgSorted] = dsorted.get();
    la.data[core::kAlignArgExpertIds] = dexperts.get();
    la.data[core::kAlignArgTotal] = dtotal.get();
    la.data[core::kAlignArgExpertMap] = s.map ? dmap.get() : nullptr;
    return la;
  }
  void poison() {
    REQUIRE(upload(mem, dsorted.get(), std::vector<int32_t>(size_t(P + kTail), kPoison)));
    REQUIRE(upload(mem, dexperts.get(), std::vector<int32_t>(size_t(blocks + kTail), kPoison)));
    REQUIRE(upload(mem, dtotal.get(), std::vector<int32_t>(size_t(1 + kTail), kPoison)));
  }
  /// "" when the three buffers, tails included, hold the host's bits.
  std::string mismatch() {
    std::string out;
    auto check = [&](const char* name, const std::vector<int32_t>& want, const void* src, int64_t size) {
      std::vector<int32_t> got(want.size());
      if (Status st = download(mem, &got, src); !st.ok()) {
        out += st.to_string() + "; ";
        return;
      }
      int64_t bad = 0;
      std::string first;
      for (size_t i = 0; i < want.size(); ++i)
        if (got[i] != want[i] && bad++ == 0)
          first = std::string(name) + (int64_t(i) >= size ? " tail[" : "[") + std::to_string(i) + "] got " +
                  std::to_string(got[i]) + " want " + std::to_string(want[i]);
      if (bad > 0) out += first + " (" + std::to_string(bad) + " elements off); ";
    };
    check("sorted_token_ids", want_sorted, dsorted.get(), P);
    check("expert_ids", want_experts, dexperts.get(), blocks);
    check("num_tokens_post_pad", want_total, dtotal.get(), 1);
    return out;
  }
};

/// The block variant's points on a problem of `experts` experts: the
/// threads whose per-warp counts fit 48 KiB, a multiple of the warp.
size_t block_points(int64_t experts, int warp) {
  size_t n = 0;
  for (int64_t t : dispatch::gpu::moe_align::kThreadValues)
    n += t % warp == 0 &&
         dispatch::gpu::moe_align::smem_bytes(experts, t, warp) <= dispatch::gpu::moe_align::kMaxSmemBytes;
  return n;
}

/// Runs every variant and point of `bt` on shape `s`; returns the runs.
int check_align_shape(DeviceType bt, const AlignShape& s, std::mt19937& rng) {
  AlignCase c(bt, s, rng);
  const Problem p = c.problem();
  const core::LaunchArgs la = c.args();
  const DeviceInfo& dev = device_of(bt);
  int runs = 0;
  for (const core::VariantDef* v : core::variants_for(OpKind::moe_align, bt)) {
    const std::vector<Plan> pts = core::config_space(*v, p, dev);
    INFO(v->name, " ", text(s));
    if (v->flags & core::kVariantReference)
      CHECK(pts.size() == 1u);
    else
      CHECK(pts.size() == block_points(s.E, dev.warp_size));
    for (const Plan& plan : pts) {
      INFO(core::plan_to_string(plan));
      ++runs;
      ++runs_of[std::string(v->name)];
      c.poison();
      const Status st = v->launch(la, p, plan.params);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      CHECK(c.mismatch() == "");
    }
  }
  return runs;
}

}  // namespace

TEST_CASE("gpu moe_align: every variant and point writes the host's bits, the tails untouched") {
  std::mt19937 rng(2718);
  for (DeviceType bt : usable_backends()) {
    runs_of.clear();
    int runs = 0;
    for (const AlignShape& s : align_shapes()) runs += check_align_shape(bt, s, rng);
    MESSAGE(dispatch::device_type_name(bt), " moe_align: ", runs, " (variant, point, shape) runs checked");
    CHECK(runs > 0);
    // Every variant ran somewhere: one that declines every shape (a launch
    // bound its check gets wrong) is a failure, not a silent skip.
    for (const core::VariantDef* v : core::variants_for(OpKind::moe_align, bt)) {
      INFO(v->name);
      CHECK(runs_of[std::string(v->name)] > 0);
    }
  }
}

TEST_CASE("gpu moe_align: the same routing twice gives the same bits (no atomic order leaks out)") {
  // Many pairs on few experts, where the counting atomics contend most.
  std::mt19937 rng(99);
  for (DeviceType bt : usable_backends()) {
    AlignCase c(bt, {8192, 8, 4, 16, false, true}, rng);
    for (const core::VariantDef* v : core::variants_for(OpKind::moe_align, bt))
      for (const Plan& plan : core::config_space(*v, c.problem(), device_of(bt)))
        for (int rep = 0; rep < 3; ++rep) {
          INFO(core::plan_to_string(plan), " rep ", rep);
          c.poison();
          REQUIRE(v->launch(c.args(), c.problem(), plan.params).ok());
          CHECK(c.mismatch() == "");
        }
  }
}

TEST_CASE("gpu moe_align get_default: the block kernel where it fits, else the reference") {
  for (DeviceType bt : usable_backends()) {
    const DeviceInfo& dev = device_of(bt);
    for (int64_t experts : {1, 8, 64, 128, 256, 257, 371, 372, 721, 722, 1364, 1365, 2456, 2457, 4096})
      for (int64_t block : {16, 64, 128})
        for (int64_t top_k : {1, 8})
          for (int64_t tokens : {1, 64, 8192}) {
            Problem p;
            p.op = OpKind::moe_align;
            p.device = Device{bt, 0};
            p.in_dtype = p.out_dtype = DType::int32;
            p.m = tokens, p.n = block, p.extra[0] = experts, p.extra[1] = top_k;
            INFO("E=", experts, " block_size=", block, " top_k=", top_k, " M=", tokens);
            const Plan plan = core::get_default(p, dev);
            REQUIRE(plan.valid());
            CHECK(plan.variant->supports(p, plan.params, dev).ok());
            const bool ref = (plan.variant->flags & core::kVariantReference) != 0;
            CHECK(ref == (block_points(experts, dev.warp_size) == 0));
            if (!ref)  // the most threads that fit
              for (int64_t t : dispatch::gpu::moe_align::kThreadValues)
                if (t > plan.params[0] && t % dev.warp_size == 0)
                  CHECK(dispatch::gpu::moe_align::smem_bytes(experts, t, dev.warp_size) >
                        dispatch::gpu::moe_align::kMaxSmemBytes);
          }
  }
}

TEST_CASE("gpu runtime: dispatch::moe_align on device tensors runs the default plan") {
  for (DeviceType bt : usable_backends()) {
    auto rt = quiet_runtime();
    REQUIRE(rt.ok());
    std::mt19937 rng(31);
    for (const AlignShape& s :
         {AlignShape{5, 8, 256, 64}, AlignShape{64, 8, 128, 16, true, true, 2}, AlignShape{3, 2, 4096, 128, true}}) {
      AlignCase c(bt, s, rng);
      c.poison();
      const Device d{bt, 0};
      dispatch::MoeAlignArgs args;
      args.topk_ids = dispatch::make_tensor_2d(c.dids.get(), DType::int32, s.M, s.top_k, c.ld, d);
      // The engine's longer buffers: the op writes their first P and ceil(P / block_size).
      args.sorted_token_ids = dispatch::make_tensor_1d(c.dsorted.get(), DType::int32, c.P + kTail, d);
      args.expert_ids = dispatch::make_tensor_1d(c.dexperts.get(), DType::int32, c.blocks + kTail, d);
      args.num_tokens_post_pad = dispatch::make_tensor_1d(c.dtotal.get(), DType::int32, 1, d);
      if (s.map) args.expert_map = dispatch::make_tensor_1d(c.dmap.get(), DType::int32, s.E, d);
      args.num_experts = static_cast<int32_t>(s.E);
      args.block_size = static_cast<int32_t>(s.block);
      std::string key;
      dispatch::DispatchInfo info;
      info.key = &key;
      dispatch::CallOptions opts;
      opts.info = &info;
      INFO(text(s));
      const Status st = dispatch::moe_align(**rt, args, dispatch::Stream{nullptr}, opts);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      CHECK(info.source == dispatch::PlanSource::fallback);
      CHECK(key.rfind(std::string(dispatch::device_type_name(bt)) + "/moe_align|" + device_of(bt).device_name + "|",
                      0) == 0);
      MESSAGE("default plan: ", std::string(info.variant), " key ", key);
      CHECK(c.mismatch() == "");
    }
  }
}
