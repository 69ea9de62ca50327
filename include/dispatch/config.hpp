// SPDX-License-Identifier: Apache-2.0
// kdispatch — configs as they appear in tuning files, and the load report.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dispatch/export.hpp"
#include "dispatch/status.hpp"

namespace dispatch {

/// One value in a config row: an integer (`"BLOCK_SIZE_M": 64`), a boolean
/// (`"USE_TMA": true`) or a string (`"variant": "gemm_fp32__blocked"`).
struct ConfigValue {
  enum class Kind : uint8_t { integer, boolean, string };
  Kind kind = Kind::integer;
  int64_t i = 0;  ///< integer value, or 0/1 for a boolean
  std::string s;  ///< string value

  static ConfigValue integer(int64_t v) { return ConfigValue{Kind::integer, v, {}}; }
  static ConfigValue boolean(bool v) { return ConfigValue{Kind::boolean, v ? 1 : 0, {}}; }
  static ConfigValue string(std::string v) { return ConfigValue{Kind::string, 0, std::move(v)}; }
  friend bool operator==(const ConfigValue&, const ConfigValue&) = default;
};

/// One config row: parameter name -> value, in the order of the file
/// (e.g. {BLOCK_SIZE_M:64, BLOCK_SIZE_N:32, ..., num_warps:4, num_stages:3}).
using Config = std::vector<std::pair<std::string, ConfigValue>>;

/// The value of `name` in `config`, or nullptr.
KDISPATCH_API const ConfigValue* config_find(const Config& config, std::string_view name) noexcept;

/// The row as a JSON object text, keys in row order: {"BLOCK_SIZE_M": 64, ...}.
/// Thread-safe. Not noexcept: allocates its result, and throws
/// std::bad_alloc (only) when memory runs out.
KDISPATCH_API std::string config_to_json(const Config& config);

/// How one config file fared at load.
struct FileReport {
  enum class State : uint8_t {
    loaded,   ///< every row usable
    partial,  ///< some rows dropped (null rows, unknown variants, bad values); the rest serve
    skipped,  ///< nothing from this file serves (unparsable, foreign layout, bad file name)
  };
  /// Path relative to the config dir it was found in (e.g.
  /// "triton_3_5_1/E=257,N=256,device_name=NVIDIA_H200,...json").
  std::string path;
  /// The config dir (as given) the file was found in.
  std::string dir;
  State state = State::loaded;
  /// One entry per problem: reason, and the byte offset for parse errors
  /// ("parse error at byte 100: ..."), the M key for dropped rows.
  std::vector<std::string> problems;
  /// Rows that serve lookups.
  int32_t rows = 0;
  /// The file's device_name matches no known device. The file is still
  /// loaded and serves a device that reports exactly that name.
  bool unknown_device = false;
  /// A tuning-cache file whose validity fingerprint (kernel sources,
  /// compiler, library, arch, runtime, env) differs from this process's:
  /// never served; re-tuned when tuning is on.
  bool stale = false;
  /// The file's metadata: its top-level keys that are not batch sizes and
  /// hold a scalar (vLLM's "triton_version") or kdispatch's own "kdispatch"
  /// object, each with its value as JSON text ("\"3.4.0\"", "{...}"), in
  /// file order.
  std::vector<std::pair<std::string, std::string>> metadata;
};

/// "loaded" | "partial" | "skipped".
KDISPATCH_API std::string_view file_state_name(FileReport::State s) noexcept;

/// Everything loading found, one entry per *.json file under the dirs.
/// `notes` holds table-level remarks (e.g. a key served from another
/// triton version folder than the running one).
struct KDISPATCH_API LoadReport {
  std::vector<FileReport> files;
  std::vector<std::string> notes;
  /// Static keys and rows in the published table.
  int64_t keys = 0;
  int64_t rows = 0;
  /// Files this (re)load read and parsed, and files unchanged since the
  /// previous load of the same Runtime (same inode, size, mtime and ctime)
  /// whose rows were reused without reading them. A reload after one file
  /// changed reads that file. A file changed within 2 s of the load that
  /// read it is always read again (filesystems with coarse timestamps).
  int64_t files_read = 0;
  int64_t files_unchanged = 0;
  /// Keys whose table was copied from the previous table because none of
  /// their files changed (the others were merged anew).
  int64_t keys_unchanged = 0;
  /// True when every file loaded fully or partially (none skipped).
  bool all_usable() const noexcept;
  /// The report as JSON: {"files": [{"path", "status", "problems"}], ...}.
  /// Not noexcept: allocates the text, and throws std::bad_alloc (only)
  /// when memory runs out.
  std::string to_json() const;
};

/// One row of an own-op table, for check_table_rows().
struct TableRow {
  int64_t m = 0;                   ///< its batch size
  const Config* config = nullptr;  ///< its config (not owned; rows may share one)
};

/// What check_table_rows() found.
struct TableRowsCheck {
  /// False when the table's backend is not compiled into this build: its
  /// rows were not checked against variants (the loader keeps such rows for
  /// lookup); only a row without a "variant" string is dropped.
  bool checked = false;
  /// (index into the rows given, reason) of every row the loader drops, with
  /// the reason its load report gives ("unknown variant 'x'", "'P'=7 is not
  /// a point of V's space", ...), in the order of the rows.
  std::vector<std::pair<size_t, std::string>> dropped;
  /// (index, note) of every row kept whose config leaves out params of its
  /// variant: the loader serves it with the variant's defaults, and its load
  /// report says so in the same words ("BLOCK_SIZE_K not in the row:
  /// <variant>'s defaults serve (BLOCK_SIZE_K=512)"), in the order of the rows.
  std::vector<std::pair<size_t, std::string>> defaulted;
};

/// Checks rows of the own-op table at `table_path` (a path under a config
/// dir ending "<backend>/<op>/<key fields>.json", the key and device in the
/// file name) as the loader checks a row of such a file (what `kdispatch
/// validate` reports): the variant exists, is the op's and backend's, takes
/// the row's params within its space, has the schema version `schema`
/// records for it (the file's "kdispatch"."schema"), computes the key's
/// dtype, and, when the file's device is this machine's device 0 of that
/// backend, accepts the key at the row's M. Fingerprints are not compared.
/// Errors: invalid_argument when `table_path` is not an own-op table path
/// the loader reads (the message says why: it skips such a file).
/// Thread-safe; no runtime needed.
KDISPATCH_API Result<TableRowsCheck> check_table_rows(std::string_view table_path,
                                                      std::span<const std::pair<std::string, int64_t>> schema,
                                                      std::span<const TableRow> rows) noexcept;

}  // namespace dispatch
