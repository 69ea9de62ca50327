// SPDX-License-Identifier: Apache-2.0
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <unordered_map>

#include "api/config_dir.hpp"
#include "api/json_out.hpp"
#include "api/runtime_impl.hpp"
#include "core/json_write.hpp"
#include "backends/registry.hpp"
#include "backends/backend.hpp"
#include "core/op_spec.hpp"
#include "store/filename.hpp"
#include "store/loader.hpp"
#include "store/private_fs.hpp"
#include "store/writer.hpp"
#include "table/epoch.hpp"
#include "table/key.hpp"
#include "store/watcher.hpp"
#include "tune/rules.hpp"
#include "tune/tuner.hpp"

namespace dispatch {
namespace fs = std::filesystem;

namespace {

// Where the shipped configs live: <datadir>/kdispatch/configs of the prefix
// the loaded libkdispatch sits in, else the source tree's configs/ (build
// tree), else the configured install path. The prefix is found from the
// library's own path (dladdr), so a relocated install (--prefix at install
// time, DESTDIR staging) works. The library dir is not always <prefix>/lib:
// GNUInstallDirs gives lib/x86_64-linux-gnu on Debian for /usr, where
// <libdir>/../share would miss, so the libdir -> datadir path computed at
// configure time (KDISPATCH_LIBDIR_TO_DATADIR, e.g. "../../share") comes
// first, then plain <libdir>/../share.
std::string find_shipped_dir(const RuntimeOptions& o) {
  if (!o.shipped_configs_dir.empty()) return o.shipped_configs_dir;
  std::error_code ec;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&find_shipped_dir), &info) != 0 && info.dli_fname && info.dli_fname[0] != '\0') {
    const fs::path lib_dir = fs::weakly_canonical(fs::path(info.dli_fname), ec).parent_path();
    if (!ec && !lib_dir.empty()) {
      const fs::path rel[] = {
#ifdef KDISPATCH_LIBDIR_TO_DATADIR
          fs::path(KDISPATCH_LIBDIR_TO_DATADIR),
#endif
          fs::path("..") / "share"};
      for (const fs::path& r : rel) {
        const fs::path cand = (lib_dir / r / "kdispatch" / "configs").lexically_normal();
        if (fs::is_directory(cand, ec)) return cand.string();
      }
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
  // Stop the writers first: the watcher, then the tuner thread (mid-search
  // included); then free the tables.
  watcher.reset();
  tuner.reset();
  // The attached streams' workspaces (cudaFree waits for the device).
  streams.release_all([](Device d, void* ws) {
    if (const backends::Backend* b = backends::find(d.type)) b->free_device(ws);
  });
  table::EpochDomain::global().drop_owner(this);
}

const DeviceInfo* Runtime::Impl::device_for(Device d) const noexcept { return core::device_info_for(d); }

uint64_t Runtime::Impl::device_name_hash(Device d, const DeviceInfo& dev) const noexcept {
  const auto t = static_cast<size_t>(d.type);
  if (t >= 3 || d.ordinal < 0 || d.ordinal >= 16) return table::key_hash(dev.device_name);
  std::atomic<uint64_t>& slot = name_hashes[t][static_cast<size_t>(d.ordinal)];
  uint64_t h = slot.load(std::memory_order_relaxed);
  if (h == 0) [[unlikely]] {
    h = table::key_hash(dev.device_name);
    slot.store(h, std::memory_order_relaxed);
  }
  return h;
}

std::vector<std::pair<std::string, int32_t>> Runtime::Impl::source_dirs() const {
  // Precedence on the same M: dirs given at run time (first given first),
  // then rows tuned in this process, then the tuning cache on disk (only
  // files whose fingerprint matches), then the shipped configs/.
  std::vector<std::pair<std::string, int32_t>> out;
  // A dir listed twice is read once, at its first (highest) precedence.
  for (size_t i = 0; i < options.config_dirs.size(); ++i)
    if (std::find(options.config_dirs.begin(), options.config_dirs.begin() + static_cast<std::ptrdiff_t>(i),
                  options.config_dirs[i]) == options.config_dirs.begin() + static_cast<std::ptrdiff_t>(i))
      out.emplace_back(options.config_dirs[i], static_cast<int32_t>(i));
  std::error_code ec;
  if (!cache_dir.empty() && options.tune.load_cache && fs::is_directory(cache_dir, ec))
    out.emplace_back(cache_dir, cache_rank);
  if (options.load_shipped_configs && !shipped_dir.empty()) out.emplace_back(shipped_dir, shipped_rank);
  return out;
}

void Runtime::Impl::rebuild_locked(std::vector<std::string>* notes) {
  auto snap =
      table::Snapshot::build(table.all_inputs(), backend_version, notes, table.current.load(std::memory_order_relaxed));
  reports.set_counts(static_cast<int64_t>(snap->buckets().size()), snap->row_count());
  table.publish_locked(std::move(snap), this);
}

bool Runtime::Impl::publish_tuned(std::vector<table::TableInput> rows) {
  std::lock_guard<std::mutex> lock(table.mu);
  if (frozen.load(std::memory_order_acquire)) return false;
  table.add_tuned_locked(std::move(rows));
  rebuild_locked(nullptr);
  return true;
}

bool Runtime::Impl::covered(const std::string& key, int64_t m) const {
  table::EpochDomain::Guard guard(table::EpochDomain::global());
  const table::Snapshot* snap = table.current.load(std::memory_order_seq_cst);
  const table::Bucket* b = snap->find(key, table::key_hash(key));
  if (!b) return false;
  size_t idx = 0;
  const table::Row* r = table::Snapshot::nearest(*b, m, table::NearestPolicy{}, &idx);
  if (!r || !table::Snapshot::plan(*b, idx).valid()) return false;
  return tune::near_tuned(b->ms[idx], m);
}

// A file that served rows and is now skipped (it stopped parsing, became
// foreign, unreadable, its rows all invalid) keeps serving its previous rows
// until it is fixed or removed, and the report says so: a bad edit or a
// half-written copy never drops a table to the defaults. A file that is gone
// is gone; a stale cache file is never kept.
void Runtime::Impl::keep_rows_of_broken_files(store::LoadOutput* out) const {
  if (table.loaded_inputs.empty()) return;
  bool any_skipped = !out->incomplete_dirs.empty();
  for (const FileReport& f : out->report.files)
    any_skipped = any_skipped || (f.state == FileReport::State::skipped && !f.stale);
  if (!any_skipped) return;
  std::unordered_map<std::string, const std::shared_ptr<const table::TableInput>*> previous;
  for (const auto& in : table.loaded_inputs) previous.emplace(std::to_string(in->source_rank) + '\n' + in->path, &in);
  std::unordered_map<std::string, int32_t> rank_of;
  for (const auto& [d, r] : source_dirs()) rank_of.emplace(d, r);
  for (FileReport& f : out->report.files) {
    if (f.state != FileReport::State::skipped || f.stale) continue;
    const auto r = rank_of.find(f.dir);
    if (r == rank_of.end()) continue;
    const auto it = previous.find(std::to_string(r->second) + '\n' + f.path);
    if (it == previous.end()) continue;
    out->inputs.push_back(*it->second);
    f.rows = static_cast<int32_t>((*it->second)->rows.size());
    f.problems.push_back("its previous rows (" + std::to_string(f.rows) +
                         ") keep serving until the file is fixed or removed");
    previous.erase(it);
  }
  // A config dir whose walk stopped at the entry limit: the files it did
  // not reach are not in the report; the rows they served keep serving.
  for (const std::string& dir : out->incomplete_dirs) {
    const auto r = rank_of.find(dir);
    if (r == rank_of.end()) continue;
    std::unordered_map<std::string, bool> seen;
    for (const FileReport& f : out->report.files)
      if (f.dir == dir) seen.emplace(f.path, true);
    size_t kept = 0;
    for (const auto& in : table.loaded_inputs)
      if (in->source_rank == r->second && !seen.count(in->path)) {
        out->inputs.push_back(in);
        ++kept;
      }
    if (kept > 0)
      out->report.notes.push_back("config dir '" + dir + "': " + std::to_string(kept) +
                                  " file(s) not reached by a walk stopped at the entry limit keep serving their "
                                  "previous rows");
  }
}

Status Runtime::Impl::load_and_publish_locked() {
  std::vector<store::SourceDir> dirs;
  for (const auto& [d, r] : source_dirs()) dirs.push_back(store::SourceDir{d, r});
  auto intern = [this](const std::string& dir, const std::string& rel) { return sources.intern(dir, rel); };
  for (auto& d : dirs) d.check_fingerprint = d.rank == cache_rank && !cache_dir.empty() && d.dir == cache_dir;
  store::LoadOutput out = store::load_config_dirs(dirs, options.device_aliases, intern, &table.file_cache);
  keep_rows_of_broken_files(&out);
  table.loaded_inputs = std::move(out.inputs);
  loads.fetch_add(1, std::memory_order_release);
  apply_verdicts_locked();  // base_inputs: a demoted committed row's M holds the floor (src/api/verify.cpp)
  std::vector<std::string> notes;
  // Incremental: the keys of unchanged files are copied from the table
  // that serves now (Snapshot::build).
  auto snap = table::Snapshot::build(table.all_inputs(), backend_version, &notes,
                                     table.current.load(std::memory_order_relaxed));
  out.report.keys = static_cast<int64_t>(snap->buckets().size());
  out.report.rows = snap->row_count();
  out.report.files_read = out.files_read;
  out.report.files_unchanged = out.files_reused;
  out.report.keys_unchanged = snap->reused_buckets();
  if (!cache_dir_refused.empty()) out.report.notes.push_back(cache_dir_refused);
  for (auto& n : notes) out.report.notes.push_back(std::move(n));
  for (const auto& f : out.report.files) {
    const bool stale_news = f.stale && reported_stale.insert(f.dir + "/" + f.path).second;  // once per file
    if ((stale_news && options.log_level >= LogLevel::warn) ||
        (f.state == FileReport::State::skipped && options.log_level >= LogLevel::info))
      std::fprintf(stderr, "kdispatch: skipped %s/%s: %s\n", f.dir.c_str(), f.path.c_str(),
                   f.problems.empty() ? "" : f.problems.front().c_str());
  }
  reports.set(std::move(out.report));
  table.publish_locked(std::move(snap), this);
  return Status();
}

namespace {
std::atomic<uint64_t> g_fork_generation{0};
void on_fork_child() noexcept { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }
const bool g_atfork_registered = (::pthread_atfork(nullptr, nullptr, &on_fork_child), true);
}  // namespace

uint64_t fork_generation() noexcept {
  (void)g_atfork_registered;
  return g_fork_generation.load(std::memory_order_relaxed);
}

Status Runtime::Impl::refuse_in_child(const char* what) const {
  return make_status(StatusCode::failed_precondition,
                     std::string(what) +
                         ": this runtime was created before fork(); in the child it serves its table "
                         "and the defaults only (no tuning, reload, misses export or stream "
                         "workspaces): create a runtime after fork() for those");
}

void Runtime::Impl::note_no_tuning_in_child() const noexcept {
  const uint64_t g = fork_generation();
  uint64_t seen = child_tuning_noted.load(std::memory_order_relaxed);
  if (seen == g || !child_tuning_noted.compare_exchange_strong(seen, g, std::memory_order_relaxed)) return;
  if (options.log_level >= LogLevel::warn)
    std::fprintf(stderr,
                 "kdispatch: tuning is off in this process (pid %d): its runtime was created before fork() (in pid "
                 "%d), so in this child it serves its table and the defaults only, and its misses are not tuned; "
                 "create a runtime after fork() to tune here\n",
                 static_cast<int>(::getpid()), made_in_pid);
}

Runtime::Runtime(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Runtime::~Runtime() {
  // The watcher and the tuner call back into this runtime: stop them while
  // it is still whole. In a forked child their threads do not exist (and
  // their locks may be held forever): they are left, not joined.
  if (impl_) {
    if (impl_->forked_child()) {
      (void)impl_->watcher.release();
      (void)impl_->tuner.release();
      return;
    }
    impl_->watcher.reset();
    impl_->tuner.reset();
  }
}

Result<std::unique_ptr<Runtime>> Runtime::create(RuntimeOptions options) noexcept {
  try {
    for (const auto& d : options.config_dirs)  // missing, not a dir, unreadable: refused, naming why
      if (std::string why = api::config_dir_problem(d); !why.empty())
        return make_status(StatusCode::invalid_argument, "config dir " + why);
    auto impl = std::make_unique<Impl>();
    impl->made_in_generation = fork_generation();
    impl->child_tuning_noted.store(impl->made_in_generation, std::memory_order_relaxed);
    impl->made_in_pid = static_cast<int>(::getpid());
    if (!options.backend_version.empty() &&
        !store::parse_runtime_version(options.backend_version, &impl->backend_version))
      return make_status(StatusCode::invalid_argument,
                         "backend_version '" + options.backend_version + "' is not a dotted version such as 3.5.1");
    if (options.bounded_nearest && !(options.bound_ratio >= 1.0))
      return make_status(StatusCode::invalid_argument, "bound_ratio must be >= 1");
    impl->policy.bounded = options.bounded_nearest;
    impl->policy.ratio = options.bound_ratio;
    impl->shipped_dir = find_shipped_dir(options);
    if (options.tune.duty_cycle <= 0.0 || options.tune.duty_cycle > 1.0)
      return make_status(StatusCode::invalid_argument, "tune.duty_cycle must be in (0, 1]");
    if (!(options.tune.margin >= 0.0 && options.tune.margin <= 0.5))
      return make_status(StatusCode::invalid_argument, "tune.margin must be a fraction in [0, 0.5]");
    if (options.tune.reps < 1) return make_status(StatusCode::invalid_argument, "tune.reps must be >= 1");
    if (!(options.tune.time_budget_ms > 0) || !std::isfinite(options.tune.time_budget_ms))
      return make_status(StatusCode::invalid_argument, "tune.time_budget_ms must be a positive, finite number of ms");
    if (options.tune.memory_budget_bytes < 0)
      return make_status(StatusCode::invalid_argument, "tune.memory_budget_bytes must be >= 0");
    auto routing = std::make_shared<tune::Routing>();
    if (Status s = tune::load_routing(options.tune.routing, routing.get()); !s.ok())
      return make_status(s.code(), "tune.routing: " + s.message());
    if (options.tune.persist || options.tune.load_cache) {
      store::CacheDirChoice c = store::resolve_cache_dir(options.tune.cache_dir);
      if (c.refused.empty()) {
        impl->cache_dir = std::move(c.dir);
      } else {
        impl->cache_dir_refused = std::move(c.refused);
        if (options.log_level >= LogLevel::warn)
          std::fprintf(stderr, "kdispatch: %s\n", impl->cache_dir_refused.c_str());
      }
    }
    impl->tuned_rank = static_cast<int32_t>(options.config_dirs.size());
    impl->cache_rank = impl->tuned_rank + 1;
    impl->shipped_rank = impl->tuned_rank + 2;
    if (auto s = impl->forced.parse(options.force); !s.ok()) return s;
    impl->options = std::move(options);
    impl->memory_verdicts = std::make_shared<tune::MemoryVerdicts>();
    {
      std::lock_guard<std::mutex> lock(impl->table.mu);
      if (auto s = impl->load_and_publish_locked(); !s.ok()) return s;
    }
    Impl* raw = impl.get();
    tune::TunerHooks hooks;
    hooks.publish = [raw](std::vector<table::TableInput> rows) { return raw->publish_tuned(std::move(rows)); };
    hooks.intern = [raw](const std::string& dir, const std::string& rel) { return raw->sources.intern(dir, rel); };
    hooks.covered = [raw](const std::string& key, int64_t m) { return raw->covered(key, m); };
    hooks.reload = [raw]() {
      std::lock_guard<std::mutex> lock(raw->table.mu);
      if (!raw->frozen.load()) (void)raw->load_and_publish_locked();
    };
    hooks.committed_rows = [raw](uint64_t* seen, std::vector<tune::VerifyRow>* out) {
      return raw->committed_rows_since(seen, out);
    };
    hooks.verdicts_changed = [raw]() { (void)raw->publish_verdicts(); };
    hooks.memory_verdicts = impl->memory_verdicts;
    impl->tuner = std::make_unique<tune::Tuner>(impl->options, impl->cache_dir, std::move(hooks), std::move(routing));
    impl->tuner->set_rank(impl->tuned_rank);
    auto rt = std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
    if (rt->impl_->options.watch) {
      Runtime* r = rt.get();
      std::vector<std::string> dirs;
      for (const auto& [d, rank] : rt->impl_->source_dirs()) dirs.push_back(d);
      auto w = store::DirWatcher::start(dirs, [r]() { (void)r->reload(); });
      if (!w.ok()) return w.status();
      rt->impl_->watcher = std::move(w.value());
    }
    return rt;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "creating the runtime");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("creating the runtime: ") + e.what());
  }
}

