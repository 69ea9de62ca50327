// SPDX-License-Identifier: Apache-2.0
// The KDISPATCH_* environment and the lazily built default runtime.
// Every variable is listed in README.md ("Environment").
#include <cstdlib>
#include <mutex>
#include <string>

#include "dispatch/runtime.hpp"

namespace dispatch {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

Status bad_env(const char* name, const std::string& value, const char* expected) {
  return make_status(StatusCode::invalid_argument,
                     std::string(name) + "='" + value + "' is not valid (expected " + expected + ")");
}

bool parse_bool(const std::string& v, bool* out) {
  if (v == "1" || v == "true" || v == "on" || v == "yes") return *out = true, true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return *out = false, true;
  return false;
}

bool parse_bytes(const std::string& v, int64_t* out) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || x < 0) return false;
  double mult = 1;
  const std::string suf(end);
  if (suf.empty() || suf == "B") mult = 1;
  else if (suf == "K" || suf == "KB" || suf == "KiB") mult = 1024.0;
  else if (suf == "M" || suf == "MB" || suf == "MiB") mult = 1024.0 * 1024;
  else if (suf == "G" || suf == "GB" || suf == "GiB") mult = 1024.0 * 1024 * 1024;
  else return false;
  *out = static_cast<int64_t>(x * mult);
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t p = s.find(sep, start);
    if (p == std::string::npos) p = s.size();
    if (p > start) out.push_back(s.substr(start, p - start));
    start = p + 1;
  }
  return out;
}

}  // namespace

Result<RuntimeOptions> options_from_env(RuntimeOptions o) noexcept {
  try {
    if (const char* v = env("KDISPATCH_CONFIG_DIRS"))
      for (auto& d : split(v, ':')) o.config_dirs.push_back(d);
    if (const char* v = env("KDISPATCH_SHIPPED_CONFIGS")) {
      if (std::string(v) == "0") o.load_shipped_configs = false;
      else o.shipped_configs_dir = v;
    }
    if (const char* v = env("KDISPATCH_BACKEND_VERSION")) o.backend_version = v;
    if (const char* v = env("KDISPATCH_LOG_LEVEL")) {
      const std::string s = v;
      if (s == "off") o.log_level = LogLevel::off;
      else if (s == "error") o.log_level = LogLevel::error;
      else if (s == "warn") o.log_level = LogLevel::warn;
      else if (s == "info") o.log_level = LogLevel::info;
      else if (s == "debug") o.log_level = LogLevel::debug;
      else return bad_env("KDISPATCH_LOG_LEVEL", s, "off|error|warn|info|debug");
    }
    if (const char* v = env("KDISPATCH_WATCH"))
      if (!parse_bool(v, &o.watch)) return bad_env("KDISPATCH_WATCH", v, "0 or 1");
    if (const char* v = env("KDISPATCH_FORCE"))
      for (auto& f : split(v, ';')) o.force.push_back(f);
    if (const char* v = env("KDISPATCH_DETERMINISTIC"))
      if (!parse_bool(v, &o.deterministic)) return bad_env("KDISPATCH_DETERMINISTIC", v, "0 or 1");
    if (const char* v = env("KDISPATCH_TUNE")) {
      const std::string s = v;
      if (s == "off") o.tune.mode = TuneMode::off;
      else if (s == "sync") o.tune.mode = TuneMode::sync;
      else if (s == "background") o.tune.mode = TuneMode::background;
      else return bad_env("KDISPATCH_TUNE", s, "off|sync|background");
    }
    if (const char* v = env("KDISPATCH_CACHE_DIR")) o.tune.cache_dir = v;
    if (const char* v = env("KDISPATCH_TUNE_MEM"))
      if (!parse_bytes(v, &o.tune.memory_budget_bytes)) return bad_env("KDISPATCH_TUNE_MEM", v, "bytes, e.g. 512M or 2G");
    if (const char* v = env("KDISPATCH_TUNE_BUDGET_MS")) {
      char* end = nullptr;
      o.tune.time_budget_ms = std::strtod(v, &end);
      if (*end || o.tune.time_budget_ms <= 0) return bad_env("KDISPATCH_TUNE_BUDGET_MS", v, "a positive number of ms");
    }
    return o;
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "reading the environment");
  }
}

Result<Runtime*> default_runtime() noexcept {
  // Built once; kept until exit (never destroyed: other statics' destructors
  // may still dispatch through it).
  static Result<Runtime*> instance = []() -> Result<Runtime*> {
    auto opts = options_from_env();
    if (!opts.ok()) return opts.status();
    auto rt = Runtime::create(std::move(opts.value()));
    if (!rt.ok()) return rt.status();
    Runtime* r = rt.value().release();
    if (const char* path = env("KDISPATCH_MISSES_EXPORT")) {
      static std::string export_path = path;
      static Runtime* exported = r;
      std::atexit([] { (void)exported->export_misses(export_path); });
    }
    return r;
  }();
  return instance;
}

}  // namespace dispatch
