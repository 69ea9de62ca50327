// SPDX-License-Identifier: Apache-2.0
#include <dlfcn.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "api/runtime_impl.hpp"
#include "core/json_write.hpp"
#include "core/registry.hpp"
#include "store/filename.hpp"
#include "store/loader.hpp"
#include "table/epoch.hpp"

namespace dispatch {
namespace fs = std::filesystem;

namespace {

void delete_snapshot(void* p) { delete static_cast<const table::Snapshot*>(p); }

// Where the shipped configs live: <prefix>/share/kdispatch/configs next to
// an installed libkdispatch, else the source tree's configs/ (build tree).
std::string find_shipped_dir(const RuntimeOptions& o) {
  if (!o.shipped_configs_dir.empty()) return o.shipped_configs_dir;
  std::error_code ec;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&find_shipped_dir), &info) != 0 && info.dli_fname) {
    const fs::path lib = fs::weakly_canonical(fs::path(info.dli_fname), ec);
    if (!ec) {
      const fs::path cand = lib.parent_path().parent_path() / "share" / "kdispatch" / "configs";
      if (fs::is_directory(cand, ec)) return cand.string();
    }
  }
#ifdef KDISPATCH_SOURCE_CONFIG_DIR
  if (fs::is_directory(KDISPATCH_SOURCE_CONFIG_DIR, ec)) return KDISPATCH_SOURCE_CONFIG_DIR;
#endif
#ifdef KDISPATCH_INSTALL_CONFIG_DIR
  if (fs::is_directory(KDISPATCH_INSTALL_CONFIG_DIR, ec)) return KDISPATCH_INSTALL_CONFIG_DIR;
#endif
  return {};
}

}  // namespace

Runtime::Impl::~Impl() {
  delete current.load(std::memory_order_acquire);
  table::EpochDomain::global().drop_owner(this);
}

const DeviceInfo* Runtime::Impl::device_for(Device d) const noexcept {
  if (d.type == DeviceType::cpu) return &cpu_device_info();
  return nullptr;  // GPU backends are added by the GPU issues
}

std::vector<std::pair<std::string, int32_t>> Runtime::Impl::source_dirs() const {
  std::vector<std::pair<std::string, int32_t>> out;
  int32_t rank = 0;
  for (const auto& d : options.config_dirs) out.emplace_back(d, rank++);
  ++rank;  // reserved: the tuning cache
  if (options.load_shipped_configs && !shipped_dir.empty()) out.emplace_back(shipped_dir, rank);
  return out;
}

void Runtime::Impl::publish_locked(std::unique_ptr<table::Snapshot> snap) {
  const table::Snapshot* old = current.exchange(snap.release(), std::memory_order_seq_cst);
  if (old) table::EpochDomain::global().retire(const_cast<table::Snapshot*>(old), &delete_snapshot, this);
}

Status Runtime::Impl::load_and_publish_locked() {
  std::vector<store::SourceDir> dirs;
  for (const auto& [d, r] : source_dirs()) dirs.push_back(store::SourceDir{d, r});
  auto intern = [this](const std::string& dir, const std::string& rel) -> uint32_t {
    std::lock_guard<std::mutex> lock(sources_mu);
    auto key = std::make_pair(dir, rel);
    auto it = source_ids.find(key);
    if (it != source_ids.end()) return it->second;
    sources.push_back(key);
    const auto id = static_cast<uint32_t>(sources.size());
    source_ids.emplace(std::move(key), id);
    return id;
  };
  store::LoadOutput out = store::load_config_dirs(dirs, options.device_aliases, intern);
  std::vector<std::string> notes;
  auto snap = table::Snapshot::build(std::move(out.inputs), backend_version, &notes);
  out.report.keys = static_cast<int64_t>(snap->buckets().size());
  out.report.rows = snap->row_count();
  for (auto& n : notes) out.report.notes.push_back(std::move(n));
  if (options.log_level >= LogLevel::warn) {
    for (const auto& f : out.report.files)
      if (f.state == FileReport::State::skipped && options.log_level >= LogLevel::info)
        std::fprintf(stderr, "kdispatch: skipped %s/%s: %s\n", f.dir.c_str(), f.path.c_str(),
                     f.problems.empty() ? "" : f.problems.front().c_str());
  }
  {
    std::lock_guard<std::mutex> lock(report_mu);
    report = std::move(out.report);
  }
  publish_locked(std::move(snap));
  return Status();
}

