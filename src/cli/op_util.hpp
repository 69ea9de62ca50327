// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — the ops as the tool sees them: every op comes from
// dispatch::op_list() (its name, key fields and batch-dim name), so no
// command names an op of its own. Header-only helpers shared by tune*.cpp,
// replay.cpp and main.cpp.
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch/ops.hpp"

namespace kdispatch_cli {

/// The op called `name` in the op list, or nullptr.
inline const dispatch::OpInfo* find_op(std::string_view name) {
  for (const dispatch::OpInfo& op : dispatch::op_list())
    if (op.name == name) return &op;
  return nullptr;
}

/// "a, b and c" / "a, b or c" of `names` (`conj` between the last two).
inline std::string join_names(std::span<const std::string_view> names, std::string_view conj) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += i + 1 == names.size() ? " " + std::string(conj) + " " : std::string(", ");
    out += names[i];
  }
  return out;
}

/// Every op of the op list: "gemm, rmsnorm, ... or <last>" (conj "or").
inline std::string op_names_text(std::string_view conj = "or") {
  std::vector<std::string_view> names;
  for (const dispatch::OpInfo& op : dispatch::op_list()) names.push_back(op.name);
  return join_names(names, conj);
}

/// The key fields of `op` of one kind ("dim", "dtype", "out_dtype", "flag",
/// "stride", "accum"), in key order.
inline std::vector<const dispatch::OpKeyFieldInfo*> fields_of_kind(const dispatch::OpInfo& op, std::string_view kind) {
  std::vector<const dispatch::OpKeyFieldInfo*> out;
  for (const dispatch::OpKeyFieldInfo& f : op.key_fields)
    if (f.kind == kind) out.push_back(&f);
  return out;
}

/// The dim key fields of `op` in file-name order (SGLang's N, then K): the
/// order describe_key() writes a key of the op in, found by describing a
/// key with every dim 1.
inline std::vector<std::string_view> dims_in_file_order(const dispatch::OpInfo& op) {
  std::vector<std::string_view> dims;
  std::string probe;
  for (const dispatch::OpKeyFieldInfo& f : op.key_fields) {
    if (f.kind == "dim") {
      dims.push_back(f.name);
      probe += std::string(f.name) + "=1,";
    } else if (f.kind == "dtype") {
      probe += std::string(f.name) + "=fp32,";
    }
  }
  if (!probe.empty()) probe.pop_back();
  const auto described = dispatch::describe_key(op.name, probe, 1);
  if (!described.ok()) return dims;  // key order
  const std::string text = "," + described->key_fields;
  const auto pos = [&](std::string_view name) { return text.find("," + std::string(name) + "="); };
  std::stable_sort(dims.begin(), dims.end(), [&](std::string_view a, std::string_view b) { return pos(a) < pos(b); });
  return dims;
}

/// The columns of the misses CSV (Runtime::export_misses): op, backend,
/// device_name, dtype, out_dtype, M, the dim fields of every op (each op's
/// in file-name order, first mention first), the accumulation fields, the
/// flag fields, stride, count, key.
inline std::string misses_columns_text() {
  std::vector<std::string_view> dims, accums, flags;
  for (const dispatch::OpInfo& op : dispatch::op_list()) {
    for (std::string_view d : dims_in_file_order(op))
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) dims.push_back(d);
    for (const dispatch::OpKeyFieldInfo* f : fields_of_kind(op, "accum"))
      if (std::find(accums.begin(), accums.end(), f->name) == accums.end()) accums.push_back(f->name);
    for (const dispatch::OpKeyFieldInfo* f : fields_of_kind(op, "flag"))
      if (std::find(flags.begin(), flags.end(), f->name) == flags.end()) flags.push_back(f->name);
  }
  std::string out = "op,backend,device_name,dtype,out_dtype,M";
  for (std::string_view d : dims) out += "," + std::string(d);
  for (std::string_view f : accums) out += "," + std::string(f);
  for (std::string_view f : flags) out += "," + std::string(f);
  return out + ",stride,count,key";
}

}  // namespace kdispatch_cli
