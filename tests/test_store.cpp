// SPDX-License-Identifier: Apache-2.0
// Store unit tests: the file-name grammar, `--key` parsing, version names,
// the JSON reader (one file's content) and the loader's per-file report.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "store/filename.hpp"
#include "store/json_file.hpp"
#include "test_util.hpp"

using namespace dispatch;
using namespace kdtest;
using store::FileKey;
using store::ParsedFile;

namespace {

FileKey name_ok(std::string_view base) {
  auto r = store::parse_file_name(base);
  REQUIRE_MESSAGE(r.ok(), base, ": ", r.status().to_string());
  return std::move(r).value();
}

std::string name_error(std::string_view base) {
  auto r = store::parse_file_name(base);
  REQUIRE_MESSAGE(!r.ok(), base, " should be rejected");
  CHECK(r.status().code() == StatusCode::invalid_argument);
  return r.status().message();
}

ParsedFile parse(std::string_view text) {
  std::string buf(text);
  buf.resize(text.size() + store::json_padding(), '\0');
  return store::parse_config_json(buf.data(), text.size());
}

std::string rows_text(const ParsedFile& p) {
  std::string s;
  for (const auto& r : p.rows) s += std::to_string(r.m) + ":" + config_to_json(p.config(r)) + ";";
  return s;
}

const char* kRow =
    R"({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2})";
const std::string kRowJson = row({{"BLOCK_SIZE_M", 16},
                                  {"BLOCK_SIZE_N", 32},
                                  {"BLOCK_SIZE_K", 64},
                                  {"GROUP_SIZE_M", 1},
                                  {"num_warps", 4},
                                  {"num_stages", 2}});

}  // namespace

TEST_CASE("store: file-name grammar") {
  const std::string canon = "E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8";
  SUBCASE("block_shape with and without the space name one key") {
    const FileKey a = name_ok("E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json");
    const FileKey b = name_ok("E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json");
    CHECK(store::join_fields(a.fields) == canon);
    CHECK(store::join_fields(b.fields) == canon);
    CHECK(a.device_name == "NVIDIA_H200");
    CHECK(a.has_device_name);
    CHECK_FALSE(a.down);
    REQUIRE(a.fields.size() == 4);
    CHECK(a.fields[2] == std::make_pair(std::string("block_shape"), std::string("[128,128]")));
  }
  SUBCASE("field order never matters") {
    const FileKey k = name_ok("dtype=fp8_w8a8,block_shape=[128, 128],device_name=NVIDIA_H200,N=256,E=257.json");
    CHECK(store::join_fields(k.fields) == canon);
    CHECK(k.device_name == "NVIDIA_H200");
  }
  SUBCASE("_down after the last field") {
    const FileKey k = name_ok("E=257,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128]_down.json");
    CHECK(k.down);
    CHECK(store::join_fields(k.fields) == canon);
    CHECK(k.device_name == "NVIDIA_H20");
    const FileKey d = name_ok("E=8,N=7168,device_name=NVIDIA_H200_down.json");  // _down right after the device
    CHECK(d.down);
    CHECK(d.device_name == "NVIDIA_H200");
    CHECK(store::join_fields(d.fields) == "E=8,N=7168");
  }
  SUBCASE("empty device_name, and its _down twin") {
    const FileKey k = name_ok("E=384,N=128,device_name=,dtype=int4_w4a16.json");
    CHECK(k.has_device_name);
    CHECK(k.device_name.empty());
    CHECK(store::join_fields(k.fields) == "E=384,N=128,dtype=int4_w4a16");
    const FileKey d = name_ok("E=384,N=128,device_name=,dtype=int4_w4a16_down.json");
    CHECK(d.down);
    CHECK(store::join_fields(d.fields) == "E=384,N=128,dtype=int4_w4a16");
  }
  SUBCASE("other fields are kept as written; no device_name field") {
    const FileKey k =
        name_ok("E=64,N=1280,device_name=NVIDIA_A100-SXM4-80GB,dtype=int8_w8a16,per_channel_quant=True.json");
    CHECK(store::join_fields(k.fields) == "E=64,N=1280,dtype=int8_w8a16,per_channel_quant=True");
    CHECK(k.device_name == "NVIDIA_A100-SXM4-80GB");
    const FileKey n = name_ok("E=8,N=64.json");
    CHECK_FALSE(n.has_device_name);
    // Parentheses in a device name (vLLM's Intel Arc files) are plain characters.
    CHECK(name_ok("E=8,N=64,device_name=Intel(R)_Arc(TM)_Pro_B60_Graphics.json").device_name ==
          "Intel(R)_Arc(TM)_Pro_B60_Graphics");
  }
  SUBCASE("rejected names say what is wrong") {
    CHECK(contains(name_error("E=1,E=2,device_name=NVIDIA_H200.json"), "field 'E' appears twice"));
    CHECK(contains(name_error("E=1,N=2,device_name=A,device_name=B.json"), "field 'device_name' appears twice"));
    CHECK(contains(name_error("E=1,N=2,device_name=X,block_shape=[128, 128.json"), "unbalanced '[' ']'"));
    CHECK(contains(name_error("E=1,N=2,device_name=X,block_shape=128]).json"), "unbalanced '[' ']'"));
    CHECK(contains(name_error("E=1,,N=2,device_name=X.json"), "empty field"));
    CHECK(contains(name_error("E=1,foo,device_name=X.json"), "field 'foo' is not <name>=<value>"));
    CHECK(contains(name_error("=5,device_name=X.json"), "field '=5' is not <name>=<value>"));
    CHECK(
        contains(name_error("causal_conv1d_fwd_sm_95.json"), "field 'causal_conv1d_fwd_sm_95' is not <name>=<value>"));
    CHECK(contains(name_error("E=1,N=2,device_name=X.csv"), "not a .json file"));
    CHECK(contains(name_error(".json"), "not a .json file"));
  }
}

