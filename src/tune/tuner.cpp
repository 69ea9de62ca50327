// SPDX-License-Identifier: Apache-2.0
#include "tune/tuner.hpp"

#include "backends/backend.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "core/dtype_table.hpp"
#include "core/routing.hpp"
#include "backends/registry.hpp"
#include "backends/cpu/cpu_identity.hpp"
#include "ops/specs.hpp"
#include "store/filename.hpp"
#include "store/fingerprint.hpp"
#include "store/private_fs.hpp"
#include "store/writer.hpp"
#include "table/key.hpp"
#include "tune/rules.hpp"

namespace dispatch::tune {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Layout of each argument slot of a problem (its spec's shapes): rows,
// cols, row stride, dtype, and whether it is there (an absent bias).
struct Slot {
  int64_t rows = 0, cols = 0, ld = 0;
  DType dtype = DType::fp32;
  bool present = false;
  core::Fill fill = core::Fill::signed_unit;
  int64_t experts = 0;  ///< Problem::extra[0] (Fill::expert_ids)
};

std::vector<Slot> layout(const MissEvent& ev) {
  const core::Problem& p = ev.problem;
  const core::OpSpec& spec = core::spec_of(p.op);
  std::vector<Slot> s(static_cast<size_t>(spec.slot_count()));
  for (int i = 0; i < spec.slot_count(); ++i) {
    const core::SlotExtent e = core::slot_extent(spec, i, p);
    Slot& x = s[static_cast<size_t>(i)];
    x.rows = e.rows;
    x.cols = e.cols;
    x.ld = e.rows > 1 && ev.ld[i] > 0 ? ev.ld[i] : e.cols;
    x.dtype = e.dtype;
    x.present = e.present;
    x.fill = spec.slots[static_cast<size_t>(i)].fill;
    x.experts = p.extra[0];
  }
  return s;
}

// Bytes of one slot's scratch; INT64_MAX when the count does not fit (a
// problem no budget admits: validation bounds dims by kMaxDim, but rows x ld
// of a strided layout can still be large).
int64_t slot_bytes(const Slot& s) {
  if (!s.present || s.rows <= 0 || s.cols <= 0) return 0;
  int64_t elems = 0, bytes = 0;
  if (__builtin_mul_overflow(s.rows - 1, s.ld, &elems) || __builtin_add_overflow(elems, s.cols, &elems) ||
      __builtin_mul_overflow(elems, static_cast<int64_t>(dtype_size(s.dtype)), &bytes))
    return INT64_MAX;
  return bytes;
}

int64_t scratch_bytes(const MissEvent& ev) {
  int64_t total = 0;
  for (const Slot& s : layout(ev))
    if (__builtin_add_overflow(total, slot_bytes(s), &total)) return INT64_MAX;
  return total;
}

// One draw per element (whatever the dtype, so that the next slot's values do
// not depend on this one's dtype), stored as the dtype table's scratch fill
// says: the slot's value encoded, or the element's index mod 8.
// Routing slots (an MoE op's expert ids and router weights) are drawn by
// core/routing.hpp instead: the ids from TuneOptions::routing (uniform by
// default, the balanced router SGLang's tuner assumes; tune/routing_file.hpp).
void fill(void* ptr, const Slot& s, std::mt19937& rng, const Routing& routing) {
  if (s.fill == core::Fill::expert_ids && s.dtype == DType::int32) {
    fill_routing(routing, static_cast<int32_t*>(ptr), s.rows, s.cols, s.ld, s.experts, rng);
    return;
  }
  if (s.fill == core::Fill::routing_weights && s.dtype == DType::fp32) {
    core::fill_routing_weights(static_cast<float*>(ptr), s.rows, s.cols, s.ld, rng);
    return;
  }
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const core::DTypeInfo& d = core::dtype_info(s.dtype);
  const size_t n = static_cast<size_t>(slot_bytes(s)) / d.bytes;
  for (size_t i = 0; i < n; ++i) {
    const float r = u(rng);
    const float v = s.fill == core::Fill::near_one ? 1.f + 0.1f * r : s.fill == core::Fill::wide ? 4.f * r : r;
    const uint32_t bits =
        d.scratch == core::ScratchFill::index_mod8 ? static_cast<uint32_t>(i % 8) : core::encode_value(d, v);
    core::store_bits(d, ptr, i, bits);
  }
}

bool is_aligned(core::Fill f) {
  return f == core::Fill::aligned_sorted || f == core::Fill::aligned_experts || f == core::Fill::aligned_total;
}

void list_every_pair(std::vector<int32_t>* ids, int64_t experts) {
  for (size_t i = 0; i < ids->size(); ++i)
    if ((*ids)[i] < 0 || (*ids)[i] >= experts) (*ids)[i] = static_cast<int32_t>(static_cast<int64_t>(i) % experts);
}

// The expert of each of an aligned problem's M * top_k pairs (moe_gemm's
// scratch; none for an op without aligned slots), drawn from `routing` with
// its own seed so that every slot of the alignment sees the same pairs. A
// recorded routing with another top_k (the down GEMM's top_k = 1) gives its
// ids flat, token after token. Every pair is listed: an id outside [0, E)
// (top_k > E, a recorded -1) becomes expert i mod E, since moe_gemm leaves
// an unlisted pair's rows alone and the search checks every output element.
Status aligned_pair_ids(const core::Problem& p, const Routing& routing, std::vector<int32_t>* ids) {
  const core::OpSpec& spec = core::spec_of(p.op);
  if (std::none_of(spec.slots.begin(), spec.slots.end(), [](const core::ArgSlot& a) { return is_aligned(a.fill); }))
    return Status();
  const int64_t pairs = p.m * p.extra[1], E = p.extra[0];
  std::mt19937 rng(0x616c6e64u ^ static_cast<uint32_t>(p.m));
  if (!routing.recorded() || routing.top_k == p.extra[1]) {
    if (Status s = check_routing(routing, p.extra[1], E); !s.ok()) return s;
    ids->assign(static_cast<size_t>(pairs), 0);
    fill_routing(routing, ids->data(), p.m, p.extra[1], p.extra[1], E, rng);
    list_every_pair(ids, E);
    return Status();
  }
  if (Status s = check_routing(routing, routing.top_k, E); !s.ok()) return s;
  const int64_t tokens = (pairs + routing.top_k - 1) / routing.top_k;
  ids->assign(static_cast<size_t>(tokens * routing.top_k), 0);
  fill_routing(routing, ids->data(), tokens, routing.top_k, routing.top_k, E, rng);
  ids->resize(static_cast<size_t>(pairs));
  list_every_pair(ids, E);
  return Status();
}

std::string key_prefix(const std::string& key) { return key.substr(0, key.find('|')); }
std::string key_fields(const std::string& key) {
  const size_t a = key.find('|');
  const size_t b = key.find('|', a + 1);
  return b == std::string::npos ? std::string() : key.substr(b + 1);
}
std::string key_device(const std::string& key) {
  const size_t a = key.find('|');
  const size_t b = key.find('|', a + 1);
  return key.substr(a + 1, b - a - 1);
}

// Scratch operands of a problem laid out as `ev.ld`, filled as every search
// fills them (seeded by M), in its backend's memory; released with it.
struct Scratch {
  struct Buf {
    DeviceMemory* mem = nullptr;
    void* p = nullptr;
    Buf() = default;
    Buf(const Buf&) = delete;
    Buf& operator=(const Buf&) = delete;
    ~Buf() {
      if (p) mem->release(p);
    }
  };
  std::vector<Buf> bufs;
  core::LaunchArgs la;
  DeviceMemory* mem = nullptr;
};

Status make_scratch(const MissEvent& ev, int64_t budget, const std::string& key, const Routing& routing, Scratch* out) {
  const int64_t need = scratch_bytes(ev);
  if (need > budget)
    return make_status(StatusCode::out_of_memory, "scratch for " + key + " needs " + std::to_string(need) +
                                                      " bytes, over the tuning memory budget of " +
                                                      std::to_string(budget));
  const std::vector<Slot> slots = layout(ev);
  DeviceMemory* mem = memory_for(ev.problem.device.type);
  if (!mem) return make_status(StatusCode::unsupported_device, "no memory interface for this backend");
  out->mem = mem;
  out->bufs = std::vector<Scratch::Buf>(slots.size());
  std::mt19937 rng(0x6b646973u ^ static_cast<uint32_t>(ev.problem.m));
  std::vector<uint64_t> staging;
  const core::OpSpec& spec = core::spec_of(ev.problem.op);
  std::vector<int32_t> pair_ids;  // the aligned slots' routing, one for all three
  if (Status s = aligned_pair_ids(ev.problem, routing, &pair_ids); !s.ok())
    return make_status(s.code(), key + ": " + s.message());
  for (size_t i = 0; i < slots.size(); ++i) {
    const size_t b = static_cast<size_t>(slot_bytes(slots[i]));
    if (b == 0) continue;
    out->bufs[i].mem = mem;
    out->bufs[i].p = mem->alloc(b + 64);
    if (!out->bufs[i].p) return make_status(StatusCode::out_of_memory, "tuning scratch for " + key);
    staging.assign((b + 7) / 8, 0);
    if (slots[i].fill == core::Fill::expert_ids)
      if (Status s = check_routing(routing, slots[i].cols, slots[i].experts); !s.ok())
        return make_status(s.code(), key + ": " + s.message());
    if (is_aligned(slots[i].fill))
      core::moe_gemm_spec::fill_aligned(slots[i].fill, pair_ids.data(), ev.problem,
                                        reinterpret_cast<int32_t*>(staging.data()));
    else
      fill(staging.data(), slots[i], rng, routing);
    if (Status s = mem->from_host(out->bufs[i].p, staging.data(), b); !s.ok()) return s;
    out->la.data[i] = out->bufs[i].p;
    out->la.ld[i] = spec.slots[i].rank >= 2 ? slots[i].ld : spec.slots[i].cols.at_least ? slots[i].cols : 0;
  }
  for (size_t j = 0; j < spec.scalars.size(); ++j)
    out->la.scalar[j] = spec.scalars[j].kind == core::ScalarKind::accum
                            ? (ev.problem.accum == core::Accum::fast ? 1.f : 0.f)  // the problem's switch
                        : spec.scalars[j].kind == core::ScalarKind::choice
                            ? static_cast<float>(ev.problem.choice)  // and its choice (activation)
                        : spec.scalars[j].kind == core::ScalarKind::dim
                            ? static_cast<float>(core::dim_value(ev.problem, spec.scalars[j].dim))  // a size
                            : spec.scalars[j].default_value;
  return Status();
}

// The reference plan of a problem (invalid when the backend has none).
core::Plan reference_plan(const core::Problem& p) {
  core::Plan ref;
  if (const core::VariantDef* refv = core::reference_variant(p.op, p.device.type, p.in_dtype)) {
    ref.variant = refv;
    for (size_t i = 0; i < refv->params.size(); ++i) ref.params[i] = refv->params[i].default_value;
  }
  return ref;
}

// Refuses a problem the search must not run: one no variant computes (its
// dtype combination; get_default has no plan: the op's own refusal), or one
// the reference declines. The search launches the reference (and, with no
// default, would time it as the default) without asking supports(), on
// buffers sized for the problem's dtypes: a reference computing other
// dtypes would write past them.
Status refuse_untunable(const core::Problem& p, const DeviceInfo& dev, const core::Plan& def, const core::Plan& ref) {
  if (!def.valid()) return core::no_variant_computes(p);
  if (ref.valid() && ref.variant->supports)
    if (Status s = ref.variant->supports(p, ref.params, dev); !s.ok())
      return make_status(StatusCode::unsupported_problem,
                         "the reference " + std::string(ref.variant->name) + " declines this problem: " + s.message());
  return Status();
}
Status refuse_untunable(const core::Problem& p, const DeviceInfo& dev) {
  return refuse_untunable(p, dev, core::get_default(p, dev), reference_plan(p));
}

}  // namespace

Tuner::Tuner(const RuntimeOptions& options, std::string cache_dir, TunerHooks hooks,
             std::shared_ptr<const Routing> routing)
    : options_(options),
      routing_(routing ? std::move(routing) : std::make_shared<const Routing>()),
      mode_(options.tune.mode),
      cache_dir_(std::move(cache_dir)),
      hooks_(std::move(hooks)),
      queue_(static_cast<size_t>(std::max(options.tune.queue_capacity, 2))) {
  // The thread tunes misses (background mode) and, with verify_shipped,
  // verifies committed rows when it has no miss to tune (any mode).
  if (options.tune.verify_shipped) n_verify_pending_.store(1, std::memory_order_relaxed);  // not looked yet
  if (mode_ == TuneMode::background || options.tune.verify_shipped)
    thread_ = std::thread([this] { background_loop(); });
}

Tuner::~Tuner() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

std::string Tuner::key_of(const core::Problem& p, const DeviceInfo& dev) {
  table::KeyBuffer kb;
  table::build_own_key(p, device_type_name(p.device.type), dev.device_name, &kb);
  return std::string(kb.view());
}

void Tuner::note_miss(const core::Problem& p, const core::LaunchArgs& la, uint64_t key_hash, bool queue) noexcept {
  MissEvent ev;
  ev.problem = p;
  ev.key_hash = key_hash;
  std::copy(std::begin(la.ld), std::end(la.ld), std::begin(ev.ld));
  n_misses_.fetch_add(1, std::memory_order_relaxed);
  const int64_t count = misses_.record(ev);
  // Queue a shape when its miss count reaches 1, 2, 4, 8, ...: the tuner
  // learns of every new shape at once and of its growing count, while a
  // hot shape costs O(log n) queue slots instead of one per call. (With the
  // miss table full, every miss is queued.)
  const bool notify = count == 0 || (count & (count - 1)) == 0;
  if (queue && notify && mode_ == TuneMode::background && !frozen()) {
    ev.count = count > 0 ? count : 1;
    if (queue_.push(ev))
      n_queued_.fetch_add(1, std::memory_order_relaxed);
    else
      n_dropped_.fetch_add(1, std::memory_order_relaxed);
  }
}

void Tuner::note_capture(const core::Problem& p, const core::LaunchArgs& la, uint64_t key_hash) noexcept {
  if (mode_ != TuneMode::sync || frozen()) return;
  MissEvent ev;
  ev.problem = p;
  ev.key_hash = key_hash;
  std::copy(std::begin(la.ld), std::end(la.ld), std::begin(ev.ld));
  std::lock_guard<std::mutex> lock(deferred_mu_);
  for (const MissEvent& d : deferred_)
    if (d.key_hash == key_hash && d.problem.m == p.m) return;
  if (deferred_.size() >= 256) return;  // the miss table still has it (export)
  deferred_.push_back(ev);
  n_deferred_.fetch_add(1, std::memory_order_relaxed);
}

int Tuner::drain_deferred(uint64_t key_hash, int64_t m) noexcept {
  std::vector<MissEvent> todo;
  {
    std::lock_guard<std::mutex> lock(deferred_mu_);
    todo.swap(deferred_);
  }
  int published = 0;
  for (const MissEvent& ev : todo) {
    n_deferred_.fetch_sub(1, std::memory_order_relaxed);
    if (ev.key_hash == key_hash && ev.problem.m == m) continue;  // the caller's own shape: searched next
    const DeviceInfo* dev = core::local_device_info(ev.problem.device.type);
    if (!dev || frozen()) continue;
    const std::string key = key_of(ev.problem, *dev);
    if (hooks_.covered(key, ev.problem.m)) continue;
    if (scratch_bytes(ev) > options_.tune.memory_budget_bytes) {
      n_skipped_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    auto r = tune_on_scratch(ev, *dev, key, /*background=*/false);
    if (r.ok()) {
      misses_.settle(ev.key_hash, ev.problem.m);
      ++published;
    } else {
      n_skipped_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return published;
}

void Tuner::wait_for_captures() {
  if (!captures_.any_capturing()) return;
  n_capture_waits_.fetch_add(1, std::memory_order_relaxed);
  // A search inside an engine's capture could break it (HIP's tuner uses
  // the legacy stream; any backend's synchronising calls): wait it out.
  while (!stop_.load(std::memory_order_acquire) && captures_.any_capturing())
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

bool Tuner::persist_and_publish(const std::string& key, const core::Problem& p, const core::Plan& plan,
                                const SearchResult& sr, std::string* why, uint32_t* source_id) {
  Config cfg = core::plan_to_config(plan);
  bool persisted = false;
  const std::string prefix = key_prefix(key);
  // Own-op keys of every backend persist, each with its backend's
  // fingerprint ("<backend>/<op>": cpu/, cuda/, hip/).
  const size_t slash = prefix.find('/');
  const std::optional<core::OpKind> key_op =
      slash == std::string::npos ? std::nullopt : core::parse_op(prefix.substr(slash + 1));
  const bool own_key = key_op && prefix.compare(0, slash, device_type_name(p.device.type)) == 0;
  const std::string rel =
      prefix + "/" + (key_op ? store::own_file_name(*key_op, key_fields(key), key_device(key)) : key_fields(key));
  const store::Fingerprint* fingerprint = store::backend_fingerprint(p.device.type);
  if (options_.tune.persist && !cache_dir_.empty() && own_key && fingerprint == nullptr && why)
    *why = "no fingerprint for the " + std::string(device_type_name(p.device.type)) + " backend (no usable device)";
  if (options_.tune.persist && !cache_dir_.empty() && own_key && fingerprint != nullptr) {
    store::PersistRow row;
    row.m = p.m;
    row.config = cfg;
    row.us = sr.best_us;
    row.default_us = sr.default_us;
    row.meta.margin = options_.tune.margin;  // the bar the confirmation held the row to
    if (sr.confirmed) row.meta.aa_spread = sr.aa_spread;
    row.meta.timing = sr.timing;
    row.meta.why = sr.why;
    if (core::is_host(p.device.type) && host_cpu_identity().known()) row.meta.cpu = host_cpu_identity().to_json();
    std::vector<std::pair<std::string, int32_t>> schema = {
        {std::string(plan.variant->name), plan.variant->schema_version}};
    std::vector<std::string> notes;
    // Which scheme the dir is written with: checked once per process per
    // dir (store::locking_scheme), said once at info.
    store::LockingScheme ls;
    bool checked_now = false;
    if (store::locking_scheme(cache_dir_, &ls, &checked_now).ok() && checked_now &&
        options_.log_level >= LogLevel::info)
      std::fprintf(stderr, "kdispatch: tuning cache dir '%s': %s; %s\n", cache_dir_.c_str(), ls.reason.c_str(),
                   ls.fragments ? "each process writes its own fragment <key>.json.d/<host>-<pid>.json"
                                : "each <key>.json is merged under its lock file");
    Status s = store::persist_rows(cache_dir_, rel, {row}, *fingerprint, schema, nullptr,
                                   options_.tune.keep_rows_of_other_builds, &notes);
    if (options_.log_level >= LogLevel::warn)
      for (const auto& n : notes) std::fprintf(stderr, "kdispatch: %s\n", n.c_str());
    if (s.ok())
      persisted = true;
    else if (why)
      *why = s.message();
  }
  table::TableInput in;
  in.key = key;
  if (own_key) {
    in.has_own_key = true;
    in.device_name = key_device(key);
    in.own_key = table::make_own_key(p, table::key_hash(in.device_name));
  }
  in.source_rank = rank_;
  in.path = rel;
  in.source_id = hooks_.intern(cache_dir_.empty() ? std::string("<in-process tuning>") : cache_dir_, rel);
  if (source_id) *source_id = in.source_id;
  in.add_row(p.m, std::move(cfg), plan);
  if (hooks_.publish({std::move(in)})) n_publishes_.fetch_add(1, std::memory_order_relaxed);
  return persisted;
}

SearchOptions Tuner::search_options(const DeviceInfo& dev, bool background) const {
  SearchOptions so;
  so.device = &dev;
  so.measure.warmup = 1;
  so.measure.reps = std::max(options_.tune.reps, 1);
  so.measure.cold_cache = options_.tune.cold_cache;
  so.time_budget_ms = options_.tune.time_budget_ms;
  so.confirm_copy_bytes = options_.tune.memory_budget_bytes;
  so.max_candidates = options_.tune.max_candidates;
  so.margin = options_.tune.margin;
  so.graph = options_.tune.graph_timing;
  so.validate = options_.tune.validate;
  so.deterministic = options_.deterministic;
  so.stop = &stop_;
  if (background) so.duty_cycle = options_.tune.duty_cycle;  // the user's own calls run flat out
  return so;
}

Result<ShapeOutcome> Tuner::tune_target(TuneTarget& target, const DeviceInfo& dev, const std::string& key,
                                        bool background) noexcept {
  try {
    const core::Problem& p = target.problem;
    const SearchOptions so = search_options(dev, background);
    core::Plan def = core::get_default(p, dev);
    core::Plan ref = reference_plan(p);
    if (Status s = refuse_untunable(p, dev, def, ref); !s.ok()) return s;
    // The incumbent is the floor (what the engine would run without us):
    // every candidate, get_default's pick included (second), must beat it
    // by the margin in the confirmation, or the row records the floor.
    const core::Plan floor = core::floor_plan(p, dev);
    int32_t space = 0, pruned = 0;
    std::vector<core::Plan> cands = candidates_for(p, dev, floor.valid() ? floor : def, so, &space, &pruned);
    if (def.valid() && !cands.empty() && !(cands.front() == def) &&
        !excluded_by_determinism(so.deterministic, *def.variant)) {
      cands.erase(std::remove(cands.begin() + 1, cands.end(), def), cands.end());
      cands.insert(cands.begin() + 1, def);
    }
    return search_and_publish(target, cands, ref, dev, key, so, space, pruned);
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "tuning");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("tuning: ") + e.what());
  }
}

Result<ShapeOutcome> Tuner::tune_custom(TuneTarget& target, const std::vector<core::Plan>& candidates,
                                        const core::Plan& reference, const DeviceInfo& dev,
                                        const std::string& key) noexcept {
  if (frozen()) return make_status(StatusCode::failed_precondition, "runtime is frozen: no tuning");
  try {
    const SearchOptions so = search_options(dev, false);
    return search_and_publish(target, candidates, reference, dev, key, so, static_cast<int32_t>(candidates.size()), 0);
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "tuning");
  }
}

Result<ShapeOutcome> Tuner::search_and_publish(TuneTarget& target, const std::vector<core::Plan>& cands,
                                               const core::Plan& ref, const DeviceInfo& dev, const std::string& key,
                                               const SearchOptions& so, int32_t space, int32_t pruned) {
  const core::Problem& p = target.problem;
  const auto t0 = SteadyClock::now();
  auto sr = search(target, cands, ref, so);
  tune_us_.fetch_add(std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - t0).count(),
                     std::memory_order_relaxed);
  if (!sr.ok()) return sr.status();
  sr->space = space;
  sr->pruned_by_model = pruned;
  n_run_.fetch_add(static_cast<int64_t>(sr->tried.size()), std::memory_order_relaxed);
  n_rejected_.fetch_add(sr->rejected, std::memory_order_relaxed);
  n_failed_.fetch_add(sr->failed, std::memory_order_relaxed);
  if (sr->stopped)  // a search cut short records nothing (its "floor kept" was not measured)
    return make_status(StatusCode::failed_precondition, "tuning stopped (runtime shutting down)");
  ShapeOutcome out;
  out.plan = sr->best;
  std::string why;
  if (!frozen()) {
    out.persisted = persist_and_publish(key, p, sr->best, *sr, &why, &out.source_id);
    n_tuned_.fetch_add(1, std::memory_order_relaxed);
  }
  if (!why.empty() && options_.log_level >= LogLevel::warn)
    std::fprintf(stderr, "kdispatch: tuned %s M=%lld but could not persist it: %s\n", key.c_str(),
                 static_cast<long long>(p.m), why.c_str());
  if (sr->aa_spread > so.margin && options_.log_level >= LogLevel::warn &&
      !aa_warned_.exchange(true, std::memory_order_relaxed))
    std::fprintf(stderr,
                 "kdispatch: tuning %s M=%lld: the floor's A/A spread over the confirmation's placements is %.1f%%, "
                 "above the margin %.1f%% (KDISPATCH_TUNE_MARGIN / tune --margin): a win that small cannot be told "
                 "from noise on this machine (said once per run)\n",
                 key.c_str(), static_cast<long long>(p.m), 100.0 * sr->aa_spread, 100.0 * so.margin);
  if (options_.log_level >= LogLevel::info) {
    std::string rounds;  // the confirmation's winner/default ratio per placement
    for (double r : sr->confirm_ratios) rounds += (rounds.empty() ? "" : " ") + std::to_string(r).substr(0, 5);
    if (!sr->graph_ratios.empty()) rounds += "; in a graph";
    for (double r : sr->graph_ratios) rounds += " " + std::to_string(r).substr(0, 5);
    std::fprintf(stderr, "kdispatch: tuned %s M=%lld -> %s %.2f us (default %.2f us, %zu candidates%s%s%s)%s%s\n",
                 key.c_str(), static_cast<long long>(p.m), core::plan_to_string(sr->best).c_str(), sr->best_us,
                 sr->default_us, sr->tried.size(), rounds.empty() ? "" : "; confirmation winner/default per placement ",
                 rounds.c_str(), sr->kept_default ? ", default kept" : "", sr->clock_note.empty() ? "" : "; ",
                 sr->clock_note.c_str());
  }
  (void)dev;
  out.search = std::move(*sr);
  return out;
}

Result<ShapeOutcome> Tuner::tune_on_caller(const core::Problem& p, const core::LaunchArgs& la, const DeviceInfo& dev,
                                           const std::string& key) noexcept {
  if (frozen()) return make_status(StatusCode::failed_precondition, "runtime is frozen");
  std::unique_lock<std::mutex> lock(sync_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return make_status(StatusCode::failed_precondition, "another sync search is running");
  try {
    TuneTarget target = make_target(p, la);
    target.mem = memory_for(p.device.type);
    return tune_target(target, dev, key, false);
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "sync tuning");
  }
}

Result<ShapeOutcome> Tuner::tune_on_scratch(const MissEvent& ev, const DeviceInfo& dev, const std::string& key,
                                            bool background) noexcept {
  if (frozen()) return make_status(StatusCode::failed_precondition, "runtime is frozen: no tuning");
  try {
    if (Status s = refuse_untunable(ev.problem, dev); !s.ok()) return s;  // before any scratch
    Scratch scratch;
    if (Status s = make_scratch(ev, options_.tune.memory_budget_bytes, key, *routing_, &scratch); !s.ok()) return s;
    TuneTarget target = make_target(ev.problem, scratch.la);
    target.mem = scratch.mem;
    return tune_target(target, dev, key, background);
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "allocating tuning scratch for " + key);
  }
}

