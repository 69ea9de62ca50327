// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch tune --model`: a model's units from its Hugging
// Face config.json (or a local snapshot dir holding one, or a replay
// model's name; nothing is fetched). The config's dimensions go through a
// per-architecture unit table (kFamilies) into the (op, key) units an
// engine's decoder runs, sharded for --tp as SGLang and vLLM shard them;
// tune.cpp turns each unit at each M of --ms into the job a --shapes row
// of the same key would be, and tunes them as it tunes a shape list.
//
// The decoder layer, as SGLang/vLLM run it (replay_model.hpp runs the same
// layer; sites named as the checkpoints name the weights):
//   input_layernorm[0]      rmsnorm hidden            (layer 0; later layers fuse it with the residual add)
//   qkv_proj                gemm N=(heads + 2 kv_heads) head_dim / tp, K=hidden [bias: Qwen2, attention_bias]
//   q_norm, k_norm          rmsnorm hidden=head_dim over M x heads/tp (M x kv_heads/tp) rows (Qwen3, Gemma3)
//   o_proj                  gemm N=hidden, K=heads head_dim / tp
//   post_attention_layernorm fused_add_rmsnorm hidden (Gemma2/3: rmsnorm, then pre_feedforward_layernorm
//                           fused_add_rmsnorm and post_feedforward_layernorm rmsnorm)
//   gate_up_proj            gemm N=2 intermediate / tp, K=hidden
//   act_fn                  silu_and_mul d=intermediate / tp (a gelu activation, Gemma's: not tuned, no op)
//   down_proj               gemm N=hidden, K=intermediate / tp
//   input_layernorm[1:]+final_norm fused_add_rmsnorm hidden
//   lm_head                 gemm N=vocab padded to 64 / tp, K=hidden (never fp8; --no-lm-head leaves it out)
// DeepSeek-V2/V3's MLA replaces qkv_proj with q_a_proj (q_lora_rank x
// hidden), q_a_layernorm, q_b_proj (heads (nope + rope) / tp x q_lora_rank;
// q_proj when q_lora_rank is null), kv_a_proj_with_mqa (kv_lora_rank + rope
// x hidden), kv_a_layernorm, kv_b_proj (heads (nope + v) / tp x
// kv_lora_rank); o_proj's K is heads v_head_dim / tp. Its first
// first_k_dense_replace layers have the dense MLP; the others the MoE: the
// router (gate: N=n_routed_experts, unquantised), the shared experts (a
// dense MLP of n_shared_experts x moe_intermediate_size) and the routed
// experts: one fused_moe unit (E, K=hidden, N=moe_intermediate_size / tp,
// top_k; --ep N: E/N whole experts per rank; fp8 as the checkpoint's:
// block fused_moe with block_shape, per tensor fused_moe_fp8_tensor, per
// channel fused_moe_fp8_channel, a_scale=static for static activations).
// Mixtral and Qwen3-MoE: the router and the experts.
//
// --fp8 tensor|rowwise|block (or an fp8 checkpoint's quantization_config:
// weight_block_size [128, 128] is block, none is tensor; compressed-tensors'
// fp8 weights per channel rowwise, per tensor tensor): every projection
// of the decoder (not the router, not lm_head) runs as the replay's fp8
// models run it: the quant op of the layout on its input (dtype -> fp8),
// then the fp8 GEMM of the layout (fp8 -> dtype):
//   tensor   quant_fp8_tensor K + gemm_fp8_tensor N,K
//   rowwise  quant_fp8_token K  + gemm_fp8_rowwise N,K
//   block    quant_fp8_group K  + gemm_fp8_block N,K
#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli.hpp"
#include "store/bounded_read.hpp"

