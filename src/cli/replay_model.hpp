// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — the model `kdispatch replay` runs: a decoder forward pass of
// a real model's shapes through the ops, its call sites, its weights and its
// activations. The only file of the tool that names the ops it calls; the
// replay driver (replay.cpp) sees call sites (a name, an op of the op list,
// the op's key fields) and counts, times and reports them without knowing
// which ops they are.
//
// The pass follows SGLang/vLLM's Llama/Qwen2 decoder layer:
//   layer 0:  residual = embeddings; h = rmsnorm(residual)           (input_layernorm)
//   layer l:  qkv = gemm(h, Wqkv [+bias])                             (qkv_proj)
//             attn = q columns of qkv  (attention is not an op of ours: not timed)
//             h = gemm(attn, Wo)                                       (o_proj)
//             fused_add_rmsnorm(h, residual)                           (post_attention_layernorm)
//             gu = gemm(h, Wgate_up)                                   (gate_up_proj)
//             act = silu_and_mul(gu): silu(gate) * up                  (act_fn, vLLM's SiluAndMul)
//             h = gemm(act, Wdown)                                     (down_proj)
//             fused_add_rmsnorm(h, residual)    (next layer's input_layernorm, or the final norm)
// One weight buffer per distinct (N, K), shared by every layer (the weights'
// values do not change which kernel runs, and this keeps Llama-3-8B at
// ~0.4 GB); activations are sized for the largest M that will run.
//
// fp8 models (ModelSpec::fp8, Fp8DecoderModel below) run the same layer with
// every projection as an fp8 checkpoint runs it in SGLang (Fp8LinearMethod,
// block-quantised: per_token_group_quant_fp8, then the w8a8 block GEMM):
//   x8, sa = quant_fp8_group(x)                            (<proj>.quant)
//   y = gemm_fp8_block(x8, W8 [N, K] with 128x128 block scales, sa [+bias])  (<proj>)
// and MLA models (DeepSeek-V3) replace qkv_proj with MLA's projections.
//
// Header-only: included by replay.cpp alone (the tool's sources are listed
// in CMakeLists.txt).
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "cli/cli.hpp"
#include "core/numeric.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"

namespace kdispatch_cli::replay {

namespace dsp = dispatch;

// ---------------------------------------------------------------- what the driver sees

/// A non-owning reference to a callable, called before the callee returns
/// (no allocation, unlike std::function).
template <class Sig>
class FnRef;
template <class R, class... A>
class FnRef<R(A...)> {
 public:
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, FnRef> && std::is_invocable_r_v<R, F&, A...>) FnRef(F&& f)
  noexcept  // NOLINT(google-explicit-constructor): a lambda converts
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))), call_([](void* o, A... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...);
        }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

/// A key field of a call site: the op's field name and its value.
struct SiteField {
  std::string_view name;  ///< "N", "K", "hidden", ...
  int64_t value = 0;
};

/// One place in the forward pass where an op is called (qkv_proj, ...),
/// with the op's static key fields (the dtype is the run's unless `dtypes`
/// says otherwise).
struct Site {
  const char* name;                     ///< "qkv_proj"
  int op = 0;                           ///< index into Model::ops()
  std::vector<SiteField> dims;          ///< the op's dim key fields, in file-name order
  std::vector<std::string_view> flags;  ///< the op's flag key fields that are set ("bias")
  std::string dtypes;                   ///< "" (the run's dtype) or "<in>-><out>" ("fp8_e4m3fn->bf16")
};

/// Where the forward pass sends its op calls: `f` runs the call with the
/// options given; the sink times it and books its DispatchInfo. False (and
/// *error set) when the op failed.
class CallSink {
 public:
  using OpCall = FnRef<dsp::Status(const dsp::CallOptions&)>;
  virtual bool call(int site, int64_t M, int64_t layer, OpCall f, std::string* error) = 0;

 protected:
  ~CallSink() = default;
};

// ---------------------------------------------------------------- buffers

/// A 64-byte-aligned host buffer of `count` elements of `dtype` (fp32 or
/// bf16), zeroed unless the caller fills it.
class Buffer {
 public:
  Buffer() = default;
  Buffer(dsp::DType dtype, size_t count, bool zero = true) : dtype_(dtype), count_(count) {
    // Weights of the big models are hundreds of MB: first touch (page
    // faults) dominates their set-up, and 2 MB pages cut it by about a third.
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t raw = count * dsp::dtype_size(dtype);
    const size_t align = raw >= kHuge ? kHuge : 64;
    const size_t bytes = std::max(align, (raw + align - 1) / align * align);
    data_.reset(static_cast<unsigned char*>(std::aligned_alloc(align, bytes)));
    if (!data_) throw std::bad_alloc();
    if (align == kHuge) ::madvise(data_.get(), bytes, MADV_HUGEPAGE);  // a hint: failure is harmless
    if (zero) std::memset(data_.get(), 0, bytes);
  }
  void* data() const { return data_.get(); }
  dsp::DType dtype() const { return dtype_; }
  size_t count() const { return count_; }
  size_t bytes_per_elem() const { return dsp::dtype_size(dtype_); }

