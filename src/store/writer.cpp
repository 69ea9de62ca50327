// SPDX-License-Identifier: Apache-2.0
#include "store/writer.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <simdjson.h>

#include "core/json_write.hpp"
#include "store/bounded_read.hpp"
#include "store/json_file.hpp"
#include "store/limits.hpp"
#include "store/fragment_claims.hpp"
#include "store/private_fs.hpp"
#include "store/write_all.hpp"

namespace dispatch::store {
namespace fs = std::filesystem;
namespace {

std::string errno_text() { return std::strerror(errno); }

Status io_error(const std::string& what, const std::string& path) {
  return make_status(StatusCode::io_error, what + " '" + path + "': " + errno_text());
}

// Reads the metadata numbers map "us"/"default_us" from our metadata object.
std::map<int64_t, double> read_us_map(std::string_view meta, const char* field) {
  std::map<int64_t, double> out;
  for_each_meta_member(meta, field, [&](std::string_view k, auto value) {
    double v = 0;
    if (value.get_double().get(v)) return false;
    out[std::atoll(std::string(k).c_str())] = v;
    return true;
  });
  return out;
}

std::string claim_path(const std::string& dir, const std::string& key, int64_t m) {
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(key.data(), key.size())));
  return dir + "/.claims/" + hex + "-M" + std::to_string(m) + ".claim";
}

}  // namespace

void config_json(core::JsonWriter& w, const Config& c) {
  w.begin_object();
  for (const auto& [k, v] : c) {
    w.key(k);
    switch (v.kind) {
      case ConfigValue::Kind::integer: w.value(v.i); break;
      case ConfigValue::Kind::boolean: w.value(v.i != 0); break;
      case ConfigValue::Kind::string: w.value(v.s); break;
    }
  }
  w.end_object();
}

std::string default_cache_dir() {
  const CacheDirChoice c = resolve_cache_dir("");
  return c.refused.empty() ? c.dir : std::string();
}

std::string render_table(const std::vector<PersistRow>& rows_in, const Fingerprint& fp,
                         const std::vector<std::pair<std::string, int32_t>>& schema) {
  std::vector<const PersistRow*> rows;
  for (const auto& r : rows_in) rows.push_back(&r);
  std::sort(rows.begin(), rows.end(), [](const PersistRow* a, const PersistRow* b) { return a->m < b->m; });
  // One member per line, four spaces in: the metadata object first, then
  // the rows by ascending M (a diff of two tunings is a diff of rows).
  core::JsonWriter w;
  w.begin_object().field("tool", std::string("kdispatch ") + KDISPATCH_VERSION_STRING).key("schema").begin_object();
  for (const auto& [variant, version] : schema) w.field(variant, static_cast<int64_t>(version));
  w.end_object().key("fingerprint").json(fp.to_json());
  for (const char* field : {"us", "default_us"}) {
    w.key(field).begin_object();
    for (const PersistRow* r : rows) {
      const double v = std::string_view(field) == "us" ? r->us : r->default_us;
      if (v > 0) w.field(std::to_string(r->m), std::round(v * 1000.0) / 1000.0);
    }
    w.end_object();
  }
  std::vector<std::pair<int64_t, const RowMeta*>> metas;
  metas.reserve(rows.size());
  for (const PersistRow* r : rows) metas.emplace_back(r->m, &r->meta);
  write_row_meta(w, metas);
  w.end_object();
  std::string s = "{\n    \"kdispatch\": " + w.take();
  for (const PersistRow* r : rows) {
    config_json(w, r->config);
    s += ",\n    \"" + std::to_string(r->m) + "\": " + w.take();
  }
  return s + "\n}\n";
}

