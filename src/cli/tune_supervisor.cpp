// SPDX-License-Identifier: Apache-2.0
// kdispatch CLI — `kdispatch tune --devices`: the worker processes. Per
// slot (--workers-per-device per device) a process of this executable as
// `tune --internal-worker` (tune_worker.cpp), started while units wait for
// it; one unit at a time handed to whichever worker is free; results read
// as they come; a worker that dies, reports a sticky device error or runs
// past --unit-timeout-s replaced, its unit retried once; every process
// reaped (or, one that SIGKILL does not end, left behind) at the end.
// tune_devices.cpp's header comment says the whole of it. (tune_impl.hpp:
// the other pieces.)
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "cli/cli.hpp"
#include "cli/tune_impl.hpp"

namespace kdispatch_cli::tune_detail {
namespace {

// How a child process ended, in words.
std::string exit_text(int status) {
  if (WIFSIGNALED(status)) {
    const char* name = ::strsignal(WTERMSIG(status));
    return "killed by signal " + std::to_string(WTERMSIG(status)) + (name ? std::string(" (") + name + ")" : "");
  }
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  return "ended (status " + std::to_string(status) + ")";
}

// The worker's command line: the run's tuning options on one device.
std::vector<std::string> worker_argv(const TuneCmdOptions& o, const std::string& exe, int32_t ordinal) {
  // No --shapes, --op nor --model: a worker reads no shape list; each unit names its op.
  std::vector<std::string> a = {exe, "tune", "--internal-worker"};
  a.insert(a.end(), {"--emit", o.emit, "--dtype", o.dtype, "--backend", o.backend, "--device", std::to_string(ordinal),
                     "--max-flops", fmt("%.17g", o.max_flops)});
  if (o.budget_ms > 0) a.insert(a.end(), {"--budget-ms", fmt("%.17g", o.budget_ms)});
  if (o.mem_gib > 0) a.insert(a.end(), {"--mem-gib", fmt("%.17g", o.mem_gib)});
  if (o.reps > 0) a.insert(a.end(), {"--reps", std::to_string(o.reps)});
  if (o.max_candidates >= 1) a.insert(a.end(), {"--max-candidates", std::to_string(o.max_candidates)});
  if (o.margin_given) a.insert(a.end(), {"--margin", o.margin_text});
  if (o.no_cold_cache) a.push_back("--no-cold-cache");
  if (!o.resume) a.push_back("--no-resume");
  return a;
}

// Starts the process of `w`: pipes, fork, exec. False (message printed) when
// no process could be started.
bool spawn_worker(WorkerSlot& w, const std::vector<std::string>& args, const char* cmd) {
  int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
    std::fprintf(stderr, "%s: %s: cannot create a pipe: %s\n", cmd, w.name.c_str(), std::strerror(errno));
    for (int fd : {to_child[0], to_child[1]})
      if (fd >= 0) ::close(fd);
    return false;
  }
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {  // the child: async-signal-safe calls only, until exec
    ::signal(SIGPIPE, SIG_DFL);
    if (::dup2(to_child[0], 0) < 0) ::_exit(127);
    if (from_child[1] == kWorkerResultFd)
      ::fcntl(kWorkerResultFd, F_SETFD, 0);  // keep it over exec
    else if (::dup2(from_child[1], kWorkerResultFd) < 0)
      ::_exit(127);
    ::dup2(2, 1);  // the worker's stdout is not the summary's
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (pid < 0) {
    std::fprintf(stderr, "%s: %s: fork: %s\n", cmd, w.name.c_str(), std::strerror(errno));
    ::close(to_child[1]);
    ::close(from_child[0]);
    return false;
  }
  w.pid = pid;
  w.cmd_fd = to_child[1];
  w.res_fd = from_child[0];
  w.buf.clear();
  w.ready = w.retiring = false;
  w.unit = -1;
  w.started = Clock::now();  // --unit-timeout-s bounds the start-up too
  ++w.processes;
  return true;
}

// --unit-timeout-s, or its default: 300 s + 30 x the search budget (the
// library's 2000 ms when --budget-ms is not given).
double unit_timeout_s(const TuneCmdOptions& o) {
  if (o.unit_timeout_s) return *o.unit_timeout_s;
  return 300.0 + 30.0 * (o.budget_ms > 0 ? o.budget_ms : 2000.0) / 1000.0;
}

// The parent of --devices: the queue, the workers, their results.
class DeviceRun {
 public:
  // `done`: the progress lines printed before (the skipped units).
  DeviceRun(const TuneCmdOptions& o, const char* cmd, const std::vector<Job>& jobs, std::vector<Outcome>* results,
            Progress& progress, size_t done)
      : o_(o),
        cmd_(cmd),
        jobs_(jobs),
        results_(*results),
        progress_(progress),
        done_(done),
        timeout_s_(unit_timeout_s(o)) {}

