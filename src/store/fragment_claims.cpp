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
#include <cstring>

namespace dispatch::store {
namespace {

constexpr std::string_view kClaimMark = ".compacting-";

bool all_digits(std::string_view s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

long to_long(std::string_view s) {
  long v = 0;
  for (char c : s) v = v * 10 + (c - '0');
  return v;
}

// The entries of an open dir (names only); the dir's position is not moved.
std::vector<std::string> list_dir(int dir_fd) {
  std::vector<std::string> names;
  const int fd = ::dup(dir_fd);
  if (fd < 0) return names;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return names;
  }
  ::rewinddir(d);
  while (const dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
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

bool parse_compact_claim(std::string_view name, CompactClaim* out) {
  if (name.size() < 2 || name[0] != '.') return false;
  const size_t at = name.rfind(kClaimMark);
  if (at == std::string_view::npos || at < 2) return false;
  const std::string_view owner = name.substr(at + kClaimMark.size());
  CompactClaim c;
  c.fragment = std::string(name.substr(1, at - 1));
  if (all_digits(owner)) {  // an older build's ".<frag>.compacting-<pid>"
    c.pid = to_long(owner);
  } else {
    const size_t dash = owner.rfind('-');
    if (dash == std::string_view::npos || dash == 0 || !all_digits(owner.substr(dash + 1))) return false;
    c.host = std::string(owner.substr(0, dash));
    c.pid = to_long(owner.substr(dash + 1));
  }
  if (c.pid <= 0) return false;
  *out = std::move(c);
  return true;
}

bool local_pid_dead(long pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

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

std::vector<RecoveredClaim> recover_dead_claims(int dir_fd, const std::string& own_fragment) noexcept {
  std::vector<RecoveredClaim> out;
  try {
    const std::string host = name_host();
    for (const std::string& n : list_dir(dir_fd)) {
      CompactClaim c;
      if (!parse_compact_claim(n, &c) || c.host != host || !local_pid_dead(c.pid)) continue;
      RecoveredClaim r;
      r.claim = n;
      if (!own_fragment.empty() && c.fragment == own_fragment) {
        r.own = true;  // the caller's own: its write merges it
        out.push_back(std::move(r));
        continue;
      }
      const bool to_fragment = !exists_at(dir_fd, c.fragment) && fragment_writer_dead(c.fragment);
      r.put_as = put_back_claim(dir_fd, n, c.fragment, to_fragment, c.host, c.pid, &r.error);
      out.push_back(std::move(r));
    }
  } catch (...) {
  }
  return out;
}

std::vector<std::string> foreign_claims(int dir_fd) noexcept {
  std::vector<std::string> out;
  try {
    const std::string host = name_host();
    for (const std::string& n : list_dir(dir_fd)) {
      CompactClaim c;
      if (parse_compact_claim(n, &c) && c.host != host) out.push_back(n);
    }
  } catch (...) {
  }
  return out;
}

}  // namespace dispatch::store
