// SPDX-License-Identifier: Apache-2.0
#include "tune/routing_file.hpp"

#include <cstring>

#include "store/bounded_read.hpp"

namespace dispatch::tune {
namespace {

Status bad(const std::string& shown, const std::string& what) {
  return make_status(StatusCode::invalid_argument,
                     "routing file " + shown + ": " + what + " (want an .npy of int32 [tokens, top_k] expert ids)");
}

/// The value text of `key` in numpy's header dict ('key': value, ...), up to
/// the next top-level comma or the closing brace; empty when absent.
std::string_view dict_value(std::string_view h, std::string_view key) {
  const std::string quoted = "'" + std::string(key) + "'";
  size_t at = h.find(quoted);
  if (at == std::string_view::npos) return {};
  at = h.find(':', at + quoted.size());
  if (at == std::string_view::npos) return {};
  size_t b = at + 1, depth = 0, e = b;
  for (; e < h.size(); ++e) {
    const char c = h[e];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' && depth == 0) || (c == '}' && depth == 0)) break;
  }
  while (b < e && h[b] == ' ') ++b;
  while (e > b && h[e - 1] == ' ') --e;
  return h.substr(b, e - b);
}

/// "(T, k)" -> T, k; false unless exactly two non-negative integers.
bool parse_shape(std::string_view v, int64_t* t, int64_t* k) {
  if (v.size() < 2 || v.front() != '(' || v.back() != ')') return false;
  int64_t dims[3] = {};
  int n = 0;
  bool digit = false;
  for (size_t i = 1; i + 1 < v.size(); ++i) {
    const char c = v[i];
    if (c >= '0' && c <= '9') {
      if (n >= 2 || dims[n] > (int64_t{1} << 40)) return false;
      dims[n] = dims[n] * 10 + (c - '0'), digit = true;
    } else if (c == ',') {
      if (!digit) return false;
      ++n, digit = false;
    } else if (c != ' ' && c != 'L') {
      return false;
    }
  }
  if (digit) ++n;
  if (n != 2) return false;
  *t = dims[0], *k = dims[1];
  return true;
}

}  // namespace

Status parse_routing_npy(std::string_view bytes, const std::string& shown, Routing* out) {
  static constexpr char kMagic[] = "\x93NUMPY";
  if (bytes.size() < 10 || bytes.substr(0, 6) != std::string_view(kMagic, 6)) return bad(shown, "not an .npy file");
  const auto u8 = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])); };
  const uint32_t major = u8(6);
  if (major < 1 || major > 3) return bad(shown, ".npy format version " + std::to_string(major) + " is not 1, 2 or 3");
  size_t head = 10, len = u8(8) | (u8(9) << 8);
  if (major >= 2) {
    if (bytes.size() < 12) return bad(shown, "truncated header");
    head = 12, len = u8(8) | (u8(9) << 8) | (u8(10) << 16) | (u8(11) << 24);
  }
  if (len > bytes.size() - head) return bad(shown, "truncated header");
  const std::string_view h = bytes.substr(head, len);
  const std::string_view descr = dict_value(h, "descr");
  if (descr != "'<i4'" && descr != "'|i4'")
    return bad(shown, "dtype " + std::string(descr.empty() ? "(none)" : descr) + " is not little-endian int32 '<i4'");
  if (dict_value(h, "fortran_order") != "False") return bad(shown, "Fortran order (transposed) data");
  int64_t tokens = 0, top_k = 0;
  const std::string_view shape = dict_value(h, "shape");
  if (!parse_shape(shape, &tokens, &top_k))
    return bad(shown, "shape " + std::string(shape.empty() ? "(none)" : shape) + " is not two dims");
  if (tokens < 1 || top_k < 1) return bad(shown, "an empty routing");
  const size_t data = head + len, want = static_cast<size_t>(tokens * top_k) * 4;
  if (bytes.size() - data != want)
    return bad(shown,
               "holds " + std::to_string(bytes.size() - data) + " data bytes, its shape says " + std::to_string(want));
  Routing r;
  r.tokens = tokens, r.top_k = top_k, r.source = shown;
  r.ids.resize(static_cast<size_t>(tokens * top_k));
  for (size_t i = 0; i < r.ids.size(); ++i) {
    const size_t b = data + 4 * i;
    const uint32_t v = u8(b) | (u8(b + 1) << 8) | (u8(b + 2) << 16) | (u8(b + 3) << 24);
    int32_t id;
    std::memcpy(&id, &v, 4);
    if (id < -1)
      return bad(shown, "token " + std::to_string(i / static_cast<size_t>(top_k)) + " has expert id " +
                            std::to_string(id) + " (ids are >= 0, or -1: not a local expert)");
    r.ids[i] = id;
    if (id > r.max_id) r.max_id = id;
  }
  *out = std::move(r);
  return Status();
}

Status load_routing(const std::string& spec, Routing* out) {
  if (spec.empty() || spec == "uniform" || spec == "skewed") {
    *out = Routing{};
    out->synthetic = spec == "skewed" ? core::Routing::skewed : core::Routing::uniform;
    out->source = spec.empty() ? "uniform" : spec;
    return Status();
  }
  std::string bytes, why;
  store::BoundedRead opt;
  opt.shown = spec;
  if (store::read_bounded(spec, &bytes, opt, &why) != store::ReadError::ok)
    return make_status(StatusCode::invalid_argument,
                       "routing '" + spec + "' is not uniform, skewed or a readable .npy file: " + why);
  return parse_routing_npy(bytes, spec, out);
}

Status check_routing(const Routing& r, int64_t top_k, int64_t experts) {
  if (!r.recorded()) return Status();
  if (r.top_k != top_k)
    return make_status(StatusCode::invalid_argument, "routing file " + r.source + " holds " + std::to_string(r.top_k) +
                                                         " ids per token, the problem's top_k is " +
                                                         std::to_string(top_k));
  if (r.max_id >= experts)
    return make_status(StatusCode::invalid_argument,
                       "routing file " + r.source + " has expert id " + std::to_string(r.max_id) +
                           ", the problem has E = " + std::to_string(experts) + " (ids must be < E)");
  return Status();
}

void fill_routing(const Routing& r, int32_t* ids, int64_t rows, int64_t top_k, int64_t ld, int64_t experts,
                  std::mt19937& rng) {
  if (!r.recorded() || r.top_k != top_k) {
    core::fill_expert_ids(ids, rows, top_k, ld, experts, r.synthetic, rng);
    return;
  }
  const int64_t start = static_cast<int64_t>(rng() % static_cast<uint64_t>(r.tokens));
  for (int64_t t = 0; t < rows; ++t) {
    const int32_t* src = r.ids.data() + ((start + t) % r.tokens) * top_k;
    for (int64_t j = 0; j < top_k; ++j) ids[t * ld + j] = src[j];
  }
}

}  // namespace dispatch::tune
