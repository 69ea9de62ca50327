// SPDX-License-Identifier: Apache-2.0
#include <string>

#include "core/dtype_table.hpp"
#include "core/op.hpp"
#include "dispatch/config.hpp"
#include "dispatch/types.hpp"

namespace dispatch {

std::string_view dtype_name(DType t) noexcept {
  const core::DTypeInfo* d = core::find_dtype(t);
  return d ? d->name : std::string_view("?");
}

std::size_t dtype_size(DType t) noexcept { return core::dtype_bytes(t); }

Result<DType> parse_dtype(std::string_view s) noexcept {
  if (const core::DTypeInfo* d = core::find_dtype(s)) return d->type;
  return make_status(StatusCode::invalid_argument,
                     "unknown dtype '" + std::string(s) + "' (expected " + core::dtype_names_text() + ")");
}

std::string_view device_type_name(DeviceType t) noexcept {
  static constexpr std::string_view kNames[kDeviceTypeCount] = {"cpu", "cuda", "hip"};  // in DeviceType order
  const auto i = static_cast<size_t>(t);
  return i < std::size(kNames) ? kNames[i] : "?";
}

Result<DeviceType> parse_device_type(std::string_view name) noexcept {
  for (int i = 0; i < kDeviceTypeCount; ++i)
    if (device_type_name(static_cast<DeviceType>(i)) == name) return static_cast<DeviceType>(i);
  return make_status(StatusCode::invalid_argument,
                     "unknown backend '" + std::string(name) + "' (expected cpu, cuda or hip)");
}

TensorRef make_tensor_1d(void* data, DType dtype, int64_t n, Device device) noexcept {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.rank = 1;
  t.shape[0] = n;
  t.strides[0] = 1;
  t.device = device;
  return t;
}

TensorRef make_tensor_2d(void* data, DType dtype, int64_t rows, int64_t cols, int64_t row_stride,
                         Device device) noexcept {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.rank = 2;
  t.shape[0] = rows;
  t.shape[1] = cols;
  t.strides[0] = row_stride;
  t.strides[1] = 1;
  t.device = device;
  return t;
}

const ConfigValue* config_find(const Config& config, std::string_view name) noexcept {
  for (const auto& [k, v] : config)
    if (k == name) return &v;
  return nullptr;
}

std::string_view file_state_name(FileReport::State s) noexcept {
  switch (s) {
    case FileReport::State::loaded: return "loaded";
    case FileReport::State::partial: return "partial";
    case FileReport::State::skipped: return "skipped";
  }
  return "?";
}

bool LoadReport::all_usable() const noexcept {
  for (const auto& f : files)
    if (f.state == FileReport::State::skipped) return false;
  return true;
}

namespace core {

namespace {
#define KD_OP_NAME(name, args, tensors, scalars) #name,
constexpr std::string_view kOpNames[] = {KDISPATCH_OP_LIST(KD_OP_NAME)};
#undef KD_OP_NAME
}  // namespace

std::string_view op_name(OpKind op) noexcept {
  const auto i = static_cast<size_t>(op);
  return i < std::size(kOpNames) ? kOpNames[i] : std::string_view("?");
}

std::optional<OpKind> parse_op(std::string_view name) noexcept {
  for (size_t i = 0; i < std::size(kOpNames); ++i)
    if (kOpNames[i] == name) return static_cast<OpKind>(i);
  return std::nullopt;
}

Status validate_variant(const VariantDef& v, int arg_slots, std::string_view (*names)(int)) noexcept {
  try {
    const std::string vn(v.name);
    if (v.name.empty()) return make_status(StatusCode::invalid_argument, "a variant has no name");
    if (!v.launch || !v.supports)
      return make_status(StatusCode::invalid_argument, "variant " + vn + " has no launch or supports function");
    if (v.params.size() > static_cast<size_t>(kMaxParams))
      return make_status(StatusCode::invalid_argument, "variant " + vn + " has more than 8 params");
    for (const ParamDef& pd : v.params) {
      bool has_default = false;
      for (int64_t x : pd.values) has_default |= x == pd.default_value;
      if (pd.values.empty() || !has_default)
        return make_status(StatusCode::invalid_argument, "variant " + vn + " param " + std::string(pd.name) +
                                                             ": empty space or default not in its space");
      if (pd.kind == ParamKind::enumeration)
        for (int64_t x : pd.values)
          if (x < 0 || static_cast<size_t>(x) >= pd.labels.size())
            return make_status(StatusCode::invalid_argument,
                               "variant " + vn + " param " + std::string(pd.name) + ": value without a label");
    }
    const uint32_t both = v.restore_args & v.reset_args;
    if (both != 0) {
      int slot = 0;
      while (!(both & (1u << slot))) ++slot;
      const std::string an = names ? std::string(names(slot)) : "#" + std::to_string(slot);
      return make_status(StatusCode::invalid_argument,
                         "variant " + vn + " declares argument '" + an +
                             "' both restore_value and reset_to_zero (choose one: an argument is either "
                             "restored to its value or zeroed before each run)");
    }
    const uint32_t all = arg_slots >= 32 ? ~0u : ((1u << arg_slots) - 1);
    if ((v.restore_args | v.reset_args) & ~all)
      return make_status(StatusCode::invalid_argument,
                         "variant " + vn + " declares a role for an argument slot the op does not have");
    return Status();
  } catch (...) {
    return Status(StatusCode::out_of_memory, std::string());
  }
}

}  // namespace core
}  // namespace dispatch