  // Tunes `units` (indices into jobs, largest first) on the slots' devices.
  void run(const std::vector<size_t>& units, const std::vector<int32_t>& ordinals, int32_t per_device,
           const std::string& exe) {
    units_ = units;
    attempts_.assign(units.size(), 0);
    for (size_t i = 0; i < units.size(); ++i) queue_.push_back(static_cast<int64_t>(i));
    // Slot order spreads the first workers over the devices.
    for (int32_t k = 0; k < per_device; ++k)
      for (int32_t ordinal : ordinals) {
        WorkerSlot w;
        w.index = static_cast<int32_t>(slots_.size());
        w.ordinal = ordinal;
        w.name = "worker " + std::to_string(w.index) + " (" + o_.backend + ":" + std::to_string(ordinal) + ")";
        slots_.push_back(std::move(w));
      }
    exe_ = exe;
    loop();
    for (WorkerSlot& w : slots_) stop(w);
  }

  const std::vector<WorkerSlot>& slots() const { return slots_; }

 private:
  const Job& job_of(int64_t unit) const { return jobs_[units_[static_cast<size_t>(unit)]]; }
  std::string head_of(int64_t unit) const { return job_of(unit).label + " M=" + std::to_string(job_of(unit).m); }

  void loop() {
    while (true) {
      // Start workers while units wait for more than the free ones; replace
      // a worker that ended while the run has work (queued or in flight).
      const auto busy = [](const WorkerSlot& w) { return w.unit >= 0; };
      const bool work = !queue_.empty() || std::any_of(slots_.begin(), slots_.end(), busy);
      size_t free_workers = 0;
      for (const WorkerSlot& w : slots_) free_workers += w.pid > 0 && !w.retiring && w.unit < 0;
      for (WorkerSlot& w : slots_)
        if (w.pid < 0 && !w.abandoned && (queue_.size() > free_workers || (w.processes > 0 && work))) {
          if (spawn_worker(w, worker_argv(o_, exe_, w.ordinal), cmd_))
            ++free_workers;
          else
            w.abandoned = true;
        }
      // The first units wait until every first worker is ready (or gone):
      // unit i goes to worker i, the largest units start together.
      const auto live = [](const WorkerSlot& w) { return w.pid > 0; };
      const auto starting = [](const WorkerSlot& w) { return w.pid > 0 && !w.ready; };
      if (!started_)
        started_ =
            std::any_of(slots_.begin(), slots_.end(), live) && std::none_of(slots_.begin(), slots_.end(), starting);
      for (WorkerSlot& w : slots_)
        if (started_ && w.pid > 0 && w.ready && !w.retiring && w.unit < 0 && !queue_.empty()) hand_out(w);
      if (queue_.empty() && std::none_of(slots_.begin(), slots_.end(), busy)) return;
      if (std::none_of(slots_.begin(), slots_.end(), live)) {  // every slot gave up: the queued units cannot be tuned
        while (!queue_.empty()) {
          fail(queue_.front(), "no worker could be started on any device of --devices");
          queue_.pop_front();
        }
        return;
      }
      wait_and_read();
    }
  }

