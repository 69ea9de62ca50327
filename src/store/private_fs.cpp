// SPDX-License-Identifier: Apache-2.0
#include "store/private_fs.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <map>
#include <mutex>
#include <vector>

namespace dispatch::store {
namespace fs = std::filesystem;
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

std::string mode_text(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

// The ancestor rule (OpenSSH's safe_path): an ancestor `a` of the cache dir
// is safe when nobody but this uid or root can rename or replace entries in
// it: owned by root or this uid, and not group/world-writable, except a
// sticky dir (/tmp: others may create entries, never rename or remove ours)
// whose next component on the path, `next`, is this uid's. `next` absent
// (this process creates it, 0700) passes, and so does the cache dir itself
// when it is a directory, not a link (its own rule judges it, and admits a
// dir shared with a group of ours); a link there of another uid's is
// refused (its owner may point it anywhere). An absent `a` passes (this
// process creates it, 0700). `shown`: how the message names `a`.
std::string ancestor_problem(const std::string& a, const std::string& next, bool next_is_dir,
                             const std::string& shown) {
  struct stat st {};
  if (::stat(a.c_str(), &st) != 0) return "";  // absent: made by this process, 0700
  const uid_t me = ::geteuid();
  if (!S_ISDIR(st.st_mode)) return shown + " is not a directory";
  if (st.st_uid != me && st.st_uid != 0)
    return shown + " is owned by uid " + std::to_string(st.st_uid) + ", not by this process (uid " +
           std::to_string(me) + ") or root";
  if (!(st.st_mode & (S_IWGRP | S_IWOTH))) return "";
  if (!(st.st_mode & S_ISVTX))
    return shown + " is group/world-writable (mode " + mode_text(st.st_mode) + ") without the sticky bit";
  struct stat ns {};
  if (::lstat(next.c_str(), &ns) == 0 && ns.st_uid != me && (!next_is_dir || S_ISLNK(ns.st_mode)))
    return shown + " is group/world-writable and sticky (mode " + mode_text(st.st_mode) + ") and its entry '" + next +
           "' on the path is owned by uid " + std::to_string(ns.st_uid) + ", not by this process (uid " +
           std::to_string(me) + ")";
  return "";
}

// Every ancestor of `dir` (its strict prefixes, from "/"), by the rule
// above; "" when all pass. Checked twice: along the path as written (a
// component that is a symbolic link is checked at its target, and the dir
// holding the link must pass: nobody else can replace the link), and along
// the path the deepest existing prefix resolves to (realpath), so a link
// cannot lead through a dir someone else may change.
std::string ancestors_problem(const std::string& dir) {
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (ec) return "";
  if (!abs.has_filename() && abs.has_parent_path()) abs = abs.parent_path();  // "d/" is "d"
  // One chain: every strict prefix of `p`, each with its next component.
  const auto check = [](const fs::path& p, const std::string& via) -> std::string {
    std::vector<fs::path> prefixes;
    fs::path cur;
    for (const fs::path& part : p) {
      cur /= part;
      prefixes.push_back(cur);
    }
    const fs::path parent = p.parent_path();
    for (size_t i = 0; i + 1 < prefixes.size(); ++i) {
      const bool is_parent = prefixes[i] == parent;
      const std::string shown =
          std::string(is_parent ? "its parent '" : "its ancestor '") + prefixes[i].string() + "'" + via;
      if (std::string why =
              ancestor_problem(prefixes[i].string(), prefixes[i + 1].string(), i + 2 == prefixes.size(), shown);
          !why.empty())
        return why;
    }
    return std::string();
  };
  if (std::string why = check(abs, ""); !why.empty()) return why;
  // The deepest prefix that exists, resolved.
  fs::path existing = abs;
  while (!existing.empty() && !fs::exists(existing, ec) && existing != existing.parent_path())
    existing = existing.parent_path();
  const fs::path real = fs::canonical(existing, ec);
  if (ec || real == existing) return "";
  fs::path resolved = existing == abs ? real : (real / abs.lexically_relative(existing)).lexically_normal();
  if (!resolved.has_filename() && resolved.has_parent_path()) resolved = resolved.parent_path();
  return check(resolved, " (the path '" + abs.string() + "' leads there through a symbolic link: '" +
                             existing.string() + "' is '" + real.string() + "')");
}

// `dir` is absent: can this process create it? "" when it can (checked by
// creating its first missing component and removing it again), else why
// not. A dir that cannot be made (KDISPATCH_CACHE_DIR=/proc/x, HOME=
// /nonexistent for a daemon's uid) is refused at start, not at every write.
std::string creation_problem(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (ec) return "";
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  fs::path first_missing = p;
  for (fs::path q = p.parent_path();; q = q.parent_path()) {
    struct stat st {};
    if (::stat(q.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode))
        return "it does not exist and cannot be created: '" + q.string() + "' is not a directory";
      break;
    }
    if (errno != ENOENT)
      return "it does not exist and cannot be created: '" + q.string() + "': " + std::strerror(errno);
    first_missing = q;
    if (q == q.parent_path()) return "";
  }
  if (::mkdir(first_missing.c_str(), 0700) == 0) {
    ::rmdir(first_missing.c_str());
    return "";
  }
  if (errno == EEXIST) return "";
  return "it does not exist and cannot be created: mkdir '" + first_missing.string() + "': " + std::strerror(errno);
}

// The fallback: created 0700 if absent, then checked strictly.
CacheDirChoice fallback(std::string dir, const char* origin) {
  CacheDirChoice c;
  c.dir = std::move(dir);
  c.origin = origin;
  struct stat lst {};
  if (::lstat(c.dir.c_str(), &lst) == 0 && !(c.refused = private_dir_problem(c.dir)).empty()) {
    // there already and not ours, or a link: its own rule names why
  } else if (std::string p = ancestors_problem(c.dir); !p.empty()) {
    c.refused = p;
  } else if (::mkdir(c.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    c.refused = std::string("cannot create it: ") + std::strerror(errno);
  } else {
    c.refused = private_dir_problem(c.dir);
  }
  if (!c.refused.empty())
    c.refused = "tuning cache dir '" + c.dir +
                "' (the per-user fallback: KDISPATCH_CACHE_DIR, XDG_CACHE_HOME and HOME "
                "are unset) refused: " +
                c.refused +
                "; tuning results are neither read from it nor written to it (set KDISPATCH_CACHE_DIR to a private "
                "directory)";
  return c;
}

bool in_group(gid_t g) {
  if (g == ::getegid()) return true;
  gid_t groups[256];
  const int n = ::getgroups(256, groups);
  for (int i = 0; i < n; ++i)
    if (groups[i] == g) return true;
  return false;
}

// A dir of the user's choice, when it exists: refused when it is not a
// directory, world-writable (anyone could plant rows in it), or another
// user's (not root's) without being a dir shared with a group of ours
// (group-writable, our group) — e.g. a name in /tmp taken first by someone
// else. Then, existing or not, refused when an ancestor fails the ancestor
// rule (ancestors_problem). Absent, it is created 0700 on the first write,
// and refused now when it cannot be (creation_problem).
CacheDirChoice chosen(std::string dir, const char* origin) {
  CacheDirChoice c;
  c.dir = std::move(dir);
  c.origin = origin;
  struct stat st {};
  const bool exists = ::stat(c.dir.c_str(), &st) == 0;
  if (exists) {
    if (!S_ISDIR(st.st_mode))
      c.refused = "it is not a directory";
    else if (st.st_mode & S_IWOTH)
      c.refused = "it is world-writable (mode " + mode_text(st.st_mode) + "): anyone could plant rows in it";
    else if (st.st_uid != ::geteuid() && st.st_uid != 0 && !((st.st_mode & S_IWGRP) && in_group(st.st_gid)))
      c.refused = "it is owned by uid " + std::to_string(st.st_uid) + ", not by this process (uid " +
                  std::to_string(::geteuid()) + ") or root, and is not group-writable by a group of this process";
  }
  if (c.refused.empty()) c.refused = ancestors_problem(c.dir);
  if (c.refused.empty() && !exists) c.refused = creation_problem(c.dir);
  if (!c.refused.empty())
    c.refused = "tuning cache dir '" + c.dir + "' (from " + origin + ") refused: " + c.refused +
                "; tuning results are neither read from it nor written to it";
  return c;
}

}  // namespace

std::string host_name() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) return "";
  return host;
}

