// SPDX-License-Identifier: Apache-2.0
// Issue 31, items 3 and 7: the offline commands read exactly the dirs they
// are given (the tuning cache only with --cache), the cache-dir ancestor
// rule (OpenSSH's safe_path), an unusable KDISPATCH_CACHE_DIR refused at
// start naming the variable, `validate --cache` of a refused dir, `misses
// --export` checked before the replay, `tune`'s flag ranges and a shape row
// without its dims, and the note a forked child logs once when it would tune.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cli_util.hpp"
#include "dispatch/dispatch.hpp"
#include "store/fingerprint.hpp"
#include "store/private_fs.hpp"
#include "store/writer.hpp"
#include "test_util.hpp"

using namespace dispatch;
using kdtest::TempDir;
namespace fs = std::filesystem;

namespace {

using kdtest::EnvScope;

constexpr uid_t kNobody = 65534;

std::string dev() { return cpu_device_info().device_name; }

store::PersistRow ref_row(int64_t m, const char* variant) {
  store::PersistRow r;
  r.m = m;
  r.config = {{"variant", ConfigValue::string(variant)}};
  return r;
}

// A tuning cache a user might have: a valid row of this build (gemm
// N=8,K=8 fp32 at M=8; rmsnorm hidden=896 fp32 at M=1, the replay's first
// call) that the trees below do not have, and a file that does not parse.
void plant_cache(const fs::path& cache) {
  REQUIRE(store::persist_rows(cache.string(), "cpu/gemm/N=8,K=8,device_name=" + dev() + ",dtype=fp32.json",
                              {ref_row(8, "gemm_fp32__ref")}, store::cpu_fingerprint(), {{"gemm_fp32__ref", 1}})
              .ok());
  REQUIRE(store::persist_rows(cache.string(), "cpu/rmsnorm/hidden=896,device_name=" + dev() + ",dtype=fp32.json",
                              {ref_row(1, "rmsnorm_fp32__ref")}, store::cpu_fingerprint(), {{"rmsnorm_fp32__ref", 1}})
              .ok());
  kdtest::write_text(cache / ("cpu/gemm/N=16,K=16,device_name=" + dev() + ",dtype=fp32.json"), "{not json");
}

// A clean tree: one table, one row.
std::string clean_tree_file() { return "cpu/gemm/N=32,K=32,device_name=" + dev() + ",dtype=fp32.json"; }
void make_tree(const fs::path& tree) {
  fs::create_directories(tree / "cpu/gemm");
  kdtest::write_text(tree / clean_tree_file(), R"({"1": {"variant": "gemm_fp32__ref"}})");
}

}  // namespace

#ifdef KDISPATCH_CLI_PATH

