// SPDX-License-Identifier: Apache-2.0
// Acceptance cases C05–C10b of shared/cases/CASES.md (the ones that need no
// tuner), on the real SGLang data in shared/data/sglang-configs, read in
// place. Every expected row below was read from the data file named next to
// it (values quoted from the file).
#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dispatch/device.hpp"
#include "test_util.hpp"

using namespace dispatch;
using namespace kdtest;

namespace {

constexpr int64_t kGB = 1000LL * 1000 * 1000;
constexpr int64_t kGiB = 1024LL * 1024 * 1024;

// Row of triton_3_5_1/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json
// at "1" (also CASES.md C06).
const std::string kH200Moe351M1 = row({{"BLOCK_SIZE_M", 16},
                                       {"BLOCK_SIZE_N", 64},
                                       {"BLOCK_SIZE_K", 128},
                                       {"GROUP_SIZE_M", 1},
                                       {"num_warps", 4},
                                       {"num_stages", 5}});

std::string moe_h200_351_file() {
  return (moe_dir() / "triton_3_5_1" / "E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json")
      .string();
}

// A copy of a table with its M keys written in ascending (or descending)
// numeric order; rows are kept as they are (simdjson DOM serialisation).
std::string resorted_table(const fs::path& src, bool ascending) {
  simdjson::dom::parser p;
  simdjson::dom::object obj;
  REQUIRE(p.load(src.string()).get(obj) == simdjson::SUCCESS);
  std::vector<std::pair<int64_t, std::string>> rows;
  for (auto [k, v] : obj) rows.emplace_back(std::stoll(std::string(k)), simdjson::to_string(v));
  std::sort(rows.begin(), rows.end());
  if (!ascending) std::reverse(rows.begin(), rows.end());
  std::string out = "{\n";
  for (size_t i = 0; i < rows.size(); ++i)
    out += "  \"" + std::to_string(rows[i].first) + "\": " + rows[i].second + (i + 1 < rows.size() ? ",\n" : "\n");
  return out + "}\n";
}

}  // namespace

