// SPDX-License-Identifier: Apache-2.0
// Issue 33, the CLI where it was silent or answered another question than
// the one asked: `lookup --env` answers what a serving process would serve
// (the KDISPATCH_* environment, the shipped configs, the tuning cache);
// `replay` says which config files apply to this host's backends; the
// misses export leaves the replay's warm-up calls out.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cli_util.hpp"
#include "dispatch/dispatch.hpp"
#include "test_util.hpp"

#ifdef KDISPATCH_CLI_PATH

using namespace dispatch;
using kdtest::CliResult;
using kdtest::run_cli;
using kdtest::TempDir;
namespace fs = std::filesystem;

namespace {

std::string dev() { return cpu_device_info().device_name; }

using kdtest::EnvScope;

// rmsnorm hidden=64 fp32 of this host's CPU: `dir` holds a row at M = `m`
// whose variant is `variant`.
void norm_table(const fs::path& dir, int64_t m, const std::string& variant) {
  kdtest::write_text(dir / ("cpu/rmsnorm/hidden=64,device_name=" + dev() + ",dtype=fp32.json"),
                     "{\"" + std::to_string(m) + "\": {\"variant\": \"" + variant + "\"}}");
}

// The text lines of `lookup` for an own-op row: what the library's lookup
// answers (`r`), as run_lookup prints it.
std::string lookup_text(const LookupResult& r, int64_t asked) {
  std::string s = "config   " + config_to_json(r.config) + "\nsource   " + r.source + "\n";
  if (!r.source_dir.empty()) s += "dir      " + r.source_dir + "\n";
  s += "match    " + std::string(match_name(r.match)) + "\n";
  s += r.table_m >= 0 ? "M        " + std::to_string(r.table_m) + " (asked " + std::to_string(asked) + ")\n"
                      : "M        - (asked " + std::to_string(asked) + ")\n";
  if (!r.variant.empty()) s += "variant  " + r.variant + "\n";
  s += "key      " + r.key + "\n";
  return s;
}

}  // namespace

