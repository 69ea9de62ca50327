// SPDX-License-Identifier: Apache-2.0
#include <string>

#include "core/op.hpp"
#include "dispatch/config.hpp"
#include "dispatch/types.hpp"

namespace dispatch {

std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::fp32: return "fp32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

std::size_t dtype_size(DType t) noexcept { return t == DType::fp32 ? 4 : 2; }

Result<DType> parse_dtype(std::string_view s) noexcept {
  if (s == "fp32" || s == "float32" || s == "float" || s == "f32") return DType::fp32;
  if (s == "fp16" || s == "float16" || s == "half" || s == "f16") return DType::fp16;
  if (s == "bf16" || s == "bfloat16") return DType::bf16;
  return make_status(StatusCode::invalid_argument,
                     "unknown dtype '" + std::string(s) + "' (expected fp32, fp16 or bf16)");
}

std::string_view device_type_name(DeviceType t) noexcept {
  switch (t) {
    case DeviceType::cpu: return "cpu";
    case DeviceType::cuda: return "cuda";
    case DeviceType::hip: return "hip";
  }
  return "?";
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

std::string_view op_name(OpKind op) noexcept {
  switch (op) {
    case OpKind::gemm: return "gemm";
    case OpKind::rmsnorm: return "rmsnorm";
    case OpKind::fused_add_rmsnorm: return "fused_add_rmsnorm";
  }
  return "?";
}

std::optional<OpKind> parse_op(std::string_view name) noexcept {
  if (name == "gemm") return OpKind::gemm;
  if (name == "rmsnorm") return OpKind::rmsnorm;
  if (name == "fused_add_rmsnorm") return OpKind::fused_add_rmsnorm;
  return std::nullopt;
}

}  // namespace core
}  // namespace dispatch
