// SPDX-License-Identifier: Apache-2.0
// The test binaries' own tuning cache dir: tests never read or write the
// user's. Used by tests/main.cpp and tests/gpu/main.cpp.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>
#include <system_error>

namespace kdtest {

/// A fresh, empty 0700 dir "kdispatch-test-run-XXXXXX" under the temp dir
/// ($TMPDIR; an empty value is unset for the run: /tmp), set as KDISPATCH_CACHE_DIR (the
/// default cache dir of every runtime a test builds without an explicit one),
/// unless the caller set KDISPATCH_CACHE_DIR (an empty value is unset, as the
/// library reads it). The run holds an exclusive flock on the dir while it
/// lives; the destructor removes it. First, dirs of that name that this user
/// owns, older than a minute and locked by no one (their run was killed by a
/// timeout or a signal and never reached its destructor) are removed: a lock,
/// not a pid, tells a live run (a pid says nothing across PID namespaces
/// sharing the temp dir). ok() is false when no dir could be made; the
/// caller exits with why().
class TestCacheDir {
 public:
  TestCacheDir() {
    // An empty TMPDIR is unset for the whole run (the tests' own temp files too).
    if (const char* t = std::getenv("TMPDIR"); t != nullptr && *t == '\0') unsetenv("TMPDIR");
    if (const char* set = std::getenv("KDISPATCH_CACHE_DIR"); set != nullptr && *set != '\0') return;
    std::error_code ec;
    const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec) {
      why_ = "no temp dir ($TMPDIR): " + ec.message();
      return;
    }
    sweep(tmp);
    std::string dir = (tmp / (std::string(kPrefix) + "XXXXXX")).string();
    if (mkdtemp(dir.data()) == nullptr) {
      why_ = "cannot make " + dir;
      return;
    }
    made_ = dir;
    // Where the file system has no flock, no sweep can take the lock either:
    // the run goes on unlocked.
    fd_ = open(made_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd_ >= 0) (void)flock(fd_, LOCK_EX);
    setenv("KDISPATCH_CACHE_DIR", made_.c_str(), 1);
  }
  ~TestCacheDir() {
    std::error_code ec;
    if (!made_.empty()) std::filesystem::remove_all(made_, ec);
    if (fd_ >= 0) close(fd_);
  }
  TestCacheDir(const TestCacheDir&) = delete;
  TestCacheDir& operator=(const TestCacheDir&) = delete;

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }

 private:
  static constexpr const char* kPrefix = "kdispatch-test-run-";

  // Dirs left by killed runs of this user: a real dir (not a link), older
  // than a minute (a run between mkdtemp and flock is not taken for dead),
  // whose lock is free. Another user's, or a live run's, are left alone.
  static void sweep(const std::filesystem::path& tmp) {
    std::error_code ec;
    const std::string prefix = kPrefix;
    for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
      if (e.path().filename().string().compare(0, prefix.size(), prefix) != 0) continue;
      struct stat st {};
      if (lstat(e.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
          std::time(nullptr) - st.st_mtime < 60)
        continue;
      const int fd = open(e.path().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) continue;
      if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        std::error_code rm;
        std::filesystem::remove_all(e.path(), rm);
      }
      close(fd);
    }
  }
  std::string made_, why_;
  int fd_ = -1;
};

}  // namespace kdtest
