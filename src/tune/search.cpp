// SPDX-License-Identifier: Apache-2.0
#include "tune/search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "core/dtype_table.hpp"
#include "core/op_spec.hpp"
#include "backends/registry.hpp"
#include "backends/backend.hpp"
#include "tune/rules.hpp"

namespace dispatch::tune {
namespace {

// The test-only timing hook (set_timing_hook_for_testing); read once per search.
std::mutex g_hook_mu;
std::shared_ptr<const TimingHook> g_hook;

std::shared_ptr<const TimingHook> timing_hook() {
  std::lock_guard<std::mutex> lock(g_hook_mu);
  return g_hook;
}

// "7.3" of 0.073: a percentage with one decimal; "2" of 0.02, "1.5" of 0.015
// for a margin.
std::string percent(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", f * 100.0);
  return b;
}
std::string margin_percent(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", f * 100.0);
  return b;
}

// Element access on a host copy of an argument's extent: the dtype table's
// host decode.
double load(const ArgBuffer& a, const char* host, int64_t r, int64_t c) {
  const int64_t i = a.ld >= 0 ? r * a.ld + c : c * -a.ld + r;  // ld < 0: a column-major view (ArgSlot::col_major_ok)
  const core::DTypeInfo& d = core::dtype_info(a.dtype);
  return core::decode_bits(d, core::load_bits(d, host, static_cast<size_t>(i)));
}

// The poison bit pattern of a dtype, in its first dtype_size() bytes: the
// dtype table's (signalling NaNs a run never writes; see core::kDTypes).
using core::poison_bits;

bool is_poison(const ArgBuffer& a, const char* host, int64_t r, int64_t c) {
  const size_t es = dtype_size(a.dtype);
  uint32_t bits = 0;
  std::memcpy(&bits, host + (r * a.ld + c) * static_cast<int64_t>(es), es);  // little endian
  return bits == poison_bits(a.dtype);
}

// Writes the poison pattern over the logical elements of a host copy.
void poison_host(const ArgBuffer& a, char* host) {
  const size_t es = dtype_size(a.dtype);
  const uint32_t p = poison_bits(a.dtype);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) std::memcpy(host + (r * a.ld + c) * static_cast<int64_t>(es), &p, es);
}

Status zero_arg(DeviceMemory& mem, const ArgBuffer& a) {
  const size_t es = dtype_size(a.dtype);
  return mem.zero_2d(a.ptr, static_cast<size_t>(a.ld) * es, static_cast<size_t>(a.cols) * es,
                     static_cast<size_t>(a.rows));
}

}  // namespace

void validation_tolerance(core::OpKind op, DType t, double* atol_rel, double* rtol) noexcept {
  core::Problem p;
  p.op = op;
  validation_tolerance(p, t, atol_rel, rtol);
}

void validation_tolerance(const core::Problem& p, DType t, double* atol_rel, double* rtol) noexcept {
  const core::Tolerance tol = core::tolerance_of(core::spec_of(p.op), p, t);
  *atol_rel = tol.atol_rel;
  *rtol = tol.rtol;
}

DeviceMemory* memory_for(DeviceType backend) noexcept {
  // The host backend's is plain host memory.
  return core::backend_memory(backend);
}

// At most 8 GiB of workspace (a candidate asking more declines).
constexpr int64_t kMaxTunerWorkspace = int64_t{8} << 30;