  float get(size_t i) const {
    if (dtype_ == dsp::DType::fp32) return reinterpret_cast<const float*>(data_.get())[i];
    return dsp::core::bf16_to_float(reinterpret_cast<const uint16_t*>(data_.get())[i]);
  }
  /// Whether the first `n` elements are finite (no NaN, no inf).
  bool all_finite(size_t n) const {
    for (size_t i = 0; i < n; ++i)
      if (!std::isfinite(get(i))) return false;
    return true;
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  dsp::DType dtype_ = dsp::DType::fp32;
  size_t count_ = 0;
  std::unique_ptr<unsigned char, Free> data_;
};

/// splitmix64: fast, good enough for test data, deterministic per seed.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t s_;
};

inline constexpr uint64_t kFillSeed = 0x6b64697370617463ull;  // "kdispatc"

/// Fills `b` with center + scale * U[-1, 1), 16 bits of randomness per value
/// (four values per draw: Llama-3-8B's 218M weights fill in well under a second).
inline void fill_uniform(Buffer& b, uint64_t stream, float center, float scale) {
  Rng rng(kFillSeed ^ (stream * 0x100000001b3ull));
  const size_t n = b.count();
  const float step = scale / 32768.f, base = center - scale;
  auto fill = [&](auto* p, auto convert) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
      const uint64_t r = rng.next();
      for (int j = 0; j < 4; ++j) p[i + j] = convert(base + step * static_cast<float>((r >> (16 * j)) & 0xffff));
    }
    for (; i < n; ++i) p[i] = convert(base + step * static_cast<float>(rng.next() & 0xffff));
  };
  if (b.dtype() == dsp::DType::fp32)
    fill(static_cast<float*>(b.data()), [](float v) { return v; });
  else
    fill(static_cast<uint16_t*>(b.data()), [](float v) { return dsp::core::float_to_bf16(v); });
}

/// Fills the fp8 e4m3fn buffer `b` with the codes of (r - 128) / 64 for a
/// random byte r: values in [-2, 2), all finite (never 0x7f/0xff, e4m3fn's
/// NaNs), eight values per draw.
inline void fill_fp8_e4m3fn(Buffer& b, uint64_t stream) {
  static const std::array<uint8_t, 256> kCodes = [] {
    std::array<uint8_t, 256> t{};
    for (int r = 0; r < 256; ++r)
      t[static_cast<size_t>(r)] =
          dsp::core::float_to_fp8(static_cast<float>(r - 128) / 64.f, dsp::core::kE4m3fn, /*saturate=*/true);
    return t;
  }();
  Rng rng(kFillSeed ^ (stream * 0x100000001b3ull));
  auto* p = static_cast<uint8_t*>(b.data());
  const size_t n = b.count();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng.next();
    for (int j = 0; j < 8; ++j) p[i + j] = kCodes[(r >> (8 * j)) & 0xff];
  }
  for (; i < n; ++i) p[i] = kCodes[rng.next() & 0xff];
}

// ---------------------------------------------------------------- what the driver runs

/// A model the replay runs: its ops, its call sites, its buffers and its
/// forward pass.
class Model {
 public:
  virtual ~Model() = default;
  /// The ops the model calls, in the order the reports list them.
  virtual std::span<const std::string_view> ops() const = 0;
  /// The call sites, in call order within a layer (Site::op indexes ops()).
  virtual const std::vector<Site>& sites() const = 0;
  /// Allocates and fills the weights and activations (throws std::bad_alloc).
  virtual void init() = 0;
  /// One forward pass with `M` tokens through `layers` layers (0: all of
  /// them), every op call through `sink`. False (and *error set) when an op
  /// fails.
  virtual bool forward(int64_t M, CallSink& sink, std::string* error, int64_t layers) = 0;
  /// The final hidden state of the last forward pass with `M` tokens holds
  /// only finite values.
  virtual bool output_finite(int64_t M) const = 0;
  /// Bytes of weights (and their scales).
  virtual size_t weight_bytes() const = 0;
};

// ---------------------------------------------------------------- the decoder

class DecoderModel final : public Model {
 public:
  /// The ops the model calls, in the order the reports list them.
  static std::span<const std::string_view> op_names() {
    static constexpr std::string_view kOps[] = {"rmsnorm", "fused_add_rmsnorm", "gemm", "silu_and_mul"};
    return kOps;
  }
  std::span<const std::string_view> ops() const override { return op_names(); }

