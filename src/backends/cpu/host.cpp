// SPDX-License-Identifier: Apache-2.0
// The CPU backend's memory (plain host memory) and clock (steady_clock
// around the call, a sweep of 3x the last-level cache before a cold rep).
#include "backends/cpu/host.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

#include "backends/memory.hpp"

namespace dispatch::backends {

namespace {
// The sweep buffer, shared read-only by every CpuClock (allocated once).
// Its size: 3x the last-level cache, clamped to [8, 96] MiB — a VM can
// report a socket-wide L3 (hundreds of MB) while a core only ever uses its
// CCD's slice, and a sweep per rep must stay affordable.
const std::vector<uint64_t>& sweep_buffer(int64_t llc_bytes) {
  static const std::vector<uint64_t> buf = [llc_bytes] {
    const int64_t llc = llc_bytes > 0 ? llc_bytes : (32LL << 20);
    const int64_t bytes = std::clamp<int64_t>(3 * llc, 8LL << 20, 96LL << 20);
    return std::vector<uint64_t>(static_cast<size_t>(bytes / 8), 1);
  }();
  return buf;
}
}  // namespace

CpuClock::CpuClock(int64_t llc_bytes) : llc_bytes_(llc_bytes) {}

void CpuClock::flush() {
  if (!sweep_) sweep_ = &sweep_buffer(llc_bytes_);  // allocated on first use only
  uint64_t s = 0;
  // One read per cache line is enough to evict; the stride keeps it cheap.
  const std::vector<uint64_t>& b = *sweep_;
  for (size_t i = 0; i < b.size(); i += 8) s += b[i];
  sink_ = sink_ + s;
}

Result<double> CpuClock::time_us(const std::function<Status()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  Status s = fn();
  const auto t1 = std::chrono::steady_clock::now();
  if (!s.ok()) return s;
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

namespace {

class HostMemory final : public DeviceMemory {
 public:
  void* alloc(size_t bytes) override { return ::operator new(bytes, std::nothrow); }
  void release(void* p) override { ::operator delete(p); }
  Status to_host(void* d, const void* s, size_t n) override { return (std::memcpy(d, s, n), Status()); }
  Status from_host(void* d, const void* s, size_t n) override { return (std::memcpy(d, s, n), Status()); }
  Status copy(void* d, const void* s, size_t n) override { return (std::memmove(d, s, n), Status()); }
  Status zero_2d(void* d, size_t pitch, size_t width, size_t rows) override {
    for (size_t r = 0; r < rows; ++r) std::memset(static_cast<char*>(d) + r * pitch, 0, width);
    return Status();
  }
  Status sync() override { return Status(); }
  std::unique_ptr<Clock> make_clock(const DeviceInfo& dev) override { return std::make_unique<CpuClock>(dev.l2_bytes); }
};

}  // namespace

DeviceMemory& host_memory() noexcept {
  static HostMemory m;
  return m;
}

size_t ArgBuffer::extent_bytes() const noexcept {
  if (rows <= 0 || cols <= 0) return 0;
  if (ld < 0) return static_cast<size_t>((cols - 1) * -ld + rows) * dtype_size(dtype);  // a column-major view
  return static_cast<size_t>((rows - 1) * ld + cols) * dtype_size(dtype);
}

}  // namespace dispatch::backends