TuneTarget make_target(const core::Problem& p, const core::LaunchArgs& la) {
  TuneTarget t;
  t.problem = p;
  const core::OpSpec& spec = core::spec_of(p.op);
  for (int i = 0; i < spec.slot_count(); ++i) {
    const core::ArgSlot& slot = spec.slots[static_cast<size_t>(i)];
    const core::SlotExtent e = core::slot_extent(spec, i, p);
    ArgBuffer a;
    a.name = std::string(slot.name);
    a.ptr = la.data[i];
    a.dtype = e.dtype;
    a.rows = a.ptr ? e.rows : 0;
    a.cols = e.cols;
    // A column-major view (ld < 0) keeps its ld even with one row: the
    // variants read it with the column stride (gemm_fp8_block's K-major
    // scale_a at K <= 128), and the extent must cover what they read.
    a.ld = slot.rank >= 2 && (e.rows > 1 || la.ld[i] < 0) ? la.ld[i] : e.cols;
    a.read = slot.role != core::Role::write;
    a.written = slot.role != core::Role::read;
    t.args.push_back(std::move(a));
  }
  // A write slot given as exactly its alias_of slot (rmsnorm with y == x)
  // is one buffer, read and written.
  for (int i = 0; i < spec.slot_count(); ++i) {
    const int r = spec.slots[static_cast<size_t>(i)].alias_of;
    if (r >= 0 && t.args[static_cast<size_t>(i)].ptr != nullptr &&
        t.args[static_cast<size_t>(i)].ptr == t.args[static_cast<size_t>(r)].ptr) {
      t.args[static_cast<size_t>(i)].read = true;
      t.args[static_cast<size_t>(r)].written = true;
    }
  }
  const core::Problem prob = p;
  // Candidates launch on the stream the backend's clock and memory use (a
  // CUDA tuning thread's per-thread default stream), never on the caller's.
  core::LaunchArgs tla = la;
  tla.stream = nullptr;
  tla.workspace = nullptr;
  tla.workspace_bytes = 0;
  if (const backends::Backend* b = backends::find(p.device.type); b && !b->is_host()) {
    tla.stream = b->tuner_stream();
    // Candidates get the tuning thread's own workspace (the caller's would
    // be ordered on the caller's stream, not the tuner's).
    if (spec.uses_workspace)
      tla.workspace =
          b->tuner_workspace(std::min(core::max_workspace_bytes(p), kMaxTunerWorkspace), &tla.workspace_bytes);
  } else {
    tla.workspace = la.workspace;  // the host: no stream to order against
    tla.workspace_bytes = la.workspace_bytes;
  }
  t.launch = [tla, prob](const core::Plan& plan) { return plan.variant->launch(tla, prob, plan.params); };
  t.launch_at = [tla, prob](const core::Plan& plan, const std::vector<void*>& ptr) {
    core::LaunchArgs l = tla;
    for (size_t i = 0; i < ptr.size() && i < static_cast<size_t>(core::kMaxArgs); ++i)
      if (tla.data[i]) l.data[i] = ptr[i];
    return plan.variant->launch(l, prob, plan.params);
  };
  if (tla.stream != nullptr) {  // a device target: the graph mode may capture it elsewhere
    t.launch_on = [tla, prob](const core::Plan& plan, const std::vector<void*>& ptr, void* stream) {
      core::LaunchArgs l = tla;
      for (size_t i = 0; i < ptr.size() && i < static_cast<size_t>(core::kMaxArgs); ++i)
        if (tla.data[i]) l.data[i] = ptr[i];
      if (stream) l.stream = stream;
      return plan.variant->launch(l, prob, plan.params);
    };
  }
  return t;
}

void zero_reset_args(const TuneTarget& target, const core::Plan& plan) noexcept {
  if (!plan.variant || plan.variant->reset_args == 0) return;
  DeviceMemory& mem = target.mem ? *target.mem : host_memory();
  for (size_t i = 0; i < target.args.size(); ++i)
    if ((plan.variant->reset_args >> i) & 1u)
      if (target.args[i].ptr) (void)zero_arg(mem, target.args[i]);
}

std::vector<core::Plan> candidates_for(const core::Problem& p, const DeviceInfo& dev, const core::Plan& def,
                                       const SearchOptions& o, int32_t* space, int32_t* pruned) {
  struct Scored {
    core::Plan plan;
    double score;
  };
  std::vector<Scored> pts;
  int32_t n_space = 0, n_pruned = 0;
  for (const core::VariantDef* v : core::variants_for(p.op, p.device.type)) {
    if (v->in_dtype != p.in_dtype) continue;
    if (v->flags & core::kVariantReference) continue;
    if (excluded_by_determinism(o.deterministic, *v)) continue;
    std::vector<core::Plan> sp = core::config_space(*v, p, dev);
    n_space += static_cast<int32_t>(sp.size());
    std::vector<Scored> mine;
    for (const core::Plan& plan : sp) {
      double score;
      if (v->estimate_us) {
        score = v->estimate_us(p, plan.params, dev);
      } else {
        // No model: explore outward from the default (fewest differing params).
        score = 0.0;
        if (def.variant != v) score += 100.0;
        for (size_t i = 0; i < v->params.size(); ++i)
          if (def.variant != v || plan.params[i] != def.params[i]) score += 1.0;
      }
      mine.push_back({plan, score});
    }
    if (v->estimate_us && o.max_candidates > 0 && static_cast<int>(mine.size()) > o.max_candidates) {
      std::stable_sort(mine.begin(), mine.end(), [](const Scored& a, const Scored& b) { return a.score < b.score; });
      n_pruned += static_cast<int32_t>(mine.size()) - o.max_candidates;
      mine.resize(static_cast<size_t>(o.max_candidates));
    }
    for (auto& s : mine) pts.push_back(s);
  }
  std::stable_sort(pts.begin(), pts.end(), [](const Scored& a, const Scored& b) { return a.score < b.score; });
  std::vector<core::Plan> out;
  if (def.valid() && !excluded_by_determinism(o.deterministic, *def.variant)) out.push_back(def);
  for (const auto& s : pts) {
    const bool is_def = def.valid() && s.plan == def;
    if (!is_def) out.push_back(s.plan);
  }
  if (space) *space = n_space;
  if (pruned) *pruned = n_pruned;
  return out;
}

namespace {

// A buffer in a backend's memory, released with it.
struct DevBuf {
  DeviceMemory* mem = nullptr;
  void* p = nullptr;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : mem(o.mem), p(o.p) { o.p = nullptr; }
  ~DevBuf() {
    if (p) mem->release(p);
  }
};

// One search, stage by stage (see search.hpp for what and why): snapshot
// the written arguments, run the reference, then per candidate validate and
// time, then confirm the winner against the default, and resolve a dynamic
// family's "pick at run time" point. On destruction every written argument
// is back to what the caller had.
class Searcher {
 public:
  Searcher(TuneTarget& t, const std::vector<core::Plan>& candidates, const core::Plan& reference,
           const SearchOptions& o, bool verify = false)
      : verify_(verify),
        hook_(timing_hook()),
        t_(t),
        cands_(candidates),
        reference_(reference),
        o_(o),
        n_(t.args.size()),
        mem_(t.mem ? *t.mem : host_memory()),
        saved_(n_),
        host_(n_),
        poisoned_(n_),
        ref_(n_),
        ref_dev_(n_) {}
  ~Searcher() { restore_all(); }

