// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch replay`: a model's forward pass (replay_model.hpp)
// through the ops on the CPU, one pass per trace entry (M = tokens of that
// pass), recording for every call where its plan came from (DispatchInfo)
// and how long it took; `kdispatch misses`: the same workload with tuning
// off, its misses written as a shape CSV.
//
// This driver knows the model's call sites (a name, an op of the op list,
// the op's key fields) and nothing of the ops themselves: the per-op stats,
// pass tables, JSON and summaries are sized and named from the ops the
// model calls.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli.hpp"
#include "cli/op_util.hpp"
#include "cli/replay_model.hpp"
#include "core/json_write.hpp"
#include "dispatch/device.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"

namespace kdispatch_cli {

std::string replay_ops_text() { return join_names(replay::all_ops(), "and"); }

namespace {

namespace dsp = dispatch;
using Clock = std::chrono::steady_clock;
using dsp::core::JsonWriter;
using replay::CallSink;
using replay::Model;
using replay::Site;

// ---------------------------------------------------------------- statistics

struct OpStats {
  int64_t calls = 0, hits = 0, defaults = 0, forced = 0, tuned_now = 0;
  double seconds = 0;
  std::map<uint32_t, int64_t> by_source;           // source_id -> table hits
  std::map<std::string_view, int64_t> by_variant;  // variant name (static storage) -> calls
};

// A shape as the table sees it: (static key, M). The static key of a call
// is fixed by its site's op and key fields (the dtype is one per run), so
// the replay names it by an index into Replay::keys() instead of asking
// every call for DispatchInfo::key (an allocation inside the timed call).
using ShapeId = std::pair<int, int64_t>;  // (key index, M)

// One op's calls in one pass over the trace (tuning modes).
struct PassOp {
  int64_t calls = 0, hits = 0, defaults = 0, forced = 0, tuned_now = 0;
  double seconds = 0;
  std::set<ShapeId> default_shapes;  // (key, M) served by get_default
  std::set<ShapeId> hit_shapes;      // (key, M) served by a table row
  std::set<ShapeId> rows;            // (key, table M): the rows that served
  std::vector<float> us;             // every call's time, µs (for the median)

  // The median time per call, µs: on a busy host more robust than the mean
  // (a preempted call costs milliseconds); the call mix is the same every pass.
  double p50_us() const {
    if (us.empty()) return 0.0;
    std::vector<float> v = us;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }
};

// A call site's counts.
struct SiteStats {
  int64_t calls = 0;
  double seconds = 0;
  int key = 0;  // index into Replay::keys()
};

// "N=1152,K=896": a site's dims, as the sites table prints them.
std::string site_dims(const Site& s) {
  std::string out;
  for (const replay::SiteField& f : s.dims)
    out += (out.empty() ? "" : ",") + std::string(f.name) + "=" + std::to_string(f.value);
  return out;
}

// ---------------------------------------------------------------- the replay

// The model, and the sink its op calls go through: every call timed and
// booked per op, per site and per pass.
class Replay final : public CallSink {
 public:
  Replay(dsp::Runtime& rt, const ModelSpec& m, dsp::DType dtype, int64_t max_m, int64_t layers)
      : model_(replay::make_model(rt, m, dtype, max_m)), dtype_(dtype), layers_(layers) {
    for (std::string_view name : model_->ops()) {
      const dsp::OpInfo* op = find_op(name);
      if (!op) throw std::logic_error("the replay's model calls '" + std::string(name) + "', not an op of this build");
      ops_.push_back(op);
    }
    stats_.resize(ops_.size());
    pass_.resize(ops_.size());
    for (const Site& s : model_->sites()) {
      std::string k = std::string(ops_[static_cast<size_t>(s.op)]->name) + " " + site_dims(s);
      for (std::string_view f : s.flags) k += "," + std::string(f);
      auto it = std::find(keys_.begin(), keys_.end(), k);
      site_stats_.push_back({0, 0.0, static_cast<int>(it - keys_.begin())});
      if (it == keys_.end()) keys_.push_back(k);
    }
  }

  void init() { model_->init(); }

  // One forward pass with `M` tokens (through --layers layers, else all of
  // them). Returns false (and sets *error) when an op fails.
  bool forward(int64_t M, std::string* error) {
    if (!model_->forward(M, *this, error, layers_)) return false;
    if (counting_ && !model_->output_finite(M)) non_finite_steps_++;
    return true;
  }

  // One uncounted forward pass at M = 1 through the first layer only: the
  // library's one-time costs (thread registration in the table's epoch
  // domain, ISA probes, first touch of the kernels) stay out of the
  // per-call numbers. Returns false (and sets *error) when an op fails.
  bool warm_up(std::string* error) {
    counting_ = false;
    const bool ok = model_->forward(1, *this, error, /*layers=*/1);
    counting_ = true;
    return ok;
  }

  // Times one op call at site `si` and books its DispatchInfo.
  bool call(int si, int64_t M, int64_t layer, OpCall f, std::string* error) override {
    const Site& site = model_->sites()[static_cast<size_t>(si)];
    dsp::DispatchInfo info;
    dsp::CallOptions opts;
    opts.info = &info;
    const auto t0 = Clock::now();
    const dsp::Status s = f(opts);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!s.ok()) {
      *error = std::string(op_name(site.op)) + " failed at " + site.name +
               (layer >= 0 ? " (layer " + std::to_string(layer) + ")" : std::string()) + ", shape " +
               shape_text(site, M) + ": " + s.to_string();
      return false;
    }
    if (counting_) book(si, M, dt, info);
    return true;
  }

  /// The ops the model calls (the per-op arrays' order).
  int op_count() const { return static_cast<int>(ops_.size()); }
  std::string_view op_name(int op) const { return ops_[static_cast<size_t>(op)]->name; }
  const OpStats& stats(int op) const { return stats_[static_cast<size_t>(op)]; }
  /// Starts a new pass: the per-pass stats restart from zero.
  void begin_pass() {
    for (PassOp& p : pass_) p = PassOp{};
  }
  const PassOp& pass_stats(int op) const { return pass_[static_cast<size_t>(op)]; }
  const std::vector<Site>& sites() const { return model_->sites(); }
  const SiteStats& site_stats(size_t i) const { return site_stats_[i]; }
  /// Forward passes whose final hidden state held a NaN or inf.
  int64_t non_finite_steps() const { return non_finite_steps_; }
  size_t weight_bytes() const { return model_->weight_bytes(); }

 private:
  void book(int si, int64_t M, double dt, const dsp::DispatchInfo& info) {
    const Site& site = model_->sites()[static_cast<size_t>(si)];
    SiteStats& ss = site_stats_[static_cast<size_t>(si)];
    OpStats& st = stats_[static_cast<size_t>(site.op)];
    PassOp& ps = pass_[static_cast<size_t>(site.op)];
    ss.calls++;
    ss.seconds += dt;
    st.calls++;
    st.seconds += dt;
    ps.calls++;
    ps.seconds += dt;
    ps.us.push_back(static_cast<float>(dt * 1e6));
    if (info.tuned_now) {
      st.tuned_now++;
      ps.tuned_now++;
    }
    switch (info.source) {
      case dsp::PlanSource::table:
        st.hits++;
        st.by_source[info.source_id]++;
        ps.hits++;
        ps.hit_shapes.insert({ss.key, M});
        ps.rows.insert({ss.key, info.table_m});
        break;
      case dsp::PlanSource::fallback:
        st.defaults++;
        ps.defaults++;
        ps.default_shapes.insert({ss.key, M});
        break;
      case dsp::PlanSource::forced:
        st.forced++;
        ps.forced++;
        break;
    }
    st.by_variant[info.variant ? std::string_view(info.variant) : std::string_view()]++;
  }

