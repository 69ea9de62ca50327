// SPDX-License-Identifier: Apache-2.0
// Tests of the CLI's tuning commands, run through the built binary
// (KDISPATCH_CLI_PATH) as tests/test_cli.cpp does: `replay --tune
// background|sync` converges and persists, a second run with the same cache
// dir hits; `misses --export` writes the untuned-shapes CSV; `tune --shapes
// --emit` writes loadable config files and resumes; `--shard`, `--devices`
// (worker processes, a SIGKILLed worker replaced) and `merge` (issue 22).
//
// Kept small for CI on 2 cores: Qwen2.5-0.5B with a 2-entry trace file,
// --budget-ms 50, --no-cold-cache; every run uses temp dirs and its own
// cache dir (never the user's), with the KDISPATCH_* tuning variables unset.
#include <doctest/doctest.h>
#include <simdjson.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "cli_util.hpp"
#include "dispatch/device.hpp"
#include "dispatch/ops.hpp"

#ifdef KDISPATCH_CLI_PATH

namespace {

namespace fs = std::filesystem;

using CliRun = kdtest::CliResult;

struct Scratch {
  fs::path path;
  explicit Scratch(const std::string& tag) {
    path = fs::temp_directory_path() / ("kdispatch-cli-tune-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

// Runs the CLI with `args` and KDISPATCH_CACHE_DIR=`cache_dir`.
CliRun run(const std::vector<std::string>& args, const std::string& cache_dir) {
  return kdtest::run_cli(args, cache_dir);
}

std::string s(simdjson::dom::element e) { return std::string(std::string_view(e)); }

const char* const kOps[] = {"rmsnorm", "fused_add_rmsnorm", "gemm", "silu_and_mul"};

// The tiny workload: Qwen2.5-0.5B, two forward passes (M = 1 and 4).
std::vector<std::string> workload(const Scratch& dir) {
  const std::string trace = dir / "trace.txt";
  if (!fs::exists(trace)) std::ofstream(trace) << "1 4\n";
  return {"--model", "qwen2.5-0.5b", "--trace", trace, "--no-shipped-configs"};
}

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

int64_t count_json_files(const fs::path& dir) {
  int64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    n += it->is_regular_file() && it->path().extension() == ".json";
  return n;
}

}  // namespace

TEST_CASE("cli tune: replay --tune background converges, and a second run hits the persisted cache") {
  Scratch dir("bg");
  const std::string cache = dir / "cache";
  const auto base = workload(dir);

  // Run 1: from nothing (no shipped configs, empty cache), background tuning. The
  // cap is a ceiling (the run stops when converged): 40 s ran out under ASan on a
  // loaded 2-core machine (6 passes, 4 shapes pending), so 120.
  CliRun r = run(cat({"replay", "--json", "--tune", "background", "--budget-ms", "50", "--no-cold-cache",
                      "--max-seconds", "120", "--cache-dir", cache},
                     base),
                 dir / "unused-cache");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(r.out));
  simdjson::dom::element tune = doc["tune"];
  CHECK(s(tune["mode"]) == "background");
  CHECK_MESSAGE(s(tune["stop"]) == "converged", "stderr:\n" << r.err);
  CHECK(bool(tune["converged"]));
  CHECK(double(tune["seconds"]) <= 120.0 + 10.0);  // the last pass may run past the limit
  CHECK(int64_t(tune["shapes_tuned"]) > 0);
  CHECK(int64_t(tune["candidates_run"]) >= int64_t(tune["shapes_tuned"]));
  CHECK(int64_t(tune["pending"]) == 0);
  CHECK(int64_t(tune["publishes"]) > 0);
  CHECK(double(tune["tune_seconds"]) > 0.0);
  CHECK(double(tune["budget_ms"]) == 50.0);
  CHECK_FALSE(bool(tune["cold_cache"]));

  const int64_t steps = doc["steps"], passes = doc["passes"];
  CHECK(steps == 2);
  CHECK(passes >= 2);
  simdjson::dom::array pass_list = tune["passes"];
  CHECK(int64_t(pass_list.size()) == passes);
  CHECK(bool(pass_list.at(0)["baseline"]));
  const std::map<std::string, int64_t> per_step = {
      {"rmsnorm", 1}, {"fused_add_rmsnorm", 48}, {"gemm", 96}, {"silu_and_mul", 24}};
  for (const char* op : kOps) {
    CAPTURE(op);
    simdjson::dom::element o = doc["ops"][op];
    const int64_t per_pass = per_step.at(op) * steps;
    CHECK(int64_t(o["calls_per_pass"]) == per_pass);
    CHECK(int64_t(o["calls"]) == per_pass * passes);
    CHECK(int64_t(o["hits_first"]) == 0);  // nothing to hit at the start
    CHECK(int64_t(o["hits_last"]) == per_pass);
    CHECK(int64_t(o["hits_last"]) > int64_t(o["hits_first"]));
    CHECK(int64_t(o["defaults_last"]) == 0);
    CHECK(int64_t(o["tuned"]) > 0);
    CHECK(int64_t(o["tuned_shapes"]) > 0);
    CHECK(double(o["us_per_call_first"]) > 0.0);
    CHECK(double(o["us_per_call_last"]) > 0.0);
    CHECK(double(o["speedup"]) > 0.0);
    CHECK(int64_t(pass_list.at(0)["ops"][op]["hits"]) == 0);
    CHECK(int64_t(pass_list.at(static_cast<size_t>(passes - 1))["ops"][op]["hits"]) == per_pass);
  }
  CHECK(r.err.find("baseline") != std::string::npos);  // the per-pass lines go to stderr with --json
  // The winners were persisted, one file per key: 4 GEMM keys, 2 norms.
  CHECK(count_json_files(fs::path(cache) / "cpu" / "gemm") == 4);
  CHECK(count_json_files(fs::path(cache) / "cpu" / "rmsnorm") == 1);
  CHECK(count_json_files(fs::path(cache) / "cpu" / "fused_add_rmsnorm") == 1);
  CHECK(count_json_files(fs::path(cache) / "cpu" / "silu_and_mul") == 1);

  // Run 2: tuning off, same cache dir: the persisted winners serve from the start.
  CliRun r2 = run(cat({"replay", "--json", "--tune", "off", "--cache-dir", cache}, base), dir / "unused-cache");
  REQUIRE_MESSAGE(r2.exit_code == 0, r2.err);
  simdjson::dom::element doc2 = parser.parse(simdjson::padded_string(r2.out));
  CHECK(s(doc2["tune"]["mode"]) == "off");
  CHECK(s(doc2["cache_dir"]) == cache);
  for (const char* op : kOps) {
    CAPTURE(op);
    simdjson::dom::element o = doc2["ops"][op];
    CHECK(int64_t(o["hits"]) > 0);
    CHECK(int64_t(o["hits"]) == int64_t(o["calls"]));
    CHECK(int64_t(o["tuned"]) == 0);
    int64_t from_cache = 0;
    for (auto [file, n] : simdjson::dom::object(o["sources"]))
      if (std::string_view(file).rfind(cache + "/cpu/" + op + "/", 0) == 0) from_cache += int64_t(n);
    CHECK(from_cache == int64_t(o["hits"]));
  }

  // The same run through KDISPATCH_CACHE_DIR (no --cache-dir): the library's default.
  CliRun r3 = run(cat({"replay", "--json"}, base), cache);
  REQUIRE_MESSAGE(r3.exit_code == 0, r3.err);
  simdjson::dom::element doc3 = parser.parse(simdjson::padded_string(r3.out));
  CHECK(s(doc3["cache_dir"]) == cache);
  CHECK(int64_t(doc3["ops"]["gemm"]["hits"]) == int64_t(doc3["ops"]["gemm"]["calls"]));
}

TEST_CASE("cli tune: replay --tune sync tunes on the first pass after the baseline, then hits") {
  Scratch dir("sync");
  CliRun r = run(cat({"replay", "--tune", "sync", "--budget-ms", "50", "--no-cold-cache", "--max-seconds", "40",
                      "--cache-dir", dir / "cache"},
                     workload(dir)),
                 dir / "unused-cache");
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  // Text mode: the pass lines and the tuning table on stdout.
  CHECK(r.out.find("baseline: the table as it started, tuning paused") != std::string::npos);
  CHECK(r.out.find("tuned on the caller's thread") != std::string::npos);
  CHECK(r.out.find("converged after 3 passes") != std::string::npos);
  CHECK(r.out.find("us/call first") != std::string::npos);

  CliRun j = run(
      cat({"replay", "--json", "--tune", "sync", "--budget-ms", "50", "--no-cold-cache", "--cache-dir", dir / "cache2"},
          workload(dir)),
      dir / "unused-cache");
  REQUIRE_MESSAGE(j.exit_code == 0, j.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(j.out));
  CHECK(s(doc["tune"]["stop"]) == "converged");
  CHECK(int64_t(doc["passes"]) == 3);  // baseline, the tuning pass, a pass of hits only
  for (const char* op : kOps) {
    CAPTURE(op);
    simdjson::dom::element o = doc["ops"][op];
    CHECK(int64_t(o["tuned_now"]) > 0);  // calls that searched on the caller's thread
    CHECK(int64_t(o["hits_first"]) == 0);
    CHECK(int64_t(o["hits_last"]) == int64_t(o["calls_per_pass"]));
    CHECK(int64_t(doc["tune"]["passes"].at(1)["ops"][op]["defaults"]) == 0);  // a tuned call serves its winner
  }
}

TEST_CASE("cli tune: misses --export, tune --emit, validate, lookup, resume") {
  Scratch dir("offline");
  const std::string cache = dir / "cache";  // stays empty: nothing is tuned online
  const std::string csv = dir / "misses.csv";
  const auto base = workload(dir);

  // 1. The workload's misses.
  CliRun m = run(cat({"misses", "--export", csv, "--json"}, base), cache);
  REQUIRE_MESSAGE(m.exit_code == 0, m.err);
  simdjson::dom::parser parser;
  simdjson::dom::element mdoc = parser.parse(simdjson::padded_string(m.out));
  CHECK(s(mdoc["export"]) == csv);
  CHECK(int64_t(mdoc["rows"]) == 14);  // (4 GEMM keys + 2 norms + silu_and_mul) x M in {1, 4}
  CHECK(int64_t(mdoc["ops"]["gemm"]["keys"]) == 4);
  CHECK(int64_t(mdoc["ops"]["gemm"]["shapes"]) == 8);
  CHECK(int64_t(mdoc["ops"]["rmsnorm"]["shapes"]) == 2);
  CHECK(int64_t(mdoc["ops"]["fused_add_rmsnorm"]["shapes"]) == 2);
  CHECK(int64_t(mdoc["ops"]["silu_and_mul"]["shapes"]) == 2);
  CHECK(int64_t(mdoc["ops"]["silu_and_mul"]["keys"]) == 1);
  CHECK(int64_t(mdoc["ops"]["silu_and_mul"]["misses"]) == int64_t(mdoc["ops"]["silu_and_mul"]["calls"]));

  const std::string text = kdtest::read_text(csv);
  std::istringstream lines(text);
  std::string header;
  std::getline(lines, header);
  CHECK(header ==
        "op,backend,device_name,dtype,out_dtype,M,N,K,hidden,d,E,top_k,block_size,accum,bias,block_shape,expert_map,"
        "a_scale,activation,mul_routed_weight,stride,count,key");
  const std::string device = dispatch::cpu_device_info().device_name;
  std::set<std::tuple<std::string, int64_t, int64_t, int64_t, int64_t, int64_t, std::string>> got;
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string x; std::getline(ls, x, ',');) f.push_back(x);
    REQUIRE(f.size() >= 23);
    CHECK(f[1] == "cpu");
    CHECK(f[2] == device);
    CHECK(f[3] == "bf16");
    CHECK(f[4] == "bf16");
    CHECK(f[13] == "precise");      // accum (the fp8 GEMMs' field) on every row
    CHECK(f[17] == "false");        // a_scale: the moe_gemm_fp8 ops' flag, false on every other row
    CHECK(f[18].empty());           // activation: fused_moe's field, empty for the other ops
    CHECK(f[19].empty());           // mul_routed_weight: moe_gemm's
    CHECK(std::stoll(f[21]) >= 1);  // count
    // The canonical key, quoted (it holds commas).
    CHECK(f[22].rfind("\"cpu/" + f[0] + "|" + device + "|", 0) == 0);
    CHECK(line.back() == '"');
    auto num = [](const std::string& v) { return v.empty() ? int64_t(0) : int64_t(std::stoll(v)); };
    got.insert({f[0], num(f[5]), num(f[6]), num(f[7]), num(f[8]), num(f[9]), f[14]});
  }
  std::set<std::tuple<std::string, int64_t, int64_t, int64_t, int64_t, int64_t, std::string>> expected;
  for (int64_t M : {1, 4}) {
    expected.insert({"rmsnorm", M, 0, 0, 896, 0, "false"});
    expected.insert({"fused_add_rmsnorm", M, 0, 0, 896, 0, "false"});
    expected.insert({"gemm", M, 1152, 896, 0, 0, "true"});         // qkv_proj (Qwen2 has a q/k/v bias)
    expected.insert({"gemm", M, 896, 896, 0, 0, "false"});         // o_proj
    expected.insert({"gemm", M, 9728, 896, 0, 0, "false"});        // gate_up_proj
    expected.insert({"silu_and_mul", M, 0, 0, 0, 4864, "false"});  // act_fn
    expected.insert({"gemm", M, 896, 4864, 0, 0, "false"});        // down_proj
  }
  CHECK(got == expected);
  CHECK_FALSE(fs::exists(cache));  // tuning off: nothing written to the cache

  // 2. Tune the rmsnorm rows into an emit dir.
  const std::string emit = dir / "emit";
  const std::vector<std::string> tune_args = {
      "tune", "--shapes", csv, "--op", "rmsnorm", "--emit", emit, "--budget-ms", "50", "--no-cold-cache", "--json"};
  CliRun t = run(tune_args, cache);
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  simdjson::dom::element tdoc = parser.parse(simdjson::padded_string(t.out));
  CHECK(int64_t(tdoc["shapes"]) == 2);
  CHECK(int64_t(tdoc["tuned"]) == 2);
  CHECK(int64_t(tdoc["skipped"]) == 0);
  CHECK(int64_t(tdoc["failed"]) == 0);
  CHECK(double(tdoc["geomean_speedup"]) > 0.0);
  const std::string file = "cpu/rmsnorm/hidden=896,device_name=" + device + ",dtype=bf16.json";
  REQUIRE(simdjson::dom::array(tdoc["files"]).size() == 1);
  CHECK(s(tdoc["files"].at(0)) == file);
  for (simdjson::dom::element res : tdoc["results"].get_array()) {
    CHECK(s(res["status"]) == "tuned");
    CHECK(s(res["key"]) == "cpu/rmsnorm|" + device + "|dtype=bf16,hidden=896");
    CHECK(s(res["variant"]).rfind("rmsnorm_bf16__", 0) == 0);
  }
  CHECK(t.err.find("[1/2] hidden=896,bf16 M=") != std::string::npos);  // the progress lines
  // Only config files: no lock or temp files left to commit by mistake.
  for (const auto& e : fs::recursive_directory_iterator(emit))
    if (e.is_regular_file()) CHECK_MESSAGE(e.path().extension() == ".json", e.path());