Runtime::Runtime(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Runtime::~Runtime() = default;

Result<std::unique_ptr<Runtime>> Runtime::create(RuntimeOptions options) noexcept {
  try {
    for (const auto& d : options.config_dirs) {
      std::error_code ec;
      if (!fs::exists(d, ec))
        return make_status(StatusCode::invalid_argument, "config dir '" + d + "' does not exist");
      if (!fs::is_directory(d, ec))
        return make_status(StatusCode::invalid_argument, "config dir '" + d + "' is not a directory");
    }
    auto impl = std::make_unique<Impl>();
    if (!options.backend_version.empty() &&
        !store::parse_runtime_version(options.backend_version, &impl->backend_version))
      return make_status(StatusCode::invalid_argument,
                         "backend_version '" + options.backend_version + "' is not a dotted version such as 3.5.1");
    if (options.bounded_nearest && !(options.bound_ratio >= 1.0))
      return make_status(StatusCode::invalid_argument, "bound_ratio must be >= 1");
    impl->policy.bounded = options.bounded_nearest;
    impl->policy.ratio = options.bound_ratio;
    impl->shipped_dir = find_shipped_dir(options);
    impl->options = std::move(options);
    {
      std::lock_guard<std::mutex> lock(impl->mu);
      if (auto s = impl->load_and_publish_locked(); !s.ok()) return s;
    }
    return std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "creating the runtime");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("creating the runtime: ") + e.what());
  }
}

const RuntimeOptions& Runtime::options() const noexcept { return impl_->options; }

LoadReport Runtime::load_report() const {
  std::lock_guard<std::mutex> lock(impl_->report_mu);
  return impl_->report;
}

Status Runtime::reload() noexcept {
  try {
    std::lock_guard<std::mutex> lock(impl_->mu);
    return impl_->load_and_publish_locked();
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "reloading configs (the old table keeps serving)");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("reloading configs: ") + e.what());
  }
}

Result<DeviceInfo> Runtime::device_info(Device device) const noexcept {
  try {
    const DeviceInfo* d = impl_->device_for(device);
    if (d == nullptr)
      return make_status(StatusCode::unsupported_device,
                         "no " + std::string(device_type_name(device.type)) + " backend in this build");
    if (device.ordinal != 0)
      return make_status(StatusCode::unsupported_device,
                         std::string(device_type_name(device.type)) + " device " + std::to_string(device.ordinal) + " does not exist");
    return *d;
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "device_info");
  }
}

std::pair<std::string, std::string> Runtime::Impl::source(uint32_t id) const {
  std::lock_guard<std::mutex> lock(sources_mu);
  if (id == 0 || id > sources.size()) return {};
  return sources[id - 1];
}

std::string Runtime::source_path(uint32_t id) const { return impl_->source(id).second; }

std::string Runtime::source_dir(uint32_t id) const { return impl_->source(id).first; }

const char* version() noexcept { return KDISPATCH_VERSION_STRING; }

// ------------------------------------------------------------------ JSON

std::string config_to_json(const Config& config) {
  std::string s = "{";
  bool first = true;
  for (const auto& [k, v] : config) {
    if (!first) s += ", ";
    first = false;
    core::json_append_string(s, k);
    s += ": ";
    switch (v.kind) {
      case ConfigValue::Kind::integer: core::json_append_int(s, v.i); break;
      case ConfigValue::Kind::boolean: s += v.i ? "true" : "false"; break;
      case ConfigValue::Kind::string: core::json_append_string(s, v.s); break;
    }
  }
  return s + "}";
}

std::string LoadReport::to_json() const {
  std::string s = "{\"files\": [";
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& f = files[i];
    s += i ? ",\n  {" : "\n  {";
    s += "\"path\": ";
    core::json_append_string(s, f.path);
    s += ", \"dir\": ";
    core::json_append_string(s, f.dir);
    s += ", \"status\": ";
    core::json_append_string(s, file_state_name(f.state));
    s += ", \"rows\": ";
    core::json_append_int(s, f.rows);
    s += ", \"unknown_device\": ";
    s += f.unknown_device ? "true" : "false";
    s += ", \"problems\": [";
    for (size_t j = 0; j < f.problems.size(); ++j) {
      if (j) s += ", ";
      core::json_append_string(s, f.problems[j]);
    }
    s += "]}";
  }
  s += files.empty() ? "]" : "\n]";
  s += ", \"notes\": [";
  for (size_t j = 0; j < notes.size(); ++j) {
    if (j) s += ", ";
    core::json_append_string(s, notes[j]);
  }
  s += "], \"keys\": ";
  core::json_append_int(s, keys);
  s += ", \"rows\": ";
  core::json_append_int(s, rows);
  s += "}";
  return s;
}

}  // namespace dispatch