TEST_CASE("C05 dtype is part of the key (quantization dir, NVIDIA H20)") {
  auto rt = make_runtime({quant_dir().string()});
  CHECK(rt->load_report().files.size() == 113);  // quantization/ holds 113 files (data/README.md)
  CHECK(rt->load_report().all_usable());

  // Hit: quantization/N=2304,K=7168,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json,
  // row "64" = {64, 32, 128, 32, 4, 3} (CASES.md C05). The op is inferred: the table only holds triton_gemm.
  const std::string expected = row({{"BLOCK_SIZE_M", 64},
                                    {"BLOCK_SIZE_N", 32},
                                    {"BLOCK_SIZE_K", 128},
                                    {"GROUP_SIZE_M", 32},
                                    {"num_warps", 4},
                                    {"num_stages", 3}});
  for (const char* key :
       {"N=2304,K=7168,dtype=fp8_w8a8,block_shape=[128,128]", "N=2304,K=7168,dtype=fp8_w8a8,block_shape=[128, 128]",
        "block_shape=[128,128],dtype=fp8_w8a8,K=7168,N=2304"}) {
    CAPTURE(key);
    auto r = lookup_ok(*rt, query(key, "NVIDIA H20", 64));
    CHECK(r.match == LookupResult::Match::exact);
    CHECK(r.table_m == 64);
    CHECK(config_to_json(r.config) == expected);
    CHECK(r.source == "N=2304,K=7168,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json");
    CHECK(r.source_dir == quant_dir().string());
    CHECK(r.key == "triton/triton_gemm|NVIDIA_H20|K=7168,N=2304,block_shape=[128,128],dtype=fp8_w8a8");
    CHECK(contains(r.why, "op triton_gemm (inferred)"));
  }

  // Miss: no bf16 table for this N,K on the H20. With a block_shape the
  // block-GEMM default serves (BLOCK_SIZE_N/K = block_shape, lookup.cpp's
  // triton_gemm_default), never the fp8 row.
  auto miss = lookup_ok(*rt, query("N=2304,K=7168,dtype=bf16,block_shape=[128,128]", "NVIDIA H20", 64));
  CHECK(miss.match == LookupResult::Match::fallback);
  CHECK(miss.table_m == -1);
  CHECK(miss.source == "default");
  CHECK(config_to_json(miss.config) == row({{"BLOCK_SIZE_M", 64},
                                            {"BLOCK_SIZE_N", 128},
                                            {"BLOCK_SIZE_K", 128},
                                            {"GROUP_SIZE_M", 32},
                                            {"num_warps", 4},
                                            {"num_stages", 3}}));
  // The int8 tables for this N,K exist for A100/A800 only: another dtype on the H20 misses too.
  auto int8 = lookup_ok(*rt, query("N=2304,K=7168,dtype=int8_w8a8,block_shape=[128,128]", "NVIDIA H20", 64));
  CHECK(int8.match == LookupResult::Match::fallback);
  // SGLang leaves dtype out for bf16 tables: no table and no default rule
  // without a block_shape -> not_found, never the fp8 row.
  auto plain = lookup(*rt, query("N=2304,K=7168", "NVIDIA H20", 64));
  REQUIRE_FALSE(plain.ok());
  CHECK(plain.status().code() == StatusCode::not_found);

  // `_down` tables exist only for fused MoE.
  auto down = lookup(*rt, query("N=2304,K=7168,dtype=fp8_w8a8,block_shape=[128,128]", "NVIDIA H20", 64, true));
  REQUIRE_FALSE(down.ok());
  CHECK(down.status().code() == StatusCode::invalid_argument);
  CHECK(down.status().message() == "down tables exist only for triton_fused_moe");

  // Same answer with the shipped configs loaded too (op inference must still pick triton_gemm).
  RuntimeOptions o = options_for({quant_dir().string()});
  o.load_shipped_configs = true;
  auto rt2 = make_runtime(o);
  auto r2 = lookup_ok(*rt2, query("N=2304,K=7168,dtype=fp8_w8a8,block_shape=[128,128]", "NVIDIA H20", 64));
  CHECK(r2.match == LookupResult::Match::exact);
  CHECK(config_to_json(r2.config) == expected);
}

TEST_CASE("the engines' fused-MoE tables are op triton_fused_moe, and fused_moe still answers for one release") {
  const std::string key = "E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]";
  RuntimeOptions o = options_for({moe_dir().string()});
  o.backend_version = "3.5.1";
  auto rt = make_runtime(o);
  LookupQuery q = query(key, "NVIDIA H200", 1);
  const LookupResult inferred = lookup_ok(*rt, q);
  CHECK(contains(inferred.why, "op triton_fused_moe (inferred)"));
  q.op = "triton_fused_moe";
  const LookupResult named = lookup_ok(*rt, q);
  q.op = "fused_moe";  // the name until 2026-12
  const LookupResult old = lookup_ok(*rt, q);
  for (const LookupResult* r : {&inferred, &named, &old}) {
    CHECK(r->key == "triton/triton_fused_moe|NVIDIA_H200|E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8");
    CHECK(config_to_json(r->config) == kH200Moe351M1);
  }
  CHECK_FALSE(contains(named.why, "deprecated"));
  CHECK(contains(old.why,
                 "op 'fused_moe' for the engines' fused-MoE tables is deprecated: they are 'triton_fused_moe' now"));
  // The _down table and the whole table answer under the old name too.
  q.down = true;
  CHECK(lookup_ok(*rt, q).key ==
        "triton/triton_fused_moe|NVIDIA_H200|E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8|down");
  q.down = false;
  auto table = lookup_table(*rt, q);
  REQUIRE(table.ok());
  CHECK(table->key == "triton/triton_fused_moe|NVIDIA_H200|E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8");
  // A key without E= is not a fused-MoE table under either name: as the own
  // op's key it names what it lacks.
  q.key = "N=2304,K=7168,dtype=fp8_w8a8,block_shape=[128,128]";
  auto wrong = lookup(*rt, q);
  REQUIRE_FALSE(wrong.ok());
  INFO(wrong.status().message());
  CHECK(wrong.status().message().rfind("key: ", 0) == 0);
  // The own op's key (it has K and top_k) is the own op's, not the engines' table.
  q.key = "E=257,K=7168,N=256,block_shape=[128,128],dtype=fp8_e4m3fn,out_dtype=bf16,top_k=9";
  // (This build has no CUDA backend to compute a default for the H200: no row, said with the own key.)
  auto own = lookup(*rt, q);
  if (own.ok()) {
    CHECK(own->key.rfind("cuda/fused_moe|NVIDIA_H200|E=257,K=7168,N=256,", 0) == 0);
    CHECK_FALSE(contains(own->why, "deprecated"));
  } else {
    CHECK(contains(own.status().message(),
                   "no table row for cuda/fused_moe|NVIDIA_H200|E=257,K=7168,N=256,block_shape=[128,128],"
                   "dtype=fp8_e4m3fn,out_dtype=bf16,top_k=9"));
  }
}

