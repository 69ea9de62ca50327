// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the file-system rules every writer of a tuning cache
// or an emit dir follows, so that a hostile, world-writable place (/tmp) can
// neither make kdispatch write through a planted link nor serve planted rows,
// and concurrent writers of one file never split over two lock files.
//
//  - The cache dir: the user's choice (RuntimeOptions, KDISPATCH_CACHE_DIR,
//    XDG_CACHE_HOME, HOME) or, when none is set, a per-user fallback
//    ($XDG_RUNTIME_DIR/kdispatch, else ${TMPDIR:-/tmp}/kdispatch-<uid>)
//    created 0700 and refused when it is a link, not this uid's, or group/
//    world-writable. A dir of the user's choice is refused when it is
//    world-writable or another user's (unless shared with a group of ours),
//    or when it is absent and cannot be created. Either is refused when an
//    ancestor fails the ancestor rule (OpenSSH's safe_path): every ancestor,
//    along the path as written and along the path it resolves to, owned by
//    root or this uid and not group/world-writable, except a sticky dir
//    (/tmp) whose next component on the path is this uid's (or absent, or
//    the cache dir itself). A refused dir turns tuning persistence and the
//    cache off.
//  - Every dir kdispatch creates is created 0700.
//  - Lock files: `.<file>.lock` beside the file, opened without following a
//    link, flock'ed, then checked to still be the file at that name (same
//    device and inode) — else closed and retried. The holder removes it
//    before unlocking; nobody else ever unlinks a lock file. So two writers
//    can never hold locks on two different inodes of one name.
//  - Temp files: `.<file>.tmp.<host>.<pid>.<random>`, O_CREAT|O_EXCL|
//    O_NOFOLLOW, written only under the lock. Every temp file of a name that
//    exists while its lock is held belongs to a dead writer, and is removed.
//  - Where flock is not honoured (locking_scheme below), there are no lock
//    files: each process writes only its own fragment file.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "dispatch/status.hpp"
#include "store/dir_entries.hpp"

