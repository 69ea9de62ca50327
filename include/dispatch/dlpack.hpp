// SPDX-License-Identifier: Apache-2.0
// kdispatch — DLPack interop: a DLTensor (dlpack.h, Debian's libdlpack-dev)
// becomes a TensorRef without copying data. Include this header only where
// DLPack is available; the rest of the API does not need it.
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>

#include "dispatch/export.hpp"
#include "dispatch/status.hpp"
#include "dispatch/types.hpp"

namespace dispatch {

/// DLPack 1.1's type codes of the fp8 formats kdispatch has a DType for,
/// defined here because the DLPack header a build finds may predate them
/// (Debian 12's is 0.6): the values are DLPack's `kDLFloat8_e4m3fn`,
/// `kDLFloat8_e4m3fnuz` and `kDLFloat8_e5m2` (what torch exports for
/// torch.float8_e4m3fn, ...), with bits 8.
inline constexpr uint8_t kDLPackFloat8_e4m3fn = 10;
inline constexpr uint8_t kDLPackFloat8_e4m3fnuz = 11;
inline constexpr uint8_t kDLPackFloat8_e5m2 = 12;

/// Views a DLTensor as a TensorRef.
/// - data: `t.data + t.byte_offset`.
/// - dtype: kDLFloat 32 -> fp32, kDLFloat 16 -> fp16, kDLBfloat 16 -> bf16,
///   kDLInt 32 -> int32, DLPack 1.1's fp8 codes with bits 8 (above) ->
///   fp8_e4m3fn, fp8_e4m3fnuz, fp8_e5m2 (lanes must be 1).
/// - device: kDLCPU/kDLCUDAHost -> cpu, kDLCUDA -> cuda, kDLROCM -> hip, with
///   t.device.device_id as the ordinal.
/// - strides: `t.strides` in elements, or the compact row-major strides
///   when `t.strides` is null (DLPack's convention).
/// Errors: invalid_argument (null tensor, ndim > kMaxRank or < 0, a null
/// `shape` with ndim > 0, negative shape; a size, stride or byte_offset
/// that overflows: the tensor's elements, from `data + byte_offset`, must
/// lie inside the 64-bit address space, below 2^57, with every product and
/// sum computed without overflow), unsupported_problem (a dtype kdispatch
/// does not compute), unsupported_device (a device type kdispatch has no
/// backend for).
/// Thread-safe; no allocation on success.
KDISPATCH_API Result<TensorRef> from_dlpack(const DLTensor* t) noexcept;

/// The kdispatch device of a DLPack device: kDLCPU and kDLCUDAHost the host
/// (ordinal 0), kDLCUDA CUDA, kDLROCM HIP. Errors: unsupported_device for
/// any other device type.
KDISPATCH_API Result<Device> device_from_dlpack(DLDevice d) noexcept;

}  // namespace dispatch