  // 3. The files load cleanly and answer the lookup exactly.
  CliRun v = run({"validate", emit}, cache);
  CHECK_MESSAGE(v.exit_code == 0, v.out << v.err);
  CHECK(v.out.find("1 files: 1 loaded") != std::string::npos);
  for (const char* M : {"1", "4"}) {
    CliRun l = run(
        {"lookup", "--configs", emit, "--op", "rmsnorm", "--key", "hidden=896,dtype=bf16", "--M", M, "--json"}, cache);
    REQUIRE_MESSAGE(l.exit_code == 0, l.err);
    simdjson::dom::element ldoc = parser.parse(simdjson::padded_string(l.out));
    CHECK(s(ldoc["match"]) == "exact");
    CHECK(s(ldoc["source"]) == file);
    CHECK(s(ldoc["variant"]).rfind("rmsnorm_bf16__", 0) == 0);
    CHECK(s(ldoc["config"]["variant"]) == s(ldoc["variant"]));
  }

  // 4. A second identical run resumes: every shape is already there.
  CliRun t2 = run(tune_args, cache);
  REQUIRE_MESSAGE(t2.exit_code == 0, t2.err);
  simdjson::dom::element t2doc = parser.parse(simdjson::padded_string(t2.out));
  CHECK(int64_t(t2doc["tuned"]) == 0);
  CHECK(int64_t(t2doc["skipped_done"]) == 2);
  CHECK(int64_t(t2doc["skipped"]) == 2);
  for (simdjson::dom::element res : t2doc["results"].get_array()) CHECK(s(res["status"]) == "done");
  CHECK(t2.err.find("already in the emit dir") != std::string::npos);
  // Text mode says so too.
  CliRun t3 = run({"tune", "--shapes", csv, "--op", "rmsnorm", "--emit", emit}, cache);
  CHECK(t3.exit_code == 0);
  CHECK(t3.out.find("0 tuned, 2 skipped (2 already in") != std::string::npos);

  // 5. The emitted dir as the only configs of a replay: rmsnorm hits it, the rest misses.
  CliRun rp = run(cat({"replay", "--json", "--only-configs", emit}, base), cache);
  REQUIRE_MESSAGE(rp.exit_code == 0, rp.err);
  simdjson::dom::element rdoc = parser.parse(simdjson::padded_string(rp.out));
  simdjson::dom::element rms = rdoc["ops"]["rmsnorm"];
  CHECK(int64_t(rms["hits"]) == int64_t(rms["calls"]));
  CHECK(int64_t(rms["sources"][emit + "/" + file]) == int64_t(rms["calls"]));
  CHECK(int64_t(rdoc["ops"]["gemm"]["hits"]) == 0);

  // 6. replay --export-misses writes the same CSV format.
  const std::string csv2 = dir / "misses2.csv";
  CliRun rx = run(cat({"replay", "--json", "--export-misses", csv2, "--only-configs", emit}, base), cache);
  REQUIRE_MESSAGE(rx.exit_code == 0, rx.err);
  const std::string text2 = kdtest::read_text(csv2);
  CHECK(text2.rfind(header + "\n", 0) == 0);
  CHECK(text2.find("\nrmsnorm,") == std::string::npos);  // served by the emitted file
  CHECK(text2.find("\ngemm,") != std::string::npos);
}

TEST_CASE(
    "cli tune: --json carries each row's metadata, --list needs no --emit, a bad KDISPATCH_* is refused "
    "(walkthrough)") {
  Scratch dir("meta");
  const std::string csv = dir / "s.csv", emit = dir / "emit", cache = dir / "cache";
  std::ofstream(csv) << "M,N,K\n1,64,64\n4,64,64\n";
  // 1. The results carry what the emitted rows record: margin, A/A spread, timing, why.
  CliRun t = run({"tune", "--shapes", csv, "--op", "gemm", "--dtype", "fp32", "--emit", emit, "--budget-ms", "50",
                  "--no-cold-cache", "--margin", "0.03", "--json"},
                 cache);
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(t.out));
  const std::string file = emit + "/" + s(doc["files"].at(0));
  simdjson::dom::parser fparser;
  simdjson::dom::element table = fparser.load(file);
  int n = 0;
  for (simdjson::dom::element res : doc["results"].get_array()) {
    ++n;
    CHECK(s(res["status"]) == "tuned");
    CHECK(double(res["margin"]) == 0.03);
    CHECK(s(res["timing"]) == "cold");  // the CPU has no graph mode
    const std::string m = std::to_string(int64_t(res["M"]));
    CHECK(s(res["why"]) == s(table["kdispatch"]["why"][m]));  // word for word the row's
    const std::string why = s(res["why"]);
    CHECK((why.rfind("beat floor by ", 0) == 0 || why.rfind("floor kept: ", 0) == 0));
    CHECK(double(res["aa_spread"]) >= 0.0);
  }
  CHECK(n == 2);
  // 2. --list tunes nothing and needs no --emit; a tune without it is a usage error.
  CliRun l = run({"tune", "--shapes", csv, "--op", "gemm", "--dtype", "fp32", "--list"}, cache);
  CHECK_MESSAGE(l.exit_code == 0, l.err);
  CHECK(l.out.find("2 units") != std::string::npos);
  CliRun ne = run({"tune", "--shapes", csv, "--op", "gemm", "--dtype", "fp32"}, cache);
  CHECK(ne.exit_code == 2);
  CHECK(ne.err.find("--emit DIR is required") != std::string::npos);
  // 3. A bad KDISPATCH_* value is refused, naming it, whether or not a
  // variable tune reads is set (it was checked only then).
  ::setenv("KDISPATCH_DETERMINISTIC", "bogus", 1);
  CliRun b = run({"tune", "--shapes", csv, "--op", "gemm", "--dtype", "fp32", "--emit", dir / "emit2"}, cache);
  ::unsetenv("KDISPATCH_DETERMINISTIC");
  CHECK(b.exit_code == 2);
  CHECK(b.err.find("KDISPATCH_DETERMINISTIC='bogus'") != std::string::npos);
  CHECK(count_json_files(dir / "emit2") == 0);
}

TEST_CASE("cli tune: aiter CSVs, M,hidden lists, --max-flops and bad shape files") {
  Scratch dir("aiter");
  const std::string cache = dir / "cache";
  simdjson::dom::parser parser;

  // An aiter-style list with spaces after the commas; one shape too big for --max-flops.
  const std::string gemm_csv = dir / "untuned.csv";
  std::ofstream(gemm_csv) << "M,N,K\n1, 64, 128\n2, 64, 128\n4096, 4096, 4096\n2,64,128\n";
  const std::string emit = dir / "emit";
  CliRun g = run({"tune", "--shapes", gemm_csv, "--op", "gemm", "--emit", emit, "--budget-ms", "50", "--no-cold-cache",
                  "--max-flops", "1e8", "--json"},
                 cache);
  REQUIRE_MESSAGE(g.exit_code == 0, g.err);
  simdjson::dom::element gdoc = parser.parse(simdjson::padded_string(g.out));
  CHECK(int64_t(gdoc["shapes"]) == 3);  // the repeated row is one shape
  CHECK(int64_t(gdoc["tuned"]) == 2);
  CHECK(int64_t(gdoc["skipped_too_large"]) == 1);
  CHECK(int64_t(gdoc["failed"]) == 0);
  // --mem-gib: a norm shape whose scratch (x, y, w, their snapshots and the
  // reference copy: a few MiB at 4096 x 4096 bf16) is over a 1 MiB budget is
  // "too large here"; the small one is tuned.
  const std::string mem_csv = dir / "mem-norms.csv";
  std::ofstream(mem_csv) << "M,hidden\n1,64\n4096,4096\n";
  CliRun m = run({"tune", "--shapes", mem_csv, "--op", "rmsnorm", "--emit", dir / "emit-mem", "--budget-ms", "50",
                  "--no-cold-cache", "--mem-gib", "0.0009765625", "--json"},
                 cache);
  REQUIRE_MESSAGE(m.exit_code == 0, m.err);
  simdjson::dom::element mdoc = parser.parse(simdjson::padded_string(m.out));
  CHECK(int64_t(mdoc["tuned"]) == 1);
  CHECK(int64_t(mdoc["skipped_too_large"]) == 1);
  CHECK(run({"tune", "--shapes", mem_csv, "--op", "rmsnorm", "--emit", dir / "emit-mem", "--mem-gib", "-1"}, cache)
            .exit_code == 2);
  // --max-candidates: at least 1. (It prunes the spaces of variants with a
  // perf model, the GPU families; the CPU variants here have none.)
  CliRun mc = run(
      {"tune", "--shapes", mem_csv, "--op", "rmsnorm", "--emit", dir / "emit-mem", "--max-candidates", "-3"}, cache);
  CHECK(mc.exit_code == 2);
  CHECK(mc.err.find("--max-candidates must be >= 1, got -3") != std::string::npos);
  CliRun mc0 =
      run({"tune", "--shapes", mem_csv, "--op", "rmsnorm", "--emit", dir / "emit-mem", "--max-candidates", "0"}, cache);
  CHECK(mc0.exit_code == 2);
  CHECK(mc0.err.find("--max-candidates must be >= 1, got 0") != std::string::npos);
  // --margin: a fraction in [0, 0.5].
  for (const char* bad : {"-0.1", "-1", "0.7", "nan", "", "abc", "5%"}) {
    CAPTURE(bad);
    CliRun mg =
        run({"tune", "--shapes", mem_csv, "--op", "rmsnorm", "--emit", dir / "emit-mem", "--margin", bad}, cache);
    CHECK(mg.exit_code == 2);
    CHECK(mg.err.find("--margin must be a fraction in [0, 0.5], got ") != std::string::npos);
  }
  CliRun mc1 = run({"tune", "--shapes", mem_csv, "--op", "rmsnorm", "--emit", dir / "emit-mc", "--budget-ms", "50",
                    "--no-cold-cache", "--max-candidates", "1", "--max-flops", "1e6", "--json"},
                   cache);
  REQUIRE_MESSAGE(mc1.exit_code == 0, mc1.err);
  CHECK(int64_t(parser.parse(simdjson::padded_string(mc1.out))["tuned"]) == 1);

  CliRun l =
      run({"lookup", "--configs", emit, "--op", "gemm", "--key", "N=64,K=128,dtype=bf16", "--M", "2", "--json"}, cache);
  REQUIRE_MESSAGE(l.exit_code == 0, l.err);
  CHECK(s(parser.parse(simdjson::padded_string(l.out))["match"]) == "exact");

  // aiter's own files parse (every shape here is over a tiny --max-flops, so nothing runs).
  const std::string aiter = std::string(KDISPATCH_SHARED_DIR) + "/data/aiter-csv";
  const std::pair<const char*, int64_t> files[] = {{"/bf16_untuned_gemm.csv", 442},
                                                   {"/model_configs/llama70B_untuned_gemm.csv", 305},
                                                   {"/a8w8_bpreshuffle_untuned_gemm.csv", 32}};
  for (const auto& [f, rows] : files) {
    CAPTURE(f);
    CliRun a =
        run({"tune", "--shapes", aiter + f, "--op", "gemm", "--emit", dir / "emit-aiter", "--max-flops", "1", "--json"},
            cache);
    REQUIRE_MESSAGE(a.exit_code == 0, a.err);
    simdjson::dom::element adoc = parser.parse(simdjson::padded_string(a.out));
    CHECK(int64_t(adoc["tuned"]) == 0);
    CHECK(int64_t(adoc["failed"]) == 0);
    CHECK(int64_t(adoc["shapes"]) <= rows);  // repeated rows count once
    CHECK(int64_t(adoc["shapes"]) > rows / 2);
    CHECK(int64_t(adoc["skipped_too_large"]) == int64_t(adoc["shapes"]));
  }

  // A norm list: M,hidden; the op comes from --op.
  const std::string norm_csv = dir / "norms.csv";
  std::ofstream(norm_csv) << "M,hidden\n2, 128\n";
  CliRun n = run({"tune", "--shapes", norm_csv, "--op", "fused_add_rmsnorm", "--emit", emit, "--budget-ms", "50",
                  "--no-cold-cache", "--json"},
                 cache);
  REQUIRE_MESSAGE(n.exit_code == 0, n.err);
  simdjson::dom::element ndoc = parser.parse(simdjson::padded_string(n.out));
  CHECK(int64_t(ndoc["tuned"]) == 1);
  CHECK(count_json_files(fs::path(emit) / "cpu" / "fused_add_rmsnorm") == 1);
  CliRun v = run({"validate", emit}, cache);
  CHECK_MESSAGE(v.exit_code == 0, v.out);

  // Errors: a bad value names the file and line; a bad op; a missing file.
  const std::string bad = dir / "bad.csv";
  std::ofstream(bad) << "M,N,K\n1,64,128\n1,x,3\n";
  CliRun b = run({"tune", "--shapes", bad, "--op", "gemm", "--emit", emit}, cache);
  CHECK(b.exit_code == 2);
  CHECK(b.err.find(bad + ":3") != std::string::npos);
  CliRun o = run({"tune", "--shapes", gemm_csv, "--op", "conv9d", "--emit", emit}, cache);
  CHECK(o.exit_code == 2);
  CHECK(o.err.find("conv9d") != std::string::npos);
  CliRun nf = run({"tune", "--shapes", dir / "missing.csv", "--op", "gemm", "--emit", emit}, cache);
  CHECK(nf.exit_code == 2);
  CHECK(nf.err.find("missing.csv") != std::string::npos);
  CliRun req = run({"tune", "--op", "gemm", "--emit", emit}, cache);
  CHECK(req.exit_code == 2);
  CliRun mt = run({"replay", "--tune", "sometimes"}, cache);
  CHECK(mt.exit_code == 2);
  CliRun me = run({"misses"}, cache);  // --export is required
  CHECK(me.exit_code == 2);
  CHECK(me.err.find("--export") != std::string::npos);
}

