// SPDX-License-Identifier: Apache-2.0
// The list of compiled backends, the lookup by device, and the device-type
// rules that hold whether a backend is compiled in or not (a device name's
// backend, a DLPack device's).
#include "backends/backend.hpp"

#include <dlpack/dlpack.h>

#include <string>

#include "dispatch/dlpack.hpp"
#include "dispatch/types.hpp"

namespace dispatch {
#if KDISPATCH_HAVE_CUDA
namespace cuda {
const backends::Backend& backend() noexcept;  // src/backends/gpu/backend.inc
}
#endif
#if KDISPATCH_HAVE_HIP
namespace hip {
const backends::Backend& backend() noexcept;
}
#endif
}  // namespace dispatch

namespace dispatch::backends {
namespace {

struct List {
  const Backend* all[3] = {};
  size_t n = 0;
  List() {
    all[n++] = &cpu::backend();
#if KDISPATCH_HAVE_CUDA
    all[n++] = &cuda::backend();
#endif
#if KDISPATCH_HAVE_HIP
    all[n++] = &hip::backend();
#endif
  }
};

const List& list() noexcept {
  static const List l;
  return l;
}

}  // namespace

std::string_view Backend::name() const noexcept { return device_type_name(type_); }

std::span<const Backend* const> compiled() noexcept {
  const List& l = list();
  return {l.all, l.n};
}

const Backend* find(DeviceType type) noexcept {
  const List& l = list();
  for (size_t i = 0; i < l.n; ++i)
    if (l.all[i]->type() == type) return l.all[i];
  return nullptr;
}

bool is_host(DeviceType type) noexcept {
  const Backend* b = find(type);
  return b != nullptr && b->is_host();
}

void fingerprint_axes(const DeviceInfo& dev, std::vector<std::pair<std::string, std::string>>* axes) {
  if (const Backend* b = find(dev.device.type))
    b->fingerprint_axes(dev, axes);
  else if (dev.device.type != cpu::backend().type())
    gpu_fingerprint_axes(dev, axes);
}

void gpu_fingerprint_axes(const DeviceInfo& dev, std::vector<std::pair<std::string, std::string>>* axes) {
  axes->emplace_back("compute_units", std::to_string(dev.compute_units));
}

DeviceType type_of_device_name(std::string_view canonical) noexcept {
  if (canonical.rfind("CPU_", 0) == 0) return cpu::backend().type();
  if (canonical.rfind("AMD_", 0) == 0 || canonical.find("Radeon") != std::string_view::npos) return DeviceType::hip;
  return DeviceType::cuda;
}

}  // namespace dispatch::backends

namespace dispatch {

Result<Device> device_from_dlpack(DLDevice d) noexcept {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost: return Device{cpu::backend().type(), 0};
    case kDLCUDA: return Device{DeviceType::cuda, d.device_id};
    case kDLROCM: return Device{DeviceType::hip, d.device_id};
    default:
      return make_status(
          StatusCode::unsupported_device,
          "DLTensor device type " + std::to_string(static_cast<int>(d.device_type)) + " has no kdispatch backend");
  }
}

}  // namespace dispatch
