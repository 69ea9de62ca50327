// SPDX-License-Identifier: Apache-2.0
// Verifying committed rows on this machine (issue 32 item 4) and what a
// tuned row records of how it was chosen (item 3): the verdicts, the
// demotion after two losses, the verdict cache, the background verification,
// lookup's note on a CPU row tuned elsewhere, the row files' metadata and
// `kdispatch verify`. On the CPU backend; where a verdict must be certain,
// the search's timing hook replaces the measured medians (every kernel still
// runs and is validated).
#include <doctest/doctest.h>
#include <simdjson.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backends/registry.hpp"
#include "cli_util.hpp"
#include "backends/cpu/cpu_identity.hpp"
#include "dispatch/dispatch.hpp"
#include "store/filename.hpp"
#include "store/fingerprint.hpp"
#include "store/writer.hpp"
#include "test_util.hpp"
#include "tune/search.hpp"
#include "tune/verify.hpp"

using namespace dispatch;
using kdtest::contains;
using kdtest::read_text;
using kdtest::TempDir;
using kdtest::write_text;
namespace fs = std::filesystem;

namespace {

constexpr const char* kFields = "hidden=256,dtype=fp32";

core::Problem norm_problem(int64_t m, const char* fields = kFields) {
  auto f = store::parse_key_fields(fields);
  REQUIRE(f.ok());
  auto p = store::own_problem_from_fields(core::OpKind::rmsnorm, *f);
  REQUIRE(p.ok());
  p->m = m;
  p->device = Device{DeviceType::cpu, 0};
  return *p;
}

// The floor of the test key on this host (get_default's plan on the CPU).
core::Plan floor_of(int64_t m, const char* fields = kFields) {
  return core::floor_plan(norm_problem(m, fields), cpu_device_info());
}

// A plan of the vectorised rmsnorm that is not the floor: vec=4 (SSE2,
// every x86-64 host) with `unroll`, or the next unroll when that is the floor.
core::Plan row_plan(int64_t m, int64_t unroll = 1, const char* fields = kFields) {
  const core::VariantDef* v = core::find_variant("rmsnorm_fp32__vec");
  REQUIRE(v != nullptr);
  core::Plan p{v, {4, unroll}};
  if (p == floor_of(m, fields)) p.params[1] = unroll == 1 ? 2 : 1;
  return p;
}

// The canonical key (fields sorted by name) of "hidden=<h>,dtype=fp32".
std::string key_of(const char* fields = kFields) {
  std::string f = fields;
  const size_t comma = f.find(',');
  return "cpu/rmsnorm|" + cpu_device_info().device_name + "|" + f.substr(comma + 1) + "," + f.substr(0, comma);
}

std::string file_name(const char* hidden = "256") {
  return std::string("hidden=") + hidden + ",device_name=" + cpu_device_info().device_name + ",dtype=fp32.json";
}

// A committed table with one row at M (the "cpu" metadata `cpu`, "" none).
void write_row_file(const fs::path& dir, int64_t m, const core::Plan& plan, const std::string& cpu,
                    const char* hidden = "256") {
  std::string meta = "{\"tool\": \"kdispatch 0.1.0\"";
  if (!cpu.empty()) meta += ", \"cpu\": " + cpu;
  meta += "}";
  write_text(dir / "cpu" / "rmsnorm" / file_name(hidden),
             "{\n    \"kdispatch\": " + meta + ",\n    \"" + std::to_string(m) +
                 "\": " + config_to_json(core::plan_to_config(plan)) + "\n}\n");
}

// The timing hook for a scope: the floor takes floor_us[placement] µs (the
// search's own timing: placement 0's), every other plan row_us(placement).
struct ScriptedTimes {
  core::Plan floor;
  double floor_us[4] = {100.0, 100.0, 102.0, 100.0};  // an A/A spread of 2 / 100.5
  std::function<double(const core::Plan&, int)> row_us;
  explicit ScriptedTimes(core::Plan f, std::function<double(const core::Plan&, int)> r)
      : floor(f), row_us(std::move(r)) {
    tune::set_timing_hook_for_testing([this](const core::Plan& p, int pl, double) {
      const int at = pl < 0 ? 0 : pl;
      return p == floor ? floor_us[at] : row_us(p, at);
    });
  }
  ~ScriptedTimes() { tune::set_timing_hook_for_testing({}); }
  ScriptedTimes(const ScriptedTimes&) = delete;
  ScriptedTimes& operator=(const ScriptedTimes&) = delete;
};

RuntimeOptions verify_options(const TempDir& cfg, const TempDir& cache) {
  RuntimeOptions o = kdtest::options_for({cfg.str()});
  o.tune.cache_dir = cache.str();
  o.tune.persist = true;
  o.tune.load_cache = false;
  o.tune.cold_cache = false;  // quick: the hook decides
  o.tune.reps = 3;
  return o;
}

LookupQuery norm_query(int64_t m, const char* fields = kFields) {
  LookupQuery q;
  q.op = "rmsnorm";
  q.key = fields;
  q.M = m;
  return q;
}

Config served(const Runtime& rt, int64_t m, const char* fields = kFields) {
  return kdtest::lookup_ok(rt, norm_query(m, fields)).config;
}

// Another vendor than this host's.
std::string other_vendor() { return host_cpu_identity().vendor == "AuthenticAMD" ? "GenuineIntel" : "AuthenticAMD"; }

}  // namespace

