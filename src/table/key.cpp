// SPDX-License-Identifier: Apache-2.0
#include "table/key.hpp"

#include <xxhash.h>

#include <charconv>
#include <cstring>

#include "dispatch/types.hpp"

namespace dispatch::table {

void KeyBuffer::append(std::string_view s) noexcept {
  if (overflow || size + s.size() > kMaxKeyBytes) {
    overflow = true;
    return;
  }
  std::memcpy(data + size, s.data(), s.size());
  size += s.size();
}

void KeyBuffer::append(char c) noexcept {
  if (overflow || size + 1 > kMaxKeyBytes) {
    overflow = true;
    return;
  }
  data[size++] = c;
}

void KeyBuffer::append_int(int64_t v) noexcept {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  append(std::string_view(buf, static_cast<size_t>(r.ptr - buf)));
}

// Stride code layout: bit 31 = non-default; bits [8*i .. 8*i+7] operand i:
// bits 0-1 class of dim 0, bits 2-3 class of dim 1, bits 4-5 rank.
uint32_t pack_stride_code(const uint8_t classes[4][2], const int ranks[4], int operands) noexcept {
  uint32_t code = 0;
  bool non_default = false;
  for (int i = 0; i < operands && i < 4; ++i) {
    const int r = ranks[i];
    uint32_t op = static_cast<uint32_t>(r & 3) << 4;
    for (int d = 0; d < r && d < 2; ++d) op |= static_cast<uint32_t>(classes[i][d] & 3) << (2 * d);
    // Default: rank 2 -> (other, unit); rank 1 -> (unit).
    const bool def = r == 2 ? (classes[i][0] == static_cast<uint8_t>(StrideClass::other) &&
                               classes[i][1] == static_cast<uint8_t>(StrideClass::unit))
                            : classes[i][0] == static_cast<uint8_t>(StrideClass::unit);
    non_default |= !def;
    code |= op << (8 * i);
  }
  return non_default ? (code | 0x80000000u) : 0u;
}

void append_stride_field(const core::Problem& p, KeyBuffer* out) noexcept {
  if (p.stride_code == 0) return;
  constexpr char kChar[4] = {'0', '1', 'o', '?'};
  for (int i = 0; i < 4; ++i) {
    const uint32_t op = (p.stride_code >> (8 * i)) & 0x7f;
    const int rank = static_cast<int>((op >> 4) & 3);
    if (rank == 0) break;
    if (i) out->append('_');
    for (int d = 0; d < rank; ++d) out->append(kChar[(op >> (2 * d)) & 3]);
  }
}

void append_own_fields(const core::Problem& p, KeyBuffer* out) noexcept {
  // Fields in byte order of their names: upper case sorts before lower case.
  if (p.op == core::OpKind::gemm) {
    out->append("K=");
    out->append_int(p.k);
    out->append(",N=");
    out->append_int(p.n);
    if (p.has_bias) out->append(",bias=true");
    out->append(",dtype=");
    out->append(dtype_name(p.in_dtype));
    if (p.out_dtype != p.in_dtype) {
      out->append(",out_dtype=");
      out->append(dtype_name(p.out_dtype));
    }
  } else {
    out->append("dtype=");
    out->append(dtype_name(p.in_dtype));
    out->append(",hidden=");
    out->append_int(p.n);
  }
  if (p.stride_code != 0) {
    out->append(",stride=");
    append_stride_field(p, out);
  }
}

void build_own_key(const core::Problem& p, std::string_view backend, std::string_view device_name,
                   KeyBuffer* out) noexcept {
  out->append(backend);
  out->append('/');
  out->append(core::op_name(p.op));
  out->append('|');
  out->append(device_name);
  out->append('|');
  append_own_fields(p, out);
}

std::string make_key(std::string_view backend, std::string_view op, std::string_view device_name,
                     std::string_view fields, bool down) {
  std::string k;
  k.reserve(backend.size() + op.size() + device_name.size() + fields.size() + 8);
  k.append(backend).append("/").append(op).append("|").append(device_name).append("|").append(fields);
  if (down) k.append("|down");
  return k;
}

uint64_t key_hash(std::string_view key) noexcept { return XXH3_64bits(key.data(), key.size()); }

}  // namespace dispatch::table
