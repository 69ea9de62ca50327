// SPDX-License-Identifier: Apache-2.0
// Config-file JSON reader. simdjson On Demand, error codes only (no
// exceptions). Every problem is reported with its byte offset or M key; a
// bad row is dropped, a bad file is reported and skipped, and the caller
// keeps going. Notes on simdjson 3.0.1 (see shared/notes/toolchain.md):
// unescaped_key() may be called once per field; On Demand is forward-only.
#include "store/json_file.hpp"
#include "store/batch_key.hpp"
#include "store/limits.hpp"

#include <simdjson.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace dispatch::store {
namespace {

using simdjson::error_code;
namespace od = simdjson::ondemand;

// Where an error lies that simdjson reports without a position (a string,
// object or array still open when the input ends, or content after the
// top-level value): the first non-blank byte after the top-level value when
// there is one (trailing content), else the end of the input (truncated).
size_t structural_error_offset(const char* p, size_t len) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < len; ++i) {
    const char c = p[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth < 0) return i;  // a closer without an opener
      if (depth == 0) {
        size_t j = i + 1;
        while (j < len && (p[j] == ' ' || p[j] == '\n' || p[j] == '\r' || p[j] == '\t')) ++j;
        return j;  // trailing content, or len
      }
    }
  }
  return len;
}

std::string offset_text(od::document& doc, const char* base, size_t len, error_code e) {
  if (e == simdjson::INCOMPLETE_ARRAY_OR_OBJECT || e == simdjson::UNCLOSED_STRING)
    return std::to_string(structural_error_offset(base, len));
  const char* loc = nullptr;
  if (doc.current_location().get(loc) == simdjson::SUCCESS && loc != nullptr && loc >= base)
    return std::to_string(static_cast<size_t>(loc - base));
  return std::to_string(len);  // the error is at the end of the input (truncated file)
}

// The raw JSON text of any value (objects and arrays are consumed whole,
// which also validates their structure).
error_code raw_value(od::value& v, od::json_type t, std::string_view* out) {
  if (t == od::json_type::object) {
    od::object o;
    if (auto e = v.get_object().get(o)) return e;
    return o.raw_json().get(*out);
  }
  if (t == od::json_type::array) {
    od::array a;
    if (auto e = v.get_array().get(a)) return e;
    return a.raw_json().get(*out);
  }
  // Scalars: read them once with their typed getter so a malformed token
  // ("tru", "1.2.3") is an error, then take the raw token text.
  *out = v.raw_json_token();
  switch (t) {
    case od::json_type::string: {
      std::string_view s;
      return v.get_string().get(s);
    }
    case od::json_type::number: {
      double d;
      return v.get_double().get(d);
    }
    case od::json_type::boolean: {
      bool b;
      return v.get_bool().get(b);
    }
    default: {
      bool n;
      return v.is_null().get(n);
    }
  }
}

// One field of a row as parsed: views into the parser's string buffer,
// valid for the whole document (On Demand unescapes keys and strings into
// an append-only buffer).
struct RawField {
  std::string_view key;
  ConfigValue::Kind kind;
  int64_t i;
  std::string_view s;
};

// A key repeated inside one row: the last value serves, as Python's
// json.load (which SGLang uses) would have it.
// Sets `key`; true when the row already had it (the last one serves, as
// json.load; the caller reports it).
bool set_field(std::vector<RawField>* fields, std::string_view key, ConfigValue::Kind kind, int64_t i,
               std::string_view s = {}) {
  for (RawField& f : *fields)
    // Last byte first: BLOCK_SIZE_M/_N/_K share a size, and a memcmp call per pair adds up.
    if (f.key.size() == key.size() && (key.empty() || f.key.back() == key.back()) && f.key == key) {
      f.kind = kind;
      f.i = i;
      f.s = s;
      return true;
    }
  fields->push_back(RawField{key, kind, i, s});
  return false;
}

