// SPDX-License-Identifier: Apache-2.0
// The KDISPATCH_* environment, forced plans, the inotify watcher, DLPack.
#include <doctest/doctest.h>
#include <dlpack/dlpack.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <optional>
#include <thread>
#include <vector>

#include "api/config_dir.hpp"
#include "dispatch/dispatch.hpp"
#include "dispatch/dlpack.hpp"
#include "test_util.hpp"

using namespace dispatch;
using kdtest::TempDir;
namespace fs = std::filesystem;

namespace {
// Sets environment variables for the scope of a test, restoring them after.
class EnvGuard {
 public:
  EnvGuard(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [k, v] : vars) {
      const char* old = std::getenv(k);
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      ::setenv(k, v, 1);
    }
  }
  ~EnvGuard() {
    for (auto& [k, v] : saved_) {
      if (v)
        ::setenv(k.c_str(), v->c_str(), 1);
      else
        ::unsetenv(k.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

std::string norm_file(const std::string& hidden, const std::string& dtype) {
  return "hidden=" + hidden + ",device_name=" + cpu_device_info().device_name + ",dtype=" + dtype + ".json";
}
}  // namespace

TEST_CASE("env: options_from_env reads every KDISPATCH_* variable") {
  TempDir a, b;
  EnvGuard env({{"KDISPATCH_CONFIG_DIRS", (a.str() + ":" + b.str()).c_str()},
                {"KDISPATCH_SHIPPED_CONFIGS", "0"},
                {"KDISPATCH_BACKEND_VERSION", "3.5.1"},
                {"KDISPATCH_LOG_LEVEL", "error"},
                {"KDISPATCH_WATCH", "1"},
                {"KDISPATCH_FORCE", "rmsnorm=rmsnorm_fp32__ref;gemm=gemm_fp32__ref"},
                {"KDISPATCH_DETERMINISTIC", "1"},
                {"KDISPATCH_TUNE", "background"},
                {"KDISPATCH_CACHE_DIR", "/tmp/kd-cache-x"},
                {"KDISPATCH_TUNE_MEM", "512M"},
                {"KDISPATCH_TUNE_BUDGET_MS", "250"},
                {"KDISPATCH_TUNE_MARGIN", "0.05"},
                {"KDISPATCH_TUNE_GRAPH", "0"}});
  auto o = options_from_env();
  REQUIRE(o.ok());
  CHECK(o->config_dirs == std::vector<std::string>{a.str(), b.str()});
  CHECK_FALSE(o->load_shipped_configs);
  CHECK(o->backend_version == "3.5.1");
  CHECK(o->log_level == LogLevel::error);
  CHECK(o->watch);
  CHECK(o->force == std::vector<std::string>{"rmsnorm=rmsnorm_fp32__ref", "gemm=gemm_fp32__ref"});
  CHECK(o->deterministic);
  CHECK(o->tune.mode == TuneMode::background);
  CHECK(o->tune.cache_dir == "/tmp/kd-cache-x");
  CHECK(o->tune.memory_budget_bytes == 512LL * 1024 * 1024);
  CHECK(o->tune.time_budget_ms == 250.0);
  CHECK(o->tune.margin == 0.05);
  CHECK_FALSE(o->tune.graph_timing);
}

TEST_CASE("env: a bad value is refused naming the variable") {
  {
    EnvGuard env({{"KDISPATCH_TUNE", "sometimes"}});
    auto o = options_from_env();
    REQUIRE_FALSE(o.ok());
    CHECK(o.status().code() == StatusCode::invalid_argument);
    CHECK(o.status().message() == "KDISPATCH_TUNE='sometimes' is not valid (expected off|sync|background)");
  }
  {
    EnvGuard env({{"KDISPATCH_TUNE_MEM", "lots"}});
    CHECK(options_from_env().status().message().find("KDISPATCH_TUNE_MEM='lots'") == 0);
  }
}

TEST_CASE("env: every bad value is refused, naming the variable and why (issue 20 item 4)") {
  TempDir dir;
  const std::string file = (dir / "a-file").string();
  kdtest::write_text(dir / "a-file", "x");
  const std::string missing = dir.str() + "/missing";
  const std::pair<const char*, std::string> bad[] = {
      {"KDISPATCH_TUNE_MEM", "nan"},
      {"KDISPATCH_TUNE_MEM", "inf"},
      {"KDISPATCH_TUNE_MEM", "0"},
      {"KDISPATCH_TUNE_MEM", "-1G"},
      {"KDISPATCH_TUNE_MEM", " 1G"},
      {"KDISPATCH_TUNE_MEM", "0x10M"},
      {"KDISPATCH_TUNE_MEM", "1e30G"},
      {"KDISPATCH_TUNE_BUDGET_MS", "nan"},
      {"KDISPATCH_TUNE_BUDGET_MS", "inf"},
      {"KDISPATCH_TUNE_BUDGET_MS", "-5"},
      {"KDISPATCH_TUNE_BUDGET_MS", "1e300"},
      {"KDISPATCH_TUNE_BUDGET_MS", "12ms"},
      {"KDISPATCH_SHIPPED_CONFIGS", missing},
      {"KDISPATCH_SHIPPED_CONFIGS", file},
      {"KDISPATCH_BACKEND_VERSION", "three"},
      {"KDISPATCH_FORCE", "rmsnorm=no_such_variant"},
      {"KDISPATCH_FORCE", "not-an-entry"},
      {"KDISPATCH_MISSES_EXPORT", missing + "/misses.csv"},
      {"KDISPATCH_MISSES_EXPORT", dir.str()},
      {"KDISPATCH_TUNE_MARGIN", "nan"},
      {"KDISPATCH_TUNE_MARGIN", "-0.01"},
      {"KDISPATCH_TUNE_MARGIN", "0.6"},
      {"KDISPATCH_TUNE_MARGIN", "2%"},
      {"KDISPATCH_TUNE_GRAPH", "maybe"},
      {"KDISPATCH_TUNE_GRAPH", "2"},
  };
  for (const auto& [name, value] : bad) {
    CAPTURE(name);
    CAPTURE(value);
    EnvGuard env({{name, value.c_str()}});
    auto o = options_from_env();
    REQUIRE_FALSE(o.ok());
    CHECK(o.status().message().find(std::string(name) + "='" + value + "'") == 0);
  }
  // and the good spellings still read
  EnvGuard env({{"KDISPATCH_TUNE_MEM", "1.5G"},
                {"KDISPATCH_TUNE_BUDGET_MS", "0.5"},
                {"KDISPATCH_SHIPPED_CONFIGS", "1"},
                {"KDISPATCH_MISSES_EXPORT", (dir / "misses.csv").string().c_str()}});
  auto o = options_from_env();
  REQUIRE(o.ok());
  CHECK(o->tune.memory_budget_bytes == 3LL * 512 * 1024 * 1024);
  CHECK(o->tune.time_budget_ms == 0.5);
  CHECK(o->load_shipped_configs);
  CHECK(o->shipped_configs_dir.empty());
}

TEST_CASE(
    "env: a KDISPATCH_CONFIG_DIRS dir that does not exist is skipped, said once on stderr, the rest serve "
    "(issue 33)") {
  TempDir a, out;
  kdtest::write_text(a / ("cpu/rmsnorm/" + norm_file("64", "fp32")), R"({"3": {"variant": "rmsnorm_fp32__ref"}})");
  kdtest::write_text(out / "a-file", "x");
  const std::string missing = out.str() + "/not-mounted", file = (out / "a-file").string();
  const std::string value = missing + ":" + a.str() + ":" + file;
  const fs::path log = out / "stderr.txt";
  // In a child: the "once" is per process, and the default runtime is built
  // once per process.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::dup2(fd, 2) < 0) ::_exit(20);
    ::setenv("KDISPATCH_CONFIG_DIRS", value.c_str(), 1);
    ::setenv("KDISPATCH_SHIPPED_CONFIGS", "0", 1);
    ::unsetenv("KDISPATCH_LOG_LEVEL");
    for (int i = 0; i < 2; ++i) {  // said once, however often the environment is read
      auto o = options_from_env();
      if (!o.ok() || o->config_dirs != std::vector<std::string>{a.str()}) ::_exit(21);
    }
    // What default_runtime() builds (the runtime the C ABI, Python and the
    // torch ops serve from; not called itself: another test of this process
    // may have built it before the fork).
    auto o = options_from_env();
    if (!o.ok()) ::_exit(22);
    auto rt = Runtime::create(std::move(*o));
    if (!rt.ok()) ::_exit(22);
    std::vector<float> x(3 * 64, 1.f), y(x.size()), w(64, 1.f);
    DispatchInfo info;
    const Status s =
        rmsnorm(**rt,
                {make_tensor_2d(y.data(), DType::fp32, 3, 64, 64), make_tensor_2d(x.data(), DType::fp32, 3, 64, 64),
                 make_tensor_1d(w.data(), DType::fp32, 64), 1e-6f},
                {}, {.info = &info});
    if (!s.ok() || info.source != PlanSource::table || info.table_m != 3 ||
        (*rt)->source_dir(info.source_id) != a.str())
      ::_exit(23);
    // At KDISPATCH_LOG_LEVEL=error nothing is said (and nothing more at warn: said already).
    ::setenv("KDISPATCH_LOG_LEVEL", "error", 1);
    ::setenv("KDISPATCH_CONFIG_DIRS", (out.str() + "/other-missing").c_str(), 1);
    if (!options_from_env().ok()) ::_exit(24);
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(kdtest::read_text(log) == "kdispatch: KDISPATCH_CONFIG_DIRS='" + value + "': config dir '" + missing +
                                      "' does not exist; serving without it\n"
                                      "kdispatch: KDISPATCH_CONFIG_DIRS='" +
                                      value + "': config dir '" + file + "' is not a directory; serving without it\n");
}

TEST_CASE(
    "env: an unreadable config dir is refused or skipped as a missing one is, and says permission denied "
    "(issue 33, the attack's finding 3)") {
  TempDir t;
  ::chmod(t.str().c_str(), 0755);
  const std::string locked = t.str() + "/locked", hidden = t.str() + "/private/inner", ok = t.str() + "/ok";
  REQUIRE(::mkdir(locked.c_str(), 0755) == 0);
  REQUIRE(::mkdir((t.str() + "/private").c_str(), 0755) == 0);
  REQUIRE(::mkdir(hidden.c_str(), 0755) == 0);
  REQUIRE(::mkdir(ok.c_str(), 0755) == 0);
  REQUIRE(::chmod(locked.c_str(), 0) == 0);
  REQUIRE(::chmod((t.str() + "/private").c_str(), 0700) == 0);
  CHECK(dispatch::api::config_dir_problem(t.str() + "/nope") == "'" + t.str() + "/nope' does not exist");
  CHECK(dispatch::api::config_dir_problem(ok).empty());
  // As a user the modes apply to (root reads through them: the child drops to nobody).
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(30);
    if (dispatch::api::config_dir_problem(locked) != "'" + locked + "' cannot be read (permission denied)") ::_exit(31);
    if (dispatch::api::config_dir_problem(hidden) !=
        "'" + hidden + "' cannot be reached (permission denied on a parent directory)")
      ::_exit(32);
    RuntimeOptions o;
    o.load_shipped_configs = false;
    o.config_dirs = {locked};
    auto rt = Runtime::create(o);
    if (rt.ok() || rt.status().message() != "config dir '" + locked + "' cannot be read (permission denied)")
      ::_exit(33);
    ::setenv("KDISPATCH_CONFIG_DIRS", (locked + ":" + ok).c_str(), 1);
    ::setenv("KDISPATCH_LOG_LEVEL", "off", 1);
    auto e = options_from_env();
    if (!e.ok() || e->config_dirs != std::vector<std::string>{ok}) ::_exit(34);  // skipped, the rest serve
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  ::chmod(locked.c_str(), 0755);
  ::chmod((t.str() + "/private").c_str(), 0755);
}

TEST_CASE("force: a forced variant serves every call of its op and dtype, lookup's why says so") {
  RuntimeOptions o;
  o.load_shipped_configs = false;
  o.tune.load_cache = o.tune.persist = false;
  o.force = {"rmsnorm=rmsnorm_fp32__vec:vec=4,unroll=2"};
  auto rt = Runtime::create(o).value();
  std::vector<float> x(3 * 40, 1.f), y(3 * 40), w(40, 2.f);
  RmsNormArgs args{make_tensor_2d(y.data(), DType::fp32, 3, 40, 40), make_tensor_2d(x.data(), DType::fp32, 3, 40, 40),
                   make_tensor_1d(w.data(), DType::fp32, 40), 1e-6f};
  DispatchInfo info;
  REQUIRE(rmsnorm(*rt, args, {}, {.info = &info}).ok());
  CHECK(info.source == PlanSource::forced);
  CHECK(std::string(info.variant) == "rmsnorm_fp32__vec");
  CHECK(std::fabs(y[0] - 2.f) < 1e-5);
  auto r = lookup(*rt, LookupQuery{.op = "rmsnorm", .key = "hidden=40,dtype=fp32", .M = 3});
  REQUIRE(r.ok());
  CHECK(r->match == LookupResult::Match::forced);
  CHECK(r->why.find("forced by 'rmsnorm=rmsnorm_fp32__vec:vec=4,unroll=2'") != std::string::npos);
  CHECK(config_to_json(r->config) == R"({"variant": "rmsnorm_fp32__vec", "vec": 4, "unroll": 2})");
  // Another dtype is not affected.
  r = lookup(*rt, LookupQuery{.op = "rmsnorm", .key = "hidden=40,dtype=bf16", .M = 3});
  REQUIRE(r.ok());
  CHECK(r->match == LookupResult::Match::fallback);

  // Bad entries are refused at create, naming the entry.
  o.force = {"rmsnorm=no_such_variant"};
  auto bad = Runtime::create(o);
  CHECK(bad.status().code() == StatusCode::no_variant);
  CHECK(bad.status().message().find("'rmsnorm=no_such_variant'") != std::string::npos);
  o.force = {"rmsnorm=rmsnorm_fp32__vec:vec=3"};
  CHECK(Runtime::create(o).status().code() == StatusCode::config_error);
}

TEST_CASE("reload: a file broken then fixed: its old rows serve meanwhile, the report says so (issue 20 item 2)") {
  TempDir dir;
  kdtest::fs::create_directories(dir / "cpu/rmsnorm");
  const auto file = dir / ("cpu/rmsnorm/" + norm_file("64", "fp32"));
  kdtest::write_text(file, R"({"8": {"variant": "rmsnorm_fp32__ref"}})");
  RuntimeOptions o;
  o.config_dirs = {dir.str()};
  o.load_shipped_configs = false;
  o.tune.load_cache = o.tune.persist = false;
  auto rt = Runtime::create(o).value();
  const LookupQuery q{.op = "rmsnorm", .key = "hidden=64,dtype=fp32", .M = 8};
  REQUIRE(lookup(*rt, q)->match == LookupResult::Match::exact);
  for (const char* broken : {R"({"8": {"variant": "rmsnorm_fp32__ref")",  // cut short (a half-written copy)
                             R"([1, 2, 3])",                              // foreign layout
                             R"({"8": {"variant": "no_such_variant"}})",  // every row invalid
                             ""}) {
    CAPTURE(broken);
    kdtest::write_text(file, broken);
    REQUIRE(rt->reload().ok());
    auto r = lookup(*rt, q);
    CHECK(r->match == LookupResult::Match::exact);  // the old row still serves
    CHECK(config_to_json(r->config) == R"({"variant": "rmsnorm_fp32__ref"})");
    const LoadReport rep = rt->load_report();
    REQUIRE(rep.files.size() == 1);
    CHECK(rep.files[0].state == FileReport::State::skipped);
    CHECK(rep.files[0].problems.back() == "its previous rows (1) keep serving until the file is fixed or removed");
    CHECK(rep.rows == 1);
  }
  kdtest::write_text(file, R"({"8": {"variant": "rmsnorm_fp32__vec", "vec": 4, "unroll": 1}})");  // fixed
  REQUIRE(rt->reload().ok());
  CHECK(config_to_json(lookup(*rt, q)->config) == R"({"variant": "rmsnorm_fp32__vec", "vec": 4, "unroll": 1})");
  CHECK(rt->load_report().files[0].state == FileReport::State::loaded);
  kdtest::fs::remove(file);  // removed: its rows go
  REQUIRE(rt->reload().ok());
  CHECK(lookup(*rt, q)->match == LookupResult::Match::fallback);
}

TEST_CASE("watch: a file dropped into a watched dir is served without a restart") {
  TempDir dir;
  kdtest::fs::create_directories(dir / "cpu/rmsnorm");
  RuntimeOptions o;
  o.config_dirs = {dir.str()};
  o.load_shipped_configs = false;
  o.tune.load_cache = o.tune.persist = false;
  o.watch = true;
  auto rt = Runtime::create(o).value();
  const LookupQuery q{.op = "rmsnorm", .key = "hidden=64,dtype=fp32", .M = 8};
  CHECK(lookup(*rt, q)->match == LookupResult::Match::fallback);
  // Written as a tool would: temp file, then rename into place.
  kdtest::write_text(dir / "cpu/rmsnorm/.tmp", R"({"8": {"variant": "rmsnorm_fp32__ref"}})");
  kdtest::fs::rename(dir / "cpu/rmsnorm/.tmp", dir / ("cpu/rmsnorm/" + norm_file("64", "fp32")));
  bool hit = false;
  for (int i = 0; i < 500 && !hit; ++i) {  // the watcher coalesces for ~100 ms
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    hit = lookup(*rt, q)->match == LookupResult::Match::exact;
  }
  CHECK(hit);
  // A broken file dropped in changes nothing but the report.
  kdtest::write_text(dir / ("cpu/rmsnorm/" + norm_file("128", "fp32")), R"({"8": {"variant": )");
  bool reported = false;
  for (int i = 0; i < 500 && !reported; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (const auto& f : rt->load_report().files) reported |= f.state == FileReport::State::skipped;
  }
  CHECK(reported);
  CHECK(lookup(*rt, q)->match == LookupResult::Match::exact);
  // A new subdirectory is watched too.
  kdtest::fs::create_directories(dir / "cpu/fused_add_rmsnorm");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  kdtest::write_text(dir / ("cpu/fused_add_rmsnorm/" + norm_file("64", "fp32")),
                     R"({"8": {"variant": "fused_add_rmsnorm_fp32__ref"}})");
  const LookupQuery qf{.op = "fused_add_rmsnorm", .key = "hidden=64,dtype=fp32", .M = 8};
  bool fused_hit = false;
  for (int i = 0; i < 500 && !fused_hit; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    fused_hit = lookup(*rt, qf)->match == LookupResult::Match::exact;
  }
  CHECK(fused_hit);
}

namespace {
// A watched runtime over `dir` (the config dir), no shipped configs, no cache.
std::unique_ptr<Runtime> watched(const std::string& dir) {
  RuntimeOptions o;
  o.config_dirs = {dir};
  o.load_shipped_configs = false;
  o.tune.load_cache = o.tune.persist = false;
  o.watch = true;
  return Runtime::create(o).value();
}
// Polls `q` until it is an exact hit (true) or `seconds` pass (false).
bool hit_within(Runtime& rt, const LookupQuery& q, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (lookup(rt, q)->match == LookupResult::Match::exact) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}
void drop_file(const kdtest::fs::path& file, const std::string& text) {  // as a tool writes: temp + rename
  // A temp name of its own per call: two threads dropping files into one
  // dir must not rename each other's temp file.
  static std::atomic<int> n{0};
  const auto tmp = file.parent_path() / (".tmp-" + std::to_string(n.fetch_add(1)));
  kdtest::write_text(tmp, text);
  kdtest::fs::rename(tmp, file);
}
}  // namespace

TEST_CASE("watch: fragments (<key>.json.d/*.json) written into a new or an existing fragment dir are served") {
  TempDir dir;
  const std::string file = "cpu/rmsnorm/" + norm_file("64", "fp32");
  kdtest::write_text(dir / file, R"({"8": {"variant": "rmsnorm_fp32__vec", "vec": 4, "unroll": 1}})");
  auto rt = watched(dir.str());
  const LookupQuery q8{.op = "rmsnorm", .key = "hidden=64,dtype=fp32", .M = 8};
  const LookupQuery q32{.op = "rmsnorm", .key = "hidden=64,dtype=fp32", .M = 32};
  const LookupQuery q64{.op = "rmsnorm", .key = "hidden=64,dtype=fp32", .M = 64};
  REQUIRE(lookup(*rt, q8)->match == LookupResult::Match::exact);
  // A writer where flock is not honoured: the fragment dir made, then its file.
  kdtest::fs::create_directories(dir / (file + ".d"));
  drop_file(dir / (file + ".d/host-1.json"),
            R"({"8": {"variant": "rmsnorm_fp32__ref"}, "32": {"variant": "rmsnorm_fp32__ref"}})");
  CHECK(hit_within(*rt, q32, 10.0));
  CHECK(lookup(*rt, q32)->source == file + ".d/host-1.json");
  // M = 8 is in both: the main file's row serves.
  CHECK(config_to_json(lookup(*rt, q8)->config) == R"({"variant": "rmsnorm_fp32__vec", "vec": 4, "unroll": 1})");
  CHECK(lookup(*rt, q8)->source == file);
  drop_file(dir / (file + ".d/host-2.json"), R"({"64": {"variant": "rmsnorm_fp32__ref"}})");
  CHECK(hit_within(*rt, q64, 10.0));
  CHECK(lookup(*rt, q64)->source == file + ".d/host-2.json");
}

TEST_CASE("watch: an event storm does not postpone the reload (issue 20 item 2)") {
  // Before: every event restarted the 100 ms quiet period, so events every
  // 20 ms (any file, even not *.json) postponed the reload until they stopped.
  for (const bool relevant : {false, true}) {
    CAPTURE(relevant);
    TempDir dir;
    kdtest::fs::create_directories(dir / "cpu/rmsnorm");
    auto rt = watched(dir.str());
    std::atomic<bool> stop{false};
    std::thread storm([&] {
      for (int i = 0; !stop.load(); ++i) {
        try {            // a write error here must not terminate the process: the check below decides
          if (relevant)  // another table, rewritten every 20 ms
            drop_file(dir / ("cpu/rmsnorm/" + norm_file("128", "fp32")),
                      R"({")" + std::to_string(1 + i % 7) + R"(": {"variant": "rmsnorm_fp32__ref"}})");
          else
            kdtest::write_text(dir / "cpu/rmsnorm/noise.txt", std::to_string(i));
        } catch (const std::exception&) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    bool hit = false;
    try {
      std::this_thread::sleep_for(std::chrono::milliseconds(150));
      drop_file(dir / ("cpu/rmsnorm/" + norm_file("64", "fp32")), R"({"8": {"variant": "rmsnorm_fp32__ref"}})");
      // Served while the storm goes on: the reload comes at most ~1 s (10 x
      // the debounce) after the first change; 5 s allows a loaded CI machine.
      hit = hit_within(*rt, {.op = "rmsnorm", .key = "hidden=64,dtype=fp32", .M = 8}, 5.0);
    } catch (...) {
      stop = true;
      storm.join();
      throw;
    }
    stop = true;
    storm.join();
    CHECK(hit);
  }
}

TEST_CASE("watch: a config dir replaced by a rename, or deleted and made again, is still followed (issue 20 item 2)") {
  TempDir parent;
  const kdtest::fs::path dir = parent / "configs";
  kdtest::fs::create_directories(dir / "cpu/rmsnorm");
  auto rt = watched(dir.string());
  const LookupQuery q64{.op = "rmsnorm", .key = "hidden=64,dtype=fp32", .M = 8};
  const LookupQuery q128{.op = "rmsnorm", .key = "hidden=128,dtype=fp32", .M = 8};
  const LookupQuery q256{.op = "rmsnorm", .key = "hidden=256,dtype=fp32", .M = 8};
  // 1. replaced by a rename (a deploy swaps in a new tree)
  const kdtest::fs::path next = parent / "configs.next";
  kdtest::fs::create_directories(next / "cpu/rmsnorm");
  kdtest::write_text(next / ("cpu/rmsnorm/" + norm_file("64", "fp32")), R"({"8": {"variant": "rmsnorm_fp32__ref"}})");
  kdtest::fs::rename(dir, parent / "configs.old");
  kdtest::fs::rename(next, dir);
  CHECK(hit_within(*rt, q64, 5.0));
  // ... and the new tree is watched: a file dropped into it is served
  drop_file(dir / ("cpu/rmsnorm/" + norm_file("128", "fp32")), R"({"8": {"variant": "rmsnorm_fp32__ref"}})");
  CHECK(hit_within(*rt, q128, 5.0));
  // 2. deleted and made again
  kdtest::fs::remove_all(dir);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kdtest::fs::create_directories(dir / "cpu/rmsnorm");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  drop_file(dir / ("cpu/rmsnorm/" + norm_file("256", "fp32")), R"({"8": {"variant": "rmsnorm_fp32__ref"}})");
  CHECK(hit_within(*rt, q256, 5.0));
  CHECK(lookup(*rt, q64)->match == LookupResult::Match::fallback);  // the deleted tree's rows are gone
}

TEST_CASE("hit memo: a call served from the table follows every reload, and each runtime serves its own table") {
  // ops.cpp keeps a per-thread memo of table hits tagged with the table's
  // generation: a reload must reach the very next call, and two runtimes
  // called from one thread with the same shape must not see each other's rows.
  TempDir a, b;
  for (const TempDir* d : {&a, &b}) kdtest::fs::create_directories(*d / "cpu/rmsnorm");
  const auto file = [](const TempDir& d) { return d / ("cpu/rmsnorm/" + norm_file("40", "fp32")); };
  kdtest::write_text(file(a), R"({"3": {"variant": "rmsnorm_fp32__ref"}})");
  kdtest::write_text(file(b), R"({"3": {"variant": "rmsnorm_fp32__vec", "vec": 4, "unroll": 2}})");
  auto make = [](const TempDir& d) {
    RuntimeOptions o;
    o.config_dirs = {d.str()};
    o.load_shipped_configs = false;
    o.tune.load_cache = o.tune.persist = false;
    return Runtime::create(o).value();
  };
  auto ra = make(a), rb = make(b);
  std::vector<float> x(3 * 40, 1.f), y(3 * 40), w(40, 2.f);
  RmsNormArgs args{make_tensor_2d(y.data(), DType::fp32, 3, 40, 40), make_tensor_2d(x.data(), DType::fp32, 3, 40, 40),
                   make_tensor_1d(w.data(), DType::fp32, 40), 1e-6f};
  auto served = [&](Runtime& rt) {
    DispatchInfo info;
    std::fill(y.begin(), y.end(), 0.f);
    REQUIRE(rmsnorm(rt, args, {}, {.info = &info}).ok());
    CHECK(std::fabs(y[3 * 40 - 1] - 2.f) < 1e-5);  // x = 1: y = w
    return std::string(plan_source_name(info.source)) + ":" + info.variant;
  };
  for (int i = 0; i < 3; ++i) {  // the second and third calls of each are memo hits
    CHECK(served(*ra) == "table:rmsnorm_fp32__ref");
    CHECK(served(*rb) == "table:rmsnorm_fp32__vec");
  }
  // The dtype is part of the memo's key (CASES.md C05's kind): the same
  // shape in bf16 right after memoised fp32 hits is a miss (no bf16 table).
  {
    std::vector<uint16_t> xb(3 * 40, 0x3F80), yb(3 * 40, 0), wb(40, 0x4000);  // 1.0, 0, 2.0
    RmsNormArgs bargs{make_tensor_2d(yb.data(), DType::bf16, 3, 40, 40),
                      make_tensor_2d(xb.data(), DType::bf16, 3, 40, 40), make_tensor_1d(wb.data(), DType::bf16, 40),
                      1e-6f};
    DispatchInfo info;
    REQUIRE(rmsnorm(*ra, bargs, {}, {.info = &info}).ok());
    CHECK(info.source == PlanSource::fallback);
    CHECK(std::string(info.variant).rfind("rmsnorm_bf16__", 0) == 0);
    CHECK(yb[3 * 40 - 1] == 0x4000);  // y = w = 2.0
  }
  // A reload of `a` with another row: its next call serves the new row.
  kdtest::write_text(file(a), R"({"3": {"variant": "rmsnorm_fp32__vec", "vec": 8, "unroll": 1}})");
  REQUIRE(ra->reload().ok());
  CHECK(served(*ra) == "table:rmsnorm_fp32__vec");
  CHECK(served(*rb) == "table:rmsnorm_fp32__vec");
  // The row removed: the next call is a miss again (get_default).
  kdtest::fs::remove(file(a));
  REQUIRE(ra->reload().ok());
  CHECK(served(*ra).rfind("default:", 0) == 0);
  CHECK(served(*rb) == "table:rmsnorm_fp32__vec");
  // A runtime destroyed and another created in its place: a new generation.
  ra.reset();
  kdtest::write_text(file(a), R"({"3": {"variant": "rmsnorm_fp32__ref"}})");
  ra = make(a);
  CHECK(served(*ra) == "table:rmsnorm_fp32__ref");
}

TEST_CASE("dlpack: a DLTensor becomes a TensorRef without a copy, fp8 by DLPack 1.1 codes") {
  float buf[2 * 3 + 5] = {};
  int64_t shape[2] = {2, 3};
  int64_t strides[2] = {4, 1};
  DLTensor t{};
  t.data = buf;
  t.byte_offset = 4;
  t.ndim = 2;
  t.shape = shape;
  t.strides = strides;
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.device = DLDevice{kDLCPU, 0};
  auto r = from_dlpack(&t);
  REQUIRE(r.ok());
  CHECK(r->data == static_cast<void*>(buf + 1));
  CHECK(r->dtype == DType::fp32);
  CHECK(r->rank == 2);
  CHECK(r->shape[0] == 2);
  CHECK(r->strides[0] == 4);
  t.strides = nullptr;  // compact row-major
  CHECK(from_dlpack(&t)->strides[0] == 3);
  t.dtype = DLDataType{kDLBfloat, 16, 1};
  CHECK(from_dlpack(&t)->dtype == DType::bf16);
  t.device = DLDevice{kDLCUDA, 1};
  CHECK(from_dlpack(&t)->device == Device{DeviceType::cuda, 1});
  t.dtype = DLDataType{kDLInt, 8, 1};
  CHECK(from_dlpack(&t).status().code() == StatusCode::unsupported_problem);
  // DLPack 1.1's fp8 codes (what torch exports for torch.float8_e4m3fn, ...),
  // whatever the installed dlpack.h knows.
  t.dtype = DLDataType{10, 8, 1};
  CHECK(from_dlpack(&t)->dtype == DType::fp8_e4m3fn);
  t.dtype = DLDataType{11, 8, 1};
  CHECK(from_dlpack(&t)->dtype == DType::fp8_e4m3fnuz);
  t.dtype = DLDataType{12, 8, 1};
  CHECK(from_dlpack(&t)->dtype == DType::fp8_e5m2);
  t.dtype = DLDataType{10, 16, 1};
  CHECK(from_dlpack(&t).status().message().find("code 10, bits 16") != std::string::npos);
  t.dtype = DLDataType{13, 8, 1};  // kDLFloat8_e5m2fnuz: no DType for it
  CHECK(from_dlpack(&t).status().code() == StatusCode::unsupported_problem);
  t.dtype = DLDataType{kDLFloat, 32, 1};
  t.device = DLDevice{kDLVulkan, 0};
  CHECK(from_dlpack(&t).status().code() == StatusCode::unsupported_device);
  CHECK(from_dlpack(nullptr).status().code() == StatusCode::invalid_argument);
}

TEST_CASE("default_runtime: built once from the environment") {
  auto a = default_runtime();
  auto b = default_runtime();
  REQUIRE(a.ok());
  CHECK(*a == *b);
}
