// SPDX-License-Identifier: Apache-2.0
// Issue 31, item 7 (the parser and loader): batch-size keys read exactly as
// SGLang's {int(key): row for key, row in json.load(f).items()} reads them
// (Unicode digits and spaces, '_', signs, more than 19 digits; two
// spellings of one batch size), a UTF-8 byte-order mark named as such, and
// own-op rows that leave params out served with a note naming the row and
// the params.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.hpp"
#include "dispatch/dispatch.hpp"
#include "store/json_file.hpp"
#include "test_util.hpp"

using namespace dispatch;
using kdtest::TempDir;

namespace {

store::ParsedFile parse(const std::string& text) {
  std::string buf = text;
  buf.append(store::json_padding(), '\0');
  return store::parse_config_json(buf.data(), text.size());
}

// (M, BLOCK_SIZE_M) of every row, in file order.
std::vector<std::pair<int64_t, int64_t>> rows_of(const store::ParsedFile& pf) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& r : pf.rows) out.emplace_back(r.m, config_find(pf.config(r), "BLOCK_SIZE_M")->i);
  return out;
}

// {"<key>": {"BLOCK_SIZE_M": i}, ...}, keys as JSON string contents (escapes allowed).
std::string table(const std::vector<std::string>& keys) {
  std::string s = "{";
  for (size_t i = 0; i < keys.size(); ++i)
    s += (i ? ", \"" : "\"") + keys[i] + "\": {\"BLOCK_SIZE_M\": " + std::to_string(i + 1) + "}";
  return s + "}";
}

std::string moe_row(int64_t block_m) {
  return "{\"BLOCK_SIZE_M\": " + std::to_string(block_m) + ", \"num_warps\": 4, \"num_stages\": 3}";
}

}  // namespace

TEST_CASE(
    "config keys: batch sizes are read as Python's int(key): Unicode digits and spaces, '_', signs, more than 19 "
    "digits") {
  const std::string zeros4301(4301, '0');
  const store::ParsedFile pf = parse(table({"\\uff11",               // 1  FULLWIDTH DIGIT ONE: int("１") == 1
                                            "00000000000000000016",  // 2  20 characters, leading zeros
                                            "\\u0663\\u0662",        // 3  ARABIC-INDIC "32"
                                            "\\u3000 64\\u00a0",  // 4  ideographic space, space, no-break space around
                                            " 1_28 ",             // 5  '_' between digits, spaces around
                                            "+0256",              // 6
                                            "\\ud835\\udfd8\\ud835\\udfda",  // 7  MATHEMATICAL DOUBLE-STRUCK "02"
                                            "\\u000b8\\u000c",               // 8  \v 8 \f
                                            "9223372036854775807",           // 9  int64's largest
                                            "４",                            // 10 raw UTF-8 FULLWIDTH FOUR
                                            "0",                             // 11 dropped: < 1
                                            "-3",                            // 12 dropped: < 1
                                            "99999999999999999999",          // 13 dropped: over int64
                                            "-99999999999999999999",         // 14 dropped: < 1
                                            "1__6",
                                            "_16",
                                            "16_",
                                            "+ 16",
                                            "\\u001c16",
                                            "1\\uff16x",
                                            "\\uff12.0",
                                            "0x10",
                                            "1e3",
                                            "\\u007f1",
                                            "1\\u200b6",
                                            zeros4301,  // int() refuses more than 4300 digits (Python >= 3.11)
                                            std::string(4299, '0') + "5"}));  // 4300 digits: 5
  REQUIRE(pf.kind == store::ParsedFile::Kind::table);
  CHECK(rows_of(pf) ==
        std::vector<std::pair<int64_t, int64_t>>{
            {1, 1}, {16, 2}, {32, 3}, {64, 4}, {128, 5}, {256, 6}, {2, 7}, {8, 8}, {INT64_MAX, 9}, {4, 10}, {5, 27}});
  CHECK(pf.dropped_rows == 4);
  const std::vector<std::string> expected = {
      "M=0: batch size must be >= 1; row dropped",
      "M=-3: batch size must be >= 1; row dropped",
      "M=99999999999999999999: batch size over 9223372036854775807 (int64); row dropped",
      "M=-99999999999999999999: batch size must be >= 1; row dropped",
      "key '1__6' is not a batch size; ignored",
      "key '_16' is not a batch size; ignored",
      "key '16_' is not a batch size; ignored",
      "key '+ 16' is not a batch size; ignored",
      "key '\x1c"
      "16' is not a batch size; ignored",
      "key '1６x' is not a batch size; ignored",
      "key '２.0' is not a batch size; ignored",
      "key '0x10' is not a batch size; ignored",
      "key '1e3' is not a batch size; ignored",
      "key '\x7f"
      "1' is not a batch size; ignored",
      "key '1\u200b6' is not a batch size; ignored",
      "key '" + zeros4301 + "' is not a batch size; ignored"};
  CHECK(pf.problems == expected);

  // Through the loader and lookup: the rows serve at the M int(key) gives.
  TempDir dir;
  kdtest::write_text(dir / "E=8,N=64,device_name=NVIDIA_H200.json",
                     "{\"\\uff11\": " + moe_row(16) + ", \"00000000000000000016\": " + moe_row(64) + "}");
  auto rt = kdtest::make_runtime({dir.str()});
  const LoadReport rep = rt->load_report();
  const FileReport* f = kdtest::find_file(rep, "E=8,N=64,device_name=NVIDIA_H200.json");
  REQUIRE(f != nullptr);
  CHECK(f->state == FileReport::State::loaded);
  CHECK(f->rows == 2);
  for (const auto& [m, block_m] : std::vector<std::pair<int64_t, int64_t>>{{1, 16}, {16, 64}}) {
    const LookupResult r = kdtest::lookup_ok(*rt, kdtest::query("E=8,N=64", "NVIDIA_H200", m));
    CHECK(r.match == LookupResult::Match::exact);
    CHECK(config_to_json(r.config) == kdtest::row({{"BLOCK_SIZE_M", block_m}, {"num_warps", 4}, {"num_stages", 3}}));
  }
}

