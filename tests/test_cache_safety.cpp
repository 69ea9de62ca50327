// SPDX-License-Identifier: Apache-2.0
// The tuning cache dir and its writers under attack (issue 17): the per-user
// fallback, links planted at every name a writer touches, lock files removed
// by another process, corrupt files, dead writers' temp files and claims.
// The same attacks from another uid, with real processes and kill -9s, run
// in .ci/run (tests/safety/).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>

#include "dispatch/dispatch.hpp"
#include "store/fingerprint.hpp"
#include "store/json_file.hpp"
#include "store/private_fs.hpp"
#include "store/writer.hpp"
#include "test_util.hpp"

using namespace dispatch;
using kdtest::TempDir;
namespace fs = std::filesystem;

namespace {

// Sets environment variables for one scope and puts the old values back.
class EnvScope {
 public:
  EnvScope(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k);
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      if (v) ::setenv(k, v, 1);
      else ::unsetenv(k);
    }
  }
  ~EnvScope() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

store::ParsedFile parse_file(const fs::path& p) {
  std::string text = kdtest::read_text(p);
  const size_t n = text.size();
  text.append(store::json_padding(), '\0');
  return store::parse_config_json(text.data(), n);
}

std::vector<int64_t> rows_of(const fs::path& p) {
  const store::ParsedFile pf = parse_file(p);
  REQUIRE_MESSAGE(pf.kind == store::ParsedFile::Kind::table, p.string(), " does not parse as a table");
  std::vector<int64_t> ms;
  for (const auto& r : pf.rows) ms.push_back(r.m);
  std::sort(ms.begin(), ms.end());
  return ms;
}

std::vector<std::string> dot_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string()[0] == '.') out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

store::PersistRow ref_row(int64_t m) {
  store::PersistRow r;
  r.m = m;
  r.config = {{"variant", ConfigValue::string("gemm_fp32__ref")}};
  return r;
}

const std::vector<std::pair<std::string, int32_t>> kSchema = {{"gemm_fp32__ref", 1}};

// The unprivileged uid the attacks come from when the tests run as root.
constexpr uid_t kNobody = 65534;

// The env of a process with none of the user's cache settings, so the
// per-user fallback under `tmpdir` is chosen.
EnvScope fallback_env(const std::string& tmpdir) {
  return EnvScope({{"KDISPATCH_CACHE_DIR", nullptr},
                   {"XDG_CACHE_HOME", nullptr},
                   {"HOME", nullptr},
                   {"XDG_RUNTIME_DIR", nullptr},
                   {"TMPDIR", tmpdir.c_str()}});
}

}  // namespace

