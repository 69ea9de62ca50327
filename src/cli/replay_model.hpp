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
// Header-only: included by replay.cpp alone (the tool's sources are listed
// in CMakeLists.txt).
#pragma once

#include <sys/mman.h>

#include <algorithm>
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
    requires(!std::is_same_v<std::remove_cvref_t<F>, FnRef> && std::is_invocable_r_v<R, F&, A...>)
  FnRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): a lambda converts
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, A... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...); }) {}
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
/// with the op's static key fields (the dtype is the run's).
struct Site {
  const char* name;                     ///< "qkv_proj"
  int op = 0;                           ///< index into DecoderModel::ops()
  std::vector<SiteField> dims;          ///< the op's dim key fields, in file-name order
  std::vector<std::string_view> flags;  ///< the op's flag key fields that are set ("bias")
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

/// Fills `b` with center + scale * U[-1, 1), 16 bits of randomness per value
/// (four values per draw: Llama-3-8B's 218M weights fill in well under a second).
inline void fill_uniform(Buffer& b, uint64_t stream, float center, float scale) {
  constexpr uint64_t kSeed = 0x6b64697370617463ull;  // "kdispatc"
  Rng rng(kSeed ^ (stream * 0x100000001b3ull));
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

// ---------------------------------------------------------------- the decoder

class DecoderModel {
 public:
  /// The ops the model calls, in the order the reports list them.
  static std::span<const std::string_view> ops() {
    static constexpr std::string_view kOps[] = {"rmsnorm", "fused_add_rmsnorm", "gemm", "silu_and_mul"};
    return kOps;
  }

  DecoderModel(dsp::Runtime& rt, const ModelSpec& m, dsp::DType dtype, int64_t max_m)
      : rt_(rt), m_(m), dtype_(dtype), max_m_(max_m) {
    const auto norm = [&](const char* name, OpIdx op) { return Site{name, op, {{"hidden", m.hidden}}, {}}; };
    const auto linear = [&](const char* name, int64_t n, int64_t k, bool bias) {
      return Site{name, kGemm, {{"N", n}, {"K", k}}, bias ? std::vector<std::string_view>{"bias"}
                                                          : std::vector<std::string_view>{}};
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

  const std::vector<Site>& sites() const { return sites_; }

  /// Allocates and fills the weights and activations (throws std::bad_alloc).
  void init() {
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
  bool forward(int64_t M, CallSink& sink, std::string* error, int64_t layers = 0) {
    std::memcpy(residual_.data(), embed_.data(), static_cast<size_t>(M * m_.hidden) * residual_.bytes_per_elem());
    const Act a = activations(M);
    if (!sink.call(kInputNorm0, M, -1, [&](const dsp::CallOptions& o) {
          return dsp::rmsnorm(rt_, dsp::RmsNormArgs{a.h, a.residual, a.w_norm, a.eps}, {}, o);
        }, error))
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
  bool output_finite(int64_t M) const {
    for (size_t i = 0, n = static_cast<size_t>(M * m_.hidden); i < n; ++i)
      if (!std::isfinite(h2_.get(i))) return false;
    return true;
  }

  size_t weight_bytes() const {
    size_t b = 0;
    for (const auto& [nk, w] : weights_) b += w.count() * w.bytes_per_elem();
    return b;
  }

 private:
  enum OpIdx : int { kRmsNorm = 0, kFusedAdd, kGemm, kSiluMul };  // index into ops()
  enum SiteId : int {  // index into sites_
    kInputNorm0 = 0,   // layer 0's input_layernorm (rmsnorm)
    kQkvProj,
    kOProj,
    kPostAttnNorm,     // fused_add_rmsnorm
    kGateUpProj,
    kActFn,            // silu_and_mul
    kDownProj,
    kNextInputNorm,    // the next layer's input_layernorm, or the final norm (fused_add_rmsnorm)
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
    return op(kOProj, [&](const dsp::CallOptions& o) {
             return dsp::gemm(rt_, dsp::GemmArgs{a.attn, a.w_o, a.h, {}}, {}, o);
           }) &&
           op(kPostAttnNorm, [&](const dsp::CallOptions& o) {
             return dsp::fused_add_rmsnorm(rt_, dsp::FusedAddRmsNormArgs{a.h, a.residual, a.w_norm, a.eps}, {}, o);
           }) &&
           op(kGateUpProj, [&](const dsp::CallOptions& o) {
             return dsp::gemm(rt_, dsp::GemmArgs{a.h, a.w_gate_up, a.gate_up, {}}, {}, o);
           }) &&
           op(kActFn, [&](const dsp::CallOptions& o) {
             return dsp::silu_and_mul(rt_, dsp::SiluAndMulArgs{a.act, a.gate_up}, {}, o);
           }) &&
           op(kDownProj, [&](const dsp::CallOptions& o) {
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

}  // namespace kdispatch_cli::replay
