// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — shards of a tuning catalogue (see shard.hpp).
#include "cli/shard.hpp"

#include <charconv>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kdispatch_cli {
namespace {

bool parse_i64(std::string_view v, int64_t* out) {
  if (v.empty()) return false;
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, *out);
  return ec == std::errc() && p == end;
}

/// The value of `name`, parsed; nullopt when unset; *bad set when set but not an integer.
std::optional<int64_t> env_int(const EnvFn& env, const char* name, std::string* bad) {
  const char* v = env(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  int64_t x = 0;
  if (!parse_i64(v, &x)) {
    *bad = std::string(name) + "='" + v + "' is not an integer";
    return std::nullopt;
  }
  return x;
}

std::optional<Shard> checked(Shard s, std::string* error) {
  if (s.count < 1 || s.index < 0 || s.index >= s.count) {
    *error = s.source + ": the shard index must be in [0, count) and the count >= 1";
    return std::nullopt;
  }
  return s;
}

}  // namespace

std::optional<Shard> parse_shard(std::string_view text, const EnvFn& env, std::string* error) {
  if (text != "auto") {
    const size_t slash = text.find('/');
    Shard s;
    s.source = "--shard " + std::string(text);
    if (slash == std::string_view::npos || !parse_i64(text.substr(0, slash), &s.index) ||
        !parse_i64(text.substr(slash + 1), &s.count)) {
      *error = "--shard " + std::string(text) + ": expected i/n (e.g. 0/4) or auto";
      return std::nullopt;
    }
    return checked(s, error);
  }
  std::string bad;
  // torchrun: one process per GPU.
  const auto rank = env_int(env, "RANK", &bad), world = env_int(env, "WORLD_SIZE", &bad);
  if (rank && world) {
    Shard s{*rank, *world, "torchrun (RANK=" + std::to_string(*rank) + ", WORLD_SIZE=" + std::to_string(*world) + ")"};
    s.from_torchrun = true;
    const auto local = env_int(env, "LOCAL_RANK", &bad);
    if (local && (*local < 0 || *local > 1023))
      bad = "LOCAL_RANK=" + std::to_string(*local) + " is not a device ordinal";
    s.local_rank = local ? static_cast<int32_t>(*local) : 0;
    // torchrun inside each task of a Slurm array or a Kubernetes Job: each
    // task tunes the whole catalogue split over its own ranks.
    if (env("SLURM_ARRAY_TASK_ID") || env("JOB_COMPLETION_INDEX"))
      s.source += "; note: the Slurm array or Kubernetes index is not used (every task tunes the whole list)";
    if (!bad.empty()) {
      *error = "--shard auto: " + bad;
      return std::nullopt;
    }
    return checked(s, error);
  }
  // Slurm job array.
  const auto task = env_int(env, "SLURM_ARRAY_TASK_ID", &bad), tasks = env_int(env, "SLURM_ARRAY_TASK_COUNT", &bad);
  if (task && tasks) {
    const int64_t min = env_int(env, "SLURM_ARRAY_TASK_MIN", &bad).value_or(0);
    Shard s{*task - min, *tasks,
            "Slurm array (SLURM_ARRAY_TASK_ID=" + std::to_string(*task) + ", SLURM_ARRAY_TASK_MIN=" +
                std::to_string(min) + ", SLURM_ARRAY_TASK_COUNT=" + std::to_string(*tasks) + ")"};
    if (!bad.empty()) {
      *error = "--shard auto: " + bad;
      return std::nullopt;
    }
    return checked(s, error);
  }
  // Kubernetes indexed Job.
  const auto index = env_int(env, "JOB_COMPLETION_INDEX", &bad);
  if (index) {
    const auto count = env_int(env, "KDISPATCH_SHARD_COUNT", &bad);
    if (!count) {
      *error = "--shard auto: JOB_COMPLETION_INDEX is set (a Kubernetes indexed Job) but " +
               (bad.empty() ? std::string("KDISPATCH_SHARD_COUNT is not") : bad) +
               "; set KDISPATCH_SHARD_COUNT to the Job's completions in the manifest";
      return std::nullopt;
    }
    Shard s{*index, *count,
            "Kubernetes indexed Job (JOB_COMPLETION_INDEX=" + std::to_string(*index) +
                ", KDISPATCH_SHARD_COUNT=" + std::to_string(*count) + ")"};
    return checked(s, error);
  }
  *error = "--shard auto: " + (bad.empty() ? std::string() : bad + "; ") +
           "no launcher variables found (torchrun's RANK and WORLD_SIZE, a Slurm array's SLURM_ARRAY_TASK_ID and "
           "SLURM_ARRAY_TASK_COUNT, or a Kubernetes indexed Job's JOB_COMPLETION_INDEX with KDISPATCH_SHARD_COUNT)";
  return std::nullopt;
}

std::string unit_text(std::string_view op, std::string_view key_fields, int64_t m) {
  std::string t = "kdispatch-unit-v1|";
  t += op;
  t += '|';
  t += key_fields;
  t += "|M=";
  t += std::to_string(m);
  return t;
}

uint64_t unit_hash(std::string_view op, std::string_view key_fields, int64_t m) {
  const std::string t = unit_text(op, key_fields, m);
  return XXH3_64bits(t.data(), t.size());
}

}  // namespace kdispatch_cli
