// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — what the pieces of one GPU backend (CUDA or HIP)
// declare to each other. Included with KDISPATCH_GPU_NS defined: by
// gpu/port.hpp in the device translation units, by hand in the plain C++ ones
// (kernels/cuda/norm_list.cpp, kernels/hip/norm_list.cpp). Plain C++: no GPU
// headers.
//
//   kernels/<backend>/<op>_<dtype>.{cu,hip}   the kernels of one (op, dtype),
//                                             their launcher and image probe
//   kernels/<backend>/<op>_list.cpp           an op's variant list, supports(),
//                                             launch(), get_default()
//   kernels/gpu/<family>_launch.hpp           a family's launchers (its TUs
//                                             define them, its list calls them)
//   kernels/cuda/cublaslt.{hpp,cpp}           the cuBLASLt GEMM family (CUDA)
//   src/backends/gpu/<backend>_device.{cu,hip} device probe, tuner memory and
//                                             clock, the backend's op table
//
// Nothing here names a family or an op: the TUs come from the list
// kernels/gpu/families.inc, the op table from kernels/gpu/ops.inc. Adding a
// GPU op or a family of kernels edits those lists, never this file.
#pragma once

#ifndef KDISPATCH_GPU_NS
#error "define KDISPATCH_GPU_NS (cuda or hip) before including gpu/backend_decls.hpp"
#endif

#include <cstdint>
#include <span>

#include "core/op.hpp"
#include "dispatch/device.hpp"

namespace dispatch::backends {
class Backend;
}

// The tiled tensor-core GEMM family exists on CUDA only.
#ifndef KDISPATCH_GPU_HAS_TILED
#if defined(__HIP__) || defined(__HIPCC__) || defined(KDISPATCH_GPU_IS_HIP)
#define KDISPATCH_GPU_HAS_TILED 0
#else
#define KDISPATCH_GPU_HAS_TILED 1
#endif
#endif

namespace dispatch::KDISPATCH_GPU_NS {

/// Whether a compiled kernel has a loadable image on a device, and what the
/// runtime says about it (cudaFuncGetAttributes / hipFuncGetAttributes).
struct KernelImage {
  bool loadable = false;
  int32_t max_threads = 0;  ///< launch bound honoured by the compiler
  int32_t num_regs = 0;
  int32_t error = 0;        ///< native error of the query when not loadable
  int64_t local_bytes = 0;  ///< stack frame per thread (spills)
};

/// The most kernel images one TU probes (the tiled GEMM family's 21 is the
/// most today); a TU static_asserts that its kernels fit.
inline constexpr int kMaxImagesPerTu = 32;

/// What a TU's image probe may need of the device beyond the current
/// context (src/backends/gpu/probe.inc fills it from the device's props).
struct ProbeEnv {
  int64_t smem_optin = 0;  ///< opt-in shared memory per block (bytes)
};

#include "gpu/families.inc"

/// The kernel translation units of this backend, in kernels/gpu/families.inc's order.
enum class KernelTu : int {
#define KD_TU_ENUM(tu) tu,
  KDISPATCH_GPU_TUS(KD_TU_ENUM)
#undef KD_TU_ENUM
};
#define KD_TU_COUNT(tu) +1
inline constexpr int kTuCount = 0 KDISPATCH_GPU_TUS(KD_TU_COUNT);
#undef KD_TU_COUNT

// Each TU's image probe (defined by the TU, called once per device).
#define KD_TU_PROBE_DECL(tu) void probe_##tu(KernelImage* out, const ProbeEnv& env) noexcept;
KDISPATCH_GPU_TUS(KD_TU_PROBE_DECL)
#undef KD_TU_PROBE_DECL

/// One device as probed once: the public description plus the kernel images.
struct DeviceState {
  DeviceInfo info;
  /// Launch with programmatic dependent launch (see pdl_enabled()).
  bool pdl = false;
  /// Per TU (KernelTu order), its kernels' images in the TU's own order.
  KernelImage tu_images[kTuCount > 0 ? kTuCount : 1][kMaxImagesPerTu];
  int64_t smem_optin = 0;  ///< opt-in shared memory per block (bytes)
  int cc_major = 0;        ///< compute capability major (CUDA; 0 on HIP)

  /// Kernel `k` of TU `tu` (k < kMaxImagesPerTu; k within the TU's count).
  const KernelImage& image(KernelTu tu, int k) const noexcept { return tu_images[static_cast<int>(tu)][k]; }
};

/// The probed state of a device (probed on first use, once), or nullptr when
/// the backend has no usable device of that ordinal. Thread-safe.
const DeviceState* device_state(int32_t ordinal) noexcept;

/// The description of ordinal 0, or of why the backend is unavailable
/// (available = false, one-line unavailable_reason). Thread-safe.
const DeviceInfo& backend_status() noexcept;

/// True when the process sees more than one device of this backend (the
/// launchers then make the tensor's device current around a launch).
bool multi_device() noexcept;

/// True when launches on device `ordinal` use programmatic dependent launch
/// (CUDA on compute capability >= 9.0, unless KDISPATCH_PDL=0): a kernel's
/// launch then overlaps the tail of the previous kernel in the stream (one
/// griddepcontrol.wait in the kernel keeps the order). False on HIP.
bool pdl_enabled(int32_t ordinal) noexcept;

/// The backend as one object (src/backends/backend.hpp).
const backends::Backend& backend() noexcept;

// ---- The op table's functions (kernels/gpu/ops.inc): each row's variant
// list, default rule and floor, defined by the op's variant list.
using OpVariantsFn = std::span<const core::VariantDef* const> (*)() noexcept;
using OpPlanFn = core::Plan (*)(const core::Problem&, const DeviceInfo&) noexcept;
#include "gpu/ops.inc"
#define KD_OP_DECL(op, variants, get_default, floor)                              \
  std::span<const core::VariantDef* const> variants() noexcept;                   \
  core::Plan get_default(const core::Problem& p, const DeviceInfo& dev) noexcept; \
  core::Plan floor(const core::Problem& p, const DeviceInfo& dev) noexcept;
KDISPATCH_GPU_OPS(KD_OP_DECL)
#undef KD_OP_DECL

}  // namespace dispatch::KDISPATCH_GPU_NS
