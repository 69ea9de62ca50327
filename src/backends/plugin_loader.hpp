// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — finding, loading and checking CPU backend plugins
// (see backends/plugin_abi.hpp for the contract). The registry calls
// load_cpu_plugins() once, from its constructor; absence of a plugin is not
// an error: its families are just not there, and plugin_status() says why.
//
// Search (the first directory holding the module wins):
//   1. $KDISPATCH_CPU_PLUGIN_DIR, when set and non-empty: only that directory;
//   2. the directory of the binary that holds this code (libkdispatch.so,
//      found with dladdr): an installed library finds its plugins next to it;
//   3. the build tree's plugin directory, compiled in (tests, benchmarks and
//      tools that link the static core from the build tree).
// KDISPATCH_OPENBLAS=0 (also off/false/no) skips the OpenBLAS plugin.
// The module is opened with dlopen(RTLD_NOW | RTLD_LOCAL) and never closed
// once a variant was taken from it.
#pragma once

#include <string>
#include <vector>

#include "core/op.hpp"
#include "backends/plugin_abi.hpp"

namespace dispatch::core {

/// The environment as the loader reads it (tests pass their own).
struct PluginLoadOptions {
  bool openblas_enabled = true;  ///< false when KDISPATCH_OPENBLAS is 0/off/false/no
  std::string openblas_env;      ///< KDISPATCH_OPENBLAS as set ("" when unset), for messages
  std::string plugin_dir;        ///< KDISPATCH_CPU_PLUGIN_DIR ("" when unset)
};

/// Reads KDISPATCH_OPENBLAS and KDISPATCH_CPU_PLUGIN_DIR.
PluginLoadOptions plugin_options_from_env();

struct PluginLoadResult {
  std::vector<const VariantDef*> variants;  ///< empty unless loaded
  bool loaded = false;
  /// One line: "openblas: loaded <path> (<description>; N variants)", or why not.
  std::string status;
};

/// Finds, opens and checks the OpenBLAS plugin (the only CPU plugin so far).
/// Never throws; every failure is a status line.
PluginLoadResult load_cpu_plugins(const PluginLoadOptions& opts) noexcept;

/// The checks the loader applies to a plugin's table: ABI version, struct
/// size, kdispatch version, layout fingerprint, and every variant non-null,
/// a CPU variant, and not named like a built-in variant. Returns "" when the
/// table is acceptable, else the reason.
std::string check_plugin_table(const KdispatchCpuPluginV1* t);

/// The module's file name for a plugin short name: "libkdispatch_cpu_<name>.so".
std::string plugin_file_name(std::string_view name);

}  // namespace dispatch::core