namespace kdispatch_cli {

namespace {

namespace fs = std::filesystem;
namespace dom = simdjson::dom;

enum class Attention { gqa, mla };
enum class Mlp { dense, moe, deepseek };

// The unit table: one row per architecture (config.json's model_type, or
// its architectures[0]).
struct Family {
  std::string_view model_type, architecture;
  Attention attention;
  bool qkv_bias;  // a q/k/v bias unless the config's attention_bias says otherwise
  bool qk_norm;   // rmsnorm of each head's q and k over head_dim
  bool sandwich;  // Gemma2/3's four norms per layer
  Mlp mlp;
};
constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", Attention::gqa, false, false, false, Mlp::dense},
    {"mistral", "MistralForCausalLM", Attention::gqa, false, false, false, Mlp::dense},
    {"qwen2", "Qwen2ForCausalLM", Attention::gqa, true, false, false, Mlp::dense},
    {"qwen3", "Qwen3ForCausalLM", Attention::gqa, false, true, false, Mlp::dense},
    {"qwen3_moe", "Qwen3MoeForCausalLM", Attention::gqa, false, true, false, Mlp::moe},
    {"gemma", "GemmaForCausalLM", Attention::gqa, false, false, false, Mlp::dense},
    {"gemma2", "Gemma2ForCausalLM", Attention::gqa, false, false, true, Mlp::dense},
    {"gemma3_text", "Gemma3ForCausalLM", Attention::gqa, false, true, true, Mlp::dense},
    {"phi3", "Phi3ForCausalLM", Attention::gqa, false, false, false, Mlp::dense},
    {"mixtral", "MixtralForCausalLM", Attention::gqa, false, false, false, Mlp::moe},
    {"deepseek_v2", "DeepseekV2ForCausalLM", Attention::mla, false, false, false, Mlp::deepseek},
    {"deepseek_v3", "DeepseekV3ForCausalLM", Attention::mla, false, false, false, Mlp::deepseek},
};

std::string family_names() {
  std::string out;
  for (const Family& f : kFamilies) out += (out.empty() ? "" : ", ") + std::string(f.model_type);
  return out;
}

const Family* family_named(std::string_view model_type, std::string_view architecture) {
  for (const Family& f : kFamilies)
    if (!model_type.empty() && f.model_type == model_type) return &f;
  for (const Family& f : kFamilies)
    if (!architecture.empty() && f.architecture == architecture) return &f;
  return nullptr;
}

// What the unit table reads of a config.
struct Arch {
  const Family* family = nullptr;
  std::string source;  // the file, or "built-in <name>"
  std::string architecture;
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0, layers = 0;
  double eps = 0;
  bool tie = false, qkv_bias = false;
  std::string act = "silu";
  int64_t default_tp = 1;  // a replay model's own
  // MLA (q_lora_rank 0: q_proj)
  int64_t q_lora_rank = 0, kv_lora_rank = 0, nope = 0, rope = 0, v_head_dim = 0;
  // MoE
  int64_t experts = 0, top_k = 0, moe_intermediate = 0, shared_experts = 0, dense_layers = 0;
  bool has_dense = true, has_moe = false;
  // An fp8 checkpoint (quantization_config): "block", "tensor", "rowwise"
  // (per-channel weights, per-token activations) or ""; static: its
  // activation scales are fixed (activation_scheme "static").
  std::string fp8;
  bool fp8_static = false;
  int64_t block_n = 0, block_k = 0;
  std::vector<std::string> notes;
};

// ---------------------------------------------------------------- config.json

// Reads keys of one config object; the first problem is kept in `error`.
struct ConfigReader {
  dom::object obj;
  std::string error;

  void fail(const std::string& what) {
    if (error.empty()) error = what;
  }
  bool present(std::string_view key) const {
    dom::element e;
    return obj[key].get(e) == simdjson::SUCCESS && !e.is_null();
  }
  // An integer key: nullopt when absent or null.
  std::optional<int64_t> opt_int(std::string_view key) {
    dom::element e;
    if (obj[key].get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
    int64_t v = 0;
    double d = 0;
    if (e.get(v) == simdjson::SUCCESS) return v;
    if (e.get(d) == simdjson::SUCCESS && std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15)
      return static_cast<int64_t>(d);
    fail(std::string(key) + " is not an integer");
    return std::nullopt;
  }
  // A required dimension: an integer >= 1 (`dflt` when absent, if > 0).
  int64_t dim(std::string_view key, int64_t dflt = 0) {
    const std::optional<int64_t> v = opt_int(key);
    if (!v && dflt > 0) return dflt;
    if (!v)
      fail("no " + std::string(key));
    else if (*v < 1)
      fail(std::string(key) + " must be >= 1, got " + std::to_string(*v));
    return v && *v >= 1 ? *v : 0;
  }
  std::string str(std::string_view key) {
    std::string_view v;
    return obj[key].get(v) == simdjson::SUCCESS ? std::string(v) : std::string();
  }
  bool flag(std::string_view key, bool dflt) {
    bool v = false;
    return obj[key].get(v) == simdjson::SUCCESS ? v : dflt;
  }
  double real(std::string_view key) {
    double v = 0;
    int64_t i = 0;
    if (obj[key].get(v) == simdjson::SUCCESS) return v;
    return obj[key].get(i) == simdjson::SUCCESS ? static_cast<double>(i) : 0.0;
  }
  size_t array_size(std::string_view key) {
    dom::array a;
    return obj[key].get(a) == simdjson::SUCCESS ? a.size() : 0;
  }
};

/// One compressed-tensors config group's scheme, with the library's
/// defaults (QuantizationArgs: num_bits 8, type "int", dynamic false;
/// type and strategy case-insensitive).
struct CtScheme {
  bool has_w = false, has_in = false, dynamic = false;
  std::string type, strategy;
  int64_t bits = 8, block_n = 0, block_k = 0;
  bool block_ok = false;  ///< block_structure read: [n, k] integers or "NxK"