// Walks a value whole, so that invalid JSON inside it (an object or array
// a row does not use: "{16, ...}") is a parse error of the file, never a
// row dropped for a misleading reason.
error_code check_value(od::value v, int depth) {
  if (depth > 64) return simdjson::DEPTH_ERROR;
  od::json_type t;
  if (auto e = v.type().get(t)) return e;
  switch (t) {
    case od::json_type::object: {
      od::object o;
      if (auto e = v.get_object().get(o)) return e;
      for (auto f : o) {
        od::field field;
        if (auto e = std::move(f).get(field)) return e;
        std::string_view k;
        if (auto e = field.unescaped_key().get(k)) return e;
        if (auto e = check_value(field.value(), depth + 1)) return e;
      }
      return simdjson::SUCCESS;
    }
    case od::json_type::array: {
      od::array a;
      if (auto e = v.get_array().get(a)) return e;
      for (auto el : a) {
        od::value x;
        if (auto e = std::move(el).get(x)) return e;
        if (auto e = check_value(x, depth + 1)) return e;
      }
      return simdjson::SUCCESS;
    }
    default: {  // a scalar: read with its typed getter (raw_value), so a malformed token is an error
      std::string_view raw;
      return raw_value(v, t, &raw);
    }
  }
}

std::string read_row_fields(od::object& obj, std::vector<RawField>* fields, error_code* err,
                            std::string_view* repeated);

// "'<key>' <what>", the reason a row is dropped.
std::string field_reason(std::string_view key, std::string_view what) {
  std::string r;
  r.reserve(key.size() + what.size() + 3);
  r.append(1, '\'').append(key).append("' ").append(what);
  return r;
}

// The file's distinct configs, found by a hash of the raw fields.
struct ConfigPool {
  std::vector<Config>* configs;
  std::unordered_map<uint64_t, uint32_t> first;      // hash -> the first config with it
  std::unordered_multimap<uint64_t, uint32_t> more;  // hash collisions between distinct configs

  static uint64_t hash(const std::vector<RawField>& fields) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](const void* p, size_t n) {
      const auto* b = static_cast<const unsigned char*>(p);
      for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    };
    for (const RawField& f : fields) {
      mix(f.key.data(), f.key.size());
      const uint8_t k = static_cast<uint8_t>(f.kind);
      mix(&k, 1);
      mix(&f.i, sizeof f.i);
      mix(f.s.data(), f.s.size());
      h = (h ^ 0xff) * 1099511628211ull;
    }
    return h;
  }
  static bool same(const Config& c, const std::vector<RawField>& fields) {
    if (c.size() != fields.size()) return false;
    for (size_t i = 0; i < fields.size(); ++i) {
      const auto& [k, v] = c[i];
      const RawField& f = fields[i];
      if (k != f.key || v.kind != f.kind || v.i != f.i || v.s != f.s) return false;
    }
    return true;
  }
  uint32_t intern(const std::vector<RawField>& fields) {
    const uint64_t h = hash(fields);
    auto add = [&] {
      Config c;
      c.reserve(fields.size());
      for (const RawField& f : fields)
        c.emplace_back(std::string(f.key), ConfigValue{f.kind, f.i, f.s.empty() ? std::string() : std::string(f.s)});
      configs->push_back(std::move(c));
      return static_cast<uint32_t>(configs->size() - 1);
    };
    const auto [it, fresh] = first.try_emplace(h, 0);
    if (fresh) return it->second = add();
    if (same((*configs)[it->second], fields)) return it->second;
    for (auto [b, e] = more.equal_range(h); b != e; ++b)
      if (same((*configs)[b->second], fields)) return b->second;
    const uint32_t id = add();
    more.emplace(h, id);
    return id;
  }
};

// Reads one row object; on success its config's index in the pool. Returns
// "" on success, else the reason the row is dropped. Hard JSON errors are
// returned through `err`. The fields are gathered as views in a per-thread
// scratch list (its capacity reused); a config is built only the first time
// it is seen in the file.
std::string read_row(od::value row, ConfigPool* pool, uint32_t* config, error_code* err, std::string_view* repeated) {
  od::object obj;
  if ((*err = row.get_object().get(obj))) return "";
  thread_local std::vector<RawField> fields;
  fields.clear();
  std::string reason = read_row_fields(obj, &fields, err, repeated);
  if (reason.empty() && !*err) *config = pool->intern(fields);
  return reason;
}