TEST_CASE(
    "cli: lookup --env answers what the default runtime serves: KDISPATCH_CONFIG_DIRS, the shipped configs, "
    "KDISPATCH_FORCE") {
  TempDir dirs, shipped, cache;
  norm_table(dirs.path(), 8, "rmsnorm_fp32__ref");      // KDISPATCH_CONFIG_DIRS: M = 8
  norm_table(shipped.path(), 16, "rmsnorm_fp32__vec");  // KDISPATCH_SHIPPED_CONFIGS: M = 16
  const std::string key = "cpu/rmsnorm|" + dev() + "|dtype=fp32,hidden=64";
  const std::string file = "cpu/rmsnorm/hidden=64,device_name=" + dev() + ",dtype=fp32.json";
  const std::string env_dirs = "KDISPATCH_CONFIG_DIRS=" + dirs.str();
  const std::string env_shipped = "KDISPATCH_SHIPPED_CONFIGS=" + shipped.str();
  const auto lookup = [&](const std::string& m, std::vector<std::string> env, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"lookup", "--op", "rmsnorm", "--key", "hidden=64,dtype=fp32", "--M", m};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_cli(a, cache.str(), env);
  };

  // Without --env the environment is not read, and --configs is required.
  CliResult none = lookup("8", {env_dirs, env_shipped});
  CHECK(none.exit_code == 2);
  CHECK(none.out == "");
  CHECK(none.err ==
        "kdispatch lookup: --configs DIR is required (or --env: the KDISPATCH_* environment and the shipped configs, "
        "as a serving process loads them)\n");

  // --env: M = 8 from KDISPATCH_CONFIG_DIRS, M = 16 from the shipped dir.
  CliResult from_dirs = lookup("8", {env_dirs, env_shipped}, {"--env"});
  CHECK(from_dirs.exit_code == 0);
  CHECK(from_dirs.err == "");
  CHECK(from_dirs.out == "config   {\"variant\": \"rmsnorm_fp32__ref\"}\nsource   " + file + "\ndir      " +
                             dirs.str() +
                             "\nmatch    exact\nM        8 (asked 8)\nvariant  rmsnorm_fp32__ref\nkey      " + key +
                             "\nwhy      device '" + dev() + "' -> " + dev() + "; key " + key + "; exact M=8; from " +
                             file + "\nnote     tuned on a CPU its file does not record; not yet verified here\n");
  CliResult from_shipped = lookup("16", {env_dirs, env_shipped}, {"--env"});
  CHECK(from_shipped.exit_code == 0);
  CHECK(from_shipped.out.find("source   " + file + "\ndir      " + shipped.str() +
                              "\nmatch    exact\nM        16 "
                              "(asked 16)\nvariant  rmsnorm_fp32__vec\n") != std::string::npos);

  // KDISPATCH_FORCE: the forced plan, as the runtime serves it.
  const std::string force = "KDISPATCH_FORCE=rmsnorm=rmsnorm_fp32__vec:vec=8,unroll=2";
  CliResult forced = lookup("8", {env_dirs, env_shipped, force}, {"--env"});
  CHECK(forced.exit_code == 0);
  CHECK(forced.out ==
        "config   {\"variant\": \"rmsnorm_fp32__vec\", \"vec\": 8, \"unroll\": 2}\nsource   forced\nmatch    forced\n"
        "M        - (asked 8)\nvariant  rmsnorm_fp32__vec\nkey      " +
            key + "\nwhy      device '" + dev() + "' -> " + dev() +
            "; forced by 'rmsnorm=rmsnorm_fp32__vec:vec=8,unroll=2' (RuntimeOptions::force / KDISPATCH_FORCE): "
            "rmsnorm_fp32__vec{vec=8,unroll=2} serves every rmsnorm call with fp32 inputs, whatever the table holds\n");

  // ... which is what dispatch::lookup answers on the runtime the default
  // runtime would build from the same environment.
  {
    EnvScope env({{"KDISPATCH_CONFIG_DIRS", dirs.str().c_str()},
                  {"KDISPATCH_SHIPPED_CONFIGS", shipped.str().c_str()},
                  {"KDISPATCH_FORCE", "rmsnorm=rmsnorm_fp32__vec:vec=8,unroll=2"},
                  {"KDISPATCH_CACHE_DIR", cache.str().c_str()},
                  {"KDISPATCH_TUNE", nullptr},
                  {"KDISPATCH_LOG_LEVEL", nullptr},
                  {"KDISPATCH_BACKEND_VERSION", nullptr}});
    auto o = options_from_env();
    REQUIRE(o.ok());
    auto rt = Runtime::create(*o);
    REQUIRE(rt.ok());
    LookupQuery q;
    q.op = "rmsnorm";
    q.key = "hidden=64,dtype=fp32";
    q.M = 8;
    auto r = dispatch::lookup(**rt, q);
    REQUIRE(r.ok());
    CHECK(forced.out == lookup_text(*r, 8) + "why      " + r->why + "\n");
  }

  // Without the forced plan and the dirs: the shipped dir alone.
  CliResult shipped_only = lookup("8", {env_shipped}, {"--env", "--json"});
  CHECK(shipped_only.exit_code == 0);
  CHECK(shipped_only.out.find("\"source\": \"" + file +
                              "\", \"match\": \"nearest\", \"M\": 16, \"variant\": "
                              "\"rmsnorm_fp32__vec\",") != std::string::npos);

  // --configs with --env ranks above the environment's dirs.
  TempDir top;
  norm_table(top.path(), 8, "rmsnorm_fp32__vec");
  CliResult above = lookup("8", {env_dirs, env_shipped}, {"--env", "--configs", top.str()});
  CHECK(above.exit_code == 0);
  CHECK(above.out.find("dir      " + top.str() +
                       "\nmatch    exact\nM        8 (asked 8)\nvariant  rmsnorm_fp32__vec\n") != std::string::npos);

  // A KDISPATCH_CONFIG_DIRS dir that does not exist: said once, the rest serve.
  const std::string missing = dirs.str() + "/not-there";
  CliResult skip = lookup("8", {"KDISPATCH_CONFIG_DIRS=" + missing + ":" + dirs.str(), env_shipped}, {"--env"});
  CHECK(skip.exit_code == 0);
  CHECK(skip.err == "kdispatch: KDISPATCH_CONFIG_DIRS='" + missing + ":" + dirs.str() + "': config dir '" + missing +
                        "' does not exist; serving without it\n");
  CHECK(skip.out == from_dirs.out);

  // A malformed variable: exit 2 naming it, as the default runtime would fail.
  CliResult bad = lookup("8", {env_shipped, "KDISPATCH_FORCE=rmsnorm=no_such_variant"}, {"--env"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.out == "");
  {
    EnvScope env({{"KDISPATCH_FORCE", "rmsnorm=no_such_variant"}});
    CHECK(bad.err == "kdispatch lookup: --env: " + options_from_env().status().to_string() + "\n");
  }
  CHECK(bad.err.find("KDISPATCH_FORCE='rmsnorm=no_such_variant'") != std::string::npos);
}