  DecoderModel(dsp::Runtime& rt, const ModelSpec& m, dsp::DType dtype, int64_t max_m)
      : rt_(rt), m_(m), dtype_(dtype), max_m_(max_m) {
    const auto norm = [&](const char* name, OpIdx op) { return Site{name, op, {{"hidden", m.hidden}}, {}}; };
    const auto linear = [&](const char* name, int64_t n, int64_t k, bool bias) {
      return Site{name,
                  kGemm,
                  {{"N", n}, {"K", k}},
                  bias ? std::vector<std::string_view>{"bias"} : std::vector<std::string_view>{}};
    };
    // In call order within a layer (SiteId).
    sites_ = {
        norm("input_layernorm[0]", kRmsNorm),
        linear("qkv_proj", m.qkv_n(), m.qkv_k(), m.qkv_bias),
        linear("o_proj", m.o_n(), m.o_k(), false),
        norm("post_attention_layernorm", kFusedAdd),
        linear("gate_up_proj", m.gate_up_n(), m.gate_up_k(), false),
        Site{"act_fn", kSiluMul, {{"d", m.down_k()}}, {}},
        linear("down_proj", m.down_n(), m.down_k(), false),
        norm("input_layernorm[1:]+final_norm", kFusedAdd),
    };
  }

  const std::vector<Site>& sites() const override { return sites_; }

  /// Allocates and fills the weights and activations (throws std::bad_alloc).
  void init() override {
    // One weight per distinct (N, K), uniform +-1/sqrt(K) so activations stay O(1).
    uint64_t stream = 1;
    for (const Site& s : sites_) {
      if (s.op != kGemm) continue;
      const std::pair<int64_t, int64_t> nk{s.dims[0].value, s.dims[1].value};
      if (weights_.count(nk)) continue;
      Buffer& w = weights_[nk] = Buffer(dtype_, static_cast<size_t>(nk.first * nk.second), /*zero=*/false);
      fill_uniform(w, stream++, 0.f, 1.f / std::sqrt(static_cast<float>(nk.second)));
    }
    if (m_.qkv_bias) {
      qkv_bias_ = Buffer(dtype_, static_cast<size_t>(m_.qkv_n()));
      fill_uniform(qkv_bias_, 100, 0.f, 0.1f);
    }
    norm_w_ = Buffer(dtype_, static_cast<size_t>(m_.hidden));
    fill_uniform(norm_w_, 200, 1.f, 0.1f);
    const auto rows = static_cast<size_t>(max_m_);
    embed_ = Buffer(dtype_, rows * m_.hidden);
    fill_uniform(embed_, 300, 0.f, 1.f);
    residual_ = Buffer(dtype_, rows * m_.hidden);
    h_ = Buffer(dtype_, rows * m_.hidden);
    h2_ = Buffer(dtype_, rows * m_.hidden);
    qkv_ = Buffer(dtype_, rows * m_.qkv_n());
    attn_ = Buffer(dtype_, rows * m_.o_k());
    gate_up_ = Buffer(dtype_, rows * m_.gate_up_n());
    act_ = Buffer(dtype_, rows * m_.down_k());
  }

  /// One forward pass with `M` tokens through `layers` layers (0: all of
  /// them), every op call through `sink`. False (and *error set) when an op
  /// fails.
  bool forward(int64_t M, CallSink& sink, std::string* error, int64_t layers = 0) override {
    std::memcpy(residual_.data(), embed_.data(), static_cast<size_t>(M * m_.hidden) * residual_.bytes_per_elem());
    const Act a = activations(M);
    if (!sink.call(
            kInputNorm0, M, -1,
            [&](const dsp::CallOptions& o) {
              return dsp::rmsnorm(rt_, dsp::RmsNormArgs{a.h, a.residual, a.w_norm, a.eps}, {}, o);
            },
            error))
      return false;
    // The input of qkv_proj: h after layer 0's rmsnorm, then h2 after each
    // layer's closing fused_add_rmsnorm (which normalises h2 in place).
    for (int64_t l = 0, n = layers > 0 ? layers : m_.layers; l < n; ++l)
      if (!layer(a, l == 0 ? a.h : a.h2, l, sink, error)) return false;
    return true;
  }

  /// The final hidden state of the last forward pass with `M` tokens holds
  /// only finite values (a NaN or inf means a kernel computed garbage: the
  /// inputs are bounded by construction).
  bool output_finite(int64_t M) const override { return h2_.all_finite(static_cast<size_t>(M * m_.hidden)); }

  size_t weight_bytes() const override {
    size_t b = 0;
    for (const auto& [nk, w] : weights_) b += w.count() * w.bytes_per_elem();
    return b;
  }

 private:
  enum OpIdx : int { kRmsNorm = 0, kFusedAdd, kGemm, kSiluMul };  // index into ops()
  enum SiteId : int {                                             // index into sites_
    kInputNorm0 = 0,                                              // layer 0's input_layernorm (rmsnorm)
    kQkvProj,
    kOProj,
    kPostAttnNorm,  // fused_add_rmsnorm
    kGateUpProj,
    kActFn,  // silu_and_mul
    kDownProj,
    kNextInputNorm,  // the next layer's input_layernorm, or the final norm (fused_add_rmsnorm)
  };

