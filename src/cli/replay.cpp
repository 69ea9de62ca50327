// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch replay`: a decoder forward pass of a real model's
// shapes through dispatch::rmsnorm / fused_add_rmsnorm / gemm on the CPU, one
// pass per trace entry (M = tokens of that pass), recording for every call
// where its plan came from (DispatchInfo) and how long it took.
//
// The pass follows SGLang/vLLM's Llama/Qwen2 decoder layer:
//   layer 0:  residual = embeddings; h = rmsnorm(residual)           (input_layernorm)
//   layer l:  qkv = gemm(h, Wqkv [+bias])                             (qkv_proj)
//             attn = q columns of qkv  (attention is not an op of ours: not timed)
//             h = gemm(attn, Wo)                                       (o_proj)
//             fused_add_rmsnorm(h, residual)                           (post_attention_layernorm)
//             gu = gemm(h, Wgate_up)                                   (gate_up_proj)
//             act = silu(gate) * up  (not an op of ours: not timed)
//             h = gemm(act, Wdown)                                     (down_proj)
//             fused_add_rmsnorm(h, residual)    (next layer's input_layernorm, or the final norm)
// One weight buffer per distinct (N, K), shared by every layer (the weights'
// values do not change which kernel runs, and this keeps Llama-3-8B at
// ~0.4 GB); activations are sized for the largest M that will run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include <sys/mman.h>

#include "cli/cli.hpp"
#include "core/json_write.hpp"
#include "core/numeric.hpp"
#include "dispatch/device.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"

namespace kdispatch_cli {
namespace {

namespace dsp = dispatch;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- buffers

// A 64-byte-aligned host buffer of `count` elements of `dtype` (fp32 or bf16),
// zeroed unless the caller fills it.
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
  void set(size_t i, float v) {
    if (dtype_ == dsp::DType::fp32)
      reinterpret_cast<float*>(data_.get())[i] = v;
    else
      reinterpret_cast<uint16_t*>(data_.get())[i] = dsp::core::float_to_bf16(v);
  }

