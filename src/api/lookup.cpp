// SPDX-License-Identifier: Apache-2.0
// dispatch::lookup — kdispatch as a config service, for its own ops and for
// kernels the engine owns (Triton fused-MoE, block-fp8 GEMM), from the same
// table the ops read.
#include <charconv>
#include <tuple>
#include <set>
#include <string>

#include "api/engine_rows.hpp"
#include "api/json_out.hpp"
#include "api/runtime_impl.hpp"
#include "core/op_spec.hpp"
#include "core/json_write.hpp"
#include "backends/registry.hpp"
#include "dispatch/ops.hpp"
#include "store/filename.hpp"
#include "store/loader.hpp"
#include "table/epoch.hpp"
#include "table/key.hpp"

namespace dispatch {
namespace {

bool field_int(const store::Fields& f, std::string_view name, int64_t* v) {
  const std::string* s = store::find_field(f, name);
  if (!s) return false;
  auto r = std::from_chars(s->data(), s->data() + s->size(), *v);
  return r.ec == std::errc() && r.ptr == s->data() + s->size();
}

// "[128,128]" -> {128, 128}
bool block_shape(const store::Fields& f, int64_t* bn, int64_t* bk) {
  const std::string* s = store::find_field(f, "block_shape");
  if (!s || s->size() < 5 || s->front() != '[' || s->back() != ']') return false;
  const auto comma = s->find(',');
  if (comma == std::string::npos) return false;
  auto r1 = std::from_chars(s->data() + 1, s->data() + comma, *bn);
  auto r2 = std::from_chars(s->data() + comma + 1, s->data() + s->size() - 1, *bk);
  return r1.ec == std::errc() && r2.ec == std::errc();
}

void put(Config* c, const char* k, int64_t v) { c->emplace_back(k, ConfigValue::integer(v)); }

// SGLang's get_default_config for its Triton fused-MoE kernel
// (python/sglang/srt/layers/moe/fused_moe_triton/fused_moe_triton_config.py),
// reproduced so an engine using kdispatch as its config service gets the
// same answer on a miss. `hip` selects the ROCm num_stages.
Config fused_moe_default(const store::Fields& f, int64_t M, bool hip, std::string* why) {
  Config c;
  int64_t E = 0;
  field_int(f, "E", &E);
  const std::string* dtype = store::find_field(f, "dtype");
  int64_t bn = 0, bk = 0;
  const bool block = block_shape(f, &bn, &bk) && bn > 0 && bk > 0;
  if (dtype && *dtype == "fp8_w8a8") {
    if (!block) {
      if (M <= E) {
        put(&c, "BLOCK_SIZE_M", 64), put(&c, "BLOCK_SIZE_N", 128), put(&c, "BLOCK_SIZE_K", 128);
        put(&c, "GROUP_SIZE_M", 1), put(&c, "num_warps", 4), put(&c, "num_stages", hip ? 2 : 4);
      } else {
        put(&c, "BLOCK_SIZE_M", 128), put(&c, "BLOCK_SIZE_N", 256), put(&c, "BLOCK_SIZE_K", 128);
        put(&c, "GROUP_SIZE_M", 32), put(&c, "num_warps", 8), put(&c, "num_stages", hip ? 2 : 4);
      }
    } else {
      put(&c, "BLOCK_SIZE_M", 64), put(&c, "BLOCK_SIZE_N", bn), put(&c, "BLOCK_SIZE_K", bk);
      put(&c, "GROUP_SIZE_M", 32), put(&c, "num_warps", 4), put(&c, "num_stages", hip ? 2 : 3);
    }
  } else if (M <= E) {
    put(&c, "BLOCK_SIZE_M", 16), put(&c, "BLOCK_SIZE_N", 32), put(&c, "BLOCK_SIZE_K", 64), put(&c, "GROUP_SIZE_M", 1);
  } else {
    put(&c, "BLOCK_SIZE_M", 64), put(&c, "BLOCK_SIZE_N", 64), put(&c, "BLOCK_SIZE_K", 32), put(&c, "GROUP_SIZE_M", 8);
  }
  // (SGLang at d55f1c28 gives fp8 without a block shape a smaller tile on a
  // CUDA GPU with < 128 KiB of shared memory per block, L40S / RTX 4090 class;
  // this rule is the >= 128 KiB one: kdispatch.sglang.get_default_config has both.)
  *why += (dtype && *dtype == "fp8_w8a8" && !block && !hip)
              ? "no table row: SGLang's fused-MoE get_default_config rule for a GPU with >= 128 KiB of shared "
                "memory per block (below that, L40S / RTX 4090 class, SGLang uses a smaller fp8 tile: "
                "kdispatch.sglang.get_default_config)"
              : "no table row: SGLang's fused-MoE get_default_config rule";
  return c;
}

// SGLang's default for its block-quantised Triton GEMM (w8a8_block_fp8_matmul).
bool triton_gemm_default(const store::Fields& f, Config* c, std::string* why) {
  int64_t bn = 0, bk = 0;
  if (!block_shape(f, &bn, &bk) || bn <= 0 || bk <= 0) return false;
  put(c, "BLOCK_SIZE_M", 64), put(c, "BLOCK_SIZE_N", bn), put(c, "BLOCK_SIZE_K", bk);
  put(c, "GROUP_SIZE_M", 32), put(c, "num_warps", 4), put(c, "num_stages", 3);
  *why += "no table row: SGLang's block-GEMM default (BLOCK_SIZE_N/K = block_shape)";
  return true;
}

}  // namespace

const char* match_name(LookupResult::Match m) noexcept {
  switch (m) {
    case LookupResult::Match::exact: return "exact";
    case LookupResult::Match::nearest: return "nearest";
    case LookupResult::Match::fallback: return "default";
    case LookupResult::Match::forced: return "forced";
  }
  return "?";
}

namespace {

// The table kinds a key's fields could be, in order: the engines' tables
// (E= a fused MoE; N and K a block-fp8 GEMM), then every own op whose dim
// fields the key has (the op list's key fields).
std::vector<std::string> ops_fitting(const store::Fields& fields) {
  std::vector<std::string> fits;
  if (store::find_field(fields, "E")) return {std::string(store::kTritonFusedMoe)};
  if (store::find_field(fields, "N") && store::find_field(fields, "K")) fits.push_back(std::string(store::kTritonGemm));
  for (const core::OpSpec* s : core::all_specs()) {
    bool all = false, any_dim = false;
    for (const core::KeyField& f : s->fields)
      if (f.kind == core::FieldKind::dim) {
        all = (any_dim ? all : true) && store::find_field(fields, f.name) != nullptr;
        any_dim = true;
      }
    if (any_dim && all) fits.push_back(std::string(s->name));
  }
  return fits;
}

// The key of op `o` for `fields` on the device named `device_name`.
std::string key_for(const std::string& o, const store::Fields& fields, const std::string& device_name,
                    DeviceType backend, bool down) {
  if (const auto own_op = core::parse_op(o)) {
    auto p = store::own_problem_from_fields(*own_op, fields);
    if (!p.ok()) return "";
    p->device = Device{backend, 0};
    table::KeyBuffer kb;
    table::build_own_key(*p, device_type_name(backend), device_name, &kb);
    return std::string(kb.view());
  }
  return table::make_key(table::kForeignBackend, o, device_name, store::join_fields(fields), down);
}

// The op of a query that names none: the key's fields decide first; the
// table's contents break the remaining ties.
Result<std::string> infer_op(const Runtime::Impl& impl, const LookupQuery& q, const store::Fields& fields,
                             const DeviceNameResolution& dev) {
  table::EpochDomain::Guard guard(table::EpochDomain::global());
  const table::Snapshot* snap = impl.table.current.load(std::memory_order_seq_cst);
  std::set<std::string> names;
  for (const auto& prefix : snap->ops()) names.insert(prefix.substr(prefix.find('/') + 1));
  const std::vector<std::string> fits = ops_fitting(fields);
  std::vector<std::string> present;
  for (const auto& f : fits)
    if (names.count(f)) present.push_back(f);
  if (present.size() > 1) {
    // Several ops of that shape in the table (an engine's triton_gemm files
    // beside kdispatch's own gemm configs): the ones that hold this very
    // key for this device decide.
    const DeviceType b = core::backend_of_device_name(dev.canonical);
    std::vector<std::string> holding;
    for (const auto& o : present)
      for (const auto& name : dev.candidates) {
        const std::string key = key_for(o, fields, name, b, q.down);
        if (!key.empty() && snap->find(key, table::key_hash(key))) {
          holding.push_back(o);
          break;
        }
      }
    if (!holding.empty()) present = std::move(holding);
  }
  if (present.size() == 1) return present.front();
  if (fits.size() == 1) return fits.front();
  if (present.empty() && !fits.empty() && fits.front() == store::kTritonGemm) return std::string(store::kTritonGemm);
  return make_status(StatusCode::invalid_argument,
                     "cannot infer the op from key '" + q.key + "'" +
                         (present.size() > 1 ? " (the table holds several ops it could be)" : "") + ": pass op (--op)");
}

struct Candidate {
  std::string key;
  std::string why;
};

// The keys to try, most specific first (one per device-name candidate; a
// _down query also the up table, as SGLang falls back).
std::vector<Candidate> candidates(const std::string& op, const std::optional<core::OpKind>& own,
                                  const core::Problem& prob, DeviceType backend, const store::Fields& fields,
                                  const DeviceNameResolution& dev, bool down) {
  std::vector<Candidate> cands;
  const std::string joined = store::join_fields(fields);
  for (const auto& name : dev.candidates) {
    if (own) {
      table::KeyBuffer kb;
      table::build_own_key(prob, device_type_name(backend), name, &kb);
      cands.push_back({std::string(kb.view()), ""});
    } else if (down) {
      cands.push_back({table::make_key(table::kForeignBackend, op, name, joined, true), ""});
      cands.push_back({table::make_key(table::kForeignBackend, op, name, joined, false),
                       "no _down table for this key: the up table serves, as SGLang does"});
    } else {
      cands.push_back({table::make_key(table::kForeignBackend, op, name, joined, false), ""});
    }
  }
  return cands;
}

// The first candidate the table holds a row for at q.M; false when none.
bool from_table(const Runtime::Impl& impl, const LookupQuery& q, bool own, const std::vector<Candidate>& cands,
                std::string& why, LookupResult& res) {
  table::EpochDomain::Guard guard(table::EpochDomain::global());
  const table::Snapshot* snap = impl.table.current.load(std::memory_order_seq_cst);
  for (const auto& c : cands) {
    const table::Bucket* b = snap->find(c.key, table::key_hash(c.key));
    if (!b) continue;
    size_t idx = 0;
    const table::Row* row = table::Snapshot::nearest(*b, q.M, impl.policy, &idx);
    if (!row) {
      why += "; key " + c.key + " found but M=" + std::to_string(q.M) + " is outside its bounded range [" +
             std::to_string(b->ms.front()) + ", " + std::to_string(b->ms.back()) + "]";
      continue;
    }
    res.key = c.key;
    res.config = snap->config(*row);
    res.table_m = b->ms[idx];
    res.match = res.table_m == q.M ? LookupResult::Match::exact : LookupResult::Match::nearest;
    std::tie(res.source_dir, res.source) = impl.sources.get(row->source_id);
    if (const core::Plan& pl = table::Snapshot::plan(*b, idx); pl.valid())
      res.variant = std::string(pl.variant->name);
    else if (const ConfigValue* v = config_find(res.config, "variant"))
      res.variant = v->s;
    if (!c.why.empty()) why += "; " + c.why;
    why += "; key " + c.key;
    if (!b->note.empty()) why += "; " + b->note;
    why += "; " + std::string(match_name(res.match)) + " M=" + std::to_string(res.table_m) +
           (res.match == LookupResult::Match::nearest
                ? " (nearest to " + std::to_string(q.M) + "; ties go to the smaller key)"
                : "");
    why += "; from " + res.source;
    if (own) res.note = impl.row_note(c.key, res.table_m, row->source_id, res.config);  // demoted, tuned on another CPU
    if (own)  // own-op params the row leaves out: the variant's defaults serve (the load report says so too)
      if (const core::Plan& pl = table::Snapshot::plan(*b, idx); pl.valid())
        if (const std::string d = store::defaulted_params(pl, res.config); !d.empty()) why += "; " + d;
    // Documented defaults for Triton rows that leave a launch field out.
    if (!own && config_find(res.config, "BLOCK_SIZE_M")) {
      if (!config_find(res.config, "num_warps")) {
        res.config.emplace_back("num_warps", ConfigValue::integer(store::kTritonDefaultNumWarps));
        why += "; num_warps not in the row: Triton's default 4";
      }
      if (!config_find(res.config, "num_stages")) {
        res.config.emplace_back("num_stages", ConfigValue::integer(store::kTritonDefaultNumStages));
        why += "; num_stages not in the row: Triton's default 3";
      }
    }
    res.why = why;
    return true;
  }
  return false;
}

// An own op's default shaped by an engine's row (api/engine_rows.hpp), as
// an op call does: the first device-name candidate whose engine table holds
// the call's engine key; the row, the mapping and k_source into res.
core::Plan shape_by_engine(const Runtime::Impl& impl, const core::Problem& prob, const core::Plan& plan,
                           const DeviceInfo& local, const DeviceNameResolution& dev, std::string& why,
                           LookupResult& res) {
  const core::OpSpec& spec = core::spec_of(prob.op);
  if (spec.engine_rows.fields == nullptr) return plan;
  table::EpochDomain::Guard guard(table::EpochDomain::global());
  const table::Snapshot* snap = impl.table.current.load(std::memory_order_seq_cst);
  for (const auto& name : dev.candidates) {
    api::EngineRowHit hit;
    if (!api::find_engine_row(*snap, impl.policy, spec, prob, name, &hit)) continue;
    res.engine_key = hit.bucket->key;
    res.engine_m = hit.bucket->ms[hit.index];
    res.engine_config = snap->config(*hit.row);
    res.engine_source = impl.sources.get(hit.row->source_id).second;
    res.k_source = spec.engine_rows.k_source;
    why += "; the engine's row " + res.engine_key + " M=" + std::to_string(res.engine_m) + " (from " +
           res.engine_source + "; " + res.k_source + ": it serves any K)";
    const core::Plan shaped = api::shape_by_engine_row(spec, plan, res.engine_config, prob, local, &why);
    why += " -> " + core::plan_to_string(shaped);
    return shaped;
  }
  char buf[api::kEngineKeyBytes];
  const std::string_view name = dev.candidates.empty() ? std::string_view() : std::string_view(dev.candidates.front());
  const size_t n = api::engine_key(spec, prob, name, buf, sizeof buf);
  char fields[api::kEngineKeyBytes];
  if (n > 0)
    why += "; no engine row either (" + std::string(buf, n) + ")";
  else if (spec.engine_rows.fields(prob, fields, sizeof fields) == 0)  // the engine has no file for this form
    why +=
        "; no engine file names this problem (fused_moe's fp8 without block_shape: fused_moe_fp8_tensor / "
        "_channel's files)";
  else
    why += "; no engine key: longer than " + std::to_string(api::kEngineKeyBytes) + " bytes with this device name";
  return plan;
}

// No table row: the op's default (get_default for own ops, the engines'
// documented defaults for theirs).
Status from_default(const Runtime::Impl& impl, const std::string& op, const std::optional<core::OpKind>& own,
                    const core::Problem& prob, DeviceType backend, const store::Fields& fields,
                    const DeviceNameResolution& dev, const LookupQuery& q, std::string& why, LookupResult& res) {
  res.match = LookupResult::Match::fallback;
  res.source = "default";
  res.table_m = -1;
  why += "; no table for key " + res.key;
  if (own) {
    const DeviceInfo* local = core::local_device_info(backend);
    if (!local)
      return make_status(StatusCode::not_found, "no table row for " + res.key + ", and no " +
                                                    std::string(device_type_name(backend)) +
                                                    " backend in this build to compute a default");
    core::Plan plan = core::get_default(prob, *local);
    if (!plan.valid())
      return make_status(StatusCode::not_found, "no table row for " + res.key + " and no variant computes it");
    why += "; get_default -> " + core::plan_to_string(plan);
    if (local->device_name != dev.canonical) why += " (heuristic evaluated for the local " + local->device_name + ")";
    plan = shape_by_engine(impl, prob, plan, *local, dev, why, res);
    res.config = core::plan_to_config(plan);
    res.variant = std::string(plan.variant->name);
  } else if (op == store::kTritonFusedMoe) {
    why += "; ";
    res.config = fused_moe_default(fields, q.M, core::is_hip_device_name(dev.canonical), &why);
  } else if (!triton_gemm_default(fields, &res.config, &(why += "; "))) {
    return make_status(StatusCode::not_found, "no table row for " + res.key + " and no default rule for it");
  }
  res.why = why;
  return Status();
}

std::string known_ops() {
  std::string s = std::string(store::kTritonFusedMoe) + ", " + std::string(store::kTritonGemm);
  for (const core::OpSpec* spec : core::all_specs()) s += ", " + std::string(spec->name);
  return s;
}

}  // namespace

Result<LookupResult> lookup(const Runtime& rt, const LookupQuery& q) noexcept {
  try {
    const Runtime::Impl& impl = rt.impl();
    if (q.M < 1) return make_status(StatusCode::invalid_argument, "M must be >= 1, got " + std::to_string(q.M));
    auto fields_r = store::parse_key_fields(q.key);
    if (!fields_r.ok()) return make_status(StatusCode::invalid_argument, "key: " + fields_r.status().message());
    const store::Fields fields = std::move(fields_r.value());

    // Device name: resolved through aliases and hardware identity.
    const std::string reported = q.device.empty() ? cpu_device_info().device_name : q.device;
    DeviceNameResolution dev =
        resolve_device_name(reported, q.arch, q.compute_units, q.memory_bytes, impl.options.device_aliases);
    LookupResult res;
    std::string why = dev.why;

    // Op: given, or inferred from the fields and what the table holds.
    std::string op = q.op;
    if (op.empty()) {
      auto inferred = infer_op(impl, q, fields, dev);
      if (!inferred.ok()) return inferred.status();
      op = *inferred;
      why += "; op " + op + " (inferred)";
    }
    // One release: "fused_moe" named the engines' fused-MoE tables before
    // kdispatch's own op of that name; an SGLang key (E=.. and not a key of
    // the own op, which also has K and top_k; or a down table) still answers
    // from them, and says so.
    const std::optional<core::OpKind> named = core::parse_op(op);
    if (op == store::kDeprecatedFusedMoe && store::find_field(fields, "E") &&
        (q.down || !named || !store::own_problem_from_fields(*named, fields).ok())) {
      op = store::kTritonFusedMoe;
      why +=
          "; op 'fused_moe' for the engines' fused-MoE tables is deprecated: they are 'triton_fused_moe' now "
          "(answered from it; 'fused_moe' names kdispatch's own MoE op, whose keys carry K and top_k)";
    }
    const std::optional<core::OpKind> own = core::parse_op(op);
    if (!own && op != store::kTritonFusedMoe && op != store::kTritonGemm)
      return make_status(StatusCode::invalid_argument, "unknown op '" + op + "' (expected " + known_ops() + ")");
    if (q.down && op != store::kTritonFusedMoe)
      return make_status(StatusCode::invalid_argument, "down tables exist only for triton_fused_moe");

    core::Problem prob;
    DeviceType backend = core::backend_of_device_name(dev.canonical);
    if (own) {
      if (!q.backend.empty()) {
        auto b = parse_device_type(q.backend);
        if (!b.ok())
          return make_status(StatusCode::invalid_argument, "unknown backend '" + q.backend + "' (cpu, cuda, hip)");
        backend = *b;
      }
      auto p = store::own_problem_from_fields(*own, fields);
      if (!p.ok()) return make_status(StatusCode::invalid_argument, "key: " + p.status().message());
      prob = *p;
      prob.m = q.M;
      prob.device = Device{backend, 0};
    }
    const std::vector<Candidate> cands = candidates(op, own, prob, backend, fields, dev, q.down);
    res.key = cands.front().key;

    // A forced plan (RuntimeOptions::force / KDISPATCH_FORCE) serves every
    // call of the op whose dtype it computes: say so.
    if (own && impl.forced.any()) {
      const auto plans = impl.forced.of(*own);
      for (size_t i = 0; i < plans.size(); ++i) {
        const core::Plan& f = plans[i];
        if (f.variant->backend != backend || f.variant->in_dtype != prob.in_dtype) continue;
        res.config = core::plan_to_config(f);
        res.variant = std::string(f.variant->name);
        res.match = LookupResult::Match::forced;
        res.source = "forced";
        res.table_m = -1;
        res.why = why + "; forced by '" + impl.forced.texts(*own)[i] +
                  "' (RuntimeOptions::force / KDISPATCH_FORCE): " + core::plan_to_string(f) + " serves every " + op +
                  " call with " + std::string(dtype_name(prob.in_dtype)) + " inputs, whatever the table holds";
        return res;
      }
    }
    if (from_table(impl, q, own.has_value(), cands, why, res)) return res;
    if (Status s = from_default(impl, op, own, prob, backend, fields, dev, q, why, res); !s.ok()) return s;
    return res;
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "lookup");
  } catch (const std::exception& e) {
    return make_status(StatusCode::internal, std::string("lookup: ") + e.what());
  }
}