std::string private_dir_problem(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return std::string("cannot stat it: ") + std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return "it is a symbolic link";
  if (!S_ISDIR(st.st_mode)) return "it is not a directory";
  if (st.st_uid != ::geteuid())
    return "it is owned by uid " + std::to_string(st.st_uid) + ", not by this process (uid " +
           std::to_string(::geteuid()) + ")";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return "it is group/world-writable (mode " + mode_text(st.st_mode) + ")";
  return "";
}

CacheDirChoice resolve_cache_dir(const std::string& explicit_dir) noexcept {
  try {
    if (!explicit_dir.empty()) {
      // options_from_env() copies $KDISPATCH_CACHE_DIR into the options: name the variable then.
      const char* d = env("KDISPATCH_CACHE_DIR");
      return chosen(explicit_dir, d && explicit_dir == d ? "KDISPATCH_CACHE_DIR" : "tune.cache_dir");
    }
    if (const char* d = env("KDISPATCH_CACHE_DIR")) return chosen(d, "KDISPATCH_CACHE_DIR");
    if (const char* x = env("XDG_CACHE_HOME")) return chosen(std::string(x) + "/kdispatch", "XDG_CACHE_HOME");
    if (const char* h = env("HOME")) return chosen(std::string(h) + "/.cache/kdispatch", "HOME");
    if (const char* r = env("XDG_RUNTIME_DIR")) return fallback(std::string(r) + "/kdispatch", "XDG_RUNTIME_DIR");
    const std::string name = "/kdispatch-" + std::to_string(::geteuid());
    if (const char* t = env("TMPDIR")) return fallback(std::string(t) + name, "TMPDIR");
    return fallback("/tmp" + name, "/tmp");
  } catch (...) {
    CacheDirChoice c;
    c.refused = "tuning cache dir: out of memory while resolving it";
    return c;
  }
}

