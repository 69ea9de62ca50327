// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — which CPU this is, beyond its ISA class: the vendor,
// family and model (cpuid on x86-64, /proc/cpuinfo elsewhere) and the model
// name. The CPU's key stays the ISA class (CPU_x86_64_AVX512), so a CPU row
// tuned on one vendor's chip serves another's; a CPU row records the CPU
// it was tuned on (the "cpu" object of its file's "kdispatch" metadata),
// and a row of another vendor or family is re-verified before it counts as
// ahead on this machine (docs/tuning.md#verifying-shipped-rows).
#pragma once

#include <cstdint>
#include <string>

namespace dispatch {

struct CpuIdentity {
  std::string vendor;   ///< cpuid's vendor string ("GenuineIntel", "AuthenticAMD"); "" = unknown
  int64_t family = -1;  ///< the display family (base + extended, as Linux's "cpu family")
  int64_t model = -1;   ///< the display model (base + extended << 4 for families 6 and 15+)
  std::string name;     ///< the model name ("AMD EPYC 7763 64-Core Processor"), informational

  bool known() const noexcept { return !vendor.empty(); }
  /// Same vendor and family (the model and name may differ: a stepping or a
  /// SKU of one family runs a kernel alike).
  bool same_family(const CpuIdentity& o) const noexcept { return vendor == o.vendor && family == o.family; }
  /// "AuthenticAMD family 25".
  std::string describe() const { return vendor + " family " + std::to_string(family); }
  /// {"vendor": "...", "family": 25, "model": 1, "name": "..."} (minified as
  /// the JSON writer spaces it).
  std::string to_json() const;
};

/// This host's CPU (probed once). The test hook's identity when one is set.
const CpuIdentity& host_cpu_identity() noexcept;

/// Test hook: host_cpu_identity() answers `id` (nullptr: the probed one).
/// `id` must outlive its use.
void set_host_cpu_for_testing(const CpuIdentity* id) noexcept;

}  // namespace dispatch