Result<std::vector<Tuner::PlanTiming>> Tuner::time_on_scratch(const MissEvent& ev, const DeviceInfo& dev,
                                                              const std::string& key,
                                                              const std::vector<core::Plan>& plans,
                                                              int rounds) noexcept {
  try {
    if (Status s = refuse_untunable(ev.problem, dev); !s.ok()) return s;  // before any scratch
    Scratch scratch;
    if (Status s = make_scratch(ev, options_.tune.memory_budget_bytes, key, *routing_, &scratch); !s.ok()) return s;
    TuneTarget target = make_target(ev.problem, scratch.la);
    target.mem = scratch.mem;
    SearchOptions so = search_options(dev, false);
    so.confirm = false;  // one plan per search: nothing to confirm against
    const core::Plan ref = reference_plan(ev.problem);
    std::vector<PlanTiming> out(plans.size());
    for (int round = 0; round < std::max(rounds, 1); ++round)
      for (size_t k = 0; k < plans.size(); ++k) {
        const size_t i = round % 2 == 0 ? k : plans.size() - 1 - k;
        if (!out[i].status.ok()) continue;  // failed in an earlier round
        const auto t0 = SteadyClock::now();
        auto sr = search(target, {plans[i]}, ref, so);
        tune_us_.fetch_add(std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - t0).count(),
                           std::memory_order_relaxed);
        if (!sr.ok()) {
          out[i].status = sr.status();
          out[i].round_us.clear();
          continue;
        }
        if (sr->stopped) return make_status(StatusCode::failed_precondition, "timing stopped (runtime shutting down)");
        out[i].round_us.push_back(sr->best_us);
      }
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "timing plans of " + key);
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("timing plans: ") + e.what());
  }
}

