// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch verify`: time every committed row of this
// machine's devices against the floor, here, with the tuner's confirmation
// (dispatch::verify_rows), print each row's margin over the floor, the A/A
// spread and the verdict, and record the verdicts in the tuning cache dir
// (docs/tuning.md#verifying-shipped-rows). Unlike `validate`, which only
// checks that files parse and rows are legal, it runs the kernels.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "cli/cli.hpp"
#include "cli/op_util.hpp"
#include "core/json_write.hpp"
#include "dispatch/config.hpp"
#include "dispatch/ops.hpp"
#include "dispatch/runtime.hpp"

namespace kdispatch_cli {
namespace {

namespace dsp = dispatch;

std::string pct(double f, bool sign) {
  char b[32];
  std::snprintf(b, sizeof b, sign ? "%+.1f%%" : "%.1f%%", 100.0 * f);
  return b;
}

void row_json(dsp::core::JsonWriter& w, const dsp::RowVerification& r) {
  w.begin_object()
      .field("op", r.op)
      .field("key", r.key)
      .field("M", r.m)
      .key("config")
      .json(dsp::config_to_json(r.config));
  w.field("variant", r.variant).field("source", r.source).field("source_dir", r.source_dir);
  if (!r.status.ok()) {
    w.field("error", r.status.to_string());
  } else {
    w.field("row_us", std::round(r.row_us * 1000.0) / 1000.0)
        .field("floor_us", std::round(r.floor_us * 1000.0) / 1000.0)
        .field("margin", std::round(r.margin * 1e4) / 1e4)
        .field("required_margin", r.required_margin)
        .field("aa_spread", std::round(r.aa_spread * 1e4) / 1e4);
    w.key("ratios").begin_array();
    for (double x : r.ratios) w.value(std::round(x * 1e4) / 1e4);
    w.end_array();
    w.key("graph_ratios").begin_array();
    for (double x : r.graph_ratios) w.value(std::round(x * 1e4) / 1e4);
    w.end_array();
    w.field("timing", r.timing).field("outcome", r.outcome).field("verdict", r.verdict);
    w.field("losses", static_cast<int64_t>(r.losses)).field("recorded_in", r.recorded_in);
  }
  w.key("tuned_on");
  if (r.tuned_on.empty())
    w.null();
  else
    w.value(r.tuned_on);
  w.field("foreign_cpu", r.foreign).end_object();
}

}  // namespace

int run_verify(const VerifyOptions& o) {
  auto env = dsp::options_from_env();
  if (!env.ok()) {
    std::fprintf(stderr, "kdispatch verify: %s\n", env.status().message().c_str());
    return kExitUsage;
  }
  if (!o.op.empty() && !find_op(o.op)) {  // before the table header: a usage error prints nothing else
    std::fprintf(stderr, "kdispatch verify: --op '%s' is not %s\n", o.op.c_str(), op_names_text().c_str());
    return kExitUsage;
  }
  dsp::RuntimeOptions ro = *env;
  if (!o.configs.empty()) {  // these dirs' rows only
    ro.config_dirs = o.configs;
    ro.load_shipped_configs = false;
  }
  for (const std::string& d : ro.config_dirs) {
    std::error_code ec;
    if (!std::filesystem::is_directory(d, ec)) {
      std::fprintf(stderr, "kdispatch verify: --configs '%s' is not a directory\n", d.c_str());
      return kExitUsage;
    }
  }
  if (!o.cache.empty()) {
    std::error_code ec;
    if (std::filesystem::exists(o.cache, ec) && !std::filesystem::is_directory(o.cache, ec)) {
      std::fprintf(stderr, "kdispatch verify: --cache '%s' is not a directory\n", o.cache.c_str());
      return kExitUsage;
    }
    ro.tune.cache_dir = o.cache;
  }
  ro.tune.mode = dsp::TuneMode::off;
  // Like every offline command, verify reads (and writes) only the dirs it
  // is given: without --cache the verdicts are kept for this run only (a
  // user's cache never changes what it prints). Nothing is tuned.
  ro.tune.persist = !o.cache.empty();
  ro.tune.load_cache = false;  // committed rows only: the tuning cache's rows were tuned here
  ro.tune.verify_shipped = false;
  ro.watch = false;
  if (o.margin_given) {
    char* end = nullptr;
    const double m = std::strtod(o.margin_text.c_str(), &end);
    if (o.margin_text.empty() || *end != '\0' || !(m >= 0.0 && m <= 0.5)) {
      std::fprintf(stderr, "kdispatch verify: --margin must be a fraction in [0, 0.5], got '%s'\n",
                   o.margin_text.c_str());
      return kExitUsage;
    }
    ro.tune.margin = m;
  }
  if (o.reps > 0) ro.tune.reps = o.reps;
  if (o.no_cold_cache) ro.tune.cold_cache = false;
  if (!std::getenv("KDISPATCH_LOG_LEVEL")) ro.log_level = dsp::LogLevel::error;  // the rows below are the output
  auto rt = dsp::Runtime::create(ro);
  if (!rt.ok()) {
    std::fprintf(stderr, "kdispatch verify: cannot load the config dirs: %s\n", rt.status().to_string().c_str());
    return rt.status().code() == dsp::StatusCode::invalid_argument ? kExitUsage : kExitFailure;
  }
  const std::string cache_dir = (*rt)->cache_dir();
  if (cache_dir.empty()) {
    std::string why = "refused";
    for (const std::string& n : (*rt)->load_report().notes)
      if (n.rfind("tuning cache dir", 0) == 0) why = n;
    if (o.cache.empty())
      std::fprintf(stderr,
                   "kdispatch verify: the verdicts are kept for this run only: give --cache DIR (a serving "
                   "process's tuning cache dir) to read and record them there\n");
    else
      std::fprintf(stderr, "kdispatch verify: the verdicts are not recorded (kept for this run only): %s\n",
                   why.c_str());
  }
  if (!o.json) {
    std::printf(
        "verify: committed rows of this machine's devices timed against the floor (margin %s; a row is "
        "demoted after losing by more than it twice)\n",
        pct(ro.tune.margin, false).c_str());
    std::printf("%-18s %-58s %6s %10s %10s %8s %6s  %s\n", "op", "key", "M", "row us", "floor us", "margin", "A/A",
                "verdict");
  }
  int failures = 0;
  auto report = dsp::verify_rows(**rt, o.op, [&](const dsp::RowVerification& r) {
    if (!r.status.ok()) ++failures;
    if (o.json) return;
    if (!r.status.ok()) {
      std::printf("%-18s %-58s %6lld  could not verify: %s\n", r.op.c_str(), r.key.c_str(), (long long)r.m,
                  r.status.to_string().c_str());
    } else {
      std::printf("%-18s %-58s %6lld %10.3f %10.3f %8s %6s  %s%s\n", r.op.c_str(), r.key.c_str(), (long long)r.m,
                  r.row_us, r.floor_us, pct(r.margin, true).c_str(), pct(r.aa_spread, false).c_str(), r.verdict.c_str(),
                  r.foreign ? (r.tuned_on.empty() ? " (tuned on an unrecorded CPU)"
                                                  : (" (tuned on " + r.tuned_on + ")").c_str())
                            : "");
    }
    std::fflush(stdout);
  });
  if (!report.ok()) {
    std::fprintf(stderr, "kdispatch verify: %s\n", report.status().to_string().c_str());
    return report.status().code() == dsp::StatusCode::invalid_argument ? kExitUsage : kExitFailure;
  }
  std::string recorded;
  for (const dsp::RowVerification& r : report->rows)
    if (!r.recorded_in.empty()) recorded = r.recorded_in;
  if (o.json) {
    dsp::core::JsonWriter w;
    w.begin_object().field("margin", ro.tune.margin).field("cache_dir", cache_dir).field("verdicts", recorded);
    w.field("floor_rows", report->floor_rows).field("demoted", report->demoted);
    w.key("rows").begin_array_lines();
    for (const dsp::RowVerification& r : report->rows) row_json(w, r);
    w.end_array().end_object();
    std::printf("%s\n", w.take().c_str());
  } else {
    std::printf("%zu rows verified%s, %lld demoted now; %lld rows record the floor itself (nothing to verify)\n",
                report->rows.size() - static_cast<size_t>(failures),
                failures ? (", " + std::to_string(failures) + " could not be").c_str() : "", (long long)report->demoted,
                (long long)report->floor_rows);
    if (!recorded.empty()) std::printf("verdicts: %s\n", recorded.c_str());
  }
  return failures ? kExitFailure : kExitOk;
}

}  // namespace kdispatch_cli
