// SPDX-License-Identifier: Apache-2.0
// The writer's two schemes (store/private_fs.hpp, locking_scheme) for the
// tests that run on both: TEST_CASE_TEMPLATE(name, T, FlockScheme,
// FragmentScheme), with `kdtest::WriterScheme scheme(T::fragments);` first.
//  - flock: the real check, on this filesystem (which honours flock);
//  - fragments: the check itself decides, on a faked flock that grants
//    every lock (as a filesystem that does not honour flock does).
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "store/loader.hpp"
#include "store/private_fs.hpp"
#include "table/snapshot.hpp"

struct FlockScheme {
  static constexpr bool fragments = false;
};
struct FragmentScheme {
  static constexpr bool fragments = true;
};
TYPE_TO_STRING_AS("flock", FlockScheme);
TYPE_TO_STRING_AS("fragments", FragmentScheme);

namespace kdtest {

inline int grant_every_flock(int, int) { return 0; }

/// Selects the writer's scheme for one scope (forgetting the cached
/// checks) and puts things back after it. KDISPATCH_CACHE_LOCKING is unset
/// meanwhile, so the check decides.
class WriterScheme {
 public:
  explicit WriterScheme(bool fragments) {
    if (const char* v = std::getenv("KDISPATCH_CACHE_LOCKING")) saved_ = v;
    ::unsetenv("KDISPATCH_CACHE_LOCKING");
    dispatch::store::set_flock_for_testing(fragments ? &grant_every_flock : nullptr);
  }
  ~WriterScheme() {
    dispatch::store::set_flock_for_testing(nullptr);
    if (saved_) ::setenv("KDISPATCH_CACHE_LOCKING", saved_->c_str(), 1);
  }
  WriterScheme(const WriterScheme&) = delete;
  WriterScheme& operator=(const WriterScheme&) = delete;

 private:
  std::optional<std::string> saved_;
};

/// The file this process writes for the table <dir>/<rel>: the table file
/// itself (flock) or its fragment <rel>.d/<host>-<pid>.json.
inline std::filesystem::path written_file(const std::filesystem::path& dir, const std::string& rel, bool fragments) {
  const std::filesystem::path t = dir / rel;
  return fragments ? t.parent_path() / dispatch::store::fragment_dir_for(t.filename().string()) /
                         dispatch::store::fragment_name()
                   : t;
}

/// The M of every row the loader serves from `dir` read as a tuning cache
/// (fingerprints checked), over all its keys, ascending.
inline std::vector<int64_t> served_ms(const std::string& dir) {
  std::vector<dispatch::store::SourceDir> dirs = {{dir, 0, true}};
  uint32_t next = 1;
  auto out =
      dispatch::store::load_config_dirs(dirs, {}, [&](const std::string&, const std::string&) { return next++; });
  auto snap = dispatch::table::Snapshot::build(out.inputs, {}, nullptr);
  std::vector<int64_t> ms;
  for (const auto& b : snap->buckets()) ms.insert(ms.end(), b.ms.begin(), b.ms.end());
  std::sort(ms.begin(), ms.end());
  return ms;
}

}  // namespace kdtest
