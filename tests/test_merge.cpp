// SPDX-License-Identifier: Apache-2.0
// `kdispatch merge` and `merge --compact` (issue 31): a compaction killed
// between its claim of a fragment and the put-back loses no row (the next
// writer or compaction recovers the claim), merge's temp files of dead
// processes are swept, --compact honours KDISPATCH_CACHE_LOCKING and parses
// no table without fragments, every source is read through the bounded
// reader, rows are checked as `kdispatch validate` checks them (a row of a
// backend this build lacks copied, "not checked here"), one bad row drops
// that row only, and --out never writes through a symbolic link.
//
// Writers are this test process (store::persist_rows on the fragment
// scheme: its fragment is <key>.json.d/<host>-<pid of this process>.json);
// compactions and merges are the CLI (KDISPATCH_CLI_PATH).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backends/registry.hpp"
#include "cli_util.hpp"
#include "dispatch/dispatch.hpp"
#include "locking_util.hpp"
#include "store/fingerprint.hpp"
#include "store/json_file.hpp"
#include "store/writer.hpp"
#include "test_util.hpp"

#ifdef KDISPATCH_CLI_PATH

using namespace dispatch;
using kdtest::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kRel = "cpu/gemm/N=8,K=8,device_name=CPU_test,dtype=fp32.json";
const std::vector<std::pair<std::string, int32_t>> kSchema = {{"gemm_fp32__ref", 1}};

store::PersistRow ref_row(int64_t m, double us = 0) {
  store::PersistRow r;
  r.m = m;
  r.config = {{"variant", ConfigValue::string("gemm_fp32__ref")}};
  r.us = us;
  return r;
}

std::vector<store::PersistRow> ref_rows(std::initializer_list<int64_t> ms) {
  std::vector<store::PersistRow> out;
  for (int64_t m : ms) out.push_back(ref_row(m));
  return out;
}

std::string table_text(const std::vector<store::PersistRow>& rows) {
  return store::render_table(rows, store::cpu_fingerprint(), kSchema);
}

std::vector<int64_t> rows_of(const fs::path& p) {
  std::string text = kdtest::read_text(p);
  const size_t n = text.size();
  text.append(store::json_padding(), '\0');
  const store::ParsedFile pf = store::parse_config_json(text.data(), n);
  REQUIRE_MESSAGE(pf.kind == store::ParsedFile::Kind::table, p.string(), " does not parse as a table");
  std::vector<int64_t> ms;
  for (const auto& r : pf.rows) ms.push_back(r.m);
  std::sort(ms.begin(), ms.end());
  return ms;
}

std::vector<std::string> names_in(const fs::path& dir, bool hidden) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if ((e.path().filename().string()[0] == '.') == hidden) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string host() {
  std::string h = store::host_name();
  std::replace(h.begin(), h.end(), '/', '_');
  return h.empty() ? "unknown-host" : h;
}

// A pid of this host that no longer exists.
pid_t dead_pid() {
  const pid_t kid = ::fork();
  REQUIRE(kid >= 0);
  if (kid == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(kid, &status, 0) == kid);
  return kid;
}

using kdtest::EnvScope;

kdtest::CliResult merge(const std::vector<std::string>& args, const TempDir& dir) {
  std::vector<std::string> a = {"merge"};
  a.insert(a.end(), args.begin(), args.end());
  return kdtest::run_cli(a, (dir / "cli-cache").string());
}

bool killed(const kdtest::CliResult& r) { return r.exit_code == -1 || r.exit_code == 128 + SIGKILL; }

// Dates `p`'s mtime (and atime) `seconds` ago (utimes).
void age_file(const fs::path& p, long seconds) {
  const struct timeval when[2] = {{std::time(nullptr) - seconds, 0}, {std::time(nullptr) - seconds, 0}};
  REQUIRE(::utimes(p.c_str(), when) == 0);
}

// A table text with hand-written keys: the metadata, then each (key, row).
std::string keyed_table(const std::vector<std::pair<std::string, std::string>>& rows) {
  std::string text =
      "{\n    \"kdispatch\": {\"tool\": \"kdispatch 0.1.0\", \"schema\": {\"gemm_fp32__ref\": 1, "
      "\"gemm_fp32__blocked\": 1}, \"fingerprint\": " +
      store::cpu_fingerprint().to_json() + "}";
  for (const auto& [k, row] : rows) text += ",\n    \"" + k + "\": " + row;
  return text + "\n}\n";
}

const std::string kRefRow = "{\"variant\": \"gemm_fp32__ref\"}";

}  // namespace