 private:
  struct Free {
    void operator()(unsigned char* p) const { std::free(p); }
  };
  dsp::DType dtype_ = dsp::DType::fp32;
  size_t count_ = 0;
  std::unique_ptr<unsigned char, Free> data_;
};

// splitmix64: fast, good enough for test data, deterministic per seed.
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

constexpr uint64_t kSeed = 0x6b64697370617463ull;  // "kdispatc"

// Fills `b` with center + scale * U[-1, 1), 16 bits of randomness per value
// (four values per draw: Llama-3-8B's 218M weights fill in well under a second).
void fill_uniform(Buffer& b, uint64_t stream, float center, float scale) {
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

// ---------------------------------------------------------------- statistics

enum OpIdx : int { kRmsNorm = 0, kFusedAdd = 1, kGemm = 2, kOps = 3 };
constexpr const char* kOpNames[kOps] = {"rmsnorm", "fused_add_rmsnorm", "gemm"};

struct OpStats {
  int64_t calls = 0, hits = 0, defaults = 0, forced = 0, tuned = 0;
  double seconds = 0;
  std::map<uint32_t, int64_t> by_source;          // source_id -> table hits
  std::map<std::string_view, int64_t> by_variant;  // variant name (static storage) -> calls
};

// One place in the layer where an op is called (qkv_proj, ...), with its shape.
struct Site {
  const char* name;
  OpIdx op;
  int64_t n = 0, k = 0;  // gemm N, K; norms: n = hidden
  bool bias = false;
  int64_t calls = 0;
  double seconds = 0;
};

// The sites of a forward pass, in call order within a layer (index into sites_).
enum SiteId : int {
  kInputNorm0 = 0,   // layer 0's input_layernorm (rmsnorm)
  kQkvProj,
  kOProj,
  kPostAttnNorm,     // fused_add_rmsnorm
  kGateUpProj,
  kDownProj,
  kNextInputNorm,    // the next layer's input_layernorm, or the final norm (fused_add_rmsnorm)
};

// ---------------------------------------------------------------- the replay

class Replay {
 public:
  Replay(dsp::Runtime& rt, const ModelSpec& m, dsp::DType dtype, int64_t max_m)
      : rt_(rt), m_(m), dtype_(dtype), max_m_(max_m) {
    sites_ = {
        {"input_layernorm[0]", kRmsNorm, m.hidden},
        {"qkv_proj", kGemm, m.qkv_n(), m.qkv_k(), m.qkv_bias},
        {"o_proj", kGemm, m.o_n(), m.o_k()},
        {"post_attention_layernorm", kFusedAdd, m.hidden},
        {"gate_up_proj", kGemm, m.gate_up_n(), m.gate_up_k()},
        {"down_proj", kGemm, m.down_n(), m.down_k()},
        {"input_layernorm[1:]+final_norm", kFusedAdd, m.hidden},
    };
  }

  void init() {
    // One weight per distinct (N, K), uniform +-1/sqrt(K) so activations stay O(1).
    uint64_t stream = 1;
    for (const Site& s : sites_) {
      if (s.op != kGemm || weights_.count({s.n, s.k})) continue;
      Buffer& w = weights_[{s.n, s.k}] = Buffer(dtype_, static_cast<size_t>(s.n * s.k), /*zero=*/false);
      fill_uniform(w, stream++, 0.f, 1.f / std::sqrt(static_cast<float>(s.k)));
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

  // One forward pass with `M` tokens. Returns false (and sets *error) when an op fails.
  bool forward(int64_t M, std::string* error) {
    const dsp::DType dt = dtype_;
    auto mat = [&](const Buffer& b, int64_t rows, int64_t cols) {
      return dsp::make_tensor_2d(b.data(), dt, rows, cols, cols);
    };
    std::memcpy(residual_.data(), embed_.data(), static_cast<size_t>(M * m_.hidden) * residual_.bytes_per_elem());

    const dsp::TensorRef w_norm = dsp::make_tensor_1d(norm_w_.data(), dt, m_.hidden);
    const auto eps = static_cast<float>(m_.rms_eps);
    const dsp::TensorRef residual = mat(residual_, M, m_.hidden);
    const dsp::TensorRef h = mat(h_, M, m_.hidden);    // normed input of qkv / gate_up
    const dsp::TensorRef h2 = mat(h2_, M, m_.hidden);  // o_proj / down_proj output

    if (!call(kInputNorm0, M, -1, error, [&](const dsp::CallOptions& o) {
          return dsp::rmsnorm(rt_, dsp::RmsNormArgs{h, residual, w_norm, eps}, {}, o);
        }))
      return false;
    const Buffer& w_qkv = weights_.at({m_.qkv_n(), m_.qkv_k()});
    const Buffer& w_o = weights_.at({m_.o_n(), m_.o_k()});
    const Buffer& w_gu = weights_.at({m_.gate_up_n(), m_.gate_up_k()});
    const Buffer& w_down = weights_.at({m_.down_n(), m_.down_k()});
    dsp::TensorRef bias{};
    if (m_.qkv_bias) bias = dsp::make_tensor_1d(qkv_bias_.data(), dt, m_.qkv_n());

    // The input of qkv_proj: h after layer 0's rmsnorm, then h2 after each
    // layer's closing fused_add_rmsnorm (which normalises h2 in place).
    dsp::TensorRef layer_in = h;
    const int64_t layers = layers_override_ > 0 ? layers_override_ : m_.layers;
    for (int64_t l = 0; l < layers; ++l) {
      const dsp::TensorRef qkv = mat(qkv_, M, m_.qkv_n());
      if (!call(kQkvProj, M, l, error, [&](const dsp::CallOptions& o) {
            return dsp::gemm(rt_, dsp::GemmArgs{layer_in, mat(w_qkv, m_.qkv_n(), m_.qkv_k()), qkv, bias}, {}, o);
          }))
        return false;
      fake_attention(M);
      if (!call(kOProj, M, l, error, [&](const dsp::CallOptions& o) {
            return dsp::gemm(rt_, dsp::GemmArgs{mat(attn_, M, m_.o_k()), mat(w_o, m_.o_n(), m_.o_k()), h, {}}, {}, o);
          }))
        return false;
      if (!call(kPostAttnNorm, M, l, error, [&](const dsp::CallOptions& o) {
            return dsp::fused_add_rmsnorm(rt_, dsp::FusedAddRmsNormArgs{h, residual, w_norm, eps}, {}, o);
          }))
        return false;
      if (!call(kGateUpProj, M, l, error, [&](const dsp::CallOptions& o) {
            return dsp::gemm(rt_,
                             dsp::GemmArgs{h, mat(w_gu, m_.gate_up_n(), m_.gate_up_k()),
                                           mat(gate_up_, M, m_.gate_up_n()), {}},
                             {}, o);
          }))
        return false;
      silu_and_mul(M);
      if (!call(kDownProj, M, l, error, [&](const dsp::CallOptions& o) {
            return dsp::gemm(rt_,
                             dsp::GemmArgs{mat(act_, M, m_.down_k()), mat(w_down, m_.down_n(), m_.down_k()), h2, {}},
                             {}, o);
          }))
        return false;
      if (!call(kNextInputNorm, M, l, error, [&](const dsp::CallOptions& o) {
            return dsp::fused_add_rmsnorm(rt_, dsp::FusedAddRmsNormArgs{h2, residual, w_norm, eps}, {}, o);
          }))
        return false;
      layer_in = h2;
    }
    // The final hidden state should be finite: a NaN or inf here means a
    // kernel computed garbage (the inputs are bounded by construction).
    for (size_t i = 0, n = static_cast<size_t>(M * m_.hidden); i < n && counting_; ++i) {
      if (!std::isfinite(h2_.get(i))) {
        non_finite_steps_++;
        break;
      }
    }
    return true;
  }

  // One uncounted forward pass at M = 1 through the first layer only: the
  // library's one-time costs (thread registration in the table's epoch
  // domain, ISA probes, first touch of the kernels) stay out of the
  // per-call numbers. Returns false (and sets *error) when an op fails.
  bool warm_up(std::string* error) {
    counting_ = false;
    layers_override_ = 1;
    const bool ok = forward(1, error);
    layers_override_ = 0;
    counting_ = true;
    return ok;
  }

  const OpStats& stats(int op) const { return ops_[op]; }
  /// Forward passes whose final hidden state held a NaN or inf.
  int64_t non_finite_steps() const { return non_finite_steps_; }
  const std::vector<Site>& sites() const { return sites_; }
  size_t weight_bytes() const {
    size_t b = 0;
    for (const auto& [nk, w] : weights_) b += w.count() * w.bytes_per_elem();
    return b;
  }

 private:
  // Times one op call at site `si` and books its DispatchInfo.
  template <class F>
  bool call(SiteId si, int64_t M, int64_t layer, std::string* error, F&& f) {
    Site& site = sites_[si];
    OpStats& st = ops_[site.op];
    dsp::DispatchInfo info;
    dsp::CallOptions opts;
    opts.info = &info;
    const auto t0 = Clock::now();
    const dsp::Status s = f(opts);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!s.ok()) {
      *error = std::string(kOpNames[site.op]) + " failed at " + site.name +
               (layer >= 0 ? " (layer " + std::to_string(layer) + ")" : std::string()) + ", shape " +
               shape_text(site, M) + ": " + s.to_string();
      return false;
    }
    if (!counting_) return true;
    site.calls++;
    site.seconds += dt;
    st.calls++;
    st.seconds += dt;
    switch (info.source) {
      case dsp::PlanSource::table:
        st.hits++;
        st.by_source[info.source_id]++;
        break;
      case dsp::PlanSource::fallback: st.defaults++; break;
      case dsp::PlanSource::forced: st.forced++; break;
    }
    st.by_variant[info.variant ? std::string_view(info.variant) : std::string_view()]++;
    return true;
  }

  std::string shape_text(const Site& s, int64_t M) const {
    const std::string dt(dsp::dtype_name(dtype_));
    if (s.op == kGemm)
      return "M=" + std::to_string(M) + ", N=" + std::to_string(s.n) + ", K=" + std::to_string(s.k) + ", " + dt +
             (s.bias ? ", bias" : "");
    return "tokens=" + std::to_string(M) + ", hidden=" + std::to_string(s.n) + ", " + dt;
  }

  // Stand-in for attention: its output has the q columns' shape; copy them.
  void fake_attention(int64_t M) {
    const size_t es = qkv_.bytes_per_elem();
    const auto* src = static_cast<const unsigned char*>(qkv_.data());
    auto* dst = static_cast<unsigned char*>(attn_.data());
    for (int64_t t = 0; t < M; ++t)
      std::memcpy(dst + t * m_.o_k() * es, src + t * m_.qkv_n() * es, static_cast<size_t>(m_.o_k()) * es);
  }

  // SiluAndMul as the engines fuse it: act = silu(gate) * up, gate_up = [gate | up].
  void silu_and_mul(int64_t M) {
    const int64_t I = m_.down_k(), GU = m_.gate_up_n();
    for (int64_t t = 0; t < M; ++t) {
      for (int64_t j = 0; j < I; ++j) {
        const float g = gate_up_.get(t * GU + j), u = gate_up_.get(t * GU + I + j);
        act_.set(t * I + j, g / (1.f + std::exp(-g)) * u);
      }
    }
  }

  dsp::Runtime& rt_;
  const ModelSpec& m_;
  dsp::DType dtype_;
  int64_t max_m_;
  std::vector<Site> sites_;
  OpStats ops_[kOps];
  bool counting_ = true;
  int64_t non_finite_steps_ = 0;
  int64_t layers_override_ = 0;  // > 0: run only this many layers (warm-up)
  std::map<std::pair<int64_t, int64_t>, Buffer> weights_;
  Buffer qkv_bias_, norm_w_, embed_, residual_, h_, h2_, qkv_, attn_, gate_up_, act_;
};

// ---------------------------------------------------------------- output

double round3(double v) { return std::round(v * 1000.0) / 1000.0; }
double us_per_call(double seconds, int64_t calls) { return calls > 0 ? seconds * 1e6 / calls : 0.0; }

struct RunInfo {
  const ModelSpec* model;
  const Trace* trace;
  int64_t steps;
  int64_t max_m;
  dsp::DType dtype;
  double init_s, warmup_s, run_s;
  size_t weight_bytes;
  dsp::LoadReport report;
  std::vector<std::string> config_dirs;
};

// Table hits per config file (its config dir / path relative to the dir).
std::map<std::string, int64_t> hits_by_file(const dsp::Runtime& rt, const OpStats& s) {
  std::map<std::string, int64_t> out;
  for (const auto& [id, n] : s.by_source) {
    std::string p = rt.source_path(id);
    if (!p.empty()) p = rt.source_dir(id) + "/" + p;
    out[p.empty() ? "source #" + std::to_string(id) : std::move(p)] += n;
  }
  return out;
}

void print_json(const dsp::Runtime& rt, const Replay& r, const RunInfo& ri) {
  using dsp::core::json_append_double;
  using dsp::core::json_append_int;
  using dsp::core::json_append_string;
  const dsp::DeviceInfo& dev = dsp::cpu_device_info();
  std::string o = "{\"backend\": \"cpu\", \"device_name\": ";
  json_append_string(o, dev.device_name);
  o += ", \"model\": ";
  json_append_string(o, ri.model->name);
  o += ", \"trace\": ";
  json_append_string(o, ri.trace->name);
  o += ", \"steps\": ";
  json_append_int(o, ri.steps);
  o += ", \"dtype\": ";
  json_append_string(o, dsp::dtype_name(ri.dtype));
  o += ", \"max_m\": ";
  json_append_int(o, ri.max_m);
  o += ", \"ops\": {";
  for (int op = 0; op < kOps; ++op) {
    const OpStats& s = r.stats(op);
    if (op) o += ", ";
    json_append_string(o, kOpNames[op]);
    o += ": {\"calls\": ";
    json_append_int(o, s.calls);
    o += ", \"hits\": ";
    json_append_int(o, s.hits);
    o += ", \"defaults\": ";
    json_append_int(o, s.defaults);
    o += ", \"tuned\": ";
    json_append_int(o, s.tuned);
    o += ", \"forced\": ";
    json_append_int(o, s.forced);
    o += ", \"us_per_call\": ";
    json_append_double(o, round3(us_per_call(s.seconds, s.calls)));
    o += ", \"sources\": {";
    bool first = true;
    for (const auto& [file, n] : hits_by_file(rt, s)) {
      if (!first) o += ", ";
      first = false;
      json_append_string(o, file);
      o += ": ";
      json_append_int(o, n);
    }
    o += first ? "\"default\": " : ", \"default\": ";
    json_append_int(o, s.defaults);
    o += "}, \"variants\": {";
    first = true;
    for (const auto& [v, n] : s.by_variant) {
      if (!first) o += ", ";
      first = false;
      json_append_string(o, v);
      o += ": ";
      json_append_int(o, n);
    }
    o += "}}";
  }
  o += "}, \"sites\": [";
  bool first = true;
  for (const Site& s : r.sites()) {
    if (!first) o += ", ";
    first = false;
    o += "{\"name\": ";
    json_append_string(o, s.name);
    o += ", \"op\": ";
    json_append_string(o, kOpNames[s.op]);
    if (s.op == kGemm) {
      o += ", \"N\": ";
      json_append_int(o, s.n);
      o += ", \"K\": ";
      json_append_int(o, s.k);
      if (s.bias) o += ", \"bias\": true";
    } else {
      o += ", \"hidden\": ";
      json_append_int(o, s.n);
    }
    o += ", \"calls\": ";
    json_append_int(o, s.calls);
    o += ", \"us_per_call\": ";
    json_append_double(o, round3(us_per_call(s.seconds, s.calls)));
    o += "}";
  }
  o += "], \"output_finite\": ";
  o += r.non_finite_steps() == 0 ? "true" : "false";
  o += ", \"config_files\": ";
  json_append_int(o, static_cast<int64_t>(ri.report.files.size()));
  o += ", \"config_keys\": ";
  json_append_int(o, ri.report.keys);
  o += ", \"init_s\": ";
  json_append_double(o, round3(ri.init_s));
  o += ", \"warmup_s\": ";
  json_append_double(o, round3(ri.warmup_s));
  o += ", \"run_s\": ";
  json_append_double(o, round3(ri.run_s));
  o += "}\n";
  std::fputs(o.c_str(), stdout);
}

void print_text(const dsp::Runtime& rt, const Replay& r, const RunInfo& ri) {
  const dsp::DeviceInfo& dev = dsp::cpu_device_info();
  const ModelSpec& m = *ri.model;
  std::printf("backend      cpu\n");
  std::printf("device_name  %s (%s, %d threads)\n", dev.device_name.c_str(), dev.reported_name.c_str(),
              dev.compute_units);
  std::printf("model        %s (%s): hidden %lld, intermediate %lld, heads %lld/%lld kv, head_dim %lld, %lld layers%s\n",
              m.name, m.source, (long long)m.hidden, (long long)m.intermediate, (long long)m.heads,
              (long long)m.kv_heads, (long long)m.head_dim, (long long)m.layers, m.qkv_bias ? ", qkv bias" : "");
  std::printf("trace        %s (%zu entries, M %lld..%lld)\n", ri.trace->name.c_str(), ri.trace->ms.size(),
              (long long)*std::min_element(ri.trace->ms.begin(), ri.trace->ms.end()),
              (long long)*std::max_element(ri.trace->ms.begin(), ri.trace->ms.end()));
  std::printf("steps        %lld (forward passes, max M %lld)\n", (long long)ri.steps, (long long)ri.max_m);
  std::printf("dtype        %s\n", std::string(dsp::dtype_name(ri.dtype)).c_str());
  int skipped = 0;
  for (const auto& f : ri.report.files) skipped += f.state == dsp::FileReport::State::skipped;
  std::printf("configs      %zu files (%d skipped), %lld keys%s\n", ri.report.files.size(), skipped,
              (long long)ri.report.keys, ri.config_dirs.empty() ? ", shipped configs only" : "");
  for (const auto& d : ri.config_dirs) std::printf("             + %s\n", d.c_str());
  std::printf("time         %.3f s setup (%.1f MB of weights), %.3f s warm-up (one layer at M=1, not counted), "
              "%.3f s replay\n\n",
              ri.init_s, ri.weight_bytes / 1e6, ri.warmup_s, ri.run_s);

  if (r.non_finite_steps() > 0)
    std::printf("WARNING      %lld forward passes ended with NaN or inf in the hidden state\n\n",
                (long long)r.non_finite_steps());
  std::printf("%-20s %9s %9s %9s %7s %12s\n", "op", "calls", "hits", "defaults", "tuned", "us/call");
  for (int op = 0; op < kOps; ++op) {
    const OpStats& s = r.stats(op);
    std::printf("%-20s %9lld %9lld %9lld %7lld %12.2f\n", kOpNames[op], (long long)s.calls, (long long)s.hits,
                (long long)s.defaults, (long long)s.tuned, us_per_call(s.seconds, s.calls));
  }

  std::printf("\n%-32s %-18s %-16s %9s %12s\n", "site", "op", "shape", "calls", "us/call");
  for (const Site& s : r.sites()) {
    const std::string shape = s.op == kGemm ? "N=" + std::to_string(s.n) + ",K=" + std::to_string(s.k)
                                            : "hidden=" + std::to_string(s.n);
    std::printf("%-32s %-18s %-16s %9lld %12.2f\n", s.name, kOpNames[s.op], shape.c_str(), (long long)s.calls,
                us_per_call(s.seconds, s.calls));
  }

  std::printf("\nwhere the configs came from\n");
  for (int op = 0; op < kOps; ++op) {
    const OpStats& s = r.stats(op);
    std::printf("  %s\n", kOpNames[op]);
    for (const auto& [file, n] : hits_by_file(rt, s)) std::printf("    %9lld  %s\n", (long long)n, file.c_str());
    std::printf("    %9lld  default (get_default)\n", (long long)s.defaults);
    if (s.forced) std::printf("    %9lld  forced\n", (long long)s.forced);
    std::string vars;
    for (const auto& [v, n] : s.by_variant)
      vars += (vars.empty() ? "" : ", ") + std::string(v) + " x" + std::to_string(n);
    if (!vars.empty()) std::printf("    variants: %s\n", vars.c_str());
  }
}

}  // namespace

int run_replay(const ReplayOptions& o) {
  const ModelSpec* model = find_model(o.model);
  if (!model) {
    std::fprintf(stderr, "kdispatch replay: unknown model '%s'; known models: %s\n", o.model.c_str(),
                 model_names().c_str());
    return kExitUsage;
  }
  auto dtype_r = dsp::parse_dtype(o.dtype);
  if (!dtype_r.ok() || (*dtype_r != dsp::DType::fp32 && *dtype_r != dsp::DType::bf16)) {
    std::fprintf(stderr, "kdispatch replay: --dtype '%s' is not supported (fp32 or bf16)\n", o.dtype.c_str());
    return kExitUsage;
  }
  const dsp::DType dtype = *dtype_r;

  std::optional<Trace> trace = builtin_trace(o.trace);
  if (!trace) {
    std::string err;
    trace = read_trace_file(o.trace, &err);
    if (!trace) {
      std::error_code ec;
      const bool is_file = std::filesystem::exists(o.trace, ec);
      std::fprintf(stderr, "kdispatch replay: --trace: %s%s\n", err.c_str(),
                   is_file ? "" : " (and it is not a built-in trace: decode, prefill or mixed)");
      return kExitUsage;
    }
  }
  if (o.steps < 0) {
    std::fprintf(stderr, "kdispatch replay: --steps must be >= 1, got %lld\n", (long long)o.steps);
    return kExitUsage;
  }
  const int64_t steps = o.steps > 0 ? o.steps : static_cast<int64_t>(trace->ms.size());
  int64_t max_m = 1;
  for (int64_t s = 0; s < steps; ++s) max_m = std::max(max_m, trace->ms[s % trace->ms.size()]);

  dsp::RuntimeOptions ro;
  ro.config_dirs = o.config_dirs;
  auto rt_r = dsp::Runtime::create(ro);
  if (!rt_r.ok()) {
    std::fprintf(stderr, "kdispatch replay: cannot create the runtime: %s\n", rt_r.status().to_string().c_str());
    return rt_r.status().code() == dsp::StatusCode::invalid_argument ? kExitUsage : kExitFailure;
  }
  dsp::Runtime& rt = **rt_r;

  // Probe the host once before anything is timed (the first probe reads /proc).
  (void)dsp::cpu_device_info();
  RunInfo ri{model, &*trace, steps, max_m, dtype, 0, 0, 0, 0, rt.load_report(), o.config_dirs};
  const auto t0 = Clock::now();
  Replay replay(rt, *model, dtype, max_m);
  try {
    replay.init();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kdispatch replay: out of memory allocating %s's weights and activations (max M %lld)\n",
                 model->name, (long long)max_m);
    return kExitFailure;
  }
  const auto tw = Clock::now();
  if (std::string err; !replay.warm_up(&err)) {
    std::fprintf(stderr, "kdispatch replay: warm-up: %s\n", err.c_str());
    return kExitFailure;
  }
  const auto t1 = Clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t M = trace->ms[s % trace->ms.size()];
    std::string err;
    if (!replay.forward(M, &err)) {
      std::fprintf(stderr, "kdispatch replay: step %lld: %s\n", (long long)s, err.c_str());
      return kExitFailure;
    }
  }
  const auto t2 = Clock::now();
  ri.init_s = std::chrono::duration<double>(tw - t0).count();
  ri.warmup_s = std::chrono::duration<double>(t1 - tw).count();
  ri.run_s = std::chrono::duration<double>(t2 - t1).count();
  ri.weight_bytes = replay.weight_bytes();
  if (o.json)
    print_json(rt, replay, ri);
  else
    print_text(rt, replay, ri);
  return kExitOk;
}

}  // namespace kdispatch_cli
