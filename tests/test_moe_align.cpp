// SPDX-License-Identifier: Apache-2.0
// moe_align on the CPU, beyond what every op gets from tests/test_ops.cpp
// (every variant against the float64 reference, the key round trip,
// pretune, the C ABI's refusals): a result worked by hand (padding, a
// dropped id, the expert map, the tail), a longer engine buffer left alone
// past the op's size, both variants equal on random routings, the errors
// that name the argument, the key and file name, and the C ABI.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/registry.hpp"
#include "dispatch/c_api.h"
#include "dispatch/dispatch.hpp"
#include "dispatch/dlpack.hpp"
#include "ops/moe_align.hpp"
#include "store/filename.hpp"
#include "test_util.hpp"

using namespace dispatch;

namespace {

std::unique_ptr<Runtime> quiet_runtime(std::vector<std::string> dirs = {}) {
  RuntimeOptions o = kdtest::options_for(std::move(dirs));
  o.tune.mode = TuneMode::off;
  return kdtest::make_runtime(o);
}

// M = 3 tokens, top_k = 2, E = 4, block_size = 4. Pairs i = t * 2 + j:
//   0: e2, 1: e0, 2: e2, 3: e3, 4: -1 (dropped), 5: e2.
// Counts e0 1, e1 0, e2 3, e3 1, padded to 4, 0, 4, 4: total 12; the pad
// value is M * top_k = 6. P = 6 + min(4, 6) * 3 = 18, ceil(18 / 4) = 5 blocks.
struct Tiny {
  std::vector<int32_t> ids{2, 0, 2, 3, -1, 2};
  std::vector<int32_t> sorted = std::vector<int32_t>(18, 99);
  std::vector<int32_t> experts = std::vector<int32_t>(5, 99);
  std::vector<int32_t> total{99};
  std::vector<int32_t> map{-1, 5, 0, 1};
  MoeAlignArgs args(bool with_map = false) {
    MoeAlignArgs a;
    a.topk_ids = make_tensor_2d(ids.data(), DType::int32, 3, 2, 2);
    a.sorted_token_ids = make_tensor_1d(sorted.data(), DType::int32, static_cast<int64_t>(sorted.size()));
    a.expert_ids = make_tensor_1d(experts.data(), DType::int32, static_cast<int64_t>(experts.size()));
    a.num_tokens_post_pad = make_tensor_1d(total.data(), DType::int32, 1);
    if (with_map) a.expert_map = make_tensor_1d(map.data(), DType::int32, 4);
    a.num_experts = 4;
    a.block_size = 4;
    return a;
  }
};
// M = 0 tokens of top_k 2 among 8 experts, blocks of 16: empty tensors with
// null data, num_tokens_post_pad at *total.
MoeAlignArgs empty_args(int32_t* total) {
  MoeAlignArgs a;
  a.topk_ids = make_tensor_2d(nullptr, DType::int32, 0, 2, 2);
  a.sorted_token_ids = make_tensor_1d(nullptr, DType::int32, 0);
  a.expert_ids = make_tensor_1d(nullptr, DType::int32, 0);
  a.num_tokens_post_pad = make_tensor_1d(total, DType::int32, 1);
  a.num_experts = 8;
  a.block_size = 16;
  return a;
}
const std::vector<int32_t> kSorted{1, 6, 6, 6, 0, 2, 5, 6, 3, 6, 6, 6, 6, 6, 6, 6, 6, 6};

}  // namespace

TEST_CASE("moe_align: a result worked by hand: padding, a dropped id, the tail, the expert map") {
  auto rt = quiet_runtime();
  Tiny t;
  DispatchInfo info;
  CallOptions o;
  o.info = &info;
  REQUIRE(moe_align(*rt, t.args(), {}, o).ok());
  CHECK(std::string(info.variant) == "moe_align_int32__count");
  CHECK(t.sorted == kSorted);
  CHECK(t.experts == std::vector<int32_t>{0, 2, 3, -1, -1});
  CHECK(t.total == std::vector<int32_t>{12});
  // vLLM's expert_map: the blocks name local ids, -1 where not local.
  REQUIRE(moe_align(*rt, t.args(true)).ok());
  CHECK(t.sorted == kSorted);
  CHECK(t.experts == std::vector<int32_t>{-1, 0, 1, -1, -1});
}