  bool fp8() const {
    return has_w && type == "float" && bits == 8 &&
           (strategy == "channel" || strategy == "tensor" || strategy == "block");
  }
  std::string text() const {
    if (!has_w) return "no weights";
    std::string t = type + std::to_string(bits) + " " + strategy;
    if (strategy == "block" && block_ok) t += " " + std::to_string(block_n) + "x" + std::to_string(block_k);
    return t + (!has_in ? ", weight-only" : dynamic ? ", dynamic inputs" : ", static inputs");
  }
};

/// A config's text as a note may print it: printable ASCII, at most `cap`
/// characters (a config's names and values are not the output's lines).
std::string printable(std::string_view text, size_t cap = 40) {
  std::string out;
  for (char ch : text.substr(0, cap)) out += ch >= 0x20 && ch < 0x7f ? ch : '?';
  return text.size() > cap ? out + "..." : out;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

CtScheme scheme_of(dom::object g) {
  CtScheme c;
  dom::object w, in;
  if (g["weights"].get(w) == simdjson::SUCCESS) {
    ConfigReader wr{w, {}};
    c.has_w = true;
    c.type = printable(lower(wr.present("type") ? wr.str("type") : "int"), 16);
    c.bits = wr.opt_int("num_bits").value_or(wr.present("num_bits") ? 0 : 8);
    c.strategy = printable(lower(wr.str("strategy")), 16);
    dom::array bs;
    std::string_view text;
    double n = 0, k = 0;
    if (w["block_structure"].get(bs) == simdjson::SUCCESS) {
      c.block_ok = bs.size() == 2 && bs.at(0).get(n) == simdjson::SUCCESS && bs.at(1).get(k) == simdjson::SUCCESS;
    } else if (w["block_structure"].get(text) == simdjson::SUCCESS) {  // "128x128"
      const size_t x = text.find('x');
      c.block_ok = x != std::string_view::npos && x > 0 && x + 1 < text.size() && x < 8 && text.size() - x < 9;
      for (size_t q = 0; c.block_ok && q < text.size(); ++q) c.block_ok = q == x || std::isdigit(text[q]) != 0;
      if (c.block_ok) n = std::stod(std::string(text.substr(0, x))), k = std::stod(std::string(text.substr(x + 1)));
    }
    c.block_ok = c.block_ok && n == std::floor(n) && k == std::floor(k) && n >= 1 && k >= 1 && n < 1e6 && k < 1e6;
    if (c.block_ok) c.block_n = static_cast<int64_t>(n), c.block_k = static_cast<int64_t>(k);
  }
  c.has_in = g["input_activations"].get(in) == simdjson::SUCCESS;
  c.dynamic = c.has_in && ConfigReader{in, {}}.flag("dynamic", false);
  return c;
}

// compressed-tensors' fp8 scheme (RedHat's FP8-dynamic / FP8 / FP8-block
// checkpoints): the first config group's weights (8-bit float, strategy
// "channel", "tensor" or "block" with its block_structure) and
// input_activations (dynamic or not); another scheme is a note. Where the
// first group's fp8 scheme serves, later groups of another scheme are
// named in a note (a mixed-precision checkpoint: every GEMM is tuned in
// the first group's).
void read_compressed_tensors(ConfigReader& qc, Arch* a) {
  dom::object groups;
  bool found = false;  // a group object (a sparse-only checkpoint has none)
  CtScheme first;
  std::string first_name, others;
  int64_t other_count = 0;
  if (qc.obj["config_groups"].get(groups) == simdjson::SUCCESS)
    for (auto [name, group] : groups) {
      dom::object g;
      if (group.get(g) != simdjson::SUCCESS) continue;
      const CtScheme c = scheme_of(g);
      if (!found) {
        first = c, first_name = printable(name), found = true;
      } else if (c.text() != first.text() && other_count++ < 4) {
        others += (others.empty() ? "" : ", ") + printable(name) + " (" + c.text() + ")";
      }
    }
  if (!found || !first.fp8()) {
    a->notes.push_back(
        "quantization_config: a compressed-tensors scheme other than fp8 weights per channel, per tensor or in "
        "blocks: its GEMMs are tuned in --dtype (or --fp8)");
    return;
  }
  if (!first.has_in) {  // weight-only fp8 (W8A16)
    a->notes.push_back(
        "quantization_config: compressed-tensors fp8 weights without input_activations (weight-only, W8A16): no "
        "kdispatch op runs that scheme; its GEMMs are tuned in --dtype (or --fp8)");
    return;
  }
  if (first.strategy == "block" && !first.block_ok)  // the caller refuses all but 128x128, as weight_block_size
    return qc.fail("quantization_config: compressed-tensors block weights without a block_structure [n, k]");
  if (other_count > 0)
    a->notes.push_back("quantization_config: compressed-tensors groups of other schemes: " + others +
                       (other_count > 4 ? " and " + std::to_string(other_count - 4) + " more" : "") +
                       "; every GEMM is tuned in the first group's, " + first_name + " (" + first.text() + ")");
  if (first.strategy == "block") {
    a->fp8 = "block", a->block_n = first.block_n, a->block_k = first.block_k;
    return;
  }
  a->fp8 = first.strategy == "channel" ? "rowwise" : "tensor";
  a->fp8_static = !first.dynamic;
}

// quantization_config: an fp8 checkpoint's layout (block with its
// weight_block_size, else per-tensor; compressed-tensors' per channel or
// per tensor) and whether its activation scales are static; another method
// is a note.
void read_quantization(ConfigReader& c, Arch* a) {
  dom::object q;
  if (c.obj["quantization_config"].get(q) != simdjson::SUCCESS) return;
  ConfigReader qc{q, {}};
  const std::string method = qc.str("quant_method");
  if (method == "compressed-tensors") {
    read_compressed_tensors(qc, a);
    if (!qc.error.empty()) c.fail(qc.error);  // (qc is this function's: its error is the config's)
    return;
  }
  if (method != "fp8") {
    a->notes.push_back("quantization_config quant_method '" + method +
                       "' is not an fp8 scheme tune --model knows: its GEMMs are tuned in --dtype (or --fp8)");
    return;
  }
  a->fp8_static = qc.str("activation_scheme") == "static";
  dom::array block;
  if (q["weight_block_size"].get(block) != simdjson::SUCCESS) {
    a->fp8 = "tensor";
    return;
  }
  a->fp8 = "block";
  int64_t n = 0, k = 0;
  if (block.size() != 2 || block.at(0).get(n) != simdjson::SUCCESS || block.at(1).get(k) != simdjson::SUCCESS)
    c.fail("quantization_config.weight_block_size is not two integers");
  a->block_n = n;
  a->block_k = k;
}

// The MoE keys (DeepSeek's, Qwen3-MoE's, Mixtral's).
void read_moe(ConfigReader& c, Arch* a) {
  const Mlp mlp = a->family->mlp;
  if (mlp == Mlp::dense) return;
  for (const char* key : {"n_routed_experts", "num_experts", "num_local_experts"})
    if (!a->experts) a->experts = c.opt_int(key).value_or(0);
  a->top_k = c.opt_int("num_experts_per_tok").value_or(0);
  a->has_moe = a->experts > 0;
  if (a->has_moe)
    a->moe_intermediate = a->family->model_type == "mixtral" ? a->intermediate : c.dim("moe_intermediate_size");
  if (mlp == Mlp::deepseek) {
    a->shared_experts = c.opt_int("n_shared_experts").value_or(0);
    a->dense_layers = c.opt_int("first_k_dense_replace").value_or(0);
    a->has_dense = a->dense_layers > 0 || !a->has_moe;
    if (a->layers > 0 && a->layers <= a->dense_layers) a->has_moe = false;
  } else {  // every layer MoE, but Qwen3-MoE's mlp_only_layers (or a sparse step > 1)
    a->dense_layers = static_cast<int64_t>(c.array_size("mlp_only_layers"));
    a->has_dense = a->dense_layers > 0 || c.opt_int("decoder_sparse_step").value_or(1) > 1 || !a->has_moe;
  }
}

std::optional<Arch> read_config(const std::string& path, std::string* error) {
  std::string text;
  if (dispatch::store::read_bounded(path, &text, {}, error) != dispatch::store::ReadError::ok) return std::nullopt;
  dom::parser parser;
  dom::element doc;
  if (auto err = parser.parse(text).get(doc); err != simdjson::SUCCESS) {
    *error = path + ": not JSON: " + simdjson::error_message(err);
    return std::nullopt;
  }
  ConfigReader c;
  if (doc.get(c.obj) != simdjson::SUCCESS) {
    *error = path + ": not a JSON object";
    return std::nullopt;
  }
  // A multimodal config (Gemma3ForConditionalGeneration, ...) keeps the
  // decoder's keys in text_config, and its quantization_config at the top.
  const dom::object top = c.obj;
  if (dom::object text_config; !c.present("hidden_size") && c.obj["text_config"].get(text_config) == simdjson::SUCCESS)
    c.obj = text_config;
  Arch a;
  a.source = path;
  dom::array archs;
  if (doc["architectures"].get(archs) == simdjson::SUCCESS && archs.size() > 0) {
    std::string_view first;
    if (archs.at(0).get(first) == simdjson::SUCCESS) a.architecture = first;
  }
  const std::string model_type = c.str("model_type");
  a.family = family_named(model_type, a.architecture);
  if (!a.family) {
    *error = path + ": model_type '" + model_type + "' (architectures " +
             (a.architecture.empty() ? std::string("none") : a.architecture) +
             ") is not a family tune --model knows: " + family_names();
    return std::nullopt;
  }
  if (a.architecture.empty()) a.architecture = a.family->architecture;
  a.hidden = c.dim("hidden_size");
  a.heads = c.dim("num_attention_heads");
  a.kv_heads = c.dim("num_key_value_heads", a.heads);
  a.head_dim = c.present("head_dim") ? c.dim("head_dim") : a.heads ? a.hidden / a.heads : 0;
  if (a.family->attention == Attention::gqa && !c.present("head_dim") && a.heads && a.hidden % a.heads)
    c.fail("hidden_size " + std::to_string(a.hidden) + " is not a multiple of num_attention_heads " +
           std::to_string(a.heads) + " (and there is no head_dim)");
  const bool dense_key =
      a.family->mlp != Mlp::moe || a.family->model_type == "mixtral" || c.present("intermediate_size");
  a.intermediate = dense_key ? c.dim("intermediate_size") : 0;
  a.vocab = c.opt_int("vocab_size").value_or(0);
  a.layers = c.opt_int("num_hidden_layers").value_or(0);
  a.eps = c.real("rms_norm_eps");
  a.tie = c.flag("tie_word_embeddings", false);
  a.qkv_bias = c.flag("attention_bias", a.family->qkv_bias);
  for (const char* key : {"hidden_activation", "hidden_act"})
    if (std::string act = c.str(key); !act.empty()) {
      a.act = act;
      break;
    }
  if (a.family->attention == Attention::mla) {
    a.q_lora_rank = c.opt_int("q_lora_rank").value_or(0);
    a.kv_lora_rank = c.dim("kv_lora_rank");
    a.nope = c.dim("qk_nope_head_dim");
    a.rope = c.dim("qk_rope_head_dim");
    a.v_head_dim = c.dim("v_head_dim");
  }
  read_moe(c, &a);
  ConfigReader quant{c.present("quantization_config") ? c.obj : top, {}};
  read_quantization(quant, &a);
  if (!quant.error.empty()) c.fail(quant.error);
  if (!c.error.empty()) {
    *error = path + ": " + c.error;
    return std::nullopt;
  }
  return a;
}

// A replay model (models.cpp) as its config.json would give it.
Arch builtin_arch(const ModelSpec& m) {
  Arch a;
  a.source = std::string("built-in ") + m.name + " (" + m.source + ")";
  a.family = family_named(m.mla ? "deepseek_v3" : m.qkv_bias ? "qwen2" : "llama", {});
  a.architecture = std::string(a.family->architecture);
  a.hidden = m.hidden;
  a.intermediate = m.intermediate;
  a.heads = m.heads;
  a.kv_heads = m.kv_heads;
  a.head_dim = m.head_dim;
  a.layers = m.layers;
  a.vocab = m.vocab;
  a.eps = m.rms_eps;
  a.qkv_bias = m.qkv_bias;
  a.default_tp = m.tp;
  if (m.mla) {  // its dense layers only
    a.q_lora_rank = m.mla->q_lora_rank;
    a.kv_lora_rank = m.mla->kv_lora_rank;
    a.nope = m.mla->qk_nope_head_dim;
    a.rope = m.mla->qk_rope_head_dim;
    a.v_head_dim = m.mla->v_head_dim;
    a.dense_layers = m.layers;
  }
  if (m.fp8) {
    a.fp8 = "block";
    a.block_n = a.block_k = 128;
  }
  return a;
}

// ---------------------------------------------------------------- the units

// Builds the plan: units deduplicated by (op, key, rows), their sites joined.
class PlanBuilder {
 public:
  PlanBuilder(const Arch& a, int64_t tp, int64_t ep, std::string fp8, ModelPlan* plan)
      : a_(a), tp_(tp), ep_(ep), fp8_(std::move(fp8)), plan_(*plan) {}

  const std::string& error() const { return error_; }

  // v / tp; a usage error naming the config key when --tp does not divide it.
  int64_t split(const std::string& what, int64_t v) {
    if (v % tp_ == 0) return v / tp_;
    if (error_.empty())
      error_ = "--tp " + std::to_string(tp_) + " does not divide " + what + " (" + std::to_string(v) + ")";
    return 0;
  }

  void add(const std::string& site, std::string_view op, std::vector<std::pair<std::string, int64_t>> dims,
           bool bias = false, std::string dtype = {}, std::string out = {}, int64_t rows = 1,
           std::vector<std::pair<std::string, std::string>> fields = {}) {
    for (ModelUnit& u : plan_.units)
      if (u.op == op && u.dims == dims && u.bias == bias && u.dtype == dtype && u.out_dtype == out &&
          u.rows_per_token == std::vector<int64_t>{rows} && u.fields == fields) {
        u.sites += "+" + site;
        return;
      }
    plan_.units.push_back(ModelUnit{
        site, std::string(op), std::move(dims), bias, std::move(dtype), std::move(out), {rows}, std::move(fields)});
  }
  void norm(const std::string& site, std::string_view op, int64_t hidden, int64_t rows = 1) {
    add(site, op, {{"hidden", hidden}}, false, {}, {}, rows);
  }
  // A projection: gemm, or (--fp8, `quantised`) the layout's quant op and fp8 GEMM.
  void linear(const std::string& site, int64_t n, int64_t k, bool bias = false, bool quantised = true) {
    if (fp8_.empty() || !quantised) {
      add(site, "gemm", {{"N", n}, {"K", k}}, bias);
      return;
    }
    const bool block = fp8_ == "block", tensor = fp8_ == "tensor";
    add(site + ".quant", block ? "quant_fp8_group" : tensor ? "quant_fp8_tensor" : "quant_fp8_token", {{"K", k}});
    add(site,
        block    ? "gemm_fp8_block"
        : tensor ? "gemm_fp8_tensor"
                 : "gemm_fp8_rowwise",
        {{"N", n}, {"K", k}}, bias, "fp8_e4m3fn", "run");
  }
  void act(const std::string& site, int64_t d) {
    if (a_.act == "silu" || a_.act == "swish") {
      add(site, "silu_and_mul", {{"d", d}});
      return;
    }
    std::string name = a_.act.substr(0, a_.act.find('_'));
    plan_.not_tuned.push_back(site + " (" + a_.act + " and mul, d=" + std::to_string(d) + "): not tuned: no " + name +
                              "_and_mul op yet");
  }
  void mlp(const std::string& prefix, int64_t inter) {
    linear(prefix + "gate_up_proj", 2 * inter, a_.hidden);
    act(prefix + "act_fn", inter);
    linear(prefix + "down_proj", a_.hidden, inter);
  }

  void attention_gqa() {
    const int64_t heads = split("num_attention_heads", a_.heads);
    // kv heads fewer than the ranks: each rank holds a copy of one (SGLang, vLLM).
    int64_t kv = 1;
    if (a_.kv_heads % tp_ == 0)
      kv = a_.kv_heads / tp_;
    else if (tp_ % a_.kv_heads != 0 && error_.empty())
      error_ = "--tp " + std::to_string(tp_) + " does not divide num_key_value_heads (" + std::to_string(a_.kv_heads) +
               ") nor is a multiple of it";
    linear("qkv_proj", (heads + 2 * kv) * a_.head_dim, a_.hidden, a_.qkv_bias);
    if (a_.family->qk_norm) {
      norm("q_norm", "rmsnorm", a_.head_dim, heads);
      norm("k_norm", "rmsnorm", a_.head_dim, kv);
    }
    linear("o_proj", a_.hidden, heads * a_.head_dim);
  }

  void attention_mla() {
    const int64_t heads = split("num_attention_heads", a_.heads);
    if (a_.q_lora_rank > 0) {
      linear("q_a_proj", a_.q_lora_rank, a_.hidden);
      norm("q_a_layernorm", "rmsnorm", a_.q_lora_rank);
      linear("q_b_proj", heads * (a_.nope + a_.rope), a_.q_lora_rank);
    } else {
      linear("q_proj", heads * (a_.nope + a_.rope), a_.hidden);
    }
    linear("kv_a_proj_with_mqa", a_.kv_lora_rank + a_.rope, a_.hidden);
    norm("kv_a_layernorm", "rmsnorm", a_.kv_lora_rank);
    linear("kv_b_proj", heads * (a_.nope + a_.v_head_dim), a_.kv_lora_rank);
    linear("o_proj", a_.hidden, heads * a_.v_head_dim);
  }

  void moe() {
    linear("gate (router)", a_.experts, a_.hidden, false, /*quantised=*/false);
    if (a_.shared_experts > 0) {
      const int64_t shared = a_.shared_experts * a_.moe_intermediate;
      mlp("shared_experts.", split("moe_intermediate_size x n_shared_experts", shared));
    }
    routed_experts();
  }

  // The routed experts: one fused_moe unit (both GEMMs, the activation and
  // the top-k sum), sharded as SGLang shards them: --ep 1, each expert's
  // moe_intermediate_size split over --tp; --ep N, E/N whole experts a rank.
  // bf16/fp16/fp32, or fp8 in the checkpoint's (or --fp8's) layout.
  void routed_experts() {
    int64_t experts = a_.experts, inter = a_.moe_intermediate;
    if (ep_ > 1) {
      if (experts % ep_ != 0 && error_.empty())
        error_ =
            "--ep " + std::to_string(ep_) + " does not divide the routed experts (" + std::to_string(experts) + ")";
      experts /= ep_;
    } else {
      inter = split("moe_intermediate_size", inter);
    }
    const std::string what = "experts (E=" + std::to_string(experts) + ", top " + std::to_string(a_.top_k) +
                             ", N=" + std::to_string(inter) + ", K=" + std::to_string(a_.hidden) + ")";
    std::string why;
    if (a_.top_k < 1)
      why = "the config has no num_experts_per_tok";
    else if (a_.act != "silu" && a_.act != "swish")
      why = "fused_moe is tuned with silu (the config's activation: " + a_.act + ")";
    if (!why.empty()) {
      plan_.not_tuned.push_back(what + ": not tuned: " + why);
      return;
    }
    // fp8: block (fused_moe with block_shape), tensor (fused_moe_fp8_tensor)
    // or rowwise (fused_moe_fp8_channel: SGLang's per_channel_quant), with
    // a_scale=static where the checkpoint's activation scales are static.
    const bool fp8 = !fp8_.empty(), block = fp8_ == "block";
    std::vector<std::pair<std::string, std::string>> fields;
    if (block) fields.emplace_back("block_shape", "true");
    if (fp8 && !block && fp8_ == a_.fp8 && a_.fp8_static) fields.emplace_back("a_scale", "true");
    add("experts",
        !fp8 || block      ? "fused_moe"
        : fp8_ == "tensor" ? "fused_moe_fp8_tensor"
                           : "fused_moe_fp8_channel",
        {{"E", experts}, {"K", a_.hidden}, {"N", inter}, {"top_k", a_.top_k}}, false, fp8 ? "fp8_e4m3fn" : "",
        fp8 ? "run" : "", 1, std::move(fields));
  }

  // The decoder layer, in call order; then lm_head.
  void layer(bool lm_head) {
    norm("input_layernorm[0]", "rmsnorm", a_.hidden);
    if (a_.family->attention == Attention::mla)
      attention_mla();
    else
      attention_gqa();
    if (a_.family->sandwich) {
      norm("post_attention_layernorm", "rmsnorm", a_.hidden);
      norm("pre_feedforward_layernorm", "fused_add_rmsnorm", a_.hidden);
    } else {
      norm("post_attention_layernorm", "fused_add_rmsnorm", a_.hidden);
    }
    if (a_.has_dense) mlp("", split("intermediate_size", a_.intermediate));
    if (a_.has_moe) moe();
    if (a_.family->sandwich) norm("post_feedforward_layernorm", "rmsnorm", a_.hidden);
    norm("input_layernorm[1:]+final_norm", "fused_add_rmsnorm", a_.hidden);
    if (!lm_head) return;
    if (a_.vocab < 1) {
      plan_.notes.push_back("lm_head: the config has no vocab_size: not listed");
      return;
    }
    // The vocabulary padded to 64 (SGLang's and vLLM's ParallelLMHead), split over the ranks.
    const int64_t padded = (a_.vocab + 63) / 64 * 64;
    if (padded % tp_ != 0 && error_.empty())
      error_ = "--tp " + std::to_string(tp_) + " does not divide vocab_size (" + std::to_string(a_.vocab) +
               ", padded to " + std::to_string(padded) + ")";
    linear(a_.tie ? "lm_head (tied to embed_tokens)" : "lm_head", padded / tp_, a_.hidden, false, false);
  }

 private:
  const Arch& a_;
  int64_t tp_, ep_;
  std::string fp8_;
  ModelPlan& plan_;
  std::string error_;
};

std::string describe(const Arch& a, int64_t tp, int64_t ep, const std::string& dtype, const std::string& fp8) {
  std::string d = std::string(a.family->model_type) + " (" + a.architecture + ") from " + a.source + ": hidden " +
                  std::to_string(a.hidden);
  if (a.intermediate) d += ", intermediate " + std::to_string(a.intermediate);
  d += ", " + std::to_string(a.heads) + " heads";
  if (a.family->attention == Attention::mla)
    d += ", MLA (q_lora_rank " + std::to_string(a.q_lora_rank) + ", kv_lora_rank " + std::to_string(a.kv_lora_rank) +
         ", qk_nope " + std::to_string(a.nope) + ", qk_rope " + std::to_string(a.rope) + ", v_head_dim " +
         std::to_string(a.v_head_dim) + ")";
  else
    d += ", " + std::to_string(a.kv_heads) + " kv heads, head_dim " + std::to_string(a.head_dim);
  if (a.has_moe)
    d += ", MoE " + std::to_string(a.experts) + " experts of " + std::to_string(a.moe_intermediate) +
         (a.shared_experts ? " + " + std::to_string(a.shared_experts) + " shared" : std::string()) +
         (a.has_dense ? " (" + std::to_string(a.dense_layers) + " dense layers)" : std::string());
  if (a.vocab) d += ", vocab " + std::to_string(a.vocab) + (a.tie ? " (tied)" : "");
  if (a.layers) d += ", " + std::to_string(a.layers) + " layers";
  char eps[32];
  std::snprintf(eps, sizeof eps, "%g", a.eps);
  if (a.eps > 0) d += ", eps " + std::string(eps);
  return d + "; tp " + std::to_string(tp) + (ep > 1 ? ", ep " + std::to_string(ep) : std::string()) + ", " + dtype +
         (fp8.empty() ? std::string() : ", fp8 " + fp8);
}

}  // namespace

bool parse_ms(const std::string& text, std::vector<int64_t>* ms, std::string* error) {
  ms->clear();
  if (text.empty()) {
    for (int64_t m = 1; m <= 8192; m *= 2) ms->push_back(m);
    return true;
  }
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string_view item =
        std::string_view(text).substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    int64_t m = 0;
    const auto r = std::from_chars(item.data(), item.data() + item.size(), m);
    if (item.empty() || r.ec != std::errc() || r.ptr != item.data() + item.size() || m < 1 || m > (int64_t{1} << 30)) {
      *error = "--ms " + text + ": '" + std::string(item) + "' is not an M (an integer in [1, 2^30])";
      return false;
    }
    if (std::find(ms->begin(), ms->end(), m) == ms->end()) ms->push_back(m);
    if (comma == std::string::npos) return true;
    start = comma + 1;
  }
}

std::optional<ModelPlan> plan_model(const TuneCmdOptions& o, std::string* error) {
  std::optional<Arch> arch;
  std::error_code ec;
  if (fs::exists(o.model, ec)) {
    const std::string file = fs::is_directory(o.model, ec) ? (fs::path(o.model) / "config.json").string() : o.model;
    arch = read_config(file, error);
  } else if (const ModelSpec* m = find_model(o.model)) {
    arch = builtin_arch(*m);
  } else {
    *error = "not a config.json, a dir holding one, or a built-in model (" + model_names() + ")";
  }
  if (!arch) return std::nullopt;
  if (o.dtype != "bf16" && o.dtype != "fp16" && o.dtype != "fp32") {
    *error = "--dtype " + o.dtype + ": a model's activations are bf16, fp16 or fp32 (fp8 projections: --fp8)";
    return std::nullopt;
  }
  ModelPlan plan;
  plan.notes = arch->notes;
  std::string fp8 = o.fp8.empty() ? arch->fp8 : o.fp8 == "none" ? std::string() : o.fp8;
  if (o.fp8.empty() && !fp8.empty())
    plan.notes.push_back("quantization_config: an fp8 checkpoint: --fp8 " + fp8 + " (--fp8 none: tune it in " +
                         o.dtype + ")");
  if (fp8 == "block" && o.fp8.empty() && (arch->block_n != 128 || arch->block_k != 128)) {
    *error = arch->source + ": quantization_config.weight_block_size [" + std::to_string(arch->block_n) + ", " +
             std::to_string(arch->block_k) + "]: gemm_fp8_block runs 128x128 blocks only";
    return std::nullopt;
  }
  const int64_t tp = o.tp > 0 ? o.tp : arch->default_tp;
  if (o.ep < 1) {
    *error = "--ep must be >= 1, got " + std::to_string(o.ep);
    return std::nullopt;
  }
  PlanBuilder b(*arch, tp, o.ep, fp8, &plan);
  b.layer(!o.no_lm_head);
  if (!b.error().empty()) {
    *error = b.error();
    return std::nullopt;
  }
  // The fp8 GEMMs' output is the run's dtype.
  for (ModelUnit& u : plan.units)
    if (u.out_dtype == "run") u.out_dtype = o.dtype;
  plan.description = describe(*arch, tp, o.ep, o.dtype, fp8);
  return plan;
}

}  // namespace kdispatch_cli