  // "M=4, N=1152, K=896, bf16, bias", "tokens=4, hidden=896, bf16",
  // "M=4, N=6144, K=4096, fp8_e4m3fn->bf16".
  std::string shape_text(const Site& s, int64_t M) const {
    std::string out = std::string(ops_[static_cast<size_t>(s.op)]->m_name) + "=" + std::to_string(M);
    for (const replay::SiteField& f : s.dims) out += ", " + std::string(f.name) + "=" + std::to_string(f.value);
    out += ", " + (s.dtypes.empty() ? std::string(dsp::dtype_name(dtype_)) : s.dtypes);
    for (std::string_view f : s.flags) out += ", " + std::string(f);
    return out;
  }

  std::unique_ptr<Model> model_;
  dsp::DType dtype_;
  int64_t layers_ = 0;  // per forward pass; 0 = the model's
  std::vector<const dsp::OpInfo*> ops_;
  std::vector<OpStats> stats_;
  std::vector<PassOp> pass_;
  std::vector<SiteStats> site_stats_;
  std::vector<std::string> keys_;
  bool counting_ = true;
  int64_t non_finite_steps_ = 0;
};

// ---------------------------------------------------------------- output

double round3(double v) { return std::round(v * 1000.0) / 1000.0; }
double us_per_call(double seconds, int64_t calls) { return calls > 0 ? seconds * 1e6 / calls : 0.0; }
double percent(int64_t part, int64_t whole) { return whole > 0 ? 100.0 * static_cast<double>(part) / whole : 0.0; }

// One op's numbers in one pass, as the pass table keeps them.
struct PassOpSummary {
  int64_t calls = 0, hits = 0, defaults = 0, tuned_now = 0;
  double seconds = 0;
};

// One pass over the trace in a tuning mode, as printed while the run goes.
struct PassSummary {
  int index = 0;
  bool baseline = false;           // pass 1: tuning paused (the runtime frozen), the table as it started
  double t = 0;                    // seconds since the first pass started, at the end of this one
  double seconds = 0;              // this pass's wall time
  std::vector<PassOpSummary> ops;  // per op of the replay
  dsp::TuneStats stats;            // at the end of the pass
};

// What a tuning run (--tune sync|background) adds to the report.
struct TuneReport {
  dsp::TuneMode mode = dsp::TuneMode::off;
  std::vector<PassSummary> passes;
  std::vector<PassOp> first, last;  // per op: the baseline pass and the last pass
  std::string stop_reason;          // "converged" | "stalled" | "max_seconds"
  double seconds = 0;               // all passes
  double max_seconds = 0;
  dsp::TuneStats stats;  // at the end
  dsp::TuneOptions options;

