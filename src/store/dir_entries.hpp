// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — listing an open dir and removing the entries a rule
// accepts: what the writer's and the merge's sweeps of dead temp files,
// and the compaction's recovery of dead claims, read a dir with. Header
// only (the CLI links the exported API and compiles what it needs of
// src/store itself).
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

namespace dispatch::store {

/// The names of the entries of the open dir `dir_fd` ("." and ".." too),
/// read from its start through a dup of it; empty when it cannot be read.
inline std::vector<std::string> list_dir(int dir_fd) {
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

/// Removes the entries of the open dir whose name `dead` accepts (listed
/// first, then unlinked: never while the listing is open). Best effort.
inline void remove_entries_if(int dir_fd, const std::function<bool(const std::string&)>& dead) {
  for (const std::string& n : list_dir(dir_fd))
    if (dead(n)) ::unlinkat(dir_fd, n.c_str(), 0);
}

}  // namespace dispatch::store
