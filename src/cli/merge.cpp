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
//     config of the source listed first; --retime times every candidate
//     config on this machine (dispatch::time_configs: the tuner's scratch
//     operands, validation and harness) and keeps the fastest, a config
//     within --retime-margin of the fastest tying, ties to the smallest
//     config text; without either the table is refused and the conflicting
//     rows reported. Every conflict's candidates (source, config, us, and
//     under --retime the retimed us) are recorded in the output's metadata
//     ("merged"), with who retimed them ("merged"."retimed").
//   - --retime refuses a table it cannot time here: its backend has no
//     device on this machine, or device 0's name is not the file's, or a
//     candidate is not a plan this build runs on it (an unknown variant or
//     param value, supports() declining, a launch failure, an output that
//     differs from the reference's). Sources of another build (fingerprint)
//     are retimed when every candidate passes that: the check is the
//     configs', not the fingerprint's.
// Fragments: a source's <key>.json.d/<name>.json (written where flock is not
// honoured) are more sources of its table <key>.json, labelled
// "<SRC> (fragment <name>)"; for --prefer a source's main file comes first,
// then its fragments by name. --compact DIR merges DIR's fragments into their
// main files in place (compact_table says how that stays safe with writers
// running).
// Output: canonical, as the tuner writes a table (the metadata first, then
// the rows by ascending M, one per line), configs as their sources wrote
// them (minified), the metadata's maps sorted, no timestamps: without
// --prefer the output does not depend on the order of the sources (under
// --retime: but for the "retimed_us" measurements, as long as they pick the
// same configs); each file written atomically (temp file, fsync, rename).
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <simdjson.h>

#include "cli/cli.hpp"
#include "core/json_write.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"