TEST_CASE("C06 device aliases help one SKU without breaking another") {
  const std::string key = "E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]";
  const std::string src351 =
      "triton_3_5_1/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json";
  // Row "64" of the same H200 3.5.1 file, and of the H20 3.5.1 file (they differ there;
  // at "1" both files hold the same row).
  const std::string h200_m64 = row({{"BLOCK_SIZE_M", 16},
                                    {"BLOCK_SIZE_N", 64},
                                    {"BLOCK_SIZE_K", 128},
                                    {"GROUP_SIZE_M", 16},
                                    {"num_warps", 4},
                                    {"num_stages", 4}});
  const std::string h20_m64 = row({{"BLOCK_SIZE_M", 16},
                                   {"BLOCK_SIZE_N", 128},
                                   {"BLOCK_SIZE_K", 128},
                                   {"GROUP_SIZE_M", 1},
                                   {"num_warps", 4},
                                   {"num_stages", 3}});

  for (bool user_alias : {true, false}) {
    CAPTURE(user_alias);
    RuntimeOptions o = options_for({moe_dir().string()});
    o.backend_version = "3.5.1";
    if (user_alias) o.device_aliases = {{"NVIDIA H200 NVL", "NVIDIA_H200"}};
    auto rt = make_runtime(o);
    for (const char* dev : {"NVIDIA H200", "NVIDIA H200 NVL", "NVIDIA_H200_NVL"}) {
      CAPTURE(dev);
      auto r = lookup_ok(*rt, query(key, dev, 1));
      CHECK(r.match == LookupResult::Match::exact);
      CHECK(r.table_m == 1);
      CHECK(config_to_json(r.config) == kH200Moe351M1);
      CHECK(r.source == src351);
      CHECK(r.key == "triton/triton_fused_moe|NVIDIA_H200|E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8");
      CHECK(contains(r.why, "triton_3_5_1 (exact version)"));
      auto r64 = lookup_ok(*rt, query(key, dev, 64));
      CHECK(config_to_json(r64.config) == h200_m64);
    }
    auto nvl = lookup_ok(*rt, query(key, "NVIDIA H200 NVL", 1));
    CHECK(contains(nvl.why, "(alias)"));
    // The H20 (another SKU) keeps its own table.
    auto h20 = lookup_ok(*rt, query(key, "NVIDIA H20", 64));
    CHECK(h20.source == "triton_3_5_1/E=257,N=256,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json");
    CHECK(config_to_json(h20.config) == h20_m64);
  }

  // The version matters: under 3.3.1 the H200 gets triton_3_3_1's row "1"
  // {16, 128, 128, 16, 4, 4}, not 3.5.1's.
  RuntimeOptions o = options_for({moe_dir().string()});
  o.backend_version = "3.3.1";
  auto rt = make_runtime(o);
  auto r = lookup_ok(*rt, query(key, "NVIDIA H200 NVL", 1));
  CHECK(r.source == "triton_3_3_1/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json");
  CHECK(config_to_json(r.config) == row({{"BLOCK_SIZE_M", 16},
                                         {"BLOCK_SIZE_N", 128},
                                         {"BLOCK_SIZE_K", 128},
                                         {"GROUP_SIZE_M", 16},
                                         {"num_warps", 4},
                                         {"num_stages", 4}}));
}