TEST_CASE(
    "config keys: two spellings of one batch size: the row SGLang's int(key) over json.load's dict keeps serves") {
  // {"16": A, "016": B, "16": C}: json.load keeps "16" -> C first and
  // "016" -> B after it; {int(k): v} then ends on B.
  store::ParsedFile pf = parse(table({"16", "016", "16"}));
  CHECK(rows_of(pf) == std::vector<std::pair<int64_t, int64_t>>{{16, 2}});
  CHECK(pf.dropped_rows == 2);
  CHECK(pf.problems == std::vector<std::string>{
                           "M=016: batch size 16 already given by key '16'; this later key's row serves (as SGLang's "
                           "int(key)), the earlier one is dropped",
                           "M=16: batch size 16 again, but json.load places this key before '016', whose row serves "
                           "(as SGLang's int(key)); row dropped"});
  // {"4": A, "04": B, "4": C, "004": D, "04": E} -> json.load {"4": C, "04": E, "004": D} -> D.
  pf = parse(table({"4", "04", "4", "004", "04"}));
  CHECK(rows_of(pf) == std::vector<std::pair<int64_t, int64_t>>{{4, 4}});
  // The same spelling twice: the last one serves (json.load), as before.
  pf = parse(table({"1", "8", "2", "8"}));
  CHECK(rows_of(pf) == std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {8, 4}, {2, 3}});
  CHECK(pf.problems == std::vector<std::string>{"M=8: duplicate key; the last one serves (as json.load)"});
  // Out of order and respelled: "８" (FULLWIDTH) after "8" serves.
  pf = parse(table({"8", "1", "８"}));
  CHECK(rows_of(pf) == std::vector<std::pair<int64_t, int64_t>>{{8, 3}, {1, 2}});
}

