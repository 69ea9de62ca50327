// SPDX-License-Identifier: Apache-2.0
// libkdispatch_torch: the kdispatch call through the C ABI. DLTensors are
// filled on the stack from the views torch_ops.cpp read off the at::Tensors
// (no DLPack capsule, no copy, no allocation). The C ABI keeps this library
// independent of the C++ standard library ABI torch was built with.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "bridge.hpp"
#include "dispatch/c_api.h"

namespace kdispatch_torch {
namespace {

void put_error(kdispatch_status s, char* error, std::size_t size) noexcept {
  if (size == 0) return;
  std::snprintf(error, size, "%s: %s", kdispatch_status_name(s), kdispatch_last_error_message());
}

std::atomic<const GpuHooks*> g_hooks{nullptr};

constexpr int kMax = KDISPATCH_MAX_OP_TENSORS;

// The views as DLTensors (`t`, pointed to by `p`; NULL for an absent one).
void to_dl(const View* views, int32_t n_views, DLTensor* t, const DLTensor** p) noexcept {
  for (int32_t i = 0; i < n_views; ++i) {
    const View& v = views[i];
    if (v.data == nullptr) {
      p[i] = nullptr;
      continue;
    }
    t[i].data = v.data;
    t[i].device = DLDevice{static_cast<DLDeviceType>(v.device_type), v.device_id};
    t[i].ndim = v.ndim;
    t[i].dtype = DLDataType{v.code, v.bits, 1};
    t[i].shape = const_cast<int64_t*>(v.shape);
    t[i].strides = const_cast<int64_t*>(v.strides);
    t[i].byte_offset = 0;
    p[i] = &t[i];
  }
}

}  // namespace

int call(void* rt, const char* op, const View* views, int32_t n_views, const float* scalars, int32_t n_scalars,
         void* stream, bool capturing, Served* served, char* error, std::size_t error_size, void* workspace,
         int64_t workspace_bytes) noexcept {
  if (n_views > kMax) {
    std::snprintf(error, error_size, "invalid_argument: %d tensors (at most %d)", n_views, kMax);
    return KDISPATCH_INVALID_ARGUMENT;
  }
  DLTensor t[kMax];
  const DLTensor* p[kMax];
  to_dl(views, n_views, t, p);
  kdispatch_dispatch_info info;
  info.struct_size = sizeof(info);
  info.variant = nullptr;
  const kdispatch_status s =
      kdispatch_op_call(static_cast<kdispatch_runtime*>(rt), op, p, n_views, scalars, n_scalars, workspace,
                        workspace_bytes, stream, capturing ? KDISPATCH_CALL_CAPTURING : 0u, served ? &info : nullptr);
  if (s != KDISPATCH_OK) {
    put_error(s, error, error_size);
    return s;
  }
  if (served) {
    served->source = info.source;
    served->variant = info.variant ? info.variant : "";
    served->table_m = info.table_m;
    served->source_id = info.source_id;
    served->tuned_now = info.tuned_now != 0;
  }
  return KDISPATCH_OK;
}

int64_t workspace_bytes(const char* op, const View* views, int32_t n_views, const float* scalars,
                        int32_t n_scalars) noexcept {
  if (n_views > kMax) return -1;
  DLTensor t[kMax];
  const DLTensor* p[kMax];
  to_dl(views, n_views, t, p);
  int64_t bytes = 0;
  return kdispatch_op_workspace_bytes(op, p, n_views, scalars, n_scalars, &bytes) == KDISPATCH_OK ? bytes : -1;
}

int attach_stream(void* rt, int32_t device_type, int32_t device_id, void* stream) noexcept {
  return kdispatch_runtime_attach_stream(static_cast<kdispatch_runtime*>(rt), device_type, device_id, stream,
                                         kStreamWorkspaceBytes);
}

void* default_runtime(char* error, std::size_t error_size) noexcept {
  kdispatch_runtime* rt = nullptr;
  const kdispatch_status s = kdispatch_default_runtime(&rt);
  if (s != KDISPATCH_OK) {
    put_error(s, error, error_size);
    return nullptr;
  }
  return rt;
}

const char* library_path() noexcept {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&kdispatch_op_call), &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

const GpuHooks* gpu_hooks() noexcept { return g_hooks.load(std::memory_order_acquire); }
void set_gpu_hooks(const GpuHooks* hooks) noexcept { g_hooks.store(hooks, std::memory_order_release); }

}  // namespace kdispatch_torch
