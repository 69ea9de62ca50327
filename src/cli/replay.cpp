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
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

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
  int64_t calls = 0, hits = 0, defaults = 0, forced = 0, tuned_now = 0;
  double seconds = 0;
  std::map<uint32_t, int64_t> by_source;          // source_id -> table hits
  std::map<std::string_view, int64_t> by_variant;  // variant name (static storage) -> calls
};

// A shape as the table sees it: (static key, M). The static key of a call
// is fixed by its site's op and dims (the dtype is one per run), so the
// replay names it by an index into Replay::keys() instead of asking every
// call for DispatchInfo::key (an allocation inside the timed call).
using ShapeId = std::pair<int, int64_t>;  // (key index, M)

// One op's calls in one pass over the trace (tuning modes).
struct PassOp {
  int64_t calls = 0, hits = 0, defaults = 0, forced = 0, tuned_now = 0;
  double seconds = 0;
  std::set<ShapeId> default_shapes;  // (key, M) served by get_default
  std::set<ShapeId> hit_shapes;      // (key, M) served by a table row
  std::set<ShapeId> rows;            // (key, table M): the rows that served
  std::vector<float> us;             // every call's time, µs (for the median)

  // The median time per call, µs: on a busy host more robust than the mean
  // (a preempted call costs milliseconds); the call mix is the same every pass.
  double p50_us() const {
    if (us.empty()) return 0.0;
    std::vector<float> v = us;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  }
};

// One place in the layer where an op is called (qkv_proj, ...), with its shape.
struct Site {
  const char* name;
  OpIdx op;
  int64_t n = 0, k = 0;  // gemm N, K; norms: n = hidden
  bool bias = false;
  int64_t calls = 0;
  double seconds = 0;
  int key = 0;  // index into Replay::keys()
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
    for (Site& s : sites_) {
      const std::string k = std::string(kOpNames[s.op]) + " " +
                            (s.op == kGemm ? "N=" + std::to_string(s.n) + ",K=" + std::to_string(s.k) +
                                                 (s.bias ? ",bias" : "")
                                           : "hidden=" + std::to_string(s.n));
      auto it = std::find(keys_.begin(), keys_.end(), k);
      s.key = static_cast<int>(it - keys_.begin());
      if (it == keys_.end()) keys_.push_back(k);
    }
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
  /// Starts a new pass: the per-pass stats restart from zero.
  void begin_pass() {
    for (PassOp& p : pass_) p = PassOp{};
  }
  const PassOp& pass_stats(int op) const { return pass_[op]; }
  /// "gemm N=1152,K=896,bias", ... (ShapeId::first indexes it).
  const std::vector<std::string>& keys() const { return keys_; }
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
    PassOp& ps = pass_[site.op];
    ps.calls++;
    ps.seconds += dt;
    ps.us.push_back(static_cast<float>(dt * 1e6));
    if (info.tuned_now) {
      st.tuned_now++;
      ps.tuned_now++;
    }
    switch (info.source) {
      case dsp::PlanSource::table:
        st.hits++;
        st.by_source[info.source_id]++;
        ps.hits++;
        ps.hit_shapes.insert({site.key, M});
        ps.rows.insert({site.key, info.table_m});
        break;
      case dsp::PlanSource::fallback:
        st.defaults++;
        ps.defaults++;
        ps.default_shapes.insert({site.key, M});
        break;
      case dsp::PlanSource::forced:
        st.forced++;
        ps.forced++;
        break;
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
  std::vector<std::string> keys_;
  OpStats ops_[kOps];
  PassOp pass_[kOps];
  bool counting_ = true;
  int64_t non_finite_steps_ = 0;
  int64_t layers_override_ = 0;  // > 0: run only this many layers (warm-up)
  std::map<std::pair<int64_t, int64_t>, Buffer> weights_;
  Buffer qkv_bias_, norm_w_, embed_, residual_, h_, h2_, qkv_, attn_, gate_up_, act_;
};

// ---------------------------------------------------------------- output

double round3(double v) { return std::round(v * 1000.0) / 1000.0; }
double us_per_call(double seconds, int64_t calls) { return calls > 0 ? seconds * 1e6 / calls : 0.0; }
double percent(int64_t part, int64_t whole) { return whole > 0 ? 100.0 * static_cast<double>(part) / whole : 0.0; }

// One pass over the trace in a tuning mode, as printed while the run goes.
struct PassSummary {
  int index = 0;
  bool baseline = false;  // pass 1: tuning paused (the runtime frozen), the table as it started
  double t = 0;           // seconds since the first pass started, at the end of this one
  double seconds = 0;     // this pass's wall time
  int64_t calls[kOps] = {}, hits[kOps] = {}, defaults[kOps] = {}, tuned_now[kOps] = {};
  double op_seconds[kOps] = {};
  dsp::TuneStats stats;   // at the end of the pass
};

// What a tuning run (--tune sync|background) adds to the report.
struct TuneReport {
  dsp::TuneMode mode = dsp::TuneMode::off;
  std::vector<PassSummary> passes;
  PassOp first[kOps], last[kOps];  // the baseline pass and the last pass
  std::string stop_reason;         // "converged" | "stalled" | "max_seconds"
  double seconds = 0;              // all passes
  double max_seconds = 0;
  dsp::TuneStats stats;            // at the end
  dsp::TuneOptions options;

