// SPDX-License-Identifier: Apache-2.0
// Tests of `kdispatch tune --model` (issue 32, item 5), run through the built
// binary (KDISPATCH_CLI_PATH) as tests/test_cli_tune.cpp does: the units a
// Hugging Face config.json gives (Llama, Qwen2 with head_dim, Gemma,
// DeepSeek-V3 with MLA, MoE and an fp8 quantization_config) through
// `--list`, --tp sharding and its refusal, --no-lm-head, the MoE experts
// (fused_moe) tuned, lm_head over the memory budget reported too large,
// the progress line of every tune, and one real tiny CPU run whose rows
// `kdispatch validate` accepts. Configs with tiny dims: CPU tuning takes
// seconds.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.hpp"

#ifdef KDISPATCH_CLI_PATH

namespace {

namespace fs = std::filesystem;
using kdtest::CliResult;
using kdtest::TempDir;

CliResult run(const std::vector<std::string>& args) { return kdtest::run_cli(args); }

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  const fs::path p = dir / name;
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
  return p.string();
}

// A Llama-style config: 4 heads of 16, 2 kv heads, a 1000-token vocabulary.
constexpr const char* kLlama = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 2,
  "vocab_size": 1000, "rms_norm_eps": 1e-05, "num_hidden_layers": 2, "tie_word_embeddings": false,
  "hidden_act": "silu", "torch_dtype": "bfloat16"})";

// Qwen2 with head_dim (32, not hidden / heads = 16): the q/k/v bias is implied.
constexpr const char* kQwen2 = R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
  "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 32, "vocab_size": 500, "rms_norm_eps": 1e-06, "tie_word_embeddings": true})";

// Gemma: head_dim 32 with 2 heads over a hidden of 48, one kv head, a gelu
// activation (no op for it), tied embeddings.
constexpr const char* kGemma = R"({"architectures": ["GemmaForCausalLM"], "model_type": "gemma",
  "hidden_size": 48, "intermediate_size": 80, "num_attention_heads": 2, "num_key_value_heads": 1,
  "head_dim": 32, "vocab_size": 256, "rms_norm_eps": 1e-06, "hidden_act": "gelu",
  "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true})";

// DeepSeek-V3 in miniature: MLA, one dense layer then MoE (8 routed experts,
// 1 shared), an fp8 checkpoint with 128x128 blocks.
constexpr const char* kDeepSeek = R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 24, "num_attention_heads": 4,
  "num_key_value_heads": 4, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
  "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1,
  "num_experts_per_tok": 2, "first_k_dense_replace": 1, "num_hidden_layers": 3, "vocab_size": 300,
  "rms_norm_eps": 1e-06, "hidden_act": "silu", "tie_word_embeddings": false,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]}})";

// The units `--list` printed: "<sites>: <op> <key label>" at each M.
struct Listed {
  std::vector<std::string> units;  // at M = 1, in order
  std::vector<std::string> not_tuned;
  size_t lines = 0;  // every unit line, at every M
};
Listed listed(const std::string& out) {
  Listed l;
  static const std::regex unit(R"(^(.*) M=(\d+) unit=[0-9a-f]{16}( \(.*\))?$)");
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, unit)) {
      ++l.lines;
      if (m[2] == "1") l.units.push_back(m[1]);
    } else if (line.find(": not tuned: ") != std::string::npos) {
      l.not_tuned.push_back(line);
    }
  }
  return l;
}

Listed list_model(const std::string& config, const std::vector<std::string>& extra = {}) {
  TempDir emit;
  std::vector<std::string> args = {"tune", "--model", config, "--emit", emit.str(), "--ms", "1,2", "--list"};
  args.insert(args.end(), extra.begin(), extra.end());
  CliResult r = run(args);
  REQUIRE_MESSAGE(r.exit_code == 0, r.out << r.err);
  CHECK(r.out.rfind("model ", 0) == 0);  // the model's description first
  return listed(r.out);
}

/// A small Qwen3-MoE config.json (8 experts, top 2, 2 layers, 4 heads)
/// whose quantization_config holds `quant` after its quant_method
/// compressed-tensors: `big` hidden 128 and MoE intermediate 128 (block
/// fp8's multiples), else hidden 64 and 16.
std::string qwen_moe_ct(const std::string& quant, bool big) {
  return std::string(R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", )") +
         (big ? R"("hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 128, "head_dim": 32, )"
              : R"("hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 16, "head_dim": 16, )") +
         R"("num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 8, "num_experts_per_tok": 2,
      "num_hidden_layers": 2, "vocab_size": 256, "hidden_act": "silu",
      "quantization_config": {"quant_method": "compressed-tensors", )" +
         quant + "}}";
}

}  // namespace

