// SPDX-License-Identifier: Apache-2.0
// Helpers of the GPU tests and the GPU norm benchmark: device buffers through
// the backend's own tuner memory (tune::DeviceMemory), host-side element
// conversions, a float64 norm reference and the per-dtype tolerance. Plain
// C++: the tests reach the GPU only through kdispatch's interfaces.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/numeric.hpp"
#include "backends/registry.hpp"
#include "dispatch/device.hpp"
#include "dispatch/runtime.hpp"
#include "backends/backend.hpp"
#include "ops/specs.hpp"
#include "tune/search.hpp"

namespace kdgpu {

using dispatch::DeviceType;
using dispatch::DType;

/// The GPU backends of this build that have a usable device.
inline std::vector<DeviceType> usable_backends() {
  std::vector<DeviceType> out;
  for (DeviceType t : {DeviceType::cuda, DeviceType::hip}) {
    const dispatch::backends::Backend* b = dispatch::backends::find(t);
    if (b && b->status().available) out.push_back(t);
  }
  return out;
}

/// A Runtime for the calls through the public API: no shipped configs
/// (get_default serves), no log.
inline auto quiet_runtime() {
  dispatch::RuntimeOptions o;
  o.load_shipped_configs = false;
  o.log_level = dispatch::LogLevel::off;
  return dispatch::Runtime::create(o);
}

/// One line on why no GPU test can run (empty when one can).
inline std::string why_no_gpu() {
  std::string why;
  for (DeviceType t : {DeviceType::cuda, DeviceType::hip}) {
    const dispatch::backends::Backend* b = dispatch::backends::find(t);
    if (!b) continue;
    if (b->status().available) return {};
    if (!why.empty()) why += "; ";
    why += b->status().unavailable_reason;
  }
  return why.empty() ? "no GPU backend compiled in" : why;
}

/// Host copy of a strided 2-D tensor as raw element bits (fp32 bits or 16-bit bits).
struct HostTensor {
  DType dtype = DType::fp32;
  int64_t rows = 0, cols = 0, ld = 0;
  std::vector<uint32_t> bits;  ///< rows * ld elements (16-bit values in the low half)

  HostTensor() = default;
  HostTensor(DType t, int64_t r, int64_t c, int64_t l) : dtype(t), rows(r), cols(c), ld(l), bits(size_t(r * l), 0) {}
  size_t elems() const { return bits.size(); }
  size_t bytes() const { return elems() * dispatch::dtype_size(dtype); }

  static uint32_t poison_bits(DType t) {  // NaN in every format
    return t == DType::fp32 ? 0xFFFFFFFFu : dispatch::dtype_size(t) == 1 ? 0xFFu : 0xFFFFu;
  }
  float get(int64_t r, int64_t c) const { return to_float(bits[size_t(r * ld + c)]); }
  void set(int64_t r, int64_t c, float v) { bits[size_t(r * ld + c)] = from_float(v); }
  bool is_poison(int64_t r, int64_t c) const { return bits[size_t(r * ld + c)] == poison_bits(dtype); }
  void poison_all() { std::fill(bits.begin(), bits.end(), poison_bits(dtype)); }

  float to_float(uint32_t b) const {
    switch (dtype) {
      case DType::fp32: return std::bit_cast<float>(b);
      case DType::bf16: return dispatch::core::bf16_to_float(static_cast<uint16_t>(b));
      case DType::fp16: return dispatch::core::fp16_to_float(static_cast<uint16_t>(b));
      case DType::fp8_e4m3fn: return dispatch::core::fp8_to_float(static_cast<uint8_t>(b), dispatch::core::kE4m3fn);
      case DType::fp8_e4m3fnuz:
      case DType::fp8_e5m2:
      case DType::int32: break;  // no GPU test holds these
    }
    return 0.f;
  }
  uint32_t from_float(float v) const {
    switch (dtype) {
      case DType::fp32: return std::bit_cast<uint32_t>(v);
      case DType::bf16: return dispatch::core::float_to_bf16(v);
      case DType::fp16: return dispatch::core::float_to_fp16(v);
      case DType::fp8_e4m3fn: return dispatch::core::float_to_fp8(v, dispatch::core::kE4m3fn, true);
      case DType::fp8_e4m3fnuz:
      case DType::fp8_e5m2:
      case DType::int32: break;  // no GPU test holds these
    }
    return 0;
  }
  /// The value v becomes once stored in this dtype.
  float round(float v) const { return to_float(from_float(v)); }

