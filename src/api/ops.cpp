// SPDX-License-Identifier: Apache-2.0
// The op entry points, one per row of core/op_list.hpp, all the same call:
//
//   validate -> choose -> observe -> launch
//
//   choose   which plan serves: a forced plan, the thread's memo of recent
//            table hits, the table (nearest M), else get_default. Takes no
//            lock and writes nothing shared (the memo is the thread's own).
//   observe  the tuner's one hook (Tuner::observe): it records a miss,
//            samples hits far from their row's M, checks the stream's
//            capture state and, in sync mode, searches on the caller's
//            buffers and may hand back the winner. It runs before the
//            launch because the sync search must restore those buffers
//            before the real launch; on a table hit it is one branch.
//   launch   the info, the workspace, the alignment re-check, reset_to_zero
//            arguments, the variant's launch, and the in-call fallback chain
//            (get_default, then the reference) when a plan returns
//            core::kNeedsFallbackCode — a code, never a message's text.
//
// Hot path rules (a table hit): no lock, no allocation, no syscall, no
// logging, no shared write; the table is read inside an epoch guard and the
// plan is copied out, so the guard is released before the kernel runs.
#include "dispatch/ops.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "api/runtime_impl.hpp"
#include "api/validate.hpp"
#include "ops/specs.hpp"
#include "store/filename.hpp"
#include "store/fingerprint.hpp"
#include "core/op_spec.hpp"
#include "backends/registry.hpp"
#include "backends/backend.hpp"
#include "table/epoch.hpp"
#include "table/key.hpp"
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
  if (plan.valid() && impl.options.deterministic && (plan.variant->flags & core::kVariantNondeterministic)) {
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
  int64_t m, n, k, extra0, extra1;
  uint32_t stride_code;
  int32_t ordinal;
  uint8_t op, device_type, in_dtype, out_dtype, has_bias, accum, pad[2];
};
static_assert(sizeof(CallKey) == 56, "CallKey is compared as bytes: no implicit padding");

CallKey call_key(const core::Problem& p) noexcept {
  CallKey c;
  std::memset(&c, 0, sizeof c);
  c.m = p.m;
  c.n = p.n;
  c.k = p.k;
  c.extra0 = p.extra[0];
  c.extra1 = p.extra[1];
  c.stride_code = p.stride_code;
  c.ordinal = p.device.ordinal;
  c.op = static_cast<uint8_t>(p.op);
  c.device_type = static_cast<uint8_t>(p.device.type);
  c.in_dtype = static_cast<uint8_t>(p.in_dtype);
  c.out_dtype = static_cast<uint8_t>(p.out_dtype);
  c.has_bias = p.has_bias ? 1 : 0;
  c.accum = static_cast<uint8_t>(p.accum);
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

// Everything but a memo hit: the device, the binary key, a forced plan, the
// table, get_default. Returns the choice in *c.
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
    for (const core::Plan& f : impl.forced.of(p.op)) {
      if (f.variant->backend != p.device.type || f.variant->in_dtype != p.in_dtype) continue;
      if (Status s = f.variant->supports(p, f.params, *dev); !s.ok())
        return make_status(StatusCode::no_variant,
                           "forced " + core::plan_to_string(f) + " declines this call: " + s.message());
      c->plan = f;
      c->source = PlanSource::forced;
      return Status();
    }
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
  if (c->plan.valid() && impl.options.deterministic && (c->plan.variant->flags & core::kVariantNondeterministic))
    *c = Choice{};  // deterministic serving never runs a scheduling-dependent variant
  if (!c->plan.valid()) {
    c->plan = default_plan(impl, p, *dev);
    if (!c->plan.valid()) return core::no_variant_computes(p);
  }
  return Status();
}

// Far from every tuned M (outside [m/2, 2m]): a hit by nearest-M, but worth
// tuning. Sampled: one in 16 such calls per thread notes it.
bool far_hit_sample(int64_t table_m, int64_t m) noexcept {
  if (table_m * 2 >= m && m * 2 >= table_m) return false;
  thread_local uint32_t n = 0;
  return (++n & 15u) == 0;
}