  // Rows the tuner added that the last pass used: (key, table M) serving in
  // the last pass but not in the baseline (the trace is the same every pass,
  // so a row serving now and not then is a new one).
  int64_t rows_added(int op) const {
    int64_t n = 0;
    for (const ShapeId& r : last[op].rows) n += first[op].rows.count(r) == 0;
    return n;
  }
  // Shapes (key, M) served by get_default in the baseline and by a table row in the last pass.
  int64_t shapes_moved(int op) const {
    int64_t n = 0;
    for (const ShapeId& s : first[op].default_shapes) n += last[op].hit_shapes.count(s);
    return n;
  }
  double us_first(int op) const { return us_per_call(first[op].seconds, first[op].calls); }
  double us_last(int op) const { return us_per_call(last[op].seconds, last[op].calls); }
  double speedup(int op) const { return us_last(op) > 0 ? us_first(op) / us_last(op) : 0.0; }
  double speedup_p50(int op) const {
    const double l = last[op].p50_us();
    return l > 0 ? first[op].p50_us() / l : 0.0;
  }
};

// The loaded config files by the backend they are for. An own-op file,
// <backend>/<op>/<fields>.json, serves that backend's calls, and only on a
// device of the name it holds; any other file (SGLang's and vLLM's trees)
// is a table of a kernel the engine owns, served to lookups, never to an op.
// The replay runs its ops on the CPU: a cuda file applies to no call of it.
struct BackendFiles {
  std::string backend;  // "cpu", "cuda", "hip"; "" for the engine-kernel tables
  int64_t files = 0;
  int64_t this_device = 0;  // of them, the files whose device_name is this host's device of the backend
  std::string device;       // this host's device of the backend (ordinal 0); "" when it has none
  std::string no_device;    // then why (Runtime::device_info's error)
};

// The file's backend ("" when it is not an own-op file) and its device_name
// field. The backend folder is two above the file, as the loader reads it
// (a fragment <key>.json.d/<host>-<pid>.json counts as its <key>.json).
std::pair<std::string, std::string> file_backend_and_device(const dsp::FileReport& f) {
  std::vector<std::string> parts;
  for (const auto& c : std::filesystem::path(f.dir + "/" + f.path)) parts.push_back(c.string());
  std::string base = parts.empty() ? std::string() : parts.back();
  size_t up = 1;
  if (parts.size() >= 2 && parts[parts.size() - 2].size() > 7 &&
      parts[parts.size() - 2].compare(parts[parts.size() - 2].size() - 7, 7, ".json.d") == 0) {
    base = parts[parts.size() - 2].substr(0, parts[parts.size() - 2].size() - 2);
    up = 2;
  }
  std::string device;
  if (const size_t at = base.find("device_name="); at != std::string::npos) {
    size_t end = base.find(',', at);
    if (end == std::string::npos) end = base.rfind(".json");
    const size_t from = at + 12;  // after "device_name="
    const size_t len = end == std::string::npos ? end : end - from;
    device = dsp::canonical_file_device_name(base.substr(from, len), {}, nullptr);
  }
  if (parts.size() < up + 2) return {"", device};
  const std::string& op = parts[parts.size() - up - 1];
  const std::string& backend = parts[parts.size() - up - 2];
  if (!dsp::parse_device_type(backend).ok() || !find_op(op)) return {"", device};
  return {backend, device};
}

// The report's files per backend: cpu first, then cuda and hip, then the
// engine-kernel tables; backends without files are left out.
std::vector<BackendFiles> files_by_backend(const dsp::Runtime& rt, const dsp::LoadReport& report) {
  std::vector<BackendFiles> out;
  for (int i = 0; i < dsp::kDeviceTypeCount; ++i) {
    const auto t = static_cast<dsp::DeviceType>(i);
    BackendFiles b;
    b.backend = std::string(dsp::device_type_name(t));
    if (auto d = rt.device_info(dsp::Device{t, 0}); d.ok() && d->available)
      b.device = d->device_name;
    else
      b.no_device = d.ok() ? d->unavailable_reason : d.status().message();
    out.push_back(std::move(b));
  }
  out.push_back(BackendFiles{});
  for (const dsp::FileReport& f : report.files) {
    const auto [backend, device] = file_backend_and_device(f);
    for (BackendFiles& b : out)
      if (b.backend == backend) {
        b.files++;
        b.this_device += !backend.empty() && !b.device.empty() && device == b.device;
      }
  }
  std::erase_if(out, [](const BackendFiles& b) { return b.files == 0; });
  return out;
}

// "7 files", "1 file".
std::string files_text(int64_t n) { return std::to_string(n) + (n == 1 ? " file" : " files"); }

// One line per backend under the report's "configs" line: which files apply
// to what this replay runs.
std::string backend_line(const BackendFiles& b) {
  if (b.backend.empty())
    return files_text(b.files) +
           " of engine-kernel tables (triton_fused_moe, triton_gemm): served to lookups, not to the "
           "replay's ops";
  std::string s = b.backend + ": " + files_text(b.files);
  if (b.device.empty()) return s + ": not used by this replay (no " + b.backend + " device: " + b.no_device + ")";
  s += ", " + std::to_string(b.this_device) + " for this host's " + b.device;
  return s + (b.backend == "cpu" ? ": the backend this replay runs" : ": not used by this replay (it runs on the CPU)");
}

struct RunInfo {
  const ModelSpec* model;
  const Trace* trace;
  int64_t steps;
  int64_t max_m;
  dsp::DType dtype;
  int64_t layers;  // --layers; 0 = the model's (not given)
  double init_s, warmup_s, run_s;
  size_t weight_bytes;
  dsp::LoadReport report;
  std::vector<std::string> config_dirs;
  bool shipped = true;
  std::string cache_dir;
  const TuneReport* tune = nullptr;    // null when tuning is off
  std::vector<BackendFiles> backends;  // the report's files by backend
};

// Table hits per config file (its config dir / path relative to the dir).
std::map<std::string, int64_t> hits_by_file(const dsp::Runtime& rt, const OpStats& s) {
  std::map<std::string, int64_t> out;
  for (const auto& [id, n] : s.by_source) {
    if (id == 0) {  // a call that tuned itself (sync mode) names no source
      out["tuned on the caller's thread (sync)"] += n;
      continue;
    }
    std::string p = rt.source_path(id);
    if (!p.empty()) p = rt.source_dir(id) + "/" + p;
    out[p.empty() ? "source #" + std::to_string(id) : std::move(p)] += n;
  }
  return out;
}

// ---------------------------------------------------------------- --json

void write_tune_stats(JsonWriter& w, const dsp::TuneStats& t) {
  w.field("misses", t.misses).field("queued", t.queued).field("dropped", t.dropped);
  w.field("shapes_tuned", t.shapes_tuned).field("shapes_skipped", t.shapes_skipped);
  w.field("candidates_run", t.candidates_run).field("candidates_rejected", t.candidates_rejected);
  w.field("candidates_failed", t.candidates_failed).field("publishes", t.publishes).field("pending", t.pending);
  w.field("tune_seconds", round3(t.tune_seconds));
}

// "<op>": {calls, hits, ..., sources, variants}.
void write_op(JsonWriter& w, const dsp::Runtime& rt, const Replay& r, int op, const TuneReport* tr) {
  const OpStats& s = r.stats(op);
  w.key(r.op_name(op)).begin_object();
  w.field("calls", s.calls).field("hits", s.hits).field("defaults", s.defaults);
  w.field("tuned", tr ? tr->rows_added(op) : int64_t{0}).field("forced", s.forced);
  w.field("us_per_call", round3(us_per_call(s.seconds, s.calls)));
  if (tr) {
    w.field("tuned_shapes", tr->shapes_moved(op)).field("tuned_now", s.tuned_now);
    w.field("calls_per_pass", tr->last[op].calls);
    w.field("hits_first", tr->first[op].hits).field("hits_last", tr->last[op].hits);
    w.field("defaults_first", tr->first[op].defaults).field("defaults_last", tr->last[op].defaults);
    w.field("us_per_call_first", round3(tr->us_first(op))).field("us_per_call_last", round3(tr->us_last(op)));
    w.field("speedup", round3(tr->speedup(op)));
    w.field("p50_us_first", round3(tr->first[op].p50_us())).field("p50_us_last", round3(tr->last[op].p50_us()));
    w.field("speedup_p50", round3(tr->speedup_p50(op)));
  }
  w.key("sources").begin_object();
  for (const auto& [file, n] : hits_by_file(rt, s)) w.field(file, n);
  w.field("default", s.defaults).end_object();
  w.key("variants").begin_object();
  for (const auto& [v, n] : s.by_variant) w.field(v, n);
  w.end_object();
  w.end_object();
}

// "sites": [{name, op, <dims>, [<flag>: true], calls, us_per_call}, ...].
void write_sites(JsonWriter& w, const Replay& r) {
  w.key("sites").begin_array();
  for (size_t i = 0; i < r.sites().size(); ++i) {
    const Site& s = r.sites()[i];
    const SiteStats& ss = r.site_stats(i);
    w.begin_object().field("name", s.name).field("op", r.op_name(s.op));
    for (const replay::SiteField& f : s.dims) w.field(f.name, f.value);
    for (std::string_view f : s.flags) w.field(f, true);
    w.field("calls", ss.calls).field("us_per_call", round3(us_per_call(ss.seconds, ss.calls)));
    w.end_object();
  }
  w.end_array();
}

// "tune": {mode, [stop, ..., passes]} (the run's tuner stats when tuning is off).
void write_tune(JsonWriter& w, const dsp::Runtime& rt, const Replay& r, const TuneReport* tr) {
  w.key("tune").begin_object().field("mode", dsp::tune_mode_name(tr ? tr->mode : dsp::TuneMode::off));
  if (!tr) {
    write_tune_stats(w, rt.tune_stats());
    w.end_object();
    return;
  }
  w.field("stop", tr->stop_reason).field("converged", tr->stop_reason == "converged");
  w.field("seconds", round3(tr->seconds)).field("max_seconds", tr->max_seconds);
  w.field("budget_ms", tr->options.time_budget_ms).field("duty_cycle", tr->options.duty_cycle);
  w.field("cold_cache", tr->options.cold_cache);
  write_tune_stats(w, tr->stats);
  w.key("passes").begin_array();
  for (const PassSummary& p : tr->passes) {
    w.begin_object().field("pass", p.index).field("baseline", p.baseline);
    w.field("t", round3(p.t)).field("seconds", round3(p.seconds));
    w.field("shapes_tuned", p.stats.shapes_tuned).field("pending", p.stats.pending);
    w.key("ops").begin_object();
    for (int op = 0; op < r.op_count(); ++op) {
      const PassOpSummary& o = p.ops[static_cast<size_t>(op)];
      w.key(r.op_name(op)).begin_object();
      w.field("calls", o.calls).field("hits", o.hits).field("defaults", o.defaults);
      w.field("us_per_call", round3(us_per_call(o.seconds, o.calls)));
      w.end_object();
    }
    w.end_object().end_object();
  }
  w.end_array().end_object();
}

void print_json(const dsp::Runtime& rt, const Replay& r, const RunInfo& ri) {
  const TuneReport* tr = ri.tune;
  JsonWriter w;
  w.begin_object().field("backend", "cpu").field("device_name", dsp::cpu_device_info().device_name);
  w.field("model", ri.model->name).field("trace", ri.trace->name).field("steps", ri.steps);
  w.field("passes", tr ? static_cast<int64_t>(tr->passes.size()) : int64_t{1});
  w.field("dtype", dsp::dtype_name(ri.dtype)).field("max_m", ri.max_m);
  if (ri.model->fp8) w.field("projections", "fp8_e4m3fn block 128x128");
  if (ri.layers > 0) w.field("layers", ri.layers);
  w.key("ops").begin_object();
  for (int op = 0; op < r.op_count(); ++op) write_op(w, rt, r, op, tr);
  w.end_object();
  write_sites(w, r);
  w.field("output_finite", r.non_finite_steps() == 0);
  w.field("config_files", static_cast<int64_t>(ri.report.files.size())).field("config_keys", ri.report.keys);
  // Which of them apply to what this replay runs (the CPU ops).
  w.key("config_files_by_backend").begin_object();
  for (const BackendFiles& b : ri.backends) {
    w.key(b.backend.empty() ? "engine_kernel_tables" : b.backend).begin_object().field("files", b.files);
    if (!b.backend.empty()) {
      w.field("this_device", b.this_device).key("device");
      if (b.device.empty())
        w.null();
      else
        w.value(b.device);
      if (b.device.empty()) w.field("no_device", b.no_device);
      w.field("replayed", b.backend == "cpu");
    }
    w.end_object();
  }
  w.end_object();
  w.field("cache_dir", ri.cache_dir);
  w.key("load_notes").begin_array();
  for (const std::string& n : ri.report.notes) w.value(n);
  w.end_array();
  w.field("init_s", round3(ri.init_s)).field("warmup_s", round3(ri.warmup_s)).field("run_s", round3(ri.run_s));
  write_tune(w, rt, r, tr);
  w.end_object();
  std::fputs((w.take() + "\n").c_str(), stdout);
}

// ---------------------------------------------------------------- text

// The run: device, model, trace, configs, times.
void print_run_header(const RunInfo& ri) {
  const dsp::DeviceInfo& dev = dsp::cpu_device_info();
  const ModelSpec& m = *ri.model;
  const TuneReport* tr = ri.tune;
  if (tr) std::printf("\n");
  std::printf("backend      cpu\n");
  std::printf("device_name  %s (%s, %d threads)\n", dev.device_name.c_str(), dev.reported_name.c_str(),
              dev.compute_units);
  if (!m.mla)
    std::printf(
        "model        %s (%s): hidden %lld, intermediate %lld, heads %lld/%lld kv, head_dim %lld, %lld layers%s%s\n",
        m.name, m.source, (long long)m.hidden, (long long)m.intermediate, (long long)m.heads, (long long)m.kv_heads,
        (long long)m.head_dim, (long long)m.layers, m.qkv_bias ? ", qkv bias" : "", m.fp8 ? ", fp8" : "");
  else
    std::printf(
        "model        %s (%s): hidden %lld, intermediate %lld, MLA with %lld heads (q_lora_rank %lld, "
        "kv_lora_rank %lld, qk_nope/rope_head_dim %lld/%lld, v_head_dim %lld), %lld layers%s\n",
        m.name, m.source, (long long)m.hidden, (long long)m.intermediate, (long long)m.heads,
        (long long)m.mla->q_lora_rank, (long long)m.mla->kv_lora_rank, (long long)m.mla->qk_nope_head_dim,
        (long long)m.mla->qk_rope_head_dim, (long long)m.mla->v_head_dim, (long long)m.layers, m.fp8 ? ", fp8" : "");
  if (ri.layers > 0)
    std::printf("layers       %lld of %lld per forward pass (--layers)\n", (long long)ri.layers, (long long)m.layers);
  std::printf("trace        %s (%zu entries, M %lld..%lld)\n", ri.trace->name.c_str(), ri.trace->ms.size(),
              (long long)*std::min_element(ri.trace->ms.begin(), ri.trace->ms.end()),
              (long long)*std::max_element(ri.trace->ms.begin(), ri.trace->ms.end()));
  if (tr)
    std::printf("steps        %lld per pass x %zu passes (forward passes, max M %lld)\n", (long long)ri.steps,
                tr->passes.size(), (long long)ri.max_m);
  else
    std::printf("steps        %lld (forward passes, max M %lld)\n", (long long)ri.steps, (long long)ri.max_m);
  if (m.fp8)
    std::printf(
        "dtype        %s; projections fp8_e4m3fn w8a8, 128x128 weight blocks, 1x128 activation groups "
        "(quant_fp8_group + gemm_fp8_block)\n",
        std::string(dsp::dtype_name(ri.dtype)).c_str());
  else
    std::printf("dtype        %s\n", std::string(dsp::dtype_name(ri.dtype)).c_str());
  int skipped = 0;
  for (const auto& f : ri.report.files) skipped += f.state == dsp::FileReport::State::skipped;
  std::printf("configs      %zu files (%d skipped), %lld keys%s\n", ri.report.files.size(), skipped,
              (long long)ri.report.keys,
              !ri.shipped ? (ri.config_dirs.empty() ? ", no shipped configs, no config dirs" : ", no shipped configs")
                          : (ri.config_dirs.empty() ? ", shipped configs only" : ""));
  for (const auto& d : ri.config_dirs) std::printf("             + %s\n", d.c_str());
  for (const BackendFiles& b : ri.backends) std::printf("             %s\n", backend_line(b).c_str());
  std::printf("cache dir    %s\n", ri.cache_dir.empty() ? "(none)" : ri.cache_dir.c_str());
  for (const auto& n : ri.report.notes) std::printf("note         %s\n", n.c_str());
  std::printf(
      "time         %.3f s setup (%.1f MB of weights), %.3f s warm-up (one layer at M=1, not counted), "
      "%.3f s replay\n\n",
      ri.init_s, ri.weight_bytes / 1e6, ri.warmup_s, ri.run_s);
}

// Per op, per site, and where the configs came from.
void print_op_tables(const dsp::Runtime& rt, const Replay& r, const TuneReport* tr) {
  if (r.non_finite_steps() > 0)
    std::printf("WARNING      %lld forward passes ended with NaN or inf in the hidden state\n\n",
                (long long)r.non_finite_steps());
  std::printf("%-20s %9s %9s %9s %7s %12s%s\n", "op", "calls", "hits", "defaults", "tuned", "us/call",
              tr ? "   (all passes)" : "");
  for (int op = 0; op < r.op_count(); ++op) {
    const OpStats& s = r.stats(op);
    std::printf("%-20s %9lld %9lld %9lld %7lld %12.2f\n", std::string(r.op_name(op)).c_str(), (long long)s.calls,
                (long long)s.hits, (long long)s.defaults, (long long)(tr ? tr->rows_added(op) : 0),
                us_per_call(s.seconds, s.calls));
  }

  std::printf("\n%-32s %-18s %-16s %9s %12s\n", "site", "op", "shape", "calls", "us/call");
  for (size_t i = 0; i < r.sites().size(); ++i) {
    const Site& s = r.sites()[i];
    const SiteStats& ss = r.site_stats(i);
    std::printf("%-32s %-18s %-16s %9lld %12.2f\n", s.name, std::string(r.op_name(s.op)).c_str(), site_dims(s).c_str(),
                (long long)ss.calls, us_per_call(ss.seconds, ss.calls));
  }

  std::printf("\nwhere the configs came from\n");
  for (int op = 0; op < r.op_count(); ++op) {
    const OpStats& s = r.stats(op);
    std::printf("  %s\n", std::string(r.op_name(op)).c_str());
    for (const auto& [file, n] : hits_by_file(rt, s)) std::printf("    %9lld  %s\n", (long long)n, file.c_str());
    std::printf("    %9lld  default (get_default)\n", (long long)s.defaults);
    if (s.forced) std::printf("    %9lld  forced\n", (long long)s.forced);
    std::string vars;
    for (const auto& [v, n] : s.by_variant)
      vars += (vars.empty() ? "" : ", ") + std::string(v) + " x" + std::to_string(n);
    if (!vars.empty()) std::printf("    variants: %s\n", vars.c_str());
  }
}

// Tuned against the defaults: the baseline pass (tuning paused) against the last pass.
void print_tune_tables(const Replay& r, const TuneReport& tr, const std::string& cache_dir) {
  std::printf("\ntuning (%s): first pass (baseline, tuning paused) vs last pass (pass %zu)\n",
              dsp::tune_mode_name(tr.mode), tr.passes.size());
  std::printf("%-20s %10s %10s %10s %13s %13s %8s %10s %10s %8s %6s\n", "op", "calls/pass", "hits first", "hits last",
              "us/call first", "us/call last", "speedup", "p50 first", "p50 last", "p50 x", "tuned");
  for (int op = 0; op < r.op_count(); ++op) {
    const PassOp& f = tr.first[op];
    const PassOp& l = tr.last[op];
    char hf[32], hl[32];
    std::snprintf(hf, sizeof hf, "%.0f%%", percent(f.hits, f.calls));
    std::snprintf(hl, sizeof hl, "%.0f%%", percent(l.hits, l.calls));
    std::printf("%-20s %10lld %10s %10s %13.2f %13.2f %7.2fx %10.2f %10.2f %7.2fx %6lld\n",
                std::string(r.op_name(op)).c_str(), (long long)l.calls, hf, hl, tr.us_first(op), tr.us_last(op),
                tr.speedup(op), f.p50_us(), l.p50_us(), tr.speedup_p50(op), (long long)tr.rows_added(op));
  }
  const dsp::TuneStats& t = tr.stats;
  const char* how = tr.stop_reason == "converged" ? "converged"
                    : tr.stop_reason == "stalled" ? "stalled (the tuner is idle; some shapes still miss)"
                                                  : "stopped at --max-seconds before converging";
  std::printf("\n%s after %zu passes in %.1f s\n", how, tr.passes.size(), tr.seconds);
  std::printf(
      "tuner        %lld shapes tuned, %lld skipped; %lld candidates run (%lld rejected by validation, "
      "%lld failed to launch); %.1f s searching; %lld tables published\n",
      (long long)t.shapes_tuned, (long long)t.shapes_skipped, (long long)t.candidates_run,
      (long long)t.candidates_rejected, (long long)t.candidates_failed, t.tune_seconds, (long long)t.publishes);
  std::printf("misses       %lld calls missed; %lld queued, %lld dropped (queue full), %lld pending\n",
              (long long)t.misses, (long long)t.queued, (long long)t.dropped, (long long)t.pending);
  std::printf("options      budget %.0f ms/shape, duty cycle %.2f, %d reps%s; cache dir %s\n",
              tr.options.time_budget_ms, tr.options.duty_cycle, tr.options.reps,
              tr.options.cold_cache ? ", cold cache" : ", warm cache", cache_dir.c_str());
}

void print_text(const dsp::Runtime& rt, const Replay& r, const RunInfo& ri) {
  print_run_header(ri);
  print_op_tables(rt, r, ri.tune);
  if (ri.tune) print_tune_tables(r, *ri.tune, ri.cache_dir);
}

// ---------------------------------------------------------------- tuning passes

// "<op> hits" as a pass table's column head, at most 18 characters: the
// op's name loses "_<word>"s from the end until it fits ("fused_add hits").
std::string hits_column(std::string_view op) {
  std::string name(op);
  for (size_t u; name.size() + 5 > 18 && (u = name.rfind('_')) != std::string::npos && u > 0;) name.resize(u);
  return name + " hits";
}

// The per-pass progress lines: to stdout in text mode, to stderr with --json
// (stdout then holds only the JSON object).
class PassPrinter {
 public:
  PassPrinter(FILE* f, dsp::TuneMode mode) : f_(f), mode_(mode) {}

