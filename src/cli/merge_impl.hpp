// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch merge`'s stages, shared by its files:
//   merge.cpp        run_merge: the options, then the stages in order, the report
//   merge_read.cpp   the sources: listing (a --compact dir's dead compactions'
//                    claims recovered first; only tables with fragments read),
//                    every file through the bounded reader, rows and their
//                    timing maps, the rows checked as `validate` checks them
//   merge_table.cpp  one table: fingerprints, conflicts (--prefer, --retime),
//                    the canonical text
//   merge_write.cpp  writing: --out's dirs opened without following a link,
//                    temp files (dead merges' swept), --compact's locks,
//                    claims and put-backs
// What each stage guarantees is in merge.cpp's header comment and
// docs/tuning.md.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cli/cli.hpp"
#include "dispatch/runtime.hpp"
#include "store/row_meta.hpp"

namespace kdispatch_cli::merge_detail {

namespace fs = std::filesystem;

/// One file read: a source's table file or one of its fragments.
struct SourceFile {
  std::string label;  ///< "<SRC>" or "<SRC> (fragment <name>)": what reports and the metadata name
  std::string path;   ///< the file, as messages name it
  size_t source = 0;  ///< index into the source list
  std::vector<std::pair<std::string, int64_t>> schema;  ///< its "kdispatch"."schema"
};

/// One row of one file.
struct Candidate {
  int64_t m = 0;
  uint32_t file = 0;   ///< index into Inputs::files
  std::string config;  ///< minified JSON, as its source wrote it
  double us = 0, default_us = 0;
  /// How it was chosen (margin, A/A spread, timing, why, cpu: store/row_meta.hpp),
  /// carried into the merged file; null when its file records none.
  std::shared_ptr<const dispatch::store::RowMeta> meta;
};

/// One table (a path under the sources) as read from every source.
struct Table {
  std::map<std::string, std::set<std::string>> fingerprints;  ///< minified fingerprint -> labels
  std::map<std::string, int64_t> schema;                      ///< variant -> schema version (union, the largest)
  std::vector<Candidate> cands;                               ///< every row read
  int dropped = 0;                                            ///< rows dropped (listed in Inputs::dropped)
  std::string problem;  ///< --compact: why the table is left as it is (its main file not readable), or ""
  /// --compact: the main file's bytes as read ("" with has_main false) and
  /// each fragment read (path, bytes).
  bool has_main = false;
  std::string main_bytes;
  std::vector<std::pair<fs::path, std::string>> fragments;
};

/// Everything the sources held.
struct Inputs {
  std::vector<SourceFile> files;
  std::map<std::string, Table> tables;  ///< by path under the source ("cpu/gemm/<key>.json")
  std::vector<std::string> skipped;     ///< a file not read or not a table: "<file>: why" (exit 1)
  std::vector<std::string> dropped;     ///< a row dropped: "<file>: M=..: why" (exit 1)
  std::vector<std::string> notes;       ///< said on stderr, exit code unchanged
};

/// Reads every source (the options' sources, or the --compact dir: its
/// dead compactions' claims recovered first, and only tables with
/// fragments read). Never fails: problems land in `in`.
void read_sources(const MergeOptions& o, bool compact, Inputs* in);

/// Checks the rows of `rel` as `kdispatch validate` checks them
/// (dispatch::check_table_rows): a bad row is removed from t->cands and
/// listed in in->dropped; *unchecked is set when the table's backend is not
/// compiled into this build (its rows are copied). "" or why the whole
/// table is refused (a path the loader does not read as an own-op table).
std::string check_rows(const std::string& rel, Table* t, Inputs* in, bool* unchecked);

/// --retime's runtime, created at the first conflict that needs it.
struct RetimeRuntime {
  const MergeOptions* options = nullptr;
  std::unique_ptr<dispatch::Runtime> rt;
  std::string error;  ///< why it could not be created
  dispatch::Runtime* get();
};

/// One table merged.
/// Candidate::file of a row no source had: the floor, kept by --retime
/// where no source's config beat it by the margin.
inline constexpr uint32_t kFloorFile = 0xffffffffu;

struct Merged {
  std::string refusal;                                     ///< "" or why the table is refused
  std::vector<std::pair<int64_t, const Candidate*>> kept;  ///< the rows, by ascending M
  std::vector<std::unique_ptr<Candidate>> floors;          ///< kept floor rows (kFloorFile), owned here
  int conflicts = 0;
  std::vector<std::string> report;  ///< lines for stderr ("M=.. retimed: ...")
  std::string text;                 ///< the canonical table (refusal empty)
};

/// Merges one table by the conflict rules (--prefer, --retime, else a
/// conflict refuses it) and renders it. `margin`: --retime's tie margin.
Merged merge_table(const std::string& rel, Table& t, const Inputs& in, const MergeOptions& o, double margin,
                   RetimeRuntime* retime);

/// This host's name ('/' as '_').
std::string host_name();

/// Writes `text` to <out>/<rel> atomically, every dir below `out` opened
/// without following a link (missing ones created), dead merges' temp
/// files of this host swept from the dir first. "" or why not (naming the
/// path).
std::string write_out(const std::string& out, const std::string& rel, const std::string& text);

/// A lock file without a pid and host (empty: an older build's, killed
/// between its create and its write; or foreign) is taken over once its
/// mtime is this many seconds old.
inline constexpr long kCompactLockStaleSeconds = 10;

/// --compact's one compaction of DIR at a time: DIR/.kdispatch-compact.lock,
/// "<pid> <host>\n", written to a temp file link()ed to the lock's name
/// (atomic, never replacing a file, NFS included; where hard links are
/// refused, O_EXCL then the write). A lock of a dead pid of this host, or
/// one without a pid and host older than kCompactLockStaleSeconds, is
/// taken over (said). The temp files of dead compactions of this host are
/// removed first. Released (removed when it is still this one's) on
/// destruction.
class CompactLock {
 public:
  CompactLock() = default;
  CompactLock(const CompactLock&) = delete;
  CompactLock& operator=(const CompactLock&) = delete;
  ~CompactLock();
  /// "" when taken (*note: "took over ...", or ""), else why not.
  std::string take(const fs::path& path, std::string* note);

 private:
  fs::path path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

/// --compact, one table in place (merge_write.cpp's comment says how).
/// `require_flock`: the dir's writers use flock (KDISPATCH_CACHE_LOCKING or
/// the check): a table lock that cannot be taken refuses the table.
/// "" or why the table was left as it was; *kept counts fragments put back.
std::string compact_table(const fs::path& root, const std::string& rel, const Table& t, const std::string& text,
                          bool require_flock, int* kept);

}  // namespace kdispatch_cli::merge_detail