TEST_CASE("C07 device names that match no known device are reported, never wildcards") {
  TempDir dir;
  const std::string short_name = "E=128,N=384,device_name=NVIDIA_H100,dtype=fp8_w8a8,block_shape=[128,128].json";
  const std::string empty_name = "E=384,N=128,device_name=,dtype=int4_w4a16.json";
  // Content of the short-name file: the real H200 3.5.1 table (14 rows, row "1" = kH200Moe351M1).
  copy_data_file(moe_h200_351_file(), dir / short_name);
  copy_data_file(moe_dir() / "triton_3_4_0" / empty_name, dir / empty_name);

  auto rt = make_runtime({dir.str()});
  REQUIRE_FALSE(rt->options().load_shipped_configs);  // only this dir is loaded
  const LoadReport rep = rt->load_report();
  REQUIRE(rep.files.size() == 2);
  const FileReport* fs_short = find_file(rep, short_name);
  const FileReport* fs_empty = find_file(rep, empty_name);
  REQUIRE(fs_short != nullptr);
  REQUIRE(fs_empty != nullptr);
  for (const FileReport* f : {fs_short, fs_empty}) {
    CAPTURE(f->path);
    CHECK(f->unknown_device);
    CHECK(contains(problems_text(*f), "matches no known device"));
    CHECK(f->state == FileReport::State::loaded);  // loaded: it serves a device reporting exactly that name
  }
  CHECK(fs_short->rows == 14);  // keys 1..1024 of the H200 3.5.1 file
  CHECK(fs_empty->rows == 18);  // keys 1..4096 of triton_3_4_0/E=384,N=128,device_name=,...
  CHECK(rep.all_usable());

  // The running H100 misses both: no prefix or fuzzy match. The miss serves
  // SGLang's get_default_config (block fp8: {64, bn, bk, 32, 4, 3}; other
  // dtypes at M <= E: {16, 32, 64, 1}).
  auto a = lookup_ok(*rt, query("E=128,N=384,dtype=fp8_w8a8,block_shape=[128,128]", "NVIDIA H100 80GB HBM3", 1));
  CHECK(a.match == LookupResult::Match::fallback);
  CHECK(config_to_json(a.config) == row({{"BLOCK_SIZE_M", 64},
                                         {"BLOCK_SIZE_N", 128},
                                         {"BLOCK_SIZE_K", 128},
                                         {"GROUP_SIZE_M", 32},
                                         {"num_warps", 4},
                                         {"num_stages", 3}}));
  auto b = lookup_ok(*rt, query("E=384,N=128,dtype=int4_w4a16", "NVIDIA H100 80GB HBM3", 1));
  CHECK(b.match == LookupResult::Match::fallback);
  CHECK(config_to_json(b.config) ==
        row({{"BLOCK_SIZE_M", 16}, {"BLOCK_SIZE_N", 32}, {"BLOCK_SIZE_K", 64}, {"GROUP_SIZE_M", 1}}));
  for (const char* dev : {"NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H1"}) {
    CAPTURE(dev);
    CHECK(lookup_ok(*rt, query("E=128,N=384,dtype=fp8_w8a8,block_shape=[128,128]", dev, 1)).match ==
          LookupResult::Match::fallback);
  }

  // A device reporting exactly "NVIDIA H100" gets the short-name file.
  for (const char* dev : {"NVIDIA H100", "NVIDIA_H100"}) {
    CAPTURE(dev);
    auto r = lookup_ok(*rt, query("E=128,N=384,dtype=fp8_w8a8,block_shape=[128, 128]", dev, 1));
    CHECK(r.match == LookupResult::Match::exact);
    CHECK(config_to_json(r.config) == kH200Moe351M1);
    CHECK(r.source == short_name);
  }
}

