// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — entry point: the command line (CLI11) of `kdispatch replay`,
// `kdispatch lookup` and `kdispatch validate`. Each subcommand fills an
// options struct and hands it to its run_* function (replay.cpp,
// configs.cpp); exit codes: 0 ok, 1 failure, 2 usage error.
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <string>

#include "cli/cli.hpp"
#include "dispatch/device.hpp"
#include "dispatch/runtime.hpp"


namespace {

using namespace kdispatch_cli;

std::string version_text() {
  const dispatch::DeviceInfo& cpu = dispatch::cpu_device_info();
  return std::string("kdispatch ") + dispatch::version() + " (CLI11 " CLI11_VERSION ")\nhost CPU: " +
         cpu.device_name + " (" + cpu.reported_name + ")";
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kdispatch: per-call kernel variant and launch-config dispatch from tuned config tables.\n"
      "Replays a model's shapes through the ops, answers config lookups, validates config trees."};
  app.name("kdispatch");
  app.set_version_flag("--version", version_text);
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  kdispatch replay\n"
      "  kdispatch replay --model llama-3-8b --steps 4\n"
      "  kdispatch lookup --configs sglang-configs/fused_moe_triton --backend-version 3.5.1 \\\n"
      "      --device \"NVIDIA H200\" --key \"E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]\" --M 1\n"
      "  kdispatch validate sglang-configs\n"
      "Exit codes: 0 ok, 1 failure (op error, not found, unusable files), 2 usage error.");

  // ------------------------------------------------------------ replay
  ReplayOptions ro;
  CLI::App* replay = app.add_subcommand(
      "replay",
      "Push a model's per-layer shapes through rmsnorm, fused_add_rmsnorm and gemm on the CPU, as a decoder "
      "forward pass per trace entry, and report per op: calls, table hits, defaults, us/call and config sources.");
  replay->add_option("--model", ro.model, "Model whose shapes to replay: " + model_names())
      ->type_name("NAME")
      ->capture_default_str();
  replay
      ->add_option("--trace", ro.trace,
                   "M per forward pass: decode (batch sizes 1..16), prefill (prompt lengths), mixed, or a FILE of "
                   "M values (whitespace/comma separated, '#' comments)")
      ->type_name("NAME|FILE")
      ->capture_default_str();
  replay->add_option("--steps", ro.steps, "Forward passes to run, cycling through the trace (default: one pass)")
      ->type_name("N")
      ->check(kAtLeastOne);
  replay->add_option("--configs", ro.config_dirs, "Extra config dir on top of the shipped configs (repeatable)")
      ->type_name("DIR")
      ->take_all()
      ->allow_extra_args(false);
  replay->add_option("--dtype", ro.dtype, "Activation and weight dtype: fp32 or bf16")
      ->type_name("DTYPE")
      ->capture_default_str();
  replay->add_flag("--json", ro.json, "Print one JSON object instead of tables");
  replay->footer(
      "Examples:\n"
      "  kdispatch replay                                   # qwen2.5-0.5b, decode trace, bf16\n"
      "  kdispatch replay --model llama-3-8b --steps 4\n"
      "  kdispatch replay --trace prefill --dtype fp32 --json\n"
      "  kdispatch replay --trace ms.txt --configs ./my-configs\n"
      "Config files for the CPU ops: <dir>/cpu/<op>/<fields>.json, e.g.\n"
      "  cpu/rmsnorm/hidden=896,device_name=CPU_x86_64_AVX512,dtype=bf16.json\n"
      "  cpu/gemm/N=1152,K=896,device_name=CPU_x86_64_AVX512,dtype=bf16,bias=true.json\n"
      "holding {\"<M>\": {\"variant\": \"<name>\", <param>: <value>, ...}, ...}.");

  // ------------------------------------------------------------ lookup
  LookupOptions lo;
  CLI::App* lookup = app.add_subcommand(
      "lookup", "Which config serves this key at this M on this device: the row, its file, the match and why.");
  lookup->add_option("--configs", lo.config_dir, "Config dir (read recursively; shipped configs are not loaded)")
      ->type_name("DIR")
      ->required();
  lookup->add_option("--device", lo.device,
                     "Device name as the runtime reports it (\"NVIDIA H200\") or as files spell it (NVIDIA_H200); "
                     "default: the host CPU's ISA class");
  lookup->add_option("--op", lo.op,
                     "fused_moe, triton_gemm, gemm, rmsnorm or fused_add_rmsnorm (default: inferred from the key)");
  lookup->add_option("--key", lo.key, "The file name's fields other than device_name, e.g. \"E=257,N=256,dtype=fp8_w8a8\"")
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
      "Exit codes: 0 found (table row or default), 1 not found, 2 bad argument.");

  // ------------------------------------------------------------ validate
  ValidateOptions vo;
  CLI::App* validate = app.add_subcommand(
      "validate", "Load config dirs and print the load report: per file loaded/partial/skipped and its problems.");
  validate->add_option("dirs", vo.dirs, "Config dirs (read recursively)")->type_name("DIR...")->required();
  validate->add_option("--backend-version", vo.backend_version,
                       "Kernel compiler version for triton_X_Y_Z/ folders, e.g. 3.5.1");
  validate->add_flag("--json", vo.json, "Print the report as JSON");
  validate->footer(
      "Examples:\n"
      "  kdispatch validate configs/\n"
      "  kdispatch validate sglang-configs --backend-version 3.5.1 --json\n"
      "Exit codes: 0 every file usable, 1 some file skipped, 2 bad argument.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message and a --help hint
    return kExitUsage;
  }

  try {
    if (replay->parsed()) return run_replay(ro);
    if (lookup->parsed()) return run_lookup(lo);
    if (validate->parsed()) return run_validate(vo);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kdispatch: %s\n", e.what());
    return kExitFailure;
  }
  return kExitUsage;
}