TEST_CASE("cli tune --model: a Llama config.json's units, --tp 2 halving the sharded dims, --tp 3 refused") {
  TempDir dir;
  const std::string cfg = write(dir, "llama/config.json", kLlama);
  const Listed l = list_model(cfg);
  const std::vector<std::string> expected = {
      "input_layernorm[0]: rmsnorm hidden=64,bf16",
      "qkv_proj: gemm N=128,K=64,bf16",  // (4 + 2 x 2) heads x 16
      "o_proj: gemm N=64,K=64,bf16",
      "post_attention_layernorm+input_layernorm[1:]+final_norm: fused_add_rmsnorm hidden=64,bf16",
      "gate_up_proj: gemm N=320,K=64,bf16",
      "act_fn: silu_and_mul d=160,bf16",
      "down_proj: gemm N=64,K=160,bf16",
      "lm_head: gemm N=1024,K=64,bf16",  // 1000 padded to 64
  };
  CHECK(l.units == expected);
  CHECK(l.lines == 2 * expected.size());  // --ms 1,2
  CHECK(l.not_tuned.empty());
  // The snapshot dir holding config.json reads the same.
  CHECK(list_model((dir / "llama").string()).units == expected);

  // --tp 2: q, k, v heads, o_proj's K, gate_up's N, down's K, the activation
  // and lm_head's N are split; the norms and the hidden size are not.
  const std::vector<std::string> tp2 = {
      "input_layernorm[0]: rmsnorm hidden=64,bf16",
      "qkv_proj: gemm N=64,K=64,bf16",
      "o_proj: gemm N=64,K=32,bf16",
      "post_attention_layernorm+input_layernorm[1:]+final_norm: fused_add_rmsnorm hidden=64,bf16",
      "gate_up_proj: gemm N=160,K=64,bf16",
      "act_fn: silu_and_mul d=80,bf16",
      "down_proj: gemm N=64,K=80,bf16",
      "lm_head: gemm N=512,K=64,bf16",
  };
  CHECK(list_model(cfg, {"--tp", "2"}).units == tp2);
  // --tp 4: 2 kv heads on 4 ranks, one copy each (as SGLang and vLLM do).
  CHECK(list_model(cfg, {"--tp", "4"}).units.at(1) == "qkv_proj: gemm N=48,K=64,bf16");

  // --tp 3 divides no head count: a usage error naming the dimension and the values.
  CliResult r = run({"tune", "--model", cfg, "--emit", (dir / "emit").string(), "--tp", "3", "--list"});
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.err.find("--tp 3 does not divide num_attention_heads (4)") != std::string::npos, r.err);
  CHECK_FALSE(fs::exists(dir / "emit"));
  // intermediate_size too (4 heads, 2 kv heads and 1000 padded to 1024 go by 4).
  const std::string odd2 = write(
      dir, "odd2.json",
      std::regex_replace(std::string(kLlama), std::regex("\"intermediate_size\": 160"), "\"intermediate_size\": 162"));
  r = run({"tune", "--model", odd2, "--emit", (dir / "emit").string(), "--tp", "4", "--list"});
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(r.err.find("--tp 4 does not divide intermediate_size (162)") != std::string::npos, r.err);

  // --no-lm-head; --op keeps one op's units.
  std::vector<std::string> no_head = expected;
  no_head.pop_back();
  CHECK(list_model(cfg, {"--no-lm-head"}).units == no_head);
  CHECK(list_model(cfg, {"--op", "silu_and_mul"}).units == std::vector<std::string>{"act_fn: silu_and_mul d=160,bf16"});
}

