// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — declarations shared by the tool's translation units: the
// model table and traces (models.cpp), the replay driver (replay.cpp, over
// the decoder model of replay_model.hpp), the shape lists and `tune`
// (tune*.cpp, tune_impl.hpp) and the config inspection commands
// (configs.cpp). Every op
// the tool handles comes from dispatch::op_list() (op_util.hpp); only the
// replay's model names the ops it calls. The CLI links the shared
// libkdispatch, so it uses only the public API (include/dispatch/*.hpp)
// plus two header-only helpers (core/json_write.hpp, core/numeric.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kdispatch_cli {

/// Exit codes of every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  ///< an op failed, not_found, unusable config files
inline constexpr int kExitUsage = 2;    ///< a bad argument or input file

/// DeepSeek-V2/V3's multi-head latent attention (MLA), as config.json
/// publishes it: q and kv pass through low-rank latents (q_a -> q_b,
/// kv_a -> kv_b), each latent normalised (q_a_layernorm, kv_a_layernorm).
struct MlaSpec {
  int64_t q_lora_rank;       ///< q_lora_rank: q_a_proj's N, q_b_proj's K
  int64_t kv_lora_rank;      ///< kv_lora_rank: the kv latent (kv_a_layernorm's hidden, kv_b_proj's K)
  int64_t qk_nope_head_dim;  ///< qk_nope_head_dim
  int64_t qk_rope_head_dim;  ///< qk_rope_head_dim: the shared rope key, kv_a_proj_with_mqa's extra columns
  int64_t v_head_dim;        ///< v_head_dim
};

/// A decoder-only transformer's dimensions, as its config.json publishes them.
struct ModelSpec {
  const char* name;      ///< CLI name, e.g. "qwen2.5-0.5b"
  const char* source;    ///< where the numbers come from (Hugging Face config.json)
  int64_t hidden;        ///< hidden_size
  int64_t intermediate;  ///< intermediate_size
  int64_t heads;         ///< num_attention_heads
  int64_t kv_heads;      ///< num_key_value_heads
  int64_t head_dim;      ///< hidden_size / num_attention_heads unless the config says otherwise
  int64_t layers;        ///< num_hidden_layers
  double rms_eps;        ///< rms_norm_eps
  bool qkv_bias;         ///< Qwen2 has a bias on q/k/v; Llama has none
  int64_t tp;            ///< tensor-parallel degree the shapes are sharded for (1 = none)
  /// Block-fp8 projections (an fp8 checkpoint's quantization_config: fp8
  /// e4m3fn weights with weight_block_size [128, 128]): every projection
  /// runs quant_fp8_group of its input, then gemm_fp8_block; norms and the
  /// activation stay in the run's dtype.
  bool fp8 = false;
  /// MLA instead of grouped-query attention (DeepSeek); null for GQA. Its
  /// projections replace qkv_proj; o_proj's K is heads * v_head_dim.
  const MlaSpec* mla = nullptr;
  int64_t vocab = 0;  ///< vocab_size (`tune --model NAME`'s lm_head; the replay runs no lm_head)

  // Per-rank GEMM shapes (N, K) of the four projections, as torch.nn.Linear
  // weights [N, K]. q/k/v and gate/up are fused as SGLang/vLLM fuse them.
  int64_t qkv_n() const { return (heads + 2 * kv_heads) * head_dim / tp; }
  int64_t qkv_k() const { return hidden; }
  int64_t o_n() const { return hidden; }
  int64_t o_k() const { return heads * head_dim / tp; }
  int64_t gate_up_n() const { return 2 * intermediate / tp; }
  int64_t gate_up_k() const { return hidden; }
  int64_t down_n() const { return hidden; }
  int64_t down_k() const { return intermediate / tp; }

