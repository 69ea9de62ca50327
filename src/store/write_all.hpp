// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — writing a whole string to a file descriptor: what the
// cache writer, tune/verify.cpp and the CLI's tune workers and supervisor
// write with. Header only (the CLI links the exported API and
// compiles what it needs of src/store itself).
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <string>

namespace dispatch::store {

/// Writes all of `s` to `fd`, retrying on EINTR and short writes; false on
/// an error (errno set) or a write that makes no progress.
inline bool write_all(int fd, const std::string& s) noexcept {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace dispatch::store
