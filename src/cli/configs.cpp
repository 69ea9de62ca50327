// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — the config inspection commands: `kdispatch lookup` (which
// config serves this key at this M, and why) and `kdispatch validate` (the
// load report of config dirs). Both are offline: they load only the dirs
// given, never the shipped configs, and never the tuning cache (the user's
// ~/.cache/kdispatch, $KDISPATCH_CACHE_DIR) unless it is named with --cache;
// `lookup --env` instead answers as a serving process would (the KDISPATCH_*
// environment, the shipped configs and the tuning cache, read only).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "cli/cli.hpp"
#include "core/json_write.hpp"
#include "dispatch/config.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"

namespace kdispatch_cli {
namespace {

namespace dsp = dispatch;

int runtime_error_exit(const char* cmd, const dsp::Status& s) {
  std::fprintf(stderr, "kdispatch %s: cannot load the config dirs: %s\n", cmd, s.to_string().c_str());
  return s.code() == dsp::StatusCode::invalid_argument ? kExitUsage : kExitFailure;
}

// The option a lookup error is about, from the library's message.
std::string lookup_error_text(const dsp::Status& s) {
  const std::string& m = s.message();
  const auto starts = [&](std::string_view p) { return m.compare(0, p.size(), p) == 0; };
  std::string out = std::string(dsp::status_code_name(s.code())) + ": ";
  if (starts("key: ")) return out + "--key: " + m.substr(5);
  if (starts("cannot infer the op") || starts("unknown op")) return out + "--op: " + m;
  if (starts("unknown backend")) return out + "--backend: " + m;
  if (starts("down tables")) return out + "--down: " + m;
  if (starts("M ")) return out + "--M: " + m;
  return out + m;
}

// The tuning cache of an offline command: read only when named with
// --cache (as the runtime reads its cache: files of this build's
// fingerprint), never written; otherwise none, whatever $KDISPATCH_CACHE_DIR,
// $XDG_CACHE_HOME or $HOME say. A usage error's exit code, or -1.
int cache_options(const char* cmd, const std::string& cache, dsp::RuntimeOptions* ro) {
  ro->tune.persist = false;
  ro->tune.load_cache = !cache.empty();
  if (cache.empty()) return -1;
  std::error_code ec;
  if (!std::filesystem::is_directory(cache, ec)) {
    std::fprintf(stderr, "kdispatch %s: --cache '%s' is not a directory\n", cmd, cache.c_str());
    return kExitUsage;
  }
  ro->tune.cache_dir = cache;
  return -1;
}

// The load report's note on a refused cache dir (the runtime adds it).
std::string refusal_note(const dsp::LoadReport& rep, const std::string& dir) {
  for (const std::string& n : rep.notes)
    if (n.rfind("tuning cache dir '" + dir + "'", 0) == 0) return n;
  return "tuning cache dir '" + dir + "' refused";
}

// `lookup --cache` of a refused dir: exit 1 naming why, else -1.
int cache_refused(const char* cmd, const std::string& cache, const dsp::Runtime& rt) {
  if (cache.empty() || !rt.cache_dir().empty()) return -1;
  std::fprintf(stderr, "kdispatch %s: --cache '%s': %s\n", cmd, cache.c_str(),
               refusal_note(rt.load_report(), cache).c_str());
  return kExitFailure;
}

// The runtime a lookup answers from. Offline (no --env): the --configs dir
// only, and the --cache dir when named. --env: what a serving process's
// default runtime builds from the KDISPATCH_* environment (the shipped
// configs, KDISPATCH_CONFIG_DIRS, the tuning cache, forced plans, ...), the
// --configs dir above its dirs, read only: no tuner thread, no watcher, no
// verification, nothing written. A usage error's exit code, or -1.
int lookup_runtime_options(const LookupOptions& o, dsp::RuntimeOptions* ro) {
  if (!o.env) {
    if (o.config_dir.empty()) {
      std::fprintf(stderr,
                   "kdispatch lookup: --configs DIR is required (or --env: the KDISPATCH_* environment and the "
                   "shipped configs, as a serving process loads them)\n");
      return kExitUsage;
    }
    ro->config_dirs = {o.config_dir};
    ro->load_shipped_configs = false;
    ro->backend_version = o.backend_version;
    ro->log_level = dsp::LogLevel::error;  // foreign files are expected; `validate` reports them
    return cache_options("lookup", o.cache, ro);
  }
  auto env = dsp::options_from_env();
  if (!env.ok()) {
    std::fprintf(stderr, "kdispatch lookup: --env: %s\n", env.status().to_string().c_str());
    return kExitUsage;
  }
  *ro = std::move(*env);
  if (!o.config_dir.empty()) ro->config_dirs.insert(ro->config_dirs.begin(), o.config_dir);
  if (!o.backend_version.empty()) ro->backend_version = o.backend_version;
  ro->tune.mode = dsp::TuneMode::off;
  ro->tune.persist = false;
  ro->tune.verify_shipped = false;
  ro->watch = false;
  ro->log_level = std::min(ro->log_level, dsp::LogLevel::error);
  if (!o.cache.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(o.cache, ec)) {
      std::fprintf(stderr, "kdispatch lookup: --cache '%s' is not a directory\n", o.cache.c_str());
      return kExitUsage;
    }
    ro->tune.load_cache = true;
    ro->tune.cache_dir = o.cache;
  }
  return -1;
}

}  // namespace

