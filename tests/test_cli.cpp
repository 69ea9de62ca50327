// SPDX-License-Identifier: Apache-2.0
// Tests of the `kdispatch` command-line tool: runs the built binary
// (KDISPATCH_CLI_PATH) on the shared SGLang config tree and on temp dirs,
// and checks exit codes, JSON output (parsed with simdjson) and messages.
#include <doctest/doctest.h>
#include <simdjson.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
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
  for (const char* foreign : {"fused_moe_triton/causal_conv1d_fwd_sm_95.json",
                              "fused_moe_triton/causal_conv1d_fwd_with_prefix_sm_95.json",
                              "fused_moe_triton/minimax_m3_gfx950_mxfp8_compact_moe.json",
                              "fused_moe_triton/update_sconv_cache_sm_90.json"})
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
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"BLOCK_SIZE_M", 16}, {"BLOCK_SIZE_N", 64}, {"BLOCK_SIZE_K", 128},
      {"GROUP_SIZE_M", 1},  {"num_warps", 4},     {"num_stages", 5}};
  const std::string file = "triton_3_5_1/E=257,N=256,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json";

  // The expectation is the file's own "1" row.
  {
    simdjson::dom::parser p;
    simdjson::dom::element row = p.load(dir + "/" + file)["1"];
    std::vector<std::pair<std::string, int64_t>> in_file;
    for (auto [k, v] : simdjson::dom::object(row)) in_file.emplace_back(std::string(k), int64_t(v));
    REQUIRE(in_file == expected);
  }

  const std::vector<std::string> base = {"lookup", "--configs", dir, "--backend-version", "3.5.1", "--device",
                                         "NVIDIA H200", "--key", "E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]"};
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
  std::ofstream(norm_dir / name) << R"({"1": {"variant": "rmsnorm_bf16__ref"}, "16": {"variant": "rmsnorm_bf16__ref"}})";
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
  for (const char* known : {"qwen2.5-0.5b", "qwen2.5-7b", "llama-3-8b", "llama-3-70b-tp8"})
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
  const std::vector<std::string> order = {"input_layernorm[0]", "qkv_proj", "o_proj", "post_attention_layernorm",
                                          "gate_up_proj", "act_fn", "down_proj", "input_layernorm[1:]+final_norm"};
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

#endif  // KDISPATCH_CLI_PATH