namespace kdispatch_cli {
namespace {

namespace fs = std::filesystem;
namespace dom = simdjson::dom;

struct Candidate {
  size_t source = 0;   ///< index into the source list
  std::string config;  ///< minified JSON
  double us = 0, default_us = 0;
  /// The source dir as given, or for a fragment "<dir> (fragment <name>)":
  /// what reports and the metadata name. Within one source the main file's
  /// label sorts before its fragments', and the fragments' by name.
  std::string label;
};

struct Table {
  std::map<std::string, std::set<std::string>> fingerprints;  ///< minified fingerprint -> labels
  std::map<std::string, int64_t> schema;                     ///< variant -> schema version (union)
  std::map<int64_t, std::vector<Candidate>> rows;
  std::vector<std::string> problems;
  /// --compact: the bytes read of the main file ("" with has_main false)
  /// and of each fragment read (path, bytes).
  bool has_main = false;
  std::string main_bytes;
  std::vector<std::pair<fs::path, std::string>> fragments;
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

/// Reads one source file (a table file or a fragment of one, named `label`)
/// into its table; a problem text when it is not a table.
/// `*bytes` (optional) receives the bytes read.
std::string read_table(const fs::path& file, size_t source, const std::string& label, dom::parser& parser, Table* t,
                       std::string* bytes = nullptr) {
  simdjson::padded_string text;
  if (simdjson::padded_string::load(file.string()).get(text) != simdjson::SUCCESS) return "cannot read";
  if (bytes) bytes->assign(text.data(), text.size());
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
    Candidate c{source, simdjson::minify(v), 0, 0, label};
    if (has_us) c.us = number_at(us, k);
    if (has_dus) c.default_us = number_at(dus, k);
    t->rows[m].push_back(std::move(c));
    ++n;
  }
  if (n == 0) return "no rows (not a config table)";
  t->fingerprints[fp].insert(label);
  return {};
}

/// Writes `text` to out/rel atomically (temp file in the same dir, fsync,
/// rename, dir fsync). The temp file, ".<name>.merge.<pid>.<64 random
/// bits>", is created O_EXCL | O_NOFOLLOW: a name planted in a shared out
/// dir (a link, or a hard link to another file) is never opened, let alone
/// truncated.
std::string write_atomic(const fs::path& target, const std::string& text) {
  std::error_code ec;
  fs::create_directories(target.parent_path(), ec);
  if (ec) return "cannot create " + target.parent_path().string() + ": " + ec.message();
  fs::path tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    char rnd[17];
    std::snprintf(rnd, sizeof rnd, "%016llx", static_cast<unsigned long long>(
                                                  (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()));
    tmp = target.parent_path() /
          ("." + target.filename().string() + ".merge." + std::to_string(::getpid()) + "." + rnd);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return "cannot create " + tmp.string() + ": " + std::strerror(errno);
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

// ---- --retime

/// Rounds of time_configs per conflict (the configs in order, then reversed).
constexpr int kRetimeRounds = 2;

/// What --retime needs of a table: its op, key fields and device, from the
/// path <backend>/<op>/<fields>.json.
struct RetimeTable {
  dispatch::DeviceType backend = dispatch::DeviceType::cpu;
  std::string op, key_fields, device_name;
};

/// The table of `rel`, or why it cannot be retimed.
std::string retime_table_of(const std::string& rel, RetimeTable* t) {
  const fs::path p(rel);
  std::vector<std::string> parts;
  for (const fs::path& c : p) parts.push_back(c.string());
  if (parts.size() != 3 || p.extension() != ".json")
    return "not a table of an own op (<backend>/<op>/<key>.json): the key to time is unknown";
  auto backend = dispatch::parse_device_type(parts[0]);
  if (!backend.ok()) return "'" + parts[0] + "' is not a backend: " + backend.status().message();
  t->backend = *backend;
  bool known = false;
  for (const dispatch::OpInfo& op : dispatch::op_list()) known = known || op.name == parts[1];
  if (!known) return "'" + parts[1] + "' is not an op of this build";
  t->op = parts[1];
  const std::string stem = p.stem().string();
  size_t b = 0;
  while (b <= stem.size()) {
    size_t e = stem.find(',', b);
    if (e == std::string::npos) e = stem.size();
    const std::string_view f(stem.data() + b, e - b);
    if (f.substr(0, 12) == "device_name=") t->device_name = std::string(f.substr(12));
    else t->key_fields += (t->key_fields.empty() ? "" : ",") + std::string(f);
    b = e + 1;
  }
  if (t->device_name.empty()) return "the file name has no device_name";
  return {};
}

/// A minified config object -> a Config, or why not.
std::string config_of(dom::parser& parser, const std::string& text, dispatch::Config* out) {
  dom::object obj;
  if (parser.parse(text).get(obj) != simdjson::SUCCESS) return "not a JSON object";
  for (auto [k, v] : obj) {
    int64_t i = 0;
    bool b = false;
    std::string_view sv;
    if (v.get(i) == simdjson::SUCCESS) out->emplace_back(std::string(k), dispatch::ConfigValue::integer(i));
    else if (v.get(b) == simdjson::SUCCESS) out->emplace_back(std::string(k), dispatch::ConfigValue::boolean(b));
    else if (v.get(sv) == simdjson::SUCCESS)
      out->emplace_back(std::string(k), dispatch::ConfigValue::string(std::string(sv)));
    else return "the value of '" + std::string(k) + "' is not an integer, a boolean or a string";
  }
  return {};
}

std::string minified(dom::parser& parser, const std::string& json) {
  dom::element e;
  return parser.parse(json).get(e) == simdjson::SUCCESS ? std::string(simdjson::minify(e)) : json;
}

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  return ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string("?");
}

// ---- --compact

/// The whole file at `p`; false when it cannot be read (*missing: absent).
bool read_bytes(const fs::path& p, std::string* out, bool* missing) {
  *missing = false;
  out->clear();
  const int fd = ::open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *missing = errno == ENOENT;
    return false;
  }
  char buf[65536];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      return r == 0;
    }
    out->append(buf, static_cast<size_t>(r));
  }
}

void fsync_dir(const fs::path& dir) {
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

/// One compaction of a dir at a time: "<dir>/.kdispatch-compact.lock",
/// created O_EXCL (atomic on NFS and Lustre too, where flock may not be
/// honoured), holding "<pid> <host>"; one left by a dead process of this
/// host is taken over. "" when held, else why not.
std::string take_compact_lock(const fs::path& path) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
      const std::string body = std::to_string(::getpid()) + " " + host_name() + "\n";
      const bool ok = ::write(fd, body.data(), body.size()) == static_cast<ssize_t>(body.size());
      ::close(fd);
      if (ok) return {};
      ::unlink(path.c_str());
      return "cannot write " + path.string();
    }
    if (errno != EEXIST) return "cannot create " + path.string() + ": " + std::strerror(errno);
    std::string body;
    bool missing = false;
    if (!read_bytes(path, &body, &missing) && missing) continue;
    long pid = 0;
    char host[256] = {0};
    if (std::sscanf(body.c_str(), "%ld %255s", &pid, host) == 2 && host == host_name() && pid > 0 &&
        ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ::unlink(path.c_str());  // its compaction died
      continue;
    }
    return "another compaction holds " + path.string() + " (" + (body.empty() ? std::string("empty") : body.substr(0, body.find('\n'))) +
           "); if none runs, remove it";
  }
  return "cannot take " + path.string();
}

