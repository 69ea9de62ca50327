// SPDX-License-Identifier: Apache-2.0
// Issue 31, item 5: every file input goes through the one bounded reader
// (store/bounded_read.hpp): a FIFO with no writer is refused at once (never
// waited on), /dev/zero and other devices are refused with what they are,
// and a file over the limit is refused with its size and the limit before
// anything is allocated (a sparse 300 MiB file: the peak RSS barely moves).
// Through each path that reads one: the loader, the cache writer's re-read
// of a table, `tune --shapes` and `replay --trace`.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "cli_util.hpp"
#include "locking_util.hpp"
#include "store/bounded_read.hpp"
#include "store/fingerprint.hpp"
#include "store/json_file.hpp"
#include "store/limits.hpp"
#include "store/loader.hpp"
#include "store/writer.hpp"
#include "test_util.hpp"

using namespace dispatch;
using kdtest::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kSparse = int64_t{300} << 20;  // truncate -s 300M
const std::string kLimit = std::to_string(int64_t{256} << 20);

struct LimitsGuard {
  store::Limits saved = store::limits();
  ~LimitsGuard() { store::limits() = saved; }
};

// Peak resident set of this process, in bytes.
int64_t peak_rss() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

void make_sparse(const fs::path& p) {
  kdtest::write_text(p, "");
  fs::resize_file(p, static_cast<uintmax_t>(kSparse));
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string moe_table(int rows) {
  std::string s = "{";
  for (int m = 1; m <= rows; ++m)
    s += (m > 1 ? ", \"" : "\"") + std::to_string(m) + "\": {\"BLOCK_SIZE_M\": 16, \"num_warps\": 4}";
  return s + "}";
}

store::PersistRow ref_row(int64_t m) {
  store::PersistRow r;
  r.m = m;
  r.config = {{"variant", ConfigValue::string("gemm_fp32__ref")}};
  return r;
}
const std::vector<std::pair<std::string, int32_t>> kSchema = {{"gemm_fp32__ref", 1}};

std::vector<int64_t> rows_of(const fs::path& p) {
  std::string text = kdtest::read_text(p);
  const size_t n = text.size();
  text.append(store::json_padding(), '\0');
  const store::ParsedFile pf = store::parse_config_json(text.data(), n);
  REQUIRE(pf.kind == store::ParsedFile::Kind::table);
  std::vector<int64_t> ms;
  for (const auto& r : pf.rows) ms.push_back(r.m);
  std::sort(ms.begin(), ms.end());
  return ms;
}

// The one "<name>.corrupt-*" file beside `target`.
fs::path aside_of(const fs::path& target) {
  std::vector<fs::path> found;
  for (const auto& e : fs::directory_iterator(target.parent_path()))
    if (e.path().filename().string().rfind(target.filename().string() + ".corrupt-", 0) == 0) found.push_back(e.path());
  REQUIRE(found.size() == 1);
  return found.front();
}

}  // namespace

TEST_CASE(
    "bounded read: a FIFO with no writer, /dev/zero, a directory and a sparse file over the limit are refused at once, "
    "with the reason") {
  TempDir dir;
  const fs::path fifo = dir / "x.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const fs::path big = dir / "big.json";
  make_sparse(big);
  const int64_t rss0 = peak_rss();
  const auto t0 = std::chrono::steady_clock::now();
  std::string out = "left over", why;

  CHECK(store::read_bounded(fifo.string(), &out, {}, &why) == store::ReadError::not_regular);
  CHECK(why == "'" + fifo.string() + "' is a FIFO: only a regular file is read");
  CHECK(out.empty());
  CHECK(store::read_bounded("/dev/zero", &out, {}, &why) == store::ReadError::not_regular);
  CHECK(why == "'/dev/zero' is a character device: only a regular file is read");
  CHECK(store::read_bounded(dir.str(), &out, {}, &why) == store::ReadError::not_regular);
  CHECK(why == "'" + dir.str() + "' is a directory: only a regular file is read");
  // A generated file: fstat says 0 bytes, a read gives content (tune --shapes
  // /proc/cpuinfo said "empty file (no header)").
  CHECK(store::read_bounded("/proc/self/status", &out, {}, &why) == store::ReadError::not_regular);
  CHECK(why ==
        "'/proc/self/status' reports a size of 0 bytes but has content (a generated file, as in /proc or /sys): "
        "not read");
  kdtest::write_text(dir / "empty.json", "");
  CHECK(store::read_bounded((dir / "empty.json").string(), &out, {}, &why) == store::ReadError::ok);
  CHECK(out.empty());
  CHECK(store::read_bounded(big.string(), &out, {}, &why) == store::ReadError::too_large);
  CHECK(why == "'" + big.string() +
                   "' is 314572800 bytes, over the limit for one input file "
                   "(docs/config-files.md#limits) of " +
                   kLimit + " bytes: not read");
  CHECK(out.empty());
  int fd = 7;
  size_t size = 0;
  CHECK(store::open_bounded_at(AT_FDCWD, big.string(), {}, &fd, &size, &why) == store::ReadError::too_large);
  CHECK(fd == -1);
  CHECK(size == static_cast<size_t>(kSparse));  // the size, for the caller's message; nothing read
  CHECK(store::read_bounded((dir / "none.json").string(), &out, {}, &why) == store::ReadError::missing);
  CHECK(why == "'" + (dir / "none.json").string() + "' does not exist");
  CHECK(seconds_since(t0) < 2.0);
  CHECK(peak_rss() - rss0 < (int64_t{32} << 20));  // the 300 MiB file was never allocated

  // A lowered limit and a regular file within it: read whole, padding after it.
  kdtest::write_text(dir / "ok.json", "{\"1\": {}}");
  store::BoundedRead opt;
  opt.limit = 9;
  opt.padding = 4;
  REQUIRE(store::read_bounded((dir / "ok.json").string(), &out, opt, &why) == store::ReadError::ok);
  CHECK(out == std::string("{\"1\": {}}") + std::string(4, '\0'));
  opt.limit = 8;
  CHECK(store::read_bounded((dir / "ok.json").string(), &out, opt, &why) == store::ReadError::too_large);
}

