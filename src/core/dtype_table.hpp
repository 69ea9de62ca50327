// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the dtype table: one row per DType, the single source
// every layer reads for what a dtype is: its names (dtype_name, parse_dtype
// and the errors that list dtypes), its element size, its DLPack type, how
// the host decodes an element (the search's checks) and how the device
// compare does (or declines to), the poison pattern the search writes into
// pure outputs before a validation run, and how the tuner fills scratch
// inputs of it.
//
// Plain constexpr C++ (std::string_view, no std::string, no DLPack header),
// usable from CUDA/HIP host code. A new DType is one new row here (and its
// enumerator and kDTypeCount in dispatch/types.hpp); the static_asserts below
// and tests/test_dtype_table.cpp refuse a table that is out of step.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>

#include "core/numeric.hpp"
#include "dispatch/types.hpp"

namespace dispatch::core {

/// How the host decodes an element's bits to a number (decode_bits: the
/// search's checks, the device compare's report of a mismatch) and encodes
/// a float into them (encode_value: the tuner's scratch).
enum class HostCodec : uint8_t {
  f32,   ///< IEEE binary32: the bits as a float
  bf16,  ///< bf16_to_float / float_to_bf16 (core/numeric.hpp)
  f16,   ///< fp16_to_float / float_to_fp16
  fp8,   ///< fp8_to_float / float_to_fp8 (saturating) with the row's Fp8Format
  i32,   ///< two's complement 32-bit integer (exact in a double)
};

/// What the GPU compare kernels (DeviceMemory::compare on the device) do
/// with an output of a dtype: decode it to float (the value tells the kernel
/// how; it switches on it) or decline it (none: the search compares on the
/// host). Numbered so that a kernel may take it as an int.
enum class DeviceDecode : uint8_t {
  none = 0,  ///< not decoded on the device: compared on the host
  f32 = 1,   ///< 4-byte elements, the bits as a float
  bf16 = 2,  ///< 2-byte elements, the bits << 16 as a float
  f16 = 3,   ///< 2-byte elements, IEEE binary16
};

/// How the tuner fills a scratch input of a dtype (tune/tuner.cpp). The
/// range of a value fill is the slot's (core::Fill: signed_unit [-1, 1),
/// near_one 1 ± 0.1, wide [-4, 4)), one uniform draw per element.
enum class ScratchFill : uint8_t {
  value,       ///< the slot's value, encoded by the row's codec (fp8: saturating)
  index_mod8,  ///< element i holds i % 8 (ids: in range for any op; the draw is still made)
};

/// DLPack's type codes as numbers (dlpack.h's DLDataTypeCode; the fp8 ones
/// are DLPack 1.1's): the table carries no DLPack header, and
/// api/dlpack.cpp checks these against the one it builds with.
inline constexpr uint8_t kDLPackCodeInt = 0;
inline constexpr uint8_t kDLPackCodeFloat = 2;
inline constexpr uint8_t kDLPackCodeBfloat = 4;
inline constexpr uint8_t kDLPackCodeFloat8_e4m3fn = 10;
inline constexpr uint8_t kDLPackCodeFloat8_e4m3fnuz = 11;
inline constexpr uint8_t kDLPackCodeFloat8_e5m2 = 12;

/// A DLPack DLDataType: code, bits, lanes.
struct DLPackType {
  uint8_t code = 0;
  uint8_t bits = 0;
  uint16_t lanes = 1;
};

/// The most aliases a row has (parse_dtype's other spellings).
inline constexpr int kMaxDTypeAliases = 3;

/// One dtype.
struct DTypeInfo {
  DType type = DType::fp32;
  std::string_view name;                       ///< canonical: dtype_name(), file names, keys
  std::string_view aliases[kMaxDTypeAliases];  ///< the other spellings parse_dtype accepts (empty: unused)
  uint8_t bytes = 0;                           ///< element size (dtype_size)
  DLPackType dlpack;                           ///< from_dlpack's mapping (lanes 1)
  HostCodec codec = HostCodec::f32;            ///< host decode / encode
  Fp8Format fp8;                               ///< the fp8 format (codec fp8 only)
  DeviceDecode device = DeviceDecode::none;    ///< the device compare's decode
  uint32_t poison = 0;                         ///< the search's poison pattern, in the first `bytes` bytes
  ScratchFill scratch = ScratchFill::value;    ///< the tuner's scratch fill
};

// Poison patterns (tune::kPoison*): signalling NaNs with a payload no
// arithmetic yields (arithmetic on a signalling NaN returns a quiet one), so
// a pattern left in an output after a run means the element was never
// written. fp8 outputs are not poisoned exactly: 0x7f is a NaN of e4m3fn and
// e5m2 but e4m3fnuz's largest finite value (240). int32 takes fp32's bits.
inline constexpr uint32_t kPoisonFp32Bits = 0x7FBADBADu;  // exponent all ones, quiet bit clear
inline constexpr uint32_t kPoisonBf16Bits = 0x7FBDu;      // bf16: exponent all ones, quiet bit clear
inline constexpr uint32_t kPoisonFp16Bits = 0x7D5Bu;      // fp16: exponent all ones, quiet bit clear
inline constexpr uint32_t kPoisonFp8Bits = 0x7Fu;

/// The table, in DType order (row i describes DType i). Columns: type,
/// name, aliases, bytes, DLPack (code, bits, lanes), host codec, fp8 format,
/// device decode, poison, scratch fill.
// clang-format off
inline constexpr DTypeInfo kDTypes[] = {
  {DType::fp32,         "fp32",         {"float32", "float", "f32"},       4, {kDLPackCodeFloat, 32, 1},
   HostCodec::f32,  {},        DeviceDecode::f32,  kPoisonFp32Bits, ScratchFill::value},
  {DType::fp16,         "fp16",         {"float16", "half", "f16"},        2, {kDLPackCodeFloat, 16, 1},
   HostCodec::f16,  {},        DeviceDecode::f16,  kPoisonFp16Bits, ScratchFill::value},
  {DType::bf16,         "bf16",         {"bfloat16"},                      2, {kDLPackCodeBfloat, 16, 1},
   HostCodec::bf16, {},        DeviceDecode::bf16, kPoisonBf16Bits, ScratchFill::value},
  {DType::fp8_e4m3fn,   "fp8_e4m3fn",   {"float8_e4m3fn", "e4m3fn"},       1, {kDLPackCodeFloat8_e4m3fn, 8, 1},
   HostCodec::fp8,  kE4m3fn,   DeviceDecode::none, kPoisonFp8Bits,  ScratchFill::value},
  {DType::fp8_e4m3fnuz, "fp8_e4m3fnuz", {"float8_e4m3fnuz", "e4m3fnuz"},   1, {kDLPackCodeFloat8_e4m3fnuz, 8, 1},
   HostCodec::fp8,  kE4m3fnuz, DeviceDecode::none, kPoisonFp8Bits,  ScratchFill::value},
  {DType::fp8_e5m2,     "fp8_e5m2",     {"float8_e5m2", "e5m2"},           1, {kDLPackCodeFloat8_e5m2, 8, 1},
   HostCodec::fp8,  kE5m2,     DeviceDecode::none, kPoisonFp8Bits,  ScratchFill::value},
  {DType::int32,        "int32",        {},                                4, {kDLPackCodeInt, 32, 1},
   HostCodec::i32,  {},        DeviceDecode::none, kPoisonFp32Bits, ScratchFill::index_mod8},
};
// clang-format on

namespace dtype_table_detail {
constexpr bool rows_in_order() {
  for (size_t i = 0; i < std::size(kDTypes); ++i)
    if (static_cast<size_t>(kDTypes[i].type) != i || kDTypes[i].name.empty() || kDTypes[i].bytes == 0 ||
        kDTypes[i].bytes > 4)
      return false;
  return true;
}
}  // namespace dtype_table_detail
static_assert(std::size(kDTypes) == static_cast<size_t>(kDTypeCount), "one row per DType (dispatch/types.hpp)");
static_assert(dtype_table_detail::rows_in_order(), "rows in DType order, named, of 1 to 4 bytes");

/// The row of `t`; nullptr for a value no DType enumerator has.
constexpr const DTypeInfo* find_dtype(DType t) noexcept {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kDTypes) ? &kDTypes[i] : nullptr;
}

