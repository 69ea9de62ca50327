// SPDX-License-Identifier: Apache-2.0
// The clock base class's default methods and the SM-clock screen.
#include "backends/clock.hpp"

#include <algorithm>
#include <map>
#include <memory>

namespace dispatch::backends {

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

}  // namespace dispatch::backends