namespace {

std::string corrupt_name(int dir_fd, const std::string& name);

// Reads the regular file `name` in an open dir through the one bounded
// reader (store/bounded_read.hpp): without following a link, without
// blocking on a FIFO, and never more than limits().max_file_bytes (what the
// loader reads). *missing = true when nothing is there. A file over the
// limit is not read: it is moved aside to "<name>.corrupt-<UTC time>" (kept
// whole, never overwritten; the loader refuses it too, so its rows were not
// serving), a note says so, and *missing = true: the new rows are written
// to a fresh file. Nothing is lost.
Status read_target(int dir_fd, const std::string& name, const std::string& shown, std::string* data, bool* missing,
                   std::vector<std::string>* notes) {
  *missing = false;
  BoundedRead opt;
  opt.limit = limits().max_file_bytes;
  opt.nofollow = true;
  opt.shown = shown;
  opt.limit_name = "the limit for one config file (docs/config-files.md#limits)";
  std::string why;
  switch (read_bounded_at(dir_fd, name, data, opt, &why)) {
    case ReadError::ok: return Status();
    case ReadError::missing: *missing = true; return Status();
    case ReadError::symlink:
      return make_status(StatusCode::io_error, "'" + shown +
                                                   "' is a symbolic link: tuning results are not written "
                                                   "through it (replace it with a regular file or remove it)");
    case ReadError::not_regular:
      return make_status(StatusCode::io_error, "'" + shown +
                                                   "' is not a regular file: tuning results are not written "
                                                   "over it");
    case ReadError::too_large: {
      const std::string aside = corrupt_name(dir_fd, name);
      if (::renameat(dir_fd, name.c_str(), dir_fd, aside.c_str()) != 0) return io_error("cannot move aside", shown);
      if (notes)
        notes->push_back(why + "; moved aside to '" + (fs::path(shown).parent_path() / aside).string() +
                         "' and started afresh (the loader does not read it either)");
      *missing = true;
      return Status();
    }
    case ReadError::io: break;
  }
  return make_status(StatusCode::io_error, why);
}

// "<name>.corrupt-<UTC time>", made unique in the dir.
std::string corrupt_name(int dir_fd, const std::string& name) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  const std::string base = name + ".corrupt-" + stamp;
  std::string out = base;
  struct stat st {};
  for (int i = 1; ::fstatat(dir_fd, out.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0; ++i)
    out = base + "-" + std::to_string(i);
  return out;
}

// With the lock on <name> held, every temp file of <name> is a dead
// writer's: remove them.
void remove_dead_temps(int dir_fd, const std::string& name) {
  const std::string prefix = temp_prefix_for(name);
  remove_entries_if(dir_fd, [&](const std::string& n) { return n.compare(0, prefix.size(), prefix) == 0; });
}

// In a fragment dir, every file is written by one process: a temp file of
// a dead writer of this host (dead_local_temp) is removed.
void remove_dead_fragment_temps(int dir_fd) { remove_entries_if(dir_fd, &dead_local_temp); }

// Fragment writes of this process: one at a time (two threads merging into
// one fragment would lose rows; no lock file is used under that scheme).
std::mutex g_fragment_mu;

// The rows of a parsed table into *merged (replacing those of equal M),
// unless its fingerprint differs from `fp` and !keep_stale (then
// *dropped_stale is set).
void add_table_rows(ParsedFile& pf, const Fingerprint& fp, bool keep_stale, std::map<int64_t, PersistRow>* merged,
                    bool* dropped_stale) {
  std::string meta;
  for (const auto& [k, v] : pf.metadata)
    if (k == "kdispatch") meta = v;
  if (!keep_stale && !fingerprint_mismatch(parse_fingerprint(meta), fp).empty()) {
    if (dropped_stale) *dropped_stale = true;
    return;
  }
  const auto us = read_us_map(meta, "us");
  const auto dus = read_us_map(meta, "default_us");
  RowMetaIndex metas;  // the rows' records (margin, A/A spread, timing, why, cpu): carried over
  if (!meta.empty()) {
    simdjson::dom::parser parser;
    simdjson::dom::element kd;
    if (parser.parse(meta).get(kd) == simdjson::SUCCESS && kd.is_object()) metas = read_row_meta(kd);
  }
  for (auto& row : pf.rows) {
    PersistRow pr;
    pr.m = row.m;
    pr.config = pf.config(row);
    if (auto it = us.find(row.m); it != us.end()) pr.us = it->second;
    if (auto it = dus.find(row.m); it != dus.end()) pr.default_us = it->second;
    pr.meta = metas.at(row.m);
    (*merged)[row.m] = std::move(pr);
  }
}

// A compaction killed between claiming a fragment and putting it back left
// its claim (store/fragment_claims.hpp). Every claim in this fragment dir
// of a compaction of this host that is gone (its pid names no process, or
// the claim is older than kClaimStaleSeconds whatever its pid says; a
// regular file only) is recovered: another fragment's is put back (or aside); one of our own
// fragment `name` has its rows merged into *merged (this write's file and
// rows then win on the same M) and is returned, to be removed once this
// write is on disk. A claim that is not a table is moved aside to
// "<name>.corrupt-<UTC time>" (not read, not lost) with a note.
std::vector<std::string> merge_own_claims(int pfd, const std::string& name, const fs::path& shown_dir,
                                          const Fingerprint& fp, bool keep_stale, std::map<int64_t, PersistRow>* merged,
                                          bool* dropped_stale, std::vector<std::string>* notes) {
  std::vector<std::string> own;
  for (const RecoveredClaim& r : recover_dead_claims(pfd, name)) {
    if (!r.own) continue;  // another fragment's claim: put back or aside
    BoundedRead opt;
    opt.limit = limits().max_file_bytes;
    opt.nofollow = true;
    opt.padding = json_padding();
    std::string data, why;
    if (read_bounded_at(pfd, r.claim, &data, opt, &why) != ReadError::ok) continue;  // left for a compaction
    ParsedFile pf = parse_config_json(data.data(), data.size() - opt.padding);
    if (pf.kind != ParsedFile::Kind::table) {
      const std::string aside = corrupt_name(pfd, name);
      if (::renameat(pfd, r.claim.c_str(), pfd, aside.c_str()) == 0 && notes)
        notes->push_back("'" + (shown_dir / r.claim).string() +
                         "' (a claim of a compaction that died) did not parse "
                         "as a config table; moved aside to '" +
                         (shown_dir / aside).string() + "'");
      continue;
    }
    add_table_rows(pf, fp, keep_stale, merged, dropped_stale);
    own.push_back(r.claim);
  }
  return own;
}

}  // namespace

