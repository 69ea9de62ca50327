// SPDX-License-Identifier: Apache-2.0
// The op entry points, one per row of core/op_list.hpp, all the same call:
//
//   validate -> choose -> observe -> launch
//
//   choose   which plan serves: a forced plan, the thread's memo of recent
//            table hits, the table (nearest M), else get_default. Takes no
//            lock and writes nothing shared (the memo is the thread's own).
//   observe  the tuner's one hook (Tuner::observe, tune/observe.cpp): it
//            records a miss, samples hits far from their row's M, checks
//            the stream's capture state and, in sync mode, searches on the
//            caller's buffers and may hand back the winner. It runs before
//            the launch because the sync search must restore those buffers
//            before the real launch; on a table hit it is one branch.
//   launch   the info, the workspace, the alignment re-check, reset_to_zero
//            arguments, the variant's launch, and the in-call fallback chain
//            (get_default, then the reference) when a plan returns
//            core::kNeedsFallbackCode — a code, never a message's text.
//
// Hot path rules (a table hit): no lock, no allocation, no syscall, no
// logging, no shared write; the table is read inside an epoch guard and the
// plan is copied out, so the guard is released before the kernel runs.
// This file is the whole path, entry points and call_op included (one TU:
// it inlines as one piece); the op list is in op_info.cpp, the calls from a
// key and pretune in op_keys.cpp (api/ops_impl.hpp: what they share).
#include "dispatch/ops.hpp"

#include <cstring>

#include "api/engine_rows.hpp"
#include "api/ops_impl.hpp"
#include "api/runtime_impl.hpp"
#include "api/validate.hpp"
#include "ops/specs.hpp"
#include "core/op_spec.hpp"
#include "backends/registry.hpp"
#include "table/epoch.hpp"
#include "table/key.hpp"
#include "tune/rules.hpp"
#include "tune/tuner.hpp"

namespace dispatch {
namespace {

// What choose() decided.
struct Choice {
  core::Plan plan;
  PlanSource source = PlanSource::fallback;
  int64_t table_m = -1;
  uint32_t source_id = 0;
  bool tuned_now = false;
  bool engine_row = false;  ///< a default shaped by an engine's row (api/engine_rows.hpp)