TEST_CASE("cache dir: the per-user fallback is created 0700 and refused when a link, another uid's or writable by others") {
  TempDir tmp;
  REQUIRE(::chmod(tmp.str().c_str(), 01777) == 0);  // a /tmp of our own: world-writable, sticky
  const std::string expect = tmp.str() + "/kdispatch-" + std::to_string(::geteuid());
  auto env = fallback_env(tmp.str());

  SUBCASE("absent: created 0700 and used") {
    const store::CacheDirChoice c = store::resolve_cache_dir("");
    CHECK(c.dir == expect);
    CHECK(c.origin == "TMPDIR");
    CHECK(c.fallback());
    CHECK(c.refused == "");
    CHECK(mode_of(expect) == 0700);
    CHECK(store::default_cache_dir() == expect);
  }
  SUBCASE("group/world-writable: refused, naming the dir and the mode") {
    REQUIRE(::mkdir(expect.c_str(), 0700) == 0);
    REQUIRE(::chmod(expect.c_str(), 0777) == 0);
    const store::CacheDirChoice c = store::resolve_cache_dir("");
    CHECK(c.refused == "tuning cache dir '" + expect +
                           "' (the per-user fallback: KDISPATCH_CACHE_DIR, XDG_CACHE_HOME and HOME are unset) "
                           "refused: it is group/world-writable (mode 0777); tuning results are neither read from it "
                           "nor written to it (set KDISPATCH_CACHE_DIR to a private directory)");
    CHECK(store::default_cache_dir() == "");
    REQUIRE(::chmod(expect.c_str(), 0720) == 0);
    CHECK(store::resolve_cache_dir("").refused.find("group/world-writable (mode 0720)") != std::string::npos);
  }
  SUBCASE("a symbolic link (even to a private dir of ours): refused") {
    TempDir mine;
    REQUIRE(::symlink(mine.str().c_str(), expect.c_str()) == 0);
    const store::CacheDirChoice c = store::resolve_cache_dir("");
    CHECK(c.refused.find("'" + expect + "'") != std::string::npos);
    CHECK(c.refused.find("refused: it is a symbolic link;") != std::string::npos);
  }
  SUBCASE("a regular file: refused") {
    kdtest::write_text(expect, "x");
    CHECK(store::resolve_cache_dir("").refused.find("refused: it is not a directory;") != std::string::npos);
  }
  SUBCASE("owned by another uid (root only: chown)") {
    if (::geteuid() != 0) return;
    REQUIRE(::mkdir(expect.c_str(), 0700) == 0);
    REQUIRE(::chown(expect.c_str(), kNobody, kNobody) == 0);
    CHECK(store::resolve_cache_dir("").refused.find("refused: it is owned by uid 65534, not by this process (uid 0);") !=
          std::string::npos);
  }
  SUBCASE("XDG_RUNTIME_DIR comes before TMPDIR") {
    TempDir run;
    REQUIRE(::chmod(run.str().c_str(), 0700) == 0);
    EnvScope xdg({{"XDG_RUNTIME_DIR", run.str().c_str()}});
    const store::CacheDirChoice c = store::resolve_cache_dir("");
    CHECK(c.dir == run.str() + "/kdispatch");
    CHECK(c.origin == "XDG_RUNTIME_DIR");
    CHECK(c.refused == "");
    CHECK(mode_of(c.dir) == 0700);
  }
  SUBCASE("a parent that others may write without the sticky bit: refused") {
    REQUIRE(::chmod(tmp.str().c_str(), 0777) == 0);
    CHECK(store::resolve_cache_dir("").refused.find("its parent '" + tmp.str() +
                                                    "' is group/world-writable (mode 0777) without the sticky bit") !=
          std::string::npos);
    CHECK_FALSE(fs::exists(expect));
  }
}

TEST_CASE("cache dir: the user's choice is used as given, refused when world-writable or another user's") {
  TempDir tmp;
  {
    EnvScope e({{"KDISPATCH_CACHE_DIR", (tmp.str() + "/a/b").c_str()}});
    const store::CacheDirChoice c = store::resolve_cache_dir("");
    CHECK(c.dir == tmp.str() + "/a/b");
    CHECK(c.origin == "KDISPATCH_CACHE_DIR");
    CHECK(c.refused == "");
    CHECK_FALSE(fs::exists(c.dir));  // created 0700 on the first write, not at resolution
  }
  if (::geteuid() == 0) {  // another user's dir: refused unless shared with a group of ours
    REQUIRE(::chown(tmp.str().c_str(), kNobody, kNobody) == 0);
    REQUIRE(::chmod(tmp.str().c_str(), 0775) == 0);
    CHECK(store::resolve_cache_dir(tmp.str()).refused ==
          "tuning cache dir '" + tmp.str() +
              "' (from tune.cache_dir) refused: it is owned by uid 65534, not by this process (uid 0) or root, and is "
              "not group-writable by a group of this process; tuning results are neither read from it nor written to it");
    REQUIRE(::chown(tmp.str().c_str(), kNobody, 0) == 0);  // group root, group-writable: a shared dir
    CHECK(store::resolve_cache_dir(tmp.str()).refused == "");
    REQUIRE(::chown(tmp.str().c_str(), 0, 0) == 0);
  }
  REQUIRE(::chmod(tmp.str().c_str(), 01777) == 0);
  const store::CacheDirChoice c = store::resolve_cache_dir(tmp.str());
  CHECK(c.origin == "tune.cache_dir");
  CHECK(c.refused == "tuning cache dir '" + tmp.str() +
                         "' (from tune.cache_dir) refused: it is world-writable (mode 1777): anyone could plant rows "
                         "in it; tuning results are neither read from it nor written to it");
}