TEST_CASE("cli tune --model: Qwen2 with head_dim and its q/k/v bias, --dtype fp16, --fp8 tensor and rowwise") {
  TempDir dir;
  const std::string cfg = write(dir, "config.json", kQwen2);
  const std::vector<std::string> expected = {
      "input_layernorm[0]: rmsnorm hidden=64,bf16",
      "qkv_proj: gemm N=256,K=64,bf16,bias",  // (4 + 2 x 2) x head_dim 32
      "o_proj: gemm N=64,K=128,bf16",         // K = 4 x 32
      "post_attention_layernorm+input_layernorm[1:]+final_norm: fused_add_rmsnorm hidden=64,bf16",
      "gate_up_proj: gemm N=192,K=64,bf16",
      "act_fn: silu_and_mul d=96,bf16",
      "down_proj: gemm N=64,K=96,bf16",
      "lm_head (tied to embed_tokens): gemm N=512,K=64,bf16",
  };
  CHECK(list_model(dir.str()).units == expected);
  CHECK(list_model(cfg, {"--dtype", "fp16"}).units.at(1) == "qkv_proj: gemm N=256,K=64,fp16,bias");
  // fp8: each projection is the layout's quant op and fp8 GEMM (its output
  // the run's dtype); lm_head stays in the run's dtype.
  const std::vector<std::string> tensor = {
      "input_layernorm[0]: rmsnorm hidden=64,bf16",
      "qkv_proj.quant+gate_up_proj.quant: quant_fp8_tensor K=64,bf16->fp8_e4m3fn",
      "qkv_proj: gemm_fp8_tensor N=256,K=64,fp8_e4m3fn->bf16,bias",
      "o_proj.quant: quant_fp8_tensor K=128,bf16->fp8_e4m3fn",
      "o_proj: gemm_fp8_tensor N=64,K=128,fp8_e4m3fn->bf16",
      "post_attention_layernorm+input_layernorm[1:]+final_norm: fused_add_rmsnorm hidden=64,bf16",
      "gate_up_proj: gemm_fp8_tensor N=192,K=64,fp8_e4m3fn->bf16",
      "act_fn: silu_and_mul d=96,bf16",
      "down_proj.quant: quant_fp8_tensor K=96,bf16->fp8_e4m3fn",
      "down_proj: gemm_fp8_tensor N=64,K=96,fp8_e4m3fn->bf16",
      "lm_head (tied to embed_tokens): gemm N=512,K=64,bf16",
  };
  CHECK(list_model(cfg, {"--fp8", "tensor"}).units == tensor);
  const Listed rowwise = list_model(cfg, {"--fp8", "rowwise"});
  REQUIRE(rowwise.units.size() == tensor.size());
  CHECK(rowwise.units[1] == "qkv_proj.quant+gate_up_proj.quant: quant_fp8_token K=64,bf16->fp8_e4m3fn");
  CHECK(rowwise.units[2] == "qkv_proj: gemm_fp8_rowwise N=256,K=64,fp8_e4m3fn->bf16,bias");
  // Built-in replay model: the replay's shapes (tests/test_cli_tune.cpp's misses export of it).
  const Listed q = list_model("qwen2.5-0.5b");
  REQUIRE(q.units.size() == 8);
  CHECK(q.units[1] == "qkv_proj: gemm N=1152,K=896,bf16,bias");
  CHECK(q.units[4] == "gate_up_proj: gemm N=9728,K=896,bf16");
  CHECK(q.units[7] == "lm_head: gemm N=151936,K=896,bf16");
}

TEST_CASE("cli tune --model: Gemma's head_dim, tied lm_head and gelu activation (not tuned, named)") {
  TempDir dir;
  const std::string cfg = write(dir, "config.json", kGemma);
  const Listed l = list_model(cfg);
  const std::vector<std::string> expected = {
      "input_layernorm[0]: rmsnorm hidden=48,bf16",
      "qkv_proj: gemm N=128,K=48,bf16",  // (2 + 2 x 1) x 32
      "o_proj: gemm N=48,K=64,bf16",
      "post_attention_layernorm+input_layernorm[1:]+final_norm: fused_add_rmsnorm hidden=48,bf16",
      "gate_up_proj: gemm N=160,K=48,bf16",
      "down_proj: gemm N=48,K=80,bf16",
      "lm_head (tied to embed_tokens): gemm N=256,K=48,bf16",
  };
  CHECK(l.units == expected);
  REQUIRE(l.not_tuned.size() == 1);
  CHECK(l.not_tuned[0] == "act_fn (gelu_pytorch_tanh and mul, d=80): not tuned: no gelu_and_mul op yet");
  // Gemma2: the sandwich norms (rmsnorm after attention and after the MLP).
  const std::string g2 =
      write(dir, "g2.json",
            std::regex_replace(std::string(kGemma), std::regex("\"gemma\"|\"GemmaForCausalLM\""), "\"gemma2\""));
  const Listed l2 = list_model(g2);
  REQUIRE(l2.units.size() == 7);
  CHECK(l2.units[0] ==
        "input_layernorm[0]+post_attention_layernorm+post_feedforward_layernorm: rmsnorm hidden=48,bf16");
  CHECK(l2.units[3] == "pre_feedforward_layernorm+input_layernorm[1:]+final_norm: fused_add_rmsnorm hidden=48,bf16");
}

