// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — entry point: the command line (CLI11) of `kdispatch replay`,
// `kdispatch misses`, `kdispatch tune`, `kdispatch lookup`, `kdispatch
// validate`, `kdispatch merge` and `kdispatch report`. Each subcommand fills
// an options struct and hands it to its run_* function (replay.cpp, tune.cpp,
// configs.cpp, merge.cpp, report.cpp); exit codes: 0 ok, 1 failure, 2 usage
// error.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "cli/op_util.hpp"
#include "dispatch/device.hpp"
#include "dispatch/runtime.hpp"

namespace {

using namespace kdispatch_cli;

std::string version_text() {
  const dispatch::DeviceInfo& cpu = dispatch::cpu_device_info();
  return std::string("kdispatch ") + dispatch::version() + " (CLI11 " CLI11_VERSION ")\nhost CPU: " + cpu.device_name +
         " (" + cpu.reported_name + ")";
}

// An integer >= 1 (batch sizes, step counts), with a readable message.
const CLI::Validator kAtLeastOne(
    [](std::string& text) -> std::string {
      int64_t v = 0;
      const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
      if (r.ec != std::errc() || r.ptr != text.data() + text.size() || v < 1)
        return "must be an integer >= 1, got '" + text + "'";
      return {};
    },
    "", "at least one");

// The workload options `replay` and `misses` share: model, trace, dtype and
// where the configs come from. `offline` (misses): the tuning cache is read
// only when named (--cache).
void add_workload_options(CLI::App* app, ReplayOptions& ro, bool offline) {
  app->add_option("--model", ro.model, "Model whose shapes to replay: " + model_names())
      ->type_name("NAME")
      ->capture_default_str();
  app->add_option("--trace", ro.trace,
                  "M per forward pass: decode (batch sizes 1..16), prefill (prompt lengths), mixed, or a FILE of "
                  "M values (whitespace/comma separated, '#' comments)")
      ->type_name("NAME|FILE")
      ->capture_default_str();
  app->add_option("--steps", ro.steps,
                  "Forward passes to run, cycling through the trace (default: one pass over the trace); with "
                  "--tune, the forward passes of one pass")
      ->type_name("N")
      ->check(kAtLeastOne);
  app->add_option("--layers", ro.layers,
                  "Decoder layers per forward pass: the model's first N (default: all of them; fewer keep the big "
                  "models quick on a small host)")
      ->type_name("N")
      ->check(kAtLeastOne);
  app->add_option("--configs", ro.config_dirs, "Extra config dir on top of the shipped configs (repeatable)")
      ->type_name("DIR")
      ->take_all()
      ->allow_extra_args(false);
  app->add_option("--only-configs", ro.only_configs,
                  "Use only this config dir, not the shipped configs (repeatable); a run can start from nothing")
      ->type_name("DIR")
      ->take_all()
      ->allow_extra_args(false);
  app->add_flag("--no-shipped-configs", ro.no_shipped_configs,
                "Do not load the shipped configs (start from --configs/--only-configs dirs and the cache only)");
  app->add_option("--dtype", ro.dtype,
                  "Activation and weight dtype: fp32 or bf16 (the *-fp8 models: of activations, norms and "
                  "projection outputs; their projections' weights and inputs are fp8_e4m3fn)")
      ->type_name("DTYPE")
      ->capture_default_str();
  if (offline)
    app->add_option("--cache,--cache-dir", ro.cache_dir,
                    "Also read this tuning cache dir (rows of this build's fingerprint, below the config dirs, as a "
                    "serving process reads its cache): its rows are hits, not misses. Without it no cache is read, "
                    "whatever KDISPATCH_CACHE_DIR, XDG_CACHE_HOME or HOME say: the export is the misses of the "
                    "config dirs alone")
        ->type_name("DIR");
  else
    app->add_option("--cache-dir", ro.cache_dir,
                    "Tuning cache dir: tuned winners are written there and read back by later runs (default: "
                    "$KDISPATCH_CACHE_DIR, else $XDG_CACHE_HOME/kdispatch, else ~/.cache/kdispatch)")
        ->type_name("DIR");
}

// ------------------------------------------------------------ replay
CLI::App* add_replay(CLI::App& app, ReplayOptions& ro) {
  CLI::App* replay = app.add_subcommand(
      "replay", "Push a model's per-layer shapes through its ops (" + replay_ops_text() +
                    ") on the CPU, as a decoder forward pass per trace entry, and report per op: calls, table hits, "
                    "defaults, us/call and config sources.");
  add_workload_options(replay, ro, false);
  replay
      ->add_option("--tune", ro.tune,
                   "Online tuning: off (table + get_default), sync (a miss tunes on the caller's thread), background "
                   "(a miss is queued for the tuner thread). With sync/background the trace is replayed in passes "
                   "until the tuner converges or --max-seconds; the first pass is a baseline with tuning paused "
                   "(default: $KDISPATCH_TUNE, else off)")
      ->type_name("MODE")
      ->check(CLI::IsMember({"off", "sync", "background"}));
  replay->add_option("--max-seconds", ro.max_seconds, "With --tune: stop replaying after this many seconds")
      ->type_name("S")
      ->capture_default_str();
  replay
      ->add_option("--budget-ms", ro.budget_ms, "Search time per shape, ms (TuneOptions::time_budget_ms; default 2000)")
      ->type_name("MS");
  replay
      ->add_option("--duty-cycle", ro.duty_cycle,
                   "Busy fraction of the background tuner thread, (0, 1] (TuneOptions::duty_cycle; default 0.5)")
      ->type_name("D");
  replay->add_flag("--no-cold-cache", ro.no_cold_cache,
                   "Time candidates with warm caches (faster tuning, less faithful timings; for tests)");
  replay
      ->add_option("--export-misses", ro.export_misses,
                   "Write the shapes that missed the table to FILE at exit, as an untuned-shapes CSV "
                   "(default: $KDISPATCH_MISSES_EXPORT)")
      ->type_name("FILE");
  replay->add_flag("--json", ro.json, "Print one JSON object instead of tables");
  replay->footer(
      "Examples:\n"
      "  kdispatch replay                                   # qwen2.5-0.5b, decode trace, bf16\n"
      "  kdispatch replay --model llama-3-8b --steps 4\n"
      "  kdispatch replay --model deepseek-v3-dense-fp8 --layers 1 --steps 4   # block-fp8 projections\n"
      "  kdispatch replay --trace prefill --dtype fp32 --json\n"
      "  kdispatch replay --trace ms.txt --configs ./my-configs\n"
      "  kdispatch replay --tune background --max-seconds 120       # watch misses turn into hits\n"
      "  kdispatch replay --tune background --no-shipped-configs --cache-dir /tmp/kd-cache\n"
      "  kdispatch replay --tune off --cache-dir /tmp/kd-cache         # a later run: the cached winners hit\n"
      "The KDISPATCH_* environment applies (KDISPATCH_TUNE, KDISPATCH_CACHE_DIR, KDISPATCH_CONFIG_DIRS, ...);\n"
      "flags override it.\n"
      "Config files for the CPU ops: <dir>/cpu/<op>/<fields>.json, e.g.\n"
      "  cpu/rmsnorm/hidden=896,device_name=CPU_x86_64_AVX512,dtype=bf16.json\n"
      "  cpu/gemm/N=1152,K=896,device_name=CPU_x86_64_AVX512,dtype=bf16,bias=true.json\n"
      "holding {\"<M>\": {\"variant\": \"<name>\", <param>: <value>, ...}, ...}.");
  return replay;
}

// ------------------------------------------------------------ misses
CLI::App* add_misses(CLI::App& app, ReplayOptions& mo) {
  mo.misses_summary = true;
  CLI::App* misses = app.add_subcommand(
      "misses",
      "Run the replay workload with tuning off and write the shapes that missed the table as an untuned-shapes "
      "CSV (" +
          misses_columns_text() + "): the input of `kdispatch tune` (aiter's offline loop).");
  misses->add_option("--export", mo.export_misses, "The CSV to write")->type_name("FILE")->required();
  add_workload_options(misses, mo, true);
  misses->add_flag("--json", mo.json, "Print the summary as one JSON object");
  misses->footer(
      "Examples:\n"
      "  kdispatch misses --export misses.csv\n"
      "  kdispatch misses --export misses.csv --model llama-3-8b --trace prefill\n"
      "  kdispatch misses --export fp8.csv --model llama-3-8b-fp8 --layers 1 && \\\n"
      "      kdispatch tune --shapes fp8.csv --op gemm_fp8_block --emit my-configs\n"
      "  kdispatch tune --shapes misses.csv --op gemm --emit my-configs\n"
      "Exit codes: 0 written, 1 an op or the write failed, 2 bad argument.");
  return misses;
}

// ------------------------------------------------------------ tune
CLI::App* add_tune(CLI::App& app, TuneCmdOptions& to) {
  CLI::App* tune = app.add_subcommand(
      "tune",
      "Tune every shape of a shape list (a `kdispatch misses` CSV, or an aiter untuned CSV: M,N,K[,bias,dtype,"
      "outdtype]; M and the op's dims, e.g. M,hidden, for the others) for one op, or every shape a model runs "
      "(--model: its config.json), with dispatch::pretune, writing the "
      "winners into an emit dir as config files (<dir>/cpu/<op>/<key>.json, the format configs/ holds). Resumes: "
      "shapes the emit dir already holds are skipped. KDISPATCH_LOG_LEVEL=info prints the confirmation of every "
      "shape whose search winner was not the default (winner/default time per placement of the inputs, and whether "
      "the default was kept).");
  tune->add_option("--shapes", to.shapes, "Shape CSV (repeatable); with --op (or --model instead)")
      ->type_name("FILE")
      ->take_all()
      ->allow_extra_args(false);
  tune->add_option("--op", to.op,
                   op_names_text() + ": the rows of this op are tuned (with --model: only this op's units)")
      ->type_name("OP");
  tune->add_option(
          "--model", to.model,
          "Tune every shape a model runs: a Hugging Face config.json, a local snapshot dir holding one, or "
          "a replay model's name (" +
              model_names() +
              "); nothing is fetched. Llama, Mistral, Qwen2, Qwen3, "
              "Gemma, Gemma2, Gemma3, Phi-3, Mixtral, Qwen3-MoE and DeepSeek-V2/V3 configs; the units are its "
              "projections (fused qkv, o_proj, fused gate_up, down, lm_head; DeepSeek's MLA projections), norms, "
              "silu_and_mul, the routed experts (fused_moe; an fp8 checkpoint's per-tensor or per-channel "
              "experts: fused_moe_fp8_tensor / _channel) and, with --fp8, its quant ops")
      ->type_name("CONFIG.json|DIR|NAME");
  tune->add_option("--tp", to.tp,
                   "--model: tensor-parallel degree the shapes are sharded for (default 1; a replay model: its own); "
                   "one that does not divide a dimension is refused, naming it")
      ->type_name("N");
  tune->add_option("--ep", to.ep,
                   "--model: expert-parallel degree of the routed experts (default 1: --tp splits each expert's "
                   "intermediate size; N > 1: each rank holds E/N whole experts, as SGLang's --ep-size)")
      ->type_name("N");
  tune->add_option("--fp8", to.fp8,
                   "--model: run the projections as fp8 (quant op + fp8 GEMM of the layout): tensor, rowwise or "
                   "block; none: not fp8 (default: an fp8 checkpoint's quantization_config, else none)")
      ->type_name("tensor|rowwise|block|none");
  tune->add_option("--ms", to.ms, "--model: the M values, comma-separated (default 1,2,4,...,8192)")->type_name("LIST");
  tune->add_flag("--no-lm-head", to.no_lm_head, "--model: leave lm_head out");
  tune->add_option("--emit", to.emit,
                   "Dir the config files are written to (created; also read to resume); required but with --list")
      ->type_name("DIR");
  tune->add_option("--dtype", to.dtype,
                   "dtype of rows whose file names none (aiter's M,N,K files; default: bf16, or the op's only input "
                   "dtype where it has no bf16 input: fp8_e4m3fn for the fp8 GEMMs)")
      ->type_name("DTYPE");
  tune->add_option("--budget-ms", to.budget_ms, "Search time per shape, ms (default 2000)")->type_name("MS");
  tune->add_option("--reps", to.reps, "Timed repeats per candidate (default 5)")->type_name("N");
  tune->add_option_function<std::string>(
          "--margin", [&to](const std::string& v) { to.margin_text = v, to.margin_given = true; },
          "How much faster than the floor (GPU GEMMs: cuBLAS / cuBLASLt as torch calls them; elsewhere "
          "get_default's plan) a candidate must be to replace it, a fraction in [0, 0.5] (default "
          "$KDISPATCH_TUNE_MARGIN, else 0.02)")
      ->type_name("FRACTION");
  tune->add_option("--max-candidates", to.max_candidates,
                   "Points of a variant's space kept after the perf model's ordering (default 96)")
      ->type_name("N");
  tune->add_option("--mem-gib", to.mem_gib,
                   "Scratch memory one shape may use, GiB (default $KDISPATCH_TUNE_MEM, else 1; with --model on a "
                   "GPU, a quarter of the device's memory per worker); larger shapes are reported too large here")
      ->type_name("GIB");
  tune->add_option("--routing", to.routing,
                   "MoE ops (fused_moe): the expert ids tuned on: uniform (default), skewed, or an .npy file of "
                   "int32 [tokens, top_k] ids dumped from a server ($KDISPATCH_TUNE_ROUTING)")
      ->type_name("uniform|skewed|FILE");
  tune->add_flag("--resume,!--no-resume", to.resume,
                 "Skip shapes the emit dir already has a row for (default), or tune them again");
  tune->add_option_function<double>(
          "--max-flops", [&to](double v) { to.max_flops = v, to.max_flops_given = true; },
          "Skip (and report) shapes whose call costs more flops than this (2*M*N*K for a GEMM): too slow "
          "to tune on this host (default 2e9 with --backend cpu; no limit on a GPU)")
      ->type_name("X");
  tune->add_option("--backend", to.backend,
                   "cpu, cuda or hip: the device the shapes are tuned on (ordinal 0, else --device or --devices)")
      ->type_name("BACKEND")
      ->capture_default_str();
  tune->add_flag("--no-cold-cache", to.no_cold_cache, "Time candidates with warm caches (faster; for tests)");
  tune->add_flag("--json", to.json, "Print the summary and every shape's result as one JSON object");
  tune->add_option("--shard", to.shard,
                   "Tune one shard of the units (key, M): i/n takes the units whose XXH3-64 of "
                   "'kdispatch-unit-v1|<op>|<key fields>|M=<M>' is i mod n (the same on every host and for any "
                   "order of the shape lists); auto reads torchrun's RANK/WORLD_SIZE (the GPU: LOCAL_RANK), a Slurm "
                   "array's SLURM_ARRAY_TASK_ID (minus SLURM_ARRAY_TASK_MIN)/SLURM_ARRAY_TASK_COUNT or a Kubernetes "
                   "indexed Job's "
                   "JOB_COMPLETION_INDEX with KDISPATCH_SHARD_COUNT, and says which it used")
      ->type_name("i/n|auto")
      ->check(CLI::Validator(
          [](std::string& v) {
            return v.empty() ? std::string("expected i/n (0 <= i < n, n >= 1) or auto, got ''") : std::string();
          },
          "", "not empty"));
  tune->add_flag("--list", to.list, "Print the units (of the shard) and an estimated time; tune nothing");
  tune->add_option("--device", to.device, "Device ordinal of --backend to tune on (default 0; torchrun: LOCAL_RANK)")
      ->type_name("N");
  tune->add_option("--devices", to.devices,
                   "Tune on several devices of --backend at once: all (every device the runtime reports) or "
                   "ordinals 0,1,...; one worker process per device (its own scratch: --mem-gib is per worker) "
                   "pulls the units (after --shard and the resume check) from one queue, largest first, into the "
                   "one --emit dir; a worker that dies or hits a sticky GPU error is replaced and its unit retried "
                   "once, then reported failed. Not with --device, nor under torchrun (one process per GPU "
                   "already). The CPU backend has one device: --devices 0 (or all)")
      ->type_name("all|N,N...")
      ->check(CLI::Validator(
          [](std::string& v) { return v.empty() ? std::string("expected all or device ordinals, e.g. 0,1") : ""; }, "",
          "not empty"));
  tune->add_option("--workers-per-device", to.workers_per_device,
                   "With --devices: worker processes per device (default 1). More than one share the device, so "
                   "their timings disturb each other: for devices one tuning process leaves idle, and for tests "
                   "(several workers on the CPU backend). 1 to 64")
      ->type_name("N");
  tune->add_option("--unit-timeout-s", to.unit_timeout_s,
                   "With --devices: a worker whose unit runs longer than this is killed and the unit retried "
                   "once on a new worker, then reported failed (a hung kernel or driver call). Default 300 s + 30 x "
                   "the --budget-ms search time; 1 to 604800 (a week)")
      ->type_name("S");
  tune->add_flag("--internal-worker", to.internal_worker, "A worker of --devices (internal)")->group("");
  tune->footer(
      "Examples:\n"
      "  kdispatch misses --export misses.csv && kdispatch tune --shapes misses.csv --op gemm --emit my-configs\n"
      "  kdispatch tune --shapes aiter/configs/bf16_untuned_gemm.csv --op gemm --emit my-configs --max-flops 1e10\n"
      "  kdispatch validate my-configs && kdispatch replay --configs my-configs\n"
      "  kdispatch tune --shapes grid.csv --op gemm --backend cuda --emit my-configs --devices all   # every GPU\n"
      "  kdispatch tune --shapes grid.csv --op gemm --backend cuda --emit my-configs --devices 0,1 --shard 0/2\n"
      "  kdispatch tune --model Qwen2.5-7B/config.json --backend cuda --emit my-configs --list   # its units\n"
      "  kdispatch tune --model Qwen2.5-7B/ --tp 2 --backend cuda --emit my-configs --devices all\n"
      "Progress goes to stderr, one line per unit: [n/N] ... [elapsed E, ETA T] (with --devices: which worker and\n"
      "device tuned it, and its time);\n"
      "the summary to stdout (with --devices: units and time per worker, and the wall time).\n"
      "Exit codes: 0 every shape tuned or skipped, 1 some shape failed, 2 bad argument or shape file.");
  return tune;
}

// ------------------------------------------------------------ lookup
CLI::App* add_lookup(CLI::App& app, LookupOptions& lo) {
  CLI::App* lookup = app.add_subcommand(
      "lookup", "Which config serves this key at this M on this device: the row, its file, the match and why.");
  lookup
      ->add_option("--configs", lo.config_dir,
                   "Config dir (read recursively; without --env neither the shipped configs nor the tuning cache "
                   "are loaded); required but with --env, where it ranks above the environment's dirs")
      ->type_name("DIR");
  lookup->add_flag("--env", lo.env,
                   "Answer what a serving process would serve: apply the KDISPATCH_* environment "
                   "(KDISPATCH_CONFIG_DIRS, KDISPATCH_SHIPPED_CONFIGS, KDISPATCH_FORCE, KDISPATCH_BACKEND_VERSION, "
                   "KDISPATCH_DETERMINISTIC, KDISPATCH_CACHE_DIR, ...) and load the shipped configs and the tuning "
                   "cache as the default runtime does (read only: nothing is tuned, verified or written); "
                   "--backend-version and --cache override the environment's");
  lookup
      ->add_option("--cache", lo.cache,
                   "Also read this tuning cache dir, below the config dir, as a runtime reads its cache (a file "
                   "written by another build is not served); without it (and without --env) no cache is read, "
                   "whatever KDISPATCH_CACHE_DIR, XDG_CACHE_HOME or HOME say")
      ->type_name("DIR");
  lookup->add_option("--device", lo.device,
                     "Device name as the runtime reports it (\"NVIDIA H200\") or as files spell it (NVIDIA_H200); "
                     "default: the host CPU's ISA class");
  lookup->add_option("--op", lo.op,
                     "triton_fused_moe, triton_gemm, " + op_names_text() +
                         " (default: inferred from the key; fused_moe with an E= key: triton_fused_moe, deprecated)");
  lookup
      ->add_option("--key", lo.key,
                   "The file name's fields other than device_name, e.g. \"E=257,N=256,dtype=fp8_w8a8\"")
      ->type_name("FIELDS")
      ->required();
  lookup->add_option("-M,--M", lo.m, "Batch size / tokens (>= 1)")->type_name("M")->check(kAtLeastOne)->required();
  lookup->add_flag("--down", lo.down, "Use the fused-MoE _down table (falls back to the up table)");
  lookup->add_option("--backend-version", lo.backend_version,
                     "Kernel compiler version for triton_X_Y_Z/ folders, e.g. 3.5.1 (default: newest)");
  lookup->add_option("--backend", lo.backend, "Own ops: cpu, cuda or hip (default: from the device name)");
  lookup->add_option("--arch", lo.arch, "Device arch for the name resolver (e.g. gfx942)");
  lookup->add_option("--compute-units", lo.compute_units, "SM/CU count for the name resolver");
  lookup->add_option("--memory-bytes", lo.memory_bytes, "Device memory for the name resolver");
  lookup->add_option("--alias", lo.aliases, "Device-name alias FROM=TO (repeatable)")
      ->type_name("FROM=TO")
      ->take_all()
      ->allow_extra_args(false);
  lookup->add_flag("--json", lo.json, "Print the result as one JSON object");
  lookup->footer(
      "Examples:\n"
      "  kdispatch lookup --configs sglang-configs/fused_moe_triton --backend-version 3.5.1 \\\n"
      "      --device \"NVIDIA H200\" --key \"E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]\" --M 1\n"
      "  kdispatch lookup --configs sglang-configs/quantization --device \"NVIDIA H20\" \\\n"
      "      --key \"N=2304,K=7168,dtype=fp8_w8a8,block_shape=[128,128]\" --M 64 --json\n"
      "  kdispatch lookup --configs ./my-configs --op rmsnorm --key \"hidden=896,dtype=bf16\" --M 8\n"
      "  kdispatch lookup --configs ./my-configs --cache ~/.cache/kdispatch --op rmsnorm --key "
      "\"hidden=896,dtype=bf16\" --M 8\n"
      "  KDISPATCH_FORCE=rmsnorm=rmsnorm_bf16__ref kdispatch lookup --env --op rmsnorm --key \"hidden=896,dtype=bf16\" "
      "--M 8\n"
      "Exit codes: 0 found (table row, forced plan or default), 1 not found or the --cache dir refused,\n"
      "2 bad argument (with --env also a KDISPATCH_* variable whose value is not valid, naming it).");
  return lookup;
}

// ------------------------------------------------------------ validate
CLI::App* add_validate(CLI::App& app, ValidateOptions& vo) {
  CLI::App* validate = app.add_subcommand(
      "validate",
      "Check config dirs without running anything: every file parses and every row is legal (a compiled variant, a "
      "point of its config space); print the load report, per file loaded/partial/skipped and its problems. No "
      "timing: `kdispatch verify` times the rows on this machine.");
  validate
      ->add_option("dirs", vo.dirs,
                   "Config dirs (read recursively; neither the shipped configs nor the tuning cache are loaded)")
      ->type_name("DIR...");
  validate
      ->add_option("--cache", vo.cache,
                   "A tuning cache or emit dir: read as the tuning cache is (a file or fragment written by "
                   "another build is skipped as stale), and say how writes into it are made (flock, or "
                   "per-process fragments where flock is not honoured); a dir the cache-dir rules refuse "
                   "(a symbolic link, another user's, world-writable, an unsafe ancestor) exits 1 naming why. "
                   "Without it no cache is read, whatever KDISPATCH_CACHE_DIR, XDG_CACHE_HOME or HOME say")
      ->type_name("DIR");
  validate->add_option("--backend-version", vo.backend_version,
                       "Kernel compiler version for triton_X_Y_Z/ folders, e.g. 3.5.1");
  validate->add_flag("--json", vo.json, "Print the report as JSON");
  validate->footer(
      "Examples:\n"
      "  kdispatch validate configs/\n"
      "  kdispatch validate sglang-configs --backend-version 3.5.1 --json\n"
      "  kdispatch validate --cache ~/.cache/kdispatch\n"
      "Exit codes: 0 every file usable, 1 some file skipped or the --cache dir refused, 2 bad argument.");
  return validate;
}

// ------------------------------------------------------------ verify
CLI::App* add_verify(CLI::App& app, VerifyOptions& vo) {
  CLI::App* verify = app.add_subcommand(
      "verify",
      "Time the committed rows on this machine: each row of this machine's devices (the shipped configs, or the "
      "--configs dirs) is run against the floor (what the engine runs without kdispatch) with the tuner's "
      "confirmation, and its margin over the floor, the A/A spread and the verdict are printed (ahead, within "
      "margin, lost once, demoted) and, with --cache DIR, recorded in that tuning cache dir; a row that lost by "
      "more than the margin twice there is demoted (the floor serves its M). Unlike `validate`, which only checks that "
      "files parse and rows "
      "are legal, this runs the kernels.");
  verify
      ->add_option("--configs", vo.configs,
                   "Verify the rows of these config dirs (repeatable; default: the rows a serving process loads: "
                   "the shipped configs and $KDISPATCH_CONFIG_DIRS)")
      ->type_name("DIR")
      ->take_all()
      ->allow_extra_args(false);
  verify
      ->add_option("--cache", vo.cache,
                   "The tuning cache dir whose verdict cache (DIR/.verify/) is read and updated, as a serving "
                   "process over it reads it (its tuned rows are not verified); without it the verdicts are "
                   "kept for this run only (no dir is read that is not given)")
      ->type_name("DIR");
  verify->add_option("--op", vo.op, op_names_text() + ": only this op's rows")->type_name("OP");
  verify
      ->add_option_function<std::string>(
          "--margin",
          [&vo](const std::string& v) {
            vo.margin_text = v;
            vo.margin_given = true;
          },
          "How much faster than the floor a row must be to count as ahead, and how much slower to count as a loss, "
          "a fraction in [0, 0.5] (default: $KDISPATCH_TUNE_MARGIN, else 0.02 = 2 %)")
      ->type_name("F");
  verify->add_option("--reps", vo.reps, "Timed repeats per measurement (default 5)")
      ->type_name("N")
      ->check(CLI::Range(1, 1000));
  verify->add_flag("--no-cold-cache", vo.no_cold_cache, "Time with warm caches (faster; for tests)");
  verify->add_flag("--json", vo.json, "Print one JSON object: the margin, the verdict file and one entry per row");
  verify->footer(
      "Examples:\n"
      "  kdispatch verify                                  # the shipped configs' rows for this machine\n"
      "  kdispatch verify --configs my-configs --op gemm --json\n"
      "  KDISPATCH_VERIFY_SHIPPED=1 ...                    # a serving process does it in the background\n"
      "Exit codes: 0 every row verified (whatever its verdict), 1 some row could not be, 2 bad argument.");
  return verify;
}

// ------------------------------------------------------------ merge
CLI::App* add_merge(CLI::App& app, MergeOptions& mo) {
  CLI::App* merge = app.add_subcommand(
      "merge",
      "Merge the emit dirs of several tuning shards (hosts, GPUs) into one config tree: rows at different M are all "
      "kept, equal rows kept once; tables whose sources have different fingerprints (builds, devices) are refused and "
      "reported, never mixed; the same M with different configs is refused unless --prefer keeps the first source's "
      "or --retime times them on this machine and keeps the faster (every candidate is recorded in the table's "
      "metadata). The output is canonical: without --prefer, the same bytes for any order of the sources (under "
      "--retime, but for the retimed times, as long as they pick the same configs). A source's fragments "
      "(<key>.json.d/*.json, written where flock is not honoured) are read with their <key>.json as more sources "
      "of that table (for --prefer: after it, by name), so the output holds one file per key.");
  merge->add_option("sources", mo.sources, "Emit dirs (kdispatch tune --emit), in --prefer order")->type_name("SRC...");
  merge->add_option("--out", mo.out, "Dir the merged tables are written to (created)")->type_name("DIR");
  merge
      ->add_option("--compact", mo.compact,
                   "Instead of sources and --out: merge each table's fragments in DIR into its <key>.json in place "
                   "(the same rules; --prefer keeps the main file's row, as the loader serves) and remove the "
                   "fragments merged; a fragment its writer rewrote meanwhile is kept. One compaction of a dir at a "
                   "time (DIR/.kdispatch-compact.lock)")
      ->type_name("DIR");
  merge->add_flag("--prefer", mo.prefer, "A conflict keeps the config of the source listed first");
  merge->add_flag("--retime", mo.retime,
                  "A conflict keeps the config that is fastest on this machine: each candidate config validated "
                  "against the reference and timed by the tuner's harness on its scratch operands, 2 rounds (in "
                  "order, then reversed; the mean of the medians); configs within --retime-margin of the fastest "
                  "tie and the smallest config text (minified JSON) wins. The floor (what the engine runs "
                  "without kdispatch; get_default's plan on the CPU) races in the same rounds as a candidate no "
                  "source had, and is kept unless the winner beats it by more than --retime-margin: the output may "
                  "hold a row no source had (recorded as source \"floor\"). Refused per table: no device of the "
                  "table's backend here (a cuda table on a machine without a GPU), device 0 of another name than "
                  "the file's, or a candidate this build cannot run (unknown variant or value, supports() "
                  "declining, a launch failure, an output that differs from the reference's). Exclusive with "
                  "--prefer");
  merge
      ->add_option("--retime-margin", mo.retime_margin,
                   "--retime: configs within this fraction of the fastest tie (default 0.02 = 2 %)")
      ->type_name("FRACTION")
      ->check(CLI::Range(0.0, 10.0));
  merge->add_option("--reps", mo.reps, "--retime: timed repeats per config and round (default 5)")
      ->type_name("N")
      ->check(CLI::Range(1, 1000));
  merge->add_flag("--no-cold-cache", mo.no_cold_cache, "--retime: time with warm caches (faster; for tests)");
  merge->footer(
      "Examples:\n"
      "  kdispatch tune --shapes grid.csv --op gemm --emit shard0 --shard 0/2   # on host A\n"
      "  kdispatch tune --shapes grid.csv --op gemm --emit shard1 --shard 1/2   # on host B\n"
      "  kdispatch merge --out configs-merged shard0 shard1 && kdispatch validate configs-merged\n"
      "  kdispatch merge --retime --out configs-merged run-a run-b   # conflicts timed here (a GPU table: on its GPU)\n"
      "  kdispatch merge --compact /nfs/kdispatch-emit   # fragments into their <key>.json, in place\n"
      "Exit codes: 0 every table merged, 1 some table refused or file skipped, 2 bad argument.");
  return merge;
}

// ------------------------------------------------------------ report
CLI::App* add_report(CLI::App& app, ReportOptions& po) {
  CLI::App* report = app.add_subcommand(
      "report",
      "Write one self-contained HTML file (inline CSS and SVG, no JavaScript, nothing fetched) of what tuning "
      "measured: per op and shape, time against M for the floor, the served plan and, where a benchmark measured "
      "one, the peer, with the read/compute ceilings where they were measured (never a spec-sheet number); a heat "
      "map of served / floor over (shape, M); every row with its margin, A/A spread and why; the rows that lost to "
      "the floor; a regret histogram where two inputs tuned the same (shape, M).");
  report
      ->add_option("inputs", po.inputs,
                   "Each told by its content: a config dir or table (`tune --emit`: the rows' \"kdispatch\" metadata), "
                   "`kdispatch tune --json` output, or a bench JSON (bench/gpu/: bench_any_model.py, bench_fp8.py, "
                   "bench_gpu.py, bench_silu.py)")
      ->type_name("DIR|FILE...")
      ->required();
  report->add_option("--out,-o", po.out, "The HTML file to write (replaced atomically)")->type_name("FILE")->required();
  report->add_option("--title", po.title, "The page's title (default: kdispatch report)")->type_name("TEXT");
  report->footer(
      "Examples:\n"
      "  kdispatch report configs/cuda --out h200.html\n"
      "  kdispatch tune --shapes grid.csv --op gemm --emit my-configs --json > tune.json && \\\n"
      "      kdispatch report my-configs tune.json --out tune.html\n"
      "  kdispatch report configs/cuda out/any_model.json --out any_model.html   # the benchmark's torch as the peer\n"
      "  kdispatch report run-a run-b --out regret.html                         # two tunes: the regret histogram\n"
      "A file named here that is none of the kinds is refused (exit 2); in a dir, foreign JSON is passed over.\n"
      "Exit codes: 0 written, 1 written but a file in a dir could not be read, or nothing to report, or the write\n"
      "failed, 2 bad argument or input.");
  return report;
}

// A command line that failed to parse. CLI11 reports the arguments that no
// option or subcommand takes last, after the required options and the
// values' checks, so `kdispatch lookup --bogus` would say "--key is
// required": an unknown argument is reported first, as CLI11 words it
// ("The following argument was not expected: --bogus"; several: in the
// order typed), whatever else the command line lacks. Returns the usage
// exit code.
int usage_error(CLI::App& app, const CLI::ParseError& e, int argc, const char* const* argv) {
  std::vector<std::string> left = app.remaining(true), extras;  // the app's own first, then its subcommand's
  if (left.empty()) {
    app.exit(e);  // prints the message and a --help hint
    return kExitUsage;
  }
  for (int i = 1; i < argc; ++i)  // in the order they were typed
    if (auto it = std::find(left.begin(), left.end(), argv[i]); it != left.end()) {
      extras.push_back(*it);
      left.erase(it);
    }
  extras.insert(extras.end(), left.begin(), left.end());
  std::reverse(extras.begin(), extras.end());  // ExtrasError joins them last to first
  app.exit(CLI::ExtrasError(extras));
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kdispatch: per-call kernel variant and launch-config dispatch from tuned config tables.\n"
      "Replays a model's shapes through the ops (and tunes them online), exports the misses and tunes them offline, "
      "answers config lookups, validates config trees, writes an HTML report of the tuning."};
  app.name("kdispatch");
  app.set_version_flag("--version", version_text);
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  kdispatch replay\n"
      "  kdispatch replay --model llama-3-8b --steps 4\n"
      "  kdispatch replay --tune background\n"
      "  kdispatch misses --export misses.csv && kdispatch tune --shapes misses.csv --op gemm --emit my-configs\n"
      "  kdispatch lookup --configs sglang-configs/fused_moe_triton --backend-version 3.5.1 \\\n"
      "      --device \"NVIDIA H200\" --key \"E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]\" --M 1\n"
      "  kdispatch validate sglang-configs\n"
      "  kdispatch report my-configs tune.json --out report.html\n"
      "Exit codes: 0 ok, 1 failure (op error, not found, unusable files), 2 usage error.");

  ReplayOptions ro, mo;
  TuneCmdOptions to;
  LookupOptions lo;
  ValidateOptions vo;
  MergeOptions gmo;
  VerifyOptions vfo;
  ReportOptions po;
  CLI::App* replay = add_replay(app, ro);
  CLI::App* misses = add_misses(app, mo);
  CLI::App* tune = add_tune(app, to);
  CLI::App* lookup = add_lookup(app, lo);
  CLI::App* validate = add_validate(app, vo);
  CLI::App* merge = add_merge(app, gmo);
  CLI::App* verify = add_verify(app, vfo);
  CLI::App* report = add_report(app, po);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    return usage_error(app, e, argc, argv);
  }

  try {
    if (replay->parsed()) return run_replay(ro);
    if (misses->parsed()) return run_replay(mo);
    if (tune->parsed()) return run_tune(to);
    if (lookup->parsed()) return run_lookup(lo);
    if (validate->parsed()) return run_validate(vo);
    if (merge->parsed()) return run_merge(gmo);
    if (verify->parsed()) return run_verify(vfo);
    if (report->parsed()) return run_report(po);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kdispatch: %s\n", e.what());
    return kExitFailure;
  }
  return kExitUsage;
}