  // MLA's projections (N, K), unsharded (mla != null): q_a_proj [q_lora_rank,
  // hidden], q_b_proj [heads * (nope + rope), q_lora_rank], kv_a_proj_with_mqa
  // [kv_lora_rank + rope, hidden], kv_b_proj [heads * (nope + v), kv_lora_rank].
  int64_t q_a_n() const { return mla->q_lora_rank; }
  int64_t q_b_n() const { return heads * (mla->qk_nope_head_dim + mla->qk_rope_head_dim) / tp; }
  int64_t kv_a_n() const { return mla->kv_lora_rank + mla->qk_rope_head_dim; }
  int64_t kv_b_n() const { return heads * (mla->qk_nope_head_dim + mla->v_head_dim) / tp; }
};

/// Every model the replay knows, the default first.
const std::vector<ModelSpec>& models();
/// The model called `name`, or nullptr.
const ModelSpec* find_model(const std::string& name);
/// "qwen2.5-0.5b, llama-3-8b, ...".
std::string model_names();

/// A sequence of M values (tokens per forward pass).
struct Trace {
  std::string name;  ///< "decode" | "prefill" | "mixed" | the file path
  std::vector<int64_t> ms;
};

/// The built-in trace called `name`, or nullopt for another name.
std::optional<Trace> builtin_trace(const std::string& name);
/// Reads a trace file: M values (>= 1) separated by whitespace, ',' or
/// newlines; '#' starts a comment. On failure returns nullopt and sets
/// `*error` to "<file>:<line>: ..." (or a sentence naming the file for I/O
/// errors: read through store/bounded_read.hpp, a regular file of at most
/// 256 MiB).
std::optional<Trace> read_trace_file(const std::string& path, std::string* error);

/// The next line of `text` at *pos (without its '\n'), as std::getline
/// splits a stream; false past the end. For a file read whole through
/// store/bounded_read.hpp (traces, shape lists).
inline bool next_line(std::string_view text, size_t* pos, std::string_view* line) {
  if (*pos >= text.size()) return false;
  const size_t nl = text.find('\n', *pos);
  const size_t end = nl == std::string_view::npos ? text.size() : nl;
  *line = text.substr(*pos, end - *pos);
  *pos = nl == std::string_view::npos ? text.size() : nl + 1;
  return true;
}

/// Options of `kdispatch replay` (and of the workload `kdispatch misses` runs).
struct ReplayOptions {
  std::string model = "qwen2.5-0.5b";
  std::string trace = "decode";
  int64_t steps = 0;                      ///< forward passes per pass; 0 = one pass over the trace
  int64_t layers = 0;                     ///< --layers: decoder layers per forward pass; 0 = the model's
  std::vector<std::string> config_dirs;   ///< --configs: on top of the shipped configs
  std::vector<std::string> only_configs;  ///< --only-configs: these dirs, no shipped configs
  bool no_shipped_configs = false;        ///< --no-shipped-configs
  std::string dtype = "bf16";
  bool json = false;

  // Online tuning (the KDISPATCH_* environment is the base; flags override it).
  std::string tune;            ///< "off" | "sync" | "background"; "" = $KDISPATCH_TUNE, else off
  double max_seconds = 60.0;   ///< tuning modes: stop replaying after this long
  std::string cache_dir;       ///< "" = the library's default ($KDISPATCH_CACHE_DIR, XDG cache)
  double budget_ms = 0.0;      ///< TuneOptions::time_budget_ms; 0 = the library's default
  double duty_cycle = 0.0;     ///< TuneOptions::duty_cycle; 0 = the library's default
  bool no_cold_cache = false;  ///< TuneOptions::cold_cache = false (quick tests)
  /// Write the misses (untuned-shapes CSV) here at exit; "" = $KDISPATCH_MISSES_EXPORT or none.
  std::string export_misses;

  /// `kdispatch misses`: tuning off, a short summary instead of the report.
  bool misses_summary = false;
};
/// Runs the replay; returns the process exit code.
int run_replay(const ReplayOptions& o);
/// The ops the replay's model calls: "rmsnorm, ... and <last>" (replay.cpp).
std::string replay_ops_text();