Result<VerifyOutcome> Tuner::verify_row(const VerifyRow& row, const DeviceInfo& dev, bool background) noexcept {
  try {
    const core::Problem& p = row.problem;
    if (Status s = refuse_untunable(p, dev); !s.ok()) return s;  // before any scratch
    const core::Plan floor = core::floor_plan(p, dev);
    if (!floor.valid()) return core::no_variant_computes(p);
    if (floor == row.plan)
      return make_status(StatusCode::invalid_argument, "the row is the floor itself: nothing to verify");
    MissEvent ev;
    ev.problem = p;  // contiguous rows: pretune_key's scratch layout
    Scratch scratch;
    if (Status s = make_scratch(ev, options_.tune.memory_budget_bytes, row.key, *routing_, &scratch); !s.ok()) return s;
    TuneTarget target = make_target(p, scratch.la);
    target.mem = scratch.mem;
    const SearchOptions so = search_options(dev, background);
    const auto t0 = SteadyClock::now();
    auto r = verify_plan(target, floor, row.plan, reference_plan(p), so);
    tune_us_.fetch_add(std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - t0).count(),
                       std::memory_order_relaxed);
    if (!r.ok()) return r.status();
    if (r->stopped) return make_status(StatusCode::failed_precondition, "verification stopped (runtime shutting down)");
    const bool row_failed = r->tried.size() >= 2 && !r->tried[1].status.ok();
    if (!row_failed && !r->confirmed)
      return make_status(StatusCode::internal, "the row and the floor could not be timed again: " + r->why);
    VerifyOutcome out;
    out.outcome = judge(*r, so.margin, &out.mean_ratio);
    const double aa = r->confirmed ? r->aa_spread : 0.0;
    const std::string identity = verdict_identity(p.device.type);
    if (options_.tune.persist && !cache_dir_.empty() && !identity.empty()) {
      auto v = record_verdict(cache_dir_, p.device.type, identity, row.id(), row.config_text, out.outcome,
                              out.mean_ratio, aa, so.margin, row.source);
      if (!v.ok()) return v.status();
      out.verdict = *v;
      out.recorded_in = verdict_path(cache_dir_, p.device.type, identity);
    } else if (hooks_.memory_verdicts) {  // no cache dir: the runtime's memory
      out.verdict = hooks_.memory_verdicts->record(p.device.type, row.id(), row.config_text, out.outcome,
                                                   out.mean_ratio, aa, so.margin, row.source);
    } else {
      apply_outcome(&out.verdict, row.config_text, out.outcome, out.mean_ratio, aa, so.margin, row.source);
    }
    out.search = std::move(*r);
    return out;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "verifying " + row.id());
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("verifying a row: ") + e.what());
  }
}