std::string lookup_result_to_json(const LookupResult& r) {
  core::JsonWriter w;
  w.begin_object().key("config");
  config_to_json(w, r.config);
  w.field("source", r.source).field("match", match_name(r.match)).key("M");
  if (r.table_m >= 0)
    w.value(r.table_m);
  else
    w.null();
  w.key("variant");
  if (r.variant.empty())
    w.null();
  else
    w.value(r.variant);
  w.field("key", r.key).field("why", r.why);
  if (!r.note.empty()) w.field("note", r.note);
  if (!r.engine_key.empty()) {
    w.key("engine_row").begin_object().field("key", r.engine_key).field("M", r.engine_m).key("config");
    config_to_json(w, r.engine_config);
    w.field("source", r.engine_source).end_object();
    w.field("k_source", r.k_source);
  }
  w.end_object();
  return w.take();
}

Result<LookupTable> lookup_table(const Runtime& rt, const LookupQuery& q) noexcept {
  try {
    const Runtime::Impl& impl = rt.impl();
    LookupQuery query = q;
    // Which table serves the key: the one a lookup lands on (same device
    // resolution, the same _down -> up fallback). Under the bounded policy
    // M = 1 may lie outside a table's range, so probe powers of two.
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::string served, last_key;
      for (int64_t m = 1; m > 0 && m <= (int64_t{1} << 40); m *= 2) {
        query.M = m;
        auto r = lookup(rt, query);
        if (!r.ok()) return r.status();
        last_key = r->key;
        if (r->match == LookupResult::Match::exact || r->match == LookupResult::Match::nearest) {
          served = r->key;
          break;
        }
        if (r->match == LookupResult::Match::forced)
          return make_status(StatusCode::not_found, "a forced plan serves " + r->key + " at every M: no table applies");
        if (!impl.policy.bounded) break;
      }
      if (served.empty()) return make_status(StatusCode::not_found, "no table serves key " + last_key);
      LookupTable out;
      out.key = served;
      bool found = false;
      {
        table::EpochDomain::Guard guard(table::EpochDomain::global());
        const table::Snapshot* snap = impl.table.current.load(std::memory_order_seq_cst);
        if (const table::Bucket* b = snap->find(served, table::key_hash(served))) {
          found = true;
          for (size_t i = 0; i < b->ms.size(); ++i) {
            const auto [dir, path] = impl.sources.get(b->rows[i].source_id);
            out.rows.push_back({b->ms[i], snap->config(b->rows[i]), path, dir});
          }
        }
      }
      if (found) return out;  // else the table was replaced between the probe and the read: once more
    }
    return make_status(StatusCode::not_found, "the table serving the key changed while it was read");
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "lookup_table");
  }
}

}  // namespace dispatch
