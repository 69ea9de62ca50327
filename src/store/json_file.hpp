// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — reading one config file's JSON (simdjson On Demand).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dispatch/config.hpp"

namespace dispatch::store {

struct ParsedRow {
  int64_t m = 0;
  uint32_t config = 0;  ///< index into ParsedFile::configs
};

/// What a config file holds.
struct ParsedFile {
  enum class Kind : uint8_t {
    table,    ///< {"<M>": {row} | null, ..., optional metadata keys}
    foreign,  ///< valid JSON of another layout (no batch-size keys)
    error,    ///< not parsable; `problems[0]` has the byte offset
  };
  Kind kind = Kind::table;
  std::vector<ParsedRow> rows;  ///< usable rows, file order; a duplicate M keeps the last
  /// The file's distinct row configs: rows that are alike share one (a
  /// table of 1M batch sizes with a few configs allocates a few configs).
  std::vector<Config> configs;
  const Config& config(const ParsedRow& r) const { return configs[r.config]; }
  /// Non-batch-size keys with scalar values ("triton_version": "3.4.0") and
  /// the "kdispatch" metadata object, as raw JSON text.
  std::vector<std::pair<std::string, std::string>> metadata;
  std::vector<std::string> problems;
  int32_t dropped_rows = 0;  ///< null rows and rows with bad values
};

/// Limits (store/limits.hpp): a file with more batch-size keys than
/// limits().max_rows_per_file is an error (not loaded); problems past
/// max_problems_per_file are counted in one last line, not kept.
/// Parses `len` bytes at `data`; `data` must have at least
/// simdjson::SIMDJSON_PADDING readable bytes after `len`.
/// Thread-safety: one call per thread at a time (uses a thread_local parser).
ParsedFile parse_config_json(const char* data, size_t len);

/// Required padding after the data passed to parse_config_json.
size_t json_padding() noexcept;

}  // namespace dispatch::store
