// SPDX-License-Identifier: Apache-2.0
// The CPU backend as one object: its op table (kernels/cpu/cpu_backend.hpp),
// the host as its one device (cpu_device.cpp), host memory and the CPU
// clock for the tuner (host.cpp), its fingerprint axes.
#include <sched.h>

#include <string>

#include "backends/backend.hpp"
#include "backends/memory.hpp"
#include "cpu/cpu_backend.hpp"

namespace dispatch::cpu {
namespace {

class CpuBackend final : public backends::Backend {
 public:
  constexpr CpuBackend() noexcept : Backend(DeviceType::cpu) {}
  bool is_host() const noexcept override { return true; }
  std::span<const core::VariantDef* const> variants() const noexcept override { return cpu::variants(); }
  core::Plan get_default(const core::Problem& p, const DeviceInfo& dev) const noexcept override {
    return cpu::get_default(p, dev);
  }
  bool dtypes_known_offline() const noexcept override { return true; }
  // The host answers every ordinal with its one device (device_info_or_why
  // refuses an ordinal other than 0).
  const DeviceInfo* device_info(int32_t) const noexcept override { return &cpu_device_info(); }
  const DeviceInfo& status() const noexcept override { return cpu_device_info(); }
  const char* no_device_message() const noexcept override { return "the CPU backend is unavailable"; }
  backends::DeviceMemory& memory() const noexcept override { return backends::host_memory(); }
  const std::string& runtime_versions() const noexcept override {
    static const std::string v = "cpu";
    return v;
  }
  const std::string& library_versions() const noexcept override {
    static const std::string v = "no vendor library (kdispatch's own kernels; OpenBLAS as a plugin)";
    return v;
  }
  void fingerprint_axes(const DeviceInfo&, std::vector<std::pair<std::string, std::string>>* axes) const override {
    // The CPUs the process may run on: a winner timed on 2 threads is not
    // one for a process pinned to 1 (taskset -c 0).
    cpu_set_t set;
    CPU_ZERO(&set);
    const int n = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    axes->emplace_back("cpus", std::to_string(n));
  }
};

constinit const CpuBackend kBackend;

}  // namespace

const backends::Backend& backend() noexcept { return kBackend; }

}  // namespace dispatch::cpu
