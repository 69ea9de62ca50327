// SPDX-License-Identifier: Apache-2.0
// kdispatch — element types, devices and the tensor reference every op takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dispatch/export.hpp"
#include "dispatch/status.hpp"

namespace dispatch {

/// Element type of a tensor. The spelling used in config file names and
/// in `--key` is `dtype_name()`: "fp32", "fp16", "bf16", ...
/// The fp8 formats are the fp8 GEMMs' and fused_moe's weights and the
/// quantisation ops' outputs; int32 is the MoE ops' expert ids and sorted
/// ids (fused_moe, moe_align). An op refuses a dtype it does not take as an
/// unsupported problem or an invalid argument naming the argument.
enum class DType : uint8_t {
  fp32 = 0,          ///< IEEE binary32, 4 bytes.
  fp16 = 1,          ///< IEEE binary16, 2 bytes.
  bf16 = 2,          ///< bfloat16 (8-bit exponent, 7-bit mantissa), 2 bytes.
  fp8_e4m3fn = 3,    ///< fp8 e4m3, finite (no inf; NaN 0x7f/0xff), bias 7, 1 byte (Hopper's, torch.float8_e4m3fn).
  fp8_e4m3fnuz = 4,  ///< fp8 e4m3, finite, no negative zero, bias 8, 1 byte (gfx94x's, torch.float8_e4m3fnuz).
  fp8_e5m2 = 5,      ///< fp8 e5m2 (IEEE-like, with inf), 1 byte (torch.float8_e5m2).
  int32 = 6,         ///< two's complement 32-bit integer, 4 bytes.
};
inline constexpr int kDTypeCount = 7;

/// "fp32" | "fp16" | "bf16" | "fp8_e4m3fn" | "fp8_e4m3fnuz" | "fp8_e5m2" | "int32".
KDISPATCH_API std::string_view dtype_name(DType t) noexcept;
/// Size of one element in bytes (4, 2 or 1).
KDISPATCH_API std::size_t dtype_size(DType t) noexcept;
/// Parses "fp32"/"float32"/"float"/"f32", "fp16"/"float16"/"half"/"f16",
/// "bf16"/"bfloat16", the fp8 names above (also "float8_e4m3fn", ... as
/// torch spells them) and "int32". Errors: invalid_argument naming the text.
KDISPATCH_API Result<DType> parse_dtype(std::string_view text) noexcept;

/// Which backend owns a pointer. Follows DLPack's device types in spirit:
/// the backend is chosen by the tensor's device, never by availability, so a
/// CUDA tensor is never run on the CPU.
enum class DeviceType : uint8_t {
  cpu = 0,   ///< host memory
  cuda = 1,  ///< NVIDIA GPU memory (DLPack kDLCUDA)
  hip = 2,   ///< AMD GPU memory (DLPack kDLROCM)
};
/// The number of DeviceType values (0 .. kDeviceTypeCount - 1).
inline constexpr int kDeviceTypeCount = 3;
/// "cpu" | "cuda" | "hip".
KDISPATCH_API std::string_view device_type_name(DeviceType t) noexcept;
/// The DeviceType named `name` ("cpu", "cuda", "hip"). Errors:
/// invalid_argument naming the text.
KDISPATCH_API Result<DeviceType> parse_device_type(std::string_view name) noexcept;

/// A device: backend type and ordinal (0 for the host).
struct Device {
  DeviceType type = DeviceType::cpu;
  int32_t ordinal = 0;
  friend constexpr bool operator==(Device a, Device b) noexcept { return a.type == b.type && a.ordinal == b.ordinal; }
};

/// Largest rank a TensorRef holds. The ops use rank 1 (weights, bias) and
/// rank 2 (activations, matrices).
inline constexpr int kMaxRank = 4;

/// A non-owning view of a strided tensor: what every op takes.
///
/// - `data` points at element [0,...,0] (byte offsets already applied).
/// - `shape[i]` and `strides[i]` for i < rank; strides are in *elements*,
///   not bytes (as torch and DLPack), and may be 0 (broadcast). A tensor
///   with a dim of 0 spans no memory: its strides are not checked. One
///   whose strides span more than 2^60 elements is refused
///   (invalid_argument naming it), never wrapped.
/// - The tensor is not owned; it must stay valid for the duration of the
///   call (for GPU backends: until the work queued on the stream is done).
///
/// Plain struct, trivially copyable, so a C ABI or a PyTorch custom op can
/// fill it without a copy of the data. Build one with `make_tensor` /
/// `make_tensor_2d` or from a DLPack DLTensor (dispatch/dlpack.hpp).
struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::fp32;
  int32_t rank = 0;
  int64_t shape[kMaxRank] = {0, 0, 0, 0};
  int64_t strides[kMaxRank] = {0, 0, 0, 0};
  Device device{};

  /// True when `data` is null (an absent optional argument, such as no bias).
  bool empty() const noexcept { return data == nullptr; }
};

/// A contiguous rank-1 tensor of `n` elements.
KDISPATCH_API TensorRef make_tensor_1d(void* data, DType dtype, int64_t n, Device device = {}) noexcept;
/// A rank-2 tensor [rows, cols] with row stride `row_stride` elements
/// (>= cols; pass cols for a contiguous matrix) and unit column stride.
KDISPATCH_API TensorRef make_tensor_2d(void* data, DType dtype, int64_t rows, int64_t cols, int64_t row_stride,
                                       Device device = {}) noexcept;

/// Stride class of one dimension, as it enters the lookup key: 0 (broadcast),
/// 1 (unit) or other. Dimensions of size 1 take the class the contiguous
/// layout would give them, so the key does not change with a dynamic M of 1.
enum class StrideClass : uint8_t { zero = 0, unit = 1, other = 2 };

/// Stream handle: a cudaStream_t or hipStream_t cast to void*, or nullptr
/// for the default stream. Ignored by the CPU backend, which runs the work on
/// the calling thread before returning.
struct Stream {
  void* handle = nullptr;
};

}  // namespace dispatch
