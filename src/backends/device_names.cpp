// SPDX-License-Identifier: Apache-2.0
// kdispatch — device-name normalisation, aliases and the hardware-identity
// resolver (cases C06–C08).
//
// Config files are keyed by SGLang's spelling of the runtime device name.
// Three kinds of trouble exist in the field's files:
//  1. One part, two names: "AMD Instinct MI325 OAM" and "AMD Instinct MI325X"
//     (vLLM has files under both). An alias table maps both to one canonical
//     name, for reported names and for file names alike.
//  2. A generic name for several parts: ROCm reports MI300-class parts as
//     "AMD Radeon Graphics". The name alone cannot tell an MI300X (304 CUs,
//     192 GB) from an MI325X (304 CUs, 256 GB) or an MI308X (80 CUs); the
//     (arch, CU count, memory) identity can.
//  3. Names that can never match a runtime name: "NVIDIA_H100" (short form)
//     or an empty name. They are not wildcards: no prefix or fuzzy matching
//     is ever done; such files serve only a device reporting exactly that
//     name, and the load report flags them.
#include <algorithm>
#include <iterator>
#include <string>
#include <string_view>

#include "dispatch/device.hpp"

namespace dispatch {
namespace {

// Canonical names of known devices (SGLang spelling). Built from the names
// found in SGLang's and vLLM's committed config trees, plus the CPU ISA
// classes kdispatch itself uses. Short or empty names are deliberately absent.
constexpr std::string_view kKnownDevices[] = {
    // NVIDIA
    "NVIDIA_A100-SXM4-40GB", "NVIDIA_A100-SXM4-80GB", "NVIDIA_A100_80GB_PCIe", "NVIDIA_A800-SXM4-80GB", "NVIDIA_A10",
    "NVIDIA_A10G", "NVIDIA_L4", "NVIDIA_L20", "NVIDIA_L20Y", "NVIDIA_L40", "NVIDIA_L40S", "NVIDIA_GeForce_RTX_4090",
    "NVIDIA_GeForce_RTX_5090", "NVIDIA_RTX_5880_Ada_Generation", "NVIDIA_RTX_6000_Ada_Generation",
    "NVIDIA_H100_80GB_HBM3", "NVIDIA_H100_PCIe", "NVIDIA_H100_NVL", "NVIDIA_H800", "NVIDIA_H20", "NVIDIA_H20-3e",
    "NVIDIA_H200", "NVIDIA_GH200_480GB", "NVIDIA_B200", "NVIDIA_GB200", "NVIDIA_B300_SXM6_AC", "NVIDIA_GB10",
    "NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition", "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition",
    "NVIDIA_RTX_PRO_6000_Blackwell_Workstation_Edition",  // vLLM's tree (it was flagged "no known device")
    // AMD
    "AMD_Instinct_MI300X", "AMD_Instinct_MI300A", "AMD_Instinct_MI308X", "AMD_Instinct_MI325X", "AMD_Instinct_MI350X",
    "AMD_Instinct_MI355X", "AMD_Instinct_MI250X_MI250", "AMD_Instinct_MI210", "AMD_Radeon_Graphics", "AMD_Radeon_R9700",
    "Radeon_8060S_Graphics",
    // Intel
    "Intel(R)_Arc(TM)_Pro_B60_Graphics",
    // CPU ISA classes (kdispatch's own)
    "CPU_x86_64_SSE", "CPU_x86_64_AVX2", "CPU_x86_64_AVX512", "CPU_aarch64_NEON", "CPU_aarch64_SVE", "CPU_generic"};

struct Alias {
  std::string_view from;
  std::string_view to;
};
// Built-in aliases (SGLang spelling on both sides). Only names that are the
// same part under another spelling; never a different SKU.
constexpr Alias kAliases[] = {
    {"AMD_Instinct_MI325_OAM", "AMD_Instinct_MI325X"},
    {"AMD_Instinct_MI350_OAM", "AMD_Instinct_MI350X"},
    {"AMD_Instinct_MI355_OAM", "AMD_Instinct_MI355X"},
    {"NVIDIA_H200_NVL", "NVIDIA_H200"},  // same GH100 die, 132 SMs, 141 GB HBM3e
};

// Names that several distinct parts report; resolved by hardware identity.
constexpr std::string_view kGenericNames[] = {"AMD_Radeon_Graphics"};

struct HardwareIdentity {
  std::string_view arch;
  int32_t compute_units;
  int64_t min_memory_bytes;  // inclusive
  int64_t max_memory_bytes;  // exclusive; 0 = no upper bound
  std::string_view canonical;
};
constexpr int64_t kGB = 1000LL * 1000 * 1000;
// Memory breaks the tie between parts with the same arch and CU count:
// MI300X has 192 GB, MI325X 256 GB (split at 224 GB).
constexpr HardwareIdentity kIdentities[] = {
    {"gfx942", 304, 0, 224 * kGB, "AMD_Instinct_MI300X"},
    {"gfx942", 304, 224 * kGB, 0, "AMD_Instinct_MI325X"},
    {"gfx942", 228, 0, 0, "AMD_Instinct_MI300A"},
    {"gfx942", 80, 0, 0, "AMD_Instinct_MI308X"},
};

std::string_view strip_arch_features(std::string_view arch) {
  // "gfx942:sramecc+:xnack-" -> "gfx942"
  auto colon = arch.find(':');
  return colon == std::string_view::npos ? arch : arch.substr(0, colon);
}

bool is_known(std::string_view name) {
  return std::find(std::begin(kKnownDevices), std::end(kKnownDevices), name) != std::end(kKnownDevices);
}

// Applies user then built-in aliases once (aliases do not chain).
bool apply_alias(const std::string& name, const std::vector<DeviceAlias>& extra, std::string* out) {
  for (const auto& a : extra) {
    if (sglang_device_name(a.from) == name) {
      *out = sglang_device_name(a.to);
      return true;
    }
  }
  for (const auto& a : kAliases) {
    if (a.from == name) {
      *out = std::string(a.to);
      return true;
    }
  }
  return false;
}

}  // namespace

std::string sglang_device_name(std::string_view reported) {
  std::string s(reported);
  std::replace(s.begin(), s.end(), ' ', '_');
  return s;
}

DeviceNameResolution resolve_device_name(std::string_view reported, std::string_view arch, int32_t compute_units,
                                         int64_t memory_bytes, const std::vector<DeviceAlias>& extra_aliases) {
  DeviceNameResolution r;
  const std::string spelled = sglang_device_name(reported);
  std::string aliased;
  if (apply_alias(spelled, extra_aliases, &aliased)) {
    r.canonical = aliased;
    r.why = "device '" + std::string(reported) + "' -> " + aliased + " (alias)";
  } else if (std::find(std::begin(kGenericNames), std::end(kGenericNames), spelled) != std::end(kGenericNames) &&
             !arch.empty() && compute_units > 0) {
    const std::string_view a = strip_arch_features(arch);
    for (const auto& id : kIdentities) {
      if (id.arch != a || id.compute_units != compute_units) continue;
      if (memory_bytes > 0 && memory_bytes < id.min_memory_bytes) continue;
      if (id.max_memory_bytes > 0 && memory_bytes >= id.max_memory_bytes) continue;
      // Unknown memory (0) matches only an identity with no lower bound.
      if (memory_bytes <= 0 && id.min_memory_bytes > 0) continue;
      r.canonical = std::string(id.canonical);
      r.why = "device '" + std::string(reported) + "' (" + std::string(a) + ", " + std::to_string(compute_units) +
              " CUs, " + std::to_string(memory_bytes / kGB) + " GB) -> " + r.canonical + " (hardware identity)";
      break;
    }
    if (r.canonical.empty()) {
      r.canonical = spelled;
      r.why = "device '" + std::string(reported) + "' is a generic name and (" + std::string(a) + ", " +
              std::to_string(compute_units) + " CUs) matches no known part; using " + spelled;
    }
  } else {
    r.canonical = spelled;
    r.why = "device '" + std::string(reported) + "' -> " + spelled;
  }
  r.candidates.push_back(r.canonical);
  if (spelled != r.canonical) r.candidates.push_back(spelled);
  r.known = is_known(r.canonical);
  return r;
}

std::string canonical_file_device_name(std::string_view field, const std::vector<DeviceAlias>& extra_aliases,
                                       bool* known) {
  std::string spelled = sglang_device_name(field);
  std::string aliased;
  if (apply_alias(spelled, extra_aliases, &aliased)) spelled = aliased;
  if (known) *known = is_known(spelled);
  return spelled;
}

namespace {
// SMs of the whole product, by canonical name (NVIDIA's datacenter parts
// that offer MIG, and their siblings): a device reporting fewer is a slice.
struct WholeSms {
  std::string_view name;
  int32_t sms;
};
constexpr WholeSms kWholeSms[] = {
    {"NVIDIA_A100-SXM4-40GB", 108},
    {"NVIDIA_A100-SXM4-80GB", 108},
    {"NVIDIA_A100-PCIE-40GB", 108},
    {"NVIDIA_A100_80GB_PCIe", 108},
    {"NVIDIA_A800-SXM4-80GB", 108},
    {"NVIDIA_A30", 56},
    {"NVIDIA_H100_80GB_HBM3", 132},
    {"NVIDIA_H100_PCIe", 114},
    {"NVIDIA_H100_NVL", 132},
    {"NVIDIA_H800", 132},
    {"NVIDIA_H20", 78},
    {"NVIDIA_H200", 132},
    {"NVIDIA_GH200_480GB", 132},
    {"NVIDIA_B200", 148},
};

// The n-th comma-separated entry of a CUDA_VISIBLE_DEVICES value.
std::string_view visible_entry(std::string_view list, int32_t n) {
  for (int32_t i = 0; i <= n; ++i) {
    const size_t comma = list.find(',');
    if (i == n) return list.substr(0, comma);
    if (comma == std::string_view::npos) return {};
    list.remove_prefix(comma + 1);
  }
  return {};
}
}  // namespace

std::string gpu_partition_of(std::string_view canonical_name, int32_t compute_units, std::string_view pci_bus_id,
                             std::string_view visible_devices, int32_t ordinal) {
  int32_t whole = 0;
  for (const auto& w : kWholeSms)
    if (w.name == canonical_name) whole = w.sms;
  std::string_view entry = visible_entry(visible_devices, ordinal);
  while (!entry.empty() && entry.front() == ' ') entry.remove_prefix(1);
  const bool mig_selected = entry.substr(0, 4) == "MIG-";
  if (!(whole > 0 && compute_units > 0 && compute_units < whole) && !mig_selected) return {};
  std::string s = "MIG instance: ";
  if (whole > 0 && compute_units > 0)
    s += std::to_string(compute_units) + " of the " + std::to_string(whole) + " SMs";
  else
    s += std::to_string(compute_units) + " SMs";
  s += " of the " + std::string(canonical_name);
  if (!pci_bus_id.empty()) s += " at PCI " + std::string(pci_bus_id);
  if (mig_selected) s += " (CUDA_VISIBLE_DEVICES " + std::string(entry) + ")";
  return s;
}

}  // namespace dispatch
