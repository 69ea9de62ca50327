// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the contract between the core registry and a CPU
// backend plugin (a shared module that adds variants at run time).
//
// Why plugins at all: a family that wraps a third-party library (OpenBLAS's
// sgemm) must not bring that library's symbols into the host process's
// global namespace. An inference server already carries a BLAS (torch ships
// MKL or OpenBLAS, numpy another): a libkdispatch that linked libopenblas
// would put `cblas_sgemm` into the global scope of every process that loads
// it, where the dynamic linker can bind someone else's calls to it. So the
// family lives in its own module, `libkdispatch_cpu_<name>.so`, which the
// registry dlopen()s with RTLD_LOCAL: neither the module's symbols nor those
// of the libraries it pulls in enter the global scope.
//
// The contract:
// - The module exports exactly one symbol, the extern "C" function named by
//   kCpuPluginEntryV1, returning a pointer to a static KdispatchCpuPluginV1
//   (a version, the layout it was compiled against, and a table of
//   `const VariantDef*`). The table and the variants live as long as the
//   process: the registry never unloads a module it took variants from.
// - The module is self-contained: it may use what the kdispatch headers
//   define inline (Status's constructor, the structs of core/op.hpp) but
//   never a function defined in libkdispatch (make_status, registry
//   functions): the process may hold the core as a static copy (the tests) or
//   as libkdispatch.so, and a module linked to libkdispatch.so would bring a
//   second copy. Its link uses --no-undefined to prove it.
// - Both sides are built from one tree: the registry refuses a table whose
//   abi_version, kdispatch version or layout fingerprint differs from its
//   own, with a one-line reason (core::plugin_status()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/op.hpp"
#include "dispatch/device.hpp"
#include "dispatch/status.hpp"

namespace dispatch::core {

/// Bumped when KdispatchCpuPluginV1's meaning changes (a new entry point
/// name goes with it: kdispatch_cpu_plugin_v2).
inline constexpr uint32_t kCpuPluginAbiVersion = 1;

/// The one symbol a CPU plugin exports.
inline constexpr const char* kCpuPluginEntryV1 = "kdispatch_cpu_plugin_v1";

/// FNV-1a over the size and alignment of every type that crosses the
/// boundary (the table's VariantDef, and what its functions take and
/// return). A module compiled against headers where one of them differs (a
/// field added to VariantDef) is refused instead of misread.
constexpr uint64_t plugin_layout_fingerprint() noexcept {
  const uint64_t sizes[] = {
      sizeof(VariantDef),  alignof(VariantDef),      sizeof(ParamDef),   alignof(ParamDef),
      sizeof(Problem),     alignof(Problem),         sizeof(LaunchArgs), alignof(LaunchArgs),
      sizeof(DeviceInfo),  alignof(DeviceInfo),      sizeof(Status),     alignof(Status),
      sizeof(std::string), sizeof(std::string_view), sizeof(Plan),       kMaxParams,
  };
  uint64_t h = 14695981039346656037ull;
  for (uint64_t v : sizes) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

}  // namespace dispatch::core

extern "C" {

/// What kdispatch_cpu_plugin_v1() returns. Plain data; the registry reads
/// abi_version and struct_size first and nothing else when they differ.
struct KdispatchCpuPluginV1 {
  uint32_t abi_version;           ///< kCpuPluginAbiVersion
  uint32_t struct_size;           ///< sizeof(KdispatchCpuPluginV1)
  uint64_t layout;                ///< plugin_layout_fingerprint() as the module saw it
  const char* kdispatch_version;  ///< KDISPATCH_VERSION_STRING the module was built with
  const char* name;               ///< short name ("openblas"), used in messages
  /// One line about the backing library as loaded ("OpenBLAS 0.3.21 ...
  /// Haswell MAX_THREADS=64"), or why it offers no variant.
  const char* description;
  uint32_t variant_count;  ///< 0 is allowed (the library was unusable; description says why)
  const dispatch::core::VariantDef* const* variants;
};

using KdispatchCpuPluginEntryV1 = const KdispatchCpuPluginV1* (*)();

}  // extern "C"
