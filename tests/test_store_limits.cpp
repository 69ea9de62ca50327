// SPDX-License-Identifier: Apache-2.0
// Issue 20: the config store's documented limits (docs/config-files.md#limits)
// each enforced at its bound with a reported reason, and incremental reload
// (only changed files read; unchanged keys copied; the table equal to a
// full load's).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "store/limits.hpp"
#include "test_util.hpp"

using namespace dispatch;
using namespace kdtest;

namespace {

// Lowers limits for one test case, restores them after.
struct LimitsGuard {
  store::Limits saved = store::limits();
  ~LimitsGuard() { store::limits() = saved; }
};

std::string table_json(int rows, int block_m, int first_m = 1) {
  std::string s = "{";
  for (int m = first_m; m < first_m + rows; ++m)
    s += (m > first_m ? ", \"" : "\"") + std::to_string(m) + "\": {\"BLOCK_SIZE_M\": " + std::to_string(block_m) +
         ", \"num_warps\": 4}";
  return s + "}";
}

std::string moe_file(int n) { return "E=8,N=" + std::to_string(n) + ",device_name=NVIDIA_H200.json"; }

const FileReport& file(const LoadReport& rep, const std::string& path) {
  const FileReport* f = find_file(rep, path.c_str());
  REQUIRE_MESSAGE(f != nullptr, path);
  return *f;
}

std::string first_problem(const LoadReport& rep, const std::string& path) {
  const FileReport& f = file(rep, path);
  REQUIRE(!f.problems.empty());
  return f.problems.front();
}

// Every key's whole table as text: M, config, source.
std::string table_text(const Runtime& rt, const std::vector<int>& ns) {
  std::string s;
  for (int n : ns) {
    auto t = lookup_table(
        rt, LookupQuery{.op = "triton_fused_moe", .key = "E=8,N=" + std::to_string(n), .device = "NVIDIA_H200"});
    s += "N=" + std::to_string(n) + (t.ok() ? "" : " none") + "\n";
    if (!t.ok()) continue;
    for (const auto& r : t->rows) s += std::to_string(r.m) + " " + config_to_json(r.config) + " " + r.source + "\n";
  }
  return s;
}

}  // namespace

TEST_CASE("limits: a file over the size limit is reported and not read") {
  LimitsGuard g;
  store::limits().max_file_bytes = 4096;
  TempDir dir;
  write_text(dir / moe_file(1), table_json(10, 16));   // 431 bytes
  write_text(dir / moe_file(2), table_json(100, 16));  // 4,392 bytes
  auto rt = make_runtime({dir.str()});
  const LoadReport rep = rt->load_report();
  CHECK(file(rep, moe_file(1)).state == FileReport::State::loaded);
  CHECK(file(rep, moe_file(2)).state == FileReport::State::skipped);
  CHECK(first_problem(rep, moe_file(2)) ==
        "file is 4392 bytes, over the limit of 4096 bytes for one config file (docs/config-files.md#limits): not read");
  CHECK(rep.rows == 10);
}