namespace {

struct Run {
  int exit_code = -1;
  std::string out, err;
};

// Runs the CLI with the user's cache planted where it would be found: as
// KDISPATCH_CACHE_DIR (`how` = "env") or as $HOME/.cache/kdispatch with
// KDISPATCH_CACHE_DIR and XDG_CACHE_HOME unset (`how` = "home").
Run run_planted(const std::vector<std::string>& args, const fs::path& home, const std::string& how) {
  TempDir tmp;
  const fs::path err_file = tmp / "stderr.txt";
  std::string cmd =
      "env -u KDISPATCH_TUNE -u KDISPATCH_CONFIG_DIRS -u KDISPATCH_SHIPPED_CONFIGS -u KDISPATCH_FORCE "
      "-u KDISPATCH_MISSES_EXPORT -u KDISPATCH_TUNE_BUDGET_MS -u KDISPATCH_TUNE_MEM -u KDISPATCH_LOG_LEVEL "
      "-u XDG_CACHE_HOME ";
  if (how == "env")
    cmd += "KDISPATCH_CACHE_DIR=" + kdtest::shell_quote((home / ".cache/kdispatch").string()) + " ";
  else
    cmd += "-u KDISPATCH_CACHE_DIR HOME=" + kdtest::shell_quote(home.string()) + " ";
  cmd += kdtest::shell_quote(KDISPATCH_CLI_PATH);
  for (const auto& a : args) cmd += " " + kdtest::shell_quote(a);
  cmd += " 2>" + kdtest::shell_quote(err_file.string());
  Run r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = kdtest::read_text(err_file);
  return r;
}

// Every regular file under `dir` with its bytes, to show a dir untouched.
std::vector<std::pair<std::string, std::string>> snapshot(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.emplace_back(fs::relative(e.path(), dir).string(), kdtest::read_text(e.path()));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("offline: validate DIR reads DIR only, never the user's cache (planted row and broken file), exit 0") {
  TempDir home, tree;
  plant_cache(home / ".cache/kdispatch");
  make_tree(tree.path());
  const std::string expected = "loaded   " + clean_tree_file() +
                               " (1 rows)\n1 files: 1 loaded, 0 partial, 0 skipped; 0 unknown-device files; 1 keys, "
                               "1 rows\n";
  for (const char* how : {"env", "home"}) {
    CAPTURE(how);
    Run r = run_planted({"validate", tree.str()}, home.path(), how);
    CHECK(r.exit_code == 0);
    CHECK(r.out == expected);
    CHECK(r.err == "");
  }
  // Control: the planted cache is what a runtime would read: named with
  // --cache it is read (its broken file makes the tree not usable).
  Run c = run_planted({"validate", tree.str(), "--cache", (home / ".cache/kdispatch").string()}, home.path(), "env");
  CHECK(c.exit_code == 1);
  CHECK(c.out.find("N=8,K=8,device_name=" + dev() + ",dtype=fp32.json (1 rows)") != std::string::npos);
}

TEST_CASE("offline: lookup --configs DIR answers from DIR only, the cache's row only with --cache") {
  TempDir home, tree;
  const fs::path cache = home / ".cache/kdispatch";
  plant_cache(cache);
  make_tree(tree.path());
  const std::vector<std::string> q = {"lookup", "--configs",          tree.str(), "--op", "gemm",
                                      "--key",  "N=8,K=8,dtype=fp32", "--M",      "8"};
  for (const char* how : {"env", "home"}) {
    CAPTURE(how);
    Run r = run_planted(q, home.path(), how);
    CHECK(r.exit_code == 0);
    CHECK(r.out.find("match    default\n") != std::string::npos);
    CHECK(r.out.find("source   default\n") != std::string::npos);
    CHECK(r.out.find("why      device '" + dev() + "' -> " + dev() + "; no table for key cpu/gemm|" + dev() +
                     "|K=8,N=8,dtype=fp32; get_default -> ") != std::string::npos);
    CHECK(r.out.find("match    exact") == std::string::npos);
  }
  std::vector<std::string> with = q;
  with.insert(with.end(), {"--cache", cache.string()});
  Run c = run_planted(with, home.path(), "home");
  CHECK(c.exit_code == 0);
  CHECK(c.out.find("match    exact\n") != std::string::npos);
  CHECK(c.out.find("dir      " + cache.string() + "\n") != std::string::npos);
  // --cache of a refused dir (world-writable): exit 1 naming why.
  TempDir open_dir;
  REQUIRE(::chmod(open_dir.str().c_str(), 0777) == 0);
  std::vector<std::string> refused = q;
  refused.insert(refused.end(), {"--cache", open_dir.str()});
  Run x = run_planted(refused, home.path(), "home");
  CHECK(x.exit_code == 1);
  CHECK(x.err == "kdispatch lookup: --cache '" + open_dir.str() + "': tuning cache dir '" + open_dir.str() +
                     "' (from tune.cache_dir) refused: it is world-writable (mode 0777): anyone could plant rows in "
                     "it; tuning results are neither read from it nor written to it\n");
}

TEST_CASE("offline: misses exports the misses of the config dirs, not of the user's cache, --cache reads it") {
  TempDir home, out;
  const fs::path cache = home / ".cache/kdispatch";
  plant_cache(cache);
  const fs::path trace = out / "trace.txt";
  kdtest::write_text(trace, "1\n");
  const auto misses = [&](const std::string& csv, const char* how, std::vector<std::string> extra) {
    std::vector<std::string> a = {"misses", "--export", csv, "--trace", trace.string(), "--steps",
                                  "1",      "--layers", "1", "--dtype", "fp32",         "--no-shipped-configs"};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_planted(a, home.path(), how);
  };
  // The replay's first call: rmsnorm hidden=896 fp32 M=1, which only the cache holds.
  const auto has_rmsnorm_896 = [](const std::string& text) {
    for (size_t at = 0; (at = text.find("\nrmsnorm,", at)) != std::string::npos; ++at) {
      const size_t end = text.find('\n', at + 1);
      if (text.substr(at, end - at).find(",896,") != std::string::npos) return true;
    }
    return false;
  };
  for (const char* how : {"env", "home"}) {
    CAPTURE(how);
    const std::string csv = (out / (std::string(how) + ".csv")).string();
    Run r = misses(csv, how, {});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(has_rmsnorm_896(kdtest::read_text(csv)));
  }
  const std::string csv = (out / "with-cache.csv").string();
  Run c = misses(csv, "home", {"--cache", cache.string()});
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  CHECK_FALSE(has_rmsnorm_896(kdtest::read_text(csv)));
}

TEST_CASE("offline: tune --emit reads its emit dir as its done set, never the user's cache") {
  TempDir home, work;
  const fs::path cache = home / ".cache/kdispatch";
  plant_cache(cache);
  const auto before = snapshot(cache);
  const fs::path csv = work / "s.csv";
  kdtest::write_text(csv, "M,N,K\n8,8,8\n");
  const fs::path emit = work / "emit";
  for (const char* how : {"env", "home"}) {
    CAPTURE(how);
    fs::remove_all(emit);
    Run r = run_planted({"tune", "--shapes", csv.string(), "--op", "gemm", "--dtype", "fp32", "--emit", emit.string(),
                         "--budget-ms", "20", "--no-cold-cache"},
                        home.path(), how);
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.find("1 gemm shapes: 1 tuned, 0 skipped (0 already in " + emit.string()) == 0);
    CHECK(fs::exists(emit / ("cpu/gemm/N=8,K=8,device_name=" + dev() + ",dtype=fp32.json")));
  }
  CHECK(snapshot(cache) == before);  // neither read as done nor written
}

TEST_CASE("offline: merge reads its sources only, never the user's cache") {
  TempDir home, work;
  plant_cache(home / ".cache/kdispatch");
  const fs::path src = work / "src";  // a tuned table (merge combines those)
  REQUIRE(store::persist_rows(src.string(), clean_tree_file(), {ref_row(1, "gemm_fp32__ref")}, store::cpu_fingerprint(),
                              {{"gemm_fp32__ref", 1}})
              .ok());
  for (const char* how : {"env", "home"}) {
    CAPTURE(how);
    const fs::path out = work / (std::string("out-") + how);
    Run r = run_planted({"merge", "--out", out.string(), src.string()}, home.path(), how);
    CHECK_MESSAGE(r.exit_code == 0, r.err);
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(out))
      if (e.is_regular_file()) files.push_back(fs::relative(e.path(), out).string());
    CHECK(files == std::vector<std::string>{clean_tree_file()});
  }
}

