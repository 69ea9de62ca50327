// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — the offline tuning loop, as aiter's: `kdispatch misses`
// writes the shapes a workload missed (replay.cpp), `kdispatch tune` reads a
// shape list (that CSV, or aiter's untuned CSVs) and tunes each shape with
// dispatch::pretune into an emit dir, in the config-file format the loader
// reads (<dir>/<backend>/<op>/<key fields>.json, fit to commit to configs/).
//
// `tune` resumes: a shape whose (key, M) already has a row in the emit dir
// (an exact lookup match) is skipped, so an interrupted run picks up where it
// stopped (every winner is persisted as soon as it is found).
//
// `tune --devices all|0,1,...` spreads the units over one worker process per
// device, pulling from one queue, largest first (tune_devices.cpp).
//
// `tune --model CONFIG` takes its units from a model's config.json instead
// of a shape list (tune_model.cpp: the unit table; tune_shapes.cpp:
// model_shapes): several ops in one run, each unit (a Job) naming its op.
// Every run prints a progress line per unit: [n/N] ... [elapsed E, ETA T].
//
// This file is the run: the options, the runtime over the emit dir, each
// unit skipped, tuned or failed, and run_tune, which puts the pieces
// together (tune_impl.hpp lists them).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "cli/cli.hpp"
#include "cli/op_util.hpp"
#include "cli/tune_impl.hpp"
#include "dispatch/device.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"