TEST_CASE("store: --key parsing") {
  auto ok = [](std::string_view text) {
    auto r = store::parse_key_fields(text);
    REQUIRE_MESSAGE(r.ok(), text, ": ", r.status().to_string());
    return store::join_fields(r.value());
  };
  CHECK(ok("E=257,N=256,block_shape=[128, 128],dtype=fp8_w8a8") == "E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8");
  CHECK(ok("dtype=fp8_w8a8, block_shape=[ 128 , 128 ] ,N=256,E=257") ==
        "E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8");
  CHECK(ok("K=4096,N=4096,dtype=bf16") == "K=4096,N=4096,dtype=bf16");
  auto err = [](std::string_view text) {
    auto r = store::parse_key_fields(text);
    REQUIRE_MESSAGE(!r.ok(), text, " should be rejected");
    CHECK(r.status().code() == StatusCode::invalid_argument);
    return r.status().message();
  };
  CHECK(contains(err(""), "empty key"));
  CHECK(contains(err("  "), "empty key"));
  CHECK(contains(err("E=1,device_name=NVIDIA_H200"), "device_name is not a key field"));
  CHECK(contains(err("E=1,N=2,E=1"), "field 'E' appears twice"));
  CHECK(contains(err("E=1,block_shape=[128,128"), "unbalanced"));
  CHECK(contains(err("E"), "field 'E' is not <name>=<value>"));

  // Through the public lookup: a malformed key is invalid_argument naming the problem.
  TempDir dir;
  auto rt = make_runtime({dir.str()});
  auto r = lookup(*rt, query("E=1,E=2", "NVIDIA H200", 1, false, "triton_fused_moe"));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::invalid_argument);
  CHECK(r.status().message() == "key: field 'E' appears twice");
  auto m0 = lookup(*rt, query("E=1,N=2", "NVIDIA H200", 0, false, "triton_fused_moe"));
  REQUIRE_FALSE(m0.ok());
  CHECK(m0.status().code() == StatusCode::invalid_argument);
  CHECK(contains(m0.status().message(), "M must be >= 1"));
  auto bad_op = lookup(*rt, query("E=1,N=2", "NVIDIA H200", 1, false, "moe"));
  REQUIRE_FALSE(bad_op.ok());
  CHECK(contains(bad_op.status().message(), "unknown op 'moe'"));
}

TEST_CASE("store: version folder and version string names") {
  std::vector<int> v;
  CHECK(store::parse_version_folder("triton_3_5_1", &v));
  CHECK(v == std::vector<int>{3, 5, 1});
  CHECK(store::parse_version_folder("triton_3_10_0", &v));
  CHECK(v == std::vector<int>{3, 10, 0});
  CHECK_FALSE(store::parse_version_folder("triton_", &v));
  CHECK_FALSE(store::parse_version_folder("triton_3_x_0", &v));
  CHECK_FALSE(store::parse_version_folder("3_5_1", &v));
  CHECK_FALSE(store::parse_version_folder("quantization", &v));
  CHECK(store::parse_version_string("3.5.1", &v));
  CHECK(v == std::vector<int>{3, 5, 1});
  CHECK(store::parse_version_string("3.5", &v));
  CHECK(v == std::vector<int>{3, 5});
  CHECK_FALSE(store::parse_version_string("", &v));
  CHECK_FALSE(store::parse_version_string("3..1", &v));
  CHECK_FALSE(store::parse_version_string("3.5.", &v));
  CHECK_FALSE(store::parse_version_string("3.5.1a", &v));
}