  // Rows the tuner added that the last pass used: (key, table M) serving in
  // the last pass but not in the baseline (the trace is the same every pass,
  // so a row serving now and not then is a new one).
  int64_t rows_added(int op) const {
    int64_t n = 0;
    for (const ShapeId& r : last[op].rows) n += first[op].rows.count(r) == 0;
    return n;
  }
  // Shapes (key, M) served by get_default in the baseline and by a table row in the last pass.
  int64_t shapes_moved(int op) const {
    int64_t n = 0;
    for (const ShapeId& s : first[op].default_shapes) n += last[op].hit_shapes.count(s);
    return n;
  }
  double us_first(int op) const { return us_per_call(first[op].seconds, first[op].calls); }
  double us_last(int op) const { return us_per_call(last[op].seconds, last[op].calls); }
  double speedup(int op) const { return us_last(op) > 0 ? us_first(op) / us_last(op) : 0.0; }
  double speedup_p50(int op) const {
    const double l = last[op].p50_us();
    return l > 0 ? first[op].p50_us() / l : 0.0;
  }
};

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
  bool shipped = true;
  std::string cache_dir;
  const TuneReport* tune = nullptr;  // null when tuning is off
};

// Table hits per config file (its config dir / path relative to the dir).
std::map<std::string, int64_t> hits_by_file(const dsp::Runtime& rt, const OpStats& s) {
  std::map<std::string, int64_t> out;
  for (const auto& [id, n] : s.by_source) {
    if (id == 0) {  // a call that tuned itself (sync mode) names no source
      out["tuned on the caller's thread (sync)"] += n;
      continue;
    }
    std::string p = rt.source_path(id);
    if (!p.empty()) p = rt.source_dir(id) + "/" + p;
    out[p.empty() ? "source #" + std::to_string(id) : std::move(p)] += n;
  }
  return out;
}

void append_tune_stats_json(std::string& o, const dsp::TuneStats& t) {
  using dsp::core::json_append_double;
  using dsp::core::json_append_int;
  const std::pair<const char*, int64_t> ints[] = {
      {"misses", t.misses},
      {"queued", t.queued},
      {"dropped", t.dropped},
      {"shapes_tuned", t.shapes_tuned},
      {"shapes_skipped", t.shapes_skipped},
      {"candidates_run", t.candidates_run},
      {"candidates_rejected", t.candidates_rejected},
      {"candidates_failed", t.candidates_failed},
      {"publishes", t.publishes},
      {"pending", t.pending}};
  bool first = true;
  for (const auto& [name, v] : ints) {
    if (!first) o += ", ";
    first = false;
    o += "\"";
    o += name;
    o += "\": ";
    json_append_int(o, v);
  }
  o += ", \"tune_seconds\": ";
  json_append_double(o, round3(t.tune_seconds));
}

