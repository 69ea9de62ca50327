// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — what `kdispatch tune` reports at its end: the totals
// (summarize: tuned, skipped and why, failed, the geomean speedup over the
// floor, the config files under the emit dir) and every unit's outcome, as
// text or as JSON (--json). --devices adds its workers (tune_devices.cpp).
// (tune_impl.hpp: the other pieces.)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "cli/cli.hpp"
#include "cli/tune_impl.hpp"

namespace kdispatch_cli::tune_detail {

const char* kind_name(Outcome::Kind k) {
  switch (k) {
    case Outcome::Kind::tuned: return "tuned";
    case Outcome::Kind::done: return "done";
    case Outcome::Kind::too_large: return "too_large";
    case Outcome::Kind::unsupported: return "unsupported";
    case Outcome::Kind::failed: return "failed";
  }
  return "?";
}

Summary summarize(const TuneCmdOptions& o, const Shapes& sh, const std::vector<Outcome>& results, double seconds) {
  Summary s;
  double log_sum = 0;
  for (const Outcome& r : results) {
    switch (r.kind) {
      case Outcome::Kind::tuned:
        ++s.tuned;
        if (r.us > 0 && r.default_us > 0) {
          log_sum += std::log(r.default_us / r.us);
          ++s.with_speedup;
        }
        break;
      case Outcome::Kind::done: ++s.done; break;
      case Outcome::Kind::too_large: ++s.too_large; break;
      case Outcome::Kind::unsupported: break;
      case Outcome::Kind::failed: ++s.failed; break;
    }
  }
  // Rows not tuned: unsupported here, or failed (a row of --op without its
  // dims: no_op_row).
  for (const Outcome& r : sh.unsupported) (r.kind == Outcome::Kind::failed ? s.failed : s.unsupported)++;
  s.shapes = static_cast<int64_t>(sh.jobs.size() + sh.unsupported.size());
  s.geomean = s.with_speedup ? std::exp(log_sum / static_cast<double>(s.with_speedup)) : 0.0;
  s.seconds = seconds;
  for (const std::string& op : sh.ops) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(fs::path(o.emit) / o.backend / op, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->is_regular_file(ec) && it->path().extension() == ".json" && it->path().filename().string()[0] != '.')
        s.files.push_back(fs::relative(it->path(), o.emit, ec).generic_string());
  }
  std::sort(s.files.begin(), s.files.end());
  return s;
}

namespace {

void write_outcome(JsonWriter& w, const Outcome& r) {
  w.begin_object();
  w.field("shape", r.label).field("M", r.m).field("status", kind_name(r.kind));
  if (!r.op.empty()) w.field("op", r.op);
  if (!r.variant.empty()) {
    w.field("variant", r.variant);
    w.key("config").json(r.config_json.empty() ? dsp::config_to_json(r.config) : r.config_json);
  }
  if (!r.key.empty()) w.field("key", r.key);
  if (r.kind == Outcome::Kind::tuned) {
    w.field("us", round3(r.us)).field("default_us", round3(r.default_us));
    w.field("speedup", r.us > 0 ? round3(r.default_us / r.us) : 0.0);
    w.field("candidates", r.candidates).field("rejected", r.rejected);
    w.field("margin", r.margin).field("aa_spread", std::round(r.aa_spread * 1e4) / 1e4);
    if (!r.timing.empty()) w.field("timing", r.timing);
    if (!r.why.empty()) w.field("why", r.why);
  }
  if (!r.message.empty()) w.field("message", r.message);
  if (r.queue_index >= 0) {
    w.field("worker", r.worker).field("device", r.device).field("queue_index", r.queue_index);
    w.field("attempts", r.attempts);
    w.field("unit_seconds", round3(r.seconds));
  }
  w.end_object();
}

}  // namespace