TEST_CASE("store: JSON reading") {
  SUBCASE("a plain table keeps file order and value kinds") {
    const ParsedFile p = parse(R"({"16": {"BLOCK_SIZE_M": 64, "USE_TMA": true, "variant": "x", "kpack": -2},
                                   "1": {"BLOCK_SIZE_M": 16}})");
    CHECK(p.kind == ParsedFile::Kind::table);
    CHECK(p.problems.empty());
    CHECK(p.dropped_rows == 0);
    REQUIRE(p.rows.size() == 2);
    CHECK(p.rows[0].m == 16);
    REQUIRE(p.config(p.rows[0]).size() == 4);
    CHECK(p.config(p.rows[0])[1].second == ConfigValue::boolean(true));
    CHECK(p.config(p.rows[0])[2].second == ConfigValue::string("x"));
    CHECK(p.config(p.rows[0])[3].second == ConfigValue::integer(-2));
    CHECK(config_to_json(p.config(p.rows[0])) ==
          R"({"BLOCK_SIZE_M": 64, "USE_TMA": true, "variant": "x", "kpack": -2})");
    CHECK(p.rows[1].m == 1);
  }
  SUBCASE("null rows are dropped and counted") {
    const ParsedFile p =
        parse(std::string(R"({"1": )") + kRow + R"(, "512": null, "1024": null, "2048": )" + kRow + "}");
    CHECK(p.kind == ParsedFile::Kind::table);
    CHECK(p.dropped_rows == 2);
    CHECK(rows_text(p) == "1:" + kRowJson + ";2048:" + kRowJson + ";");
    CHECK(p.problems == std::vector<std::string>{"M=512: null row dropped", "M=1024: null row dropped"});
  }
  SUBCASE("\"triton_version\" is metadata, not a row and not a problem") {
    const ParsedFile p = parse(std::string(R"({"triton_version": "3.4.0", "1": )") + kRow + "}");
    CHECK(p.kind == ParsedFile::Kind::table);
    CHECK(p.problems.empty());
    CHECK(p.dropped_rows == 0);
    CHECK(rows_text(p) == "1:" + kRowJson + ";");
    REQUIRE(p.metadata.size() == 1);
    CHECK(p.metadata[0].first == "triton_version");
    CHECK(p.metadata[0].second == "\"3.4.0\"");
  }
  SUBCASE("keys out of order stay in file order here (the table sorts them)") {
    const ParsedFile p =
        parse(std::string(R"({"3840": )") + kRow + R"(, "1792": )" + kRow + R"(, "3584": )" + kRow + "}");
    REQUIRE(p.rows.size() == 3);
    CHECK(p.rows[0].m == 3840);
    CHECK(p.rows[1].m == 1792);
    CHECK(p.rows[2].m == 3584);
  }
  SUBCASE("a duplicate M keeps the last, as json.load does, and is reported") {
    const ParsedFile p = parse(R"({"8": {"BLOCK_SIZE_M": 16}, "8": {"BLOCK_SIZE_M": 32}})");
    CHECK(p.kind == ParsedFile::Kind::table);
    CHECK(rows_text(p) == "8:{\"BLOCK_SIZE_M\": 32};");
    REQUIRE(p.problems.size() == 1);
    CHECK(contains(p.problems[0], "M=8: duplicate key"));
  }
  SUBCASE("duplicates among out-of-order rows: the last serves, in the first one's place, each reported") {
    // The first M at or below the largest so far switches to an index of
    // the rows (linear time for any order); the result is json.load's.
    const ParsedFile p = parse(R"({"64": {"num_warps": 1}, "8": {"num_warps": 2}, "128": {"num_warps": 3},)"
                               R"( "8": {"num_warps": 4}, "64": {"num_warps": 5}, "16": {"num_warps": 6}})");
    CHECK(p.kind == ParsedFile::Kind::table);
    CHECK(rows_text(p) == "64:{\"num_warps\": 5};8:{\"num_warps\": 4};128:{\"num_warps\": 3};16:{\"num_warps\": 6};");
    CHECK(p.dropped_rows == 2);
    REQUIRE(p.problems.size() == 2);
    CHECK(contains(p.problems[0], "M=8: duplicate key"));
    CHECK(contains(p.problems[1], "M=64: duplicate key"));
  }
  SUBCASE("100,000 rows in one file: every row, in order (the duplicate check is no longer a scan per row)") {
    std::string text = "{";
    for (int m = 1; m <= 100000; ++m) text += (m > 1 ? ", \"" : "\"") + std::to_string(m) + "\": {\"num_warps\": 4}";
    text += ", \"50000\": {\"num_warps\": 8}}";
    const ParsedFile p = parse(text);
    REQUIRE(p.rows.size() == 100000);
    CHECK(p.rows[49999].m == 50000);
    CHECK(p.rows[99999].m == 100000);
    CHECK(p.dropped_rows == 1);
    REQUIRE(p.problems.size() == 1);
    CHECK(contains(p.problems[0], "M=50000: duplicate key"));
  }
  SUBCASE("batch-size keys as SGLang's int(key) reads them: spaces, sign, leading zeros, 1_000") {
    const ParsedFile p = parse(R"({" 16": {"num_warps": 1}, "+32\t": {"num_warps": 2}, "064": {"num_warps": 3},)"
                               R"( "1_024": {"num_warps": 4}, "-4": {"num_warps": 5}, "1__6": {"num_warps": 6},)"
                               R"( "16x": {"num_warps": 7}, "_8": {"num_warps": 8}})");
    CHECK(p.kind == ParsedFile::Kind::table);
    CHECK(rows_text(p) == "16:{\"num_warps\": 1};32:{\"num_warps\": 2};64:{\"num_warps\": 3};1024:{\"num_warps\": 4};");
    CHECK(p.dropped_rows == 1);  // -4: a batch size, below 1
    REQUIRE(p.problems.size() == 4);
    CHECK(contains(p.problems[0], "M=-4: batch size must be >= 1"));
    CHECK(p.problems[1] == "key '1__6' is not a batch size; ignored");
    CHECK(p.problems[2] == "key '16x' is not a batch size; ignored");
    CHECK(p.problems[3] == "key '_8' is not a batch size; ignored");
  }
  SUBCASE("invalid JSON inside a value a row does not use is a parse error, not a dropped row") {
    const ParsedFile p = parse(R"({"1": {"BLOCK_SIZE_M": {16, "num_warps": 4}, "2": {"BLOCK_SIZE_M": 32}})");
    CHECK(p.kind == ParsedFile::Kind::error);
    CHECK(p.rows.empty());
    REQUIRE(!p.problems.empty());
    CHECK(p.problems[0].rfind("parse error at byte ", 0) == 0);
  }
  SUBCASE("a key repeated inside a row: the last serves, as json.load, and it is reported") {
    const ParsedFile p = parse(R"({"1": {"BLOCK_SIZE_M": 16, "num_warps": 4, "BLOCK_SIZE_M": 32}})");
    CHECK(p.kind == ParsedFile::Kind::table);
    CHECK(rows_text(p) == "1:{\"BLOCK_SIZE_M\": 32, \"num_warps\": 4};");
    REQUIRE(p.problems.size() == 1);
    CHECK(p.problems[0] == "M=1: key 'BLOCK_SIZE_M' repeated in the row; the last one serves (as json.load)");
  }
  SUBCASE("a float value drops its row") {
    const ParsedFile p = parse(
        R"({"1": {"BLOCK_SIZE_M": 1.5, "num_warps": 4}, "2": {"BLOCK_SIZE_M": 16}, "4": {"BLOCK_SIZE_M": 16.0}})");
    CHECK(p.kind == ParsedFile::Kind::table);
    CHECK(p.dropped_rows == 2);
    CHECK(rows_text(p) == "2:{\"BLOCK_SIZE_M\": 16};");
    REQUIRE(p.problems.size() == 2);
    CHECK(p.problems[0] == "M=1: 'BLOCK_SIZE_M' is not an integer (1.500000); row dropped");
    CHECK(p.problems[1] == "M=4: 'BLOCK_SIZE_M' is not an integer (16.000000); row dropped");
  }
  SUBCASE("a nested object or array drops its row; a null value too") {
    const ParsedFile p =
        parse(R"({"1": {"BLOCK_SIZE_M": {"a": 1}}, "2": {"x": [1, 2]}, "4": {"y": null}, "8": {"BLOCK_SIZE_M": 8}})");
    CHECK(p.dropped_rows == 3);
    CHECK(rows_text(p) == "8:{\"BLOCK_SIZE_M\": 8};");
    REQUIRE(p.problems.size() == 3);
    CHECK(p.problems[0] == "M=1: 'BLOCK_SIZE_M' is not a scalar; row dropped");
    CHECK(p.problems[1] == "M=2: 'x' is not a scalar; row dropped");
    CHECK(p.problems[2] == "M=4: 'y' is null; row dropped");
  }
  SUBCASE("M = 0 and non-object rows are dropped") {
    const ParsedFile p = parse(R"({"0": {"BLOCK_SIZE_M": 8}, "1": 5, "2": {"BLOCK_SIZE_M": 8}})");
    CHECK(p.dropped_rows == 2);
    CHECK(rows_text(p) == "2:{\"BLOCK_SIZE_M\": 8};");
    CHECK(p.problems[0] == "M=0: batch size must be >= 1; row dropped");
    CHECK(p.problems[1] == "M=1: row is not an object; dropped");
  }
  SUBCASE("a non-batch-size object key next to rows is ignored and reported") {
    const ParsedFile p = parse(R"({"1": {"BLOCK_SIZE_M": 8}, "extra": {"a": 1}})");
    CHECK(p.kind == ParsedFile::Kind::table);
    CHECK(rows_text(p) == "1:{\"BLOCK_SIZE_M\": 8};");
    CHECK(p.problems == std::vector<std::string>{"key 'extra' is not a batch size; ignored"});
  }
  SUBCASE("foreign layouts: the real ones in fused_moe_triton/, and others") {
    // causal_conv1d_fwd_sm_95.json: {"useful_configs": {"<M>": "helion.Config(...)"}, "hash_configs": {...}}
    const ParsedFile h = parse(read_text(moe_dir() / "causal_conv1d_fwd_sm_95.json"));
    CHECK(h.kind == ParsedFile::Kind::foreign);
    CHECK(h.rows.empty());
    CHECK(h.problems ==
          std::vector<std::string>{"not a config table: no batch-size keys (keys: useful_configs, hash_configs)"});
    // minimax_m3_gfx950_mxfp8_compact_moe.json: {"model": ..., "top_k": 4, "tokens": {"<M>": {...}}}
    const ParsedFile m = parse(read_text(moe_dir() / "minimax_m3_gfx950_mxfp8_compact_moe.json"));
    CHECK(m.kind == ParsedFile::Kind::foreign);
    CHECK(m.problems == std::vector<std::string>{"not a config table: no batch-size keys (keys: tokens)"});
    CHECK(parse(read_text(moe_dir() / "update_sconv_cache_sm_90.json")).kind == ParsedFile::Kind::foreign);
    for (const char* top : {"[1, 2]", "5", "\"x\"", "null", "true"}) {
      CAPTURE(top);
      const ParsedFile p = parse(top);
      CHECK(p.kind == ParsedFile::Kind::foreign);
      CHECK(p.problems == std::vector<std::string>{"top level is not a JSON object"});
    }
  }
  SUBCASE("an empty object is foreign (no batch-size keys)") {
    const ParsedFile p = parse("{}");
    CHECK(p.kind == ParsedFile::Kind::foreign);
    CHECK(p.problems == std::vector<std::string>{"no batch-size keys (empty table)"});
    const ParsedFile q = parse(R"({"triton_version": "3.4.0"})");
    CHECK(q.kind == ParsedFile::Kind::foreign);
  }
  SUBCASE("content after the top-level object is a parse error at its offset") {
    // "{"1": {"BLOCK_SIZE_M": 8}}" is 26 bytes; the garbage starts after one blank at 27.
    const std::string good = R"({"1": {"BLOCK_SIZE_M": 8}})";
    REQUIRE(good.size() == 26);
    for (const char* tail : {" xx", " }", " {\"2\": {\"BLOCK_SIZE_M\": 9}}", " ]", " 5 }"}) {
      CAPTURE(tail);
      const ParsedFile p = parse(good + tail);
      CHECK(p.kind == ParsedFile::Kind::error);
      CHECK(p.rows.empty());
      REQUIRE_FALSE(p.problems.empty());
      CHECK(contains(p.problems[0], "parse error at byte 27:"));
    }
    // Two whole tables appended one after the other (a torn concurrent write).
    const ParsedFile two = parse(good + "\n" + good + "\n");
    CHECK(two.kind == ParsedFile::Kind::error);
    CHECK(two.problems[0] == "parse error at byte 27: content after the top-level object");
    // Trailing blanks are fine.
    CHECK(parse(good + "\n\n  \t").kind == ParsedFile::Kind::table);
  }
  SUBCASE("syntax errors inside carry the offset of the bad token") {
    const ParsedFile a = parse(R"({"1": {"a": 1,, "b": 2}})");
    CHECK(a.kind == ParsedFile::Kind::error);
    CHECK(contains(a.problems[0], "parse error at byte 14:"));  // the second ','
    const ParsedFile b = parse(R"({"1" {"a": 1}})");
    CHECK(contains(b.problems[0], "parse error at byte 5:"));  // '{' where ':' belongs
    const ParsedFile c = parse(R"({"1": {"a": 01}})");
    CHECK(contains(c.problems[0], "parse error at byte 12:"));  // the number 01
    const ParsedFile e = parse("");
    CHECK(e.kind == ParsedFile::Kind::error);
    CHECK(contains(e.problems[0], "parse error at byte 0:"));
  }
  SUBCASE("truncated files: an error at the cut, at every kind of cut point") {
    // quantization/...NVIDIA_H20...: 4-space indented, rows of 6 ints.
    const std::string full =
        read_text(quant_dir() / "N=2304,K=7168,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json");
    const size_t first_row_end = full.find('}');  // closes row "1"
    const size_t last_brace = full.rfind('}');    // closes the top-level object
    REQUIRE(first_row_end != std::string::npos);
    std::vector<size_t> cuts = {1,                  // "{"
                                10,                 // after `"1":`
                                30,                 // inside the key "BLOCK_SIZE_M"
                                40,                 // after `64,`
                                100,                // C10's cut: inside row "1", between fields
                                first_row_end + 1,  // right after row "1" closes
                                first_row_end + 2,  // after the comma that follows it
                                full.size() / 2,
                                last_brace};  // everything but the final '}'
    for (size_t cut : cuts) {
      CAPTURE(cut);
      const ParsedFile p = parse(std::string_view(full).substr(0, cut));
      CHECK(p.kind == ParsedFile::Kind::error);
      CHECK(p.rows.empty());
      REQUIRE_FALSE(p.problems.empty());
      CHECK(contains(p.problems[0], "parse error at byte " + std::to_string(cut) + ":"));
    }
    CHECK(parse(full).kind == ParsedFile::Kind::table);
    CHECK(parse(full).rows.size() == 18);
  }
}

