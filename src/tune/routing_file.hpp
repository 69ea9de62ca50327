// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the routing the tuner feeds a Mixture-of-Experts op
// (TuneOptions::routing; `kdispatch tune --routing`; KDISPATCH_TUNE_ROUTING):
// synthetic (core/routing.hpp: uniform, the balanced router SGLang's tuner
// assumes, or skewed), or recorded: an .npy file of int32 [tokens, top_k]
// expert ids dumped from a server (numpy's format 1.0-3.0, little-endian
// '<i4', C order), read through the one bounded reader
// (store/bounded_read.hpp). A search of M tokens takes M consecutive
// recorded tokens from an offset drawn per search (wrapping), so the
// tuned plan sees the served mix of hot and cold experts.
//
// Thread-safety: a Routing is immutable once loaded; the functions are
// reentrant.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/routing.hpp"
#include "dispatch/status.hpp"

namespace dispatch::tune {

struct Routing {
  core::Routing synthetic = core::Routing::uniform;  ///< when nothing is recorded
  std::vector<int32_t> ids;                          ///< recorded ids, [tokens, top_k] row-major
  int64_t tokens = 0, top_k = 0;
  int32_t max_id = -1;             ///< the largest recorded id (-1: none or all -1)
  std::string source = "uniform";  ///< "uniform", "skewed" or the file's path
  bool recorded() const noexcept { return tokens > 0; }
};

/// Parses TuneOptions::routing: "" or "uniform", "skewed", else the path of
/// an .npy file (read and checked now). Errors name the file and what is
/// wrong with it (not .npy, not int32 [tokens, top_k], an id below -1).
Status load_routing(const std::string& spec, Routing* out);

/// The .npy bytes of a recorded routing; `shown` names it in errors.
Status parse_routing_npy(std::string_view bytes, const std::string& shown, Routing* out);

/// Whether the routing fits a problem of `experts` experts and `top_k`
/// choices per token (a recorded one: the same top_k, ids < experts).
Status check_routing(const Routing& r, int64_t top_k, int64_t experts);

/// ids[t * ld + j] for t < rows, j < top_k: recorded rows from an offset
/// drawn from rng, else synthetic (core::fill_expert_ids). A recorded
/// routing must pass check_routing for the problem first.
void fill_routing(const Routing& r, int32_t* ids, int64_t rows, int64_t top_k, int64_t ld, int64_t experts,
                  std::mt19937& rng);

}  // namespace dispatch::tune
