// SPDX-License-Identifier: Apache-2.0
// kdispatch — the host CPU as a device. Its device_name is an ISA class
// ("CPU_x86_64_AVX512"), never the model string, so CPU config files
// travel between hosts with the same vector ISA.
#include <unistd.h>
#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#endif

#include <atomic>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "core/json_write.hpp"
#include "backends/cpu/cpu_identity.hpp"
#include "dispatch/device.hpp"

namespace dispatch {
namespace {

std::string read_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto v = line.substr(colon + 1);
        auto b = v.find_first_not_of(' ');
        return b == std::string::npos ? std::string() : v.substr(b);
      }
    }
  }
  return {};
}

int64_t read_llc_bytes() {
#ifdef _SC_LEVEL3_CACHE_SIZE
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) return l3;
#endif
#ifdef _SC_LEVEL2_CACHE_SIZE
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l2 > 0) return l2;
#endif
  // sysfs fallback: the highest cache index of cpu0.
  for (int idx = 4; idx >= 0; --idx) {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/size");
    std::string s;
    if (f >> s && !s.empty()) {
      int64_t v = std::stoll(s);
      if (s.back() == 'K') v *= 1024;
      if (s.back() == 'M') v *= 1024 * 1024;
      return v;
    }
  }
  return 0;
}

DeviceInfo probe_cpu() {
  DeviceInfo d;
  d.device = Device{DeviceType::cpu, 0};
#if defined(__x86_64__) || defined(_M_X64)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    d.device_name = "CPU_x86_64_AVX512";
    d.arch = "x86_64_avx512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    d.device_name = "CPU_x86_64_AVX2";
    d.arch = "x86_64_avx2";
  } else {
    d.device_name = "CPU_x86_64_SSE";
    d.arch = "x86_64_sse";
  }
#elif defined(__aarch64__)
  d.device_name = "CPU_aarch64_NEON";
  d.arch = "aarch64_neon";
#else
  d.device_name = "CPU_generic";
  d.arch = "generic";
#endif
  try {
    d.reported_name = read_model_name();
  } catch (...) {
  }
  d.compute_units = static_cast<int32_t>(std::thread::hardware_concurrency());
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  d.memory_bytes = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
  try {
    d.l2_bytes = read_llc_bytes();
  } catch (...) {
    d.l2_bytes = 0;
  }
  d.warp_size = 1;
  d.available = true;
  return d;
}

// "<value>" of the first "<field>\t: <value>" line of /proc/cpuinfo, or "".
[[maybe_unused]] std::string cpuinfo_field(const char* field) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(f, line)) {
    if (line.compare(0, n, field) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos || line.find_first_not_of(" \t", n) != colon) continue;
    const size_t b = line.find_first_not_of(' ', colon + 1);
    return b == std::string::npos ? std::string() : line.substr(b);
  }
  return {};
}

[[maybe_unused]] int64_t parse_number(const std::string& s) {
  if (s.empty()) return -1;
  try {
    return static_cast<int64_t>(std::stoll(s, nullptr, 0));  // "0x41" (aarch64) or decimal
  } catch (...) {
    return -1;
  }
}

CpuIdentity probe_identity() {
  CpuIdentity id;
  try {
    id.name = read_model_name();
#if defined(__x86_64__) || defined(_M_X64)
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid(0, &a, &b, &c, &d)) {
      char v[13] = {};
      std::memcpy(v, &b, 4);
      std::memcpy(v + 4, &d, 4);
      std::memcpy(v + 8, &c, 4);
      id.vendor = v;
    }
    if (__get_cpuid(1, &a, &b, &c, &d)) {
      const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
      const unsigned ext_family = (a >> 20) & 0xff, ext_model = (a >> 16) & 0xf;
      id.family = base_family == 0xf ? base_family + ext_family : base_family;
      id.model = base_family == 0x6 || base_family == 0xf ? base_model + (ext_model << 4) : base_model;
    }
#else
    // /proc/cpuinfo: x86's fields where they exist, else aarch64's
    // ("CPU implementer" 0x41 = Arm, "CPU architecture", "CPU part").
    id.vendor = cpuinfo_field("vendor_id");
    if (!id.vendor.empty()) {
      id.family = parse_number(cpuinfo_field("cpu family"));
      id.model = parse_number(cpuinfo_field("model"));
    } else if (const std::string impl = cpuinfo_field("CPU implementer"); !impl.empty()) {
      id.vendor = "implementer " + impl;
      id.family = parse_number(cpuinfo_field("CPU architecture"));
      id.model = parse_number(cpuinfo_field("CPU part"));
    }
#endif
  } catch (...) {
  }
  return id;
}

std::atomic<const CpuIdentity*> g_cpu_for_testing{nullptr};

}  // namespace

std::string CpuIdentity::to_json() const {
  core::JsonWriter w;
  w.begin_object().field("vendor", vendor).field("family", family).field("model", model).field("name", name);
  w.end_object();
  return w.take();
}

const CpuIdentity& host_cpu_identity() noexcept {
  if (const CpuIdentity* t = g_cpu_for_testing.load(std::memory_order_acquire)) return *t;
  static const CpuIdentity id = probe_identity();  // thread-safe static init
  return id;
}

void set_host_cpu_for_testing(const CpuIdentity* id) noexcept {
  g_cpu_for_testing.store(id, std::memory_order_release);
}

const DeviceInfo& cpu_device_info() noexcept {
  static const DeviceInfo info = probe_cpu();  // thread-safe static init
  return info;
}

}  // namespace dispatch
