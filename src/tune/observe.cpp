// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — Tuner::observe, the tuner's one hook on the op path
// (api/ops.cpp: validate -> choose -> observe -> launch).
//
// The tuner's view of a call. A miss is recorded (for export), queued in
// background mode and tuned here in sync mode unless the stream is being
// captured (the capture query is asked only then: a hit never pays for
// it); a hit far from its row's M is sampled. May hand back the sync
// search's winner. The op path calls it only off its hit path (a miss, or
// a hit while tuning is on), through a cold, noinline wrapper.
#include <string>

#include "backends/backend.hpp"
#include "table/key.hpp"
#include "tune/capture.hpp"
#include "tune/rules.hpp"
#include "tune/tuner.hpp"

namespace dispatch::tune {
namespace {

// Far from every tuned M (not near_tuned): a hit by nearest-M, but worth
// tuning. Sampled: one in 16 such calls per thread notes it.
bool far_hit_sample(int64_t table_m, int64_t m) noexcept {
  if (near_tuned(table_m, m)) return false;
  thread_local uint32_t n = 0;
  return (++n & 15u) == 0;
}

}  // namespace

Status Tuner::observe(const ObservedCall& call, PlanSource source, int64_t table_m, TunedNow* now) noexcept {
  const core::Problem& p = call.problem;
  if (source == PlanSource::table) {
    if (mode() != TuneMode::off && far_hit_sample(table_m, p.m)) note_miss(p, call.la, call.key_hash, /*queue=*/true);
    return Status();
  }
  if (source != PlanSource::fallback) return Status();  // forced: nothing to learn
  note_miss(p, call.la, call.key_hash, /*queue=*/true);
  // Graph captures (tune/capture.hpp). Background mode: the miss's stream
  // is noted, no query here; the tuner asks whether it captures before
  // each search and waits while it does. Sync mode: a captured miss is
  // never searched now (a search inside a capture breaks it) but deferred
  // to the next miss outside a capture.
  if (mode() == TuneMode::background) {
    if (call.stream) note_stream(p.device.type, call.stream);
    return Status();
  }
  if (mode() != TuneMode::sync) return Status();
  const bool this_captures = call.capturing || (call.stream && stream_capturing(p.device.type, call.stream));
  if (this_captures && call.stream) note_stream(p.device.type, call.stream);
  // A search (on the legacy stream) while another thread's stream captures
  // would break that capture too: deferred as well.
  if (this_captures || capture_in_progress()) {
    note_capture(p, call.la, call.key_hash);
    return Status();
  }
  drain_deferred(call.key_hash, p.m);
  const backends::Backend* backend = backends::find(p.device.type);
  table::KeyBuffer key;
  table::build_own_key(p, device_type_name(p.device.type), call.dev.device_name, &key);
  // The search launches on the legacy default stream: first let the
  // caller's stream finish writing the inputs (sync mode is for
  // development; one synchronisation on a miss is its price).
  if (backend && call.stream)
    if (Status s = backend->stream_synchronize(call.stream); !s.ok()) return s;
  auto r = tune_on_caller(p, call.la, call.dev, std::string(key.view()));
  if (r.ok()) {
    now->tuned = true;
    now->plan = r->plan;
    now->source_id = r->source_id;
  }
  return Status();
}

}  // namespace dispatch::tune
