// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — verifying committed rows on this machine
// (docs/tuning.md#verifying-shipped-rows).
//
// A committed row (the shipped configs/, a config dir) claims that its plan
// beats the floor by the margin; that was measured on the machine that
// tuned it. A verification times the row's plan against the floor here with
// the search's own confirmation (tune::verify_plan: one timing method for
// every tuning path) and judges it:
//   ahead          faster than the floor on every placement and by more
//                  than the margin on average (the rule that admits a winner)
//   lost           the floor wins by that same rule, or the row fails here
//                  (a launch failure, an output that differs from the reference)
//   within margin  neither
// Each verification is recorded in the verdict cache, a small JSON file of
// the tuning cache dir, <cache>/.verify/<backend>-<hash>.json, keyed by the
// identity of the machine and build: the backend's tuning fingerprint and,
// on the CPU, the CPU's vendor, family and model (a new build, device or
// CPU reads an empty cache). A row whose losses since its last win reach
// kDemoteAfterLosses is demoted: when the table is built the floor serves
// its M (Runtime::Impl::apply_verdicts); a win resets the count. Verdicts
// apply to a row's exact config: a row rewritten since reads as unverified.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "dispatch/config.hpp"
#include "dispatch/status.hpp"
#include "dispatch/types.hpp"
#include "tune/search.hpp"

namespace dispatch::tune {

/// Losses beyond the margin, since the last win, that demote a row.
inline constexpr int32_t kDemoteAfterLosses = 2;

enum class Outcome : uint8_t { ahead, within_margin, lost };
/// "ahead" | "within margin" | "lost".
const char* outcome_name(Outcome o) noexcept;

/// The outcome of a verify_plan() result at `margin` (lost: the floor won by
/// the margin in either timing mode); *mean_ratio (optional) receives row /
/// floor averaged over the placements in the row's worse mode (0 when the
/// row failed).
Outcome judge(const SearchResult& r, double margin, double* mean_ratio = nullptr) noexcept;

/// One row's verdict as cached.
struct Verdict {
  std::string config;         ///< the row's config (config_to_json): the verdict holds for it only
  int32_t losses = 0;         ///< verifications lost since the last win
  int32_t verifications = 0;  ///< verifications recorded (any outcome)
  std::string last;           ///< outcome_name of the last verification
  double ratio = 0.0;         ///< its row / floor mean ratio
  double aa_spread = 0.0;     ///< its floor's A/A spread
  double margin = 0.0;        ///< its margin
  std::string source;         ///< the row's file, as the table names it

  bool demoted() const noexcept { return losses >= kDemoteAfterLosses; }
  /// "ahead" | "within margin" | "lost once" | "demoted" (what `verify` prints).
  std::string state() const;
};

/// "<key> M=<m>": a row's id in the verdict cache.
std::string row_id(const std::string& key, int64_t m);

/// What verdicts of `backend` are cached under: {"fingerprint": {...}} with,
/// on the CPU, "cpu": {...} (host_cpu_identity()). "" when the backend has
/// no fingerprint here (no usable device).
std::string verdict_identity(DeviceType backend);

/// <cache_dir>/.verify/<backend>-<16 hex of XXH3-64(identity)>.json.
std::string verdict_path(const std::string& cache_dir, DeviceType backend, const std::string& identity);

/// The verdicts of one file: rows by id. A file recorded under another
/// identity (or absent, or not parsing) reads as empty.
struct Verdicts {
  std::map<std::string, Verdict> rows;
  /// The verdict of `id` for `config`, or nullptr (none, or one recorded
  /// for another config).
  const Verdict* find(const std::string& id, const std::string& config) const;
};
Verdicts load_verdicts(const std::string& path, const std::string& identity) noexcept;

/// Applies one verification to `v` (its config set to `config`; a verdict
/// of another config starts afresh): a loss adds one, a win resets the count.
void apply_outcome(Verdict* v, const std::string& config, Outcome o, double ratio, double aa_spread, double margin,
                   const std::string& source);

/// The verdicts of a runtime without a usable cache dir, kept in memory
/// (one per runtime, shared by its tuner and its table builds). Thread-safe.
class MemoryVerdicts {
 public:
  /// apply_outcome() on row `id` of `backend`; the new verdict.
  Verdict record(DeviceType backend, const std::string& id, const std::string& config, Outcome o, double ratio,
                 double aa_spread, double margin, const std::string& source);
  /// The verdicts of `backend`.
  Verdicts of(DeviceType backend) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<DeviceType, std::string>, Verdict> rows_;
};

/// Records one verification of row `id` in `cache_dir`'s verdict file of
/// `backend` under its lock (read, apply_outcome, write a temp file, fsync,
/// rename: store/private_fs.hpp's rules, the dir 0700). Returns the row's new
/// verdict. Errors: io_error naming the path. Where flock is not honoured two
/// processes recording at once may lose one record (a demotion then takes
/// one more verification).
Result<Verdict> record_verdict(const std::string& cache_dir, DeviceType backend, const std::string& identity,
                               const std::string& id, const std::string& config, Outcome o, double ratio,
                               double aa_spread, double margin, const std::string& source) noexcept;

}  // namespace dispatch::tune