namespace dispatch::store {

/// Where the tuning cache is and whether it may be used.
struct CacheDirChoice {
  std::string dir;      ///< the path (also when refused, for the message)
  std::string origin;   ///< what chose it: "tune.cache_dir", "KDISPATCH_CACHE_DIR", "XDG_CACHE_HOME", "HOME",
                        ///< "XDG_RUNTIME_DIR", "TMPDIR" or "/tmp" (the last three: the per-user fallback)
  std::string refused;  ///< "" = usable; else a sentence naming the dir and why
  bool fallback() const noexcept { return origin == "XDG_RUNTIME_DIR" || origin == "TMPDIR" || origin == "/tmp"; }
};

/// Resolves the cache dir: `explicit_dir` (RuntimeOptions::tune.cache_dir)
/// if not empty, else $KDISPATCH_CACHE_DIR, $XDG_CACHE_HOME/kdispatch,
/// $HOME/.cache/kdispatch; else the per-user fallback, which is created
/// (0700) now and checked strictly. Refused (`refused` names the dir, the
/// variable that chose it and why) by the rules above; the message names
/// the ancestor that fails the ancestor rule. An absent dir of the user's
/// choice is checked by creating its first missing component and removing
/// it again (KDISPATCH_CACHE_DIR=/proc/x is refused here, not at every
/// write). Never throws.
CacheDirChoice resolve_cache_dir(const std::string& explicit_dir) noexcept;

/// Why `dir` must not be used as a private dir of this uid ("" = fine):
/// a symbolic link, not a directory, owned by another uid, or group/world-
/// writable. `dir` must exist.
std::string private_dir_problem(const std::string& dir);

/// Creates `dir` and its missing parents, each new one 0700 (existing ones
/// are left as they are). Errors: io_error naming the path.
Status make_private_dirs(const std::string& dir) noexcept;

/// An open directory (RAII), for the *at() calls that never leave it.
class DirFd {
 public:
  DirFd() = default;
  explicit DirFd(int fd) noexcept : fd_(fd) {}
  DirFd(DirFd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  DirFd& operator=(DirFd&& o) noexcept;
  DirFd(const DirFd&) = delete;
  DirFd& operator=(const DirFd&) = delete;
  ~DirFd();
  int get() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

/// Opens <root>/<rel_dir> for writing into it: `root` as given (it may be a
/// link — the user's choice — and is created 0700 if absent), then every
/// component of `rel_dir` below it without following a link, each missing
/// one created 0700. Errors: io_error naming the path ("... is a symbolic
/// link", "... is not a directory").
Status open_dir_below(const std::string& root, const std::string& rel_dir, DirFd* out) noexcept;

/// An exclusive lock on the file `name` in an open dir (see the header
/// comment). Movable RAII.
class FileLock {
 public:
  FileLock() = default;
  FileLock(FileLock&& o) noexcept : dir_(o.dir_), fd_(o.fd_), name_(std::move(o.name_)) { o.fd_ = -1; }
  FileLock& operator=(FileLock&&) = delete;
  FileLock(const FileLock&) = delete;
  ~FileLock() { release(); }
  /// Blocks until held. `shown` is the path used in messages. Errors:
  /// io_error naming it (a link or a non-regular file at that name,
  /// permissions).
  static Status acquire(int dir_fd, const std::string& name, const std::string& shown, FileLock* out) noexcept;
  /// Removes the lock file (while still holding it), then unlocks.
  void release() noexcept;
  bool held() const noexcept { return fd_ >= 0; }

 private:
  int dir_ = -1;
  int fd_ = -1;
  std::string name_;
};

/// A new temp-file name for the file `name` (no dir part):
/// ".<name>.tmp.<host>.<pid>.<16 hex random>".
std::string temp_name_for(std::string_view name);

/// The prefix every temp file of `name` starts with: ".<name>.tmp.".
std::string temp_prefix_for(std::string_view name);

/// This host's name (gethostname), "" when unknown.
std::string host_name();

/// True when `name` is a temp file of this host (".<file>.tmp.<host>.<pid>.
/// <random>", temp_name_for's form, '/' in the host name as '_') whose
/// writer pid names no process of this host any more (kill(pid, 0): ESRCH):
/// a dead writer's, safe to remove. Other hosts' temp files: false.
bool dead_local_temp(const std::string& name);

/// How writers write into a cache or emit dir (docs/tuning.md#storage-a-cluster-shares).
///  - flock (fragments = false): each <key>.json is merged under its lock
///    file, as described above;
///  - fragments: each process writes only its own fragment
///    <key>.json.d/<host>-<pid>.json (the same table format, the same temp
///    file + fsync + rename + dir fsync, its own previous rows merged in),
///    with no lock; the loader reads <key>.json and its fragments as one
///    table. For filesystems whose flock is not honoured (some NFS, Lustre
///    and FUSE mounts grant it to everyone or refuse it).
struct LockingScheme {
  bool fragments = false;
  std::string reason;  ///< the check's result, or the variable that forced it
};

/// The scheme of `dir`: KDISPATCH_CACHE_LOCKING=flock or =fragments forces
/// one; unset or "auto" runs the flock check once per process per dir
/// (cached): a probe file ".kdispatch-flock-probe.tmp.<host>.<pid>.<random>"
/// is created in `dir` (made 0700 if absent) and opened a second time (two
/// open file descriptions, which flock treats as two owners); an exclusive
/// non-blocking flock on the first must be granted, one on the second
/// refused with EWOULDBLOCK while the first is held, and granted once the
/// first is released. Anything else (both granted, flock failing with
/// ENOSYS, ENOLCK, EOPNOTSUPP, ...) selects fragments, and `reason` says
/// what was seen. The probe file is unlinked as soon as it is open twice
/// (a killed check leaves nothing). A filesystem whose locks are
/// only local to a host (NFS mounted with `nolock`, Lustre's `localflock`)
/// passes the check: force fragments there. `*checked_now` (optional) is
/// set when this call ran the check (so that its result is logged once).
/// Errors: invalid_argument naming KDISPATCH_CACHE_LOCKING for another
/// value; io_error naming the probe file when it cannot be made.
Status locking_scheme(const std::string& dir, LockingScheme* out, bool* checked_now = nullptr) noexcept;

/// Test hook: the flock() the check calls (nullptr: the real one), e.g. one
/// that grants every lock, as a filesystem that does not honour flock
/// does. Also forgets the cached results of the check.
void set_flock_for_testing(int (*fn)(int fd, int operation)) noexcept;

/// This process's fragment file name: "<host>-<pid>.json" ('/' in the host
/// name replaced by '_'; "unknown-host" when it has none).
std::string fragment_name();

/// The fragment dir of the table file `name` ("<key>.json" -> "<key>.json.d").
inline std::string fragment_dir_for(std::string_view name) { return std::string(name) + ".d"; }

}  // namespace dispatch::store
