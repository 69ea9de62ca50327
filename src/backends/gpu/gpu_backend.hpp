// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the GPU backends as the rest of the library sees them:
// one entry table per compiled backend (CUDA, HIP), nullptr for a backend
// this build does not have. Plain C++: the registry, the runtime, the store
// and the tests reach the GPU code only through this header, never through
// a CUDA or HIP header.
//
// Availability: a backend compiled in but with no usable device (no driver:
// CUDA error 35 or 34; no GPU: 100; HIP 100) still has its table; its
// status() says available = false with a one-line reason, device_info()
// returns nullptr, and tensors on it get unsupported_device.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::tune {
class DeviceMemory;
}

namespace dispatch::gpu {

struct BackendOps {
  DeviceType type = DeviceType::cuda;
  /// Every variant of the backend, in list order.
  std::span<const core::VariantDef* const> (*variants)() noexcept = nullptr;
  /// The analytical default plan (an invalid Plan for an op the backend lacks).
  core::Plan (*get_default)(const core::Problem& p, const DeviceInfo& dev) noexcept = nullptr;
  /// The probed description of device `ordinal` (probed once, on first use),
  /// or nullptr when the backend has no usable device of that ordinal.
  /// After the first call per ordinal: a few loads, no lock, no allocation.
  const DeviceInfo* (*device_info)(int32_t ordinal) noexcept = nullptr;
  /// Ordinal 0's description, or why the backend is unavailable
  /// (available = false and a one-line unavailable_reason).
  const DeviceInfo& (*status)() noexcept = nullptr;
  /// The tuner's memory and clock for this backend (device 0: the current
  /// device of the calling thread).
  tune::DeviceMemory* (*memory)() noexcept = nullptr;
  /// "cuda runtime 13000, driver 13000" — the runtime axis of the tuning
  /// fingerprint.
  const std::string& (*runtime_versions)() noexcept = nullptr;
  /// True when `stream` is being captured into a graph (false on errors).
  bool (*stream_capturing)(void* stream) noexcept = nullptr;
  /// Waits for the work queued on `stream` (sync-mode tuning on the caller's
  /// buffers: the tuner's launches run on the legacy default stream, which a
  /// non-blocking caller stream does not order against).
  Status (*stream_synchronize)(void* stream) noexcept = nullptr;
  /// Called once on the background tuner's thread before its first GPU
  /// call: relaxed capture mode, so its allocations and copies neither fail
  /// nor invalidate an engine thread's CUDA-graph capture (global mode).
  /// On CUDA the tuner's own work runs on its thread's per-thread default
  /// stream (cuda_device.cu is built with --default-stream=per-thread),
  /// never on the legacy stream that orders against the engine's blocking
  /// streams (not yet on HIP: cmake/backends.cmake says why).
  void (*prepare_tuner_thread)() noexcept = nullptr;
  /// The stream the tuner launches candidates on, the one its clock and
  /// memory use: CUDA's per-thread default stream (cudaStreamPerThread) of
  /// the tuning thread; null (the legacy stream) on HIP.
  void* tuner_stream = nullptr;
  /// The calling tuning thread's GEMM workspace (allocated on its first
  /// use, kept for the process; *bytes = 0 and nullptr when that failed).
  void* (*tuner_workspace)(int64_t* bytes) noexcept = nullptr;
  /// Device memory on device `ordinal` (Runtime::attach_stream's
  /// workspaces), nullptr on failure; and its release.
  void* (*alloc_device)(int32_t ordinal, int64_t bytes) noexcept = nullptr;
  void (*free_device)(void* p) noexcept = nullptr;
  /// The vendor GEMM library the backend uses, one line ("cuBLASLt 130100
  /// (/usr/local/cuda/lib/libcublasLt.so.13)"), or why there is none.
  const std::string& (*library_versions)() noexcept = nullptr;
  /// The floor of a problem (the plan the engine would run without us:
  /// cuBLAS / cuBLASLt as torch calls them), the incumbent every search
  /// must beat; get_default's plan for an op without one.
  core::Plan (*floor)(const core::Problem& p, const DeviceInfo& dev) noexcept = nullptr;
};

/// The entry table of a GPU backend, or nullptr when it is not compiled in
/// (and for the CPU).
const BackendOps* backend_ops(DeviceType type) noexcept;

}  // namespace dispatch::gpu
