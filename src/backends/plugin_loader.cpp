// SPDX-License-Identifier: Apache-2.0
// kdispatch — loading CPU backend plugins (see plugin_loader.hpp).
#include "backends/plugin_loader.hpp"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_backend.hpp"

namespace dispatch::core {
namespace {

// is_file, own_binary_dir and search_dirs serve only a build with the
// OpenBLAS plugin (KDISPATCH_OPENBLAS=OFF leaves them unused).
[[maybe_unused]] bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// The directory of the binary this code is part of: libkdispatch.so's
/// directory, or the executable's when the core is linked statically.
std::string own_binary_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&load_cpu_plugins), &info) == 0 || info.dli_fname == nullptr ||
      info.dli_fname[0] == '\0')
    return {};
  return dir_of(info.dli_fname);
}

[[maybe_unused]] std::vector<std::string> search_dirs(const PluginLoadOptions& opts) {
  if (!opts.plugin_dir.empty()) return {opts.plugin_dir};
  std::vector<std::string> dirs;
  if (std::string own = own_binary_dir(); !own.empty()) dirs.push_back(std::move(own));
#ifdef KDISPATCH_CPU_PLUGIN_BUILD_DIR
  if (std::find(dirs.begin(), dirs.end(), KDISPATCH_CPU_PLUGIN_BUILD_DIR) == dirs.end())
    dirs.emplace_back(KDISPATCH_CPU_PLUGIN_BUILD_DIR);
#endif
  return dirs;
}

bool env_says_off(std::string v) {
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v == "0" || v == "off" || v == "false" || v == "no";
}

const char* or_empty(const char* s) { return s ? s : ""; }

}  // namespace

PluginLoadOptions plugin_options_from_env() {
  PluginLoadOptions o;
  if (const char* v = std::getenv("KDISPATCH_OPENBLAS")) {
    o.openblas_env = v;
    o.openblas_enabled = !env_says_off(o.openblas_env);
  }
  if (const char* v = std::getenv("KDISPATCH_CPU_PLUGIN_DIR")) o.plugin_dir = v;
  return o;
}

std::string plugin_file_name(std::string_view name) { return "libkdispatch_cpu_" + std::string(name) + ".so"; }

std::string check_plugin_table(const KdispatchCpuPluginV1* t) {
  if (t == nullptr) return "the entry point returned no table";
  if (t->abi_version != kCpuPluginAbiVersion)
    return "plugin ABI version " + std::to_string(t->abi_version) + ", this kdispatch speaks " +
           std::to_string(kCpuPluginAbiVersion);
  if (t->struct_size < sizeof(KdispatchCpuPluginV1))
    return "plugin table of " + std::to_string(t->struct_size) + " bytes, expected at least " +
           std::to_string(sizeof(KdispatchCpuPluginV1));
  if (std::strcmp(or_empty(t->kdispatch_version), KDISPATCH_VERSION_STRING) != 0)
    return std::string("built for kdispatch ") + or_empty(t->kdispatch_version) + ", this is " +
           KDISPATCH_VERSION_STRING;
  if (t->layout != plugin_layout_fingerprint())
    return "built against different kdispatch headers (layout fingerprint differs)";
  if (t->variant_count > 0 && t->variants == nullptr) return "variant table is null";
  const auto builtin = cpu::variants();
  for (uint32_t i = 0; i < t->variant_count; ++i) {
    const VariantDef* v = t->variants[i];
    if (v == nullptr) return "variant #" + std::to_string(i) + " is null";
    if (v->backend != DeviceType::cpu) return "variant " + std::string(v->name) + " is not a CPU variant";
    for (const VariantDef* b : builtin)
      if (b->name == v->name) return "variant " + std::string(v->name) + " has the name of a built-in variant";
    for (uint32_t j = 0; j < i; ++j)
      if (t->variants[j]->name == v->name) return "variant " + std::string(v->name) + " is listed twice";
  }
  return {};
}

PluginLoadResult load_cpu_plugins(const PluginLoadOptions& opts) noexcept {
  PluginLoadResult r;
  try {
    constexpr std::string_view kName = "openblas";
    const std::string prefix = std::string(kName) + ": ";
#ifndef KDISPATCH_HAVE_OPENBLAS_PLUGIN
    r.status = prefix + "not built (configure with KDISPATCH_OPENBLAS=AUTO or ON and libopenblas-dev installed)";
    return r;
#else
    if (!opts.openblas_enabled) {
      r.status = prefix + "disabled by KDISPATCH_OPENBLAS=" + opts.openblas_env;
      return r;
    }
    const std::string file = plugin_file_name(kName);
    const std::vector<std::string> dirs = search_dirs(opts);
    std::string path;
    for (const std::string& d : dirs) {
      if (is_file(d + "/" + file)) {
        path = d + "/" + file;
        break;
      }
    }
    if (path.empty()) {
      std::string where;
      for (const std::string& d : dirs) where += (where.empty() ? "" : ", ") + d;
      r.status = prefix + file + " not found in " + (where.empty() ? "(no directory)" : where) +
                 (opts.plugin_dir.empty() ? "" : " (KDISPATCH_CPU_PLUGIN_DIR)");
      return r;
    }
    // RTLD_LOCAL: neither the module's symbols nor its libopenblas's enter
    // the global scope. (Not RTLD_DEEPBIND: it would also bind the module's
    // malloc/operator new past an allocator the host interposes, and the
    // strings of a Status cross the boundary.)
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      r.status = prefix + "dlopen failed: " + or_empty(::dlerror());
      return r;
    }
    auto entry = reinterpret_cast<KdispatchCpuPluginEntryV1>(::dlsym(handle, kCpuPluginEntryV1));
    if (entry == nullptr) {
      ::dlclose(handle);
      r.status = prefix + path + " exports no " + kCpuPluginEntryV1;
      return r;
    }
    const KdispatchCpuPluginV1* table = entry();
    if (std::string why = check_plugin_table(table); !why.empty()) {
      ::dlclose(handle);
      r.status = prefix + path + " refused: " + why;
      return r;
    }
    if (table->variant_count == 0) {
      ::dlclose(handle);
      r.status = prefix + path + " offers no variant: " + or_empty(table->description);
      return r;
    }
    r.variants.assign(table->variants, table->variants + table->variant_count);
    r.loaded = true;  // the handle stays open for the life of the process
    r.status = prefix + "loaded " + path + " (" + or_empty(table->description) + "; " +
               std::to_string(table->variant_count) + (table->variant_count == 1 ? " variant)" : " variants)");
    return r;
#endif
  } catch (...) {
    r.variants.clear();
    r.loaded = false;
    r.status = "openblas: out of memory while loading the plugin";
    return r;
  }
}

}  // namespace dispatch::core
