// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the one bounded file reader (store/bounded_read.hpp).
#include "store/bounded_read.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "store/limits.hpp"

namespace dispatch::store {

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

ReadError open_bounded_at(int dir_fd, const std::string& path, const BoundedRead& opt, int* fd, size_t* size,
                          std::string* why) {
  *fd = -1;
  *size = 0;
  const std::string& shown = opt.shown.empty() ? path : opt.shown;
  const int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | (opt.nofollow ? O_NOFOLLOW : 0);
  int f;
  while ((f = ::openat(dir_fd, path.c_str(), flags)) < 0 && errno == EINTR) {
  }
  if (f < 0) {
    const int e = errno;
    if (e == ENOENT) {
      *why = "'" + shown + "' does not exist";
      return ReadError::missing;
    }
    if (e == ELOOP && opt.nofollow) {
      *why = "'" + shown + "' is a symbolic link: not followed";
      return ReadError::symlink;
    }
    *why = "cannot open '" + shown + "': " + std::strerror(e);
    return ReadError::io;
  }
  struct stat st {};
  if (::fstat(f, &st) != 0) {
    *why = "cannot stat '" + shown + "': " + std::strerror(errno);
    ::close(f);
    return ReadError::io;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = "'" + shown + "' is " + kind_of(st.st_mode) + ": only a regular file is read";
    ::close(f);
    return ReadError::not_regular;
  }
  const int64_t limit = opt.limit >= 0 ? opt.limit : kMaxInputFileBytes;
  if (st.st_size > limit) {
    *size = static_cast<size_t>(st.st_size);
    *why = "'" + shown + "' is " + std::to_string(st.st_size) + " bytes, over " +
           (opt.limit_name.empty() ? std::string("the limit for one input file (docs/config-files.md#limits)")
                                   : opt.limit_name) +
           " of " + std::to_string(limit) + " bytes: not read";
    ::close(f);
    return ReadError::too_large;
  }
  if (st.st_size == 0) {
    // A regular file of size 0 with content is a generated one (/proc,
    // /sys): its size is unknown until read, so it is not read here.
    char c;
    if (::pread(f, &c, 1, 0) == 1) {
      *why =
          "'" + shown + "' reports a size of 0 bytes but has content (a generated file, as in /proc or /sys): not read";
      ::close(f);
      return ReadError::not_regular;
    }
  }
  *fd = f;
  *size = static_cast<size_t>(st.st_size);
  return ReadError::ok;
}

bool read_fd_into(int fd, char* dst, size_t size, size_t* got, std::string* why) {
  *got = 0;
  while (*got < size) {
    const ssize_t r = ::read(fd, dst + *got, size - *got);
    if (r < 0) {
      if (errno == EINTR) continue;
      *why = std::string("read error: ") + std::strerror(errno);
      return false;
    }
    if (r == 0) break;  // shrank while reading: what is there
    *got += static_cast<size_t>(r);
  }
  return true;
}

ReadError read_bounded_at(int dir_fd, const std::string& path, std::string* out, const BoundedRead& opt,
                          std::string* why) {
  out->clear();
  int fd = -1;
  size_t size = 0;
  if (ReadError e = open_bounded_at(dir_fd, path, opt, &fd, &size, why); e != ReadError::ok) return e;
  try {
    out->resize(size + opt.padding);
  } catch (const std::bad_alloc&) {
    ::close(fd);
    *why =
        "cannot allocate " + std::to_string(size) + " bytes to read '" + (opt.shown.empty() ? path : opt.shown) + "'";
    return ReadError::io;
  }
  size_t got = 0;
  std::string err;
  const bool ok = read_fd_into(fd, out->data(), size, &got, &err);
  ::close(fd);
  if (!ok) {
    out->clear();
    *why = "cannot read '" + (opt.shown.empty() ? path : opt.shown) + "': " + err;
    return ReadError::io;
  }
  out->resize(got);
  out->append(opt.padding, '\0');
  return ReadError::ok;
}

ReadError read_bounded(const std::string& path, std::string* out, const BoundedRead& opt, std::string* why) {
  return read_bounded_at(AT_FDCWD, path, out, opt, why);
}

}  // namespace dispatch::store