// Issue 31, item 1 (reproduced against 55f2afd): a compaction killed between
// renaming a fragment its writer had rewritten to the hidden claim and
// putting it back left the writer's newer row only in the claim; the
// loader, later compactions and the writer never read it: M = [1, 3] served.
TEST_CASE(
    "merge --compact: a compaction killed between its claim and the put-back loses no row, the next compaction "
    "recovers the claim") {
  kdtest::WriterScheme scheme(true);  // this process writes its own fragment
  EnvScope env({{"KDISPATCH_CACHE_LOCKING", nullptr}});
  TempDir dir;
  const fs::path cache = dir / "cache";
  const fs::path frag_dir = cache / (kRel + ".d");
  const std::string mine = host() + "-" + std::to_string(::getpid()) + ".json";
  REQUIRE(store::persist_rows(cache.string(), kRel, {ref_row(1)}, store::cpu_fingerprint(), kSchema).ok());
  REQUIRE(names_in(frag_dir, false) == std::vector<std::string>{mine});
  // The writer rewrites its fragment (M = 1, 2) after the compaction read
  // it (KDISPATCH_TEST_COMPACT_REPLACE); the compaction is killed with the
  // claim made and not put back (KDISPATCH_TEST_COMPACT_KILL=putback).
  kdtest::write_text(dir / "rewritten.json", table_text(ref_rows({1, 2})));
  {
    EnvScope hooks({{"KDISPATCH_TEST_COMPACT_REPLACE", (dir / "rewritten.json").c_str()},
                    {"KDISPATCH_TEST_COMPACT_KILL", "putback"}});
    kdtest::CliResult k = merge({"--compact", cache.string()}, dir);
    CHECK_MESSAGE(killed(k), "exit ", k.exit_code, "\n", k.err);
  }
  CHECK(rows_of(cache / kRel) == std::vector<int64_t>{1});  // the main file was written before the claim
  const std::vector<std::string> hidden = names_in(frag_dir, true);
  REQUIRE(hidden.size() == 1);
  const std::string claim_prefix = "." + mine + ".compacting-" + host() + "-";
  REQUIRE(hidden[0].rfind(claim_prefix, 0) == 0);
  const std::string killed_pid = hidden[0].substr(claim_prefix.size());
  CHECK(killed_pid.find_first_not_of("0123456789") == std::string::npos);
  CHECK(rows_of(frag_dir / hidden[0]) == std::vector<int64_t>{1, 2});
  CHECK(names_in(frag_dir, false).empty());
  CHECK(fs::exists(cache / ".kdispatch-compact.lock"));  // the killed compaction's: taken over (dead, this host)

  // The next compaction recovers the claim before reading: its fragment's
  // writer (this process) is alive, so it goes aside under a name the
  // loader reads (a put-back under the writer's own name could be replaced
  // by the writer's next rename), and is merged.
  kdtest::CliResult c = merge({"--compact", cache.string()}, dir);
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  const std::string aside =
      host() + "-" + std::to_string(::getpid()) + ".unmerged-" + host() + "-" + killed_pid + ".json";
  CHECK(c.err.find(kRel + ".d: recovered " + hidden[0] + ", the claim of a compaction that died (pid " + killed_pid +
                   " of this host), as " + aside) != std::string::npos);
  CHECK(c.out.find("1 table(s) compacted in " + cache.string() +
                   " (2 rows, 0 conflicts resolved, 1 fragment(s) merged and removed, 0 kept), 0 refused, 0 file(s) "
                   "skipped") != std::string::npos);
  CHECK(rows_of(cache / kRel) == std::vector<int64_t>{1, 2});
  CHECK(names_in(frag_dir, true).empty());
  CHECK(names_in(frag_dir, false).empty());
  // The writer's next write, then what the loader serves.
  REQUIRE(store::persist_rows(cache.string(), kRel, {ref_row(3)}, store::cpu_fingerprint(), kSchema).ok());
  CHECK(rows_of(frag_dir / mine) == std::vector<int64_t>{3});
  CHECK(kdtest::served_ms(cache.string()) == std::vector<int64_t>{1, 2, 3});
}

TEST_CASE(
    "persist_rows (fragments): the next write recovers a dead compaction's claims: its own merged in, others put back "
    "or aside") {
  kdtest::WriterScheme scheme(true);
  TempDir dir;
  const std::string cache = dir.str();
  const fs::path frag_dir = dir / (kRel + ".d");
  const std::string mine = host() + "-" + std::to_string(::getpid()) + ".json";
  const pid_t compactor = dead_pid();  // the killed compaction
  const pid_t writer = dead_pid();     // a writer of this host that exited
  const std::string owner = host() + "-" + std::to_string(compactor);
  // A killed compaction's claims: of this process's fragment (M = 1, 2), of
  // a dead writer's (M = 5; its name is free), of a live writer's (our
  // parent's: M = 6, its name free), and of a fragment whose name is taken
  // again (M = 7). Left alone: another host's claim (M = 8), and an older
  // build's claim without a host (M = 9).
  const std::string dead_frag = host() + "-" + std::to_string(writer) + ".json";
  const std::string live_frag = host() + "-" + std::to_string(::getppid()) + ".json";
  const std::string taken = "elsewhere-42.json";
  kdtest::write_text(frag_dir / ("." + mine + ".compacting-" + owner), table_text(ref_rows({1, 2})));
  kdtest::write_text(frag_dir / ("." + dead_frag + ".compacting-" + owner), table_text(ref_rows({5})));
  kdtest::write_text(frag_dir / ("." + live_frag + ".compacting-" + owner), table_text(ref_rows({6})));
  kdtest::write_text(frag_dir / ("." + taken + ".compacting-" + owner), table_text(ref_rows({7})));
  kdtest::write_text(frag_dir / taken, table_text(ref_rows({10})));
  const std::string remote = "." + taken + ".compacting-otherhost-" + std::to_string(compactor);
  const std::string legacy = "." + taken + ".compacting-" + std::to_string(compactor);
  kdtest::write_text(frag_dir / remote, table_text(ref_rows({8})));
  kdtest::write_text(frag_dir / legacy, table_text(ref_rows({9})));

  REQUIRE(store::persist_rows(cache, kRel, {ref_row(3)}, store::cpu_fingerprint(), kSchema).ok());
  CHECK(rows_of(frag_dir / mine) == std::vector<int64_t>{1, 2, 3});  // its claim's rows merged under its new one
  const std::string live_aside = host() + "-" + std::to_string(::getppid()) + ".unmerged-" + owner + ".json";
  const std::string taken_aside = "elsewhere-42.unmerged-" + owner + ".json";
  std::vector<std::string> want = {dead_frag, live_aside, mine, taken, taken_aside};
  std::sort(want.begin(), want.end());
  CHECK(names_in(frag_dir, false) == want);
  CHECK(rows_of(frag_dir / dead_frag) == std::vector<int64_t>{5});
  CHECK(rows_of(frag_dir / live_aside) == std::vector<int64_t>{6});
  CHECK(rows_of(frag_dir / taken) == std::vector<int64_t>{10});
  CHECK(rows_of(frag_dir / taken_aside) == std::vector<int64_t>{7});
  std::vector<std::string> left = {remote, legacy};
  std::sort(left.begin(), left.end());
  CHECK(names_in(frag_dir, true) == left);
  CHECK(kdtest::served_ms(cache) == std::vector<int64_t>{1, 2, 3, 5, 6, 7, 10});
  // A compaction reports the claims it cannot judge and leaves them.
  EnvScope env({{"KDISPATCH_CACHE_LOCKING", nullptr}});
  kdtest::CliResult c = merge({"--compact", cache}, dir);
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  for (const std::string& n : left)
    CHECK(c.err.find(kRel + ".d/" + n +
                     ": left alone: a claim of another host's compaction, or of an older build's "
                     "(no host in its name)") != std::string::npos);
  CHECK(rows_of(dir / kRel) == std::vector<int64_t>{1, 2, 3, 5, 6, 7, 10});
  CHECK(names_in(frag_dir, true) == left);
}