Status make_private_dirs(const std::string& dir) noexcept {
  try {
    fs::path p = fs::path(dir).lexically_normal();
    // Walk up to the first existing ancestor, then create downwards, 0700.
    std::vector<fs::path> missing;
    for (fs::path q = p; !q.empty(); q = q.parent_path()) {
      struct stat st {};
      if (::stat(q.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode))
          return make_status(StatusCode::io_error,
                             "cannot create '" + dir + "': '" + q.string() + "' is not a directory");
        break;
      }
      missing.push_back(q);
      if (q == q.parent_path()) break;
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (::mkdir(it->c_str(), 0700) != 0 && errno != EEXIST)
        return make_status(StatusCode::io_error,
                           "cannot create '" + it->string() + "': " + std::string(std::strerror(errno)));
    }
    return Status();
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "creating '" + dir + "'");
  } catch (const std::exception& e) {
    return make_status(StatusCode::io_error, "cannot create '" + dir + "': " + e.what());
  }
}

DirFd& DirFd::operator=(DirFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

DirFd::~DirFd() {
  if (fd_ >= 0) ::close(fd_);
}

Status open_dir_below(const std::string& root, const std::string& rel_dir, DirFd* out) noexcept {
  try {
    if (Status s = make_private_dirs(root); !s.ok()) return s;
    DirFd cur(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (cur.get() < 0)
      return make_status(StatusCode::io_error, "cannot open '" + root + "': " + std::string(std::strerror(errno)));
    fs::path shown(root);
    for (const auto& part : fs::path(rel_dir)) {
      const std::string c = part.string();
      if (c.empty() || c == ".") continue;
      shown /= c;
      if (c == "..")
        return make_status(StatusCode::io_error, "'" + shown.string() + "': '..' is not allowed below a cache dir");
      if (::mkdirat(cur.get(), c.c_str(), 0700) != 0 && errno != EEXIST)
        return make_status(StatusCode::io_error,
                           "cannot create '" + shown.string() + "': " + std::string(std::strerror(errno)));
      const int fd = ::openat(cur.get(), c.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) {
        const int e = errno;
        struct stat st {};
        const bool link = ::fstatat(cur.get(), c.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
        return make_status(StatusCode::io_error,
                           "'" + shown.string() + "' " +
                               (link ? std::string("is a symbolic link: tuning results are not written through it")
                                : e == ENOTDIR ? std::string("is not a directory")
                                               : std::string("cannot be opened: ") + std::strerror(e)));
      }
      cur = DirFd(fd);
    }
    *out = std::move(cur);
    return Status();
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "opening '" + root + "'");
  } catch (const std::exception& e) {
    return make_status(StatusCode::io_error, "cannot open '" + root + "/" + rel_dir + "': " + e.what());
  }
}

Status FileLock::acquire(int dir_fd, const std::string& name, const std::string& shown, FileLock* out) noexcept {
  try {
    out->release();
    for (int attempt = 0;; ++attempt) {
      const int fd = ::openat(dir_fd, name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
      if (fd < 0) {
        const int e = errno;
        return make_status(StatusCode::io_error,
                           "cannot open lock file '" + shown + "': " +
                               (e == ELOOP ? std::string("it is a symbolic link (not followed)") : std::strerror(e)));
      }
      struct stat mine {};
      if (::fstat(fd, &mine) != 0 || !S_ISREG(mine.st_mode)) {
        ::close(fd);
        return make_status(StatusCode::io_error, "lock file '" + shown + "' is not a regular file");
      }
      while (::flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
          const int e = errno;
          ::close(fd);
          return make_status(StatusCode::io_error, "cannot lock '" + shown + "': " + std::string(std::strerror(e)));
        }
      }
      // Still the file at that name? Its holder may have removed it while
      // we waited; then our lock guards nothing and we start again.
      struct stat now {};
      if (::fstatat(dir_fd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == mine.st_dev &&
          now.st_ino == mine.st_ino) {
        out->dir_ = dir_fd;
        out->fd_ = fd;
        out->name_ = name;
        return Status();
      }
      ::flock(fd, LOCK_UN);
      ::close(fd);
      if (attempt > 100000)
        return make_status(StatusCode::io_error, "cannot lock '" + shown + "': it keeps being replaced");
    }
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "locking '" + shown + "'");
  }
}

void FileLock::release() noexcept {
  if (fd_ < 0) return;
  ::unlinkat(dir_, name_.c_str(), 0);  // while held: a waiter then sees another inode (or none) and retries
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
  fd_ = -1;
}

std::string temp_prefix_for(std::string_view name) { return "." + std::string(name) + ".tmp."; }

std::string temp_name_for(std::string_view name) {
  unsigned char rnd[8] = {0};
  size_t got = 0;
  while (got < sizeof rnd) {
    const ssize_t r = ::getrandom(rnd + got, sizeof rnd - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    got += static_cast<size_t>(r);
  }
  if (got < sizeof rnd) {  // no getrandom: the clock and the address of a local
    const auto v = static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                   reinterpret_cast<uintptr_t>(&got);
    std::memcpy(rnd, &v, sizeof rnd);
  }
  char hex[17];
  for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
  std::string host = host_name();
  for (char& c : host)
    if (c == '/') c = '_';
  return temp_prefix_for(name) + host + "." + std::to_string(::getpid()) + "." + hex;
}

bool dead_local_temp(const std::string& n) {
  std::string host = host_name();
  for (char& c : host)
    if (c == '/') c = '_';
  const size_t rnd = n.rfind('.');
  const size_t pid_at = rnd == std::string::npos || rnd == 0 ? std::string::npos : n.rfind('.', rnd - 1);
  if (n.empty() || n[0] != '.' || pid_at == std::string::npos || pid_at < host.size() + 5) return false;
  if (n.compare(pid_at - host.size() - 5, host.size() + 5, ".tmp." + host) != 0) return false;
  const std::string pid = n.substr(pid_at + 1, rnd - pid_at - 1);
  if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) return false;
  const long p = std::atol(pid.c_str());
  return p > 0 && ::kill(static_cast<pid_t>(p), 0) != 0 && errno == ESRCH;
}

namespace {

std::mutex g_locking_mu;
std::map<std::string, LockingScheme> g_locking;  // dir (lexically normal) -> the check's result
int (*g_flock)(int, int) = nullptr;              // test hook

// The check (see locking_scheme): the scheme and what was seen.
Status check_flock(const std::string& dir, LockingScheme* out) {
  DirFd d;
  if (Status s = open_dir_below(dir, "", &d); !s.ok()) return s;
  int (*lock)(int, int) = g_flock ? g_flock : &::flock;
  // A probe file outlives its check only when the checking process was
  // killed between creating it and unlinking it (a few system calls): the
  // next check removes those of dead processes of this host.
  const std::string probe_prefix = temp_prefix_for("kdispatch-flock-probe");
  remove_entries_if(d.get(), [&](const std::string& n) {
    return n.compare(0, probe_prefix.size(), probe_prefix) == 0 && dead_local_temp(n);
  });
  const std::string name =
      temp_name_for("kdispatch-flock-probe");  // ".kdispatch-flock-probe.tmp.<host>.<pid>.<random>"
  const std::string shown = (fs::path(dir) / name).string();
  const int a = ::openat(d.get(), name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (a < 0)
    return make_status(StatusCode::io_error, "cannot create the flock check's probe file '" + shown +
                                                 "': " + std::string(std::strerror(errno)));
  const int b = ::openat(d.get(), name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  const int open_errno = errno;
  ::unlinkat(d.get(), name.c_str(), 0);  // the two descriptors keep the file while the check runs
  if (b < 0) {
    ::close(a);
    return make_status(StatusCode::io_error, "cannot open the flock check's probe file '" + shown +
                                                 "' a second time: " + std::string(std::strerror(open_errno)));
  }
  const std::string on = "on '" + dir + "'";
  auto failed = [](const char* what) { return std::string(what) + " (" + std::strerror(errno) + ")"; };
  out->fragments = true;
  if (lock(a, LOCK_EX | LOCK_NB) != 0) {
    out->reason = "flock is not available " + on + ": " + failed("an exclusive lock on a new file failed");
  } else if (lock(b, LOCK_EX | LOCK_NB) == 0) {
    out->reason =
        "flock is not honoured " + on + ": a second exclusive lock on one file was granted while the first was held";
  } else if (errno != EWOULDBLOCK) {
    out->reason = "flock is not usable " + on + ": " +
                  failed("a second exclusive lock on one file failed other than by being refused");
  } else if (lock(a, LOCK_UN) != 0 || lock(b, LOCK_EX | LOCK_NB) != 0) {
    out->reason = "flock is not usable " + on + ": " + failed("a lock released was not granted to the next owner");
  } else {
    out->fragments = false;
    out->reason =
        "flock is honoured " + on + " (a second exclusive lock on one file was refused while the first was held)";
  }
  ::close(b);
  ::close(a);
  return Status();
}

}  // namespace

Status locking_scheme(const std::string& dir, LockingScheme* out, bool* checked_now) noexcept {
  try {
    if (checked_now) *checked_now = false;
    const char* forced = env("KDISPATCH_CACHE_LOCKING");
    const std::string f = forced ? forced : "auto";
    if (f == "flock" || f == "fragments") {
      out->fragments = f == "fragments";
      out->reason = "KDISPATCH_CACHE_LOCKING=" + f;
      return Status();
    }
    if (f != "auto")
      return make_status(StatusCode::invalid_argument,
                         "KDISPATCH_CACHE_LOCKING='" + f + "' is not valid (expected auto, flock or fragments)");
    fs::path norm = fs::path(dir).lexically_normal();
    if (!norm.has_filename() && norm.has_parent_path()) norm = norm.parent_path();  // "d/" is "d"
    const std::string key = norm.string();
    std::lock_guard<std::mutex> g(g_locking_mu);
    if (auto it = g_locking.find(key); it != g_locking.end()) {
      *out = it->second;
      return Status();
    }
    LockingScheme r;
    if (Status s = check_flock(dir, &r); !s.ok()) return s;
    g_locking.emplace(key, r);
    *out = std::move(r);
    if (checked_now) *checked_now = true;
    return Status();
  } catch (const std::bad_alloc&) {
    return make_status(StatusCode::out_of_memory, "checking flock on '" + dir + "'");
  } catch (const std::exception& e) {
    return make_status(StatusCode::io_error, "checking flock on '" + dir + "': " + e.what());
  }
}

void set_flock_for_testing(int (*fn)(int, int)) noexcept {
  std::lock_guard<std::mutex> g(g_locking_mu);
  g_flock = fn;
  g_locking.clear();
}

std::string fragment_name() {
  std::string host = host_name();
  for (char& c : host)
    if (c == '/') c = '_';
  if (host.empty()) host = "unknown-host";
  if (host[0] == '.') host[0] = '_';  // a name starting with '.' is a temp file's
  return host + "-" + std::to_string(::getpid()) + ".json";
}

}  // namespace dispatch::store
