// SPDX-License-Identifier: Apache-2.0
// CUDA graphs and the background tuner (CUDA only): an engine thread captures
// its decode step in global capture mode (torch.cuda.graph's default) on a
// non-blocking stream while kdispatch's tuner thread allocates scratch,
// copies, launches and synchronises for other shapes. Every capture must
// succeed, the captured graph must compute the right result, and the tuner
// must finish its shapes without a failure: its GPU work runs on its
// thread's per-thread default stream in relaxed capture mode
// (src/backends/gpu/gpu_backend.hpp, prepare_tuner_thread), never on the legacy
// stream that would order against (and invalidate) the engine's capture.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "dispatch/dispatch.hpp"
#include "gpu_test_util.hpp"

namespace {

using namespace kdgpu;
using dispatch::Device;
using dispatch::Status;

struct TempCache {
  std::filesystem::path path;
  TempCache() {
    path = std::filesystem::temp_directory_path() / ("kdispatch-gpu-capture-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempCache() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// A runtime whose background tuner works flat out (duty cycle 1) on a short
// budget per shape, tuning into `cache`.
std::unique_ptr<dispatch::Runtime> background_runtime(const TempCache& cache) {
  dispatch::RuntimeOptions o;
  o.load_shipped_configs = false;
  o.log_level = dispatch::LogLevel::warn;
  o.tune.mode = dispatch::TuneMode::background;
  o.tune.cache_dir = cache.path.string();
  o.tune.duty_cycle = 1.0;
  o.tune.time_budget_ms = 300;
  auto rt = dispatch::Runtime::create(o);
  REQUIRE(rt.ok());
  return std::move(rt).value();
}

// One engine step's rmsnorm of [T, H] bf16 on device 0: x and w drawn from
// `seed`, y poisoned, all uploaded; `args` ready to call.
struct NormStep {
  HostTensor x, w, y;
  DeviceBuffer dx, dw, dy;
  dispatch::RmsNormArgs args;
  NormStep(dispatch::tune::DeviceMemory* mem, int64_t T, int64_t H, uint32_t seed)
      : x(DType::bf16, T, H, H), w(DType::bf16, 1, H, H), y(DType::bf16, T, H, H),
        dx(mem, x.bytes()), dw(mem, w.bytes()), dy(mem, y.bytes()) {
    std::mt19937 rng(seed);
    x.fill_uniform(rng, -2, 2);
    w.fill_uniform(rng, 0.5f, 1.5f);
    y.poison_all();
    REQUIRE(dx.upload(x).ok());
    REQUIRE(dw.upload(w).ok());
    REQUIRE(dy.upload(y).ok());
    const Device d{DeviceType::cuda, 0};
    args = dispatch::RmsNormArgs{dispatch::make_tensor_2d(dy.get(), DType::bf16, T, H, H, d),
                                 dispatch::make_tensor_2d(dx.get(), DType::bf16, T, H, H, d),
                                 dispatch::make_tensor_1d(dw.get(), DType::bf16, H, d), 1e-6f};
  }
};

}  // namespace

TEST_CASE("gpu capture: graphs captured in global mode while the background tuner works stay valid") {
  const dispatch::gpu::BackendOps* b = dispatch::gpu::backend_ops(DeviceType::cuda);
  if (!b || !b->status().available) return;  // HIP-only machine: nothing to capture with here
  TempCache cache;
  auto rt = background_runtime(cache);
  auto* mem = dispatch::core::backend_memory(DeviceType::cuda);
  const Device d{DeviceType::cuda, 0};

  // Bait for the tuner: big rmsnorm shapes of several hidden sizes (misses).
  const int64_t BT = 4096;
  const std::vector<int64_t> hiddens = {1024, 2048, 3072, 4096, 5120, 6144, 7168, 8192};
  DeviceBuffer bx(mem, size_t(BT * 8192 * 2)), by(mem, size_t(BT * 8192 * 2)), bw(mem, size_t(8192 * 2));
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  for (int64_t h : hiddens) {
    dispatch::RmsNormArgs a{dispatch::make_tensor_2d(by.get(), DType::bf16, BT, h, h, d),
                            dispatch::make_tensor_2d(bx.get(), DType::bf16, BT, h, h, d),
                            dispatch::make_tensor_1d(bw.get(), DType::bf16, h, d), 1e-6f};
    REQUIRE(dispatch::rmsnorm(*rt, a, dispatch::Stream{s}).ok());
  }
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);

  // The engine's step: 64 rmsnorms of [5, 4096] bf16 into one graph.
  NormStep step(mem, 5, 4096, 11);
  HostTensor& x = step.x;
  HostTensor& w = step.w;
  HostTensor& y = step.y;
  DeviceBuffer& dy = step.dy;
  const dispatch::RmsNormArgs& args = step.args;
  int captures = 0, overlapped = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    const int64_t before = rt->tune_stats().candidates_run;
    const bool busy = rt->tune_stats().shapes_tuned < int64_t(hiddens.size());
    REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    Status st;
    for (int i = 0; i < 64 && st.ok(); ++i) st = dispatch::rmsnorm(*rt, args, dispatch::Stream{s});
    cudaGraph_t g = nullptr;
    const cudaError_t end = cudaStreamEndCapture(s, &g);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    REQUIRE_MESSAGE(end == cudaSuccess, "capture ", captures, " invalidated: ", cudaGetErrorString(end));
    cudaGraphExec_t ge = nullptr;
    REQUIRE(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(ge, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    (void)cudaGraphExecDestroy(ge);
    (void)cudaGraphDestroy(g);
    ++captures;
    overlapped += busy && rt->tune_stats().candidates_run > before;
    if (!busy && rt->tune_stats().shapes_tuned >= int64_t(hiddens.size())) break;
  }
  MESSAGE(captures, " captures, ", overlapped, " while the tuner ran candidates");
  CHECK(captures > 0);
  REQUIRE(rt->wait_tuner_idle(120.0));
  const dispatch::TuneStats ts = rt->tune_stats();
  CHECK(ts.shapes_tuned >= int64_t(hiddens.size()));
  CHECK(ts.shapes_skipped == 0);
  CHECK(ts.candidates_failed == 0);
  // The last graph's output is the norm.
  REQUIRE(dy.download(&y).ok());
  CHECK(rmsnorm_mismatch(x, w, y, 1e-6, 8.0) == "");
  (void)cudaStreamDestroy(s);
}

// Issue 20 item 7: an engine captures on a BLOCKING stream (cudaStreamCreate's
// default flags: it orders against the legacy default stream) while the
// background tuner works on other shapes, and a call inside the capture
// misses. The capture must end with cudaSuccess (no
// cudaErrorStreamCaptureImplicit), the miss must be queued, and the tuner
// must tune the captured shape after the capture (it waits while a stream it
// saw a miss on is captured).
TEST_CASE("gpu capture: a miss inside a capture on a blocking stream is queued and tuned after it") {
  const dispatch::gpu::BackendOps* b = dispatch::gpu::backend_ops(DeviceType::cuda);
  if (!b || !b->status().available) return;
  TempCache cache;
  auto rt = background_runtime(cache);
  auto* mem = dispatch::core::backend_memory(DeviceType::cuda);
  const Device d{DeviceType::cuda, 0};
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);  // blocking
  // Bait: misses of other shapes keep the tuner busy.
  const int64_t BT = 4096;
  DeviceBuffer bx(mem, size_t(BT * 8192 * 2)), by(mem, size_t(BT * 8192 * 2)), bw(mem, size_t(8192 * 2));
  for (int64_t h : {1024, 2048, 3072, 5120, 6144}) {
    dispatch::RmsNormArgs a{dispatch::make_tensor_2d(by.get(), DType::bf16, BT, h, h, d),
                            dispatch::make_tensor_2d(bx.get(), DType::bf16, BT, h, h, d),
                            dispatch::make_tensor_1d(bw.get(), DType::bf16, h, d), 1e-6f};
    REQUIRE(dispatch::rmsnorm(*rt, a, dispatch::Stream{s}).ok());
  }
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  const int64_t queued_before = rt->tune_stats().queued;

  // The captured step: a shape never seen before (a miss inside the capture).
  const int64_t T = 7;
  NormStep step(mem, T, 4096, 12);
  HostTensor& x = step.x;
  HostTensor& w = step.w;
  HostTensor& y = step.y;
  DeviceBuffer& dy = step.dy;
  const dispatch::RmsNormArgs& args = step.args;
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
  dispatch::DispatchInfo info;
  Status st;
  for (int i = 0; i < 16 && st.ok(); ++i) st = dispatch::rmsnorm(*rt, args, dispatch::Stream{s}, {.info = &info});
  // Hold the capture open a while: the tuner, busy with the bait, must not break it.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  cudaGraph_t g = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &g);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  REQUIRE_MESSAGE(end == cudaSuccess, "capture invalidated: ", cudaGetErrorString(end));
  CHECK(info.source == dispatch::PlanSource::fallback);  // the miss served the default inside the graph
  CHECK(rt->tune_stats().queued > queued_before);     // and was queued
  cudaGraphExec_t ge = nullptr;
  REQUIRE(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(ge, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  REQUIRE(dy.download(&y).ok());
  CHECK(rmsnorm_mismatch(x, w, y, 1e-6, 8.0) == "");
  (void)cudaGraphExecDestroy(ge);
  (void)cudaGraphDestroy(g);
  REQUIRE(rt->wait_tuner_idle(120.0));
  const dispatch::TuneStats ts = rt->tune_stats();
  MESSAGE("capture waits ", ts.capture_waits, ", shapes tuned ", ts.shapes_tuned);
  CHECK(ts.candidates_failed == 0);
  const dispatch::LookupQuery q{.op = "rmsnorm", .key = "hidden=4096,dtype=bf16", .device = b->status().device_name,
                                .backend = "cuda", .M = T};
  auto r = dispatch::lookup(*rt, q);
  REQUIRE(r.ok());
  CHECK(r->match == dispatch::LookupResult::Match::exact);  // tuned after the capture
  (void)cudaStreamDestroy(s);
}
