// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — one vendor-library handle per (thread, device)
// (cuBLAS, hipBLASLt: their handles are not shared between threads), kept
// for the thread's life; a finished thread's handles go to a pool the next
// thread takes from (as torch's handle pool: a server's short-lived threads
// do not leak one handle each); the call's device made current around a
// library call. Plain C++, header only.
#pragma once

#include <mutex>
#include <vector>

namespace dispatch::gpu {

/// The handles of one library; `Tag` makes one pool (and one thread_local
/// set) per library. Thread-safe.
template <class Tag, class Handle>
class HandlePool {
 public:
  static constexpr int kDevices = 64;

  /// The calling thread's handle on `device`: its own, else one from the
  /// pool, else `create(&h)` (true on success). nullptr when none could be
  /// had or `device` is out of range.
  template <class Create>
  static Handle acquire(int device, Create&& create) {
    thread_local Owned owned;
    if (device < 0 || device >= kDevices) return nullptr;
    Handle& h = owned.h[device];
    if (h != nullptr) return h;
    {
      Pool& p = pool();
      std::lock_guard<std::mutex> lock(p.mu);
      if (!p.free[device].empty()) {
        h = p.free[device].back();
        p.free[device].pop_back();
        return h;
      }
    }
    if (!create(&h)) h = nullptr;
    return h;
  }

 private:
  struct Pool {
    std::mutex mu;
    std::vector<Handle> free[kDevices];
  };
  static Pool& pool() {
    static auto* p = new Pool;  // outlives every thread's Owned
    return *p;
  }
  struct Owned {
    Handle h[kDevices] = {};
    ~Owned() {
      try {
        Pool& p = pool();
        std::lock_guard<std::mutex> lock(p.mu);
        for (int d = 0; d < kDevices; ++d)
          if (h[d]) p.free[d].push_back(h[d]);
      } catch (...) {
      }
    }
  };
};

/// The call's device current for the scope, the previous one restored
/// after (a vendor library's handle is per device): `Get` / `Set` are the
/// runtime's cudaGetDevice / hipGetDevice and cudaSetDevice / hipSetDevice,
/// `kOk` its success value. `ok` false when the device could not be made
/// current.
template <class Err, Err (*Get)(int*), Err (*Set)(int), Err kOk>
struct DeviceScope {
  int prev = -1;
  bool ok = true;
  explicit DeviceScope(int want) {
    if (Get(&prev) != kOk) {
      ok = false;
      return;
    }
    if (prev != want && Set(want) != kOk) ok = false;
  }
  ~DeviceScope() {
    int now = -1;
    if (prev >= 0 && Get(&now) == kOk && now != prev) (void)Set(prev);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
};

}  // namespace dispatch::gpu