Status persist_rows(const std::string& dir, const std::string& rel_path, const std::vector<PersistRow>& rows,
                    const Fingerprint& fp, const std::vector<std::pair<std::string, int32_t>>& schema,
                    bool* dropped_stale, bool keep_stale, std::vector<std::string>* notes) noexcept {
  try {
    if (dropped_stale) *dropped_stale = false;
    LockingScheme scheme;
    if (Status s = locking_scheme(dir, &scheme); !s.ok()) return s;
    // flock: <rel_path> itself, merged under its lock. Fragments: this
    // process's own <rel_path>.d/<host>-<pid>.json, which nobody else writes.
    fs::path rel_dir = fs::path(rel_path).parent_path();
    std::string name = fs::path(rel_path).filename().string();
    if (scheme.fragments) {
      rel_dir /= fragment_dir_for(name);
      name = fragment_name();
    }
    const fs::path target = fs::path(dir) / rel_dir / name;
    const std::string shown = target.string();
    DirFd parent;
    if (Status s = open_dir_below(dir, rel_dir.string(), &parent); !s.ok()) return s;
    const int pfd = parent.get();

    FileLock lock;
    std::unique_lock<std::mutex> fragment_lock;
    if (scheme.fragments) {
      fragment_lock = std::unique_lock<std::mutex>(g_fragment_mu);
      remove_dead_temps(pfd, name);  // ours, or of a dead process that had our pid
      remove_dead_fragment_temps(pfd);
    } else {
      if (Status s = FileLock::acquire(pfd, "." + name + ".lock",
                                       (target.parent_path() / ("." + name + ".lock")).string(), &lock);
          !s.ok())
        return s;
      remove_dead_temps(pfd, name);
    }
    remove_dead_claims(dir);

    // Re-read the current file (under the lock, or our own fragment) and merge.
    std::map<int64_t, PersistRow> merged;
    // A killed compaction's claims of our own fragment: their rows first.
    const std::vector<std::string> own_claims =
        scheme.fragments
            ? merge_own_claims(pfd, name, target.parent_path(), fp, keep_stale, &merged, dropped_stale, notes)
            : std::vector<std::string>();
    {
      std::string data;
      bool missing = false;
      if (Status s = read_target(pfd, name, shown, &data, &missing, notes); !s.ok()) return s;
      if (!missing) {
        const size_t len = data.size();
        data.append(json_padding(), '\0');
        ParsedFile pf = parse_config_json(data.data(), len);
        if (pf.kind == ParsedFile::Kind::table) {
          add_table_rows(pf, fp, keep_stale, &merged, dropped_stale);
        } else {
          // Not a table we can merge into: keep it, aside, and say so.
          const std::string aside = corrupt_name(pfd, name);
          if (::renameat(pfd, name.c_str(), pfd, aside.c_str()) != 0) return io_error("cannot move aside", shown);
          if (notes)
            notes->push_back("'" + shown + "' did not parse as a config table (" +
                             (pf.problems.empty() ? std::string("unknown layout") : pf.problems[0]) +
                             "); moved aside to '" + (target.parent_path() / aside).string() + "' and started afresh");
        }
      }
    }
    for (const auto& r : rows) merged[r.m] = r;
    std::vector<PersistRow> all;
    for (auto& [m, r] : merged) all.push_back(std::move(r));
    const std::string text = render_table(all, fp, schema);

    const std::string tmp = temp_name_for(name);
    const std::string tmp_shown = (target.parent_path() / tmp).string();
    const int fd = ::openat(pfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return io_error("cannot create", tmp_shown);
    if (!write_all(fd, text) || ::fsync(fd) != 0) {
      Status s = io_error("cannot write", tmp_shown);
      ::close(fd);
      ::unlinkat(pfd, tmp.c_str(), 0);
      return s;
    }
    ::close(fd);
    if (::renameat(pfd, tmp.c_str(), pfd, name.c_str()) != 0) {
      Status s = io_error("cannot rename into", shown);
      ::unlinkat(pfd, tmp.c_str(), 0);
      return s;
    }
    ::fsync(pfd);
    for (const std::string& c : own_claims) ::unlinkat(pfd, c.c_str(), 0);  // their rows are in the file now
    if (!own_claims.empty()) ::fsync(pfd);
    return Status();
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "persisting tuning results");
  } catch (const std::exception& e) {
    return make_status(StatusCode::io_error, std::string("persisting tuning results: ") + e.what());
  }
}

