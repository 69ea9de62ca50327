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

using TableInputP = const TableInput*;

// Version folder selection inside one source (one key, one rank): the
// folder of exactly `backend_version`, else the newest older one, else the
// newest newer one (none given: the newest); unversioned files of a source
// that has version folders are ignored. Appends to the bucket's note and,
// when the exact version is absent, to `notes`.
std::vector<TableInputP> choose_version(const std::string& key, const std::vector<TableInputP>& group,
                                        const std::vector<int>& backend_version, std::string* note,
                                        std::vector<std::string>* notes) {
  std::vector<TableInputP> versioned, plain, chosen;
  for (TableInputP t : group) (t->versioned ? versioned : plain).push_back(t);
  if (versioned.empty()) return plain;
  std::vector<int> pick;
  bool have = false;
  std::string how;
  auto newest = [&](auto&& admit) {
    for (TableInputP t : versioned)
      if (admit(t) && (!have || compare_versions(t->version, pick) > 0)) {
        pick = t->version;
        have = true;
      }
  };
  if (!backend_version.empty()) {
    newest([&](TableInputP t) { return compare_versions(t->version, backend_version) == 0; });
    if (have) how = "exact version";
    if (!have) {
      newest([&](TableInputP t) { return compare_versions(t->version, backend_version) < 0; });
      if (have) how = "newest folder older than " + version_text(backend_version);
    }
    if (!have) {
      newest([](TableInputP) { return true; });
      how = "no folder at or below " + version_text(backend_version) + "; newest newer folder";
    }
  } else {
    newest([](TableInputP) { return true; });
    how = "no version given; newest folder";
  }
  for (TableInputP t : versioned)
    if (compare_versions(t->version, pick) == 0) chosen.push_back(t);
  const std::string folder = chosen.front()->version_folder;
  *note += (note->empty() ? "" : "; ") + std::string("served from ") + folder + " (" + how + ")";
  if (!backend_version.empty() && how != "exact version")
    notes->push_back(key + ": " + folder + " serves (" + how + ")");
  if (!plain.empty()) *note += "; unversioned file(s) of this source ignored in favour of " + folder;
  return chosen;
}

// The M values held by more than one of `chosen`.
std::set<int64_t> shared_ms(const std::vector<TableInputP>& chosen) {
  std::set<int64_t> seen, shared;
  for (TableInputP t : chosen)
    for (const auto& row : t->rows)
      if (!seen.insert(row.m).second) shared.insert(row.m);
  return shared;
}

// One key from several files of one source (two spellings of one device,
// MI325X and MI325_OAM, or a copy): said, not silent. `chosen` is sorted by path.
std::string shared_key_note(const std::string& key, const std::vector<TableInputP>& chosen) {
  const std::set<int64_t> shared = shared_ms(chosen);
  std::string files;
  for (TableInputP t : chosen) files += (files.empty() ? "" : ", ") + t->path;
  return key + ": " + std::to_string(chosen.size()) + " files of one config dir hold this key (" + files + "); " +
         (shared.empty() ? std::string("their rows are merged")
                         : std::to_string(shared.size()) + " M value(s) are in more than one, and " +
                               chosen.front()->path + " serves them (the first by path)");
}

// The table file a path names: "<x>.json" itself, and for a fragment
// "<x>.json.d/<f>.json" (a writer's share of <x>.json where flock is not
// honoured: store/private_fs.hpp) its "<x>.json".
std::string_view table_file_of(std::string_view path) {
  const size_t slash = path.rfind('/');
  constexpr std::string_view kFrag = ".json.d";
  if (slash != std::string_view::npos && slash >= kFrag.size() &&
      path.substr(slash - kFrag.size(), kFrag.size()) == kFrag)
    return path.substr(0, slash - 2);
  return path;
}

// One table file and its fragments: their rows are one table, so only an M
// held by more than one of them is said. `chosen` is sorted by path, which
// puts the main file first, then the fragments by name.
std::string fragments_note(const std::string& key, const std::vector<TableInputP>& chosen) {
  const std::set<int64_t> shared = shared_ms(chosen);
  if (shared.empty()) return {};
  size_t fragments = 0;
  for (TableInputP t : chosen) fragments += table_file_of(t->path).size() != t->path.size();
  std::string ms;
  int listed = 0;
  for (int64_t m : shared)
    if (++listed <= 8) ms += (ms.empty() ? "" : ", ") + std::to_string(m);
  if (shared.size() > 8) ms += ", ...";
  return key + ": " + std::to_string(shared.size()) + " M value(s) (" + ms + ") are in more than one of " +
         std::string(table_file_of(chosen.front()->path)) + " and its " + std::to_string(fragments) +
         " fragment file(s): the first by path serves each (the main file, then the fragments by name)";
}