  void hand_out(WorkerSlot& w) {
    const int64_t unit = queue_.front();
    queue_.pop_front();
    const Job& j = job_of(unit);
    w.unit = unit;
    w.started = Clock::now();
    const std::string msg = "unit\t" + std::to_string(unit) + "\t" + std::to_string(attempts_[size_t(unit)]) + "\t" +
                            std::to_string(j.m) + "\t" + j.key_fields + "\t" + one_field(j.label) + "\t" + j.op + "\n";
    // A worker that died meanwhile: its pipe's end says so (EPIPE here,
    // EOF on its result pipe), and its unit is handled there.
    (void)write_all(w.cmd_fd, msg);
  }

  void wait_and_read() {
    // Wake up for the first unit deadline (--unit-timeout-s); a worker past
    // it is killed, and its result pipe's EOF retries or fails the unit.
    // The same deadline bounds a worker's start-up (a hung driver or context
    // creation: the first units wait for every first worker) and the exit
    // of one retiring after a sticky error (stop() waits for it).
    // A killed worker's pipe ends with it; one whose pipe is still open
    // grace() after the SIGKILL (a thread stuck in the GPU driver keeps every
    // fd of the process open; a child may hold the pipe) is ended here.
    int wait_ms = -1;
    bool gone = false;
    const auto now = Clock::now();
    for (WorkerSlot& w : slots_) {
      if (w.pid > 0 && w.timed_out) {
        const double left = grace() - std::chrono::duration<double>(now - w.killed_at).count();
        if (left <= 0) {
          ended(w, /*pipe_open=*/true);
          gone = true;
          continue;
        }
        const int ms = static_cast<int>(left * 1000.0 + 1.0);
        wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
        continue;
      }
      if (w.pid <= 0 || (w.unit < 0 && w.ready && !w.retiring)) continue;
      const double left = timeout_s_ - std::chrono::duration<double>(now - w.started).count();
      if (left <= 0) {
        w.timed_out = true;
        const std::string what = w.unit >= 0 ? "ran " + head_of(w.unit)
                                 : !w.ready  ? std::string("was not ready")
                                             : std::string("had not exited after its sticky device error");
        std::fprintf(stderr, "%s: %s (pid %d) %s past --unit-timeout-s %g: killed\n", cmd_, w.name.c_str(),
                     static_cast<int>(w.pid), what.c_str(), timeout_s_);
        // Never handed another unit: a result read before its EOF (it
        // finished as it was killed) must not make it look free.
        w.retiring = true;
        ::kill(w.pid, SIGKILL);
        w.killed_at = Clock::now();
        const int ms = static_cast<int>(grace() * 1000.0 + 1.0);
        wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
        continue;
      }
      const int ms = static_cast<int>(std::min(left * 1000.0 + 1.0, 3.6e6));
      wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
    }
    // A unit retried or a slot freed: the loop hands it out (or starts a
    // worker) before anything waits.
    if (gone) return;
    std::vector<pollfd> fds;
    std::vector<WorkerSlot*> who;
    for (WorkerSlot& w : slots_)
      if (w.pid > 0) {
        fds.push_back(pollfd{w.res_fd, POLLIN, 0});
        who.push_back(&w);
      }
    if (fds.empty()) return;                                  // the loop starts workers (or gives up)
    if (::poll(fds.data(), fds.size(), wait_ms) < 0) return;  // EINTR: the loop polls again
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      WorkerSlot& w = *who[i];
      char buf[4096];
      const ssize_t n = ::read(w.res_fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ended(w);
        continue;
      }
      w.buf.append(buf, static_cast<size_t>(n));
      for (size_t nl; (nl = w.buf.find('\n')) != std::string::npos;) {
        const std::string line = w.buf.substr(0, nl);
        w.buf.erase(0, nl + 1);
        message(w, line);
      }
    }
  }