TEST_CASE(
    "merge --compact: KDISPATCH_CACHE_LOCKING is honoured as the writers honour it, a bad value is a usage error") {
  TempDir dir;
  const fs::path cache = dir / "cache";
  kdtest::write_text(cache / kRel, table_text(ref_rows({1})));
  kdtest::write_text(cache / (kRel + ".d/a-1.json"), table_text(ref_rows({2})));
  {
    EnvScope env({{"KDISPATCH_CACHE_LOCKING", "nfs"}});
    kdtest::CliResult r = merge({"--compact", cache.string()}, dir);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("kdispatch merge: --compact " + cache.string() +
                     ": KDISPATCH_CACHE_LOCKING='nfs' is not valid (expected auto, flock or fragments)") !=
          std::string::npos);
    CHECK(rows_of(cache / kRel) == std::vector<int64_t>{1});  // nothing touched
    CHECK(fs::exists(cache / (kRel + ".d/a-1.json")));
    CHECK_FALSE(fs::exists(cache / ".kdispatch-compact.lock"));
  }
  EnvScope env({{"KDISPATCH_CACHE_LOCKING", "fragments"}});
  kdtest::CliResult r = merge({"--compact", cache.string()}, dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out.find("writes into " + cache.string() + ": per-process fragments: KDISPATCH_CACHE_LOCKING=fragments") !=
        std::string::npos);
  CHECK(rows_of(cache / kRel) == std::vector<int64_t>{1, 2});
}

// Issue 31, item 4: --compact parsed every table, fragments or not (23.5 s
// for one 64k-row table). Only tables with fragments are read now: an
// unparsable table without fragments is not even opened.
TEST_CASE("merge --compact: a table without fragments is not read") {
  TempDir dir;
  const fs::path cache = dir / "cache";
  const std::string other = "cpu/gemm/N=16,K=8,device_name=CPU_test,dtype=fp32.json";
  kdtest::write_text(cache / other, "{ not json");
  kdtest::write_text(cache / kRel, table_text(ref_rows({1})));
  kdtest::write_text(cache / (kRel + ".d/a-1.json"), table_text(ref_rows({2})));
  kdtest::CliResult r = merge({"--compact", cache.string()}, dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.err.find(other) == std::string::npos);
  CHECK(r.out.find("1 table(s) compacted in " + cache.string() +
                   " (2 rows, 0 conflicts resolved, 1 fragment(s) "
                   "merged and removed, 0 kept), 0 refused, 0 file(s) skipped") != std::string::npos);
  CHECK(kdtest::read_text(cache / other) == "{ not json");
}

TEST_CASE("merge: temp files of dead merges of this host are removed from the dirs it writes, others kept") {
  TempDir dir;
  kdtest::write_text(dir / "src" / kRel, table_text(ref_rows({1})));
  const fs::path out_dir = (dir / "out" / kRel).parent_path();
  fs::create_directories(out_dir);
  const std::string name = fs::path(kRel).filename().string();
  const std::string d = std::to_string(dead_pid());
  const std::string dead = "." + name + ".merge." + host() + "." + d + ".0123456789abcdef";
  const std::string live = "." + name + ".merge." + host() + "." + std::to_string(::getpid()) + ".0123456789abcdef";
  const std::string remote = "." + name + ".merge.otherhost." + d + ".0123456789abcdef";
  for (const std::string& n : {dead, live, remote}) kdtest::write_text(out_dir / n, "{");
  kdtest::CliResult r = merge({"--out", (dir / "out").string(), (dir / "src").string()}, dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  std::vector<std::string> kept = {live, remote};
  std::sort(kept.begin(), kept.end());
  CHECK(names_in(out_dir, true) == kept);
  CHECK(rows_of(dir / "out" / kRel) == std::vector<int64_t>{1});
}

// Issue 31, item 5: merge read a 3 GB source whole (3.15 GB RSS).
TEST_CASE(
    "merge: a source file over the input limit is refused naming the limit, a FIFO is reported without blocking") {
  TempDir dir;
  const fs::path src = dir / "src";
  kdtest::write_text(src / kRel, table_text(ref_rows({1})));
  const fs::path big = src / "cpu/gemm/N=16,K=8,device_name=CPU_test,dtype=fp32.json";
  const fs::path fifo = src / "cpu/gemm/N=32,K=8,device_name=CPU_test,dtype=fp32.json";
  kdtest::write_text(big, "");
  REQUIRE(::truncate(big.c_str(), (int64_t{256} << 20) + 1) == 0);  // sparse: nothing is written
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  kdtest::CliResult r = merge({"--out", (dir / "out").string(), src.string()}, dir);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("kdispatch merge: skipped '" + big.string() +
                   "' is 268435457 bytes, over the limit for one input "
                   "file (docs/config-files.md#limits) of 268435456 bytes: not read") != std::string::npos);
  CHECK(r.err.find("kdispatch merge: skipped '" + fifo.string() + "' is a FIFO: only a regular file is read") !=
        std::string::npos);
  CHECK(r.out.find("1 table(s) written to " + (dir / "out").string() +
                   " (1 rows, 0 conflicts resolved), 0 refused, 2 "
                   "file(s) skipped") != std::string::npos);
  CHECK(rows_of(dir / "out" / kRel) == std::vector<int64_t>{1});
}