TEST_CASE("limits: rows per file, problems per file and metadata keys per file") {
  LimitsGuard g;
  store::limits().max_rows_per_file = 10;
  store::limits().max_problems_per_file = 5;
  store::limits().max_metadata_keys = 2;
  TempDir dir;
  write_text(dir / moe_file(1), table_json(10, 16));  // at the bound: loads
  write_text(dir / moe_file(2), table_json(11, 16));  // one past it
  // One good row, eight null rows: five problems listed, three counted.
  std::string nulls = R"({"1": {"BLOCK_SIZE_M": 16})";
  for (int m = 2; m <= 9; ++m) nulls += ", \"" + std::to_string(m) + "\": null";
  write_text(dir / moe_file(3), nulls + "}");
  write_text(dir / moe_file(4), R"({"a": "1", "b": 2, "c": true, "1": {"BLOCK_SIZE_M": 16}})");
  auto rt = make_runtime({dir.str()});
  const LoadReport rep = rt->load_report();
  CHECK(file(rep, moe_file(1)).state == FileReport::State::loaded);
  CHECK(file(rep, moe_file(1)).rows == 10);
  CHECK(file(rep, moe_file(2)).state == FileReport::State::skipped);
  CHECK(first_problem(rep, moe_file(2)) ==
        "more than 10 batch-size keys, the limit for one file (docs/config-files.md#limits): file not loaded");
  const FileReport& f3 = file(rep, moe_file(3));
  CHECK(f3.state == FileReport::State::partial);
  REQUIRE(f3.problems.size() == 6);
  CHECK(f3.problems[0] == "M=2: null row dropped");
  CHECK(f3.problems[4] == "M=6: null row dropped");
  CHECK(f3.problems[5] == "... and 3 more problems (only the first 5 are listed)");
  const FileReport& f4 = file(rep, moe_file(4));
  REQUIRE(f4.metadata.size() == 2);
  CHECK(f4.metadata[1].first == "b");
  REQUIRE(f4.problems.size() == 1);
  CHECK(f4.problems[0] == "key 'c' is not a batch size; ignored (more than 2 metadata keys)");
}

TEST_CASE("limits: files per config dir and entries per config dir") {
  LimitsGuard g;
  TempDir dir;
  for (int n = 1; n <= 5; ++n) write_text(dir / moe_file(n), table_json(2, 16));
  for (int i = 0; i < 6; ++i) write_text(dir / ("notes" + std::to_string(i) + ".txt"), "x");
  SUBCASE("files") {
    store::limits().max_files_per_dir = 3;
    auto rt = make_runtime({dir.str()});
    const LoadReport rep = rt->load_report();
    CHECK(rep.rows == 6);  // the first three files in path order
    CHECK(file(rep, moe_file(3)).state == FileReport::State::loaded);
    for (int n : {4, 5})  // one entry per file past the limit, not read
      CHECK(first_problem(rep, moe_file(n)) ==
            "not loaded: the config dir holds 5 *.json files, over the limit of 3 (docs/config-files.md#limits); "
            "the first 3 in path order are loaded");
  }
  SUBCASE("files, on reload: the files past the limit keep their previous rows") {
    auto rt = make_runtime({dir.str()});
    CHECK(rt->load_report().rows == 10);
    store::limits().max_files_per_dir = 3;
    REQUIRE(rt->reload().ok());
    const LoadReport rep = rt->load_report();
    CHECK(rep.rows == 10);
    CHECK(file(rep, moe_file(5)).problems.back() ==
          "its previous rows (2) keep serving until the file is fixed or removed");
  }
  SUBCASE("entries, on reload: the files the walk did not reach keep their previous rows") {
    auto rt = make_runtime({dir.str()});
    store::limits().max_entries_per_dir = 3;
    REQUIRE(rt->reload().ok());
    const LoadReport rep = rt->load_report();
    CHECK(rep.rows == 10);
    bool noted = false;
    for (const auto& n : rep.notes)
      noted = noted || n.find("not reached by a walk stopped at the entry limit") != std::string::npos;
    CHECK(noted);
  }
  SUBCASE("entries") {
    store::limits().max_entries_per_dir = 10;  // 11 entries: the walk stops at the 11th
    auto rt = make_runtime({dir.str()});
    const LoadReport rep = rt->load_report();
    int stopped = 0;
    for (const auto& f : rep.files)
      if (!f.problems.empty() && f.problems[0].find("more than 10 entries under this config dir") == 0) ++stopped;
    CHECK(stopped == 1);
    CHECK_FALSE(rep.all_usable());
  }
}