  // The tensors of one forward pass with M tokens.
  struct Act {
    int64_t M;
    dsp::TensorRef residual, h, h2, qkv, attn, gate_up, act;
    dsp::TensorRef w_norm, w_qkv, w_o, w_gate_up, w_down, bias;
    float eps;
  };
  dsp::TensorRef mat(const Buffer& b, int64_t rows, int64_t cols) const {
    return dsp::make_tensor_2d(b.data(), dtype_, rows, cols, cols);
  }
  Act activations(int64_t M) const {
    Act a{};
    a.M = M;
    a.residual = mat(residual_, M, m_.hidden);
    a.h = mat(h_, M, m_.hidden);    // normed input of qkv / gate_up
    a.h2 = mat(h2_, M, m_.hidden);  // o_proj / down_proj output
    a.qkv = mat(qkv_, M, m_.qkv_n());
    a.attn = mat(attn_, M, m_.o_k());
    a.gate_up = mat(gate_up_, M, m_.gate_up_n());
    a.act = mat(act_, M, m_.down_k());
    a.w_norm = dsp::make_tensor_1d(norm_w_.data(), dtype_, m_.hidden);
    a.w_qkv = mat(weights_.at({m_.qkv_n(), m_.qkv_k()}), m_.qkv_n(), m_.qkv_k());
    a.w_o = mat(weights_.at({m_.o_n(), m_.o_k()}), m_.o_n(), m_.o_k());
    a.w_gate_up = mat(weights_.at({m_.gate_up_n(), m_.gate_up_k()}), m_.gate_up_n(), m_.gate_up_k());
    a.w_down = mat(weights_.at({m_.down_n(), m_.down_k()}), m_.down_n(), m_.down_k());
    if (m_.qkv_bias) a.bias = dsp::make_tensor_1d(qkv_bias_.data(), dtype_, m_.qkv_n());
    a.eps = static_cast<float>(m_.rms_eps);
    return a;
  }

  // Layer l: attention block, then the MLP; `in` is the normed input.
  bool layer(const Act& a, const dsp::TensorRef& in, int64_t l, CallSink& sink, std::string* error) {
    const int64_t M = a.M;
    const auto op = [&](SiteId si, auto&& f) { return sink.call(si, M, l, f, error); };
    if (!op(kQkvProj, [&](const dsp::CallOptions& o) {
          return dsp::gemm(rt_, dsp::GemmArgs{in, a.w_qkv, a.qkv, a.bias}, {}, o);
        }))
      return false;
    fake_attention(M);
    return op(kOProj,
              [&](const dsp::CallOptions& o) {
                return dsp::gemm(rt_, dsp::GemmArgs{a.attn, a.w_o, a.h, {}}, {}, o);
              }) &&
           op(kPostAttnNorm,
              [&](const dsp::CallOptions& o) {
                return dsp::fused_add_rmsnorm(rt_, dsp::FusedAddRmsNormArgs{a.h, a.residual, a.w_norm, a.eps}, {}, o);
              }) &&
           op(kGateUpProj,
              [&](const dsp::CallOptions& o) {
                return dsp::gemm(rt_, dsp::GemmArgs{a.h, a.w_gate_up, a.gate_up, {}}, {}, o);
              }) &&
           op(kActFn,
              [&](const dsp::CallOptions& o) {
                return dsp::silu_and_mul(rt_, dsp::SiluAndMulArgs{a.act, a.gate_up}, {}, o);
              }) &&
           op(kDownProj,
              [&](const dsp::CallOptions& o) {
                return dsp::gemm(rt_, dsp::GemmArgs{a.act, a.w_down, a.h2, {}}, {}, o);
              }) &&
           op(kNextInputNorm, [&](const dsp::CallOptions& o) {
             return dsp::fused_add_rmsnorm(rt_, dsp::FusedAddRmsNormArgs{a.h2, a.residual, a.w_norm, a.eps}, {}, o);
           });
  }

  // Stand-in for attention: its output has the q columns' shape; copy them.
  void fake_attention(int64_t M) {
    const size_t es = qkv_.bytes_per_elem();
    const auto* src = static_cast<const unsigned char*>(qkv_.data());
    auto* dst = static_cast<unsigned char*>(attn_.data());
    for (int64_t t = 0; t < M; ++t)
      std::memcpy(dst + t * m_.o_k() * es, src + t * m_.qkv_n() * es, static_cast<size_t>(m_.o_k()) * es);
  }

  dsp::Runtime& rt_;
  const ModelSpec& m_;
  dsp::DType dtype_;
  int64_t max_m_;
  std::vector<Site> sites_;
  std::map<std::pair<int64_t, int64_t>, Buffer> weights_;
  Buffer qkv_bias_, norm_w_, embed_, residual_, h_, h2_, qkv_, attn_, gate_up_, act_;
};

