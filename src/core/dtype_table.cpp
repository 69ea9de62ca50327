// SPDX-License-Identifier: Apache-2.0
#include "core/dtype_table.hpp"

#include <vector>

namespace dispatch::core {
namespace {

// "a, b, c<last>d": items joined with ", ", the last one with `last`.
std::string prose_list(const std::vector<std::string>& items, std::string_view last) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) s += i + 1 == items.size() ? last : std::string_view(", ");
    s += items[i];
  }
  return s;
}

}  // namespace

std::string dtype_names_text() {
  std::vector<std::string> names;
  for (const DTypeInfo& d : kDTypes) names.emplace_back(d.name);
  return prose_list(names, " or ");
}

std::string dlpack_dtypes_text() {
  std::vector<std::string> items;
  std::string codes;
  unsigned fp8_bits = 0;
  for (const DTypeInfo& d : kDTypes) {
    if (d.codec != HostCodec::fp8) {
      items.emplace_back(d.name);
      continue;
    }
    codes += (codes.empty() ? "" : ", ") + std::to_string(d.dlpack.code);
    fp8_bits = d.dlpack.bits;
  }
  if (!codes.empty())
    items.push_back("an fp8 format (DLPack 1.1 codes " + codes + " with bits " + std::to_string(fp8_bits) + ")");
  return prose_list(items, " or ");
}

std::string device_decoded_dtypes_text() {
  std::vector<std::string> names;
  for (const DTypeInfo& d : kDTypes)
    if (d.device != DeviceDecode::none) names.emplace_back(d.name);
  return prose_list(names, " and ");
}

}  // namespace dispatch::core