TEST_CASE("cli: replay's report says which config files apply to this host's backends") {
  TempDir tree;
  const std::string other = dev() == "CPU_x86_64_AVX2" ? "CPU_x86_64_AVX512" : "CPU_x86_64_AVX2";
  kdtest::write_text(tree / ("cpu/rmsnorm/hidden=896,device_name=" + dev() + ",dtype=fp32.json"),
                     R"({"1": {"variant": "rmsnorm_fp32__ref"}})");
  kdtest::write_text(tree / ("cpu/rmsnorm/hidden=896,device_name=" + other + ",dtype=fp32.json"),
                     R"({"1": {"variant": "rmsnorm_fp32__ref"}})");
  const std::string cuda_file = "hidden=2048,device_name=NVIDIA_H200,dtype=bf16.json";
  kdtest::write_text(tree / ("cuda/rmsnorm/" + cuda_file),
                     kdtest::read_text(fs::path(KDISPATCH_SOURCE_DIR) / "configs/cuda/rmsnorm" / cuda_file));
  kdtest::write_text(tree / "E=8,N=16,device_name=NVIDIA_H200.json",
                     R"({"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, )"
                     R"("num_warps": 4, "num_stages": 2}})");
  const fs::path trace = tree / "trace.txt";
  kdtest::write_text(trace, "1\n");

  // What this host has of CUDA, as the replay asks the runtime.
  auto rt = Runtime::create(kdtest::options_for({})).value();
  auto cuda = rt->device_info(Device{DeviceType::cuda, 0});
  const std::string cuda_line = cuda.ok() && cuda->available
                                    ? "cuda: 1 file, " + std::string(cuda->device_name == "NVIDIA_H200" ? "1" : "0") +
                                          " for this host's " + cuda->device_name +
                                          ": not used by this replay (it runs on the CPU)"
                                    : "cuda: 1 file: not used by this replay (no cuda device: " +
                                          (cuda.ok() ? cuda->unavailable_reason : cuda.status().message()) + ")";

  CliResult r = run_cli({"replay", "--only-configs", tree.str(), "--trace", trace.string(), "--steps", "1", "--layers",
                         "1", "--dtype", "fp32"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const size_t at = r.out.find("configs      ");
  REQUIRE(at != std::string::npos);
  const size_t end = r.out.find("cache dir", at);
  REQUIRE(end != std::string::npos);
  CHECK(
      r.out.substr(at, end - at) ==
      "configs      4 files (0 skipped), 4 keys, no shipped configs\n"
      "             + " +
          tree.str() +
          "\n"
          "             cpu: 2 files, 1 for this host's " +
          dev() +
          ": the backend this replay runs\n"
          "             " +
          cuda_line +
          "\n"
          "             1 file of engine-kernel tables (triton_fused_moe, triton_gemm): served to lookups, not to the "
          "replay's "
          "ops\n");

  CliResult j = run_cli({"replay", "--only-configs", tree.str(), "--trace", trace.string(), "--steps", "1", "--layers",
                         "1", "--dtype", "fp32", "--json"});
  REQUIRE_MESSAGE(j.exit_code == 0, j.err);
  const std::string cuda_json =
      cuda.ok() && cuda->available
          ? "{\"files\": 1, \"this_device\": " + std::string(cuda->device_name == "NVIDIA_H200" ? "1" : "0") +
                ", \"device\": \"" + cuda->device_name + "\", \"replayed\": false}"
          : "{\"files\": 1, \"this_device\": 0, \"device\": null, \"no_device\": \"" +
                (cuda.ok() ? cuda->unavailable_reason : cuda.status().message()) + "\", \"replayed\": false}";
  CHECK(j.out.find("\"config_files_by_backend\": {\"cpu\": {\"files\": 2, \"this_device\": 1, \"device\": \"" + dev() +
                   "\", \"replayed\": true}, \"cuda\": " + cuda_json + ", \"engine_kernel_tables\": {\"files\": 1}}") !=
        std::string::npos);
}

namespace {

// The misses CSV's rows as (op, M, dims, count): the dims are the columns
// between M and accum (N, K, hidden, d), the count the column before the
// quoted key.
using MissRow = std::tuple<std::string, std::string, std::string, int64_t>;
std::vector<MissRow> miss_rows(const std::string& csv) {
  std::vector<MissRow> out;
  size_t line_start = csv.find('\n') + 1;  // after the header
  REQUIRE(csv.compare(0, line_start,
                      "op,backend,device_name,dtype,out_dtype,M,N,K,hidden,d,E,top_k,block_size,accum,bias,block_shape,"
                      "expert_map,a_scale,activation,mul_routed_weight,stride,count,key\n") == 0);
  while (line_start < csv.size()) {
    const size_t e = csv.find('\n', line_start);
    const std::string line = csv.substr(line_start, e - line_start);
    line_start = e + 1;
    std::vector<std::string> cols;
    const size_t q = line.find(",\"");
    for (size_t a = 0; a <= q;) {
      size_t c = line.find(',', a);
      if (c > q) c = q;
      cols.push_back(line.substr(a, c - a));
      a = c + 1;
    }
    REQUIRE(cols.size() == 22);
    out.emplace_back(cols[0], cols[5], cols[6] + "," + cols[7] + "," + cols[8] + "," + cols[9], std::stoll(cols[21]));
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("cli: the misses export counts the workload's calls, the warm-up's left out") {
  TempDir work, empty;
  const fs::path t1 = work / "t1.txt", t4 = work / "t4.txt";
  kdtest::write_text(t1, "1\n");
  kdtest::write_text(t4, "4\n");
  const auto misses = [&](const fs::path& trace, const std::string& layers, const std::string& csv) {
    return run_cli({"misses", "--export", csv, "--trace", trace.string(), "--steps", "1", "--layers", layers, "--dtype",
                    "fp32", "--only-configs", empty.str()});
  };
  // qwen2.5-0.5b, one layer at M = 1: each site once, the norms between
  // layers twice (post-attention, then the final norm). The warm-up (one
  // layer at M = 1) made the same calls: they are not counted.
  const std::string csv1 = (work / "m1.csv").string();
  CliResult a = misses(t1, "1", csv1);
  REQUIRE_MESSAGE(a.exit_code == 0, a.err);
  CHECK(miss_rows(kdtest::read_text(csv1)) == std::vector<MissRow>{{"fused_add_rmsnorm", "1", ",,896,", 2},
                                                                   {"gemm", "1", "1152,896,,", 1},
                                                                   {"gemm", "1", "896,4864,,", 1},
                                                                   {"gemm", "1", "896,896,,", 1},
                                                                   {"gemm", "1", "9728,896,,", 1},
                                                                   {"rmsnorm", "1", ",,896,", 1},
                                                                   {"silu_and_mul", "1", ",,,4864", 1}});
  CHECK(a.out.find("\nrmsnorm                      1         0         1        1      1\n"
                   "fused_add_rmsnorm            2         0         2        1      1\n"
                   "gemm                         4         0         4        4      4\n"
                   "silu_and_mul                 1         0         1        1      1\n") != std::string::npos);
  CHECK(
      a.out.find(
          "\nwrote " + csv1 +
          ": 7 shapes (op,backend,device_name,dtype,out_dtype,M,N,K,hidden,d,E,top_k,block_size,accum,bias,block_shape,"
          "expert_map,a_scale,activation,mul_routed_weight,stride,count,key); the warm-up's calls (one layer at M=1) "
          "left "
          "out\n") != std::string::npos);

  // Two layers at M = 4: no row at the warm-up's M = 1.
  const std::string csv4 = (work / "m4.csv").string();
  CliResult b = misses(t4, "2", csv4);
  REQUIRE_MESSAGE(b.exit_code == 0, b.err);
  CHECK(miss_rows(kdtest::read_text(csv4)) == std::vector<MissRow>{{"fused_add_rmsnorm", "4", ",,896,", 4},
                                                                   {"gemm", "4", "1152,896,,", 2},
                                                                   {"gemm", "4", "896,4864,,", 2},
                                                                   {"gemm", "4", "896,896,,", 2},
                                                                   {"gemm", "4", "9728,896,,", 2},
                                                                   {"rmsnorm", "4", ",,896,", 1},
                                                                   {"silu_and_mul", "4", ",,,4864", 2}});
  CHECK_FALSE(fs::exists(csv4 + ".warm-up"));

  // replay --export-misses: the same rows, and it says the warm-up is out.
  const std::string csv_r = (work / "r.csv").string();
  CliResult c = run_cli({"replay", "--export-misses", csv_r, "--trace", t4.string(), "--steps", "1", "--layers", "2",
                         "--dtype", "fp32", "--only-configs", empty.str()});
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  CHECK(c.err == "kdispatch replay: wrote the misses to " + csv_r + " (the warm-up's calls left out)\n");
  CHECK(miss_rows(kdtest::read_text(csv_r)) == miss_rows(kdtest::read_text(csv4)));
}

#endif  // KDISPATCH_CLI_PATH
