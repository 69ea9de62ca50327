// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch tune --devices`: one worker process per device,
// one queue.
//
// The parent reads the shapes, applies --shard and the resume check, and
// orders the remaining units largest first (flops per call). Per device of
// --devices it starts --workers-per-device workers: its own executable
// (/proc/self/exe) as `kdispatch tune --internal-worker --device N` with the
// run's tuning options, each with its own runtime over the emit dir, its own
// scratch and --mem-gib. A worker takes one unit at a time; the parent hands
// the next to whichever worker is free (the first units once every first
// worker is ready or gone: unit i to worker i). Over pipes, one line per
// message, tab-separated:
//   parent -> worker (its stdin):  unit <index> <attempt> <M> <key fields> <label> <op>
//   worker -> parent (its fd 3):   ready <device name>
//                                  result <index> <kind> <persisted> <sticky> <us> <default us>
//                                         <candidates> <rejected> <variant> <key> <config> <message> <line>
//                                         <margin> <A/A spread> <timing> <why>
// The worker's stdout is its stderr. EOF on its stdin ends it (exit 0). A
// worker whose result pipe ends without its result (killed, crashed) or
// that reports a sticky device error (then it exits) is replaced by a new
// process on the same device; its unit goes back to the front of the queue
// once, and is reported failed when it ends its worker a second time. A
// worker that dies twice in a row before it is ready gives up its slot.
// The emit dir's writes merge under a per-file lock (store/writer.hpp), so
// workers tuning different M of one key keep every row.
//
// Test hook (test-only, read by the workers): KDISPATCH_TEST_WORKER_DIE_AT=
// <index>[:always|:sticky] — the worker handed the unit of queue index
// <index> (0 = the largest) kills itself with SIGKILL before tuning it, on
// the unit's first attempt (":always": on every attempt; ":sticky": reports
// a sticky device error instead, on the first attempt; ":close-hang":
// closes its result pipe, then hangs, on the first attempt; ":hold-hang":
// forks a child that keeps its result pipe open, then both hang, on the
// first attempt).
//
// This file: the devices of --devices, the resume pass, the queue order and
// the run's report with its workers; the worker processes are
// tune_supervisor.cpp's, a worker and the protocol tune_worker.cpp's.
// (tune_impl.hpp: the other pieces.)
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli.hpp"
#include "cli/tune_impl.hpp"
#include "dispatch/device.hpp"

