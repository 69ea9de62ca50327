// SPDX-License-Identifier: Apache-2.0
// CUDA graphs and the background tuner (CUDA only): an engine thread captures
// its decode step in global capture mode (torch.cuda.graph's default) on a
// non-blocking stream while kdispatch's tuner thread allocates scratch,
// copies, launches and synchronises for other shapes. Every capture must
// succeed, the captured graph must compute the right result, and the tuner
// must finish its shapes without a failure: its GPU work runs on its
// thread's per-thread default stream in relaxed capture mode
// (src/backends/backend.hpp, prepare_tuner_thread), never on the legacy
// stream that would order against (and invalidate) the engine's capture.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "dispatch/dispatch.hpp"
#include "gpu_test_util.hpp"
#include "tune/search.hpp"

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
      : x(DType::bf16, T, H, H),
        w(DType::bf16, 1, H, H),
        y(DType::bf16, T, H, H),
        dx(mem, x.bytes()),
        dw(mem, w.bytes()),
        dy(mem, y.bytes()) {
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
  const dispatch::backends::Backend* b = dispatch::backends::find(DeviceType::cuda);
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
  const dispatch::backends::Backend* b = dispatch::backends::find(DeviceType::cuda);
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
  CHECK(rt->tune_stats().queued > queued_before);        // and was queued
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
  const dispatch::LookupQuery q{
      .op = "rmsnorm", .key = "hidden=4096,dtype=bf16", .device = b->status().device_name, .backend = "cuda", .M = T};
  auto r = dispatch::lookup(*rt, q);
  REQUIRE(r.ok());
  CHECK(r->match == dispatch::LookupResult::Match::exact);  // tuned after the capture
  (void)cudaStreamDestroy(s);
}

// Issue 32 item 3: the tuner times its confirmation in a CUDA graph of its
// own (thread-local capture mode on its thread's stream) while an engine
// thread captures its own work in global mode on another stream, one the
// tuner has never seen (so nothing makes the tuner wait: the two captures
// overlap). Every engine capture must end with cudaSuccess and replay the
// right bytes; the tuner must finish its GEMM shapes with no failed
// candidate, and its rows must say they were timed "cold+graph". A timing
// hook makes the floor look 3x slower in the search only, so the search's
// winner is one of our families and the confirmation (the real timings,
// cold and in a graph) decides.
TEST_CASE("gpu capture: the tuner's graph-mode confirmation beside an engine's global-mode capture in another thread") {
  const dispatch::backends::Backend* b = dispatch::backends::find(DeviceType::cuda);
  if (!b || !b->status().available) return;
  dispatch::tune::set_timing_hook_for_testing([](const dispatch::core::Plan& p, int placement, double us) {
    const std::string v(p.variant->name);
    const bool floor = v.size() > 8 && v.compare(v.size() - 8, 8, "__cublas") == 0;
    return placement == -1 && floor ? 3 * us : us;
  });
  struct Unhook {
    ~Unhook() { dispatch::tune::set_timing_hook_for_testing(nullptr); }
  } unhook;
  TempCache cache;
  auto rt = background_runtime(cache);
  auto* mem = dispatch::core::backend_memory(DeviceType::cuda);
  const Device d{DeviceType::cuda, 0};

  // The tuner's work: bf16 GEMM misses at decode M, on a stream of their own.
  cudaStream_t tune_s = nullptr, engine_s = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&tune_s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamCreateWithFlags(&engine_s, cudaStreamNonBlocking) == cudaSuccess);
  const int64_t M = 16, shapes[][2] = {{4608, 3584}, {2560, 2048}, {1536, 5120}};
  DeviceBuffer ga(mem, size_t(M * 8192 * 2)), gb(mem, size_t(8192 * 8192 * 2)), gd(mem, size_t(M * 8192 * 2));
  for (const auto& nk : shapes) {
    const int64_t N = nk[0], K = nk[1];
    dispatch::GemmArgs g{dispatch::make_tensor_2d(ga.get(), DType::bf16, M, K, K, d),
                         dispatch::make_tensor_2d(gb.get(), DType::bf16, N, K, K, d),
                         dispatch::make_tensor_2d(gd.get(), DType::bf16, M, N, N, d), dispatch::TensorRef{}};
    REQUIRE(dispatch::gemm(*rt, g, dispatch::Stream{tune_s}).ok());
  }
  REQUIRE(cudaStreamSynchronize(tune_s) == cudaSuccess);

  // The engine: its own work (copies of 8 MiB through 3 buffers) captured in
  // global mode, the capture held open 5 ms, replayed and checked.
  const size_t bytes = size_t(8) << 20;
  std::vector<uint8_t> src(bytes), got(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = uint8_t(i * 131 + 7);
  DeviceBuffer e0(mem, bytes), e1(mem, bytes), e2(mem, bytes);
  REQUIRE(cudaMemcpy(e0.get(), src.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  int captures = 0, overlapped = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    const int64_t before = rt->tune_stats().candidates_run;
    const bool busy = rt->tune_stats().shapes_tuned < int64_t(std::size(shapes));
    REQUIRE(cudaMemsetAsync(e2.get(), 0, bytes, engine_s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(engine_s) == cudaSuccess);
    REQUIRE(cudaStreamBeginCapture(engine_s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(e1.get(), e0.get(), bytes, cudaMemcpyDeviceToDevice, engine_s) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(e2.get(), e1.get(), bytes, cudaMemcpyDeviceToDevice, engine_s) == cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    cudaGraph_t g = nullptr;
    const cudaError_t end = cudaStreamEndCapture(engine_s, &g);
    REQUIRE_MESSAGE(end == cudaSuccess, "capture ", captures, " invalidated: ", cudaGetErrorString(end));
    cudaGraphExec_t ge = nullptr;
    REQUIRE(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(ge, engine_s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(engine_s) == cudaSuccess);
    (void)cudaGraphExecDestroy(ge);
    (void)cudaGraphDestroy(g);
    REQUIRE(cudaMemcpy(got.data(), e2.get(), bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    REQUIRE(got == src);
    ++captures;
    overlapped += busy && rt->tune_stats().candidates_run > before;
    if (!busy) break;
  }
  MESSAGE(captures, " engine captures, ", overlapped, " while the tuner ran candidates");
  CHECK(captures > 0);
  CHECK(overlapped > 0);
  REQUIRE(rt->wait_tuner_idle(120.0));
  const dispatch::TuneStats ts = rt->tune_stats();
  CHECK(ts.shapes_tuned >= int64_t(std::size(shapes)));
  CHECK(ts.candidates_failed == 0);
  // The rows the tuner wrote were timed in both modes.
  int files = 0, graphed = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(cache.path / "cuda" / "gemm")) {
    if (!e.is_regular_file() || e.path().extension() != ".json") continue;
    std::ifstream in(e.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ++files;
    graphed += text.find("\"cold+graph\"") != std::string::npos;
    MESSAGE(e.path().filename().string(), ": ",
            text.substr(text.find("\"why\"") == std::string::npos ? 0 : text.find("\"why\""), 160));
  }
  CHECK(files >= int(std::size(shapes)));
  CHECK(graphed == files);
  (void)cudaStreamDestroy(tune_s);
  (void)cudaStreamDestroy(engine_s);
}