TEST_CASE(
    "verify: a row slower than the floor by more than the margin is demoted after exactly two verifications, and a win "
    "resets the count") {
  TempDir cfg, cache;
  const core::Plan floor = floor_of(4), row = row_plan(4);
  write_row_file(cfg.path(), 4, row, host_cpu_identity().to_json());
  double row_us = 110.0;  // 10% slower than the floor everywhere
  ScriptedTimes times(floor, [&](const core::Plan&, int) { return row_us; });
  auto rt = kdtest::make_runtime(verify_options(cfg, cache));
  CHECK(served(*rt, 4) == core::plan_to_config(row));

  // First verification: a loss, not yet a demotion.
  auto r1 = verify_rows(*rt, "rmsnorm");
  REQUIRE(r1.ok());
  REQUIRE(r1->rows.size() == 1);
  const RowVerification& v1 = r1->rows[0];
  REQUIRE_MESSAGE(v1.status.ok(), v1.status.to_string());
  CHECK(v1.op == "rmsnorm");
  CHECK(v1.key == key_of());
  CHECK(v1.m == 4);
  CHECK(v1.outcome == "lost");
  CHECK(v1.verdict == "lost once");
  CHECK(v1.losses == 1);
  CHECK(v1.required_margin == 0.02);
  REQUIRE(v1.ratios.size() == 4);
  CHECK(v1.ratios[0] == doctest::Approx(1.1));
  CHECK(v1.ratios[2] == doctest::Approx(110.0 / 102.0));
  CHECK(v1.margin == doctest::Approx(1.0 - (3 * 1.1 + 110.0 / 102.0) / 4));
  CHECK(v1.aa_spread == doctest::Approx(2.0 / 100.5));
  CHECK(v1.floor_us == doctest::Approx(100.5));
  CHECK(v1.row_us == doctest::Approx(110.0));
  CHECK(v1.timing == "cold");
  CHECK(r1->demoted == 0);
  CHECK(served(*rt, 4) == core::plan_to_config(row));  // one loss never demotes
  CHECK(kdtest::lookup_ok(*rt, norm_query(4)).note.empty());

  // Second: demoted; the floor serves the row's M (and the Ms nearest it).
  auto r2 = verify_rows(*rt, "rmsnorm");
  REQUIRE(r2.ok());
  REQUIRE(r2->rows.size() == 1);
  CHECK(r2->rows[0].verdict == "demoted");
  CHECK(r2->rows[0].losses == 2);
  CHECK(r2->demoted == 1);
  CHECK(served(*rt, 4) == core::plan_to_config(floor));
  CHECK(served(*rt, 9) == core::plan_to_config(floor));
  const LookupResult demoted = kdtest::lookup_ok(*rt, norm_query(4));
  CHECK(contains(demoted.note, "demoted on this machine"));
  CHECK(contains(demoted.note, "the floor's plan at M=4 serves (at the Ms nearest it too, as the row did): " +
                                   core::plan_to_string(floor)));

  // A later runtime reads the verdict cache: the row stays demoted.
  auto rt2 = kdtest::make_runtime(verify_options(cfg, cache));
  CHECK(served(*rt2, 4) == core::plan_to_config(floor));

  // A win resets the count: the row serves again.
  row_us = 90.0;
  auto r3 = verify_rows(*rt2, "rmsnorm");
  REQUIRE(r3.ok());
  REQUIRE(r3->rows.size() == 1);
  CHECK(r3->rows[0].outcome == "ahead");
  CHECK(r3->rows[0].verdict == "ahead");
  CHECK(r3->rows[0].losses == 0);
  CHECK(served(*rt2, 4) == core::plan_to_config(row));
  CHECK(kdtest::lookup_ok(*rt2, norm_query(4)).note.empty());

  // After the reset one loss is again only one.
  row_us = 110.0;
  auto r4 = verify_rows(*rt2, "rmsnorm");
  REQUIRE(r4.ok());
  CHECK(r4->rows[0].verdict == "lost once");
  CHECK(served(*rt2, 4) == core::plan_to_config(row));
  // Within the margin (faster on three placements, slower on one): neither.
  row_us = 101.0;
  auto r5 = verify_rows(*rt2, "rmsnorm");
  REQUIRE(r5.ok());
  CHECK(r5->rows[0].outcome == "within margin");
  CHECK(r5->rows[0].losses == 1);  // not a win: the count stays
  CHECK(served(*rt2, 4) == core::plan_to_config(row));

  // Without a cache dir the verdicts live in the runtime's memory: the same two steps.
  row_us = 110.0;
  RuntimeOptions mem = verify_options(cfg, cache);
  mem.tune.persist = false;
  mem.tune.cache_dir.clear();
  auto rt3 = kdtest::make_runtime(mem);
  REQUIRE(rt3->cache_dir().empty());
  auto m1 = verify_rows(*rt3, "rmsnorm");
  REQUIRE(m1.ok());
  CHECK(m1->rows[0].verdict == "lost once");
  CHECK(m1->rows[0].recorded_in.empty());
  CHECK(served(*rt3, 4) == core::plan_to_config(row));
  auto m2 = verify_rows(*rt3, "rmsnorm");
  REQUIRE(m2.ok());
  CHECK(m2->rows[0].verdict == "demoted");
  CHECK(served(*rt3, 4) == core::plan_to_config(floor));
  CHECK(contains(kdtest::lookup_ok(*rt3, norm_query(4)).note, "(in memory)"));
}

