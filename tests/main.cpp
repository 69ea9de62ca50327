// SPDX-License-Identifier: Apache-2.0
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>

#include "test_cache_dir.hpp"

// Tests never read or write the user's tuning cache: each run of this binary
// (ctest runs one test case a process) gets its own dir (test_cache_dir.hpp).
// (A property list given to doctest_discover_tests loses all but its first
// variable, so the binary does it itself.)
int main(int argc, char** argv) {
  const kdtest::TestCacheDir cache;
  if (!cache.ok()) {
    std::fprintf(stderr, "kdispatch_tests: %s; set KDISPATCH_CACHE_DIR\n", cache.why().c_str());
    return 2;
  }
  setenv("OPENBLAS_NUM_THREADS", "1", 0);
  doctest::Context context(argc, argv);
  return context.run();
}
