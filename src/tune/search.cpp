// SPDX-License-Identifier: Apache-2.0
#include "tune/search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>

#include "core/numeric.hpp"
#include "core/op_spec.hpp"
#include "core/registry.hpp"
#include "gpu/gpu_backend.hpp"

namespace dispatch::tune {
namespace {

// Poison bit patterns: signalling NaNs with a payload no arithmetic yields
// (arithmetic on a signalling NaN returns a quiet one), so a pattern left in
// an output after a run means the element was never written.
constexpr uint32_t kPoison32 = kPoisonFp32;
constexpr uint16_t kPoison16bf = kPoisonBf16;  // bf16: exponent all ones, quiet bit clear
constexpr uint16_t kPoison16h = kPoisonFp16;   // fp16: exponent all ones, quiet bit clear

// Element access on a host copy of an argument's extent.
double load(const ArgBuffer& a, const char* host, int64_t r, int64_t c) {
  const int64_t i = r * a.ld + c;
  const char* e = host + i * static_cast<int64_t>(dtype_size(a.dtype));
  uint8_t b8 = 0;
  uint16_t b16 = 0;
  switch (a.dtype) {
    case DType::fp32: {
      float f;
      std::memcpy(&f, e, 4);
      return f;
    }
    case DType::int32: {
      int32_t v;
      std::memcpy(&v, e, 4);
      return v;
    }
    case DType::bf16: std::memcpy(&b16, e, 2); return core::bf16_to_float(b16);
    case DType::fp16: std::memcpy(&b16, e, 2); return core::fp16_to_float(b16);
    case DType::fp8_e4m3fn: std::memcpy(&b8, e, 1); return core::fp8_to_float(b8, 4, 7, true, false);
    case DType::fp8_e4m3fnuz: std::memcpy(&b8, e, 1); return core::fp8_to_float(b8, 4, 8, true, true);
    case DType::fp8_e5m2: std::memcpy(&b8, e, 1); return core::fp8_to_float(b8, 5, 15, false, false);
  }
  return 0.0;
}

// The poison bit pattern of a dtype, in its first dtype_size() bytes.
uint32_t poison_bits(DType t) noexcept {
  switch (t) {
    case DType::fp32:
    case DType::int32: return kPoison32;
    case DType::bf16: return kPoison16bf;
    case DType::fp16: return kPoison16h;
    case DType::fp8_e4m3fn:
    case DType::fp8_e4m3fnuz:
    case DType::fp8_e5m2: return 0x7fu;  // a NaN (e4m3fn) / large value: fp8 outputs are not poisoned exactly
  }
  return 0;
}

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

class HostMemory final : public DeviceMemory {
 public:
  void* alloc(size_t bytes) override { return ::operator new(bytes, std::nothrow); }
  void release(void* p) override { ::operator delete(p); }
  Status to_host(void* d, const void* s, size_t n) override { return (std::memcpy(d, s, n), Status()); }
  Status from_host(void* d, const void* s, size_t n) override { return (std::memcpy(d, s, n), Status()); }
  Status copy(void* d, const void* s, size_t n) override { return (std::memmove(d, s, n), Status()); }
  Status zero_2d(void* d, size_t pitch, size_t width, size_t rows) override {
    for (size_t r = 0; r < rows; ++r) std::memset(static_cast<char*>(d) + r * pitch, 0, width);
    return Status();
  }
  Status sync() override { return Status(); }
  std::unique_ptr<Clock> make_clock(const DeviceInfo& dev) override { return std::make_unique<CpuClock>(dev.l2_bytes); }
};

Status zero_arg(DeviceMemory& mem, const ArgBuffer& a) {
  const size_t es = dtype_size(a.dtype);
  return mem.zero_2d(a.ptr, static_cast<size_t>(a.ld) * es, static_cast<size_t>(a.cols) * es, static_cast<size_t>(a.rows));
}

}  // namespace

void validation_tolerance(core::OpKind op, DType t, double* atol_rel, double* rtol) noexcept {
  const core::Tolerance& tol = core::spec_of(op).tolerance[static_cast<size_t>(t)];
  *atol_rel = tol.atol_rel;
  *rtol = tol.rtol;
}

DeviceMemory& host_memory() noexcept {
  static HostMemory m;
  return m;
}

DeviceMemory* memory_for(DeviceType backend) noexcept {
  if (backend == DeviceType::cpu) return &host_memory();
  return core::backend_memory(backend);
}

size_t ArgBuffer::extent_bytes() const noexcept {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<size_t>((rows - 1) * ld + cols) * dtype_size(dtype);
}

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
    a.ld = e.rows > 1 && slot.rank == 2 ? la.ld[i] : e.cols;
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
  if (const gpu::BackendOps* b = gpu::backend_ops(p.device.type)) {
    tla.stream = b->tuner_stream;
    // Candidates get the tuning thread's own workspace (the caller's would
    // be ordered on the caller's stream, not the tuner's).
    if (spec.uses_workspace && b->tuner_workspace) tla.workspace = b->tuner_workspace(&tla.workspace_bytes);
  } else if (p.device.type == DeviceType::cpu) {
    tla.workspace = la.workspace;
    tla.workspace_bytes = la.workspace_bytes;
  }
  t.launch = [tla, prob](const core::Plan& plan) { return plan.variant->launch(tla, prob, plan.params); };
  t.launch_at = [tla, prob](const core::Plan& plan, const std::vector<void*>& ptr) {
    core::LaunchArgs l = tla;
    for (size_t i = 0; i < ptr.size() && i < static_cast<size_t>(core::kMaxArgs); ++i)
      if (tla.data[i]) l.data[i] = ptr[i];
    return plan.variant->launch(l, prob, plan.params);
  };
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
    if (o.deterministic && (v->flags & core::kVariantNondeterministic)) continue;
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
  if (def.valid() && !(o.deterministic && (def.variant->flags & core::kVariantNondeterministic))) out.push_back(def);
  for (const auto& s : pts) {
    const bool is_def = def.valid() && s.plan == def;
    if (!is_def) out.push_back(s.plan);
  }
  if (space) *space = n_space;
  if (pruned) *pruned = n_pruned;
  return out;
}