std::string read_row_fields(od::object& obj, std::vector<RawField>* fields, error_code* err,
                            std::string_view* repeated) {
  std::string reason;
  // Past limits().max_fields_per_row the row is dropped (its values are
  // still walked, so the file's JSON is checked whole): the repeated-key
  // check is a scan of the row's earlier keys, and a row of 80k keys made it
  // quadratic (13 s for a 1.2 MB file).
  size_t n_fields = 0;
  auto set = [&](std::string_view key, ConfigValue::Kind kind, int64_t i, std::string_view sv = {}) {
    if (++n_fields > limits().max_fields_per_row) {
      if (reason.empty())
        reason = "row has more than " + std::to_string(limits().max_fields_per_row) +
                 " fields (docs/config-files.md#limits)";
      return;
    }
    if (set_field(fields, key, kind, i, sv) && repeated->empty()) *repeated = key;
  };
  for (auto field_res : obj) {
    od::field field;
    if ((*err = std::move(field_res).get(field))) return "";
    std::string_view key;  // unescaped into the parser's string buffer: valid for the whole document
    if ((*err = field.unescaped_key().get(key))) return "";
    od::value v = field.value();
    od::json_type t;
    if ((*err = v.type().get(t))) return "";
    switch (t) {
      case od::json_type::number: {
        int64_t i = 0;
        if (v.get_int64().get(i) == simdjson::SUCCESS) {
          set(key, ConfigValue::Kind::integer, i);
        } else {
          double d = 0;
          if ((*err = v.get_double().get(d))) return "";
          if (reason.empty()) reason = field_reason(key, "is not an integer (" + std::to_string(d) + ")");
        }
        break;
      }
      case od::json_type::boolean: {
        bool b = false;
        if ((*err = v.get_bool().get(b))) return "";
        set(key, ConfigValue::Kind::boolean, b ? 1 : 0);
        break;
      }
      case od::json_type::string: {
        std::string_view s;
        if ((*err = v.get_string().get(s))) return "";
        set(key, ConfigValue::Kind::string, 0, s);
        break;
      }
      case od::json_type::null: {
        bool is_null = false;
        if ((*err = v.is_null().get(is_null))) return "";
        if (reason.empty()) reason = field_reason(key, "is null");
        break;
      }
      default: {  // object or array: not a config value (but it must be valid JSON)
        if ((*err = check_value(v, 0))) return "";
        if (reason.empty()) reason = field_reason(key, "is not a scalar");
        break;
      }
    }
  }
  return reason;
}

}  // namespace

namespace {
Limits g_limits;  // constant-initialised: no guard on the parser's path
}  // namespace
Limits& limits() noexcept { return g_limits; }

size_t json_padding() noexcept { return simdjson::SIMDJSON_PADDING; }

namespace {

// The state of one file's top-level walk: its rows, their configs, the
// problems (past limits().max_problems_per_file counted, not kept: a file of
// a million bad rows reports a thousand and a count).
struct TableReader {
  ParsedFile& out;
  ConfigPool pool{&out.configs, {}, {}};
  int64_t object_keys = 0, batch_keys = 0, max_m = 0;
  size_t problems_left_out = 0;
  std::unordered_map<int64_t, size_t> row_index;    // M -> index in out.rows, once an M comes out of order
  std::unordered_map<size_t, std::string> spelled;  // row index -> its key where not std::to_string(M) (rare)
  std::unordered_map<int64_t, std::vector<std::string>> earlier_spellings;  // M -> its keys that no longer serve
  std::vector<std::string> foreign_keys;

  void problem(std::string text) {
    if (out.problems.size() < limits().max_problems_per_file)
      out.problems.push_back(std::move(text));
    else
      ++problems_left_out;
  }
  void drop(const std::string& key, const char* why) {
    problem("M=" + key + ": " + why);
    ++out.dropped_rows;
  }

