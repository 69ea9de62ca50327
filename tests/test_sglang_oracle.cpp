// SPDX-License-Identifier: Apache-2.0
// dispatch::lookup against a brute-force oracle over every SGLang file in
// shared/data/sglang-configs (fused_moe_triton/ and quantization/).
//
// The oracle is written from the rules (ARCHITECTURE.md §4-5, data/README.md),
// not from the library: its own file-name splitter, simdjson DOM for the
// content, a linear nearest-M scan. Rules it encodes:
//  - key = the file name's fields other than device_name, sorted by name,
//    block_shape without spaces, plus `_down`; op triton_fused_moe (E=) or
//    triton_gemm (N=, K=); device = the file's device_name as written;
//  - version folders triton_X_Y_Z/: for a running version V the folder of
//    exactly V, else the newest older, else the newest newer; V unset = the
//    newest folder holding the key; several files of the chosen folder with
//    one key merge by path, the first holding an M wins;
//  - null rows are skipped; nearest M: smallest |k - M|, ties to the smaller k;
//  - a `_down` query falls back to the up table when the key has no `_down` table;
//  - rows with BLOCK_SIZE_M and without num_warps / num_stages get Triton's
//    defaults 4 / 3 appended (lookup.cpp);
//  - files whose name has no key fields or whose content has no batch-size
//    keys are foreign: skipped and reported.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "test_util.hpp"

using namespace dispatch;
using namespace kdtest;

namespace {

// data/README.md, "device_name values seen in SGLang" (all but the empty one
// are known to the resolver).
const std::set<std::string> kSglangDevices = {"AMD_Instinct_MI300X",
                                              "AMD_Instinct_MI325X",
                                              "AMD_Radeon_Graphics",
                                              "NVIDIA_A100-SXM4-40GB",
                                              "NVIDIA_A100-SXM4-80GB",
                                              "NVIDIA_A800-SXM4-80GB",
                                              "NVIDIA_B200",
                                              "NVIDIA_GB10",
                                              "NVIDIA_GeForce_RTX_4090",
                                              "NVIDIA_H100_80GB_HBM3",
                                              "NVIDIA_H20",
                                              "NVIDIA_H20-3e",
                                              "NVIDIA_H200",
                                              "NVIDIA_H800",
                                              "NVIDIA_L20",
                                              "NVIDIA_L20Y",
                                              "NVIDIA_L40",
                                              "NVIDIA_L40S",
                                              "NVIDIA_RTX_5880_Ada_Generation",
                                              "NVIDIA_RTX_6000_Ada_Generation",
                                              "NVIDIA_RTX_PRO_6000_Blackwell_Max-Q_Workstation_Edition",
                                              "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"};

struct OracleFile {
  std::string rel;  // relative to the config dir (sglang-configs/)
  bool foreign = false;
  std::string op;         // triton_fused_moe | triton_gemm
  std::string device;     // as written in the file name
  std::string fields;     // canonical: sorted, block_shape without spaces
  std::string query_key;  // the fields as written in the name (file order, original spelling)
  bool down = false;
  bool versioned = false;
  std::vector<int> version;
  std::vector<int64_t> all_keys;        // every M key of the file, nulls included
  std::map<int64_t, std::string> rows;  // usable rows: M -> expected config JSON
  int nulls = 0;

