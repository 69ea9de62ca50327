// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch merge`: writing (cli/merge_impl.hpp).
//
// --out: every dir below the --out dir is opened with O_NOFOLLOW |
// O_DIRECTORY, one component at a time, and created (mkdirat) when
// missing: a symbolic link at <out>/cpu (or any folder below --out) is
// refused, naming it, never written through; --out itself may be a link
// (the user's choice). Each file is written atomically: the temp file
// ".<name>.merge.<host>.<pid>.<64 random bits>" (O_EXCL | O_NOFOLLOW: a name
// planted in a shared out dir is never opened), fsync, rename, fsync of the
// dir. The first write into a dir removes the temp files there of merges
// of this host that no longer run (a merge killed mid-write); another
// host's are left alone.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <set>
#include <string_view>

#include "cli/merge_impl.hpp"
#include "store/bounded_read.hpp"
#include "store/dir_entries.hpp"
#include "store/fragment_claims.hpp"

namespace kdispatch_cli::merge_detail {
namespace {

namespace store = dispatch::store;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// ".<file>.merge.<host>.<pid>.<16 hex>": a temp file of a merge of this
// host whose pid no longer exists.
bool dead_merge_temp(const std::string& n, const std::string& host) {
  const size_t rnd = n.rfind('.');
  if (n.size() < 2 || n[0] != '.' || rnd == std::string::npos || n.size() - rnd - 1 != 16) return false;
  const size_t pid_at = n.rfind('.', rnd - 1);
  const std::string marker = ".merge." + host;
  if (pid_at == std::string::npos || pid_at < marker.size() + 1) return false;
  if (n.compare(pid_at - marker.size(), marker.size(), marker) != 0) return false;
  const std::string pid = n.substr(pid_at + 1, rnd - pid_at - 1);
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) return false;
  return store::local_pid_dead(std::atol(pid.c_str()));
}

void sweep_dead_temps(int dir_fd) {
  const std::string host = host_name();
  store::remove_entries_if(dir_fd, [&](const std::string& n) { return dead_merge_temp(n, host); });
}

// Opens <root>/<rel_dir>: root as given, each component below it without
// following a link (created when missing). "" or why not, naming the path.
std::string open_below(const fs::path& root, const fs::path& rel_dir, Fd* out) {
  std::error_code ec;
  fs::create_directories(root, ec);
  Fd cur(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (cur.get() < 0) return "cannot open " + root.string() + ": " + std::strerror(errno);
  fs::path shown = root;
  for (const fs::path& part : rel_dir) {
    const std::string name = part.string();
    if (name.empty() || name == ".") continue;
    shown /= part;
    if (name == "..") return "'" + shown.string() + "' leaves the output dir";
    int fd = ::openat(cur.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
      if (::mkdirat(cur.get(), name.c_str(), 0777) != 0 && errno != EEXIST)
        return "cannot create " + shown.string() + ": " + std::strerror(errno);
      fd = ::openat(cur.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
      struct stat st {};
      if (errno == ELOOP || (::fstatat(cur.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)))
        return "'" + shown.string() + "' is a symbolic link: merge does not write through it";
      if (errno == ENOTDIR) return "'" + shown.string() + "' is not a directory";
      return "cannot open " + shown.string() + ": " + std::strerror(errno);
    }
    cur = Fd(fd);
  }
  *out = std::move(cur);
  return {};
}

std::string random_hex() {
  unsigned char rnd[8] = {0};
  size_t got = 0;
  while (got < sizeof rnd) {
    const ssize_t r = ::getrandom(rnd + got, sizeof rnd - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  char hex[17];
  for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
  return hex;
}

// Writes `text` as `name` in the open dir atomically (see the header
// comment). `shown`: the dir, for messages.
std::string write_at(int dir_fd, const fs::path& shown, const std::string& name, const std::string& text) {
  static std::set<std::pair<dev_t, ino_t>> swept;  // dirs whose dead temps are gone
  struct stat st {};
  if (::fstat(dir_fd, &st) == 0 && swept.insert({st.st_dev, st.st_ino}).second) sweep_dead_temps(dir_fd);
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    tmp = "." + name + ".merge." + host_name() + "." + std::to_string(::getpid()) + "." + random_hex();
    fd = ::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return "cannot create " + (shown / tmp).string() + ": " + std::strerror(errno);
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t w = ::write(fd, text.data() + off, text.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ::close(fd);
      ::unlinkat(dir_fd, tmp.c_str(), 0);
      return "cannot write " + (shown / tmp).string();
    }
    off += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::renameat(dir_fd, tmp.c_str(), dir_fd, name.c_str()) != 0) {
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return "cannot write " + (shown / name).string();
  }
  ::fsync(dir_fd);
  return {};
}

// The whole regular file `name` of an open dir, through the bounded reader
// (no link followed); false when it cannot be read (*missing: absent).
bool read_at(int dir_fd, const std::string& name, std::string* out, bool* missing) {
  store::BoundedRead opt;
  opt.nofollow = true;
  std::string why;
  const store::ReadError e = store::read_bounded_at(dir_fd, name, out, opt, &why);
  *missing = e == store::ReadError::missing;
  return e == store::ReadError::ok;
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
    ::unlinkat(dir_, name_.c_str(), 0);
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  // `required`: the dir's writers use flock; a lock that cannot be taken
  // refuses the table (else it is taken where it can be).
  std::string acquire(int dir_fd, const fs::path& table, bool required) {
    dir_ = dir_fd;
    name_ = "." + table.filename().string() + ".lock";
    const std::string shown = (table.parent_path() / name_).string();
    for (int attempt = 0; attempt < 1000; ++attempt) {
      const int fd = ::openat(dir_fd, name_.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
      if (fd < 0) return "cannot open lock file " + shown + ": " + std::strerror(errno);
      struct stat mine {
      }, now{};
      if (::fstat(fd, &mine) != 0 || !S_ISREG(mine.st_mode)) {
        ::close(fd);
        return "lock file " + shown + " is not a regular file";
      }
      int r;
      while ((r = ::flock(fd, LOCK_EX)) != 0 && errno == EINTR) {
      }
      if (r != 0) {
        const int e = errno;
        ::close(fd);
        ::unlinkat(dir_fd, name_.c_str(), 0);
        if (!required && (e == ENOSYS || e == ENOLCK || e == EOPNOTSUPP)) return {};  // no flock writers either
        return "cannot lock " + shown + ": " + std::strerror(e) +
               (required ? " (the dir's writers use flock: KDISPATCH_CACHE_LOCKING or the flock check)" : "");
      }
      if (::fstatat(dir_fd, name_.c_str(), &now, AT_SYMLINK_NOFOLLOW) == 0 && now.st_dev == mine.st_dev &&
          now.st_ino == mine.st_ino) {
        fd_ = fd;
        return {};
      }
      ::close(fd);
    }
    return "cannot lock " + shown + ": it keeps being replaced";
  }

 private:
  int dir_ = -1;
  int fd_ = -1;
  std::string name_;
};

// Takes one fragment read: renamed to this compaction's claim, removed when
// it still holds `bytes`, else put back (store/fragment_claims.hpp). True
// when it was put back; "" or an error in *err.
bool take_fragment(int dfd, const std::string& frag, const std::string& bytes, std::string* err) {
  const std::string claim = store::compact_claim_name(frag);
  // The claim's mtime is now (recovery takes a claim older than
  // store::kClaimStaleSeconds as a gone compaction's): set before the
  // rename (whatever file it moves was written or touched since) and after
  // it. Best effort (a file of another user may refuse it).
  (void)::utimensat(dfd, frag.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
  if (::renameat(dfd, frag.c_str(), dfd, claim.c_str()) != 0) return false;  // gone: nothing to remove
  (void)::utimensat(dfd, claim.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
  std::string claimed;
  bool gone = false;
  if (read_at(dfd, claim, &claimed, &gone) && claimed == bytes) {
    ::unlinkat(dfd, claim.c_str(), 0);
    return false;
  }
  // Its writer replaced it after it was read. Test-only: the compaction
  // dies here (KDISPATCH_TEST_COMPACT_KILL=putback), the claim made and not
  // put back: the next writer or compaction recovers it.
  if (const char* k = std::getenv("KDISPATCH_TEST_COMPACT_KILL"); k && std::string_view(k) == "putback")
    ::raise(SIGKILL);
  std::string why;
  const std::string as = store::put_back_claim(dfd, claim, frag, store::fragment_writer_dead(frag), store::name_host(),
                                               static_cast<long>(::getpid()), &why);
  if (as.empty()) *err = "cannot put back the claim " + claim + " of " + frag + ": " + why;
  return true;
}

}  // namespace

std::string write_out(const std::string& out, const std::string& rel, const std::string& text) {
  const fs::path r(rel);
  Fd dir;
  if (std::string why = open_below(out, r.parent_path(), &dir); !why.empty()) return why;
  return write_at(dir.get(), fs::path(out) / r.parent_path(), r.filename().string(), text);
}

CompactLock::~CompactLock() {
  if (path_.empty()) return;
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) ::unlink(path_.c_str());
}

std::string CompactLock::take(const fs::path& path, std::string* note) {
  const std::string name = path.filename().string();
  const fs::path dir_path = path.has_parent_path() ? path.parent_path() : fs::path(".");
  Fd dir(::open(dir_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return "cannot open " + dir_path.string() + ": " + std::strerror(errno);
  const std::string me = host_name() + "." + std::to_string(::getpid());
  const std::string body = std::to_string(::getpid()) + " " + host_name() + "\n";
  // Temp and aside files "<name>.{tmp,stale}.<host>.<pid>.<hex>" of dead
  // compactions of this host (killed between their create and unlink).
  store::remove_entries_if(dir.get(), [&](const std::string& n) {
    for (const char* kind : {".tmp.", ".stale."}) {
      const std::string prefix = name + kind + host_name() + ".";
      if (n.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string rest = n.substr(prefix.size());
      const size_t dot = rest.find('.');
      const std::string pid = rest.substr(0, dot);
      if (dot != std::string::npos && !pid.empty() && pid.size() <= 18 &&
          pid.find_first_not_of("0123456789") == std::string::npos && store::local_pid_dead(std::atol(pid.c_str())))
        return true;
    }
    return false;
  });
  for (int attempt = 0; attempt < 8; ++attempt) {
    // The body first, then the name: a complete temp file link()ed to the
    // lock's name (atomic, never replacing a file, on NFS too), so no lock
    // is ever seen without its pid and host.
    const std::string tmp = name + ".tmp." + me + "." + random_hex();
    Fd fd(::openat(dir.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (fd.get() < 0) return "cannot create " + (dir_path / tmp).string() + ": " + std::strerror(errno);
    struct stat mine {};
    if (::write(fd.get(), body.data(), body.size()) != static_cast<ssize_t>(body.size()) || ::fsync(fd.get()) != 0 ||
        ::fstat(fd.get(), &mine) != 0) {
      ::unlinkat(dir.get(), tmp.c_str(), 0);
      return "cannot write " + (dir_path / tmp).string();
    }
    int e = ::linkat(dir.get(), tmp.c_str(), dir.get(), name.c_str(), 0) == 0 ? 0 : errno;
    if (e != 0 && e != EEXIST) {
      struct stat now {};  // NFS: a link done whose reply was lost
      if (::fstat(fd.get(), &now) == 0 && now.st_nlink == 2) e = 0;
    }
    ::unlinkat(dir.get(), tmp.c_str(), 0);
    if (e == EPERM || e == EOPNOTSUPP || e == ENOSYS) {  // no hard links: O_EXCL, then the body
      Fd lf(::openat(dir.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
      e = lf.get() >= 0 ? 0 : errno;
      if (e == 0) {
        if (::write(lf.get(), body.data(), body.size()) != static_cast<ssize_t>(body.size()) ||
            ::fstat(lf.get(), &mine) != 0) {
          ::unlinkat(dir.get(), name.c_str(), 0);
          return "cannot write " + path.string();
        }
      }
    }
    if (e == 0) {
      path_ = path;
      dev_ = mine.st_dev;
      ino_ = mine.st_ino;
      return {};
    }
    if (e != EEXIST) return "cannot create " + path.string() + ": " + std::strerror(e);
    // Held: judge the holder.
    Fd held(::openat(dir.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (held.get() < 0 && errno == ENOENT) continue;  // released meanwhile
    struct stat st {};
    if (held.get() < 0 || ::fstat(held.get(), &st) != 0 || !S_ISREG(st.st_mode))
      return path.string() + " is not a regular file (a compaction writes one): if no compaction runs, remove it";
    char buf[512];
    ssize_t n = 0;
    while ((n = ::read(held.get(), buf, sizeof buf - 1)) < 0 && errno == EINTR) {
    }
    buf[n > 0 ? n : 0] = '\0';
    std::string text(buf);
    text = text.substr(0, text.find('\n'));
    struct timespec ts {};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    const long age = static_cast<long>(ts.tv_sec - st.st_mtim.tv_sec);
    long pid = 0;
    char host[256] = {0};
    const bool parsed = std::sscanf(buf, "%ld %255s", &pid, host) == 2;
    const std::string shown = text.empty() ? std::string("empty") : "'" + text + "'";
    std::string why;
    if (parsed && host == host_name() && store::local_pid_dead(pid)) {
      why = "its compaction (pid " + std::to_string(pid) + " of this host) no longer runs";
    } else if (!parsed && (age > kCompactLockStaleSeconds || age < -kCompactLockStaleSeconds)) {
      why = shown + ", without the pid and host a compaction writes before the lock's name exists, and " +
            std::to_string(age) + " s old: left by a compaction killed while creating it";
    } else if (!parsed) {
      return "another compaction may be creating " + path.string() + " (" + shown + ", " + std::to_string(age) +
             " s old): run the compaction again; a lock without a pid and host is taken over once " +
             std::to_string(kCompactLockStaleSeconds) + " s old";
    } else {
      return "another compaction holds " + path.string() + " (" + text + "); if none runs, remove it";
    }
    // Take it over: moved aside, then removed if it is still the file
    // judged (another compaction may have taken it over and re-created it
    // meanwhile: that one is put back).
    const std::string aside = name + ".stale." + me + "." + random_hex();
    if (::renameat(dir.get(), name.c_str(), dir.get(), aside.c_str()) != 0) {
      if (errno == ENOENT) continue;
      return "cannot take over " + path.string() + ": " + std::strerror(errno);
    }
    struct stat moved {};
    if (::fstatat(dir.get(), aside.c_str(), &moved, AT_SYMLINK_NOFOLLOW) == 0 &&
        (moved.st_dev != st.st_dev || moved.st_ino != st.st_ino)) {
      // Not the one judged: put it back. When its name was taken meanwhile,
      // the lock it was is released (as its holder would), and the loop
      // judges the new one.
      if (::linkat(dir.get(), aside.c_str(), dir.get(), name.c_str(), 0) != 0) {
      }
    } else {
      *note += (note->empty() ? "" : "; ") + ("took over " + path.string() + ": " + why);
    }
    ::unlinkat(dir.get(), aside.c_str(), 0);
  }
  return "cannot take " + path.string() + ": it keeps changing";
}

/// Compacts one table in place: its main file <root>/<rel> becomes `text`
/// (the merge of the main file and the fragments as `t` read them), then
/// each fragment read is renamed to this compaction's claim (after which
/// its writer makes a new one) and removed if it still holds the bytes
/// that were merged; a claim whose bytes differ (its writer rewrote it) is
/// put back under a name the loader reads (store/fragment_claims.hpp:
/// its old name only when its writer is a process of this host that no
/// longer exists, else "<name stem>.unmerged-<host>-<pid>.json"): nothing a
/// writer wrote is lost, and the next compaction takes it. "" or why the
/// table was left as it was; `*kept` counts fragments put back.
std::string compact_table(const fs::path& root, const std::string& rel, const Table& t, const std::string& text,
                          bool require_flock, int* kept) {
  *kept = 0;
  const fs::path r(rel), main = root / r;
  Fd dir;
  if (std::string why = open_below(root, r.parent_path(), &dir); !why.empty()) return why;
  const std::string name = r.filename().string();
  TableLock lock;
  if (std::string err = lock.acquire(dir.get(), main, require_flock); !err.empty()) return err;
  std::string now;
  bool missing = false;
  if (!read_at(dir.get(), name, &now, &missing) && !missing) return "cannot read " + main.string();
  if (missing == t.has_main || now != t.main_bytes)
    return main.string() + " changed while it was read: left as it was; run the compaction again";
  if (std::string err = write_at(dir.get(), main.parent_path(), name, text); !err.empty()) return err;
  // Test-only: a writer rewriting a fragment between its read and its claim
  // (KDISPATCH_TEST_COMPACT_REPLACE=<file>: that file's bytes, as its writer
  // would put them there: temp file, rename).
  if (const char* with = std::getenv("KDISPATCH_TEST_COMPACT_REPLACE"); with && *with && !t.fragments.empty()) {
    std::string bytes;
    bool gone = false;
    if (read_at(AT_FDCWD, with, &bytes, &gone)) {
      const fs::path f = t.fragments.front().first;
      (void)write_out(f.parent_path().string(), f.filename().string(), bytes);
    }
  }
  Fd fdir;
  if (std::string why = open_below(root, r.parent_path() / (name + ".d"), &fdir); !why.empty()) return why;
  for (const auto& [frag, bytes] : t.fragments) {
    std::string err;
    if (take_fragment(fdir.get(), frag.filename().string(), bytes, &err)) ++*kept;
    if (!err.empty()) return err;
  }
  ::fsync(fdir.get());
  return {};
}

}  // namespace kdispatch_cli::merge_detail
