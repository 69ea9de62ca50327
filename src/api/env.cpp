// SPDX-License-Identifier: Apache-2.0
// The KDISPATCH_* environment and the lazily built default runtime.
// Every variable is listed in README.md ("Environment").
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "api/config_dir.hpp"
#include "api/runtime_parts.hpp"
#include "dispatch/runtime.hpp"
#include "store/filename.hpp"
#include "store/private_fs.hpp"

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

// A positive, finite decimal number (strtod alone takes "nan", "inf",
// hex floats and leading spaces).
bool parse_positive(const std::string& v, double* out, const char** rest) {
  if (v.empty() || !((v[0] >= '0' && v[0] <= '9') || v[0] == '.')) return false;
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || !std::isfinite(x) || !(x > 0)) return false;
  *out = x;
  *rest = end;
  return true;
}

bool parse_bytes(const std::string& v, int64_t* out) {
  double x = 0;
  const char* end = nullptr;
  if (!parse_positive(v, &x, &end) || v.find_first_of("xXpP") != std::string::npos) return false;
  double mult = 1;
  const std::string suf(end);
  if (suf.empty() || suf == "B")
    mult = 1;
  else if (suf == "K" || suf == "KB" || suf == "KiB")
    mult = 1024.0;
  else if (suf == "M" || suf == "MB" || suf == "MiB")
    mult = 1024.0 * 1024;
  else if (suf == "G" || suf == "GB" || suf == "GiB")
    mult = 1024.0 * 1024 * 1024;
  else
    return false;
  const double bytes = x * mult;
  if (!(bytes >= 1) || bytes > 9.0e18) return false;  // at least a byte; fits int64
  *out = static_cast<int64_t>(bytes);
  return true;
}

namespace fs = std::filesystem;

// "" when `path` names an existing directory, else why not.
std::string dir_problem(const std::string& path) { return api::config_dir_problem(path); }

Status env_error(const char* name, const std::string& value, const std::string& why) {
  return make_status(StatusCode::invalid_argument, std::string(name) + "='" + value + "': " + why);
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

// A KDISPATCH_CONFIG_DIRS entry that is not a directory (a volume not
// mounted yet, a typo in a deployment) is skipped, not fatal: failing here
// would fail the default runtime, and with it every op call of the process
// (the torch ops at the first forward pass). Said on stderr once per process
// and dir, at warn.
void warn_skipped_config_dirs(const std::string& value, const std::vector<std::string>& whys, LogLevel level) {
  static std::mutex mu;
  static auto* said = new std::set<std::string>;  // never destroyed: a runtime may be built during exit
  std::lock_guard<std::mutex> lock(mu);
  for (const std::string& why : whys)
    if (level >= LogLevel::warn && said->insert(why).second)
      std::fprintf(stderr, "kdispatch: KDISPATCH_CONFIG_DIRS='%s': config dir %s; serving without it\n", value.c_str(),
                   why.c_str());
}

}  // namespace

