// SPDX-License-Identifier: Apache-2.0
#include "api/runtime_parts.hpp"

#include <cstdlib>

#include "backends/registry.hpp"
#include "table/epoch.hpp"

namespace dispatch::api {
namespace {

void delete_snapshot(void* p) { delete static_cast<const table::Snapshot*>(p); }

}  // namespace

// ------------------------------------------------------------------ PublishedTable

PublishedTable::~PublishedTable() { delete current.load(std::memory_order_acquire); }

std::vector<const table::TableInput*> PublishedTable::all_inputs() const {
  std::vector<const table::TableInput*> all;
  all.reserve(base_inputs.size() + tuned_inputs.size());
  for (const auto& in : base_inputs) all.push_back(in.get());
  for (const auto& in : tuned_inputs) all.push_back(&in);
  return all;
}

void PublishedTable::publish_locked(std::unique_ptr<table::Snapshot> snap, const void* owner) {
  // Generation 0 while the table changes: readers neither use nor make memo
  // entries then, so no thread serves an older memo entry after it has seen
  // the new table. After the new table, a fresh generation: a reader that
  // sees it sees the new table (it loads `gen` with acquire before it
  // loads `current`).
  static std::atomic<uint64_t> generations{0};
  gen.store(0, std::memory_order_seq_cst);
  const table::Snapshot* old = current.exchange(snap.release(), std::memory_order_seq_cst);
  gen.store(generations.fetch_add(1, std::memory_order_relaxed) + 1, std::memory_order_release);
  if (old)
    table::EpochDomain::global().retire(const_cast<table::Snapshot*>(old), &delete_snapshot, const_cast<void*>(owner));
}

void PublishedTable::add_tuned_locked(std::vector<table::TableInput> rows) {
  for (auto& in : rows) {
    // One in-process row per (key, M): a re-tune replaces the old row.
    for (auto& old : tuned_inputs)
      if (old.key == in.key)
        std::erase_if(old.rows, [&](const table::TableInput::InputRow& r) {
          for (const auto& n : in.rows)
            if (n.m == r.m) return true;
          return false;
        });
    std::erase_if(tuned_inputs, [](const table::TableInput& t) { return t.rows.empty(); });
    for (auto& old : tuned_inputs)
      if (old.key == in.key) old.serial = table::next_serial();  // changed: its key is rebuilt
    in.serial = table::next_serial();
    tuned_inputs.push_back(std::move(in));
  }
}

// ------------------------------------------------------------------ SourceIds

uint32_t SourceIds::intern(const std::string& dir, const std::string& rel) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = std::make_pair(dir, rel);
  auto it = ids_.find(key);
  if (it != ids_.end()) return it->second;
  list_.push_back(key);
  const auto id = static_cast<uint32_t>(list_.size());
  ids_.emplace(std::move(key), id);
  return id;
}

std::pair<std::string, std::string> SourceIds::get(uint32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == 0 || id > list_.size()) return {};
  return list_[id - 1];
}

// ------------------------------------------------------------------ StreamWorkspaces

Status StreamWorkspaces::attach(Device d, void* stream, int64_t bytes,
                                const std::function<void*(int32_t ordinal, int64_t bytes)>& alloc) noexcept {
  try {
    std::lock_guard<std::mutex> lock(mu_);
    if (find(d, stream) != nullptr) return Status();
    const int n = n_.load(std::memory_order_relaxed);
    if (n >= kMax)
      return make_status(StatusCode::out_of_memory,
                         "attach_stream: " + std::to_string(kMax) + " streams already attached to this runtime");
    void* ws = nullptr;
    if (bytes > 0) {
      ws = alloc(d.ordinal, bytes);
      if (ws == nullptr)
        return make_status(StatusCode::out_of_memory,
                           "attach_stream: allocating a " + std::to_string(bytes) + "-byte workspace on " +
                               std::string(device_type_name(d.type)) + ":" + std::to_string(d.ordinal));
    }
    slots_[n] = Slot{d, stream, ws, ws ? bytes : 0};
    n_.store(n + 1, std::memory_order_release);
    return Status();
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "attach_stream");
  }
}

void StreamWorkspaces::release_all(void (*free_fn)(Device d, void* workspace)) noexcept {
  for (int i = 0; i < n_.load(std::memory_order_acquire); ++i)
    if (slots_[i].workspace) free_fn(slots_[i].device, slots_[i].workspace);
}

// ------------------------------------------------------------------ ForcedPlans

namespace {

// "<param>=<value>,..." appended to `row` as the variant's params take them.
Status parse_forced_params(const std::string& entry, const core::VariantDef& v, const std::string& params,
                           Config* row) {
  size_t start = 0;
  while (start < params.size()) {
    size_t comma = params.find(',', start);
    if (comma == std::string::npos) comma = params.size();
    const std::string kv = params.substr(start, comma - start);
    start = comma + 1;
    const auto e2 = kv.find('=');
    if (e2 == std::string::npos)
      return make_status(StatusCode::config_error, "force entry '" + entry + "': '" + kv + "' is not param=value");
    const std::string pn = kv.substr(0, e2), pv = kv.substr(e2 + 1);
    const core::ParamDef* pd = nullptr;
    for (const auto& d : v.params)
      if (d.name == pn) pd = &d;
    if (!pd)
      return make_status(StatusCode::config_error,
                         "force entry '" + entry + "': " + std::string(v.name) + " has no param '" + pn + "'");
    if (pd->kind == core::ParamKind::integer) {
      char* end = nullptr;
      const long long x = std::strtoll(pv.c_str(), &end, 10);
      if (pv.empty() || *end)
        return make_status(StatusCode::config_error, "force entry '" + entry + "': " + pn + " needs an integer");
      row->emplace_back(pn, ConfigValue::integer(x));
    } else if (pd->kind == core::ParamKind::boolean) {
      row->emplace_back(pn, ConfigValue::boolean(pv == "true" || pv == "1"));
    } else {
      row->emplace_back(pn, ConfigValue::string(pv));
    }
  }
  return Status();
}

}  // namespace

Status ForcedPlans::parse(const std::vector<std::string>& entries) {
  for (const std::string& entry : entries) {
    const auto eq = entry.find('=');
    if (eq == std::string::npos)
      return make_status(StatusCode::config_error,
                         "force entry '" + entry + "' is not <op>=<variant>[:param=value,...]");
    const std::string opname = entry.substr(0, eq);
    const auto op = core::parse_op(opname);
    if (!op) return make_status(StatusCode::config_error, "force entry '" + entry + "': unknown op '" + opname + "'");
    const std::string rest = entry.substr(eq + 1);
    std::string vname = rest, params;
    if (const auto colon = rest.find(':'); colon != std::string::npos) {
      vname = rest.substr(0, colon);
      params = rest.substr(colon + 1);
    }
    const core::VariantDef* v = core::find_variant(vname);
    if (!v || v->op != *op)
      return make_status(StatusCode::no_variant,
                         "force entry '" + entry + "': no " + opname + " variant named '" + vname + "'");
    Config row;
    row.emplace_back("variant", ConfigValue::string(vname));
    if (Status s = parse_forced_params(entry, *v, params, &row); !s.ok()) return s;
    auto plan = core::plan_from_config(row, *op, v->backend);
    if (!plan.ok())
      return make_status(StatusCode::config_error, "force entry '" + entry + "': " + plan.status().message());
    plans_[static_cast<int>(*op)].push_back(*plan);
    texts_[static_cast<int>(*op)].push_back(entry);
    any_ = true;
  }
  return Status();
}

}  // namespace dispatch::api
