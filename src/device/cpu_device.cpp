// SPDX-License-Identifier: Apache-2.0
// kdispatch — the host CPU as a device. Its device_name is an ISA class
// ("CPU_x86_64_AVX512"), never the model string, so CPU config files
// travel between hosts with the same vector ISA.
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

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
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl")) {
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

}  // namespace

const DeviceInfo& cpu_device_info() noexcept {
  static const DeviceInfo info = probe_cpu();  // thread-safe static init
  return info;
}

}  // namespace dispatch