/// The row of `t`, which must be a DType enumerator.
constexpr const DTypeInfo& dtype_info(DType t) noexcept { return kDTypes[static_cast<size_t>(t)]; }

/// The row whose name or one of whose aliases is `text` (exact, case
/// sensitive); nullptr for none.
constexpr const DTypeInfo* find_dtype(std::string_view text) noexcept {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == text) return &d;
    for (std::string_view a : d.aliases)
      if (!a.empty() && a == text) return &d;
  }
  return nullptr;
}

/// The row of DLPack type (code, bits, lanes); nullptr for none.
constexpr const DTypeInfo* find_dtype_dlpack(uint8_t code, uint8_t bits, uint16_t lanes = 1) noexcept {
  for (const DTypeInfo& d : kDTypes)
    if (d.dlpack.code == code && d.dlpack.bits == bits && d.dlpack.lanes == lanes) return &d;
  return nullptr;
}

/// The value of an element of `d` whose bits (its first d.bytes bytes, little
/// endian) are `bits`: the host's decode, exact.
constexpr double decode_bits(const DTypeInfo& d, uint32_t bits) noexcept {
  switch (d.codec) {
    case HostCodec::f32: return std::bit_cast<float>(bits);
    case HostCodec::bf16: return bf16_to_float(static_cast<uint16_t>(bits));
    case HostCodec::f16: return fp16_to_float(static_cast<uint16_t>(bits));
    case HostCodec::fp8: return fp8_to_float(static_cast<uint8_t>(bits), d.fp8);
    case HostCodec::i32: return static_cast<int32_t>(bits);
  }
  return 0.0;
}

