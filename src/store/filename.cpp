// SPDX-License-Identifier: Apache-2.0
#include "store/filename.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "core/op_spec.hpp"
#include "table/key.hpp"

namespace dispatch::store {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits on ',' at bracket depth 0. Returns false on unbalanced brackets.
bool split_fields(std::string_view text, std::vector<std::string_view>* parts) {
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) return false;
    if (c == ',' && depth == 0) {
      parts->push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) return false;
  parts->push_back(text.substr(start));
  return true;
}

Result<Fields> parse_fields_impl(std::string_view text, bool allow_device_name, std::string* device_name,
                                 bool* has_device_name) {
  std::vector<std::string_view> parts;
  if (!split_fields(text, &parts))
    return make_status(StatusCode::invalid_argument, "unbalanced '[' ']' in '" + std::string(text) + "'");
  Fields fields;
  bool any_eq = false;
  for (std::string_view part : parts) {
    part = trim(part);
    const auto eq = part.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      if (part.empty()) return make_status(StatusCode::invalid_argument, "empty field in '" + std::string(text) + "'");
      return make_status(StatusCode::invalid_argument, "field '" + std::string(part) + "' is not <name>=<value>");
    }
    any_eq = true;
    std::string name(trim(part.substr(0, eq)));
    std::string_view value = trim(part.substr(eq + 1));
    if (name == "device_name") {
      if (!allow_device_name)
        return make_status(StatusCode::invalid_argument,
                           "device_name is not a key field here: pass the device separately");
      if (*has_device_name) return make_status(StatusCode::invalid_argument, "field 'device_name' appears twice");
      *has_device_name = true;
      *device_name = std::string(value);
      continue;
    }
    for (const auto& f : fields)
      if (f.first == name) return make_status(StatusCode::invalid_argument, "field '" + name + "' appears twice");
    fields.emplace_back(name, canonical_field_value(name, value));
  }
  if (!any_eq)
    return make_status(StatusCode::invalid_argument, "no <name>=<value> fields in '" + std::string(text) + "'");
  sort_fields(fields);
  return fields;
}

}  // namespace

std::string canonical_field_value(std::string_view name, std::string_view value) {
  std::string out;
  out.reserve(value.size());
  const bool squeeze = !value.empty() && value.front() == '[';
  for (char c : value) {
    if (squeeze && std::isspace(static_cast<unsigned char>(c))) continue;
    out += c;
  }
  (void)name;
  return out;
}

void sort_fields(Fields& fields) {
  std::sort(fields.begin(), fields.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
}

std::string join_fields(const Fields& fields) {
  std::string s;
  for (const auto& [k, v] : fields) {
    if (!s.empty()) s += ',';
    s += k;
    s += '=';
    s += v;
  }
  return s;
}

const std::string* find_field(const Fields& fields, std::string_view name) noexcept {
  for (const auto& f : fields)
    if (f.first == name) return &f.second;
  return nullptr;
}

Result<FileKey> parse_file_name(std::string_view base) noexcept {
  try {
    constexpr std::string_view kExt = ".json";
    if (base.size() <= kExt.size() || base.substr(base.size() - kExt.size()) != kExt)
      return make_status(StatusCode::invalid_argument, "not a .json file");
    base.remove_suffix(kExt.size());
    FileKey key;
    constexpr std::string_view kDown = "_down";
    if (base.size() > kDown.size() && base.substr(base.size() - kDown.size()) == kDown) {
      key.down = true;
      base.remove_suffix(kDown.size());
    }
    auto fields = parse_fields_impl(base, true, &key.device_name, &key.has_device_name);
    if (!fields.ok()) return fields.status();
    key.fields = std::move(fields.value());
    return key;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "parsing a file name");
  }
}

Result<Fields> parse_key_fields(std::string_view text) noexcept {
  try {
    std::string dev;
    bool has = false;
    if (trim(text).empty()) return make_status(StatusCode::invalid_argument, "empty key");
    return parse_fields_impl(text, false, &dev, &has);
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "parsing a key");
  }
}

bool parse_version_string(std::string_view text, std::vector<int>* version) {
  // Strict: "3.5.1" -> {3,5,1}; "3..1", "3.5.", "3.5.1a" are refused.
  version->clear();
  size_t start = 0;
  while (true) {
    size_t dot = text.find('.', start);
    if (dot == std::string_view::npos) dot = text.size();
    std::string_view part = text.substr(start, dot - start);
    int v = 0;
    auto r = std::from_chars(part.data(), part.data() + part.size(), v);
    if (part.empty() || r.ec != std::errc() || r.ptr != part.data() + part.size()) return false;
    version->push_back(v);
    if (dot == text.size()) break;
    start = dot + 1;
  }
  return !version->empty();
}