// ------------------------------------------------------------------ observe
//
// The tuner's view of a call. A miss is recorded (for export), queued in
// background mode and tuned here in sync mode unless the stream is being
// captured (the capture query is asked only then: a hit never pays for
// it); a hit far from its row's M is sampled. May replace the choice with
// the sync search's winner.
[[gnu::cold, gnu::noinline]] Status observe(Runtime::Impl& impl, Call& call, Choice* c) noexcept {
  tune::Tuner& tuner = *impl.tuner;
  const core::Problem& p = call.p;
  if (call.key_hash == 0)
    call.key_hash = table::own_key_hash(table::make_own_key(p, impl.device_name_hash(p.device, device_of(impl, call))));
  if (c->source == PlanSource::table) {
    if (tuner.mode() != TuneMode::off && far_hit_sample(c->table_m, p.m))
      tuner.note_miss(p, call.la, call.key_hash, /*queue=*/true);
    return Status();
  }
  if (c->source != PlanSource::fallback) return Status();  // forced: nothing to learn
  tuner.note_miss(p, call.la, call.key_hash, /*queue=*/true);
  // Graph captures (tune/capture.hpp). Background mode: the miss's stream
  // is noted, no query here; the tuner asks whether it captures before
  // each search and waits while it does. Sync mode: a captured miss is
  // never searched now (a search inside a capture breaks it) but deferred
  // to the next miss outside a capture.
  if (tuner.mode() == TuneMode::background) {
    if (call.stream.handle) tuner.note_stream(p.device.type, call.stream.handle);
    return Status();
  }
  if (tuner.mode() != TuneMode::sync) return Status();
  const bool this_captures =
      call.opts.capturing || (call.stream.handle && tune::stream_capturing(p.device.type, call.stream.handle));
  if (this_captures && call.stream.handle) tuner.note_stream(p.device.type, call.stream.handle);
  // A search (on the legacy stream) while another thread's stream captures
  // would break that capture too: deferred as well.
  if (this_captures || tuner.capture_in_progress()) {
    tuner.note_capture(p, call.la, call.key_hash);
    return Status();
  }
  tuner.drain_deferred(call.key_hash, p.m);
  const backends::Backend* backend = backends::find(p.device.type);
  table::KeyBuffer key;
  table::build_own_key(p, device_type_name(p.device.type), device_of(impl, call).device_name, &key);
  // The search launches on the legacy default stream: first let the
  // caller's stream finish writing the inputs (sync mode is for
  // development; one synchronisation on a miss is its price).
  if (backend && call.stream.handle)
    if (Status s = backend->stream_synchronize(call.stream.handle); !s.ok()) return s;
  auto r = tuner.tune_on_caller(p, call.la, device_of(impl, call), std::string(key.view()));
  if (r.ok()) {
    c->plan = r->plan;
    c->source = PlanSource::table;
    c->table_m = p.m;
    c->source_id = r->source_id;
    c->tuned_now = true;
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
    const bool near = memo.table_m * 2 >= p.m && p.m * 2 >= memo.table_m;
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

// What the op call refuses after validation, before any table or plan:
// no backend for the tensors' device, or no variant for the problem's dtype
// combination (choose_full's answers, word for word). Pretune asks it
// before any scratch is made or row persisted, so that it never tunes
// (launches the reference on) a problem the op would refuse.
Status refuse_as_the_op(Runtime::Impl& impl, const core::Problem& p, const DeviceInfo** dev) noexcept {
  *dev = impl.device_for(p.device);
  if (*dev == nullptr) return make_status(StatusCode::unsupported_device, core::no_backend_message(p.device));
  if (!default_plan(impl, p, **dev).valid()) return core::no_variant_computes(p);
  return Status();
}

Result<PretuneResult> pretune_problem(Runtime& rt, const core::Problem& p, const core::LaunchArgs& la) noexcept {
  try {
    Runtime::Impl& impl = rt.impl();
    const DeviceInfo* dev = nullptr;
    if (Status s = refuse_as_the_op(impl, p, &dev); !s.ok()) return s;
    if (impl.forked_child()) return impl.refuse_in_child("pretune");
    if (impl.frozen.load(std::memory_order_acquire))
      return make_status(StatusCode::failed_precondition, "runtime is frozen: no tuning");
    tune::MissEvent ev;
    ev.problem = p;
    std::copy(std::begin(la.ld), std::end(la.ld), std::begin(ev.ld));
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
    out.margin = impl.options.tune.margin;
    out.aa_spread = r->search.confirmed ? r->search.aa_spread : 0.0;
    out.timing = r->search.timing;
    out.why = r->search.why;
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "pretune");
  }
}

// "<first dim-binding slot>: <its M name> is 0, nothing to tune".
[[gnu::cold]] Status nothing_to_tune(const core::OpSpec& s) {
  const auto& first = s.slots[static_cast<size_t>(s.order[0])];
  return make_status(StatusCode::invalid_argument, std::string(first.name) + ": " +
                                                       std::string(s.dim_names[static_cast<int>(core::Dim::m)]) +
                                                       " is 0, nothing to tune");
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

// ------------------------------------------------------------------ the op list, for bindings

namespace {

std::string_view dim_symbol(const core::OpSpec& s, core::Dim d) noexcept {
  return d == core::Dim::none ? std::string_view() : s.dim_names[static_cast<int>(d)];
}

std::string_view field_kind_name(core::FieldKind k) noexcept {
  switch (k) {
    case core::FieldKind::dim: return "dim";
    case core::FieldKind::in_dtype: return "dtype";
    case core::FieldKind::out_dtype: return "out_dtype";
    case core::FieldKind::flag: return "flag";
    case core::FieldKind::stride: return "stride";
    case core::FieldKind::accum: return "accum";
  }
  return "?";
}

struct OpListStorage {
  std::vector<std::vector<OpArgInfo>> args;
  std::vector<std::vector<OpScalarInfo>> scalars;
  std::vector<std::vector<OpKeyFieldInfo>> fields;
  std::vector<std::vector<std::string_view>> in_dtypes;
  std::vector<OpInfo> ops;
  OpListStorage() {
    for (const core::OpSpec* s : core::all_specs()) {
      std::vector<OpArgInfo> a;
      for (const core::ArgSlot& slot : s->slots) {
        OpArgInfo i;
        i.name = slot.name;
        i.read = slot.role != core::Role::write;
        i.written = slot.role != core::Role::read;
        i.rank = slot.rank;
        i.optional = slot.optional;
        if (slot.rank == 2) {
          i.rows_dim = dim_symbol(*s, slot.rows.dim);
          i.rows_mul = slot.rows.mul;
          i.rows_div = slot.rows.div;
        }
        i.cols_dim = dim_symbol(*s, slot.cols.dim);
        i.cols_mul = slot.cols.mul;
        i.cols_div = slot.cols.div;
        i.alias_of = slot.alias_of;
        i.col_major_ok = slot.col_major_ok;
        i.dtype = slot.dtype == core::SlotDType::in    ? std::string_view("in")
                  : slot.dtype == core::SlotDType::out ? std::string_view("out")
                                                       : dtype_name(slot.fixed_dtype);
        a.push_back(i);
      }
      std::vector<OpScalarInfo> sc;
      for (const core::ScalarSlot& x : s->scalars)
        sc.push_back({x.name, x.default_value, x.kind == core::ScalarKind::accum ? "bool" : "float"});
      std::vector<OpKeyFieldInfo> f;
      for (const core::KeyField& k : s->fields)
        f.push_back({k.name, field_kind_name(k.kind), k.csv_name.empty() ? k.name : k.csv_name, k.file_pos});
      args.push_back(std::move(a));
      scalars.push_back(std::move(sc));
      fields.push_back(std::move(f));
      bool seen[kDTypeCount] = {};
      for (const backends::Backend* b : backends::compiled())
        for (const core::VariantDef* v : core::variants_for(s->op, b->type()))
          seen[static_cast<size_t>(v->in_dtype)] = true;
      std::vector<std::string_view> dts;
      for (int t = 0; t < kDTypeCount; ++t)
        if (seen[t]) dts.push_back(dtype_name(static_cast<DType>(t)));
      in_dtypes.push_back(std::move(dts));
    }
    size_t i = 0;
    for (const core::OpSpec* s : core::all_specs()) {
      ops.push_back(
          OpInfo{s->name, s->summary, args[i], scalars[i], s->uses_workspace, fields[i],
                 s->dim_names[static_cast<int>(core::Dim::m)], in_dtypes[i],
                 s->default_out_dtype < 0 ? std::string_view() : dtype_name(static_cast<DType>(s->default_out_dtype))});
      ++i;
    }
  }
};

// The scalars a caller must give: all but the trailing switches (left out:
// off, as callers wrote before the op had them).
size_t required_scalars(const core::OpSpec& s) noexcept {
  size_t n = s.scalars.size();
  while (n > 0 && s.scalars[n - 1].kind == core::ScalarKind::accum) --n;
  return n;
}

// The args struct of `op` from slot-ordered tensors and scalars.
[[gnu::cold]] Status count_error(const core::OpSpec& s, size_t nt, size_t ns) {
  const size_t need = required_scalars(s);
  return make_status(StatusCode::invalid_argument, std::string(s.name) + " takes " + std::to_string(s.slots.size()) +
                                                       " tensors and " +
                                                       (need == s.scalars.size() ? "" : std::to_string(need) + " to ") +
                                                       std::to_string(s.scalars.size()) + " scalars, got " +
                                                       std::to_string(nt) + " and " + std::to_string(ns));
}

// The op's scalars in full (left-out switches: their defaults), each switch
// checked to be 0 or 1 before it becomes a bool member. Errors name it.
Status full_scalars(const core::OpSpec& s, std::span<const float> given, float (&out)[core::kMaxScalars]) noexcept {
  for (size_t j = 0; j < s.scalars.size(); ++j) {
    out[j] = j < given.size() ? given[j] : s.scalars[j].default_value;
    if (s.scalars[j].kind == core::ScalarKind::accum && out[j] != 0.f && out[j] != 1.f)
      return make_status(StatusCode::invalid_argument,
                         std::string(s.scalars[j].name) +
                             ": must be 0 or 1 (false or true: 1 asks for fast accumulation), got " +
                             std::to_string(out[j]));
  }
  return Status();
}

inline void set_scalar(float& member, float v) noexcept { member = v; }
inline void set_scalar(bool& member, float v) noexcept { member = v != 0.f; }

const core::OpSpec* spec_named(std::string_view op) noexcept { return core::find_spec(op); }

}  // namespace

std::span<const OpInfo> op_list() noexcept {
  static const OpListStorage storage;
  return storage.ops;
}

namespace {

// The Problem of an own op's key fields at batch size m (m >= 1).
Result<core::Problem> key_problem(std::string_view op, std::string_view key_fields, int64_t m) {
  const core::OpSpec* s = spec_named(op);
  if (s == nullptr) return make_status(StatusCode::invalid_argument, "unknown op '" + std::string(op) + "'");
  if (m < 1 || m > core::kMaxDim)
    return make_status(StatusCode::invalid_argument, "M must be in [1, 2^40], got " + std::to_string(m));
  auto fields = store::parse_key_fields(key_fields);
  if (!fields.ok()) return fields.status();
  auto p = store::own_problem_from_fields(s->op, *fields);
  if (!p.ok()) return p.status();
  p->m = m;
  return p;
}

}  // namespace

Result<KeyProblem> describe_key(std::string_view op, std::string_view key_fields, int64_t m) noexcept {
  try {
    auto p = key_problem(op, key_fields, m);
    if (!p.ok()) return p.status();
    const core::OpSpec& s = core::spec_of(p->op);
    KeyProblem out;
    table::KeyBuffer kb;
    table::append_own_fields(*p, &kb);
    out.key_fields = store::file_order_fields(p->op, kb.view(), "");  // file-name order, no device name
    out.flops = s.flops ? s.flops(*p) : 0.0;
    for (int i = 0; i < s.slot_count(); ++i) {
      const core::SlotExtent e = core::slot_extent(s, i, *p);
      int64_t b = 0;  // saturates: dims up to 2^40 can multiply past int64
      if (e.present && (__builtin_mul_overflow(e.rows, e.cols, &b) ||
                        __builtin_mul_overflow(b, static_cast<int64_t>(dtype_size(e.dtype)), &b) ||
                        __builtin_add_overflow(out.bytes, b, &out.bytes)))
        out.bytes = INT64_MAX;
    }
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "describe_key");
  }
}

Result<PretuneResult> pretune_key(Runtime& rt, std::string_view op, std::string_view key_fields, int64_t m,
                                  Device device) noexcept {
  try {
    auto p = key_problem(op, key_fields, m);
    if (!p.ok()) return p.status();
    p->device = device;
    core::LaunchArgs la;  // contiguous rows: the scratch layout's default
    return pretune_problem(rt, *p, la);
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "pretune_key");
  }
}