int run_lookup(const LookupOptions& o) {
  if (o.m < 1) {
    std::fprintf(stderr, "kdispatch lookup: --M must be >= 1, got %lld\n", (long long)o.m);
    return kExitUsage;
  }
  dsp::RuntimeOptions ro;
  if (int e = lookup_runtime_options(o, &ro); e >= 0) return e;
  for (const std::string& a : o.aliases) {
    const auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == a.size()) {
      std::fprintf(stderr, "kdispatch lookup: --alias '%s' is not FROM=TO\n", a.c_str());
      return kExitUsage;
    }
    ro.device_aliases.push_back({a.substr(0, eq), a.substr(eq + 1)});
  }
  auto rt = dsp::Runtime::create(ro);
  if (!rt.ok()) return runtime_error_exit("lookup", rt.status());
  if (int e = cache_refused("lookup", o.cache, **rt); e >= 0) return e;

  dsp::LookupQuery q;
  q.op = o.op;
  q.key = o.key;
  q.device = o.device;
  q.arch = o.arch;
  q.compute_units = o.compute_units;
  q.memory_bytes = o.memory_bytes;
  q.backend = o.backend;
  q.M = o.m;
  q.down = o.down;
  auto r = dsp::lookup(**rt, q);
  if (!r.ok()) {
    std::fprintf(stderr, "kdispatch lookup: %s\n", lookup_error_text(r.status()).c_str());
    return r.status().code() == dsp::StatusCode::invalid_argument ? kExitUsage : kExitFailure;
  }
  // The serving file's metadata (vLLM's "triton_version", kdispatch's own
  // object), from the load report.
  const std::vector<std::pair<std::string, std::string>>* metadata = nullptr;
  const dsp::LoadReport report = (*rt)->load_report();
  for (const dsp::FileReport& f : report.files)
    if (!r->source.empty() && f.path == r->source && f.dir == r->source_dir) metadata = &f.metadata;
  if (o.json) {
    std::string text = dsp::lookup_result_to_json(*r);
    if (metadata && !metadata->empty() && !text.empty() && text.back() == '}') {
      std::string m = ", \"metadata\": {";
      for (size_t i = 0; i < metadata->size(); ++i) {
        dsp::core::JsonWriter w;
        w.value((*metadata)[i].first);
        m += (i ? ", " : "") + w.take() + ": " + (*metadata)[i].second;
      }
      text.insert(text.size() - 1, m + "}");
    }
    std::printf("%s\n", text.c_str());
    return kExitOk;
  }
  std::printf("config   %s\n", dsp::config_to_json(r->config).c_str());
  std::printf("source   %s\n", r->source.c_str());
  if (!r->source_dir.empty()) std::printf("dir      %s\n", r->source_dir.c_str());
  std::printf("match    %s\n", dsp::match_name(r->match));
  if (r->table_m >= 0)
    std::printf("M        %lld (asked %lld)\n", (long long)r->table_m, (long long)o.m);
  else
    std::printf("M        - (asked %lld)\n", (long long)o.m);
  if (!r->variant.empty()) std::printf("variant  %s\n", r->variant.c_str());
  std::printf("key      %s\n", r->key.c_str());
  if (metadata)
    for (const auto& [k, v] : *metadata)
      if (k != "kdispatch") std::printf("metadata %s = %s\n", k.c_str(), v.c_str());
  std::printf("why      %s\n", r->why.c_str());
  if (!r->note.empty()) std::printf("note     %s\n", r->note.c_str());
  return kExitOk;
}

