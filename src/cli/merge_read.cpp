// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch merge`: reading the sources (cli/merge_impl.hpp).
//
// Listing comes first and parses nothing: a source's <key>.json files and
// its fragment dirs <key>.json.d/ (their *.json files are fragments of
// <key>.json). Under --compact, each fragment dir's claims left by a
// compaction of this host that is gone (its pid names no process, or the
// claim is older than store::kClaimStaleSeconds) are recovered before the
// dir is listed, and the claims left alone are reported
// (store/fragment_claims.hpp), and only
// tables with at least one fragment are read: a table without fragments is
// never opened. Every file is read through the bounded reader
// (store/bounded_read.hpp: a regular file only, never blocking on a FIFO,
// refused past 256 MiB before anything is allocated). A table's timing
// maps ("us", "default_us") are indexed once per file, so reading is
// linear in rows. A key is a batch size as the loader reads it
// (store/batch_key.hpp: Python's int(key), so "01", " 2", "1_0" and "３"
// are M = 1, 2, 10, 3; the output writes canonical decimal keys), and an M
// spelled twice in one file keeps the row the loader serves (SGLang's
// {int(k): v} over json.load's dict: the spelling placed last wins, with
// the last row of that spelling); the other row is dropped and listed. A
// row the loader drops (null, not an object, M < 1, over 2^63-1) or a key
// int() does not read is dropped and listed; the file's other rows are
// read.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <string_view>
#include <unordered_map>

#include <simdjson.h>

#include "cli/merge_impl.hpp"
#include "dispatch/config.hpp"
#include "store/batch_key.hpp"
#include "store/bounded_read.hpp"
#include "store/fragment_claims.hpp"