TEST_CASE("C08 one AMD part, several names") {
  // Resolver: hardware identity (gfx942, 304 CUs, < 224 GB) -> MI300X.
  for (int64_t mem : {192 * kGB, 192 * kGiB}) {
    CAPTURE(mem);
    for (const char* arch : {"gfx942", "gfx942:sramecc+:xnack-"}) {
      auto r = resolve_device_name("AMD Radeon Graphics", arch, 304, mem);
      CHECK(r.canonical == "AMD_Instinct_MI300X");
      CHECK(r.known);
      CHECK(r.candidates == std::vector<std::string>{"AMD_Instinct_MI300X", "AMD_Radeon_Graphics"});
    }
  }
  for (int64_t mem : {256 * kGB, 256 * kGiB}) {
    CAPTURE(mem);
    CHECK(resolve_device_name("AMD Radeon Graphics", "gfx942", 304, mem).canonical == "AMD_Instinct_MI325X");
  }
  {
    auto r = resolve_device_name("AMD Radeon Graphics", "gfx942", 80, 192 * kGB);
    CHECK(r.canonical != "AMD_Instinct_MI300X");
    CHECK(r.canonical == "AMD_Instinct_MI308X");
  }
  // Unknown hardware: the generic name stays.
  CHECK(resolve_device_name("AMD Radeon Graphics").canonical == "AMD_Radeon_Graphics");
  CHECK(resolve_device_name("AMD Radeon Graphics", "gfx950", 304, 192 * kGB).canonical == "AMD_Radeon_Graphics");
  // Two names of one part.
  CHECK(resolve_device_name("AMD Instinct MI325 OAM").canonical == "AMD_Instinct_MI325X");
  CHECK(resolve_device_name("AMD Instinct MI325X").canonical == "AMD_Instinct_MI325X");
  bool known = false;
  CHECK(canonical_file_device_name("AMD_Instinct_MI325_OAM", {}, &known) == "AMD_Instinct_MI325X");
  CHECK(known);
  // vLLM's RTX PRO 6000 workstation files name a known device (they were flagged)
  known = false;
  CHECK(canonical_file_device_name("NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition", {}, &known) ==
        "NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition");
  CHECK(known);

  // Lookup: the three E=256,N=256 fp8 block [128, 128] tables live only in triton_3_1_0.
  const std::string key = "E=256,N=256,dtype=fp8_w8a8,block_shape=[128, 128]";
  const std::string tail = ",dtype=fp8_w8a8,block_shape=[128, 128].json";
  auto rt = make_runtime({moe_dir().string()});
  auto amd = [&](int32_t cus, int64_t mem, const char* dev = "AMD Radeon Graphics") {
    LookupQuery q = query(key, dev, 1);
    q.arch = cus ? "gfx942" : "";
    q.compute_units = cus;
    q.memory_bytes = mem;
    return lookup_ok(*rt, q);
  };
  // MI300X file row "1": {32, 32, 128, 16, 4, 2, waves_per_eu 0}.
  const std::string mi300x_m1 = row({{"BLOCK_SIZE_M", 32},
                                     {"BLOCK_SIZE_N", 32},
                                     {"BLOCK_SIZE_K", 128},
                                     {"GROUP_SIZE_M", 16},
                                     {"num_warps", 4},
                                     {"num_stages", 2},
                                     {"waves_per_eu", 0}});
  // AMD_Radeon_Graphics file row "1": {32, 128, 128, 1, 2, 2, waves_per_eu 0}.
  const std::string radeon_m1 = row({{"BLOCK_SIZE_M", 32},
                                     {"BLOCK_SIZE_N", 128},
                                     {"BLOCK_SIZE_K", 128},
                                     {"GROUP_SIZE_M", 1},
                                     {"num_warps", 2},
                                     {"num_stages", 2},
                                     {"waves_per_eu", 0}});
  auto r300 = amd(304, 192 * kGB);
  CHECK(r300.match == LookupResult::Match::exact);
  CHECK(r300.source == "triton_3_1_0/E=256,N=256,device_name=AMD_Instinct_MI300X" + tail);
  CHECK(config_to_json(r300.config) == mi300x_m1);
  CHECK(contains(r300.why, "hardware identity"));
  // 256 GB: the MI325X file (its row "1" equals the MI300X one; the source tells them apart).
  auto r325 = amd(304, 256 * kGB);
  CHECK(r325.source == "triton_3_1_0/E=256,N=256,device_name=AMD_Instinct_MI325X" + tail);
  CHECK(config_to_json(r325.config) == mi300x_m1);
  // 80 CUs (an MI308X, no table of its own): the generic name's table, never MI300X's.
  auto r308 = amd(80, 192 * kGB);
  CHECK(r308.source == "triton_3_1_0/E=256,N=256,device_name=AMD_Radeon_Graphics" + tail);
  CHECK(config_to_json(r308.config) == radeon_m1);
  // No hardware identity given: the generic name's table.
  auto rgen = amd(0, 0);
  CHECK(rgen.source == "triton_3_1_0/E=256,N=256,device_name=AMD_Radeon_Graphics" + tail);
  CHECK(config_to_json(rgen.config) == radeon_m1);
  // Both spellings of the MI325X reach the MI325X file.
  for (const char* dev : {"AMD Instinct MI325 OAM", "AMD Instinct MI325X"}) {
    CAPTURE(dev);
    CHECK(amd(0, 0, dev).source == "triton_3_1_0/E=256,N=256,device_name=AMD_Instinct_MI325X" + tail);
  }
}

