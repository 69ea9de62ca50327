// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the SM clock as NVML reports it, for the tuner's
// timing (issue 32, item 3): a timed batch that ran while the SM clock was
// below 0.9x the run's median (thermal or power throttling, another process
// holding the GPU in a low clock) is timed again instead of deciding a
// race. Read only: kdispatch never sets a clock or an application clock.
//
// libnvidia-ml is opened at run time (dlopen of libnvidia-ml.so.1, the
// driver's, or KDISPATCH_NVML=<path>; "0" turns the screening off): never
// linked, so libkdispatch.so loads where there is no driver. The device is
// found by its PCI bus id (DeviceInfo::pci_bus_id), which CUDA and NVML
// agree on whatever CUDA_VISIBLE_DEVICES reorders. Plain C++, no NVML
// headers (the handful of declarations are NVML's stable C ABI).
// Thread-safe: the library is opened once; a handle per bus id is cached.
#pragma once

#include <string>

namespace dispatch::cuda::nvml {

/// The SM clock of the device at `pci_bus_id` in MHz (nvmlDeviceGetClockInfo,
/// NVML_CLOCK_SM), or 0 when NVML is not available, turned off, or does not
/// know the device. A read costs a few µs (an ioctl); never throws.
unsigned sm_clock_mhz(const std::string& pci_bus_id) noexcept;

/// "NVML <path>" when the library is open, else why not (for logs).
std::string describe();

}  // namespace dispatch::cuda::nvml