  void message(WorkerSlot& w, const std::string& line) {
    const std::vector<std::string> f = split_tabs(line);
    if (f.size() == 2 && f[0] == "ready") {
      w.ready = true;
      w.startup_failures = 0;
      return;
    }
    int64_t unit = -1;
    Outcome out;
    if (!read_result(f, &unit, &out) || unit != w.unit) {
      std::fprintf(stderr, "%s: %s: an unexpected message: '%s'\n", cmd_, w.name.c_str(), line.c_str());
      return;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - w.started).count();
    w.unit = -1;
    w.busy_seconds += seconds;
    const bool sticky = f[4] == "1";
    const std::string where = w.name + ": ";
    const std::string took = fmt(" [%.2f s]", seconds);
    if (sticky) {  // the worker exits; a new one takes the unit once
      w.retiring = true;
      w.started = Clock::now();  // its exit's deadline (--unit-timeout-s)
      ++attempts_[size_t(unit)];
      const bool again = attempts_[size_t(unit)] < 2;
      progress_line(where + f[13] + took + (again ? " (a sticky device error: retried on a new worker)" : ""), !again);
      if (again) {
        queue_.push_front(unit);
      } else {
        ++w.units;
        fail(unit, f[12] + " (a sticky device error, twice)", &w, seconds);
      }
      return;
    }
    ++w.units;
    out.attempts = attempts_[size_t(unit)] + 1;
    const bool ran = searched(out);
    record(unit, std::move(out), &w, seconds);
    progress_line(where + f[13] + took, true, ran);
  }

  // How long a worker whose pipe ended is given to exit before SIGKILL, and
  // then to end on it: min(10 s, --unit-timeout-s).
  double grace() const { return std::min(10.0, timeout_s_); }

  // The result pipe of `w` ended: its process is gone (or going). Or, with
  // `pipe_open`, `w` was killed past --unit-timeout-s and its pipe did not
  // end within grace() of that.
  void ended(WorkerSlot& w, bool pipe_open = false) {
    ::close(w.res_fd);
    ::close(w.cmd_fd);
    // Its pipe ended, so it is exiting: reaped within g = min(10 s,
    // --unit-timeout-s), else SIGKILLed and given g more; a process that
    // outlives SIGKILL (stuck in the GPU driver, state D) is left behind,
    // never waited on: the run goes on with a new worker in its slot. One
    // killed past --unit-timeout-s counts from that SIGKILL.
    int status = 0;
    bool reaped = false, left_behind = false, killed_now = w.timed_out;
    {
      const auto t0 = w.timed_out ? w.killed_at : Clock::now();
      for (;;) {
        const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
        if (r == w.pid || (r < 0 && errno != EINTR)) {
          reaped = r == w.pid;
          break;
        }
        const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
        const double grace = this->grace();
        if (!killed_now && waited > grace) {
          ::kill(w.pid, SIGKILL);
          killed_now = true;
        } else if (killed_now && waited > 2 * grace) {
          left_behind = true;
          break;
        }
        ::usleep(r == 0 && waited < 0.05 ? 1000 : 10000);
      }
    }
    const bool timed_out = w.timed_out;
    const std::string death = timed_out ? fmt("killed past --unit-timeout-s %g", timeout_s_) +
                                              (left_behind ? std::string(", did not end on SIGKILL: left behind")
                                               : pipe_open ? std::string(" (its result pipe stayed open)")
                                                           : std::string())
                              : left_behind ? std::string("closed its pipe and did not end on SIGKILL: left behind")
                              : killed_now  ? std::string("closed its pipe and did not exit: killed")
                              : reaped      ? exit_text(status)
                                            : std::string("ended (its exit status could not be read)");
    const std::string how = w.name + " (pid " + std::to_string(w.pid) + ") " + death;
    const int64_t unit = w.unit;
    const bool was_ready = w.ready, retiring = w.retiring;
    w.timed_out = false;
    w.pid = -1;
    w.cmd_fd = w.res_fd = -1;
    w.unit = -1;
    w.ready = w.retiring = false;
    if (unit >= 0) {
      const double seconds = std::chrono::duration<double>(Clock::now() - w.started).count();
      w.busy_seconds += seconds;
      ++attempts_[size_t(unit)];
      if (attempts_[size_t(unit)] < 2) {
        std::fprintf(stderr, "%s: %s while tuning %s: the unit is retried on a new worker\n", cmd_, how.c_str(),
                     head_of(unit).c_str());
        queue_.push_front(unit);
      } else {
        std::fprintf(stderr, "%s: %s while tuning %s, its second attempt: the unit failed\n", cmd_, how.c_str(),
                     head_of(unit).c_str());
        ++w.units;
        fail(unit, "its worker died on both attempts (the last " + death + ")", &w, seconds);
        progress_line(w.name + ": " + head_of(unit) + " FAILED: its worker died on both attempts", true);
      }
    } else if (!was_ready) {
      ++w.startup_failures;
      std::fprintf(stderr, "%s: %s before it was ready%s\n", cmd_, how.c_str(),
                   w.startup_failures >= 2 ? ", twice in a row: no more workers on this slot" : "");
      w.abandoned = w.startup_failures >= 2;
    } else if (!retiring) {
      std::fprintf(stderr, "%s: %s between units\n", cmd_, how.c_str());
    }
  }