TEST_CASE("moe_align: an engine's longer buffers are written up to the op's size and left alone past it") {
  auto rt = quiet_runtime();
  Tiny t;
  // SGLang's (E + 1) * (block_size - 1) + M * top_k = 21 sorted ids, 6 blocks.
  t.sorted.assign(21, 99);
  t.experts.assign(6, 99);
  REQUIRE(moe_align(*rt, t.args()).ok());
  std::vector<int32_t> want = kSorted;
  want.insert(want.end(), {99, 99, 99});
  CHECK(t.sorted == want);
  CHECK(t.experts == std::vector<int32_t>{0, 2, 3, -1, -1, 99});
}

TEST_CASE("moe_align: the counting sort equals the per-expert scan on random routings, E > M*top_k too") {
  auto rt = quiet_runtime();
  std::mt19937 rng(7);
  struct Shape {
    int64_t m, top_k, experts, block;
  };
  for (const Shape s :
       {Shape{1, 8, 128, 16}, Shape{5, 2, 8, 64}, Shape{64, 8, 128, 16}, Shape{33, 9, 257, 32}, Shape{7, 1, 3, 1}}) {
    CAPTURE(s.m);
    CAPTURE(s.experts);
    const int64_t pairs = s.m * s.top_k;
    const int64_t p = core::moe_align_spec::padded_capacity(s.m, s.top_k, s.experts, s.block);
    const int64_t blocks = (p + s.block - 1) / s.block;
    std::vector<int32_t> ids(static_cast<size_t>(pairs));
    std::uniform_int_distribution<int32_t> pick(-1, static_cast<int32_t>(s.experts) - 1);
    for (int32_t& v : ids) v = pick(rng);
    core::Problem p0;
    p0.op = core::OpKind::moe_align;
    p0.device = Device{DeviceType::cpu, 0};
    p0.in_dtype = p0.out_dtype = DType::int32;
    p0.m = s.m, p0.n = s.block, p0.extra[0] = s.experts, p0.extra[1] = s.top_k;
    const auto vs = core::variants_for(core::OpKind::moe_align, DeviceType::cpu);
    REQUIRE(vs.size() == 2);
    std::vector<int32_t> out[2][3];
    for (int v = 0; v < 2; ++v) {
      out[v][0].assign(static_cast<size_t>(p), -7);
      out[v][1].assign(static_cast<size_t>(blocks), -7);
      out[v][2].assign(1, -7);
      core::LaunchArgs la;
      la.data[core::kAlignArgTopkIds] = ids.data();
      la.ld[core::kAlignArgTopkIds] = s.top_k;
      for (int k = 0; k < 3; ++k) la.data[core::kAlignArgSorted + k] = out[v][k].data();
      REQUIRE(vs[static_cast<size_t>(v)]->supports(p0, nullptr, cpu_device_info()).ok());
      REQUIRE(vs[static_cast<size_t>(v)]->launch(la, p0, nullptr).ok());
    }
    for (int k = 0; k < 3; ++k) CHECK(out[0][k] == out[1][k]);
    // Every kept pair appears once; the total is a multiple of the block.
    const int32_t total = out[0][2][0];
    CHECK(total % s.block == 0);
    const auto kept = std::count_if(ids.begin(), ids.end(), [](int32_t e) { return e >= 0; });
    CHECK(std::count_if(out[0][0].begin(), out[0][0].begin() + total, [&](int32_t v) { return v < pairs; }) == kept);
  }
}

