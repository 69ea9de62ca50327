// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — synthetic MoE routing: the expert ids and router
// weights the tuner (core::Fill::expert_ids / routing_weights), the tests
// and the benchmarks feed a Mixture-of-Experts op.
//
// uniform: each token's top_k experts drawn without replacement, every
//   expert equally likely (a balanced router, what SGLang's tuner draws).
// skewed: the same, each expert's weight 1 / (rank + 1)^1.1 over a fixed
//   random ranking of the E experts, so a few hot experts take most tokens
//   (what served traffic looks like before load balancing).
// Router weights: a softmax of random logits over the chosen experts, each
// row summing to 1 (a renormalised top-k).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace dispatch::core {

enum class Routing : uint8_t { uniform = 0, skewed = 1 };

/// Fills ids[t * ld + j] (t < rows, j < top_k) with top_k distinct experts
/// in [0, experts) per row (or every expert, then -1, when top_k > experts).
inline void fill_expert_ids(int32_t* ids, int64_t rows, int64_t top_k, int64_t ld, int64_t experts, Routing r,
                            std::mt19937& rng) {
  std::vector<double> w(static_cast<size_t>(experts > 0 ? experts : 0), 1.0);
  if (r == Routing::skewed && experts > 0) {
    std::vector<int64_t> rank(static_cast<size_t>(experts));
    std::iota(rank.begin(), rank.end(), int64_t{0});
    std::mt19937 fixed(0x726f7574u);  // one ranking for every call: the same hot experts
    std::shuffle(rank.begin(), rank.end(), fixed);
    for (int64_t e = 0; e < experts; ++e)
      w[static_cast<size_t>(rank[static_cast<size_t>(e)])] = 1.0 / std::pow(static_cast<double>(e + 1), 1.1);
  }
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<double> left;
  for (int64_t t = 0; t < rows; ++t) {
    left = w;
    double total = std::accumulate(left.begin(), left.end(), 0.0);
    for (int64_t j = 0; j < top_k; ++j) {
      int32_t pick = -1;
      if (total > 0.0) {
        double x = u(rng) * total;
        for (int64_t e = 0; e < experts; ++e) {
          const double we = left[static_cast<size_t>(e)];
          if (we <= 0.0) continue;
          pick = static_cast<int32_t>(e);
          if (x < we) break;
          x -= we;
        }
        total -= left[static_cast<size_t>(pick)];
        left[static_cast<size_t>(pick)] = 0.0;
      }
      ids[t * ld + j] = pick;
    }
  }
}

/// Fills w[t * ld + j] with a softmax of random logits over each row's top_k.
inline void fill_routing_weights(float* w, int64_t rows, int64_t top_k, int64_t ld, std::mt19937& rng) {
  std::normal_distribution<float> n(0.f, 1.f);
  for (int64_t t = 0; t < rows; ++t) {
    float sum = 0.f;
    for (int64_t j = 0; j < top_k; ++j) sum += (w[t * ld + j] = std::exp(n(rng)));
    for (int64_t j = 0; j < top_k; ++j) w[t * ld + j] /= sum;
  }
}

}  // namespace dispatch::core