TEST_CASE(
    "cli tune --model: DeepSeek-V3's MLA projections, dense MLP, router, shared experts and routed experts "
    "(fused_moe, --ep)") {
  TempDir dir;
  const std::string cfg = write(dir, "config.json", kDeepSeek);
  const Listed l = list_model(cfg);
  // fp8 block from quantization_config: quant_fp8_group + gemm_fp8_block per
  // projection; the router and lm_head unquantised.
  const std::vector<std::string> expected = {
      "input_layernorm[0]: rmsnorm hidden=64,bf16",
      "q_a_proj.quant+kv_a_proj_with_mqa.quant+o_proj.quant+gate_up_proj.quant+shared_experts.gate_up_proj.quant: "
      "quant_fp8_group K=64,bf16->fp8_e4m3fn",
      "q_a_proj: gemm_fp8_block N=32,K=64,fp8_e4m3fn->bf16",
      "q_a_layernorm: rmsnorm hidden=32,bf16",
      "q_b_proj.quant: quant_fp8_group K=32,bf16->fp8_e4m3fn",
      "q_b_proj: gemm_fp8_block N=64,K=32,fp8_e4m3fn->bf16",            // 4 heads x (8 + 8)
      "kv_a_proj_with_mqa: gemm_fp8_block N=24,K=64,fp8_e4m3fn->bf16",  // 16 + 8
      "kv_a_layernorm: rmsnorm hidden=16,bf16",
      "kv_b_proj.quant: quant_fp8_group K=16,bf16->fp8_e4m3fn",
      "kv_b_proj: gemm_fp8_block N=96,K=16,fp8_e4m3fn->bf16",  // 4 x (8 + 16)
      "o_proj: gemm_fp8_block N=64,K=64,fp8_e4m3fn->bf16",     // K = 4 x 16: its quant is the K=64 one
      "post_attention_layernorm+input_layernorm[1:]+final_norm: fused_add_rmsnorm hidden=64,bf16",
      "gate_up_proj: gemm_fp8_block N=192,K=64,fp8_e4m3fn->bf16",
      "act_fn: silu_and_mul d=96,bf16",
      "down_proj.quant: quant_fp8_group K=96,bf16->fp8_e4m3fn",
      "down_proj: gemm_fp8_block N=64,K=96,fp8_e4m3fn->bf16",
      "gate (router): gemm N=8,K=64,bf16",
      "shared_experts.gate_up_proj: gemm_fp8_block N=48,K=64,fp8_e4m3fn->bf16",
      "shared_experts.act_fn: silu_and_mul d=24,bf16",
      "shared_experts.down_proj.quant: quant_fp8_group K=24,bf16->fp8_e4m3fn",
      "shared_experts.down_proj: gemm_fp8_block N=64,K=24,fp8_e4m3fn->bf16",
      "experts: fused_moe E=8,N=24,K=64,top_k=2,fp8_e4m3fn->bf16,block_shape",  // the routed experts, block fp8
      "lm_head: gemm N=320,K=64,bf16",
  };
  CHECK(l.units == expected);
  CHECK(l.not_tuned.empty());

  // --tp 2 --fp8 none: the heads, the dense and shared MLPs and the experts
  // split; q_a, kv_a (latents) and the router not.
  const Listed t = list_model(cfg, {"--tp", "2", "--fp8", "none"});
  const std::vector<std::string> tp2 = {
      "input_layernorm[0]: rmsnorm hidden=64,bf16",
      "q_a_proj: gemm N=32,K=64,bf16",
      "q_a_layernorm: rmsnorm hidden=32,bf16",
      "q_b_proj: gemm N=32,K=32,bf16",
      "kv_a_proj_with_mqa+shared_experts.gate_up_proj: gemm N=24,K=64,bf16",
      "kv_a_layernorm: rmsnorm hidden=16,bf16",
      "kv_b_proj: gemm N=48,K=16,bf16",
      "o_proj: gemm N=64,K=32,bf16",
      "post_attention_layernorm+input_layernorm[1:]+final_norm: fused_add_rmsnorm hidden=64,bf16",
      "gate_up_proj: gemm N=96,K=64,bf16",
      "act_fn: silu_and_mul d=48,bf16",
      "down_proj: gemm N=64,K=48,bf16",
      "gate (router): gemm N=8,K=64,bf16",
      "shared_experts.act_fn: silu_and_mul d=12,bf16",
      "shared_experts.down_proj: gemm N=64,K=12,bf16",
      "experts: fused_moe E=8,N=12,K=64,top_k=2,bf16",  // each expert's intermediate split over the 2 ranks
      "lm_head: gemm N=160,K=64,bf16",
  };
  CHECK(t.units == tp2);
  CHECK(t.not_tuned.empty());
  // --ep 2: 4 whole experts a rank; --ep 3 does not divide 8; --fp8 tensor: not a layout fused_moe runs.
  const Listed ep = list_model(cfg, {"--tp", "2", "--ep", "2", "--fp8", "none"});
  CHECK(std::find(ep.units.begin(), ep.units.end(), "experts: fused_moe E=4,N=24,K=64,top_k=2,bf16") != ep.units.end());
  CliResult bad_ep = run({"tune", "--model", cfg, "--emit", (dir / "emit").string(), "--ep", "3", "--list"});
  CHECK(bad_ep.exit_code == 2);
  CHECK(bad_ep.err.find("--ep 3 does not divide the routed experts (8)") != std::string::npos);
  // --fp8 tensor / rowwise: the per-tensor and per-channel fused-MoE ops
  // (dynamic scales: the checkpoint's static flag is not --fp8's).
  const Listed tensor = list_model(cfg, {"--fp8", "tensor"});
  CHECK(tensor.not_tuned.empty());
  CHECK(std::find(tensor.units.begin(), tensor.units.end(),
                  "experts: fused_moe_fp8_tensor E=8,N=24,K=64,top_k=2,fp8_e4m3fn->bf16") != tensor.units.end());
  const Listed rowwise = list_model(cfg, {"--fp8", "rowwise"});
  CHECK(std::find(rowwise.units.begin(), rowwise.units.end(),
                  "experts: fused_moe_fp8_channel E=8,N=24,K=64,top_k=2,fp8_e4m3fn->bf16") != rowwise.units.end());

  // A real run of its norms and of its routed experts (fused_moe on the CPU, block fp8).
  TempDir emit;
  CliResult r = run({"tune", "--model", cfg, "--emit", emit.str(), "--ms", "1", "--op", "rmsnorm", "--budget-ms", "20",
                     "--no-cold-cache", "--reps", "1"});
  CHECK_MESSAGE(r.exit_code == 0, r.out << r.err);
  CHECK(r.out.find("3 rmsnorm shapes: 3 tuned") != std::string::npos);
  CliResult m = run({"tune", "--model", cfg, "--emit", emit.str(), "--ms", "1,3", "--op", "fused_moe", "--budget-ms",
                     "20", "--no-cold-cache", "--reps", "1"});
  CHECK_MESSAGE(m.exit_code == 0, m.out << m.err);
  CHECK_MESSAGE(m.out.find("2 fused_moe shapes: 2 tuned") != std::string::npos, m.out);
  CHECK(fs::exists(emit / "cpu" / "fused_moe"));
  CHECK(r.err.find("note: quantization_config: an fp8 checkpoint: --fp8 block") != std::string::npos);
}