TEST_CASE(
    "cli tune: an fp8 list's accum column tunes accum=fast into its own file beside the precise one, a bad value "
    "named") {
  Scratch dir("accum");
  const std::string cache = dir / "cache";
  const std::string device = dispatch::cpu_device_info().device_name;
  simdjson::dom::parser parser;
  const std::string csv = dir / "fp8.csv";
  std::ofstream(csv) << "M,N,K,dtype,accum\n2,64,128,fp8_e4m3fn,fast\n2,64,128,fp8_e4m3fn,precise\n";
  const std::string emit = dir / "emit";
  CliRun t = run({"tune", "--shapes", csv, "--op", "gemm_fp8_tensor", "--emit", emit, "--budget-ms", "50",
                  "--no-cold-cache", "--json"},
                 cache);
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(t.out));
  CHECK(int64_t(doc["shapes"]) == 2);
  CHECK(int64_t(doc["tuned"]) == 2);
  const fs::path dir_fp8 = fs::path(emit) / "cpu" / "gemm_fp8_tensor";
  CHECK(
      fs::exists(dir_fp8 / ("N=64,K=128,device_name=" + device + ",accum=fast,dtype=fp8_e4m3fn,out_dtype=bf16.json")));
  CHECK(fs::exists(dir_fp8 / ("N=64,K=128,device_name=" + device + ",dtype=fp8_e4m3fn,out_dtype=bf16.json")));
  CHECK(count_json_files(dir_fp8) == 2);
  const std::string bad = dir / "bad.csv";
  std::ofstream(bad) << "M,N,K,dtype,accum\n2,64,128,fp8_e4m3fn,slow\n";
  CliRun b = run({"tune", "--shapes", bad, "--op", "gemm_fp8_tensor", "--emit", emit}, cache);
  CHECK(b.exit_code == 2);
  CHECK(b.err.find(bad + ":2: accum 'slow' is not fast or precise") != std::string::npos);
}

TEST_CASE(
    "cli tune: an fp8 GEMM list without a dtype column and without --dtype tunes fp8_e4m3fn, --dtype bf16 fails the "
    "rows") {
  Scratch dir("fp8_default_dtype");
  const std::string cache = dir / "cache";
  const std::string device = dispatch::cpu_device_info().device_name;
  simdjson::dom::parser parser;
  const std::string csv = dir / "fp8.csv";
  std::ofstream(csv) << "M,N,K\n1,256,512\n";  // aiter's M,N,K: no dtype
  const std::string emit = dir / "emit";
  CliRun t = run({"tune", "--shapes", csv, "--op", "gemm_fp8_block", "--emit", emit, "--budget-ms", "50",
                  "--no-cold-cache", "--json"},
                 cache);
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(t.out));
  CHECK(int64_t(doc["tuned"]) == 1);
  CHECK(fs::exists(fs::path(emit) / "cpu" / "gemm_fp8_block" /
                   ("N=256,K=512,device_name=" + device + ",dtype=fp8_e4m3fn,out_dtype=bf16.json")));
  // An explicit --dtype is taken as given: no fp8 GEMM computes bf16 inputs
  // (refused as the op call refuses it, before any search).
  CliRun b = run({"tune", "--shapes", csv, "--op", "gemm_fp8_block", "--emit", dir / "emit_bf16", "--dtype", "bf16",
                  "--budget-ms", "50", "--no-cold-cache"},
                 cache);
  CHECK(b.exit_code == 1);
  CHECK_MESSAGE(b.err.find("N=256,K=512,bf16 M=1 FAILED: unsupported_problem: no cpu variant computes gemm_fp8_block "
                           "with bf16 inputs and bf16 output") != std::string::npos,
                b.err);
}

TEST_CASE("cli tune: --op silu_and_mul on an M,d list and on the misses CSV, rows of other ops left out") {
  Scratch dir("silu");
  const std::string cache = dir / "cache";
  simdjson::dom::parser parser;
  const std::string device = dispatch::cpu_device_info().device_name;

  // 1. An M,d list: the op from --op, the dtype from --dtype (bf16).
  const std::string csv = dir / "silu.csv";
  std::ofstream(csv) << "M,d\n1, 256\n8,256\n";
  const std::string emit = dir / "emit";
  const std::vector<std::string> args = {"tune",         "--shapes",        csv,     "--op",
                                         "silu_and_mul", "--emit",          emit,    "--budget-ms",
                                         "50",           "--no-cold-cache", "--json"};
  CliRun t = run(args, cache);
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(t.out));
  CHECK(s(doc["op"]) == "silu_and_mul");
  CHECK(int64_t(doc["shapes"]) == 2);
  CHECK(int64_t(doc["tuned"]) == 2);
  CHECK(int64_t(doc["failed"]) == 0);
  const std::string file = "cpu/silu_and_mul/d=256,device_name=" + device + ",dtype=bf16.json";
  REQUIRE(simdjson::dom::array(doc["files"]).size() == 1);
  CHECK(s(doc["files"].at(0)) == file);
  for (simdjson::dom::element res : doc["results"].get_array()) {
    CHECK(s(res["status"]) == "tuned");
    CHECK(s(res["shape"]) == "d=256,bf16");
    CHECK(s(res["key"]) == "cpu/silu_and_mul|" + device + "|d=256,dtype=bf16");
    CHECK(s(res["variant"]).rfind("silu_and_mul_bf16__", 0) == 0);
  }
  CHECK(t.err.find("[1/2] d=256,bf16 M=") != std::string::npos);  // the progress lines

  // 2. The file loads cleanly and answers the lookup exactly, at both M.
  CliRun v = run({"validate", emit}, cache);
  CHECK_MESSAGE(v.exit_code == 0, v.out << v.err);
  CHECK(v.out.find("1 files: 1 loaded") != std::string::npos);
  for (const char* M : {"1", "8"}) {
    CliRun l = run(
        {"lookup", "--configs", emit, "--op", "silu_and_mul", "--key", "d=256,dtype=bf16", "--M", M, "--json"}, cache);
    REQUIRE_MESSAGE(l.exit_code == 0, l.err);
    simdjson::dom::element ldoc = parser.parse(simdjson::padded_string(l.out));
    CHECK(s(ldoc["match"]) == "exact");
    CHECK(s(ldoc["source"]) == file);
    CHECK(s(ldoc["variant"]).rfind("silu_and_mul_bf16__", 0) == 0);
  }

  // 3. A second run resumes: both shapes are there.
  CliRun t2 = run(args, cache);
  REQUIRE_MESSAGE(t2.exit_code == 0, t2.err);
  simdjson::dom::element t2doc = parser.parse(simdjson::padded_string(t2.out));
  CHECK(int64_t(t2doc["tuned"]) == 0);
  CHECK(int64_t(t2doc["skipped_done"]) == 2);

  // 4. The workload's misses CSV (op column): its silu_and_mul rows, d=4864 at M 1 and 4.
  const std::string misses = dir / "misses.csv";
  CliRun m = run(cat({"misses", "--export", misses}, workload(dir)), cache);
  REQUIRE_MESSAGE(m.exit_code == 0, m.err);
  CHECK(m.out.find("kdispatch tune --shapes " + misses + " --op silu_and_mul --emit DIR") != std::string::npos);
  CliRun tm =
      run({"tune", "--shapes", misses, "--op", "silu_and_mul", "--emit", emit, "--budget-ms", "50", "--no-cold-cache"},
          cache);
  REQUIRE_MESSAGE(tm.exit_code == 0, tm.err);
  CHECK(tm.out.find("2 silu_and_mul shapes: 2 tuned") != std::string::npos);
  CHECK(tm.err.find("d=4864,bf16 M=1 -> silu_and_mul_bf16__") != std::string::npos);
  CHECK(tm.err.find("left out 8 rows of gemm") != std::string::npos);
  CHECK(tm.err.find("left out 2 rows of rmsnorm") != std::string::npos);
  CHECK(fs::exists(fs::path(emit) / "cpu" / "silu_and_mul" / ("d=4864,device_name=" + device + ",dtype=bf16.json")));

  // 5. Without an op column, a row belongs to --op when it has --op's dims:
  // M,d rows are left out of a gemm run, M,hidden rows out of a silu_and_mul run.
  CliRun g = run({"tune", "--shapes", csv, "--op", "gemm", "--emit", dir / "emit-g"}, cache);
  CHECK(g.exit_code == 0);
  CHECK(g.err.find("left out 2 rows of silu_and_mul") != std::string::npos);
  CHECK(g.out.find("0 gemm shapes") != std::string::npos);
  const std::string norms = dir / "norms.csv";
  std::ofstream(norms) << "M,hidden\n2,128\n";
  CliRun n = run({"tune", "--shapes", norms, "--op", "silu_and_mul", "--emit", dir / "emit-n"}, cache);
  CHECK(n.exit_code == 0);
  CHECK(n.err.find("left out 1 rows of rmsnorm/fused_add_rmsnorm (M,hidden)") != std::string::npos);
  // A row of the op without its dim names it.
  const std::string nod = dir / "no-d.csv";
  std::ofstream(nod) << "op,M,d\nsilu_and_mul,2,\n";
  CliRun nd = run({"tune", "--shapes", nod, "--op", "silu_and_mul", "--emit", dir / "emit-n"}, cache);
  CHECK(nd.exit_code == 0);
  CHECK(nd.err.find(nod + ":2: a silu_and_mul row needs d >= 1") != std::string::npos);
  // An unknown --op names the ops of the list.
  CliRun bad = run({"tune", "--shapes", csv, "--op", "silu", "--emit", dir / "emit-n"}, cache);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--op 'silu' is not ") != std::string::npos);
  for (const dispatch::OpInfo& op : dispatch::op_list())
    CHECK_MESSAGE(bad.err.find(std::string(op.name)) != std::string::npos, op.name);
}

// ---- shards (issue 22): units (key, M), XXH3-64 of the versioned unit text mod n

namespace {

/// The units a `tune --list` printed: "<label> M=<m> unit=<hash>" lines.
std::vector<std::string> listed_units(const std::string& out) {
  std::vector<std::string> u;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.find(" unit=") != std::string::npos) u.push_back(line);
  std::sort(u.begin(), u.end());
  return u;
}

/// Unsets every launcher variable `--shard auto` reads (the test's own environment may have some).
void clear_launcher_env() {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
                        "SLURM_ARRAY_TASK_MIN", "JOB_COMPLETION_INDEX", "KDISPATCH_SHARD_COUNT"})
    ::unsetenv(v);
}

}  // namespace

TEST_CASE("cli tune: --shard i/n splits the units by their hash, the same for any row order, union = all") {
  Scratch dir("shard");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  // 12 units: 3 (N, K) x 4 Ms; the second file has the same rows reversed.
  const std::string a = dir / "a.csv", b = dir / "b.csv";
  {
    std::ofstream fa(a), fb(b);
    fa << "M,N,K\n";
    fb << "M,N,K\n";
    std::vector<std::string> rows;
    for (const char* nk : {"64,64", "128,64", "64,256"})
      for (int m : {1, 2, 8, 33}) rows.push_back(std::to_string(m) + "," + nk);
    for (const auto& r : rows) fa << r << "\n";
    for (auto it = rows.rbegin(); it != rows.rend(); ++it) fb << *it << "\n";
  }
  const auto list = [&](const std::string& csv, const std::string& shard) {
    std::vector<std::string> args = {"tune", "--shapes", csv,          "--op",   "gemm",        "--dtype",
                                     "fp32", "--emit",   dir / "emit", "--list", "--budget-ms", "100"};
    if (!shard.empty()) args.insert(args.end(), {"--shard", shard});
    CliRun r = run(args, cache);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    return r;
  };
  const CliRun all = list(a, "");
  const std::vector<std::string> every = listed_units(all.out);
  REQUIRE(every.size() == 12);
  CHECK(all.out.find("12 units, estimated 7 s (0.1 s search + ~0.5 s confirmation each; units the emit dir holds are "
                     "counted too)") != std::string::npos);
  // The documented unit text and hash, pinned: XXH3-64 of
  // "kdispatch-unit-v1|gemm|N=64,K=64,dtype=fp32|M=1" (seed 0).
  CHECK(std::find(every.begin(), every.end(), "N=64,K=64,fp32 M=1 unit=58a85846d3e06d5f") != every.end());
  std::vector<std::string> joined;
  for (int i = 0; i < 3; ++i) {
    const std::string shard = std::to_string(i) + "/3";
    const CliRun ra = list(a, shard), rb = list(b, shard);
    const auto ua = listed_units(ra.out), ub = listed_units(rb.out);
    CHECK(ua == ub);  // the row order does not move a unit between shards
    CHECK(ra.err.find("shard " + std::to_string(i) + "/3 from --shard " + shard + ": " + std::to_string(ua.size()) +
                      " of 12 units") != std::string::npos);
    for (const auto& u : ua) {
      const uint64_t h = std::stoull(u.substr(u.find("unit=") + 5), nullptr, 16);
      CHECK(h % 3 == uint64_t(i));
    }
    joined.insert(joined.end(), ua.begin(), ua.end());
  }
  std::sort(joined.begin(), joined.end());
  CHECK(joined == every);  // every unit in exactly one shard

  // Bad values name themselves.
  for (const char* bad : {"3/3", "1", "a/2", "-1/2", "0/0"}) {
    CliRun r = run(
        {"tune", "--shapes", a, "--op", "gemm", "--dtype", "fp32", "--emit", dir / "emit", "--list", "--shard", bad},
        cache);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find(std::string("--shard ") + bad) != std::string::npos);
  }
}

TEST_CASE("cli tune: --shard auto reads torchrun, Slurm array and Kubernetes indexed Job variables and says which") {
  Scratch dir("shard_auto");
  const std::string cache = dir / "cache";
  const std::string csv = dir / "s.csv";
  std::ofstream(csv) << "M,N,K\n1,64,64\n2,64,64\n4,64,64\n8,64,64\n";
  const std::vector<std::string> args = {"tune", "--shapes", csv,          "--op",   "gemm",    "--dtype",
                                         "fp32", "--emit",   dir / "emit", "--list", "--shard", "auto"};
  clear_launcher_env();
  CliRun none = run(args, cache);
  CHECK(none.exit_code == 2);
  CHECK(none.err.find("no launcher variables found") != std::string::npos);

  ::setenv("SLURM_ARRAY_TASK_ID", "5", 1);
  ::setenv("SLURM_ARRAY_TASK_MIN", "4", 1);
  ::setenv("SLURM_ARRAY_TASK_COUNT", "2", 1);
  CliRun slurm = run(args, cache);
  CHECK_MESSAGE(slurm.exit_code == 0, slurm.err);
  CHECK(slurm.err.find("shard 1/2 from Slurm array (SLURM_ARRAY_TASK_ID=5, SLURM_ARRAY_TASK_MIN=4, "
                       "SLURM_ARRAY_TASK_COUNT=2)") != std::string::npos);

  // torchrun wins over Slurm (srun launching torchrun); LOCAL_RANK is the device, --device must agree.
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  CliRun tr = run(args, cache);
  CHECK_MESSAGE(tr.exit_code == 0, tr.err);
  CHECK(tr.err.find("shard 0/2 from torchrun (RANK=0, WORLD_SIZE=2)") != std::string::npos);
  ::setenv("LOCAL_RANK", "1", 1);
  // On a GPU backend the device is LOCAL_RANK (refused before any device is
  // opened, so this runs on a CPU-only build too); the CPU has one device.
  CliRun dev = run(cat(args, {"--device", "0", "--backend", "cuda"}), cache);
  CHECK(dev.exit_code == 2);
  CHECK(dev.err.find("--device 0 under torchrun: each process tunes on its LOCAL_RANK (1)") != std::string::npos);
  // The two torchrun shards together are the whole list.
  const auto u0 = listed_units(tr.out);
  ::setenv("RANK", "1", 1);
  CliRun tr1 = run(args, cache);
  const auto u1 = listed_units(tr1.out);
  CHECK(u0.size() + u1.size() == 4);

  clear_launcher_env();
  ::setenv("JOB_COMPLETION_INDEX", "1", 1);
  CliRun k8s_nocount = run(args, cache);
  CHECK(k8s_nocount.exit_code == 2);
  CHECK(k8s_nocount.err.find("KDISPATCH_SHARD_COUNT is not") != std::string::npos);
  ::setenv("KDISPATCH_SHARD_COUNT", "2", 1);
  CliRun k8s = run(args, cache);
  CHECK_MESSAGE(k8s.exit_code == 0, k8s.err);
  CHECK(k8s.err.find("shard 1/2 from Kubernetes indexed Job (JOB_COMPLETION_INDEX=1, KDISPATCH_SHARD_COUNT=2)") !=
        std::string::npos);
  CHECK(listed_units(k8s.out) == u1);  // index 1 of 2 is the same shard whatever the launcher
  clear_launcher_env();
}

