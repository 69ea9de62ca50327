// SPDX-License-Identifier: Apache-2.0
// The op entry points: validate -> key -> table -> plan -> launch.
//
// Hot path rules (a table hit): no lock, no allocation, no syscall, no
// logging, no shared write; the table is read inside an epoch guard and the
// plan is copied out, so the guard is released before the kernel runs.
// A miss is the slow path: get_default's plan, the miss recorded (lock-free),
// and depending on the tuning mode the shape queued for the background tuner
// or tuned right here on the caller's buffers (sync). While the caller's
// stream is being captured into a graph a miss never tunes: it returns the
// default and queues the shape.
#include "dispatch/ops.hpp"

#include <algorithm>
#include <cstring>

#include "api/runtime_impl.hpp"
#include "api/validate.hpp"
#include "core/registry.hpp"
#include "gpu/gpu_backend.hpp"
#include "table/epoch.hpp"
#include "table/key.hpp"
#include "tune/tuner.hpp"

namespace dispatch {
namespace {

// Zeroes the reset_to_zero arguments of `plan` before a real launch (the
// same role the tuner enforces between reps), without allocating.
void zero_reset_args(const core::Problem& p, const core::LaunchArgs& la, const core::Plan& plan) noexcept {
  const uint32_t mask = plan.variant->reset_args;
  if (mask == 0) return;
  auto zero_rows = [](void* ptr, int64_t rows, int64_t cols, int64_t ld, DType t) {
    if (!ptr) return;
    const size_t es = dtype_size(t);
    for (int64_t r = 0; r < rows; ++r)
      std::memset(static_cast<char*>(ptr) + static_cast<size_t>(r * ld) * es, 0, static_cast<size_t>(cols) * es);
  };
  switch (p.op) {
    case core::OpKind::gemm:
      if (mask & (1u << core::kGemmArgD)) zero_rows(la.d, p.m, p.n, la.ldd, p.out_dtype);
      break;
    case core::OpKind::rmsnorm:
      if (mask & (1u << core::kNormArgY)) zero_rows(la.y, p.m, p.n, la.ldy, p.out_dtype);
      break;
    case core::OpKind::fused_add_rmsnorm:
      break;  // in-place arguments are restore_value, never reset_to_zero
  }
}

// Far from every tuned M (outside [m/2, 2m]): a hit by nearest-M, but worth
// tuning. Sampled: one in 16 such calls per thread notes it.
bool far_hit_sample(int64_t table_m, int64_t m) noexcept {
  if (table_m * 2 >= m && m * 2 >= table_m) return false;
  thread_local uint32_t n = 0;
  return (++n & 15u) == 0;
}

// The rest of a call once its plan is chosen: the info, the workspace, the
// alignment re-check, the launch and the in-call fallback. `dev` may be null
// (a memo hit never needs it unless the call leaves the fast path). The
// rare parts are out of line and marked cold, so that the hit path's code
// is a few contiguous cache lines (behind a GPU launch they are cold).

// get_default's plan, with deterministic serving's rule applied: a
// scheduling-dependent default is replaced by the reference. Every place a
// call falls back uses it (the miss, the re-alignment, the in-call fallback).
core::Plan default_plan(const Runtime::Impl& impl, const core::Problem& p, const DeviceInfo& dev) noexcept {
  core::Plan plan = core::get_default(p, dev);
  if (plan.valid() && impl.options.deterministic && (plan.variant->flags & core::kVariantNondeterministic)) {
    plan = core::Plan{};
    plan.variant = core::reference_variant(p.op, p.device.type, p.in_dtype);
  }
  return plan;
}

const DeviceInfo& device_of(Runtime::Impl& impl, const core::Problem& p, const DeviceInfo*& dev) noexcept {
  if (dev == nullptr) dev = impl.device_for(p.device);  // non-null: a memo entry was made with it
  return *dev;
}

void set_info(const CallOptions& opts, const core::Plan& plan, PlanSource source, int64_t table_m,
              uint32_t source_id) noexcept {
  opts.info->source = source;
  opts.info->variant = plan.variant->name.data();
  opts.info->table_m = table_m;
  opts.info->source_id = source_id;
}

[[gnu::cold, gnu::noinline]] void fill_info(Runtime::Impl& impl, const core::Problem& p, const CallOptions& opts,
                                            const DeviceInfo*& dev, const core::Plan& plan, PlanSource source,
                                            int64_t table_m, uint32_t source_id, bool tuned_now) noexcept {
  set_info(opts, plan, source, table_m, source_id);
  opts.info->tuned_now = tuned_now;
  if (opts.info->key) {
    try {
      table::KeyBuffer key;
      table::build_own_key(p, device_type_name(p.device.type), device_of(impl, p, dev).device_name, &key);
      opts.info->key->assign(key.view());
    } catch (...) {
    }
  }
}

// A table row was checked for 16-byte aligned operands; a call with less
// aligned ones re-asks the row (rare: sliced or odd-sized tensors).
[[gnu::cold, gnu::noinline]] Status realign(Runtime::Impl& impl, const core::Problem& p, const CallOptions& opts,
                                            const DeviceInfo*& dev, core::Plan* plan, PlanSource* source) noexcept {
  if (plan->variant->supports(p, plan->params, device_of(impl, p, dev)).ok()) return Status();
  *plan = default_plan(impl, p, device_of(impl, p, dev));
  *source = PlanSource::fallback;
  if (!plan->valid()) return make_status(StatusCode::unsupported_problem, "no variant accepts these operands");
  if (opts.info) set_info(opts, *plan, *source, -1, 0);
  return Status();
}

// A plan the call cannot run although its key accepted it (a workspace too
// small, cuBLASLt refusing an algorithm for this M): get_default's plan,
// then the reference, in the same call. Nothing was enqueued.
[[gnu::cold, gnu::noinline]] Status launch_fallback(Runtime::Impl& impl, const core::Problem& p,
                                                    const core::LaunchArgs& la, const CallOptions& opts,
                                                    const DeviceInfo*& dev, core::Plan plan, Status st) noexcept {
  for (int step = 0; step < 2 && !st.ok() && st.code() == StatusCode::unsupported_problem &&
                     st.message().starts_with(core::kNeedsFallback);
       ++step) {
    core::Plan next = default_plan(impl, p, device_of(impl, p, dev));
    const bool is_default = next.valid() && next == plan;
    if (!next.valid() || is_default) {
      next = core::Plan{};
      next.variant = core::reference_variant(p.op, p.device.type, p.in_dtype);
      if (next.variant == nullptr || next.variant == plan.variant) break;
    }
    plan = next;
    if (opts.info) set_info(opts, plan, PlanSource::fallback, -1, 0);
    st = plan.variant->launch(la, p, plan.params);
  }
  return st;
}

Status launch_plan(Runtime::Impl& impl, const core::Problem& p, core::LaunchArgs& la, const CallOptions& opts,
                   const DeviceInfo* dev, const core::Plan& plan) noexcept;

// The call's operands are less aligned than the row was checked for: the
// row again, or get_default's plan, then the launch (out of line: rare).
[[gnu::cold, gnu::noinline]] Status serve_realigned(Runtime::Impl& impl, const core::Problem& p,
                                                    core::LaunchArgs& la, const CallOptions& opts,
                                                    const DeviceInfo* dev, core::Plan plan,
                                                    PlanSource source) noexcept {
  if (Status s = realign(impl, p, opts, dev, &plan, &source); !s.ok()) return s;
  return launch_plan(impl, p, la, opts, dev, plan);
}

Status serve(Runtime::Impl& impl, const core::Problem& p, core::LaunchArgs& la, Stream stream,
             const CallOptions& opts, const DeviceInfo* dev, const core::Plan& plan, PlanSource source,
             int64_t table_m, uint32_t source_id, bool tuned_now) noexcept {
  if (opts.info) [[unlikely]]
    fill_info(impl, p, opts, dev, plan, source, table_m, source_id, tuned_now);
  la.stream = stream.handle;
  if (p.op == core::OpKind::gemm && p.device.type != DeviceType::cpu) {
    // The call's workspace: the caller's, else the one attached to its stream.
    if (opts.workspace != nullptr) {
      la.workspace = opts.workspace;
      la.workspace_bytes = opts.workspace_bytes;
    } else if (const Runtime::Impl::StreamSlot* slot = impl.stream_slot(p.device, stream.handle)) {
      la.workspace = slot->workspace;
      la.workspace_bytes = slot->bytes;
    }
    if (p.align_bytes < 16 && source != PlanSource::fallback) [[unlikely]]
      return serve_realigned(impl, p, la, opts, dev, plan, source);
  }
  return launch_plan(impl, p, la, opts, dev, plan);
}

Status launch_plan(Runtime::Impl& impl, const core::Problem& p, core::LaunchArgs& la,
                   const CallOptions& opts, const DeviceInfo* dev, const core::Plan& plan) noexcept {
  if (plan.variant->reset_args != 0) [[unlikely]]
    zero_reset_args(p, la, plan);
  Status st = plan.variant->launch(la, p, plan.params);
  if (!st.ok()) [[unlikely]]
    return launch_fallback(impl, p, la, opts, dev, plan, std::move(st));
  return st;
}

// ------------------------------------------------------------------ hit memo
//
// A table hit costs few instructions but many cache lines: device probe,
// device name, key hash, epoch slot, bucket, M list, row, variant. Behind a
// GPU launch (the driver walks its own state between our calls) those lines
// are cold, and the hit path measured ~300 ns on an H200 host against ~90 ns
// warm. So each thread keeps a small direct-mapped memo of its recent hits:
// (call key, M) -> the row's plan, tagged with the table's generation
// (Runtime::Impl::table_gen, unique per published table in the process). A
// memo entry is used only while its generation is the runtime's current
// one, so a publish (reload, tuned row) invalidates every memo at once and a
// memo never outlives its table's answer. Reads and writes are the owning
// thread's only: no shared write, no lock. Only table hits are memoised (a
// miss runs its slow path every time, as before).

struct CallKey {
  int64_t m, n, k;
  uint32_t stride_code;
  int32_t ordinal;
  uint8_t op, device_type, in_dtype, out_dtype, has_bias, pad[3];
};
static_assert(sizeof(CallKey) == 40, "CallKey is compared as bytes: no implicit padding");

CallKey call_key(const core::Problem& p) noexcept {
  CallKey c;
  std::memset(&c, 0, sizeof c);
  c.m = p.m;
  c.n = p.n;
  c.k = p.k;
  c.stride_code = p.stride_code;
  c.ordinal = p.device.ordinal;
  c.op = static_cast<uint8_t>(p.op);
  c.device_type = static_cast<uint8_t>(p.device.type);
  c.in_dtype = static_cast<uint8_t>(p.in_dtype);
  c.out_dtype = static_cast<uint8_t>(p.out_dtype);
  c.has_bias = p.has_bias ? 1 : 0;
  return c;
}

struct HitMemo {
  uint64_t gen = 0;  ///< 0: empty
  CallKey key{};
  int64_t table_m = -1;
  uint32_t source_id = 0;
  core::Plan plan;
};

inline constexpr int kMemoSlots = 16;  // a decoder layer's GEMMs and norms at one M

HitMemo& memo_slot(const CallKey& c) noexcept {
  thread_local HitMemo memo[kMemoSlots];
  uint64_t h = static_cast<uint64_t>(c.n) * 0x9E3779B97F4A7C15ull;
  h ^= static_cast<uint64_t>(c.k) * 0xC2B2AE3D27D4EB4Full;
  h ^= static_cast<uint64_t>(c.m) * 0x165667B19E3779F9ull;
  h ^= static_cast<uint64_t>(c.op) << 7;
  return memo[(h >> 40) % kMemoSlots];
}

// A memo hit far from its row's M, sampled for the tuner's queue.
[[gnu::cold, gnu::noinline]] void note_far_hit(Runtime::Impl& impl, const core::Problem& p,
                                               const core::LaunchArgs& la) noexcept {
  if (const DeviceInfo* d = impl.device_for(p.device)) {
    const uint64_t nh = p.device.type == DeviceType::cpu ? impl.cpu_name_hash : table::key_hash(d->device_name);
    impl.tuner->note_miss(p, la, table::own_key_hash(table::make_own_key(p, nh)), /*queue=*/true);
  }
}

Status run_full(Runtime::Impl& impl, const core::Problem& p, core::LaunchArgs& la, Stream stream,
                const CallOptions& opts, const CallKey& ckey, HitMemo& memo, uint64_t gen) noexcept;

Status run(Runtime& rt, const core::Problem& p, core::LaunchArgs& la, Stream stream,
           const CallOptions& opts) noexcept {
  Runtime::Impl& impl = rt.impl();
  const CallKey ckey = call_key(p);
  HitMemo& memo = memo_slot(ckey);
  // Loaded before the table (acquire; the writer stores it after `current`):
  // an entry made below is tagged with a generation no newer than its table.
  const uint64_t gen = impl.table_gen.load(std::memory_order_acquire);
  if (!impl.any_forced && gen != 0 && memo.gen == gen && std::memcmp(&memo.key, &ckey, sizeof ckey) == 0) [[likely]] {
    const bool near = memo.table_m * 2 >= p.m && p.m * 2 >= memo.table_m;
    if (!near && impl.tuner && impl.tuner->mode() != TuneMode::off && far_hit_sample(memo.table_m, p.m)) [[unlikely]]
      note_far_hit(impl, p, la);
    return serve(impl, p, la, stream, opts, nullptr, memo.plan, PlanSource::table, memo.table_m, memo.source_id,
                 false);
  }
  return run_full(impl, p, la, stream, opts, ckey, memo, gen);
}

// Everything but a memo hit: the device, the key, the table, the tuner, get_default.
[[gnu::noinline]] Status run_full(Runtime::Impl& impl, const core::Problem& p, core::LaunchArgs& la, Stream stream,
                                  const CallOptions& opts, const CallKey& ckey, HitMemo& memo, uint64_t gen) noexcept {
  const DeviceInfo* dev = impl.device_for(p.device);
  if (dev == nullptr) {
    return make_status(StatusCode::unsupported_device,
                       p.device.type == DeviceType::cpu
                           ? "the CPU backend is unavailable"
                           : "tensors are on a GPU but this build has no usable GPU backend for it; "
                             "kdispatch never runs GPU tensors on the CPU");
  }
  // The binary static key (table/key.hpp: OwnKey): 40 bytes hashed and
  // compared; the text form is built only off the hit path (tuning, info).
  const uint64_t name_hash =
      p.device.type == DeviceType::cpu ? impl.cpu_name_hash : table::key_hash(dev->device_name);
  const table::OwnKey okey = table::make_own_key(p, name_hash);
  const uint64_t hash = table::own_key_hash(okey);
  auto text_key = [&](table::KeyBuffer* kb) {
    table::build_own_key(p, device_type_name(p.device.type), dev->device_name, kb);
  };

  core::Plan plan;
  PlanSource source = PlanSource::fallback;
  int64_t table_m = -1;
  uint32_t source_id = 0;
  bool tuned_now = false;

  if (impl.any_forced) {
    for (const core::Plan& f : impl.forced[static_cast<int>(p.op)]) {
      if (f.variant->backend != p.device.type || f.variant->in_dtype != p.in_dtype) continue;
      if (Status s = f.variant->supports(p, f.params, *dev); !s.ok())
        return make_status(StatusCode::no_variant, "forced " + core::plan_to_string(f) + " declines this call: " + s.message());
      plan = f;
      source = PlanSource::forced;
      break;
    }
  }
  if (!plan.valid()) {
    {
      table::EpochDomain::Guard guard(table::EpochDomain::global());
      const table::Snapshot* snap = impl.current.load(std::memory_order_seq_cst);
      if (const table::Bucket* b = snap->find_own(okey, hash, dev->device_name)) {
        size_t idx = 0;
        if (const table::Row* r = table::Snapshot::nearest(*b, p.m, impl.policy, &idx); r && r->plan.valid()) {
          plan = r->plan;
          source = PlanSource::table;
          table_m = b->ms[idx];
          source_id = r->source_id;
        }
      }
    }
    if (plan.valid() && impl.options.deterministic && (plan.variant->flags & core::kVariantNondeterministic)) {
      plan = core::Plan{};  // deterministic serving never runs a scheduling-dependent variant
      source = PlanSource::fallback;
      table_m = -1;
      source_id = 0;
    }
    const TuneMode mode = impl.tuner ? impl.tuner->mode() : TuneMode::off;
    if (!plan.valid()) {
      // Miss: recorded always (for export), queued in background mode, tuned
      // here in sync mode unless the stream is being captured.
      if (impl.tuner) impl.tuner->note_miss(p, la, hash, /*queue=*/true);
      // The capture query is asked only here, on a miss in sync mode: a hit
      // never pays for it.
      const gpu::BackendOps* gops = p.device.type == DeviceType::cpu ? nullptr : gpu::backend_ops(p.device.type);
      const bool capturing =
          opts.capturing || (mode == TuneMode::sync && gops && gops->stream_capturing &&
                             gops->stream_capturing(stream.handle));
      if (mode == TuneMode::sync && !capturing) {
        table::KeyBuffer key;
        text_key(&key);
        // The search launches on the legacy default stream: first let the
        // caller's stream finish writing the inputs (sync mode is for
        // development; one synchronisation on a miss is its price).
        if (gops && gops->stream_synchronize && stream.handle)
          if (Status s = gops->stream_synchronize(stream.handle); !s.ok()) return s;
        auto r = impl.tuner->tune_on_caller(p, la, *dev, std::string(key.view()));
        if (r.ok()) {
          plan = r->plan;
          source = PlanSource::table;
          table_m = p.m;
          source_id = r->source_id;
          tuned_now = true;
        }
      }
    } else if (mode != TuneMode::off && source == PlanSource::table && far_hit_sample(table_m, p.m)) {
      impl.tuner->note_miss(p, la, hash, /*queue=*/true);
    }
  }
  if (!plan.valid()) {
    plan = default_plan(impl, p, *dev);
    if (!plan.valid())
      return make_status(StatusCode::unsupported_problem,
                         std::string("no ") + std::string(device_type_name(p.device.type)) + " variant computes " +
                             std::string(core::op_name(p.op)) + " with " + std::string(dtype_name(p.in_dtype)) +
                             " inputs and " + std::string(dtype_name(p.out_dtype)) + " output");
  }
  if (source == PlanSource::table && !tuned_now && gen != 0) {
    memo.gen = gen;
    memo.key = ckey;
    memo.table_m = table_m;
    memo.source_id = source_id;
    memo.plan = plan;
  }
  return serve(impl, p, la, stream, opts, dev, plan, source, table_m, source_id, tuned_now);
}

Result<PretuneResult> pretune_problem(Runtime& rt, const core::Problem& p, const core::LaunchArgs& la) noexcept {
  try {
    Runtime::Impl& impl = rt.impl();
    const DeviceInfo* dev = impl.device_for(p.device);
    if (!dev) return make_status(StatusCode::unsupported_device, "no usable backend for the tensors' device");
    if (impl.frozen.load(std::memory_order_acquire))
      return make_status(StatusCode::failed_precondition, "runtime is frozen: no tuning");
    tune::MissEvent ev;
    ev.problem = p;
    switch (p.op) {
      case core::OpKind::gemm: ev.ld[0] = la.lda, ev.ld[1] = la.ldb, ev.ld[2] = la.ldd; break;
      case core::OpKind::rmsnorm: ev.ld[0] = la.ldy, ev.ld[1] = la.ldx; break;
      case core::OpKind::fused_add_rmsnorm: ev.ld[0] = la.ldx, ev.ld[1] = la.ldr; break;
    }
    const std::string key = tune::Tuner::key_of(p, *dev);
    auto r = impl.tuner->tune_on_scratch(ev, *dev, key);
    if (!r.ok()) return r.status();
    PretuneResult out;
    out.key = key;
    out.m = p.m;
    out.config = core::plan_to_config(r->plan);
    out.variant = std::string(r->plan.variant->name);
    out.best_us = r->search.best_us;
    out.default_us = r->search.default_us;
    out.candidates = static_cast<int32_t>(r->search.tried.size());
    out.rejected = r->search.rejected;
    out.failed = r->search.failed;
    out.persisted = r->persisted;
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "pretune");
  }
}

}  // namespace

