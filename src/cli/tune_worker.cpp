// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch tune --devices`: the worker process
// (`tune --internal-worker`), and the line protocol it and the parent
// (tune_supervisor.cpp) speak, both ends side by side: the parent's unit
// messages on the worker's stdin, the worker's ready and result messages
// on its fd 3 (tune_devices.cpp's header comment has the fields). A worker
// is a runtime over the emit dir on --device that tunes one unit at a time
// (tune_unit, tune.cpp) until its stdin ends. The test hooks
// (KDISPATCH_TEST_WORKER_*) are read here. (tune_impl.hpp: the other
// pieces.)
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli.hpp"
#include "cli/op_util.hpp"
#include "cli/tune_impl.hpp"

namespace kdispatch_cli::tune_detail {

// ---------------------------------------------------------------- the protocol

// A message text as one field of the protocol: no tab, no newline.
std::string one_field(std::string v) {
  for (char& c : v)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return v;
}

std::vector<std::string> split_tabs(std::string_view l) {
  std::vector<std::string> f;
  size_t start = 0;
  while (true) {
    const size_t tab = l.find('\t', start);
    f.emplace_back(l.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start));
    if (tab == std::string_view::npos) return f;
    start = tab + 1;
  }
}

namespace {

double parse_double(const std::string& v) {
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  return end && *end == '\0' && std::isfinite(d) ? d : 0.0;
}

// A worker result's kind.
Outcome::Kind kind_from_name(std::string_view n) {
  for (Outcome::Kind k : {Outcome::Kind::tuned, Outcome::Kind::done, Outcome::Kind::too_large,
                          Outcome::Kind::unsupported, Outcome::Kind::failed})
    if (n == kind_name(k)) return k;
  return Outcome::Kind::failed;
}

// A unit's result message: "result", then the fields read_result reads.
std::string result_line(int64_t index, const Outcome& out, bool sticky, const std::string& line) {
  const std::string cfg = out.variant.empty() ? std::string() : dsp::config_to_json(out.config);
  return "result\t" + std::to_string(index) + "\t" + kind_name(out.kind) + "\t" + (out.persisted ? "1" : "0") + "\t" +
         (sticky ? "1" : "0") + "\t" + fmt("%.17g", out.us) + "\t" + fmt("%.17g", out.default_us) + "\t" +
         std::to_string(out.candidates) + "\t" + std::to_string(out.rejected) + "\t" + one_field(out.variant) + "\t" +
         one_field(out.key) + "\t" + one_field(cfg) + "\t" + one_field(out.message) + "\t" + one_field(line) + "\t" +
         fmt("%.17g", out.margin) + "\t" + fmt("%.17g", out.aa_spread) + "\t" + one_field(out.timing) + "\t" +
         one_field(out.why) + "\n";
}

}  // namespace

bool read_result(const std::vector<std::string>& f, int64_t* unit, Outcome* out) {
  int64_t cand = 0, rej = 0;
  if (f.size() != 18 || f[0] != "result" || !parse_int(f[1], unit) || !parse_int(f[7], &cand) || !parse_int(f[8], &rej))
    return false;
  out->kind = kind_from_name(f[2]);
  out->persisted = f[3] == "1";
  out->us = parse_double(f[5]);
  out->default_us = parse_double(f[6]);
  out->candidates = static_cast<int32_t>(cand);
  out->rejected = static_cast<int32_t>(rej);
  out->variant = f[9];
  out->key = f[10];
  out->config_json = f[11];
  out->message = f[12];
  out->margin = parse_double(f[14]);
  out->aa_spread = parse_double(f[15]);
  out->timing = f[16];
  out->why = f[17];
  return true;
}

// ---------------------------------------------------------------- the worker