// Mixtral with a per-tensor fp8 checkpoint whose activation scales are
// static (quant_method fp8, no weight_block_size), and Qwen3-MoE from a
// compressed-tensors FP8-dynamic checkpoint (weights per channel, tokens
// dynamic): their experts are fused_moe_fp8_tensor with a_scale=static and
// fused_moe_fp8_channel, and a real run tunes them on the CPU.
TEST_CASE("cli tune --model: per-tensor (static) and per-channel fp8 MoE checkpoints tune the fp8_w8a8 fused-MoE ops") {
  TempDir dir;
  const std::string mixtral = write(dir, "mixtral/config.json", R"({"architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral", "hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
    "vocab_size": 256, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}})");
  const Listed m = list_model(mixtral, {"--no-lm-head"});
  CHECK(std::find(m.units.begin(), m.units.end(),
                  "experts: fused_moe_fp8_tensor E=4,N=32,K=64,top_k=2,fp8_e4m3fn->bf16,a_scale") != m.units.end());
  CHECK(std::find(m.units.begin(), m.units.end(), "qkv_proj: gemm_fp8_tensor N=128,K=64,fp8_e4m3fn->bf16") !=
        m.units.end());
  CHECK(m.not_tuned.empty());

  const std::string qwen = write(dir, "qwen/config.json", R"({"architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 16,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8,
    "num_experts_per_tok": 2, "num_hidden_layers": 2, "vocab_size": 256, "rms_norm_eps": 1e-06,
    "hidden_act": "silu", "quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": false, "symmetric": true},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true,
                              "symmetric": true}}}}})");
  const Listed q = list_model(qwen, {"--no-lm-head"});
  CHECK(std::find(q.units.begin(), q.units.end(),
                  "experts: fused_moe_fp8_channel E=8,N=16,K=64,top_k=2,fp8_e4m3fn->bf16") != q.units.end());
  CHECK(std::find(q.units.begin(), q.units.end(), "o_proj: gemm_fp8_rowwise N=64,K=64,fp8_e4m3fn->bf16") !=
        q.units.end());

  // A real run of both experts units on the CPU: rows of each op's key.
  TempDir emit;
  for (const std::string& cfg : {mixtral, qwen}) {
    CliResult r = run({"tune", "--model", cfg, "--emit", emit.str(), "--ms", "1,3", "--op",
                       cfg == mixtral ? "fused_moe_fp8_tensor" : "fused_moe_fp8_channel", "--budget-ms", "20",
                       "--no-cold-cache", "--reps", "1"});
    CHECK_MESSAGE(r.exit_code == 0, r.out << r.err);
    CHECK_MESSAGE(r.out.find(cfg == mixtral ? "2 fused_moe_fp8_tensor shapes: 2 tuned"
                                            : "2 fused_moe_fp8_channel "
                                              "shapes: 2 tuned") != std::string::npos,
                  r.out);
  }
  // A shapes CSV without out_dtype tunes the fp8 MoE ops into bf16 (what engines run), not fp8.
  const std::string csv = write(dir, "moe.csv", "M,N,K,E,top_k\n1,8,16,2,2\n");
  CliResult shapes = run({"tune", "--shapes", csv, "--op", "fused_moe_fp8_channel", "--emit", emit.str(), "--budget-ms",
                          "20", "--no-cold-cache", "--reps", "1"});
  CHECK_MESSAGE(shapes.exit_code == 0, shapes.out << shapes.err);
  CHECK_MESSAGE(shapes.out.find("1 fused_moe_fp8_channel shapes: 1 tuned") != std::string::npos, shapes.out);

  // compressed-tensors without a usable group (a sparse-only checkpoint: config_groups empty,
  // missing or not objects) or with weight-only fp8: a note, the experts in --dtype (it crashed).
  for (const char* groups : {R"("config_groups": {})", R"("config_groups": [1, 2])", R"("sparsity_config": {})",
                             R"("config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float",
                                "strategy": "channel"}, "input_activations": null}})"}) {
    CAPTURE(groups);
    const std::string cfg = write(dir, "ct/config.json", qwen_moe_ct(std::string(groups), false));
    TempDir e2;
    CliResult r = run({"tune", "--model", cfg, "--emit", e2.str(), "--ms", "1", "--list"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.out << r.err);
    const Listed l = listed(r.out);
    CHECK(std::find(l.units.begin(), l.units.end(), "experts: fused_moe E=8,N=16,K=64,top_k=2,bf16") != l.units.end());
    CHECK((r.out + r.err).find("note: quantization_config: ") != std::string::npos);
  }

  // Two groups of different schemes (a mixed-precision checkpoint): the first's taken, the other named
  // in a note; two groups of one scheme say nothing.
  for (const char* second : {R"("weights": {"num_bits": 4, "type": "int", "strategy": "group"})",
                             R"("weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                                "input_activations": {"dynamic": true})"}) {
    CAPTURE(second);
    const std::string cfg = write(dir, "ct2/config.json",
                                  qwen_moe_ct(std::string(R"("config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                    "input_activations": {"dynamic": true}},
        "group_1": {)") + second + R"(}})",
                                              false));
    TempDir e2;
    CliResult r = run({"tune", "--model", cfg, "--emit", e2.str(), "--ms", "1", "--list", "--no-lm-head"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.out << r.err);
    const Listed l = listed(r.out);
    CHECK(std::find(l.units.begin(), l.units.end(),
                    "experts: fused_moe_fp8_channel E=8,N=16,K=64,top_k=2,fp8_e4m3fn->bf16") != l.units.end());
    const bool mixed = std::string(second).find("int") != std::string::npos;
    CHECK(((r.out + r.err)
               .find("note: quantization_config: compressed-tensors groups of other schemes: group_1 "
                     "(int4 group, weight-only); every GEMM is tuned in the first group's, group_0 "
                     "(float8 channel, dynamic inputs)") != std::string::npos) == mixed);
  }

  // Hostile groups: a name with a newline and a fake unit line prints as one note line (printable, capped);
  // an int4 first group serves nothing in fp8, so no "first group's" note; block weights without a usable
  // block_structure are an error naming it, its "128x128" string form is read.
  struct Hostile {
    const char* groups;
    int exit;
    const char* want;  // in stdout + stderr
    const char* never;
  };
  for (const Hostile& h :
       {Hostile{R"("group_0": {"weights": {"type": "float", "strategy": "channel"},
                                  "input_activations": {"dynamic": true}},
                      "x\nexperts: fused_moe E=8,N=16,K=64,top_k=2,bf16 M=1 unit=deadbeef\n": {
                        "weights": {"num_bits": 4, "type": "int", "strategy": "group\nexperts: fake"}})",
                0,
                "groups of other schemes: x?experts: fused_moe E=8,N=16,K=64,top_k... (int4 group?experts: f..., "
                "weight-only)",
                "\nexperts: fused_moe E=8,N=16,K=64,top_k=2,bf16 M=1"},
        Hostile{R"("group_0": {"weights": {"num_bits": 4, "type": "int", "strategy": "group"}},
                      "group_1": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                                  "input_activations": {"dynamic": true}})",
                0, "a compressed-tensors scheme other than fp8", "first group's"},
        Hostile{R"("group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "block"},
                                  "input_activations": {"dynamic": true}})",
                2, "compressed-tensors block weights without a block_structure [n, k]", "experts:"},
        Hostile{R"("group_0": {"weights": {"num_bits": 8, "type": "FLOAT", "strategy": "block",
                                  "block_structure": "128x128"}, "input_activations": {"dynamic": true}})",
                0, "experts: fused_moe E=8,N=128,K=128,top_k=2,fp8_e4m3fn->bf16,block_shape", "other schemes"}}) {
    CAPTURE(h.groups);
    const std::string cfg =
        write(dir, "cth/config.json", qwen_moe_ct(std::string(R"("config_groups": {)") + h.groups + R"(})", true));
    TempDir e4;
    CliResult r = run({"tune", "--model", cfg, "--emit", e4.str(), "--ms", "1", "--list", "--no-lm-head"});
    CHECK_MESSAGE(r.exit_code == h.exit, r.out << r.err);
    CHECK_MESSAGE((r.out + r.err).find(h.want) != std::string::npos, r.out << r.err);
    CHECK_MESSAGE((r.out + r.err).find(h.never) == std::string::npos, r.out << r.err);
  }

  // compressed-tensors block fp8 (an FP8-block checkpoint): block fused_moe and gemm_fp8_block; a
  // block_structure other than 128x128 refused as weight_block_size is.
  for (const char* bs : {"[128, 128]", "[64, 64]"}) {
    CAPTURE(bs);
    const std::string cfg = write(dir, "ctb/config.json",
                                  qwen_moe_ct(std::string(R"("config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": )") +
                                                  bs + R"(},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128,
                              "dynamic": true}}})",
                                              true));
    TempDir e3;
    CliResult r = run({"tune", "--model", cfg, "--emit", e3.str(), "--ms", "1", "--list", "--no-lm-head"});
    if (std::string(bs) == "[64, 64]") {
      CHECK(r.exit_code == 2);
      CHECK(r.err.find("gemm_fp8_block runs 128x128 blocks only") != std::string::npos);
      continue;
    }
    REQUIRE_MESSAGE(r.exit_code == 0, r.out << r.err);
    const Listed l = listed(r.out);
    CHECK(std::find(l.units.begin(), l.units.end(),
                    "experts: fused_moe E=8,N=128,K=128,top_k=2,fp8_e4m3fn->bf16,block_shape") != l.units.end());
  }

  // A multimodal config: the decoder in text_config, quantization_config at the top (it was missed).
  const std::string mm = write(dir, "mm/config.json", R"({"architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "hidden_size": 64,
      "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "vocab_size": 256, "num_hidden_layers": 2, "hidden_activation": "gelu_pytorch_tanh"},
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}})");
  const Listed g = list_model(mm, {"--no-lm-head"});
  CHECK(std::find_if(g.units.begin(), g.units.end(), [](const std::string& u) {
          return u.find("qkv_proj: gemm_fp8_tensor N=128,K=64") != std::string::npos;
        }) != g.units.end());

  bool static_row = false;
  for (const auto& e : fs::directory_iterator(emit / "cpu" / "fused_moe_fp8_tensor"))
    static_row = static_row || e.path().filename().string().find("a_scale=static") != std::string::npos;
  CHECK(static_row);
  CHECK(fs::exists(emit / "cpu" / "fused_moe_fp8_channel"));
}

