// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch merge` (issue 22): the emit dirs of several
// tuning shards (hosts, GPUs) into one config tree.
//
// A table is a file's path under its dir (<backend>/<op>/<key>.json: the key
// and the device are in the name). Per table:
//   - the sources' fingerprints (the "fingerprint" object of the "kdispatch"
//     metadata) must be equal: rows of different builds or devices are never
//     mixed; such a table is refused and reported;
//   - rows at different M are all kept; the same M with equal configs is
//     kept once (the smallest "us" of the sources is recorded);
//   - the same M with different configs is a conflict: --prefer keeps the
//     config of the source listed first; --retime times every candidate
//     config on this machine (dispatch::time_configs: the tuner's scratch
//     operands, validation and harness) and keeps the fastest, a config
//     within --retime-margin of the fastest tying, ties to the smallest
//     config text; without either the table is refused and the conflicting
//     rows reported. Every conflict's candidates (source, config, us, and
//     under --retime the retimed us) are recorded in the output's metadata
//     ("merged"), with who retimed them ("merged"."retimed").
//   - --retime refuses a table it cannot time here: its backend has no
//     device on this machine, or device 0's name is not the file's, or a
//     candidate is not a plan this build runs on it (supports() declining,
//     a launch failure, an output that differs from the reference's).
//     Sources of another build (fingerprint) are retimed when every
//     candidate passes that: the check is the configs', not the
//     fingerprint's.
// Rows: before any of that, every row is checked as `kdispatch validate`
// checks it (dispatch::check_table_rows, for the backends this build has:
// the variant exists and takes the row's params within its space, its
// schema version and dtype, supports() where the file's device is this
// machine's); a bad row is dropped and listed (exit 1), and so is a row the
// loader drops (null, not an object, M < 1 or over 2^63-1, a key Python's
// int() does not read: keys are read by the loader's own parser,
// store/batch_key.hpp, and written canonical; of an M spelled twice in one
// file the row the loader serves is kept): the file's other rows merge. A
// kept row that leaves out params gets validate's "defaults serve" note. A table of
// a backend this build lacks is copied unchecked and counted "not checked
// here" (shards are merged on CPU-only login nodes). Under --compact a
// table with a dropped row is left as it is (in place, nothing is removed
// that is not carried over).
// Fragments: a source's <key>.json.d/<name>.json (written where flock is not
// honoured) are more sources of its table <key>.json, labelled
// "<SRC> (fragment <name>)"; for --prefer a source's main file comes first,
// then its fragments by name. --compact DIR merges DIR's fragments into their
// main files in place (merge_write.cpp's compact_table says how that stays
// safe with writers running; claims of a compaction that died are
// recovered first: store/fragment_claims.hpp), reading only the tables
// that have fragments, and honours KDISPATCH_CACHE_LOCKING as the writers
// do (a bad value is a usage error; flock, forced or found by the check,
// makes each table's lock required).
// Every source file is read through the bounded reader (256 MiB, a regular
// file only, never blocking): merge_read.cpp. Reading is linear in rows.
// Output: canonical, as the tuner writes a table (the metadata first, then
// the rows by ascending M, one per line), configs as their sources wrote
// them (minified), the metadata's maps sorted, no timestamps: without
// --prefer the output does not depend on the order of the sources (under
// --retime: but for the "retimed_us" measurements, as long as they pick the
// same configs); each file written atomically (temp file, fsync, rename),
// never through a symbolic link below --out (merge_write.cpp).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "cli/merge_impl.hpp"
#include "dispatch/runtime.hpp"