  std::string group() const { return op + "|" + device + "|" + fields + (down ? "|down" : ""); }
};

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// "triton_3_5_1" -> {3,5,1}.
bool folder_version(const std::string& name, std::vector<int>* v) {
  if (name.rfind("triton_", 0) != 0) return false;
  v->clear();
  std::string part;
  for (char c : name.substr(7) + "_") {
    if (c == '_') {
      if (!all_digits(part)) return false;
      v->push_back(std::stoi(part));
      part.clear();
    } else {
      part += c;
    }
  }
  return !v->empty();
}

int vcmp(const std::vector<int>& a, const std::vector<int>& b) {
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const int x = i < a.size() ? a[i] : 0, y = i < b.size() ? b[i] : 0;
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

// The file name -> key; false for a name with no key fields.
bool parse_name(std::string base, OracleFile* f) {
  base = base.substr(0, base.size() - 5);  // ".json"
  if (base.size() > 5 && base.compare(base.size() - 5, 5, "_down") == 0) {
    f->down = true;
    base.resize(base.size() - 5);
  }
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : base) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  std::vector<std::pair<std::string, std::string>> fields;
  bool have_device = false;
  for (const auto& p : parts) {
    const auto eq = p.find('=');
    if (eq == std::string::npos || eq == 0) return false;
    std::string name = p.substr(0, eq), value = p.substr(eq + 1);
    if (name == "device_name") {
      f->device = value;
      have_device = true;
      continue;
    }
    if (!f->query_key.empty()) f->query_key += ",";
    f->query_key += p;
    if (name == "block_shape") value.erase(std::remove(value.begin(), value.end(), ' '), value.end());
    fields.emplace_back(name, value);
  }
  if (!have_device) return false;
  std::sort(fields.begin(), fields.end());
  for (const auto& [n, v] : fields) f->fields += (f->fields.empty() ? "" : ",") + n + "=" + v;
  bool has_e = false, has_n = false, has_k = false;
  for (const auto& [n, v] : fields) {
    has_e |= n == "E";
    has_n |= n == "N";
    has_k |= n == "K";
  }
  if (has_e)
    f->op = "triton_fused_moe";
  else if (has_n && has_k)
    f->op = "triton_gemm";
  else
    return false;
  return true;
}

// Content -> rows; false for foreign content (no batch-size keys).
bool parse_content(const fs::path& path, OracleFile* f) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE_MESSAGE(parser.load(path.string()).get(doc) == simdjson::SUCCESS, path.string());
  simdjson::dom::object obj;
  if (doc.get_object().get(obj) != simdjson::SUCCESS) return false;
  for (auto [k, v] : obj) {
    if (!all_digits(k)) continue;
    const int64_t m = std::stoll(std::string(k));
    f->all_keys.push_back(m);
    if (v.is_null()) {
      ++f->nulls;
      continue;
    }
    simdjson::dom::object r;
    REQUIRE_MESSAGE(v.get_object().get(r) == simdjson::SUCCESS, path.string(), " M=", m);
    Config c;
    bool warps = false, stages = false, block_m = false;
    for (auto [rk, rv] : r) {
      const std::string name(rk);
      warps |= name == "num_warps";
      stages |= name == "num_stages";
      block_m |= name == "BLOCK_SIZE_M";
      if (rv.is_bool())
        c.emplace_back(name, ConfigValue::boolean(rv.get_bool().value()));
      else if (rv.is_int64())
        c.emplace_back(name, ConfigValue::integer(rv.get_int64().value()));
      else if (rv.is_string())
        c.emplace_back(name, ConfigValue::string(std::string(rv.get_string().value())));
      else
        FAIL("the shared data holds only int/bool/string row values: ", path.string());
    }
    if (block_m && !warps) c.emplace_back("num_warps", ConfigValue::integer(4));
    if (block_m && !stages) c.emplace_back("num_stages", ConfigValue::integer(3));
    f->rows[m] = config_to_json(c);
  }
  return !f->all_keys.empty();
}

struct Expected {
  bool hit = false;
  int64_t m = -1;
  std::string config;
  std::string source;
  std::string key;
};

class Oracle {
 public:
  explicit Oracle(std::vector<OracleFile>& files) {
    for (auto& f : files)  // a file without usable rows never enters the table
      if (!f.foreign && !f.rows.empty()) groups_[f.group()].push_back(&f);
  }

  bool has_group(const std::string& g) const { return groups_.count(g) != 0; }

  // How many version folders hold the group's key (0 = only unversioned files).
  size_t folder_count(const std::string& g) const {
    std::set<std::vector<int>> vs;
    for (const OracleFile* f : groups_.at(g))
      if (f->versioned) vs.insert(f->version);
    return vs.size();
  }

  // The files whose rows serve group `g` under running version `v`.
  std::vector<const OracleFile*> choose(const std::string& g, const std::vector<int>& v) const {
    auto it = groups_.find(g);
    if (it == groups_.end()) return {};
    std::vector<const OracleFile*> versioned, plain, chosen;
    for (const OracleFile* f : it->second) (f->versioned ? versioned : plain).push_back(f);
    if (versioned.empty()) {
      chosen = plain;
    } else {
      std::vector<std::vector<int>> vs;
      for (const OracleFile* f : versioned) vs.push_back(f->version);
      std::sort(vs.begin(), vs.end(), [](const auto& a, const auto& b) { return vcmp(a, b) < 0; });
      std::vector<int> pick = vs.back();  // newest (V unset; or nothing at or below V)
      if (!v.empty()) {
        bool found = false;
        for (const auto& x : vs)
          if (vcmp(x, v) == 0) pick = x, found = true;
        if (!found)
          for (const auto& x : vs)  // ascending: the last one below V is the newest older
            if (vcmp(x, v) < 0) pick = x, found = true;
      }
      for (const OracleFile* f : versioned)
        if (vcmp(f->version, pick) == 0) chosen.push_back(f);
    }
    std::sort(chosen.begin(), chosen.end(), [](auto* a, auto* b) { return a->rel < b->rel; });
    return chosen;
  }

