// SPDX-License-Identifier: Apache-2.0
#include "tune/harness.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <chrono>

namespace dispatch::tune {

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