void print_json(const dsp::Runtime& rt, const Replay& r, const RunInfo& ri) {
  using dsp::core::json_append_double;
  using dsp::core::json_append_int;
  using dsp::core::json_append_string;
  const dsp::DeviceInfo& dev = dsp::cpu_device_info();
  const TuneReport* tr = ri.tune;
  std::string o = "{\"backend\": \"cpu\", \"device_name\": ";
  json_append_string(o, dev.device_name);
  o += ", \"model\": ";
  json_append_string(o, ri.model->name);
  o += ", \"trace\": ";
  json_append_string(o, ri.trace->name);
  o += ", \"steps\": ";
  json_append_int(o, ri.steps);
  o += ", \"passes\": ";
  json_append_int(o, tr ? static_cast<int64_t>(tr->passes.size()) : 1);
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
    json_append_int(o, tr ? tr->rows_added(op) : 0);
    o += ", \"forced\": ";
    json_append_int(o, s.forced);
    o += ", \"us_per_call\": ";
    json_append_double(o, round3(us_per_call(s.seconds, s.calls)));
    if (tr) {
      o += ", \"tuned_shapes\": ";
      json_append_int(o, tr->shapes_moved(op));
      o += ", \"tuned_now\": ";
      json_append_int(o, s.tuned_now);
      o += ", \"calls_per_pass\": ";
      json_append_int(o, tr->last[op].calls);
      o += ", \"hits_first\": ";
      json_append_int(o, tr->first[op].hits);
      o += ", \"hits_last\": ";
      json_append_int(o, tr->last[op].hits);
      o += ", \"defaults_first\": ";
      json_append_int(o, tr->first[op].defaults);
      o += ", \"defaults_last\": ";
      json_append_int(o, tr->last[op].defaults);
      o += ", \"us_per_call_first\": ";
      json_append_double(o, round3(tr->us_first(op)));
      o += ", \"us_per_call_last\": ";
      json_append_double(o, round3(tr->us_last(op)));
      o += ", \"speedup\": ";
      json_append_double(o, round3(tr->speedup(op)));
      o += ", \"p50_us_first\": ";
      json_append_double(o, round3(tr->first[op].p50_us()));
      o += ", \"p50_us_last\": ";
      json_append_double(o, round3(tr->last[op].p50_us()));
      o += ", \"speedup_p50\": ";
      json_append_double(o, round3(tr->speedup_p50(op)));
    }
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
  o += ", \"cache_dir\": ";
  json_append_string(o, ri.cache_dir);
  o += ", \"load_notes\": [";
  for (size_t i = 0; i < ri.report.notes.size(); ++i) {
    if (i) o += ", ";
    json_append_string(o, ri.report.notes[i]);
  }
  o += "]";
  o += ", \"init_s\": ";
  json_append_double(o, round3(ri.init_s));
  o += ", \"warmup_s\": ";
  json_append_double(o, round3(ri.warmup_s));
  o += ", \"run_s\": ";
  json_append_double(o, round3(ri.run_s));
  o += ", \"tune\": {\"mode\": ";
  json_append_string(o, dsp::tune_mode_name(tr ? tr->mode : dsp::TuneMode::off));
  if (tr) {
    o += ", \"stop\": ";
    json_append_string(o, tr->stop_reason);
    o += ", \"converged\": ";
    o += tr->stop_reason == "converged" ? "true" : "false";
    o += ", \"seconds\": ";
    json_append_double(o, round3(tr->seconds));
    o += ", \"max_seconds\": ";
    json_append_double(o, tr->max_seconds);
    o += ", \"budget_ms\": ";
    json_append_double(o, tr->options.time_budget_ms);
    o += ", \"duty_cycle\": ";
    json_append_double(o, tr->options.duty_cycle);
    o += ", \"cold_cache\": ";
    o += tr->options.cold_cache ? "true" : "false";
    o += ", ";
    append_tune_stats_json(o, tr->stats);
    o += ", \"passes\": [";
    for (size_t i = 0; i < tr->passes.size(); ++i) {
      const PassSummary& p = tr->passes[i];
      o += i ? ", {\"pass\": " : "{\"pass\": ";
      json_append_int(o, p.index);
      o += ", \"baseline\": ";
      o += p.baseline ? "true" : "false";
      o += ", \"t\": ";
      json_append_double(o, round3(p.t));
      o += ", \"seconds\": ";
      json_append_double(o, round3(p.seconds));
      o += ", \"shapes_tuned\": ";
      json_append_int(o, p.stats.shapes_tuned);
      o += ", \"pending\": ";
      json_append_int(o, p.stats.pending);
      o += ", \"ops\": {";
      for (int op = 0; op < kOps; ++op) {
        if (op) o += ", ";
        json_append_string(o, kOpNames[op]);
        o += ": {\"calls\": ";
        json_append_int(o, p.calls[op]);
        o += ", \"hits\": ";
        json_append_int(o, p.hits[op]);
        o += ", \"defaults\": ";
        json_append_int(o, p.defaults[op]);
        o += ", \"us_per_call\": ";
        json_append_double(o, round3(us_per_call(p.op_seconds[op], p.calls[op])));
        o += "}";
      }
      o += "}}";
    }
    o += "]";
  } else {
    const dsp::TuneStats ts = rt.tune_stats();
    o += ", ";
    append_tune_stats_json(o, ts);
  }
  o += "}}\n";
  std::fputs(o.c_str(), stdout);
}