  Result<SearchResult> run() {
    res_.default_plan = cands_.front();
    t_start_ = std::chrono::steady_clock::now();
    if (Status s = snapshot(); !s.ok()) return s;
    if (o_.validate)
      if (Status s = run_reference(); !s.ok()) return s;
    DeviceInfo no_dev;
    clock_ = mem_.make_clock(o_.device ? *o_.device : no_dev);
    run_candidates();
    if (verify_) return run_verify();
    pick_incumbent();
    confirm();
    resolve_dynamic();
    if (clock_) res_.clock_note = clock_->screen_note();
    if (!res_.best.valid() && !res_.stopped)
      return make_status(StatusCode::no_variant,
                         "every candidate failed to launch or was rejected (" + std::to_string(res_.failed) +
                             " failed, " + std::to_string(res_.rejected) + " rejected)" +
                             (res_.tried.empty() ? std::string() : ": " + res_.tried.front().status.message()));
    return std::move(res_);
  }

 private:
  bool stop_requested() const { return o_.stop && o_.stop->load(std::memory_order_relaxed); }

  // A median through the test hook, when one is set.
  double hooked(const core::Plan& plan, int placement, double us) const {
    return hook_ && *hook_ ? (*hook_)(plan, placement, us) : us;
  }

  // verify_plan: cands_ = {floor, row}, both validated and timed by
  // run_candidates(); the row is the challenger of the confirmation whatever
  // the first timings said.
  Result<SearchResult> run_verify() {
    if (res_.stopped) return std::move(res_);
    if (res_.tried.empty() || !res_.tried[0].status.ok())
      return make_status(res_.tried.empty() ? StatusCode::internal : res_.tried[0].status.code(),
                         "the floor " + core::plan_to_string(cands_[0]) + " could not be timed here: " +
                             (res_.tried.empty() ? std::string("not run") : res_.tried[0].status.message()));
    inc_ = 0;
    res_.default_plan = cands_[0];
    res_.default_us = res_.tried[0].timing.median_us;
    if (res_.tried.size() < 2 || !res_.tried[1].status.ok()) {  // the row cannot run here: the floor stays
      res_.best = cands_[0];
      res_.best_us = res_.default_us;
      res_.kept_default = true;
      res_.why =
          "the row failed here: " + (res_.tried.size() < 2 ? std::string("not run") : res_.tried[1].status.message());
      return std::move(res_);
    }
    res_.best = cands_[1];
    res_.best_us = res_.tried[1].timing.median_us;
    confirm();
    return std::move(res_);
  }

  // 1. Snapshot every written argument (in-place ones to restore before each
  //    rep; pure outputs so the caller gets its bytes back at the end), in
  //    the backend's memory; pure outputs also get a poisoned host image.
  Status snapshot() {
    for (size_t i = 0; i < n_; ++i) {
      const ArgBuffer& a = t_.args[i];
      if (!a.ptr || !a.written) continue;
      const size_t b = a.extent_bytes();
      saved_[i].mem = &mem_;
      saved_[i].p = mem_.alloc(b);
      if (!saved_[i].p) return make_status(StatusCode::out_of_memory, "snapshot of '" + a.name + "'");
      if (Status s = mem_.copy(saved_[i].p, a.ptr, b); !s.ok()) return s;
      host_[i].resize(b);
    }
    // Pure outputs: a host copy of the snapshot with the logical elements
    // poisoned, written over the output (the gaps between rows keep the
    // caller's bytes).
    for (size_t i = 0; i < n_; ++i) {
      const ArgBuffer& a = t_.args[i];
      if (!saved_[i].p || a.read) continue;
      poisoned_[i].resize(a.extent_bytes());
      if (Status s = mem_.to_host(poisoned_[i].data(), saved_[i].p, a.extent_bytes()); !s.ok()) return s;
      poison_host(a, poisoned_[i].data());
    }
    return Status();
  }

  void restore(uint32_t extra_restore) {
    for (size_t i = 0; i < n_; ++i) {
      const ArgBuffer& a = t_.args[i];
      if (!saved_[i].p) continue;
      if ((a.read && a.written) || ((extra_restore >> i) & 1u)) (void)mem_.copy(a.ptr, saved_[i].p, a.extent_bytes());
    }
  }
  void restore_all() {
    for (size_t i = 0; i < n_; ++i)
      if (saved_[i].p) (void)mem_.copy(t_.args[i].ptr, saved_[i].p, t_.args[i].extent_bytes());
    (void)mem_.sync();
  }
  void prepare_for(const core::Plan& plan) {
    restore(plan.variant->restore_args);
    zero_reset_args(t_, plan);
  }
  void poison_outputs() {
    for (size_t i = 0; i < n_; ++i)
      if (!poisoned_[i].empty()) (void)mem_.from_host(t_.args[i].ptr, poisoned_[i].data(), poisoned_[i].size());
  }
  Status fetch(size_t i) { return mem_.to_host(host_[i].data(), t_.args[i].ptr, host_[i].size()); }