bool Tuner::verify_next_shipped(const std::function<void(DeviceType)>& prepare) {
  VerifyQueue& q = verify_queue_;
  const auto key_of_row = [](const VerifyRow& r) { return r.id() + "\n" + r.config_text; };
  if (q.rows.empty()) {
    // A new pass once the config dirs were loaded (again): the rows the
    // table serves that have no verdict under this machine's identity, or
    // lost once (to be verified once more), and that this thread has not
    // verified twice.
    std::vector<VerifyRow> all;
    if (!hooks_.committed_rows || !hooks_.committed_rows(&q.loads_seen, &all)) {
      n_verify_pending_.store(0, std::memory_order_relaxed);
      return false;
    }
    std::map<DeviceType, Verdicts> cached;
    for (VerifyRow& r : all) {
      const DeviceType b = r.problem.device.type;
      if (!cached.count(b)) {
        const std::string identity = verdict_identity(b);
        cached[b] = !cache_dir_.empty() && !identity.empty()
                        ? load_verdicts(verdict_path(cache_dir_, b, identity), identity)
                        : Verdicts{};
        if (hooks_.memory_verdicts)  // this process's, where it records none in the cache dir
          for (auto& [id, v] : hooks_.memory_verdicts->of(b).rows) cached[b].rows[id] = v;
      }
      const auto done = q.done.find(key_of_row(r));
      if (done != q.done.end() && done->second >= 2) continue;
      const Verdict* v = cached[b].find(r.id(), r.config_text);
      if (v && v->losses != 1) continue;        // verified here already (ahead, within the margin, or demoted)
      if (v && done != q.done.end()) continue;  // lost once, verified again by this thread already
      q.rows.push_back(std::move(r));
    }
    n_verify_pending_.store(static_cast<int64_t>(q.rows.size()), std::memory_order_relaxed);
    if (q.rows.empty()) return false;
  }
  VerifyRow row = std::move(q.rows.front());
  q.rows.erase(q.rows.begin());
  const DeviceInfo* dev = core::local_device_info(row.problem.device.type);
  if (!dev) {
    n_verify_pending_.store(static_cast<int64_t>(q.rows.size()), std::memory_order_relaxed);
    return true;
  }
  prepare(row.problem.device.type);
  wait_for_captures();
  if (stop_.load(std::memory_order_acquire)) return false;
  // Never beside a caller's sync search (KDISPATCH_TUNE=sync): two timings
  // on the same cores or GPU would pollute both. The row waits for the
  // next idle turn; a sync search meanwhile sees "another sync search is
  // running" and serves its call as a miss (it tunes on a later call).
  std::unique_lock<std::mutex> timing(sync_mu_, std::try_to_lock);
  if (!timing.owns_lock()) {
    q.rows.insert(q.rows.begin(), std::move(row));
    return false;
  }
  const auto t0 = SteadyClock::now();
  auto r = verify_row(row, *dev, /*background=*/true);
  timing.unlock();
  int& n = q.done[key_of_row(row)];
  ++n;
  if (r.ok()) {
    n_verified_.fetch_add(1, std::memory_order_relaxed);
    const bool demoted_now = r->outcome == Outcome::lost && r->verdict.losses == kDemoteAfterLosses;
    if (demoted_now) n_demoted_.fetch_add(1, std::memory_order_relaxed);
    // Lost once: verified a second time after the rest of the pass (one
    // slow moment of the machine never demotes a row on its own).
    if (r->verdict.losses == 1 && n < 2) q.rows.push_back(row);
    if (hooks_.verdicts_changed) hooks_.verdicts_changed();
    if (options_.log_level >= LogLevel::info || (demoted_now && options_.log_level >= LogLevel::warn))
      std::fprintf(stderr,
                   "kdispatch: verified the committed row %s (%s) against the floor: row/floor %.3f, A/A spread "
                   "%.1f%%, margin %.1f%%: %s%s\n",
                   row.id().c_str(), row.source.c_str(), r->mean_ratio, 100.0 * r->search.aa_spread,
                   100.0 * options_.tune.margin, r->verdict.state().c_str(),
                   demoted_now ? " (lost twice: the floor serves it from now on)" : "");
  } else if (r.status().code() != StatusCode::failed_precondition && options_.log_level >= LogLevel::warn) {
    std::fprintf(stderr, "kdispatch: could not verify the committed row %s (%s): %s\n", row.id().c_str(),
                 row.source.c_str(), r.status().to_string().c_str());
  }
  n_verify_pending_.store(static_cast<int64_t>(q.rows.size()), std::memory_order_relaxed);
  // Low priority: the duty cycle's share of idle time after the work, cut
  // short by a miss to tune or a stop request.
  const double d = options_.tune.duty_cycle;
  if (d > 0 && d < 1) {
    const double busy = std::chrono::duration<double>(SteadyClock::now() - t0).count();
    const auto until = SteadyClock::now() + std::chrono::duration<double>(busy * (1.0 - d) / d);
    while (SteadyClock::now() < until && !stop_.load(std::memory_order_acquire) && queue_.empty())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void Tuner::background_loop() {
  // A shape reaches the tuner by the queue (notified at miss counts 1, 2, 4,
  // ...) or, when the queue is drained, by a sweep of the miss table for
  // shapes still unsettled: a notification dropped on a full queue, or a
  // search that failed (retried kMaxAttempts times with backoff), never
  // leaves a missed shape untuned for good.
  constexpr int kMaxAttempts = 3;
  struct Pending {
    MissEvent ev;
    int64_t count = 0;
    SteadyClock::time_point not_before{};
    int claim_waits = 0;
    int attempts = 0;
  };
  std::map<std::pair<std::string, int64_t>, Pending> pending;
  // sweep=true: only shapes the table does not cover yet (else settled).
  auto enqueue = [&](const MissEvent& ev, int64_t count, bool sweep) {
    const DeviceInfo* dev = core::local_device_info(ev.problem.device.type);
    if (!dev) return;
    const std::string key = key_of(ev.problem, *dev);
    if (sweep && hooks_.covered(key, ev.problem.m)) {
      misses_.settle(ev.key_hash, ev.problem.m);
      return;
    }
    auto [it, fresh] = pending.try_emplace({key, ev.problem.m});
    if (fresh) it->second.ev = ev;
    it->second.count = std::max(it->second.count, count);
  };
  auto settle = [&](const Pending& item) { misses_.settle(item.ev.key_hash, item.ev.problem.m); };
  // Before this thread's first GPU call (never for CPU-only use: that
  // would create a GPU context): relaxed capture mode.
  std::vector<const backends::Backend*> prepared;
  auto prepare_gpu = [&](DeviceType t) {
    const backends::Backend* b = backends::find(t);
    if (b == nullptr || b->is_host() || std::find(prepared.begin(), prepared.end(), b) != prepared.end()) return;
    prepared.push_back(b);
    b->prepare_tuner_thread();
  };
  while (!stop_.load(std::memory_order_acquire)) {
    busy_.store(true, std::memory_order_release);
    MissEvent ev;
    while (queue_.pop(&ev)) {
      if (frozen()) continue;  // frozen: the queue is ignored
      enqueue(ev, ev.count, false);
    }
    if (frozen()) pending.clear();
    auto now = SteadyClock::now();
    const auto ready = [&] {
      auto best = pending.end();
      for (auto it = pending.begin(); it != pending.end(); ++it)
        if (it->second.not_before <= now && (best == pending.end() || it->second.count > best->second.count)) best = it;
      return best;
    };
    auto best = ready();
    if (best == pending.end() && !frozen() && mode_ == TuneMode::background) {
      // Nothing ready: sweep the miss table for shapes the queue lost.
      misses_.for_each_unsettled([&](size_t, const MissEvent& e, int64_t count) { enqueue(e, count, true); });
      now = SteadyClock::now();
      best = ready();
    }
    n_pending_.store(static_cast<int64_t>(pending.size()), std::memory_order_relaxed);
    if (best == pending.end()) {
      // Idle: the next committed row to verify (TuneOptions::verify_shipped).
      if (options_.tune.verify_shipped && pending.empty() && !frozen() && queue_.empty()) {
        if (verify_next_shipped(prepare_gpu)) continue;
      }
      busy_.store(false, std::memory_order_release);
      std::this_thread::sleep_for(std::chrono::milliseconds(pending.empty() ? 5 : 20));
      continue;
    }
    const std::string key = best->first.first;
    Pending item = best->second;
    pending.erase(best);
    n_pending_.store(static_cast<int64_t>(pending.size()), std::memory_order_relaxed);
    const core::Problem& p = item.ev.problem;
    const DeviceInfo* dev = core::local_device_info(p.device.type);
    if (!dev) continue;
    if (hooks_.covered(key, p.m)) {
      settle(item);
      continue;
    }
    if (scratch_bytes(item.ev) > options_.tune.memory_budget_bytes) {
      n_skipped_.fetch_add(1, std::memory_order_relaxed);
      settle(item);
      continue;
    }
    const bool claim = options_.tune.claim_shapes && options_.tune.persist && !cache_dir_.empty();
    if (claim && !store::try_claim(cache_dir_, key, p.m)) {
      // Another process is tuning it: pick its result up from the cache.
      if (item.claim_waits++ < 30) {
        item.not_before = SteadyClock::now() + std::chrono::seconds(2);
        hooks_.reload();
        if (!hooks_.covered(key, p.m))
          pending[{key, p.m}] = item;
        else
          settle(item);
      } else {
        n_skipped_.fetch_add(1, std::memory_order_relaxed);
        settle(item);
      }
      continue;
    }
    prepare_gpu(p.device.type);
    wait_for_captures();
    if (stop_.load(std::memory_order_acquire)) break;
    auto r = tune_on_scratch(item.ev, *dev, key, /*background=*/true);
    if (claim) store::release_claim(cache_dir_, key, p.m);
    if (r.ok()) {
      settle(item);
      continue;
    }
    if (r.status().code() == StatusCode::failed_precondition) continue;  // stopping or frozen
    if (++item.attempts < kMaxAttempts) {
      // Retry later: a search can fail for passing reasons (a busy machine
      // running out of its time budget, a transient allocation failure).
      item.not_before = SteadyClock::now() + std::chrono::milliseconds(200 << (2 * (item.attempts - 1)));
      pending[{key, p.m}] = item;
      continue;
    }
    n_skipped_.fetch_add(1, std::memory_order_relaxed);
    settle(item);
    if (options_.log_level >= LogLevel::warn)
      std::fprintf(stderr, "kdispatch: background tuning of %s M=%lld failed %d times, giving up: %s\n", key.c_str(),
                   static_cast<long long>(p.m), kMaxAttempts, r.status().to_string().c_str());
  }
  busy_.store(false, std::memory_order_release);
}

TuneStats Tuner::stats() const noexcept {
  TuneStats s;
  s.misses = n_misses_.load(std::memory_order_relaxed);
  s.queued = n_queued_.load(std::memory_order_relaxed);
  s.dropped = n_dropped_.load(std::memory_order_relaxed);
  s.shapes_tuned = n_tuned_.load(std::memory_order_relaxed);
  s.shapes_skipped = n_skipped_.load(std::memory_order_relaxed);
  s.candidates_run = n_run_.load(std::memory_order_relaxed);
  s.candidates_rejected = n_rejected_.load(std::memory_order_relaxed);
  s.candidates_failed = n_failed_.load(std::memory_order_relaxed);
  s.publishes = n_publishes_.load(std::memory_order_relaxed);
  s.pending = n_pending_.load(std::memory_order_relaxed);
  s.tune_seconds = static_cast<double>(tune_us_.load(std::memory_order_relaxed)) * 1e-6;
  s.frozen = frozen();
  s.deferred = n_deferred_.load(std::memory_order_relaxed);
  s.capture_waits = n_capture_waits_.load(std::memory_order_relaxed);
  s.rows_verified = n_verified_.load(std::memory_order_relaxed);
  s.rows_demoted = n_demoted_.load(std::memory_order_relaxed);
  s.rows_to_verify = n_verify_pending_.load(std::memory_order_relaxed);
  return s;
}

bool Tuner::wait_idle(double timeout_s) noexcept {
  if (!thread_.joinable()) return true;  // no tuner thread: always idle
  const auto until = SteadyClock::now() + std::chrono::duration<double>(timeout_s);
  int quiet = 0;
  for (;;) {  // the state is looked at once at least: a timeout of 0 answers "idle now?"
    const bool idle = queue_.empty() && !busy_.load(std::memory_order_acquire) &&
                      n_pending_.load(std::memory_order_relaxed) == 0 &&
                      n_verify_pending_.load(std::memory_order_relaxed) == 0;
    quiet = idle ? quiet + 1 : 0;
    if (quiet >= 3) return true;
    if (SteadyClock::now() >= until) return idle;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace dispatch::tune
