// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — host-side helpers every kernel family's launcher
// shares (norms, GEMM): the device guard, alignment tests and the kernel
// image probe. Device-compiled TUs only (after gpu/port.hpp).
#pragma once

#include <cstdint>

#include "gpu/port.hpp"  // first: defines KDISPATCH_GPU_NS

#include "gpu/backend_decls.hpp"

namespace dispatch::KDISPATCH_GPU_NS {

/// Makes the tensor's device current around a launch when the process sees
/// several devices (a single-device process pays one relaxed load).
class DeviceGuard {
 public:
  explicit DeviceGuard(int32_t ordinal) noexcept {
    if (!multi_device()) return;
    int cur = 0;
    if (port::get_device(&cur) == port::kSuccess && cur != ordinal && port::set_device(ordinal) == port::kSuccess)
      prev_ = cur;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) (void)port::set_device(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

/// What every launcher sets up before its launches, in this order: the
/// call's stream, the tensor's device made current for the scope
/// (DeviceGuard), and whether the launches use programmatic dependent
/// launch (pdl_enabled).
struct LaunchScope {
  port::Stream stream;
  DeviceGuard guard;
  bool pdl;
  LaunchScope(const core::LaunchArgs& la, const core::Problem& p) noexcept
      : stream(static_cast<port::Stream>(la.stream)), guard(p.device.ordinal), pdl(pdl_enabled(p.device.ordinal)) {}
};

inline bool aligned16(const void* p) noexcept { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

/// What the runtime says about one compiled kernel on the current device.
template <class K>
inline KernelImage image_of(K* kernel) noexcept {
  const port::FuncInfo fi = port::func_info(kernel);
  KernelImage k;
  k.loadable = fi.loadable;
  k.max_threads = fi.max_threads;
  k.num_regs = fi.num_regs;
  k.local_bytes = fi.local_bytes;
  k.error = static_cast<int32_t>(fi.error);
  return k;
}

#if !KDISPATCH_GPU_HIP
/// image_of, with the kernel's dynamic shared memory limit raised to
/// `smem_bytes` on the current device (over 48 KiB needs the opt-in); not
/// loadable, with the runtime's error, where the device refuses.
template <class K>
inline KernelImage image_with_smem(K* kernel, int64_t smem_bytes) noexcept {
  KernelImage k = image_of(kernel);
  if (!k.loadable) return k;
  const port::Error e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_bytes));
  if (e != port::kSuccess) {
    (void)cudaGetLastError();
    k.loadable = false;
    k.error = static_cast<int32_t>(e);
  }
  return k;
}

/// image_with_smem for a kernel that runs on sm_90a alone (wgmma,
/// setmaxnreg): not loadable (cudaErrorNoKernelImageForDevice) unless its
/// TU's module runs the sm_90a SASS here (`runs`: kd_wgmma::sm90a_code_runs,
/// read from the module itself) with binary version 90; elsewhere the
/// compute_90 PTX's body of such a kernel is a trap.
template <class K>
inline KernelImage wgmma_image(K* kernel, int64_t smem_bytes, bool runs) noexcept {
  const port::FuncInfo fi = port::func_info(kernel);
  if (fi.loadable && (fi.binary_version != 90 || !runs)) {
    KernelImage k;
    k.error = static_cast<int32_t>(cudaErrorNoKernelImageForDevice);
    return k;
  }
  return image_with_smem(kernel, smem_bytes);
}
#endif

}  // namespace dispatch::KDISPATCH_GPU_NS