// The snapshot's config pool: identical rows share one stored config (a
// table of many batch sizes repeats a few configs), and an input's configs
// (distinct already) are each interned once.
class ConfigInterner {
 public:
  explicit ConfigInterner(std::vector<Config>* pool) : pool_(pool) {
    for (uint32_t id = 0; id < pool_->size(); ++id) ids_[hash((*pool_)[id])].push_back(id);
  }
  uint32_t of(const TableInput* in, const TableInput::InputRow& row) {
    std::vector<uint32_t>& ids = remap_[in];
    if (ids.empty()) ids.assign(in->configs.size(), UINT32_MAX);
    uint32_t& id = ids[row.config];
    if (id == UINT32_MAX) id = intern(in->config(row));
    return id;
  }

 private:
  static uint64_t hash(const Config& c) {
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
  }
  uint32_t intern(const Config& c) {
    std::vector<uint32_t>& ids = ids_[hash(c)];
    for (uint32_t id : ids)
      if ((*pool_)[id] == c) return id;
    ids.push_back(static_cast<uint32_t>(pool_->size()));
    pool_->push_back(c);
    return ids.back();
  }
  std::vector<Config>* pool_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> ids_;
  std::unordered_map<const TableInput*, std::vector<uint32_t>> remap_;  // an input's config -> the pool's
};

// A candidate row of one key, in precedence order (source rank, then file
// path, then file order).
struct Candidate {
  int64_t m;
  const TableInput::InputRow* row;
  const TableInput* input;
};

// The bucket's rows from its candidates: sorted by M (stable: the first of
// each M wins), plans kept only when a row has one.
void assemble_rows(std::vector<Candidate>& merged, ConfigInterner& configs, Bucket* bucket) {
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
    if (const core::Plan* pl = merged[c].input->plan(*merged[c].row)) {
      if (plans.empty()) plans.reserve(unique);
      plans.resize(rows.size());  // the rows before without one
      plans.push_back(*pl);
    } else if (!plans.empty()) {
      plans.emplace_back();
    }
    ms.push_back(merged[c].m);
    rows.push_back(Row{merged[c].input->source_id, configs.of(merged[c].input, *merged[c].row)});
  }
  bucket->ms = SharedArray<int64_t>(std::move(ms));
  bucket->rows = SharedArray<Row>(std::move(rows));
  if (!plans.empty()) {
    plans.resize(bucket->rows.size());
    bucket->plans = SharedArray<core::Plan>(std::move(plans));
  }
}

// Open addressing, capacity a power of two >= 2 * entries.
template <class HashOf>
std::vector<Snapshot::Slot> index_slots(const std::vector<Bucket>& buckets, HashOf hash_of) {
  size_t n = 0;
  for (const Bucket& b : buckets) n += hash_of(b).first;
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  std::vector<Snapshot::Slot> slots(cap);
  const size_t mask = cap - 1;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const auto [in, h] = hash_of(buckets[b]);
    if (!in) continue;
    size_t i = h & mask;
    while (slots[i].bucket != 0) i = (i + 1) & mask;
    slots[i] = Snapshot::Slot{h, static_cast<uint32_t>(b + 1)};
  }
  return slots;
}

}  // namespace

uint64_t next_serial() noexcept {
  static std::atomic<uint64_t> serials{0};
  return serials.fetch_add(1, std::memory_order_relaxed) + 1;
}

std::unique_ptr<Snapshot> Snapshot::empty() { return std::unique_ptr<Snapshot>(new Snapshot()); }

