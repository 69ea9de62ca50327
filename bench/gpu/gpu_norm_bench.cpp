// SPDX-License-Identifier: Apache-2.0
// kdispatch_gpu_norm_bench: times every point of every CUDA norm variant, and
// the get_default plan, on the peers' grid (../shared/peers/h200_baseline.py:
// hidden 2048..16384, tokens 1..32768, bf16, eps 1e-6), with the peers'
// method, so ratios against h200-baseline.json from the same run compare:
//   cold   CUDA events around each call, a 256 MiB read that evicts L2
//          before each (the tuner's own clock: GpuClock in src/backends/gpu/device.inc;
//          the flush kernel also covers the host's enqueue time), median;
//   graph  the calls captured back to back in one CUDA graph, rotating over
//          buffer sets whose footprint is >= 3x L2 (at most 64 sets), median
//          replay time / nodes (tokens <= 1024 only).
// Writes one CSV row per (op, hidden, tokens, plan) and prints a summary.
//
//   kdispatch_gpu_norm_bench [--csv FILE] [--ops rmsnorm,fused_add_rmsnorm]
//                            [--hidden 2048,4096] [--tokens 1,16] [--reps N] [--no-graph]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/numeric.hpp"
#include "backends/registry.hpp"
#include "backends/backend.hpp"
#include "gpu_bench_util.hpp"
#include "ops/specs.hpp"
#include "tune/search.hpp"

using namespace dispatch;
using core::LaunchArgs;
using core::OpKind;
using core::Plan;
using core::Problem;
using kdbench::dalloc;
using kdbench::median;

namespace {

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoll(item));
  return v;
}

/// randn-like bf16 data (weights 1 + 0.1 randn, as the peers'): a random
/// tile of up to 1M values, repeated (the timing does not depend on the values,
/// but zeros would hide unwritten outputs and can run faster).
void fill_random(void* d, size_t elems, std::mt19937& rng, bool weight) {
  const size_t tile = std::min<size_t>(elems, size_t{1} << 20);
  std::vector<uint16_t> h(tile);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : h) v = core::float_to_bf16(weight ? 1.f + 0.1f * nd(rng) : nd(rng));
  for (size_t off = 0; off < elems; off += tile) {
    const size_t n = std::min(tile, elems - off);
    CK(cudaMemcpy(static_cast<uint16_t*>(d) + off, h.data() + (off / tile * 7919) % (tile - n + 1), n * 2,
                  cudaMemcpyHostToDevice));
  }
}

struct Bufs {
  void* a = nullptr;  // x
  void* b = nullptr;  // y or residual
};

}  // namespace