TEST_CASE("C09 nearest-M ties do not depend on file order") {
  const fs::path src = moe_dir() / "triton_3_1_0" / "E=16,N=6400,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json";
  const std::string key = "E=16,N=6400,dtype=fp8_w8a8";
  const std::string dev = "NVIDIA H100 80GB HBM3";
  // Rows "3584" and "3840" of that file; the file lists 3840 before 3584.
  const std::string m3584 = row({{"BLOCK_SIZE_M", 64},
                                 {"BLOCK_SIZE_N", 256},
                                 {"BLOCK_SIZE_K", 64},
                                 {"GROUP_SIZE_M", 16},
                                 {"num_warps", 4},
                                 {"num_stages", 2}});
  const std::string m3840 = row({{"BLOCK_SIZE_M", 128},
                                 {"BLOCK_SIZE_N", 128},
                                 {"BLOCK_SIZE_K", 64},
                                 {"GROUP_SIZE_M", 8},
                                 {"num_warps", 4},
                                 {"num_stages", 4}});
  const std::string text = read_text(src);
  REQUIRE(text.find("\"3840\"") < text.find("\"3584\""));

  auto check = [&](const Runtime& rt) {
    auto tie = lookup_ok(rt, query(key, dev, 3712));  // exactly halfway
    CHECK(tie.match == LookupResult::Match::nearest);
    CHECK(tie.table_m == 3584);
    CHECK(config_to_json(tie.config) == m3584);
    auto up = lookup_ok(rt, query(key, dev, 3713));  // one past halfway: 3840 is nearer
    CHECK(up.table_m == 3840);
    CHECK(config_to_json(up.config) == m3840);
    auto down = lookup_ok(rt, query(key, dev, 3711));
    CHECK(down.table_m == 3584);
  };
  SUBCASE("as shipped (the only copy is in triton_3_1_0)") {
    auto rt = make_runtime({moe_dir().string()});
    check(*rt);
  }
  SUBCASE("keys re-sorted ascending and descending") {
    for (bool asc : {true, false}) {
      CAPTURE(asc);
      TempDir dir;
      write_text(dir / "triton_3_1_0" / src.filename().string(), resorted_table(src, asc));
      auto rt = make_runtime({dir.str()});
      REQUIRE(rt->load_report().files.size() == 1);
      CHECK(rt->load_report().files[0].rows == 16);
      check(*rt);
    }
  }
  SUBCASE("bounded policy: keys {1,2,4,8} at M=2048 miss") {
    TempDir dir;
    const std::string r =
        R"({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 2})";
    write_text(dir / "E=8,N=64,device_name=NVIDIA_H200.json",
               "{\"1\": " + r + ", \"2\": " + r + ", \"4\": " + r + ", \"8\": " + r + "}");
    RuntimeOptions o = options_for({dir.str()});
    o.bounded_nearest = true;  // bound_ratio 2: [1/2, 16]
    auto bounded = make_runtime(o);
    auto miss = lookup_ok(*bounded, query("E=8,N=64", "NVIDIA H200", 2048));
    CHECK(miss.match == LookupResult::Match::fallback);
    CHECK(miss.table_m == -1);
    CHECK(contains(miss.why, "outside its bounded range [1, 8]"));
    CHECK(lookup_ok(*bounded, query("E=8,N=64", "NVIDIA H200", 16)).table_m == 8);  // 8 * 2: inside
    CHECK(lookup_ok(*bounded, query("E=8,N=64", "NVIDIA H200", 17)).match == LookupResult::Match::fallback);
    // The default (unbounded) policy serves the nearest key, as SGLang does.
    auto unbounded = make_runtime({dir.str()});
    auto hit = lookup_ok(*unbounded, query("E=8,N=64", "NVIDIA H200", 2048));
    CHECK(hit.match == LookupResult::Match::nearest);
    CHECK(hit.table_m == 8);
  }
}