namespace kdispatch_cli {
namespace {

namespace fs = std::filesystem;
using namespace merge_detail;

constexpr const char* kCmd = "kdispatch merge";

// The options, checked: kExitOk or the exit code of a usage error.
int check_options(MergeOptions& o, bool compact, double* margin) {
  if (compact) {
    if (!o.sources.empty() || !o.out.empty()) {
      std::fprintf(stderr, "%s: --compact DIR merges DIR's fragments in place: no source dirs and no --out with it\n",
                   kCmd);
      return kExitUsage;
    }
    o.sources = {o.compact};
  } else if (o.out.empty()) {
    std::fprintf(stderr, "%s: --out DIR is required (or --compact DIR)\n", kCmd);
    return kExitUsage;
  }
  if (o.sources.empty()) {
    std::fprintf(stderr, "%s: no source dirs\n", kCmd);
    return kExitUsage;
  }
  if (o.retime && o.prefer) {
    std::fprintf(stderr,
                 "%s: --retime and --prefer are two rules for the same conflicts: pass one (--prefer keeps the first "
                 "source's config, --retime the faster on this machine)\n",
                 kCmd);
    return kExitUsage;
  }
  if (!o.retime && (o.retime_margin >= 0 || o.reps > 0 || o.no_cold_cache)) {
    std::fprintf(stderr, "%s: --retime-margin, --reps and --no-cold-cache time conflicts: they need --retime\n", kCmd);
    return kExitUsage;
  }
  *margin = o.retime_margin >= 0 ? o.retime_margin : kDefaultRetimeMargin;
  if (!(*margin <= 10.0)) {
    std::fprintf(stderr, "%s: --retime-margin must be in [0, 10], got %g\n", kCmd, o.retime_margin);
    return kExitUsage;
  }
  std::error_code ec;
  const fs::path out_abs = compact ? fs::path() : fs::weakly_canonical(fs::absolute(o.out, ec), ec);
  for (const std::string& s : o.sources) {
    if (!fs::is_directory(s, ec)) {
      std::fprintf(stderr, "%s: source '%s' is not a directory\n", kCmd, s.c_str());
      return kExitUsage;
    }
    if (compact) continue;
    // --out below a source would be read back as part of it on the next run.
    const fs::path src_abs = fs::weakly_canonical(fs::absolute(s, ec), ec);
    const auto rel = out_abs.lexically_relative(src_abs);
    if (!rel.empty() && *rel.begin() != ".." && rel != ".") {
      std::fprintf(stderr, "%s: --out %s is inside the source %s: choose a dir outside every source\n", kCmd,
                   o.out.c_str(), s.c_str());
      return kExitUsage;
    }
  }
  return kExitOk;
}

// --compact: how the dir's writers write (KDISPATCH_CACHE_LOCKING, or the
// flock check the writers run): kExitOk with *flock set, or an exit code.
int compact_locking(const MergeOptions& o, bool* flock) {
  auto cl = dispatch::cache_locking(o.compact);
  if (!cl.ok()) {
    std::fprintf(stderr, "%s: --compact %s: %s\n", kCmd, o.compact.c_str(), cl.status().message().c_str());
    return cl.status().code() == dispatch::StatusCode::invalid_argument ? kExitUsage : kExitFailure;
  }
  *flock = !cl->fragments;
  std::printf("writes into %s: %s: %s\n", o.compact.c_str(),
              cl->fragments ? "per-process fragments" : "each <key>.json under its lock file", cl->reason.c_str());
  return kExitOk;
}

/// The run's counts and report lines.
struct Outcome {
  int written = 0, refused = 0, rows = 0, conflicts = 0, fragments_merged = 0, fragments_kept = 0, unchecked = 0;
  std::vector<std::string> report;
};

// One table: checked, merged, written (or compacted). Counts into *r.
void merge_one(const std::string& rel, Table& t, Inputs& in, const MergeOptions& o, bool compact, bool flock,
               double margin, RetimeRuntime* retime, Outcome* r) {
  const auto refuse = [&](const std::string& why) {
    r->report.push_back(rel + ": refused: " + why);
    ++r->refused;
  };
  if (!t.problem.empty()) return refuse(t.problem);
  if (t.cands.empty()) return;
  if (compact && t.fragments.empty()) return;  // a table without fragments stays as it is
  if (t.fingerprints.size() == 1 && t.fingerprints.begin()->first.front() == '(')
    return refuse("not written by kdispatch (no fingerprint); merge combines tuned tables");
  if (t.fingerprints.size() > 1) {
    std::string why = "the sources were tuned by different builds or devices (fingerprints:";
    for (const auto& [fp, labels] : t.fingerprints) {
      why += " [";
      for (const std::string& l : labels) why += (why.back() == '[' ? "" : ", ") + l;
      why += "] " + fp;
    }
    return refuse(why + "); never mixed");
  }
  bool unchecked = false;
  if (std::string why = check_rows(rel, &t, &in, &unchecked); !why.empty()) return refuse(why);
  if (compact && t.dropped > 0)
    return refuse(std::to_string(t.dropped) +
                  " row(s) dropped (listed): left as it was (--compact removes no row it "
                  "does not carry over; fix or remove them, or merge with --out)");
  if (t.cands.empty()) return;
  Merged m = merge_table(rel, t, in, o, margin, retime);
  for (std::string& line : m.report) r->report.push_back(std::move(line));
  if (!m.refusal.empty()) return refuse(m.refusal);
  if (compact) {
    int kept = 0;
    if (std::string err = compact_table(o.compact, rel, t, m.text, flock, &kept); !err.empty()) return refuse(err);
    r->fragments_merged += static_cast<int>(t.fragments.size()) - kept;
    r->fragments_kept += kept;
    if (kept)
      r->report.push_back(rel + ": " + std::to_string(kept) +
                          " fragment(s) were rewritten by their writer while compacting: kept (their earlier rows are "
                          "merged); run the compaction again");
  } else if (std::string err = write_out(o.out, rel, m.text); !err.empty()) {
    r->report.push_back(rel + ": " + err);
    ++r->refused;
    return;
  }
  ++r->written;
  r->rows += static_cast<int>(m.kept.size());
  r->conflicts += m.conflicts;
  if (unchecked) {
    r->unchecked += static_cast<int>(m.kept.size());
    r->report.push_back(rel + ": " + std::to_string(m.kept.size()) + " row(s) copied unchecked: backend '" +
                        fs::path(rel).begin()->string() +
                        "' is not compiled into this build (run kdispatch validate where it is)");
  }
  if (m.conflicts)
    r->report.push_back(rel + ": " + std::to_string(m.conflicts) + " conflicting M resolved by " +
                        (o.prefer ? "--prefer" : "--retime"));
}

int report(const MergeOptions& o, bool compact, const Inputs& in, const Outcome& r) {
  for (const std::string& n : in.notes) std::fprintf(stderr, "%s: %s\n", kCmd, n.c_str());
  for (const std::string& u : in.skipped) std::fprintf(stderr, "%s: skipped %s\n", kCmd, u.c_str());
  for (const std::string& d : in.dropped) std::fprintf(stderr, "%s: %s\n", kCmd, d.c_str());
  for (const std::string& line : r.report) std::fprintf(stderr, "%s: %s\n", kCmd, line.c_str());
  if (compact)
    std::printf(
        "%d table(s) compacted in %s (%d rows, %d conflicts resolved, %d fragment(s) merged and removed, %d "
        "kept), %d refused, %zu file(s) skipped, %zu row(s) dropped, %d row(s) not checked here\n",
        r.written, o.compact.c_str(), r.rows, r.conflicts, r.fragments_merged, r.fragments_kept, r.refused,
        in.skipped.size(), in.dropped.size(), r.unchecked);
  else
    std::printf(
        "%d table(s) written to %s (%d rows, %d conflicts resolved), %d refused, %zu file(s) skipped, %zu "
        "row(s) dropped, %d row(s) not checked here\n",
        r.written, o.out.c_str(), r.rows, r.conflicts, r.refused, in.skipped.size(), in.dropped.size(), r.unchecked);
  return r.refused > 0 || !in.skipped.empty() || !in.dropped.empty() ? kExitFailure : kExitOk;
}

}  // namespace

int run_merge(const MergeOptions& options) {
  MergeOptions o = options;
  const bool compact = !o.compact.empty();
  double margin = 0;
  if (int rc = check_options(o, compact, &margin); rc != kExitOk) return rc;
  // --compact: the writers' scheme, then one compaction of the dir at a
  // time (the lock released on return).
  bool flock = false;
  CompactLock compact_lock;
  if (compact) {
    if (int rc = compact_locking(o, &flock); rc != kExitOk) return rc;
    std::string note;
    if (std::string why = compact_lock.take(fs::path(o.compact) / ".kdispatch-compact.lock", &note); !why.empty()) {
      std::fprintf(stderr, "%s: --compact %s: %s\n", kCmd, o.compact.c_str(), why.c_str());
      return kExitFailure;
    }
    if (!note.empty()) std::fprintf(stderr, "%s: --compact %s: %s\n", kCmd, o.compact.c_str(), note.c_str());
  }
  Inputs in;
  read_sources(o, compact, &in);
  RetimeRuntime retime{&o, nullptr, {}};
  Outcome r;
  for (auto& [rel, t] : in.tables) merge_one(rel, t, in, o, compact, flock, margin, &retime, &r);
  return report(o, compact, in, r);
}

}  // namespace kdispatch_cli