int main(int argc, char** argv) {
  std::string csv_path = "gpu_norm_bench.csv";
  std::vector<std::string> ops = {"rmsnorm", "fused_add_rmsnorm"};
  std::vector<int64_t> hiddens = {2048, 4096, 5120, 8192, 16384};
  std::vector<int64_t> tokens_list = {1, 16, 128, 1024, 8192, 32768};
  int reps = 40;
  bool graph = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--csv")
      csv_path = next();
    else if (a == "--ops") {
      ops.clear();
      std::stringstream ss(next());
      std::string it;
      while (std::getline(ss, it, ',')) ops.push_back(it == "fused" ? "fused_add_rmsnorm" : it);
    } else if (a == "--hidden")
      hiddens = parse_list(next());
    else if (a == "--tokens")
      tokens_list = parse_list(next());
    else if (a == "--reps")
      reps = std::atoi(next());
    else if (a == "--no-graph")
      graph = false;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  const backends::Backend* be = backends::find(DeviceType::cuda);
  if (!be || !be->status().available) {
    std::printf("kdispatch_gpu_norm_bench: skipped, no usable CUDA device: %s\n",
                be ? be->status().unavailable_reason.c_str() : "CUDA backend not compiled in");
    return 0;
  }
  const DeviceInfo& dev = *be->device_info(0);
  tune::DeviceMemory* mem = &be->memory();
  auto clock = mem->make_clock(dev);
  std::printf("device %s (%s) arch %s, %d SMs, L2 %lld KiB\n", dev.device_name.c_str(), dev.reported_name.c_str(),
              dev.arch.c_str(), dev.compute_units, static_cast<long long>(dev.l2_bytes >> 10));
  FILE* csv = std::fopen(csv_path.c_str(), "w");
  if (!csv) {
    std::perror(csv_path.c_str());
    return 2;
  }
  std::fprintf(csv, "op,dtype,hidden,tokens,plan,is_default,cold_us,graph_us\n");
  cudaStream_t gs;
  CK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::mt19937 rng(1234);
  const int64_t l2 = dev.l2_bytes > 0 ? dev.l2_bytes : (60LL << 20);

  std::printf("%-18s %6s %6s | %-44s %9s %9s | %-44s %9s | %9s %9s\n", "op", "hidden", "tokens", "default plan",
              "cold us", "graph us", "best cold plan", "cold us", "best grph", "def/best");
  for (const std::string& opn : ops) {
    const OpKind op = opn == "rmsnorm" ? OpKind::rmsnorm : OpKind::fused_add_rmsnorm;
    const bool fused = op == OpKind::fused_add_rmsnorm;
    for (int64_t H : hiddens) {
      for (int64_t T : tokens_list) {
        Problem p;
        p.op = op;
        p.device = Device{DeviceType::cuda, 0};
        p.in_dtype = p.out_dtype = DType::bf16;
        p.m = T;
        p.n = H;
        const size_t elems = size_t(T * H);
        const int64_t bytes = (fused ? 4 : 2) * T * H * 2 + H * 2;
        void* w = dalloc(size_t(H) * 2);
        fill_random(w, size_t(H), rng, true);
        const int nsets =
            graph && T <= 1024
                ? int(std::min<int64_t>(64, std::max<int64_t>(1, (3 * l2 + bytes - 1) / std::max<int64_t>(bytes, 1))))
                : 1;
        std::vector<Bufs> sets(static_cast<size_t>(nsets));
        for (auto& s : sets) {
          s.a = dalloc(elems * 2);
          s.b = dalloc(elems * 2);
          fill_random(s.a, elems, rng, false);
          fill_random(s.b, elems, rng, false);
        }
        auto args_for = [&](const Bufs& s, cudaStream_t st) {
          LaunchArgs la;
          if (fused) {
            la.data[core::kFusedArgX] = s.a;
            la.ld[core::kFusedArgX] = H;
            la.data[core::kFusedArgResidual] = s.b;
            la.ld[core::kFusedArgResidual] = H;
            la.data[core::kFusedArgW] = w;
          } else {
            la.data[core::kNormArgX] = s.a;
            la.ld[core::kNormArgX] = H;
            la.data[core::kNormArgY] = s.b;
            la.ld[core::kNormArgY] = H;
            la.data[core::kNormArgW] = w;
          }
          la.scalar[0] = 1e-6f;
          la.stream = st;
          return la;
        };
        std::vector<Plan> plans;
        const Plan def = core::get_default(p, dev);
        plans.push_back(def);
        for (const core::VariantDef* v : core::variants_for(op, DeviceType::cuda)) {
          if (v->in_dtype != DType::bf16 || (v->flags & core::kVariantReference)) continue;
          for (const Plan& pl : core::config_space(*v, p, dev)) {
            const bool same = pl == def;
            if (!same) plans.push_back(pl);
          }
        }
        double def_cold = 0, def_graph = 0, best_cold = 1e30, best_graph = 1e30;
        std::string best_cold_plan;
        for (size_t pi = 0; pi < plans.size(); ++pi) {
          const Plan& pl = plans[pi];
          const LaunchArgs la0 = args_for(sets[0], nullptr);
          // cold: the tuner's clock (L2 flush before each rep)
          std::vector<double> t;
          for (int r = 0; r < 3; ++r) (void)pl.variant->launch(la0, p, pl.params);  // warm-up
          for (int r = 0; r < reps; ++r) {
            clock->flush();
            auto us = clock->time_us([&] { return pl.variant->launch(la0, p, pl.params); });
            if (!us.ok()) {
              std::fprintf(stderr, "%s: %s\n", core::plan_to_string(pl).c_str(), us.status().to_string().c_str());
              return 3;
            }
            t.push_back(*us);
          }
          const double cold = median(t);
          double gus = -1;
          if (graph && T <= 1024) {
            const int nodes =
                int(std::min<double>(200, std::max<double>(nsets, std::ceil(2000.0 / std::max(cold, 0.5)))));
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(gs, cudaStreamCaptureModeThreadLocal));
            for (int k = 0; k < nodes; ++k) {
              const LaunchArgs la = args_for(sets[size_t(k % nsets)], gs);
              (void)pl.variant->launch(la, p, pl.params);
            }
            CK(cudaStreamEndCapture(gs, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, gs));
            CK(cudaStreamSynchronize(gs));
            std::vector<double> gt;
            for (int r = 0; r < 15; ++r) {
              CK(cudaEventRecord(e0, gs));
              CK(cudaGraphLaunch(ge, gs));
              CK(cudaEventRecord(e1, gs));
              CK(cudaEventSynchronize(e1));
              float ms = 0;
              CK(cudaEventElapsedTime(&ms, e0, e1));
              gt.push_back(double(ms) * 1e3 / nodes);
            }
            gus = median(gt);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
          }
          std::fprintf(csv, "%s,bf16,%lld,%lld,\"%s\",%d,%.3f,%.3f\n", opn.c_str(), (long long)H, (long long)T,
                       core::plan_to_string(pl).c_str(), pi == 0 ? 1 : 0, cold, gus);
          if (pi == 0) {
            def_cold = cold;
            def_graph = gus;
          }
          if (cold < best_cold) {
            best_cold = cold;
            best_cold_plan = core::plan_to_string(pl);
          }
          if (gus > 0 && gus < best_graph) best_graph = gus;
        }
        CK(cudaDeviceSynchronize());
        CK(cudaGetLastError());
        std::printf("%-18s %6lld %6lld | %-44s %9.2f %9.2f | %-44s %9.2f | %9.2f %9.3f  (%.0f GB/s)\n", opn.c_str(),
                    (long long)H, (long long)T, core::plan_to_string(def).c_str(), def_cold, def_graph,
                    best_cold_plan.c_str(), best_cold, best_graph < 1e29 ? best_graph : -1.0, def_cold / best_cold,
                    double(bytes) / (def_cold * 1e-6) / 1e9);
        std::fflush(stdout);
        std::fflush(csv);
        for (auto& s : sets) {
          CK(cudaFree(s.a));
          CK(cudaFree(s.b));
        }
        CK(cudaFree(w));
      }
    }
  }
  std::fclose(csv);
  return 0;
}