TEST_CASE("cli tune: shards run one after the other into one emit dir tune every unit once, then resume finds all") {
  Scratch dir("shard_run");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  const std::string csv = dir / "s.csv";
  std::ofstream(csv) << "M,hidden\n1,64\n4,64\n16,64\n1,128\n4,128\n16,128\n";
  const std::string emit = dir / "emit";
  int tuned = 0;
  for (const char* shard : {"0/2", "1/2"}) {
    CliRun r = run({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", emit, "--budget-ms", "20",
                    "--no-cold-cache", "--shard", shard, "--json"},
                   cache);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    simdjson::dom::parser p;
    simdjson::dom::element doc = p.parse(simdjson::padded_string(r.out));
    CHECK(int64_t(doc["skipped_done"]) == 0);  // no unit of shard 1 was tuned by shard 0
    tuned += int(int64_t(doc["tuned"]));
  }
  CHECK(tuned == 6);
  CliRun whole = run({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", emit, "--budget-ms",
                      "20", "--no-cold-cache", "--json"},
                     cache);
  REQUIRE_MESSAGE(whole.exit_code == 0, whole.err);
  simdjson::dom::parser p;
  simdjson::dom::element doc = p.parse(simdjson::padded_string(whole.out));
  CHECK(int64_t(doc["tuned"]) == 0);
  CHECK(int64_t(doc["skipped_done"]) == 6);
}

// ---- --devices (issue 22): one worker process per device, one queue, largest first

namespace {

/// A tune --json run's results: "<shape> M=<m>" -> the result object, each unit once (a
/// second entry for a unit fails the test).
std::map<std::string, simdjson::dom::element> results_by_unit(simdjson::dom::element doc) {
  std::map<std::string, simdjson::dom::element> u;
  for (simdjson::dom::element r : simdjson::dom::array(doc["results"])) {
    const std::string name = s(r["shape"]) + " M=" + std::to_string(int64_t(r["M"]));
    CHECK_MESSAGE(u.emplace(name, r).second, "unit listed twice: " << name);
  }
  return u;
}

/// The rows of an emit dir: "<file name> M=<m>" for every M key of every config file.
std::set<std::string> emit_rows(const fs::path& emit) {
  std::set<std::string> rows;
  simdjson::dom::parser p;
  for (auto& e : fs::recursive_directory_iterator(emit)) {
    if (!e.is_regular_file() || e.path().extension() != ".json") continue;
    simdjson::dom::element doc = p.parse(simdjson::padded_string(kdtest::read_text(e.path())));
    for (auto [k, v] : simdjson::dom::object(doc))
      if (k != "kdispatch") rows.insert(e.path().filename().string() + " M=" + std::string(k));
  }
  return rows;
}

/// Sets KDISPATCH_TEST_WORKER_DIE_AT for the runs of one scope.
struct DieAt {
  explicit DieAt(const char* v) { ::setenv("KDISPATCH_TEST_WORKER_DIE_AT", v, 1); }
  ~DieAt() { ::unsetenv("KDISPATCH_TEST_WORKER_DIE_AT"); }
};

}  // namespace

TEST_CASE("cli tune: --devices all with 2 workers on the CPU tunes the units of one process, each once, no row lost") {
  Scratch dir("devices");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  ::unsetenv("KDISPATCH_TEST_WORKER_DIE_AT");
  // 24 units in 2 files (keys): both workers write rows (different M) into the same files.
  const std::string csv = dir / "s.csv";
  {
    std::ofstream f(csv);
    f << "M,hidden\n";
    for (int hidden : {64, 128})
      for (int m : {1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48}) f << m << "," << hidden << "\n";
  }
  const auto tune = [&](const std::string& emit, std::vector<std::string> extra) {
    return run(cat({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", emit, "--budget-ms", "20",
                    "--no-cold-cache"},
                   extra),
               cache);
  };
  simdjson::dom::parser p1, p2;
  CliRun one = tune(dir / "one", {"--json"});
  REQUIRE_MESSAGE(one.exit_code == 0, one.err);
  simdjson::dom::element d1 = p1.parse(simdjson::padded_string(one.out));
  CliRun two = tune(dir / "two", {"--devices", "all", "--workers-per-device", "2", "--json"});
  REQUIRE_MESSAGE(two.exit_code == 0, two.err);
  simdjson::dom::element d2 = p2.parse(simdjson::padded_string(two.out));
  CHECK(int64_t(d1["tuned"]) == 24);
  CHECK(int64_t(d2["tuned"]) == 24);
  CHECK(int64_t(d2["failed"]) == 0);
  CHECK(int64_t(d2["skipped"]) == 0);

  // The same units as the single process, each tuned once, by worker 0 or 1 on device 0.
  const auto u1 = results_by_unit(d1), u2 = results_by_unit(d2);
  REQUIRE(u1.size() == 24);
  REQUIRE(u2.size() == 24);
  std::map<int64_t, int64_t> per_worker;
  std::map<std::string, std::set<int64_t>> workers_of_shape;
  for (const auto& [name, r] : u2) {
    CAPTURE(name);
    CHECK(u1.count(name) == 1);
    CHECK(s(r["status"]) == "tuned");
    CHECK(int64_t(r["attempts"]) == 1);
    CHECK(int64_t(r["device"]) == 0);
    // the row's metadata came through the worker's result line
    CHECK(s(r["timing"]) == "cold");
    CHECK(double(r["margin"]) == 0.02);
    CHECK(!s(r["why"]).empty());
    const int64_t w = int64_t(r["worker"]);
    CHECK((w == 0 || w == 1));
    ++per_worker[w];
    workers_of_shape[s(r["shape"])].insert(w);
  }
  // The summary's per-worker counts agree with the results; no restarts.
  simdjson::dom::array workers = d2["workers"];
  REQUIRE(workers.size() == 2);
  int64_t sum = 0;
  for (simdjson::dom::element w : workers) {
    CHECK(int64_t(w["device"]) == 0);
    CHECK(int64_t(w["restarts"]) == 0);
    CHECK(int64_t(w["units"]) == per_worker[int64_t(w["worker"])]);
    CHECK(int64_t(w["units"]) >= 1);  // both workers pulled units from the queue
    sum += int64_t(w["units"]);
  }
  CHECK(sum == 24);
  CHECK(two.err.find("] worker 0 (cpu:0): ") != std::string::npos);
  CHECK(two.err.find("] worker 1 (cpu:0): ") != std::string::npos);
  // The queue holds the units largest first (flops: M * hidden here), ties in the list's order.
  std::vector<std::pair<int64_t, std::string>> queue(24);
  for (const auto& [name, r] : u2) {
    const int64_t q = int64_t(r["queue_index"]);
    REQUIRE((q >= 0 && q < 24));
    queue[size_t(q)] = {int64_t(r["M"]) * (s(r["shape"]).find("hidden=128") == 0 ? 128 : 64), name};
  }
  for (size_t i = 1; i < queue.size(); ++i) {
    CAPTURE(queue[i].second);
    CHECK(queue[i - 1].first >= queue[i].first);
  }
  CHECK(queue[0].second == "hidden=128,fp32 M=48");
  CHECK(queue[2].second == "hidden=64,fp32 M=48");  // 3072 flops, before hidden=128 M=24 (3072): the list's order

  // The emit dir holds every row of the single run: the workers' writes to
  // one file (different M of one key) merge under the file's lock.
  const std::set<std::string> rows1 = emit_rows(dir / "one"), rows2 = emit_rows(dir / "two");
  CHECK(rows1.size() == 24);
  CHECK(rows2 == rows1);
  bool shared_file = false;
  for (const auto& [shape, ws] : workers_of_shape) shared_file |= ws.size() == 2;
  CHECK(shared_file);  // at least one file got rows from both workers
  CliRun v = run({"validate", dir / "two"}, cache);
  CHECK_MESSAGE(v.exit_code == 0, v.out << v.err);

  // Resumable: a second run finds every unit in the emit dir, starts no worker.
  CliRun again = tune(dir / "two", {"--devices", "0", "--workers-per-device", "2"});
  REQUIRE_MESSAGE(again.exit_code == 0, again.err);
  CHECK(again.out.find("24 rmsnorm shapes: 0 tuned, 24 skipped (24 already in") != std::string::npos);
  CHECK(again.out.find("worker 0 (cpu:0): 0 units, 0.00 s tuning, not started") != std::string::npos);
  CHECK(again.out.find("wall time ") != std::string::npos);
}

TEST_CASE("cli tune: --devices, a worker killed by SIGKILL is replaced and its unit retried once, twice is failed") {
  Scratch dir("devices_kill");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  // 6 units, largest first: queue index 0 is M=32, 1 is M=16, 2 is M=8.
  const std::string csv = dir / "s.csv";
  std::ofstream(csv) << "M,hidden\n1,64\n2,64\n4,64\n8,64\n16,64\n32,64\n";
  const auto tune = [&](const std::string& emit) {
    return run({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", emit, "--budget-ms", "20",
                "--no-cold-cache", "--devices", "0", "--workers-per-device", "2", "--json"},
               cache);
  };
  const auto restarts = [](simdjson::dom::element doc) {
    int64_t n = 0, units = 0;
    for (simdjson::dom::element w : simdjson::dom::array(doc["workers"])) {
      n += int64_t(w["restarts"]);
      units += int64_t(w["units"]);
    }
    CHECK(units == 6);  // the workers' counts hold each unit once, retried or not
    return n;
  };
  simdjson::dom::parser pa, pb, pc, pd;
  {
    // The worker handed M=8 dies (SIGKILL) on its first attempt: a new worker tunes it.
    DieAt hook("2");
    CliRun r = tune(dir / "once");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    simdjson::dom::element doc = pa.parse(simdjson::padded_string(r.out));
    CHECK(int64_t(doc["tuned"]) == 6);
    CHECK(int64_t(doc["failed"]) == 0);
    const auto u = results_by_unit(doc);
    REQUIRE(u.size() == 6);
    for (const auto& [name, res] : u) {
      CAPTURE(name);
      CHECK(s(res["status"]) == "tuned");
      CHECK(int64_t(res["attempts"]) == (name == "hidden=64,fp32 M=8" ? 2 : 1));
    }
    CHECK(int64_t(u.at("hidden=64,fp32 M=8")["queue_index"]) == 2);
    CHECK(restarts(doc) == 1);
    CHECK(r.err.find("killed by signal 9") != std::string::npos);
    CHECK(r.err.find("while tuning hidden=64,fp32 M=8: the unit is retried on a new worker") != std::string::npos);
    CHECK(emit_rows(dir / "once").size() == 6);
  }
  {
    // It dies on every attempt: reported failed after the second, the other units tuned, exit 1.
    DieAt hook("2:always");
    CliRun r = tune(dir / "always");
    CHECK(r.exit_code == 1);
    simdjson::dom::element doc = pb.parse(simdjson::padded_string(r.out));
    CHECK(int64_t(doc["tuned"]) == 5);
    CHECK(int64_t(doc["failed"]) == 1);
    const auto u = results_by_unit(doc);
    REQUIRE(u.count("hidden=64,fp32 M=8") == 1);
    simdjson::dom::element bad = u.at("hidden=64,fp32 M=8");
    CHECK(s(bad["status"]) == "failed");
    CHECK(int64_t(bad["attempts"]) == 2);
    CHECK(s(bad["message"]).find("its worker died on both attempts (the last killed by signal 9") == 0);
    // Two deaths; the second worker is replaced only when units still wait.
    const int64_t n = restarts(doc);
    CHECK((n == 1 || n == 2));
    size_t deaths = 0;
    for (size_t at = 0; (at = r.err.find("killed by signal 9", at)) != std::string::npos; ++at) ++deaths;
    CHECK(deaths == 2);
    CHECK(r.err.find("while tuning hidden=64,fp32 M=8, its second attempt: the unit failed") != std::string::npos);
    const std::set<std::string> rows = emit_rows(dir / "always");
    CHECK(rows.size() == 5);
    for (const std::string& row : rows) CHECK(row.find(" M=8") == std::string::npos);
  }
  {
    // Resuming that emit dir (no hook) tunes only the failed unit.
    CliRun r = tune(dir / "always");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    simdjson::dom::element doc = pc.parse(simdjson::padded_string(r.out));
    CHECK(int64_t(doc["tuned"]) == 1);
    CHECK(int64_t(doc["skipped_done"]) == 5);
    CHECK(s(results_by_unit(doc).at("hidden=64,fp32 M=8")["status"]) == "tuned");
    CHECK(emit_rows(dir / "always").size() == 6);
  }
  {
    // A sticky device error (simulated on M=16) ends the worker too: a new one retries the unit.
    DieAt hook("1:sticky");
    CliRun r = tune(dir / "sticky");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    simdjson::dom::element doc = pd.parse(simdjson::padded_string(r.out));
    CHECK(int64_t(doc["tuned"]) == 6);
    CHECK(int64_t(results_by_unit(doc).at("hidden=64,fp32 M=16")["attempts"]) == 2);
    // The retiring worker's slot is refilled only while units wait: when the
    // other worker takes the retried unit and the last ones before the exit
    // is read (the clean-clone asan run, 1 in 2), no new process starts.
    const int64_t n = restarts(doc);
    CHECK((n == 0 || n == 1));
    CHECK(r.err.find("hidden=64,fp32 M=16 FAILED: backend_error: a simulated sticky device error") !=
          std::string::npos);
    CHECK(r.err.find("(a sticky device error: retried on a new worker)") != std::string::npos);
  }
}