TEST_CASE("moe_align: errors name the argument: a short buffer, num_experts, block_size, expert_map") {
  auto rt = quiet_runtime();
  Tiny t;
  MoeAlignArgs a = t.args();
  a.sorted_token_ids.shape[0] = 17;
  Status s = moe_align(*rt, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() ==
        "sorted_token_ids: must have at least 18 elements (M*top_k + min(E, M*top_k)*(block_size - 1)), has 17");
  a = t.args();
  a.expert_ids.shape[0] = 4;
  s = moe_align(*rt, a);
  CHECK(s.message() ==
        "expert_ids: must have at least 5 elements (ceil((M*top_k + min(E, M*top_k)*(block_size - 1))/block_size)), "
        "has 4");
  a = t.args();
  a.num_experts = 0;
  s = moe_align(*rt, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "num_experts: must be a whole number in [1, 16777216], got 0");
  a = t.args();
  a.block_size = -4;
  CHECK(moe_align(*rt, a).message() == "block_size: must be a whole number in [1, 16777216], got -4");
  a = t.args(true);
  a.expert_map.shape[0] = 3;
  CHECK(moe_align(*rt, a).message() == "expert_map: must have 4 elements, has 3");
  a = t.args();
  a.num_tokens_post_pad.shape[0] = 2;
  CHECK(moe_align(*rt, a).message() == "num_tokens_post_pad: must have 1 elements, has 2");
  a = t.args();
  a.topk_ids.dtype = DType::fp32;
  CHECK(moe_align(*rt, a).message() == "topk_ids: dtype fp32 must be int32");
}

TEST_CASE("moe_align: a call's key and file name, with and without the expert map") {
  const std::string dev = cpu_device_info().device_name;
  auto rt = quiet_runtime();
  Tiny t;
  std::string key;
  DispatchInfo info;
  info.key = &key;
  CallOptions o;
  o.info = &info;
  REQUIRE(moe_align(*rt, t.args(), {}, o).ok());
  CHECK(key == "cpu/moe_align|" + dev + "|E=4,block_size=4,top_k=2");
  REQUIRE(moe_align(*rt, t.args(true), {}, o).ok());
  CHECK(key == "cpu/moe_align|" + dev + "|E=4,block_size=4,expert_map=true,top_k=2");
  CHECK(store::own_file_name(core::OpKind::moe_align, "E=128,block_size=16,top_k=8", "NVIDIA_H200") ==
        "E=128,block_size=16,top_k=8,device_name=NVIDIA_H200.json");
  auto f = store::parse_key_fields("E=257,block_size=64,top_k=9");
  REQUIRE(f.ok());
  auto p = store::own_problem_from_fields(core::OpKind::moe_align, *f);
  REQUIRE_MESSAGE(p.ok(), p.status().to_string());
  CHECK(p->extra[0] == 257);
  CHECK(p->n == 64);
  CHECK(p->extra[1] == 9);
}

TEST_CASE("moe_align: the C ABI's kdispatch_moe_align takes (topk_ids, outputs, expert_map, E, block_size)") {
  Tiny t;
  int64_t ids_shape[2] = {3, 2}, sorted_shape[1] = {18}, blocks_shape[1] = {5}, one[1] = {1}, map_shape[1] = {4};
  DLTensor ids{}, sorted{}, experts{}, total{}, map{};
  ids.data = t.ids.data();
  ids.device = {kDLCPU, 0};
  ids.ndim = 2;
  ids.dtype = {kDLInt, 32, 1};
  ids.shape = ids_shape;
  sorted = ids;
  sorted.ndim = 1;
  sorted.data = t.sorted.data();
  sorted.shape = sorted_shape;
  experts = sorted;
  experts.data = t.experts.data();
  experts.shape = blocks_shape;
  total = sorted;
  total.data = t.total.data();
  total.shape = one;
  map = sorted;
  map.data = t.map.data();
  map.shape = map_shape;
  kdispatch_options opts;
  kdispatch_options_init(&opts);
  opts.load_shipped_configs = 0;
  opts.log_level = KDISPATCH_LOG_OFF;
  kdispatch_runtime* rt = nullptr;
  REQUIRE(kdispatch_runtime_create(&opts, &rt) == KDISPATCH_OK);
  CHECK(kdispatch_moe_align(rt, &ids, &sorted, &experts, &total, nullptr, 4.f, 4.f, nullptr, 0, nullptr) ==
        KDISPATCH_OK);
  CHECK(t.sorted == kSorted);
  CHECK(t.total[0] == 12);
  CHECK(kdispatch_moe_align(rt, &ids, &sorted, &experts, &total, &map, 4.f, 4.f, nullptr, 0, nullptr) == KDISPATCH_OK);
  CHECK(t.experts == std::vector<int32_t>{-1, 0, 1, -1, -1});
  CHECK(kdispatch_moe_align(rt, &ids, &sorted, &experts, &total, nullptr, 4.5f, 4.f, nullptr, 0, nullptr) ==
        KDISPATCH_INVALID_ARGUMENT);
  kdispatch_runtime_destroy(rt);
}