bool parse_runtime_version(std::string_view text, std::vector<int>* version) {
  // triton.__version__ on nightlies and release candidates carries a suffix
  // ("3.4.0+git1234", "3.5.0rc1", "3.6.0-dev"): the dotted numeric part
  // serves; the suffix must start with '+', '-' or a letter.
  size_t end = 0;
  while (end < text.size() && ((text[end] >= '0' && text[end] <= '9') || text[end] == '.')) ++end;
  if (end < text.size()) {
    const char c = text[end];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (!(c == '+' || c == '-' || letter)) return false;
  }
  return parse_version_string(text.substr(0, end), version);
}

bool parse_version_folder(std::string_view dirname, std::vector<int>* version) {
  constexpr std::string_view kPrefix = "triton_";
  if (dirname.substr(0, kPrefix.size()) != kPrefix) return false;
  std::string dotted(dirname.substr(kPrefix.size()));
  std::replace(dotted.begin(), dotted.end(), '_', '.');
  return parse_version_string(dotted, version);
}

namespace {

bool parse_int_field(const std::string& v, int64_t* out) {
  if (v.empty()) return false;
  auto r = std::from_chars(v.data(), v.data() + v.size(), *out);
  return r.ec == std::errc() && r.ptr == v.data() + v.size() && *out >= 1 && *out <= core::kMaxDim;
}

// The operands the stride field covers: every one of the spec's order.
int stride_operands(const core::OpSpec& spec) { return static_cast<int>(spec.order.size()); }

// "01_o1_o1" -> stride code; operands in op order (gemm a,b,d,bias; norms
// x,y|residual,w), one class per dim (a rank-3 operand: its matrices' two).
bool parse_stride_field(const std::string& v, const core::OpSpec& spec, uint64_t* code) {
  const int operands = stride_operands(spec);
  uint8_t classes[core::kMaxArgs][2] = {};
  int8_t ranks[core::kMaxArgs] = {};
  int i = 0;
  size_t start = 0;
  while (start <= v.size()) {
    size_t us = v.find('_', start);
    if (us == std::string::npos) us = v.size();
    const std::string part = v.substr(start, us - start);
    if (i >= operands || part.empty() || part.size() > 2) return false;
    ranks[i] = spec.slots[static_cast<size_t>(spec.order[static_cast<size_t>(i)])].rank;
    // One class per dim of the operand (spec order): "1_1" fits no rank-2 operand.
    if (part.size() != (ranks[i] >= 2 ? 2u : 1u)) return false;
    for (size_t d = 0; d < part.size(); ++d) {
      const char c = part[d];
      if (c == '0')
        classes[i][d] = static_cast<uint8_t>(StrideClass::zero);
      else if (c == '1')
        classes[i][d] = static_cast<uint8_t>(StrideClass::unit);
      else if (c == 'o')
        classes[i][d] = static_cast<uint8_t>(StrideClass::other);
      else
        return false;
    }
    ++i;
    start = us + 1;
    if (us == v.size()) break;
  }
  if (i != operands) return false;
  *code = table::pack_stride_code(classes, ranks, operands);
  return true;
}

}  // namespace