TEST_CASE("cache dir: rows planted in a refused fallback are never served, the load report says why") {
  TempDir tmp;
  REQUIRE(::chmod(tmp.str().c_str(), 01777) == 0);
  const std::string hostile = tmp.str() + "/kdispatch-" + std::to_string(::geteuid());
  // A valid cache file (this build's fingerprint) for gemm N=8,K=8 fp32, M=8.
  const std::string rel = "cpu/gemm/N=8,K=8,device_name=" + cpu_device_info().device_name + ",dtype=fp32.json";
  REQUIRE(store::persist_rows(hostile, rel, {ref_row(8)}, store::cpu_fingerprint(), kSchema).ok());
  REQUIRE(::chmod(hostile.c_str(), 0777) == 0);
  LookupQuery q{.op = "gemm", .key = "N=8,K=8,dtype=fp32", .M = 8};
  {
    // Control: the same dir given as a private dir of ours serves the row.
    REQUIRE(::chmod(hostile.c_str(), 0700) == 0);
    RuntimeOptions o;
    o.load_shipped_configs = false;
    o.log_level = LogLevel::off;
    o.tune.cache_dir = hostile;
    auto rt = Runtime::create(o).value();
    CHECK(lookup(*rt, q)->match == LookupResult::Match::exact);
    REQUIRE(::chmod(hostile.c_str(), 0777) == 0);
  }
  auto env = fallback_env(tmp.str());
  RuntimeOptions o;
  o.load_shipped_configs = false;
  o.log_level = LogLevel::off;
  o.tune.mode = TuneMode::sync;
  auto rt = Runtime::create(o).value();
  CHECK(rt->cache_dir() == "");
  auto lr = lookup(*rt, q);
  REQUIRE(lr.ok());
  CHECK(lr->match == LookupResult::Match::fallback);
  const LoadReport rep = rt->load_report();
  CHECK(rep.files.empty());
  REQUIRE(rep.notes.size() == 1);
  CHECK(rep.notes[0].find("tuning cache dir '" + hostile + "'") == 0);
  CHECK(rep.notes[0].find("group/world-writable (mode 0777)") != std::string::npos);
  // Tuning still works; its winner is not written there.
  std::vector<float> a(64, 1.f), b(64, 1.f), d(64);
  GemmArgs args{make_tensor_2d(a.data(), DType::fp32, 8, 8, 8), make_tensor_2d(b.data(), DType::fp32, 8, 8, 8),
                make_tensor_2d(d.data(), DType::fp32, 8, 8, 8), TensorRef{}};
  auto pr = pretune(*rt, args);
  REQUIRE(pr.ok());
  CHECK_FALSE(pr->persisted);
  CHECK(rows_of(fs::path(hostile) / rel) == std::vector<int64_t>{8});
}

