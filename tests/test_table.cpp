// SPDX-License-Identifier: Apache-2.0
// Table unit tests: nearest M, the bounded policy, full-key confirmation of a
// hash hit, precedence across config dirs, version-folder selection.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "table/key.hpp"
#include "table/snapshot.hpp"
#include "test_util.hpp"

using namespace dispatch;
using namespace kdtest;
using table::Bucket;
using table::NearestPolicy;
using table::Snapshot;
using table::TableInput;

namespace {

Bucket bucket_of(std::vector<int64_t> ms) {
  Bucket b;
  const size_t n = ms.size();
  b.ms = table::SharedArray<int64_t>(std::move(ms));
  b.rows = table::SharedArray<table::Row>(std::vector<table::Row>(n));
  return b;
}

// The M key nearest() picks, or -1 for a miss.
int64_t pick(const Bucket& b, int64_t m, NearestPolicy pol = {}) {
  size_t idx = 12345;
  const table::Row* r = Snapshot::nearest(b, m, pol, &idx);
  if (!r) return -1;
  REQUIRE(idx < b.ms.size());
  CHECK(r == &b.rows[idx]);
  return b.ms[idx];
}

TableInput input(std::string key, std::vector<int64_t> ms, int64_t tag, int32_t rank = 0) {
  TableInput in;
  in.key = std::move(key);
  in.source_rank = rank;
  in.path = "p" + std::to_string(tag);
  for (int64_t m : ms) in.add_row(m, {{"tag", ConfigValue::integer(tag)}, {"m", ConfigValue::integer(m)}});
  return in;
}

TableInput versioned(std::string key, std::vector<int> v, int64_t tag) {
  TableInput in = input(std::move(key), {1, 64}, tag);
  in.versioned = true;
  in.version = v;
  in.version_folder = "triton";
  for (int x : v) in.version_folder += "_" + std::to_string(x);
  return in;
}

// The tag of the row a snapshot serves for (key, m), or -1.
int64_t tag_of(const Snapshot& s, const std::string& key, int64_t m) {
  const Bucket* b = s.find(key, table::key_hash(key));
  if (!b) return -1;
  const table::Row* r = Snapshot::nearest(*b, m, {}, nullptr);
  if (!r) return -1;
  return config_find(s.config(*r), "tag")->i;
}

std::string moe_table(int64_t block_m_1, int64_t block_m_64) {
  auto r = [](int64_t bm) {
    return "{\"BLOCK_SIZE_M\": " + std::to_string(bm) +
           ", \"BLOCK_SIZE_N\": 64, \"BLOCK_SIZE_K\": 128, \"GROUP_SIZE_M\": 1, \"num_warps\": 4, \"num_stages\": 3}";
  };
  return "{\"1\": " + r(block_m_1) + ", \"64\": " + r(block_m_64) + "}";
}

}  // namespace

TEST_CASE("table: nearest M") {
  const Bucket b = bucket_of({16, 64, 256});
  CHECK(pick(b, 64) == 64);  // exact
  CHECK(pick(b, 16) == 16);
  CHECK(pick(b, 256) == 256);
  CHECK(pick(b, 1) == 16);  // below the smallest key
  CHECK(pick(b, 15) == 16);
  CHECK(pick(b, 257) == 256);  // above the largest key
  CHECK(pick(b, 1 << 30) == 256);
  CHECK(pick(b, 40) == 16);  // |40-16| = |64-40| = 24: the tie goes to the smaller key
  CHECK(pick(b, 39) == 16);
  CHECK(pick(b, 41) == 64);
  CHECK(pick(b, 160) == 64);  // |160-64| = |256-160| = 96: tie -> 64
  CHECK(pick(b, 161) == 256);
  CHECK(pick(bucket_of({8}), 1) == 8);
  CHECK(pick(bucket_of({8}), 1000) == 8);
  CHECK(pick(bucket_of({1, 2}), 2) == 2);
  CHECK(pick(bucket_of({}), 5) == -1);
  // Adjacent keys: no midpoint strictly between them.
  CHECK(pick(bucket_of({3, 4}), 3) == 3);
  CHECK(pick(bucket_of({3, 4}), 4) == 4);
}

