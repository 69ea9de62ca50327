// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the validity fingerprint of a persisted tuning result.
//
// A tuned winner is a measurement of specific machine code on a specific
// device under a specific environment. It stays valid only while all of these
// hold, so each is one axis of the fingerprint stored with the result, and a
// result whose fingerprint differs on ANY axis is stale: never served,
// reported once, re-tuned when tuning is on (FlashInfer's autotuner keeps
// such metadata too; unlike it, kdispatch stores variant names, not indices).
//
//   kernels   XXH3-128 over the sources that define the variants (kernels/),
//             computed at build time
//   compiler  compiler id and version that built them
//   library   kdispatch version
//   arch      the device's arch (sm_90a, gfx942, x86_64_avx512)
//   runtime   backend runtime/driver and vendor-library versions
//             ("cpu" on the CPU; CUDA runtime, driver and cuBLASLt versions)
//   env       the environment variables that change codegen or behaviour:
//             an explicit list (kFingerprintEnv) and every variable of the
//             families in kFingerprintEnvPrefixes (OPENBLAS_*, GOTO_*,
//             OMP_*), as sorted NAME=value pairs
//   cpus      (CPU only) how many CPUs the process may run on (its affinity)
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dispatch/device.hpp"

namespace dispatch::store {

/// Environment variables that change what a kernel does or how fast it is.
inline constexpr std::string_view kFingerprintEnv[] = {
    "KDISPATCH_OPENBLAS",   "OPENBLAS_NUM_THREADS",    "OPENBLAS_CORETYPE",   "OMP_NUM_THREADS",
    "NVIDIA_TF32_OVERRIDE", "CUBLAS_WORKSPACE_CONFIG", "CUDA_MODULE_LOADING", "HSA_OVERRIDE_GFX_VERSION",
};

/// Variable families that tune a BLAS or an OpenMP runtime: all of them count.
inline constexpr std::string_view kFingerprintEnvPrefixes[] = {"OPENBLAS_", "GOTO_", "OMP_"};

struct Fingerprint {
  std::vector<std::pair<std::string, std::string>> axes;  ///< in the order of the file comment

  /// The value of an axis, or nullptr.
  const std::string* find(std::string_view axis) const noexcept;
  /// {"kernels": "...", ...}
  std::string to_json() const;
};

/// The fingerprint of results tuned now, on `dev`. `runtime_versions`
/// describes the backend runtime ("cpu" for the CPU backend).
Fingerprint current_fingerprint(const DeviceInfo& dev, std::string_view runtime_versions);

/// The CPU backend's current fingerprint (cached).
const Fingerprint& cpu_fingerprint();

/// The current fingerprint of `backend`'s results (cached per backend): the
/// CPU's, or a GPU backend's for its device 0 (arch such as "sm_90a",
/// runtime "cuda runtime 13000, driver 13000"). nullptr when the backend is
/// not compiled in or has no usable device (nothing can be tuned or checked).
const Fingerprint* backend_fingerprint(DeviceType backend);

/// Parses the "fingerprint" object of a file's "kdispatch" metadata text.
/// An absent object yields an empty fingerprint.
Fingerprint parse_fingerprint(std::string_view kdispatch_metadata_json);

/// "" when `file` matches `now` on every axis of `now`, else one line naming
/// the first differing axis and both values.
std::string fingerprint_mismatch(const Fingerprint& file, const Fingerprint& now);

/// The build-time kernel-source fingerprint (hex).
std::string_view kernel_sources_fingerprint() noexcept;

}  // namespace dispatch::store