TEST_CASE("store: entries that cannot be config files are reported, never passed over (issue 20 item 3)") {
  TempDir dir;
  const std::string r = kRow;
  write_text(dir / "E=8,N=64,device_name=NVIDIA_H200.json", "{\"1\": " + r + "}");      // the one usable file
  fs::create_symlink(dir / "nowhere", dir / "E=8,N=128,device_name=NVIDIA_H200.json");  // dangling
  fs::create_symlink(dir / "loop-b.json", dir / "loop-a.json");                         // a loop
  fs::create_symlink(dir / "loop-a.json", dir / "loop-b.json");
  REQUIRE(::mkfifo((dir / "E=8,N=256,device_name=NVIDIA_H200.json").c_str(), 0600) ==
          0);                                                              // a FIFO (would block a reader)
  fs::create_directories(dir / "E=8,N=512,device_name=NVIDIA_H200.json");  // a folder named *.json
  TempDir other;
  write_text(other / "E=8,N=1024,device_name=NVIDIA_H200.json", "{\"1\": " + r + "}");
  fs::create_symlink(other.path(), dir / "linked");  // a directory link
  fs::path deep = dir / "d";
  for (int i = 0; i < 17; ++i) deep /= "d";  // 18 levels below dir
  fs::create_directories(deep);
  write_text(deep / "E=8,N=2048,device_name=NVIDIA_H200.json", "{\"1\": " + r + "}");
  write_text(dir / "README.md", "not a config");  // not *.json: not reported

  auto rt = make_runtime({dir.str()});
  const LoadReport rep = rt->load_report();
  CHECK_FALSE(rep.all_usable());
  CHECK(rep.rows == 1);
  auto skipped = [&](const std::string& path, const std::string& why) {
    const FileReport* f = find_file(rep, path.c_str());
    REQUIRE_MESSAGE(f != nullptr, path);
    CHECK(f->state == FileReport::State::skipped);
    REQUIRE(!f->problems.empty());
    CHECK_MESSAGE(f->problems[0].find(why) == 0, f->problems[0]);
  };
  skipped("E=8,N=128,device_name=NVIDIA_H200.json", "a dangling symbolic link");
  skipped("loop-a.json", "a symbolic link loop");
  skipped("loop-b.json", "a symbolic link loop");
  skipped("E=8,N=256,device_name=NVIDIA_H200.json", "a FIFO, not a regular file");
  skipped("linked", "a symbolic link to a directory: not followed");
  skipped("d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d/d", "folder deeper than 16 levels");
  CHECK(find_file(rep, "README.md") == nullptr);
  // a folder named *.json is a folder: walked, not reported as a file
  CHECK(find_file(rep, "E=8,N=512,device_name=NVIDIA_H200.json") == nullptr);
  CHECK(rep.files.size() == 7);
}