TEST_CASE(
    "verify: the verdict cache holds the row's verdict under this machine's fingerprint and CPU, and is ignored under "
    "another") {
  TempDir cfg, cache;
  const core::Plan floor = floor_of(4), row = row_plan(4);
  write_row_file(cfg.path(), 4, row, host_cpu_identity().to_json());
  ScriptedTimes times(floor, [](const core::Plan&, int) { return 110.0; });
  auto rt = kdtest::make_runtime(verify_options(cfg, cache));
  REQUIRE(verify_rows(*rt, "rmsnorm").ok());

  const std::string identity = tune::verdict_identity(DeviceType::cpu);
  const std::string path = tune::verdict_path(cache.str(), DeviceType::cpu, identity);
  CHECK(contains(path, cache.str() + "/.verify/cpu-"));
  const std::string text = read_text(path);
  CHECK(contains(text, "\"identity\": {\"fingerprint\": " + store::cpu_fingerprint().to_json() +
                           ", \"cpu\": " + host_cpu_identity().to_json() + "}"));
  CHECK(contains(text, "\"" + key_of() + " M=4\": {\"config\": " + config_to_json(core::plan_to_config(row)) +
                           ", \"state\": \"lost once\", \"losses\": 1, \"verifications\": 1, \"last\": \"lost\""));
  CHECK(contains(text, "\"aa_spread\": 0.0199, \"margin\": 0.02"));
  CHECK(contains(text, "\"source\": \"cpu/rmsnorm/" + file_name() + "\""));
  const tune::Verdicts v = tune::load_verdicts(path, identity);
  REQUIRE(v.rows.size() == 1);
  const tune::Verdict* d = v.find(tune::row_id(key_of(), 4), config_to_json(core::plan_to_config(row)));
  REQUIRE(d != nullptr);
  CHECK(d->losses == 1);
  CHECK(v.find(tune::row_id(key_of(), 4), "{}") == nullptr);  // another config: no verdict

  // Another fingerprint (a new build): the file reads as empty, and its
  // verdicts go to another file.
  store::Fingerprint other = store::cpu_fingerprint();
  for (auto& [axis, value] : other.axes)
    if (axis == "kernels") value = "0000";
  const std::string other_identity =
      "{\"fingerprint\": " + other.to_json() + ", \"cpu\": " + host_cpu_identity().to_json() + "}";
  CHECK(tune::load_verdicts(path, other_identity).rows.empty());
  CHECK(tune::verdict_path(cache.str(), DeviceType::cpu, other_identity) != path);

  // Two losses recorded under the other fingerprint, in this machine's file:
  // a runtime of this build ignores them (the file is another identity's).
  const std::string cfg_text = config_to_json(core::plan_to_config(row));
  for (int i = 0; i < 2; ++i)
    REQUIRE(tune::record_verdict(cache.str(), DeviceType::cpu, other_identity, tune::row_id(key_of(), 4), cfg_text,
                                 tune::Outcome::lost, 1.1, 0.01, 0.02, "x")
                .ok());
  std::filesystem::rename(tune::verdict_path(cache.str(), DeviceType::cpu, other_identity), path);
  CHECK(tune::load_verdicts(path, other_identity).find(tune::row_id(key_of(), 4), cfg_text)->demoted());
  auto rt2 = kdtest::make_runtime(verify_options(cfg, cache));
  CHECK(served(*rt2, 4) == core::plan_to_config(row));
  // ... and this build's next record starts that file afresh.
  auto again = verify_rows(*rt2, "rmsnorm");
  REQUIRE(again.ok());
  CHECK(again->rows[0].losses == 1);
  CHECK(tune::load_verdicts(path, other_identity).rows.empty());
}