const char* plan_source_name(PlanSource s) noexcept {
  switch (s) {
    case PlanSource::table: return "table";
    case PlanSource::fallback: return "default";
    case PlanSource::forced: return "forced";
  }
  return "?";
}

Status gemm(Runtime& rt, const GemmArgs& args, Stream stream, const CallOptions& opts) noexcept {
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  if (Status s = api::validate_gemm(args, &p, &la, &empty); !s.ok()) return s;
  if (empty) return Status();
  return run(rt, p, la, stream, opts);
}

Status rmsnorm(Runtime& rt, const RmsNormArgs& args, Stream stream, const CallOptions& opts) noexcept {
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  if (Status s = api::validate_rmsnorm(args, &p, &la, &empty); !s.ok()) return s;
  if (empty) return Status();
  return run(rt, p, la, stream, opts);
}

Status fused_add_rmsnorm(Runtime& rt, const FusedAddRmsNormArgs& args, Stream stream,
                         const CallOptions& opts) noexcept {
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  if (Status s = api::validate_fused_add_rmsnorm(args, &p, &la, &empty); !s.ok()) return s;
  if (empty) return Status();
  return run(rt, p, la, stream, opts);
}

Result<PretuneResult> pretune(Runtime& rt, const GemmArgs& args) noexcept {
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  if (Status s = api::validate_gemm(args, &p, &la, &empty, /*require_data=*/false); !s.ok()) return s;
  if (empty) return make_status(StatusCode::invalid_argument, "a: M is 0, nothing to tune");
  return pretune_problem(rt, p, la);
}

Result<PretuneResult> pretune(Runtime& rt, const RmsNormArgs& args) noexcept {
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  if (Status s = api::validate_rmsnorm(args, &p, &la, &empty, /*require_data=*/false); !s.ok()) return s;
  if (empty) return make_status(StatusCode::invalid_argument, "x: tokens is 0, nothing to tune");
  return pretune_problem(rt, p, la);
}

Result<PretuneResult> pretune(Runtime& rt, const FusedAddRmsNormArgs& args) noexcept {
  core::Problem p;
  core::LaunchArgs la;
  bool empty = false;
  if (Status s = api::validate_fused_add_rmsnorm(args, &p, &la, &empty, /*require_data=*/false); !s.ok()) return s;
  if (empty) return make_status(StatusCode::invalid_argument, "x: tokens is 0, nothing to tune");
  return pretune_problem(rt, p, la);
}

}  // namespace dispatch
