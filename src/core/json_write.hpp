// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — minimal JSON *writing* helpers (simdjson parses; it has
// no writer in 3.0). Only string escaping and number formatting live here.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace dispatch::core {

/// Appends `s` as a JSON string literal (quotes included) to `out`.
inline void json_append_string(std::string& out, std::string_view s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

inline std::string json_string(std::string_view s) {
  std::string out;
  json_append_string(out, s);
  return out;
}

inline void json_append_int(std::string& out, int64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

/// Shortest round-trip text of a double; "null" for NaN/inf (JSON has none).
inline void json_append_double(std::string& out, double v) {
  if (!(v == v) || v > 1e308 || v < -1e308) {
    out += "null";
    return;
  }
  char buf[40];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

/// A small streaming JSON writer: objects, arrays, keys and values, with
/// the commas and nesting kept for you. Every report and --json output of
/// the library and the CLI is written with it (no hand-placed commas).
///
///   JsonWriter w;
///   w.begin_object();
///   w.key("op").value("gemm");
///   w.key("ms").begin_array().value(1).value(2).end_array();
///   w.end_object();
///   std::string text = w.take();   // {"op": "gemm", "ms": [1, 2]}
///
/// Separators are ", " and ": " (the library's JSON has always looked so).
/// Misuse (a value where a key is due, unbalanced ends) is a programming
/// error: checked by assert in debug builds.
class JsonWriter {
 public:
  JsonWriter& begin_object() { return open('{'); }
  JsonWriter& end_object() { return close('}'); }
  JsonWriter& begin_array() { return open('['); }
  /// An array with one element per line ("[\n  {...},\n  {...}\n]"; "[]"
  /// when empty): long reports stay readable.
  JsonWriter& begin_array_lines() {
    open('[');
    lines_ |= 1ull << depth_;
    return *this;
  }
  JsonWriter& end_array() {
    if ((lines_ >> depth_) & 1ull) {
      lines_ &= ~(1ull << depth_);
      if (!first_) out_ += '\n';
    }
    return close(']');
  }
  /// The next member's key (inside an object).
  JsonWriter& key(std::string_view k) {
    separate();
    json_append_string(out_, k);
    out_ += ": ";
    after_key_ = true;
    return *this;
  }
  JsonWriter& value(std::string_view v) {
    return raw_value([&] { json_append_string(out_, v); });
  }
  JsonWriter& value(const char* v) { return value(std::string_view(v ? v : "")); }
  JsonWriter& value(const std::string& v) { return value(std::string_view(v)); }
  JsonWriter& value(bool v) {
    return raw_value([&] { out_ += v ? "true" : "false"; });
  }
  JsonWriter& value(int v) { return value(static_cast<int64_t>(v)); }
  JsonWriter& value(int64_t v) {
    return raw_value([&] { json_append_int(out_, v); });
  }
  JsonWriter& value(uint32_t v) { return value(static_cast<int64_t>(v)); }
  JsonWriter& value(double v) {
    return raw_value([&] { json_append_double(out_, v); });
  }
  JsonWriter& null() {
    return raw_value([&] { out_ += "null"; });
  }
  /// A value that is already JSON text (a nested document written elsewhere).
  JsonWriter& json(std::string_view text) {
    return raw_value([&] { out_ += text; });
  }
  /// key(k).value(v) in one call.
  template <class T>
  JsonWriter& field(std::string_view k, const T& v) {
    key(k);
    return value(v);
  }
  /// The text so far; the writer is empty afterwards.
  std::string take() {
    std::string s;
    s.swap(out_);
    first_ = true;
    after_key_ = false;
    depth_ = 0;
    return s;
  }
  const std::string& text() const noexcept { return out_; }

 private:
  void separate() {
    if (after_key_) return;
    const bool lines = depth_ < 64 && ((lines_ >> depth_) & 1ull);
    if (!first_) out_ += lines ? "," : ", ";
    if (lines) out_ += "\n  ";
    first_ = false;
  }
  template <class F>
  JsonWriter& raw_value(F&& write) {
    separate();
    write();
    after_key_ = false;
    first_ = false;
    return *this;
  }
  JsonWriter& open(char c) {
    separate();
    out_ += c;
    after_key_ = false;
    first_ = true;
    ++depth_;
    return *this;
  }
  JsonWriter& close(char c) {
    out_ += c;
    first_ = false;
    after_key_ = false;
    --depth_;
    return *this;
  }

  std::string out_;
  bool first_ = true;
  bool after_key_ = false;
  int depth_ = 0;
  uint64_t lines_ = 0;  ///< bit d: the array at depth d puts one element per line
};

}  // namespace dispatch::core