TEST_CASE("verify: counts this library never writes, or a symlinked .verify dir, demote nothing") {
  TempDir cache, elsewhere;
  const std::string identity = tune::verdict_identity(DeviceType::cpu);
  const std::string path = tune::verdict_path(cache.str(), DeviceType::cpu, identity);
  const std::string id = tune::row_id(key_of(), 4), cfg_text = config_to_json(core::plan_to_config(row_plan(4)));
  for (int i = 0; i < 2; ++i)
    REQUIRE(tune::record_verdict(cache.str(), DeviceType::cpu, identity, id, cfg_text, tune::Outcome::lost, 1.1, 0.01,
                                 0.02, "x")
                .ok());
  REQUIRE(tune::load_verdicts(path, identity).find(id, cfg_text) != nullptr);
  CHECK(tune::load_verdicts(path, identity).find(id, cfg_text)->demoted());
  const std::string text = read_text(path);
  const std::string two = "\"losses\": 2, \"verifications\": 2";
  REQUIRE(contains(text, two));
  auto rewrite = [&](const std::string& counts) {
    std::string t = text;
    t.replace(t.find(two), two.size(), counts);
    std::ofstream(path, std::ios::trunc) << t;
  };
  // 2^32 + 2 losses (2 as an int32), more losses than verifications, none
  // recorded, a negative count: the row reads as unverified.
  for (const char* counts :
       {"\"losses\": 4294967298, \"verifications\": 4294967298", "\"losses\": 3, \"verifications\": 2",
        "\"verifications\": 2", "\"losses\": -1, \"verifications\": 2"}) {
    INFO(counts);
    rewrite(counts);
    CHECK(tune::load_verdicts(path, identity).find(id, cfg_text) == nullptr);
  }
  rewrite(two);
  REQUIRE(tune::load_verdicts(path, identity).find(id, cfg_text) != nullptr);
  // The same file through a symlinked .verify: not read (record_verdict
  // never writes through one either).
  std::filesystem::rename(cache.path() / ".verify", elsewhere.path() / "v");
  std::filesystem::create_directory_symlink(elsewhere.path() / "v", cache.path() / ".verify");
  CHECK(tune::load_verdicts(path, identity).rows.empty());
  CHECK_FALSE(tune::record_verdict(cache.str(), DeviceType::cpu, identity, id, cfg_text, tune::Outcome::lost, 1.1, 0.01,
                                   0.02, "x")
                  .ok());
}

TEST_CASE(
    "verify: KDISPATCH_VERIFY_SHIPPED's background thread verifies committed rows when idle, rows tuned on another CPU "
    "first, and demotes after two losses") {
  TempDir cfg, cache;
  const char* kOther = "hidden=512,dtype=fp32";
  const core::Plan floor = floor_of(4), floor2 = floor_of(4, kOther);
  // Two row plans, neither a floor, told apart by the hook.
  std::vector<core::Plan> plans;
  for (int64_t unroll : {1, 2, 4}) {
    const core::Plan p{core::find_variant("rmsnorm_fp32__vec"), {4, unroll}};
    if (!(p == floor) && !(p == floor2)) plans.push_back(p);
  }
  REQUIRE(plans.size() >= 2);
  const core::Plan native_row = plans[0], foreign_row = plans[1];
  write_row_file(cfg.path(), 4, native_row, host_cpu_identity().to_json());
  write_row_file(cfg.path(), 4, foreign_row,
                 "{\"vendor\": \"" + other_vendor() + "\", \"family\": 25, \"model\": 1, \"name\": \"elsewhere\"}",
                 "512");
  std::mutex mu;
  std::vector<core::Plan> order;  // the rows in the order their verification starts
  ScriptedTimes times(floor, [&](const core::Plan& p, int) { return 120.0; });
  tune::set_timing_hook_for_testing([&](const core::Plan& p, int pl, double) {
    if (p == floor || p == floor2) return times.floor_us[pl < 0 ? 0 : pl];
    if (pl < 0) {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(p);
    }
    return 120.0;
  });
  RuntimeOptions o = verify_options(cfg, cache);
  o.tune.verify_shipped = true;  // tuning mode off: the thread runs for the verification alone
  o.tune.duty_cycle = 1.0;
  auto rt = kdtest::make_runtime(o);
  REQUIRE(rt->wait_tuner_idle(120.0));
  const TuneStats s = rt->tune_stats();
  CHECK(s.rows_verified == 4);  // each row twice: a loss, then once more after the others
  CHECK(s.rows_demoted == 2);
  CHECK(s.rows_to_verify == 0);
  CHECK(s.shapes_tuned == 0);
  {
    std::lock_guard<std::mutex> lock(mu);
    REQUIRE(order.size() == 4);
    CHECK(order[0] == foreign_row);  // tuned on another vendor: verified first
    CHECK(order[1] == native_row);
    CHECK(order[2] == foreign_row);
    CHECK(order[3] == native_row);
  }
  CHECK(served(*rt, 4) == core::plan_to_config(floor));
  CHECK(served(*rt, 4, kOther) == core::plan_to_config(floor2));
  // Verified once per verdict: a second runtime finds them all decided.
  auto rt2 = kdtest::make_runtime(o);
  REQUIRE(rt2->wait_tuner_idle(60.0));
  CHECK(rt2->tune_stats().rows_verified == 0);
  CHECK(served(*rt2, 4) == core::plan_to_config(floor));
}

