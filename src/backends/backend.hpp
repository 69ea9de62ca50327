// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — a backend is one object (issue 34): everything the
// shared layers (api, table, store, tune, the C ABI) ask of "the CPU", "CUDA"
// or "HIP" is a member of its Backend, and they never branch on the device
// type. One Backend per compiled device type, the CPU included:
//
//   src/backends/cpu/        the CPU backend (kernels in kernels/cpu/)
//   src/backends/gpu/        CUDA and HIP, written once (kernels in
//                            kernels/{gpu,cuda,hip}/)
//
// The registry (find(), compiled()) is the list of compiled backends. A call
// resolves its backend once (find(device.type)); the tuner gets a
// `const Backend&` per shape; the fingerprint asks the backend for its axes.
//
// Thread-safety: every member is safe to call from any thread. The objects
// are constant-initialised and never destroyed (find() is a load).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/op.hpp"
#include "dispatch/device.hpp"
#include "dispatch/status.hpp"

namespace dispatch::backends {

class DeviceMemory;

/// One compiled backend. Members with a body here are what a backend
/// without the capability answers (the CPU: no streams, no device memory).
class Backend {
 public:
  constexpr explicit Backend(DeviceType type) noexcept : type_(type) {}
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  DeviceType type() const noexcept { return type_; }
  /// "cpu", "cuda", "hip" (device_type_name).
  std::string_view name() const noexcept;
  /// True for the host backend: no device memory, no streams, no workspace;
  /// its rows record the CPU they were tuned on (store/row_meta.hpp).
  virtual bool is_host() const noexcept { return false; }

  // ---- the op table (kernels/<backend>/): variants and default rules
  /// Every variant of the backend, in list order (the registry's order).
  virtual std::span<const core::VariantDef* const> variants() const noexcept = 0;
  /// The analytical default plan (an invalid Plan for an op or dtype
  /// combination the backend lacks).
  virtual core::Plan get_default(const core::Problem& p, const DeviceInfo& dev) const noexcept = 0;
  /// The floor: the plan the engine would run without us (CUDA GEMMs:
  /// cuBLAS / cuBLASLt as torch calls them), the incumbent of every search;
  /// get_default's plan where the backend has none.
  virtual core::Plan floor(const core::Problem& p, const DeviceInfo& dev) const noexcept { return get_default(p, dev); }
  /// Whether the backend's default rule can tell, without the device the
  /// problem is for, that no variant computes p's dtypes: the host's can
  /// (its rule reads no device state); a GPU's cannot (true: only supports()
  /// on the file's own device tells).
  virtual bool dtypes_known_offline() const noexcept { return false; }

  // ---- devices
  /// The probed description of device `ordinal` (probed once, on first
  /// use), or nullptr when the backend has no usable device of that
  /// ordinal. After the first call per ordinal: a few loads, no lock.
  virtual const DeviceInfo* device_info(int32_t ordinal) const noexcept = 0;
  /// Ordinal 0's description, or why the backend is unavailable
  /// (available = false and a one-line unavailable_reason).
  virtual const DeviceInfo& status() const noexcept = 0;
  /// Why a tensor on this backend's device type has no usable device, for
  /// an op's unsupported_device error.
  virtual const char* no_device_message() const noexcept = 0;

  // ---- the tuner
  /// The tuner's memory and clock for this backend (host memory for the
  /// CPU; a GPU's: device 0, the calling thread's current device).
  virtual DeviceMemory& memory() const noexcept = 0;
  /// True when `stream` is being captured into a graph (false on errors).
  virtual bool stream_capturing(void* stream) const noexcept { return (void)stream, false; }
  /// Waits for the work queued on `stream` (sync-mode tuning on the
  /// caller's buffers).
  virtual Status stream_synchronize(void* stream) const noexcept { return (void)stream, Status(); }
  /// Called once on the background tuner's thread before its first call
  /// into the backend (CUDA: relaxed capture mode, so its allocations
  /// neither fail nor invalidate an engine thread's graph capture).
  virtual void prepare_tuner_thread() const noexcept {}
  /// The stream the tuner launches candidates on (CUDA: the tuning
  /// thread's per-thread default stream), null for the legacy stream / the
  /// host.
  virtual void* tuner_stream() const noexcept { return nullptr; }
  /// The calling tuning thread's workspace, at least `min_bytes` when that
  /// can be allocated (allocated on first use, grown when a search needs
  /// more, kept for the process); *bytes its size, 0 with nullptr when
  /// there is none. A smaller one than asked (the allocation failed) makes
  /// the candidates that need more decline with their fallback code.
  virtual void* tuner_workspace(int64_t min_bytes, int64_t* bytes) const noexcept {
    return (void)min_bytes, *bytes = 0, nullptr;
  }
  /// Device memory on device `ordinal` (Runtime::attach_stream's
  /// workspaces), nullptr on failure or on the host; and its release.
  virtual void* alloc_device(int32_t ordinal, int64_t bytes) const noexcept {
    return (void)ordinal, (void)bytes, nullptr;
  }
  virtual void free_device(void* p) const noexcept { (void)p; }

  // ---- the tuning fingerprint (store/fingerprint.hpp)
  /// The runtime axis: "cuda runtime 13000, driver 13000"; "cpu" on the host.
  virtual const std::string& runtime_versions() const noexcept = 0;
  /// The vendor library the backend uses, one line, or why there is none.
  virtual const std::string& library_versions() const noexcept = 0;
  /// The axes of this backend beyond the shared ones, appended as (name,
  /// value): a GPU's SM count (a MIG slice's winners are not the whole
  /// GPU's); the CPU's affinity count (a winner on 2 threads is not one for
  /// a process pinned to 1).
  virtual void fingerprint_axes(const DeviceInfo& dev,
                                std::vector<std::pair<std::string, std::string>>* axes) const = 0;

 protected:
  ~Backend() = default;  // constant-initialised objects, never deleted

 private:
  DeviceType type_;
};

/// The compiled backends, the CPU first, then CUDA and HIP where this build
/// has them.
std::span<const Backend* const> compiled() noexcept;

/// The backend of a device type, or nullptr when it is not compiled in.
const Backend* find(DeviceType type) noexcept;

/// find(type) && find(type)->is_host().
bool is_host(DeviceType type) noexcept;

/// The tuning fingerprint's axes of `dev`'s backend, appended to `axes`
/// (Backend::fingerprint_axes); for a GPU type this build does not compile
/// (a description of another machine's device), the GPU backends' rule,
/// gpu_fingerprint_axes, so that its fingerprint is the one that machine
/// computes.
void fingerprint_axes(const DeviceInfo& dev, std::vector<std::pair<std::string, std::string>>* axes);

/// The GPU backends' axes (CUDA and HIP): the SM / CU count the search ran
/// on ("compute_units"; a MIG slice's winners are not the whole GPU's).
void gpu_fingerprint_axes(const DeviceInfo& dev, std::vector<std::pair<std::string, std::string>>* axes);

/// The device type of a canonical device name (CPU_* the CPU, AMD_* and
/// Radeon HIP, the rest CUDA), compiled in or not (a config file of another
/// machine names it).
DeviceType type_of_device_name(std::string_view canonical) noexcept;

}  // namespace dispatch::backends

namespace dispatch::cpu {
/// The CPU backend (src/backends/cpu/cpu_backend.cpp).
const backends::Backend& backend() noexcept;
}  // namespace dispatch::cpu