TEST_CASE(
    "cli tune: --devices, a worker hung past --unit-timeout-s is killed and its unit retried once, twice is failed") {
  Scratch dir("devices_hang");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  // 4 units, largest first: queue index 1 is M=4.
  const std::string csv = dir / "s.csv";
  std::ofstream(csv) << "M,hidden\n1,64\n2,64\n4,64\n8,64\n";
  const auto tune = [&](const std::string& emit) {
    return run({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", emit, "--budget-ms", "20",
                "--no-cold-cache", "--devices", "0", "--workers-per-device", "2", "--unit-timeout-s", "1.5", "--json"},
               cache);
  };
  simdjson::dom::parser pa, pb;
  {
    // The worker handed M=4 hangs on its first attempt: killed after 1.5 s, a new worker tunes it.
    DieAt hook("1:hang");
    CliRun r = tune(dir / "once");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    simdjson::dom::element doc = pa.parse(simdjson::padded_string(r.out));
    CHECK(int64_t(doc["tuned"]) == 4);
    const auto u = results_by_unit(doc);
    REQUIRE(u.size() == 4);
    for (const auto& [name, res] : u) {
      CAPTURE(name);
      CHECK(s(res["status"]) == "tuned");
      CHECK(int64_t(res["attempts"]) == (name == "hidden=64,fp32 M=4" ? 2 : 1));
    }
    CHECK(r.err.find("ran hidden=64,fp32 M=4 past --unit-timeout-s 1.5: killed") != std::string::npos);
    CHECK(r.err.find("killed past --unit-timeout-s 1.5 while tuning hidden=64,fp32 M=4: the unit is retried on a new "
                     "worker") != std::string::npos);
    CHECK(emit_rows(dir / "once").size() == 4);
  }
  {
    // It hangs on every attempt: failed after the second, the others tuned, exit 1.
    DieAt hook("1:hang-always");
    CliRun r = tune(dir / "always");
    CHECK(r.exit_code == 1);
    simdjson::dom::element doc = pb.parse(simdjson::padded_string(r.out));
    CHECK(int64_t(doc["tuned"]) == 3);
    CHECK(int64_t(doc["failed"]) == 1);
    simdjson::dom::element bad = results_by_unit(doc).at("hidden=64,fp32 M=4");
    CHECK(s(bad["status"]) == "failed");
    CHECK(int64_t(bad["attempts"]) == 2);
    CHECK(s(bad["message"]) == "its worker died on both attempts (the last killed past --unit-timeout-s 1.5)");
    CHECK(emit_rows(dir / "always").size() == 3);
  }
}

namespace {

/// Runs the CLI as run() does, under `timeout -s KILL <limit_s>` (exit code
/// 137: the run did not end by itself); then SIGKILLs the hooked hung
/// workers listed in `pid_file` (a worker the hook hangs never exits alone).
CliRun run_bounded(const std::vector<std::string>& args, const std::string& cache_dir, int limit_s,
                   const std::string& pid_file) {
  const std::string err_file = pid_file + ".stderr";
  std::string cmd =
      "env -u KDISPATCH_TUNE -u KDISPATCH_CONFIG_DIRS -u KDISPATCH_TUNE_BUDGET_MS -u KDISPATCH_LOG_LEVEL "
      "KDISPATCH_CACHE_DIR=" +
      kdtest::shell_quote(cache_dir) + " KDISPATCH_TEST_WORKER_HANG_PIDS=" + kdtest::shell_quote(pid_file) +
      " timeout -s KILL " + std::to_string(limit_s) + " " + kdtest::shell_quote(KDISPATCH_CLI_PATH);
  for (const auto& a : args) cmd += " " + kdtest::shell_quote(a);
  cmd += " 2>" + kdtest::shell_quote(err_file);
  CliRun out;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.out.append(buf, n);
  const int status = ::pclose(p);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  out.err = kdtest::read_text(err_file);
  std::ifstream pids(pid_file);
  for (long pid; pids >> pid;)
    if (pid > 1) ::kill(static_cast<pid_t>(pid), SIGKILL);
  return out;
}

/// The 4-unit rmsnorm list (M = 1, 2, 4, 8; queue index 1 is M = 4) tuned
/// into <dir>/emit by `--devices 0` with 2 workers and --unit-timeout-s 1.5,
/// under run_bounded's 30 s limit (hooked workers listed in <dir>/pids).
CliRun run_devices_hooked(const Scratch& dir, const std::string& cache) {
  const std::string csv = dir / "s.csv";
  std::ofstream(csv) << "M,hidden\n1,64\n2,64\n4,64\n8,64\n";
  return run_bounded(
      {"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", dir / "emit", "--budget-ms", "20",
       "--no-cold-cache", "--devices", "0", "--workers-per-device", "2", "--unit-timeout-s", "1.5", "--json"},
      cache, 30, dir / "pids");
}

}  // namespace

// Attack (b3fb5de): --unit-timeout-s bounds a unit, not a worker's start-up:
// a worker hung before 'ready' (a wedged GPU's cuInit or context creation,
// e.g. the new worker started on the device whose kernel hung) keeps
// `started_` false, so no worker gets a unit and poll() waits forever.
TEST_CASE("cli tune: --devices, a worker hung before 'ready' does not stall the run (attack)") {
  Scratch dir("devices_hang_start");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  ::unsetenv("KDISPATCH_TEST_WORKER_DIE_AT");
  ::setenv("KDISPATCH_TEST_WORKER_HANG_START", (dir / "hang_start").c_str(), 1);
  CliRun r = run_devices_hooked(dir, cache);
  ::unsetenv("KDISPATCH_TEST_WORKER_HANG_START");
  INFO(r.err);
  CHECK(fs::exists(dir / "hang_start"));  // the hook fired
  CHECK_MESSAGE(r.exit_code != 137, "the run hung (killed by timeout after 30 s)");
  CHECK(r.exit_code == 0);
  CHECK(emit_rows(dir / "emit").size() == 4);
}

// Attack (b3fb5de): a worker retiring after a sticky error (unit -1) has no
// deadline; one whose exit hangs (the context teardown of a faulted GPU)
// is waited for forever by stop() at the end of the run.
TEST_CASE("cli tune: --devices, a retiring worker whose exit hangs does not stall the run's end (attack)") {
  Scratch dir("devices_hang_exit");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  DieAt hook("1:sticky-hang");
  CliRun r = run_devices_hooked(dir, cache);
  INFO(r.err);
  CHECK(fs::exists(dir / "pids"));  // the hook fired
  CHECK_MESSAGE(r.exit_code != 137, "the run hung (killed by timeout after 30 s)");
  CHECK(r.exit_code == 0);
  CHECK(emit_rows(dir / "emit").size() == 4);
}

// Attack: ended() waited for a worker whose result pipe ended with a
// blocking waitpid: a process that closes its pipe but does not exit (or one
// SIGKILL cannot end: stuck in the GPU driver) stalled the whole run.
TEST_CASE("cli tune: --devices, a worker that closes its pipe but does not exit is killed, its unit retried") {
  Scratch dir("devices_close_hang");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  DieAt hook("1:close-hang");  // queue index 1: M=4
  CliRun r = run_devices_hooked(dir, cache);
  INFO(r.err);
  CHECK(fs::exists(dir / "pids"));  // the hook fired
  CHECK_MESSAGE(r.exit_code != 137, "the run hung (killed by timeout after 30 s)");
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("closed its pipe and did not exit: killed while tuning hidden=64,fp32 M=4: the unit is retried on "
                   "a new worker") != std::string::npos);
  CHECK(emit_rows(dir / "emit").size() == 4);
}

// Attack (1d58e34): a worker killed past --unit-timeout-s was waited for by
// its result pipe's EOF alone, with no deadline: a process whose pipe outlives
// the SIGKILL (state D in the GPU driver: a thread that never leaves the
// kernel keeps every fd open; here a child holding fd 3) stalled the run in
// poll() forever. Hook <i>:hold-hang: the worker forks a child that keeps
// its result pipe open, then both hang.
TEST_CASE("cli tune: --devices, a killed worker whose result pipe stays open does not stall the run (attack)") {
  Scratch dir("devices_hold_hang");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  DieAt hook("1:hold-hang");  // queue index 1: M=4
  CliRun r = run_devices_hooked(dir, cache);
  INFO(r.err);
  {
    std::ifstream pids(dir / "pids");
    int n = 0;
    for (long pid; pids >> pid;) ++n;
    CHECK(n == 2);  // the hook fired: the worker and the child holding its pipe
  }
  CHECK_MESSAGE(r.exit_code != 137, "the run hung (killed by timeout after 30 s)");
  CHECK(r.exit_code == 0);
  CHECK(r.err.find("ran hidden=64,fp32 M=4 past --unit-timeout-s 1.5: killed") != std::string::npos);
  CHECK(r.err.find("killed past --unit-timeout-s 1.5 (its result pipe stayed open) while tuning hidden=64,fp32 M=4: "
                   "the unit is retried on a new worker") != std::string::npos);
  CHECK(emit_rows(dir / "emit").size() == 4);
}

TEST_CASE("cli tune: --devices refuses --device, duplicates, absent ordinals, bad lists and torchrun") {
  Scratch dir("devices_refused");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  ::unsetenv("TORCHELASTIC_RUN_ID");
  const std::string csv = dir / "s.csv";
  std::ofstream(csv) << "M,hidden\n1,64\n";
  const std::vector<std::string> base = {"tune", "--shapes", csv,          "--op",        "rmsnorm", "--dtype",
                                         "fp32", "--emit",   dir / "emit", "--budget-ms", "20",      "--no-cold-cache"};
  const auto refused = [&](const std::vector<std::string>& extra, const std::string& message) {
    CAPTURE(message);
    CliRun r = run(cat(base, extra), cache);
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(r.err.find(message) != std::string::npos, r.err);
  };
  refused({"--devices", "0", "--device", "0"}, "--devices and --device: give one");
  refused({"--devices", "0,0"},
          "--devices 0,0: device 0 is listed twice (for several workers on one device: "
          "--workers-per-device N)");
  refused({"--devices", "1"},
          "--devices 1 (--backend cpu): device 1 is not present: unsupported_device: cpu device 1 "
          "does not exist");
  refused({"--devices", "0,1"}, "device 1 is not present");
  refused({"--devices", "x"}, "--devices x: expected all or device ordinals separated by commas (e.g. 0,1), got 'x'");
  refused({"--devices", "0,,1"}, "got ''");
  refused({"--devices", "-1"}, "got '-1'");
  refused({"--devices", ""}, "--devices");
  refused({"--workers-per-device", "2"}, "--workers-per-device needs --devices");
  refused({"--devices", "0", "--workers-per-device", "0"}, "--workers-per-device must be in [1, 64], got 0");
  ::setenv("KDISPATCH_CACHE_LOCKING", "bogus", 1);
  refused({}, "KDISPATCH_CACHE_LOCKING='bogus' is not valid (expected auto, flock or fragments)");
  ::unsetenv("KDISPATCH_CACHE_LOCKING");
  refused({"--unit-timeout-s", "5"}, "--unit-timeout-s needs --devices");
  refused({"--devices", "0", "--unit-timeout-s", "0"},
          "--unit-timeout-s must be in [1, 604800] seconds (1 s to a week), got 0");
  refused({"--devices", "0", "--unit-timeout-s", "0.001"},
          "--unit-timeout-s must be in [1, 604800] seconds (1 s to a week), got 0.001");
  // torchrun: through --shard auto, and its variables alone.
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  refused({"--devices", "all", "--shard", "auto"},
          "--devices under torchrun (torchrun (RANK=0, WORLD_SIZE=2)): torchrun already runs one process per GPU");
  refused({"--devices", "all"}, "--devices under torchrun (TORCHELASTIC_RUN_ID or LOCAL_RANK and WORLD_SIZE are set)");
  clear_launcher_env();
  CHECK_FALSE(fs::exists(fs::path(dir / "emit") / "cpu"));  // nothing was tuned
  // The CPU backend's one device: --devices 0 runs.
  CliRun ok = run(cat(base, {"--devices", "0"}), cache);
  CHECK_MESSAGE(ok.exit_code == 0, ok.err);
  CHECK(ok.out.find("1 rmsnorm shapes: 1 tuned") != std::string::npos);
  CHECK(ok.out.find("worker 0 (cpu:0): 1 units") != std::string::npos);
  // --help documents --devices and --workers-per-device, not the workers' own flag.
  CliRun help = run({"tune", "--help"}, cache);
  CHECK(help.out.find("--devices all|N,N...") != std::string::npos);
  CHECK(help.out.find("--workers-per-device N") != std::string::npos);
  CHECK(help.out.find("--internal-worker") == std::string::npos);
}

TEST_CASE("cli merge: two shards into one tree, byte-identical for either source order, conflicts and builds refused") {
  Scratch dir("merge");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  const std::string csv = dir / "s.csv";
  std::ofstream(csv) << "M,hidden\n1,64\n4,64\n16,64\n1,128\n4,128\n16,128\n";
  const std::string e0 = dir / "shard0", e1 = dir / "shard1";
  for (auto [emit, shard] : {std::pair{e0, "0/2"}, std::pair{e1, "1/2"}}) {
    CliRun r = run({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", emit, "--budget-ms", "20",
                    "--no-cold-cache", "--shard", shard},
                   cache);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  }
  const auto read_tree = [](const std::string& root) {
    std::map<std::string, std::string> files;
    for (auto& e : fs::recursive_directory_iterator(root))
      if (e.is_regular_file()) files[fs::relative(e.path(), root).generic_string()] = kdtest::read_text(e.path());
    return files;
  };
  // 1. Merge both orders: the same bytes; every unit present once; the tree validates.
  const std::string m01 = dir / "m01", m10 = dir / "m10";
  CliRun a = run({"merge", "--out", m01, e0, e1}, cache);
  REQUIRE_MESSAGE(a.exit_code == 0, a.err);
  CliRun b = run({"merge", "--out", m10, e1, e0}, cache);
  REQUIRE_MESSAGE(b.exit_code == 0, b.err);
  const auto t01 = read_tree(m01), t10 = read_tree(m10);
  CHECK(t01.size() == 2);  // hidden=64 and hidden=128
  CHECK(t01 == t10);
  CHECK(a.out.find("2 table(s) written to " + m01 + " (6 rows, 0 conflicts resolved), 0 refused") != std::string::npos);
  CliRun v = run({"validate", m01}, cache);
  CHECK_MESSAGE(v.exit_code == 0, v.out << v.err);
  CliRun whole = run({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", m01, "--budget-ms", "20",
                      "--no-cold-cache", "--json"},
                     cache);
  REQUIRE_MESSAGE(whole.exit_code == 0, whole.err);
  simdjson::dom::parser p;
  CHECK(int64_t(p.parse(simdjson::padded_string(whole.out))["skipped_done"]) == 6);

  // 2. A conflicting row (the same key and M, another config) in a third dir.
  const std::string rel = t01.begin()->first;
  const std::string e2 = dir / "shard2";
  fs::create_directories(fs::path(e2) / fs::path(rel).parent_path());
  {
    std::string text = t01.begin()->second;
    const size_t row = text.find("\n    \"1\": ");
    REQUIRE(row != std::string::npos);
    const size_t end = text.find('\n', row + 1);
    // A valid config (merge drops a row validate drops) in a text no tuner
    // writes: its params before its variant.
    text = text.substr(0, row) + "\n    \"1\": {\"unroll\": 1, \"variant\": \"rmsnorm_fp32__vec\", \"vec\": 4}" +
           (text[end - 1] == ',' ? "," : "") + text.substr(end);
    std::ofstream(fs::path(e2) / rel) << text;
  }
  CliRun c = run({"merge", "--out", dir / "mc", m01, e2}, cache);
  CHECK(c.exit_code == 1);
  CHECK(c.err.find(rel + ": refused: different configs for the same M (M=1): pass --prefer") != std::string::npos);
  CHECK_FALSE(fs::exists(fs::path(dir / "mc") / rel));
  CliRun cp = run({"merge", "--prefer", "--out", dir / "mp", m01, e2}, cache);
  REQUIRE_MESSAGE(cp.exit_code == 0, cp.err);
  const std::string merged = kdtest::read_text(fs::path(dir / "mp") / rel);
  simdjson::dom::element doc = p.parse(simdjson::padded_string(merged));
  CHECK(s(doc["kdispatch"]["merged"]["conflicts"]["1"]["kept"]) == m01);
  CHECK(simdjson::dom::array(doc["kdispatch"]["merged"]["conflicts"]["1"]["candidates"]).size() == 2);
  const std::string other = "{\"unroll\":1,\"variant\":\"rmsnorm_fp32__vec\",\"vec\":4}";
  CHECK(merged.find(other) != std::string::npos);           // recorded as a candidate ...
  CHECK(std::string(simdjson::minify(doc["1"])) != other);  // ... not kept

  // 3. Another build's fingerprint: refused, never mixed.
  const std::string e3 = dir / "shard3";
  fs::create_directories(fs::path(e3) / fs::path(rel).parent_path());
  {
    std::string text = t01.begin()->second;
    const size_t k = text.find("\"kernels\":");
    REQUIRE(k != std::string::npos);
    const size_t q = text.find('"', text.find('"', k + 10) + 1);
    text = text.substr(0, text.find('"', k + 10) + 1) + "00000000000000000000000000000000" + text.substr(q);
    std::ofstream(fs::path(e3) / rel) << text;
  }
  CliRun f = run({"merge", "--out", dir / "mf", m01, e3}, cache);
  CHECK(f.exit_code == 1);
  CHECK(f.err.find(rel + ": refused: the sources were tuned by different builds or devices") != std::string::npos);
  CHECK(f.out.find("1 table(s) written") != std::string::npos);  // the other table merges
}