  // Ends the process of `w` at the end of the run: EOF on its stdin.
  // A worker still there after --unit-timeout-s (an exit that hangs) is
  // killed; one that SIGKILL does not end within 10 s more is left behind.
  void stop(WorkerSlot& w) {
    if (w.pid < 0) return;
    ::close(w.cmd_fd);
    ::close(w.res_fd);
    const auto t0 = Clock::now();
    bool killed = false;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r == w.pid || (r < 0 && errno != EINTR)) break;
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!killed && waited > timeout_s_) {
        std::fprintf(stderr, "%s: %s (pid %d) had not exited %g s after the run's end (--unit-timeout-s): killed\n",
                     cmd_, w.name.c_str(), static_cast<int>(w.pid), timeout_s_);
        ::kill(w.pid, SIGKILL);
        killed = true;
      } else if (killed && waited > timeout_s_ + 10) {
        std::fprintf(stderr, "%s: %s (pid %d) did not end on SIGKILL: left behind\n", cmd_, w.name.c_str(),
                     static_cast<int>(w.pid));
        break;
      }
      ::usleep(10000);
    }
    w.pid = -1;
  }

  void record(int64_t unit, Outcome out, const WorkerSlot* w, double seconds) {
    const Job& j = job_of(unit);
    out.label = j.label;
    out.op = j.op;
    out.m = j.m;
    out.queue_index = unit;
    out.worker = w ? w->index : -1;
    out.device = w ? w->ordinal : -1;
    out.seconds = seconds;
    results_[units_[size_t(unit)]] = std::move(out);
  }

  void fail(int64_t unit, const std::string& message, const WorkerSlot* w = nullptr, double seconds = 0) {
    Outcome out;
    out.kind = Outcome::Kind::failed;
    out.message = message;
    out.attempts = attempts_[size_t(unit)];
    record(unit, std::move(out), w, seconds);
  }

  // A line of a unit's end (`counts`: numbered as the units' progress), or of a retry.
  void progress_line(const std::string& text, bool counts, bool ran = true) {
    if (counts)
      progress_.done(++done_, text, ran);
    else
      std::fprintf(stderr, "%s\n", text.c_str());
  }

  const TuneCmdOptions& o_;
  const char* cmd_;
  const std::vector<Job>& jobs_;
  std::vector<Outcome>& results_;
  Progress& progress_;
  std::string exe_;
  std::vector<size_t> units_;      // queue index -> job index
  std::vector<int32_t> attempts_;  // queue index -> attempts that ended its worker
  std::deque<int64_t> queue_;
  std::vector<WorkerSlot> slots_;
  size_t done_ = 0;       // progress lines numbered so far (the skipped units first)
  bool started_ = false;  // the first workers were all ready (or gone) once
  double timeout_s_;      // --unit-timeout-s, resolved
};

}  // namespace

std::vector<WorkerSlot> supervise(const TuneCmdOptions& o, const char* cmd, const std::vector<Job>& jobs,
                                  const std::vector<size_t>& units, const std::vector<int32_t>& ordinals,
                                  int32_t per_device, const std::string& exe, std::vector<Outcome>* results,
                                  Progress& progress, size_t done) {
  DeviceRun dr(o, cmd, jobs, results, progress, done);
  dr.run(units, ordinals, per_device, exe);
  return dr.slots();
}

}  // namespace kdispatch_cli::tune_detail