  // 2. The reference's output on the same inputs: a copy in the backend's
  //    memory (compared there when the backend can), else a host copy.
  Status run_reference() {
    if (!reference_.valid()) return make_status(StatusCode::no_variant, "no reference variant for this problem");
    prepare_for(reference_);
    poison_outputs();
    if (Status s = t_.launch(reference_); !s.ok()) return s;
    if (Status s = mem_.sync(); !s.ok()) return s;
    device_compare_ = true;
    for (size_t i = 0; i < n_ && device_compare_; ++i) {
      const ArgBuffer& a = t_.args[i];
      if (!a.ptr || !a.written) continue;
      ref_dev_[i].mem = &mem_;
      ref_dev_[i].p = mem_.alloc(a.extent_bytes());
      if (!ref_dev_[i].p) return make_status(StatusCode::out_of_memory, "reference copy of '" + a.name + "'");
      if (Status s = mem_.copy(ref_dev_[i].p, a.ptr, a.extent_bytes()); !s.ok()) return s;
      double atol = 0, rtol = 0;
      validation_tolerance(t_.problem, a.dtype, &atol, &rtol);
      // Probe: the reference against itself tells whether the backend
      // compares on its own (and must pass).
      auto probe = mem_.compare(a, ref_dev_[i].p, atol, rtol, false);
      if (!probe.ok())
        device_compare_ = false;
      else if (!probe->ok)
        return make_status(StatusCode::internal, "device compare of the reference with itself failed");
    }
    for (size_t i = 0; i < n_ && !device_compare_; ++i) {
      const ArgBuffer& a = t_.args[i];
      if (!a.ptr || !a.written) continue;
      if (Status s = fetch(i); !s.ok()) return s;
      ref_[i].resize(static_cast<size_t>(a.rows * a.cols));
      for (int64_t r = 0; r < a.rows; ++r)
        for (int64_t c = 0; c < a.cols; ++c)
          ref_[i][static_cast<size_t>(r * a.cols + c)] = load(a, host_[i].data(), r, c);
    }
    return Status();
  }

  // Every written argument of a validation run against the reference.
  Status check(const core::Plan& plan) {
    if (Status s = mem_.sync(); !s.ok()) return s;
    for (size_t i = 0; i < n_; ++i) {
      const ArgBuffer& a = t_.args[i];
      if (!a.ptr || !a.written) continue;
      double atol = 0, rtol = 0;
      validation_tolerance(t_.problem, a.dtype, &atol, &rtol);
      if (Status s = device_compare_ ? check_on_device(plan, i, atol, rtol) : check_on_host(plan, i, atol, rtol);
          !s.ok())
        return s;
    }
    return Status();
  }
  Status check_on_device(const core::Plan& plan, size_t i, double atol, double rtol) {
    const ArgBuffer& a = t_.args[i];
    auto m = mem_.compare(a, ref_dev_[i].p, atol, rtol, !a.read);
    if (!m.ok()) return m.status();
    if (m->ok) return Status();
    const std::string where = "'" + a.name + "'[" + std::to_string(m->row) + "," + std::to_string(m->col) + "]";
    if (m->unwritten)
      return make_status(StatusCode::internal, std::string(plan.variant->name) + " left " + where + " unwritten");
    return make_status(StatusCode::internal, std::string(plan.variant->name) + " differs from the reference at " +
                                                 where + ": " + std::to_string(m->got) + " vs " +
                                                 std::to_string(m->want));
  }
  Status check_on_host(const core::Plan& plan, size_t i, double atol, double rtol) {
    const ArgBuffer& a = t_.args[i];
    if (Status s = fetch(i); !s.ok()) return s;
    const char* h = host_[i].data();
    double scale = 0.0;
    for (double v : ref_[i])
      if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t c = 0; c < a.cols; ++c) {
        auto where = [&] { return "'" + a.name + "'[" + std::to_string(r) + "," + std::to_string(c) + "]"; };
        if (!a.read && is_poison(a, h, r, c))
          return make_status(StatusCode::internal, std::string(plan.variant->name) + " left " + where() + " unwritten");
        const double got = load(a, h, r, c);
        const double want = ref_[i][static_cast<size_t>(r * a.cols + c)];
        if (std::isnan(want)) continue;  // the reference's NaN (NaN input): any NaN matches
        if (std::isnan(got) || std::fabs(got - want) > atol * scale + rtol * std::fabs(want))
          return make_status(StatusCode::internal, std::string(plan.variant->name) + " differs from the reference at " +
                                                       where() + ": " + std::to_string(got) + " vs " +
                                                       std::to_string(want));
      }
    return Status();
  }