/// The flock writers' lock on a table file (store/private_fs.hpp's
/// protocol: ".<name>.lock" beside it, opened without following a link,
/// re-checked to be the file at that name after flock, removed by its
/// holder before unlocking): where flock works, a compaction never
/// overwrites rows such a writer merged in meanwhile.
class TableLock {
 public:
  ~TableLock() {
    if (fd_ < 0) return;
    ::unlink(path_.c_str());
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  std::string acquire(const fs::path& table) {
    path_ = table.parent_path() / ("." + table.filename().string() + ".lock");
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
      if (fd < 0) return "cannot open lock file " + path_.string() + ": " + std::strerror(errno);
      struct stat mine {}, now {};
      if (::fstat(fd, &mine) != 0 || !S_ISREG(mine.st_mode)) {
        ::close(fd);
        return "lock file " + path_.string() + " is not a regular file";
      }
      int r;
      while ((r = ::flock(fd, LOCK_EX)) != 0 && errno == EINTR) {
      }
      if (r != 0) {
        const int e = errno;
        ::close(fd);
        ::unlink(path_.c_str());
        if (e == ENOSYS || e == ENOLCK || e == EOPNOTSUPP) return {};  // no flock here: no flock writers either
        return "cannot lock " + path_.string() + ": " + std::strerror(e);
      }
      if (::lstat(path_.c_str(), &now) == 0 && now.st_dev == mine.st_dev && now.st_ino == mine.st_ino) {
        fd_ = fd;
        return {};
      }
      ::close(fd);
    }
    return "cannot lock " + path_.string() + ": it keeps being replaced";
  }

 private:
  fs::path path_;
  int fd_ = -1;
};

/// Compacts one table in place: its main file `main` becomes `text` (the
/// merge of the main file and the fragments as `t` read them), then each
/// fragment read is removed if it still holds the bytes that were merged.
/// A fragment's writer may have replaced it meanwhile: it is first renamed
/// to a hidden claim name (after which its writer makes a new one), and a
/// claim whose bytes differ is put back (linked to its old name when that
/// is free, else to "<name>.unmerged-<host>-<pid>.json"): nothing a writer
/// wrote is lost, and the next compaction takes it. "" or why the table was
/// left as it was; `*kept` counts fragments put back.
std::string compact_table(const fs::path& main, const Table& t, const std::string& text, int* kept) {
  *kept = 0;
  TableLock lock;
  if (std::string err = lock.acquire(main); !err.empty()) return err;
  std::string now;
  bool missing = false;
  if (!read_bytes(main, &now, &missing) && !missing) return "cannot read " + main.string();
  if (missing == t.has_main || now != t.main_bytes)
    return main.string() + " changed while it was read: left as it was; run the compaction again";
  if (std::string err = write_atomic(main, text); !err.empty()) return err;
  // Test-only: a writer rewriting a fragment between its read and its claim
  // (KDISPATCH_TEST_COMPACT_REPLACE=<file>: that file's bytes, as its writer
  // would put them there: temp file, rename).
  if (const char* with = std::getenv("KDISPATCH_TEST_COMPACT_REPLACE"); with && *with && !t.fragments.empty()) {
    std::string bytes;
    bool gone = false;
    if (read_bytes(with, &bytes, &gone)) (void)write_atomic(t.fragments.front().first, bytes);
  }
  std::set<fs::path> dirs;
  for (const auto& [frag, bytes] : t.fragments) {
    const fs::path claim = frag.parent_path() / ("." + frag.filename().string() + ".compacting-" + std::to_string(::getpid()));
    dirs.insert(frag.parent_path());
    if (::rename(frag.c_str(), claim.c_str()) != 0) continue;  // gone: nothing to remove
    std::string claimed;
    bool gone = false;
    if (read_bytes(claim, &claimed, &gone) && claimed == bytes) {
      ::unlink(claim.c_str());
      continue;
    }
    // Its writer replaced it after it was read: keep what it holds, under
    // its name when that is free (link never replaces), else under a name
    // only compactions make (and they run one at a time).
    ++*kept;
    if (::link(claim.c_str(), frag.c_str()) == 0) {
      ::unlink(claim.c_str());
      continue;
    }
    fs::path aside;
    struct stat st {};
    for (int i = 0; aside.empty() || ::lstat(aside.c_str(), &st) == 0; ++i)
      aside = frag.parent_path() / (frag.stem().string() + ".unmerged-" + host_name() + "-" +
                                    std::to_string(::getpid()) + (i ? "-" + std::to_string(i) : "") + ".json");
    if (::rename(claim.c_str(), aside.c_str()) != 0)
      return "cannot put back " + claim.string() + " as " + aside.string() + ": " + std::strerror(errno);
  }
  for (const fs::path& d : dirs) fsync_dir(d);
  return {};
}

}  // namespace