TEST_CASE("validate --cache of a refused dir exits 1 naming why") {
  TempDir dir;
  make_tree(dir.path());
  REQUIRE(::chmod(dir.str().c_str(), 0777) == 0);
  kdtest::CliResult r = kdtest::run_cli({"validate", "--cache", dir.str()});
  CHECK(r.exit_code == 1);
  const std::string why = "tuning cache dir '" + dir.str() +
                          "' (from tune.cache_dir) refused: it is world-writable (mode 0777): anyone could plant rows "
                          "in it; tuning results are neither read from it nor written to it";
  CHECK(r.err == "kdispatch validate: --cache '" + dir.str() + "': " + why + "\n");
  CHECK(r.out == "note: " + why +
                     "\n0 files: 0 loaded, 0 partial, 0 skipped; 0 unknown-device files; 0 keys, 0 rows\n" +
                     "cache dir " + dir.str() + " is not usable: refused, so no runtime reads it\n");
  kdtest::CliResult j = kdtest::run_cli({"validate", "--cache", dir.str(), "--json"});
  CHECK(j.exit_code == 1);
  CHECK(j.out.find("\"refused\": \"" + why + "\"") != std::string::npos);
  // Control: the same dir, private and holding a table of this build, is usable.
  fs::remove_all(dir / "cpu");
  REQUIRE(store::persist_rows(dir.str(), clean_tree_file(), {ref_row(1, "gemm_fp32__ref")}, store::cpu_fingerprint(),
                              {{"gemm_fp32__ref", 1}})
              .ok());
  REQUIRE(::chmod(dir.str().c_str(), 0700) == 0);
  kdtest::CliResult ok = kdtest::run_cli({"validate", "--cache", dir.str()});
  CHECK_MESSAGE(ok.exit_code == 0, ok.out);
}

