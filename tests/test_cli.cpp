// SPDX-License-Identifier: Apache-2.0
// Tests of the `kdispatch` command-line tool: runs the built binary
// (KDISPATCH_CLI_PATH) on the shared SGLang config tree and on temp dirs,
// and checks exit codes, JSON output (parsed with simdjson) and messages.
#include <doctest/doctest.h>
#include <simdjson.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.hpp"
#include "dispatch/device.hpp"
#include "dispatch/ops.hpp"

#ifdef KDISPATCH_CLI_PATH

namespace {

namespace fs = std::filesystem;

using kdtest::CliResult;
using kdtest::run_cli;

// A fresh temp dir per test, removed on scope exit.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("kdispatch-cli-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

const std::string kShared = KDISPATCH_SHARED_DIR;
const std::string kSglang = kShared + "/data/sglang-configs";

std::string str(simdjson::dom::element e) { return std::string(std::string_view(e)); }

}  // namespace

TEST_CASE("cli: --help and --version") {
  CliResult h = run_cli({"--help"});
  CHECK(h.exit_code == 0);
  CHECK(h.out.find("replay") != std::string::npos);
  CHECK(h.out.find("lookup") != std::string::npos);
  CHECK(h.out.find("validate") != std::string::npos);
  CHECK(h.out.find("misses") != std::string::npos);
  CHECK(h.out.find("tune") != std::string::npos);
  for (const char* sub : {"replay", "misses", "tune", "lookup", "validate"}) {
    CliResult s = run_cli({sub, "--help"});
    CHECK(s.exit_code == 0);
    CHECK(s.out.find("Examples:") != std::string::npos);
    CHECK(s.out.find(std::string("kdispatch ") + sub) != std::string::npos);
  }
  CliResult v = run_cli({"--version"});
  CHECK(v.exit_code == 0);
  CHECK(v.out.find("kdispatch ") == 0);
  CHECK(v.out.find(dispatch::cpu_device_info().device_name) != std::string::npos);

  CliResult none = run_cli({});
  CHECK(none.exit_code == 2);
  CliResult bad = run_cli({"replay", "--no-such-option"});
  CHECK(bad.exit_code == 2);
}

TEST_CASE("cli: validate --json accounts for every SGLang config file") {
  std::set<std::string> on_disk;
  for (const auto& e : fs::recursive_directory_iterator(kSglang))
    if (e.is_regular_file() && e.path().extension() == ".json")
      on_disk.insert(fs::relative(e.path(), kSglang).generic_string());
  REQUIRE(on_disk.size() >= 381);

  CliResult r = run_cli({"validate", kSglang, "--json"});
  CHECK(r.exit_code == 1);  // the foreign files in fused_moe_triton/ are skipped
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(r.out));
  std::set<std::string> reported, skipped;
  for (simdjson::dom::element f : doc["files"].get_array()) {
    const std::string path = str(f["path"]);
    CHECK_MESSAGE(reported.insert(path).second, "reported twice: " << path);
    const std::string status = str(f["status"]);
    CHECK((status == "loaded" || status == "partial" || status == "skipped"));
    if (status == "skipped") {
      skipped.insert(path);
      CHECK_MESSAGE(simdjson::dom::array(f["problems"]).size() > 0, "skipped without a reason: " << path);
    }
  }
  CHECK(reported == on_disk);
  for (const char* foreign :
       {"fused_moe_triton/causal_conv1d_fwd_sm_95.json", "fused_moe_triton/causal_conv1d_fwd_with_prefix_sm_95.json",
        "fused_moe_triton/minimax_m3_gfx950_mxfp8_compact_moe.json", "fused_moe_triton/update_sconv_cache_sm_90.json"})
    CHECK_MESSAGE(skipped.count(foreign) == 1, foreign << " should be skipped");
  MESSAGE("skipped: " << skipped.size() << " of " << reported.size());

  // Text mode: one line per file plus the summary; same exit code.
  CliResult t = run_cli({"validate", kSglang});
  CHECK(t.exit_code == 1);
  CHECK(t.out.find("skipped  fused_moe_triton/causal_conv1d_fwd_sm_95.json") != std::string::npos);
  CHECK(t.out.find(std::to_string(on_disk.size()) + " files: ") != std::string::npos);

  // A dir of usable files only: exit 0.
  CliResult q = run_cli({"validate", kSglang + "/quantization"});
  CHECK(q.out.find(" 0 skipped") != std::string::npos);
  CHECK(q.exit_code == 0);

  CliResult missing = run_cli({"validate", kSglang + "/no-such-dir"});
  CHECK(missing.exit_code == 2);
  CHECK(missing.err.find("no-such-dir") != std::string::npos);
}

