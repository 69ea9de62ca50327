// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — compaction claims and their recovery (store/fragment_claims.hpp).
#include "store/fragment_claims.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "store/dir_entries.hpp"

namespace dispatch::store {
namespace {

constexpr std::string_view kClaimMark = ".compacting-";

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Digits as a pid, any width: LONG_MAX when larger (no process has a pid
// over INT_MAX: local_pid_dead).
long to_long(std::string_view s) {
  long v = 0;
  for (char c : s) {
    if (v > (LONG_MAX - 9) / 10) return LONG_MAX;
    v = v * 10 + (c - '0');
  }
  return v;
}

int64_t now_s() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec);
}

const char* file_kind(mode_t mode) {
  return S_ISLNK(mode)                      ? "a symbolic link"
         : S_ISFIFO(mode)                   ? "a FIFO"
         : S_ISDIR(mode)                    ? "a directory"
         : S_ISSOCK(mode)                   ? "a socket"
         : (S_ISCHR(mode) || S_ISBLK(mode)) ? "a device"
                                            : "not a regular file";
}

bool exists_at(int dir_fd, const std::string& name) {
  struct stat st {};
  return ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

}  // namespace

std::string name_host() {
  char buf[HOST_NAME_MAX + 1] = {0};
  std::string host = ::gethostname(buf, sizeof buf - 1) == 0 ? std::string(buf) : std::string();
  for (char& c : host)
    if (c == '/') c = '_';
  return host.empty() ? std::string("unknown-host") : host;
}

std::string compact_claim_name(std::string_view fragment) {
  return "." + std::string(fragment) + std::string(kClaimMark) + name_host() + "-" + std::to_string(::getpid());
}

bool looks_like_claim(std::string_view name) {
  return name.size() > 1 && name[0] == '.' && name.find(kClaimMark) != std::string_view::npos;
}

bool parse_compact_claim(std::string_view name, CompactClaim* out) {
  if (!looks_like_claim(name)) return false;
  const size_t at = name.rfind(kClaimMark);
  if (at < 2) return false;
  const std::string_view owner = name.substr(at + kClaimMark.size());
  CompactClaim c;
  c.fragment = std::string(name.substr(1, at - 1));
  // Only fragments are claimed: "<name>.json", not hidden.
  constexpr std::string_view kJson = ".json";
  if (c.fragment.size() <= kJson.size() || c.fragment[0] == '.' ||
      c.fragment.compare(c.fragment.size() - kJson.size(), kJson.size(), kJson) != 0)
    return false;
  if (all_digits(owner)) {  // an older build's ".<frag>.compacting-<pid>"
    c.pid = to_long(owner);
  } else {
    const size_t dash = owner.rfind('-');
    if (dash == std::string_view::npos || dash == 0 || !all_digits(owner.substr(dash + 1))) return false;
    c.host = std::string(owner.substr(0, dash));
    c.pid = to_long(owner.substr(dash + 1));
  }
  *out = std::move(c);
  return true;
}

bool local_pid_dead(long pid) {
  if (pid <= 0 || pid > INT_MAX) return true;  // no process has such a pid
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

ClaimVerdict judge_claim(int dir_fd, const std::string& name, CompactClaim* c, std::string* why) {
  why->clear();
  if (!looks_like_claim(name)) return ClaimVerdict::not_a_claim;
  if (!parse_compact_claim(name, c)) {
    *why = "named like a compaction's claim, but not .<fragment>.json.compacting-<host>-<pid>";
    return ClaimVerdict::unparsable;
  }
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return ClaimVerdict::not_a_claim;  // gone
  if (!S_ISREG(st.st_mode)) {
    *why = std::string("a claim that is ") + file_kind(st.st_mode) +
           ", not a regular file (a compaction claims only regular files): never put back under a name the loader "
           "reads";
    return ClaimVerdict::not_regular;
  }
  if (c->host != name_host()) {
    *why = "a claim of another host's compaction, or of an older build's (no host in its name)";
    return ClaimVerdict::foreign;
  }
  if (local_pid_dead(c->pid)) {
    *why = "pid " + std::to_string(c->pid) + " of this host no longer runs";
    return ClaimVerdict::dead;
  }
  const int64_t age = now_s() - static_cast<int64_t>(st.st_mtim.tv_sec);
  if (age > kClaimStaleSeconds || age < -kClaimStaleSeconds) {
    *why = "pid " + std::to_string(c->pid) + " of this host runs, but the claim is " + std::to_string(age) +
           " s old: a compaction holds a claim for moments (its pid was reused, or is this process's in a "
           "container)";
    return ClaimVerdict::stale;
  }
  *why = "the claim of a compaction running on this host (pid " + std::to_string(c->pid) + ", claimed " +
         std::to_string(age < 0 ? 0 : age) + " s ago); if none runs, it is recovered once " +
         std::to_string(kClaimStaleSeconds) + " s old";
  return ClaimVerdict::live;
}

bool fragment_writer_dead(std::string_view fragment) {
  constexpr std::string_view kJson = ".json";
  if (fragment.size() <= kJson.size() || fragment.substr(fragment.size() - kJson.size()) != kJson) return false;
  const std::string_view stem = fragment.substr(0, fragment.size() - kJson.size());
  const size_t dash = stem.rfind('-');
  if (dash == std::string_view::npos || dash == 0 || !all_digits(stem.substr(dash + 1))) return false;
  std::string host = name_host();
  if (!host.empty() && host[0] == '.') host[0] = '_';  // as fragment_name() writes it
  return stem.substr(0, dash) == host && local_pid_dead(to_long(stem.substr(dash + 1)));
}

std::string unmerged_name(std::string_view fragment, std::string_view host, long pid, int i) {
  std::string_view stem = fragment;
  if (stem.size() > 5 && stem.substr(stem.size() - 5) == ".json") stem.remove_suffix(5);
  return std::string(stem) + ".unmerged-" + std::string(host) + "-" + std::to_string(pid) +
         (i ? "-" + std::to_string(i) : std::string()) + ".json";
}

std::string put_back_claim(int dir_fd, const std::string& claim, const std::string& fragment, bool to_fragment,
                           const std::string& host, long pid, std::string* error) {
  // The claim as `to`: by link (never replacing a file), then the claim
  // unlinked; where the filesystem has no hard links, by rename to a name
  // found free (only recoveries make unmerged names, one per claim). 0 or
  // the errno.
  const auto place = [&](const std::string& to) -> int {
    if (::linkat(dir_fd, claim.c_str(), dir_fd, to.c_str(), 0) == 0) {
      ::unlinkat(dir_fd, claim.c_str(), 0);
      return 0;
    }
    int e = errno;
    if (e == EPERM || e == EOPNOTSUPP || e == ENOSYS) {
      if (exists_at(dir_fd, to)) return EEXIST;
      if (::renameat(dir_fd, claim.c_str(), dir_fd, to.c_str()) == 0) return 0;
      e = errno;
    }
    return e;
  };
  struct stat st {};
  if (::fstatat(dir_fd, claim.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) *error = std::string("cannot stat it: ") + std::strerror(errno);
    return {};  // ENOENT: gone: another process recovered it first
  }
  if (!S_ISREG(st.st_mode)) {  // never under a name the loader reads
    *error = std::string("it is ") + file_kind(st.st_mode) + ", not a regular file: left as it is";
    return {};
  }
  std::string as;
  int e = to_fragment ? place(fragment) : EEXIST;
  if (e == 0) as = fragment;
  for (int i = 0; i < 1000 && as.empty() && e == EEXIST; ++i) {
    const std::string aside = unmerged_name(fragment, host, pid, i);
    if ((e = place(aside)) == 0) as = aside;
  }
  if (as.empty()) {
    if (e != ENOENT || exists_at(dir_fd, claim))
      *error = std::string("cannot link it to a name the loader reads: ") + std::strerror(e);
    return {};  // else gone: another process recovered it first
  }
  ::fsync(dir_fd);
  return as;
}

namespace {

// Calls f(name, verdict, claim, why) for every entry of the open dir, as
// judge_claim judges it; an exception (memory) ends the walk.
template <class F>
void for_each_judged(int dir_fd, F&& f) noexcept {
  try {
    for (const std::string& n : list_dir(dir_fd)) {
      CompactClaim c;
      std::string why;
      const ClaimVerdict v = judge_claim(dir_fd, n, &c, &why);
      f(n, v, c, why);
    }
  } catch (...) {
  }
}

}  // namespace

std::vector<RecoveredClaim> recover_dead_claims(int dir_fd, const std::string& own_fragment) noexcept {
  std::vector<RecoveredClaim> out;
  for_each_judged(dir_fd, [&](const std::string& n, ClaimVerdict v, const CompactClaim& c, const std::string& why) {
    if (v != ClaimVerdict::dead && v != ClaimVerdict::stale) return;
    RecoveredClaim r;
    r.claim = n;
    r.pid = c.pid;
    r.stale = v == ClaimVerdict::stale;
    r.why = why;
    if (!own_fragment.empty() && c.fragment == own_fragment) {
      r.own = true;  // the caller's own: its write merges it
      out.push_back(std::move(r));
      return;
    }
    const bool to_fragment = !exists_at(dir_fd, c.fragment) && fragment_writer_dead(c.fragment);
    r.put_as = put_back_claim(dir_fd, n, c.fragment, to_fragment, c.host, c.pid, &r.error);
    out.push_back(std::move(r));
  });
  return out;
}

std::vector<LeftClaim> left_claims(int dir_fd) noexcept {
  std::vector<LeftClaim> out;
  for_each_judged(dir_fd, [&](const std::string& n, ClaimVerdict v, const CompactClaim&, const std::string& why) {
    if (v == ClaimVerdict::foreign || v == ClaimVerdict::live || v == ClaimVerdict::not_regular ||
        v == ClaimVerdict::unparsable)
      out.push_back(LeftClaim{n, v, why});
  });
  return out;
}

}  // namespace dispatch::store