int run_validate(const ValidateOptions& o) {
  if (o.dirs.empty() && o.cache.empty()) {
    std::fprintf(stderr, "kdispatch validate: name config dirs, or a cache dir with --cache\n");
    return kExitUsage;
  }
  dsp::RuntimeOptions ro;
  ro.config_dirs = o.dirs;
  ro.load_shipped_configs = false;
  ro.backend_version = o.backend_version;
  ro.log_level = dsp::LogLevel::off;  // the report below is the output
  if (int e = cache_options("validate", o.cache, &ro); e >= 0) return e;
  auto rt = dsp::Runtime::create(ro);
  if (!rt.ok()) return runtime_error_exit("validate", rt.status());
  const dsp::LoadReport rep = (*rt)->load_report();
  // A --cache dir refused by the cache-dir rules (docs/tuning.md "Safety
  // rules") is read by no runtime: not usable, and the note says why. Its
  // flock is not probed (no probe file is made in a refused dir).
  const std::string refused = !o.cache.empty() && (*rt)->cache_dir().empty() ? refusal_note(rep, o.cache) : "";
  std::string locking;  // --cache: how its writes are made
  if (!o.cache.empty() && !refused.empty()) locking = "none: the dir is refused";
  if (!o.cache.empty() && refused.empty()) {
    auto cl = dsp::cache_locking(o.cache);
    if (!cl.ok() && cl.status().code() == dsp::StatusCode::invalid_argument) {  // a bad KDISPATCH_CACHE_LOCKING
      std::fprintf(stderr, "kdispatch validate: %s\n", cl.status().message().c_str());
      return kExitUsage;
    }
    locking =
        !cl.ok() ? "not checked: " + cl.status().message()
        : cl->fragments
            ? "per-process fragments (<key>.json.d/<host>-<pid>.json; compact them with kdispatch merge): " + cl->reason
            : "flock (each <key>.json merged under its lock file): " + cl->reason;
  }
  const int exit_code = rep.all_usable() && refused.empty() ? kExitOk : kExitFailure;
  if (o.json) {
    std::string text = rep.to_json();
    if (!o.cache.empty() && !text.empty() && text.back() == '}') {
      dsp::core::JsonWriter w;
      w.begin_object().field("dir", o.cache).field("writes", locking);
      if (!refused.empty()) w.field("refused", refused);
      w.end_object();
      text.insert(text.size() - 1, ", \"cache\": " + w.take());
    }
    std::printf("%s\n", text.c_str());
    return exit_code;
  }

  int64_t counts[3] = {0, 0, 0}, unknown = 0;
  for (const dsp::FileReport& f : rep.files) {
    counts[static_cast<int>(f.state)]++;
    unknown += f.unknown_device;
    const std::string path = o.dirs.size() + !o.cache.empty() > 1 ? f.dir + ": " + f.path : f.path;
    const std::string state(dsp::file_state_name(f.state));
    if (f.state == dsp::FileReport::State::skipped)
      std::printf("%-8s %s\n", state.c_str(), path.c_str());
    else
      std::printf("%-8s %s (%d rows%s)\n", state.c_str(), path.c_str(), f.rows,
                  f.unknown_device ? ", unknown device" : "");
    for (const std::string& p : f.problems) std::printf("           - %s\n", p.c_str());
  }
  for (const std::string& n : rep.notes) std::printf("note: %s\n", n.c_str());
  if (!o.cache.empty() && refused.empty())
    std::printf("cache dir %s: writes use %s\n", o.cache.c_str(), locking.c_str());
  std::printf("%zu files: %lld loaded, %lld partial, %lld skipped; %lld unknown-device files; %lld keys, %lld rows\n",
              rep.files.size(), (long long)counts[0], (long long)counts[1], (long long)counts[2], (long long)unknown,
              (long long)rep.keys, (long long)rep.rows);
  if (!refused.empty()) {
    std::printf("cache dir %s is not usable: refused, so no runtime reads it\n", o.cache.c_str());
    std::fprintf(stderr, "kdispatch validate: --cache '%s': %s\n", o.cache.c_str(), refused.c_str());
  } else if (exit_code != kExitOk) {
    std::printf("not every file is usable: %lld skipped\n", (long long)counts[2]);
  }
  return exit_code;
}

}  // namespace kdispatch_cli