const RuntimeOptions& Runtime::options() const noexcept { return impl_->options; }

LoadReport Runtime::load_report() const { return impl_->reports.get(); }

Status Runtime::reload() noexcept {
  if (impl_->forked_child()) return impl_->refuse_in_child("reload");
  try {
    std::lock_guard<std::mutex> lock(impl_->table.mu);
    if (impl_->frozen.load(std::memory_order_acquire))
      return make_status(StatusCode::failed_precondition, "runtime is frozen: the table does not change");
    return impl_->load_and_publish_locked();
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "reloading configs (the old table keeps serving)");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("reloading configs: ") + e.what());
  }
}

Result<DeviceInfo> Runtime::device_info(Device device) const noexcept { return core::device_info_or_why(device); }

std::string Runtime::source_path(uint32_t id) const { return impl_->sources.get(id).second; }

std::string Runtime::source_dir(uint32_t id) const { return impl_->sources.get(id).first; }

Status Runtime::attach_stream(Device device, Stream stream, int64_t workspace_bytes) noexcept {
  if (impl_->forked_child()) return impl_->refuse_in_child("attach_stream");
  if (core::is_host(device.type))
    return make_status(StatusCode::invalid_argument, "attach_stream: device is the CPU (a workspace is for GPU gemm)");
  if (workspace_bytes < 0)
    return make_status(StatusCode::invalid_argument,
                       "attach_stream: workspace_bytes must be >= 0, got " + std::to_string(workspace_bytes));
  const backends::Backend* b = backends::find(device.type);
  if (b == nullptr || impl_->device_for(device) == nullptr)
    return make_status(StatusCode::unsupported_device, "attach_stream: no usable " +
                                                           std::string(device_type_name(device.type)) + " device " +
                                                           std::to_string(device.ordinal));
  return impl_->streams.attach(device, stream.handle, workspace_bytes,
                               [b](int32_t ordinal, int64_t bytes) { return b->alloc_device(ordinal, bytes); });
}