Result<ConfigTimings> time_configs(Runtime& rt, std::string_view op, std::string_view key_fields, int64_t m,
                                   std::span<const Config> configs, Device device, int32_t rounds) noexcept {
  try {
    if (rounds < 1 || rounds > 16)
      return make_status(StatusCode::invalid_argument, "rounds must be in [1, 16], got " + std::to_string(rounds));
    auto p = key_problem(op, key_fields, m);
    if (!p.ok()) return p.status();
    p->device = device;
    Runtime::Impl& impl = rt.impl();
    if (impl.forked_child()) return impl.refuse_in_child("time_configs");
    const DeviceInfo* dev = impl.device_for(device);
    if (!dev) return make_status(StatusCode::unsupported_device, core::no_backend_message(device));
    ConfigTimings out;
    tune::MissEvent ev;
    ev.problem = *p;  // contiguous rows: pretune_key's scratch layout
    out.key = tune::Tuner::key_of(*p, *dev);
    out.device_name = dev->device_name;
    if (const store::Fingerprint* f = store::backend_fingerprint(device.type)) out.fingerprint = f->to_json();
    out.configs.resize(configs.size());
    std::vector<core::Plan> plans;
    std::vector<size_t> index;  // plans[j] is configs[index[j]]
    for (size_t i = 0; i < configs.size(); ++i) {
      auto plan = core::plan_from_config(configs[i], p->op, device.type);
      if (!plan.ok()) {
        out.configs[i].status = plan.status();
        continue;
      }
      const core::VariantDef* v = plan->variant;
      if (v->in_dtype != p->in_dtype) {
        out.configs[i].status = make_status(StatusCode::unsupported_problem,
                                            std::string(v->name) + " computes " + std::string(dtype_name(v->in_dtype)) +
                                                ", the key is " + std::string(dtype_name(p->in_dtype)));
        continue;
      }
      if (Status s = v->supports(*p, plan->params, *dev); !s.ok()) {
        out.configs[i].status =
            make_status(StatusCode::unsupported_problem, std::string(v->name) + " declines this key: " + s.message());
        continue;
      }
      plans.push_back(*plan);
      index.push_back(i);
    }
    // The floor, in the same rounds (merge --retime holds the sources'
    // configs against it).
    out.floor.status = make_status(StatusCode::unsupported_problem, "no floor for this key here");
    size_t floor_at = plans.size();  // plans[floor_at] is the floor (== plans.size(): not timed)
    if (const core::Plan fp = core::floor_plan(*p, *dev);
        fp.valid() && fp.variant->supports(*p, fp.params, *dev).ok()) {
      out.floor_config = core::plan_to_config(fp);
      floor_at = static_cast<size_t>(std::find(plans.begin(), plans.end(), fp) - plans.begin());
      if (floor_at == plans.size()) plans.push_back(fp);
    }
    if (plans.empty()) return out;
    auto t = impl.tuner->time_on_scratch(ev, *dev, out.key, plans, rounds);
    if (!t.ok()) return t.status();
    for (size_t j = 0; j < plans.size(); ++j) {
      ConfigTiming& c = j < index.size() ? out.configs[index[j]] : out.floor;
      c.status = (*t)[j].status;
      if (!c.status.ok()) continue;
      c.round_us = (*t)[j].round_us;
      double sum = 0;
      for (double u : c.round_us) sum += u;
      c.us = c.round_us.empty() ? 0.0 : sum / static_cast<double>(c.round_us.size());
    }
    if (floor_at < index.size()) {
      out.floor = out.configs[index[floor_at]];
      out.floor_index = static_cast<int32_t>(index[floor_at]);
    }
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "time_configs");
  }
}

