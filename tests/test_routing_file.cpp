// SPDX-License-Identifier: Apache-2.0
// The routing the tuner feeds an MoE op (tune/routing_file.hpp;
// TuneOptions::routing, `tune --routing`, KDISPATCH_TUNE_ROUTING): a
// recorded .npy of int32 [tokens, top_k] ids read exactly, every malformed
// file refused naming the file and what is wrong, a search's ids taken as
// consecutive recorded tokens, a problem the file does not fit refused when
// tuned, and a fused_moe pretune on a recorded routing.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "dispatch/dispatch.hpp"
#include "table/key.hpp"
#include "test_util.hpp"
#include "tune/routing_file.hpp"

namespace {

using dispatch::tune::Routing;

/// An .npy (format 1.0) of int32 values with numpy's header text for
/// `shape` and `descr`; the header padded with spaces to 64 bytes as numpy does.
std::string npy(const std::vector<int32_t>& v, const std::string& shape, const std::string& descr = "'<i4'",
                const std::string& order = "False") {
  std::string h = "{'descr': " + descr + ", 'fortran_order': " + order + ", 'shape': " + shape + ", }";
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(h.size() & 0xff);
  out += static_cast<char>(h.size() >> 8);
  out += h;
  for (int32_t x : v) {
    char b[4];
    std::memcpy(b, &x, 4);  // little-endian hosts (x86-64, aarch64)
    out.append(b, 4);
  }
  return out;
}

std::string message_of(const std::string& bytes) {
  Routing r;
  return dispatch::tune::parse_routing_npy(bytes, "ids.npy", &r).message();
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
}

}  // namespace

TEST_CASE("routing file: a recorded [tokens, top_k] int32 .npy is read exactly") {
  Routing r;
  REQUIRE(dispatch::tune::parse_routing_npy(npy({0, 5, 7, -1, 3, 4}, "(3, 2)"), "ids.npy", &r).ok());
  CHECK(r.recorded());
  CHECK(r.tokens == 3);
  CHECK(r.top_k == 2);
  CHECK(r.max_id == 7);
  CHECK(r.ids == std::vector<int32_t>{0, 5, 7, -1, 3, 4});
  CHECK(r.source == "ids.npy");
  // A search of 5 tokens takes consecutive recorded tokens from an offset, wrapping.
  std::mt19937 rng(7);
  int32_t ids[5 * 3] = {};
  dispatch::tune::fill_routing(r, ids, 5, 2, 3, 8, rng);
  int start = -1;
  for (int s = 0; s < 3; ++s)
    if (ids[0] == r.ids[size_t(2 * s)] && ids[1] == r.ids[size_t(2 * s + 1)]) start = s;
  REQUIRE(start >= 0);
  for (int t = 0; t < 5; ++t) {
    CHECK(ids[3 * t] == r.ids[size_t(2 * ((start + t) % 3))]);
    CHECK(ids[3 * t + 1] == r.ids[size_t(2 * ((start + t) % 3) + 1)]);
  }
  CHECK(dispatch::tune::check_routing(r, 2, 8).ok());
  CHECK(dispatch::tune::check_routing(r, 3, 8).message() ==
        "routing file ids.npy holds 2 ids per token, the problem's top_k is 3");
  CHECK(dispatch::tune::check_routing(r, 2, 7).message() ==
        "routing file ids.npy has expert id 7, the problem has E = 7 (ids must be < E)");
}