  void header(const ReplayOptions& o, const dsp::TuneOptions& t, const std::string& cache_dir, int64_t steps,
              const Replay& r) {
    std::fprintf(f_,
                 "tuning       %s: a pass is %lld forward passes; passes repeat until a pass has no misses and "
                 "the tuner is idle, or %.0f s\n"
                 "             budget %.0f ms/shape, duty cycle %.2f, %d reps%s, cache dir %s\n",
                 dsp::tune_mode_name(mode_), (long long)steps, o.max_seconds, t.time_budget_ms, t.duty_cycle, t.reps,
                 t.cold_cache ? ", cold cache" : ", warm cache", cache_dir.empty() ? "(none)" : cache_dir.c_str());
    std::fprintf(f_, "%-5s %8s  ", "pass", "time");
    for (int op = 0; op < r.op_count(); ++op) std::fprintf(f_, " %-18s", hits_column(r.op_name(op)).c_str());
    std::fprintf(f_, " tuner\n");
    std::fflush(f_);
  }

  // A pass line (or, with `partial`, a progress line inside a long pass).
  void line(int index, double t, const Replay& r, const dsp::TuneStats& s, bool baseline, const char* partial) {
    std::fprintf(f_, "%-5s %7.1fs  ", (std::to_string(index) + (partial ? "..." : "")).c_str(), t);
    for (int op = 0; op < r.op_count(); ++op) {
      const PassOp& p = r.pass_stats(op);
      char cell[48];
      std::snprintf(cell, sizeof cell, "%lld/%lld %.0f%%", (long long)p.hits, (long long)p.calls,
                    percent(p.hits, p.calls));
      std::fprintf(f_, " %-18s", cell);
    }
    if (baseline)
      std::fprintf(f_, " baseline: the table as it started, tuning paused");
    else if (mode_ == dsp::TuneMode::sync)
      std::fprintf(f_, " %lld shapes tuned on the caller's thread, %lld candidates", (long long)s.shapes_tuned,
                   (long long)s.candidates_run);
    else
      std::fprintf(f_, " %lld shapes tuned, %lld pending, %lld candidates, %.1f s searching", (long long)s.shapes_tuned,
                   (long long)s.pending, (long long)s.candidates_run, s.tune_seconds);
    if (partial) std::fprintf(f_, " (%s)", partial);
    std::fprintf(f_, "\n");
    std::fflush(f_);
  }