TEST_CASE("table: bounded nearest policy edges") {
  const Bucket b = bucket_of({16, 64, 256});
  NearestPolicy two{true, 2.0};  // [16/2, 256*2] = [8, 512]
  CHECK(pick(b, 7, two) == -1);
  CHECK(pick(b, 8, two) == 16);
  CHECK(pick(b, 512, two) == 256);
  CHECK(pick(b, 513, two) == -1);
  CHECK(pick(b, 40, two) == 16);  // ties unchanged inside the range
  NearestPolicy one{true, 1.0};   // [16, 256]: only inside the tuned range
  CHECK(pick(b, 15, one) == -1);
  CHECK(pick(b, 16, one) == 16);
  CHECK(pick(b, 256, one) == 256);
  CHECK(pick(b, 257, one) == -1);
  // CASES.md C09: keys {1,2,4,8} at M=2048 miss; 16 = 8*2 is the last hit.
  const Bucket small = bucket_of({1, 2, 4, 8});
  CHECK(pick(small, 2048, two) == -1);
  CHECK(pick(small, 16, two) == 8);
  CHECK(pick(small, 17, two) == -1);
  CHECK(pick(small, 1, two) == 1);
  CHECK(pick(small, 2048) == 8);  // unbounded default
}

TEST_CASE("table: a hash hit is confirmed by the full key") {
  const std::string a = "triton/triton_fused_moe|NVIDIA_H200|E=8,N=64";
  const std::string b = "triton/triton_fused_moe|NVIDIA_H200|E=8,N=65";
  std::vector<std::string> notes;
  std::vector<TableInput> in;
  in.push_back(input(a, {1}, 7));
  auto snap = Snapshot::build(std::move(in), {}, &notes);
  const uint64_t ha = table::key_hash(a);
  REQUIRE(snap->find(a, ha) != nullptr);
  CHECK(snap->find(a, ha)->key == a);
  // A forced collision: b presented with a's hash walks exactly a's probe path
  // and meets a's slot with an equal hash; only the key compare can reject it.
  CHECK(snap->find(b, ha) == nullptr);
  CHECK(snap->find(a.substr(0, a.size() - 1), ha) == nullptr);  // a prefix of the key
  CHECK(snap->find(a + ",", ha) == nullptr);                    // an extension of it
  CHECK(snap->find(b, table::key_hash(b)) == nullptr);

  // A key whose real hash lands in a's slot (same low bits of a 16-slot
  // table, different hash) probes past a and misses.
  std::string same_slot;
  for (int i = 0; i < 10000 && same_slot.empty(); ++i) {
    std::string k = "triton/triton_fused_moe|NVIDIA_H200|E=" + std::to_string(i) + ",N=64";
    if (k != a && (table::key_hash(k) & 15) == (ha & 15)) same_slot = k;
  }
  REQUIRE_FALSE(same_slot.empty());
  CHECK(snap->find(same_slot, table::key_hash(same_slot)) == nullptr);

  // Many keys: every key is found under its own hash and never under another's.
  std::vector<TableInput> many;
  std::vector<std::string> keys;
  for (int i = 0; i < 200; ++i) {
    keys.push_back("cpu/gemm|CPU_x86_64_AVX2|K=" + std::to_string(64 * (i + 1)) + ",N=4096,dtype=fp32");
    many.push_back(input(keys.back(), {1, 16}, i));
  }
  auto big = Snapshot::build(std::move(many), {}, &notes);
  CHECK(big->buckets().size() == 200);
  CHECK(big->row_count() == 400);
  for (int i = 0; i < 200; ++i) {
    CHECK(tag_of(*big, keys[i], 16) == i);
    const std::string& other = keys[(i + 1) % 200];
    CHECK(big->find(other, table::key_hash(keys[i])) == nullptr);
  }
  CHECK(big->ops() == std::vector<std::string>{"cpu/gemm"});
}

