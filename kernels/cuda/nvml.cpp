// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the SM clock through NVML (nvml.hpp says why).
#include "cuda/nvml.hpp"

#include <map>
#include <mutex>

#include "cuda/dl_library.hpp"

namespace dispatch::cuda::nvml {
namespace {

// NVML's C ABI (nvml.h): nvmlReturn_t is an int enum, NVML_SUCCESS 0;
// nvmlDevice_t an opaque pointer; NVML_CLOCK_SM is 1.
using Device = struct nvmlDevice_st*;
using InitFn = int (*)();
using HandleFn = int (*)(const char*, Device*);
using ClockFn = int (*)(Device, int, unsigned*);
constexpr int kClockSm = 1;

struct Api {
  dl::Opened lib;
  bool ok = false;
  HandleFn handle = nullptr;
  ClockFn clock = nullptr;
  std::string why;
};

const Api& api() {
  static const Api a = [] {
    Api r;
    r.lib = dl::open_library("KDISPATCH_NVML", {"libnvidia-ml.so.1", "libnvidia-ml.so"});
    if (r.lib.disabled) {
      r.why = "NVML off (KDISPATCH_NVML=0)";
      return r;
    }
    if (!r.lib.so) {
      r.why = "NVML not loaded (tried " + r.lib.tried + ")";
      return r;
    }
    InitFn init = nullptr;
    if (!dl::sym(r.lib.so, "nvmlInit_v2", &init) || !dl::sym(r.lib.so, "nvmlDeviceGetHandleByPciBusId_v2", &r.handle) ||
        !dl::sym(r.lib.so, "nvmlDeviceGetClockInfo", &r.clock)) {
      r.why = "NVML lacks nvmlInit_v2 / nvmlDeviceGetHandleByPciBusId_v2 / nvmlDeviceGetClockInfo";
      return r;
    }
    // nvmlInit is reference counted by NVML: never shut down here (another
    // user of NVML in the process, torch's say, keeps its own count).
    if (const int rc = init(); rc != 0) {
      r.why = "nvmlInit_v2 failed (" + std::to_string(rc) + ")";
      return r;
    }
    r.ok = true;
    r.why = "NVML " + dl::path_of(reinterpret_cast<void*>(r.clock));
    return r;
  }();
  return a;
}

}  // namespace

unsigned sm_clock_mhz(const std::string& pci_bus_id) noexcept {
  try {
    const Api& a = api();
    if (!a.ok || pci_bus_id.empty()) return 0;
    static std::mutex mu;
    static std::map<std::string, Device> handles;  // nullptr: NVML does not know the id
    Device d = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = handles.find(pci_bus_id);
      if (it == handles.end()) {
        if (a.handle(pci_bus_id.c_str(), &d) != 0) d = nullptr;
        it = handles.emplace(pci_bus_id, d).first;
      }
      d = it->second;
    }
    unsigned mhz = 0;
    if (d == nullptr || a.clock(d, kClockSm, &mhz) != 0) return 0;
    return mhz;
  } catch (...) {  // allocation failure in the cache: no reading
    return 0;
  }
}

std::string describe() { return api().why; }

}  // namespace dispatch::cuda::nvml
