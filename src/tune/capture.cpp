// SPDX-License-Identifier: Apache-2.0
#include "tune/capture.hpp"

#include <algorithm>

#include "backends/backend.hpp"

namespace dispatch::tune {
namespace {
std::atomic<CaptureQuery> g_fake[3] = {};  // by DeviceType: cpu, cuda, hip
size_t slot(DeviceType t) noexcept { return std::min<size_t>(static_cast<size_t>(t), 2); }
}  // namespace

bool stream_capturing(DeviceType backend, void* stream) noexcept {
  if (CaptureQuery q = g_fake[slot(backend)].load(std::memory_order_acquire)) return q(stream);
  const backends::Backend* b = backends::find(backend);
  return b != nullptr && b->stream_capturing(stream);
}

void set_capture_query_for_tests(DeviceType backend, CaptureQuery q) noexcept {
  g_fake[slot(backend)].store(q, std::memory_order_release);
}

void CaptureWatch::note(DeviceType backend, void* stream) noexcept {
  if (last_.load(std::memory_order_relaxed) == stream) return;
  std::lock_guard<std::mutex> lock(mu_);
  last_.store(stream, std::memory_order_relaxed);
  for (const auto& s : streams_)
    if (s.first == backend && s.second == stream) return;
  if (streams_.size() < kMax) streams_.emplace_back(backend, stream);
}

bool CaptureWatch::any_capturing() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  // Streams stay noted (at most kMax; an engine has a few): forgetting one
  // raced with a note() that skipped the lock on its fast path.
  for (const auto& [backend, stream] : streams_) {
    if (stream_capturing(backend, stream)) return true;
  }
  return false;
}

}  // namespace dispatch::tune
