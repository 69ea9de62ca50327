// SPDX-License-Identifier: Apache-2.0
// The tuner's SM clock screen (issue 32, item 3; tune/harness.hpp): a batch
// timed while the clock read below 0.9x the run's median is timed again.
#include <doctest/doctest.h>

#include "tune/harness.hpp"

using dispatch::tune::ClockScreen;

TEST_CASE("clock screen: a batch below 0.9x the run's median is re-timed, up to the third try") {
  ClockScreen s;
  // No reading (no NVML): accepted, nothing recorded.
  CHECK(s.accept(0));
  CHECK(s.batches() == 0);
  CHECK(s.note("NVML test") == "");
  // The first 5 readings build the history: accepted whatever they are.
  for (unsigned mhz : {1980u, 1975u, 1500u, 1980u, 1985u}) CHECK(s.accept(mhz));
  CHECK(s.median_mhz() == doctest::Approx(1980));
  // 1782 = 0.9 x 1980: kept; 1781: refused and not recorded.
  CHECK(s.accept(1782));
  CHECK_FALSE(s.accept(1781));
  CHECK(s.discarded() == 1);
  CHECK(s.median_mhz() == doctest::Approx(1980));  // 1500, 1782 | 1975, 1980, 1980, 1985
  // The third try is kept whatever the clock, and counted.
  CHECK_FALSE(s.accept(1200));
  CHECK_FALSE(s.accept(1200));
  CHECK(s.accept(1200, /*last_try=*/true));
  CHECK(s.kept_throttled() == 1);  // recorded: 1200 1500 1782 | 1975 | 1980 1980 1985
  CHECK(s.batches() == 10);
  CHECK(s.note("NVML test") ==
        "SM clock (NVML test): median 1975 MHz over 10 batches, 3 re-timed below 90% of it, 1 kept throttled (third "
        "try)");
  // The median is of the last 256 readings: a lasting lower clock becomes
  // the run's clock instead of refusing every batch.
  ClockScreen r;
  for (int i = 0; i < 256; ++i) CHECK(r.accept(2000));
  int refused = 0;
  for (int i = 0; i < 600; ++i) refused += r.accept(1500, /*last_try=*/i % 3 == 2) ? 0 : 1;
  CHECK(r.median_mhz() == doctest::Approx(1500));
  CHECK(refused == 258);  // two of every three tries refused until 129 kept readings moved the median
}