// ---------------------------------------------------------------- the fp8 decoder

/// The decoder of an fp8 checkpoint (ModelSpec::fp8): SGLang's Llama or
/// DeepSeek-V2/V3 decoder layer with every projection block-fp8, as
/// SGLang's Fp8LinearMethod runs it with weight_block_size [128, 128]:
/// per_token_group_quant_fp8 of the projection's input (quant_fp8_group:
/// an fp8 copy and its 1x128 scales, M-major), then the w8a8 block GEMM
/// (gemm_fp8_block: fp8 weight [N, K] with a scale per 128x128 block,
/// output and bias in the run's dtype). The norms and silu_and_mul stay in
/// the run's dtype. Each projection is two call sites, "<proj>.quant" and
/// "<proj>". SGLang quantises each projection's input itself, so q_a_proj
/// and kv_a_proj_with_mqa (one input) quantise it twice, as there.
///
/// GQA (Llama): the sites of DecoderModel, each projection quant + GEMM.
///
/// MLA (DeepSeek-V3's dense layers: its first 3 of 61), SGLang's
/// DeepseekV2AttentionMLA on its MHA path (forward_normal: kv_b_proj runs as
/// a GEMM; the absorbed decode path folds kv_b_proj into per-head BMMs,
/// which are not block-fp8 GEMMs), unsharded. The (N, K) of each GEMM and
/// SGLang's committed H200 table for it (quantization/N=..,K=..,
/// device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json):
///   q_a_proj            N=1536,  K=7168   N=1536,K=7168  (q_lora_rank x hidden)
///   q_a_layernorm       rmsnorm hidden 1536
///   q_b_proj            N=24576, K=1536   none: SGLang tunes it only sharded,
///                                         N/8 = N=3072,K=1536 (tp 8)
///   kv_a_proj_with_mqa  N=576,   K=7168   N=576,K=7168   (kv_lora_rank + rope)
///   kv_a_layernorm      rmsnorm hidden 512 (the kv latent, made contiguous)
///   kv_b_proj           N=32768, K=512    N=32768,K=512  (128 x (128 + 128))
///   (attention: not an op of ours)
///   o_proj              N=7168,  K=16384  N=7168,K=16384 (hidden x 128 x 128)
///   gate_up_proj        N=36864, K=7168   none: only sharded, N/16 =
///                                         N=2304,K=7168 (tp 16)
///   down_proj           N=7168,  K=18432  N=7168,K=18432
/// (Newer SGLang fuses q_a_proj and kv_a_proj_with_mqa into one
/// fused_qkv_a_proj_with_mqa GEMM, N=2112,K=7168, which has no H200 table;
/// the committed tables are of the two GEMMs this replay runs.)
class Fp8DecoderModel final : public Model {
 public:
  static std::span<const std::string_view> op_names() {
    static constexpr std::string_view kOps[] = {"rmsnorm", "fused_add_rmsnorm", "quant_fp8_group", "gemm_fp8_block",
                                                "silu_and_mul"};
    return kOps;
  }
  std::span<const std::string_view> ops() const override { return op_names(); }

  Fp8DecoderModel(dsp::Runtime& rt, const ModelSpec& m, dsp::DType dtype, int64_t max_m)
      : rt_(rt), m_(m), dtype_(dtype), max_m_(max_m) {
    const std::string run(dsp::dtype_name(dtype));
    const auto norm = [&](const char* name, OpIdx op, int64_t hidden) {
      sites_.push_back(Site{name, op, {{"hidden", hidden}}, {}, {}});
      return static_cast<int>(sites_.size() - 1);
    };
    const auto proj = [&](const char* quant_name, const char* name, int64_t n, int64_t k, bool bias) {
      Proj p;
      p.n = n;
      p.k = k;
      p.bias = bias;
      sites_.push_back(Site{quant_name, kQuant, {{"K", k}}, {}, run + "->fp8_e4m3fn"});
      p.quant_site = static_cast<int>(sites_.size() - 1);
      sites_.push_back(Site{name,
                            kGemm,
                            {{"N", n}, {"K", k}},
                            bias ? std::vector<std::string_view>{"bias"} : std::vector<std::string_view>{},
                            "fp8_e4m3fn->" + run});
      p.gemm_site = static_cast<int>(sites_.size() - 1);
      return p;
    };
    // In call order within a layer.
    input_norm0_ = norm("input_layernorm[0]", kRmsNorm, m.hidden);
    if (!m.mla) {
      qkv_ = proj("qkv_proj.quant", "qkv_proj", m.qkv_n(), m.qkv_k(), m.qkv_bias);
    } else {
      q_a_ = proj("q_a_proj.quant", "q_a_proj", m.q_a_n(), m.hidden, false);
      q_a_norm_ = norm("q_a_layernorm", kRmsNorm, m.mla->q_lora_rank);
      q_b_ = proj("q_b_proj.quant", "q_b_proj", m.q_b_n(), m.mla->q_lora_rank, false);
      kv_a_ = proj("kv_a_proj_with_mqa.quant", "kv_a_proj_with_mqa", m.kv_a_n(), m.hidden, false);
      kv_a_norm_ = norm("kv_a_layernorm", kRmsNorm, m.mla->kv_lora_rank);
      kv_b_ = proj("kv_b_proj.quant", "kv_b_proj", m.kv_b_n(), m.mla->kv_lora_rank, false);
    }
    o_ = proj("o_proj.quant", "o_proj", m.o_n(), m.o_k(), false);
    post_attn_norm_ = norm("post_attention_layernorm", kFusedAdd, m.hidden);
    gate_up_ = proj("gate_up_proj.quant", "gate_up_proj", m.gate_up_n(), m.gate_up_k(), false);
    sites_.push_back(Site{"act_fn", kSiluMul, {{"d", m.down_k()}}, {}, {}});
    act_fn_ = static_cast<int>(sites_.size() - 1);
    down_ = proj("down_proj.quant", "down_proj", m.down_n(), m.down_k(), false);
    next_norm_ = norm("input_layernorm[1:]+final_norm", kFusedAdd, m.hidden);
  }

