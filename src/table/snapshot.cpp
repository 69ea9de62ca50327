// SPDX-License-Identifier: Apache-2.0
#include "table/snapshot.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <set>

#include "table/key.hpp"

namespace dispatch::table {
namespace {

std::string version_text(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "." : "") + std::to_string(v[i]);
  return s;
}

// Compares versions numerically; missing trailing parts count as 0.
int compare_versions(const std::vector<int>& a, const std::vector<int>& b) {
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const int x = i < a.size() ? a[i] : 0;
    const int y = i < b.size() ? b[i] : 0;
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

}  // namespace

uint64_t next_serial() noexcept {
  static std::atomic<uint64_t> serials{0};
  return serials.fetch_add(1, std::memory_order_relaxed) + 1;
}

std::unique_ptr<Snapshot> Snapshot::empty() { return std::unique_ptr<Snapshot>(new Snapshot()); }

const Row* Snapshot::nearest(const Bucket& b, int64_t m, const NearestPolicy& policy,
                             size_t* index) noexcept {
  const size_t n = b.ms.size();
  if (n == 0) return nullptr;
  if (policy.bounded) {
    const double lo = static_cast<double>(b.ms.front()) / policy.ratio;
    const double hi = static_cast<double>(b.ms.back()) * policy.ratio;
    if (static_cast<double>(m) < lo || static_cast<double>(m) > hi) return nullptr;
  }
  // First key >= m.
  const auto it = std::lower_bound(b.ms.begin(), b.ms.end(), m);
  size_t i = static_cast<size_t>(it - b.ms.begin());
  if (i == n) {
    i = n - 1;
  } else if (b.ms[i] != m && i > 0) {
    // Candidates ms[i-1] < m < ms[i]: the smaller distance wins, a tie goes
    // to the smaller key.
    const int64_t below = m - b.ms[i - 1];
    const int64_t above = b.ms[i] - m;
    if (below <= above) i = i - 1;
  }
  if (index) *index = i;
  return &b.rows[i];
}

std::unique_ptr<Snapshot> Snapshot::build(std::vector<TableInput> inputs,
                                          const std::vector<int>& backend_version,
                                          std::vector<std::string>* notes) {
  std::vector<const TableInput*> ptrs;
  ptrs.reserve(inputs.size());
  for (const auto& in : inputs) ptrs.push_back(&in);
  return build(ptrs, backend_version, notes);
}

std::unique_ptr<Snapshot> Snapshot::build(const std::vector<std::shared_ptr<const TableInput>>& inputs,
                                          const std::vector<int>& backend_version,
                                          std::vector<std::string>* notes) {
  std::vector<const TableInput*> ptrs;
  ptrs.reserve(inputs.size());
  for (const auto& in : inputs) ptrs.push_back(in.get());
  return build(ptrs, backend_version, notes);
}

std::unique_ptr<Snapshot> Snapshot::build(const std::vector<const TableInput*>& inputs,
                                          const std::vector<int>& backend_version,
                                          std::vector<std::string>* notes, const Snapshot* previous) {
  auto snap = std::unique_ptr<Snapshot>(new Snapshot());
  snap->backend_version_ = backend_version;
  // Incremental: the previous table's configs are carried over whole (so
  // its rows' config indices stay valid in a copied bucket); every 64th
  // build starts afresh and drops the configs no row uses any more.
  if (previous && (previous->backend_version_ != backend_version || previous->incremental_builds_ >= 63))
    previous = nullptr;
  if (previous) {
    snap->configs_ = previous->configs_;
    snap->incremental_builds_ = previous->incremental_builds_ + 1;
  }

  // Group inputs by key, then by source rank. The inputs stay untouched (the
  // runtime keeps them to rebuild after a tuner publish): only the rows that
  // serve are copied into the snapshot.
  // Inputs ordered by key, then source rank, then their order in `inputs`
  // (a sort of pointers: a map of maps cost several nodes per key).
  using TableInputP = const TableInput*;
  std::vector<std::pair<TableInputP, size_t>> order;
  order.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) order.emplace_back(inputs[i], i);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (const int c = a.first->key.compare(b.first->key); c != 0) return c < 0;
    if (a.first->source_rank != b.first->source_rank) return a.first->source_rank < b.first->source_rank;
    return a.second < b.second;
  });
  // One key's inputs grouped by rank: (rank, inputs) in rank order.
  std::vector<std::pair<int32_t, std::vector<TableInputP>>> by_rank;
  std::vector<std::string_view> ops;
  snap->buckets_.reserve(order.size());
  // Identical rows share one stored config (a table of many batch sizes
  // repeats a few configs): memory follows the distinct configs, not rows.
  std::unordered_map<uint64_t, std::vector<uint32_t>> config_ids;
  auto config_hash = [](const Config& c) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](const void* p, size_t n) {
      const auto* b = static_cast<const unsigned char*>(p);
      for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    };
    for (const auto& [k, v] : c) {
      mix(k.data(), k.size());
      mix(&v.kind, sizeof v.kind);
      mix(&v.i, sizeof v.i);
      mix(v.s.data(), v.s.size());
      h = (h ^ 0xff) * 1099511628211ull;
    }
    return h;
  };
  std::unordered_map<const TableInput*, std::vector<uint32_t>> remap;  // an input's config -> the snapshot's
  for (uint32_t id = 0; id < snap->configs_.size(); ++id) config_ids[config_hash(snap->configs_[id])].push_back(id);
  auto intern_config = [&](const Config& c) -> uint32_t {
    std::vector<uint32_t>& ids = config_ids[config_hash(c)];
    for (uint32_t id : ids)
      if (snap->configs_[id] == c) return id;
    ids.push_back(static_cast<uint32_t>(snap->configs_.size()));
    snap->configs_.push_back(c);
    return ids.back();
  };
  // Candidate rows of one key in precedence order (source rank, then file
  // path, then file order); a stable sort by M then keeps the first of each
  // M. A vector reused across keys: a std::map here cost a node per row.
  struct Candidate {
    int64_t m;
    const TableInput::InputRow* row;
    const TableInput* input;
  };
  std::vector<Candidate> merged;
  std::vector<TableInputP> versioned, plain, chosen;  // per source; reused, as `merged`
  for (size_t next = 0; next < order.size();) {
    const std::string& key = order[next].first->key;
    by_rank.clear();
    for (; next < order.size() && order[next].first->key == key; ++next) {
      const TableInputP t = order[next].first;
      if (by_rank.empty() || by_rank.back().first != t->source_rank) by_rank.emplace_back(t->source_rank, std::vector<TableInputP>{});
      by_rank.back().second.push_back(t);
    }
    // The identity of this key's inputs: (rank, serial) of each, in order;
    // empty when one of them has no serial (then never reused).
    std::vector<uint64_t> ids;
    for (const auto& [rank, group] : by_rank)
      for (TableInputP t : group) ids.insert(ids.end(), {static_cast<uint64_t>(static_cast<uint32_t>(rank)), t->serial});
    bool reusable = true;
    for (size_t i = 1; i < ids.size(); i += 2) reusable = reusable && ids[i] != 0;
    if (!reusable) ids.clear();
    if (!ids.empty() && previous) {
      if (const Bucket* old = previous->find(key, key_hash(key)); old && old->inputs == ids) {
        if (notes) notes->insert(notes->end(), old->build_notes.begin(), old->build_notes.end());
        snap->rows_ += static_cast<int64_t>(old->ms.size());
        ops.push_back(std::string_view(key).substr(0, key.find('|')));
        snap->buckets_.push_back(*old);
        ++snap->reused_buckets_;
        continue;
      }
    }
    Bucket bucket;
    bucket.inputs = std::move(ids);
    std::vector<std::string> local_notes;
    bucket.key = key;
    bucket.hash = key_hash(key);
    {
      const TableInput* first = by_rank.front().second.front();
      bucket.has_own_key = first->has_own_key;
      bucket.own_key = first->own_key;
      bucket.device_name = first->device_name;
    }
    merged.clear();
    std::string note;
    for (auto& [rank, group] : by_rank) {
      // Version folder selection inside one source.
      versioned.clear();
      plain.clear();
      chosen.clear();
      for (TableInputP t : group) (t->versioned ? versioned : plain).push_back(t);
      if (!versioned.empty()) {
        std::vector<int> pick;
        bool have = false;
        std::string how;
        if (!backend_version.empty()) {
          for (TableInputP t : versioned)
            if (compare_versions(t->version, backend_version) == 0) {
              pick = t->version;
              have = true;
              how = "exact version";
            }
          if (!have) {
            for (TableInputP t : versioned)
              if (compare_versions(t->version, backend_version) < 0 &&
                  (!have || compare_versions(t->version, pick) > 0)) {
                pick = t->version;
                have = true;
              }
            if (have) how = "newest folder older than " + version_text(backend_version);
          }
          if (!have) {
            for (TableInputP t : versioned)
              if (!have || compare_versions(t->version, pick) > 0) {
                pick = t->version;
                have = true;
              }
            how = "no folder at or below " + version_text(backend_version) + "; newest newer folder";
          }
        } else {
          for (TableInputP t : versioned)
            if (!have || compare_versions(t->version, pick) > 0) {
              pick = t->version;
              have = true;
            }
          how = "no version given; newest folder";
        }
        for (TableInputP t : versioned)
          if (compare_versions(t->version, pick) == 0) chosen.push_back(t);
        const std::string folder = chosen.front()->version_folder;
        note += (note.empty() ? "" : "; ") + std::string("served from ") + folder + " (" + how + ")";
        if (!backend_version.empty() && how != "exact version")
          local_notes.push_back(key + ": " + folder + " serves (" + how + ")");
        if (!plain.empty())
          note += "; unversioned file(s) of this source ignored in favour of " + folder;
      } else {
        chosen = plain;
      }
      std::sort(chosen.begin(), chosen.end(),
                [](TableInputP a, TableInputP b) { return a->path < b->path; });
      if (chosen.size() > 1) {
        // Two spellings of one device (MI325X and MI325_OAM files), or a
        // copy: one key from several files of one source. Said, not silent.
        std::set<int64_t> seen, shared;
        for (TableInputP t : chosen)
          for (const auto& row : t->rows)
            if (!seen.insert(row.m).second) shared.insert(row.m);
        std::string files;
        for (TableInputP t : chosen) files += (files.empty() ? "" : ", ") + t->path;
        local_notes.push_back(key + ": " + std::to_string(chosen.size()) + " files of one config dir hold this key (" +
                         files + "); " +
                         (shared.empty() ? std::string("their rows are merged")
                                         : std::to_string(shared.size()) + " M value(s) are in more than one, and " +
                                               chosen.front()->path + " serves them (the first by path)"));
      }
      for (TableInputP t : chosen)
        for (const auto& row : t->rows) merged.push_back(Candidate{row.m, &row, t});
    }
    bucket.note = note;
    auto by_m = [](const Candidate& a, const Candidate& b) { return a.m < b.m; };
    // One source's rows in ascending M (every real table) are in order
    // already: no n log n sort for a 1M-row file.
    if (!std::is_sorted(merged.begin(), merged.end(), by_m)) std::stable_sort(merged.begin(), merged.end(), by_m);
    size_t unique = 0;
    for (size_t c = 0; c < merged.size(); ++c) unique += (c == 0 || merged[c].m != merged[c - 1].m);
    std::vector<int64_t> ms;
    std::vector<Row> rows;
    std::vector<core::Plan> plans;  // filled only once a row has a plan
    ms.reserve(unique);
    rows.reserve(unique);
    for (size_t c = 0; c < merged.size(); ++c) {
      if (c > 0 && merged[c].m == merged[c - 1].m) continue;  // first wins
      Row r;
      if (const core::Plan* pl = merged[c].input->plan(*merged[c].row)) {
        if (plans.empty()) plans.reserve(unique);
        plans.resize(rows.size());  // the rows before without one
        plans.push_back(*pl);
      } else if (!plans.empty()) {
        plans.emplace_back();
      }
      r.source_id = merged[c].input->source_id;
      {
        // An input's configs are distinct already: each is interned once
        // (the rows of a 1M-row table with a few configs hash a few configs).
        const TableInput* in = merged[c].input;
        std::vector<uint32_t>& ids = remap[in];
        if (ids.empty()) ids.assign(in->configs.size(), UINT32_MAX);
        uint32_t& id = ids[merged[c].row->config];
        if (id == UINT32_MAX) id = intern_config(in->config(*merged[c].row));
        r.config_index = id;
      }
      ms.push_back(merged[c].m);
      rows.push_back(r);
    }
    bucket.ms = SharedArray<int64_t>(std::move(ms));
    bucket.rows = SharedArray<Row>(std::move(rows));
    if (!plans.empty()) {
      plans.resize(bucket.rows.size());
      bucket.plans = SharedArray<core::Plan>(std::move(plans));
    }
    if (notes) notes->insert(notes->end(), local_notes.begin(), local_notes.end());
    if (bucket.ms.empty()) continue;
    bucket.build_notes = std::move(local_notes);
    snap->rows_ += static_cast<int64_t>(bucket.ms.size());
    ops.push_back(std::string_view(key).substr(0, key.find('|')));
    snap->buckets_.push_back(std::move(bucket));
  }
  std::sort(ops.begin(), ops.end());
  ops.erase(std::unique(ops.begin(), ops.end()), ops.end());
  snap->ops_.assign(ops.begin(), ops.end());

  // Open addressing, capacity a power of two >= 2 * buckets.
  size_t cap = 16;
  while (cap < snap->buckets_.size() * 2) cap <<= 1;
  snap->slots_.assign(cap, Slot{});
  const size_t mask = cap - 1;
  size_t n_own = 0;
  for (size_t b = 0; b < snap->buckets_.size(); ++b) {
    const uint64_t h = snap->buckets_[b].hash;
    size_t i = h & mask;
    while (snap->slots_[i].bucket != 0) i = (i + 1) & mask;
    snap->slots_[i] = Slot{h, static_cast<uint32_t>(b + 1)};
    n_own += snap->buckets_[b].has_own_key;
  }
  // The own-op index: the same scheme over the binary keys.
  size_t own_cap = 16;
  while (own_cap < n_own * 2) own_cap <<= 1;
  snap->own_slots_.assign(own_cap, Slot{});
  const size_t own_mask = own_cap - 1;
  for (size_t b = 0; b < snap->buckets_.size(); ++b) {
    if (!snap->buckets_[b].has_own_key) continue;
    const uint64_t h = own_key_hash(snap->buckets_[b].own_key);
    size_t i = h & own_mask;
    while (snap->own_slots_[i].bucket != 0) i = (i + 1) & own_mask;
    snap->own_slots_[i] = Slot{h, static_cast<uint32_t>(b + 1)};
  }
  return snap;
}

}  // namespace dispatch::table
