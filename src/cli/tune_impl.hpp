// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch tune`'s pieces, shared by its files:
//   tune.cpp             the run: the options, the runtime over the emit
//                        dir, each unit skipped, tuned or failed with its
//                        progress line, run_tune
//   tune_shapes.cpp      the shapes: shape CSVs, their rows (or a model's
//                        units, tune_model.cpp) -> the jobs of the run,
//                        --shard's units, --list
//   tune_report.cpp      what the run prints at its end: the summary, as
//                        text or JSON
//   tune_devices.cpp     --devices: the devices, the resume pass, the queue
//                        order, the workers' report
//   tune_supervisor.cpp  --devices: the worker processes (spawn, hand out,
//                        wait, time out, replace, stop)
//   tune_worker.cpp      --devices: the worker process, and the line
//                        protocol both sides speak
// tune.cpp's header comment says what the command does; tune_devices.cpp's
// says how --devices works.
#pragma once

#include <sys/types.h>

#include <cctype>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli/cli.hpp"
#include "core/json_write.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"
#include "store/write_all.hpp"

namespace kdispatch_cli::tune_detail {

namespace dsp = dispatch;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using dsp::core::JsonWriter;

// ---------------------------------------------------------------- text

/// `v` without the blanks (space, tab, CR, LF) around it.
inline std::string_view trim(std::string_view v) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!v.empty() && ws(v.front())) v.remove_prefix(1);
  while (!v.empty() && ws(v.back())) v.remove_suffix(1);
  return v;
}