TEST_CASE("reload: only changed files are read, unchanged keys are copied, the table equals a full load's") {
  LimitsGuard g;
  store::limits().racy_ns = 0;  // the files this test writes count as settled at once
  TempDir dir;
  std::vector<int> ns;
  for (int n = 1; n <= 20; ++n) {
    write_text(dir / moe_file(n), table_json(4, 16 * (n % 4 + 1)));
    ns.push_back(n);
  }
  // A version folder older than the running version: a build note.
  kdtest::fs::create_directories(dir / "triton_3_4_0");
  write_text(dir / "triton_3_4_0" / moe_file(21), table_json(2, 64));
  ns.push_back(21);
  RuntimeOptions o = options_for({dir.str()});
  o.backend_version = "3.5.1";
  auto rt = make_runtime(o);
  auto fresh_table = [&] { return table_text(*make_runtime(o), ns); };
  LoadReport rep = rt->load_report();
  CHECK(rep.files_read == 21);
  CHECK(rep.files_unchanged == 0);
  const std::vector<std::string> notes = rep.notes;
  REQUIRE(notes.size() == 1);

  REQUIRE(rt->reload().ok());  // nothing changed
  rep = rt->load_report();
  CHECK(rep.files_read == 0);
  CHECK(rep.files_unchanged == 21);
  CHECK(rep.keys_unchanged == 21);
  CHECK(rep.notes == notes);  // a copied key says its note again
  CHECK(table_text(*rt, ns) == fresh_table());

  write_text(dir / moe_file(5), table_json(6, 128));  // one file changes
  REQUIRE(rt->reload().ok());
  rep = rt->load_report();
  CHECK(rep.files_read == 1);
  CHECK(rep.files_unchanged == 20);
  CHECK(rep.keys_unchanged == 20);
  CHECK(rep.rows == 20 * 4 + 2 + 2);
  CHECK(table_text(*rt, ns) == fresh_table());
  CHECK(config_to_json(
            lookup(*rt, LookupQuery{.op = "triton_fused_moe", .key = "E=8,N=5", .device = "NVIDIA_H200", .M = 6})
                ->config) ==
        R"({"BLOCK_SIZE_M": 128, "num_warps": 4, "num_stages": 3})");  // num_stages: the documented default

  // The same size, the mtime put back: the ctime still tells.
  const auto f7 = dir / moe_file(7);
  struct stat before {};
  REQUIRE(::stat(f7.c_str(), &before) == 0);
  write_text(f7, table_json(4, 32));  // was BLOCK_SIZE_M 64: the same size
  const struct timespec times[2] = {before.st_atim, before.st_mtim};
  REQUIRE(::utimensat(AT_FDCWD, f7.c_str(), times, 0) == 0);
  REQUIRE(rt->reload().ok());
  CHECK(rt->load_report().files_read == 1);
  CHECK(table_text(*rt, ns) == fresh_table());

  // Replaced by a rename (a new inode), removed, added.
  write_text(dir / ".tmp", table_json(3, 256));
  kdtest::fs::rename(dir / ".tmp", dir / moe_file(9));
  kdtest::fs::remove(dir / moe_file(10));
  write_text(dir / moe_file(22), table_json(2, 16));
  ns.push_back(22);
  REQUIRE(rt->reload().ok());
  rep = rt->load_report();
  CHECK(rep.files_read == 2);
  CHECK(rep.files_unchanged == 19);
  const std::string t = table_text(*rt, ns);
  CHECK(t == fresh_table());
  CHECK(t.find("N=10 none\n") != std::string::npos);
  CHECK(t.find("1 {\"BLOCK_SIZE_M\": 256, \"num_warps\": 4} " + moe_file(9)) != std::string::npos);

  // A file changed within the racy window of the load that read it is not
  // cached: the next reload reads it again.
  store::limits().racy_ns = int64_t{3600} * 1'000'000'000;
  write_text(dir / moe_file(1), table_json(4, 32));
  REQUIRE(rt->reload().ok());
  CHECK(rt->load_report().files_read == 1);
  REQUIRE(rt->reload().ok());
  CHECK(rt->load_report().files_read == 1);
  store::limits().racy_ns = 0;
  REQUIRE(rt->reload().ok());
  CHECK(rt->load_report().files_read == 1);  // cached now
  REQUIRE(rt->reload().ok());
  CHECK(rt->load_report().files_read == 0);
  CHECK(table_text(*rt, ns) == fresh_table());
}