/// One row of a shape list: a row of kdispatch's misses CSV (op,backend,
/// device_name,dtype,out_dtype,M,<every op's dims>,bias,stride,count,key) or
/// of an aiter untuned CSV (M,N,K[,bias,dtype,outdtype,...]; M,hidden): every
/// column of the header, by its lower-cased name.
struct ShapeRow {
  int line = 0;   ///< 1-based line in the file
  int64_t m = 0;  ///< the M column (>= 1)
  /// (lower-cased column name, value as written without the spaces around it).
  std::vector<std::pair<std::string, std::string>> fields;
  /// The value of column `name` (lower-cased); "" when the file has no such column.
  std::string_view get(std::string_view name) const {
    for (const auto& [k, v] : fields)
      if (k == name) return v;
    return {};
  }
};
/// A shape list: the header's column names (as written) and the rows.
struct ShapeCsv {
  std::vector<std::string> columns;
  std::vector<ShapeRow> rows;
};
/// Reads a shape CSV: the first non-blank line is the header (column names,
/// case-insensitive, spaces around fields ignored; fields past the header's
/// last column belong to it, as the misses CSV's unquoted key). M must be an
/// integer >= 1; the dims of every op of the op list, count and aiter's B
/// integers >= 0 when given; flag fields (bias) true/false/1/0. On failure
/// returns nullopt and sets *error to "<file>:<line>: ...". The file is read
/// through store/bounded_read.hpp: a regular file of at most 256 MiB
/// (/dev/zero, a FIFO, a directory: refused at once, *error says what it is).
std::optional<ShapeCsv> read_shape_csv(const std::string& path, std::string* error);

/// Options of `kdispatch tune`.
struct TuneCmdOptions {
  std::vector<std::string> shapes;  ///< CSV files
  std::string op;
  std::string emit;
  /// Rows whose file names no dtype; "" (no --dtype): bf16, or the op's one
  /// input dtype when it computes no bf16 input (fp8_e4m3fn for the fp8 GEMMs).
  std::string dtype;
  double budget_ms = 0.0;  ///< 0 = the library's default
  double mem_gib = 0.0;    ///< scratch budget per shape, GiB; 0 = $KDISPATCH_TUNE_MEM, else 1 GiB
  /// MoE ops' expert ids: uniform, skewed or an .npy path ("" = $KDISPATCH_TUNE_ROUTING, else uniform).
  std::string routing;
  bool resume = true;
  /// Shapes costing more per call are skipped: at ~150 GFLOP/s (bf16, 2 cores)
  /// 2e9 flops is ~13 ms a call, so ~20 candidates fit the default 2 s budget;
  /// at 2e10 only the default plan would be measured.
  double max_flops = 2e9;
  /// --max-flops was given; without it a GPU backend has no limit (2e9
  /// flops is ~3 µs of an H200: the CPU's bound, not a GPU's).
  bool max_flops_given = false;
  std::string backend = "cpu";  ///< cpu | cuda | hip: where the shapes are tuned
  bool no_cold_cache = false;
  int32_t reps = 0;             ///< 0 = the library's default
  int32_t max_candidates = -1;  ///< -1 (not given) = the library's default (TuneOptions::max_candidates)
  std::string margin_text;      ///< --margin as given (checked by check_options, read by margin_of)
  bool margin_given = false;    ///< false: $KDISPATCH_TUNE_MARGIN, else TuneOptions::margin (0.02)
  bool json = false;
  /// --shard: "i/n" or "auto" (cli/shard.hpp); empty = every unit.
  std::string shard;
  /// --list: print the (shard's) units and an estimated time, tune nothing.
  bool list = false;
  /// --device: the ordinal tuned on; -1 = 0, or torchrun's LOCAL_RANK under --shard auto.
  int32_t device = -1;
  /// --devices: "all" or ordinals "0,1,..." of --backend, one worker process
  /// each pulling units from a shared queue; "" = tune in this process.
  std::string devices;
  /// --workers-per-device: worker processes per device of --devices, in
  /// [1, kMaxWorkersPerDevice]; nullopt = not given (1). (Not a sentinel
  /// value: `--workers-per-device -1` is refused, not taken as "not given".)
  std::optional<int32_t> workers_per_device;
  /// --unit-timeout-s: with --devices, a worker whose unit runs longer is
  /// killed (SIGKILL) and the unit retried once on a new worker, then
  /// reported failed; in [1, kMaxUnitTimeoutS] s; nullopt = not given: 300 s
  /// + 30 x the --budget-ms search time (a hung kernel or driver call
  /// otherwise stalls the run forever).
  std::optional<double> unit_timeout_s;
  /// The hidden worker mode of --devices: tune the units the parent sends
  /// on stdin on --device, answer on fd 3 (tune_worker.cpp).
  bool internal_worker = false;