void print_text(const dsp::Runtime& rt, const Replay& r, const RunInfo& ri) {
  const dsp::DeviceInfo& dev = dsp::cpu_device_info();
  const ModelSpec& m = *ri.model;
  const TuneReport* tr = ri.tune;
  if (tr) std::printf("\n");
  std::printf("backend      cpu\n");
  std::printf("device_name  %s (%s, %d threads)\n", dev.device_name.c_str(), dev.reported_name.c_str(),
              dev.compute_units);
  std::printf("model        %s (%s): hidden %lld, intermediate %lld, heads %lld/%lld kv, head_dim %lld, %lld layers%s\n",
              m.name, m.source, (long long)m.hidden, (long long)m.intermediate, (long long)m.heads,
              (long long)m.kv_heads, (long long)m.head_dim, (long long)m.layers, m.qkv_bias ? ", qkv bias" : "");
  std::printf("trace        %s (%zu entries, M %lld..%lld)\n", ri.trace->name.c_str(), ri.trace->ms.size(),
              (long long)*std::min_element(ri.trace->ms.begin(), ri.trace->ms.end()),
              (long long)*std::max_element(ri.trace->ms.begin(), ri.trace->ms.end()));
  if (tr)
    std::printf("steps        %lld per pass x %zu passes (forward passes, max M %lld)\n", (long long)ri.steps,
                tr->passes.size(), (long long)ri.max_m);
  else
    std::printf("steps        %lld (forward passes, max M %lld)\n", (long long)ri.steps, (long long)ri.max_m);
  std::printf("dtype        %s\n", std::string(dsp::dtype_name(ri.dtype)).c_str());
  int skipped = 0;
  for (const auto& f : ri.report.files) skipped += f.state == dsp::FileReport::State::skipped;
  std::printf("configs      %zu files (%d skipped), %lld keys%s\n", ri.report.files.size(), skipped,
              (long long)ri.report.keys,
              !ri.shipped ? (ri.config_dirs.empty() ? ", no shipped configs, no config dirs" : ", no shipped configs")
                          : (ri.config_dirs.empty() ? ", shipped configs only" : ""));
  for (const auto& d : ri.config_dirs) std::printf("             + %s\n", d.c_str());
  std::printf("cache dir    %s\n", ri.cache_dir.empty() ? "(none)" : ri.cache_dir.c_str());
  for (const auto& n : ri.report.notes) std::printf("note         %s\n", n.c_str());
  std::printf("time         %.3f s setup (%.1f MB of weights), %.3f s warm-up (one layer at M=1, not counted), "
              "%.3f s replay\n\n",
              ri.init_s, ri.weight_bytes / 1e6, ri.warmup_s, ri.run_s);

  if (r.non_finite_steps() > 0)
    std::printf("WARNING      %lld forward passes ended with NaN or inf in the hidden state\n\n",
                (long long)r.non_finite_steps());
  std::printf("%-20s %9s %9s %9s %7s %12s%s\n", "op", "calls", "hits", "defaults", "tuned", "us/call",
              tr ? "   (all passes)" : "");
  for (int op = 0; op < kOps; ++op) {
    const OpStats& s = r.stats(op);
    std::printf("%-20s %9lld %9lld %9lld %7lld %12.2f\n", kOpNames[op], (long long)s.calls, (long long)s.hits,
                (long long)s.defaults, (long long)(tr ? tr->rows_added(op) : 0), us_per_call(s.seconds, s.calls));
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

  if (!tr) return;
  // Tuned against the defaults: the baseline pass (tuning paused) against the last pass.
  std::printf("\ntuning (%s): first pass (baseline, tuning paused) vs last pass (pass %zu)\n",
              dsp::tune_mode_name(tr->mode), tr->passes.size());
  std::printf("%-20s %10s %10s %10s %13s %13s %8s %10s %10s %8s %6s\n", "op", "calls/pass", "hits first",
              "hits last", "us/call first", "us/call last", "speedup", "p50 first", "p50 last", "p50 x", "tuned");
  for (int op = 0; op < kOps; ++op) {
    const PassOp& f = tr->first[op];
    const PassOp& l = tr->last[op];
    char hf[32], hl[32];
    std::snprintf(hf, sizeof hf, "%.0f%%", percent(f.hits, f.calls));
    std::snprintf(hl, sizeof hl, "%.0f%%", percent(l.hits, l.calls));
    std::printf("%-20s %10lld %10s %10s %13.2f %13.2f %7.2fx %10.2f %10.2f %7.2fx %6lld\n", kOpNames[op],
                (long long)l.calls, hf, hl, tr->us_first(op), tr->us_last(op), tr->speedup(op), f.p50_us(), l.p50_us(),
                tr->speedup_p50(op), (long long)tr->rows_added(op));
  }
  const dsp::TuneStats& t = tr->stats;
  const char* how = tr->stop_reason == "converged" ? "converged"
                    : tr->stop_reason == "stalled" ? "stalled (the tuner is idle; some shapes still miss)"
                                                   : "stopped at --max-seconds before converging";
  std::printf("\n%s after %zu passes in %.1f s\n", how, tr->passes.size(), tr->seconds);
  std::printf("tuner        %lld shapes tuned, %lld skipped; %lld candidates run (%lld rejected by validation, "
              "%lld failed to launch); %.1f s searching; %lld tables published\n",
              (long long)t.shapes_tuned, (long long)t.shapes_skipped, (long long)t.candidates_run,
              (long long)t.candidates_rejected, (long long)t.candidates_failed, t.tune_seconds,
              (long long)t.publishes);
  std::printf("misses       %lld calls missed; %lld queued, %lld dropped (queue full), %lld pending\n",
              (long long)t.misses, (long long)t.queued, (long long)t.dropped, (long long)t.pending);
  std::printf("options      budget %.0f ms/shape, duty cycle %.2f, %d reps%s; cache dir %s\n",
              tr->options.time_budget_ms, tr->options.duty_cycle, tr->options.reps,
              tr->options.cold_cache ? ", cold cache" : ", warm cache", ri.cache_dir.c_str());
}

// ---------------------------------------------------------------- tuning passes

// The per-pass progress lines: to stdout in text mode, to stderr with --json
// (stdout then holds only the JSON object).
class PassPrinter {
 public:
  PassPrinter(FILE* f, dsp::TuneMode mode) : f_(f), mode_(mode) {}

  void header(const ReplayOptions& o, const dsp::TuneOptions& t, const std::string& cache_dir, int64_t steps) {
    std::fprintf(f_,
                 "tuning       %s: a pass is %lld forward passes; passes repeat until a pass has no misses and "
                 "the tuner is idle, or %.0f s\n"
                 "             budget %.0f ms/shape, duty cycle %.2f, %d reps%s, cache dir %s\n",
                 dsp::tune_mode_name(mode_), (long long)steps, o.max_seconds, t.time_budget_ms, t.duty_cycle, t.reps,
                 t.cold_cache ? ", cold cache" : ", warm cache", cache_dir.empty() ? "(none)" : cache_dir.c_str());
    std::fprintf(f_, "%-5s %8s   %-18s %-18s %-18s %s\n", "pass", "time", "rmsnorm hits", "fused_add hits",
                 "gemm hits", "tuner");
    std::fflush(f_);
  }

  // A pass line (or, with `partial`, a progress line inside a long pass).
  void line(int index, double t, const Replay& r, const dsp::TuneStats& s, bool baseline, const char* partial) {
    std::fprintf(f_, "%-5s %7.1fs  ", (std::to_string(index) + (partial ? "..." : "")).c_str(), t);
    for (int op = 0; op < kOps; ++op) {
      const PassOp& p = r.pass_stats(op);
      char cell[48];
      std::snprintf(cell, sizeof cell, "%lld/%lld %.0f%%", (long long)p.hits, (long long)p.calls,
                    percent(p.hits, p.calls));
      std::fprintf(f_, " %-18s", cell);
    }
    if (baseline)
      std::fprintf(f_, " baseline: the table as it started, tuning paused");
    else if (mode_ == dsp::TuneMode::sync)
      std::fprintf(f_, " %lld shapes tuned on the caller's thread, %lld candidates", (long long)s.shapes_tuned,
                   (long long)s.candidates_run);
    else
      std::fprintf(f_, " %lld shapes tuned, %lld pending, %lld candidates, %.1f s searching",
                   (long long)s.shapes_tuned, (long long)s.pending, (long long)s.candidates_run, s.tune_seconds);
    if (partial) std::fprintf(f_, " (%s)", partial);
    std::fprintf(f_, "\n");
    std::fflush(f_);
  }

 private:
  FILE* f_;
  dsp::TuneMode mode_;
};

// ---------------------------------------------------------------- `kdispatch misses` summary

int print_misses_summary(const Replay& r, const ReplayOptions& o, const RunInfo& ri, const std::string& path) {
  using dsp::core::json_append_int;
  using dsp::core::json_append_string;
  std::string err;
  auto csv = read_shape_csv(path, &err);
  if (!csv) {
    std::fprintf(stderr, "kdispatch misses: reading back %s: %s\n", path.c_str(), err.c_str());
    return kExitFailure;
  }
  int64_t shapes[kOps] = {}, keys[kOps] = {};
  for (int op = 0; op < kOps; ++op) {
    std::set<std::string> k;
    for (const ShapeRow& s : csv->rows) {
      if (s.get("op") != kOpNames[op]) continue;
      shapes[op]++;
      std::string key;  // every column but M and count
      for (const auto& [name, v] : s.fields)
        if (name != "m" && name != "count") key += v + "|";
      k.insert(std::move(key));
    }
    keys[op] = static_cast<int64_t>(k.size());
  }
  if (o.json) {
    std::string j = "{\"export\": ";
    json_append_string(j, path);
    j += ", \"model\": ";
    json_append_string(j, ri.model->name);
    j += ", \"trace\": ";
    json_append_string(j, ri.trace->name);
    j += ", \"steps\": ";
    json_append_int(j, ri.steps);
    j += ", \"dtype\": ";
    json_append_string(j, dsp::dtype_name(ri.dtype));
    j += ", \"rows\": ";
    json_append_int(j, static_cast<int64_t>(csv->rows.size()));
    j += ", \"ops\": {";
    for (int op = 0; op < kOps; ++op) {
      const OpStats& s = r.stats(op);
      if (op) j += ", ";
      json_append_string(j, kOpNames[op]);
      j += ": {\"calls\": ";
      json_append_int(j, s.calls);
      j += ", \"hits\": ";
      json_append_int(j, s.hits);
      j += ", \"misses\": ";
      json_append_int(j, s.defaults);
      j += ", \"shapes\": ";
      json_append_int(j, shapes[op]);
      j += ", \"keys\": ";
      json_append_int(j, keys[op]);
      j += "}";
    }
    j += "}}\n";
    std::fputs(j.c_str(), stdout);
    return kExitOk;
  }
  std::printf("workload     %s, trace %s, %lld forward passes, %s, tuning off\n", ri.model->name,
              ri.trace->name.c_str(), (long long)ri.steps, std::string(dsp::dtype_name(ri.dtype)).c_str());
  std::printf("\n%-20s %9s %9s %9s %8s %6s\n", "op", "calls", "hits", "misses", "shapes", "keys");
  for (int op = 0; op < kOps; ++op) {
    const OpStats& s = r.stats(op);
    std::printf("%-20s %9lld %9lld %9lld %8lld %6lld\n", kOpNames[op], (long long)s.calls, (long long)s.hits,
                (long long)s.defaults, (long long)shapes[op], (long long)keys[op]);
  }
  std::string columns;
  for (const std::string& c : csv->columns) columns += (columns.empty() ? "" : ",") + c;
  std::printf("\nwrote %s: %zu shapes (%s)\n", path.c_str(), csv->rows.size(), columns.c_str());
  if (!csv->rows.empty()) {
    std::printf("tune them:\n");
    for (int op = 0; op < kOps; ++op)
      if (shapes[op])
        std::printf("  kdispatch tune --shapes %s --op %s --emit DIR\n", path.c_str(), kOpNames[op]);
  }
  return kExitOk;
}

}  // namespace