namespace {

// The owner of a claim file: "<pid> <host>". True when it names a process
// of this host that no longer exists.
bool claim_owner_dead(const std::string& path, const std::string& host) {
  const int rfd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (rfd < 0) return false;
  char buf[512] = {0};
  const ssize_t r = ::read(rfd, buf, sizeof buf - 1);
  ::close(rfd);
  if (r <= 0) return false;
  long pid = 0;
  char owner[256] = {0};
  return std::sscanf(buf, "%ld %255s", &pid, owner) == 2 && host == owner && pid > 0 &&
         ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

}  // namespace

void remove_dead_claims(const std::string& dir) noexcept {
  try {
    const std::string host = host_name();
    std::error_code ec;
    for (auto it = fs::directory_iterator(fs::path(dir) / ".claims", ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      if (it->path().extension() == ".claim" && claim_owner_dead(it->path().string(), host))
        ::unlink(it->path().c_str());
    }
  } catch (...) {
  }
}

bool try_claim(const std::string& dir, const std::string& key, int64_t m, double ttl_s) noexcept {
  try {
    if (!make_private_dirs((fs::path(dir) / ".claims").string()).ok()) return false;
    const std::string path = claim_path(dir, key, m);
    const std::string host = host_name();
    for (int attempt = 0; attempt < 2; ++attempt) {
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd >= 0) {
        const std::string body = std::to_string(::getpid()) + " " + host + "\n" + key + "\n";
        write_all(fd, body);
        ::close(fd);
        return true;
      }
      if (errno != EEXIST) return false;
      // Held: take it over when it is older than the TTL or its owner (on
      // this host) is gone.
      struct stat st {};
      if (::lstat(path.c_str(), &st) != 0) continue;
      const double age = static_cast<double>(::time(nullptr) - st.st_mtime);
      if (!S_ISREG(st.st_mode) || age > ttl_s || claim_owner_dead(path, host)) {
        ::unlink(path.c_str());
        continue;
      }
      return false;
    }
    return false;
  } catch (...) {
    return false;
  }
}

void release_claim(const std::string& dir, const std::string& key, int64_t m) noexcept {
  try {
    ::unlink(claim_path(dir, key, m).c_str());
  } catch (...) {
  }
}

}  // namespace dispatch::store
