// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — splitting a tuning catalogue into shards (issue 22).
//
// The unit of work is (key, M). A unit belongs to shard i of n when
//   XXH3-64(unit text) mod n == i,
// where the unit text, version 1, is
//   "kdispatch-unit-v1|<op>|<key fields>|M=<M>"
// with <key fields> the key's canonical file-name text without the device
// (e.g. "N=4096,K=4096,dtype=bf16"): independent of the order of the shape
// lists, of the host and of the platform (XXH3-64 with seed 0 of the UTF-8
// bytes). A new text or hash gets a new version tag, never a silent change.
//
// `--shard auto` takes the shard from the launcher's variables, first found:
//   torchrun        RANK / WORLD_SIZE (and LOCAL_RANK: the GPU ordinal)
//   Slurm array     SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN (0 when unset)
//                   of SLURM_ARRAY_TASK_COUNT
//   Kubernetes      JOB_COMPLETION_INDEX (an indexed Job) of
//                   KDISPATCH_SHARD_COUNT (the Job's completions, which the
//                   manifest passes: Kubernetes exports no count)
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace kdispatch_cli {

/// One shard of a catalogue: units whose hash mod count == index.
struct Shard {
  int64_t index = 0;
  int64_t count = 1;
  /// Where it came from: "--shard 1/4", "torchrun (RANK=1, WORLD_SIZE=4)", ...
  std::string source;
  /// torchrun's LOCAL_RANK when the shard came from torchrun (the GPU ordinal), else -1.
  int32_t local_rank = -1;
  bool from_torchrun = false;
};

/// Reads an environment variable (std::getenv by default; tests inject one).
using EnvFn = std::function<const char*(const char*)>;

/// Parses --shard's value: "i/n" (0 <= i < n) or "auto" (the launcher's
/// variables through `env`). nullopt with *error naming the value or the
/// variables on failure.
std::optional<Shard> parse_shard(std::string_view text, const EnvFn& env, std::string* error);

/// The version-1 unit text of (op, key fields, M).
std::string unit_text(std::string_view op, std::string_view key_fields, int64_t m);

/// XXH3-64 (seed 0) of unit_text(op, key_fields, m).
uint64_t unit_hash(std::string_view op, std::string_view key_fields, int64_t m);

/// Whether a unit of hash `h` is in `s`.
inline bool in_shard(const Shard& s, uint64_t h) {
  return s.count <= 1 || h % static_cast<uint64_t>(s.count) == static_cast<uint64_t>(s.index);
}

}  // namespace kdispatch_cli