  Choice() = default;
  /// A table row's answer (the memo hit: built in place, no zeroing first).
  Choice(const core::Plan& row_plan, int64_t m, uint32_t id) noexcept
      : plan(row_plan), source(PlanSource::table), table_m(m), source_id(id) {}
};

// One call as the stages see it.
struct Call {
  const core::Problem& p;
  core::LaunchArgs& la;
  Stream stream;
  const CallOptions& opts;
  const DeviceInfo* dev = nullptr;  ///< probed lazily (a memo hit never needs it)
  uint64_t key_hash = 0;            ///< hash of the binary key (0 until choose computed it)
};

const DeviceInfo& device_of(Runtime::Impl& impl, Call& c) noexcept {
  if (c.dev == nullptr) c.dev = impl.device_for(c.p.device);  // non-null: a memo entry was made with it
  return *c.dev;
}

// get_default's plan, with deterministic serving's rule applied: a
// scheduling-dependent default is replaced by the reference. Every place a
// call falls back uses it (the miss, the re-alignment, the in-call fallback).
core::Plan default_plan(const Runtime::Impl& impl, const core::Problem& p, const DeviceInfo& dev) noexcept {
  core::Plan plan = core::get_default(p, dev);
  if (plan.valid() && tune::excluded_by_determinism(impl.options.deterministic, *plan.variant)) {
    plan = core::Plan{};
    plan.variant = core::reference_variant(p.op, p.device.type, p.in_dtype);
  }
  return plan;
}

// ------------------------------------------------------------------ launch

// Zeroes the reset_to_zero arguments of `plan` before a real launch (the
// same role the tuner enforces between reps), without allocating.
void zero_reset_args(const core::Problem& p, const core::LaunchArgs& la, const core::Plan& plan) noexcept {
  const core::OpSpec& spec = core::spec_of(p.op);
  for (int i = 0; i < spec.slot_count(); ++i) {
    if (!((plan.variant->reset_args >> i) & 1u) || la.data[i] == nullptr) continue;
    const core::SlotExtent e = core::slot_extent(spec, i, p);
    const size_t es = dtype_size(e.dtype);
    const int64_t ld = e.rows > 1 ? la.ld[i] : e.cols;
    for (int64_t r = 0; r < e.rows; ++r)
      std::memset(static_cast<char*>(la.data[i]) + static_cast<size_t>(r * ld) * es, 0,
                  static_cast<size_t>(e.cols) * es);
  }
}

void set_info(const CallOptions& opts, const Choice& c) noexcept {
  opts.info->source = c.source;
  opts.info->variant = c.plan.variant->name.data();
  opts.info->table_m = c.table_m;
  opts.info->source_id = c.source_id;
  opts.info->tuned_now = c.tuned_now;
  opts.info->k_source = c.engine_row ? core::spec_of(c.plan.variant->op).engine_rows.k_source : "";
}

[[gnu::cold, gnu::noinline]] void fill_info(Runtime::Impl& impl, Call& call, const Choice& c) noexcept {
  set_info(call.opts, c);
  if (call.opts.info->key) {
    try {
      table::KeyBuffer key;
      table::build_own_key(call.p, device_type_name(call.p.device.type), device_of(impl, call).device_name, &key);
      call.opts.info->key->assign(key.view());
    } catch (...) {
    }
  }
}

// A table row was checked for 16-byte aligned operands; a call with less
// aligned ones re-asks the row, else serves get_default's plan (rare: sliced
// or odd-sized tensors).
[[gnu::cold, gnu::noinline]] Status realign(Runtime::Impl& impl, Call& call, Choice* c) noexcept {
  if (c->plan.variant->supports(call.p, c->plan.params, device_of(impl, call)).ok()) return Status();
  c->plan = default_plan(impl, call.p, device_of(impl, call));
  c->source = PlanSource::fallback;
  c->table_m = -1;
  c->source_id = 0;
  if (!c->plan.valid()) return make_status(StatusCode::unsupported_problem, "no variant accepts these operands");
  if (call.opts.info) set_info(call.opts, *c);
  return Status();
}

// A plan the call cannot run although its key accepted it (a workspace too
// small, cuBLASLt refusing an algorithm for this M) says so with
// kNeedsFallbackCode: get_default's plan, then the reference, in the same
// call. Work may already be enqueued (cuBLASLt's block row split runs its
// head before the tail declines): every fallback writes all of its outputs,
// stream-ordered after it.
[[gnu::cold, gnu::noinline]] Status launch_fallback(Runtime::Impl& impl, Call& call, Choice c, Status st) noexcept {
  for (int step = 0; step < 2 && st.code() == core::kNeedsFallbackCode; ++step) {
    core::Plan next = default_plan(impl, call.p, device_of(impl, call));
    if (!next.valid() || next == c.plan) {
      next = core::Plan{};
      next.variant = core::reference_variant(call.p.op, call.p.device.type, call.p.in_dtype);
      if (next.variant == nullptr || next.variant == c.plan.variant) break;
    }
    c.plan = next;
    c.source = PlanSource::fallback;
    c.table_m = -1;
    c.source_id = 0;
    c.engine_row = false;
    if (call.opts.info) set_info(call.opts, c);
    st = c.plan.variant->launch(call.la, call.p, c.plan.params);
  }
  // The code never leaves the library: nothing could run the call.
  if (st.code() == core::kNeedsFallbackCode) return Status(StatusCode::unsupported_problem, st.message());
  return st;
}

// Whether `op` takes CallOptions::workspace (a constant per op: no call
// into the spec table on the hit path).
constexpr bool uses_workspace(core::OpKind op) noexcept {
#define KD_USES_WS(kd_op, args, tensors, scalars) core::OpSpecOf<core::OpKind::kd_op>::value.uses_workspace,
  constexpr bool kUses[] = {KDISPATCH_OP_LIST(KD_USES_WS)};
#undef KD_USES_WS
  return kUses[static_cast<size_t>(op)];
}

// The plan's launch, with the in-call fallback (launch_fallback).
[[gnu::always_inline]] inline Status launch_plan(Runtime::Impl& impl, Call& call, const Choice& c) noexcept {
  if (c.plan.variant->reset_args != 0) [[unlikely]]
    zero_reset_args(call.p, call.la, c.plan);
  Status st = c.plan.variant->launch(call.la, call.p, c.plan.params);
  if (!st.ok()) [[unlikely]]
    return launch_fallback(impl, call, c, std::move(st));
  return st;
}

[[gnu::cold, gnu::noinline]] Status launch_realigned(Runtime::Impl& impl, Call& call, Choice c) noexcept {
  if (Status s = realign(impl, call, &c); !s.ok()) return s;
  return launch_plan(impl, call, c);
}

// `c` by reference: the memo hit's choice is never copied.
Status launch(Runtime::Impl& impl, Call& call, const Choice& c) noexcept {
  if (call.opts.info) [[unlikely]]
    fill_info(impl, call, c);
  core::LaunchArgs& la = call.la;
  la.stream = call.stream.handle;
  if (uses_workspace(call.p.op)) {
    // The call's workspace: the caller's, else the one attached to its stream.
    if (call.opts.workspace != nullptr) {
      la.workspace = call.opts.workspace;
      la.workspace_bytes = call.opts.workspace_bytes;
    } else if (const api::StreamWorkspaces::Slot* slot = impl.streams.find(call.p.device, call.stream.handle)) {
      la.workspace = slot->workspace;
      la.workspace_bytes = slot->bytes;
    }
  }
  if (call.p.align_bytes < 16 && c.source != PlanSource::fallback) [[unlikely]]
    return launch_realigned(impl, call, c);
  return launch_plan(impl, call, c);
}

// ------------------------------------------------------------------ choose
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
// miss runs its slow path every time).

// Every member of the Problem that the table key holds, plus M and the
// device ordinal: equal call keys get equal answers.
struct CallKey {
  int64_t m, n, k, extra0, extra1, extra2;
  uint64_t stride_code;
  int32_t ordinal;
  uint8_t op, device_type, in_dtype, out_dtype, has_bias, accum, choice, pad;
};
static_assert(sizeof(CallKey) == 72, "CallKey is compared as bytes: no implicit padding");

CallKey call_key(const core::Problem& p) noexcept {
  CallKey c;
  std::memset(&c, 0, sizeof c);
  c.m = p.m;
  c.n = p.n;
  c.k = p.k;
  c.extra0 = p.extra[0];
  c.extra1 = p.extra[1];
  c.extra2 = p.extra[2];
  c.stride_code = p.stride_code;
  c.ordinal = p.device.ordinal;
  c.op = static_cast<uint8_t>(p.op);
  c.device_type = static_cast<uint8_t>(p.device.type);
  c.in_dtype = static_cast<uint8_t>(p.in_dtype);
  c.out_dtype = static_cast<uint8_t>(p.out_dtype);
  c.has_bias = p.has_bias ? 1 : 0;
  c.accum = static_cast<uint8_t>(p.accum);
  c.choice = p.choice;
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

// The op's forced plan for this call (RuntimeOptions::force) in *c, if one
// computes its dtype; left invalid when none does.
[[gnu::cold, gnu::noinline]] Status forced_choice(const Runtime::Impl& impl, const core::Problem& p,
                                                  const DeviceInfo& dev, Choice* c) noexcept {
  for (const core::Plan& f : impl.forced.of(p.op)) {
    if (f.variant->backend != p.device.type || f.variant->in_dtype != p.in_dtype) continue;
    if (Status s = f.variant->supports(p, f.params, dev); !s.ok())
      return make_status(StatusCode::no_variant,
                         "forced " + core::plan_to_string(f) + " declines this call: " + s.message());
    c->plan = f;
    c->source = PlanSource::forced;
    return Status();
  }
  return Status();
}

// No row of the op's own key: an engine's row for the call shapes
// get_default's plan (core::EngineRows; the op's spec has them). Still a
// default: not memoised, and the tuner sees the miss.
[[gnu::cold, gnu::noinline]] void shape_by_engine(Runtime::Impl& impl, const core::Problem& p, const DeviceInfo& dev,
                                                  Choice* c) noexcept {
  const core::OpSpec& spec = core::spec_of(p.op);
  table::EpochDomain::Guard guard(table::EpochDomain::global());
  const table::Snapshot* snap = impl.table.current.load(std::memory_order_seq_cst);
  api::EngineRowHit hit;
  if (!api::find_engine_row(*snap, impl.policy, spec, p, dev.device_name, &hit)) return;
  c->plan = api::shape_by_engine_row(spec, c->plan, snap->config(*hit.row), p, dev, nullptr);
  c->table_m = hit.bucket->ms[hit.index];
  c->source_id = hit.row->source_id;
  c->engine_row = true;
}

// Everything but a memo hit: the device, the binary key, a forced plan, the
// table, get_default (an engine's row may shape it). Returns the choice in *c.
[[gnu::noinline]] Status choose_full(Runtime::Impl& impl, Call& call, Choice* c) noexcept {
  const core::Problem& p = call.p;
  const DeviceInfo* dev = impl.device_for(p.device);
  if (dev == nullptr) return make_status(StatusCode::unsupported_device, core::no_backend_message(p.device));
  call.dev = dev;
  // The binary static key (table/key.hpp: OwnKey): hashed and compared as
  // bytes; the text form is built only off the hit path (tuning, info).
  const table::OwnKey okey = table::make_own_key(p, impl.device_name_hash(p.device, *dev));
  call.key_hash = table::own_key_hash(okey);

  if (impl.forced.any()) {
    if (Status s = forced_choice(impl, p, *dev, c); !s.ok() || c->plan.valid()) return s;
  }
  {
    table::EpochDomain::Guard guard(table::EpochDomain::global());
    const table::Snapshot* snap = impl.table.current.load(std::memory_order_seq_cst);
    if (const table::Bucket* b = snap->find_own(okey, call.key_hash, dev->device_name)) {
      size_t idx = 0;
      const table::Row* r = table::Snapshot::nearest(*b, p.m, impl.policy, &idx);
      if (r && table::Snapshot::plan(*b, idx).valid()) {
        c->plan = table::Snapshot::plan(*b, idx);
        c->source = PlanSource::table;
        c->table_m = b->ms[idx];
        c->source_id = r->source_id;
      }
    }
  }
  // Deterministic serving never runs a scheduling-dependent variant: such a
  // row gives way to get_default's plan, screened the same way (default_plan).
  if (!c->plan.valid() || tune::excluded_by_determinism(impl.options.deterministic, *c->plan.variant)) {
    *c = Choice{};
    c->plan = default_plan(impl, p, *dev);
    if (!c->plan.valid()) return core::no_variant_computes(p);
    if (core::spec_of(p.op).engine_rows.fields != nullptr) [[unlikely]]
      shape_by_engine(impl, p, *dev, c);
  }
  return Status();
}

// ------------------------------------------------------------------ observe
//
// The tuner's view of a call (Tuner::observe, tune/observe.cpp), off the hit
// path: the device and the binary key's hash it needs (a memo hit has
// neither yet), and the sync search's winner, which replaces the choice.
[[gnu::cold, gnu::noinline]] Status observe(Runtime::Impl& impl, Call& call, Choice* c) noexcept {
  const core::Problem& p = call.p;
  const DeviceInfo& dev = device_of(impl, call);
  if (call.key_hash == 0)
    call.key_hash = table::own_key_hash(table::make_own_key(p, impl.device_name_hash(p.device, dev)));
  const tune::ObservedCall oc{p, call.la, call.stream.handle, call.opts.capturing, dev, call.key_hash};
  tune::TunedNow now;
  if (Status s = impl.tuner->observe(oc, c->source, c->table_m, &now); !s.ok()) return s;
  if (now.tuned) {
    c->plan = now.plan;
    c->source = PlanSource::table;
    c->table_m = p.m;
    c->source_id = now.source_id;
    c->tuned_now = true;
    c->engine_row = false;  // its own row now, not the engine's
  }
  return Status();
}

// ------------------------------------------------------------------ the call

// A memo hit far from its row's M: observed (sampled), then launched.
[[gnu::cold, gnu::noinline]] Status observe_and_launch(Runtime::Impl& impl, Call& call, Choice c) noexcept {
  if (Status s = observe(impl, call, &c); !s.ok()) return s;
  return launch(impl, call, c);
}

Status run(Runtime& rt, const core::Problem& p, core::LaunchArgs& la, Stream stream, const CallOptions& opts) noexcept {
  Runtime::Impl& impl = rt.impl();
  Call call{p, la, stream, opts};
  const CallKey ckey = call_key(p);
  HitMemo& memo = memo_slot(ckey);
  // Loaded before the table (acquire; the writer stores it after `current`):
  // an entry made below is tagged with a generation no newer than its table.
  const uint64_t gen = impl.table.gen.load(std::memory_order_acquire);
  if (!impl.forced.any() && gen != 0 && memo.gen == gen && std::memcmp(&memo.key, &ckey, sizeof ckey) == 0) [[likely]] {
    const bool near = tune::near_tuned(memo.table_m, p.m);
    if (!near && impl.tuner && impl.tuner->mode() != TuneMode::off) [[unlikely]] {
      if (!impl.forked_child()) return observe_and_launch(impl, call, Choice(memo.plan, memo.table_m, memo.source_id));
      impl.note_no_tuning_in_child();  // once: why this child never tunes
    }
    return launch(impl, call, Choice(memo.plan, memo.table_m, memo.source_id));
  }
  Choice c;
  if (Status s = choose_full(impl, call, &c); !s.ok()) return s;
  if (c.source == PlanSource::table && gen != 0) {
    memo.gen = gen;
    memo.key = ckey;
    memo.table_m = c.table_m;
    memo.source_id = c.source_id;
    memo.plan = c.plan;
  }
  if (impl.tuner && (c.source != PlanSource::table || impl.tuner->mode() != TuneMode::off)) {
    if (!impl.forked_child()) {
      if (Status s = observe(impl, call, &c); !s.ok()) return s;
    } else if (c.source != PlanSource::table && impl.tuner->mode() != TuneMode::off) [[unlikely]] {
      impl.note_no_tuning_in_child();  // once: why this child never tunes its misses
    }
  }
  return launch(impl, call, c);
}

// A call with M = 0 of an op that still launches then
// (OpSpec::launches_when_empty): a forced plan, else get_default's; no
// table, no tuning.
[[gnu::cold, gnu::noinline]] Status run_empty(Runtime& rt, const core::Problem& p, core::LaunchArgs& la, Stream stream,
                                              const CallOptions& opts) noexcept {
  Runtime::Impl& impl = rt.impl();
  Call call{p, la, stream, opts};
  call.dev = impl.device_for(p.device);
  if (call.dev == nullptr) return make_status(StatusCode::unsupported_device, core::no_backend_message(p.device));
  Choice c;
  if (impl.forced.any())
    if (Status s = forced_choice(impl, p, *call.dev, &c); !s.ok()) return s;
  if (!c.plan.valid()) c.plan = default_plan(impl, p, *call.dev);
  if (!c.plan.valid()) return core::no_variant_computes(p);
  return launch(impl, call, c);
}

}  // namespace

// choose_full's answers, word for word (api/ops_impl.hpp).
Status api::refuse_as_the_op(Runtime::Impl& impl, const core::Problem& p, const DeviceInfo** dev) noexcept {
  *dev = impl.device_for(p.device);
  if (*dev == nullptr) return make_status(StatusCode::unsupported_device, core::no_backend_message(p.device));
  if (!default_plan(impl, p, **dev).valid()) return core::no_variant_computes(p);
  return Status();
}

// One op by name (bindings, the C ABI): the args struct from slot-ordered
// tensors and scalars, then the op's entry point (below).
Status call_op(Runtime& rt, std::string_view op, std::span<const TensorRef> tensors, std::span<const float> scalars,
               Stream stream, const CallOptions& opts) noexcept {
  const core::OpSpec* s = nullptr;
  float full[core::kMaxScalars] = {};
  if (Status st = api::named_op_args(op, tensors.size(), scalars, &s, full); !st.ok()) return st;
  switch (s->op) {
#define KD_GENERIC_CALL(op, Args, tensors_, scalars_) \
  case core::OpKind::op: {                            \
    KD_ARGS_FROM_SPANS(Args, tensors_, scalars_)      \
    return dispatch::op(rt, args, stream, opts);      \
  }
    KDISPATCH_OP_LIST(KD_GENERIC_CALL)
#undef KD_GENERIC_CALL
  }
  return make_status(StatusCode::internal, "call_op: op without an entry point");
}

// One entry point per row of core/op_list.hpp (its pretune: op_keys.cpp).
#define KD_OP_ENTRY(op, Args, tensors, scalars)                                                               \
  Status op(Runtime& rt, const Args& args, Stream stream, const CallOptions& opts) noexcept {                 \
    core::Problem p;                                                                                          \
    core::LaunchArgs la{core::LaunchArgs::Unset{}}; /* validate sets every slot and scalar */                 \
    bool empty = false;                                                                                       \
    if (Status s = api::validate_##op(args, &p, &la, &empty); !s.ok()) return s;                              \
    if (empty)                                                                                                \
      return core::OpSpecOf<core::OpKind::op>::value.launches_when_empty ? run_empty(rt, p, la, stream, opts) \
                                                                         : Status();                          \
    return run(rt, p, la, stream, opts);                                                                      \
  }
KDISPATCH_OP_LIST(KD_OP_ENTRY)
#undef KD_OP_ENTRY

}  // namespace dispatch
