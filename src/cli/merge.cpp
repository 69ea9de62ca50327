// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch merge` (issue 22): the emit dirs of several
// tuning shards (hosts, GPUs) into one config tree.
//
// A table is a file's path under its dir (<backend>/<op>/<key>.json: the key
// and the device are in the name). Per table:
//   - the sources' fingerprints (the "fingerprint" object of the "kdispatch"
//     metadata) must be equal: rows of different builds or devices are never
//     mixed; such a table is refused and reported;
//   - rows at different M are all kept; the same M with equal configs is
//     kept once (the smallest "us" of the sources is recorded);
//   - the same M with different configs is a conflict: --prefer keeps the
//     config of the source listed first; without it the table is refused
//     and the conflicting rows reported. Every conflict's candidates (source,
//     config, us) are recorded in the output's metadata ("merged").
// Output: canonical, as the tuner writes a table (the metadata first, then
// the rows by ascending M, one per line), configs as their sources wrote
// them (minified), the metadata's maps sorted, no timestamps: without
// --prefer the output does not depend on the order of the sources; each
// file written atomically (temp file, fsync, rename).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <simdjson.h>

#include "cli/cli.hpp"
#include "core/json_write.hpp"
#include "dispatch/runtime.hpp"

namespace kdispatch_cli {
namespace {

namespace fs = std::filesystem;
namespace dom = simdjson::dom;

struct Candidate {
  size_t source = 0;   ///< index into the source list
  std::string config;  ///< minified JSON
  double us = 0, default_us = 0;
};

struct Table {
  std::map<std::string, std::vector<size_t>> fingerprints;  ///< minified fingerprint -> sources
  std::map<std::string, int64_t> schema;                     ///< variant -> schema version (union)
  std::map<int64_t, std::vector<Candidate>> rows;
  std::vector<std::string> problems;
};

bool parse_m(std::string_view k, int64_t* m) {
  if (k.empty() || k.size() > 12) return false;
  int64_t v = 0;
  for (char c : k) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *m = v;
  return v >= 1;
}

double number_at(dom::element obj, std::string_view key) {
  double v = 0;
  if (obj[key].get(v) != simdjson::SUCCESS) {
    int64_t i = 0;
    if (obj[key].get(i) == simdjson::SUCCESS) v = static_cast<double>(i);
  }
  return v;
}

/// Reads one source file into its table; a problem text when it is not a table.
std::string read_table(const fs::path& file, size_t source, dom::parser& parser, Table* t) {
  simdjson::padded_string text;
  if (simdjson::padded_string::load(file.string()).get(text) != simdjson::SUCCESS) return "cannot read";
  dom::element doc;
  if (auto err = parser.parse(text).get(doc); err != simdjson::SUCCESS)
    return std::string("not JSON: ") + simdjson::error_message(err);
  dom::object obj;
  if (doc.get(obj) != simdjson::SUCCESS) return "not a JSON object";
  dom::element kd, us, dus;
  bool has_us = false, has_dus = false;  // a default-constructed element must never be read
  std::string fp = "(none: not written by kdispatch)";
  const bool has_kd = obj["kdispatch"].get(kd) == simdjson::SUCCESS && kd.is_object();
  if (has_kd) {
    dom::element f;
    if (kd["fingerprint"].get(f) == simdjson::SUCCESS) fp = simdjson::minify(f);
    dom::object schema;
    if (kd["schema"].get(schema) == simdjson::SUCCESS)
      for (auto [k, v] : schema) {
        int64_t ver = 0;
        if (v.get(ver) == simdjson::SUCCESS) t->schema[std::string(k)] = std::max(t->schema[std::string(k)], ver);
      }
    has_us = kd["us"].get(us) == simdjson::SUCCESS && us.is_object();
    has_dus = kd["default_us"].get(dus) == simdjson::SUCCESS && dus.is_object();
  }
  size_t n = 0;
  std::set<int64_t> seen;
  for (auto [k, v] : obj) {
    if (k == "kdispatch") continue;
    int64_t m = 0;
    // The tuner writes every batch size as canonical digits with an object:
    // anything else (" 2", "08", a scalar) is a hand edit merge does not
    // guess at.
    if (!parse_m(k, &m) || k.front() == '0' || !v.is_object())
      return "key '" + std::string(k) + "' is not a batch size as the tuner writes it (digits, an object)";
    if (!seen.insert(m).second) return "batch size " + std::to_string(m) + " appears twice";
    Candidate c{source, simdjson::minify(v), 0, 0};
    if (has_us) c.us = number_at(us, k);
    if (has_dus) c.default_us = number_at(dus, k);
    t->rows[m].push_back(std::move(c));
    ++n;
  }
  if (n == 0) return "no rows (not a config table)";
  t->fingerprints[fp].push_back(source);
  return {};
}

/// Writes `text` to out/rel atomically (temp file in the same dir, fsync, rename).
std::string write_atomic(const fs::path& target, const std::string& text) {
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) return "cannot create " + target.parent_path().string() + ": " + ec.message();
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".merge-" + std::to_string(::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return "cannot create " + tmp.string();
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return "cannot write " + tmp.string();
    }
    off += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), target.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return "cannot write " + target.string();
  }
  if (const int dfd = ::open(target.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

}  // namespace

int run_merge(const MergeOptions& o) {
  const char* cmd = "kdispatch merge";
  if (o.sources.empty()) {
    std::fprintf(stderr, "%s: no source dirs\n", cmd);
    return kExitUsage;
  }
  if (o.retime) {
    std::fprintf(stderr, "%s: --retime is not implemented yet: use --prefer (the first source listed wins)\n", cmd);
    return kExitUsage;
  }
  std::error_code ec;
  const fs::path out_abs = fs::weakly_canonical(fs::absolute(o.out, ec), ec);
  for (const std::string& s : o.sources) {
    if (!fs::is_directory(s, ec)) {
      std::fprintf(stderr, "%s: source '%s' is not a directory\n", cmd, s.c_str());
      return kExitUsage;
    }
    // --out below a source would be read back as part of it on the next run.
    const fs::path src_abs = fs::weakly_canonical(fs::absolute(s, ec), ec);
    const auto rel = out_abs.lexically_relative(src_abs);
    if (!rel.empty() && *rel.begin() != ".." && rel != ".") {
      std::fprintf(stderr, "%s: --out %s is inside the source %s: choose a dir outside every source\n", cmd,
                   o.out.c_str(), s.c_str());
      return kExitUsage;
    }
  }
  // ---- read every source's tables
  std::map<std::string, Table> tables;  // rel path -> table
  std::vector<std::string> unreadable;
  dom::parser parser;
  for (size_t si = 0; si < o.sources.size(); ++si) {
    const fs::path root(o.sources[si]);
    for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      const fs::path& p = it->path();
      if (!it->is_regular_file() || p.extension() != ".json" || p.filename().string().front() == '.') continue;
      const std::string rel = fs::relative(p, root).generic_string();
      if (std::string why = read_table(p, si, parser, &tables[rel]); !why.empty())
        unreadable.push_back(o.sources[si] + "/" + rel + ": " + why);
    }
  }
  // ---- merge table by table
  int written = 0, refused = 0, rows_out = 0, conflicts_total = 0;
  std::vector<std::string> report;
  for (auto& [rel, t] : tables) {
    if (t.rows.empty()) continue;
    if (t.fingerprints.size() == 1 && t.fingerprints.begin()->first.front() == '(') {
      report.push_back(rel + ": refused: not written by kdispatch (no fingerprint); merge combines tuned tables");
      ++refused;
      continue;
    }
    if (t.fingerprints.size() > 1) {
      std::string why = rel + ": refused: the sources were tuned by different builds or devices (fingerprints:";
      for (const auto& [fp, srcs] : t.fingerprints) {
        why += " [";
        for (size_t i = 0; i < srcs.size(); ++i) why += (i ? ", " : "") + o.sources[srcs[i]];
        why += "] " + fp;
      }
      report.push_back(why + "); never mixed");
      ++refused;
      continue;
    }
    dispatch::core::JsonWriter conflicts;
    conflicts.begin_object();
    std::vector<std::pair<int64_t, const Candidate*>> kept;
    std::vector<std::string> unresolved;
    int n_conflicts = 0;
    for (auto& [m, cands] : t.rows) {
      // Equal configs: one row, the smallest time of its sources.
      std::map<std::string, std::vector<const Candidate*>> by_config;
      for (const Candidate& c : cands) by_config[c.config].push_back(&c);
      const Candidate* pick = nullptr;
      // The smallest time, then the smallest default time, then the source
      // name: the same pick for any order of the sources.
      const auto better = [&](const Candidate* c, const Candidate* b) {
        const double cu = c->us > 0 ? c->us : 1e300, bu = b->us > 0 ? b->us : 1e300;
        if (cu != bu) return cu < bu;
        const double cd = c->default_us > 0 ? c->default_us : 1e300, bd = b->default_us > 0 ? b->default_us : 1e300;
        if (cd != bd) return cd < bd;
        return o.sources[c->source] < o.sources[b->source];
      };
      if (by_config.size() == 1) {
        for (const Candidate* c : by_config.begin()->second)
          if (!pick || better(c, pick)) pick = c;
      } else {
        ++n_conflicts;
        if (o.prefer) {
          for (const Candidate& c : cands)
            if (!pick || c.source < pick->source) pick = &c;
        } else {
          unresolved.push_back("M=" + std::to_string(m));
        }
        // Every candidate, sorted by config then source name (canonical).
        std::vector<const Candidate*> all;
        for (const Candidate& c : cands) all.push_back(&c);
        std::sort(all.begin(), all.end(), [&](const Candidate* a, const Candidate* b) {
          return a->config != b->config ? a->config < b->config : o.sources[a->source] < o.sources[b->source];
        });
        conflicts.key(std::to_string(m)).begin_object();
        if (pick) conflicts.field("kept", o.sources[pick->source]);
        conflicts.key("candidates").begin_array();
        for (const Candidate* c : all) {
          conflicts.begin_object().field("source", o.sources[c->source]).key("config").json(c->config);
          if (c->us > 0) conflicts.field("us", std::round(c->us * 1000.0) / 1000.0);
          conflicts.end_object();
        }
        conflicts.end_array().end_object();
      }
      if (pick) kept.emplace_back(m, pick);
    }
    conflicts.end_object();
    if (!unresolved.empty()) {
      std::string why = rel + ": refused: different configs for the same M (";
      for (size_t i = 0; i < unresolved.size(); ++i) why += (i ? ", " : "") + unresolved[i];
      report.push_back(why + "): pass --prefer to keep the first source's");
      ++refused;
      continue;
    }
    // ---- the canonical table
    dispatch::core::JsonWriter w;
    w.begin_object().field("tool", std::string("kdispatch ") + dispatch::version()).key("schema").begin_object();
    for (const auto& [variant, ver] : t.schema) w.field(variant, ver);
    w.end_object().key("fingerprint").json(t.fingerprints.begin()->first);
    for (const char* field : {"us", "default_us"}) {
      w.key(field).begin_object();
      for (const auto& [m, c] : kept) {
        const double v = std::string_view(field) == "us" ? c->us : c->default_us;
        if (v > 0) w.field(std::to_string(m), std::round(v * 1000.0) / 1000.0);
      }
      w.end_object();
    }
    w.key("merged").begin_object().field("sources", static_cast<int64_t>(o.sources.size()));
    if (n_conflicts) w.key("conflicts").json(conflicts.take());
    w.end_object().end_object();
    std::string text = "{\n    \"kdispatch\": " + w.take();
    for (const auto& [m, c] : kept) text += ",\n    \"" + std::to_string(m) + "\": " + c->config;
    text += "\n}\n";
    if (std::string err = write_atomic(fs::path(o.out) / rel, text); !err.empty()) {
      report.push_back(rel + ": " + err);
      ++refused;
      continue;
    }
    ++written;
    rows_out += static_cast<int>(kept.size());
    conflicts_total += n_conflicts;
    if (n_conflicts) report.push_back(rel + ": " + std::to_string(n_conflicts) + " conflicting M resolved by --prefer");
  }
  for (const std::string& u : unreadable) std::fprintf(stderr, "%s: skipped %s\n", cmd, u.c_str());
  for (const std::string& r : report) std::fprintf(stderr, "%s: %s\n", cmd, r.c_str());
  std::printf("%d table(s) written to %s (%d rows, %d conflicts resolved), %d refused, %zu file(s) skipped\n", written,
              o.out.c_str(), rows_out, conflicts_total, refused, unreadable.size());
  return refused > 0 || !unreadable.empty() ? kExitFailure : kExitOk;
}

}  // namespace kdispatch_cli