  Expected expect(const OracleFile& q, bool down, int64_t m, const std::vector<int>& v) const {
    Expected e;
    std::string g = q.op + "|" + q.device + "|" + q.fields;
    if (down && groups_.count(g + "|down")) g += "|down";
    const std::vector<const OracleFile*> chosen = choose(g, v);
    std::map<int64_t, std::pair<const std::string*, const OracleFile*>> merged;
    for (const OracleFile* f : chosen)
      for (const auto& [k, cfg] : f->rows) merged.emplace(k, std::make_pair(&cfg, f));
    if (merged.empty()) return e;
    // Nearest, ties to the smaller key: scan ascending, replace only when strictly nearer.
    int64_t best = -1, best_d = 0;
    for (const auto& [k, unused] : merged) {
      const int64_t d = k > m ? k - m : m - k;
      if (best < 0 || d < best_d) best = k, best_d = d;
    }
    e.hit = true;
    e.m = best;
    e.config = *merged[best].first;
    e.source = merged[best].second->rel;
    e.key = "triton/" + g.substr(0, g.find('|')) + "|" + g.substr(g.find('|') + 1);
    return e;
  }

 private:
  std::map<std::string, std::vector<const OracleFile*>> groups_;
};

std::vector<int64_t> query_points(const OracleFile& f) {
  std::set<int64_t> pts(f.all_keys.begin(), f.all_keys.end());
  std::vector<int64_t> sorted(pts.begin(), pts.end());
  for (size_t i = 0; i + 1 < sorted.size(); ++i) {
    const int64_t a = sorted[i], b = sorted[i + 1];
    pts.insert((a + b) / 2);      // floor of the midpoint (a tie when a + b is even)
    pts.insert((a + b + 1) / 2);  // ceil
  }
  pts.insert(1);
  pts.insert(sorted.back() + 1);
  pts.insert(sorted.back() * 3 + 7);
  return {pts.begin(), pts.end()};
}

}  // namespace