TEST_CASE(
    "limits: a row with more fields than the limit is dropped with the reason (the repeated-key scan stays bounded)") {
  TempDir dir;
  std::string wide = R"({"1": {"BLOCK_SIZE_M": 16}, "2": {)";
  for (int i = 0; i < 80000; ++i) wide += (i ? ", \"k" : "\"k") + std::to_string(i) + "\": 1";
  write_text(dir / moe_file(1), wide + "}}");
  auto rt = make_runtime({dir.str()});
  const LoadReport rep = rt->load_report();
  const FileReport& f = file(rep, moe_file(1));
  CHECK(f.state == FileReport::State::partial);
  CHECK(f.rows == 1);
  REQUIRE(f.problems.size() == 1);
  CHECK(f.problems[0] == "M=2: row has more than 64 fields (docs/config-files.md#limits); row dropped");
}

TEST_CASE("reload: a file that could not be read is read again by the next reload (not cached)") {
  LimitsGuard g;
  store::limits().racy_ns = 0;
  TempDir dir;
  write_text(dir / moe_file(1), table_json(4, 16));
  auto rt = make_runtime({dir.str()});
  CHECK(rt->load_report().rows == 4);
  // A read that fails (here: the size check in the read path; in the field:
  // EMFILE, EIO) is not cached under the file's unchanged stat.
  store::limits().max_file_bytes = 10;
  write_text(dir / moe_file(1), table_json(4, 16));  // rewritten: read again, and the read fails
  REQUIRE(rt->reload().ok());
  CHECK(file(rt->load_report(), moe_file(1)).state == FileReport::State::skipped);
  CHECK(rt->load_report().rows == 4);  // its previous rows keep serving
  store::limits().max_file_bytes = int64_t{256} << 20;
  REQUIRE(rt->reload().ok());
  const LoadReport rep = rt->load_report();
  CHECK(rep.files_read == 1);  // read again, not the cached failure
  CHECK(file(rep, moe_file(1)).state == FileReport::State::loaded);
}

TEST_CASE(
    "reload: a symbolic link retargeted to another name of the same file is seen (the link is in the signature)") {
  LimitsGuard g;
  store::limits().racy_ns = 0;
  TempDir dir, targets;
  write_text(targets / "t0.json", table_json(2, 16));
  kdtest::fs::create_hard_link(targets / "t0.json", targets / "t1.json");
  kdtest::fs::create_symlink(targets / "t0.json", dir / moe_file(1));
  auto rt = make_runtime({dir.str()});
  const std::string before = table_text(*rt, {1});
  CHECK(before.find("t0.json") != std::string::npos);
  kdtest::fs::remove(dir / moe_file(1));
  kdtest::fs::create_symlink(targets / "t1.json", dir / moe_file(1));
  REQUIRE(rt->reload().ok());
  CHECK(rt->load_report().files_read == 1);
  CHECK(table_text(*rt, {1}) == table_text(*make_runtime({dir.str()}), {1}));
  CHECK(table_text(*rt, {1}).find("t1.json") != std::string::npos);
}

TEST_CASE("reload: a config dir listed twice is read once (no note of a key held twice when a file breaks)") {
  TempDir dir;
  write_text(dir / moe_file(1), table_json(2, 16));
  auto rt = make_runtime({dir.str(), dir.str()});
  CHECK(rt->load_report().files.size() == 1);
  write_text(dir / moe_file(1), "{");
  REQUIRE(rt->reload().ok());
  const LoadReport rep = rt->load_report();
  CHECK(rep.rows == 2);
  CHECK(rep.notes.empty());
}
