// SPDX-License-Identifier: Apache-2.0
// Verification of committed rows on this machine (tune/verify.hpp,
// docs/tuning.md#verifying-shipped-rows): which rows (committed_rows), the
// verdict cache applied to the table when it is built (apply_verdicts_locked:
// a demoted row's M holds the floor; the notes lookup shows), and
// dispatch::verify_rows. Nothing here runs on the op path: the op path
// reads the table these build.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <simdjson.h>
#include <unordered_map>

#include "api/runtime_impl.hpp"
#include "backends/backend.hpp"
#include "backends/registry.hpp"
#include "backends/cpu/cpu_identity.hpp"
#include "dispatch/ops.hpp"
#include "store/filename.hpp"
#include "table/key.hpp"
#include "tune/tuner.hpp"
#include "tune/verify.hpp"

namespace dispatch {
namespace {

// "cpu/rmsnorm|CPU_x86_64_AVX512|dtype=fp32,hidden=64": backend, op and fields.
struct KeyParts {
  DeviceType backend{};
  core::OpKind op{};
  std::string fields;
};
bool split_key(const std::string& key, KeyParts* out) {
  const size_t slash = key.find('/'), a = key.find('|');
  if (slash == std::string::npos || a == std::string::npos || slash > a) return false;
  const size_t b = key.find('|', a + 1);
  if (b == std::string::npos) return false;
  auto backend = parse_device_type(std::string_view(key).substr(0, slash));
  const auto op = core::parse_op(key.substr(slash + 1, a - slash - 1));
  if (!backend.ok() || !op) return false;
  out->backend = *backend;
  out->op = *op;
  out->fields = key.substr(b + 1);
  return true;
}

// The problem of an own-op key at M on device 0 of its backend.
bool problem_of(const KeyParts& k, int64_t m, core::Problem* p) {
  auto fields = store::parse_key_fields(k.fields);
  if (!fields.ok()) return false;
  auto prob = store::own_problem_from_fields(k.op, *fields);
  if (!prob.ok()) return false;
  *p = *prob;
  p->m = m;
  p->device = Device{k.backend, 0};
  return true;
}

// The CPU a row's file records ("" = none): its identity, and whether it
// is of another vendor or family than this host's (an unrecorded one counts
// as such: nothing ties its claim to this machine).
CpuIdentity cpu_of(const std::string& json) {
  CpuIdentity id;
  if (json.empty()) return id;
  simdjson::dom::parser p;
  simdjson::dom::element e;
  if (p.parse(json).get(e) != simdjson::SUCCESS) return id;
  std::string_view s;
  int64_t i = 0;
  if (e["vendor"].get(s) == simdjson::SUCCESS) id.vendor = std::string(s);
  if (e["family"].get(i) == simdjson::SUCCESS) id.family = i;
  if (e["model"].get(i) == simdjson::SUCCESS) id.model = i;
  if (e["name"].get(s) == simdjson::SUCCESS) id.name = std::string(s);
  return id;
}

// One committed row that serves: its input and row.
struct Serving {
  const table::TableInput* in = nullptr;
  size_t input_index = 0;  // in table.loaded_inputs
  size_t row = 0;
  KeyParts key;
  const DeviceInfo* dev = nullptr;
};

// The committed rows of own ops on this machine's devices that serve: per
// (key, M) the row of the lowest source rank among every input (the tuning
// cache and in-process rows included: a row they outrank does not serve,
// and is not theirs to verify); the first input at that rank on a tie.
// Caller holds table.mu.
std::vector<Serving> serving_committed(const Runtime::Impl& impl) {
  struct Best {
    int32_t rank = INT32_MAX;
    bool committed = false;
    Serving s;
  };
  std::map<std::pair<std::string, int64_t>, Best> best;
  auto consider = [&](const table::TableInput& in, size_t index, bool committed) {
    if (!in.has_own_key) return;
    for (size_t j = 0; j < in.rows.size(); ++j) {
      Best& b = best[{in.key, in.rows[j].m}];
      if (in.source_rank >= b.rank) continue;
      b.rank = in.source_rank;
      b.committed = committed && in.plan(in.rows[j]) != nullptr;
      b.s = Serving{&in, index, j, {}, nullptr};
    }
  };
  const auto& loaded = impl.table.loaded_inputs;
  for (size_t i = 0; i < loaded.size(); ++i)
    consider(*loaded[i], i, loaded[i]->source_rank != impl.cache_rank || impl.cache_dir.empty());
  for (const table::TableInput& in : impl.table.tuned_inputs) consider(in, SIZE_MAX, false);
  std::vector<Serving> out;
  std::map<DeviceType, const DeviceInfo*> devs;
  for (auto& [km, b] : best) {
    if (!b.committed) continue;
    Serving s = b.s;
    if (!split_key(s.in->key, &s.key)) continue;
    auto [it, fresh] = devs.try_emplace(s.key.backend, nullptr);
    if (fresh) it->second = core::local_device_info(s.key.backend);
    s.dev = it->second;
    if (!s.dev || s.dev->device_name != s.in->device_name) continue;  // another device's row
    out.push_back(s);
  }
  return out;
}

// The verdicts of `backend`: the cache dir's file, with this process's
// in-memory ones (recorded where the cache dir is none, or not written:
// TuneOptions::persist off) over it. *path: the file, or "" when none is read.
tune::Verdicts verdicts_of(const Runtime::Impl& impl, DeviceType backend, std::string* path) {
  const std::string identity = tune::verdict_identity(backend);
  tune::Verdicts out;
  path->clear();
  if (!impl.cache_dir.empty() && !identity.empty()) {
    *path = tune::verdict_path(impl.cache_dir, backend, identity);
    out = tune::load_verdicts(*path, identity);
  }
  if (impl.memory_verdicts)
    for (auto& [id, v] : impl.memory_verdicts->of(backend).rows) out.rows[id] = v;
  return out;
}

// What lookup says of a CPU row tuned elsewhere.
std::string foreign_note(const CpuIdentity& tuned_on, const tune::Verdict* v) {
  const std::string where =
      tuned_on.known() ? "tuned on " + tuned_on.describe() : "tuned on a CPU its file does not record";
  return where + (v ? "; verified here: " + v->state() : "; not yet verified here");
}

}  // namespace

void Runtime::Impl::apply_verdicts_locked() {
  table.base_inputs = table.loaded_inputs;
  const DeviceInfo& cpu = cpu_device_info();
  std::unordered_map<uint32_t, std::shared_ptr<const table::TableInput>> cpu_inputs;
  // Own-op inputs by key (every source: a row of the tuning cache or tuned
  // in this process may outrank a committed one); per input, not per row.
  std::unordered_map<std::string_view, std::vector<std::pair<const table::TableInput*, size_t>>> by_key;
  for (size_t i = 0; i < table.loaded_inputs.size(); ++i) {
    const auto& in = table.loaded_inputs[i];
    if (!in->has_own_key) continue;
    by_key[in->key].emplace_back(in.get(), i);
    if (in->source_rank != cache_rank && in->device_name == cpu.device_name && in->key.compare(0, 4, "cpu/") == 0)
      cpu_inputs.emplace(in->source_id, in);
  }
  for (const table::TableInput& in : table.tuned_inputs)
    if (in.has_own_key) by_key[in.key].emplace_back(&in, SIZE_MAX);
  // The demoted verdicts of each backend with a local device: the row they
  // name demoted where it serves, is committed and still holds their config.
  std::map<size_t, std::vector<std::pair<size_t, core::Plan>>> demote;  // input -> (row, floor plan)
  std::map<std::pair<std::string, int64_t>, std::pair<uint32_t, std::string>> notes;
  std::shared_ptr<const tune::Verdicts> cpu_verdicts;
  for (const backends::Backend* backend : backends::compiled()) {
    const DeviceType b = backend->type();
    const DeviceInfo* dev = backend->device_info(0);
    if (!dev) continue;
    std::string path;
    auto verdicts = std::make_shared<const tune::Verdicts>(verdicts_of(*this, b, &path));
    const tune::Verdicts in_memory = memory_verdicts ? memory_verdicts->of(b) : tune::Verdicts{};
    if (backend->is_host()) cpu_verdicts = verdicts;
    for (const auto& [id, v] : verdicts->rows) {
      if (!v.demoted()) continue;
      const size_t at = id.rfind(" M=");
      if (at == std::string::npos) continue;
      const std::string key = id.substr(0, at);
      const int64_t m = std::atoll(id.c_str() + at + 3);
      const auto inputs = by_key.find(key);
      if (inputs == by_key.end()) continue;
      const table::TableInput* best = nullptr;  // the input whose row at m serves: the lowest rank, the first
      size_t best_index = 0, best_row = 0;
      for (const auto& [in, index] : inputs->second)
        for (size_t j = 0; j < in->rows.size(); ++j)
          if (in->rows[j].m == m && (!best || in->source_rank < best->source_rank)) {
            best = in, best_index = index, best_row = j;
            break;
          }
      if (!best || best_index == SIZE_MAX || best->source_rank == cache_rank || best->device_name != dev->device_name)
        continue;  // not a committed row of this machine's device that serves
      const table::TableInput::InputRow& row = best->rows[best_row];
      const core::Plan* plan = best->plan(row);
      KeyParts parts;
      core::Problem p;
      if (!plan || config_to_json(best->config(row)) != v.config || !split_key(key, &parts) ||
          !problem_of(parts, m, &p))
        continue;
      const core::Plan floor = core::floor_plan(p, *dev);
      if (!floor.valid() || floor == *plan) continue;
      demote[best_index].emplace_back(best_row, floor);
      notes[{key, m}] = {best->source_id,
                         "demoted on this machine: " + core::plan_to_string(*plan) +
                             " lost to the floor by more than the margin in " + std::to_string(v.losses) +
                             " verifications (" +
                             (path.empty() || in_memory.rows.count(id) ? std::string("in memory") : path) +
                             "); the floor's plan at M=" + std::to_string(m) +
                             " serves (at the "
                             "Ms nearest it too, as the row did): " +
                             core::plan_to_string(floor)};
    }
  }
  // One copy of each input with a demoted row (the others stay shared): the
  // row's M holds the floor's plan at that M. On CUDA that is cuBLAS /
  // cuBLASLt's own per-call pick (no params), so the Ms nearest it get what
  // the engine runs; on the CPU the floor (get_default's plan) depends on M
  // and the nearest Ms get the plan of the row's M, as they got the row.
  for (auto& [index, rows] : demote) {
    table::TableInput copy = *table.loaded_inputs[index];
    for (auto& [r, floor] : rows) {
      copy.configs.push_back(core::plan_to_config(floor));
      copy.plans.push_back(floor);
      copy.rows[r].config = static_cast<uint32_t>(copy.configs.size() - 1);
      copy.rows[r].plan = static_cast<uint32_t>(copy.plans.size() - 1);
    }
    copy.serial = table::next_serial();
    table.base_inputs[index] = std::make_shared<const table::TableInput>(std::move(copy));
  }
  std::lock_guard<std::mutex> lock(row_notes.mu);
  row_notes.cpu_inputs = std::move(cpu_inputs);
  row_notes.cpu_verdicts = std::move(cpu_verdicts);
  row_notes.demoted = std::move(notes);
}

std::string Runtime::Impl::row_note(const std::string& key, int64_t m, uint32_t source_id, const Config& config) const {
  std::shared_ptr<const table::TableInput> in;
  std::shared_ptr<const tune::Verdicts> verdicts;
  {
    std::lock_guard<std::mutex> lock(row_notes.mu);
    if (auto it = row_notes.demoted.find({key, m}); it != row_notes.demoted.end() && it->second.first == source_id)
      return it->second.second;
    const auto it = row_notes.cpu_inputs.find(source_id);
    if (it == row_notes.cpu_inputs.end() || it->second->key != key) return {};
    in = it->second;
    verdicts = row_notes.cpu_verdicts;
  }
  const CpuIdentity tuned_on = cpu_of(in->tuned_on_at(m));
  if (tuned_on.known() && tuned_on.same_family(host_cpu_identity())) return {};
  // A row that records the floor itself (get_default's plan on the CPU) is
  // what this machine runs without the row: nothing to verify, no note.
  KeyParts parts;
  core::Problem p;
  if (split_key(key, &parts) && problem_of(parts, m, &p)) {
    auto plan = core::plan_from_config(config, p.op, parts.backend);
    if (plan.ok() && *plan == core::floor_plan(p, cpu_device_info())) return {};
  }
  const tune::Verdict* v = verdicts ? verdicts->find(tune::row_id(key, m), config_to_json(config)) : nullptr;
  return foreign_note(tuned_on, v);
}

bool Runtime::Impl::publish_verdicts() {
  std::lock_guard<std::mutex> lock(table.mu);
  if (frozen.load(std::memory_order_acquire)) return false;
  apply_verdicts_locked();
  rebuild_locked(nullptr);
  return true;
}

std::vector<tune::VerifyRow> Runtime::Impl::committed_rows(std::string_view op, int64_t* floor_rows) const {
  std::vector<tune::VerifyRow> out;
  int64_t floors = 0;
  const CpuIdentity& host = host_cpu_identity();
  {
    std::lock_guard<std::mutex> lock(table.mu);
    for (const Serving& s : serving_committed(*this)) {
      if (!op.empty() && core::op_name(s.key.op) != op) continue;
      const table::TableInput& in = *s.in;
      const table::TableInput::InputRow& row = in.rows[s.row];
      tune::VerifyRow v;
      if (!problem_of(s.key, row.m, &v.problem)) continue;
      v.key = in.key;
      v.plan = *in.plan(row);
      if (core::floor_plan(v.problem, *s.dev) == v.plan) {  // the row records the floor itself
        ++floors;
        continue;
      }
      v.config = in.config(row);
      v.config_text = config_to_json(v.config);
      v.source = in.path;
      v.source_dir = sources.get(in.source_id).first;
      if (core::is_host(s.key.backend)) {
        const CpuIdentity tuned_on = cpu_of(in.tuned_on_at(row.m));
        v.tuned_on = tuned_on.known() ? tuned_on.describe() : "";
        v.foreign = !tuned_on.known() || !tuned_on.same_family(host);
      }
      out.push_back(std::move(v));
    }
  }
  // Rows tuned on another CPU (or an unrecorded one) first: they are the
  // likeliest not to hold here.
  std::stable_partition(out.begin(), out.end(), [](const tune::VerifyRow& r) { return r.foreign; });
  if (floor_rows) *floor_rows = floors;
  return out;
}

bool Runtime::Impl::committed_rows_since(uint64_t* seen, std::vector<tune::VerifyRow>* out) const {
  const uint64_t now = loads.load(std::memory_order_acquire);
  if (now == *seen) return false;
  *seen = now;
  *out = committed_rows({});
  return true;
}

Result<VerifyReport> verify_rows(Runtime& rt, std::string_view op,
                                 const std::function<void(const RowVerification&)>& on_row) noexcept {
  try {
    Runtime::Impl& impl = rt.impl();
    if (impl.forked_child()) return impl.refuse_in_child("verify_rows");
    if (!op.empty() && !core::parse_op(op))
      return make_status(StatusCode::invalid_argument, "unknown op '" + std::string(op) + "'");
    VerifyReport report;
    const std::vector<tune::VerifyRow> rows = impl.committed_rows(op, &report.floor_rows);
    bool changed = false;
    for (const tune::VerifyRow& row : rows) {
      RowVerification rv;
      rv.op = std::string(core::op_name(row.problem.op));
      rv.key = row.key;
      rv.m = row.problem.m;
      rv.config = row.config;
      rv.variant = std::string(row.plan.variant->name);
      rv.source = row.source;
      rv.source_dir = row.source_dir;
      rv.required_margin = impl.options.tune.margin;
      rv.tuned_on = row.tuned_on;
      rv.foreign = row.foreign;
      const DeviceInfo* dev = core::local_device_info(row.problem.device.type);
      auto r = dev ? impl.tuner->verify_row(row, *dev, false)
                   : Result<tune::VerifyOutcome>(make_status(StatusCode::unsupported_device, "no local device"));
      if (!r.ok()) {
        rv.status = r.status();
      } else {
        const tune::SearchResult& sr = r->search;
        rv.row_us = sr.challenger_us;
        rv.floor_us = sr.confirmed ? sr.default_us : 0.0;
        rv.margin = r->mean_ratio > 0 ? 1.0 - r->mean_ratio : 0.0;
        rv.aa_spread = sr.aa_spread;
        rv.ratios = sr.confirm_ratios;
        rv.graph_ratios = sr.graph_ratios;
        rv.timing = sr.timing;
        rv.outcome = tune::outcome_name(r->outcome);
        rv.verdict = r->verdict.state();
        rv.losses = r->verdict.losses;
        rv.recorded_in = r->recorded_in;
        if (r->outcome == tune::Outcome::lost && r->verdict.losses == tune::kDemoteAfterLosses) ++report.demoted;
        changed = true;
        if (!sr.confirmed && sr.tried.size() >= 2 && !sr.tried[1].status.ok())
          rv.outcome = "lost (the row fails here: " + sr.tried[1].status.message() + ")";
      }
      if (on_row) on_row(rv);
      report.rows.push_back(std::move(rv));
    }
    if (changed) (void)impl.publish_verdicts();  // a demotion (or a win) changes what serves; notes change
    return report;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "verify_rows");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("verify_rows: ") + e.what());
  }
}

}  // namespace dispatch