  const std::vector<Site>& sites() const override { return sites_; }

  void init() override {
    // One fp8 weight per distinct (N, K): codes of values in [-2, 2) (rms
    // ~1.15) times a scale per 128x128 block of 0.5/sqrt(K) +-25%, so the
    // dequantised weights are about the bf16 model's +-1/sqrt(K) uniform
    // and activations stay O(1).
    uint64_t stream = 1;
    int64_t max_k = 1;
    for (const Proj* p : projections()) {
      max_k = std::max(max_k, p->k);
      const std::pair<int64_t, int64_t> nk{p->n, p->k};
      if (p->bias && !biases_.count(p->n)) {
        Buffer& b = biases_[p->n] = Buffer(dtype_, static_cast<size_t>(p->n));
        fill_uniform(b, 100, 0.f, 0.1f);
      }
      if (weights_.count(nk)) continue;
      Fp8Weight& w = weights_[nk];
      w.w = Buffer(dsp::DType::fp8_e4m3fn, static_cast<size_t>(p->n * p->k), /*zero=*/false);
      fill_fp8_e4m3fn(w.w, stream);
      w.scale = Buffer(dsp::DType::fp32, static_cast<size_t>(blocks(p->n) * blocks(p->k)));
      const float base = 0.5f / std::sqrt(static_cast<float>(p->k));
      fill_uniform(w.scale, 1000 + stream, base, 0.25f * base);
      ++stream;
    }
    // A norm weight per width (hidden; MLA's q and kv latents).
    uint64_t norm_stream = 200;
    for (const Site& s : sites_) {
      if (s.op != kRmsNorm && s.op != kFusedAdd) continue;
      const int64_t hidden = s.dims[0].value;
      if (norm_w_.count(hidden)) continue;
      Buffer& w = norm_w_[hidden] = Buffer(dtype_, static_cast<size_t>(hidden));
      fill_uniform(w, norm_stream++, 1.f, 0.1f);
    }
    const auto rows = static_cast<size_t>(max_m_);
    const auto act = [&](int64_t cols) { return Buffer(dtype_, rows * static_cast<size_t>(cols)); };
    embed_ = act(m_.hidden);
    fill_uniform(embed_, 300, 0.f, 1.f);
    residual_ = act(m_.hidden);
    h_ = act(m_.hidden);
    h2_ = act(m_.hidden);
    if (!m_.mla) {
      qkv_out_ = act(m_.qkv_n());
    } else {
      q_a_out_ = act(m_.q_a_n());
      q_out_ = act(m_.q_b_n());
      kv_a_out_ = act(m_.kv_a_n());
      kv_latent_ = act(m_.mla->kv_lora_rank);
      kv_out_ = act(m_.kv_b_n());
    }
    attn_ = act(m_.o_k());
    gate_up_out_ = act(m_.gate_up_n());
    act_out_ = act(m_.down_k());
    // The quantised input of the projection being run, and its scales
    // [ceil(K/128), M] (one pair: each is read right after it is written).
    xq_ = Buffer(dsp::DType::fp8_e4m3fn, rows * static_cast<size_t>(max_k));
    sa_ = Buffer(dsp::DType::fp32, rows * static_cast<size_t>(blocks(max_k)));
  }