#define KD_ARG_FROM_SPAN(x) args.x = tensors[i++];
#define KD_SCALAR_FROM_SPAN(x) set_scalar(args.x, full[j++]);
Status call_op(Runtime& rt, std::string_view op, std::span<const TensorRef> tensors, std::span<const float> scalars,
               Stream stream, const CallOptions& opts) noexcept {
  const core::OpSpec* s = spec_named(op);
  if (s == nullptr) return make_status(StatusCode::invalid_argument, "unknown op '" + std::string(op) + "'");
  if (tensors.size() != s->slots.size() || scalars.size() > s->scalars.size() || scalars.size() < required_scalars(*s))
    return count_error(*s, tensors.size(), scalars.size());
  float full[core::kMaxScalars] = {};
  if (Status st = full_scalars(*s, scalars, full); !st.ok()) return st;
  switch (s->op) {
#define KD_GENERIC_CALL(op, Args, tensors_, scalars_)            \
  case core::OpKind::op: {                                       \
    Args args;                                                   \
    size_t i = 0, j = 0;                                         \
    KD_PP_FOR_EACH(KD_ARG_FROM_SPAN, KD_PP_NOTHING, tensors_)    \
    KD_PP_FOR_EACH(KD_SCALAR_FROM_SPAN, KD_PP_NOTHING, scalars_) \
    (void)i, (void)j;                                            \
    return dispatch::op(rt, args, stream, opts);                 \
  }
    KDISPATCH_OP_LIST(KD_GENERIC_CALL)
#undef KD_GENERIC_CALL
  }
  return make_status(StatusCode::internal, "call_op: op without an entry point");
}