TEST_CASE("cli: lookup --json of case C06") {
  const std::string dir = kSglang + "/fused_moe_triton";
  const std::vector<std::pair<std::string, int64_t>> expected = {{"BLOCK_SIZE_M", 16},  {"BLOCK_SIZE_N", 64},
                                                                 {"BLOCK_SIZE_K", 128}, {"GROUP_SIZE_M", 1},
                                                                 {"num_warps", 4},      {"num_stages", 5}};
  const std::string file =
      "triton_3_5_1/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json";

  // The expectation is the file's own "1" row.
  {
    simdjson::dom::parser p;
    simdjson::dom::element row = p.load(dir + "/" + file)["1"];
    std::vector<std::pair<std::string, int64_t>> in_file;
    for (auto [k, v] : simdjson::dom::object(row)) in_file.emplace_back(std::string(k), int64_t(v));
    REQUIRE(in_file == expected);
  }

  const std::vector<std::string> base = {"lookup",
                                         "--configs",
                                         dir,
                                         "--backend-version",
                                         "3.5.1",
                                         "--device",
                                         "NVIDIA H200",
                                         "--key",
                                         "E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]"};
  auto args = base;
  args.insert(args.end(), {"--M", "1", "--json"});
  CliResult r = run_cli(args);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(r.out));
  std::vector<std::pair<std::string, int64_t>> got;
  for (auto [k, v] : simdjson::dom::object(doc["config"])) got.emplace_back(std::string(k), int64_t(v));
  CHECK(got == expected);
  CHECK(str(doc["source"]) == file);
  CHECK(str(doc["match"]) == "exact");
  CHECK(int64_t(doc["M"]) == 1);

  // Same lookup through the alias the case names.
  args = base;
  args[6] = "NVIDIA H200 NVL";
  args.insert(args.end(), {"--M", "1", "--json", "--alias", "NVIDIA H200 NVL=NVIDIA_H200"});
  CliResult a = run_cli(args);
  REQUIRE_MESSAGE(a.exit_code == 0, a.err);
  simdjson::dom::element adoc = parser.parse(simdjson::padded_string(a.out));
  CHECK(str(adoc["source"]) == file);

  // Text mode names the same file and match.
  args = base;
  args.insert(args.end(), {"--M", "1"});
  CliResult t = run_cli(args);
  CHECK(t.exit_code == 0);
  CHECK(t.out.find("\"BLOCK_SIZE_M\": 16") != std::string::npos);
  CHECK(t.out.find(file) != std::string::npos);
  CHECK(t.out.find("match    exact") != std::string::npos);
}

TEST_CASE("cli: lookup errors") {
  const std::string dir = kSglang + "/quantization";
  // Malformed key: usage error naming --key.
  CliResult k = run_cli({"lookup", "--configs", dir, "--device", "NVIDIA H20", "--key", "N=2304,K", "--M", "64"});
  CHECK(k.exit_code == 2);
  CHECK(k.err.find("--key") != std::string::npos);
  // Unknown op: usage error naming it.
  CliResult o = run_cli({"lookup", "--configs", dir, "--op", "conv9d", "--key", "N=1,K=1", "--M", "1"});
  CHECK(o.exit_code == 2);
  CHECK(o.err.find("conv9d") != std::string::npos);
  // M < 1.
  CliResult m = run_cli({"lookup", "--configs", dir, "--key", "N=1,K=1", "--M", "0"});
  CHECK(m.exit_code == 2);
  CHECK(m.err.find("--M") != std::string::npos);
  // No row and no default rule (no block_shape): not_found, exit 1.
  CliResult nf = run_cli({"lookup", "--configs", dir, "--op", "triton_gemm", "--device", "NVIDIA H20", "--key",
                          "N=7,K=9,dtype=bf16", "--M", "64"});
  CHECK(nf.exit_code == 1);
  CHECK(nf.err.find("not_found") != std::string::npos);
  // A config dir that does not exist.
  CliResult d = run_cli({"lookup", "--configs", dir + "/nope", "--key", "N=1,K=1", "--M", "1"});
  CHECK(d.exit_code == 2);
  CHECK(d.err.find("nope") != std::string::npos);
  // A required option left out.
  CliResult req = run_cli({"lookup", "--configs", dir, "--M", "1"});
  CHECK(req.exit_code == 2);
  CHECK(req.err.find("--key") != std::string::npos);
}