 private:
  FILE* f_;
  dsp::TuneMode mode_;
};

// ---------------------------------------------------------------- `kdispatch misses` summary

int print_misses_summary(const Replay& r, const ReplayOptions& o, const RunInfo& ri, const std::string& path) {
  std::string err;
  auto csv = read_shape_csv(path, &err);
  if (!csv) {
    std::fprintf(stderr, "kdispatch misses: reading back %s: %s\n", path.c_str(), err.c_str());
    return kExitFailure;
  }
  // Per op: its rows (shapes) and its distinct keys (every column but M and count).
  std::vector<int64_t> shapes(static_cast<size_t>(r.op_count())), keys(shapes.size());
  for (int op = 0; op < r.op_count(); ++op) {
    std::set<std::string> k;
    for (const ShapeRow& s : csv->rows) {
      if (s.get("op") != r.op_name(op)) continue;
      shapes[op]++;
      std::string key;
      for (const auto& [name, v] : s.fields)
        if (name != "m" && name != "count") key += v + "|";
      k.insert(std::move(key));
    }
    keys[op] = static_cast<int64_t>(k.size());
  }
  if (o.json) {
    JsonWriter w;
    w.begin_object().field("export", path).field("model", ri.model->name).field("trace", ri.trace->name);
    w.field("steps", ri.steps).field("dtype", dsp::dtype_name(ri.dtype));
    if (ri.layers > 0) w.field("layers", ri.layers);
    w.field("rows", static_cast<int64_t>(csv->rows.size()));
    w.key("ops").begin_object();
    for (int op = 0; op < r.op_count(); ++op) {
      const OpStats& s = r.stats(op);
      w.key(r.op_name(op)).begin_object().field("calls", s.calls).field("hits", s.hits).field("misses", s.defaults);
      w.field("shapes", shapes[op]).field("keys", keys[op]).end_object();
    }
    w.end_object().end_object();
    std::fputs((w.take() + "\n").c_str(), stdout);
    return kExitOk;
  }
  std::printf(
      "workload     %s%s, trace %s, %lld forward passes, %s, tuning off\n", ri.model->name,
      ri.layers > 0 ? (" (" + std::to_string(ri.layers) + (ri.layers == 1 ? " layer)" : " layers)")).c_str() : "",
      ri.trace->name.c_str(), (long long)ri.steps, std::string(dsp::dtype_name(ri.dtype)).c_str());
  std::printf("\n%-20s %9s %9s %9s %8s %6s\n", "op", "calls", "hits", "misses", "shapes", "keys");
  for (int op = 0; op < r.op_count(); ++op) {
    const OpStats& s = r.stats(op);
    std::printf("%-20s %9lld %9lld %9lld %8lld %6lld\n", std::string(r.op_name(op)).c_str(), (long long)s.calls,
                (long long)s.hits, (long long)s.defaults, (long long)shapes[op], (long long)keys[op]);
  }
  std::string columns;
  for (const std::string& c : csv->columns) columns += (columns.empty() ? "" : ",") + c;
  std::printf("\nwrote %s: %zu shapes (%s); the warm-up's calls (one layer at M=1) left out\n", path.c_str(),
              csv->rows.size(), columns.c_str());
  if (!csv->rows.empty()) {
    std::printf("tune them:\n");
    for (int op = 0; op < r.op_count(); ++op)
      if (shapes[op])
        std::printf("  kdispatch tune --shapes %s --op %s --emit DIR\n", path.c_str(),
                    std::string(r.op_name(op)).c_str());
  }
  return kExitOk;
}

// ---------------------------------------------------------------- run_replay's stages

// What to replay: the model, the dtype, the trace and how many forward passes.
struct Workload {
  const ModelSpec* model = nullptr;
  dsp::DType dtype = dsp::DType::bf16;
  Trace trace;
  int64_t steps = 0;
  int64_t max_m = 1;
  int64_t layers = 0;  // --layers; 0 = the model's
};

// The workload options -> *w; a usage error's exit code, or -1.
int read_workload(const ReplayOptions& o, const char* cmd, Workload* w) {
  w->model = find_model(o.model);
  if (!w->model) {
    std::fprintf(stderr, "%s: unknown model '%s'; known models: %s\n", cmd, o.model.c_str(), model_names().c_str());
    return kExitUsage;
  }
  auto dtype_r = dsp::parse_dtype(o.dtype);
  if (!dtype_r.ok() || (*dtype_r != dsp::DType::fp32 && *dtype_r != dsp::DType::bf16)) {
    std::fprintf(stderr, "%s: --dtype '%s' is not supported (fp32 or bf16)\n", cmd, o.dtype.c_str());
    return kExitUsage;
  }
  w->dtype = *dtype_r;
  std::optional<Trace> trace = builtin_trace(o.trace);
  if (!trace) {
    std::string err;
    trace = read_trace_file(o.trace, &err);
    if (!trace) {
      std::error_code ec;
      const bool is_file = std::filesystem::exists(o.trace, ec);
      std::fprintf(stderr, "%s: --trace: %s%s\n", cmd, err.c_str(),
                   is_file ? "" : " (and it is not a built-in trace: decode, prefill or mixed)");
      return kExitUsage;
    }
  }
  w->trace = std::move(*trace);
  if (o.steps < 0) {
    std::fprintf(stderr, "%s: --steps must be >= 1, got %lld\n", cmd, (long long)o.steps);
    return kExitUsage;
  }
  if (o.layers < 0 || o.layers > w->model->layers) {
    std::fprintf(stderr, "%s: --layers must be in 1..%lld (%s's layers), got %lld\n", cmd, (long long)w->model->layers,
                 w->model->name, (long long)o.layers);
    return kExitUsage;
  }
  w->layers = o.layers;
  w->steps = o.steps > 0 ? o.steps : static_cast<int64_t>(w->trace.ms.size());
  for (int64_t s = 0; s < w->steps; ++s) w->max_m = std::max(w->max_m, w->trace.ms[s % w->trace.ms.size()]);
  return -1;
}

// The runtime's options: the KDISPATCH_* environment, then the flags. A
// usage error's exit code, or -1.
int runtime_options(const ReplayOptions& o, const char* cmd, dsp::RuntimeOptions* out) {
  auto env_r = dsp::options_from_env();
  if (!env_r.ok()) {
    std::fprintf(stderr, "%s: %s\n", cmd, env_r.status().message().c_str());
    return kExitUsage;
  }
  dsp::RuntimeOptions ro = std::move(*env_r);
  if (!o.tune.empty()) {
    if (o.tune == "off")
      ro.tune.mode = dsp::TuneMode::off;
    else if (o.tune == "sync")
      ro.tune.mode = dsp::TuneMode::sync;
    else if (o.tune == "background")
      ro.tune.mode = dsp::TuneMode::background;
    else {
      std::fprintf(stderr, "%s: --tune '%s' is not off, sync or background\n", cmd, o.tune.c_str());
      return kExitUsage;
    }
  }
  if (o.misses_summary) ro.tune.mode = dsp::TuneMode::off;
  if (!(o.max_seconds > 0)) {
    std::fprintf(stderr, "%s: --max-seconds must be > 0, got %g\n", cmd, o.max_seconds);
    return kExitUsage;
  }
  if (o.budget_ms < 0 || (o.budget_ms > 0 && !std::isfinite(o.budget_ms))) {
    std::fprintf(stderr, "%s: --budget-ms must be > 0, got %g\n", cmd, o.budget_ms);
    return kExitUsage;
  }
  if (o.duty_cycle < 0 || o.duty_cycle > 1) {
    std::fprintf(stderr, "%s: --duty-cycle must be in (0, 1], got %g\n", cmd, o.duty_cycle);
    return kExitUsage;
  }
  // Config dirs: --configs on top of the shipped configs (and of
  // $KDISPATCH_CONFIG_DIRS); --only-configs / --no-shipped-configs: only
  // the dirs given on the command line.
  if (!o.only_configs.empty() || o.no_shipped_configs) {
    ro.load_shipped_configs = false;
    ro.config_dirs = o.only_configs;
    ro.config_dirs.insert(ro.config_dirs.end(), o.config_dirs.begin(), o.config_dirs.end());
  } else {
    std::vector<std::string> dirs = o.config_dirs;
    dirs.insert(dirs.end(), ro.config_dirs.begin(), ro.config_dirs.end());
    ro.config_dirs = std::move(dirs);
  }
  if (!o.cache_dir.empty()) ro.tune.cache_dir = o.cache_dir;
  if (o.misses_summary) {
    // Offline: the misses of the config dirs given, not of whatever the
    // user's cache holds; the cache only when named (--cache), never written.
    ro.tune.persist = false;
    ro.tune.load_cache = !o.cache_dir.empty();
    if (!o.cache_dir.empty()) {
      std::error_code ec;
      if (!std::filesystem::is_directory(o.cache_dir, ec)) {
        std::fprintf(stderr, "%s: --cache '%s' is not a directory\n", cmd, o.cache_dir.c_str());
        return kExitUsage;
      }
    }
  }
  if (o.budget_ms > 0) ro.tune.time_budget_ms = o.budget_ms;
  if (o.duty_cycle > 0) ro.tune.duty_cycle = o.duty_cycle;
  if (o.no_cold_cache) ro.tune.cold_cache = false;
  *out = std::move(ro);
  return -1;
}

// The workload's forward passes, once; `every_step` after each. False
// (message printed) when an op failed.
bool run_steps(Replay& replay, const Workload& w, const char* cmd, const std::function<void()>& every_step) {
  for (int64_t s = 0; s < w.steps; ++s) {
    const int64_t M = w.trace.ms[s % w.trace.ms.size()];
    std::string err;
    if (!replay.forward(M, &err)) {
      std::fprintf(stderr, "%s: step %lld: %s\n", cmd, (long long)s, err.c_str());
      return false;
    }
    if (every_step) every_step();
  }
  return true;
}

// The pass that just ended, per op.
PassSummary pass_summary(const Replay& replay, int index, bool baseline) {
  PassSummary ps;
  ps.index = index;
  ps.baseline = baseline;
  for (int op = 0; op < replay.op_count(); ++op) {
    const PassOp& p = replay.pass_stats(op);
    ps.ops.push_back({p.calls, p.hits, p.defaults, p.tuned_now, p.seconds});
  }
  return ps;
}

// Tuning modes: passes over the trace until the tuner converges (a pass
// without misses, the tuner idle), stalls, or --max-seconds. Pass 1 is the
// baseline, run frozen. False when an op failed.
bool run_tuning_passes(dsp::Runtime& rt, Replay& replay, const Workload& w, const ReplayOptions& o, const char* cmd,
                       TuneReport* tr) {
  const dsp::TuneMode mode = rt.options().tune.mode;
  tr->mode = mode;
  tr->max_seconds = o.max_seconds;
  tr->options = rt.options().tune;
  PassPrinter printer(o.json ? stderr : stdout, mode);
  printer.header(o, tr->options, rt.cache_dir(), w.steps, replay);
  const auto start = Clock::now();
  const auto since = [&](Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); };
  std::vector<PassOp> prev(static_cast<size_t>(replay.op_count()));
  const auto per_op = [&](std::vector<PassOp>* to) {
    for (int op = 0; op < replay.op_count(); ++op) (*to)[op] = replay.pass_stats(op);
  };
  tr->first.resize(prev.size());
  tr->last.resize(prev.size());
  for (int index = 1;; ++index) {
    const bool baseline = index == 1;
    const dsp::TuneStats before = rt.tune_stats();
    replay.begin_pass();
    const auto pass_start = Clock::now();
    auto last_print = pass_start;
    // A long pass (a big model) prints a progress line every 5 s.
    const bool ok = run_steps(replay, w, cmd, [&] {
      if (std::chrono::duration<double>(Clock::now() - last_print).count() < 5.0) return;
      last_print = Clock::now();
      printer.line(index, since(start), replay, rt.tune_stats(), baseline, "in progress");
    });
    if (!ok) return false;
    if (baseline) rt.freeze(false);
    PassSummary ps = pass_summary(replay, index, baseline);
    ps.t = since(start);
    ps.seconds = since(pass_start);
    ps.stats = rt.tune_stats();
    int64_t defaults = 0;
    for (const PassOpSummary& p : ps.ops) defaults += p.defaults;
    tr->passes.push_back(ps);
    printer.line(index, ps.t, replay, ps.stats, baseline, nullptr);
    if (baseline) {
      per_op(&tr->first);
    } else {
      // Quiet: no candidate ran and no table was published during the pass.
      const bool quiet = ps.stats.candidates_run == before.candidates_run && ps.stats.publishes == before.publishes;
      const auto idle = [&] { return mode != dsp::TuneMode::background || rt.wait_tuner_idle(0.5); };
      if (quiet && defaults == 0 && idle()) {
        tr->stop_reason = "converged";
        break;
      }
      bool same_misses = true;
      for (int op = 0; op < replay.op_count(); ++op)
        same_misses = same_misses && replay.pass_stats(op).default_shapes == prev[op].default_shapes;
      // Stalled only when the tuner, once idle, had done nothing since the
      // pass began: a long search in flight shows no candidates until it
      // ends, so "quiet" alone is not enough.
      const auto still = [&] {
        const dsp::TuneStats now = rt.tune_stats();
        return now.candidates_run == before.candidates_run && now.publishes == before.publishes &&
               now.shapes_tuned == before.shapes_tuned;
      };
      if (quiet && defaults > 0 && same_misses && idle() && still()) {
        tr->stop_reason = "stalled";
        break;
      }
    }
    per_op(&prev);
    if (!baseline && since(start) >= o.max_seconds) {  // at least one pass with tuning on
      tr->stop_reason = "max_seconds";
      break;
    }
  }
  per_op(&tr->last);
  tr->seconds = since(start);
  tr->stats = rt.tune_stats();
  return true;
}