TEST_CASE("misses --export and replay --export-misses: an unwritable path is a usage error before the replay") {
  kdtest::CliResult m = kdtest::run_cli({"misses", "--export", "/nonexistent/x.csv"});
  CHECK(m.exit_code == 2);
  CHECK(m.out == "");
  CHECK(m.err ==
        "kdispatch misses: --export '/nonexistent/x.csv': cannot be written: its directory '/nonexistent' "
        "does not exist\n");
  kdtest::CliResult r = kdtest::run_cli({"replay", "--export-misses", "/nonexistent/x.csv"});
  CHECK(r.exit_code == 2);
  CHECK(r.out == "");
  CHECK(r.err ==
        "kdispatch replay: --export-misses '/nonexistent/x.csv': cannot be written: its directory "
        "'/nonexistent' does not exist\n");
  TempDir d;
  kdtest::CliResult dir = kdtest::run_cli({"misses", "--export", d.str()});
  CHECK(dir.exit_code == 2);
  CHECK(dir.err == "kdispatch misses: --export '" + d.str() + "': is a directory, not a file\n");
  // An existing file is neither truncated nor removed by the check.
  kdtest::write_text(d / "keep.csv", "old");
  kdtest::CliResult bad = kdtest::run_cli({"misses", "--export", (d / "keep.csv").string(), "--model", "nope"});
  CHECK(bad.exit_code == 2);
  CHECK(kdtest::read_text(d / "keep.csv") == "old");
}

TEST_CASE("tune: --workers-per-device, --unit-timeout-s and --shard out of range are usage errors naming the range") {
  TempDir dir;
  kdtest::write_text(dir / "s.csv", "M,hidden\n1,64\n");
  const std::vector<std::string> base = {
      "tune", "--shapes", (dir / "s.csv").string(), "--op",        "rmsnorm", "--dtype",
      "fp32", "--emit",   (dir / "emit").string(),  "--budget-ms", "20",      "--no-cold-cache"};
  const auto refused = [&](std::vector<std::string> extra, const std::string& err) {
    CAPTURE(err);
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    kdtest::CliResult r = kdtest::run_cli(a);
    CHECK(r.exit_code == 2);
    CHECK(r.err.rfind(err, 0) == 0);
    CHECK(r.out == "");
  };
  refused({"--devices", "0", "--workers-per-device", "-1"},
          "kdispatch tune: --workers-per-device must be in [1, 64], got -1\n");
  refused({"--devices", "0", "--workers-per-device", "65"},
          "kdispatch tune: --workers-per-device must be in [1, 64], got 65\n");
  refused({"--workers-per-device", "-1"}, "kdispatch tune: --workers-per-device must be in [1, 64], got -1\n");
  refused({"--devices", "0", "--unit-timeout-s", "-1"},
          "kdispatch tune: --unit-timeout-s must be in [1, 604800] seconds (1 s to a week), got -1\n");
  refused({"--devices", "0", "--unit-timeout-s", "1e30"},
          "kdispatch tune: --unit-timeout-s must be in [1, 604800] seconds (1 s to a week), got 1e+30\n");
  refused({"--devices", "0", "--unit-timeout-s", "nan"},
          "kdispatch tune: --unit-timeout-s must be in [1, 604800] seconds (1 s to a week), got nan\n");
  refused({"--shard", ""}, "--shard: expected i/n (0 <= i < n, n >= 1) or auto, got ''\n");
  CHECK_FALSE(fs::exists(dir / "emit"));
}

