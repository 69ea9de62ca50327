// SPDX-License-Identifier: Apache-2.0
// kdispatch — device descriptions and device-name resolution.
//
// Config files are keyed by `device_name` spelled as SGLang spells it: the
// runtime's device string with spaces turned into '_' ("NVIDIA H200" ->
// "NVIDIA_H200"). Some parts report several names (ROCm's generic
// "AMD Radeon Graphics" for MI300-class parts, "MI325 OAM" vs "MI325X"); the
// resolver maps those to one canonical name using the arch, the compute-unit
// count and the memory size. It never matches by prefix or fuzzily: a file
// named for "NVIDIA_H100" is not served to "NVIDIA H100 80GB HBM3".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch/export.hpp"
#include "dispatch/types.hpp"

namespace dispatch {

/// What kdispatch knows about one device, probed once per ordinal.
/// Thread-safety: an immutable value once returned.
struct DeviceInfo {
  Device device{};
  /// Canonical device name used in config keys, e.g. "NVIDIA_H200",
  /// "AMD_Instinct_MI300X", or for the CPU an ISA class such as
  /// "CPU_x86_64_AVX2" (never the host's model string, so CPU config files
  /// travel between hosts).
  std::string device_name;
  /// The name as the device runtime reported it ("NVIDIA H200"); for the CPU
  /// the model string from /proc/cpuinfo (informational only).
  std::string reported_name;
  /// Architecture: "sm_90a", "gfx942", or for the CPU the ISA class in lower
  /// case ("x86_64_avx512", "x86_64_avx2", "x86_64_sse", "aarch64_neon").
  std::string arch;
  /// Streaming multiprocessors (CUDA), compute units (HIP) or hardware
  /// threads (CPU).
  int32_t compute_units = 0;
  /// Device memory (GPU) or physical memory (CPU), bytes.
  int64_t memory_bytes = 0;
  /// L2 cache (GPU) or last-level cache (CPU), bytes; 0 when unknown.
  int64_t l2_bytes = 0;
  /// Shared memory per block (GPU), bytes; 0 on the CPU.
  int64_t smem_per_block_bytes = 0;
  /// Warp/wavefront width (32 or 64); 1 on the CPU.
  int32_t warp_size = 1;
  /// The runtime's device UUID as text ("GPU-8c0e...-..."; for a MIG
  /// instance CUDA reports the instance's own UUID); "" when the runtime
  /// has none (the CPU, HIP).
  std::string uuid;
  /// The physical GPU's PCI address ("0000:3b:00.0"); the MIG instances of
  /// one GPU all report it. "" on the CPU.
  std::string pci_bus_id;
  /// "" for a whole device. For a partition of one (an NVIDIA MIG
  /// instance), which GPU it is a part of and how much of it:
  /// "MIG instance: 16 of the 132 SMs of the NVIDIA_H200 at PCI
  /// 0000:3b:00.0". A partition has its own tuning fingerprint (its SM
  /// count is an axis): results tuned on a slice never serve the whole GPU.
  std::string partition;
  /// False when the backend is compiled in but no usable device was found;
  /// `unavailable_reason` then says why in one line.
  bool available = false;
  std::string unavailable_reason;
};

/// SGLang's spelling of a reported device name: spaces become '_'. Nothing
/// else changes ("NVIDIA A100-SXM4-80GB" -> "NVIDIA_A100-SXM4-80GB").
/// Thread-safe. Not noexcept: allocates its result, and throws
/// std::bad_alloc (only) when memory runs out.
KDISPATCH_API std::string sglang_device_name(std::string_view reported);

/// A user-supplied alias: a reported or file name that should be treated as
/// another canonical name (e.g. {"NVIDIA H200 NVL", "NVIDIA_H200"}). Both
/// sides may use spaces or '_'.
struct DeviceAlias {
  std::string from;
  std::string to;
};

/// Result of resolving a device name.
struct DeviceNameResolution {
  /// Canonical name: the alias or the hardware-identity match, else the
  /// SGLang spelling of the reported name.
  std::string canonical;
  /// Names to try in a config lookup, most specific first: the canonical
  /// name, then the SGLang spelling of the reported name when it differs
  /// (so "AMD Radeon Graphics" on an MI300X tries AMD_Instinct_MI300X, then
  /// AMD_Radeon_Graphics). Exact names only.
  std::vector<std::string> candidates;
  /// True when the canonical name is in kdispatch's table of known devices.
  bool known = false;
  /// One line on how the name was resolved (for lookup's "why").
  std::string why;
};

/// Resolves a reported device name to the canonical config-file name.
/// Rules, in order: (1) `extra_aliases`, then the built-in alias table
/// (e.g. "AMD Instinct MI325 OAM" -> "AMD_Instinct_MI325X",
/// "NVIDIA H200 NVL" -> "NVIDIA_H200"); (2) for generic names that several
/// parts report ("AMD Radeon Graphics"), the hardware identity: `arch`,
/// `compute_units` and `memory_bytes` (gfx942 with 304 CUs and < 224 GB is
/// an MI300X, with more memory an MI325X; gfx942 with 80 CUs is an MI308X);
/// (3) otherwise the SGLang spelling unchanged. Pass 0/empty for unknown
/// hardware fields. Thread-safe; allocates. Not noexcept: throws
/// std::bad_alloc (only) when memory runs out.
KDISPATCH_API DeviceNameResolution resolve_device_name(std::string_view reported, std::string_view arch = {},
                                                       int32_t compute_units = 0, int64_t memory_bytes = 0,
                                                       const std::vector<DeviceAlias>& extra_aliases = {});

/// Canonical form of a device name found in a config file name, through the
/// same alias tables (no hardware identity is known for a file). Sets
/// `*known` to whether the result is a known device name (when `known` is
/// not null). Thread-safe. Not noexcept: allocates its result, and throws
/// std::bad_alloc (only) when memory runs out.
KDISPATCH_API std::string canonical_file_device_name(std::string_view file_name_field,
                                                     const std::vector<DeviceAlias>& extra_aliases, bool* known);

/// The partition description of a GPU (DeviceInfo::partition): "" for a
/// whole GPU; else which GPU it is a part of. A device is a partition when
/// its SM count is below the whole product's (known for NVIDIA's
/// datacenter GPUs by canonical name) or when `visible_devices` (the
/// CUDA_VISIBLE_DEVICES value) selects it by a "MIG-" UUID. `ordinal` picks
/// the entry of `visible_devices`. Thread-safe; allocates. Not noexcept:
/// throws std::bad_alloc (only) when memory runs out.
KDISPATCH_API std::string gpu_partition_of(std::string_view canonical_name, int32_t compute_units,
                                           std::string_view pci_bus_id, std::string_view visible_devices,
                                           int32_t ordinal);

/// The host CPU as a device: ISA class name, core count, memory, LLC size.
/// Probed once; thread-safe.
KDISPATCH_API const DeviceInfo& cpu_device_info() noexcept;

}  // namespace dispatch