namespace kdispatch_cli::merge_detail {
namespace {

namespace dom = simdjson::dom;
namespace store = dispatch::store;

constexpr std::string_view kFragmentDir = ".json.d";

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() > tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// "" with *m when `k` is a batch size as the loader reads it
// (store::parse_m_key: Python's int(key)); else the reason the row is
// dropped.
std::string batch_size_of(std::string_view k, int64_t* m) {
  bool plain = false;
  switch (store::parse_m_key(k, m, &plain)) {
    case store::KeyInt::none:
      return "key '" + std::string(k) +
             "' is not a batch size (Python's int() does not read it; the loader ignores it)";
    case store::KeyInt::too_large: return "key '" + std::string(k) + "' is not a batch size (1 to 9223372036854775807)";
    case store::KeyInt::value: break;
  }
  if (*m < 1) return "M=" + std::string(k) + ": batch size must be >= 1";
  return {};
}

// A timing map {"<M>": <number>, ...} as M -> number, read once (a lookup
// per row of a simdjson object is a linear scan: quadratic in rows).
std::unordered_map<int64_t, double> index_times(dom::element kd, std::string_view field) {
  std::unordered_map<int64_t, double> out;
  dom::object obj;
  if (kd[field].get(obj) != simdjson::SUCCESS) return out;
  out.reserve(obj.size());
  for (auto [k, v] : obj) {
    int64_t m = 0;
    bool plain = false;
    if (store::parse_m_key(k, &m, &plain) != store::KeyInt::value || m < 1) continue;
    double d = 0;
    if (v.get(d) != simdjson::SUCCESS) {
      int64_t i = 0;
      if (v.get(i) != simdjson::SUCCESS) continue;
      d = static_cast<double>(i);
    }
    out.emplace(m, d);
  }
  return out;
}

double time_of(const std::unordered_map<int64_t, double>& times, int64_t m) {
  const auto it = times.find(m);
  return it == times.end() ? 0.0 : it->second;
}

// Reads the parsed file `fi` into its table; "" or why the whole file is
// skipped (then nothing of it is kept).
std::string read_table(const char* data, size_t len, uint32_t fi, dom::parser& parser, Table* t, Inputs* in) {
  dom::element doc;
  if (auto err = parser.parse(data, len, false).get(doc); err != simdjson::SUCCESS)
    return std::string("not JSON: ") + simdjson::error_message(err);
  dom::object obj;
  if (doc.get(obj) != simdjson::SUCCESS) return "not a JSON object";
  SourceFile& f = in->files[fi];
  std::string fp = "(none: not written by kdispatch)";
  std::unordered_map<int64_t, double> us, dus;
  store::RowMetaIndex metas;
  bool has_meta = false;
  dom::element kd;
  if (obj["kdispatch"].get(kd) == simdjson::SUCCESS && kd.is_object()) {
    dom::element e;
    if (kd["fingerprint"].get(e) == simdjson::SUCCESS) fp = simdjson::minify(e);
    dom::object schema;
    if (kd["schema"].get(schema) == simdjson::SUCCESS)
      for (auto [k, v] : schema) {
        int64_t ver = 0;
        if (v.get(ver) != simdjson::SUCCESS) continue;
        f.schema.emplace_back(std::string(k), ver);
      }
    us = index_times(kd, "us");
    dus = index_times(kd, "default_us");
    metas = store::read_row_meta(kd);
    has_meta = metas.margin >= 0 || !metas.margin_by_m.empty() || !metas.aa_spread.empty() || !metas.timing.empty() ||
               !metas.why.empty() || !metas.cpu.empty() || !metas.cpu_by_m.empty();
  }
  const size_t first_drop = in->dropped.size();
  // The rows in file order; an M given twice is resolved below.
  struct Row {
    int64_t m;
    std::string_view key;
    dom::element v;
  };
  std::vector<Row> rows;
  bool ascending = true;  // every real table: no M can repeat
  int64_t max_m = 0;
  for (auto [k, v] : obj) {
    if (k == "kdispatch") continue;
    int64_t m = 0;
    std::string why = batch_size_of(k, &m);
    if (why.empty() && v.is_null())
      why = "M=" + std::string(k) + ": the row is null, not an object";
    else if (why.empty() && !v.is_object())
      why = "M=" + std::string(k) + ": the row is not an object";
    if (!why.empty()) {
      in->dropped.push_back(f.path + ": " + why + "; row dropped");
      ++t->dropped;
      continue;
    }
    ascending = ascending && m > max_m;
    max_m = std::max(max_m, m);
    rows.push_back(Row{m, k, v});
  }
  std::vector<char> serves(rows.size(), 1);
  if (!ascending) {
    // As SGLang reads the file, {int(k): v for k, v in json.load(f).items()}:
    // json.load keeps one entry per key string (its last row, at the place
    // of its first occurrence), then of the spellings of one M the entry
    // placed last serves. So the row that serves M is the last row of the
    // spelling whose first occurrence is last (the loader's rule:
    // store/json_file.cpp).
    std::unordered_map<std::string_view, size_t> first_at;        // key string -> its first row
    std::unordered_map<int64_t, std::pair<size_t, size_t>> best;  // M -> (first_at of its key, row)
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t at = first_at.try_emplace(rows[i].key, i).first->second;
      auto [it, fresh] = best.try_emplace(rows[i].m, at, i);
      if (!fresh && std::make_pair(at, i) > it->second) it->second = {at, i};
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t win = best.at(rows[i].m).second;
      if (win == i) continue;
      serves[i] = 0;
      const std::string_view by = rows[win].key;
      in->dropped.push_back(f.path + ": M=" + std::string(rows[i].key) + ": " +
                            (by == rows[i].key ? std::string("duplicate key; the last one serves (as json.load)")
                                               : "batch size " + std::to_string(rows[i].m) + " also given by key '" +
                                                     std::string(by) + "', whose row serves (as SGLang's int(key))") +
                            "; row dropped");
      ++t->dropped;
    }
  }
  size_t n = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!serves[i]) continue;
    const Row& r = rows[i];
    t->cands.push_back(Candidate{r.m, fi, std::string(simdjson::minify(r.v)), time_of(us, r.m), time_of(dus, r.m), {}});
    if (has_meta) t->cands.back().meta = std::make_shared<const store::RowMeta>(metas.at(r.m));
    ++n;
  }
  if (n == 0 && in->dropped.size() == first_drop) return "no rows (not a config table)";
  for (const auto& [variant, ver] : f.schema) t->schema[variant] = std::max(t->schema[variant], ver);
  if (n > 0) t->fingerprints[fp].insert(f.label);
  return {};
}

// The tables of one source, from its listing: table path -> its main file
// (if any) and its fragments' names (sorted).
struct Listed {
  bool main = false;
  std::vector<std::string> fragments;
};