// Issue 31, item 7: merge copied rows `validate` then drops, with exit 0.
TEST_CASE(
    "merge: rows are checked as validate checks them, a bad row dropped and listed, a backend this build lacks copied "
    "unchecked") {
  TempDir dir;
  const fs::path src = dir / "src";
  const std::string rows =
      "{\n    \"kdispatch\": {\"tool\": \"kdispatch 0.1.0\", \"schema\": {\"gemm_fp32__ref\": 1}, \"fingerprint\": " +
      store::cpu_fingerprint().to_json() +
      "},\n    \"1\": {\"variant\": \"gemm_fp32__ref\"},\n    \"2\": {\"variant\": \"gemm_fp32__nope\"},\n"
      "    \"3\": {\"variant\": \"gemm_fp32__blocked\", \"BLOCK_SIZE_M\": 7},\n"
      "    \"4\": {\"variant\": \"gemm_bf16__blocked\"}\n}\n";
  kdtest::write_text(src / kRel, rows);
  kdtest::CliResult v = kdtest::run_cli({"validate", src.string()}, (dir / "cli-cache").string());
  const std::vector<std::string> why = {
      "M=2: unknown variant 'gemm_fp32__nope'; row dropped",
      "M=3: 'BLOCK_SIZE_M'=7 is not a point of gemm_fp32__blocked's space; row dropped",
      "M=4: variant gemm_bf16__blocked computes bf16, the key is fp32; row dropped"};
  for (const std::string& w : why) CHECK_MESSAGE(v.out.find("- " + w) != std::string::npos, v.out);
  kdtest::CliResult r = merge({"--out", (dir / "out").string(), src.string()}, dir);
  CHECK(r.exit_code == 1);
  for (const std::string& w : why)
    CHECK_MESSAGE(r.err.find("kdispatch merge: " + (src / kRel).string() + ": " + w +
                             " (as kdispatch validate drops it)") != std::string::npos,
                  r.err);
  CHECK(rows_of(dir / "out" / kRel) == std::vector<int64_t>{1});
  CHECK(r.out.find("1 table(s) written to " + (dir / "out").string() +
                   " (1 rows, 0 conflicts resolved), 0 refused, 0 "
                   "file(s) skipped, 3 row(s) dropped, 0 row(s) not checked here") != std::string::npos);

  // A table of a backend this build lacks (a shard tuned on a GPU host,
  // merged on a CPU-only login node): copied, counted as not checked.
  std::optional<DeviceType> lacking;
  for (DeviceType t : {DeviceType::cuda, DeviceType::hip})
    if (!core::backend_compiled(t) && !lacking) lacking = t;
  if (!lacking) {
    MESSAGE("every backend is compiled into this build: the not-checked case is not exercised");
    return;
  }
  const std::string b(device_type_name(*lacking));
  const std::string gpu_rel = b + "/gemm/N=8,K=8,device_name=NVIDIA_H200,dtype=bf16.json";
  kdtest::write_text(
      dir / "gpu" / gpu_rel,
      "{\n    \"kdispatch\": {\"tool\": \"kdispatch 0.1.0\", \"schema\": {}, \"fingerprint\": {\"kernels\": "
      "\"x\"}},\n    \"1\": {\"variant\": \"gemm_bf16__anything\"},\n    \"2\": {\"variant\": "
      "\"gemm_bf16__anything\", \"BLOCK\": 3}\n}\n");
  kdtest::CliResult g = merge({"--out", (dir / "out-gpu").string(), (dir / "gpu").string()}, dir);
  REQUIRE_MESSAGE(g.exit_code == 0, g.err);
  CHECK(rows_of(dir / "out-gpu" / gpu_rel) == std::vector<int64_t>{1, 2});
  CHECK(g.out.find("0 row(s) dropped, 2 row(s) not checked here") != std::string::npos);
  CHECK(g.err.find("kdispatch merge: " + gpu_rel + ": 2 row(s) copied unchecked: backend '" + b +
                   "' is not compiled into this build (run kdispatch validate where it is)") != std::string::npos);
}

// Issue 31, item 7: one null row, M = 0 or M = 2^63 dropped the whole source.
TEST_CASE("merge: a null row, M = 0 or M = 2^63 drops that row, listed, and the source's other rows merge") {
  TempDir dir;
  const fs::path src = dir / "src";
  std::string text = table_text(ref_rows({1, 2}));
  text.insert(text.rfind("\n}"),
              ",\n    \"4\": null,\n    \"0\": {\"variant\": \"gemm_fp32__ref\"},\n"
              "    \"9223372036854775808\": {\"variant\": \"gemm_fp32__ref\"}");
  kdtest::write_text(src / kRel, text);
  kdtest::CliResult r = merge({"--out", (dir / "out").string(), src.string()}, dir);
  CHECK(r.exit_code == 1);
  const std::string f = "kdispatch merge: " + (src / kRel).string() + ": ";
  CHECK(r.err.find(f + "M=4: the row is null, not an object; row dropped") != std::string::npos);
  CHECK(r.err.find(f + "M=0: batch size must be >= 1; row dropped") != std::string::npos);
  CHECK(r.err.find(f + "key '9223372036854775808' is not a batch size (1 to 9223372036854775807); row dropped") !=
        std::string::npos);
  CHECK(rows_of(dir / "out" / kRel) == std::vector<int64_t>{1, 2});
  CHECK(r.out.find("1 table(s) written to " + (dir / "out").string() +
                   " (2 rows, 0 conflicts resolved), 0 refused, 0 "
                   "file(s) skipped, 3 row(s) dropped") != std::string::npos);
}

