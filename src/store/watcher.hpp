// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — hot reload: watch config dirs and reload on change.
//
// Linux inotify on every directory of each tree, and on each root's parent
// folder: when folders change shape (created, moved, removed; a root
// replaced by a rename, or deleted and made again) every watch is made anew
// from the paths, so a tree is followed whatever happened to it. Events are
// coalesced: after the first change the watcher waits until the tree has
// been quiet for `debounce_ms`, or at most 10 x debounce_ms after that first
// change while events keep coming (an event storm, relevant or not, never
// postpones a reload for longer), then calls the callback once: a tool
// writing many files triggers one reload, an editor's temp file + rename
// pair is one change. Our own atomic writes (temp file + rename) are picked
// up at the rename. Stopping is prompt: the thread polls an eventfd
// alongside the inotify fd.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dispatch/status.hpp"

namespace dispatch::store {

class DirWatcher {
 public:
  /// Starts watching `dirs` (missing dirs are ignored). Errors: io_error when
  /// inotify is unavailable.
  static Result<std::unique_ptr<DirWatcher>> start(const std::vector<std::string>& dirs,
                                                   std::function<void()> on_change, int debounce_ms = 100);
  ~DirWatcher();  ///< stops the thread
  /// Reloads triggered so far (tests).
  int64_t reloads() const noexcept;

  struct State;

 private:
  explicit DirWatcher(std::unique_ptr<State> s) noexcept;
  std::unique_ptr<State> s_;
};

}  // namespace dispatch::store