void recover_claims(const fs::path& frag_dir, const std::string& shown, Inputs* in) {
  const int fd = ::open(frag_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  for (const store::RecoveredClaim& r : store::recover_dead_claims(fd, "")) {
    if (r.put_as.empty() && r.error.empty()) continue;  // recovered by another process meanwhile
    const std::string whose =
        r.stale ? "the claim of a compaction of this host that is gone (" + r.why + ")"
                : "the claim of a compaction that died (pid " + std::to_string(r.pid) + " of this host)";
    if (!r.error.empty())
      in->skipped.push_back(shown + "/" + r.claim + ": " + whose + " cannot be recovered: " + r.error);
    else
      in->notes.push_back(shown + ": recovered " + r.claim + ", " + whose + ", as " + r.put_as);
  }
  for (const store::LeftClaim& c : store::left_claims(fd))
    in->notes.push_back(shown + "/" + c.name + ": left alone: " + c.why +
                        (c.verdict == store::ClaimVerdict::not_regular ? "; remove it"
                         : c.verdict == store::ClaimVerdict::live
                             ? ""
                             : "; if no compaction runs, rename it to a *.json name in its dir"));
  ::close(fd);
}

// Lists one source: <key>.json files and <key>.json.d/*.json fragments.
// Under --compact, the fragment dirs' dead claims are recovered first.
std::map<std::string, Listed> list_source(const fs::path& root, bool compact, Inputs* in) {
  std::map<std::string, Listed> tables;
  std::vector<std::string> frag_dirs;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code tec;
    const bool dir = it->is_directory(tec) && !it->is_symlink(tec);
    if (name.empty() || name.front() == '.') {
      if (dir) it.disable_recursion_pending();
      continue;
    }
    const std::string rel = it->path().lexically_relative(root).generic_string();
    if (dir && ends_with(name, kFragmentDir)) {
      frag_dirs.push_back(rel);
      it.disable_recursion_pending();
    } else if (!dir && ends_with(name, ".json")) {
      tables[rel].main = true;
    }
  }
  for (const std::string& rel : frag_dirs) {
    const fs::path d = root / rel;
    if (compact) recover_claims(d, rel, in);
    std::vector<std::string> names;
    std::error_code dec;
    for (auto it = fs::directory_iterator(d, dec); !dec && it != fs::directory_iterator(); it.increment(dec)) {
      const std::string name = it->path().filename().string();
      if (!name.empty() && name.front() != '.' && ends_with(name, ".json")) names.push_back(name);
    }
    if (names.empty()) continue;
    std::sort(names.begin(), names.end());
    Listed& l = tables[rel.substr(0, rel.size() - 2)];
    l.fragments = std::move(names);
  }
  return tables;
}

// Reads one file into its table; bytes kept for --compact.
void read_one(const std::string& rel, const fs::path& path, const std::string& shown, SourceFile f, bool compact,
              std::string* keep, dom::parser& parser, Inputs* in) {
  store::BoundedRead opt;
  opt.nofollow = compact;  // in place: never through a link
  opt.padding = simdjson::SIMDJSON_PADDING;
  opt.shown = shown;
  opt.limit_name = "the limit for one input file (docs/config-files.md#limits)";
  std::string data, why;
  if (store::read_bounded(path.string(), &data, opt, &why) != store::ReadError::ok) {
    in->skipped.push_back(why);
    return;
  }
  const size_t len = data.size() - opt.padding;
  const uint32_t fi = static_cast<uint32_t>(in->files.size());
  in->files.push_back(std::move(f));
  Table& t = in->tables[rel];
  if (std::string bad = read_table(data.data(), len, fi, parser, &t, in); !bad.empty()) {
    in->skipped.push_back(shown + ": " + bad);
    return;
  }
  if (keep) keep->assign(data.data(), len);
}

}  // namespace

void read_sources(const MergeOptions& o, bool compact, Inputs* in) {
  dom::parser parser;
  const std::vector<std::string> sources = compact ? std::vector<std::string>{o.compact} : o.sources;
  for (size_t si = 0; si < sources.size(); ++si) {
    const fs::path root(sources[si]);
    for (auto& [rel, l] : list_source(root, compact, in)) {
      if (compact && l.fragments.empty()) continue;  // a table without fragments is not read
      const std::string shown = sources[si] + "/" + rel;
      if (l.main) {
        std::string bytes;
        const size_t before = in->skipped.size();
        read_one(rel, root / rel, shown, SourceFile{sources[si], shown, si, {}}, compact, compact ? &bytes : nullptr,
                 parser, in);
        if (compact) {
          Table& t = in->tables[rel];
          if (in->skipped.size() != before)
            t.problem = "its main file could not be read (skipped, above): left as it was";
          t.has_main = true;
          t.main_bytes = std::move(bytes);
        }
      }
      for (const std::string& name : l.fragments) {
        const fs::path p = root / (rel + ".d") / name;
        const std::string fshown = shown + ".d/" + name;
        std::string bytes;
        const size_t before = in->skipped.size();
        read_one(rel, p, fshown, SourceFile{sources[si] + " (fragment " + name + ")", fshown, si, {}}, compact,
                 compact ? &bytes : nullptr, parser, in);
        if (compact && in->skipped.size() == before) in->tables[rel].fragments.emplace_back(p, std::move(bytes));
      }
    }
  }
  std::sort(in->skipped.begin(), in->skipped.end());
}

}  // namespace kdispatch_cli::merge_detail