TEST_CASE(
    "verify: lookup --json notes a CPU row tuned on another vendor or family, or on an unrecorded CPU, until it is "
    "verified here") {
  TempDir cfg, cache;
  const core::Plan floor = floor_of(4), row = row_plan(4);
  const std::string vendor = other_vendor();
  write_row_file(cfg.path(), 4, row, "{\"vendor\": \"" + vendor + "\", \"family\": 25, \"model\": 1, \"name\": \"x\"}");
  auto rt = kdtest::make_runtime(verify_options(cfg, cache));
  const LookupResult r = kdtest::lookup_ok(*rt, norm_query(4));
  const std::string note = "tuned on " + vendor + " family 25; not yet verified here";
  CHECK(r.config == core::plan_to_config(row));  // served meanwhile
  CHECK(r.note == note);
  CHECK(contains(lookup_result_to_json(r), "\"note\": \"" + note + "\""));
#ifdef KDISPATCH_CLI_PATH
  const kdtest::CliResult cli =
      kdtest::run_cli({"lookup", "--configs", cfg.str(), "--op", "rmsnorm", "--key", kFields, "--M", "4", "--json"});
  CHECK(cli.exit_code == 0);
  CHECK(contains(cli.out, "\"note\": \"" + note + "\""));
#endif
  {  // verified here (ahead): the note says so
    ScriptedTimes times(floor, [](const core::Plan&, int) { return 90.0; });
    REQUIRE(verify_rows(*rt, "rmsnorm").ok());
  }
  CHECK(kdtest::lookup_ok(*rt, norm_query(4)).note == "tuned on " + vendor + " family 25; verified here: ahead");

  // This host's vendor and family: no note. No "cpu" recorded (a file of
  // an older kdispatch): unknown, noted as such.
  TempDir same, unrecorded;
  CpuIdentity mine = host_cpu_identity();
  if (!mine.known()) mine = CpuIdentity{"GenuineIntel", 6, 1, "test"};
  struct HostGuard {
    explicit HostGuard(const CpuIdentity* id) { set_host_cpu_for_testing(id); }
    ~HostGuard() { set_host_cpu_for_testing(nullptr); }
  } host_guard(&mine);
  write_row_file(same.path(), 4, row, mine.to_json());
  write_row_file(unrecorded.path(), 4, row, "");
  CHECK(kdtest::lookup_ok(*kdtest::make_runtime({same.str()}), norm_query(4)).note.empty());
  CHECK(kdtest::lookup_ok(*kdtest::make_runtime({unrecorded.str()}), norm_query(4)).note ==
        "tuned on a CPU its file does not record; not yet verified here");
  // Another family of this vendor counts as another CPU; another model does not.
  CpuIdentity family = mine, model = mine;
  family.family += 1;
  model.model += 1;
  write_row_file(same.path(), 4, row, family.to_json());
  CHECK(contains(kdtest::lookup_ok(*kdtest::make_runtime({same.str()}), norm_query(4)).note, "not yet verified here"));
  write_row_file(same.path(), 4, row, model.to_json());
  CHECK(kdtest::lookup_ok(*kdtest::make_runtime({same.str()}), norm_query(4)).note.empty());
  // A row that records the floor itself: what this machine runs without it,
  // nothing to verify, no note (whatever CPU it names).
  TempDir floor_row;
  write_row_file(floor_row.path(), 4, floor, "");
  const LookupResult fr = kdtest::lookup_ok(*kdtest::make_runtime({floor_row.str()}), norm_query(4));
  CHECK(fr.config == core::plan_to_config(floor));
  CHECK(fr.note.empty());
}