TEST_CASE("tune: a shape row without the op's dim column fails naming the column and the row, exit 1") {
  TempDir dir;
  const std::string csv = (dir / "s.csv").string();
  kdtest::write_text(csv, "M,N\n1,64\n");
  const std::string emit = (dir / "emit").string();
  kdtest::CliResult r = kdtest::run_cli({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", emit,
                                         "--budget-ms", "20", "--no-cold-cache"});
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("left out") == std::string::npos);
  CHECK(r.err.find("  failed " + csv +
                   ":2 M=1: a rmsnorm row needs hidden >= 1 and the row names no other op: the "
                   "file has no 'hidden' column (columns: M,N)\n") != std::string::npos);
  CHECK(r.out.rfind("1 rmsnorm shapes: 0 tuned, 0 skipped (0 already in " + emit +
                        ", 0 too large here, 0 not tunable here), 1 failed;",
                    0) == 0);
  // The column there, the row's value empty: said so.
  kdtest::write_text(csv, "M,hidden,N\n1,,64\n2,64,\n");
  kdtest::CliResult e = kdtest::run_cli({"tune", "--shapes", csv, "--op", "rmsnorm", "--dtype", "fp32", "--emit", emit,
                                         "--budget-ms", "20", "--no-cold-cache", "--json"});
  CHECK(e.exit_code == 1);
  CHECK(e.out.find("\"shapes\": 2, \"tuned\": 1") != std::string::npos);
  CHECK(e.out.find("\"failed\": 1") != std::string::npos);
  CHECK(e.out.find("{\"shape\": \"" + csv +
                   ":2\", \"M\": 1, \"status\": \"failed\", \"message\": \"a rmsnorm row "
                   "needs hidden >= 1 and the row names no other op: no value in its 'hidden' column (columns: "
                   "M,hidden,N)\"}") != std::string::npos);
}

#endif  // KDISPATCH_CLI_PATH

TEST_CASE("cache dir: KDISPATCH_CACHE_DIR that cannot be created is refused at start, naming the variable") {
  EnvScope e({{"KDISPATCH_CACHE_DIR", "/proc/x"}, {"KDISPATCH_TUNE", nullptr}});
  auto o = options_from_env();
  REQUIRE(o.ok());
  o->load_shipped_configs = false;
  o->log_level = LogLevel::off;
  o->tune.mode = TuneMode::sync;
  auto rt = Runtime::create(*o);
  REQUIRE(rt.ok());  // not fatal: tuning runs, persistence is off
  CHECK((*rt)->cache_dir() == "");
  const LoadReport rep = (*rt)->load_report();
  REQUIRE(rep.notes.size() == 1);
  CHECK(rep.notes[0] ==
        "tuning cache dir '/proc/x' (from KDISPATCH_CACHE_DIR) refused: it does not exist and cannot "
        "be created: mkdir '/proc/x': No such file or directory; tuning results are neither read from "
        "it nor written to it");
  std::vector<float> a(64, 1.f), b(64, 1.f), d(64);
  GemmArgs args{make_tensor_2d(a.data(), DType::fp32, 8, 8, 8), make_tensor_2d(b.data(), DType::fp32, 8, 8, 8),
                make_tensor_2d(d.data(), DType::fp32, 8, 8, 8), TensorRef{}};
  auto pr = pretune(**rt, args);
  REQUIRE(pr.ok());
  CHECK_FALSE(pr->persisted);
  // An absent dir that can be made is accepted, and not made at start.
  TempDir tmp;
  const std::string later = tmp.str() + "/a/b";
  const store::CacheDirChoice ok = store::resolve_cache_dir(later);
  CHECK(ok.refused == "");
  CHECK_FALSE(fs::exists(tmp / "a"));
  // Below a regular file: refused, naming it.
  kdtest::write_text(tmp / "file", "x");
  CHECK(store::resolve_cache_dir(tmp.str() + "/file/c").refused ==
        "tuning cache dir '" + tmp.str() + "/file/c' (from tune.cache_dir) refused: its parent '" + tmp.str() +
            "/file' is not a directory; tuning results are neither read from it nor written to it");
  CHECK(store::resolve_cache_dir(tmp.str() + "/file/c/d").refused ==
        "tuning cache dir '" + tmp.str() + "/file/c/d' (from tune.cache_dir) refused: its ancestor '" + tmp.str() +
            "/file' is not a directory; tuning results are neither read from it nor written to it");
}