Result<core::Problem> own_problem_from_fields(core::OpKind op, const Fields& fields) noexcept {
  try {
    using core::FieldKind;
    const core::OpSpec& spec = core::spec_of(op);
    core::Problem p;
    p.op = op;
    // An op whose input and output dtypes are fixed (moe_align's int32 ids)
    // has no dtype field: its slots' dtypes.
    if (const core::ArgSlot& in = spec.slots[static_cast<size_t>(spec.in_dtype_slot)];
        in.dtype == core::SlotDType::fixed)
      p.in_dtype = in.fixed_dtype;
    if (const core::ArgSlot& o = spec.slots[static_cast<size_t>(spec.out_dtype_slot)];
        o.dtype == core::SlotDType::fixed)
      p.out_dtype = o.fixed_dtype;
    uint32_t have = 0;  // bit per spec field
    for (const auto& [name, value] : fields) {
      size_t fi = 0;
      while (fi < spec.fields.size() && spec.fields[fi].name != name) ++fi;
      if (fi == spec.fields.size())
        return make_status(StatusCode::invalid_argument,
                           "unknown field '" + name + "' for op " + std::string(core::op_name(op)));
      const core::KeyField& f = spec.fields[fi];
      have |= 1u << fi;
      switch (f.kind) {
        case FieldKind::dim: {
          int64_t v = 0;
          if (!parse_int_field(value, &v))
            return make_status(StatusCode::invalid_argument,
                               "field " + name + "='" + value + "' is not an integer in [1, 2^40]");
          core::set_dim(p, f.dim, v);
          break;
        }
        case FieldKind::in_dtype:
        case FieldKind::out_dtype: {
          auto t = parse_dtype(value);
          if (!t.ok()) return make_status(StatusCode::invalid_argument, name + ": " + t.status().message());
          (f.kind == FieldKind::in_dtype ? p.in_dtype : p.out_dtype) = *t;
          break;
        }
        case FieldKind::flag:
          if (f.flag_text != "true") {
            // A flag with its own text (block_shape=[128,128]): that text, or false.
            if (value == "false" || value == "False") break;
            if (value != f.flag_text)
              return make_status(StatusCode::invalid_argument, "field " + name + "='" + value + "' is not " +
                                                                   std::string(f.flag_text) + " (the only one served)");
            p.has_bias = true;
            break;
          }
          if (value != "true" && value != "false" && value != "True" && value != "False")
            return make_status(StatusCode::invalid_argument, "field " + name + "='" + value + "' is not true/false");
          p.has_bias = value == "true" || value == "True";
          break;
        case FieldKind::choice: {
          const core::ScalarSlot* c = nullptr;
          for (const core::ScalarSlot& sc : spec.scalars)
            if (sc.kind == core::ScalarKind::choice) c = &sc;
          size_t li = 0;
          while (c && li < c->labels.size() && c->labels[li] != value) ++li;
          if (!c || li == c->labels.size()) {
            std::string all;
            for (size_t j = 0; c && j < c->labels.size(); ++j) all += (j ? ", " : "") + std::string(c->labels[j]);
            return make_status(StatusCode::invalid_argument, "field " + name + "='" + value + "' is not one of " + all);
          }
          p.choice = static_cast<uint8_t>(li);
          break;
        }
        case FieldKind::accum:
          if (value != "fast" && value != "precise")
            return make_status(StatusCode::invalid_argument, "field " + name + "='" + value + "' is not fast/precise");
          p.accum = value == "fast" ? core::Accum::fast : core::Accum::precise;
          break;
        case FieldKind::stride:
          if (!parse_stride_field(value, spec, &p.stride_code))
            return make_status(StatusCode::invalid_argument,
                               "field " + name + "='" + value + "' is not " + std::to_string(stride_operands(spec)) +
                                   " operands of classes [01o] joined by '_', one class per dim of each");
          break;
      }
    }
    bool out_given = false;
    std::vector<const core::KeyField*> dims;  // the dim fields, in file-name order
    for (size_t fi = 0; fi < spec.fields.size(); ++fi) {
      const core::KeyField& f = spec.fields[fi];
      const bool given = (have >> fi) & 1u;
      if (f.kind == FieldKind::in_dtype && !given)
        return make_status(StatusCode::invalid_argument, "missing field " + std::string(f.name));
      if (f.kind == FieldKind::out_dtype) out_given = given;
      if (f.kind == FieldKind::dim) dims.push_back(&f);
    }
    std::stable_sort(dims.begin(), dims.end(),
                     [](const core::KeyField* a, const core::KeyField* b) { return a->file_pos < b->file_pos; });
    std::string missing, all;
    for (const core::KeyField* f : dims) {
      all += (all.empty() ? "" : " or ") + std::string(f->name);
      if (core::dim_value(p, f->dim) == 0) missing = f->name;
    }
    if (!missing.empty()) return make_status(StatusCode::invalid_argument, "missing field " + all);
    if (!out_given) p.out_dtype = p.in_dtype;
    return p;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "parsing key fields");
  }
}

std::string own_file_name(core::OpKind op, std::string_view fields, std::string_view device_name) {
  return file_order_fields(op, fields, device_name) + ".json";
}

std::string file_order_fields(core::OpKind op, std::string_view fields, std::string_view device_name) {
  // The spec's fields with a file position first (SGLang's N=...,K=...),
  // then device_name, then the rest in key (name) order.
  const core::OpSpec& spec = core::spec_of(op);
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= fields.size()) {
    size_t comma = fields.find(',', start);
    if (comma == std::string_view::npos) comma = fields.size();
    if (comma > start) parts.emplace_back(fields.substr(start, comma - start));
    start = comma + 1;
  }
  auto pos = [&](const std::string& part) -> int {
    const std::string_view name = std::string_view(part).substr(0, part.find('='));
    for (const core::KeyField& f : spec.fields)
      if (f.name == name) return f.file_pos;
    return -1;
  };
  std::string head, tail;
  std::vector<std::pair<int, std::string>> front;
  for (const auto& part : parts) {
    const int p = pos(part);
    if (p >= 0)
      front.emplace_back(p, part);
    else
      tail += "," + part;
  }
  std::stable_sort(front.begin(), front.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [p, part] : front) head += (head.empty() ? "" : ",") + part;
  if (!device_name.empty()) head += (head.empty() ? "" : ",") + std::string("device_name=") + std::string(device_name);
  if (head.empty() && !tail.empty()) tail.erase(0, 1);
  return head + tail;
}

}  // namespace dispatch::store