TEST_CASE("cli: an unknown option is reported by name, before a missing required option, for every subcommand") {
  const std::string hint = "Run with --help for more information.\n";
  for (const char* sub : {"replay", "misses", "tune", "lookup", "validate", "merge", "verify", "report"}) {
    CAPTURE(sub);
    CliResult r = run_cli({sub, "--bogus"});
    CHECK(r.exit_code == 2);
    CHECK(r.out.empty());
    CHECK(r.err == "The following argument was not expected: --bogus\n" + hint);
  }
  // lookup lacks --key and --M (required), and --M 0 fails its check: the
  // unknown flag is what is reported.
  CliResult noreq = run_cli({"lookup", "--M", "0", "--bogus"});
  CHECK(noreq.exit_code == 2);
  CHECK(noreq.err == "The following argument was not expected: --bogus\n" + hint);
  // Several, in the order typed, the subcommand's and the top level's.
  CliResult two = run_cli({"lookup", "--bogus", "stray", "--key", "N=1,K=1", "--other"});
  CHECK(two.exit_code == 2);
  CHECK(two.err == "The following arguments were not expected: --bogus stray --other\n" + hint);
  // No subcommand: the flag, not "A subcommand is required".
  CliResult top = run_cli({"--bogus"});
  CHECK(top.exit_code == 2);
  CHECK(top.err == "The following argument was not expected: --bogus\n" + hint);
  // Without an unknown argument, the missing required option as before.
  CliResult req = run_cli({"lookup", "--M", "1"});
  CHECK(req.exit_code == 2);
  CHECK(req.err == "--key is required\n" + hint);
  // --help still wins.
  CliResult help = run_cli({"lookup", "--help", "--bogus"});
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("kdispatch lookup") != std::string::npos);
}