TEST_CASE("moe_align: M = 0 launches and writes num_tokens_post_pad = 0, empty tensors may have null data") {
  auto rt = quiet_runtime();
  int32_t total = 99;
  MoeAlignArgs a = empty_args(&total);
  DispatchInfo info;
  CallOptions o;
  o.info = &info;
  REQUIRE(moe_align(*rt, a, {}, o).ok());
  CHECK(total == 0);
  CHECK(std::string(info.variant) == "moe_align_int32__count");
  // vLLM's buffers at M = 0 are E * (block_size - 1) long: left alone.
  std::vector<int32_t> sorted(8 * 15, 99), experts(8, 99);
  a.sorted_token_ids = make_tensor_1d(sorted.data(), DType::int32, static_cast<int64_t>(sorted.size()));
  a.expert_ids = make_tensor_1d(experts.data(), DType::int32, static_cast<int64_t>(experts.size()));
  total = 99;
  REQUIRE(moe_align(*rt, a).ok());
  CHECK(total == 0);
  CHECK(std::count(sorted.begin(), sorted.end(), 99) == 8 * 15);
  // The one output it writes must still be there.
  a.num_tokens_post_pad = make_tensor_1d(nullptr, DType::int32, 1);
  CHECK(moe_align(*rt, a).message() == "num_tokens_post_pad: data is null");
}

TEST_CASE("moe_align: M = 0 serves a forced variant, as every other call of the op") {
  RuntimeOptions o = kdtest::options_for({});
  o.tune.mode = TuneMode::off;
  o.force = {"moe_align=moe_align_int32__ref"};
  auto rt = kdtest::make_runtime(o);
  int32_t total = 99;
  MoeAlignArgs a = empty_args(&total);
  DispatchInfo info;
  CallOptions co;
  co.info = &info;
  REQUIRE(moe_align(*rt, a, {}, co).ok());
  CHECK(total == 0);
  CHECK(std::string(info.variant) == "moe_align_int32__ref");
  CHECK(info.source == PlanSource::forced);
  // The same runtime at M = 3: the forced variant too.
  Tiny t;
  MoeAlignArgs b = t.args();
  REQUIRE(moe_align(*rt, b, {}, co).ok());
  CHECK(std::string(info.variant) == "moe_align_int32__ref");
  CHECK(info.source == PlanSource::forced);
}

TEST_CASE("moe_align: a size past 2^24 is refused, never rounded to a float's neighbour") {
  auto rt = quiet_runtime();
  Tiny t;
  MoeAlignArgs a = t.args();
  a.num_experts = (1 << 24) + 1;  // a float would hold 2^24
  CHECK(moe_align(*rt, a).message() ==
        "num_experts: must be a whole number in [1, 16777216], got -1 (an integer size past 2^24 arrives as -1)");
  a = t.args();
  a.block_size = 1 << 25;
  CHECK(moe_align(*rt, a).message() ==
        "block_size: must be a whole number in [1, 16777216], got -1 (an integer size past 2^24 arrives as -1)");
}