TEST_CASE("merge --compact: a table with a row merge drops is left as it was, nothing removed") {
  TempDir dir;
  const fs::path cache = dir / "cache";
  kdtest::write_text(cache / kRel, table_text(ref_rows({1})));
  std::string frag = table_text(ref_rows({2}));
  frag.insert(frag.rfind("\n}"), ",\n    \"3\": null");
  kdtest::write_text(cache / (kRel + ".d/a-1.json"), frag);
  kdtest::CliResult r = merge({"--compact", cache.string()}, dir);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find(kRel + ": refused: 1 row(s) dropped (listed): left as it was") != std::string::npos);
  CHECK(kdtest::read_text(cache / (kRel + ".d/a-1.json")) == frag);
  CHECK(rows_of(cache / kRel) == std::vector<int64_t>{1});
}

TEST_CASE(
    "check_table_rows: the loader's reasons, a backend this build lacks unchecked, a path that is no own-op table "
    "refused") {
  const Config ref = {{"variant", ConfigValue::string("gemm_fp32__ref")}};
  const Config nope = {{"variant", ConfigValue::string("gemm_fp32__nope")}};
  const Config novariant = {{"BLOCK_SIZE_M", ConfigValue::integer(8)}};
  const std::vector<TableRow> rows = {{1, &ref}, {2, &nope}, {3, &ref}, {4, &novariant}};
  auto r = check_table_rows(kRel, {}, rows);
  REQUIRE(r.ok());
  CHECK(r->checked);
  CHECK(r->dropped == std::vector<std::pair<size_t, std::string>>{{1, "unknown variant 'gemm_fp32__nope'"},
                                                                  {3, "row has no \"variant\" string"}});
  const std::vector<std::pair<std::string, int64_t>> old_schema = {{"gemm_fp32__ref", 7}};
  r = check_table_rows("some/dir/" + kRel, old_schema, rows);
  REQUIRE(r.ok());
  REQUIRE(r->dropped.size() == 4);  // both ref rows, and the two bad ones
  CHECK(r->dropped[0] == std::pair<size_t, std::string>{0,
                                                        "variant gemm_fp32__ref has config schema 1 but the file "
                                                        "was written for another"});
  for (DeviceType t : {DeviceType::cuda, DeviceType::hip}) {
    if (core::backend_compiled(t)) continue;
    r = check_table_rows(std::string(device_type_name(t)) + "/gemm/N=8,K=8,device_name=NVIDIA_H200,dtype=bf16.json", {},
                         rows);
    REQUIRE(r.ok());
    CHECK_FALSE(r->checked);
    CHECK(r->dropped == std::vector<std::pair<size_t, std::string>>{{3, "row has no \"variant\""}});
  }
  auto bad = check_table_rows("cpu/gemm/N=8,K=8,dtype=fp32.json", {}, rows);
  CHECK(bad.status().code() == StatusCode::invalid_argument);
  CHECK(bad.status().message() ==
        "'cpu/gemm/N=8,K=8,dtype=fp32.json' is not an own-op table: file name has no "
        "device_name field");
  bad = check_table_rows("x/gemm/N=8,K=8,device_name=CPU_test,dtype=fp32.json", {}, rows);
  CHECK(bad.status().code() == StatusCode::invalid_argument);
  bad = check_table_rows("gemm.json", {}, rows);
  CHECK(bad.status().message() ==
        "'gemm.json' is not an own-op table: the path does not end <backend>/<op>/<key "
        "fields>.json");
}

// Issue 31, item 7: merge followed an --out/cpu symbolic link.
TEST_CASE("merge --out: a backend folder that is a symbolic link is not written through") {
  TempDir dir;
  kdtest::write_text(dir / "src" / kRel, table_text(ref_rows({1})));
  fs::create_directories(dir / "out");
  fs::create_directories(dir / "elsewhere");
  fs::create_directory_symlink(dir / "elsewhere", dir / "out/cpu");
  kdtest::CliResult r = merge({"--out", (dir / "out").string(), (dir / "src").string()}, dir);
  CHECK(r.exit_code == 1);
  CHECK(r.err.find("kdispatch merge: " + kRel + ": '" + (dir / "out/cpu").string() +
                   "' is a symbolic link: merge does not write through it") != std::string::npos);
  CHECK(fs::is_empty(dir / "elsewhere"));
  CHECK(r.out.find("0 table(s) written to " + (dir / "out").string() + " (0 rows, 0 conflicts resolved), 1 refused") !=
        std::string::npos);
}