// Where the misses go (aiter's offline loop): --export-misses / `misses
// --export`, else $KDISPATCH_MISSES_EXPORT as the default runtime honours
// it; "" = nowhere.
std::string misses_path(const ReplayOptions& o) {
  if (!o.export_misses.empty()) return o.export_misses;
  if (const char* e = std::getenv("KDISPATCH_MISSES_EXPORT"); e && *e) return e;
  return {};
}

// A misses CSV's rows (Runtime::export_misses) by identity, every column
// but the count, -> count.
using MissCounts = std::map<std::string, int64_t>;

// A row ends ",<count>,\"<key>\"" (the key, last and quoted, holds commas
// but no quotes): its identity (the row without the count) and its count.
// False for the header or a line of another shape.
bool split_miss_row(const std::string& line, std::string* id, size_t* count_at, int64_t* count) {
  const size_t q = line.rfind(",\"");
  if (q == std::string::npos || q == 0) return false;
  const size_t c = line.rfind(',', q - 1);
  if (c == std::string::npos) return false;
  const auto r = std::from_chars(line.data() + c + 1, line.data() + q, *count);
  if (r.ec != std::errc() || r.ptr != line.data() + q) return false;
  *id = line.substr(0, c) + line.substr(q);
  *count_at = c;
  return true;
}