// Review finding: merge read "us"/"default_us" of a table without a
// "kdispatch" object (an SGLang/vLLM table, or "kdispatch" an array) or
// without "us" through a default-constructed simdjson element: an assertion
// abort in Debug, a segfault in Release. Such a table must be refused.
TEST_CASE("cli merge: a table without kdispatch metadata or without its us map is refused, not a crash") {
  Scratch dir("merge-foreign");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  const std::string rel = "cpu/rmsnorm/hidden=64,device_name=CPU_x86_64_AVX512,dtype=fp32.json";
  const auto put = [&](const std::string& src, const std::string& text) {
    fs::create_directories(fs::path(dir / src) / fs::path(rel).parent_path());
    std::ofstream(fs::path(dir / src) / rel) << text;
  };
  put("foreign", "{\"1\": {\"variant\": \"rmsnorm_fp32__ref\"}}\n");                      // SGLang-style table
  put("kdarray", "{\"kdispatch\": [1], \"1\": {\"variant\": \"rmsnorm_fp32__ref\"}}\n");  // metadata not an object
  put("nous",
      "{\"kdispatch\": {\"fingerprint\": {\"kernels\": \"x\"}}, \"1\": {\"variant\": \"rmsnorm_fp32__ref\"}}\n");
  for (const std::string src : {"foreign", "kdarray"}) {
    CAPTURE(src);
    CliRun r = run({"merge", "--out", dir / ("out-" + src), dir / src}, cache);
    CHECK_MESSAGE(r.exit_code == 1, "exit " << r.exit_code << ": " << r.err);
    CHECK(r.err.find(rel + ": refused: not written by kdispatch (no fingerprint)") != std::string::npos);
  }
  // With a fingerprint but no "us" map: merged, the row kept.
  CliRun r = run({"merge", "--out", dir / "out-nous", dir / "nous"}, cache);
  CHECK_MESSAGE(r.exit_code == 0, r.err);
  CHECK(kdtest::read_text(fs::path(dir / "out-nous") / rel).find("\"1\": {\"variant\":\"rmsnorm_fp32__ref\"}") !=
        std::string::npos);
  // A key Python's int() does not read is dropped, not guessed at ("08" is
  // M = 8, as the loader reads it: tests/test_merge.cpp); --out inside a
  // source is refused.
  put("odd", "{\"kdispatch\": {\"fingerprint\": {}}, \"8x\": {\"variant\": \"rmsnorm_fp32__ref\"}}\n");
  CliRun odd = run({"merge", "--out", dir / "out-odd", dir / "odd"}, cache);
  CHECK(odd.exit_code == 1);
  CHECK(odd.err.find("key '8x' is not a batch size (Python's int() does not read it; the loader ignores it)") !=
        std::string::npos);
  CliRun inside = run({"merge", "--out", dir / "nous/merged", dir / "nous"}, cache);
  CHECK(inside.exit_code == 2);
  CHECK(inside.err.find("is inside the source") != std::string::npos);
}

// `merge --retime` (issue 22 item 3): conflicts timed on this machine. One
// gemm fp32 key tuned for real (this build's fingerprint and a fast
// config), then the same key and M in other sources with hand-written
// configs: the reference (plain loops: many times slower), the blocked
// kernel with its scalar register tile and the smallest tiles written
// params first (slower, and a config text smaller than the tuned one's),
// the tuned config with its keys in another order (the same plan, a smaller
// text), and a variant this build does not have.
namespace {

// The merged tree's files with every "retimed_us" number blanked: the bytes
// --retime promises to keep for any source order.
std::map<std::string, std::string> retime_tree(const std::string& root) {
  static const std::regex us("\"retimed_us\": ?[-+0-9.eE]+");
  std::map<std::string, std::string> files;
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file())
      files[fs::relative(e.path(), root).generic_string()] =
          std::regex_replace(kdtest::read_text(e.path()), us, "\"retimed_us\":_");
  return files;
}

// A copy of the emitted table `rel` under `dst` with the row of M replaced by `config`.
void put_row(const std::string& src, const std::string& dst, const std::string& rel, int64_t m,
             const std::string& config) {
  std::string text = kdtest::read_text(fs::path(src) / rel);
  const std::string head = "\n    \"" + std::to_string(m) + "\": ";
  const size_t row = text.find(head);
  REQUIRE(row != std::string::npos);
  const size_t end = text.find('\n', row + 1);
  text = text.substr(0, row) + head + config + (text[end - 1] == ',' ? "," : "") + text.substr(end);
  fs::create_directories(fs::path(dst) / fs::path(rel).parent_path());
  std::ofstream(fs::path(dst) / rel) << text;
}

}  // namespace

TEST_CASE("cli merge --retime: the faster config kept, every candidate's retimed time recorded, any source order") {
  Scratch dir("retime");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  const std::string csv = dir / "g.csv";
  std::ofstream(csv) << "M,N,K\n16,128,128\n";
  const std::string fast = dir / "fast";
  CliRun t = run({"tune", "--shapes", csv, "--op", "gemm", "--dtype", "fp32", "--emit", fast, "--budget-ms", "50",
                  "--no-cold-cache"},
                 cache);
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  const std::string rel =
      "cpu/gemm/N=128,K=128,device_name=" + dispatch::cpu_device_info().device_name + ",dtype=fp32.json";
  REQUIRE(fs::exists(fs::path(fast) / rel));
  simdjson::dom::parser p;
  const std::string fast_text = kdtest::read_text(fs::path(fast) / rel);
  std::string tuned = std::string(simdjson::minify(p.parse(simdjson::padded_string(fast_text))["16"]));
  const std::string ref = "{\"variant\":\"gemm_fp32__ref\"}";
  const std::string scalar =
      "{\"BLOCK_SIZE_M\":8,\"BLOCK_SIZE_N\":16,\"BLOCK_SIZE_K\":128,\"ukernel\":\"scalar\","
      "\"variant\":\"gemm_fp32__blocked\"}";
  // The tuner keeps the floor (get_default's plan) unless a config beats it
  // by its margin: on a quiet machine the tuned row is the floor's plan; on
  // a loaded one another config can win by noise, and the floor would then
  // race every conflict below as a third candidate. `fast` holds the
  // floor's config (learned from a merge of two rows that are not it), so
  // the cases below are the quiet machine's.
  {
    const std::string pa = dir / "probe_a", pb = dir / "probe_b", pm = dir / "probe";
    put_row(fast, pa, rel, 16, ref);
    put_row(fast, pb, rel, 16, scalar);
    CliRun pr = run({"merge", "--retime", "--no-cold-cache", "--reps", "1", "--out", pm, pa, pb}, cache);
    REQUIRE_MESSAGE(pr.exit_code == 0, pr.err);
    simdjson::dom::element pd = p.parse(simdjson::padded_string(kdtest::read_text(fs::path(pm) / rel)));
    std::string floor;
    for (simdjson::dom::element c : simdjson::dom::array(pd["kdispatch"]["merged"]["conflicts"]["16"]["candidates"]))
      if (s(c["source"]) == "floor") floor = std::string(simdjson::minify(c["config"]));
    REQUIRE_FALSE(floor.empty());
    if (floor != tuned) put_row(fast, fast, rel, 16, floor), tuned = floor;
  }
  CAPTURE(tuned);
  REQUIRE(tuned.find("gemm_fp32__ref") == std::string::npos);
  REQUIRE(scalar < tuned);  // the tie rule's smaller text
  // The tuned plan, params first: the same plan, a smaller config text.
  std::string same = tuned.substr(tuned.find(',') + 1);
  same = "{" + same.substr(0, same.size() - 1) + "," + tuned.substr(1, tuned.find(',') - 1) + "}";
  CAPTURE(same);
  REQUIRE(same < tuned);
  const std::string slow = dir / "slow", odd = dir / "odd", twin = dir / "twin";
  put_row(fast, slow, rel, 16, ref);
  put_row(fast, odd, rel, 16, scalar);
  put_row(fast, twin, rel, 16, same);
  const std::vector<std::string> timing = {"--retime", "--no-cold-cache", "--reps", "3"};

  // 1. The tuned config against the reference: the tuned one is kept, in
  //    either source order, both candidates retimed, the reference slower.
  const std::string m1 = dir / "m1", m2 = dir / "m2";
  CliRun a = run(cat(cat({"merge"}, timing), {"--out", m1, fast, slow}), cache);
  REQUIRE_MESSAGE(a.exit_code == 0, a.err);
  CHECK(a.out.find("1 table(s) written to " + m1 + " (1 rows, 1 conflicts resolved), 0 refused") != std::string::npos);
  CHECK(a.err.find(rel + ": 1 conflicting M resolved by --retime") != std::string::npos);
  CHECK(a.err.find(rel + ": M=16 retimed: ") != std::string::npos);
  CliRun b = run(cat(cat({"merge"}, timing), {"--out", m2, slow, fast}), cache);
  REQUIRE_MESSAGE(b.exit_code == 0, b.err);
  CHECK(retime_tree(m1) == retime_tree(m2));  // byte-identical but for the measurements
  const std::string merged = kdtest::read_text(fs::path(m1) / rel);
  simdjson::dom::element doc = p.parse(simdjson::padded_string(merged));
  CHECK(std::string(simdjson::minify(doc["16"])) == tuned);
  simdjson::dom::element conflict = doc["kdispatch"]["merged"]["conflicts"]["16"];
  CHECK(s(conflict["kept"]) == fast);
  CHECK(s(conflict["by"]) == "retime");
  std::map<std::string, double> retimed;  // config -> retimed us
  for (simdjson::dom::element c : simdjson::dom::array(conflict["candidates"])) {
    const std::string config(simdjson::minify(c["config"]));
    CHECK(double(c["us"]) > 0);  // the source's own time, kept
    retimed[config] = double(c["retimed_us"]);
    CHECK(s(c["source"]) == (config == ref ? slow : fast));
  }
  REQUIRE(retimed.size() == 2);
  CHECK(retimed[tuned] > 0);
  CHECK_MESSAGE(retimed[ref] > 1.5 * retimed[tuned],
                "ref " << retimed[ref] << " us, tuned " << retimed[tuned] << " us");
  simdjson::dom::element by = doc["kdispatch"]["merged"]["retimed"];
  CHECK_FALSE(s(by["host"]).empty());
  CHECK(s(by["device"]) == "cpu:0");
  CHECK(s(by["device_name"]) == dispatch::cpu_device_info().device_name);
  CHECK(bool(by["same_fingerprint"]));
  CHECK(std::string(simdjson::minify(by["fingerprint"])) ==
        std::string(simdjson::minify(doc["kdispatch"]["fingerprint"])));
  CHECK(int64_t(by["rounds"]) == 2);
  CHECK(int64_t(by["reps"]) == 3);
  CHECK_FALSE(bool(by["cold_cache"]));
  CHECK(double(by["margin"]) == 0.02);
  // The kept row's "us" stays the source's measurement (not the retimed one).
  const double src_us = double(p.parse(simdjson::padded_string(fast_text))["kdispatch"]["us"]["16"]);
  CHECK(double(doc["kdispatch"]["us"]["16"]) == doctest::Approx(src_us).epsilon(1e-3));
  CliRun v = run({"validate", m1}, cache);
  CHECK_MESSAGE(v.exit_code == 0, v.out << v.err);

  // 1b. The floor (get_default's plan on the CPU) races every conflict as
  //     a candidate no source had: recorded as source "floor" with its
  //     retimed µs, and kept unless a source's config beat it by the margin
  //     (the rule checked on the recorded times). The reference and the
  //     scalar blocked config are not the floor's plan.
  {
    const std::string mf = dir / "mf";
    CliRun f = run(cat(cat({"merge"}, timing), {"--out", mf, slow, odd}), cache);
    REQUIRE_MESSAGE(f.exit_code == 0, f.err);
    CHECK(f.err.find(rel + ": M=16 retimed: ") != std::string::npos);
    CHECK(f.err.find(" floor {") != std::string::npos);
    simdjson::dom::element df = p.parse(simdjson::padded_string(kdtest::read_text(fs::path(mf) / rel)));
    simdjson::dom::element cf = df["kdispatch"]["merged"]["conflicts"]["16"];
    std::map<std::string, double> rf;
    std::string floor_config;
    for (simdjson::dom::element c : simdjson::dom::array(cf["candidates"])) {
      const std::string config(simdjson::minify(c["config"]));
      rf[config] = double(c["retimed_us"]);
      if (s(c["source"]) == "floor") floor_config = config;
    }
    REQUIRE(rf.size() == 3);
    REQUIRE_FALSE(floor_config.empty());
    CHECK(floor_config.find("gemm_fp32__ref") == std::string::npos);
    const double best_source = std::min(rf[ref], rf[scalar]);
    const bool floor_kept = !(best_source < rf[floor_config] * (1.0 - 0.02));
    CAPTURE(best_source);
    CAPTURE(rf[floor_config]);
    CHECK(s(cf["kept"]) == (floor_kept ? "floor" : (rf[ref] < rf[scalar] ? slow : odd)));
    if (floor_kept) CHECK(std::string(simdjson::minify(df["16"])) == floor_config);
    CliRun vf = run({"validate", mf}, cache);
    CHECK_MESSAGE(vf.exit_code == 0, vf.out << vf.err);
  }

  // 2. Three sources, any order: the kept config is the measured fastest
  //    (or, within the margin, the smallest text), not the smaller text of
  //    the slower scalar config; two texts of one plan tie under a wide
  //    margin: the smaller is kept.
  const std::string m3 = dir / "m3", m4 = dir / "m4", m5 = dir / "m5";
  CliRun c3 = run(cat(cat({"merge"}, timing), {"--out", m3, fast, slow, odd}), cache);
  REQUIRE_MESSAGE(c3.exit_code == 0, c3.err);
  simdjson::dom::element d3 = p.parse(simdjson::padded_string(kdtest::read_text(fs::path(m3) / rel)));
  std::map<std::string, double> r3;
  for (simdjson::dom::element c : simdjson::dom::array(d3["kdispatch"]["merged"]["conflicts"]["16"]["candidates"]))
    r3[std::string(simdjson::minify(c["config"]))] = double(c["retimed_us"]);
  REQUIRE(r3.size() == 3);
  double best = 1e300;
  for (const auto& [config, us] : r3) best = std::min(best, us);
  std::string expect;  // the rule, applied to the recorded times
  for (const auto& [config, us] : r3)
    if (expect.empty() && us <= best * 1.02) expect = config;
  const std::string kept3(simdjson::minify(d3["16"]));
  CHECK(kept3 == expect);
  CHECK_MESSAGE(kept3 == tuned, c3.err);  // the scalar tile and the reference are several times slower
  CliRun c4 = run(cat(cat({"merge"}, timing), {"--out", m4, odd, slow, fast}), cache);
  REQUIRE_MESSAGE(c4.exit_code == 0, c4.err);
  CHECK(retime_tree(m3) == retime_tree(m4));  // a clear winner: the same pick, the same bytes
  CliRun c5 = run(cat(cat({"merge"}, timing), {"--retime-margin", "1", "--out", m5, fast, twin}), cache);
  REQUIRE_MESSAGE(c5.exit_code == 0, c5.err);
  simdjson::dom::element d5 = p.parse(simdjson::padded_string(kdtest::read_text(fs::path(m5) / rel)));
  CHECK_MESSAGE(std::string(simdjson::minify(d5["16"])) == same, c5.err);
  CHECK(s(d5["kdispatch"]["merged"]["conflicts"]["16"]["kept"]) == twin);
  CHECK(double(d5["kdispatch"]["merged"]["retimed"]["margin"]) == 1.0);

  // 3. A candidate this build cannot run (a variant it lacks, a value
  //    outside the variant's space): dropped and listed as validate drops
  //    it, before any conflict (issue 31); the other candidate is written,
  //    with nothing to time, and the exit code is 1.
  const std::string bad = dir / "bad";
  put_row(fast, bad, rel, 16, "{\"variant\":\"gemm_fp32__from_a_newer_build\"}");
  CliRun r = run(cat(cat({"merge"}, timing), {"--out", dir / "mbad", fast, bad}), cache);
  CHECK(r.exit_code == 1);
  CHECK_MESSAGE(r.err.find(bad + "/" + rel +
                           ": M=16: unknown variant 'gemm_fp32__from_a_newer_build'; row dropped (as "
                           "kdispatch validate drops it)") != std::string::npos,
                r.err);
  CHECK(r.out.find("1 table(s) written to " + (dir / "mbad") +
                   " (1 rows, 0 conflicts resolved), 0 refused, 0 file(s) "
                   "skipped, 1 row(s) dropped") != std::string::npos);
  CHECK(std::string(simdjson::minify(
            p.parse(simdjson::padded_string(kdtest::read_text(fs::path(dir / "mbad") / rel)))["16"])) == tuned);
  const std::string bad2 = dir / "bad2";
  put_row(fast, bad2, rel, 16, "{\"variant\":\"gemm_fp32__blocked\",\"BLOCK_SIZE_M\":7}");
  CliRun r2 = run(cat(cat({"merge"}, timing), {"--out", dir / "mbad2", fast, bad2}), cache);
  CHECK(r2.exit_code == 1);
  CHECK(r2.err.find(bad2 + "/" + rel +
                    ": M=16: 'BLOCK_SIZE_M'=7 is not a point of gemm_fp32__blocked's space; row "
                    "dropped") != std::string::npos);

  // 4. Sources of another build (both: merge never mixes fingerprints) whose
  //    configs this build still runs are retimed, the record saying so.
  const std::string ofast = dir / "other-fast", oslow = dir / "other-slow";
  for (const auto& [src, dst] : {std::pair{fast, ofast}, std::pair{slow, oslow}}) {
    std::string text = kdtest::read_text(fs::path(src) / rel);
    const size_t k = text.find("\"kernels\":");
    REQUIRE(k != std::string::npos);
    const size_t q0 = text.find('"', k + 10);
    const size_t q1 = text.find('"', q0 + 1);
    text = text.substr(0, q0 + 1) + "00000000000000000000000000000000" + text.substr(q1);
    fs::create_directories(fs::path(dst) / fs::path(rel).parent_path());
    std::ofstream(fs::path(dst) / rel) << text;
  }
  CliRun o = run(cat(cat({"merge"}, timing), {"--out", dir / "mo", ofast, oslow}), cache);
  REQUIRE_MESSAGE(o.exit_code == 0, o.err);
  simdjson::dom::element dob = p.parse(simdjson::padded_string(kdtest::read_text(fs::path(dir / "mo") / rel)));
  CHECK(std::string(simdjson::minify(dob["16"])) == tuned);
  CHECK_FALSE(bool(dob["kdispatch"]["merged"]["retimed"]["same_fingerprint"]));
  CHECK(std::string(simdjson::minify(dob["kdispatch"]["fingerprint"])).find("00000000000000000000000000000000") !=
        std::string::npos);  // the sources' fingerprint stays the table's

  // 5. Usage: --retime with --prefer, timing flags without --retime.
  CliRun both = run({"merge", "--retime", "--prefer", "--out", dir / "mx", fast, slow}, cache);
  CHECK(both.exit_code == 2);
  CHECK(both.err.find("--retime and --prefer are two rules for the same conflicts: pass one") != std::string::npos);
  CliRun flags = run({"merge", "--reps", "3", "--out", dir / "mx", fast, slow}, cache);
  CHECK(flags.exit_code == 2);
  CHECK(flags.err.find("need --retime") != std::string::npos);
  // No conflict: --retime times nothing and merges as without it.
  CliRun none = run(cat(cat({"merge"}, timing), {"--out", dir / "mn", fast}), cache);
  CHECK_MESSAGE(none.exit_code == 0, none.err);
  CHECK(kdtest::read_text(fs::path(dir / "mn") / rel).find("\"retimed\"") == std::string::npos);
  CliRun help = run({"merge", "--help"}, cache);
  CHECK(help.out.find("--retime-margin FRACTION") != std::string::npos);
  CHECK(help.out.find("Exclusive with --prefer") != std::string::npos);
}

