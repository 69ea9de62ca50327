// SPDX-License-Identifier: Apache-2.0
// The GPU backends compiled into this build (KDISPATCH_HAVE_CUDA /
// KDISPATCH_HIP come from cmake/backends.cmake).
#include "backends/gpu/gpu_backend.hpp"

namespace dispatch {
#if KDISPATCH_HAVE_CUDA
namespace cuda {
const gpu::BackendOps& backend_ops() noexcept;
}
#endif
#if KDISPATCH_HAVE_HIP
namespace hip {
const gpu::BackendOps& backend_ops() noexcept;
}
#endif
}  // namespace dispatch

namespace dispatch::gpu {

const BackendOps* backend_ops(DeviceType type) noexcept {
  switch (type) {
    case DeviceType::cuda:
#if KDISPATCH_HAVE_CUDA
      return &cuda::backend_ops();
#else
      return nullptr;
#endif
    case DeviceType::hip:
#if KDISPATCH_HAVE_HIP
      return &hip::backend_ops();
#else
      return nullptr;
#endif
    case DeviceType::cpu: return nullptr;
  }
  return nullptr;
}

}  // namespace dispatch::gpu
