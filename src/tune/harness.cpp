// SPDX-License-Identifier: Apache-2.0
#include "tune/harness.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <chrono>

namespace dispatch::tune {

namespace {
// The sweep buffer, shared read-only by every CpuClock (allocated once).
// Its size: 3x the last-level cache, clamped to [8, 96] MiB — a VM can
// report a socket-wide L3 (hundreds of MB) while a core only ever uses its
// CCD's slice, and a sweep per rep must stay affordable.
const std::vector<uint64_t>& sweep_buffer(int64_t llc_bytes) {
  static const std::vector<uint64_t> buf = [llc_bytes] {
    const int64_t llc = llc_bytes > 0 ? llc_bytes : (32LL << 20);
    const int64_t bytes = std::clamp<int64_t>(3 * llc, 8LL << 20, 96LL << 20);
    return std::vector<uint64_t>(static_cast<size_t>(bytes / 8), 1);
  }();
  return buf;
}
}  // namespace

CpuClock::CpuClock(int64_t llc_bytes) : llc_bytes_(llc_bytes) {}

void CpuClock::flush() {
  if (!sweep_) sweep_ = &sweep_buffer(llc_bytes_);  // allocated on first use only
  uint64_t s = 0;
  // One read per cache line is enough to evict; the stride keeps it cheap.
  const std::vector<uint64_t>& b = *sweep_;
  for (size_t i = 0; i < b.size(); i += 8) s += b[i];
  sink_ = sink_ + s;
}

Result<double> CpuClock::time_us(const std::function<Status()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  Status s = fn();
  const auto t1 = std::chrono::steady_clock::now();
  if (!s.ok()) return s;
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

Timing summarize(std::vector<double> v) {
  Timing t;
  if (v.empty()) return t;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    const double pos = q * static_cast<double>(v.size() - 1);
    const size_t lo = static_cast<size_t>(pos);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
  };
  t.median_us = at(0.5);
  t.p10_us = at(0.1);
  t.p90_us = at(0.9);
  t.min_us = v.front();
  t.max_us = v.back();
  t.reps = static_cast<int32_t>(v.size());
  return t;
}

Result<std::vector<double>> Clock::time_reps(const std::function<Status()>& prepare, const std::function<Status()>& fn,
                                             int n, bool cold) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(std::max(n, 0)));
  for (int i = 0; i < n; ++i) {
    if (prepare) {
      if (Status s = prepare(); !s.ok()) return s;
    }
    if (cold) flush();
    auto t = time_us(fn);
    if (!t.ok()) return t.status();
    out.push_back(*t);
  }
  return out;
}

Result<std::vector<double>> Clock::time_graph(const std::function<Status(int, void*)>& fn, int calls, int reps) {
  (void)fn, (void)calls, (void)reps;
  return make_status(StatusCode::unsupported_problem, "this clock does not time in graphs");
}

double ClockScreen::median_locked() const {
  if (ring_.empty()) return 0.0;
  std::vector<unsigned> c = ring_;
  std::nth_element(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(c.size() / 2), c.end());
  return static_cast<double>(c[c.size() / 2]);
}

bool ClockScreen::accept(unsigned mhz, bool last_try) {
  if (mhz == 0) return true;
  std::lock_guard<std::mutex> lock(mu_);
  ++batches_;
  const bool low =
      static_cast<int>(ring_.size()) >= min_history_ && static_cast<double>(mhz) < ratio_ * median_locked();
  if (low && !last_try) {
    ++discarded_;
    return false;  // not recorded: a throttled stretch must not drag the median down
  }
  if (low) ++kept_throttled_;
  if (ring_.size() < 256) {
    ring_.push_back(mhz);
  } else {
    ring_[next_] = mhz;
    next_ = (next_ + 1) % ring_.size();
  }
  return true;
}

int64_t ClockScreen::batches() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_;
}
int64_t ClockScreen::discarded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return discarded_;
}
int64_t ClockScreen::kept_throttled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_throttled_;
}
double ClockScreen::median_mhz() const {
  std::lock_guard<std::mutex> lock(mu_);
  return median_locked();
}

std::string ClockScreen::note(const std::string& source) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (batches_ == 0) return {};
  std::string s = "SM clock (" + source + "): median " + std::to_string(static_cast<int64_t>(median_locked())) +
                  " MHz over " + std::to_string(batches_) + " batches, " + std::to_string(discarded_) +
                  " re-timed below " + std::to_string(static_cast<int>(ratio_ * 100)) + "% of it";
  if (kept_throttled_ > 0) s += ", " + std::to_string(kept_throttled_) + " kept throttled (third try)";
  return s;
}

ClockScreen& clock_screen_of(const std::string& device) {
  static std::mutex mu;
  // Never freed: a tuner thread's clock may still screen during exit.
  static auto* screens = new std::map<std::string, std::unique_ptr<ClockScreen>>();
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<ClockScreen>& s = (*screens)[device];
  if (!s) s = std::make_unique<ClockScreen>();
  return *s;
}

Result<Timing> measure(Clock& clock, const std::function<Status()>& prepare, const std::function<Status()>& fn,
                       const MeasureOptions& o) {
  for (int32_t i = 0; i < o.warmup; ++i) {
    if (prepare) {
      if (Status s = prepare(); !s.ok()) return s;
    }
    if (Status s = fn(); !s.ok()) return s;
  }
  const int reps = std::max(o.reps, 1);
  std::vector<double> samples;
  samples.reserve(static_cast<size_t>(reps));
  double total = 0.0;
  while (static_cast<int>(samples.size()) < reps) {
    const int done = static_cast<int>(samples.size());
    const int batch = done == 0 ? std::min(reps, 3) : std::min(reps - done, 8);
    auto t = clock.time_reps(prepare, fn, batch, o.cold_cache);
    if (!t.ok()) return t.status();
    if (t->empty()) return make_status(StatusCode::internal, "the clock returned no timed reps");
    for (double v : *t) {
      samples.push_back(v);
      total += v;
    }
    if (samples.size() >= 3) {
      if (o.max_total_us > 0 && total > o.max_total_us) break;
      if (o.abandon_above_us > 0) {
        std::vector<double> c = samples;
        std::nth_element(c.begin(), c.begin() + c.size() / 2, c.end());
        if (c[c.size() / 2] > o.abandon_above_us) break;
      }
    }
  }
  return summarize(std::move(samples));
}

}  // namespace dispatch::tune
