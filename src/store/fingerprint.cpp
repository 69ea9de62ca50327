// SPDX-License-Identifier: Apache-2.0
#include "store/fingerprint.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "store/row_meta.hpp"
#include "core/json_write.hpp"
#include "backends/backend.hpp"
#include "kdispatch_kernel_fingerprint.hpp"  // generated at build time (see CMakeLists.txt)

#ifndef KDISPATCH_COMPILER_ID
#define KDISPATCH_COMPILER_ID "unknown"
#endif

namespace dispatch::store {

std::string_view kernel_sources_fingerprint() noexcept { return KDISPATCH_KERNEL_FINGERPRINT; }

const std::string* Fingerprint::find(std::string_view axis) const noexcept {
  for (const auto& [k, v] : axes)
    if (k == axis) return &v;
  return nullptr;
}

std::string Fingerprint::to_json() const {
  core::JsonWriter w;
  w.begin_object();
  for (const auto& [axis, value] : axes) w.field(axis, value);
  w.end_object();
  return w.take();
}

Fingerprint current_fingerprint(const DeviceInfo& dev, std::string_view runtime_versions) {
  Fingerprint f;
  f.axes.emplace_back("kernels", std::string(KDISPATCH_KERNEL_FINGERPRINT));
  f.axes.emplace_back("compiler", std::string(KDISPATCH_COMPILER_ID));
  f.axes.emplace_back("library", std::string(KDISPATCH_VERSION_STRING));
  f.axes.emplace_back("arch", dev.arch);
  f.axes.emplace_back("runtime", std::string(runtime_versions));
  // The listed variables, and every variable of the families that tune a
  // BLAS or an OpenMP runtime (OPENBLAS_*, GOTO_*, OMP_*), sorted by name.
  std::vector<std::string> vars;
  for (std::string_view name : kFingerprintEnv)
    if (const char* v = std::getenv(std::string(name).c_str())) vars.push_back(std::string(name) + "=" + v);
  for (char** e = environ; e && *e; ++e) {
    const std::string_view kv(*e);
    for (std::string_view prefix : kFingerprintEnvPrefixes)
      if (kv.substr(0, prefix.size()) == prefix && kv.find('=') != std::string_view::npos) vars.emplace_back(kv);
  }
  std::sort(vars.begin(), vars.end());
  vars.erase(std::unique(vars.begin(), vars.end()), vars.end());
  std::string env;
  for (const std::string& v : vars) env += (env.empty() ? "" : ";") + v;
  f.axes.emplace_back("env", env);
  // The backend's own axes (a GPU's SM count, the CPU's affinity count).
  backends::fingerprint_axes(dev, &f.axes);
  return f;
}

const Fingerprint& cpu_fingerprint() {
  const backends::Backend& b = cpu::backend();
  static const Fingerprint f = current_fingerprint(*b.device_info(0), b.runtime_versions());
  return f;
}

const Fingerprint* backend_fingerprint(DeviceType backend) {
  const backends::Backend* b = backends::find(backend);
  if (b == nullptr) return nullptr;
  if (b->is_host()) return &cpu_fingerprint();
  const DeviceInfo* dev = b->device_info(0);
  if (dev == nullptr) return nullptr;
  // One per compiled backend, in compiled() order.
  static std::once_flag once[3];
  static std::optional<Fingerprint> fp[3];
  const auto all = backends::compiled();
  const size_t i = static_cast<size_t>(std::find(all.begin(), all.end(), b) - all.begin());
  std::call_once(once[i], [&] { fp[i] = current_fingerprint(*dev, b->runtime_versions()); });
  return fp[i] ? &*fp[i] : nullptr;
}

Fingerprint parse_fingerprint(std::string_view meta) {
  Fingerprint f;
  for_each_meta_member(meta, "fingerprint", [&](std::string_view k, auto value) {
    std::string_view v;
    if (!value.get_string().get(v)) f.axes.emplace_back(std::string(k), std::string(v));
    return true;  // an axis of another type is skipped
  });
  return f;
}

std::string fingerprint_mismatch(const Fingerprint& file, const Fingerprint& now) {
  if (file.axes.empty()) return "no fingerprint in the file";
  for (const auto& [axis, value] : now.axes) {
    const std::string* fv = file.find(axis);
    if (!fv) return "axis '" + axis + "' missing in the file";
    if (*fv != value) return "axis '" + axis + "' differs (file '" + *fv + "', now '" + value + "')";
  }
  return {};
}

}  // namespace dispatch::store