TEST_CASE(
    "row files record the margin, the A/A spread, the timing, why and the CPU (exact values), and old files still "
    "load") {
  // render_table: exact members.
  std::vector<store::PersistRow> rows(2);
  rows[0].m = 1;
  rows[0].config = {{"variant", ConfigValue::string("rmsnorm_fp32__vec")}};
  rows[0].us = 9.27;
  rows[0].default_us = 10.0;
  rows[0].meta.margin = 0.02;
  rows[0].meta.aa_spread = 0.01234;
  rows[0].meta.timing = "cold";
  rows[0].meta.why = "beat floor by 7.3% (margin 2%)";
  rows[0].meta.cpu = CpuIdentity{"AuthenticAMD", 25, 1, "AMD EPYC 7763 64-Core Processor"}.to_json();
  rows[1] = rows[0];
  rows[1].m = 8;
  rows[1].meta.margin = 0.05;
  rows[1].meta.aa_spread = -1;  // not confirmed
  rows[1].meta.why = "floor kept: won by 1.1% < margin 5%";
  const std::string text = store::render_table(rows, store::cpu_fingerprint(), {{"rmsnorm_fp32__vec", 1}});
  CHECK(contains(text,
                 "\"us\": {\"1\": 9.27, \"8\": 9.27}, \"default_us\": {\"1\": 10, \"8\": 10}, \"margin\": 0.02, "
                 "\"margin_by_m\": {\"8\": 0.05}, \"aa_spread\": {\"1\": 0.0123}, \"timing\": {\"1\": \"cold\", "
                 "\"8\": \"cold\"}, \"why\": {\"1\": \"beat floor by 7.3% (margin 2%)\", \"8\": \"floor kept: won "
                 "by 1.1% < margin 5%\"}, \"cpu\": {\"vendor\": \"AuthenticAMD\", \"family\": 25, \"model\": 1, "
                 "\"name\": \"AMD EPYC 7763 64-Core Processor\"}}"));

  // Through the tuner (pretune_key, as `kdispatch tune` runs it): the winner
  // beats the floor by 7.3% on every placement; the floor's A/A spread is
  // 2 / 100.5.
  TempDir cache;
  const core::Plan floor = floor_of(4);
  ScriptedTimes times(floor, [&](const core::Plan&, int pl) { return 0.927 * (pl == 2 ? 102.0 : 100.0); });
  RuntimeOptions o = kdtest::options_for({});
  o.tune.cache_dir = cache.str();
  o.tune.cold_cache = false;
  o.tune.reps = 3;
  o.tune.time_budget_ms = 60000;
  auto rt = kdtest::make_runtime(o);
  auto r = pretune_key(*rt, "rmsnorm", kFields, 4);
  REQUIRE_MESSAGE(r.ok(), r.status().to_string());
  CHECK(r->persisted);
  CHECK_FALSE(r->config == core::plan_to_config(floor));
  const fs::path file = cache / "cpu" / "rmsnorm" / file_name();
  std::string tuned = read_text(file);
  CHECK(contains(tuned,
                 "\"margin\": 0.02, \"aa_spread\": {\"4\": 0.0199}, \"timing\": {\"4\": \"cold\"}, \"why\": "
                 "{\"4\": \"beat floor by 7.3% (margin 2%)\"}, \"cpu\": " +
                     host_cpu_identity().to_json() + "}"));
  // A second tuning with another margin, into the same file: each row keeps its own.
  o.tune.margin = 0.1;
  auto r8 = pretune_key(*kdtest::make_runtime(o), "rmsnorm", kFields, 8);
  REQUIRE(r8.ok());
  tuned = read_text(file);
  CHECK(contains(tuned,
                 "\"margin\": 0.02, \"margin_by_m\": {\"8\": 0.1}, \"aa_spread\": {\"4\": 0.0199, \"8\": 0.0199}"));
  CHECK(contains(
      tuned, "\"why\": {\"4\": \"beat floor by 7.3% (margin 2%)\", \"8\": \"floor kept: won by 7.3% < margin 10%\"}"));
  // The loader serves the rows and keeps the metadata as written.
  auto served_rt = kdtest::make_runtime({cache.str()});
  CHECK(served(*served_rt, 4) == r->config);
  bool seen = false;
  for (const FileReport& f : served_rt->load_report().files)
    for (const auto& [k, raw] : f.metadata)
      if (k == "kdispatch") seen = contains(raw, "\"margin_by_m\": {\"8\": 0.1}");
  CHECK(seen);

  // An old-format file (no margin, A/A spread, timing, why or cpu) loads;
  // a row tuned into it records its own, the old row records nothing.
  TempDir old;
  const fs::path old_file = old / "cpu" / "rmsnorm" / file_name();
  write_text(old_file,
             "{\n    \"kdispatch\": {\"tool\": \"kdispatch 0.1.0\", \"schema\": {\"rmsnorm_fp32__vec\": 1}, "
             "\"fingerprint\": " +
                 store::cpu_fingerprint().to_json() +
                 ", \"us\": {\"1\": 2.5}, \"default_us\": {\"1\": 2.6}},\n    \"1\": " +
                 config_to_json(core::plan_to_config(row_plan(1))) + "\n}\n");
  auto old_rt = kdtest::make_runtime({old.str()});
  CHECK(old_rt->load_report().all_usable());
  CHECK(served(*old_rt, 1) == core::plan_to_config(row_plan(1)));
  o.tune.margin = 0.02;
  o.tune.cache_dir = old.str();
  REQUIRE(pretune_key(*kdtest::make_runtime(o), "rmsnorm", kFields, 4).ok());
  const std::string merged = read_text(old_file);
  CHECK(contains(merged, "\"us\": {\"1\": 2.5, "));
  CHECK(contains(merged, "\"margin\": 0.02, \"margin_by_m\": {\"1\": null}, \"aa_spread\": {\"4\": 0.0199}"));
  CHECK(contains(merged, "\"cpu_by_m\": {\"1\": null}"));
  CHECK(contains(merged, "\"1\": " + config_to_json(core::plan_to_config(row_plan(1)))));
}