TEST_CASE("routing file: every malformed file is refused naming it and what is wrong") {
  const std::string want = " (want an .npy of int32 [tokens, top_k] expert ids)";
  CHECK(message_of("not numpy at all") == "routing file ids.npy: not an .npy file" + want);
  CHECK(message_of(npy({1, 2}, "(1, 2)", "'<i8'")) ==
        "routing file ids.npy: dtype '<i8' is not little-endian int32 '<i4'" + want);
  CHECK(message_of(npy({1, 2}, "(1, 2)", "'>i4'")) ==
        "routing file ids.npy: dtype '>i4' is not little-endian int32 '<i4'" + want);
  CHECK(message_of(npy({1, 2}, "(1, 2)", "'<i4'", "True")) ==
        "routing file ids.npy: Fortran order (transposed) data" + want);
  CHECK(message_of(npy({1, 2}, "(2,)")) == "routing file ids.npy: shape (2,) is not two dims" + want);
  CHECK(message_of(npy({1, 2}, "(1, 2, 1)")) == "routing file ids.npy: shape (1, 2, 1) is not two dims" + want);
  CHECK(message_of(npy({}, "(0, 8)")) == "routing file ids.npy: an empty routing" + want);
  CHECK(message_of(npy({1, 2, 3}, "(2, 2)")) == "routing file ids.npy: holds 12 data bytes, its shape says 16" + want);
  CHECK(message_of(npy({1, -2}, "(1, 2)")) ==
        "routing file ids.npy: token 0 has expert id -2 (ids are >= 0, or -1: not a local expert)" + want);
  std::string truncated = npy({1, 2}, "(1, 2)");
  truncated.resize(40);
  CHECK(message_of(truncated) == "routing file ids.npy: truncated header" + want);
  // The spec: the synthetic names, else a file.
  Routing r;
  REQUIRE(dispatch::tune::load_routing("skewed", &r).ok());
  CHECK((!r.recorded() && r.synthetic == dispatch::core::Routing::skewed && r.source == "skewed"));
  REQUIRE(dispatch::tune::load_routing("", &r).ok());
  CHECK((!r.recorded() && r.synthetic == dispatch::core::Routing::uniform && r.source == "uniform"));
  kdtest::TempDir dir;
  const std::string missing = (dir / "missing.npy").string();
  const std::string m = dispatch::tune::load_routing(missing, &r).message();
  CHECK(m.rfind("routing '" + missing + "' is not uniform, skewed or a readable .npy file: ", 0) == 0);
}

TEST_CASE("routing file: Runtime::create refuses a bad one, and fused_moe tunes on a recorded one") {
  using namespace dispatch;
  kdtest::TempDir dir;
  const std::string bad = (dir / "bad.npy").string(), good = (dir / "ids.npy").string(),
                    three = (dir / "top3.npy").string();
  write(bad, "\x93NUMPY garbage");
  std::vector<int32_t> ids;
  for (int t = 0; t < 16; ++t) ids.push_back(t % 4), ids.push_back((t + 1) % 4);  // 16 tokens, top-2 of E = 4
  write(good, npy(ids, "(16, 2)"));
  write(three, npy({0, 1, 2}, "(1, 3)"));
  RuntimeOptions o;
  o.load_shipped_configs = false;
  o.log_level = LogLevel::off;
  o.tune.cache_dir = (dir / "cache").string();
  o.tune.cold_cache = false;
  o.tune.time_budget_ms = 20;
  o.tune.reps = 2;
  o.tune.routing = bad;
  auto refused = Runtime::create(o);
  REQUIRE(!refused.ok());
  CHECK(refused.status().message().rfind("tune.routing: routing file " + bad + ": ", 0) == 0);

  core::Problem p;
  p.op = core::OpKind::fused_moe;
  p.device = Device{DeviceType::cpu, 0};
  p.in_dtype = p.out_dtype = DType::bf16;
  p.m = 3, p.n = 8, p.k = 16, p.extra[0] = 4, p.extra[1] = 2;
  table::KeyBuffer fields;
  table::append_own_fields(p, &fields);
  o.tune.routing = good;
  auto rt = Runtime::create(o);
  REQUIRE_MESSAGE(rt.ok(), rt.status().to_string());
  auto r = pretune_key(**rt, "fused_moe", fields.view(), 3);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->persisted);
  o.tune.routing = three;  // top_k 3 against the problem's 2: refused when tuned, naming the file
  auto rt3 = Runtime::create(o);
  REQUIRE(rt3.ok());
  auto r3 = pretune_key(**rt3, "fused_moe", fields.view(), 5);
  REQUIRE(!r3.ok());
  CHECK(r3.status().message().find("routing file " + three + " holds 3 ids per token, the problem's top_k is 2") !=
        std::string::npos);
}