TEST_CASE("SGLang oracle: lookup over every shared SGLang file equals the brute-force oracle") {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path root = sglang_dir();
  std::vector<OracleFile> files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file() || e.path().extension() != ".json") continue;
    OracleFile f;
    f.rel = fs::relative(e.path(), root).generic_string();
    const std::string parent = e.path().parent_path().filename().string();
    f.versioned = folder_version(parent, &f.version);
    f.foreign = !parse_name(e.path().filename().string(), &f) || !parse_content(e.path(), &f);
    files.push_back(std::move(f));
  }
  // data/README.md: 381 shared files; 4 foreign ones at the top of fused_moe_triton/.
  REQUIRE(files.size() == 381);
  CHECK(std::count_if(files.begin(), files.end(), [](const OracleFile& f) { return f.foreign; }) == 4);
  Oracle oracle(files);

  // The load report, file by file.
  auto base_rt = make_runtime({root.string()});
  {
    const LoadReport rep = base_rt->load_report();
    CHECK(rep.files.size() == files.size());
    for (const auto& f : files) {
      CAPTURE(f.rel);
      const FileReport* r = find_file(rep, f.rel);
      REQUIRE(r != nullptr);
      if (f.foreign || f.rows.empty()) {
        CHECK(r->state == FileReport::State::skipped);
        CHECK(r->rows == 0);
        continue;
      }
      CHECK(r->state == (f.nulls ? FileReport::State::partial : FileReport::State::loaded));
      CHECK(r->rows == static_cast<int32_t>(f.rows.size()));
      CHECK(r->unknown_device == (kSglangDevices.count(f.device) == 0));
      if (f.device.empty()) CHECK(r->unknown_device);
    }
  }

  // Running versions: unset (= the newest folder), one with folders above
  // and below, one in the middle, one older than every folder. Under "unset"
  // every file is asked at every point; under the others, files whose key
  // lives in several folders (where the version decides) are asked at every
  // point, the others at two (their first key and above the max: the
  // selection cannot change their answer, and the points were all checked
  // already). Finally each file that no setting selected (an intermediate
  // folder) is asked under its own folder's version, so every file's rows
  // are checked at every point at least once.
  struct Setting {
    std::string version;
    std::vector<int> parsed;
  };
  std::vector<Setting> settings = {{"", {}}, {"3.5.1", {3, 5, 1}}, {"3.2.0", {3, 2, 0}}, {"3.0.0", {3, 0, 0}}};
  std::set<std::vector<int>> folders;
  for (const auto& f : files)
    if (f.versioned) folders.insert(f.version);
  CHECK(folders.size() == 8);  // triton_3_1_0 ... triton_3_7_1

  int64_t lookups = 0, hits = 0, down_fallbacks = 0, mismatches = 0, multi_folder = 0;
  std::set<std::string> fully_checked;  // files whose own rows served every point of theirs
  std::vector<std::string> first_mismatches;
  auto run = [&](const Runtime& rt, const Setting& s, const OracleFile& f, bool down, bool all_points) {
    std::vector<int64_t> pts = query_points(f);
    if (!all_points)
      pts = {pts.front(), f.all_keys.empty() ? 1 : *std::max_element(f.all_keys.begin(), f.all_keys.end()) + 1};
    for (int64_t m : pts) {
      const Expected e = oracle.expect(f, down, m, s.parsed);
      auto r = lookup(rt, query(f.query_key, f.device, m, down));
      ++lookups;
      std::string why;
      if (!r.ok()) {
        why = "error " + r.status().to_string();
      } else if (!e.hit) {
        if (r->match != LookupResult::Match::fallback) why = "expected a miss, got " + r->source;
      } else {
        const auto want = e.m == m ? LookupResult::Match::exact : LookupResult::Match::nearest;
        if (r->match != want || r->table_m != e.m || config_to_json(r->config) != e.config || r->source != e.source ||
            r->source_dir != root.string() || r->key != e.key)
          why = "expected M=" + std::to_string(e.m) + " " + e.config + " from " + e.source + " key " + e.key +
                "; got " + match_name(r->match) + " M=" + std::to_string(r->table_m) + " " + config_to_json(r->config) +
                " from " + r->source + " key " + r->key;
        ++hits;
        if (down && !f.down) ++down_fallbacks;
      }
      if (!why.empty() && ++mismatches <= 20)
        first_mismatches.push_back("V='" + s.version + "' " + f.rel + " down=" + (down ? "1" : "0") +
                                   " M=" + std::to_string(m) + ": " + why);
    }
    if (all_points && down == f.down) {
      const auto chosen = oracle.choose(f.group(), s.parsed);
      if (std::find(chosen.begin(), chosen.end(), &f) != chosen.end()) fully_checked.insert(f.rel);
    }
  };
  auto askable = [](const OracleFile& f) { return !f.foreign && !f.device.empty(); };  // "" asks for the host CPU
  for (const Setting& s : settings) {
    RuntimeOptions o = options_for({root.string()});
    o.backend_version = s.version;
    auto owned = s.parsed.empty() ? std::move(base_rt) : make_runtime(o);
    for (const auto& f : files) {
      if (!askable(f)) continue;
      const bool multi = oracle.folder_count(f.group()) > 1;
      multi_folder += multi && s.parsed.empty();
      run(*owned, s, f, f.down, s.parsed.empty() || multi);
      // An up table whose key has no _down table anywhere also answers a _down query.
      if (s.parsed.empty() && !f.down && f.op == "triton_fused_moe" && !oracle.has_group(f.group() + "|down"))
        run(*owned, s, f, true, true);
    }
  }
  CHECK(multi_folder == 30);  // 13 keys live in 2+ folders, 30 files in all
  std::set<std::vector<int>> extra;
  for (const auto& f : files)
    if (askable(f) && !fully_checked.count(f.rel)) {
      REQUIRE(f.versioned);
      extra.insert(f.version);
    }
  for (const auto& v : extra) {
    Setting s{"", v};
    for (int x : v) s.version += (s.version.empty() ? "" : ".") + std::to_string(x);
    RuntimeOptions o = options_for({root.string()});
    o.backend_version = s.version;
    auto rt = make_runtime(o);
    for (const auto& f : files)
      if (askable(f) && !fully_checked.count(f.rel) && vcmp(f.version, v) == 0) run(*rt, s, f, f.down, true);
  }
  for (const auto& msg : first_mismatches) MESSAGE(msg);
  CHECK(mismatches == 0);
  // Every query of an askable file is a hit (its own key always exists), and
  // every askable file's rows were checked at all of its points.
  CHECK(hits == lookups);
  CHECK(down_fallbacks > 0);
  for (const auto& f : files)
    if (askable(f) && !fully_checked.count(f.rel)) FAIL_CHECK("never fully checked: ", f.rel);
  CHECK(std::count_if(files.begin(), files.end(), askable) == 375);  // 381 - 4 foreign - 2 with device_name=
  MESSAGE("oracle: ", lookups, " lookups over ", files.size(), " files, ", settings.size() + extra.size(),
          " runtimes, ", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
}