TEST_CASE(
    "config files: a UTF-8 byte-order mark is named as such and the file skipped, its previous rows keep serving") {
  const std::string name = "E=8,N=64,device_name=NVIDIA_H200.json";
  const std::string bom_why = "UTF-8 byte-order mark at byte 0; SGLang's json.load refuses it too";
  const store::ParsedFile pf = parse("\xEF\xBB\xBF{\"1\": {\"BLOCK_SIZE_M\": 16}}");
  CHECK(pf.kind == store::ParsedFile::Kind::error);
  CHECK(pf.rows.empty());
  CHECK(pf.problems == std::vector<std::string>{bom_why});

  TempDir dir;
  kdtest::write_text(dir / name, "{\"1\": " + moe_row(16) + "}");
  auto rt = kdtest::make_runtime({dir.str()});
  CHECK(config_find(kdtest::lookup_ok(*rt, kdtest::query("E=8,N=64", "NVIDIA_H200", 1)).config, "BLOCK_SIZE_M")->i ==
        16);
  kdtest::write_text(dir / name, "\xEF\xBB\xBF{\"1\": " + moe_row(32) + ", \"2\": " + moe_row(32) + "}");
  REQUIRE(rt->reload().ok());
  const LoadReport rep = rt->load_report();
  const FileReport* f = kdtest::find_file(rep, name);
  REQUIRE(f != nullptr);
  CHECK(f->state == FileReport::State::skipped);
  REQUIRE(!f->problems.empty());
  CHECK(f->problems.front() == bom_why);
  CHECK(kdtest::contains(kdtest::problems_text(*f), "keep serving"));
  const LookupResult r = kdtest::lookup_ok(*rt, kdtest::query("E=8,N=64", "NVIDIA_H200", 2));
  CHECK(r.table_m == 1);  // the old table: M=2 was only in the refused file
  CHECK(config_find(r.config, "BLOCK_SIZE_M")->i == 16);

  auto fresh = kdtest::make_runtime({dir.str()});
  const LoadReport fresh_rep = fresh->load_report();
  const FileReport* g = kdtest::find_file(fresh_rep, name);
  REQUIRE(g != nullptr);
  CHECK(g->state == FileReport::State::skipped);
  CHECK(g->problems == std::vector<std::string>{bom_why});
}

TEST_CASE(
    "own-op rows that leave params out: served with the variant's defaults, and the load report and lookup's why say "
    "which") {
  const std::string device = cpu_device_info().device_name;
  const std::string name = "cpu/rmsnorm/hidden=64,device_name=" + device + ",dtype=fp32.json";
  TempDir dir;
  kdtest::write_text(dir / name,
                     "{\"1\": {\"variant\": \"rmsnorm_fp32__vec\", \"vec\": 4, \"unroll\": 1},\n"
                     " \"2\": {\"variant\": \"rmsnorm_fp32__vec\", \"vec\": 4},\n"
                     " \"4\": {\"variant\": \"rmsnorm_fp32__vec\"}}");
  RuntimeOptions o = kdtest::options_for({dir.str()});
  o.tune.load_cache = o.tune.persist = false;
  auto rt = kdtest::make_runtime(o);
  const LoadReport rep = rt->load_report();
  const FileReport* f = kdtest::find_file(rep, name);
  REQUIRE(f != nullptr);
  CHECK(f->state == FileReport::State::loaded);
  CHECK(f->rows == 3);
  CHECK(f->problems == std::vector<std::string>{
                           "M=2: unroll not in the row: rmsnorm_fp32__vec's defaults serve (unroll=1)",
                           "M=4: vec, unroll not in the row: rmsnorm_fp32__vec's defaults serve (vec=4, unroll=1)"});
  const LookupQuery q{.op = "rmsnorm", .key = "hidden=64,dtype=fp32", .M = 4};
  LookupResult r = kdtest::lookup_ok(*rt, q);
  CHECK(r.match == LookupResult::Match::exact);
  CHECK(r.variant == "rmsnorm_fp32__vec");
  CHECK(kdtest::contains(r.why, "; vec, unroll not in the row: rmsnorm_fp32__vec's defaults serve (vec=4, unroll=1)"));
  r = kdtest::lookup_ok(*rt, LookupQuery{.op = "rmsnorm", .key = "hidden=64,dtype=fp32", .M = 1});
  CHECK_FALSE(kdtest::contains(r.why, "not in the row"));
#ifdef KDISPATCH_CLI_PATH
  const kdtest::CliResult c = kdtest::run_cli(
      {"lookup", "--configs", dir.str(), "--op", "rmsnorm", "--key", "hidden=64,dtype=fp32", "--M", "2", "--json"});
  CHECK(c.exit_code == 0);
  CHECK(kdtest::contains(c.out, "; unroll not in the row: rmsnorm_fp32__vec's defaults serve (unroll=1)"));
#endif
}