TEST_CASE("cache dir: the ancestor rule: /tmp and a private home pass, unsafe ancestors are refused by name") {
  TempDir tmp;  // in /tmp: sticky, root's; this dir ours
  SUBCASE("a dir under /tmp and $HOME/.cache/kdispatch pass") {
    CHECK(store::resolve_cache_dir(tmp.str() + "/cache").refused == "");
    REQUIRE(::chmod(tmp.str().c_str(), 0750) == 0);
    fs::create_directories(tmp / ".cache");
    REQUIRE(::chmod((tmp / ".cache").c_str(), 0755) == 0);
    EnvScope e({{"KDISPATCH_CACHE_DIR", nullptr}, {"XDG_CACHE_HOME", nullptr}, {"HOME", tmp.str().c_str()}});
    const store::CacheDirChoice c = store::resolve_cache_dir("");
    CHECK(c.origin == "HOME");
    CHECK(c.dir == tmp.str() + "/.cache/kdispatch");
    CHECK(c.refused == "");
  }
  SUBCASE("an ancestor writable by others without the sticky bit") {
    fs::create_directories(tmp / "shared/me");
    REQUIRE(::chmod((tmp / "shared").c_str(), 0777) == 0);
    CHECK(store::resolve_cache_dir(tmp.str() + "/shared/me/cache").refused ==
          "tuning cache dir '" + tmp.str() + "/shared/me/cache' (from tune.cache_dir) refused: its ancestor '" +
              tmp.str() +
              "/shared' is group/world-writable (mode 0777) without the sticky bit; tuning results are "
              "neither read from it nor written to it");
    REQUIRE(::chmod((tmp / "shared").c_str(), 0775) == 0);  // group-writable too
    CHECK(store::resolve_cache_dir(tmp.str() + "/shared/me/cache")
              .refused.find("its ancestor '" + tmp.str() +
                            "/shared' is group/world-writable (mode 0775) without the sticky bit") !=
          std::string::npos);
    REQUIRE(::chmod((tmp / "shared").c_str(), 0755) == 0);
    CHECK(store::resolve_cache_dir(tmp.str() + "/shared/me/cache").refused == "");
  }
  SUBCASE("a link that leads through a dir others may write: refused, naming the dir and the link") {
    fs::create_directories(tmp / "open/x");
    REQUIRE(::chmod((tmp / "open").c_str(), 0777) == 0);
    fs::create_directories(tmp / "mine");
    REQUIRE(::symlink((tmp / "open/x").c_str(), (tmp / "mine/link").c_str()) == 0);
    CHECK(store::resolve_cache_dir(tmp.str() + "/mine/link/cache").refused ==
          "tuning cache dir '" + tmp.str() + "/mine/link/cache' (from tune.cache_dir) refused: its ancestor '" +
              tmp.str() + "/open' (the path '" + tmp.str() +
              "/mine/link/cache' leads there through a symbolic "
              "link: '" +
              tmp.str() + "/mine/link' is '" + tmp.str() +
              "/open/x') is group/world-writable (mode 0777) "
              "without the sticky bit; tuning results are neither read from it nor written to it");
  }
  SUBCASE("another user's parent with a planted link: refused, nothing written where the link points (root only)") {
    if (::geteuid() != 0) return;
    // The attack: uid 65534 owns the parent and plants `cache` -> a dir of root's.
    fs::create_directories(tmp / "theirs");
    fs::create_directories(tmp / "victim");
    REQUIRE(::chown((tmp / "theirs").c_str(), kNobody, kNobody) == 0);
    REQUIRE(::symlink((tmp / "victim").c_str(), (tmp / "theirs/cache").c_str()) == 0);
    RuntimeOptions o;
    o.load_shipped_configs = false;
    o.log_level = LogLevel::off;
    o.tune.mode = TuneMode::sync;
    o.tune.cache_dir = tmp.str() + "/theirs/cache";
    auto rt = Runtime::create(o).value();
    CHECK(rt->cache_dir() == "");
    REQUIRE(rt->load_report().notes.size() == 1);
    CHECK(rt->load_report().notes[0] ==
          "tuning cache dir '" + tmp.str() + "/theirs/cache' (from tune.cache_dir) refused: its parent '" + tmp.str() +
              "/theirs' is owned by uid 65534, not by this process (uid 0) or root; tuning results are neither read "
              "from it nor written to it");
    std::vector<float> a(64, 1.f), b(64, 1.f), d(64);
    GemmArgs args{make_tensor_2d(a.data(), DType::fp32, 8, 8, 8), make_tensor_2d(b.data(), DType::fp32, 8, 8, 8),
                  make_tensor_2d(d.data(), DType::fp32, 8, 8, 8), TensorRef{}};
    auto pr = pretune(*rt, args);
    REQUIRE(pr.ok());
    CHECK_FALSE(pr->persisted);
    CHECK(fs::is_empty(tmp / "victim"));
  }
  SUBCASE("a sticky dir whose next component is another user's (root only)") {
    if (::geteuid() != 0) return;
    fs::create_directories(tmp / "sticky/theirs");
    REQUIRE(::chmod((tmp / "sticky").c_str(), 01777) == 0);
    REQUIRE(::chown((tmp / "sticky/theirs").c_str(), kNobody, kNobody) == 0);
    REQUIRE(::chmod((tmp / "sticky/theirs").c_str(), 0755) == 0);
    CHECK(store::resolve_cache_dir(tmp.str() + "/sticky/theirs/cache").refused ==
          "tuning cache dir '" + tmp.str() + "/sticky/theirs/cache' (from tune.cache_dir) refused: its ancestor '" +
              tmp.str() + "/sticky' is group/world-writable and sticky (mode 1777) and its entry '" + tmp.str() +
              "/sticky/theirs' on the path is owned by uid 65534, not by this process (uid 0); tuning results are "
              "neither read from it nor written to it");
    // Ours below the same sticky dir: passes.
    fs::create_directories(tmp / "sticky/mine");
    CHECK(store::resolve_cache_dir(tmp.str() + "/sticky/mine/cache").refused == "");
    // The cache dir's own name in the sticky dir is another user's link to a
    // dir of root's: refused (its owner could point it anywhere).
    fs::create_directories(tmp / "rootdir");
    REQUIRE(::symlink((tmp / "rootdir").c_str(), (tmp / "sticky/kd").c_str()) == 0);
    REQUIRE(::lchown((tmp / "sticky/kd").c_str(), kNobody, kNobody) == 0);
    CHECK(store::resolve_cache_dir(tmp.str() + "/sticky/kd").refused ==
          "tuning cache dir '" + tmp.str() + "/sticky/kd' (from tune.cache_dir) refused: its parent '" + tmp.str() +
              "/sticky' is group/world-writable and sticky (mode 1777) and its entry '" + tmp.str() +
              "/sticky/kd' on the path is owned by uid 65534, not by this process (uid 0); tuning results are "
              "neither read from it nor written to it");
  }
}

