// SPDX-License-Identifier: Apache-2.0
#include "store/watcher.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

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
  std::map<int, std::string> wd_path;
  std::atomic<int64_t> reloads{0};
  std::thread thread;

  void add_tree(const std::string& root) {
    std::error_code ec;
    if (!fs::is_directory(root, ec)) return;
    add_dir(root);
    for (fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
         !ec && it != end; it.increment(ec))
      if (it->is_directory(ec)) add_dir(it->path().string());
  }
  void add_dir(const std::string& dir) {
    const uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE | IN_DELETE_SELF;
    const int wd = inotify_add_watch(ino, dir.c_str(), mask);
    if (wd >= 0) wd_path[wd] = dir;
  }
  // Reads pending events; true when one concerns a *.json file or a dir.
  bool drain() {
    alignas(struct inotify_event) char buf[16384];
    bool relevant = false;
    for (;;) {
      const ssize_t n = ::read(ino, buf, sizeof buf);
      if (n <= 0) break;
      for (char* p = buf; p < buf + n;) {
        auto* e = reinterpret_cast<struct inotify_event*>(p);
        p += sizeof(struct inotify_event) + e->len;
        const std::string name = e->len ? std::string(e->name) : std::string();
        if (e->mask & IN_ISDIR) {
          if (e->mask & (IN_CREATE | IN_MOVED_TO)) {
            auto it = wd_path.find(e->wd);
            if (it != wd_path.end()) add_tree(it->second + "/" + name);
          }
          relevant = true;
        } else if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0 && name[0] != '.') {
          relevant = true;
        }
      }
    }
    return relevant;
  }
  void loop() {
    bool dirty = false;
    auto last = std::chrono::steady_clock::now();
    for (;;) {
      struct pollfd fds[2] = {{ino, POLLIN, 0}, {stop_fd, POLLIN, 0}};
      const int timeout = dirty ? debounce_ms : -1;
      const int r = ::poll(fds, 2, timeout);
      if (r < 0 && errno != EINTR) return;
      if (fds[1].revents & POLLIN) return;
      if (r > 0 && (fds[0].revents & POLLIN)) {
        if (drain()) {
          dirty = true;
          last = std::chrono::steady_clock::now();
        }
        continue;
      }
      if (dirty && std::chrono::steady_clock::now() - last >= std::chrono::milliseconds(debounce_ms)) {
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
  for (const auto& d : dirs) s->add_tree(d);
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
