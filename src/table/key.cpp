// SPDX-License-Identifier: Apache-2.0
#include "table/key.hpp"

// Inline XXH3: the hash runs on every op call; inlined, the short-key path
// skips the call into libxxhash (same algorithm, same values).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <charconv>
#include <cstring>

#include "core/op_spec.hpp"
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
namespace {

// Copies the short pieces of a key (names, dtypes, field labels: mostly
// 1..32 bytes) as a few fixed-size moves instead of a libc memcpy call.
inline void copy_key_bytes(char* d, const char* s, size_t n) noexcept {
  if (n > 32) {
    std::memcpy(d, s, n);
  } else if (n > 16) {
    char a[16], b[16];
    std::memcpy(a, s, 16);
    std::memcpy(b, s + n - 16, 16);
    std::memcpy(d, a, 16);
    std::memcpy(d + n - 16, b, 16);
  } else if (n >= 8) {
    uint64_t a, b;
    std::memcpy(&a, s, 8);
    std::memcpy(&b, s + n - 8, 8);
    std::memcpy(d, &a, 8);
    std::memcpy(d + n - 8, &b, 8);
  } else if (n >= 4) {
    uint32_t a, b;
    std::memcpy(&a, s, 4);
    std::memcpy(&b, s + n - 4, 4);
    std::memcpy(d, &a, 4);
    std::memcpy(d + n - 4, &b, 4);
  } else if (n > 0) {
    const char a = s[0], b = s[n / 2], c = s[n - 1];
    d[0] = a;
    d[n / 2] = b;
    d[n - 1] = c;
  }
}

// The op path builds a key on every call (bench/bench_lookup.cpp). This
// writer keeps its cursor in registers and stores size/overflow back into
// the KeyBuffer once, when it dies: KeyBuffer::append keeps `size` in
// memory, and since a char store may alias it the compiler reloads it
// after every piece. Same semantics as KeyBuffer's appends: past an
// overflow nothing more is written.
class KeyWriter {
 public:
  explicit KeyWriter(KeyBuffer* b) noexcept
      : b_(b), p_(b->data + b->size), end_(b->data + kMaxKeyBytes), overflow_(b->overflow) {}
  ~KeyWriter() {
    b_->size = static_cast<size_t>(p_ - b_->data);
    b_->overflow = overflow_;
  }
  KeyWriter(const KeyWriter&) = delete;
  KeyWriter& operator=(const KeyWriter&) = delete;

  void append(std::string_view s) noexcept {
    if (overflow_ || s.size() > static_cast<size_t>(end_ - p_)) {
      overflow_ = true;
      return;
    }
    copy_key_bytes(p_, s.data(), s.size());
    p_ += s.size();
  }
  void append(char c) noexcept {
    if (overflow_ || p_ == end_) {
      overflow_ = true;
      return;
    }
    *p_++ = c;
  }
  void append_int(int64_t v) noexcept {
    if (overflow_) return;
    const auto r = std::to_chars(p_, end_, v);  // digits straight into the key
    if (r.ec != std::errc()) {
      overflow_ = true;
      return;
    }
    p_ = r.ptr;
  }

 private:
  KeyBuffer* b_;
  char* p_;
  char* end_;
  bool overflow_;
};

// The stride field's text ("01_o1_o1"; every operand of the spec's order,
// one class per dim, a rank-3 operand's rows and columns) into `buf`;
// returns its length.
constexpr size_t kStrideTextMax = 3 * core::kMaxArgs;
size_t stride_field_text(const core::Problem& p, char (&buf)[kStrideTextMax]) noexcept {
  size_t n = 0;
  if (p.stride_code == 0) return n;
  constexpr char kChar[4] = {'0', '1', 'o', '?'};
  const core::OpSpec& spec = core::spec_of(p.op);
  for (size_t i = 0; i < spec.order.size() && i < static_cast<size_t>(core::kMaxArgs); ++i) {
    const int rank = spec.slots[static_cast<size_t>(spec.order[i])].rank;
    if (i) buf[n++] = '_';
    for (int d = 0; d < (rank >= 2 ? 2 : 1); ++d)
      buf[n++] = kChar[static_cast<int>(core::stride_class(p.stride_code, static_cast<int>(i), d, rank))];
  }
  return n;
}

void write_stride_field(const core::Problem& p, KeyWriter& out) noexcept {
  char buf[kStrideTextMax];
  const size_t n = stride_field_text(p, buf);
  for (size_t i = 0; i < n; ++i) out.append(buf[i]);  // char by char, as the field always was
}

// The op's key fields in their (byte) order, each as its spec says.
// Inlined into build_own_key so the writer stays in registers.
[[gnu::always_inline]] inline void write_own_fields(const core::Problem& p, KeyWriter& out) noexcept {
  bool first = true;
  auto field = [&](std::string_view name) {
    if (!first) out.append(',');
    first = false;
    out.append(name);
    out.append('=');
  };
  for (const core::KeyField& f : core::spec_of(p.op).fields) {
    switch (f.kind) {
      case core::FieldKind::dim:
        field(f.name);
        out.append_int(core::dim_value(p, f.dim));
        break;
      case core::FieldKind::in_dtype:
        field(f.name);
        out.append(dtype_name(p.in_dtype));
        break;
      case core::FieldKind::out_dtype:
        if (p.out_dtype == p.in_dtype) break;
        field(f.name);
        out.append(dtype_name(p.out_dtype));
        break;
      case core::FieldKind::flag:
        if (!p.has_bias) break;
        field(f.name);
        out.append(f.flag_text);
        break;
      case core::FieldKind::stride:
        if (p.stride_code == 0) break;
        field(f.name);
        write_stride_field(p, out);
        break;
      case core::FieldKind::accum:
        if (p.accum == core::Accum::precise) break;
        field(f.name);
        out.append("fast");
        break;
      case core::FieldKind::choice:
        if (p.choice == 0) break;
        field(f.name);
        out.append(core::choice_label(core::spec_of(p.op), p.choice));
        break;
    }
  }
}

}  // namespace

void append_stride_field(const core::Problem& p, KeyBuffer* out) noexcept {
  KeyWriter w(out);
  write_stride_field(p, w);
}

void append_own_fields(const core::Problem& p, KeyBuffer* out) noexcept {
  KeyWriter w(out);
  write_own_fields(p, w);
}

void build_own_key(const core::Problem& p, std::string_view backend, std::string_view device_name,
                   KeyBuffer* out) noexcept {
  KeyWriter w(out);
  w.append(backend);
  w.append('/');
  w.append(core::op_name(p.op));
  w.append('|');
  w.append(device_name);
  w.append('|');
  write_own_fields(p, w);
}

std::string make_key(std::string_view backend, std::string_view op, std::string_view device_name,
                     std::string_view fields, bool down) {
  std::string k;
  k.reserve(backend.size() + op.size() + device_name.size() + fields.size() + 8);
  k.append(backend).append("/").append(op).append("|").append(device_name).append("|").append(fields);
  if (down) k.append("|down");
  return k;
}

uint64_t own_key_hash(const OwnKey& k) noexcept { return XXH3_64bits(&k, sizeof k); }

uint64_t key_hash(std::string_view key) noexcept { return XXH3_64bits(key.data(), key.size()); }

}  // namespace dispatch::table