TEST_CASE("store: the loader reports every file and keeps going") {
  TempDir dir;
  const std::string r = kRow;
  write_text(dir / "E=8,N=64,device_name=NVIDIA_H200.json", "{\"1\": " + r + ", \"2\": null, \"4\": " + r + "}");
  write_text(dir / "E=8,N=128,device_name=NVIDIA_H200.json", "{\"triton_version\": \"3.4.0\", \"1\": " + r + "}");
  write_text(dir / "E=8,N=256,device_name=NVIDIA_H200.json", "{\"1\": {\"BLOCK_SIZE_M\": 1.5}, \"2\": " + r + "}");
  copy_data_file(moe_dir() / "causal_conv1d_fwd_sm_95.json", dir / "E=8,N=512,device_name=NVIDIA_H200.json");
  write_text(dir / "E=8,N=1024,device_name=NVIDIA_H200.json", "{}");
  write_text(dir / "E=8,N=2048,device_name=NVIDIA_H200.json", "{\"1\": null, \"2\": null}");
  write_text(dir / "E=8,N=4096,device_name=NVIDIA_H200.json", "{\"1\": " + r + "} {\"2\": " + r + "}");
  write_text(dir / "E=8,N=8192,device_name=NVIDIA_H200.json", "");
  write_text(dir / "notes.json", "{\"1\": " + r + "}");
  write_text(dir / "E=8,N=32.json", "{\"1\": " + r + "}");
  write_text(dir / "hidden=64,device_name=NVIDIA_H200.json", "{\"1\": " + r + "}");
  write_text(dir / "README.md", "not a config");
  write_text(dir / ".E=8,N=16,device_name=NVIDIA_H200.json", "{\"1\": " + r + "}");  // editor/tmp file

  auto rt = make_runtime({dir.str()});
  const LoadReport rep = rt->load_report();
  CHECK(rep.files.size() == 11);  // every *.json but the hidden one
  CHECK_FALSE(rep.all_usable());
  CHECK(rep.keys == 3);
  CHECK(rep.rows == 2 + 1 + 1);
  auto state = [&](const char* path) {
    const FileReport* f = find_file(rep, path);
    REQUIRE_MESSAGE(f != nullptr, path);
    CHECK(f->dir == dir.str());
    return f;
  };
  const FileReport* f = state("E=8,N=64,device_name=NVIDIA_H200.json");
  CHECK(f->state == FileReport::State::partial);
  CHECK(f->rows == 2);
  CHECK(f->problems == std::vector<std::string>{"M=2: null row dropped"});
  f = state("E=8,N=128,device_name=NVIDIA_H200.json");
  CHECK(f->state == FileReport::State::loaded);
  CHECK(f->rows == 1);
  CHECK(f->problems.empty());
  f = state("E=8,N=256,device_name=NVIDIA_H200.json");
  CHECK(f->state == FileReport::State::partial);
  CHECK(f->rows == 1);
  CHECK(problems_text(*f) == "M=1: 'BLOCK_SIZE_M' is not an integer (1.500000); row dropped | ");
  f = state("E=8,N=512,device_name=NVIDIA_H200.json");
  CHECK(f->state == FileReport::State::skipped);
  CHECK(f->problems[0] ==
        "foreign JSON layout, skipped: not a config table: no batch-size keys (keys: useful_configs, hash_configs)");
  f = state("E=8,N=1024,device_name=NVIDIA_H200.json");
  CHECK(f->state == FileReport::State::skipped);
  CHECK(f->problems[0] == "foreign JSON layout, skipped: no batch-size keys (empty table)");
  f = state("E=8,N=2048,device_name=NVIDIA_H200.json");
  CHECK(f->state == FileReport::State::skipped);
  CHECK(f->problems[0] == "no usable rows");
  f = state("E=8,N=4096,device_name=NVIDIA_H200.json");
  CHECK(f->state == FileReport::State::skipped);
  // `{"1": <row>} {"2": ...}`: the top-level '}' is at 6 + |row|, the second object starts at 8 + |row|.
  CHECK(contains(f->problems[0], "parse error at byte " + std::to_string(r.size() + 8) + ":"));
  f = state("E=8,N=8192,device_name=NVIDIA_H200.json");
  CHECK(f->state == FileReport::State::skipped);
  CHECK(contains(f->problems[0], "parse error at byte 0:"));
  f = state("notes.json");
  CHECK(f->state == FileReport::State::skipped);
  CHECK(contains(f->problems[0], "file name is not a config key"));
  f = state("E=8,N=32.json");
  CHECK(f->state == FileReport::State::skipped);
  CHECK(f->problems[0] == "file name has no device_name field");
  f = state("hidden=64,device_name=NVIDIA_H200.json");
  CHECK(f->state == FileReport::State::skipped);
  CHECK(contains(f->problems[0], "match no known table kind"));
  CHECK(contains(rep.to_json(), "\"status\": \"partial\""));

  // What loaded serves: the null M=2 is gone, so M=2 goes to the nearest key 1
  // (|2-1| = 1 < |4-2| = 2); M=3 to 4.
  auto a = lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 2));
  CHECK(a.match == LookupResult::Match::nearest);
  CHECK(a.table_m == 1);
  CHECK(config_to_json(a.config) == kRowJson);
  CHECK(lookup_ok(*rt, query("E=8,N=64", "NVIDIA H200", 3)).table_m == 4);
  CHECK(lookup_ok(*rt, query("E=8,N=128", "NVIDIA H200", 1)).match == LookupResult::Match::exact);
  CHECK(lookup_ok(*rt, query("E=8,N=256", "NVIDIA H200", 1)).table_m == 2);  // row 1 was dropped
  for (const char* k : {"E=8,N=512", "E=8,N=2048", "E=8,N=4096", "E=8,N=8192", "E=8,N=16"}) {
    CAPTURE(k);
    CHECK(lookup_ok(*rt, query(k, "NVIDIA H200", 1)).match == LookupResult::Match::fallback);
  }
}

