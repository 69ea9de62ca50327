// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — opening a CUDA library at run time (cuBLAS,
// cuBLASLt): never linked, so libkdispatch.so loads without the toolkit, and
// inside a PyTorch process the dlopen finds the library torch loaded (same
// soname). Plain C++, header only.
#pragma once

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <string_view>

namespace dispatch::cuda::dl {

/// The library as opened: `so` (null when not), or why not.
struct Opened {
  void* so = nullptr;
  bool disabled = false;  ///< env_var is "0"
  std::string tried;      ///< the names dlopen refused, ", "-separated
};

/// Opens the path in `env_var` when set (non-empty, not "0"), else the first
/// of `sonames` dlopen takes (RTLD_NOW | RTLD_LOCAL).
inline Opened open_library(const char* env_var, std::initializer_list<std::string> sonames) {
  Opened o;
  const char* env = std::getenv(env_var);
  if (env && std::string_view(env) == "0") {
    o.disabled = true;
    return o;
  }
  auto try_open = [&](const std::string& name) {
    if (o.so) return;
    o.so = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!o.so) o.tried += (o.tried.empty() ? "" : ", ") + name;
  };
  if (env && *env) {
    try_open(env);
  } else {
    for (const std::string& n : sonames) try_open(n);
  }
  return o;
}

/// open_library, saying in `*why` what a library's describe() says when it
/// is not there: "<floor> disabled by <env_var>=0" or "<name> unavailable:
/// dlopen failed for <the names tried>". The handle, or null.
inline void* open_or_say(const char* env_var, std::initializer_list<std::string> sonames, const std::string& name,
                         const std::string& floor, std::string* why) {
  Opened lib = open_library(env_var, sonames);
  if (lib.disabled)
    *why = floor + " disabled by " + env_var + "=0";
  else if (!lib.so)
    *why = name + " unavailable: dlopen failed for " + lib.tried;
  return lib.so;
}

/// `*out` = the symbol `name` of `so`; false when it is missing.
template <class F>
bool sym(void* so, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(so, name));
  return *out != nullptr;
}

/// The file a loaded symbol comes from, "?" when unknown.
inline std::string path_of(void* symbol) {
  Dl_info info;
  if (symbol && dladdr(symbol, &info) && info.dli_fname) return info.dli_fname;
  return "?";
}

}  // namespace dispatch::cuda::dl
