// SPDX-License-Identifier: Apache-2.0
#include "store/watcher.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

namespace dispatch::store {
namespace fs = std::filesystem;

struct DirWatcher::State {
  int ino = -1;
  int stop_fd = -1;
  std::function<void()> cb;
  int debounce_ms = 100;
  /// A change is acted on at most this long after it was first seen, even
  /// while events keep coming (an event every 30 ms postponed it forever).
  int max_delay_ms = 1000;
  std::vector<std::string> roots;
  std::map<int, std::string> wd_path;      // the trees' folders
  std::map<int, std::string> parent_root;  // a root's parent folder -> that root (it may be replaced)
  std::atomic<int64_t> reloads{0};
  std::thread thread;

  static constexpr uint32_t kTreeMask =
      IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF;
  static constexpr uint32_t kParentMask = IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ONLYDIR;

  void add_tree(const std::string& root) {
    std::error_code ec;
    if (!fs::is_directory(root, ec)) return;
    add_dir(root);
    for (fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
         !ec && it != end; it.increment(ec))
      if (it->is_directory(ec) && !it->is_symlink(ec)) add_dir(it->path().string());
  }
  void add_dir(const std::string& dir) {
    const int wd = inotify_add_watch(ino, dir.c_str(), kTreeMask | IN_DONT_FOLLOW);
    if (wd >= 0) wd_path[wd] = dir;
  }
  void watch_parent(const std::string& root) {
    const fs::path p = fs::path(root).lexically_normal();
    const fs::path parent = p.has_parent_path() && p.has_filename() ? p.parent_path() : fs::path(".");
    const int wd = inotify_add_watch(ino, parent.empty() ? "." : parent.c_str(), kParentMask);
    if (wd >= 0) parent_root[wd] = p.filename().string();
  }
  // The folders changed shape (a folder created, moved or removed, a root
  // replaced by a rename or deleted and made again): every watch is made
  // anew from the paths, so the trees are followed whatever happened.
  void rearm() {
    for (const auto& [wd, path] : wd_path) (void)inotify_rm_watch(ino, wd);
    wd_path.clear();
    for (const auto& r : roots) add_tree(r);
  }
  // Reads pending events; true when one concerns a *.json file or a folder.
  bool drain() {
    alignas(struct inotify_event) char buf[16384];
    bool relevant = false, reshaped = false;
    for (;;) {
      const ssize_t n = ::read(ino, buf, sizeof buf);
      if (n <= 0) break;
      for (char* p = buf; p < buf + n;) {
        auto* e = reinterpret_cast<struct inotify_event*>(p);
        p += sizeof(struct inotify_event) + e->len;
        const std::string name = e->len ? std::string(e->name) : std::string();
        if (e->mask & IN_Q_OVERFLOW) {
          relevant = reshaped = true;  // events were lost: assume anything changed
          continue;
        }
        if (auto pr = parent_root.find(e->wd); pr != parent_root.end()) {
          if (name == pr->second) relevant = reshaped = true;  // a root appeared, went or was replaced
          continue;
        }
        if (e->mask & IN_IGNORED) {
          wd_path.erase(e->wd);
          continue;
        }
        if (e->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
          relevant = reshaped = true;
        } else if (e->mask & IN_ISDIR) {
          relevant = reshaped = true;
        } else if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0 && name[0] != '.') {
          relevant = true;
        }
      }
    }
    if (reshaped) rearm();
    return relevant;
  }
  void loop() {
    using Clock = std::chrono::steady_clock;
    bool dirty = false;
    Clock::time_point first{}, last{};
    for (;;) {
      int timeout = -1;
      if (dirty) {
        const auto due =
            std::min(last + std::chrono::milliseconds(debounce_ms), first + std::chrono::milliseconds(max_delay_ms));
        timeout = static_cast<int>(std::max<int64_t>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(due - Clock::now()).count() + 1));
      }
      struct pollfd fds[2] = {{ino, POLLIN, 0}, {stop_fd, POLLIN, 0}};
      const int r = ::poll(fds, 2, timeout);
      if (r < 0 && errno != EINTR) return;
      if (fds[1].revents & POLLIN) return;
      if (r > 0 && (fds[0].revents & POLLIN) && drain()) {
        const auto now = Clock::now();
        if (!dirty) first = now;
        dirty = true;
        last = now;
      }
      // Due when the tree was quiet for debounce_ms, or max_delay_ms after
      // the first change whatever keeps coming (any file, any rate).
      const auto now = Clock::now();
      if (dirty && (now - last >= std::chrono::milliseconds(debounce_ms) ||
                    now - first >= std::chrono::milliseconds(max_delay_ms))) {
        dirty = false;
        cb();
        reloads.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
};

Result<std::unique_ptr<DirWatcher>> DirWatcher::start(const std::vector<std::string>& dirs,
                                                      std::function<void()> on_change, int debounce_ms) {
  auto s = std::make_unique<State>();
  s->ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (s->ino < 0) return make_status(StatusCode::io_error, std::string("inotify_init1: ") + std::strerror(errno));
  s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->stop_fd < 0) {
    ::close(s->ino);
    return make_status(StatusCode::io_error, std::string("eventfd: ") + std::strerror(errno));
  }
  s->cb = std::move(on_change);
  s->debounce_ms = debounce_ms;
  s->max_delay_ms = std::max(debounce_ms, 10 * debounce_ms);
  s->roots = dirs;
  for (const auto& d : dirs) {
    s->watch_parent(d);
    s->add_tree(d);
  }
  State* raw = s.get();
  s->thread = std::thread([raw] { raw->loop(); });
  return std::unique_ptr<DirWatcher>(new DirWatcher(std::move(s)));
}

DirWatcher::DirWatcher(std::unique_ptr<State> s) noexcept : s_(std::move(s)) {}

DirWatcher::~DirWatcher() {
  const uint64_t one = 1;
  (void)!::write(s_->stop_fd, &one, sizeof one);
  if (s_->thread.joinable()) s_->thread.join();
  ::close(s_->ino);
  ::close(s_->stop_fd);
}

int64_t DirWatcher::reloads() const noexcept { return s_->reloads.load(std::memory_order_relaxed); }

}  // namespace dispatch::store