int run_replay(const ReplayOptions& o) {
  const char* cmd = o.misses_summary ? "kdispatch misses" : "kdispatch replay";
  const ModelSpec* model = find_model(o.model);
  if (!model) {
    std::fprintf(stderr, "%s: unknown model '%s'; known models: %s\n", cmd, o.model.c_str(), model_names().c_str());
    return kExitUsage;
  }
  auto dtype_r = dsp::parse_dtype(o.dtype);
  if (!dtype_r.ok() || (*dtype_r != dsp::DType::fp32 && *dtype_r != dsp::DType::bf16)) {
    std::fprintf(stderr, "%s: --dtype '%s' is not supported (fp32 or bf16)\n", cmd, o.dtype.c_str());
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
      std::fprintf(stderr, "%s: --trace: %s%s\n", cmd, err.c_str(),
                   is_file ? "" : " (and it is not a built-in trace: decode, prefill or mixed)");
      return kExitUsage;
    }
  }
  if (o.steps < 0) {
    std::fprintf(stderr, "%s: --steps must be >= 1, got %lld\n", cmd, (long long)o.steps);
    return kExitUsage;
  }
  const int64_t steps = o.steps > 0 ? o.steps : static_cast<int64_t>(trace->ms.size());
  int64_t max_m = 1;
  for (int64_t s = 0; s < steps; ++s) max_m = std::max(max_m, trace->ms[s % trace->ms.size()]);

  // The runtime: the KDISPATCH_* environment, then the flags.
  auto env_r = dsp::options_from_env();
  if (!env_r.ok()) {
    std::fprintf(stderr, "%s: %s\n", cmd, env_r.status().message().c_str());
    return kExitUsage;
  }
  dsp::RuntimeOptions ro = std::move(*env_r);
  if (!o.tune.empty()) {
    if (o.tune == "off") ro.tune.mode = dsp::TuneMode::off;
    else if (o.tune == "sync") ro.tune.mode = dsp::TuneMode::sync;
    else if (o.tune == "background") ro.tune.mode = dsp::TuneMode::background;
    else {
      std::fprintf(stderr, "%s: --tune '%s' is not off, sync or background\n", cmd, o.tune.c_str());
      return kExitUsage;
    }
  }
  if (o.misses_summary) ro.tune.mode = dsp::TuneMode::off;
  if (!(o.max_seconds > 0)) {
    std::fprintf(stderr, "%s: --max-seconds must be > 0, got %g\n", cmd, o.max_seconds);
    return kExitUsage;
  }
  if (o.budget_ms < 0 || (o.budget_ms > 0 && !std::isfinite(o.budget_ms))) {
    std::fprintf(stderr, "%s: --budget-ms must be > 0, got %g\n", cmd, o.budget_ms);
    return kExitUsage;
  }
  if (o.duty_cycle < 0 || o.duty_cycle > 1) {
    std::fprintf(stderr, "%s: --duty-cycle must be in (0, 1], got %g\n", cmd, o.duty_cycle);
    return kExitUsage;
  }
  // Config dirs: --configs on top of the shipped configs (and of
  // $KDISPATCH_CONFIG_DIRS); --only-configs / --no-shipped-configs: only
  // the dirs given on the command line.
  if (!o.only_configs.empty() || o.no_shipped_configs) {
    ro.load_shipped_configs = false;
    ro.config_dirs = o.only_configs;
    ro.config_dirs.insert(ro.config_dirs.end(), o.config_dirs.begin(), o.config_dirs.end());
  } else {
    std::vector<std::string> dirs = o.config_dirs;
    dirs.insert(dirs.end(), ro.config_dirs.begin(), ro.config_dirs.end());
    ro.config_dirs = std::move(dirs);
  }
  if (!o.cache_dir.empty()) ro.tune.cache_dir = o.cache_dir;
  if (o.budget_ms > 0) ro.tune.time_budget_ms = o.budget_ms;
  if (o.duty_cycle > 0) ro.tune.duty_cycle = o.duty_cycle;
  if (o.no_cold_cache) ro.tune.cold_cache = false;
  const dsp::TuneMode mode = ro.tune.mode;
  const std::vector<std::string> config_dirs = ro.config_dirs;
  const bool shipped = ro.load_shipped_configs;

  auto rt_r = dsp::Runtime::create(ro);
  if (!rt_r.ok()) {
    std::fprintf(stderr, "%s: cannot create the runtime: %s\n", cmd, rt_r.status().to_string().c_str());
    return rt_r.status().code() == dsp::StatusCode::invalid_argument ? kExitUsage : kExitFailure;
  }
  dsp::Runtime& rt = **rt_r;

  // Probe the host once before anything is timed (the first probe reads /proc).
  (void)dsp::cpu_device_info();
  RunInfo ri{model, &*trace, steps, max_m, dtype, 0, 0, 0, 0, rt.load_report(), config_dirs};
  ri.shipped = shipped;
  ri.cache_dir = rt.cache_dir();
  const auto t0 = Clock::now();
  Replay replay(rt, *model, dtype, max_m);
  try {
    replay.init();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "%s: out of memory allocating %s's weights and activations (max M %lld)\n", cmd,
                 model->name, (long long)max_m);
    return kExitFailure;
  }
  const bool tuning = mode != dsp::TuneMode::off;
  // Tuning modes: the warm-up and the first pass run frozen, so the first
  // pass measures the table as it started (no search on the caller's thread,
  // no background tuner competing for the cores).
  if (tuning) rt.freeze(true);
  const auto tw = Clock::now();
  if (std::string err; !replay.warm_up(&err)) {
    std::fprintf(stderr, "%s: warm-up: %s\n", cmd, err.c_str());
    return kExitFailure;
  }
  const auto t1 = Clock::now();
  auto run_steps = [&](const std::function<void()>& every_step) -> bool {
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t M = trace->ms[s % trace->ms.size()];
      std::string err;
      if (!replay.forward(M, &err)) {
        std::fprintf(stderr, "%s: step %lld: %s\n", cmd, (long long)s, err.c_str());
        return false;
      }
      if (every_step) every_step();
    }
    return true;
  };

  TuneReport tr;
  if (!tuning) {
    if (!run_steps(nullptr)) return kExitFailure;
  } else {
    tr.mode = mode;
    tr.max_seconds = o.max_seconds;
    tr.options = rt.options().tune;
    PassPrinter printer(o.json ? stderr : stdout, mode);
    printer.header(o, tr.options, rt.cache_dir(), steps);
    const auto start = Clock::now();
    const auto since = [&](Clock::time_point a) { return std::chrono::duration<double>(Clock::now() - a).count(); };
    PassOp prev[kOps];
    for (int index = 1;; ++index) {
      const bool baseline = index == 1;
      const dsp::TuneStats before = rt.tune_stats();
      replay.begin_pass();
      const auto pass_start = Clock::now();
      auto last_print = pass_start;
      // A long pass (a big model) prints a progress line every 5 s.
      const bool ok = run_steps([&] {
        if (std::chrono::duration<double>(Clock::now() - last_print).count() < 5.0) return;
        last_print = Clock::now();
        printer.line(index, since(start), replay, rt.tune_stats(), baseline, "in progress");
      });
      if (!ok) return kExitFailure;
      if (baseline) rt.freeze(false);
      PassSummary ps;
      ps.index = index;
      ps.baseline = baseline;
      ps.t = since(start);
      ps.seconds = since(pass_start);
      ps.stats = rt.tune_stats();
      int64_t defaults = 0;
      for (int op = 0; op < kOps; ++op) {
        const PassOp& p = replay.pass_stats(op);
        ps.calls[op] = p.calls;
        ps.hits[op] = p.hits;
        ps.defaults[op] = p.defaults;
        ps.tuned_now[op] = p.tuned_now;
        ps.op_seconds[op] = p.seconds;
        defaults += p.defaults;
      }
      tr.passes.push_back(ps);
      printer.line(index, ps.t, replay, ps.stats, baseline, nullptr);
      if (baseline) {
        for (int op = 0; op < kOps; ++op) tr.first[op] = replay.pass_stats(op);
      } else {
        // Quiet: no candidate ran and no table was published during the pass.
        const bool quiet = ps.stats.candidates_run == before.candidates_run && ps.stats.publishes == before.publishes;
        const auto idle = [&] { return mode != dsp::TuneMode::background || rt.wait_tuner_idle(0.5); };
        if (quiet && defaults == 0 && idle()) {
          tr.stop_reason = "converged";
          break;
        }
        bool same_misses = true;
        for (int op = 0; op < kOps; ++op)
          same_misses = same_misses && replay.pass_stats(op).default_shapes == prev[op].default_shapes;
        // Stalled only when the tuner, once idle, had done nothing since the
        // pass began: a long search in flight shows no candidates until it
        // ends, so "quiet" alone is not enough.
        const auto still = [&] {
          const dsp::TuneStats now = rt.tune_stats();
          return now.candidates_run == before.candidates_run && now.publishes == before.publishes &&
                 now.shapes_tuned == before.shapes_tuned;
        };
        if (quiet && defaults > 0 && same_misses && idle() && still()) {
          tr.stop_reason = "stalled";
          break;
        }
      }
      for (int op = 0; op < kOps; ++op) prev[op] = replay.pass_stats(op);
      if (!baseline && since(start) >= o.max_seconds) {  // at least one pass with tuning on
        tr.stop_reason = "max_seconds";
        break;
      }
    }
    for (int op = 0; op < kOps; ++op) tr.last[op] = replay.pass_stats(op);
    tr.seconds = since(start);
    tr.stats = rt.tune_stats();
    ri.tune = &tr;
  }
  const auto t2 = Clock::now();
  ri.init_s = std::chrono::duration<double>(tw - t0).count();
  ri.warmup_s = std::chrono::duration<double>(t1 - tw).count();
  ri.run_s = std::chrono::duration<double>(t2 - t1).count();
  ri.weight_bytes = replay.weight_bytes();

  // The misses (aiter's offline loop): --export-misses / `misses --export`,
  // else $KDISPATCH_MISSES_EXPORT as the default runtime honours it.
  std::string export_path = o.export_misses;
  if (export_path.empty())
    if (const char* e = std::getenv("KDISPATCH_MISSES_EXPORT"); e && *e) export_path = e;
  if (!export_path.empty()) {
    if (dsp::Status s = rt.export_misses(export_path); !s.ok()) {
      std::fprintf(stderr, "%s: cannot write the misses: %s\n", cmd, s.to_string().c_str());
      return kExitFailure;
    }
    if (!o.misses_summary) std::fprintf(stderr, "%s: wrote the misses to %s\n", cmd, export_path.c_str());
  }
  if (o.misses_summary) return print_misses_summary(replay, o, ri, export_path);
  if (o.json)
    print_json(rt, replay, ri);
  else
    print_text(rt, replay, ri);
  return kExitOk;
}

}  // namespace kdispatch_cli