namespace kdispatch_cli {
namespace tune_detail {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

double round3(double v) { return std::round(v * 1000) / 1000; }

// ---------------------------------------------------------------- progress

namespace {

// "12.3s", "4m05s", "2h07m".
std::string duration_text(double s) {
  char b[32];
  if (s < 60)
    std::snprintf(b, sizeof b, "%.1fs", s);
  else if (s < 3600)
    std::snprintf(b, sizeof b, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  else
    std::snprintf(b, sizeof b, "%dh%02dm", static_cast<int>(s / 3600), static_cast<int>(s / 60) % 60);
  return b;
}

}  // namespace

Progress::Progress(size_t total)
    : total_(total), tty_(::isatty(::fileno(stderr)) == 1), t0_(std::chrono::steady_clock::now()) {}

void Progress::start(size_t i, const std::string& what) {
  if (!tty_) return;
  constexpr int kWidth = 24;
  const int done = total_ ? static_cast<int>(kWidth * (i - 1) / total_) : kWidth;  // shapes finished
  std::string bar(static_cast<size_t>(done), '=');
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "\r\033[K[%s] %zu/%zu %s ...", bar.c_str(), i, total_, what.c_str());
  std::fflush(stderr);
}

void Progress::done(size_t i, const std::string& text, bool searched) {
  if (tty_) std::fprintf(stderr, "\r\033[K");
  searched_ += searched;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const size_t left = total_ > i ? total_ - i : 0;
  const std::string eta = left == 0 ? std::string("0.0s")
                          : searched_ == 0
                              ? std::string("?")
                              : duration_text(elapsed / static_cast<double>(searched_) * static_cast<double>(left));
  const int w = static_cast<int>(std::to_string(total_).size());
  std::fprintf(stderr, "[%*zu/%zu] %s [elapsed %s, ETA %s]\n", w, i, total_, text.c_str(),
               duration_text(elapsed).c_str(), eta.c_str());
  std::fflush(stderr);
}

void Progress::finish() {
  if (tty_) std::fprintf(stderr, "\r\033[K");
}

// ---------------------------------------------------------------- the options

namespace {

// Checks the options that need no file: a usage error's exit code, or -1.
/// --margin's value; NaN when it is not a number (empty, trailing text).
double margin_of(const TuneCmdOptions& o) {
  char* end = nullptr;
  const double m = std::strtod(o.margin_text.c_str(), &end);
  return o.margin_text.empty() || end == o.margin_text.c_str() || *end != '\0' ? std::nan("") : m;
}

int check_options(const TuneCmdOptions& o, const char* cmd) {
  const auto bad = [&](const std::string& msg) {
    std::fprintf(stderr, "%s: %s\n", cmd, msg.c_str());
    return kExitUsage;
  };
  if (!o.op.empty() && !find_op(o.op)) return bad("--op '" + o.op + "' is not " + op_names_text());
  if (o.model.empty() && (o.tp != 0 || !o.fp8.empty() || !o.ms.empty() || o.no_lm_head))
    return bad("--tp, --fp8, --ms and --no-lm-head go with --model");
  if (o.tp < 0 || o.tp > 1024) return bad("--tp must be in [1, 1024], got " + std::to_string(o.tp));
  if (!o.fp8.empty() && o.fp8 != "tensor" && o.fp8 != "rowwise" && o.fp8 != "block" && o.fp8 != "none")
    return bad("--fp8 '" + o.fp8 + "' is not tensor, rowwise, block or none");
  if (!dtype_from_csv(o.dtype)) return bad("--dtype '" + o.dtype + "' is not a dtype (fp32, bf16, fp16, fp8_e4m3fn)");
  if (!(o.max_flops > 0)) return bad("--max-flops must be > 0, got " + fmt("%g", o.max_flops));
  if (o.mem_gib < 0 || !std::isfinite(o.mem_gib)) return bad("--mem-gib must be > 0, got " + fmt("%g", o.mem_gib));
  if (o.budget_ms < 0 || !std::isfinite(o.budget_ms))
    return bad("--budget-ms must be > 0, got " + fmt("%g", o.budget_ms));
  if (o.margin_given && !(margin_of(o) >= 0.0 && margin_of(o) <= 0.5))
    return bad("--margin must be a fraction in [0, 0.5], got '" + o.margin_text + "'");
  if (o.max_candidates != -1 && o.max_candidates < 1)
    return bad("--max-candidates must be >= 1, got " + std::to_string(o.max_candidates));
  if (o.reps < 0) return bad("--reps must be >= 1, got " + std::to_string(o.reps));
  if (o.backend != "cpu" && o.backend != "cuda" && o.backend != "hip")
    return bad("--backend '" + o.backend + "' is not cpu, cuda or hip");
  if (o.device < -1) return bad("--device must be >= 0, got " + std::to_string(o.device));
  if (!o.devices.empty()) {
    if (o.device >= 0) return bad("--devices and --device: give one (--devices " + o.devices + " tunes on each)");
    std::vector<int32_t> ordinals;
    if (std::string e = parse_devices(o.devices, &ordinals); !e.empty()) return bad(e);
  }
  // Read by the writer at the first persisted row: a bad value would fail
  // every row after its search.
  if (const char* lk = std::getenv("KDISPATCH_CACHE_LOCKING"))
    if (std::string_view v(lk); v != "auto" && v != "flock" && v != "fragments")
      return bad("KDISPATCH_CACHE_LOCKING='" + std::string(v) + "' is not valid (expected auto, flock or fragments)");
  // Ranges checked whether or not --devices is given, so a bad value is
  // named for what it is. Under a second kills units as they are handed out
  // (a value in ms?); over a week is no timeout (1e30 s overflows the
  // deadline's clock).
  if (o.unit_timeout_s && !(*o.unit_timeout_s >= 1 && *o.unit_timeout_s <= kMaxUnitTimeoutS))
    return bad("--unit-timeout-s must be in [1, " + fmt("%.0f", kMaxUnitTimeoutS) + "] seconds (1 s to a week), got " +
               fmt("%g", *o.unit_timeout_s));
  if (o.workers_per_device && (*o.workers_per_device < 1 || *o.workers_per_device > kMaxWorkersPerDevice))
    return bad("--workers-per-device must be in [1, " + std::to_string(kMaxWorkersPerDevice) + "], got " +
               std::to_string(*o.workers_per_device));
  if (o.workers_per_device && o.devices.empty()) return bad("--workers-per-device needs --devices");
  if (o.unit_timeout_s && o.devices.empty()) return bad("--unit-timeout-s needs --devices");
  return -1;
}

}  // namespace

// ---------------------------------------------------------------- the runtime over the emit dir

// A runtime over the emit dir (no shipped configs, no other dir); null with
// *exit_code set on failure.
std::unique_ptr<dsp::Runtime> emit_runtime(const TuneCmdOptions& o, const char* cmd, int* exit_code) {
  std::error_code ec;
  *exit_code = kExitUsage;
  if (fs::exists(o.emit, ec) && !fs::is_directory(o.emit, ec)) {
    std::fprintf(stderr, "%s: --emit '%s' is not a directory\n", cmd, o.emit.c_str());
    return nullptr;
  }
  fs::create_directories(o.emit, ec);
  if (ec) {
    std::fprintf(stderr, "%s: cannot create --emit dir '%s': %s\n", cmd, o.emit.c_str(), ec.message().c_str());
    *exit_code = kExitFailure;
    return nullptr;
  }
  dsp::RuntimeOptions ro;
  ro.load_shipped_configs = false;
  ro.tune.mode = dsp::TuneMode::off;  // pretune works in every mode
  ro.tune.cache_dir = o.emit;         // winners persist straight into the emit dir
  ro.tune.persist = true;
  ro.tune.load_cache = true;                 // its rows (this build's) are the "done" set
  ro.tune.keep_rows_of_other_builds = true;  // an emit dir is committed configs: never drop rows on merge
  if (o.budget_ms > 0) ro.tune.time_budget_ms = o.budget_ms;
  // $KDISPATCH_TUNE_MEM (unless --mem-gib), $KDISPATCH_TUNE_MARGIN (unless
  // --margin), $KDISPATCH_TUNE_GRAPH and $KDISPATCH_LOG_LEVEL (info:
  // every shape's confirmation rounds) apply. The whole KDISPATCH_*
  // environment is checked as a runtime checks it, whichever variables are
  // set: a bad value is refused naming it (it was checked only when one of
  // these four was set).
  const bool env_mem = o.mem_gib <= 0 && std::getenv("KDISPATCH_TUNE_MEM");
  const bool env_margin = !o.margin_given && std::getenv("KDISPATCH_TUNE_MARGIN");
  {
    auto env = dsp::options_from_env();
    if (!env.ok()) {
      std::fprintf(stderr, "%s: %s\n", cmd, env.status().to_string().c_str());
      return nullptr;
    }
    if (env_mem) ro.tune.memory_budget_bytes = env->tune.memory_budget_bytes;
    if (env_margin) ro.tune.margin = env->tune.margin;
    if (std::getenv("KDISPATCH_LOG_LEVEL")) ro.log_level = env->log_level;
    ro.tune.graph_timing = env->tune.graph_timing;
    ro.tune.routing = env->tune.routing;
  }
  if (!o.routing.empty()) ro.tune.routing = o.routing;
  if (o.mem_gib > 0) ro.tune.memory_budget_bytes = static_cast<int64_t>(o.mem_gib * 1073741824.0);
  if (o.no_cold_cache) ro.tune.cold_cache = false;
  if (o.reps > 0) ro.tune.reps = o.reps;
  if (o.max_candidates >= 1) ro.tune.max_candidates = o.max_candidates;
  if (o.margin_given) ro.tune.margin = margin_of(o);
  auto rt = dsp::Runtime::create(ro);
  if (!rt.ok()) {
    std::fprintf(stderr, "%s: cannot create the runtime over '%s': %s\n", cmd, o.emit.c_str(),
                 rt.status().to_string().c_str());
    *exit_code = kExitFailure;
    return nullptr;
  }
  if ((*rt)->cache_dir().empty()) {  // refused by the cache-dir rules (docs/tuning.md "Safety rules"): nothing persists
    std::string why = "refused";
    for (const std::string& n : (*rt)->load_report().notes)
      if (n.rfind("tuning cache dir '", 0) == 0) why = n;
    std::fprintf(stderr, "%s: --emit '%s': %s\n", cmd, o.emit.c_str(), why.c_str());
    *exit_code = kExitFailure;
    return nullptr;
  }
  return std::move(*rt);
}

// The device the shapes are tuned on: its tensors' device selects the
// backend, and its device_name goes into the emitted file names. False
// (message printed) when --backend's device is not there.
bool tune_device(dsp::Runtime& rt, const TuneCmdOptions& o, const char* cmd, dsp::Device* dev, std::string* name) {
  auto type = dsp::parse_device_type(o.backend);  // --backend's choices are the device type names
  if (!type.ok()) {
    std::fprintf(stderr, "%s: --backend %s: %s\n", cmd, o.backend.c_str(), type.status().to_string().c_str());
    return false;
  }
  *dev = dsp::Device{*type, o.device < 0 ? 0 : o.device};
  auto di = rt.device_info(*dev);
  if (!di.ok() || !di->available) {
    std::fprintf(stderr, "%s: --backend %s: %s\n", cmd, o.backend.c_str(),
                 di.ok() ? di->unavailable_reason.c_str() : di.status().to_string().c_str());
    return false;
  }
  *name = di->device_name;
  return true;
}

namespace {

void print_plan(const TuneCmdOptions& o, const char* cmd, const Shapes& sh, dsp::Runtime& rt) {
  int stale = 0;
  for (const auto& f : rt.load_report().files) stale += f.stale;
  const dsp::TuneOptions& to = rt.options().tune;
  const std::string from = sh.model ? "model units" : "shapes from " + std::to_string(o.shapes.size()) + " file(s)";
  std::fprintf(stderr, "%s: %zu %s %s -> %s (budget %.0f ms/shape, %d reps%s%s)\n", cmd, sh.jobs.size(),
               ops_text(sh).c_str(), from.c_str(), o.emit.c_str(), to.time_budget_ms, to.reps,
               to.cold_cache ? ", cold cache" : ", warm cache", o.resume ? ", resuming" : "");
  if (sh.model) {
    std::fprintf(stderr, "  model: %s\n", sh.model->description.c_str());
    for (const std::string& n : sh.model->notes) std::fprintf(stderr, "  note: %s\n", n.c_str());
  }
  for (const auto& [other, n] : sh.other_rows)
    std::fprintf(stderr, "  left out %lld rows of %s\n", (long long)n, other.c_str());
  if (auto cl = dsp::cache_locking(o.emit); cl.ok())
    std::fprintf(stderr, "  writes: %s (%s)\n",
                 cl->fragments ? "per-process fragments <key>.json.d/<host>-<pid>.json (compact them with kdispatch "
                                 "merge)"
                               : "each <key>.json merged under its lock file",
                 cl->reason.c_str());
  else
    std::fprintf(stderr, "  writes: none can be made: %s\n", cl.status().to_string().c_str());
  if (stale)
    std::fprintf(stderr,
                 "  note: %d file(s) in %s were written by another build (their fingerprint differs): their rows "
                 "do not count as done, and writing to such a file replaces them\n",
                 stale, o.emit.c_str());
}

}  // namespace

// ---------------------------------------------------------------- tune

// Why a unit whose operands need `bytes` is not tuned under `budget`.
std::string over_budget_text(int64_t bytes, int64_t budget) {
  return "its operands need " + fmt("%.2f", static_cast<double>(bytes) / 1073741824.0) +
         " GiB, over the tuning memory budget of " + fmt("%.2f", static_cast<double>(budget) / 1073741824.0) +
         " GiB (--mem-gib)";
}

namespace {

// The tuner's result of one job -> its outcome and progress line.
Outcome tuned_outcome(const dsp::PretuneResult& r, const std::string& head, const std::string& emit,
                      std::string* line) {
  Outcome out;
  out.kind = Outcome::Kind::tuned;
  out.variant = r.variant;
  out.key = r.key;
  out.config = r.config;
  out.us = r.best_us;
  out.default_us = r.default_us;
  out.candidates = r.candidates;
  out.rejected = r.rejected;
  out.persisted = r.persisted;
  out.margin = r.margin;
  out.aa_spread = r.aa_spread;
  out.timing = r.timing;
  out.why = r.why;
  *line = head + " -> " + r.variant + " " + fmt("%.1f", r.best_us) + "us (floor " + fmt("%.1f", r.default_us) + "us, " +
          (r.best_us > 0 && r.default_us > 0 ? fmt("%.2f", r.default_us / r.best_us) + "x" : "n/a") + ", " +
          std::to_string(r.candidates) + (r.candidates == 1 ? " candidate)" : " candidates)");
  if (!r.persisted) {
    out.kind = Outcome::Kind::failed;
    out.message = "tuned but not written to " + emit;
    *line += " FAILED: not written to the emit dir";
  }
  return out;
}

}  // namespace

// A job skipped before the search: its call costs more than --max-flops,
// its operands alone are over the tuning memory budget (--mem-gib: a
// model's lm_head at large M), or (resuming) the emit dir has its (key, M)
// already (an exact lookup match). Sets the progress line.
std::optional<Outcome> skip(const Target& t, const Job& j, const std::string& head, std::string* line) {
  const TuneCmdOptions& o = t.o;
  Outcome out;
  out.op = j.op;
  const int64_t budget = t.rt.options().tune.memory_budget_bytes;
  if (j.flops > o.max_flops || j.bytes > budget) {
    out.kind = Outcome::Kind::too_large;
    out.message = j.flops > o.max_flops
                      ? fmt("%.3g", j.flops) + " flops per call > --max-flops " + fmt("%.3g", o.max_flops)
                      : over_budget_text(j.bytes, budget);
    *line = head + " skipped: " + out.message;
    return out;
  }
  if (!o.resume) return std::nullopt;
  dsp::LookupQuery q;
  q.op = j.op;
  q.key = j.key_fields;
  q.backend = o.backend;
  q.device = t.device;
  q.M = j.m;
  auto lr = dsp::lookup(t.rt, q);
  if (!lr.ok() || lr->match != dsp::LookupResult::Match::exact) return std::nullopt;
  out.kind = Outcome::Kind::done;
  out.variant = lr->variant;
  out.key = lr->key;
  out.config = lr->config;
  out.message = "already in " + o.emit;
  *line = head + " skipped: already in the emit dir (" + lr->variant + ")";
  return out;
}

namespace {

// A backend error after which the device context is unusable (CUDA's and
// HIP's sticky errors: every later call fails): only a new process recovers.
bool is_sticky_error(const dsp::Status& s) {
  if (s.code() != dsp::StatusCode::backend_error) return false;
  static const char* const kSticky[] = {"cudaErrorIllegalAddress",     "cudaErrorLaunchFailure",
                                        "cudaErrorHardwareStackError", "cudaErrorIllegalInstruction",
                                        "cudaErrorMisalignedAddress",  "cudaErrorInvalidAddressSpace",
                                        "cudaErrorInvalidPc",          "cudaErrorAssert",
                                        "cudaErrorECCUncorrectable",   "cudaErrorLaunchTimeout",
                                        "cudaErrorContextIsDestroyed", "hipErrorIllegalAddress",
                                        "hipErrorLaunchFailure",       "hipErrorAssert",
                                        "hipErrorECCNotCorrectable",   "hipErrorLaunchTimeOut",
                                        "hipErrorContextIsDestroyed"};
  const std::string text = s.to_string();
  for (const char* name : kSticky)
    if (text.find(name) != std::string::npos) return true;
  return false;
}

}  // namespace

// One job: skipped, tuned (dsp::pretune_key, persisted into the emit dir) or
// failed; *line is its progress line. *sticky (optional) says whether it
// failed with a sticky device error. `progress` (optional) shows the job
// as started before the search.
Outcome tune_unit(const Target& t, const Job& j, std::string* line, bool* sticky, Progress* progress, size_t i) {
  const std::string head = j.label + " M=" + std::to_string(j.m);
  Outcome out;
  if (sticky) *sticky = false;
  if (auto skipped = skip(t, j, head, line)) {
    out = std::move(*skipped);
  } else {
    if (progress) progress->start(i + 1, head);
    auto r = dsp::pretune_key(t.rt, j.op, j.key_fields, j.m, t.dev);
    if (r.ok()) {
      out = tuned_outcome(*r, head, t.o.emit, line);
    } else {
      // Over the scratch-memory budget is "too large here", like --max-flops.
      out.kind = r.status().code() == dsp::StatusCode::out_of_memory ? Outcome::Kind::too_large : Outcome::Kind::failed;
      out.message = r.status().to_string();
      *line = head + (out.kind == Outcome::Kind::failed ? " FAILED: " : " skipped: ") + out.message;
      if (sticky) *sticky = is_sticky_error(r.status());
    }
  }
  out.label = j.label;
  out.op = j.op;
  out.m = j.m;
  return out;
}

// Whether the unit ran a search (the progress line's ETA counts those).
bool searched(const Outcome& out) { return out.kind == Outcome::Kind::tuned || out.kind == Outcome::Kind::failed; }

namespace {

// One job of this process, with its progress line.
Outcome tune_one(const Target& t, const Job& j, size_t i, Progress& progress) {
  std::string line;
  Outcome out = tune_unit(t, j, &line, nullptr, &progress, i);
  progress.done(i + 1, line, searched(out));
  return out;
}

// The --max-flops of a GPU backend when none is given.
constexpr double kNoFlopsLimit = 1e18;

// --model on a GPU without --mem-gib or $KDISPATCH_TUNE_MEM: the budget is
// a quarter of the device's memory, split over --workers-per-device (the
// lm_head of a 150k vocabulary at M = 8192 needs ~4 GiB of operands, over
// the library's 1 GiB default), never below that default. Left as it is
// when the device cannot be asked (the budget then says "too large here").
void size_model_budget(TuneCmdOptions* o) {
  if (o->mem_gib > 0 || std::getenv("KDISPATCH_TUNE_MEM") || o->model.empty() || o->backend == "cpu") return;
  auto type = dsp::parse_device_type(o->backend);
  if (!type.ok()) return;
  dsp::RuntimeOptions ro;
  ro.load_shipped_configs = false;
  ro.log_level = dsp::LogLevel::off;
  ro.tune.mode = dsp::TuneMode::off;
  auto rt = dsp::Runtime::create(ro);
  if (!rt.ok()) return;
  auto di = (*rt)->device_info(dsp::Device{*type, o->device < 0 ? 0 : o->device});
  if (!di.ok() || !di->available || di->memory_bytes <= 0) return;
  const double per_worker = static_cast<double>(di->memory_bytes) / 4.0 / o->workers_per_device.value_or(1);
  o->mem_gib = std::max(static_cast<double>(dsp::TuneOptions{}.memory_budget_bytes), per_worker) / 1073741824.0;
}

}  // namespace
}  // namespace tune_detail

int run_tune(const TuneCmdOptions& opts) {
  using namespace tune_detail;
  const char* cmd = "kdispatch tune";
  TuneCmdOptions o = opts;
  // No --dtype: bf16, else (--shapes) the op's only input dtype (the fp8
  // GEMMs: fp8_e4m3fn). With --model, --dtype is the model's activations'
  // and --op only filters the units (each fp8 unit names its own dtype).
  if (o.dtype.empty()) {
    o.dtype = "bf16";
    if (const dsp::OpInfo* info = find_op(o.op);
        o.model.empty() && info && info->in_dtypes.size() == 1 && info->in_dtypes[0] != "bf16")
      o.dtype = std::string(info->in_dtypes[0]);
  }
  if (o.emit.empty() && !o.list) {  // --list tunes nothing: no dir needed
    std::fprintf(stderr, "%s: --emit DIR is required (the dir the config files are written to)\n", cmd);
    return kExitUsage;
  }
  if (int e = check_options(o, cmd); e >= 0) return e;
  if (o.internal_worker) return run_worker(o, cmd);
  if (!o.max_flops_given && o.backend != "cpu") o.max_flops = kNoFlopsLimit;
  size_model_budget(&o);
  if (o.model.empty() == o.shapes.empty() || (o.model.empty() && o.op.empty())) {
    std::fprintf(stderr, "%s: give --shapes FILE... with --op OP, or --model CONFIG.json|DIR|NAME%s\n", cmd,
                 o.model.empty() ? "" : " (not both)");
    return kExitUsage;
  }
  // Under torchrun each process is one GPU's: --devices would start workers
  // on every GPU from every process (--shard auto says so below too).
  const bool torchrun = std::getenv("TORCHELASTIC_RUN_ID") || (std::getenv("LOCAL_RANK") && std::getenv("WORLD_SIZE"));
  if (!o.devices.empty() && o.shard != "auto" && torchrun) {
    std::fprintf(stderr,
                 "%s: --devices under torchrun (TORCHELASTIC_RUN_ID or LOCAL_RANK and WORLD_SIZE are set): torchrun "
                 "already runs one process per GPU; use --shard auto without --devices\n",
                 cmd);
    return kExitUsage;
  }

  // ---- the shapes: read, keep --op's rows, drop duplicates (or the
  // model's units, --op's only when given); the shard's units
  Shapes shapes;
  if (int e = o.model.empty() ? read_shapes(o, cmd, *find_op(o.op), &shapes) : model_shapes(o, cmd, &shapes); e >= 0)
    return e;
  if (int e = select_shard(&o, cmd, &shapes); e >= 0) return e;
  if (o.list) return list_units(o, shapes);

  // ---- the emit dir and a runtime over it, the device
  int exit_code = kExitOk;
  std::unique_ptr<dsp::Runtime> rt = emit_runtime(o, cmd, &exit_code);
  if (!rt) return exit_code;
  if (!o.json) print_plan(o, cmd, shapes, *rt);
  if (!o.devices.empty()) return run_devices(o, cmd, shapes, *rt);
  Target target{*rt, o, {}, {}};
  if (!tune_device(*rt, o, cmd, &target.dev, &target.device)) return kExitUsage;

  // ---- tune
  std::vector<Outcome> results;
  Progress progress(shapes.jobs.size());
  const auto t0 = Clock::now();
  for (size_t i = 0; i < shapes.jobs.size(); ++i) results.push_back(tune_one(target, shapes.jobs[i], i, progress));
  progress.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  // ---- summary
  const Summary s = summarize(o, shapes, results, seconds);
  if (o.json)
    print_json(o, target.device, s, rt->options().tune.time_budget_ms, results, shapes);
  else
    print_text(o, s, shapes);
  return s.failed > 0 ? kExitFailure : kExitOk;
}

}  // namespace kdispatch_cli
