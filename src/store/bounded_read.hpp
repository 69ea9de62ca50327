// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the one bounded file reader (docs/config-files.md#limits).
//
// Every file input of the library and the CLI (config files, merge's
// sources, the cache writer's re-read of a table, `tune --shapes`, model
// files) is read through it, so each has the same guarantees: the open never
// blocks (O_NONBLOCK: a FIFO with no writer is refused, not waited on), only
// a regular file is read (a FIFO, a device such as /dev/zero, a directory
// are refused with what they are), a file over the limit is refused before
// anything is allocated, and no more than the size fstat gave is read (a
// file that grows while it is read is read as it was). Never a hang, never
// an unbounded allocation.
//
// Thread-safety: reentrant; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dispatch::store {

struct BoundedRead {
  /// Largest accepted size in bytes; < 0: kMaxInputFileBytes (256 MiB; the
  /// library's loader passes limits().max_file_bytes, which tests lower).
  /// The CLI compiles this file too (it links only the exported API).
  int64_t limit = -1;
  /// Refuse a symbolic link at the last component (O_NOFOLLOW).
  bool nofollow = false;
  /// Zero bytes appended after the data (not counted in the size; for
  /// simdjson's padding).
  size_t padding = 0;
  /// What the error messages call the file (default: the path).
  std::string shown;
  /// Where the limit comes from, for the message (default: "the limit for one
  /// input file (docs/config-files.md#limits)").
  std::string limit_name;
};

/// Why a read failed (ok: it did not).
enum class ReadError { ok, missing, not_regular, too_large, symlink, io };

/// Reads the whole regular file `path` (relative names against `dir_fd`,
/// AT_FDCWD for the cwd) into *out (replaced; data then `opt.padding` zero
/// bytes; out->size() - padding is the file's size). Returns ReadError::ok,
/// or the kind of failure with *why a sentence naming the file (and, for
/// too_large, its size and the limit). Nothing is allocated past
/// limit + padding bytes.
ReadError read_bounded_at(int dir_fd, const std::string& path, std::string* out, const BoundedRead& opt,
                          std::string* why);

/// read_bounded_at(AT_FDCWD, ...).
ReadError read_bounded(const std::string& path, std::string* out, const BoundedRead& opt, std::string* why);

/// Opens `path` (relative to `dir_fd`) as read_bounded_at does and checks it:
/// on ok, *fd is the open descriptor (the caller closes it) and *size the
/// file's size (<= the limit); for callers that read into their own buffer.
/// On too_large, *size is the file's size (for the caller's own message;
/// nothing is read or allocated) and *fd is -1.
ReadError open_bounded_at(int dir_fd, const std::string& path, const BoundedRead& opt, int* fd, size_t* size,
                          std::string* why);

/// Reads at most `size` bytes of an fd from open_bounded_at into `dst`;
/// *got the bytes read (< size when the file shrank). A file that grew past
/// `size` is not an error here (the caller parsed what the size promised).
/// False with *why on a read error.
bool read_fd_into(int fd, char* dst, size_t size, size_t* got, std::string* why);

}  // namespace dispatch::store