namespace {

constexpr int kExitSticky = 3;  // a worker after a sticky device error

// KDISPATCH_TEST_WORKER_DIE_AT (see above); index -1 when unset or malformed.
struct DieHook {
  int64_t index = -1;
  bool always = false, sticky = false, hang = false, sticky_hang = false, close_hang = false, hold_hang = false;
};

// Test-only: a hooked hang appends this process's pid to
// $KDISPATCH_TEST_WORKER_HANG_PIDS (so a test can end it), then waits forever.
// Async-signal-safe (no allocation): the child of hold-hang's fork calls it.
[[noreturn]] void test_hang() {
  if (const char* f = std::getenv("KDISPATCH_TEST_WORKER_HANG_PIDS"); f && *f) {
    const int fd = ::open(f, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd >= 0) {
      char line[24];
      size_t n = sizeof line;
      line[--n] = '\n';
      for (unsigned long v = static_cast<unsigned long>(::getpid()); n > 0;) {
        line[--n] = static_cast<char>('0' + v % 10);
        if ((v /= 10) == 0) break;
      }
      (void)!::write(fd, line + n, sizeof line - n);
      ::close(fd);
    }
  }
  for (;;) ::pause();
}
DieHook die_hook() {
  DieHook h;
  const char* v = std::getenv("KDISPATCH_TEST_WORKER_DIE_AT");
  if (v == nullptr) return h;
  const std::string_view text(v);
  const size_t colon = text.find(':');
  const std::string_view mode = colon == std::string_view::npos ? std::string_view() : text.substr(colon + 1);
  int64_t i = 0;
  if (!parse_int(text.substr(0, colon), &i) || i < 0 ||
      !(mode.empty() || mode == "always" || mode == "sticky" || mode == "hang" || mode == "hang-always" ||
        mode == "sticky-hang" || mode == "close-hang" || mode == "hold-hang"))
    return h;
  h.index = i;
  h.always = mode == "always" || mode == "hang-always";
  h.sticky = mode == "sticky" || mode == "sticky-hang";
  h.sticky_hang = mode == "sticky-hang";
  h.hang = mode == "hang" || mode == "hang-always";
  h.close_hang = mode == "close-hang";
  h.hold_hang = mode == "hold-hang";
  return h;
}

}  // namespace

// The worker: a runtime over the emit dir on --device, then the units the
// parent sends, one at a time, until its stdin ends.
int run_worker(const TuneCmdOptions& o, const char* cmd) {
  int exit_code = kExitOk;
  std::unique_ptr<dsp::Runtime> rt = emit_runtime(o, cmd, &exit_code);
  if (!rt) return exit_code;
  Target t{*rt, o, {}, {}};
  if (!tune_device(*rt, o, cmd, &t.dev, &t.device)) return kExitUsage;
  // Test-only (KDISPATCH_TEST_WORKER_HANG_START=<path>): the first worker to
  // create <path> hangs before 'ready' (a driver or context start-up hang).
  if (const char* f = std::getenv("KDISPATCH_TEST_WORKER_HANG_START"); f && *f) {
    const int fd = ::open(f, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      test_hang();
    }
  }
  if (!write_all(kWorkerResultFd, "ready\t" + one_field(t.device) + "\n")) return kExitFailure;
  const DieHook hook = die_hook();
  std::string in;
  while (std::getline(std::cin, in)) {
    const std::vector<std::string> f = split_tabs(in);
    int64_t index = 0, attempt = 0, m = 0;
    if (f.size() != 7 || f[0] != "unit" || !parse_int(f[1], &index) || !parse_int(f[2], &attempt) ||
        !parse_int(f[3], &m) || !find_op(f[6])) {
      std::fprintf(stderr, "%s: worker: a bad command from the parent: '%s'\n", cmd, in.c_str());
      return kExitFailure;
    }
    Job j;
    j.m = m;
    j.key_fields = f[4];
    j.label = f[5];
    j.op = f[6];
    std::string line;
    bool sticky = false;
    Outcome out;
    if (hook.index == index && (attempt == 0 || hook.always)) {
      if (hook.hang) test_hang();  // a hung kernel: only the parent's --unit-timeout-s ends it
      if (hook.close_hang) {       // its pipe ends but the process stays: the parent must not wait forever
        ::close(kWorkerResultFd);
        test_hang();
      }
      if (hook.hold_hang) {  // a child keeps its result pipe open past its SIGKILL (as a thread stuck in D does)
        std::fflush(nullptr);
        if (::fork() == 0) test_hang();
        test_hang();
      }
      if (!hook.sticky) {
        std::fflush(nullptr);
        ::kill(::getpid(), SIGKILL);
      }
      sticky = true;
      out.kind = Outcome::Kind::failed;
      out.message = "backend_error: a simulated sticky device error (KDISPATCH_TEST_WORKER_DIE_AT)";
      line = j.label + " M=" + std::to_string(m) + " FAILED: " + out.message;
    } else {
      out = tune_unit(t, j, &line, &sticky);
    }
    if (!write_all(kWorkerResultFd, result_line(index, out, sticky, line))) return kExitFailure;
    // sticky-hang: the exit after a sticky error hangs (a context teardown).
    if (sticky && hook.sticky_hang && hook.index == index) test_hang();
    if (sticky) return kExitSticky;  // the device context is unusable: the parent starts a new worker
  }
  return kExitOk;
}

}  // namespace kdispatch_cli::tune_detail