// The timing maps are indexed once per file (issue 31, item 4): each row
// still gets its own numbers, whatever the order of the maps' keys.
TEST_CASE("merge: every row keeps its us and default_us, the maps in any key order") {
  TempDir dir;
  const std::string fp = store::cpu_fingerprint().to_json();
  kdtest::write_text(
      dir / "a" / kRel,
      "{\n    \"kdispatch\": {\"tool\": \"kdispatch 0.1.0\", \"schema\": {\"gemm_fp32__ref\": 1}, "
      "\"fingerprint\": " +
          fp +
          ", \"us\": {\"16\": 3.5, \"1\": 1.25, \"99\": 7}, \"default_us\": "
          "{\"4\": 8, \"1\": 2.5}},\n    \"1\": {\"variant\": \"gemm_fp32__ref\"},\n    \"4\": {\"variant\": "
          "\"gemm_fp32__ref\"},\n    \"16\": {\"variant\": \"gemm_fp32__ref\"}\n}\n");
  kdtest::CliResult r = merge({"--out", (dir / "out").string(), (dir / "a").string()}, dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const std::string out = kdtest::read_text(dir / "out" / kRel);
  CHECK(out.find("\"us\": {\"1\": 1.25, \"16\": 3.5}, \"default_us\": {\"1\": 2.5, \"4\": 8}") != std::string::npos);
}

// Reliability attack 3, item 1: a compaction killed between its create
// (O_EXCL) and its write left an empty lock, and every later compaction
// refused ("another compaction holds ... (empty)") forever; so did a lock
// "123" without a host. The lock's body is now written before its name
// exists (link() of a temp file), and one without a pid and host is taken
// over once kCompactLockStaleSeconds (10 s) old.
TEST_CASE("merge --compact: an empty lock, or one without a host, older than 10 s is taken over, a young one refuses") {
  EnvScope env({{"KDISPATCH_CACHE_LOCKING", nullptr}});
  TempDir dir;
  const fs::path cache = dir / "cache";
  const fs::path lock = cache / ".kdispatch-compact.lock";
  kdtest::write_text(cache / kRel, table_text(ref_rows({1})));
  kdtest::write_text(cache / (kRel + ".d/a-1.json"), table_text(ref_rows({2})));
  // A temp file of the lock left by a dead compaction of this host (killed
  // between its create and its unlink): removed by the next one.
  kdtest::write_text(
      cache / (".kdispatch-compact.lock.tmp." + host() + "." + std::to_string(dead_pid()) + ".0123456789abcdef"),
      "1 x\n");
  kdtest::write_text(lock, "");
  kdtest::CliResult young = merge({"--compact", cache.string()}, dir);
  CHECK(young.exit_code == 1);
  CHECK_MESSAGE(
      young.err.find("kdispatch merge: --compact " + cache.string() + ": another compaction may be creating " +
                     lock.string() + " (empty, ") != std::string::npos,
      young.err);
  CHECK(young.err.find("run the compaction again; a lock without a pid and host is taken over once 10 s old") !=
        std::string::npos);
  CHECK(fs::exists(cache / (kRel + ".d/a-1.json")));  // nothing touched
  CHECK(rows_of(cache / kRel) == std::vector<int64_t>{1});

  age_file(lock, 60);
  kdtest::CliResult c = merge({"--compact", cache.string()}, dir);
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  CHECK_MESSAGE(
      c.err.find("kdispatch merge: --compact " + cache.string() + ": took over " + lock.string() +
                 ": empty, without the pid and host a compaction writes before the lock's name exists, and ") !=
          std::string::npos,
      c.err);
  CHECK(rows_of(cache / kRel) == std::vector<int64_t>{1, 2});
  CHECK(kdtest::served_ms(cache.string()) == std::vector<int64_t>{1, 2});
  CHECK_FALSE(fs::exists(lock));         // released
  CHECK(names_in(cache, true).empty());  // no temp file of the lock left, the dead one's removed

  // A body without a host ("123"): the same.
  kdtest::write_text(cache / (kRel + ".d/a-1.json"), table_text(ref_rows({3})));
  kdtest::write_text(lock, "123");
  kdtest::CliResult y2 = merge({"--compact", cache.string()}, dir);
  CHECK(y2.exit_code == 1);
  CHECK(y2.err.find("another compaction may be creating " + lock.string() + " ('123', ") != std::string::npos);
  age_file(lock, 3600);
  kdtest::CliResult c2 = merge({"--compact", cache.string()}, dir);
  REQUIRE_MESSAGE(c2.exit_code == 0, c2.err);
  CHECK(c2.err.find("took over " + lock.string() + ": '123', without the pid and host") != std::string::npos);
  CHECK(rows_of(cache / kRel) == std::vector<int64_t>{1, 2, 3});
  CHECK_FALSE(fs::exists(lock));

  // A lock with a pid and host is judged by them, whatever its age: a live
  // holder's is never taken over.
  kdtest::write_text(cache / (kRel + ".d/a-1.json"), table_text(ref_rows({4})));
  const std::string live = std::to_string(::getpid()) + " " + host() + "\n";
  kdtest::write_text(lock, live);
  age_file(lock, 3600);
  kdtest::CliResult held = merge({"--compact", cache.string()}, dir);
  CHECK(held.exit_code == 1);
  CHECK(held.err.find("another compaction holds " + lock.string() + " (" + std::to_string(::getpid()) + " " + host() +
                      "); if none runs, remove it") != std::string::npos);
  CHECK(kdtest::read_text(lock) == live);
  CHECK(fs::exists(cache / (kRel + ".d/a-1.json")));
}

// Reliability attack 3, item 2: a claim of this host whose pid is alive
// but no compaction (pid 1 = the CLI in a container, a reused pid) was
// never recovered nor reported, a claim with a 10-digit pid was not parsed
// as one: their rows were hidden forever. A claim of this host older than
// kClaimStaleSeconds (60 s) is recovered whatever its pid says; a young
// live one, one that is not a regular file and a name that does not parse
// are left and reported; a symbolic link is never put back.
TEST_CASE(
    "merge --compact: an old claim of a live pid is recovered, a young one reported, a 10-digit pid parsed, a symlink "
    "claim left") {
  EnvScope env({{"KDISPATCH_CACHE_LOCKING", nullptr}});
  TempDir dir;
  const fs::path cache = dir / "cache";
  const fs::path frag_dir = cache / (kRel + ".d");
  kdtest::write_text(cache / kRel, table_text(ref_rows({1})));
  const std::string me = std::to_string(::getpid());
  const std::string old_own = ".a-1.json.compacting-" + host() + "-" + me;    // this (live) pid, an hour old
  const std::string old_one = ".b-2.json.compacting-" + host() + "-1";        // pid 1, an hour old
  const std::string young = ".c-3.json.compacting-" + host() + "-" + me;      // live, just made
  const std::string wide = ".d-4.json.compacting-" + host() + "-9999999999";  // no process has it
  const std::string dead = std::to_string(dead_pid());
  const std::string link = ".e-5.json.compacting-" + host() + "-" + dead;  // a symbolic link
  const std::string odd = ".f-6.json.compacting-" + host();                // no pid: does not parse
  kdtest::write_text(frag_dir / old_own, table_text(ref_rows({5})));
  kdtest::write_text(frag_dir / old_one, table_text(ref_rows({6})));
  kdtest::write_text(frag_dir / young, table_text(ref_rows({7})));
  kdtest::write_text(frag_dir / wide, table_text(ref_rows({8})));
  kdtest::write_text(dir / "elsewhere.json", table_text(ref_rows({9})));
  fs::create_symlink(dir / "elsewhere.json", frag_dir / link);
  kdtest::write_text(frag_dir / odd, table_text(ref_rows({10})));
  age_file(frag_dir / old_own, 3600);
  age_file(frag_dir / old_one, 3600);

  kdtest::CliResult c = merge({"--compact", cache.string()}, dir);
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  const std::string d = "kdispatch merge: " + kRel + ".d";
  // "... the claim is 3600 s old: ..." (3601 when a second turned meanwhile)
  const std::string why_old =
      " s old: a compaction holds a claim for moments (its pid was reused, or is this "
      "process's in a container)), as ";
  for (const auto& [claim, pid, as] : {std::tuple{old_own, me, "a-1.unmerged-" + host() + "-" + me + ".json"},
                                       std::tuple{old_one, std::string("1"), "b-2.unmerged-" + host() + "-1.json"}}) {
    const size_t at = c.err.find(d + ": recovered " + claim +
                                 ", the claim of a compaction of this host that is gone "
                                 "(pid " +
                                 pid + " of this host runs, but the claim is 360");
    CHECK_MESSAGE(at != std::string::npos, c.err);
    CHECK(c.err.find(why_old + as + "\n", at) != std::string::npos);
  }
  CHECK(c.err.find(d + ": recovered " + wide +
                   ", the claim of a compaction that died (pid 9999999999 of this host), "
                   "as d-4.unmerged-" +
                   host() + "-9999999999.json") != std::string::npos);
  const size_t at = c.err.find(d + "/" + young + ": left alone: the claim of a compaction running on this host (pid " +
                               me + ", claimed ");
  CHECK(at != std::string::npos);
  CHECK(c.err.find(" s ago); if none runs, it is recovered once 60 s old\n", at) != std::string::npos);
  CHECK(c.err.find(d + "/" + link +
                   ": left alone: a claim that is a symbolic link, not a regular file (a compaction "
                   "claims only regular files): never put back under a name the loader reads; remove "
                   "it") != std::string::npos);
  CHECK(c.err.find(d + "/" + odd +
                   ": left alone: named like a compaction's claim, but not "
                   ".<fragment>.json.compacting-<host>-<pid>; if no compaction runs, rename it to a "
                   "*.json name in its dir") != std::string::npos);
  CHECK(c.out.find("1 table(s) compacted in " + cache.string() +
                   " (4 rows, 0 conflicts resolved, 3 fragment(s) merged "
                   "and removed, 0 kept), 0 refused, 0 file(s) skipped") != std::string::npos);
  CHECK(rows_of(cache / kRel) == std::vector<int64_t>{1, 5, 6, 8});
  CHECK(kdtest::served_ms(cache.string()) == std::vector<int64_t>{1, 5, 6, 8});
  CHECK(names_in(frag_dir, false).empty());
  std::vector<std::string> left = {young, link, odd};
  std::sort(left.begin(), left.end());
  CHECK(names_in(frag_dir, true) == left);
  CHECK(fs::is_symlink(frag_dir / link));
  CHECK(rows_of(dir / "elsewhere.json") == std::vector<int64_t>{9});

  // Once the young claim is old, the next compaction recovers it too.
  age_file(frag_dir / young, 61);
  kdtest::CliResult c2 = merge({"--compact", cache.string()}, dir);
  REQUIRE_MESSAGE(c2.exit_code == 0, c2.err);
  CHECK(c2.err.find(d + ": recovered " + young + ", the claim of a compaction of this host that is gone") !=
        std::string::npos);
  CHECK(kdtest::served_ms(cache.string()) == std::vector<int64_t>{1, 5, 6, 7, 8});
}

TEST_CASE("persist_rows (fragments): an old claim of its own fragment by a live pid is merged into its write") {
  kdtest::WriterScheme scheme(true);
  TempDir dir;
  const fs::path frag_dir = dir / (kRel + ".d");
  const std::string mine = host() + "-" + std::to_string(::getpid()) + ".json";
  // A claim by this (live) pid: the CLI that made it ran as the same pid
  // (pid 1 of a container), an hour ago.
  const std::string claim = "." + mine + ".compacting-" + host() + "-" + std::to_string(::getpid());
  kdtest::write_text(frag_dir / claim, table_text(ref_rows({1, 2})));
  age_file(frag_dir / claim, 3600);
  REQUIRE(store::persist_rows(dir.str(), kRel, {ref_row(3)}, store::cpu_fingerprint(), kSchema).ok());
  CHECK(rows_of(frag_dir / mine) == std::vector<int64_t>{1, 2, 3});
  CHECK(names_in(frag_dir, true).empty());
  CHECK(kdtest::served_ms(dir.str()) == std::vector<int64_t>{1, 2, 3});
}

// Reliability attack 3, item 3: merge dropped rows whose keys the loader
// and SGLang's int(key) read ("01", " 2", "1_0", "３"), and --compact then
// refused such a table forever. merge reads keys with the loader's parser
// (store/batch_key.hpp) and writes canonical keys.
TEST_CASE("merge: keys Python's int() reads merge as their M, written canonical, and --compact compacts such a table") {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"01", kRefRow}, {" 2", kRefRow}, {"1_0", kRefRow}, {"\xEF\xBC\x93", kRefRow}, {"7", kRefRow}};  // "３": U+FF13
  kdtest::write_text(dir / "src" / kRel, keyed_table(rows));
  CHECK(kdtest::served_ms((dir / "src").string()) == std::vector<int64_t>{1, 2, 3, 7, 10});  // as the loader serves it
  kdtest::CliResult r = merge({"--out", (dir / "out").string(), (dir / "src").string()}, dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK(r.out.find("1 table(s) written to " + (dir / "out").string() +
                   " (5 rows, 0 conflicts resolved), 0 refused, 0 "
                   "file(s) skipped, 0 row(s) dropped") != std::string::npos);
  CHECK(rows_of(dir / "out" / kRel) == std::vector<int64_t>{1, 2, 3, 7, 10});
  const std::string out = kdtest::read_text(dir / "out" / kRel);
  for (const char* k : {"1", "2", "3", "7", "10"})
    CHECK(out.find("\"" + std::string(k) + "\": {\"variant\":\"gemm_fp32__ref\"}") != std::string::npos);
  for (const char* k : {"\"01\"", "\" 2\"", "\"1_0\"", "\xEF\xBC\x93"}) CHECK(out.find(k) == std::string::npos);

  // In place: a table whose one fragment has such keys is compacted.
  EnvScope env({{"KDISPATCH_CACHE_LOCKING", nullptr}});
  const fs::path cache = dir / "cache";
  kdtest::write_text(cache / kRel, table_text(ref_rows({4})));
  kdtest::write_text(cache / (kRel + ".d/a-1.json"), keyed_table(rows));
  kdtest::CliResult c = merge({"--compact", cache.string()}, dir);
  REQUIRE_MESSAGE(c.exit_code == 0, c.err);
  CHECK(c.out.find("1 table(s) compacted in " + cache.string() +
                   " (6 rows, 0 conflicts resolved, 1 fragment(s) merged "
                   "and removed, 0 kept), 0 refused, 0 file(s) skipped, 0 row(s) dropped") != std::string::npos);
  CHECK(rows_of(cache / kRel) == std::vector<int64_t>{1, 2, 3, 4, 7, 10});
  CHECK(names_in(cache / (kRel + ".d"), false).empty());
  CHECK(kdtest::served_ms(cache.string()) == std::vector<int64_t>{1, 2, 3, 4, 7, 10});
}

