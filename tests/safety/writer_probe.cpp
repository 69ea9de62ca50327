// SPDX-License-Identifier: Apache-2.0
// The `pretune` write path for the writer-safety tests (tests/safety/):
// dispatch::pretune of rmsnorm or fused_add_rmsnorm for a list of M into a
// tuning cache dir, through the public API only. After each row it prints
//   committed <key> M=<m>
// (flushed) once the row is on disk, or
//   failed <key> M=<m>: <error>
// Usage: kdispatch_writer_probe --cache-dir DIR --op rmsnorm|fused_add_rmsnorm
//            --hidden H --dtype bf16|fp16|fp32 --m 1,2,3 [--budget-ms MS]
// Exit 0 when every row was committed, 1 otherwise, 2 on a usage error.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "dispatch/dispatch.hpp"

namespace {

int usage(const char* why) {
  std::fprintf(stderr, "kdispatch_writer_probe: %s\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, op, dtype_text = "bf16", ms_text;
  long hidden = 0, budget_ms = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--cache-dir")
      dir = v;
    else if (k == "--op")
      op = v;
    else if (k == "--hidden")
      hidden = std::atol(v);
    else if (k == "--dtype")
      dtype_text = v;
    else if (k == "--m")
      ms_text = v;
    else if (k == "--budget-ms")
      budget_ms = std::atol(v);
    else
      return usage(("unknown option " + k).c_str());
  }
  if (dir.empty() || hidden < 1 || ms_text.empty() || (op != "rmsnorm" && op != "fused_add_rmsnorm"))
    return usage("need --cache-dir, --op rmsnorm|fused_add_rmsnorm, --hidden >= 1 and --m");
  auto dt = dispatch::parse_dtype(dtype_text);
  if (!dt.ok()) return usage(dt.status().message().c_str());
  std::vector<long> ms;
  for (char* p = ms_text.data(); *p;) {
    char* end = nullptr;
    const long m = std::strtol(p, &end, 10);
    if (end == p || m < 1) return usage("bad --m");
    ms.push_back(m);
    p = *end == ',' ? end + 1 : end;
  }

  dispatch::RuntimeOptions o;
  o.load_shipped_configs = false;
  o.log_level = dispatch::LogLevel::warn;
  o.tune.cache_dir = dir;
  o.tune.cold_cache = false;
  o.tune.time_budget_ms = static_cast<double>(budget_ms);
  o.tune.reps = 3;
  auto rt = dispatch::Runtime::create(o);
  if (!rt.ok()) return usage(rt.status().to_string().c_str());
  int failed = 0;
  for (long m : ms) {
    // pretune reads only shapes, strides and dtypes: null data.
    const dispatch::TensorRef a = dispatch::make_tensor_2d(nullptr, *dt, m, hidden, hidden);
    const dispatch::TensorRef w = dispatch::make_tensor_1d(nullptr, *dt, hidden);
    dispatch::Result<dispatch::PretuneResult> r = op == "rmsnorm"
                                                      ? dispatch::pretune(**rt, dispatch::RmsNormArgs{a, a, w})
                                                      : dispatch::pretune(**rt, dispatch::FusedAddRmsNormArgs{a, a, w});
    if (r.ok() && r->persisted) {
      std::printf("committed %s M=%ld\n", r->key.c_str(), m);
    } else {
      std::printf("failed %s/%ld M=%ld: %s\n", op.c_str(), hidden, m,
                  r.ok() ? "not persisted" : r.status().to_string().c_str());
      ++failed;
    }
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}