TEST_CASE("cli merge --retime: a cuda table on a machine without a cuda device is refused, naming the file") {
  Scratch dir("retime-cuda");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  const std::string rel = "cuda/gemm/N=128,K=128,device_name=NVIDIA_H200,dtype=bf16.json";
  const auto put = [&](const std::string& src, const std::string& config) {
    fs::create_directories(fs::path(dir / src) / fs::path(rel).parent_path());
    std::ofstream(fs::path(dir / src) / rel)
        << "{\n    \"kdispatch\": {\"fingerprint\": {\"kernels\": \"x\", \"arch\": \"sm_90a\"}, "
           "\"us\": {\"4\": 5.0}},\n    \"4\": " +
               config + "\n}\n";
  };
  // Points of the CUDA skinny GEMM's space: rows a CUDA build checks and
  // keeps, a build without CUDA copies unchecked.
  put("a", "{\"variant\": \"gemm_bf16__skinny\", \"rows_per_warp\": 1}");
  put("b", "{\"variant\": \"gemm_bf16__skinny\", \"rows_per_warp\": 2}");
  // A cpu table in the same sources, without a conflict, still merges.
  const std::string cpu_rel = "cpu/rmsnorm/hidden=64,device_name=CPU_x,dtype=fp32.json";
  fs::create_directories(fs::path(dir / "a") / fs::path(cpu_rel).parent_path());
  std::ofstream(fs::path(dir / "a") / cpu_rel)
      << "{\"kdispatch\": {\"fingerprint\": {\"kernels\": \"x\"}}, \"1\": {\"variant\": \"rmsnorm_fp32__ref\"}}\n";
  CliRun r = run({"merge", "--retime", "--out", dir / "m", dir / "a", dir / "b"}, cache);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find(rel + ": refused: ") != std::string::npos);
  auto rt = dispatch::Runtime::create();
  REQUIRE(rt.ok());
  auto di = (*rt)->device_info(dispatch::Device{dispatch::DeviceType::cuda, 0});
  if (!di.ok() || !di->available)
    CHECK_MESSAGE(r.err.find(rel + ": refused: --retime times this cuda table's conflicting rows on a cuda device, and "
                                   "this machine has none (") != std::string::npos,
                  r.err);
  CHECK_FALSE(fs::exists(fs::path(dir / "m") / rel));
  CHECK(fs::exists(fs::path(dir / "m") / cpu_rel));
  CHECK(r.out.find("1 table(s) written") != std::string::npos);
}

// ---- storage a cluster shares: fragments (<key>.json.d/<host>-<pid>.json)

namespace {

// The table text `text` (as the tuner writes it: "{", the metadata line,
// one row a line, "}") with only the rows of `ms`.
std::string with_rows(const std::string& text, const std::set<int64_t>& ms) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  REQUIRE(lines.size() >= 4);
  const auto strip = [](std::string l) { return !l.empty() && l.back() == ',' ? l.substr(0, l.size() - 1) : l; };
  std::string out = "{\n" + strip(lines[1]);
  for (size_t i = 2; i + 1 < lines.size(); ++i) {
    const size_t q = lines[i].find('"');
    if (ms.count(std::stoll(lines[i].substr(q + 1)))) out += ",\n" + strip(lines[i]);
  }
  return out + "\n}\n";
}

std::map<std::string, std::string> read_tree(const std::string& root) {
  std::map<std::string, std::string> files;
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) files[fs::relative(e.path(), root).generic_string()] = kdtest::read_text(e.path());
  return files;
}

// KDISPATCH_CACHE_LOCKING for the CLI runs of one scope.
struct LockingEnv {
  explicit LockingEnv(const char* v) { ::setenv("KDISPATCH_CACHE_LOCKING", v, 1); }
  ~LockingEnv() { ::unsetenv("KDISPATCH_CACHE_LOCKING"); }
};

}  // namespace

