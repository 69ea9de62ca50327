// SPDX-License-Identifier: Apache-2.0
// kdispatch — why a config dir cannot be read, or "" (internal): one rule for
// RuntimeOptions::config_dirs (Runtime::create refuses such a dir) and
// KDISPATCH_CONFIG_DIRS (options_from_env skips it with a warning).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace dispatch::api {

/// "'<path>' does not exist" / "is not a directory" / "cannot be reached
/// (permission denied on a parent directory)" / "cannot be read (permission
/// denied)" / "cannot be read (<strerror>)"; "" for a readable directory.
inline std::string config_dir_problem(const std::string& path) {
  struct stat st {};
  const std::string q = "'" + path + "' ";
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) return q + "does not exist";
    if (e == EACCES) return q + "cannot be reached (permission denied on a parent directory)";
    return q + "cannot be read (" + std::strerror(e) + ")";
  }
  if (!S_ISDIR(st.st_mode)) return q + "is not a directory";
  if (::access(path.c_str(), R_OK | X_OK) != 0)
    return q + "cannot be read (" + (errno == EACCES ? std::string("permission denied") : std::strerror(errno)) + ")";
  return "";
}

}  // namespace dispatch::api