namespace kdispatch_cli::tune_detail {

// --devices' value: "all" (*ordinals left empty) or comma-separated device
// ordinals, each once. A message naming the problem, or "".
std::string parse_devices(const std::string& text, std::vector<int32_t>* ordinals) {
  ordinals->clear();
  if (text == "all") return {};
  const std::string what = "--devices " + text + ": ";
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string_view item =
        trim(std::string_view(text).substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    int64_t n = 0;
    if (!parse_int(item, &n) || n < 0 || n > 1023)
      return what + "expected all or device ordinals separated by commas (e.g. 0,1), got '" + std::string(item) + "'";
    if (std::find(ordinals->begin(), ordinals->end(), n) != ordinals->end())
      return what + "device " + std::to_string(n) +
             " is listed twice (for several workers on one device: " + "--workers-per-device N)";
    ordinals->push_back(static_cast<int32_t>(n));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return {};
}

namespace {

// The devices of --devices: their ordinals and the one device name they
// share. A usage error's exit code, or -1.
int resolve_devices(const TuneCmdOptions& o, const char* cmd, dsp::Runtime& rt, std::vector<int32_t>* ordinals,
                    std::string* device_name) {
  auto type = dsp::parse_device_type(o.backend);
  if (!type.ok()) {
    std::fprintf(stderr, "%s: --backend %s: %s\n", cmd, o.backend.c_str(), type.status().to_string().c_str());
    return kExitUsage;
  }
  const std::string what = "--devices " + o.devices + " (--backend " + o.backend + ")";
  if (std::string e = parse_devices(o.devices, ordinals); !e.empty()) {  // checked before: cannot fail
    std::fprintf(stderr, "%s: %s\n", cmd, e.c_str());
    return kExitUsage;
  }
  std::vector<std::string> names;
  if (o.devices == "all") {
    for (int32_t n = 0; n < 1024; ++n) {
      auto di = rt.device_info(dsp::Device{*type, n});
      if (!di.ok() || !di->available) {
        if (n == 0) {
          std::fprintf(stderr, "%s: %s: no device: %s\n", cmd, what.c_str(),
                       di.ok() ? di->unavailable_reason.c_str() : di.status().to_string().c_str());
          return kExitUsage;
        }
        break;
      }
      ordinals->push_back(n);
      names.push_back(di->device_name);
    }
  } else {
    for (int32_t n : *ordinals) {
      auto di = rt.device_info(dsp::Device{*type, n});
      if (!di.ok() || !di->available) {
        std::fprintf(stderr, "%s: %s: device %d is not present: %s\n", cmd, what.c_str(), n,
                     di.ok() ? di->unavailable_reason.c_str() : di.status().to_string().c_str());
        return kExitUsage;
      }
      names.push_back(di->device_name);
    }
  }
  // The units are pulled by any worker, so every device must tune for the
  // same config files (and resume from the same rows).
  for (size_t i = 1; i < names.size(); ++i)
    if (names[i] != names[0]) {
      std::fprintf(stderr,
                   "%s: %s: device %d is %s but device %d is %s: the devices of one run must be of one kind "
                   "(tune each kind with its own --devices list)\n",
                   cmd, what.c_str(), (*ordinals)[0], names[0].c_str(), (*ordinals)[i], names[i].c_str());
      return kExitUsage;
    }
  *device_name = names.at(0);
  return -1;
}

}  // namespace

// tune --devices: the resume and --max-flops checks here, the rest in the
// workers. Returns the exit code.
int run_devices(const TuneCmdOptions& o, const char* cmd, const Shapes& shapes, dsp::Runtime& rt) {
  std::vector<int32_t> ordinals;
  std::string device_name;
  if (int e = resolve_devices(o, cmd, rt, &ordinals, &device_name); e >= 0) return e;
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    std::fprintf(stderr, "%s: --devices: cannot find this executable (/proc/self/exe): %s\n", cmd,
                 std::strerror(errno));
    return kExitFailure;
  }
  exe[n] = '\0';
  auto type = dsp::parse_device_type(o.backend);
  Target target{rt, o, dsp::Device{*type, ordinals[0]}, device_name};
  const int32_t per_device = o.workers_per_device.value_or(1);

  const auto t0 = Clock::now();
  Progress progress(shapes.jobs.size());
  std::vector<Outcome> results(shapes.jobs.size());
  std::vector<size_t> units;
  size_t done = 0;
  for (size_t i = 0; i < shapes.jobs.size(); ++i) {
    const Job& j = shapes.jobs[i];
    std::string line;
    if (auto skipped = skip(target, j, j.label + " M=" + std::to_string(j.m), &line)) {
      results[i] = std::move(*skipped);
      results[i].label = j.label;
      results[i].m = j.m;
      progress.done(++done, line, false);
    } else {
      units.push_back(i);
    }
  }
  std::stable_sort(units.begin(), units.end(),
                   [&](size_t a, size_t b) { return shapes.jobs[a].flops > shapes.jobs[b].flops; });
  std::string devs;
  for (int32_t d : ordinals) devs += (devs.empty() ? "" : ",") + std::to_string(d);
  if (!o.json)
    std::fprintf(stderr, "%s: %zu units to tune on %s device(s) %s (%s), %d worker(s) each, largest first\n", cmd,
                 units.size(), o.backend.c_str(), devs.c_str(), device_name.c_str(), per_device);

  // A worker's pipe closing under a write must not end this process.
  struct sigaction ignore {
  }, old{};
  ignore.sa_handler = SIG_IGN;
  ::sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &old);
  const std::vector<WorkerSlot> slots =
      supervise(o, cmd, shapes.jobs, units, ordinals, per_device, exe, &results, progress, done);
  ::sigaction(SIGPIPE, &old, nullptr);
  progress.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();

  const Summary s = summarize(o, shapes, results, seconds);
  if (o.json) {
    std::string out;
    {
      JsonWriter w;
      w.begin_array();
      for (const WorkerSlot& ws : slots) {
        w.begin_object();
        w.field("worker", ws.index).field("device", ws.ordinal).field("units", ws.units);
        w.field("seconds", round3(ws.busy_seconds)).field("processes", ws.processes);
        w.field("restarts", std::max(0, ws.processes - 1));
        w.end_object();
      }
      w.end_array();
      out = w.take();
    }
    print_json(o, device_name, s, rt.options().tune.time_budget_ms, results, shapes, out);
  } else {
    print_text(o, s, shapes);
    for (const WorkerSlot& ws : slots)
      std::printf("%s: %lld units, %.2f s tuning%s\n", ws.name.c_str(), (long long)ws.units, ws.busy_seconds,
                  ws.processes > 1    ? (", " + std::to_string(ws.processes - 1) + " restart(s)").c_str()
                  : ws.processes == 0 ? ", not started (no unit waited for it)"
                                      : "");
    std::printf("wall time %.1f s with %zu worker(s) on %zu device(s)\n", seconds, slots.size(), ordinals.size());
  }
  return s.failed > 0 ? kExitFailure : kExitOk;
}

}  // namespace kdispatch_cli::tune_detail