void Runtime::freeze(bool f) noexcept {
  if (impl_->forked_child()) return;                  // nothing changes the child's table anyway
  std::lock_guard<std::mutex> lock(impl_->table.mu);  // waits out a publish in flight
  impl_->frozen.store(f, std::memory_order_release);
  if (impl_->tuner) impl_->tuner->freeze(f);
}

bool Runtime::frozen() const noexcept { return impl_->frozen.load(std::memory_order_acquire); }

TuneStats Runtime::tune_stats() const noexcept {
  TuneStats s = impl_->tuner && !impl_->forked_child() ? impl_->tuner->stats() : TuneStats{};
  s.frozen = frozen();
  return s;
}

bool Runtime::wait_tuner_idle(double timeout_s) noexcept {
  return impl_->tuner && !impl_->forked_child() ? impl_->tuner->wait_idle(timeout_s) : true;
}

std::string Runtime::cache_dir() const { return impl_->cache_dir; }

const char* tune_mode_name(TuneMode m) noexcept {
  switch (m) {
    case TuneMode::off: return "off";
    case TuneMode::sync: return "sync";
    case TuneMode::background: return "background";
  }
  return "?";
}

Status Runtime::export_misses(const std::string& path) const noexcept {
  if (impl_->forked_child()) return impl_->refuse_in_child("export_misses");
  try {
    if (!impl_->tuner) return Status();
    // Columns: op, backend, device_name, dtype, out_dtype, M, then every dim
    // field of the op list (each op's in file-name order, first mention
    // first: N,K,hidden,...), the accumulation fields (accum: fast/precise
    // on every row), the flag fields (bias: true/false on every row),
    // stride, count, key.
    std::vector<std::pair<std::string_view, core::Dim>> dim_cols;  // name, and the Problem dim of each op
    std::vector<std::string_view> accum_cols, flag_cols, choice_cols;
    for (const core::OpSpec* s : core::all_specs()) {
      std::vector<const core::KeyField*> fs;
      for (const core::KeyField& f : s->fields) fs.push_back(&f);
      std::stable_sort(fs.begin(), fs.end(), [](const core::KeyField* a, const core::KeyField* b) {
        return (a->file_pos < 0 ? 99 : a->file_pos) < (b->file_pos < 0 ? 99 : b->file_pos);
      });
      for (const core::KeyField* f : fs) {
        if (f->kind == core::FieldKind::dim &&
            std::none_of(dim_cols.begin(), dim_cols.end(), [&](const auto& c) { return c.first == f->name; }))
          dim_cols.emplace_back(f->name, f->dim);
        if (f->kind == core::FieldKind::flag &&
            std::find(flag_cols.begin(), flag_cols.end(), f->name) == flag_cols.end())
          flag_cols.push_back(f->name);
        if (f->kind == core::FieldKind::accum &&
            std::find(accum_cols.begin(), accum_cols.end(), f->name) == accum_cols.end())
          accum_cols.push_back(f->name);
        if (f->kind == core::FieldKind::choice &&
            std::find(choice_cols.begin(), choice_cols.end(), f->name) == choice_cols.end())
          choice_cols.push_back(f->name);
      }
    }
    // RFC 4180: the key holds commas, so it is quoted (it holds no quotes).
    std::string csv = "op,backend,device_name,dtype,out_dtype,M";
    for (const auto& c : dim_cols) csv += "," + std::string(c.first);
    for (std::string_view f : accum_cols) csv += "," + std::string(f);
    for (std::string_view f : flag_cols) csv += "," + std::string(f);
    for (std::string_view f : choice_cols) csv += "," + std::string(f);
    csv += ",stride,count,key\n";
    for (const auto& [ev, count] : impl_->tuner->misses()) {
      const core::Problem& p = ev.problem;
      const core::OpSpec& spec = core::spec_of(p.op);
      const DeviceInfo* dev = impl_->device_for(p.device);
      if (!dev) continue;
      table::KeyBuffer stride;
      table::append_stride_field(p, &stride);
      csv += std::string(core::op_name(p.op)) + "," + std::string(device_type_name(p.device.type)) + "," +
             dev->device_name + "," + std::string(dtype_name(p.in_dtype)) + "," + std::string(dtype_name(p.out_dtype)) +
             "," + std::to_string(p.m);
      for (const auto& c : dim_cols) {
        const core::KeyField* f = nullptr;
        for (const core::KeyField& k : spec.fields)
          if (k.kind == core::FieldKind::dim && k.name == c.first) f = &k;
        csv += "," + (f ? std::to_string(core::dim_value(p, f->dim)) : std::string());
      }
      for (size_t i = 0; i < accum_cols.size(); ++i) csv += p.accum == core::Accum::fast ? ",fast" : ",precise";
      // A flag column: the op's own text when set ("true", "[128,128]"), else false.
      // (false for an op without that field.)
      for (std::string_view name : flag_cols) {
        const core::KeyField* f = nullptr;
        for (const core::KeyField& k : spec.fields)
          if (k.kind == core::FieldKind::flag && k.name == name) f = &k;
        const std::string text(f && p.has_bias ? f->flag_text : std::string_view("false"));
        csv += text.find(',') == std::string::npos ? "," + text : ",\"" + text + "\"";  // [128,128]: quoted
      }
      // A choice column: the op's label when the op has that field (its
      // activation, its mul_routed_weight), else empty.
      for (std::string_view name : choice_cols) {
        const bool has = std::any_of(spec.fields.begin(), spec.fields.end(), [&](const core::KeyField& k) {
          return k.kind == core::FieldKind::choice && k.name == name;
        });
        csv += "," + std::string(has ? core::choice_label(spec, p.choice) : std::string_view());
      }
      csv += "," + std::string(stride.view()) + "," + std::to_string(count) + ",\"" + tune::Tuner::key_of(p, *dev) +
             "\"\n";
    }
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) return make_status(StatusCode::io_error, "cannot write '" + path + "'");
    const bool ok = std::fwrite(csv.data(), 1, csv.size(), f) == csv.size();
    if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0)
      return make_status(StatusCode::io_error, "cannot write '" + path + "'");
    return Status();
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "export_misses");
  }
}