// The same M spelled twice in one file: the row the loader serves (SGLang's
// {int(k): v} over json.load's dict: the spelling placed last) is kept, the
// other dropped and listed; a key int() does not read is dropped.
TEST_CASE("merge: an M spelled twice keeps the row the loader serves, the other dropped and listed") {
  TempDir dir;
  const std::string blocked = "{\"variant\": \"gemm_fp32__blocked\"}";
  kdtest::write_text(
      dir / "src" / kRel,
      keyed_table({{"16", kRefRow}, {"016", blocked}, {"16", kRefRow}, {"2", kRefRow}, {"2x", kRefRow}}));
  kdtest::CliResult r = merge({"--out", (dir / "out").string(), (dir / "src").string()}, dir);
  CHECK(r.exit_code == 1);
  const std::string f = "kdispatch merge: " + (dir / "src" / kRel).string() + ": ";
  CHECK_MESSAGE(r.err.find(f + "M=16: batch size 16 also given by key '016', whose row serves (as SGLang's int(key)); "
                               "row dropped") != std::string::npos,
                r.err);
  CHECK(r.err.find(f + "key '2x' is not a batch size (Python's int() does not read it; the loader ignores it); row "
                       "dropped") != std::string::npos);
  CHECK(r.out.find("(2 rows, 0 conflicts resolved), 0 refused, 0 file(s) skipped, 3 row(s) dropped") !=
        std::string::npos);
  const std::string out = kdtest::read_text(dir / "out" / kRel);
  CHECK(out.find("\"16\": {\"variant\":\"gemm_fp32__blocked\"}") != std::string::npos);
  CHECK(rows_of(dir / "out" / kRel) == std::vector<int64_t>{2, 16});
}

