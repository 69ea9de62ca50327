// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — the checks every variant list of one backend
// (kernels/gpu/<op>_variants.inc, kernels/cuda/fp8_list.cpp) makes the same
// way in its supports(): the device type and input dtype of the problem,
// whether this process probed the device a description names, and whether a
// kernel the point would launch has a loadable image there. Plain host C++,
// included with KDISPATCH_GPU_NS defined (gpu/backend_decls.hpp). Every
// decline names the variant (core::decline).
#pragma once

#include <string>

#include "core/op.hpp"
#include "gpu/backend_decls.hpp"

namespace dispatch::KDISPATCH_GPU_NS {

/// The decline of a problem on another device type or of another input
/// dtype than the variant's (its backend, its in_dtype), or Ok. supports()
/// checks this right after the op.
inline Status check_device_and_dtype(const core::VariantDef& v, const core::Problem& p) {
  if (p.device.type != v.backend)
    return core::decline(v, StatusCode::unsupported_device,
                         std::string(device_type_name(v.backend)) + " variant, the problem is on " +
                             std::string(device_type_name(p.device.type)));
  if (p.in_dtype != v.in_dtype)
    return core::decline(v, StatusCode::unsupported_problem,
                         "input dtype must be " + std::string(dtype_name(v.in_dtype)));
  return Status();
}

/// The probed state of the device a description names, when this process
/// probed it (a description of another machine's device, e.g. in a CPU-only
/// test reading committed rows, is taken at its word: nullptr).
inline const DeviceState* probed(const DeviceInfo& dev, DeviceType backend) noexcept {
  if (!dev.available || dev.device.type != backend) return nullptr;
  const DeviceState* st = device_state(dev.device.ordinal);
  return st != nullptr && st->info.device_name == dev.device_name ? st : nullptr;
}

/// Ok when kernel `k` has a loadable image on the probed device `st`, else
/// the decline "no loadable kernel image for <arch> in this build (native
/// error <e>)<hint>".
inline Status image_ok(const core::VariantDef& v, const KernelImage& k, const DeviceState& st,
                       std::string_view hint = {}) {
  if (k.loadable) return Status();
  return core::decline(v, StatusCode::unsupported_problem,
                       "no loadable kernel image for " + st.info.arch + " in this build (native error " +
                           std::to_string(k.error) + ")" + std::string(hint));
}

/// image_ok with the rebuild hint, then the compiled launch bound of `k`
/// against the `threads` a point launches with (the norm and silu_and_mul
/// families, whose block size is a param).
inline Status image_fits(const core::VariantDef& v, const KernelImage& k, const DeviceState& st, int64_t threads) {
  if (Status s = image_ok(v, k, st,
                          "; rebuild with its arch in KDISPATCH_CUDA_ARCHITECTURES / "
                          "KDISPATCH_HIP_ARCHITECTURES");
      !s.ok())
    return s;
  if (threads > k.max_threads)
    return core::decline(
        v, StatusCode::unsupported_problem,
        std::to_string(threads) + " threads exceed the compiled kernel's limit of " + std::to_string(k.max_threads));
  return Status();
}

}  // namespace dispatch::KDISPATCH_GPU_NS