  // --model (tune_model.cpp): the units of a model instead of --shapes.
  /// --model: a Hugging Face config.json, a dir holding one, or a replay model's name; "" = --shapes.
  std::string model;
  int64_t tp = 0;           ///< --tp: tensor-parallel degree the shapes are sharded for; 0 = not given (1)
  int64_t ep = 1;           ///< --ep: expert-parallel degree of the routed experts (1: TP splits them)
  std::string fp8;          ///< --fp8: tensor | rowwise | block | none; "" = the config's quantization_config
  std::string ms;           ///< --ms: M values "1,2,4"; "" = 1, 2, 4, ..., 8192
  bool no_lm_head = false;  ///< --no-lm-head: leave lm_head out
};

/// One (op, key) a model runs, as `tune --model` derives it from the
/// model's unit table (tune_model.cpp): tuned at each M of --ms (times
/// each of rows_per_token).
struct ModelUnit {
  std::string sites;  ///< where the model calls it: "qkv_proj", "post_attention_layernorm+final_norm"
  std::string op;     ///< an op of the op list
  std::vector<std::pair<std::string, int64_t>> dims;  ///< the op's dim key fields: {"N", 1152}, {"K", 896}
  bool bias = false;
  std::string dtype;      ///< "" = the run's (--dtype)
  std::string out_dtype;  ///< "" = the op's default
  /// Rows per token: the unit's M is tokens x each (1; Qwen3's q_norm and
  /// k_norm run over every head's row: heads per rank).
  std::vector<int64_t> rows_per_token = {1};
  /// Other key fields as a shape CSV's columns: {"block_shape", "true"}.
  std::vector<std::pair<std::string, std::string>> fields = {};
};
/// What `tune --model` derived from a config: the units, and what it does
/// not tune (said in the output, not an error).
struct ModelPlan {
  std::string description;  ///< "llama (LlamaForCausalLM): hidden 4096, ..., tp 1, bf16"
  std::vector<ModelUnit> units;
  std::vector<std::string> not_tuned;  ///< "experts.gate_up_proj ...: not tuned: no MoE op yet"
  std::vector<std::string> notes;      ///< e.g. the fp8 layout taken from quantization_config
};
/// Reads --model (o.model, o.tp, o.fp8, o.dtype, o.no_lm_head) and derives
/// its units; nullopt with *error (a usage error: an unreadable or unknown
/// config, --tp not dividing a dimension, naming it) on failure.
std::optional<ModelPlan> plan_model(const TuneCmdOptions& o, std::string* error);
/// --ms: M values >= 1 separated by commas; "" gives 1, 2, 4, ..., 8192.
/// False with *error on a bad value.
bool parse_ms(const std::string& text, std::vector<int64_t>* ms, std::string* error);
/// The accepted ranges of `tune --workers-per-device` and `--unit-timeout-s`
/// (a week: a longer unit is a hung one).
inline constexpr int32_t kMaxWorkersPerDevice = 64;
inline constexpr double kMaxUnitTimeoutS = 604800.0;
int run_tune(const TuneCmdOptions& o);