TEST_CASE("loader: a config file swapped for a FIFO or /dev/zero after the walk is refused at once, never waited on") {
  // The walk stats every file first (a FIFO found there is reported by the
  // walk); the file is opened later. A file replaced in between used to be
  // opened blocking: a FIFO with no writer hung the load (and every reload).
  const std::string a = "E=8,N=1,device_name=NVIDIA_H200.json", b = "E=8,N=2,device_name=NVIDIA_H200.json";
  for (const bool fifo : {true, false}) {
    CAPTURE(fifo);
    TempDir dir;
    kdtest::write_text(dir / a, moe_table(4));
    kdtest::write_text(dir / b, moe_table(4));
    const fs::path target = dir / b;
    uint32_t next = 1;
    int swapped = -1;
    // Called for file a once it parsed, before file b is opened (path order).
    auto intern = [&](const std::string&, const std::string&) {
      if (next == 1)
        swapped = ::unlink(target.c_str()) == 0 &&
                  (fifo ? ::mkfifo(target.c_str(), 0600) : ::symlink("/dev/zero", target.c_str())) == 0;
      return next++;
    };
    const std::vector<store::SourceDir> dirs = {{dir.str(), 0, false}};
    auto fut = std::async(std::launch::async, [&] { return store::load_config_dirs(dirs, {}, intern); });
    if (fut.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      FAIL_CHECK("the load blocked on the FIFO");
      const int w = ::open(target.c_str(), O_WRONLY | O_NONBLOCK);  // let it go
      if (w >= 0) ::close(w);
    }
    const store::LoadOutput out = fut.get();
    REQUIRE(swapped == 1);
    const FileReport* fa = kdtest::find_file(out.report, a);
    const FileReport* fb = kdtest::find_file(out.report, b);
    REQUIRE(fa != nullptr);
    REQUIRE(fb != nullptr);
    CHECK(fa->state == FileReport::State::loaded);
    CHECK(fa->rows == 4);
    CHECK(fb->state == FileReport::State::skipped);
    REQUIRE(!fb->problems.empty());
    CHECK(fb->problems.front() ==
          "'" + target.string() + "' is " + (fifo ? "a FIFO" : "a character device") + ": only a regular file is read");
  }
}

TEST_CASE(
    "loader: a sparse 300 MiB config file is refused with its size and the limit, nothing allocated, the rest serves") {
  TempDir dir;
  const std::string a = "E=8,N=1,device_name=NVIDIA_H200.json", b = "E=8,N=2,device_name=NVIDIA_H200.json";
  kdtest::write_text(dir / a, moe_table(4));
  make_sparse(dir / b);
  const int64_t rss0 = peak_rss();
  const auto t0 = std::chrono::steady_clock::now();
  auto rt = kdtest::make_runtime({dir.str()});
  CHECK(seconds_since(t0) < 5.0);
  CHECK(peak_rss() - rss0 < (int64_t{64} << 20));
  const LoadReport rep = rt->load_report();
  const FileReport* fb = kdtest::find_file(rep, b);
  REQUIRE(fb != nullptr);
  CHECK(fb->state == FileReport::State::skipped);
  REQUIRE(fb->problems.size() == 1);
  CHECK(fb->problems[0] == "file is 314572800 bytes, over the limit of " + kLimit +
                               " bytes for one config file (docs/config-files.md#limits): not read");
  CHECK(kdtest::find_file(rep, a)->rows == 4);
  CHECK(kdtest::lookup_ok(*rt, kdtest::query("E=8,N=1", "NVIDIA_H200", 3)).match == LookupResult::Match::exact);
}