TEST_CASE("table: snapshot merges sources by rank and picks version folders") {
  const std::string k = "triton/triton_fused_moe|NVIDIA_H200|E=8,N=64";
  SUBCASE("precedence: the lower rank wins on the same M; rows merge across ranks") {
    std::vector<TableInput> in;
    in.push_back(input(k, {1, 64}, 20, /*rank=*/1));
    in.push_back(input(k, {1, 16}, 10, /*rank=*/0));
    std::vector<std::string> notes;
    auto s = Snapshot::build(std::move(in), {}, &notes);
    const Bucket* b = s->find(k, table::key_hash(k));
    REQUIRE(b != nullptr);
    CHECK(std::vector<int64_t>(b->ms.begin(), b->ms.end()) == std::vector<int64_t>{1, 16, 64});
    CHECK(tag_of(*s, k, 1) == 10);
    CHECK(tag_of(*s, k, 16) == 10);
    CHECK(tag_of(*s, k, 64) == 20);
    CHECK(notes.empty());
  }
  SUBCASE("M keys are sorted whatever the input order") {
    std::vector<TableInput> in;
    in.push_back(input(k, {3840, 1792, 3584, 512}, 1));
    auto s = Snapshot::build(std::move(in), {}, nullptr);
    const auto& ms = s->find(k, table::key_hash(k))->ms;
    CHECK(std::vector<int64_t>(ms.begin(), ms.end()) == std::vector<int64_t>{512, 1792, 3584, 3840});
  }
  SUBCASE("version folders: exact, newest older, newest newer, none given; numeric order") {
    auto build = [&](std::vector<int> v, std::vector<std::string>* notes) {
      std::vector<TableInput> in;
      in.push_back(versioned(k, {3, 1, 0}, 310));
      in.push_back(versioned(k, {3, 3, 1}, 331));
      in.push_back(versioned(k, {3, 10, 0}, 3100));  // newer than 3.5.1 numerically, older as text
      in.push_back(versioned(k, {3, 5, 1}, 351));
      in.push_back(input(k, {1}, 999));  // an unversioned file of the same source
      return Snapshot::build(std::move(in), v, notes);
    };
    std::vector<std::string> notes;
    CHECK(tag_of(*build({3, 5, 1}, &notes), k, 1) == 351);
    CHECK(notes.empty());
    CHECK(tag_of(*build({3, 5, 1, 0}, &notes), k, 1) == 351);  // trailing zeros compare equal
    CHECK(notes.empty());
    CHECK(tag_of(*build({3, 4, 0}, &notes), k, 1) == 331);
    REQUIRE(notes.size() == 1);
    CHECK(notes[0] == k + ": triton_3_3_1 serves (newest folder older than 3.4.0)");
    notes.clear();
    CHECK(tag_of(*build({3, 9}, &notes), k, 1) == 351);
    notes.clear();
    CHECK(tag_of(*build({3, 0, 0}, &notes), k, 1) == 3100);
    REQUIRE(notes.size() == 1);
    CHECK(notes[0] == k + ": triton_3_10_0 serves (no folder at or below 3.0.0; newest newer folder)");
    notes.clear();
    auto s = build({}, &notes);
    CHECK(tag_of(*s, k, 1) == 3100);
    CHECK(notes.empty());  // nothing asked, nothing to report
    const Bucket* b = s->find(k, table::key_hash(k));
    CHECK(contains(b->note, "served from triton_3_10_0 (no version given; newest folder)"));
    CHECK(contains(b->note, "unversioned file(s) of this source ignored in favour of triton_3_10_0"));
  }
}

TEST_CASE("table: precedence across RuntimeOptions::config_dirs") {
  TempDir d1, d2;
  const std::string name = "E=8,N=64,device_name=NVIDIA_H200.json";
  write_text(d1 / name, "{\"1\": {\"BLOCK_SIZE_M\": 11}, \"16\": {\"BLOCK_SIZE_M\": 116}}");
  write_text(d2 / name, "{\"1\": {\"BLOCK_SIZE_M\": 21}, \"64\": {\"BLOCK_SIZE_M\": 264}}");
  auto bm = [](const LookupResult& r) { return config_find(r.config, "BLOCK_SIZE_M")->i; };

  auto rt = make_runtime({d1.str(), d2.str()});
  auto r1 = lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 1));
  CHECK(bm(r1) == 11);  // same M: the first dir wins
  CHECK(r1.source_dir == d1.str());
  CHECK(r1.source == name);
  auto r16 = lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 16));
  CHECK(bm(r16) == 116);
  CHECK(r16.source_dir == d1.str());
  auto r64 = lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 64));
  CHECK(bm(r64) == 264);  // rows merge: 64 exists only in the second dir
  CHECK(r64.source_dir == d2.str());
  CHECK(r64.match == LookupResult::Match::exact);
  // Defaults appended to the served row (no num_warps/num_stages in it).
  CHECK(config_to_json(r64.config) == row({{"BLOCK_SIZE_M", 264}, {"num_warps", 4}, {"num_stages", 3}}));
  CHECK(rt->load_report().keys == 1);
  CHECK(rt->load_report().rows == 3);

  auto swapped = make_runtime({d2.str(), d1.str()});
  CHECK(bm(lookup_ok(*swapped, query("E=8,N=64", "NVIDIA H200", 1))) == 21);
  CHECK(bm(lookup_ok(*swapped, query("E=8,N=64", "NVIDIA H200", 16))) == 116);
}

