// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the CPU backend's memory and clock: plain host
// memory (backends::host_memory(), memory.hpp) and the clock below.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "backends/clock.hpp"

namespace dispatch::backends {

/// The CPU clock: steady_clock around the call; flush() reads a buffer of
/// 3x the last-level cache, clamped to [8, 96] MiB (allocated once per
/// process, shared read-only).
class CpuClock final : public Clock {
 public:
  explicit CpuClock(int64_t llc_bytes);
  void flush() override;
  Result<double> time_us(const std::function<Status()>& fn) override;

 private:
  int64_t llc_bytes_ = 0;
  const std::vector<uint64_t>* sweep_ = nullptr;
  volatile uint64_t sink_ = 0;
};

}  // namespace dispatch::backends