  // 3. Per candidate, in order: a validation run on poisoned outputs, then
  //    the timing (the default first; the budget ends the loop only once
  //    there is a valid pick), with the duty cycle's sleep between them.
  void run_candidates() {
    for (size_t ci = 0; ci < cands_.size(); ++ci) {
      if (stop_requested()) {
        res_.stopped = true;
        return;
      }
      const double elapsed_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start_).count();
      if (!verify_ && ci > 0 && res_.best.valid() && elapsed_ms > o_.time_budget_ms) {
        res_.out_of_time = true;
        return;
      }
      const auto c_start = std::chrono::steady_clock::now();
      if (!try_candidate(ci)) return;  // stopped
      idle_after(c_start);
    }
  }

  // Validates and times candidate ci; false when a stop request ended it.
  bool try_candidate(size_t ci) {
    const core::Plan& plan = cands_[ci];
    CandidateResult cr;
    cr.plan = plan;
    if (o_.validate) {
      prepare_for(plan);
      poison_outputs();
      if (Status s = t_.launch(plan); !s.ok()) {
        cr.status = s;
        ++res_.failed;
        res_.tried.push_back(std::move(cr));
        return true;
      }
      if (Status v = check(plan); !v.ok()) {
        cr.status = v;
        ++res_.rejected;
        res_.tried.push_back(std::move(cr));
        return true;
      }
    }
    MeasureOptions mo = o_.measure;
    if (best_ > 0 && !verify_) mo.abandon_above_us = best_ * 1.5;
    bool stop_seen = false;
    auto prepare = [&]() -> Status {
      if (stop_requested()) {
        stop_seen = true;
        return make_status(StatusCode::internal, "stopped");
      }
      prepare_for(plan);
      return Status();
    };
    auto timing = measure(
        *clock_, prepare, [&]() { return t_.launch(plan); }, mo);
    if (!timing.ok()) {
      if (stop_seen) {
        res_.stopped = true;
        return false;
      }
      cr.status = timing.status();
      ++res_.failed;
      res_.tried.push_back(std::move(cr));
      return true;
    }
    cr.timing = *timing;
    cr.timing.median_us = hooked(plan, -1, cr.timing.median_us);
    if (ci == 0) res_.default_us = cr.timing.median_us;
    if (!res_.best.valid() || cr.timing.median_us < best_) {
      best_ = cr.timing.median_us;
      res_.best = plan;
      res_.best_us = best_;
    }
    res_.tried.push_back(std::move(cr));
    return true;
  }

  // The duty cycle: sleep busy * (1 - d) / d in small slices (a stop
  // request is honoured quickly).
  void idle_after(std::chrono::steady_clock::time_point c_start) {
    if (!(o_.duty_cycle > 0 && o_.duty_cycle < 1)) return;
    const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - c_start).count();
    const double idle = busy * (1.0 - o_.duty_cycle) / o_.duty_cycle;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(idle);
    while (std::chrono::steady_clock::now() < until) {
      if (stop_requested()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // The argument pointers of confirmation placement `pl` (0: the search's
  // buffers; then fresh copies of the read-only inputs, within the copy
  // budget). The copies keep the original's offset within 256 bytes: a plan
  // that picks by alignment (cuBLASLt's get_default pick) picks the same.
  std::vector<void*> placement(int pl, std::vector<DevBuf>* copies, int64_t* copied) {
    std::vector<void*> ptr(n_, nullptr);
    for (size_t i = 0; i < n_; ++i) ptr[i] = t_.args[i].ptr;
    if (pl == 0 || !t_.launch_at) return ptr;
    for (size_t i = 0; i < n_; ++i) {
      const ArgBuffer& a = t_.args[i];
      if (!a.ptr || !a.read || a.written) continue;  // written args keep their snapshots' address
      const size_t b = a.extent_bytes();
      const size_t off = static_cast<size_t>(reinterpret_cast<uintptr_t>(a.ptr) % 256);
      if (b == 0 || *copied + static_cast<int64_t>(b + off) > o_.confirm_copy_bytes) continue;  // stays put
      DevBuf c;
      c.mem = &mem_;
      c.p = mem_.alloc(b + off);
      if (!c.p) continue;  // no memory: this arg stays where it is
      *copied += static_cast<int64_t>(b + off);
      void* at = static_cast<char*>(c.p) + off;
      if (mem_.copy(at, a.ptr, b).ok()) ptr[i] = at;
      copies->push_back(std::move(c));
    }
    return ptr;
  }

  // Two rounds of the default and the winner on one placement, in the
  // order of the round plan; the rounds' summed medians in us[0] (default)
  // and us[1] (winner). False when a plan could not be timed again.
  bool time_placement(int pl, const std::vector<void*>& ptr, double us[2]) {
    const core::Plan& def = cands_[inc_];
    const bool moved = pl > 0 && t_.launch_at;
    for (int round = 0; round < 2; ++round) {
      const bool def_first = (pl % 2 == 0) == (round == 0);
      const core::Plan* first = def_first ? &def : &res_.best;
      const core::Plan* second = def_first ? &res_.best : &def;
      for (const core::Plan* plan : {first, second}) {
        auto prepare = [&]() -> Status {
          if (stop_requested()) {  // shutting down: checked every rep
            res_.stopped = true;
            return make_status(StatusCode::internal, "stopped");
          }
          prepare_for(*plan);
          return Status();
        };
        auto tm = measure(
            *clock_, prepare, [&]() { return moved ? t_.launch_at(*plan, ptr) : t_.launch(*plan); }, o_.measure);
        if (!tm.ok()) return false;
        us[plan == &def ? 0 : 1] += hooked(*plan, pl, tm->median_us);
      }
    }
    return us[0] > 0;
  }

  // The graph mode's copies of the read-only inputs: set 0 is the search's
  // buffers, sets 1.. fresh copies, as many as make the sets together more
  // than twice the device's L2 (a model's layers each read their own
  // weights: back to back, nothing stays in L2), at most kGraphMaxSets and
  // within what the copy budget has left. A target without launch_at, or
  // without read-only inputs, gets one set (no rotation).
  std::vector<std::vector<void*>> graph_sets(std::vector<DevBuf>* copies, int64_t* copied) {
    std::vector<std::vector<void*>> sets;
    sets.push_back(placement(0, copies, copied));
    int64_t bytes = 0;
    for (const ArgBuffer& a : t_.args)
      if (a.ptr && a.read && !a.written) bytes += static_cast<int64_t>(a.extent_bytes());
    res_.graph_set_bytes = bytes;
    const int64_t l2 = o_.device ? o_.device->l2_bytes : 0;
    if (!t_.launch_at || bytes <= 0 || l2 <= 0) return sets;
    const int64_t want = std::min<int64_t>(kGraphMaxSets, 2 * l2 / bytes + 2);
    while (static_cast<int64_t>(sets.size()) < want) {
      // (room left for the cold placements' own copies, made after this)
      const int64_t cold_left = (kConfirmPlacements - 1) * (bytes + 256 * static_cast<int64_t>(n_));
      if (*copied + cold_left + bytes + 256 * static_cast<int64_t>(n_) > o_.confirm_copy_bytes) break;
      const size_t before = copies->size();
      std::vector<void*> ptr = placement(1, copies, copied);
      if (copies->size() == before) break;  // nothing more could be copied
      sets.push_back(std::move(ptr));
    }
    res_.graph_set_bytes = bytes * static_cast<int64_t>(sets.size());
    return sets;
  }

  // The graph mode on placement `pl`: the default and the winner each
  // captured as `calls` calls back to back (call i on set i % sets), in the
  // round order of the placement's first cold round; medians (µs per call)
  // in us[0] (default) and us[1] (winner). The status of the first failure
  // and whose it was: `*who` = 0 the default's, 1 the winner's, 2 both's (a
  // plan that fails is not blamed for what fails the other plan too: the
  // capture itself, a clock without a graph mode).
  Status time_graph_placement(int pl, const std::vector<std::vector<void*>>& sets, int calls, double us[2], int* who) {
    const core::Plan& def = cands_[inc_];
    const bool def_first = pl % 2 == 0;
    Status first_failure;
    *who = -1;
    for (const core::Plan* plan : {def_first ? &def : &res_.best, def_first ? &res_.best : &def}) {
      const int mine = plan == &def ? 0 : 1;
      if (stop_requested()) {
        res_.stopped = true;
        *who = mine;
        return make_status(StatusCode::internal, "stopped");
      }
      prepare_for(*plan);  // restores and zeroes outside the capture
      const size_t n = sets.size();
      auto r = clock_->time_graph(
          [&](int i, void* stream) {
            const std::vector<void*>& ptr = sets[static_cast<size_t>(i) % n];
            if (t_.launch_on) return t_.launch_on(*plan, ptr, stream);  // set 0: the search's own buffers
            return t_.launch_at && n > 1 ? t_.launch_at(*plan, ptr) : t_.launch(*plan);
          },
          calls, kGraphReps);
      if (!r.ok()) {
        if (!first_failure.ok()) return *who = 2, first_failure;  // both failed
        first_failure = r.status();
        *who = mine;
        continue;  // does the other plan fail too?
      }
      const double med = summarize(*r).median_us;
      if (!(med > 0)) {  // a clock that measured nothing: no graph timing
        *who = 2;
        return make_status(StatusCode::internal, "a graph replay measured 0 us");
      }
      us[mine] = hooked(*plan, kGraphHookPlacement + pl, med);
    }
    return first_failure;
  }

  // The incumbent the confirmation holds the winner against: the first
  // candidate (the floor), or the second (get_default's plan, which the
  // tuner puts there) when the first failed to launch or validate here (a
  // floor that declines this call must not let any winner through
  // unconfirmed).
  void pick_incumbent() {
    inc_ = 0;
    if (!res_.tried.empty() && !res_.tried[0].status.ok() && res_.tried.size() > 1 && res_.tried[1].status.ok() &&
        res_.tried[1].plan == cands_[1])
      inc_ = 1;
    res_.default_plan = cands_[inc_];
    if (inc_ == 1 && res_.tried[1].timing.median_us > 0) res_.default_us = res_.tried[1].timing.median_us;
  }

  // 4. The confirmation: the winner and the default again, on
  //    kConfirmPlacements placements of the read-only inputs, two rounds
  //    each in both orders (ABBA BAAB); the winner replaces the default only
  //    when faster on every placement and > o_.margin faster on the
  //    mean ratio. Why each part: search.hpp and
  //    bench/results/h200_gemm_fixed.md (the winner's curse, placements of
  //    the weights, the order of measurement).
  void confirm() {
    const core::Plan& def = cands_[inc_];
    const bool def_ok =
        res_.tried.size() > inc_ && res_.tried[inc_].status.ok() && res_.tried[inc_].timing.median_us > 0;
    // The incumbent is get_default's plan when the floor declined the call.
    const std::string who = inc_ == 0 ? "floor" : "get_default's plan (the floor declined this call)";
    if (res_.best.valid() && !res_.stopped) {
      if (res_.best == def)
        res_.why = who + " kept: no candidate beat it in the search";
      else if (!def_ok)
        res_.why = "the floor could not be timed: the search's fastest kept, unconfirmed";
      else if (!o_.confirm)
        res_.why = "the search's fastest, not confirmed";
    }
    if (!res_.best.valid() || !def_ok || res_.stopped || !o_.confirm || res_.best == def) return;
    std::vector<DevBuf> copies;  // released when the confirmation ends
    copies.reserve(static_cast<size_t>(kConfirmPlacements + kGraphMaxSets) * n_);
    int64_t copied = 0;
    double again_best = 0, again_def = 0, graph_best = 0, graph_def = 0;
    std::vector<double> def_per_placement;
    bool ok = true;
    // The graph mode's sets and calls; off when the option is, or when the
    // clock answers unsupported_problem (the CPU).
    bool graph = o_.graph && clock_ != nullptr && clock_->has_graph();
    std::vector<std::vector<void*>> sets;
    int calls = kGraphCalls;
    std::string graph_failed;  // the default could not run in a graph: cold decides, the why says so
    for (int pl = 0; pl < kConfirmPlacements && ok; ++pl) {
      const std::vector<void*> ptr = placement(pl, &copies, &copied);
      double us[2] = {0, 0};
      if (!time_placement(pl, ptr, us)) {
        ok = false;
        res_.confirm_ratios.clear();  // not confirmed: no partial ratios
        break;
      }
      again_def += us[0] / 2;
      again_best += us[1] / 2;
      def_per_placement.push_back(us[0] / 2);
      res_.confirm_ratios.push_back(us[1] / us[0]);
      if (!graph) continue;
      if (sets.empty()) {
        sets = graph_sets(&copies, &copied);
        calls = std::max<int>(static_cast<int>(sets.size()), us[0] / 2 > kGraphLongUs ? kGraphCallsLong : kGraphCalls);
      }
      double g[2] = {0, 0};
      int failed_plan = 0;
      if (Status s = time_graph_placement(pl, sets, calls, g, &failed_plan); !s.ok()) {
        graph = false;
        res_.graph_ratios.clear();
        res_.graph_sets = 0;
        res_.graph_set_bytes = 0;
        if (res_.stopped || failed_plan == 1) {
          // A winner that cannot be captured is not served: an engine runs
          // it in a graph. (A stop request ends the confirmation too.)
          ok = false;
          res_.confirm_ratios.clear();
          if (!res_.stopped) {
            graph_failed = "the winner could not run in a graph: " + s.message();
            res_.challenger_not_in_graph = true;
          }
          break;
        }
        if (s.code() == StatusCode::unsupported_problem && pl == 0 && failed_plan == 2) continue;  // no graph mode
        graph_failed =
            (failed_plan == 0 ? "the floor could not run in a graph (" : "no plan could be timed in a graph (") +
            s.message() + "): cold timing decided";
        continue;
      }
      graph_def += g[0];
      graph_best += g[1];
      res_.graph_ratios.push_back(g[1] / g[0]);
    }
    if (!ok) {
      // A plan that could not be timed again (a launch refused on a copy,
      // say, or a stop request) is no confirmed winner: the default stays.
      res_.best = def;
      res_.best_us = res_.tried[inc_].timing.median_us;
      res_.kept_default = true;
      res_.graph_ratios.clear();
      res_.why = who + " kept: " + (graph_failed.empty() ? "the winner could not be timed again" : graph_failed);
      return;
    }
    if (!(again_def > 0)) return;
    res_.confirmed = true;
    double mean_ratio = 0;
    bool wins_everywhere = true;
    for (double r : res_.confirm_ratios) {
      mean_ratio += r / kConfirmPlacements;
      wins_everywhere = wins_everywhere && r < 1.0;
    }
    const bool graphed = graph && res_.graph_ratios.size() == static_cast<size_t>(kConfirmPlacements);
    double graph_mean = 0;
    bool graph_everywhere = true;
    if (graphed) {
      res_.timing = "cold+graph";
      res_.graph_sets = static_cast<int32_t>(sets.size());
      res_.graph_default_us = graph_def / kConfirmPlacements;
      res_.graph_challenger_us = graph_best / kConfirmPlacements;
      for (double r : res_.graph_ratios) {
        graph_mean += r / kConfirmPlacements;
        graph_everywhere = graph_everywhere && r < 1.0;
      }
    } else {
      res_.graph_ratios.clear();
    }
    double dmin = 1e300, dmax = 0, dsum = 0;
    for (double d : def_per_placement) dmin = std::min(dmin, d), dmax = std::max(dmax, d), dsum += d;
    if (dsum > 0) res_.aa_spread = (dmax - dmin) / (dsum / static_cast<double>(def_per_placement.size()));
    res_.challenger_us = again_best / kConfirmPlacements;
    const std::string by = percent(1.0 - mean_ratio), margin = "margin " + margin_percent(o_.margin) + "%";
    const std::string gby = percent(1.0 - graph_mean);
    const bool cold_wins = wins_everywhere && mean_ratio <= 1.0 - o_.margin;
    const bool graph_wins = !graphed || (graph_everywhere && graph_mean <= 1.0 - o_.margin);
    const std::string note = graph_failed.empty() ? "" : "; " + graph_failed;
    if (!cold_wins || !graph_wins) {
      res_.best = def;
      res_.best_us = again_def / kConfirmPlacements;
      res_.kept_default = true;
      if (!cold_wins)
        res_.why = !wins_everywhere ? who + " kept: lost a placement" : who + " kept: won by " + by + "% < " + margin;
      else
        res_.why =
            who + " kept: won cold by " + by + "% but " +
            (!graph_everywhere ? std::string("lost a placement in a graph") : "in a graph by " + gby + "% < " + margin);
      res_.why += note;
    } else {
      res_.best_us = again_best / kConfirmPlacements;
      res_.why = (inc_ == 0 ? "beat floor by " : "beat get_default's plan (the floor declined this call) by ") + by +
                 "%" + (graphed ? " cold, " + gby + "% in a graph" : std::string()) + " (" + margin + ")" + note;
    }
    res_.default_us = again_def / kConfirmPlacements;
  }

  // 5. A dynamic family's "resolve at run time" point (cuBLASLt's algo_id
  //    -1: its heuristic's first pick, asked on the call) is not what a table
  //    should hold: a hit on it would query and lock. It is the same
  //    algorithm as that family's first enumerated candidate, which was
  //    measured too: persist that one. When the budget ran out before it was
  //    measured (large M), the first enumerated candidate is still the same
  //    heuristic query with the same workspace: persist it.
  void resolve_dynamic() {
    // Only -1 ("the heuristic's pick at the call", get_default's point) is
    // resolved; -2 (the floor: the pick torch's call gets) is recorded as it
    // is, so the row keeps running what torch runs.
    if (!res_.best.valid() || !(res_.best.variant->flags & core::kVariantDynamicSpace) || res_.best.params[0] != -1)
      return;
    for (const CandidateResult& cr : res_.tried)
      if (cr.plan.variant == res_.best.variant && cr.plan.params[0] >= 0 && cr.status.ok()) {
        res_.best = cr.plan;
        return;
      }
    for (const core::Plan& c : cands_)
      if (c.variant == res_.best.variant && c.params[0] >= 0) {
        res_.best = c;
        return;
      }
  }

  const bool verify_;  // verify_plan: {floor, row}, the row always confirmed
  const std::shared_ptr<const TimingHook> hook_;
  TuneTarget& t_;
  const std::vector<core::Plan>& cands_;
  const core::Plan& reference_;
  const SearchOptions& o_;
  const size_t n_;
  DeviceMemory& mem_;
  std::vector<DevBuf> saved_;                // snapshots of the written arguments
  std::vector<std::vector<char>> host_;      // host staging per written argument
  std::vector<std::vector<char>> poisoned_;  // poisoned host images of the pure outputs
  std::vector<std::vector<double>> ref_;     // the reference's output on the host
  std::vector<DevBuf> ref_dev_;              // ... and in the backend's memory
  bool device_compare_ = false;
  size_t inc_ = 0;  // the incumbent's index in cands_ and res_.tried (pick_incumbent)
  std::unique_ptr<Clock> clock_;
  std::chrono::steady_clock::time_point t_start_;
  double best_ = 0.0;
  SearchResult res_;
};

}  // namespace