const Row* Snapshot::nearest(const Bucket& b, int64_t m, const NearestPolicy& policy, size_t* index) noexcept {
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

std::unique_ptr<Snapshot> Snapshot::build(std::vector<TableInput> inputs, const std::vector<int>& backend_version,
                                          std::vector<std::string>* notes) {
  std::vector<const TableInput*> ptrs;
  ptrs.reserve(inputs.size());
  for (const auto& in : inputs) ptrs.push_back(&in);
  return build(ptrs, backend_version, notes);
}

std::unique_ptr<Snapshot> Snapshot::build(const std::vector<std::shared_ptr<const TableInput>>& inputs,
                                          const std::vector<int>& backend_version, std::vector<std::string>* notes) {
  std::vector<const TableInput*> ptrs;
  ptrs.reserve(inputs.size());
  for (const auto& in : inputs) ptrs.push_back(in.get());
  return build(ptrs, backend_version, notes);
}

std::unique_ptr<Snapshot> Snapshot::build(const std::vector<const TableInput*>& inputs,
                                          const std::vector<int>& backend_version, std::vector<std::string>* notes,
                                          const Snapshot* previous) {
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
  ConfigInterner configs(&snap->configs_);

  // Inputs ordered by key, then source rank, then their order in `inputs`
  // (a sort of pointers: a map of maps cost several nodes per key). The
  // inputs stay untouched (the runtime keeps them to rebuild after a tuner
  // publish): only the rows that serve are copied into the snapshot.
  std::vector<std::pair<TableInputP, size_t>> order;
  order.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) order.emplace_back(inputs[i], i);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    if (const int c = a.first->key.compare(b.first->key); c != 0) return c < 0;
    if (a.first->source_rank != b.first->source_rank) return a.first->source_rank < b.first->source_rank;
    return a.second < b.second;
  });
  std::vector<std::pair<int32_t, std::vector<TableInputP>>> by_rank;  // one key's inputs: (rank, inputs)
  std::vector<std::string_view> ops;
  std::vector<Candidate> merged;  // reused across keys: a std::map here cost a node per row
  snap->buckets_.reserve(order.size());
  for (size_t next = 0; next < order.size();) {
    const std::string& key = order[next].first->key;
    by_rank.clear();
    for (; next < order.size() && order[next].first->key == key; ++next) {
      const TableInputP t = order[next].first;
      if (by_rank.empty() || by_rank.back().first != t->source_rank)
        by_rank.emplace_back(t->source_rank, std::vector<TableInputP>{});
      by_rank.back().second.push_back(t);
    }
    // The identity of this key's inputs: (rank, serial) of each, in order;
    // empty when one of them has no serial (then never reused).
    std::vector<uint64_t> ids;
    for (const auto& [rank, group] : by_rank)
      for (TableInputP t : group)
        ids.insert(ids.end(), {static_cast<uint64_t>(static_cast<uint32_t>(rank)), t->serial});
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
    bucket.key = key;
    bucket.hash = key_hash(key);
    const TableInput* first = by_rank.front().second.front();
    bucket.has_own_key = first->has_own_key;
    bucket.own_key = first->own_key;
    bucket.device_name = first->device_name;
    merged.clear();
    for (auto& [rank, group] : by_rank) {
      std::vector<TableInputP> chosen = choose_version(key, group, backend_version, &bucket.note, &bucket.build_notes);
      std::sort(chosen.begin(), chosen.end(), [](TableInputP a, TableInputP b) { return a->path < b->path; });
      if (chosen.size() > 1) {
        bool one_table = true;  // a table file and its fragments (or fragments only)
        for (TableInputP t : chosen) one_table = one_table && table_file_of(t->path) == table_file_of(chosen[0]->path);
        std::string note = one_table ? fragments_note(key, chosen) : shared_key_note(key, chosen);
        if (!note.empty()) bucket.build_notes.push_back(std::move(note));
      }
      for (TableInputP t : chosen)
        for (const auto& row : t->rows) merged.push_back(Candidate{row.m, &row, t});
    }
    assemble_rows(merged, configs, &bucket);
    if (notes) notes->insert(notes->end(), bucket.build_notes.begin(), bucket.build_notes.end());
    if (bucket.ms.empty()) continue;
    snap->rows_ += static_cast<int64_t>(bucket.ms.size());
    ops.push_back(std::string_view(key).substr(0, key.find('|')));
    snap->buckets_.push_back(std::move(bucket));
  }
  std::sort(ops.begin(), ops.end());
  ops.erase(std::unique(ops.begin(), ops.end()), ops.end());
  snap->ops_.assign(ops.begin(), ops.end());
  snap->slots_ = index_slots(snap->buckets_, [](const Bucket& b) { return std::pair<bool, uint64_t>{true, b.hash}; });
  // The own-op index: the same scheme over the binary keys.
  snap->own_slots_ = index_slots(snap->buckets_, [](const Bucket& b) {
    return std::pair<bool, uint64_t>{b.has_own_key, b.has_own_key ? own_key_hash(b.own_key) : 0};
  });
  return snap;
}

}  // namespace dispatch::table