Result<PretuneResult> pretune_op(Runtime& rt, std::string_view op, std::span<const TensorRef> tensors,
                                 std::span<const float> scalars) noexcept {
  const core::OpSpec* s = spec_named(op);
  if (s == nullptr) return make_status(StatusCode::invalid_argument, "unknown op '" + std::string(op) + "'");
  if (tensors.size() != s->slots.size() || scalars.size() > s->scalars.size() || scalars.size() < required_scalars(*s))
    return count_error(*s, tensors.size(), scalars.size());
  float full[core::kMaxScalars] = {};
  if (Status st = full_scalars(*s, scalars, full); !st.ok()) return st;
  switch (s->op) {
#define KD_GENERIC_PRETUNE(op, Args, tensors_, scalars_)         \
  case core::OpKind::op: {                                       \
    Args args;                                                   \
    size_t i = 0, j = 0;                                         \
    KD_PP_FOR_EACH(KD_ARG_FROM_SPAN, KD_PP_NOTHING, tensors_)    \
    KD_PP_FOR_EACH(KD_SCALAR_FROM_SPAN, KD_PP_NOTHING, scalars_) \
    (void)i, (void)j;                                            \
    return dispatch::pretune(rt, args);                          \
  }
    KDISPATCH_OP_LIST(KD_GENERIC_PRETUNE)
#undef KD_GENERIC_PRETUNE
  }
  return make_status(StatusCode::internal, "pretune_op: op without an entry point");
}
#undef KD_ARG_FROM_SPAN
#undef KD_SCALAR_FROM_SPAN