TEST_CASE(
    "cli tune --model: a real tiny run writes rows validate accepts, lm_head over --mem-gib is too large, resume") {
  TempDir dir;
  // A 4000-token vocabulary: lm_head's operands (4032 x 64 bf16, ~0.5 MiB)
  // are over a 0.2 MiB budget, every other unit's are far under it.
  const std::string cfg =
      write(dir, "config.json",
            std::regex_replace(std::string(kLlama), std::regex("\"vocab_size\": 1000"), "\"vocab_size\": 4000"));
  const std::string emit = (dir / "emit").string();
  const std::vector<std::string> args = {"tune",   "--model", cfg,           "--emit", emit,
                                         "--ms",   "1,2",     "--budget-ms", "20",     "--no-cold-cache",
                                         "--reps", "1",       "--mem-gib",   "0.0002"};
  std::vector<std::string> json_args = args;
  json_args.push_back("--json");
  CliResult r = run(json_args);
  REQUIRE_MESSAGE(r.exit_code == 0, r.out << r.err);
  simdjson::dom::parser parser;
  simdjson::dom::element doc = parser.parse(simdjson::padded_string(r.out));
  CHECK(int64_t(doc["shapes"]) == 16);
  CHECK(int64_t(doc["tuned"]) == 14);
  CHECK(int64_t(doc["skipped_too_large"]) == 2);
  CHECK(int64_t(doc["failed"]) == 0);
  CHECK(std::string_view(doc["model"]).find("llama (LlamaForCausalLM)") == 0);
  int64_t lm_heads = 0;
  for (simdjson::dom::element res : doc["results"].get_array()) {
    const std::string shape{std::string_view(res["shape"])};
    if (shape.rfind("lm_head: ", 0) != 0) continue;
    ++lm_heads;
    CHECK(std::string_view(res["status"]) == "too_large");
    CHECK(std::string_view(res["op"]) == "gemm");
    CHECK(std::string_view(res["message"]).find("over the tuning memory budget") != std::string_view::npos);
  }
  CHECK(lm_heads == 2);
  // Every unit's progress line: [n/N] ... [elapsed E, ETA T].
  static const std::regex progress(R"(\[ ?(\d+)/16\] .* \[elapsed [0-9.]+s, ETA ([0-9.]+s|\?)\])");
  int lines = 0;
  std::istringstream err(r.err);
  for (std::string line; std::getline(err, line);)
    if (std::smatch m; std::regex_match(line, m, progress)) CHECK(std::stoi(m[1]) == ++lines);
  CHECK_MESSAGE(lines == 16, r.err);

  CliResult v = run({"validate", emit});
  CHECK_MESSAGE(v.exit_code == 0, v.out << v.err);
  CHECK(v.out.find("7 files: 7 loaded") != std::string::npos);  // 4 gemm keys (not lm_head), 2 norms, 1 act

  // Resumed: every unit is in the emit dir (or too large); nothing tuned again.
  CliResult again = run(args);
  REQUIRE_MESSAGE(again.exit_code == 0, again.out << again.err);
  CHECK(again.out.find("16 rmsnorm/gemm/fused_add_rmsnorm/silu_and_mul shapes: 0 tuned, 16 skipped (14 already in") !=
        std::string::npos);
}

