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

}  // namespace dispatch::core
