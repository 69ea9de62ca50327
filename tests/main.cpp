// SPDX-License-Identifier: Apache-2.0
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

// Tests never read or write the user's tuning cache. Unless the caller set
// KDISPATCH_CACHE_DIR (an empty value is unset, as the library reads it),
// each run of this binary (ctest runs one test case a process) gets a fresh,
// empty 0700 dir under the temp dir as the default cache dir of every runtime
// a test builds without an explicit one, removed when the run ends. (A
// property list given to doctest_discover_tests loses all but its first
// variable, so the binary does it itself.)
int main(int argc, char** argv) {
  std::string made;
  if (const char* set = std::getenv("KDISPATCH_CACHE_DIR"); set == nullptr || *set == '\0') {  // empty: unset
    std::error_code ec;
    std::string dir = (std::filesystem::temp_directory_path(ec) / "kdispatch-test-cache-XXXXXX").string();
    if (ec || mkdtemp(dir.data()) == nullptr) {
      std::fprintf(stderr,
                   "kdispatch_tests: cannot make a cache dir under the temp dir (%s); set KDISPATCH_CACHE_DIR\n",
                   dir.c_str());
      return 2;
    }
    made = dir;
    setenv("KDISPATCH_CACHE_DIR", made.c_str(), 1);
  }
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (!made.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(made, ec);
  }
  return rc;
}