void set_timing_hook_for_testing(TimingHook hook) {
  std::lock_guard<std::mutex> lock(g_hook_mu);
  g_hook = hook ? std::make_shared<const TimingHook>(std::move(hook)) : nullptr;
}

Result<SearchResult> verify_plan(TuneTarget& t, const core::Plan& floor, const core::Plan& row,
                                 const core::Plan& reference, const SearchOptions& o) noexcept {
  try {
    if (!floor.valid() || !row.valid()) return make_status(StatusCode::invalid_argument, "verify_plan: no plan");
    const std::vector<core::Plan> cands = {floor, row};
    SearchOptions vo = o;
    vo.confirm = true;
    Searcher searcher(t, cands, reference, vo, /*verify=*/true);
    return searcher.run();
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "verifying a row (snapshots of the written arguments)");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("verifying a row: ") + e.what());
  }
}

Result<SearchResult> search(TuneTarget& t, const std::vector<core::Plan>& candidates, const core::Plan& reference,
                            const SearchOptions& o) noexcept {
  try {
    if (candidates.empty()) return make_status(StatusCode::no_variant, "no candidate accepts this problem");
    Searcher searcher(t, candidates, reference, o);
    return searcher.run();
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "tuning search (snapshots of the written arguments)");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("tuning search: ") + e.what());
  }
}

}  // namespace dispatch::tune
