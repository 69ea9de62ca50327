// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — a batch-size key as Python's int(key) reads it
// (store/batch_key.hpp).
#include "store/batch_key.hpp"

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace dispatch::store {
namespace {

// The first code point of each run of ten Unicode decimal digits (general
// category Nd, values 0-9 in order) above ASCII: Python 3.12's and 3.13's
// table (Unicode 15.0/15.1), which int() reads as digits.
constexpr char32_t kDigitZeros[] = {
    0x660,   0x6F0,   0x7C0,   0x966,   0x9E6,   0xA66,   0xAE6,   0xB66,   0xBE6,   0xC66,   0xCE6,   0xD66,
    0xDE6,   0xE50,   0xED0,   0xF20,   0x1040,  0x1090,  0x17E0,  0x1810,  0x1946,  0x19D0,  0x1A80,  0x1A90,
    0x1B50,  0x1BB0,  0x1C40,  0x1C50,  0xA620,  0xA8D0,  0xA900,  0xA9D0,  0xA9F0,  0xAA50,  0xABF0,  0xFF10,
    0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650, 0x116C0, 0x11730,
    0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x11F50, 0x16A60, 0x16AC0, 0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2,
    0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E4F0, 0x1E950, 0x1FBF0};

// int()'s digit value of a code point >= 128, or -1.
int unicode_digit(char32_t c) {
  const char32_t* it = std::upper_bound(std::begin(kDigitZeros), std::end(kDigitZeros), c);
  if (it == std::begin(kDigitZeros)) return -1;
  const char32_t d = c - *(it - 1);
  return d < 10 ? static_cast<int>(d) : -1;
}

// Python's whitespace above ASCII (str.isspace(), which int() strips).
bool unicode_space(char32_t c) {
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// The code point at s[*i] (UTF-8, validated by simdjson), *i moved past it.
char32_t next_code_point(std::string_view s, size_t* i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(*i);
  size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  if (*i + n > s.size()) n = 1;  // (not reached: valid UTF-8)
  char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (b(*i + k) & 0x3F);
  *i += n;
  return cp;
}

}  // namespace

// See the header: exactly CPython's int(key), base 10.
KeyInt parse_m_key(std::string_view key, int64_t* m, bool* plain) {
  *plain = false;
  // Fast path, every real table: ASCII digits that fit an int64.
  if (!key.empty() && key.size() <= 18) {
    int64_t v = 0;
    size_t i = 0;
    for (; i < key.size() && key[i] >= '0' && key[i] <= '9'; ++i) v = v * 10 + (key[i] - '0');
    if (i == key.size()) {
      *m = v;
      *plain = key.size() == 1 || key[0] != '0';
      return KeyInt::value;
    }
  }
  constexpr size_t kMaxDigits = 4300;
  auto ascii_space = [](char32_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  enum { lead, sign, first_digit, digits, trail } phase = lead;
  bool negative = false, prev_underscore = false, overflow = false;
  uint64_t v = 0;
  size_t n_digits = 0;
  for (size_t i = 0; i < key.size();) {
    char32_t c = next_code_point(key, &i);
    if (c >= 127) {  // CPython maps these first (DEL and above)
      if (unicode_space(c)) {
        c = ' ';
      } else if (const int d = unicode_digit(c); d >= 0) {
        c = static_cast<char32_t>('0' + d);
      } else {
        return KeyInt::none;
      }
    }
    if (phase == lead) {
      if (ascii_space(c)) continue;
      phase = sign;
    }
    if (phase == sign) {
      phase = first_digit;
      if (c == '+' || c == '-') {
        negative = c == '-';
        continue;
      }
    }
    if (phase == trail) {
      if (!ascii_space(c)) return KeyInt::none;
      continue;
    }
    if (c >= '0' && c <= '9') {
      phase = digits;
      prev_underscore = false;
      if (++n_digits > kMaxDigits) return KeyInt::none;
      const uint64_t d = c - '0';
      if (!overflow) {
        if (v > (UINT64_MAX - d) / 10)
          overflow = true;
        else
          v = v * 10 + d;
      }
      continue;
    }
    if (phase == first_digit) return KeyInt::none;  // no digit yet: "_1", "+ 1", "", "x"
    if (c == '_' && !prev_underscore) {             // "1_000"; "1__0" is refused
      prev_underscore = true;
      continue;
    }
    if (!ascii_space(c) || prev_underscore) return KeyInt::none;  // "1x", "1_ "
    phase = trail;
  }
  if (phase != digits && phase != trail) return KeyInt::none;
  if (prev_underscore) return KeyInt::none;  // "16_"
  if (negative) {
    *m = v == 0 ? 0 : (overflow || v > static_cast<uint64_t>(INT64_MAX)) ? -1 : -static_cast<int64_t>(v);
    return KeyInt::value;
  }
  if (overflow || v > static_cast<uint64_t>(INT64_MAX)) return KeyInt::too_large;
  *m = static_cast<int64_t>(v);
  return KeyInt::value;
}

}  // namespace dispatch::store
