// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — the models `replay` knows (published config.json values)
// and its traces: built-in decode/prefill/mixed sequences and trace files.
#include <charconv>
#include <fstream>
#include <string_view>

#include "cli/cli.hpp"
#include "store/bounded_read.hpp"

namespace kdispatch_cli {

namespace {

// DeepSeek-V3's MLA (deepseek-ai/DeepSeek-V3 config.json).
constexpr MlaSpec kDeepSeekV3Mla{/*q_lora_rank=*/1536, /*kv_lora_rank=*/512, /*qk_nope_head_dim=*/128,
                                 /*qk_rope_head_dim=*/64, /*v_head_dim=*/128};

}  // namespace

const std::vector<ModelSpec>& models() {
  // Dimensions from each model's config.json on the Hugging Face hub
  // (hidden_size, intermediate_size, num_attention_heads,
  // num_key_value_heads, num_hidden_layers, rms_norm_eps, vocab_size; head_dim =
  // hidden_size / num_attention_heads). Qwen2 adds a bias to q/k/v
  // ("attention_bias" is implied by the Qwen2 architecture); Llama has none.
  static const std::vector<ModelSpec> kModels = {
      {"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B config.json", 896, 4864, 14, 2, 64, 24, 1e-6, true, 1, false, nullptr,
       /*vocab=*/151936},
      {"qwen2.5-7b", "Qwen/Qwen2.5-7B config.json", 3584, 18944, 28, 4, 128, 28, 1e-6, true, 1, false, nullptr,
       /*vocab=*/152064},
      {"llama-3-8b", "meta-llama/Meta-Llama-3-8B config.json", 4096, 14336, 32, 8, 128, 32, 1e-5, false, 1, false,
       nullptr, /*vocab=*/128256},
      // One rank of an 8-way tensor-parallel Llama-3-70B: qkv and gate_up are
      // column-parallel (N / 8), o_proj and down_proj row-parallel (K / 8).
      {"llama-3-70b-tp8", "meta-llama/Meta-Llama-3-70B config.json, tensor parallel 8", 8192, 28672, 64, 8, 128, 80,
       1e-5, false, 8, false, nullptr, /*vocab=*/128256},
      // fp8 models: every projection quant_fp8_group + gemm_fp8_block (fp8
      // e4m3fn weights in 128x128 blocks, 1x128 activation groups: DeepSeek-
      // V3's scheme, SGLang's "fp8_w8a8, block_shape=[128, 128]").
      {"llama-3-8b-fp8", "meta-llama/Meta-Llama-3-8B config.json, block-fp8 projections", 4096, 14336, 32, 8, 128, 32,
       1e-5, false, 1, /*fp8=*/true, nullptr, /*vocab=*/128256},
      // DeepSeek-V3's dense layers: the first first_k_dense_replace = 3 of
      // its 61 layers have a dense MLP (intermediate_size 18432; the other
      // 58 are MoE). MLA attention, 128 heads; unsharded (tp 1) shapes, as
      // one GPU with data-parallel attention runs them. head_dim is
      // v_head_dim (o_proj's K = 128 * 128); kv_heads = heads (MLA's kv_b_proj
      // gives every head its own k and v).
      {"deepseek-v3-dense-fp8",
       "deepseek-ai/DeepSeek-V3 config.json, its 3 dense layers, fp8 checkpoint (block 128x128)", 7168, 18432, 128, 128,
       128, 3, 1e-6, false, 1, /*fp8=*/true, &kDeepSeekV3Mla,
       /*vocab=*/129280},
  };
  return kModels;
}

const ModelSpec* find_model(const std::string& name) {
  for (const ModelSpec& m : models())
    if (name == m.name) return &m;
  return nullptr;
}

std::string model_names() {
  std::string out;
  for (const ModelSpec& m : models()) {
    if (!out.empty()) out += ", ";
    out += m.name;
  }
  return out;
}

namespace {

// An engine's decode loop as the batch size evolves: requests arrive, run,
// finish; the batch grows to 16 and drains. Every M of 1..16 appears, many
// of them twice, so a config table's nearest-M and the default path
// are both exercised.
constexpr int64_t kDecode[] = {1,  1,  2,  3,  4,  4,  5,  6, 8, 8, 7, 6, 7, 9, 10, 12,
                               13, 14, 16, 16, 15, 13, 11, 9, 8, 6, 5, 4, 3, 2, 2,  1};
// Prompt lengths as a server sees them: short chats, a padded 128, odd
// lengths and a full chunk.
constexpr int64_t kPrefill[] = {17, 128, 333, 512, 45, 256, 1, 96};

}  // namespace

std::optional<Trace> builtin_trace(const std::string& name) {
  Trace t;
  t.name = name;
  if (name == "decode") {
    t.ms.assign(std::begin(kDecode), std::end(kDecode));
  } else if (name == "prefill") {
    t.ms.assign(std::begin(kPrefill), std::end(kPrefill));
  } else if (name == "mixed") {
    // A continuous-batching engine without chunked mixing: a prefill pass
    // each time a request is admitted, decode passes in between.
    const size_t nd = std::size(kDecode), np = std::size(kPrefill);
    size_t p = 0;
    for (size_t d = 0; d < nd; ++d) {
      if (d % 5 == 0 && p < np) t.ms.push_back(kPrefill[p++]);
      t.ms.push_back(kDecode[d]);
    }
  } else {
    return std::nullopt;
  }
  return t;
}

std::optional<Trace> read_trace_file(const std::string& path, std::string* error) {
  std::string text;  // a regular file of at most 256 MiB (store/bounded_read.hpp)
  if (dispatch::store::read_bounded(path, &text, {}, error) != dispatch::store::ReadError::ok) return std::nullopt;
  Trace t;
  t.name = path;
  std::string_view line;
  size_t pos = 0;
  int64_t line_no = 0;
  while (next_line(text, &pos, &line)) {
    ++line_no;
    std::string_view v(line);
    if (const auto hash = v.find('#'); hash != std::string_view::npos) v = v.substr(0, hash);
    size_t i = 0;
    while (i < v.size()) {
      const auto is_sep = [](char c) { return c == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
      while (i < v.size() && is_sep(v[i])) ++i;
      size_t j = i;
      while (j < v.size() && !is_sep(v[j])) ++j;
      if (j > i) {
        const std::string_view tok = v.substr(i, j - i);
        int64_t m = 0;
        const auto r = std::from_chars(tok.data(), tok.data() + tok.size(), m);
        if (r.ec != std::errc() || r.ptr != tok.data() + tok.size() || m < 1) {
          *error = path + ":" + std::to_string(line_no) + ": bad M value '" + std::string(tok) +
                   "' (expected an integer >= 1)";
          return std::nullopt;
        }
        t.ms.push_back(m);
      }
      i = j;
    }
  }
  if (t.ms.empty()) {
    *error = path + ": no M values in the trace file";
    return std::nullopt;
  }
  return t;
}

}  // namespace kdispatch_cli