  bool forward(int64_t M, CallSink& sink, std::string* error, int64_t layers = 0) override {
    std::memcpy(residual_.data(), embed_.data(), static_cast<size_t>(M * m_.hidden) * residual_.bytes_per_elem());
    const dsp::TensorRef residual = mat(residual_, M, m_.hidden), h = mat(h_, M, m_.hidden);
    const dsp::TensorRef w = norm_weight(m_.hidden);
    const float eps = static_cast<float>(m_.rms_eps);
    if (!sink.call(
            input_norm0_, M, -1,
            [&](const dsp::CallOptions& o) {
              return dsp::rmsnorm(rt_, dsp::RmsNormArgs{h, residual, w, eps}, {}, o);
            },
            error))
      return false;
    for (int64_t l = 0, n = layers > 0 ? layers : m_.layers; l < n; ++l)
      if (!layer(M, l == 0 ? h_ : h2_, l, sink, error)) return false;
    return true;
  }

  bool output_finite(int64_t M) const override { return h2_.all_finite(static_cast<size_t>(M * m_.hidden)); }

  size_t weight_bytes() const override {
    size_t b = 0;
    for (const auto& [nk, w] : weights_) b += w.w.count() + w.scale.count() * w.scale.bytes_per_elem();
    for (const auto& [n, bias] : biases_) b += bias.count() * bias.bytes_per_elem();
    return b;
  }

 private:
  enum OpIdx : int { kRmsNorm = 0, kFusedAdd, kQuant, kGemm, kSiluMul };  // index into ops()

  // A projection: its two sites and its weight's (N, K).
  struct Proj {
    int quant_site = -1, gemm_site = -1;
    int64_t n = 0, k = 0;
    bool bias = false;
  };
  struct Fp8Weight {
    Buffer w;      // [N, K] fp8_e4m3fn
    Buffer scale;  // [ceil(N/128), ceil(K/128)] fp32
  };

  static int64_t blocks(int64_t n) { return (n + 127) / 128; }

  std::vector<const Proj*> projections() const {
    std::vector<const Proj*> out;
    for (const Proj* p : {&qkv_, &q_a_, &q_b_, &kv_a_, &kv_b_, &o_, &gate_up_, &down_})
      if (p->gemm_site >= 0) out.push_back(p);
    return out;
  }

  dsp::TensorRef mat(const Buffer& b, int64_t rows, int64_t cols) const {
    return dsp::make_tensor_2d(b.data(), dtype_, rows, cols, cols);
  }
  dsp::TensorRef norm_weight(int64_t hidden) const {
    return dsp::make_tensor_1d(norm_w_.at(hidden).data(), dtype_, hidden);
  }

  // <proj>.quant then <proj>: out[M, N] = gemm_fp8_block(quant_fp8_group(in[M, K])).
  bool project(const Proj& p, const Buffer& in, const Buffer& out, int64_t M, int64_t l, CallSink& sink,
               std::string* error) {
    const dsp::TensorRef x = mat(in, M, p.k), d = mat(out, M, p.n);
    const dsp::TensorRef q = dsp::make_tensor_2d(xq_.data(), dsp::DType::fp8_e4m3fn, M, p.k, p.k);
    const dsp::TensorRef sa = dsp::make_tensor_2d(sa_.data(), dsp::DType::fp32, blocks(p.k), M, M);
    const Fp8Weight& w = weights_.at({p.n, p.k});
    const dsp::TensorRef b = dsp::make_tensor_2d(w.w.data(), dsp::DType::fp8_e4m3fn, p.n, p.k, p.k);
    const dsp::TensorRef sb =
        dsp::make_tensor_2d(w.scale.data(), dsp::DType::fp32, blocks(p.n), blocks(p.k), blocks(p.k));
    const dsp::TensorRef bias = p.bias ? dsp::make_tensor_1d(biases_.at(p.n).data(), dtype_, p.n) : dsp::TensorRef{};
    return sink.call(
               p.quant_site, M, l,
               [&](const dsp::CallOptions& o) {
                 return dsp::quant_fp8_group(rt_, dsp::QuantFp8GroupArgs{{q, x, sa}}, {}, o);
               },
               error) &&
           sink.call(
               p.gemm_site, M, l,
               [&](const dsp::CallOptions& o) {
                 return dsp::gemm_fp8_block(rt_, dsp::GemmFp8BlockArgs{{q, b, d, sa, sb, bias}}, {}, o);
               },
               error);
  }

  bool norm(int site, const Buffer& x, int64_t hidden, int64_t M, int64_t l, CallSink& sink, std::string* error) {
    const dsp::TensorRef t = mat(x, M, hidden), w = norm_weight(hidden);
    const float eps = static_cast<float>(m_.rms_eps);
    return sink.call(
        site, M, l,
        [&](const dsp::CallOptions& o) {
          return dsp::rmsnorm(rt_, dsp::RmsNormArgs{t, t, w, eps}, {}, o);  // in place
        },
        error);
  }