/// `v` lower-cased (ASCII).
inline std::string lower(std::string_view v) {
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

/// `v` as a whole decimal integer (no blanks, no trailing text).
inline bool parse_int(std::string_view v, int64_t* out) {
  if (v.empty()) return false;
  const auto r = std::from_chars(v.data(), v.data() + v.size(), *out);
  return r.ec == std::errc() && r.ptr == v.data() + v.size();
}

/// printf's `f` of one double ("%.1f", "%g", ...), at most 63 characters.
std::string fmt(const char* f, double v);
/// `v` rounded to 3 decimals (the JSON's times and ratios).
double round3(double v);

// ---------------------------------------------------------------- the units

/// One shape to tune: a key of --op (its file name's fields) at one M.
struct Job {
  std::string file;
  int line = 0;
  std::string key_fields;  ///< canonical, file-name order (describe_key)
  std::string label;       ///< the progress line's and the summary's name: "N=896,K=896,bf16", "hidden=896,bf16"
  int64_t m = 0;
  double flops = 0;
  std::string op;     ///< its op (--op, or the model unit's)
  int64_t bytes = 0;  ///< its operands' bytes at M (describe_key): a lower bound of its tuning scratch
};

/// What became of one unit (or of a row that never became one).
struct Outcome {
  enum class Kind { tuned, done, too_large, unsupported, failed } kind = Kind::failed;
  std::string label;
  std::string op;
  int64_t m = 0;
  std::string variant, key, message;
  dsp::Config config;
  double us = 0, default_us = 0;
  int32_t candidates = 0, rejected = 0;
  bool persisted = false;
  double margin = 0, aa_spread = 0;  ///< the row's metadata (PretuneResult)
  std::string timing, why;
  /// --devices: the config as a worker sent it (JSON), the worker slot and
  /// device ordinal that tuned the unit (-1: this process), the attempts (2:
  /// retried after its first worker died) and the unit's time in the worker.
  /// queue_index: its place in the queue, 0 = the largest (the index
  /// KDISPATCH_TEST_WORKER_DIE_AT names).
  std::string config_json;
  int32_t worker = -1, device = -1, attempts = 0;
  int64_t queue_index = -1;
  double seconds = 0;
};

/// The kind's name in the JSON and the worker protocol: "tuned", "done", ...
const char* kind_name(Outcome::Kind k);

/// What the reading of the shape lists (or of --model) found.
struct Shapes {
  std::vector<Job> jobs;
  std::vector<Outcome> unsupported;           ///< rows of --op this host cannot tune
  std::map<std::string, int64_t> other_rows;  ///< rows left out: another op -> count
  std::vector<std::string> ops;               ///< the ops of the run: --op, or the model's
  std::optional<ModelPlan> model;             ///< --model: what it derived
};

/// Where the units are tuned: the runtime over the emit dir and its device.
struct Target {
  dsp::Runtime& rt;
  const TuneCmdOptions& o;
  dsp::Device dev;
  std::string device;  ///< its device_name
};

/// The progress display on stderr: one line per unit, "[n/N] <what> [elapsed
/// E, ETA T]"; on a terminal, also a bar redrawn in place under those lines.
/// The ETA is the elapsed time per unit searched (not skipped) so far times
/// the units left ("?" before the first search ends). (tune.cpp)
class Progress {
 public:
  explicit Progress(size_t total);
  /// Unit i (1-based) of the total starts (a terminal's bar only).
  void start(size_t i, const std::string& what);
  /// Unit i of the total ended; `searched`: it ran a search (not skipped).
  void done(size_t i, const std::string& text, bool searched = true);
  /// The bar's line cleared (a terminal).
  void finish();

 private:
  size_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point t0_;
  size_t searched_ = 0;
};

// ---------------------------------------------------------------- the shapes (tune_shapes.cpp)

/// "bf16", "torch.bfloat16", "float32", ... -> a DType.
std::optional<dsp::DType> dtype_from_csv(std::string_view v);
/// The ops of the run as the summary names them: "gemm", or "gemm/rmsnorm/...".
std::string ops_text(const Shapes& sh);
/// Reads the shape lists and keeps --op's rows, without duplicates. A usage
/// error's exit code, or -1.
int read_shapes(const TuneCmdOptions& o, const char* cmd, const dsp::OpInfo& op, Shapes* out);
/// --model: the units of the model's unit table at each M of --ms. A usage
/// error's exit code, or -1.
int model_shapes(const TuneCmdOptions& o, const char* cmd, Shapes* out);
/// Keeps the units of --shard in shapes->jobs. A usage error's exit code, or -1.
int select_shard(TuneCmdOptions* o, const char* cmd, Shapes* shapes);
/// --list: the units and an estimate; the exit code.
int list_units(const TuneCmdOptions& o, const Shapes& shapes);

// ---------------------------------------------------------------- the run (tune.cpp)

/// A runtime over the emit dir (no shipped configs, no other dir); null with
/// *exit_code set on failure.
std::unique_ptr<dsp::Runtime> emit_runtime(const TuneCmdOptions& o, const char* cmd, int* exit_code);
/// The device the shapes are tuned on (--backend, --device) and its
/// device_name. False (message printed) when it is not there.
bool tune_device(dsp::Runtime& rt, const TuneCmdOptions& o, const char* cmd, dsp::Device* dev, std::string* name);
/// Why a unit whose operands need `bytes` is not tuned under `budget`.
std::string over_budget_text(int64_t bytes, int64_t budget);
/// A job skipped before the search (--max-flops, the memory budget, or
/// already in the emit dir when resuming), with its progress line; nullopt
/// when it is to be searched.
std::optional<Outcome> skip(const Target& t, const Job& j, const std::string& head, std::string* line);
/// One job: skipped, tuned or failed; *line is its progress line, *sticky
/// (optional) whether it failed with a sticky device error; `progress`
/// (optional) shows it as started (unit i, 0-based) before the search.
Outcome tune_unit(const Target& t, const Job& j, std::string* line, bool* sticky = nullptr,
                  Progress* progress = nullptr, size_t i = 0);
/// Whether the unit ran a search (the progress line's ETA counts those).
bool searched(const Outcome& out);

// ---------------------------------------------------------------- the report (tune_report.cpp)

/// The run's totals.
struct Summary {
  int64_t shapes = 0, tuned = 0, done = 0, too_large = 0, unsupported = 0, failed = 0, with_speedup = 0;
  double geomean = 0.0, seconds = 0.0;
  std::vector<std::string> files;  ///< under <emit>/<backend>/<op>/ (what a commit would add)
};
Summary summarize(const TuneCmdOptions& o, const Shapes& sh, const std::vector<Outcome>& results, double seconds);
/// The summary as JSON on stdout; `workers` (--devices): the JSON array of
/// the worker slots, else "".
void print_json(const TuneCmdOptions& o, const std::string& device, const Summary& s, double budget_ms,
                const std::vector<Outcome>& results, const Shapes& sh, const std::string& workers = {});
/// The summary as text (stdout; the rows not tuned on stderr).
void print_text(const TuneCmdOptions& o, const Summary& s, const Shapes& sh);

// ---------------------------------------------------------------- --devices (tune_devices.cpp)

/// --devices' value: "all" (*ordinals left empty) or comma-separated device
/// ordinals, each once. A message naming the problem, or "".
std::string parse_devices(const std::string& text, std::vector<int32_t>* ordinals);
/// tune --devices; returns the exit code.
int run_devices(const TuneCmdOptions& o, const char* cmd, const Shapes& shapes, dsp::Runtime& rt);

// ---------------------------------------------------------------- the worker protocol (tune_worker.cpp)

/// The fd a worker writes its messages to.
inline constexpr int kWorkerResultFd = 3;
/// A message text as one field of the protocol: no tab, no newline.
std::string one_field(std::string v);
/// The tab-separated fields of one message.
std::vector<std::string> split_tabs(std::string_view l);
/// All of `s` to `fd` (EINTR retried); false on an error.
using dispatch::store::write_all;  // header only: the CLI cannot link the library's hidden symbols
/// A worker's message (split_tabs) read as a result: false when it is not
/// one (the wrong field count, a field that is not a number); else its unit
/// (the queue index) and outcome (the unit's label, op and M are the
/// parent's). The sticky flag, the message and the progress line are
/// fields 4, 12 and 13.
bool read_result(const std::vector<std::string>& f, int64_t* unit, Outcome* out);
/// The worker (tune --internal-worker): the units the parent sends, one at
/// a time, until its stdin ends. Returns the exit code.
int run_worker(const TuneCmdOptions& o, const char* cmd);

// ---------------------------------------------------------------- the workers (tune_supervisor.cpp)

/// One worker slot of --devices: the process serving it now (pid -1: none)
/// and the totals of every process it had.
struct WorkerSlot {
  int32_t index = 0, ordinal = 0;
  std::string name;  ///< "worker 1 (cuda:1)"
  pid_t pid = -1;
  int cmd_fd = -1, res_fd = -1;
  std::string buf;  ///< a result line read in part
  bool ready = false, retiring = false, abandoned = false;
  bool timed_out = false;       ///< killed for running its unit past --unit-timeout-s
  Clock::time_point killed_at;  ///< when (timed_out)
  int64_t unit = -1;            ///< the queue index in flight, or -1
  Clock::time_point started;
  int32_t startup_failures = 0, processes = 0;
  int64_t units = 0;
  double busy_seconds = 0;
};

/// Tunes `units` (indices into `jobs`, largest first) on --workers-per-device
/// worker processes (`exe`) per device of `ordinals`, their outcomes into
/// (*results)[unit]; `progress` numbers their lines after the `done` printed
/// before. Returns the worker slots, for the report.
std::vector<WorkerSlot> supervise(const TuneCmdOptions& o, const char* cmd, const std::vector<Job>& jobs,
                                  const std::vector<size_t>& units, const std::vector<int32_t>& ordinals,
                                  int32_t per_device, const std::string& exe, std::vector<Outcome>* results,
                                  Progress& progress, size_t done);

}  // namespace kdispatch_cli::tune_detail