TEST_CASE("env: KDISPATCH_VERIFY_SHIPPED sets TuneOptions::verify_shipped (as KDISPATCH_WATCH: 0/1, off/on, ...)") {
  const char* old = std::getenv("KDISPATCH_VERIFY_SHIPPED");
  const std::string saved = old ? old : "";
  ::setenv("KDISPATCH_VERIFY_SHIPPED", "1", 1);
  auto on = options_from_env();
  ::setenv("KDISPATCH_VERIFY_SHIPPED", "0", 1);
  auto off = options_from_env();
  ::setenv("KDISPATCH_VERIFY_SHIPPED", "2", 1);
  auto bad = options_from_env();
  if (old)
    ::setenv("KDISPATCH_VERIFY_SHIPPED", saved.c_str(), 1);
  else
    ::unsetenv("KDISPATCH_VERIFY_SHIPPED");
  REQUIRE(on.ok());
  CHECK(on->tune.verify_shipped);
  REQUIRE(off.ok());
  CHECK_FALSE(off->tune.verify_shipped);
  CHECK_FALSE(RuntimeOptions{}.tune.verify_shipped);  // off by default
  REQUIRE_FALSE(bad.ok());
  CHECK(contains(bad.status().message(), "KDISPATCH_VERIFY_SHIPPED"));
}