  bool add_norm(int site, const Buffer& x, int64_t M, int64_t l, CallSink& sink, std::string* error) {
    const dsp::TensorRef t = mat(x, M, m_.hidden), r = mat(residual_, M, m_.hidden), w = norm_weight(m_.hidden);
    const float eps = static_cast<float>(m_.rms_eps);
    return sink.call(
        site, M, l,
        [&](const dsp::CallOptions& o) {
          return dsp::fused_add_rmsnorm(rt_, dsp::FusedAddRmsNormArgs{t, r, w, eps}, {}, o);
        },
        error);
  }

  // Layer l: attention block, then the MLP; `in` holds the normed input.
  bool layer(int64_t M, const Buffer& in, int64_t l, CallSink& sink, std::string* error) {
    if (!m_.mla) {
      if (!project(qkv_, in, qkv_out_, M, l, sink, error)) return false;
      copy_columns(qkv_out_, m_.qkv_n(), attn_, m_.o_k(), M);  // attention stand-in: q's columns
    } else {
      if (!project(q_a_, in, q_a_out_, M, l, sink, error) ||
          !norm(q_a_norm_, q_a_out_, m_.mla->q_lora_rank, M, l, sink, error) ||
          !project(q_b_, q_a_out_, q_out_, M, l, sink, error) || !project(kv_a_, in, kv_a_out_, M, l, sink, error))
        return false;
      // The kv latent: kv_a's first kv_lora_rank columns (the rest is the
      // rope key), made contiguous as SGLang does before kv_a_layernorm.
      copy_columns(kv_a_out_, m_.kv_a_n(), kv_latent_, m_.mla->kv_lora_rank, M);
      if (!norm(kv_a_norm_, kv_latent_, m_.mla->kv_lora_rank, M, l, sink, error) ||
          !project(kv_b_, kv_latent_, kv_out_, M, l, sink, error))
        return false;
      copy_columns(q_out_, m_.q_b_n(), attn_, m_.o_k(), M);  // attention stand-in: q's columns
    }
    const dsp::TensorRef act = mat(act_out_, M, m_.down_k()), gu = mat(gate_up_out_, M, m_.gate_up_n());
    return project(o_, attn_, h_, M, l, sink, error) && add_norm(post_attn_norm_, h_, M, l, sink, error) &&
           project(gate_up_, h_, gate_up_out_, M, l, sink, error) &&
           sink.call(
               act_fn_, M, l,
               [&](const dsp::CallOptions& o) {
                 return dsp::silu_and_mul(rt_, dsp::SiluAndMulArgs{act, gu}, {}, o);
               },
               error) &&
           project(down_, act_out_, h2_, M, l, sink, error) && add_norm(next_norm_, h2_, M, l, sink, error);
  }

  // The first `cols` columns of src [M, src_cols] into dst [M, cols] (not an op: not timed).
  void copy_columns(const Buffer& src, int64_t src_cols, const Buffer& dst, int64_t cols, int64_t M) const {
    const size_t es = src.bytes_per_elem();
    const auto* s = static_cast<const unsigned char*>(src.data());
    auto* d = static_cast<unsigned char*>(dst.data());
    for (int64_t t = 0; t < M; ++t)
      std::memcpy(d + t * cols * es, s + t * src_cols * es, static_cast<size_t>(cols) * es);
  }

  dsp::Runtime& rt_;
  const ModelSpec& m_;
  dsp::DType dtype_;
  int64_t max_m_;
  std::vector<Site> sites_;
  int input_norm0_ = -1, q_a_norm_ = -1, kv_a_norm_ = -1, post_attn_norm_ = -1, act_fn_ = -1, next_norm_ = -1;
  Proj qkv_, q_a_, q_b_, kv_a_, kv_b_, o_, gate_up_, down_;
  std::map<std::pair<int64_t, int64_t>, Fp8Weight> weights_;
  std::map<int64_t, Buffer> biases_;  // by N
  std::map<int64_t, Buffer> norm_w_;  // by hidden
  Buffer embed_, residual_, h_, h2_, qkv_out_, q_a_out_, q_out_, kv_a_out_, kv_latent_, kv_out_, attn_, gate_up_out_,
      act_out_, xq_, sa_;
};

// ---------------------------------------------------------------- the models

/// The model `m` runs as: the bf16/fp32 decoder, or its fp8 flavour.
inline std::unique_ptr<Model> make_model(dsp::Runtime& rt, const ModelSpec& m, dsp::DType dtype, int64_t max_m) {
  if (m.fp8) return std::make_unique<Fp8DecoderModel>(rt, m, dtype, max_m);
  return std::make_unique<DecoderModel>(rt, m, dtype, max_m);
}

/// Every op some model calls, first mention first (the help texts).
inline std::vector<std::string_view> all_ops() {
  std::vector<std::string_view> out;
  for (auto ops : {DecoderModel::op_names(), Fp8DecoderModel::op_names()})
    for (std::string_view op : ops)
      if (std::find(out.begin(), out.end(), op) == out.end()) out.push_back(op);
  return out;
}

}  // namespace kdispatch_cli::replay