TEST_CASE("fork: a child whose runtime was made before fork() says once, at warn, why it does not tune") {
  TempDir cache;
  RuntimeOptions o;
  o.load_shipped_configs = false;
  o.log_level = LogLevel::warn;
  o.tune.mode = TuneMode::sync;
  o.tune.cache_dir = cache.str();
  o.tune.time_budget_ms = 5;
  o.tune.cold_cache = false;
  auto rt = Runtime::create(o).value();
  const fs::path log = cache / "child-stderr.txt";
  const int parent = static_cast<int>(::getpid());
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ::dup2(fd, 2) < 0) ::_exit(20);
    int code = 0;
    for (int64_t hidden : {64, 96, 64, 128}) {  // misses, and one shape again
      std::vector<float> x(static_cast<size_t>(3 * hidden), 1.f), y(x.size()), w(static_cast<size_t>(hidden), 1.f);
      RmsNormArgs a{make_tensor_2d(y.data(), DType::fp32, 3, hidden, hidden),
                    make_tensor_2d(x.data(), DType::fp32, 3, hidden, hidden),
                    make_tensor_1d(w.data(), DType::fp32, hidden), 1e-6f};
      DispatchInfo info;
      if (!rmsnorm(*rt, a, {}, {.info = &info}).ok() || info.source != PlanSource::fallback) code = 21;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(kdtest::read_text(log) ==
        "kdispatch: tuning is off in this process (pid " + std::to_string(pid) +
            "): its runtime was created before fork() (in pid " + std::to_string(parent) +
            "), so in this child it serves its table and the defaults only, and its misses are not tuned; create a "
            "runtime after fork() to tune here\n");
  CHECK(rt->tune_stats().shapes_tuned == 0);  // the parent tuned nothing either
}