  // A batch-size key's value: a row kept, replaced (a duplicate M) or
  // dropped with the reason. Hard JSON errors come back.
  // `plain`: the key is std::to_string(m); `too_large`: int(key) is over
  // int64's range.
  error_code batch_row(const std::string& key, int64_t m, bool plain, bool too_large, od::value& v, od::json_type t) {
    error_code err = simdjson::SUCCESS;
    std::string_view raw;
    if (too_large || m < 1) {
      if ((err = raw_value(v, t, &raw))) return err;
      drop(key, too_large ? "batch size over 9223372036854775807 (int64); row dropped"
                          : "batch size must be >= 1; row dropped");
      return err;
    }
    if (t == od::json_type::null) {
      bool is_null = false;
      if ((err = v.is_null().get(is_null))) return err;
      drop(key, "null row dropped");
      return err;
    }
    if (t != od::json_type::object) {
      if ((err = raw_value(v, t, &raw))) return err;
      drop(key, "row is not an object; dropped");
      return err;
    }
    ++object_keys;
    ParsedRow row;
    row.m = m;
    std::string_view repeated;
    const std::string reason = read_row(v, &pool, &row.config, &err, &repeated);
    if (err) return err;
    if (!repeated.empty())
      problem("M=" + key + ": key '" + std::string(repeated) +
              "' repeated in the row; the last one serves (as json.load)");
    if (!reason.empty()) {
      problem("M=" + key + ": " + reason + "; row dropped");
      ++out.dropped_rows;
      return err;
    }
    // A duplicate M needs an M at or below the largest so far: rows in
    // ascending order (every real table) never look anything up; the
    // first out-of-order M builds an index of the rows (linear, not a
    // scan per row: a 1M-row file loads in linear time).
    size_t dup = out.rows.size();
    if (m <= max_m) {
      if (row_index.empty())
        for (size_t i = 0; i < out.rows.size(); ++i) row_index.emplace(out.rows[i].m, i);
      if (auto it = row_index.find(m); it != row_index.end()) dup = it->second;
    }
    if (dup < out.rows.size()) {
      ++out.dropped_rows;  // one of the two rows is dropped: the file is partial
      duplicate(key, m, plain, dup, row);
      return err;
    }
    if (!plain) spelled.emplace(out.rows.size(), key);
    if (!row_index.empty()) row_index.emplace(m, out.rows.size());
    max_m = std::max(max_m, m);
    out.rows.push_back(row);
    return err;
  }

  // A row for an M the file already has a row for. SGLang reads a table as
  // {int(key): row for key, row in json.load(f).items()}: json.load keeps
  // one entry per key string (its last row, at the place of its first
  // occurrence), then the entry placed last among the spellings of one M
  // serves. So: the same spelling again replaces the row; a new spelling
  // ("016" after "16") replaces it too; a spelling seen before the one
  // that serves now is placed before it and does not serve.
  void duplicate(const std::string& key, int64_t m, bool plain, size_t dup, const ParsedRow& row) {
    const auto sp = spelled.find(dup);
    const std::string serving = sp != spelled.end() ? sp->second : std::to_string(m);
    if (key == serving) {
      problem("M=" + key + ": duplicate key; the last one serves (as json.load)");
      out.rows[dup] = row;
      return;
    }
    std::vector<std::string>& before = earlier_spellings[m];
    if (std::find(before.begin(), before.end(), key) != before.end()) {
      problem("M=" + key + ": batch size " + std::to_string(m) + " again, but json.load places this key before '" +
              serving + "', whose row serves (as SGLang's int(key)); row dropped");
      return;
    }
    before.push_back(serving);
    problem("M=" + key + ": batch size " + std::to_string(m) + " already given by key '" + serving +
            "'; this later key's row serves (as SGLang's int(key)), the earlier one is dropped");
    out.rows[dup] = row;
    if (plain)
      spelled.erase(dup);
    else
      spelled[dup] = key;
  }

  // Not a batch size: metadata (scalars, our "kdispatch" object) or foreign.
  error_code other_key(std::string key, od::value& v, od::json_type t) {
    std::string_view raw;
    if (error_code err = raw_value(v, t, &raw)) return err;
    if (t == od::json_type::object || t == od::json_type::array) {
      if (key == "kdispatch") {
        out.metadata.emplace_back(std::move(key), std::string(raw));
      } else {
        if (foreign_keys.size() < limits().max_problems_per_file)
          foreign_keys.push_back(std::move(key));
        else
          ++problems_left_out;
      }
    } else if (out.metadata.size() < limits().max_metadata_keys) {
      out.metadata.emplace_back(std::move(key), std::string(raw));
    } else {
      problem("key '" + key + "' is not a batch size; ignored (more than " +
              std::to_string(limits().max_metadata_keys) + " metadata keys)");
    }
    return simdjson::SUCCESS;
  }