TEST_CASE("persist_rows: a link at the file, lock or dir name is never written through") {
  TempDir dir;
  TempDir elsewhere;
  const fs::path victim = elsewhere / "victim";
  kdtest::write_text(victim, "precious\n");
  REQUIRE(::chmod(victim.c_str(), 0600) == 0);
  const std::string rel = "cpu/gemm/N=8,K=8,device_name=CPU_test,dtype=fp32.json";
  const fs::path target = dir / rel;
  fs::create_directories(target.parent_path());

  SUBCASE("the file itself") {
    fs::create_symlink(victim, target);
    Status s = store::persist_rows(dir.str(), rel, {ref_row(1)}, store::cpu_fingerprint(), kSchema);
    CHECK(s.code() == StatusCode::io_error);
    CHECK(s.message() == "'" + target.string() +
                             "' is a symbolic link: tuning results are not written through it (replace it with a "
                             "regular file or remove it)");
    CHECK(fs::is_symlink(target));
  }
  SUBCASE("the lock file") {
    const fs::path lock = target.parent_path() / ("." + target.filename().string() + ".lock");
    fs::create_symlink(victim, lock);
    Status s = store::persist_rows(dir.str(), rel, {ref_row(1)}, store::cpu_fingerprint(), kSchema);
    CHECK(s.code() == StatusCode::io_error);
    CHECK(s.message() == "cannot open lock file '" + lock.string() + "': it is a symbolic link (not followed)");
    CHECK_FALSE(fs::exists(target));
  }
  SUBCASE("a dir on the way (cpu/gemm -> a dir elsewhere)") {
    fs::remove(target.parent_path());
    fs::create_symlink(elsewhere.path(), target.parent_path());
    Status s = store::persist_rows(dir.str(), rel, {ref_row(1)}, store::cpu_fingerprint(), kSchema);
    CHECK(s.code() == StatusCode::io_error);
    CHECK(s.message() == "'" + target.parent_path().string() +
                             "' is a symbolic link: tuning results are not written through it");
    CHECK(dot_files(elsewhere.path()).empty());
    CHECK(std::distance(fs::directory_iterator(elsewhere.path()), fs::directory_iterator()) == 1);  // the victim only
  }
  SUBCASE("a FIFO at the file name") {
    REQUIRE(::mkfifo(target.c_str(), 0600) == 0);
    Status s = store::persist_rows(dir.str(), rel, {ref_row(1)}, store::cpu_fingerprint(), kSchema);
    CHECK(s.message() == "'" + target.string() + "' is not a regular file: tuning results are not written over it");
  }
  SUBCASE("links at the old predictable temp names are not touched") {
    for (int pid = ::getpid() - 5; pid <= ::getpid() + 5; ++pid)
      fs::create_symlink(victim, target.parent_path() / ("." + target.filename().string() + ".tmp." + std::to_string(pid)));
    REQUIRE(store::persist_rows(dir.str(), rel, {ref_row(1)}, store::cpu_fingerprint(), kSchema).ok());
    CHECK(rows_of(target) == std::vector<int64_t>{1});
    CHECK(dot_files(target.parent_path()).empty());  // dead writers' temp names, removed (the links, not the victim)
  }
  CHECK(kdtest::read_text(victim) == "precious\n");
  CHECK(mode_of(victim) == 0600);
}

TEST_CASE("persist_rows: new dirs are 0700, temp names carry host, pid and a random part") {
  TempDir dir;
  REQUIRE(store::persist_rows(dir.str() + "/cache", "cpu/gemm/N=8,K=8,device_name=CPU_test,dtype=fp32.json",
                              {ref_row(1)}, store::cpu_fingerprint(), kSchema)
              .ok());
  CHECK(mode_of(dir / "cache") == 0700);
  CHECK(mode_of(dir / "cache/cpu") == 0700);
  CHECK(mode_of(dir / "cache/cpu/gemm") == 0700);
  const std::string t1 = store::temp_name_for("f.json"), t2 = store::temp_name_for("f.json");
  const std::string prefix = ".f.json.tmp." + store::host_name() + "." + std::to_string(::getpid()) + ".";
  CHECK(t1.rfind(prefix, 0) == 0);
  CHECK(t1.size() == prefix.size() + 16);
  CHECK(t1 != t2);
}

TEST_CASE("persist_rows: a file that does not parse is moved aside and reported, never silently overwritten") {
  TempDir dir;
  const std::string rel = "cpu/gemm/N=8,K=8,device_name=CPU_test,dtype=fp32.json";
  const fs::path target = dir / rel;
  kdtest::write_text(target, "{\"1\": {\"variant\": \"gemm_fp32__ref\"}, \"2\": ");  // torn by hand
  std::vector<std::string> notes;
  REQUIRE(store::persist_rows(dir.str(), rel, {ref_row(4)}, store::cpu_fingerprint(), kSchema, nullptr, false, &notes)
              .ok());
  CHECK(rows_of(target) == std::vector<int64_t>{4});
  std::vector<fs::path> aside;
  for (const auto& e : fs::directory_iterator(target.parent_path()))
    if (e.path().filename().string().find(".json.corrupt-") != std::string::npos) aside.push_back(e.path());
  REQUIRE(aside.size() == 1);
  CHECK(kdtest::read_text(aside[0]) == "{\"1\": {\"variant\": \"gemm_fp32__ref\"}, \"2\": ");
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].find("'" + target.string() + "' did not parse as a config table (") == 0);
  CHECK(notes[0].find("moved aside to '" + aside[0].string() + "' and started afresh") != std::string::npos);
  // The aside file is not a *.json: the loader does not read it.
  CHECK(aside[0].extension() != ".json");
}

