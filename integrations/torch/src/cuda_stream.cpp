// SPDX-License-Identifier: Apache-2.0
// libkdispatch_torch, the GPU side: torch's current stream of a device, its
// capture status, and one empty kernel (the floor op's launch). Compiled
// only against a CUDA-enabled torch; a HIP port is this file (hipify of
// the stream calls, device type 10, a code object instead of PTX) —
// untested: no ROCm torch is available to the project.
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <mutex>

#include "bridge.hpp"

namespace kdispatch_torch {
namespace {

void* current_stream(int32_t device_index) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index)).stream();
}

bool is_capturing(void* stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return st != cudaStreamCaptureStatusNone;
}

// An empty kernel, as PTX (JIT-compiled once per device by the driver).
constexpr char kEmptyPtx[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry kdispatch_empty()\n{\n ret;\n}\n";

using ModuleLoadData = CUresult (*)(CUmodule*, const void*);
using ModuleGetFunction = CUresult (*)(CUfunction*, CUmodule, const char*);
using LaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  CUstream, void**, void**);
using CtxGetDevice = CUresult (*)(CUdevice*);

template <class F>
F entry(const char* name) {
  void* p = nullptr;
#if CUDART_VERSION >= 12000
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPoint(name, &p, cudaEnableDefault, &q) != cudaSuccess) return nullptr;
#else
  if (cudaGetDriverEntryPoint(name, &p, cudaEnableDefault) != cudaSuccess) return nullptr;
#endif
  return reinterpret_cast<F>(p);
}

bool launch_empty(void* stream) {
  static const ModuleLoadData load = entry<ModuleLoadData>("cuModuleLoadData");
  static const ModuleGetFunction get = entry<ModuleGetFunction>("cuModuleGetFunction");
  static const LaunchKernel launch = entry<LaunchKernel>("cuLaunchKernel");
  static const CtxGetDevice ctx_device = entry<CtxGetDevice>("cuCtxGetDevice");
  if (!load || !get || !launch || !ctx_device) return false;
  constexpr int kDevices = 64;
  static CUfunction fn[kDevices] = {};
  static std::mutex mu;
  CUdevice dev = 0;
  if (ctx_device(&dev) != CUDA_SUCCESS || dev < 0 || dev >= kDevices) return false;
  CUfunction f = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (fn[dev] == nullptr) {
      CUmodule mod = nullptr;
      if (load(&mod, kEmptyPtx) != CUDA_SUCCESS || get(&fn[dev], mod, "kdispatch_empty") != CUDA_SUCCESS)
        return false;
    }
    f = fn[dev];
  }
  return launch(f, 1, 1, 1, 32, 1, 1, 0, static_cast<CUstream>(stream), nullptr, nullptr) == CUDA_SUCCESS;
}

const GpuHooks kHooks{2, &current_stream, &is_capturing, &launch_empty};

struct Register {
  Register() { set_gpu_hooks(&kHooks); }
} register_hooks;

}  // namespace
}  // namespace kdispatch_torch
