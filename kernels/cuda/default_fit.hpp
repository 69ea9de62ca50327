// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — where get_default's decode rule (our skinny
// families) serves instead of the floor (cuBLAS / cuBLASLt as torch calls
// them): the CUDA heuristics' fitted table (issue 32, item 2).
//
// Fitted on the synthetic grid bench/gpu/fit_grid.csv (N, K log-spaced
// 1024..26112 with N finer at t 1.5-2.8; no projection of the "any model"
// benchmark), H200, the rule's pick against the floor timed cold and in
// CUDA graphs (cold since 2026-12-04): `bench/gpu/run_h200.sh --sections
// fit`, then `python3 bench/gpu/fit_defaults.py fit.json --apply
// kernels/cuda/default_fit.hpp` writes these tables (data:
// bench/results/h200_default_fit.csv; the cells' numbers:
// bench/results/h200_any_model.md, run 5). A cell is (t bin, M tier), t =
// ceil(N/16) / SMs; the rule serves a cell whose grid points have, in each
// mode, a geomean >= 1.03x the floor and none below 0.95x (the tuner's
// rule: a winner wins cold and in a graph). Bit i of a bin's byte: M tier i
// (bf16: M 1, 2, 3-4, 5-8, 9-16; fp8: 1-4, 5-8, 9-16). Plain data, no GPU
// headers.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string_view>

namespace dispatch::cuda::fit {

/// Upper bounds of the t bins (geometric midpoints of the grid's t values).
inline constexpr double kTBounds[] = {0.542, 0.691, 0.874, 1.084, 1.355, 1.660, 1.878, 1.999,
                                      2.178, 2.421, 2.664, 2.935, 3.895, 6.171, 9.793};
inline constexpr uint8_t kBf16Rule[] = {0x01, 0x0e, 0x0d, 0x0c, 0x00, 0x0f, 0x1f, 0x10,
                                        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x0f};
inline constexpr uint8_t kFp8TensorRule[] = {0x00, 0x00, 0x03, 0x03, 0x00, 0x00, 0x02, 0x00,
                                             0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
inline constexpr uint8_t kFp8RowwiseRule[] = {0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07, 0x07,
                                              0x03, 0x03, 0x03, 0x03, 0x03, 0x03, 0x03, 0x00};
inline constexpr uint8_t kFp8BlockRule[] = {0x01, 0x03, 0x03, 0x03, 0x00, 0x06, 0x06, 0x06,
                                            0x02, 0x00, 0x02, 0x03, 0x02, 0x00, 0x01, 0x00};

static_assert(std::size(kBf16Rule) == std::size(kTBounds) + 1 && std::size(kFp8TensorRule) == std::size(kTBounds) + 1 &&
                  std::size(kFp8RowwiseRule) == std::size(kTBounds) + 1 &&
                  std::size(kFp8BlockRule) == std::size(kTBounds) + 1,
              "one rule byte per t bin");

/// KDISPATCH_TEST_DEFAULT_RULE=everywhere (the fit's sweep only, read once):
/// the decode rule serves every cell at M <= 16, so the sweep times the
/// rule itself where the fitted table would hand the cell to the floor.
inline bool rule_everywhere() noexcept {
  static const bool on = [] {
    const char* v = std::getenv("KDISPATCH_TEST_DEFAULT_RULE");
    return v != nullptr && std::string_view(v) == "everywhere";
  }();
  return on;
}

inline int t_bin(double t) noexcept {
  int b = 0;
  for (double x : kTBounds) b += t >= x ? 1 : 0;
  return b;
}

/// Whether the bf16/fp16 decode rule serves (M <= 16 only).
inline bool bf16_rule(double t, int64_t m) noexcept {
  if (m < 1 || m > 16) return false;
  if (rule_everywhere()) return true;
  const int tier = m == 1 ? 0 : m == 2 ? 1 : m <= 4 ? 2 : m <= 8 ? 3 : 4;
  return (kBf16Rule[t_bin(t)] >> tier) & 1;
}

/// Whether the fp8 decode rule serves layout L (0 tensor, 1 rowwise, 2 block).
inline bool fp8_rule(int layout, double t, int64_t m) noexcept {
  if (m < 1 || m > 16) return false;
  if (rule_everywhere()) return true;
  const int tier = m <= 4 ? 0 : m <= 8 ? 1 : 2;
  const uint8_t* table = layout == 0 ? kFp8TensorRule : layout == 1 ? kFp8RowwiseRule : kFp8BlockRule;
  return (table[t_bin(t)] >> tier) & 1;
}

}  // namespace dispatch::cuda::fit
