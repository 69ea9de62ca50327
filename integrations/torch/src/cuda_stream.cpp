// SPDX-License-Identifier: Apache-2.0
// libkdispatch_torch, the GPU side: torch's current stream of a device, its
// capture status, and one empty kernel (the floor op's launch). Compiled
// only against a CUDA-enabled torch; a HIP port is this file (hipify of
// the stream calls, device type 10, a code object instead of PTX) —
// untested: no ROCm torch is available to the project.
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAStream.h>
#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "bridge.hpp"

// No CUDA runtime call of our own: the stream and its capture status come
// from torch's c10_cuda (torch's own CUDA runtime, whichever it bundles),
// the empty kernel from the driver (libcuda.so.1, dlopen'ed), so a CUDA
// toolkit of another major version on the build machine cannot put a
// second runtime in the process.
namespace kdispatch_torch {
namespace {

void* current_stream(int32_t device_index) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index)).stream();
}

// The caller has made the stream's device current (a device guard) and the
// stream is that device's current stream: c10's capture query answers for it.
bool is_capturing(void* /*stream*/) {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

// An empty kernel, as PTX (JIT-compiled once per device by the driver).
constexpr char kEmptyPtx[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry kdispatch_empty()\n{\n ret;\n}\n";

// The driver API, typed by hand (CUresult int, handles as pointers).
using ModuleLoadData = int (*)(void** module, const void* image);
using ModuleGetFunction = int (*)(void** fn, void* module, const char* name);
using LaunchKernel = int (*)(void* fn, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             void* stream, void** params, void** extra);
using CtxGetDevice = int (*)(int* device);

struct Driver {
  ModuleLoadData load = nullptr;
  ModuleGetFunction get = nullptr;
  LaunchKernel launch = nullptr;
  CtxGetDevice ctx_device = nullptr;
  Driver() {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h == nullptr) return;
    load = reinterpret_cast<ModuleLoadData>(dlsym(h, "cuModuleLoadData"));
    get = reinterpret_cast<ModuleGetFunction>(dlsym(h, "cuModuleGetFunction"));
    launch = reinterpret_cast<LaunchKernel>(dlsym(h, "cuLaunchKernel"));
    ctx_device = reinterpret_cast<CtxGetDevice>(dlsym(h, "cuCtxGetDevice"));
  }
  bool ok() const { return load && get && launch && ctx_device; }
};

bool launch_empty(void* stream) {
  static const Driver drv;
  if (!drv.ok()) return false;
  constexpr int kDevices = 64;
  static std::atomic<void*> fn[kDevices] = {};
  static std::mutex mu;
  int dev = 0;
  if (drv.ctx_device(&dev) != 0 || dev < 0 || dev >= kDevices) return false;
  void* f = fn[dev].load(std::memory_order_acquire);
  if (f == nullptr) {
    std::lock_guard<std::mutex> lock(mu);
    f = fn[dev].load(std::memory_order_relaxed);
    if (f == nullptr) {
      void* mod = nullptr;
      if (drv.load(&mod, kEmptyPtx) != 0 || drv.get(&f, mod, "kdispatch_empty") != 0) return false;
      fn[dev].store(f, std::memory_order_release);
    }
  }
  return drv.launch(f, 1, 1, 1, 32, 1, 1, 0, stream, nullptr, nullptr) == 0;
}

const GpuHooks kHooks{2, &current_stream, &is_capturing, &launch_empty};

struct Register {
  Register() { set_gpu_hooks(&kHooks); }
} register_hooks;

}  // namespace
}  // namespace kdispatch_torch