// `workers` (--devices): the JSON array of the worker slots, else "".
void print_json(const TuneCmdOptions& o, const std::string& device, const Summary& s, double budget_ms,
                const std::vector<Outcome>& results, const Shapes& sh, const std::string& workers) {
  const std::vector<Outcome>& unsupported = sh.unsupported;
  JsonWriter w;
  w.begin_object();
  w.field("op", o.op).field("emit", o.emit).field("device_name", device);
  if (sh.model) {  // --model: what it derived, and what it does not tune
    w.field("model", sh.model->description);
    w.key("ops").begin_array();
    for (const std::string& op : sh.ops) w.value(op);
    w.end_array();
    w.key("not_tuned").begin_array();
    for (const std::string& n : sh.model->not_tuned) w.value(n);
    w.end_array();
  }
  w.field("shapes", s.shapes).field("tuned", s.tuned);
  w.field("skipped", s.done + s.too_large + s.unsupported).field("skipped_done", s.done);
  w.field("skipped_too_large", s.too_large).field("skipped_unsupported", s.unsupported);
  w.field("failed", s.failed).field("seconds", round3(s.seconds)).field("geomean_speedup", round3(s.geomean));
  w.field("budget_ms", budget_ms);
  if (!workers.empty()) w.key("workers").json(workers);
  w.key("files").begin_array();
  for (const std::string& f : s.files) w.value(f);
  w.end_array();
  w.key("results").begin_array();
  for (const Outcome& r : results) write_outcome(w, r);
  for (const Outcome& r : unsupported) write_outcome(w, r);
  w.end_array();
  w.end_object();
  std::fputs((w.take() + "\n").c_str(), stdout);
}

void print_text(const TuneCmdOptions& o, const Summary& s, const Shapes& sh) {
  for (const Outcome& r : sh.unsupported)
    std::fprintf(stderr, "  %s %s M=%lld: %s\n", r.kind == Outcome::Kind::failed ? "failed" : "skipped",
                 r.label.c_str(), (long long)r.m, r.message.c_str());
  if (sh.model)
    for (const std::string& n : sh.model->not_tuned) std::printf("%s\n", n.c_str());
  const std::string ops = ops_text(sh);
  std::printf(
      "%lld %s shapes: %lld tuned, %lld skipped (%lld already in %s, %lld too large here, %lld not "
      "tunable here), %lld failed; %.1f s\n",
      (long long)s.shapes, ops.c_str(), (long long)s.tuned, (long long)(s.done + s.too_large + s.unsupported),
      (long long)s.done, o.emit.c_str(), (long long)s.too_large, (long long)s.unsupported, (long long)s.failed,
      s.seconds);
  if (s.with_speedup)
    std::printf(
        "geomean speedup vs the floor (what the engine runs without kdispatch): %.2fx over %lld tuned "
        "shapes\n",
        s.geomean, (long long)s.with_speedup);
  // A fragment (<key>.json.d/<host>-<pid>.json, the fragments write scheme)
  // is part of its table <key>.json, not a table of its own: the tables are
  // counted once each, whether written whole, as fragments or both.
  std::set<std::string> tables;
  size_t fragments = 0;
  for (const std::string& f : s.files) {
    const size_t d = f.find(".json.d/");
    fragments += d != std::string::npos;
    tables.insert(d != std::string::npos ? f.substr(0, d + 5) : f);
  }
  const std::string as = fragments ? " (written as " + std::to_string(fragments) +
                                         " fragment(s): compact them with kdispatch merge --compact)"
                                   : std::string();
  const std::string op_dir = sh.ops.size() == 1 ? ops : "{" + ops + "}";
  std::printf("%zu config file(s)%s under %s/%s/%s/%s\n", tables.size(), as.c_str(), o.emit.c_str(), o.backend.c_str(),
              op_dir.c_str(),
              s.files.empty() ? "" : " (the format configs/ holds; check them with `kdispatch validate`)");
}

}  // namespace kdispatch_cli::tune_detail
