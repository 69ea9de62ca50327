// SPDX-License-Identifier: Apache-2.0
// The test binaries' own tuning cache dir: tests never read or write the
// user's. Used by tests/main.cpp and tests/gpu/main.cpp.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace kdtest {

/// A fresh, empty 0700 dir "kdispatch-test-cache-<pid>-XXXXXX" under the temp
/// dir, set as KDISPATCH_CACHE_DIR (the default cache dir of every runtime a
/// test builds without an explicit one), unless the caller set
/// KDISPATCH_CACHE_DIR (an empty value is unset, as the library reads it).
/// The destructor removes it. First, dirs of that name that this user owns
/// and whose process is gone (a run killed by a timeout or a signal never
/// reaches its destructor) are removed. ok() is false when no dir could be
/// made; the caller exits with a message (why()).
class TestCacheDir {
 public:
  TestCacheDir() {
    if (const char* set = std::getenv("KDISPATCH_CACHE_DIR"); set != nullptr && *set != '\0') return;
    std::error_code ec;
    const std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec) {
      why_ = "no temp dir: " + ec.message();
      return;
    }
    sweep(tmp);
    std::string dir = (tmp / ("kdispatch-test-cache-" + std::to_string(getpid()) + "-XXXXXX")).string();
    if (mkdtemp(dir.data()) == nullptr) {
      why_ = "cannot make " + dir;
      return;
    }
    made_ = dir;
    setenv("KDISPATCH_CACHE_DIR", made_.c_str(), 1);
  }
  ~TestCacheDir() {
    std::error_code ec;
    if (!made_.empty()) std::filesystem::remove_all(made_, ec);
  }
  TestCacheDir(const TestCacheDir&) = delete;
  TestCacheDir& operator=(const TestCacheDir&) = delete;

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }

 private:
  // Dirs left by killed runs of this user: the pid in the name is not a live
  // process (kill(pid, 0) answers ESRCH). Another user's, or a live run's,
  // are left alone.
  static void sweep(const std::filesystem::path& tmp) {
    std::error_code ec;
    const std::string prefix = "kdispatch-test-cache-";
    for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
      const std::string name = e.path().filename().string();
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
      struct stat st {};
      if (pid <= 0 || lstat(e.path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) continue;
      if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
      std::error_code rm;
      std::filesystem::remove_all(e.path(), rm);
    }
  }
  std::string made_, why_;
};

}  // namespace kdtest