const char* version() noexcept { return KDISPATCH_VERSION_STRING; }

// ------------------------------------------------------------------ JSON

void config_to_json(core::JsonWriter& w, const Config& config) { store::config_json(w, config); }

std::string config_to_json(const Config& config) {
  core::JsonWriter w;
  config_to_json(w, config);
  return w.take();
}

std::string LoadReport::to_json() const {
  core::JsonWriter w;
  w.begin_object().key("files").begin_array_lines();
  for (const auto& f : files) {
    w.begin_object();
    w.field("path", f.path).field("dir", f.dir).field("status", file_state_name(f.state));
    w.field("rows", static_cast<int64_t>(f.rows)).field("unknown_device", f.unknown_device);
    if (f.stale) w.field("stale", true);
    if (!f.metadata.empty()) {
      w.key("metadata").begin_object();
      for (const auto& [k, raw] : f.metadata) w.key(k).json(raw);
      w.end_object();
    }
    w.key("problems").begin_array();
    for (const auto& p : f.problems) w.value(p);
    w.end_array().end_object();
  }
  w.end_array();
  w.key("notes").begin_array();
  for (const auto& n : notes) w.value(n);
  w.end_array();
  w.field("keys", keys).field("rows", rows).field("files_read", files_read);
  w.field("files_unchanged", files_unchanged).field("keys_unchanged", keys_unchanged).end_object();
  return w.take();
}

}  // namespace dispatch
