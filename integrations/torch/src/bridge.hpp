// SPDX-License-Identifier: Apache-2.0
// libkdispatch_torch: the plain interface between its three translation
// units, so that none of them includes what another needs:
// - torch_ops.cpp  the op registrations and bodies (torch headers; no CUDA,
//                  HIP or DLPack header);
// - call.cpp       the kdispatch call through the C ABI (DLPack's DLTensor
//                  built on the stack; no torch header);
// - cuda_stream.cpp the current stream and its capture status (torch's
//                  CUDA headers; compiled only against a CUDA-enabled torch,
//                  and the only file a HIP port changes).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kdispatch_torch {

/// A strided view as kdispatch takes it (DLPack's fields, element strides).
struct View {
  void* data = nullptr;  ///< null: an absent optional argument
  int32_t ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};
  int64_t strides[4] = {0, 0, 0, 0};
  uint8_t code = 0;  ///< DLDataTypeCode (0 int, 1 uint, 2 float, 4 bfloat)
  uint8_t bits = 0;
  int32_t device_type = 1;  ///< DLDeviceType (1 CPU, 2 CUDA, 10 ROCm)
  int32_t device_id = 0;
};

/// What served a call (kdispatch_dispatch_info, copied).
struct Served {
  int32_t source = -1;       ///< 0 table, 1 default, 2 forced; -1 no call
  const char* variant = "";  ///< static storage
  int64_t table_m = -1;
  uint32_t source_id = 0;
  bool tuned_now = false;
};

/// kdispatch_op_call on the runtime `rt` (a kdispatch_runtime*; null: the
/// default runtime), with `workspace_bytes` at `workspace` for this call
/// (null: the stream's attached one). Returns the kdispatch status code (0
/// ok); on failure `error` holds "<code name>: <message>" (truncated to
/// `error_size`).
int call(void* rt, const char* op, const View* views, int32_t n_views, const float* scalars, int32_t n_scalars,
         void* stream, bool capturing, Served* served, char* error, std::size_t error_size, void* workspace = nullptr,
         int64_t workspace_bytes = 0) noexcept;

/// kdispatch_op_workspace_bytes: the bytes of workspace this call may ask
/// for, or -1 when the library refuses the call (the call itself then
/// names the error).
int64_t workspace_bytes(const char* op, const View* views, int32_t n_views, const float* scalars,
                        int32_t n_scalars) noexcept;

/// The bytes of the workspace attach_stream gives a stream (torch's cuBLAS
/// workspace on Hopper); a call that may ask for more gets its own.
constexpr int64_t kStreamWorkspaceBytes = int64_t{32} << 20;

/// Gives `stream` of GPU `device_id` a kdispatch-owned gemm workspace
/// (kdispatch_runtime_attach_stream: device memory kdispatch allocates
/// itself, never from torch's allocator or a graph pool). Call outside any
/// capture. Returns the status code.
int attach_stream(void* rt, int32_t device_type, int32_t device_id, void* stream) noexcept;

/// The default runtime (kdispatch_default_runtime), or null with `error`
/// filled when it cannot be built.
void* default_runtime(char* error, std::size_t error_size) noexcept;

/// The path of the libkdispatch this library calls (dladdr), "" when unknown.
const char* library_path() noexcept;

/// The GPU side (cuda_stream.cpp): null in a build against a CPU-only torch.
struct GpuHooks {
  int32_t dl_device_type;                         ///< 2 (CUDA) or 10 (ROCm)
  void* (*current_stream)(int32_t device_index);  ///< torch's current stream of that device
  bool (*is_capturing)(void* stream);             ///< the stream is being captured into a graph
  bool (*launch_empty)(void* stream);             ///< one empty kernel (the floor op)
};
const GpuHooks* gpu_hooks() noexcept;
void set_gpu_hooks(const GpuHooks* hooks) noexcept;

}  // namespace kdispatch_torch