/// Options of `kdispatch lookup`.
struct LookupOptions {
  std::string config_dir;  ///< --configs; "" only with --env
  /// --env: answer as a serving process would: the KDISPATCH_* environment
  /// (options_from_env), the shipped configs and the tuning cache it reads
  /// (read only; nothing tuned, verified or written).
  bool env = false;
  /// --cache: a tuning cache dir read with the config dir, as the runtime
  /// reads its cache (fingerprints checked); "" = no cache is read.
  std::string cache;
  std::string device;
  std::string op;
  std::string key;
  int64_t m = 0;
  bool down = false;
  std::string backend_version;
  std::string backend;
  std::string arch;
  int32_t compute_units = 0;
  int64_t memory_bytes = 0;
  std::vector<std::string> aliases;  ///< "FROM=TO"
  bool json = false;
};
int run_lookup(const LookupOptions& o);

/// Options of `kdispatch merge` (merge.cpp).
struct MergeOptions {
  std::vector<std::string> sources;  ///< emit dirs, in --prefer order
  std::string out;
  /// --compact DIR: merge DIR's fragments (<key>.json.d/*.json) into their
  /// <key>.json in place and remove them (instead of sources and --out).
  std::string compact;
  bool prefer = false;  ///< a conflict keeps the first source's config
  /// A conflict keeps the config that is fastest on this machine
  /// (dispatch::time_configs); exclusive with prefer.
  bool retime = false;
  /// --retime-margin: configs within this fraction of the fastest tie (the
  /// smallest config text is kept); < 0 = not given (kDefaultRetimeMargin).
  double retime_margin = -1.0;
  int32_t reps = 0;            ///< --reps: timed reps per config and round; 0 = the library's default
  bool no_cold_cache = false;  ///< --no-cold-cache: time on warm caches (quick tests)
};
/// --retime's default tie margin: 2 %.
inline constexpr double kDefaultRetimeMargin = 0.02;
int run_merge(const MergeOptions& o);

/// Options of `kdispatch verify` (verify.cpp).
struct VerifyOptions {
  /// --configs: the committed rows of these dirs (in precedence order);
  /// none: those a serving process loads (the shipped configs and
  /// $KDISPATCH_CONFIG_DIRS).
  std::vector<std::string> configs;
  /// --cache: the tuning cache dir whose verdict cache (.verify/) is read
  /// and updated; "": the runtime's ($KDISPATCH_CACHE_DIR, XDG, ~/.cache).
  std::string cache;
  std::string op;              ///< --op: only this op's rows
  std::string margin_text;     ///< --margin as given
  bool margin_given = false;   ///< false: $KDISPATCH_TUNE_MARGIN, else 0.02
  int32_t reps = 0;            ///< --reps: timed repeats per measurement; 0 = the library's default
  bool no_cold_cache = false;  ///< --no-cold-cache: time on warm caches (quick tests)
  bool json = false;
};
int run_verify(const VerifyOptions& o);

/// Options of `kdispatch validate`.
struct ValidateOptions {
  std::vector<std::string> dirs;
  /// --cache: a tuning cache or emit dir, read as the runtime reads its
  /// cache (every own-op file and fragment checked against this build's
  /// fingerprint: a stale one is skipped), with the scheme its writes use.
  std::string cache;
  std::string backend_version;
  bool json = false;
};
int run_validate(const ValidateOptions& o);

/// Options of `kdispatch report` (report.cpp).
struct ReportOptions {
  /// Config dirs or tables, `kdispatch tune --json` output, bench JSON
  /// (bench/gpu/*.py): each told by its content.
  std::vector<std::string> inputs;
  std::string out;    ///< the HTML file written
  std::string title;  ///< "" = "kdispatch report"
};
int run_report(const ReportOptions& o);

}  // namespace kdispatch_cli
