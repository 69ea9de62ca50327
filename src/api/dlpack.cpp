// SPDX-License-Identifier: Apache-2.0
#include "dispatch/dlpack.hpp"

#include <cstdint>
#include <string>

#include "core/dtype_table.hpp"
#include "core/op.hpp"

namespace dispatch {
namespace {

// No 64-bit host (x86-64 with 5-level paging: 2^56; aarch64: 2^52) or GPU
// maps memory at or above this address: a tensor that reaches it has a size,
// stride or byte_offset that overflowed.
constexpr uint64_t kMaxAddress = uint64_t{1} << 57;

// The dtype table (core/dtype_table.hpp) spells DLPack's codes as numbers:
// they must be the ones of the dlpack.h this file builds with, and of the
// public fp8 constants (dispatch/dlpack.hpp).
static_assert(core::kDLPackCodeInt == kDLInt && core::kDLPackCodeFloat == kDLFloat &&
              core::kDLPackCodeBfloat == kDLBfloat);
static_assert(core::kDLPackCodeFloat8_e4m3fn == kDLPackFloat8_e4m3fn &&
              core::kDLPackCodeFloat8_e4m3fnuz == kDLPackFloat8_e4m3fnuz &&
              core::kDLPackCodeFloat8_e5m2 == kDLPackFloat8_e5m2);

std::string dims_text(const int64_t* v, int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// The errors, out of line: the checks above them stay a few instructions.
[[gnu::cold, gnu::noinline]] Status null_shape(int ndim) noexcept {
  try {
    return make_status(StatusCode::invalid_argument,
                       "DLTensor shape is NULL (ndim " + std::to_string(ndim) + " needs ndim sizes)");
  } catch (...) {
    return make_status(StatusCode::invalid_argument, "DLTensor shape is NULL");
  }
}
[[gnu::cold, gnu::noinline]] Status negative_shape() noexcept {
  return make_status(StatusCode::invalid_argument, "DLTensor has a negative shape");
}
[[gnu::cold, gnu::noinline]] Status offset_overflows(uint64_t byte_offset) noexcept {
  try {
    return make_status(StatusCode::invalid_argument, "DLTensor data + byte_offset overflows (byte_offset " +
                                                         std::to_string(byte_offset) +
                                                         "): past the end of any 64-bit address space (2^57)");
  } catch (...) {
    return make_status(StatusCode::invalid_argument, "DLTensor data + byte_offset overflows");
  }
}
[[gnu::cold, gnu::noinline]] Status extent_overflows(const int64_t* shape, const int64_t* strides, int ndim) noexcept {
  try {
    return make_status(StatusCode::invalid_argument,
                       "DLTensor size or stride overflows: shape " + dims_text(shape, ndim) + " with strides " +
                           dims_text(strides, ndim) + " reaches past the 64-bit address space (2^57 bytes)");
  } catch (...) {
    return make_status(StatusCode::invalid_argument, "DLTensor size or stride overflows");
  }
}

}  // namespace

Result<TensorRef> from_dlpack(const DLTensor* t) noexcept {
  if (t == nullptr) return make_status(StatusCode::invalid_argument, "DLTensor is null");
  if (t->ndim < 0 || t->ndim > kMaxRank)
    return make_status(StatusCode::invalid_argument,
                       "DLTensor ndim " + std::to_string(t->ndim) + " is outside 0.." + std::to_string(kMaxRank));
  TensorRef r;
  if (t->dtype.lanes != 1) return make_status(StatusCode::unsupported_problem, "DLTensor dtype lanes must be 1");
  if (const core::DTypeInfo* d = core::find_dtype_dlpack(t->dtype.code, t->dtype.bits))
    r.dtype = d->type;
  else
    return make_status(StatusCode::unsupported_problem,
                       "DLTensor dtype (code " + std::to_string(t->dtype.code) + ", bits " +
                           std::to_string(t->dtype.bits) + ") is not " + core::dlpack_dtypes_text() +
                           (t->dtype.code == kDLUInt && t->dtype.bits == 8
                                ? std::string("; fp8 data in a uint8 array needs its format named (Python: "
                                              "kdispatch.fp8(array, \"e4m3fn\"))")
                                : std::string()));
  auto dev = device_from_dlpack(t->device);
  if (!dev.ok()) return dev.status();
  r.device = *dev;
  r.rank = t->ndim;
  if (t->ndim > 0 && t->shape == nullptr) [[unlikely]]
    return null_shape(t->ndim);
  // The elements' offsets from element [0,...]: [lo, hi], in elements. Every
  // product and sum is checked (a size or stride that overflows is refused,
  // never wrapped into an in-range pointer).
  int64_t compact = 1, lo = 0, hi = 0;
  bool overflow = false, empty = false;
  for (int i = t->ndim - 1; i >= 0; --i) {
    const int64_t n = t->shape[i];
    if (n < 0) [[unlikely]]
      return negative_shape();
    int64_t st = compact;
    if (t->strides != nullptr)
      st = t->strides[i];
    else
      overflow |= __builtin_mul_overflow(compact, n, &compact);
    r.shape[i] = n;
    r.strides[i] = st;
    empty |= n == 0;
    int64_t reach;  // (n - 1) * stride
    overflow |= __builtin_mul_overflow(n - 1, st, &reach);
    overflow |= reach < 0 ? __builtin_add_overflow(lo, reach, &lo) : __builtin_add_overflow(hi, reach, &hi);
  }
  // In bytes, [lo, hi + 1) * bytes from data + byte_offset, inside the 64-bit
  // address space (below kMaxAddress).
  const auto bytes = static_cast<int64_t>(core::dtype_bytes(r.dtype));
  overflow |= __builtin_add_overflow(hi, 1, &hi);
  overflow |= __builtin_mul_overflow(hi, bytes, &hi);
  overflow |= __builtin_mul_overflow(lo, bytes, &lo);
  const uint64_t base = reinterpret_cast<uintptr_t>(t->data);
  if (t->byte_offset >= kMaxAddress || base >= kMaxAddress || base + t->byte_offset >= kMaxAddress) [[unlikely]]
    return offset_overflows(t->byte_offset);
  const uint64_t start = base + t->byte_offset;
  if (!empty && (overflow || static_cast<uint64_t>(hi) > kMaxAddress - start ||
                 uint64_t{0} - static_cast<uint64_t>(lo) > start)) [[unlikely]]
    return extent_overflows(t->shape, r.strides, t->ndim);
  r.data = t->data ? static_cast<char*>(t->data) + t->byte_offset : nullptr;
  return r;
}

}  // namespace dispatch
