// SPDX-License-Identifier: Apache-2.0
// kdispatch — the Runtime: config dirs, options, the published dispatch table.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch/config.hpp"
#include "dispatch/device.hpp"
#include "dispatch/export.hpp"
#include "dispatch/status.hpp"
#include "dispatch/types.hpp"

namespace dispatch {

/// The library version, "MAJOR.MINOR.PATCH".
KDISPATCH_API const char* version() noexcept;

/// Verbosity of the messages kdispatch writes to stderr. Nothing on the
/// dispatch hot path logs; loading, tuning and reloads do.
enum class LogLevel : uint8_t { off = 0, error = 1, warn = 2, info = 3, debug = 4 };

/// How a Runtime is set up. Every field has a working default.
struct RuntimeOptions {
  /// Extra config dirs, highest precedence first. They outrank the shipped
  /// configs (and, once tuning lands, the tuning cache) on the same M.
  /// Each dir is read recursively; SGLang/vLLM trees can be given as they are.
  std::vector<std::string> config_dirs;
  /// Load the configs shipped with kdispatch (the repo's configs/, or
  /// <prefix>/share/kdispatch/configs once installed).
  bool load_shipped_configs = true;
  /// Override for where the shipped configs live; empty = built-in path.
  std::string shipped_configs_dir;
  /// Version of the engine's kernel compiler, used to pick version folders
  /// `triton_X_Y_Z/` ("3.5.1"): the exact folder first, then the newest older
  /// one, then the newest newer one (reported). Empty = newest folder.
  std::string backend_version;
  /// Extra device-name aliases (see resolve_device_name).
  std::vector<DeviceAlias> device_aliases;
  /// Nearest-M policy. Unbounded (default): the nearest key always serves,
  /// as in SGLang. Bounded: an M outside [min_key / bound_ratio,
  /// max_key * bound_ratio] of a table is a miss (default config served).
  bool bounded_nearest = false;
  double bound_ratio = 2.0;
  LogLevel log_level = LogLevel::warn;
};

/// A loaded, immutable dispatch table plus the options it was built from.
///
/// Thread-safety: every const method and every op/lookup call may run
/// concurrently from any number of threads. Readers take no lock, allocate
/// nothing and make no syscall on a table hit. `reload()` may run
/// concurrently with readers: it builds a new table and publishes it with
/// one atomic release store; readers see either the old or the new table,
/// never a mix. Destroying a Runtime while calls are in flight on it is
/// undefined behaviour.
class KDISPATCH_API Runtime {
 public:
  /// Builds a runtime and loads its config dirs. A bad or foreign config file
  /// never fails creation: it is skipped and listed in load_report().
  /// Errors: invalid_argument (a config dir that does not exist or is not a
  /// directory, naming it), out_of_memory.
  static Result<std::unique_ptr<Runtime>> create(RuntimeOptions options = {}) noexcept;

  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const RuntimeOptions& options() const noexcept;

  /// The report of the most recent (re)load. Allocates a copy.
  LoadReport load_report() const;

  /// Re-reads every config dir, builds a new table and publishes it
  /// atomically. On a failure the old table keeps serving. Readers are never
  /// blocked. Errors: out_of_memory, internal.
  Status reload() noexcept;

  /// The device description for `device` (probed once per ordinal).
  /// Errors: unsupported_device when the device's backend is not compiled
  /// in or the ordinal does not exist.
  Result<DeviceInfo> device_info(Device device) const noexcept;

  /// Path of a config source (file relative to its dir) by the id found in
  /// DispatchInfo::source_id; "" for an unknown id. Ids stay valid for the
  /// runtime's lifetime.
  std::string source_path(uint32_t source_id) const;

  /// The config dir (as given, or the shipped-configs dir) of a source id;
  /// "" for an unknown id.
  std::string source_dir(uint32_t source_id) const;

  struct Impl;
  Impl& impl() noexcept { return *impl_; }
  const Impl& impl() const noexcept { return *impl_; }

 private:
  explicit Runtime(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dispatch