TEST_CASE_TEMPLATE(
    "persist_rows: a table over the size limit is moved aside whole, never read, and the new rows are written", T,
    FlockScheme, FragmentScheme) {
  kdtest::WriterScheme scheme(T::fragments);
  LimitsGuard g;
  TempDir dir;
  const std::string rel = "cpu/gemm/N=8,K=8,device_name=CPU_test,dtype=fp32.json";
  const fs::path target = kdtest::written_file(dir.path(), rel, T::fragments);
  std::vector<store::PersistRow> rows;
  for (int64_t m = 1; m <= 100; ++m) rows.push_back(ref_row(m));
  REQUIRE(store::persist_rows(dir.str(), rel, rows, store::cpu_fingerprint(), kSchema).ok());
  const std::string before = kdtest::read_text(target);
  REQUIRE(before.size() > 4096);

  SUBCASE("over a lowered limit: the rows are kept aside byte for byte, the new row is written alone") {
    store::limits().max_file_bytes = 4096;
    std::vector<std::string> notes;
    const Status s =
        store::persist_rows(dir.str(), rel, {ref_row(200)}, store::cpu_fingerprint(), kSchema, nullptr, false, &notes);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    CHECK(rows_of(target) == std::vector<int64_t>{200});
    const fs::path aside = aside_of(target);
    CHECK(kdtest::read_text(aside) == before);
    REQUIRE(notes.size() == 1);
    CHECK(notes[0] == "'" + target.string() + "' is " + std::to_string(before.size()) +
                          " bytes, over the limit for one config file (docs/config-files.md#limits) of 4096 bytes: "
                          "not read; moved aside to '" +
                          aside.string() + "' and started afresh (the loader does not read it either)");
  }
  SUBCASE("a sparse 300 MiB file at the default limit: moved aside at once, nothing allocated") {
    fs::resize_file(target, static_cast<uintmax_t>(kSparse));
    const int64_t rss0 = peak_rss();
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> notes;
    const Status s =
        store::persist_rows(dir.str(), rel, {ref_row(200)}, store::cpu_fingerprint(), kSchema, nullptr, false, &notes);
    REQUIRE_MESSAGE(s.ok(), s.to_string());
    CHECK(seconds_since(t0) < 2.0);
    CHECK(peak_rss() - rss0 < (int64_t{32} << 20));
    CHECK(rows_of(target) == std::vector<int64_t>{200});
    const fs::path aside = aside_of(target);
    CHECK(fs::file_size(aside) == static_cast<uintmax_t>(kSparse));
    REQUIRE(notes.size() == 1);
    CHECK(notes[0] == "'" + target.string() +
                          "' is 314572800 bytes, over the limit for one config file "
                          "(docs/config-files.md#limits) of " +
                          kLimit + " bytes: not read; moved aside to '" + aside.string() +
                          "' and started afresh (the loader does not read it either)");
  }
}

#ifdef KDISPATCH_CLI_PATH
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// The CLI, killed after 20 s, and (where no sanitizer reserves its shadow
// memory) under a 4 GiB address-space cap: a reader that waits on a FIFO or
// grows on /dev/zero fails the test instead of hanging or swapping it.
kdtest::CliResult run_capped(const std::vector<std::string>& args) {
  TempDir tmp;
  const fs::path err_file = tmp / "stderr.txt";
  std::string cmd = std::string(kSanitized ? "" : "ulimit -v 4194304; ") +
                    "KDISPATCH_CACHE_DIR=" + kdtest::shell_quote((tmp / "cache").string()) + " timeout -s KILL 20 " +
                    kdtest::shell_quote(KDISPATCH_CLI_PATH);
  for (const auto& a : args) cmd += " " + kdtest::shell_quote(a);
  cmd += " 2>" + kdtest::shell_quote(err_file.string()) + " >/dev/null";
  const int status = std::system(cmd.c_str());
  kdtest::CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = kdtest::read_text(err_file);
  return r;
}

}  // namespace

TEST_CASE(
    "tune --shapes and replay --trace: /dev/zero, a FIFO with no writer and a sparse 300 MiB file are refused at once, "
    "with what they are") {
  TempDir dir;
  const fs::path fifo = dir / "shapes.csv";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const fs::path big = dir / "big.csv";
  make_sparse(big);
  const std::string big_why = "'" + big.string() +
                              "' is 314572800 bytes, over the limit for one input file "
                              "(docs/config-files.md#limits) of " +
                              kLimit + " bytes: not read";
  const std::vector<std::pair<std::string, std::string>> inputs = {
      {fifo.string(), "'" + fifo.string() + "' is a FIFO: only a regular file is read"},
      {"/dev/zero", "'/dev/zero' is a character device: only a regular file is read"},
      {big.string(), big_why}};
  for (const auto& [file, why] : inputs) {
    CAPTURE(file);
    auto t0 = std::chrono::steady_clock::now();
    kdtest::CliResult t = run_capped({"tune", "--shapes", file, "--op", "rmsnorm", "--emit", (dir / "emit").string()});
    CHECK(seconds_since(t0) < 15.0);
    CHECK(t.exit_code == 2);
    CHECK(t.err == "kdispatch tune: --shapes: " + why + "\n");
    t0 = std::chrono::steady_clock::now();
    kdtest::CliResult r = run_capped({"replay", "--trace", file, "--steps", "1"});
    CHECK(seconds_since(t0) < 15.0);
    CHECK(r.exit_code == 2);
    CHECK(kdtest::contains(r.err, why));
  }
  CHECK_FALSE(fs::exists(dir / "emit"));
}
#endif  // KDISPATCH_CLI_PATH
