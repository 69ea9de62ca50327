// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the config store's documented limits
// (docs/config-files.md#limits). Past a limit an input is reported with the
// reason and not read: never a hang or an unbounded allocation.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dispatch::store {

/// One input file's size limit (config files, merge sources, shape lists):
/// 256 MiB. store/bounded_read.hpp's default.
inline constexpr int64_t kMaxInputFileBytes = int64_t{256} << 20;

struct Limits {
  int max_dir_depth = 16;                        ///< folder levels read below a config dir
  int64_t max_file_bytes = kMaxInputFileBytes;   ///< one config file: 256 MiB
  int64_t max_files_per_dir = 100'000;           ///< *.json files read under one config dir
  int64_t max_entries_per_dir = 1'000'000;       ///< directory entries examined under one config dir
  int64_t max_rows_per_file = int64_t{1} << 20;  ///< batch-size keys in one file: 1,048,576
  size_t max_problems_per_file = 1000;           ///< problems listed per file; the rest counted
  size_t max_metadata_keys = 64;                 ///< scalar non-batch-size keys kept as metadata
  size_t max_fields_per_row = 64;                ///< fields of one row (SGLang's rows have 6-12)
  /// A file changed less than this before the load that read it is read
  /// again by the next reload whatever its stat says (FileCache).
  int64_t racy_ns = 2'000'000'000;
};

/// The limits in force. Only tests change them (lowered around one load, on
/// the test's thread, with no runtime loading concurrently).
Limits& limits() noexcept;

}  // namespace dispatch::store
