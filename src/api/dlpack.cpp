// SPDX-License-Identifier: Apache-2.0
#include "dispatch/dlpack.hpp"

#include <string>

namespace dispatch {

Result<Device> device_from_dlpack(DLDevice d) noexcept {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost: return Device{DeviceType::cpu, 0};
    case kDLCUDA: return Device{DeviceType::cuda, d.device_id};
    case kDLROCM: return Device{DeviceType::hip, d.device_id};
    default:
      return make_status(StatusCode::unsupported_device,
                         "DLTensor device type " + std::to_string(static_cast<int>(d.device_type)) +
                             " has no kdispatch backend");
  }
}

Result<TensorRef> from_dlpack(const DLTensor* t) noexcept {
  if (t == nullptr) return make_status(StatusCode::invalid_argument, "DLTensor is null");
  if (t->ndim < 0 || t->ndim > kMaxRank)
    return make_status(StatusCode::invalid_argument,
                       "DLTensor ndim " + std::to_string(t->ndim) + " is outside 0.." + std::to_string(kMaxRank));
  TensorRef r;
  if (t->dtype.lanes != 1)
    return make_status(StatusCode::unsupported_problem, "DLTensor dtype lanes must be 1");
  if (t->dtype.code == kDLFloat && t->dtype.bits == 32) r.dtype = DType::fp32;
  else if (t->dtype.code == kDLFloat && t->dtype.bits == 16) r.dtype = DType::fp16;
  else if (t->dtype.code == kDLBfloat && t->dtype.bits == 16) r.dtype = DType::bf16;
  else if (t->dtype.code == kDLInt && t->dtype.bits == 32) r.dtype = DType::int32;
  else if (t->dtype.code == kDLPackFloat8_e4m3fn && t->dtype.bits == 8) r.dtype = DType::fp8_e4m3fn;
  else if (t->dtype.code == kDLPackFloat8_e4m3fnuz && t->dtype.bits == 8) r.dtype = DType::fp8_e4m3fnuz;
  else if (t->dtype.code == kDLPackFloat8_e5m2 && t->dtype.bits == 8) r.dtype = DType::fp8_e5m2;
  else
    return make_status(StatusCode::unsupported_problem,
                       "DLTensor dtype (code " + std::to_string(t->dtype.code) + ", bits " +
                           std::to_string(t->dtype.bits) +
                           ") is not fp32, fp16, bf16, int32 or an fp8 format (DLPack 1.1 codes 10, 11, 12 with bits 8)" +
                           (t->dtype.code == kDLUInt && t->dtype.bits == 8
                                ? std::string("; fp8 data in a uint8 array needs its format named (Python: "
                                              "kdispatch.fp8(array, \"e4m3fn\"))")
                                : std::string()));
  auto dev = device_from_dlpack(t->device);
  if (!dev.ok()) return dev.status();
  r.device = *dev;
  r.rank = t->ndim;
  int64_t stride = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] < 0) return make_status(StatusCode::invalid_argument, "DLTensor has a negative shape");
    r.shape[i] = t->shape[i];
    r.strides[i] = t->strides ? t->strides[i] : stride;
    stride *= t->shape[i];
  }
  r.data = t->data ? static_cast<char*>(t->data) + t->byte_offset : nullptr;
  return r;
}

}  // namespace dispatch