TEST_CASE("C10 b: a torn file is reported with its byte offset and skipped, the rest serves") {
  TempDir dir;
  const std::string f1 = "N=2304,K=7168,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json";
  const std::string f2 = "N=2304,K=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json";
  copy_data_file(quant_dir() / f1, dir / f1);
  const std::string full = read_text(quant_dir() / f2);
  REQUIRE(full.size() > 100);
  // Cut after 100 bytes: `{\n    "1": {\n        "BLOCK_SIZE_M": 64, ... "BLOCK_SIZE_K": 128,\n  `
  // ends inside the first row's object, outside any string. The parse error
  // is the end of the input: byte 100 (simdjson: "ended early in the middle
  // of an object or array"; it reports no position itself, the reader places
  // it at the truncation point).
  write_text(dir / f2, full.substr(0, 100));

  auto created = Runtime::create(options_for({dir.str()}));
  REQUIRE(created.ok());
  auto& rt = *created.value();
  const LoadReport rep = rt.load_report();
  REQUIRE(rep.files.size() == 2);
  const FileReport* torn = find_file(rep, f2);
  REQUIRE(torn != nullptr);
  CHECK(torn->state == FileReport::State::skipped);
  CHECK(torn->rows == 0);
  REQUIRE_FALSE(torn->problems.empty());
  CHECK(contains(torn->problems[0], "parse error at byte 100:"));
  CHECK(contains(rep.to_json(), "parse error at byte 100"));
  CHECK_FALSE(rep.all_usable());
  const FileReport* good = find_file(rep, f1);
  REQUIRE(good != nullptr);
  CHECK(good->state == FileReport::State::loaded);
  CHECK(good->rows == 18);

  // F1 serves: rows "1" and "4096" of the H20 file.
  auto r1 = lookup_ok(rt, query("N=2304,K=7168,dtype=fp8_w8a8,block_shape=[128,128]", "NVIDIA H20", 1));
  CHECK(r1.match == LookupResult::Match::exact);
  CHECK(config_to_json(r1.config) == row({{"BLOCK_SIZE_M", 64},
                                          {"BLOCK_SIZE_N", 64},
                                          {"BLOCK_SIZE_K", 128},
                                          {"GROUP_SIZE_M", 16},
                                          {"num_warps", 4},
                                          {"num_stages", 4}}));
  auto r2 = lookup_ok(rt, query("N=2304,K=7168,dtype=fp8_w8a8,block_shape=[128,128]", "NVIDIA H20", 100000));
  CHECK(r2.table_m == 4096);
  CHECK(config_to_json(r2.config) == row({{"BLOCK_SIZE_M", 64},
                                          {"BLOCK_SIZE_N", 64},
                                          {"BLOCK_SIZE_K", 128},
                                          {"GROUP_SIZE_M", 1},
                                          {"num_warps", 4},
                                          {"num_stages", 3}}));
  // F2's key serves nothing from the torn file.
  auto r3 = lookup_ok(rt, query("N=2304,K=7168,dtype=fp8_w8a8,block_shape=[128,128]", "NVIDIA H200", 1));
  CHECK(r3.match == LookupResult::Match::fallback);
}