  /// Packed storage bytes (what goes to the device).
  std::vector<char> pack() const {
    std::vector<char> out(bytes());
    if (dtype == DType::fp32) {
      std::memcpy(out.data(), bits.data(), out.size());
    } else if (dispatch::dtype_size(dtype) == 1) {
      for (size_t i = 0; i < elems(); ++i) out[i] = static_cast<char>(bits[i]);
    } else {
      for (size_t i = 0; i < elems(); ++i) {
        const uint16_t h = static_cast<uint16_t>(bits[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
    }
    return out;
  }
  void unpack(const std::vector<char>& in) {
    if (dtype == DType::fp32) {
      std::memcpy(bits.data(), in.data(), bytes());
    } else if (dispatch::dtype_size(dtype) == 1) {
      for (size_t i = 0; i < elems(); ++i) bits[i] = static_cast<uint8_t>(in[i]);
    } else {
      for (size_t i = 0; i < elems(); ++i) {
        uint16_t h;
        std::memcpy(&h, in.data() + 2 * i, 2);
        bits[i] = h;
      }
    }
  }
  void fill_uniform(std::mt19937& rng, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) set(r, c, u(rng));
  }
};

/// A device allocation through the backend's tuner memory.
class DeviceBuffer {
 public:
  DeviceBuffer(dispatch::tune::DeviceMemory* mem, size_t bytes, size_t offset_bytes = 0)
      : mem_(mem), raw_(mem->alloc(bytes + offset_bytes + 64)), offset_(offset_bytes) {}
  ~DeviceBuffer() {
    if (raw_) mem_->release(raw_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return raw_ ? static_cast<char*>(raw_) + offset_ : nullptr; }
  bool ok() const { return raw_ != nullptr; }
  dispatch::Status upload(const HostTensor& t) {
    const std::vector<char> b = t.pack();
    return mem_->from_host(get(), b.data(), b.size());
  }
  dispatch::Status download(HostTensor* t) {
    std::vector<char> b(t->bytes());
    if (dispatch::Status s = mem_->sync(); !s.ok()) return s;
    if (dispatch::Status s = mem_->to_host(b.data(), get(), b.size()); !s.ok()) return s;
    t->unpack(b);
    return {};
  }

 private:
  dispatch::tune::DeviceMemory* mem_;
  void* raw_;
  size_t offset_;
};

/// float64 RMSNorm of one row of values (already as the kernel sees them).
inline double inv_rms(const std::vector<double>& v, double eps) {
  double ss = 0;
  for (double x : v) ss += x * x;
  return 1.0 / std::sqrt(ss / double(v.size()) + eps);
}

/// |got - want| allowed for an output of `dtype`: half an ulp of the output
/// format at want (the kernel rounds its fp32 result once) plus the fp32
/// arithmetic's error, relative to the row's largest output.
inline double tolerance(DType t, double want, double row_scale) {
  const double fp32_slack = 4e-6 * row_scale + 1e-30;
  const double a = std::fabs(want);
  if (t == DType::fp32) return fp32_slack + 2e-6 * a;
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  if (t == DType::bf16) return std::ldexp(1.0, std::max(e - 1, -126) - 8) + fp32_slack + 1e-6 * a;
  return std::ldexp(1.0, std::max(e - 1, -14) - 11) + fp32_slack + 1e-6 * a;  // fp16
}

/// The first element of y (T x H) off the float64 rmsnorm of x by w beyond
/// tolerance(y.dtype, want, row_scale), as "[t,h] got G want W"; "" when
/// every element is within it.
inline std::string rmsnorm_mismatch(const HostTensor& x, const HostTensor& w, const HostTensor& y, double eps,
                                    double row_scale) {
  for (int64_t t = 0; t < y.rows; ++t) {
    std::vector<double> row(static_cast<size_t>(y.cols));
    for (int64_t h = 0; h < y.cols; ++h) row[size_t(h)] = x.get(t, h);
    const double inv = inv_rms(row, eps);
    for (int64_t h = 0; h < y.cols; ++h) {
      const double want = row[size_t(h)] * inv * w.get(0, h);
      if (!(std::fabs(y.get(t, h) - want) <= tolerance(y.dtype, want, row_scale)))
        return "[" + std::to_string(t) + "," + std::to_string(h) + "] got " + std::to_string(y.get(t, h)) + " want " +
               std::to_string(want);
    }
  }
  return {};
}

}  // namespace kdgpu