// The runtime's misses so far (the warm-up's), written next to the export
// (`path`, whose directory is known writable) and read back. False (message
// printed) when that failed.
bool snapshot_misses(const dsp::Runtime& rt, const std::string& path, const char* cmd, MissCounts* out) {
  const std::string tmp = path + ".warm-up";
  const dsp::Status s = rt.export_misses(tmp);
  std::ifstream f(tmp);
  std::string line, id;
  size_t at = 0;
  int64_t n = 0;
  while (s.ok() && std::getline(f, line))
    if (split_miss_row(line, &id, &at, &n)) (*out)[id] += n;
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  if (!s.ok()) std::fprintf(stderr, "%s: cannot write the misses: %s\n", cmd, s.to_string().c_str());
  return s.ok();
}

// The export at `path` less the warm-up's calls (`warm`): each row's count
// lowered by the warm-up's, a row the warm-up alone missed left out.
// Replaced atomically, as the runtime writes it. False when that failed.
bool subtract_misses(const std::string& path, const MissCounts& warm) {
  std::ifstream f(path);
  if (!f) return false;
  std::string text, line, id;
  size_t at = 0;
  int64_t n = 0;
  while (std::getline(f, line)) {
    if (split_miss_row(line, &id, &at, &n)) {
      if (const auto it = warm.find(id); it != warm.end()) n -= it->second;
      if (n <= 0) continue;
      line = line.substr(0, at + 1) + std::to_string(n) + line.substr(line.find(",\"", at));
    }
    text += line + "\n";
  }
  const std::string tmp = path + ".tmp";
  std::ofstream w(tmp, std::ios::binary | std::ios::trunc);
  w << text;
  w.close();
  std::error_code ec;
  if (!w || (std::filesystem::rename(tmp, path, ec), ec)) {
    std::filesystem::remove(tmp, ec);
    return false;
  }
  return true;
}

