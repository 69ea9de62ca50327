// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — graph captures seen by the op path, and what the
// tuner does about them (issue 20 item 7).
//
// A search launches kernels, allocates and synchronises: inside an engine's
// CUDA/HIP graph capture that breaks the capture (cudaErrorStreamCapture*
// on a blocking stream, or kernels recorded into the graph). So:
//  - sync mode: a miss on a capturing stream is not searched; it is
//    deferred and searched (on scratch buffers) by the next sync-mode miss
//    outside a capture while no noted stream captures;
//  - background mode: the miss is queued as always and its stream noted;
//    before each search the tuner asks whether a noted stream is being
//    captured and waits while one is.
// The op path asks nothing on a hit; on a miss it asks the capture query in
// sync mode only (the tuner's thread asks in background mode). A capture
// made only of hits is never seen, and needs nothing: no search runs for it.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "dispatch/types.hpp"

namespace dispatch::tune {

/// True when `stream` is being captured into a graph; false on errors.
using CaptureQuery = bool (*)(void* stream) noexcept;

/// Whether `stream` of `backend` is being captured into a graph: the test
/// override when one is set, else the backend's answer (false for the host
/// and for a backend not compiled in).
bool stream_capturing(DeviceType backend, void* stream) noexcept;

/// Tests: fakes the capture query of `backend` (nullptr restores the real
/// one). Set it before the runtime under test makes calls.
void set_capture_query_for_tests(DeviceType backend, CaptureQuery q) noexcept;

/// The streams the op path saw capturing, until they stop.
class CaptureWatch {
 public:
  /// A miss was seen on `stream` of `backend` (op path: the same stream as
  /// the last note costs one atomic load, no lock).
  void note(DeviceType backend, void* stream) noexcept;
  /// True while a noted stream is capturing (each asked through its
  /// backend's capture query). Noted streams stay noted (at most 64, the
  /// first ones): a destroyed stream's handle answers "not capturing" (an
  /// error) or, reused by a new stream, that stream's state.
  bool any_capturing() noexcept;

 private:
  std::atomic<void*> last_{nullptr};
  std::mutex mu_;
  std::vector<std::pair<DeviceType, void*>> streams_;  ///< bounded (kMax)
  static constexpr size_t kMax = 64;
};

}  // namespace dispatch::tune
