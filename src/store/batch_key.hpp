// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — a table's batch-size key as the loader reads it:
// exactly Python's int(key), the rule of SGLang's and vLLM's loaders
// ({int(k): v for k, v in json.load(f).items()}).
//
// One definition for every reader of tables: the loader
// (store/json_file.cpp) and `kdispatch merge` (cli/merge_read.cpp), which
// must accept and resolve the same keys. Compiled into the library and
// into the CLI (which links only the exported API): no dependency on other
// store files.
// Thread-safety: reentrant; no shared state.
#pragma once

#include <cstdint>
#include <string_view>

namespace dispatch::store {

/// What int(key) makes of a top-level key.
enum class KeyInt : uint8_t {
  none,       ///< int() raises: not a batch size (metadata, or a foreign key)
  value,      ///< *m holds the value (< 1 for 0 and negatives: a row dropped)
  too_large,  ///< a value int() reads but int64 cannot hold: a row dropped
};

/// A batch-size key as SGLang's and vLLM's loaders read it: exactly
/// Python's int(key) (CPython's PyLong_FromUnicodeObject, base 10). Each
/// code point above ASCII that is whitespace becomes ' ' and each Unicode
/// decimal digit (Nd) its ASCII digit; any other one fails. Then: ASCII
/// whitespace (" \t\n\v\f\r") around, one '+' or '-', digits with single
/// '_' between two digits, leading zeros allowed, at most 4300 digits
/// (Python's int_max_str_digits; leading zeros count). " 16", "+16", "016",
/// "1_6", "１６", "00000000000000000016" are 16. *plain: the key is
/// std::to_string(*m) (plain ASCII digits without a leading zero).
/// `key` must be valid UTF-8 (as a JSON parser hands it over).
KeyInt parse_m_key(std::string_view key, int64_t* m, bool* plain);

}  // namespace dispatch::store