TEST_CASE(
    "cli merge: fragments merge into one file per key, byte-identical for any split and order, --compact in place") {
  Scratch dir("fragments");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  ::unsetenv("KDISPATCH_CACHE_LOCKING");
  const std::string csv = dir / "s.csv";
  std::ofstream(csv) << "M,hidden\n1,64\n4,64\n16,64\n";
  const std::string whole = dir / "whole";
  CliRun t = run({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", whole, "--budget-ms", "20",
                  "--no-cold-cache"},
                 cache);
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  CHECK(t.err.find("  writes: each <key>.json merged under its lock file (flock is honoured on '" + whole + "'") !=
        std::string::npos);
  const std::string rel =
      "cpu/rmsnorm/hidden=64,device_name=" + dispatch::cpu_device_info().device_name + ",dtype=fp32.json";
  const std::string table = kdtest::read_text(fs::path(whole) / rel);
  const auto put = [&](const std::string& src, const std::string& file, const std::set<int64_t>& ms) {
    kdtest::write_text(fs::path(dir / src) / file, with_rows(table, ms));
  };
  // The same rows split three ways: a main file and two fragments; fragments
  // only; a main file and a fragment sharing a row (equal configs).
  put("a", rel, {1});
  put("a", rel + ".d/x-1.json", {4});
  put("a", rel + ".d/y-2.json", {16});
  put("b", rel + ".d/z-3.json", {1, 4, 16});
  put("c", rel, {1, 4});
  put("c", rel + ".d/x-1.json", {4, 16});
  CliRun va = run({"validate", dir / "a"}, cache);
  CHECK(va.exit_code == 0);
  CHECK(va.out.find("loaded   " + rel + ".d/x-1.json (1 rows)") != std::string::npos);
  CHECK(va.out.find("3 files: 3 loaded, 0 partial, 0 skipped; 0 unknown-device files; 1 keys, 3 rows") !=
        std::string::npos);
  std::map<std::string, std::map<std::string, std::string>> out;
  for (const std::vector<std::string>& srcs :
       std::vector<std::vector<std::string>>{{"whole"}, {"a"}, {"b"}, {"c"}, {"a", "c"}, {"c", "a"}, {"b", "whole"}}) {
    std::string name = "m";
    std::vector<std::string> args = {"merge", "--out"};
    for (const auto& x : srcs) name += "-" + x;
    args.push_back(dir / name);
    for (const auto& x : srcs) args.push_back(dir / x);
    CliRun m = run(args, cache);
    REQUIRE_MESSAGE(m.exit_code == 0, m.err);
    CHECK(m.out.find("1 table(s) written to " + (dir / name) + " (3 rows, 0 conflicts resolved), 0 refused") !=
          std::string::npos);
    out[name] = read_tree(dir / name);
    CHECK(out[name].size() == 1);  // one file per key, no fragment
  }
  CHECK(out["m-a"] == out["m-whole"]);
  CHECK(out["m-b"] == out["m-whole"]);
  CHECK(out["m-c"] == out["m-whole"]);
  CHECK(out["m-a-c"] == out["m-c-a"]);
  CHECK(out["m-a-c"] == out["m-b-whole"]);
  CHECK(out["m-a-c"].at(rel).find("\"merged\": {\"sources\": 2}") != std::string::npos);

  // In place: the fragments go into the main file (the same bytes as
  // merge --out of the dir) and are removed; a table without fragments is
  // left as it is.
  fs::copy(dir / "a", dir / "a2", fs::copy_options::recursive);
  put("a2", "cpu/rmsnorm/hidden=128,device_name=X,dtype=fp32.json", {1});  // no fragments: untouched
  const std::string untouched =
      kdtest::read_text(fs::path(dir / "a2") / "cpu/rmsnorm/hidden=128,device_name=X,dtype=fp32.json");
  CliRun c = run({"merge", "--compact", dir / "a2"}, cache);
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  CHECK(c.out.find("1 table(s) compacted in " + (dir / "a2") +
                   " (3 rows, 0 conflicts resolved, 2 fragment(s) merged and removed, 0 kept), 0 refused, 0 file(s) "
                   "skipped") != std::string::npos);
  const auto a2 = read_tree(dir / "a2");
  CHECK(a2.size() == 2);
  CHECK(a2.at(rel) == out["m-a"].at(rel));
  CHECK(a2.at("cpu/rmsnorm/hidden=128,device_name=X,dtype=fp32.json") == untouched);
  CHECK(fs::is_empty(fs::path(dir / "a2") / (rel + ".d")));  // the fragment dir stays (a writer may be in it)
  CHECK_FALSE(fs::exists(fs::path(dir / "a2") / ".kdispatch-compact.lock"));
  // A writer rewrites its fragment (rows 4 and 1) between the compaction's
  // read and its claim (test hook): the rows read are merged, the rewritten
  // fragment is kept (nothing lost) and the next compaction takes it.
  fs::copy(dir / "a", dir / "a4", fs::copy_options::recursive);
  fs::remove(fs::path(dir / "a4") / (rel + ".d/y-2.json"));
  put("rewrite", "f.json", {1, 4});
  {
    ::setenv("KDISPATCH_TEST_COMPACT_REPLACE", (dir / "rewrite/f.json").c_str(), 1);
    CliRun w = run({"merge", "--compact", dir / "a4"}, cache);
    ::unsetenv("KDISPATCH_TEST_COMPACT_REPLACE");
    REQUIRE_MESSAGE(w.exit_code == 0, w.err);
    CHECK(w.out.find("(2 rows, 0 conflicts resolved, 0 fragment(s) merged and removed, 1 kept)") != std::string::npos);
    CHECK(w.err.find(rel + ": 1 fragment(s) were rewritten by their writer while compacting: kept") !=
          std::string::npos);
  }
  // Put back aside (its writer, "x-1", is not a process of this host known
  // to be gone: a put-back under its name could be replaced by its next
  // rename): a name the loader reads.
  std::vector<std::string> a4_frags;
  for (auto& e : fs::directory_iterator(fs::path(dir / "a4") / (rel + ".d")))
    a4_frags.push_back(e.path().filename().string());
  REQUIRE(a4_frags.size() == 1);
  CHECK(a4_frags[0].rfind("x-1.unmerged-", 0) == 0);
  CHECK(kdtest::read_text(fs::path(dir / "a4") / (rel + ".d") / a4_frags[0]) == with_rows(table, {1, 4}));
  for (auto& e : fs::recursive_directory_iterator(dir / "a4"))
    CHECK_MESSAGE(e.path().filename().string()[0] != '.', e.path().string());  // no claim or lock left
  CliRun again = run({"merge", "--compact", dir / "a4"}, cache);
  REQUIRE_MESSAGE(again.exit_code == 0, again.err);
  CHECK(again.out.find("(2 rows, 0 conflicts resolved, 1 fragment(s) merged and removed, 0 kept)") !=
        std::string::npos);
  put("e", rel, {1, 4});
  REQUIRE(run({"merge", "--out", dir / "m-e", dir / "e"}, cache).exit_code == 0);
  CHECK(read_tree(dir / "a4") == read_tree(dir / "m-e"));  // rows 1 and 4, nothing lost
  // A compaction already running (its lock file): refused, nothing touched.
  fs::copy(dir / "a", dir / "a3", fs::copy_options::recursive);
  kdtest::write_text(fs::path(dir / "a3") / ".kdispatch-compact.lock", "1 otherhost\n");
  CliRun busy = run({"merge", "--compact", dir / "a3"}, cache);
  CHECK(busy.exit_code == 1);
  CHECK(busy.err.find("another compaction holds " + (dir / "a3") +
                      "/.kdispatch-compact.lock (1 otherhost); if none "
                      "runs, remove it") != std::string::npos);
  CHECK(read_tree(dir / "a3").size() == 4);
  // Usage.
  CHECK(run({"merge", "--compact", dir / "a3", "--out", dir / "x"}, cache).exit_code == 2);
  CHECK(run({"merge", dir / "a3"}, cache).exit_code == 2);

  // A conflict between the main file and a fragment: refused (nothing
  // touched) unless --prefer, which keeps the main file's row (what the
  // loader serves).
  put("d", rel, {1, 4});
  {
    std::string other = with_rows(table, {4});
    const size_t row = other.find("\n    \"4\": {");
    REQUIRE(row != std::string::npos);
    other = other.substr(0, row) + "\n    \"4\": {\"unroll\": 1, \"variant\": \"rmsnorm_fp32__vec\", \"vec\": 4}" +
            other.substr(other.find('\n', row + 1));
    kdtest::write_text(fs::path(dir / "d") / (rel + ".d/f-9.json"), other);
  }
  const auto d_before = read_tree(dir / "d");
  CliRun r = run({"merge", "--compact", dir / "d"}, cache);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find(rel + ": refused: different configs for the same M (M=4): pass --prefer") != std::string::npos);
  CHECK(read_tree(dir / "d") == d_before);
  CliRun p = run({"merge", "--compact", dir / "d", "--prefer"}, cache);
  REQUIRE_MESSAGE(p.exit_code == 0, p.err);
  const auto d_after = read_tree(dir / "d");
  REQUIRE(d_after.size() == 1);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(d_after.at(rel)));
  CHECK(s(doc["kdispatch"]["merged"]["conflicts"]["4"]["kept"]) == dir / "d");
  std::set<std::string> candidates;
  for (simdjson::dom::element c : simdjson::dom::array(doc["kdispatch"]["merged"]["conflicts"]["4"]["candidates"]))
    candidates.insert(s(c["source"]));
  CHECK(candidates == std::set<std::string>{dir / "d", (dir / "d") + " (fragment f-9.json)"});
  CHECK(std::string(simdjson::minify(doc["4"])) != "{\"unroll\":1,\"variant\":\"rmsnorm_fp32__vec\",\"vec\":4}");
}

// Attack (1d58e34): tune's summary counted fragments apart from tables as
// "<tables - fragments> config file(s) and <n> fragment(s) of them": a
// fragments-only emit dir (KDISPATCH_CACHE_LOCKING=fragments, every --devices
// worker its own fragment) read "0 config file(s) and 2 fragment(s) of them".
TEST_CASE("cli tune: the summary counts a table written as fragments once, with its fragments") {
  Scratch dir("summary-fragments");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  const std::string csv = dir / "s.csv";
  std::ofstream(csv) << "M,hidden\n1,64\n2,64\n4,64\n8,64\n1,128\n";
  const std::string emit = dir / "emit";
  LockingEnv env("fragments");
  CliRun t = run({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", emit, "--budget-ms", "20",
                  "--no-cold-cache", "--devices", "0", "--workers-per-device", "2"},
                 cache);
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  size_t fragments = 0, mains = 0;
  for (auto& e : fs::recursive_directory_iterator(fs::path(emit) / "cpu" / "rmsnorm"))
    if (e.is_regular_file() && e.path().extension() == ".json")
      ++(e.path().parent_path().extension() == ".d" ? fragments : mains);
  CHECK(mains == 0);
  REQUIRE(fragments >= 2);  // one table per hidden size, at least one fragment each
  const std::string want = "2 config file(s) (written as " + std::to_string(fragments) +
                           " fragment(s): compact them with kdispatch merge --compact) under " + emit + "/cpu/rmsnorm/";
  CHECK_MESSAGE(t.out.find(want) != std::string::npos, t.out);
}

TEST_CASE("cli validate --cache: a stale fragment is skipped and reported, the dir's write scheme is said") {
  Scratch dir("validate-cache");
  const std::string cache = dir / "cache";
  clear_launcher_env();
  const std::string csv = dir / "s.csv";
  std::ofstream(csv) << "M,hidden\n1,64\n";
  const std::string emit = dir / "emit";
  std::string fragment;
  {
    // Written where flock is not honoured (forced): a fragment, said so.
    LockingEnv env("fragments");
    CliRun t = run({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", emit, "--budget-ms", "20",
                    "--no-cold-cache"},
                   cache);
    REQUIRE_MESSAGE(t.exit_code == 0, t.err);
    CHECK(t.err.find("  writes: per-process fragments <key>.json.d/<host>-<pid>.json (compact them with kdispatch "
                     "merge) (KDISPATCH_CACHE_LOCKING=fragments)") != std::string::npos);
  }
  const std::string rel =
      "cpu/rmsnorm/hidden=64,device_name=" + dispatch::cpu_device_info().device_name + ",dtype=fp32.json";
  for (auto& e : fs::directory_iterator(fs::path(emit) / (rel + ".d"))) fragment = e.path().filename().string();
  REQUIRE(fragment.size() > 5);
  CHECK_FALSE(fs::exists(fs::path(emit) / rel));
  // Another build's fragment of the same table.
  std::string text = kdtest::read_text(fs::path(emit) / (rel + ".d/" + fragment));
  const size_t k = text.find("\"kernels\":");
  REQUIRE(k != std::string::npos);
  const size_t open = text.find('"', k + 10);
  text = text.substr(0, open + 1) + "00000000000000000000000000000000" + text.substr(text.find('"', open + 1));
  kdtest::write_text(fs::path(emit) / (rel + ".d/oldbuild-1.json"), with_rows(text, {1}));
  CliRun v = run({"validate", "--cache", emit}, cache);
  CHECK(v.exit_code == 1);
  CHECK(v.out.find("loaded   " + rel + ".d/" + fragment + " (1 rows)\n") != std::string::npos);
  CHECK(v.out.find("skipped  " + rel +
                   ".d/oldbuild-1.json\n           - stale tuning result, not served: axis 'kernels' differs (file "
                   "'00000000000000000000000000000000', now") != std::string::npos);
  CHECK(v.out.find("cache dir " + emit +
                   ": writes use flock (each <key>.json merged under its lock file): flock is "
                   "honoured on '" +
                   emit + "'") != std::string::npos);
  CHECK(v.out.find("2 files: 1 loaded, 0 partial, 1 skipped") != std::string::npos);
  {
    LockingEnv env("fragments");
    CliRun vf = run({"validate", "--cache", emit, "--json"}, cache);
    simdjson::dom::parser parser;
    simdjson::dom::element doc = parser.parse(simdjson::padded_string(vf.out));
    CHECK(s(doc["cache"]["writes"]) ==
          "per-process fragments (<key>.json.d/<host>-<pid>.json; compact them with kdispatch merge): "
          "KDISPATCH_CACHE_LOCKING=fragments");
  }
  {
    // A bad value: a usage error naming the variable, as tune refuses it.
    LockingEnv env("sometimes");
    CliRun vb = run({"validate", "--cache", emit}, cache);
    CHECK(vb.exit_code == 2);
    CHECK(vb.out.empty());
    CHECK_MESSAGE(vb.err.find("kdispatch validate: KDISPATCH_CACHE_LOCKING='sometimes' is not valid (expected auto, "
                              "flock or fragments)") != std::string::npos,
                  vb.err);
  }
  // As a config dir (rows taken as given, no fingerprint check) both load.
  CliRun vc = run({"validate", emit}, cache);
  CHECK(vc.exit_code == 0);
  CHECK(vc.out.find("2 files: 2 loaded, 0 partial, 0 skipped") != std::string::npos);
  CHECK(run({"validate"}, cache).exit_code == 2);
}

TEST_CASE("cli tune: --op moe_gemm on an M,E,N,K,top_k,block_size list: scratch holds one alignment, rows load") {
  Scratch dir("moe_gemm");
  const std::string cache = dir / "cache";
  simdjson::dom::parser parser;
  const std::string device = dispatch::cpu_device_info().device_name;
  const std::string csv = dir / "moe_gemm.csv";
  // The up call of a small MoE (top_k 2) and its down call (top_k 1, the routed weight), block fp8 and fp32.
  std::ofstream(csv) << "M,E,N,K,top_k,block_size,dtype,out_dtype,mul_routed_weight,block_shape\n"
                        "4,8,64,128,2,16,fp32,,,\n"
                        "8,8,128,32,1,16,fp32,,true,\n"
                        "4,8,128,256,2,16,fp8_e4m3fn,bf16,,true\n";
  const std::string emit = dir / "emit";
  CliRun t = run(
      {"tune", "--shapes", csv, "--op", "moe_gemm", "--emit", emit, "--budget-ms", "50", "--no-cold-cache", "--json"},
      cache);
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(t.out));
  CHECK(int64_t(doc["shapes"]) == 3);
  CHECK(int64_t(doc["tuned"]) == 3);
  CHECK(int64_t(doc["failed"]) == 0);
  std::set<std::string> keys;
  for (simdjson::dom::element res : doc["results"].get_array()) {
    CHECK(s(res["status"]) == "tuned");
    CHECK(s(res["variant"]).rfind("moe_gemm_", 0) == 0);
    keys.insert(std::string(s(res["key"])));
  }
  CHECK(keys ==
        std::set<std::string>{
            "cpu/moe_gemm|" + device + "|E=8,K=128,N=64,block_size=16,dtype=fp32,top_k=2",
            "cpu/moe_gemm|" + device + "|E=8,K=32,N=128,block_size=16,dtype=fp32,mul_routed_weight=true,top_k=1",
            "cpu/moe_gemm|" + device +
                "|E=8,K=256,N=128,block_shape=[128,128],block_size=16,dtype=fp8_e4m3fn,out_dtype=bf16,top_k=2"});
  CliRun v = run({"validate", emit}, cache);
  CHECK_MESSAGE(v.exit_code == 0, v.out << v.err);
  CHECK(v.out.find("3 files: 3 loaded") != std::string::npos);
}

// add_choice (src/cli/tune_shapes.cpp) takes "1" for a two-label switch's
// second label (mul_routed_weight=true) but not "0" for its first: a shapes
// file written with 0/1 fails every row that has the routed weight off.
TEST_CASE("cli tune: --op moe_gemm takes mul_routed_weight as 0 and 1 as it takes false and true") {
  Scratch dir("moe_gemm01");
  const std::string cache = dir / "cache";
  simdjson::dom::parser parser;
  const std::string csv = dir / "moe_gemm.csv";
  std::ofstream(csv) << "M,E,N,K,top_k,block_size,dtype,mul_routed_weight\n"
                        "4,8,64,128,2,16,fp32,0\n"
                        "8,8,128,32,1,16,fp32,1\n";
  const std::string emit = dir / "emit";
  CliRun t = run(
      {"tune", "--shapes", csv, "--op", "moe_gemm", "--emit", emit, "--budget-ms", "50", "--no-cold-cache", "--json"},
      cache);
  INFO(t.out << t.err);
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(t.out));
  CHECK(int64_t(doc["failed"]) == 0);
  CHECK(int64_t(doc["tuned"]) == 2);
}

#endif  // KDISPATCH_CLI_PATH