// Reliability attack 3, item 3: merge kept an own-op row that leaves out
// params without the note `validate` gives ("... defaults serve").
TEST_CASE("merge: a row that leaves out params is kept with validate's \"defaults serve\" note") {
  TempDir dir;
  const fs::path src = dir / "src";
  kdtest::write_text(src / kRel, keyed_table({{"1", "{\"variant\": \"gemm_fp32__blocked\", \"BLOCK_SIZE_M\": 128}"}}));
  kdtest::CliResult v = kdtest::run_cli({"validate", src.string()}, (dir / "cli-cache").string());
  const size_t at = v.out.find("- M=1: ");
  REQUIRE_MESSAGE(at != std::string::npos, v.out);
  const std::string note = v.out.substr(at + 7, v.out.find('\n', at) - at - 7);
  CHECK(note.find("BLOCK_SIZE_N, BLOCK_SIZE_K, ukernel not in the row: gemm_fp32__blocked's defaults serve "
                  "(BLOCK_SIZE_N=64, BLOCK_SIZE_K=512, ukernel=") == 0);
  kdtest::CliResult r = merge({"--out", (dir / "out").string(), src.string()}, dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK_MESSAGE(r.err.find("kdispatch merge: " + (src / kRel).string() + ": M=1: " + note +
                           "; row kept (as kdispatch validate reports it)") != std::string::npos,
                r.err);
  CHECK(rows_of(dir / "out" / kRel) == std::vector<int64_t>{1});
  const Config blocked = {{"variant", ConfigValue::string("gemm_fp32__blocked")},
                          {"BLOCK_SIZE_M", ConfigValue::integer(128)}};
  const Config ref = {{"variant", ConfigValue::string("gemm_fp32__ref")}};
  const std::vector<TableRow> rows = {{1, &ref}, {2, &blocked}};
  auto c = check_table_rows(kRel, {}, rows);
  REQUIRE(c.ok());
  CHECK(c->dropped.empty());
  CHECK(c->defaulted == std::vector<std::pair<size_t, std::string>>{{1, note}});
}

#endif  // KDISPATCH_CLI_PATH