int run_merge(const MergeOptions& options) {
  const char* cmd = "kdispatch merge";
  MergeOptions o = options;
  const bool compact = !o.compact.empty();
  if (compact) {
    if (!o.sources.empty() || !o.out.empty()) {
      std::fprintf(stderr, "%s: --compact DIR merges DIR's fragments in place: no source dirs and no --out with it\n",
                   cmd);
      return kExitUsage;
    }
    o.sources = {o.compact};
  } else if (o.out.empty()) {
    std::fprintf(stderr, "%s: --out DIR is required (or --compact DIR)\n", cmd);
    return kExitUsage;
  }
  if (o.sources.empty()) {
    std::fprintf(stderr, "%s: no source dirs\n", cmd);
    return kExitUsage;
  }
  if (o.retime && o.prefer) {
    std::fprintf(stderr,
                 "%s: --retime and --prefer are two rules for the same conflicts: pass one (--prefer keeps the first "
                 "source's config, --retime the faster on this machine)\n",
                 cmd);
    return kExitUsage;
  }
  if (!o.retime && (o.retime_margin >= 0 || o.reps > 0 || o.no_cold_cache)) {
    std::fprintf(stderr, "%s: --retime-margin, --reps and --no-cold-cache time conflicts: they need --retime\n", cmd);
    return kExitUsage;
  }
  const double margin = o.retime_margin >= 0 ? o.retime_margin : kDefaultRetimeMargin;
  if (!(margin <= 10.0)) {
    std::fprintf(stderr, "%s: --retime-margin must be in [0, 10], got %g\n", cmd, o.retime_margin);
    return kExitUsage;
  }
  // --retime's runtime: created at the first conflict (a merge without one
  // times nothing), never loading or persisting configs.
  std::unique_ptr<dispatch::Runtime> timing_rt;
  std::string timing_rt_error;
  const auto timing_runtime = [&]() -> dispatch::Runtime* {
    if (timing_rt || !timing_rt_error.empty()) return timing_rt.get();
    dispatch::RuntimeOptions ro;
    ro.load_shipped_configs = false;
    ro.tune.mode = dispatch::TuneMode::off;
    ro.tune.persist = false;
    ro.tune.load_cache = false;
    if (o.reps > 0) ro.tune.reps = o.reps;
    if (o.no_cold_cache) ro.tune.cold_cache = false;
    auto rt = dispatch::Runtime::create(ro);
    if (!rt.ok()) timing_rt_error = rt.status().to_string();
    else timing_rt = std::move(*rt);
    return timing_rt.get();
  };
  std::error_code ec;
  const fs::path out_abs = compact ? fs::path() : fs::weakly_canonical(fs::absolute(o.out, ec), ec);
  for (const std::string& s : o.sources) {
    if (!fs::is_directory(s, ec)) {
      std::fprintf(stderr, "%s: source '%s' is not a directory\n", cmd, s.c_str());
      return kExitUsage;
    }
    if (compact) continue;
    // --out below a source would be read back as part of it on the next run.
    const fs::path src_abs = fs::weakly_canonical(fs::absolute(s, ec), ec);
    const auto rel = out_abs.lexically_relative(src_abs);
    if (!rel.empty() && *rel.begin() != ".." && rel != ".") {
      std::fprintf(stderr, "%s: --out %s is inside the source %s: choose a dir outside every source\n", cmd,
                   o.out.c_str(), s.c_str());
      return kExitUsage;
    }
  }
  // --compact: one compaction of the dir at a time (released on return).
  struct CompactLock {
    fs::path path;
    ~CompactLock() {
      if (!path.empty()) ::unlink(path.c_str());
    }
  } compact_lock;
  if (compact) {
    const fs::path lock = fs::path(o.compact) / ".kdispatch-compact.lock";
    if (std::string why = take_compact_lock(lock); !why.empty()) {
      std::fprintf(stderr, "%s: --compact %s: %s\n", cmd, o.compact.c_str(), why.c_str());
      return kExitFailure;
    }
    compact_lock.path = lock;
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
      // A fragment <key>.json.d/<name>.json (written where flock is not
      // honoured) is part of the table <key>.json.
      std::string table = rel, label = o.sources[si];
      const std::string folder = p.parent_path().filename().string();
      const bool fragment = folder.size() > 7 && folder.compare(folder.size() - 7, 7, ".json.d") == 0;
      if (fragment) {
        table = fs::relative(p.parent_path(), root).generic_string();
        table.resize(table.size() - 2);
        label += " (fragment " + p.filename().string() + ")";
      }
      Table& t = tables[table];
      std::string bytes;
      if (std::string why = read_table(p, si, label, parser, &t, compact ? &bytes : nullptr); !why.empty()) {
        unreadable.push_back(o.sources[si] + "/" + rel + ": " + why);
      } else if (compact && fragment) {
        t.fragments.emplace_back(p, std::move(bytes));
      } else if (compact) {
        t.has_main = true;
        t.main_bytes = std::move(bytes);
      }
    }
  }
  std::sort(unreadable.begin(), unreadable.end());
  // ---- merge table by table
  int written = 0, refused = 0, rows_out = 0, conflicts_total = 0, fragments_merged = 0, fragments_kept = 0;
  std::vector<std::string> report;
  for (auto& [rel, t] : tables) {
    if (t.rows.empty()) continue;
    if (compact && t.fragments.empty()) continue;  // a table without fragments stays as it is
    if (t.fingerprints.size() == 1 && t.fingerprints.begin()->first.front() == '(') {
      report.push_back(rel + ": refused: not written by kdispatch (no fingerprint); merge combines tuned tables");
      ++refused;
      continue;
    }
    if (t.fingerprints.size() > 1) {
      std::string why = rel + ": refused: the sources were tuned by different builds or devices (fingerprints:";
      for (const auto& [fp, labels] : t.fingerprints) {
        why += " [";
        for (const std::string& l : labels) why += (why.back() == '[' ? "" : ", ") + l;
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
    // --retime: the table's op, key and device, checked at its first conflict.
    RetimeTable rtab;
    std::string retime_refusal;  // why this table cannot be retimed (refused)
    bool retime_checked = false;
    std::string timing_fingerprint;  // this build's, on the table's backend (minified)
    dom::parser cfg_parser;
    const std::string& source_fp = t.fingerprints.begin()->first;
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
        return c->label < b->label;
      };
      const auto sources_of = [&](const std::string& config) {
        std::set<std::string> names;  // sorted: the same text for any order of the sources
        for (const Candidate* c : by_config[config]) names.insert(c->label);
        std::string text;
        for (const std::string& n : names) text += (text.empty() ? "" : ", ") + n;
        return text;
      };
      std::map<std::string, double> retimed;  // config -> retimed us
      if (by_config.size() == 1) {
        for (const Candidate* c : by_config.begin()->second)
          if (!pick || better(c, pick)) pick = c;
      } else {
        ++n_conflicts;
        if (o.prefer) {
          for (const Candidate& c : cands)
            if (!pick || c.source < pick->source || (c.source == pick->source && c.label < pick->label)) pick = &c;
        } else if (o.retime) {
          if (!retime_checked) {
            retime_checked = true;
            retime_refusal = retime_table_of(rel, &rtab);
            dispatch::Runtime* rt = retime_refusal.empty() ? timing_runtime() : nullptr;
            if (retime_refusal.empty() && !rt)
              retime_refusal = "cannot create a runtime to time on: " + timing_rt_error;
            if (rt) {
              auto di = rt->device_info(dispatch::Device{rtab.backend, 0});
              const std::string bname(dispatch::device_type_name(rtab.backend));
              if (!di.ok() || !di->available)
                retime_refusal = "--retime times this " + bname + " table's conflicting rows on a " + bname +
                                 " device, and this machine has none (" +
                                 (di.ok() ? di->unavailable_reason : di.status().message()) + ")";
              else if (di->device_name != rtab.device_name)
                retime_refusal = "the table is for the device " + rtab.device_name + ", this machine's " + bname +
                                 " device 0 is " + di->device_name +
                                 ": timing here would not measure the device the table serves";
            }
          }
          std::string why = retime_refusal;
          if (why.empty()) {
            std::vector<dispatch::Config> configs;
            for (const auto& [config, srcs] : by_config) {
              dispatch::Config c;
              if (std::string bad = config_of(cfg_parser, config, &c); !bad.empty()) {
                why = "cannot time M=" + std::to_string(m) + "'s config " + config + " (from " + sources_of(config) +
                      "): " + bad;
                break;
              }
              configs.push_back(std::move(c));
            }
            if (why.empty()) {
              auto r = dispatch::time_configs(*timing_rt, rtab.op, rtab.key_fields, m, configs,
                                              dispatch::Device{rtab.backend, 0}, kRetimeRounds);
              if (!r.ok()) {
                why = "cannot time M=" + std::to_string(m) + ": " + r.status().to_string();
              } else {
                if (timing_fingerprint.empty() && !r->fingerprint.empty())
                  timing_fingerprint = minified(cfg_parser, r->fingerprint);
                size_t i = 0;
                for (const auto& [config, srcs] : by_config) {
                  const dispatch::ConfigTiming& ct = r->configs[i++];
                  if (!ct.status.ok() && why.empty())
                    why = "cannot time M=" + std::to_string(m) + "'s config " + config + " (from " +
                          sources_of(config) + ") with this build: " + ct.status.to_string() +
                          (timing_fingerprint != source_fp
                               ? " (the sources were tuned by another build or environment: this build's "
                                 "fingerprint is " +
                                     (timing_fingerprint.empty() ? std::string("unknown") : timing_fingerprint) + ")"
                               : "");
                  retimed[config] = ct.us;
                }
              }
            }
          }
          if (!why.empty()) {
            if (retime_refusal.empty()) retime_refusal = why;
          } else {
            // The fastest; a config within the margin of it ties, and the
            // smallest config text among the tied is kept (by_config's order).
            double best = 1e300;
            for (const auto& [config, us] : retimed) best = std::min(best, us);
            std::string chosen;
            for (const auto& [config, us] : retimed)
              if (us <= best * (1.0 + margin)) {
                chosen = config;
                break;
              }
            for (const Candidate* c : by_config[chosen])
              if (!pick || better(c, pick)) pick = c;
            std::string line = rel + ": M=" + std::to_string(m) + " retimed:";
            for (const auto& [config, us] : retimed)
            {
              char num[32];
              std::snprintf(num, sizeof num, "%.3f", us);
              line += " " + config + " " + num + " us" + (config == chosen ? " (kept)" : "") + ";";
            }
            line.pop_back();
            report.push_back(line);
          }
        } else {
          unresolved.push_back("M=" + std::to_string(m));
        }
        // Every candidate, sorted by config then source name (canonical).
        std::vector<const Candidate*> all;
        for (const Candidate& c : cands) all.push_back(&c);
        std::sort(all.begin(), all.end(), [&](const Candidate* a, const Candidate* b) {
          return a->config != b->config ? a->config < b->config : a->label < b->label;
        });
        conflicts.key(std::to_string(m)).begin_object();
        if (pick) conflicts.field("kept", pick->label).field("by", o.prefer ? "prefer" : "retime");
        conflicts.key("candidates").begin_array();
        for (const Candidate* c : all) {
          conflicts.begin_object().field("source", c->label).key("config").json(c->config);
          if (c->us > 0) conflicts.field("us", std::round(c->us * 1000.0) / 1000.0);
          if (pick && o.retime) conflicts.field("retimed_us", std::round(retimed[c->config] * 1000.0) / 1000.0);
          conflicts.end_object();
        }
        conflicts.end_array().end_object();
      }
      if (pick) kept.emplace_back(m, pick);
    }
    conflicts.end_object();
    if (!retime_refusal.empty()) {
      report.push_back(rel + ": refused: " + retime_refusal);
      ++refused;
      continue;
    }
    if (!unresolved.empty()) {
      std::string why = rel + ": refused: different configs for the same M (";
      for (size_t i = 0; i < unresolved.size(); ++i) why += (i ? ", " : "") + unresolved[i];
      report.push_back(why + "): pass --prefer to keep the first source's, or --retime to time them here");
      ++refused;
      continue;
    }
    // ---- the canonical table
    dispatch::core::JsonWriter w;
    w.begin_object().field("tool", std::string("kdispatch ") + dispatch::version()).key("schema").begin_object();
    for (const auto& [variant, ver] : t.schema) w.field(variant, ver);
    w.end_object().key("fingerprint").json(source_fp);
    for (const char* field : {"us", "default_us"}) {
      w.key(field).begin_object();
      for (const auto& [m, c] : kept) {
        const double v = std::string_view(field) == "us" ? c->us : c->default_us;
        if (v > 0) w.field(std::to_string(m), std::round(v * 1000.0) / 1000.0);
      }
      w.end_object();
    }
    w.key("merged").begin_object().field("sources", static_cast<int64_t>(o.sources.size()));
    if (o.retime && n_conflicts) {
      // Who timed the "retimed_us" of the conflicts: this host, device and build.
      w.key("retimed").begin_object();
      w.field("host", host_name())
          .field("device", std::string(dispatch::device_type_name(rtab.backend)) + ":0")
          .field("device_name", rtab.device_name)
          .field("tool", std::string("kdispatch ") + dispatch::version());
      w.key("fingerprint").json(timing_fingerprint.empty() ? std::string("null") : timing_fingerprint);
      w.field("same_fingerprint", timing_fingerprint == source_fp)
          .field("rounds", static_cast<int64_t>(kRetimeRounds))
          .field("reps", static_cast<int64_t>(timing_rt->options().tune.reps))
          .field("cold_cache", timing_rt->options().tune.cold_cache)
          .field("margin", margin);
      w.end_object();
    }
    if (n_conflicts) w.key("conflicts").json(conflicts.take());
    w.end_object().end_object();
    std::string text = "{\n    \"kdispatch\": " + w.take();
    for (const auto& [m, c] : kept) text += ",\n    \"" + std::to_string(m) + "\": " + c->config;
    text += "\n}\n";
    if (compact) {
      int kept_back = 0;
      if (std::string err = compact_table(fs::path(o.compact) / rel, t, text, &kept_back); !err.empty()) {
        report.push_back(rel + ": refused: " + err);
        ++refused;
        continue;
      }
      fragments_merged += static_cast<int>(t.fragments.size()) - kept_back;
      fragments_kept += kept_back;
      if (kept_back)
        report.push_back(rel + ": " + std::to_string(kept_back) +
                         " fragment(s) were rewritten by their writer while compacting: kept (their earlier rows are "
                         "merged); run the compaction again");
    } else if (std::string err = write_atomic(fs::path(o.out) / rel, text); !err.empty()) {
      report.push_back(rel + ": " + err);
      ++refused;
      continue;
    }
    ++written;
    rows_out += static_cast<int>(kept.size());
    conflicts_total += n_conflicts;
    if (n_conflicts)
      report.push_back(rel + ": " + std::to_string(n_conflicts) + " conflicting M resolved by " +
                       (o.prefer ? "--prefer" : "--retime"));
  }
  for (const std::string& u : unreadable) std::fprintf(stderr, "%s: skipped %s\n", cmd, u.c_str());
  for (const std::string& r : report) std::fprintf(stderr, "%s: %s\n", cmd, r.c_str());
  if (compact)
    std::printf("%d table(s) compacted in %s (%d rows, %d conflicts resolved, %d fragment(s) merged and removed, %d "
                "kept), %d refused, %zu file(s) skipped\n",
                written, o.compact.c_str(), rows_out, conflicts_total, fragments_merged, fragments_kept, refused,
                unreadable.size());
  else
    std::printf("%d table(s) written to %s (%d rows, %d conflicts resolved), %d refused, %zu file(s) skipped\n",
                written, o.out.c_str(), rows_out, conflicts_total, refused, unreadable.size());
  return refused > 0 || !unreadable.empty() ? kExitFailure : kExitOk;
}

}  // namespace kdispatch_cli