TEST_CASE("cli: replay --json counts every call and finds configs given with --configs") {
  // Qwen2.5-0.5B (24 layers), decode trace, one pass: per step 1 rmsnorm,
  // 2 fused_add_rmsnorm, 4 gemm and 1 silu_and_mul calls per layer.
  CliResult r = run_cli({"replay", "--json"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(r.out));
  CHECK(str(doc["backend"]) == "cpu");
  const std::string device_name = str(doc["device_name"]);
  CHECK(device_name == dispatch::cpu_device_info().device_name);
  CHECK(str(doc["model"]) == "qwen2.5-0.5b");
  CHECK(str(doc["trace"]) == "decode");
  const int64_t steps = doc["steps"];
  CHECK(steps > 0);
  CHECK(int64_t(doc["passes"]) == 1);
  CHECK(str(doc["tune"]["mode"]) == "off");
  CHECK(bool(doc["output_finite"]));
  const std::pair<const char*, int64_t> per_step[] = {
      {"rmsnorm", 1}, {"fused_add_rmsnorm", 48}, {"gemm", 96}, {"silu_and_mul", 24}};
  for (const auto& [op, n] : per_step) {
    CAPTURE(op);
    simdjson::dom::element s = doc["ops"][op];
    const int64_t calls = s["calls"], hits = s["hits"], defaults = s["defaults"], tuned = s["tuned"];
    CHECK(calls == n * steps);
    CHECK(hits + defaults == calls);
    CHECK(tuned == 0);
    CHECK(double(s["us_per_call"]) > 0.0);
    CHECK(int64_t(s["sources"]["default"]) == defaults);
  }

  // A config dir with one table for the model's rmsnorm shape: every
  // rmsnorm call hits it, the other ops are unchanged.
  TempDir tmp("replay-configs");
  const fs::path norm_dir = tmp.path / "cpu" / "rmsnorm";
  fs::create_directories(norm_dir);
  const std::string name = "hidden=896,device_name=" + device_name + ",dtype=bf16.json";
  std::ofstream(norm_dir / name)
      << R"({"1": {"variant": "rmsnorm_bf16__ref"}, "16": {"variant": "rmsnorm_bf16__ref"}})";
  // (Without the shipped configs: their exact-M rows would win over this
  // dir's nearest rows for the M values in between, as the merge rule says.)
  CliResult c = run_cli({"replay", "--json", "--steps", "3", "--no-shipped-configs", "--configs", tmp.path.string()});
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  simdjson::dom::element cdoc = parser.parse(simdjson::padded_string(c.out));
  CHECK(int64_t(cdoc["steps"]) == 3);
  simdjson::dom::element rms = cdoc["ops"]["rmsnorm"];
  CHECK(int64_t(rms["calls"]) == 3);
  CHECK(int64_t(rms["hits"]) == 3);
  CHECK(int64_t(rms["defaults"]) == 0);
  CHECK(int64_t(rms["sources"][tmp.path.string() + "/cpu/rmsnorm/" + name]) == 3);
  CHECK(int64_t(rms["variants"]["rmsnorm_bf16__ref"]) == 3);
  // Another op is another key: the rmsnorm file never serves fused_add_rmsnorm.
  simdjson::dom::element fused_sources = cdoc["ops"]["fused_add_rmsnorm"]["sources"];
  CHECK(fused_sources["cpu/rmsnorm/" + name].error() == simdjson::NO_SUCH_FIELD);
}

TEST_CASE("cli: replay traces, models and errors") {
  TempDir tmp("replay-trace");
  // A recorded trace: separators, comments, blank lines.
  const fs::path good = tmp.path / "ms.txt";
  std::ofstream(good) << "# recorded M values\n1, 3\n\n5   # a prefill\n";
  CliResult r = run_cli({"replay", "--json", "--trace", good.string(), "--dtype", "fp32"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(r.out));
  CHECK(str(doc["trace"]) == good.string());
  CHECK(int64_t(doc["steps"]) == 3);
  CHECK(int64_t(doc["max_m"]) == 5);
  CHECK(int64_t(doc["ops"]["rmsnorm"]["calls"]) == 3);

  // A bad value: the message names the file and the line.
  const fs::path bad = tmp.path / "bad.txt";
  std::ofstream(bad) << "1 2\n# comment\n3, x4\n";
  CliResult b = run_cli({"replay", "--trace", bad.string()});
  CHECK(b.exit_code == 2);
  CHECK(b.err.find(bad.string() + ":3") != std::string::npos);
  CHECK(b.err.find("x4") != std::string::npos);
  // Zero is not a batch size either.
  std::ofstream(bad) << "1\n0\n";
  CliResult z = run_cli({"replay", "--trace", bad.string()});
  CHECK(z.exit_code == 2);
  CHECK(z.err.find(bad.string() + ":2") != std::string::npos);
  // Neither a built-in trace nor a file.
  CliResult nf = run_cli({"replay", "--trace", (tmp.path / "missing.txt").string()});
  CHECK(nf.exit_code == 2);
  CHECK(nf.err.find("missing.txt") != std::string::npos);

  // Unknown model: exit 2, the message names it and lists the known ones.
  CliResult m = run_cli({"replay", "--model", "gpt-17"});
  CHECK(m.exit_code == 2);
  CHECK(m.err.find("gpt-17") != std::string::npos);
  for (const char* known :
       {"qwen2.5-0.5b", "qwen2.5-7b", "llama-3-8b", "llama-3-70b-tp8", "llama-3-8b-fp8", "deepseek-v3-dense-fp8"})
    CHECK_MESSAGE(m.err.find(known) != std::string::npos, known);

  CliResult dt = run_cli({"replay", "--dtype", "fp16"});
  CHECK(dt.exit_code == 2);
  CHECK(dt.err.find("fp16") != std::string::npos);

  // Text mode: the header and the per-op table.
  CliResult t = run_cli({"replay", "--steps", "2", "--trace", "mixed"});
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  CHECK(t.out.find("backend      cpu") != std::string::npos);
  CHECK(t.out.find("device_name  " + dispatch::cpu_device_info().device_name) != std::string::npos);
  CHECK(t.out.find("model        qwen2.5-0.5b") != std::string::npos);
  CHECK(t.out.find("default (get_default)") != std::string::npos);
}

TEST_CASE("cli: replay of the sharded Llama-3-70B shapes") {
  // One short pass: the qkv/o/gate_up/down shapes are per rank (N or K / 8).
  CliResult r = run_cli({"replay", "--json", "--model", "llama-3-70b-tp8", "--steps", "1", "--trace", "decode"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(r.out));
  std::set<std::pair<int64_t, int64_t>> shapes;
  for (simdjson::dom::element s : doc["sites"].get_array())
    if (str(s["op"]) == "gemm") shapes.insert({int64_t(s["N"]), int64_t(s["K"])});
  const std::set<std::pair<int64_t, int64_t>> expected = {{1280, 8192}, {8192, 1024}, {7168, 8192}, {8192, 3584}};
  CHECK(shapes == expected);
  CHECK(int64_t(doc["ops"]["gemm"]["calls"]) == 4 * 80);
  // act_fn's d is the rank's share of the intermediate size.
  int64_t d = 0;
  for (simdjson::dom::element s : doc["sites"].get_array())
    if (str(s["op"]) == "silu_and_mul") d = int64_t(s["d"]);
  CHECK(d == 28672 / 8);
  CHECK(int64_t(doc["ops"]["silu_and_mul"]["calls"]) == 80);
}

TEST_CASE("cli: replay calls silu_and_mul between gate_up_proj and down_proj, once per layer") {
  CliResult r = run_cli({"replay", "--json", "--steps", "3"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(r.out));
  CHECK(bool(doc["output_finite"]));
  // Every op of the report is an op of the library's list.
  std::set<std::string> listed;
  for (const dispatch::OpInfo& op : dispatch::op_list()) listed.insert(std::string(op.name));
  for (auto [name, v] : simdjson::dom::object(doc["ops"])) CHECK_MESSAGE(listed.count(std::string(name)), name);

  simdjson::dom::element silu = doc["ops"]["silu_and_mul"];
  const int64_t calls = silu["calls"];
  CHECK(calls == 24 * 3);  // Qwen2.5-0.5B: 24 layers, 3 forward passes
  CHECK(int64_t(silu["hits"]) + int64_t(silu["defaults"]) == calls);
  CHECK(int64_t(silu["sources"]["default"]) == int64_t(silu["defaults"]));
  CHECK(double(silu["us_per_call"]) > 0.0);
  int64_t variant_calls = 0;
  for (auto [v, n] : simdjson::dom::object(silu["variants"])) {
    CHECK(std::string_view(v).rfind("silu_and_mul_bf16__", 0) == 0);
    variant_calls += int64_t(n);
  }
  CHECK(variant_calls == calls);

  // The sites in call order: act_fn right after gate_up_proj, before down_proj,
  // called as often as every other per-layer site.
  std::vector<std::string> names;
  for (simdjson::dom::element s : doc["sites"].get_array()) {
    names.push_back(str(s["name"]));
    if (names.back() == "input_layernorm[0]") continue;  // layer 0 only
    CHECK_MESSAGE(int64_t(s["calls"]) == calls, names.back());
    if (str(s["op"]) != "silu_and_mul") continue;
    CHECK(names.back() == "act_fn");
    CHECK(int64_t(s["d"]) == 4864);  // Qwen2.5-0.5B's intermediate_size
    CHECK(double(s["us_per_call"]) > 0.0);
  }
  const std::vector<std::string> order = {
      "input_layernorm[0]", "qkv_proj", "o_proj",    "post_attention_layernorm",
      "gate_up_proj",       "act_fn",   "down_proj", "input_layernorm[1:]+final_norm"};
  CHECK(names == order);
  CHECK(int64_t(doc["ops"]["fused_add_rmsnorm"]["calls"]) == 2 * calls);
  CHECK(int64_t(doc["ops"]["gemm"]["calls"]) == 4 * calls);

  // Text mode: its row in the op table, its site and where its configs came from.
  CliResult t = run_cli({"replay", "--steps", "1"});
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  CHECK(t.out.find("\nsilu_and_mul ") != std::string::npos);
  CHECK(t.out.find("\nact_fn ") != std::string::npos);
  CHECK(t.out.find("d=4864") != std::string::npos);
  CHECK(t.out.find("\n  silu_and_mul\n") != std::string::npos);
  // The help texts name the ops from the op list: the ops replay's model calls, tune's --op.
  CliResult h = run_cli({"replay", "--help"});
  CHECK(h.out.find("silu_and_mul") != std::string::npos);
  CliResult th = run_cli({"tune", "--help"});
  for (const std::string& op : listed) CHECK_MESSAGE(th.out.find(op) != std::string::npos, op);
}

namespace {

// The rows of a misses CSV as (lower-cased column -> value) maps; the key
// column is quoted (it holds commas).
std::vector<std::map<std::string, std::string>> read_misses_csv(const fs::path& path) {
  const auto split = [](const std::string& line) {
    std::vector<std::string> f;
    std::string cur;
    bool quoted = false;
    for (char c : line) {
      if (c == '"')
        quoted = !quoted;
      else if (c == ',' && !quoted)
        f.push_back(std::exchange(cur, {}));
      else
        cur += c;
    }
    f.push_back(cur);
    return f;
  };
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> header;
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (header.empty()) {
      header = split(line);
      for (std::string& h : header)
        for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      continue;
    }
    const std::vector<std::string> f = split(line);
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < header.size() && i < f.size(); ++i) row[header[i]] = f[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

// The sites of a replay's JSON: (name, op) in call order, and each one's calls.
struct SiteRow {
  std::string name, op;
  int64_t calls = 0, n = 0, k = 0, hidden = 0, d = 0;
};
std::vector<SiteRow> sites_of(simdjson::dom::element doc) {
  std::vector<SiteRow> out;
  for (simdjson::dom::element s : doc["sites"].get_array()) {
    SiteRow r{str(s["name"]), str(s["op"]), int64_t(s["calls"])};
    const auto field = [&](const char* name) {
      int64_t v = 0;
      return s[name].get(v) == simdjson::SUCCESS ? v : int64_t{0};
    };
    r.n = field("N");
    r.k = field("K");
    r.hidden = field("hidden");
    r.d = field("d");
    out.push_back(r);
  }
  return out;
}

}  // namespace

TEST_CASE("cli: replay of llama-3-8b-fp8 runs every projection as quant_fp8_group then gemm_fp8_block") {
  // One decoder layer (--layers 1) of Llama-3-8B's shapes, two decode steps (M = 1, 1).
  CliResult r = run_cli({"replay", "--json", "--model", "llama-3-8b-fp8", "--layers", "1", "--steps", "2"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(r.out));
  CHECK(str(doc["model"]) == "llama-3-8b-fp8");
  CHECK(str(doc["dtype"]) == "bf16");
  CHECK(str(doc["projections"]) == "fp8_e4m3fn block 128x128");
  CHECK(int64_t(doc["layers"]) == 1);
  CHECK(int64_t(doc["steps"]) == 2);
  CHECK(bool(doc["output_finite"]));
  // Per step: 1 rmsnorm, 2 fused_add_rmsnorm, 4 quantisations, 4 fp8 GEMMs,
  // 1 silu_and_mul per layer; no bf16 gemm.
  const std::pair<const char*, int64_t> per_step[] = {
      {"rmsnorm", 1}, {"fused_add_rmsnorm", 2}, {"quant_fp8_group", 4}, {"gemm_fp8_block", 4}, {"silu_and_mul", 1}};
  std::set<std::string> ops;
  for (auto [name, v] : simdjson::dom::object(doc["ops"])) ops.insert(std::string(name));
  CHECK(ops ==
        std::set<std::string>{"rmsnorm", "fused_add_rmsnorm", "quant_fp8_group", "gemm_fp8_block", "silu_and_mul"});
  for (const auto& [op, n] : per_step) {
    CAPTURE(op);
    simdjson::dom::element s = doc["ops"][op];
    CHECK(int64_t(s["calls"]) == 2 * n);
    CHECK(int64_t(s["hits"]) + int64_t(s["defaults"]) == 2 * n);
  }
  CHECK(int64_t(doc["ops"]["gemm_fp8_block"]["variants"]["gemm_fp8_block_e4m3fn__tiled"]) == 8);
  for (auto [v, n] : simdjson::dom::object(doc["ops"]["quant_fp8_group"]["variants"]))
    CHECK(std::string_view(v).rfind("quant_fp8_group_bf16__", 0) == 0);

  // The sites in call order: each projection's quantisation right before its
  // GEMM, with the GEMM's K; Llama-3-8B's qkv N = (32 + 2 * 8) * 128.
  const std::vector<SiteRow> sites = sites_of(doc);
  std::vector<std::string> names;
  for (const SiteRow& s : sites) names.push_back(s.name);
  const std::vector<std::string> order = {"input_layernorm[0]", "qkv_proj.quant", "qkv_proj",
                                          "o_proj.quant",       "o_proj",         "post_attention_layernorm",
                                          "gate_up_proj.quant", "gate_up_proj",   "act_fn",
                                          "down_proj.quant",    "down_proj",      "input_layernorm[1:]+final_norm"};
  CHECK(names == order);
  for (size_t i = 0; i < sites.size(); ++i) {
    const SiteRow& s = sites[i];
    CAPTURE(s.name);
    CHECK(s.calls == 2);  // 2 steps x 1 layer (input_layernorm[0]: once per step)
    if (s.op == "quant_fp8_group") {
      REQUIRE(i + 1 < sites.size());
      CHECK(sites[i + 1].op == "gemm_fp8_block");
      CHECK(s.name == sites[i + 1].name + ".quant");
      CHECK(s.k == sites[i + 1].k);
    }
  }
  std::map<std::string, std::pair<int64_t, int64_t>> gemms;
  for (const SiteRow& s : sites)
    if (s.op == "gemm_fp8_block") gemms[s.name] = {s.n, s.k};
  const std::map<std::string, std::pair<int64_t, int64_t>> expected = {{"qkv_proj", {6144, 4096}},
                                                                       {"o_proj", {4096, 4096}},
                                                                       {"gate_up_proj", {28672, 4096}},
                                                                       {"down_proj", {4096, 14336}}};
  CHECK(gemms == expected);

  // Text mode: the fp8 dtype line and the quantisation sites.
  CliResult t = run_cli({"replay", "--model", "llama-3-8b-fp8", "--layers", "1", "--steps", "1"});
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  CHECK(t.out.find("model        llama-3-8b-fp8") != std::string::npos);
  CHECK(t.out.find("layers       1 of 32 per forward pass") != std::string::npos);
  CHECK(t.out.find("dtype        bf16; projections fp8_e4m3fn") != std::string::npos);
  CHECK(t.out.find("\nqkv_proj.quant ") != std::string::npos);
  CHECK(t.out.find("N=6144,K=4096") != std::string::npos);

  // --layers beyond the model's: a usage error naming the model's count.
  CliResult bad = run_cli({"replay", "--model", "llama-3-8b-fp8", "--layers", "33"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("1..32") != std::string::npos);
  CHECK(run_cli({"replay", "--layers", "0"}).exit_code == 2);
  // The help names the fp8 models, the fp8 ops and --layers.
  CliResult h = run_cli({"replay", "--help"});
  for (const char* word : {"llama-3-8b-fp8", "deepseek-v3-dense-fp8", "quant_fp8_group", "gemm_fp8_block", "--layers"})
    CHECK_MESSAGE(h.out.find(word) != std::string::npos, word);
}

TEST_CASE("cli: misses of llama-3-8b-fp8 name the fp8 keys, tune --op gemm_fp8_block consumes them, replay hits") {
  TempDir tmp("fp8-misses");
  const fs::path csv = tmp.path / "misses.csv";
  CliResult m = run_cli({"misses", "--export", csv.string(), "--model", "llama-3-8b-fp8", "--layers", "1", "--steps",
                         "1", "--no-shipped-configs", "--json"});
  REQUIRE_MESSAGE(m.exit_code == 0, m.err);
  simdjson::dom::parser parser;
  simdjson::dom::element mdoc = parser.parse(simdjson::padded_string(m.out));
  CHECK(int64_t(mdoc["layers"]) == 1);
  CHECK(int64_t(mdoc["ops"]["gemm_fp8_block"]["misses"]) == 4);
  CHECK(int64_t(mdoc["ops"]["gemm_fp8_block"]["keys"]) == 4);
  CHECK(int64_t(mdoc["ops"]["quant_fp8_group"]["misses"]) == 4);
  CHECK(int64_t(mdoc["ops"]["quant_fp8_group"]["keys"]) == 2);  // K = 4096 (qkv, o, gate_up) and 14336 (down)

  const auto rows = read_misses_csv(csv);
  const auto find = [&](const std::string& op, const std::string& n, const std::string& k) {
    for (const auto& r : rows)
      if (r.at("op") == op && r.at("n") == n && r.at("k") == k) return &r;
    return static_cast<const std::map<std::string, std::string>*>(nullptr);
  };
  const auto* qkv = find("gemm_fp8_block", "6144", "4096");
  REQUIRE(qkv != nullptr);
  CHECK(qkv->at("m") == "1");
  CHECK(qkv->at("dtype") == "fp8_e4m3fn");
  CHECK(qkv->at("out_dtype") == "bf16");
  CHECK(qkv->at("bias") == "false");
  CHECK(qkv->at("key").find("cpu/gemm_fp8_block|") == 0);
  CHECK(qkv->at("key").find("N=6144,dtype=fp8_e4m3fn,out_dtype=bf16") != std::string::npos);
  const auto* quant = find("quant_fp8_group", "", "4096");
  REQUIRE(quant != nullptr);
  CHECK(quant->at("dtype") == "bf16");
  CHECK(quant->at("out_dtype") == "fp8_e4m3fn");
  CHECK(find("gemm_fp8_block", "4096", "14336") != nullptr);
  CHECK(find("gemm_fp8_block", "28672", "4096") != nullptr);
  CHECK(find("quant_fp8_group", "", "14336") != nullptr);

  // Tune the fp8 GEMM rows; --max-flops keeps the smallest (o_proj, N=K=4096
  // at M=1: 3.4e7 flops) and reports the other three too large.
  const fs::path emit = tmp.path / "emit";
  CliResult t =
      run_cli({"tune", "--shapes", csv.string(), "--op", "gemm_fp8_block", "--dtype", "fp8_e4m3fn", "--emit",
               emit.string(), "--max-flops", "4e7", "--budget-ms", "100", "--reps", "1", "--no-cold-cache", "--json"});
  REQUIRE_MESSAGE(t.exit_code == 0, t.err);
  simdjson::dom::element tdoc = parser.parse(simdjson::padded_string(t.out));
  CHECK(int64_t(tdoc["shapes"]) == 4);
  CHECK(int64_t(tdoc["tuned"]) == 1);
  CHECK(int64_t(tdoc["skipped_too_large"]) == 3);
  CHECK(int64_t(tdoc["failed"]) == 0);
  std::vector<std::string> files;
  for (simdjson::dom::element f : tdoc["files"].get_array()) files.push_back(str(f));
  REQUIRE(files.size() == 1);
  CHECK(files[0].find("cpu/gemm_fp8_block/N=4096,K=4096,device_name=") == 0);
  CHECK(files[0].find(",dtype=fp8_e4m3fn,out_dtype=bf16") != std::string::npos);

  // The same workload over the emitted table: o_proj's call hits it.
  CliResult r = run_cli({"replay", "--json", "--model", "llama-3-8b-fp8", "--layers", "1", "--steps", "1",
                         "--no-shipped-configs", "--configs", emit.string()});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  simdjson::dom::element rdoc = parser.parse(simdjson::padded_string(r.out));
  simdjson::dom::element g = rdoc["ops"]["gemm_fp8_block"];
  CHECK(int64_t(g["calls"]) == 4);
  CHECK(int64_t(g["hits"]) == 1);
  CHECK(int64_t(g["defaults"]) == 3);
  CHECK(int64_t(g["sources"][emit.string() + "/" + files[0]]) == 1);
}

TEST_CASE("cli: replay of deepseek-v3-dense-fp8 runs MLA's projections at SGLang's H200 block-fp8 shapes") {
  TempDir tmp("deepseek-fp8");
  const fs::path csv = tmp.path / "misses.csv";
  CliResult r = run_cli({"replay", "--json", "--model", "deepseek-v3-dense-fp8", "--layers", "1", "--steps", "1",
                         "--no-shipped-configs", "--export-misses", csv.string()});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(r.out));
  CHECK(str(doc["model"]) == "deepseek-v3-dense-fp8");
  CHECK(bool(doc["output_finite"]));
  // One layer, M = 1: 7 projections (quant + GEMM each), the input norm and
  // MLA's two latent norms, 2 fused add+norms, one silu_and_mul.
  CHECK(int64_t(doc["ops"]["quant_fp8_group"]["calls"]) == 7);
  CHECK(int64_t(doc["ops"]["gemm_fp8_block"]["calls"]) == 7);
  CHECK(int64_t(doc["ops"]["rmsnorm"]["calls"]) == 3);
  CHECK(int64_t(doc["ops"]["fused_add_rmsnorm"]["calls"]) == 2);
  CHECK(int64_t(doc["ops"]["silu_and_mul"]["calls"]) == 1);

  const std::vector<SiteRow> sites = sites_of(doc);
  std::vector<std::string> names;
  std::map<std::string, SiteRow> by_name;
  for (const SiteRow& s : sites) {
    names.push_back(s.name);
    by_name[s.name] = s;
    CHECK_MESSAGE(s.calls == 1, s.name);
  }
  const std::vector<std::string> order = {"input_layernorm[0]",
                                          "q_a_proj.quant",
                                          "q_a_proj",
                                          "q_a_layernorm",
                                          "q_b_proj.quant",
                                          "q_b_proj",
                                          "kv_a_proj_with_mqa.quant",
                                          "kv_a_proj_with_mqa",
                                          "kv_a_layernorm",
                                          "kv_b_proj.quant",
                                          "kv_b_proj",
                                          "o_proj.quant",
                                          "o_proj",
                                          "post_attention_layernorm",
                                          "gate_up_proj.quant",
                                          "gate_up_proj",
                                          "act_fn",
                                          "down_proj.quant",
                                          "down_proj",
                                          "input_layernorm[1:]+final_norm"};
  CHECK(names == order);
  // DeepSeek-V3: hidden 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512,
  // qk_nope/rope 128/64, v_head_dim 128, intermediate 18432.
  const std::map<std::string, std::pair<int64_t, int64_t>> expected = {
      {"q_a_proj", {1536, 7168}},  {"q_b_proj", {24576, 1536}}, {"kv_a_proj_with_mqa", {576, 7168}},
      {"kv_b_proj", {32768, 512}}, {"o_proj", {7168, 16384}},   {"gate_up_proj", {36864, 7168}},
      {"down_proj", {7168, 18432}}};
  for (const auto& [name, nk] : expected) {
    CAPTURE(name);
    CHECK(by_name[name].op == "gemm_fp8_block");
    CHECK(std::make_pair(by_name[name].n, by_name[name].k) == nk);
    CHECK(by_name[name + ".quant"].k == nk.second);
    // SGLang commits an H200 block-fp8 table for every one but q_b_proj and
    // gate_up_proj (tuned only tensor-parallel-sharded there).
    const fs::path sglang = fs::path(kSglang) / "quantization" /
                            ("N=" + std::to_string(nk.first) + ",K=" + std::to_string(nk.second) +
                             ",device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json");
    CHECK(fs::exists(sglang) == (name != "q_b_proj" && name != "gate_up_proj"));
  }
  CHECK(by_name["q_a_layernorm"].hidden == 1536);
  CHECK(by_name["kv_a_layernorm"].hidden == 512);
  CHECK(by_name["input_layernorm[0]"].hidden == 7168);
  CHECK(by_name["act_fn"].d == 18432);

  // The misses name the fp8 keys: o_proj's N=7168,K=16384 among them.
  const auto rows = read_misses_csv(csv);
  bool o_proj = false, quant = false;
  for (const auto& row : rows) {
    o_proj = o_proj || (row.at("op") == "gemm_fp8_block" && row.at("n") == "7168" && row.at("k") == "16384" &&
                        row.at("dtype") == "fp8_e4m3fn" && row.at("out_dtype") == "bf16");
    quant = quant || (row.at("op") == "quant_fp8_group" && row.at("k") == "16384");
  }
  CHECK(o_proj);
  CHECK(quant);
}

#endif  // KDISPATCH_CLI_PATH
