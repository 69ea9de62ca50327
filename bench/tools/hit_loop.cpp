// SPDX-License-Identifier: Apache-2.0
// hit_loop — the op hot path on a table hit, for counting instructions:
// dispatch::rmsnorm (hidden 64) and dispatch::gemm (16x16, M = 1) on fp32
// CPU tensors whose shapes the runtime's table holds, each called N times
// in its own noinline loop. Public API only, so the same file builds against
// any version of the library (the hot-path comparisons of bench/results/).
//
//   valgrind --tool=callgrind --toggle-collect=rmsnorm_loop hit_loop 100000
//   (instructions of the loop) / 100000 = instructions per call
//
// Prints the plans that served (a table hit is required) and exits 1
// otherwise. The kernels' own work is included (the same in every build).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dispatch/dispatch.hpp"

namespace fs = std::filesystem;

extern "C" [[gnu::noinline]] int rmsnorm_loop(dispatch::Runtime* rt, const dispatch::RmsNormArgs* a, long n) {
  int bad = 0;
  for (long i = 0; i < n; ++i) bad += !dispatch::rmsnorm(*rt, *a).ok();
  return bad;
}

extern "C" [[gnu::noinline]] int gemm_loop(dispatch::Runtime* rt, const dispatch::GemmArgs* a, long n) {
  int bad = 0;
  for (long i = 0; i < n; ++i) bad += !dispatch::gemm(*rt, *a).ok();
  return bad;
}

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 100000;
  const std::string dev = dispatch::cpu_device_info().device_name;
  const fs::path dir = fs::temp_directory_path() / ("kdispatch-hit-loop-" + std::to_string(::getpid()));
  fs::create_directories(dir / "cpu" / "rmsnorm");
  fs::create_directories(dir / "cpu" / "gemm");
  std::ofstream(dir / "cpu" / "rmsnorm" / ("hidden=64,device_name=" + dev + ",dtype=fp32.json"))
      << "{\"1\": {\"variant\": \"rmsnorm_fp32__ref\"}}\n";
  std::ofstream(dir / "cpu" / "gemm" / ("N=16,K=16,device_name=" + dev + ",dtype=fp32.json"))
      << "{\"1\": {\"variant\": \"gemm_fp32__ref\"}}\n";
  dispatch::RuntimeOptions o;
  o.config_dirs = {dir.string()};
  o.load_shipped_configs = false;
  o.tune.persist = false;
  o.tune.load_cache = false;
  o.log_level = dispatch::LogLevel::off;
  auto rt = dispatch::Runtime::create(o);
  fs::remove_all(dir);
  if (!rt.ok()) {
    std::fprintf(stderr, "%s\n", rt.status().to_string().c_str());
    return 1;
  }
  std::vector<float> x(64, 0.5f), y(64), w(64, 1.f), a(16, 0.25f), b(256, 0.5f), d(16);
  const dispatch::RmsNormArgs na{dispatch::make_tensor_2d(y.data(), dispatch::DType::fp32, 1, 64, 64),
                                 dispatch::make_tensor_2d(x.data(), dispatch::DType::fp32, 1, 64, 64),
                                 dispatch::make_tensor_1d(w.data(), dispatch::DType::fp32, 64), 1e-6f};
  const dispatch::GemmArgs ga{dispatch::make_tensor_2d(a.data(), dispatch::DType::fp32, 1, 16, 16),
                              dispatch::make_tensor_2d(b.data(), dispatch::DType::fp32, 16, 16, 16),
                              dispatch::make_tensor_2d(d.data(), dispatch::DType::fp32, 1, 16, 16),
                              {}};
  dispatch::DispatchInfo ni, gi;
  if (!dispatch::rmsnorm(**rt, na, {}, {.info = &ni}).ok() || ni.source != dispatch::PlanSource::table ||
      !dispatch::gemm(**rt, ga, {}, {.info = &gi}).ok() || gi.source != dispatch::PlanSource::table) {
    std::fprintf(stderr, "hit_loop: the calls did not hit the table\n");
    return 1;
  }
  const int bad = rmsnorm_loop(rt->get(), &na, n) + gemm_loop(rt->get(), &ga, n);
  std::printf("hit_loop: %ld calls each; rmsnorm -> %s, gemm -> %s; %d failed\n", n, ni.variant, gi.variant, bad);
  return bad ? 1 : 0;
}