#ifdef KDISPATCH_CLI_PATH
TEST_CASE(
    "cli: verify --json prints each row's times, margin over the floor, A/A spread and verdict, merge and merge "
    "--compact keep the rows' records, --help tells verify from validate") {
  TempDir cfg, cache;
  const core::Plan row = row_plan(4);
  write_row_file(cfg.path(), 4, row, host_cpu_identity().to_json());
  const kdtest::CliResult r =
      kdtest::run_cli({"verify", "--configs", cfg.str(), "--cache", cache.str(), "--op", "rmsnorm", "--reps", "2",
                       "--no-cold-cache", "--margin", "0.03", "--json"});
  INFO(r.out, r.err);
  REQUIRE(r.exit_code == 0);
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.parse(r.out).get(doc) == simdjson::SUCCESS);
  CHECK(double(doc["margin"]) == 0.03);
  CHECK(std::string_view(doc["verdicts"]) ==
        tune::verdict_path(cache.str(), DeviceType::cpu, tune::verdict_identity(DeviceType::cpu)));
  simdjson::dom::array rows = doc["rows"];
  REQUIRE(rows.size() == 1);
  simdjson::dom::element e = rows.at(0);
  CHECK(std::string_view(e["op"]) == "rmsnorm");
  CHECK(std::string_view(e["key"]) == key_of());
  CHECK(int64_t(e["M"]) == 4);
  CHECK(std::string_view(e["variant"]) == "rmsnorm_fp32__vec");
  CHECK(std::string_view(e["source"]) == "cpu/rmsnorm/" + file_name());
  CHECK(double(e["row_us"]) > 0);
  CHECK(double(e["floor_us"]) > 0);
  const double ratio_mean =
      (double(e["ratios"].at(0)) + double(e["ratios"].at(1)) + double(e["ratios"].at(2)) + double(e["ratios"].at(3))) /
      4;
  CHECK(double(e["margin"]) == doctest::Approx(1.0 - ratio_mean).epsilon(1e-3));
  CHECK(double(e["required_margin"]) == 0.03);
  CHECK(double(e["aa_spread"]) >= 0);
  CHECK(std::string_view(e["timing"]) == "cold");
  const std::string verdict{std::string_view(e["verdict"])};
  CHECK((verdict == "ahead" || verdict == "within margin" || verdict == "lost once"));
  CHECK(int64_t(e["losses"]) == (verdict == "lost once" ? 1 : 0));
  CHECK(bool(e["foreign_cpu"]) == false);
  CHECK(std::string_view(e["tuned_on"]) == host_cpu_identity().describe());
  CHECK(contains(read_text(std::string(std::string_view(doc["verdicts"]))), "\"state\": \"" + verdict + "\""));
  // The text form: the same columns.
  const kdtest::CliResult t =
      kdtest::run_cli({"verify", "--configs", cfg.str(), "--cache", cache.str(), "--reps", "2", "--no-cold-cache"});
  CHECK(t.exit_code == 0);
  CHECK(contains(t.out, "row us"));
  CHECK(contains(t.out, "A/A"));
  CHECK(contains(t.out, key_of()));
  // Without --cache: KDISPATCH_CACHE_DIR is neither read nor written (an
  // offline command reads only the dirs it is given); verdicts for the run only.
  {
    TempDir user_cache;
    const kdtest::CliResult u = kdtest::run_cli(
        {"verify", "--configs", cfg.str(), "--op", "rmsnorm", "--reps", "2", "--no-cold-cache"}, user_cache.str());
    CHECK(u.exit_code == 0);
    CHECK(contains(u.err, "kept for this run only: give --cache DIR"));
    CHECK_FALSE(fs::exists(user_cache.path() / ".verify"));
  }
  CHECK(kdtest::run_cli({"verify", "--configs", cfg.str(), "--margin", "0.7"}).exit_code == 2);
  CHECK(kdtest::run_cli({"verify", "--configs", cfg.str(), "--op", "nope"}).exit_code == 2);

  const kdtest::CliResult vh = kdtest::run_cli({"verify", "--help"});
  CHECK(vh.exit_code == 0);
  CHECK(contains(vh.out, "Unlike `validate`"));
  CHECK(contains(vh.out, "against the floor"));
  const kdtest::CliResult lh = kdtest::run_cli({"validate", "--help"});
  CHECK(contains(lh.out, "without running anything"));
  CHECK(contains(lh.out, "`kdispatch verify` times the rows"));
  CHECK(contains(kdtest::run_cli({"--help"}).out, "verify"));

  // merge carries each row's record (margin, A/A spread, timing, why, cpu).
  TempDir a, b, out;
  std::vector<store::PersistRow> ra(1), rb(1);
  ra[0].m = 1;
  ra[0].config = core::plan_to_config(row_plan(1));
  ra[0].meta = {0.02, 0.0123, "cold", "beat floor by 7.3% (margin 2%)", host_cpu_identity().to_json()};
  rb[0].m = 8;
  rb[0].config = core::plan_to_config(row_plan(8));
  rb[0].meta = {0.05, 0.02, "cold+graph", "floor kept: lost a placement", host_cpu_identity().to_json()};
  const std::vector<std::pair<std::string, int32_t>> schema = {{"rmsnorm_fp32__vec", 1}};
  write_text(a / "cpu" / "rmsnorm" / file_name(), store::render_table(ra, store::cpu_fingerprint(), schema));
  write_text(b / "cpu" / "rmsnorm" / file_name(), store::render_table(rb, store::cpu_fingerprint(), schema));
  const kdtest::CliResult m = kdtest::run_cli({"merge", "--out", out.str(), a.str(), b.str()});
  INFO(m.err);
  REQUIRE(m.exit_code == 0);
  const std::string merged = read_text(out / "cpu" / "rmsnorm" / file_name());
  CHECK(contains(merged,
                 "\"margin\": 0.02, \"margin_by_m\": {\"8\": 0.05}, \"aa_spread\": {\"1\": 0.0123, \"8\": "
                 "0.02}, \"timing\": {\"1\": \"cold\", \"8\": \"cold+graph\"}, \"why\": {\"1\": \"beat floor "
                 "by 7.3% (margin 2%)\", \"8\": \"floor kept: lost a placement\"}, \"cpu\": " +
                     host_cpu_identity().to_json() + ", \"merged\""));
  // ... and so does merge --compact (a table and a fragment of it, in place).
  TempDir c;
  const fs::path main_file = c / "cpu" / "rmsnorm" / file_name();
  write_text(main_file, store::render_table(ra, store::cpu_fingerprint(), schema));
  write_text(c / "cpu" / "rmsnorm" / (file_name() + ".d") / "otherhost-1.json",
             store::render_table(rb, store::cpu_fingerprint(), schema));
  const kdtest::CliResult mc = kdtest::run_cli({"merge", "--compact", c.str()});
  INFO(mc.err);
  REQUIRE(mc.exit_code == 0);
  const std::string compacted = read_text(main_file);
  CHECK(contains(compacted, "\"margin_by_m\": {\"8\": 0.05}, \"aa_spread\": {\"1\": 0.0123, \"8\": 0.02}"));
  CHECK(contains(compacted,
                 "\"why\": {\"1\": \"beat floor by 7.3% (margin 2%)\", \"8\": \"floor kept: lost a placement\"}"));
  CHECK_FALSE(fs::exists(c / "cpu" / "rmsnorm" / (file_name() + ".d") / "otherhost-1.json"));
}
#endif