Result<SearchResult> search(TuneTarget& t, const std::vector<core::Plan>& candidates, const core::Plan& reference,
                            const SearchOptions& o) noexcept {
  try {
    SearchResult res;
    if (candidates.empty()) return make_status(StatusCode::no_variant, "no candidate accepts this problem");
    res.default_plan = candidates.front();
    const auto t_start = std::chrono::steady_clock::now();
    const size_t n = t.args.size();

    // 1. Snapshot every written argument (in-place ones to restore before
    //    each rep; pure outputs so the caller gets its bytes back at the end).
    //    Snapshots live in the backend's memory; validation reads host copies.
    DeviceMemory& mem = t.mem ? *t.mem : host_memory();
    struct Snap {
      DeviceMemory* mem = nullptr;
      void* p = nullptr;
      ~Snap() {
        if (p) mem->release(p);
      }
    };
    std::vector<Snap> saved(n);
    std::vector<std::vector<char>> host(n);  // host staging per written arg
    for (size_t i = 0; i < n; ++i) {
      const ArgBuffer& a = t.args[i];
      if (!a.ptr || !a.written) continue;
      const size_t b = a.extent_bytes();
      saved[i].mem = &mem;
      saved[i].p = mem.alloc(b);
      if (!saved[i].p) return make_status(StatusCode::out_of_memory, "snapshot of '" + a.name + "'");
      if (Status s = mem.copy(saved[i].p, a.ptr, b); !s.ok()) return s;
      host[i].resize(b);
    }
    auto restore = [&](uint32_t extra_restore) {
      for (size_t i = 0; i < n; ++i) {
        const ArgBuffer& a = t.args[i];
        if (!saved[i].p) continue;
        if ((a.read && a.written) || ((extra_restore >> i) & 1u)) (void)mem.copy(a.ptr, saved[i].p, a.extent_bytes());
      }
    };
    auto restore_all = [&]() {
      for (size_t i = 0; i < n; ++i)
        if (saved[i].p) (void)mem.copy(t.args[i].ptr, saved[i].p, t.args[i].extent_bytes());
      (void)mem.sync();
    };
    // Restores the search's own changes whatever happens below.
    struct Guard {
      std::function<void()> f;
      ~Guard() { f(); }
    } guard{restore_all};

    auto prepare_for = [&](const core::Plan& plan) {
      restore(plan.variant->restore_args);
      zero_reset_args(t, plan);
    };
    // Pure outputs: a host copy of the snapshot with the logical elements
    // poisoned, written over the output (the gaps between rows keep the
    // caller's bytes).
    std::vector<std::vector<char>> poisoned(n);
    for (size_t i = 0; i < n; ++i) {
      const ArgBuffer& a = t.args[i];
      if (!saved[i].p || a.read) continue;
      poisoned[i].resize(a.extent_bytes());
      if (Status s = mem.to_host(poisoned[i].data(), saved[i].p, a.extent_bytes()); !s.ok()) return s;
      poison_host(a, poisoned[i].data());
    }
    auto poison_outputs = [&]() {
      for (size_t i = 0; i < n; ++i)
        if (!poisoned[i].empty()) (void)mem.from_host(t.args[i].ptr, poisoned[i].data(), poisoned[i].size());
    };
    auto fetch = [&](size_t i) { return mem.to_host(host[i].data(), t.args[i].ptr, host[i].size()); };

    // 2. Reference output on the same inputs: a copy in the backend's memory
    //    (compared there when the backend can), and a host copy otherwise.
    std::vector<std::vector<double>> ref(n);
    std::vector<Snap> ref_dev(n);
    bool device_compare = false;
    if (o.validate) {
      if (!reference.valid()) return make_status(StatusCode::no_variant, "no reference variant for this problem");
      prepare_for(reference);
      poison_outputs();
      if (Status s = t.launch(reference); !s.ok()) return s;
      if (Status s = mem.sync(); !s.ok()) return s;
      device_compare = true;
      for (size_t i = 0; i < n && device_compare; ++i) {
        const ArgBuffer& a = t.args[i];
        if (!a.ptr || !a.written) continue;
        ref_dev[i].mem = &mem;
        ref_dev[i].p = mem.alloc(a.extent_bytes());
        if (!ref_dev[i].p) return make_status(StatusCode::out_of_memory, "reference copy of '" + a.name + "'");
        if (Status s = mem.copy(ref_dev[i].p, a.ptr, a.extent_bytes()); !s.ok()) return s;
        double atol = 0, rtol = 0;
        validation_tolerance(t.problem.op, a.dtype, &atol, &rtol);
        // Probe: the reference against itself tells whether the backend
        // compares on its own (and must pass).
        auto probe = mem.compare(a, ref_dev[i].p, atol, rtol, false);
        if (!probe.ok()) device_compare = false;
        else if (!probe->ok) return make_status(StatusCode::internal, "device compare of the reference with itself failed");
      }
      for (size_t i = 0; i < n && !device_compare; ++i) {
        const ArgBuffer& a = t.args[i];
        if (!a.ptr || !a.written) continue;
        if (Status s = fetch(i); !s.ok()) return s;
        ref[i].resize(static_cast<size_t>(a.rows * a.cols));
        for (int64_t r = 0; r < a.rows; ++r)
          for (int64_t c = 0; c < a.cols; ++c)
            ref[i][static_cast<size_t>(r * a.cols + c)] = load(a, host[i].data(), r, c);
      }
    }
    auto check = [&](const core::Plan& plan) -> Status {
      if (Status s = mem.sync(); !s.ok()) return s;
      for (size_t i = 0; i < n; ++i) {
        const ArgBuffer& a = t.args[i];
        if (!a.ptr || !a.written) continue;
        if (device_compare) {
          double atol = 0, rtol = 0;
          validation_tolerance(t.problem.op, a.dtype, &atol, &rtol);
          auto m = mem.compare(a, ref_dev[i].p, atol, rtol, !a.read);
          if (!m.ok()) return m.status();
          if (!m->ok) {
            const std::string where =
                "'" + a.name + "'[" + std::to_string(m->row) + "," + std::to_string(m->col) + "]";
            if (m->unwritten)
              return make_status(StatusCode::internal, std::string(plan.variant->name) + " left " + where + " unwritten");
            return make_status(StatusCode::internal, std::string(plan.variant->name) + " differs from the reference at " +
                                                         where + ": " + std::to_string(m->got) + " vs " +
                                                         std::to_string(m->want));
          }
          continue;
        }
        if (Status s = fetch(i); !s.ok()) return s;
        const char* h = host[i].data();
        double atol = 0, rtol = 0;
        validation_tolerance(t.problem.op, a.dtype, &atol, &rtol);
        double scale = 0.0;
        for (double v : ref[i])
          if (std::isfinite(v)) scale = std::max(scale, std::fabs(v));
        for (int64_t r = 0; r < a.rows; ++r)
          for (int64_t c = 0; c < a.cols; ++c) {
            auto where = [&] {
              return "'" + a.name + "'[" + std::to_string(r) + "," + std::to_string(c) + "]";
            };
            if (!a.read && is_poison(a, h, r, c))
              return make_status(StatusCode::internal, std::string(plan.variant->name) + " left " + where() + " unwritten");
            const double got = load(a, h, r, c);
            const double want = ref[i][static_cast<size_t>(r * a.cols + c)];
            if (std::isnan(want)) continue;  // the reference's NaN (NaN input): any NaN matches
            if (std::isnan(got) || std::fabs(got - want) > atol * scale + rtol * std::fabs(want))
              return make_status(StatusCode::internal, std::string(plan.variant->name) + " differs from the reference at " +
                                                           where() + ": " + std::to_string(got) + " vs " + std::to_string(want));
          }
      }
      return Status();
    };

    DeviceInfo no_dev;
    std::unique_ptr<Clock> clock_ptr = mem.make_clock(o.device ? *o.device : no_dev);
    Clock& clock = *clock_ptr;
    double best = 0.0;
    for (size_t ci = 0; ci < candidates.size(); ++ci) {
      const core::Plan& plan = candidates[ci];
      if (o.stop && o.stop->load(std::memory_order_relaxed)) {
        res.stopped = true;
        break;
      }
      const double elapsed_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();
      // The budget ends a search only once it has a valid pick: a default
      // that failed on a busy machine never leaves the shape with nothing.
      if (ci > 0 && res.best.valid() && elapsed_ms > o.time_budget_ms) {
        res.out_of_time = true;
        break;
      }
      const auto c_start = std::chrono::steady_clock::now();
      CandidateResult cr;
      cr.plan = plan;
      // Validation run on poisoned outputs.
      if (o.validate) {
        prepare_for(plan);
        poison_outputs();
        Status s = t.launch(plan);
        if (!s.ok()) {
          cr.status = s;
          ++res.failed;
          res.tried.push_back(std::move(cr));
          continue;
        }
        if (Status v = check(plan); !v.ok()) {
          cr.status = v;
          ++res.rejected;
          res.tried.push_back(std::move(cr));
          continue;
        }
      }
      MeasureOptions mo = o.measure;
      if (best > 0) mo.abandon_above_us = best * 1.5;
      std::atomic<bool> stop_seen{false};
      auto prepare = [&]() -> Status {
        if (o.stop && o.stop->load(std::memory_order_relaxed)) {
          stop_seen = true;
          return make_status(StatusCode::internal, "stopped");
        }
        prepare_for(plan);
        return Status();
      };
      auto timing = measure(clock, prepare, [&]() { return t.launch(plan); }, mo);
      if (!timing.ok()) {
        if (stop_seen) {
          res.stopped = true;
          break;
        }
        cr.status = timing.status();
        ++res.failed;
        res.tried.push_back(std::move(cr));
        continue;
      }
      cr.timing = *timing;
      if (ci == 0) res.default_us = cr.timing.median_us;
      if (!res.best.valid() || cr.timing.median_us < best) {
        best = cr.timing.median_us;
        res.best = plan;
        res.best_us = best;
      }
      res.tried.push_back(std::move(cr));
      if (o.duty_cycle > 0 && o.duty_cycle < 1) {
        const double busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - c_start).count();
        const double idle = busy * (1.0 - o.duty_cycle) / o.duty_cycle;
        // Sleep in small slices so a stop request is honoured quickly.
        const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(idle);
        while (std::chrono::steady_clock::now() < until) {
          if (o.stop && o.stop->load(std::memory_order_relaxed)) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      }
    }
    // Confirmation: the fastest of many noisy measurements is biased low
    // (the winner's curse: a GEMM whose candidates are all cuBLASLt
    // algorithms within 2% of each other picked one 8% slower on the H200).
    // The winner and the default are measured again on kConfirmPlacements
    // placements of the read-only inputs: the search's buffers, then fresh
    // copies (new allocations, other physical pages, all alive until the
    // end), two rounds each, in the order def, best | best, def on the 1st
    // and 3rd placement and best, def | def, best on the 2nd and 4th (ABBA
    // BAAB over the 8 rounds: a linear drift falls on both alike). The
    // winner replaces the default only when it is faster on every placement
    // (its two rounds' sum against the default's) and > kConfirmMargin faster
    // on the mean of the placements' ratios. Why each part, all measured on
    // the H200 (bench/results/h200_gemm_fixed.md):
    //  - placements: the same cuBLASLt algorithm takes 22.8-25.1 us on four
    //    copies of one 6144x4096 weight at M=256, and which of two algorithms
    //    wins changes with the copy; a winner of the search's buffers alone
    //    was 2-9% slower than the default in the grid bench;
    //  - two rounds per placement, both orders: at ~9 us (8192x1024 M=8, 16)
    //    the plan measured first in a round came out 3-8% faster whichever
    //    it was; a single round per placement reads that as a win or a loss.
    const core::Plan& def = candidates.front();
    const bool def_ok = !res.tried.empty() && res.tried.front().status.ok() && res.tried.front().timing.median_us > 0;
    if (res.best.valid() && def_ok && !res.stopped && o.confirm &&
        !(res.best == def)) {
      double again_best = 0, again_def = 0;
      bool ok = true;
      struct Copies {
        DeviceMemory* mem;
        std::vector<void*> p;
        ~Copies() {
          for (void* q : p) mem->release(q);
        }
      } copies{&mem, {}};  // released when the confirmation ends
      copies.p.reserve(static_cast<size_t>(kConfirmPlacements) * n);
      // The argument pointers of placement `pl` (0: the search's buffers).
      int64_t copied = 0;
      auto pointers_for = [&](int pl) {
        std::vector<void*> ptr(n, nullptr);
        for (size_t i = 0; i < n; ++i) ptr[i] = t.args[i].ptr;
        if (pl == 0 || !t.launch_at) return ptr;
        for (size_t i = 0; i < n; ++i) {
          const ArgBuffer& a = t.args[i];
          if (!a.ptr || !a.read || a.written) continue;  // written args keep their snapshots' address
          // The copy keeps the original's offset within 256 bytes: a plan that
          // picks by alignment (cuBLASLt's get_default pick) picks the same.
          const size_t b = a.extent_bytes();
          const size_t off = static_cast<size_t>(reinterpret_cast<uintptr_t>(a.ptr) % 256);
          if (b == 0 || copied + static_cast<int64_t>(b + off) > o.confirm_copy_bytes) continue;  // stays put
          void* c = mem.alloc(b + off);
          if (!c) continue;  // no memory: this arg stays where it is
          copied += static_cast<int64_t>(b + off);
          copies.p.push_back(c);
          void* at = static_cast<char*>(c) + off;
          if (mem.copy(at, a.ptr, b).ok()) ptr[i] = at;
        }
        return ptr;
      };
      for (int pl = 0; pl < kConfirmPlacements && ok; ++pl) {
        const std::vector<void*> ptr = pointers_for(pl);
        const bool moved = pl > 0 && t.launch_at;
        double us[2] = {0, 0};  // [0] default, [1] winner: the two rounds' sum
        for (int round = 0; round < 2 && ok; ++round) {
          const bool def_first = (pl % 2 == 0) == (round == 0);
          const core::Plan* first = def_first ? &def : &res.best;
          const core::Plan* second = def_first ? &res.best : &def;
          for (const core::Plan* plan : {first, second}) {
            MeasureOptions mo = o.measure;
            auto prepare = [&]() -> Status {
              if (o.stop && o.stop->load(std::memory_order_relaxed)) {  // shutting down: checked every rep
                res.stopped = true;
                return make_status(StatusCode::internal, "stopped");
              }
              prepare_for(*plan);
              return Status();
            };
            auto tm = measure(
                clock, prepare, [&]() { return moved ? t.launch_at(*plan, ptr) : t.launch(*plan); }, mo);
            if (!tm.ok()) {
              ok = false;
              break;
            }
            us[plan == &def ? 0 : 1] += tm->median_us;
          }
        }
        if (!ok || us[0] <= 0) {
          ok = false;
          res.confirm_ratios.clear();  // not confirmed: no partial ratios
          break;
        }
        again_def += us[0] / 2;
        again_best += us[1] / 2;
        res.confirm_ratios.push_back(us[1] / us[0]);
      }
      if (!ok) {
        // A plan that could not be timed again (a launch refused on a copy,
        // say, or a stop request) is no confirmed winner: the default stays.
        res.best = def;
        res.best_us = res.tried.front().timing.median_us;
        res.kept_default = true;
      } else if (again_def > 0) {
        res.confirmed = true;
        double mean_ratio = 0;
        bool wins_everywhere = true;
        for (double r : res.confirm_ratios) {
          mean_ratio += r / kConfirmPlacements;
          wins_everywhere = wins_everywhere && r < 1.0;
        }
        if (!wins_everywhere || mean_ratio > 1.0 - kConfirmMargin) {
          res.best = def;
          res.best_us = again_def / kConfirmPlacements;
          res.kept_default = true;
        } else {
          res.best_us = again_best / kConfirmPlacements;
        }
        res.default_us = again_def / kConfirmPlacements;
      }
    }
    // A dynamic family's "resolve at run time" point (cuBLASLt's algo_id
    // -1: its heuristic's first pick, asked on the call) is not what a table
    // should hold: a hit on it would query and lock. It is the same
    // algorithm as that family's first enumerated candidate (the heuristic's
    // top pick, offered the tuner's workspace), which was measured too:
    // persist that one.
    if (res.best.valid() && (res.best.variant->flags & core::kVariantDynamicSpace) && res.best.params[0] < 0) {
      bool resolved = false;
      for (const CandidateResult& cr : res.tried)
        if (cr.plan.variant == res.best.variant && cr.plan.params[0] >= 0 && cr.status.ok()) {
          res.best = cr.plan;
          resolved = true;
          break;
        }
      // The budget ran out before that candidate was measured (large M: the
      // default alone takes much of it): the first enumerated candidate of
      // the family is still the same heuristic query with the same workspace,
      // so the same algorithm the default ran and validated; persist it.
      if (!resolved)
        for (const core::Plan& c : candidates)
          if (c.variant == res.best.variant && c.params[0] >= 0) {
            res.best = c;
            break;
          }
    }
    if (!res.best.valid() && !res.stopped)
      return make_status(StatusCode::no_variant,
                         "every candidate failed to launch or was rejected (" + std::to_string(res.failed) +
                             " failed, " + std::to_string(res.rejected) + " rejected)" +
                             (res.tried.empty() ? std::string() : ": " + res.tried.front().status.message()));
    return res;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "tuning search (snapshots of the written arguments)");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("tuning search: ") + e.what());
  }
}

}  // namespace dispatch::tune