TEST_CASE("table: version-folder selection over a synthetic tree") {
  TempDir dir;
  const std::string name = "E=8,N=64,device_name=NVIDIA_H200.json";
  // BLOCK_SIZE_M at M=1 encodes the folder: 310, 331, 351, 3100.
  write_text(dir / "triton_3_1_0" / name, moe_table(310, 310));
  write_text(dir / "triton_3_3_1" / name, moe_table(331, 331));
  write_text(dir / "triton_3_5_1" / name, moe_table(351, 351));
  write_text(dir / "triton_3_10_0" / name, moe_table(3100, 3100));
  // A second key only in an old folder, and a _down table only in 3_3_1.
  const std::string only_old = "E=16,N=64,device_name=NVIDIA_H200.json";
  write_text(dir / "triton_3_1_0" / only_old, moe_table(1310, 1310));
  write_text(dir / "triton_3_3_1" / "E=8,N=64,device_name=NVIDIA_H200_down.json", moe_table(9331, 9331));

  struct Case {
    const char* version;
    int64_t expect_bm;
    const char* folder;
    const char* note;  // expected in the report's notes ("" = none for this key)
  };
  const Case cases[] = {
      {"3.5.1", 351, "triton_3_5_1", ""},
      {"3.3.1", 331, "triton_3_3_1", ""},
      {"3.4.0", 331, "triton_3_3_1", "triton_3_3_1 serves (newest folder older than 3.4.0)"},
      {"3.6", 351, "triton_3_5_1", "triton_3_5_1 serves (newest folder older than 3.6)"},
      {"3.0.0", 3100, "triton_3_10_0", "triton_3_10_0 serves (no folder at or below 3.0.0; newest newer folder)"},
      {"", 3100, "triton_3_10_0", ""},
  };
  for (const Case& c : cases) {
    CAPTURE(c.version);
    RuntimeOptions o = options_for({dir.str()});
    o.backend_version = c.version;
    auto rt = make_runtime(o);
    auto r = lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 1));
    CHECK(config_find(r.config, "BLOCK_SIZE_M")->i == c.expect_bm);
    CHECK(r.source == std::string(c.folder) + "/" + name);
    CHECK(contains(r.why, std::string("served from ") + c.folder));
    const LoadReport rep = rt->load_report();
    bool noted = false;
    for (const auto& n : rep.notes)
      if (contains(n, "triton/triton_fused_moe|NVIDIA_H200|E=8,N=64: ")) noted = contains(n, c.note) && *c.note;
    CHECK(noted == (*c.note != 0));
    // The key that exists only in triton_3_1_0 serves under every version;
    // with a version above 3.1.0 the report says it fell back.
    auto old = lookup_ok(*rt, query("E=16,N=64", "NVIDIA H200", 1));
    CHECK(config_find(old.config, "BLOCK_SIZE_M")->i == 1310);
    bool old_noted = false;
    for (const auto& n : rep.notes)
      if (n == "triton/triton_fused_moe|NVIDIA_H200|E=16,N=64: triton_3_1_0 serves (newest folder older than " +
                   std::string(c.version) + ")")
        old_noted = true;
    const bool above_310 = *c.version && std::string(c.version) != "3.0.0";
    CHECK(old_noted == above_310);
    // The _down table exists only in 3_3_1: it serves every version's down
    // query; the up table serves a down query for E=16 (no _down table).
    CHECK(config_find(lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 1, true)).config, "BLOCK_SIZE_M")->i == 9331);
    auto down_fb = lookup_ok(*rt, query("E=16,N=64", "NVIDIA H200", 1, true));
    CHECK(config_find(down_fb.config, "BLOCK_SIZE_M")->i == 1310);
    CHECK(contains(down_fb.why, "no _down table for this key: the up table serves"));
  }
  // A malformed version is refused up front.
  RuntimeOptions bad = options_for({dir.str()});
  bad.backend_version = "3.x";
  auto r = Runtime::create(bad);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::invalid_argument);
  CHECK(contains(r.status().message(), "backend_version '3.x'"));
}
