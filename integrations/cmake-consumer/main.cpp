// SPDX-License-Identifier: Apache-2.0
// A consumer of the installed kdispatch package (find_package(kdispatch)).
// Creates a Runtime, runs dispatch::rmsnorm on a small fp32 buffer and checks
// it against a plain loop, asks dispatch::lookup for a config and prints it.
// Exit 0 on success, 1 on a failed check.
//
//   kdispatch_consumer                          # the checks above
//   kdispatch_consumer --expect-shipped DIR     # also: the runtime read its
//                                               # shipped configs from DIR
// The second form is how CI proves that an installed library finds
// <prefix>/share/kdispatch/configs by itself: CI puts one table under DIR,
// for the device name "CPU_ci_probe", and this program checks that the load
// report lists it from DIR and that a lookup for that device is served by it.
#include <dispatch/dispatch.hpp>
#if defined(KDISPATCH_CONSUMER_DLPACK)
#include <dispatch/dlpack.hpp>
#endif

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

std::string canonical(const std::string& p) {
  std::error_code ec;
  const auto c = std::filesystem::weakly_canonical(p, ec);
  return ec ? p : c.lexically_normal().string();
}

}  // namespace

int main(int argc, char** argv) {
  std::string expect_shipped;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--expect-shipped") == 0 && i + 1 < argc) {
      expect_shipped = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--expect-shipped DIR]\n", argv[0]);
      return 2;
    }
  }

  std::printf("kdispatch %s\n", dispatch::version());
  auto rt = dispatch::Runtime::create();
  if (!rt.ok()) {
    std::printf("FAIL Runtime::create: %s\n", rt.status().to_string().c_str());
    return 1;
  }
  dispatch::Runtime& runtime = **rt;
  const dispatch::LoadReport report = runtime.load_report();
  std::printf("shipped config files loaded: %zu\n", report.files.size());

  // rmsnorm on [tokens, hidden] fp32, rows with a stride larger than hidden.
  constexpr int64_t tokens = 3, hidden = 64, stride = 80;
  constexpr float eps = 1e-6f;
  std::vector<float> x(tokens * stride, 0.0f), y(tokens * stride, -1.0f), w(hidden);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < hidden; ++i) x[t * stride + i] = std::sin(0.37f * float(i) + float(t)) * float(t + 1);
  for (int64_t i = 0; i < hidden; ++i) w[i] = 0.5f + 0.01f * float(i);

  dispatch::DispatchInfo info;
  dispatch::CallOptions opts;
  opts.info = &info;
  const dispatch::Status s =
      dispatch::rmsnorm(runtime,
                        {.y = dispatch::make_tensor_2d(y.data(), dispatch::DType::fp32, tokens, hidden, stride),
                         .x = dispatch::make_tensor_2d(x.data(), dispatch::DType::fp32, tokens, hidden, stride),
                         .w = dispatch::make_tensor_1d(w.data(), dispatch::DType::fp32, hidden),
                         .eps = eps},
                        {}, opts);
  check(s.ok(), "rmsnorm returns ok" + (s.ok() ? std::string() : ": " + s.to_string()));

  double max_rel = 0.0;
  for (int64_t t = 0; t < tokens; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < hidden; ++i) ss += double(x[t * stride + i]) * double(x[t * stride + i]);
    const double inv = 1.0 / std::sqrt(ss / double(hidden) + double(eps));
    for (int64_t i = 0; i < hidden; ++i) {
      const double ref = double(x[t * stride + i]) * inv * double(w[i]);
      const double got = y[t * stride + i];
      max_rel = std::fmax(max_rel, std::fabs(got - ref) / std::fmax(std::fabs(ref), 1e-3));
    }
    for (int64_t i = hidden; i < stride; ++i) {  // padding is left alone
      if (y[t * stride + i] != -1.0f) max_rel = 1e9;
    }
  }
  std::printf("rmsnorm: variant %s (%s), max relative error %.3g\n", info.variant,
              dispatch::plan_source_name(info.source), max_rel);
  check(max_rel < 1e-5, "rmsnorm matches the plain loop");

  // The config service: which config serves rmsnorm at this shape and M?
  dispatch::LookupQuery q;
  q.op = "rmsnorm";
  q.key = "hidden=64,dtype=fp32";
  q.M = tokens;
  auto r = dispatch::lookup(runtime, q);
  check(r.ok(), "lookup returns ok" + (r.ok() ? std::string() : ": " + r.status().to_string()));
  if (r.ok()) std::printf("lookup: %s\n", dispatch::lookup_result_to_json(*r).c_str());

#if defined(KDISPATCH_CONSUMER_DLPACK)
  {
    int64_t shape[2] = {tokens, hidden};
    int64_t strides[2] = {stride, 1};
    DLTensor t{};
    t.data = x.data();
    t.device = {kDLCPU, 0};
    t.ndim = 2;
    t.dtype = {kDLFloat, 32, 1};
    t.shape = shape;
    t.strides = strides;
    auto tr = dispatch::from_dlpack(&t);
    check(tr.ok() && tr->rank == 2 && tr->shape[1] == hidden && tr->strides[0] == stride,
          "from_dlpack views a DLTensor");
  }
#endif

  if (!expect_shipped.empty()) {
    const std::string want = canonical(expect_shipped);
    bool listed = false;
    for (const auto& f : report.files) {
      std::printf("shipped: %s [%s] from %s\n", f.path.c_str(), std::string(dispatch::file_state_name(f.state)).c_str(),
                  f.dir.c_str());
      if (canonical(f.dir) == want) listed = true;
    }
    check(listed, "the load report lists a file from " + want);
    dispatch::LookupQuery pq;
    pq.op = "rmsnorm";
    pq.backend = "cpu";
    pq.device = "CPU_ci_probe";
    pq.key = "hidden=64,dtype=fp32";
    pq.M = 1;
    auto pr = dispatch::lookup(runtime, pq);
    check(pr.ok() && pr->match == dispatch::LookupResult::Match::exact && canonical(pr->source_dir) == want,
          "a lookup for CPU_ci_probe is served from " + want +
              (pr.ok() ? " (source_dir " + pr->source_dir + ", match " + dispatch::match_name(pr->match) + ")"
                       : ": " + pr.status().to_string()));
  }

  std::printf("%s\n", failures == 0 ? "kdispatch consumer: all checks passed" : "kdispatch consumer: FAILED");
  return failures == 0 ? 0 : 1;
}