TEST_CASE("persist_rows: dead writers' temp files and claims are removed at the next write, no lock file stays") {
  TempDir dir;
  const std::string rel = "cpu/gemm/N=8,K=8,device_name=CPU_test,dtype=fp32.json";
  const fs::path parent = (dir / rel).parent_path();
  fs::create_directories(parent);
  // A writer killed after creating its temp file, one of an older build
  // (".<name>.tmp.<pid>"), and a lock file left by a killed holder.
  kdtest::write_text(parent / (store::temp_prefix_for("N=8,K=8,device_name=CPU_test,dtype=fp32.json") + "h.1.abc"), "{");
  kdtest::write_text(parent / ".N=8,K=8,device_name=CPU_test,dtype=fp32.json.tmp.77", "{");
  kdtest::write_text(parent / ".N=8,K=8,device_name=CPU_test,dtype=fp32.json.lock", "");
  // Another file's temp file is left alone (its writer may be alive).
  kdtest::write_text(parent / ".other.json.tmp.h.1.abc", "{");
  // A claim of a process of this host that is gone, and one of ours.
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  REQUIRE(::waitpid(dead, nullptr, 0) == dead);
  REQUIRE(store::try_claim(dir.str(), "key-a", 1));
  const fs::path claims = dir / ".claims";
  CHECK(mode_of(claims) == 0700);
  fs::path ours;
  for (const auto& e : fs::directory_iterator(claims)) ours = e.path();
  kdtest::write_text(claims / "0000000000000000-M9.claim",
                     std::to_string(dead) + " " + store::host_name() + "\nkey-b\n");

  REQUIRE(store::persist_rows(dir.str(), rel, {ref_row(1)}, store::cpu_fingerprint(), kSchema).ok());
  CHECK(dot_files(parent) == std::vector<std::string>{".other.json.tmp.h.1.abc"});
  std::vector<fs::path> left;
  for (const auto& e : fs::directory_iterator(claims)) left.push_back(e.path());
  CHECK(left == std::vector<fs::path>{ours});
}

TEST_CASE("persist_rows: lock files removed by their holders at every write never split the writers") {
  // Every write removes its lock file on the way out (so none is left
  // behind); a writer that waited on the removed file sees another inode
  // (or none) at the name after flock and starts again. Without that
  // re-check this loses rows. 4 writer processes x 60 rows, plus 1 process
  // taking and dropping the lock (and so removing the file) all the while:
  // every row is in the file. (The tool's old "remove idle lock files"
  // pass — open, try-lock, unlink by name — is gone: it removed a lock file
  // another process had just locked.)
  TempDir dir;
  const std::string rel = "cpu/gemm/N=8,K=8,device_name=CPU_test,dtype=fp32.json";
  const fs::path target = dir / rel;
  fs::create_directories(target.parent_path());
  constexpr int kWriters = 4, kRows = 60;
  pid_t churner = ::fork();
  REQUIRE(churner >= 0);
  if (churner == 0) {
    const int dfd = ::open(target.parent_path().c_str(), O_RDONLY | O_DIRECTORY);
    const std::string name = "." + target.filename().string() + ".lock";
    for (;;) {  // until killed
      store::FileLock l;
      if (!store::FileLock::acquire(dfd, name, name, &l).ok()) ::_exit(1);
    }
  }
  std::vector<pid_t> kids;
  for (int w = 0; w < kWriters; ++w) {
    pid_t k = ::fork();
    REQUIRE(k >= 0);
    if (k == 0) {
      for (int i = 0; i < kRows; ++i)
        if (Status s = store::persist_rows(dir.str(), rel, {ref_row(1 + w * kRows + i)}, store::cpu_fingerprint(),
                                           kSchema);
            !s.ok()) {
          std::fprintf(stderr, "writer %d: %s\n", w, s.to_string().c_str());
          ::_exit(1);
        }
      ::_exit(0);
    }
    kids.push_back(k);
  }
  for (pid_t k : kids) {
    int status = 0;
    REQUIRE(::waitpid(k, &status, 0) == k);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  ::kill(churner, SIGKILL);
  ::waitpid(churner, nullptr, 0);
  std::vector<int64_t> want;
  for (int i = 1; i <= kWriters * kRows; ++i) want.push_back(i);
  CHECK(rows_of(target) == want);
}