/// The bits of `v` as an element of `d` (rounded to nearest even; fp8
/// saturating; int32 truncated toward zero), in the low d.bytes bytes.
constexpr uint32_t encode_value(const DTypeInfo& d, float v) noexcept {
  switch (d.codec) {
    case HostCodec::f32: return std::bit_cast<uint32_t>(v);
    case HostCodec::bf16: return float_to_bf16(v);
    case HostCodec::f16: return float_to_fp16(v);
    case HostCodec::fp8: return float_to_fp8(v, d.fp8, true);
    case HostCodec::i32: return static_cast<uint32_t>(static_cast<int32_t>(v));
  }
  return 0;
}

/// The bits of element `i` of a dtype of d.bytes bytes at `base` (little endian).
inline uint32_t load_bits(const DTypeInfo& d, const void* base, size_t i) noexcept {
  uint32_t bits = 0;
  std::memcpy(&bits, static_cast<const char*>(base) + i * d.bytes, d.bytes);
  return bits;
}

/// Writes the low d.bytes bytes of `bits` as element `i` at `base`.
inline void store_bits(const DTypeInfo& d, void* base, size_t i, uint32_t bits) noexcept {
  char* p = static_cast<char*>(base) + i * d.bytes;
  switch (d.bytes) {
    case 4: std::memcpy(p, &bits, 4); break;
    case 2: {
      const auto h = static_cast<uint16_t>(bits);
      std::memcpy(p, &h, 2);
      break;
    }
    default: *p = static_cast<char>(bits); break;
  }
}

/// Whether the device compare decodes outputs of `t`.
constexpr bool device_decodes(DType t) noexcept {
  // Index, not find_dtype's pointer: GCC's -fsanitize=undefined makes a
  // pointer's null check non-constant.
  const auto i = static_cast<size_t>(t);
  return i < std::size(kDTypes) && kDTypes[i].device != DeviceDecode::none;
}

/// The search's poison pattern of `t` (its first dtype_size(t) bytes); 0 for
/// a value no enumerator has.
constexpr uint32_t poison_bits(DType t) noexcept {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kDTypes) ? kDTypes[i].poison : 0;
}

// Prose lists of the table's dtypes, for error messages (dtype_table.cpp):
// generated, so that they cannot go stale.

/// Every canonical name, in DType order: "fp32, fp16, bf16, fp8_e4m3fn,
/// fp8_e4m3fnuz, fp8_e5m2 or int32" (parse_dtype's error).
std::string dtype_names_text();
/// The dtypes from_dlpack takes, the fp8 ones by their DLPack codes: "fp32,
/// fp16, bf16, int32 or an fp8 format (DLPack 1.1 codes 10, 11, 12 with bits 8)".
std::string dlpack_dtypes_text();
/// The dtypes the device compare decodes: "fp32, fp16 and bf16".
std::string device_decoded_dtypes_text();

}  // namespace dispatch::core