TEST_CASE("cli tune: every run's progress line says unit n of N, elapsed and ETA (--shapes too)") {
  TempDir dir;
  const std::string csv = write(dir, "norms.csv", "M,hidden\n1,64\n2,64\n");
  CliResult r = run({"tune", "--shapes", csv, "--op", "rmsnorm", "--emit", (dir / "emit").string(), "--budget-ms", "20",
                     "--no-cold-cache", "--reps", "1"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  CHECK(std::regex_search(r.err, std::regex(R"(\[1/2\] hidden=64,bf16 M=1 -> .* \[elapsed [0-9.]+s, ETA [0-9.]+s\])")));
  CHECK(std::regex_search(r.err, std::regex(R"(\[2/2\] hidden=64,bf16 M=2 -> .* \[elapsed [0-9.]+s, ETA 0\.0s\])")));
}

TEST_CASE("cli tune --model: usage errors exit 2, naming what is wrong") {
  TempDir dir;
  const std::string emit = (dir / "emit").string();
  const std::string llama = write(dir, "llama.json", kLlama);
  const auto err_of = [&](const std::vector<std::string>& args) {
    std::vector<std::string> a = {"tune", "--emit", emit};
    a.insert(a.end(), args.begin(), args.end());
    CliResult r = run(a);
    CHECK_MESSAGE(r.exit_code == 2, r.out << r.err);
    return r.err;
  };
  CHECK(err_of({"--model", llama, "--shapes", llama}).find("not both") != std::string::npos);
  CHECK(err_of({}).find("give --shapes FILE... with --op OP, or --model") != std::string::npos);
  CHECK(err_of({"--shapes", llama}).find("give --shapes FILE... with --op OP") != std::string::npos);
  CHECK(err_of({"--shapes", llama, "--op", "gemm", "--tp", "2"}).find("go with --model") != std::string::npos);
  CHECK(err_of({"--model", llama, "--fp8", "mxfp4"}).find("--fp8 'mxfp4' is not tensor, rowwise, block or none") !=
        std::string::npos);
  CHECK(err_of({"--model", llama, "--ms", "1,0"}).find("--ms 1,0: '0' is not an M") != std::string::npos);
  CHECK(err_of({"--model", llama, "--dtype", "fp8_e4m3fn"}).find("--fp8") != std::string::npos);
  CHECK(err_of({"--model", (dir / "nothing-here").string()})
            .find("not a config.json, a dir holding one, or a built-in") != std::string::npos);
  const std::string bert = write(dir, "bert.json", R"({"architectures": ["BertModel"], "model_type": "bert"})");
  CHECK(err_of({"--model", bert}).find("model_type 'bert' (architectures BertModel) is not a family") !=
        std::string::npos);
  const std::string no_hidden = write(dir, "nohidden.json", R"({"model_type": "llama", "num_attention_heads": 4})");
  CHECK(err_of({"--model", no_hidden}).find("no hidden_size") != std::string::npos);
  CHECK(err_of({"--model", write(dir, "bad.json", "{not json")}).find("not JSON") != std::string::npos);
  CHECK_FALSE(fs::exists(emit));
}

#endif  // KDISPATCH_CLI_PATH