TEST_CASE("moe_align: by name, a fraction for an integer scalar is refused with the value given") {
  auto rt = quiet_runtime();
  Tiny t;
  const MoeAlignArgs a = t.args(true);
  const TensorRef ts[] = {a.topk_ids, a.sorted_token_ids, a.expert_ids, a.num_tokens_post_pad, a.expert_map};
  const float half[] = {4.f, 0.5f};
  CHECK(call_op(*rt, "moe_align", ts, half).message() ==
        "block_size: must be a whole number in [1, 16777216], got 0.5");
  const float frac[] = {3.75f, 4.f};
  CHECK(call_op(*rt, "moe_align", ts, frac).message() ==
        "num_experts: must be a whole number in [1, 16777216], got 3.75");
  // NaN, an infinity and a size past 2^24 are named with the value given
  // (the args struct's int32 past 2^24 arrives as -1, said as such above).
  const float nan_sz[] = {std::nanf(""), 4.f};
  CHECK(call_op(*rt, "moe_align", ts, nan_sz).message() ==
        "num_experts: must be a whole number in [1, 16777216], got nan");
  const float inf_sz[] = {4.f, -INFINITY};
  CHECK(call_op(*rt, "moe_align", ts, inf_sz).message() ==
        "block_size: must be a whole number in [1, 16777216], got -inf");
  const float big[] = {33554432.f, 4.f};
  CHECK(call_op(*rt, "moe_align", ts, big).message() ==
        "num_experts: must be a whole number in [1, 16777216], got 33554432");
  // A fraction a float32 holds next to a whole number is said in full.
  const float near[] = {4.f, 4.00000048f};
  CHECK(call_op(*rt, "moe_align", ts, near).message() ==
        "block_size: must be a whole number in [1, 16777216], got 4.0000005");
  CHECK(t.total == std::vector<int32_t>{99});  // nothing ran
  // Whole numbers pass on to the op: the call sorts as the args call does.
  const float whole[] = {4.f, 4.f};
  REQUIRE(call_op(*rt, "moe_align", ts, whole).ok());
  CHECK(t.sorted == kSorted);
  CHECK(t.experts == std::vector<int32_t>{-1, 0, 1, -1, -1});
  CHECK(t.total == std::vector<int32_t>{12});
}

TEST_CASE("moe_align: two written buffers that overlap are named as both written") {
  auto rt = quiet_runtime();
  Tiny t;
  MoeAlignArgs a = t.args();
  a.expert_ids.data = t.sorted.data() + 10;
  const Status s = moe_align(*rt, a);
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK(s.message() == "sorted_token_ids: overlaps expert_ids (both are written)");
}

TEST_CASE("moe_align: a key's sizes past what a call takes: the CPU declines, describe_key's bytes saturate") {
  core::Problem p;
  p.op = core::OpKind::moe_align;
  p.device = Device{DeviceType::cpu, 0};
  p.in_dtype = p.out_dtype = DType::int32;
  p.m = 4, p.n = 16, p.extra[0] = int64_t{1} << 25, p.extra[1] = 2;
  for (const core::VariantDef* v : core::variants_for(core::OpKind::moe_align, DeviceType::cpu)) {
    const Status s = v->supports(p, nullptr, cpu_device_info());
    CHECK(s.code() == StatusCode::unsupported_problem);
    CHECK(s.message().find("E and block_size must be <= 2^24") != std::string::npos);
  }
  // M * top_k + min(E, M * top_k) * (block_size - 1) = 2^30 + 2^30 * (2^20 - 1) > 2^40.
  auto k = describe_key("moe_align", "E=1073741824,block_size=1048576,top_k=1", int64_t{1} << 30);
  REQUIRE_MESSAGE(k.ok(), k.status().to_string());
  CHECK(k->bytes == INT64_MAX);
  k = describe_key("moe_align", "E=4,block_size=4,top_k=2", 3);
  REQUIRE(k.ok());
  CHECK(k->bytes == 4 * (6 + 18 + 5 + 1));
}