  // After the walk: a file without rows is foreign; the ignored keys and the
  // count of problems not listed are reported.
  void finish() {
    if (out.rows.empty() && out.dropped_rows == 0 && object_keys == 0) {
      out.kind = ParsedFile::Kind::foreign;
      std::string keys;
      for (size_t i = 0; i < foreign_keys.size() && i < 4; ++i) keys += (i ? ", " : "") + foreign_keys[i];
      out.problems.push_back(foreign_keys.empty() ? "no batch-size keys (empty table)"
                                                  : "not a config table: no batch-size keys (keys: " + keys + ")");
      return;
    }
    for (const auto& k : foreign_keys) problem("key '" + k + "' is not a batch size; ignored");
    if (problems_left_out > 0)
      out.problems.push_back("... and " + std::to_string(problems_left_out) + " more problems (only the first " +
                             std::to_string(limits().max_problems_per_file) + " are listed)");
  }
};

}  // namespace

ParsedFile parse_config_json(const char* data, size_t len) {
  thread_local od::parser parser;
  ParsedFile out;
  out.rows.reserve(32);  // SGLang's tables have up to ~20 batch sizes: no regrowth
  if (len >= 3 && static_cast<unsigned char>(data[0]) == 0xEF && static_cast<unsigned char>(data[1]) == 0xBB &&
      static_cast<unsigned char>(data[2]) == 0xBF) {
    out.kind = ParsedFile::Kind::error;
    out.problems.push_back("UTF-8 byte-order mark at byte 0; SGLang's json.load refuses it too");
    return out;
  }
  od::document doc;
  error_code err = parser.iterate(data, len, len + simdjson::SIMDJSON_PADDING).get(doc);
  auto fail = [&](error_code e) {
    out.kind = ParsedFile::Kind::error;
    out.rows.clear();
    out.problems.insert(out.problems.begin(),
                        "parse error at byte " + offset_text(doc, data, len, e) + ": " + simdjson::error_message(e));
    return out;
  };
  if (err) {
    // Stage 1 failed (empty input, a string never closed, bad UTF-8).
    const size_t at = err == simdjson::UNCLOSED_STRING ? structural_error_offset(data, len) : 0;
    out.kind = ParsedFile::Kind::error;
    out.problems.push_back("parse error at byte " + std::to_string(at) + ": " + simdjson::error_message(err));
    return out;
  }
  od::object top;
  if ((err = doc.get_object().get(top))) {
    if (err == simdjson::INCORRECT_TYPE) {
      out.kind = ParsedFile::Kind::foreign;
      out.problems.push_back("top level is not a JSON object");
      return out;
    }
    return fail(err);
  }
  TableReader r{out};
  for (auto field_res : top) {
    od::field field;
    if ((err = std::move(field_res).get(field))) return fail(err);
    std::string_view k;
    if ((err = field.unescaped_key().get(k))) return fail(err);
    std::string key(k);
    od::value v = field.value();
    od::json_type t;
    if ((err = v.type().get(t))) return fail(err);
    int64_t m = 0;
    bool plain = false;
    const KeyInt ki = parse_m_key(key, &m, &plain);
    if (ki == KeyInt::none) {
      if ((err = r.other_key(std::move(key), v, t))) return fail(err);
      continue;
    }
    if (++r.batch_keys > limits().max_rows_per_file) {
      out.kind = ParsedFile::Kind::error;
      out.rows.clear();
      out.configs.clear();
      out.problems.insert(out.problems.begin(), "more than " + std::to_string(limits().max_rows_per_file) +
                                                    " batch-size keys, the limit for one file "
                                                    "(docs/config-files.md#limits): file not loaded");
      return out;
    }
    if ((err = r.batch_row(key, ki == KeyInt::too_large ? -1 : m, plain, ki == KeyInt::too_large, v, t)))
      return fail(err);
  }
  // Content after the top-level object. simdjson catches it at the first
  // access only when the input does not end in '}' ("{...} xx"); "{...} {...}"
  // (two writes appended) and "{...} }" get through, so check here.
  const char* loc = nullptr;
  if (doc.current_location().get(loc) == simdjson::SUCCESS && loc != nullptr) {
    out.kind = ParsedFile::Kind::error;
    out.rows.clear();
    out.problems.insert(out.problems.begin(), "parse error at byte " + std::to_string(static_cast<size_t>(loc - data)) +
                                                  ": content after the top-level object");
    return out;
  }
  r.finish();
  return out;
}

}  // namespace dispatch::store