Result<RuntimeOptions> options_from_env(RuntimeOptions o) noexcept {
  try {
    std::vector<std::string> skipped;  // why each skipped KDISPATCH_CONFIG_DIRS entry was skipped
    if (const char* v = env("KDISPATCH_CONFIG_DIRS"))
      for (auto& d : split(v, ':')) {
        if (std::string why = dir_problem(d); !why.empty())
          skipped.push_back(std::move(why));
        else
          o.config_dirs.push_back(d);
      }
    if (const char* v = env("KDISPATCH_SHIPPED_CONFIGS")) {
      const std::string s = v;
      if (s == "0") {
        o.load_shipped_configs = false;
      } else if (s != "1") {  // 1: the default (the installed shipped configs)
        if (std::string why = dir_problem(s); !why.empty())
          return env_error("KDISPATCH_SHIPPED_CONFIGS", s, "expected 0, 1 or a configs dir; " + why);
        o.shipped_configs_dir = s;
      }
    }
    if (const char* v = env("KDISPATCH_BACKEND_VERSION")) {
      std::vector<int> version;
      if (!store::parse_runtime_version(v, &version))
        return env_error("KDISPATCH_BACKEND_VERSION", v, "not a dotted version such as 3.5.1");
      o.backend_version = v;
    }
    if (const char* v = env("KDISPATCH_LOG_LEVEL")) {
      const std::string s = v;
      if (s == "off")
        o.log_level = LogLevel::off;
      else if (s == "error")
        o.log_level = LogLevel::error;
      else if (s == "warn")
        o.log_level = LogLevel::warn;
      else if (s == "info")
        o.log_level = LogLevel::info;
      else if (s == "debug")
        o.log_level = LogLevel::debug;
      else
        return bad_env("KDISPATCH_LOG_LEVEL", s, "off|error|warn|info|debug");
    }
    if (const char* v = env("KDISPATCH_WATCH"))
      if (!parse_bool(v, &o.watch)) return bad_env("KDISPATCH_WATCH", v, "0 or 1");
    if (const char* v = env("KDISPATCH_FORCE")) {
      for (auto& f : split(v, ';')) o.force.push_back(f);
      api::ForcedPlans check;  // the runtime's own parser: the same errors, naming the variable
      if (Status s = check.parse(o.force); !s.ok())
        return make_status(s.code(), "KDISPATCH_FORCE='" + std::string(v) + "': " + s.message());
    }
    if (const char* v = env("KDISPATCH_DETERMINISTIC"))
      if (!parse_bool(v, &o.deterministic)) return bad_env("KDISPATCH_DETERMINISTIC", v, "0 or 1");
    if (const char* v = env("KDISPATCH_TUNE")) {
      const std::string s = v;
      if (s == "off")
        o.tune.mode = TuneMode::off;
      else if (s == "sync")
        o.tune.mode = TuneMode::sync;
      else if (s == "background")
        o.tune.mode = TuneMode::background;
      else
        return bad_env("KDISPATCH_TUNE", s, "off|sync|background");
    }
    if (const char* v = env("KDISPATCH_CACHE_DIR")) o.tune.cache_dir = v;
    if (const char* v = env("KDISPATCH_CACHE_LOCKING")) {  // read by the writer (store::locking_scheme)
      const std::string s = v;
      if (s != "auto" && s != "flock" && s != "fragments")
        return bad_env("KDISPATCH_CACHE_LOCKING", s, "auto, flock or fragments");
    }
    if (const char* v = env("KDISPATCH_TUNE_ROUTING")) o.tune.routing = v;
    if (const char* v = env("KDISPATCH_TUNE_MEM"))
      if (!parse_bytes(v, &o.tune.memory_budget_bytes))
        return bad_env("KDISPATCH_TUNE_MEM", v, "bytes, e.g. 512M or 2G");
    if (const char* v = env("KDISPATCH_TUNE_BUDGET_MS")) {
      double ms = 0;
      const char* end = nullptr;
      if (!parse_positive(v, &ms, &end) || *end || ms > 86.4e6)
        return bad_env("KDISPATCH_TUNE_BUDGET_MS", v, "a positive number of ms, at most a day");
      o.tune.time_budget_ms = ms;
    }
    if (const char* v = env("KDISPATCH_TUNE_MARGIN")) {
      char* end = nullptr;
      const double m = std::strtod(v, &end);
      if (end == v || *end || !(m >= 0.0 && m <= 0.5))
        return bad_env("KDISPATCH_TUNE_MARGIN", v, "a fraction in [0, 0.5], e.g. 0.02 for 2%");
      o.tune.margin = m;
    }
    if (const char* v = env("KDISPATCH_TUNE_GRAPH"))
      if (!parse_bool(v, &o.tune.graph_timing))
        return bad_env("KDISPATCH_TUNE_GRAPH", v, "0|1 (or false|true, off|on, no|yes)");
    if (const char* v = env("KDISPATCH_VERIFY_SHIPPED"))
      if (!parse_bool(v, &o.tune.verify_shipped)) return bad_env("KDISPATCH_VERIFY_SHIPPED", v, "0 or 1");
    if (const char* v = env("KDISPATCH_MISSES_EXPORT")) {
      // Written at exit: a path that cannot be written is refused now, not
      // lost then without a word.
      const fs::path p(v);
      const std::string parent = p.has_parent_path() ? p.parent_path().string() : ".";
      if (std::string why = dir_problem(parent); !why.empty())
        return env_error("KDISPATCH_MISSES_EXPORT", v, "its directory " + why);
      if (::access(parent.c_str(), W_OK) != 0)
        return env_error("KDISPATCH_MISSES_EXPORT", v, "its directory '" + parent + "' is not writable");
      std::error_code ec;
      if (fs::is_directory(p, ec)) return env_error("KDISPATCH_MISSES_EXPORT", v, "is a directory, not a file");
    }
    if (!skipped.empty()) warn_skipped_config_dirs(env("KDISPATCH_CONFIG_DIRS"), skipped, o.log_level);
    return o;
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "reading the environment");
  }
}

Result<CacheLocking> cache_locking(const std::string& dir) noexcept {
  try {
    store::LockingScheme ls;
    if (Status s = store::locking_scheme(dir, &ls); !s.ok()) return s;
    return CacheLocking{ls.fragments, std::move(ls.reason)};
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "checking flock on '" + dir + "'");
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
      std::atexit([] {
        if (Status s = exported->export_misses(export_path); !s.ok())
          std::fprintf(stderr, "kdispatch: KDISPATCH_MISSES_EXPORT='%s': %s\n", export_path.c_str(),
                       s.to_string().c_str());
      });
    }
    return r;
  }();
  return instance;
}

}  // namespace dispatch