// One entry point and one pretune per row of core/op_list.hpp.
#define KD_OP_ENTRY(op, Args, tensors, scalars)                                                          \
  Status op(Runtime& rt, const Args& args, Stream stream, const CallOptions& opts) noexcept {            \
    core::Problem p;                                                                                     \
    core::LaunchArgs la{core::LaunchArgs::Unset{}}; /* validate sets every slot and scalar */            \
    bool empty = false;                                                                                  \
    if (Status s = api::validate_##op(args, &p, &la, &empty); !s.ok()) return s;                         \
    if (empty) return Status();                                                                          \
    return run(rt, p, la, stream, opts);                                                                 \
  }                                                                                                      \
  Result<PretuneResult> pretune(Runtime& rt, const Args& args) noexcept {                                \
    core::Problem p;                                                                                     \
    core::LaunchArgs la;                                                                                 \
    bool empty = false;                                                                                  \
    if (Status s = api::validate_##op(args, &p, &la, &empty, /*require_data=*/false); !s.ok()) return s; \
    if (empty) return nothing_to_tune(core::spec_of(core::OpKind::op));                                  \
    return pretune_problem(rt, p, la);                                                                   \
  }
KDISPATCH_OP_LIST(KD_OP_ENTRY)
#undef KD_OP_ENTRY

}  // namespace dispatch
