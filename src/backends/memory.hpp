// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — how the tuner reaches a backend's memory: the
// argument view it poisons, restores and compares (ArgBuffer), and the
// interface every backend implements (DeviceMemory: the CPU's is plain host
// memory, src/backends/cpu/host.cpp; a GPU's, device allocations, copies,
// a compare on the device and its clock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backends/clock.hpp"
#include "core/dtype_table.hpp"
#include "dispatch/device.hpp"
#include "dispatch/status.hpp"

namespace dispatch::backends {

/// One argument as the search sees it: a strided 2-D view (a 1-D tensor is
/// one row). Only its logical elements are poisoned or compared; bytes
/// between rows (row stride > cols) are never touched.
struct ArgBuffer {
  std::string name;
  void* ptr = nullptr;
  DType dtype = DType::fp32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld =
      0;  ///< row stride in elements (may be 0 for a broadcast input); < 0: a column-major view, column stride -ld
  bool read = true;      ///< the op reads it
  bool written = false;  ///< the op writes it

  /// Bytes from element [0,0] to one past the last element.
  size_t extent_bytes() const noexcept;
};

/// How the search reaches a backend's memory and clock. The CPU's is plain
/// host memory (host_memory()); a GPU backend supplies its own (device
/// allocations, copies through the host for validation, events for timing).
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  /// Allocates `bytes` of the backend's memory (nullptr on failure).
  virtual void* alloc(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  virtual Status to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual Status from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual Status copy(void* dst, const void* src, size_t bytes) = 0;
  /// Zeroes `rows` rows of `width_bytes` each, `pitch_bytes` apart.
  virtual Status zero_2d(void* dst, size_t pitch_bytes, size_t width_bytes, size_t rows) = 0;
  /// Waits for queued work (GPU); a no-op on the CPU.
  virtual Status sync() = 0;
  /// The benchmark clock of this backend for `dev`.
  virtual std::unique_ptr<Clock> make_clock(const DeviceInfo& dev) = 0;

  /// Outcome of compare(): `ok`, or the first bad element and why.
  struct Mismatch {
    bool ok = true;
    bool unwritten = false;  ///< the poison pattern survived at (row, col)
    int64_t row = 0, col = 0;
    double got = 0.0, want = 0.0;
  };
  /// Compares the logical elements of `out` (rows x cols, row stride ld)
  /// with `ref`, a copy of the reference output in the same layout in this
  /// backend's memory: an element fails when it still holds the poison
  /// pattern (check_poison), is NaN where the reference is not, or differs
  /// by more than atol_rel * max|ref| + rtol * |ref|. A GPU backend runs it
  /// on the device, so validating a 1 GB output costs a kernel, not a copy
  /// to the host. The default (host memory) returns unsupported_problem and
  /// the search compares on the host.
  virtual Result<Mismatch> compare(const ArgBuffer& out, const void* ref, double atol_rel, double rtol,
                                   bool check_poison) {
    (void)out, (void)ref, (void)atol_rel, (void)rtol, (void)check_poison;
    return make_status(StatusCode::unsupported_problem, "compare on the host");
  }
};

/// The poison bit patterns the search writes into pure outputs before a
/// validation run (signalling NaNs with a payload no arithmetic produces):
/// the dtype table's (core::DTypeInfo::poison).
inline constexpr uint32_t kPoisonFp32 = core::dtype_info(DType::fp32).poison;
inline constexpr uint16_t kPoisonBf16 = static_cast<uint16_t>(core::dtype_info(DType::bf16).poison);
inline constexpr uint16_t kPoisonFp16 = static_cast<uint16_t>(core::dtype_info(DType::fp16).poison);

/// Plain host memory and the CPU clock (src/backends/cpu/host.cpp).
DeviceMemory& host_memory() noexcept;

}  // namespace dispatch::backends