// The misses of the replay, its warm-up's calls left out (`warm`: the
// misses the runtime had recorded when the warm-up ended), to `path` ("" =
// none); false (message printed) when the write failed.
bool export_misses(const dsp::Runtime& rt, const ReplayOptions& o, const char* cmd, const std::string& path,
                   const MissCounts& warm) {
  if (path.empty()) return true;
  if (dsp::Status s = rt.export_misses(path); !s.ok()) {
    std::fprintf(stderr, "%s: cannot write the misses: %s\n", cmd, s.to_string().c_str());
    return false;
  }
  if (!warm.empty() && !subtract_misses(path, warm)) {
    std::fprintf(stderr, "%s: cannot write the misses: io_error: cannot rewrite '%s' without the warm-up's calls\n",
                 cmd, path.c_str());
    return false;
  }
  if (!o.misses_summary)
    std::fprintf(stderr, "%s: wrote the misses to %s (the warm-up's calls left out)\n", cmd, path.c_str());
  return true;
}

// The misses file is written after the whole workload ran: a path that
// cannot be written is a usage error now, naming the flag, not a failure
// after minutes of replay. Checked by opening it for writing (created and
// removed again when absent; an existing file is not truncated). A usage
// error's exit code, or -1.
int check_export_path(const ReplayOptions& o, const char* cmd) {
  if (o.export_misses.empty()) return -1;
  const char* flag = o.misses_summary ? "--export" : "--export-misses";
  const std::string& path = o.export_misses;
  const auto bad = [&](const std::string& why) {
    std::fprintf(stderr, "%s: %s '%s': %s\n", cmd, flag, path.c_str(), why.c_str());
    return kExitUsage;
  };
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return bad("is a directory, not a file");
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  const bool created = fd >= 0;
  if (fd < 0 && errno == EEXIST) fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (e == ENOENT && !parent.empty() && !std::filesystem::exists(parent, ec))
      return bad("cannot be written: its directory '" + parent.string() + "' does not exist");
    return bad(std::string("cannot be written: ") + std::strerror(e));
  }
  ::close(fd);
  if (created) ::unlink(path.c_str());
  return -1;
}

}  // namespace

int run_replay(const ReplayOptions& o) {
  const char* cmd = o.misses_summary ? "kdispatch misses" : "kdispatch replay";
  Workload w;
  if (int e = read_workload(o, cmd, &w); e >= 0) return e;
  dsp::RuntimeOptions ro;
  if (int e = runtime_options(o, cmd, &ro); e >= 0) return e;
  if (int e = check_export_path(o, cmd); e >= 0) return e;
  auto rt_r = dsp::Runtime::create(ro);
  if (!rt_r.ok()) {
    std::fprintf(stderr, "%s: cannot create the runtime: %s\n", cmd, rt_r.status().to_string().c_str());
    return rt_r.status().code() == dsp::StatusCode::invalid_argument ? kExitUsage : kExitFailure;
  }
  dsp::Runtime& rt = **rt_r;
  if (o.misses_summary && !o.cache_dir.empty() && rt.cache_dir().empty()) {
    // --cache named a dir the cache-dir rules refuse: the note says why.
    const dsp::LoadReport rep = rt.load_report();
    std::string why = "refused";
    for (const std::string& n : rep.notes)
      if (n.rfind("tuning cache dir '", 0) == 0) why = n;
    std::fprintf(stderr, "%s: --cache '%s': %s\n", cmd, o.cache_dir.c_str(), why.c_str());
    return kExitFailure;
  }

  // ---- set-up: the model's weights and activations
  (void)dsp::cpu_device_info();  // probe the host once before anything is timed (the first probe reads /proc)
  RunInfo ri{w.model, &w.trace, w.steps, w.max_m, w.dtype, w.layers, 0, 0, 0, 0, rt.load_report(), ro.config_dirs};
  ri.shipped = ro.load_shipped_configs;
  ri.cache_dir = rt.cache_dir();
  ri.backends = files_by_backend(rt, ri.report);
  const auto t0 = Clock::now();
  Replay replay(rt, *w.model, w.dtype, w.max_m, w.layers);
  try {
    replay.init();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: out of memory allocating %s's weights and activations (max M %lld)\n", cmd, w.model->name,
                 (long long)w.max_m);
    return kExitFailure;
  }

  // ---- warm-up. Tuning modes: the warm-up and the first pass run frozen,
  // so the first pass measures the table as it started (no search on the
  // caller's thread, no background tuner competing for the cores).
  const bool tuning = ro.tune.mode != dsp::TuneMode::off;
  if (tuning) rt.freeze(true);
  const auto tw = Clock::now();
  if (std::string err; !replay.warm_up(&err)) {
    std::fprintf(stderr, "%s: warm-up: %s\n", cmd, err.c_str());
    return kExitFailure;
  }
  // The warm-up's misses, left out of the export: it counts the workload's
  // calls only (a prefill trace's misses hold no M = 1 row of the warm-up).
  const std::string export_path = misses_path(o);
  MissCounts warm_misses;
  if (!export_path.empty() && !snapshot_misses(rt, export_path, cmd, &warm_misses)) return kExitFailure;

  // ---- the replay: one pass, or tuning passes
  const auto t1 = Clock::now();
  TuneReport tr;
  if (!tuning) {
    if (!run_steps(replay, w, cmd, nullptr)) return kExitFailure;
  } else {
    if (!run_tuning_passes(rt, replay, w, o, cmd, &tr)) return kExitFailure;
    ri.tune = &tr;
  }
  const auto t2 = Clock::now();
  ri.init_s = std::chrono::duration<double>(tw - t0).count();
  ri.warmup_s = std::chrono::duration<double>(t1 - tw).count();
  ri.run_s = std::chrono::duration<double>(t2 - t1).count();
  ri.weight_bytes = replay.weight_bytes();

  // ---- the misses and the report
  if (!export_misses(rt, o, cmd, export_path, warm_misses)) return kExitFailure;
  if (o.misses_summary) return print_misses_summary(replay, o, ri, export_path);
  if (o.json)
    print_json(rt, replay, ri);
  else
    print_text(rt, replay, ri);
  return kExitOk;
}

}  // namespace kdispatch_cli