TEST_CASE("store: one key from two files of one dir (MI325X and MI325_OAM) is a note, never silent (issue 20 item 5)") {
  TempDir dir;
  write_text(dir / "E=8,N=1024,device_name=AMD_Instinct_MI325X.json",
             R"({"1": {"BLOCK_SIZE_M": 16}, "2": {"BLOCK_SIZE_M": 16}})");
  write_text(dir / "E=8,N=1024,device_name=AMD_Instinct_MI325_OAM.json",
             R"({"1": {"BLOCK_SIZE_M": 32}, "4": {"BLOCK_SIZE_M": 32}})");
  auto rt = make_runtime({dir.str()});
  const LoadReport rep = rt->load_report();
  CHECK(rep.keys == 1);
  CHECK(rep.rows == 3);
  int notes = 0;
  for (const std::string& n : rep.notes)
    if (n.find("2 files of one config dir hold this key") != std::string::npos) {
      ++notes;
      CHECK(n.find("1 M value(s) are in more than one, and E=8,N=1024,device_name=AMD_Instinct_MI325X.json serves "
                   "them (the first by path)") != std::string::npos);
    }
  CHECK(notes == 1);
}

TEST_CASE("store: a file's metadata (vLLM's triton_version) is in the load report and its JSON (issue 20 item 5)") {
  TempDir dir;
  write_text(dir / "E=8,N=1024,device_name=NVIDIA_H200.json",
             R"({"triton_version": "3.4.0", "1": {"BLOCK_SIZE_M": 16}})");
  auto rt = make_runtime({dir.str()});
  const LoadReport rep = rt->load_report();
  REQUIRE(rep.files.size() == 1);
  REQUIRE(rep.files[0].metadata.size() == 1);
  CHECK(rep.files[0].metadata[0].first == "triton_version");
  CHECK(rep.files[0].metadata[0].second == "\"3.4.0\"");
  CHECK(rep.to_json().find(R"("metadata": {"triton_version": "3.4.0"})") != std::string::npos);
}
