// SPDX-License-Identifier: Apache-2.0
// kdispatch GPU backends — the portability layer: one source for CUDA (nvcc)
// and HIP (Debian's clang++-15 -x hip, ROCm 5.2).
//
// Why our own thin header instead of HIP's: HIP 5.2's "HIP on NVIDIA" headers
// do not compile against CUDA 13 (they read cudaDeviceProp::clockRate and
// texture references, both removed; see ../shared/notes/toolchain.md), so a
// single source for both vendors has to name the few runtime calls, vector
// types and conversions it uses itself. Everything here is either a direct
// alias or a one-line wrapper; the kernels and the host glue use only this.
//
// Rules the rest of the GPU code follows:
//  - Everything lives in namespace dispatch::KDISPATCH_GPU_NS (`cuda` or
//    `hip`), so a build with both backends links two distinct copies of the
//    same templates (no ODR clash between the CUDA and the HIP definitions).
//  - Native errors never escape: port::status() turns a cudaError_t /
//    hipError_t into a dispatch::Status holding the native code, its name
//    and its text (one line).
//  - Only fields present in both CUDA 12.x and 13.x are read (no
//    cudaDeviceProp::clockRate, removed in 13).
//  - Warp size: 32 on NVIDIA; 64 on the CDNA parts we build for (gfx90a,
//    gfx940: wave64). kWarpSize is a compile-time constant because the
//    kernels unroll over it.
//  - 16-bit floats are handled as raw bits (uint16_t storage); the widening
//    is exact bit arithmetic, the narrowing (round to nearest even) uses the
//    vendor intrinsic where there is one (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32
//    on sm_80+), else the same integer rounding as core/numeric.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__HIP__) || defined(__HIPCC__)
#define KDISPATCH_GPU_HIP 1
#define KDISPATCH_GPU_NS hip
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#else
#define KDISPATCH_GPU_HIP 0
#define KDISPATCH_GPU_NS cuda
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include "dispatch/status.hpp"
#include "dispatch/types.hpp"

#if defined(__CUDACC__) || defined(__HIP__)
#define KDISPATCH_DEVICE_INLINE __device__ __forceinline__
#else
#define KDISPATCH_DEVICE_INLINE inline
#endif

// clang's HIP gives kernel handles default visibility even under
// -fvisibility=hidden, which would export every kernel from libkdispatch.so;
// nvcc's -fvisibility=hidden already hides them.
#if KDISPATCH_GPU_HIP
#define KDISPATCH_KERNEL_HIDDEN __attribute__((visibility("hidden")))
#else
#define KDISPATCH_KERNEL_HIDDEN
#endif

namespace dispatch::KDISPATCH_GPU_NS::port {

// ------------------------------------------------------------------ names

// The runtime's names both vendors spell alike but for the prefix (cudaX,
// hipX) are written once, through KDISPATCH_RT.
#if KDISPATCH_GPU_HIP
#define KDISPATCH_RT(name) hip##name
#else
#define KDISPATCH_RT(name) cuda##name
#endif

using Error = KDISPATCH_RT(Error_t);
using Stream = KDISPATCH_RT(Stream_t);
using Event = KDISPATCH_RT(Event_t);
inline constexpr Error kSuccess = KDISPATCH_RT(Success);
#if KDISPATCH_GPU_HIP
inline constexpr DeviceType kBackend = DeviceType::hip;
inline constexpr std::string_view kApi = "hip";
/// CDNA (gfx9) runs 64-wide wavefronts; the device pass of clang states it.
#if defined(__AMDGCN_WAVEFRONT_SIZE)
inline constexpr int kWarpSize = __AMDGCN_WAVEFRONT_SIZE;
#else
inline constexpr int kWarpSize = 64;
#endif
#else
inline constexpr DeviceType kBackend = DeviceType::cuda;
inline constexpr std::string_view kApi = "cuda";
inline constexpr int kWarpSize = 32;
#endif

// ------------------------------------------------------------------ errors

inline const char* error_name(Error e) noexcept { return KDISPATCH_RT(GetErrorName)(e); }
inline const char* error_string(Error e) noexcept { return KDISPATCH_RT(GetErrorString)(e); }
inline Error get_last_error() noexcept { return KDISPATCH_RT(GetLastError)(); }
#if KDISPATCH_GPU_HIP
/// "No usable device here": the driver is missing or no GPU is present.
inline bool is_no_device(Error e) noexcept {
  return e == hipErrorNoDevice || e == hipErrorInsufficientDriver || e == hipErrorInvalidDevice;
}
inline bool is_out_of_memory(Error e) noexcept { return e == hipErrorOutOfMemory; }
#else
/// "No usable device here": 35 (no driver, or one too old), 34 (the stub
/// libcuda.so), 100 (driver but no device). Checked on a machine without a
/// GPU: every runtime call then fails with 35 (or 34), never 100.
inline bool is_no_device(Error e) noexcept {
  return e == cudaErrorInsufficientDriver || e == cudaErrorStubLibrary || e == cudaErrorNoDevice;
}
inline bool is_out_of_memory(Error e) noexcept { return e == cudaErrorMemoryAllocation; }
#endif

/// One line: "cuda error 35 (cudaErrorInsufficientDriver: CUDA driver version
/// is insufficient for CUDA runtime version) in cudaGetDeviceCount".
inline std::string error_text(Error e, std::string_view what) {
  std::string s(kApi);
  s += " error ";
  s += std::to_string(static_cast<int>(e));
  s += " (";
  const char* n = error_name(e);
  const char* t = error_string(e);
  s += n ? n : "?";
  s += ": ";
  s += t ? t : "?";
  s += ")";
  if (!what.empty()) {
    s += " in ";
    s += what;
  }
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

/// The native error as a Status (ok for kSuccess): out_of_memory for an
/// allocation failure, backend_error otherwise, with error_text().
inline Status status(Error e, std::string_view what) noexcept {
  if (e == kSuccess) return Status();
  try {
    return make_status(is_out_of_memory(e) ? StatusCode::out_of_memory : StatusCode::backend_error,
                       error_text(e, what));
  } catch (...) {
    return make_status(StatusCode::backend_error, what);
  }
}

// ------------------------------------------------------------------ runtime

inline Error get_device_count(int* n) noexcept {
  *n = 0;
  return KDISPATCH_RT(GetDeviceCount)(n);
}
inline Error get_device(int* d) noexcept { return KDISPATCH_RT(GetDevice)(d); }
inline Error set_device(int d) noexcept { return KDISPATCH_RT(SetDevice)(d); }
inline Error malloc_device(void** p, size_t n) noexcept { return KDISPATCH_RT(Malloc)(p, n); }
inline Error free_device(void* p) noexcept { return KDISPATCH_RT(Free)(p); }
inline Error copy_d2h(void* d, const void* s, size_t n) noexcept {
  return KDISPATCH_RT(Memcpy)(d, s, n, KDISPATCH_RT(MemcpyDeviceToHost));
}
inline Error copy_h2d(void* d, const void* s, size_t n) noexcept {
  return KDISPATCH_RT(Memcpy)(d, s, n, KDISPATCH_RT(MemcpyHostToDevice));
}
inline Error copy_d2d(void* d, const void* s, size_t n) noexcept {
  return KDISPATCH_RT(Memcpy)(d, s, n, KDISPATCH_RT(MemcpyDeviceToDevice));
}
inline Error memset_2d(void* d, size_t pitch, int v, size_t w, size_t h) noexcept {
  return KDISPATCH_RT(Memset2D)(d, pitch, v, w, h);
}
inline Error stream_synchronize(Stream s) noexcept { return KDISPATCH_RT(StreamSynchronize)(s); }
inline Error event_create(Event* e) noexcept { return KDISPATCH_RT(EventCreate)(e); }
inline Error event_destroy(Event e) noexcept { return KDISPATCH_RT(EventDestroy)(e); }
inline Error event_record(Event e, Stream s) noexcept { return KDISPATCH_RT(EventRecord)(e, s); }
inline Error event_synchronize(Event e) noexcept { return KDISPATCH_RT(EventSynchronize)(e); }
inline Error event_elapsed_ms(float* ms, Event a, Event b) noexcept { return KDISPATCH_RT(EventElapsedTime)(ms, a, b); }
inline Error runtime_version(int* v) noexcept {
  *v = 0;
  return KDISPATCH_RT(RuntimeGetVersion)(v);
}
inline Error driver_version(int* v) noexcept {
  *v = 0;
  return KDISPATCH_RT(DriverGetVersion)(v);
}
/// This thread may make "unsafe" calls (malloc, synchronous copies) while
/// another thread captures a graph in global mode.
#if KDISPATCH_GPU_HIP
inline void* tuner_stream() noexcept { return nullptr; }  // no per-thread streams in Debian's HIP 5.2
#else
inline void* tuner_stream() noexcept { return static_cast<void*>(cudaStreamPerThread); }
#endif
inline Error relax_capture_mode() noexcept {
  KDISPATCH_RT(StreamCaptureMode) m = KDISPATCH_RT(StreamCaptureModeRelaxed);
  return KDISPATCH_RT(ThreadExchangeStreamCaptureMode)(&m);
}
/// This thread's capture mode set to relaxed until the scope ends (then
/// restored): an allocation while this thread captures, as torch's caching
/// allocator does it (cudaMalloc is an "unsafe" call in global mode).
struct RelaxedCaptureScope {
  KDISPATCH_RT(StreamCaptureMode) m = KDISPATCH_RT(StreamCaptureModeRelaxed);
  bool ok;
  RelaxedCaptureScope() noexcept : ok(KDISPATCH_RT(ThreadExchangeStreamCaptureMode)(&m) == kSuccess) {}
  ~RelaxedCaptureScope() {
    if (ok) (void)KDISPATCH_RT(ThreadExchangeStreamCaptureMode)(&m);
  }
};
inline Error stream_capturing(Stream s, bool* yes) noexcept {
  KDISPATCH_RT(StreamCaptureStatus) st = KDISPATCH_RT(StreamCaptureStatusNone);
  Error e = KDISPATCH_RT(StreamIsCapturing)(s, &st);
  *yes = st != KDISPATCH_RT(StreamCaptureStatusNone);
  return e;
}
#if !KDISPATCH_GPU_HIP
/// The tuner's serving-mode timing (tune::Clock::time_graph): a capture in
/// thread-local mode (an engine thread's global-mode capture neither breaks
/// it nor is broken by it), instantiated and replayed.
using Graph = cudaGraph_t;
using GraphExec = cudaGraphExec_t;
inline Error stream_create_nonblocking(Stream* s) noexcept {
  *s = nullptr;
  return cudaStreamCreateWithFlags(s, cudaStreamNonBlocking);
}
inline Error stream_destroy(Stream s) noexcept { return cudaStreamDestroy(s); }
inline Error begin_capture_thread_local(Stream s) noexcept {
  return cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
}
inline Error end_capture(Stream s, Graph* g) noexcept {
  *g = nullptr;
  return cudaStreamEndCapture(s, g);
}
inline Error graph_instantiate(GraphExec* x, Graph g) noexcept {
  *x = nullptr;
  return cudaGraphInstantiateWithFlags(x, g, 0);
}
inline Error graph_launch(GraphExec x, Stream s) noexcept { return cudaGraphLaunch(x, s); }
inline Error graph_destroy(Graph g) noexcept { return cudaGraphDestroy(g); }
inline Error graph_exec_destroy(GraphExec x) noexcept { return cudaGraphExecDestroy(x); }
#endif

#undef KDISPATCH_RT

/// The device properties kdispatch reads, from fields every supported
/// runtime version has.
struct Props {
  std::string name;      ///< "NVIDIA H200", "AMD Instinct MI250X"
  std::string gcn_arch;  ///< HIP: "gfx90a:sramecc+:xnack-"; CUDA: empty
  int major = 0, minor = 0;
  int multiprocessors = 0;
  int warp_size = 0;
  int64_t total_memory = 0;
  int64_t l2_bytes = 0;
  int64_t smem_per_block = 0;
  int64_t smem_per_block_optin = 0;
  std::string uuid;        ///< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (CUDA); "" on HIP
  std::string pci_bus_id;  ///< "0000:3b:00.0"
};

inline Error device_props(int ordinal, Props* out) noexcept {
#if KDISPATCH_GPU_HIP
  hipDeviceProp_t p;
  std::memset(&p, 0, sizeof p);
  Error e = hipGetDeviceProperties(&p, ordinal);
  if (e != kSuccess) return e;
  out->gcn_arch.assign(p.gcnArchName, strnlen(p.gcnArchName, sizeof p.gcnArchName));
  out->smem_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlock);
#else
  cudaDeviceProp p;
  std::memset(&p, 0, sizeof p);
  Error e = cudaGetDeviceProperties(&p, ordinal);
  if (e != kSuccess) return e;
  out->smem_per_block_optin = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  {
    static const char* hex = "0123456789abcdef";
    std::string u = "GPU-";
    for (int i = 0; i < 16; ++i) {
      const auto b = static_cast<unsigned char>(p.uuid.bytes[i]);
      if (i == 4 || i == 6 || i == 8 || i == 10) u += '-';
      u += hex[b >> 4];
      u += hex[b & 15];
    }
    out->uuid = u;
  }
#endif
  {
    char pci[32];
    std::snprintf(pci, sizeof pci, "%04x:%02x:%02x.0", static_cast<unsigned>(p.pciDomainID),
                  static_cast<unsigned>(p.pciBusID), static_cast<unsigned>(p.pciDeviceID));
    out->pci_bus_id = pci;
  }
  out->name.assign(p.name, strnlen(p.name, sizeof p.name));
  out->major = p.major;
  out->minor = p.minor;
  out->multiprocessors = p.multiProcessorCount;
  out->warp_size = p.warpSize;
  out->total_memory = static_cast<int64_t>(p.totalGlobalMem);
  out->l2_bytes = static_cast<int64_t>(p.l2CacheSize);
  out->smem_per_block = static_cast<int64_t>(p.sharedMemPerBlock);
  return kSuccess;
}

/// What the runtime says about one compiled kernel on the current device.
/// A failure (cudaErrorNoKernelImageForDevice, hipErrorNoBinaryForGpu,
/// cudaErrorInvalidDeviceFunction) means there is no loadable image.
struct FuncInfo {
  bool loadable = false;
  int max_threads = 0;  ///< the launch bound the compiler honoured
  int num_regs = 0;
  int binary_version = 0;
  int64_t local_bytes = 0;  ///< stack frame (spills show here)
  Error error = kSuccess;
};

template <class Kernel>
inline FuncInfo func_info(Kernel* kernel) noexcept {
  FuncInfo fi;
#if KDISPATCH_GPU_HIP
  hipFuncAttributes a;
  std::memset(&a, 0, sizeof a);
  fi.error = hipFuncGetAttributes(&a, reinterpret_cast<const void*>(kernel));
#else
  cudaFuncAttributes a;
  std::memset(&a, 0, sizeof a);
  fi.error = cudaFuncGetAttributes(&a, reinterpret_cast<const void*>(kernel));
#endif
  if (fi.error != kSuccess) {
    (void)get_last_error();  // the failed query is not a sticky error: clear it
    return fi;
  }
  fi.loadable = true;
  fi.max_threads = a.maxThreadsPerBlock;
  fi.num_regs = a.numRegs;
  fi.binary_version = a.binaryVersion;
  fi.local_bytes = static_cast<int64_t>(a.localSizeBytes);
  return fi;
}

/// Checks the launch just enqueued (configuration errors show at once;
/// faults inside the kernel show at the next synchronisation).
inline Status check_launch(std::string_view kernel) noexcept {
  const Error e = get_last_error();
  return e == kSuccess ? Status() : status(e, kernel);
}

/// Launches `kernel` on `stream`. `pdl`: allow programmatic dependent launch
/// (CUDA, compute capability >= 9.0): the kernel may be scheduled while the
/// previous kernel of the stream still runs; it must call
/// grid_dependency_wait() before touching memory that kernel may write
/// (every kernel here does so first thing). HIP has no such launch: plain.
template <class... KernelParams, class... Args>
inline Error launch(void (*kernel)(KernelParams...), dim3 grid, dim3 block, Stream stream, bool pdl,
                    Args&&... args) noexcept;

/// launch() with `smem` bytes of dynamic shared memory (kernels whose
/// `extern __shared__` size depends on the launch; above 48 KiB the kernel
/// must have raised its cudaFuncAttributeMaxDynamicSharedMemorySize first).
template <class... KernelParams, class... Args>
inline Error launch_smem(void (*kernel)(KernelParams...), dim3 grid, dim3 block, size_t smem, Stream stream, bool pdl,
                         Args&&... args) noexcept {
#if KDISPATCH_GPU_HIP
  (void)pdl;
  kernel<<<grid, block, smem, stream>>>(static_cast<Args&&>(args)...);
  return hipGetLastError();
#else
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const Error e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Args&&>(args)...);
  if (e != kSuccess) (void)cudaGetLastError();
  return e;
#endif
}

template <class... KernelParams, class... Args>
inline Error launch(void (*kernel)(KernelParams...), dim3 grid, dim3 block, Stream stream, bool pdl,
                    Args&&... args) noexcept {
  return launch_smem(kernel, grid, block, 0, stream, pdl, static_cast<Args&&>(args)...);
}

// ------------------------------------------------------------------ device helpers
#if defined(__CUDACC__) || defined(__HIP__)

/// Butterfly sum over a warp: every lane gets the total.
KDISPATCH_DEVICE_INLINE float warp_sum(float v) {
#pragma unroll
  for (int o = kWarpSize / 2; o > 0; o >>= 1) {
#if KDISPATCH_GPU_HIP
    v += __shfl_xor(v, o);
#else
    v += __shfl_xor_sync(0xffffffffu, v, o);
#endif
  }
  return v;
}

/// A load that another block's writes, made visible by its __threadfence()
/// and an atomic this block observed, are sure to reach: past the SM's
/// incoherent L1 (CUDA's ld.global.cg; HIP: a relaxed device-scope atomic load).
KDISPATCH_DEVICE_INLINE float load_coherent(const float* p) {
#if KDISPATCH_GPU_HIP
  return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
  return __ldcg(p);
#endif
}

KDISPATCH_DEVICE_INLINE float bits_to_float(uint32_t u) { return __uint_as_float(u); }
KDISPATCH_DEVICE_INLINE uint32_t float_to_bits(float f) { return __float_as_uint(f); }

/// Two bf16 (element 0 in the low half) -> two floats: exact.
KDISPATCH_DEVICE_INLINE float2 bf16x2_to_float2(uint32_t u) {
  return make_float2(bits_to_float(u << 16), bits_to_float(u & 0xffff0000u));
}

/// float -> bf16 bits, round to nearest even, NaN kept (quietened): the rule
/// of core::float_to_bf16, for targets without a conversion instruction.
KDISPATCH_DEVICE_INLINE uint32_t float_to_bf16_rne(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

/// Two floats -> two bf16 (a in the low half), round to nearest even.
KDISPATCH_DEVICE_INLINE uint32_t float2_to_bf16x2(float a, float b) {
#if KDISPATCH_GPU_HIP
  return float_to_bf16_rne(a) | (float_to_bf16_rne(b) << 16);
#else
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // cvt.rn.bf16x2.f32 on sm_80+
  uint32_t u;
  memcpy(&u, &h, sizeof u);
  return u;
#endif
}

/// Two fp16 (element 0 in the low half) -> two floats: exact.
KDISPATCH_DEVICE_INLINE float2 fp16x2_to_float2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, sizeof u);
  return __half22float2(h);
}

/// Two floats -> two fp16 (a in the low half), round to nearest even.
KDISPATCH_DEVICE_INLINE uint32_t float2_to_fp16x2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  uint32_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}

/// Programmatic dependent launch, device side (sm_90+; no-ops elsewhere):
/// wait until the previous kernel of the stream has completed and its
/// memory is visible, then let the next kernel of the stream be scheduled
/// (it waits for our completion the same way before it reads anything).
/// Called first thing by every kernel, so a launch with the PDL attribute is
/// as safe as a plain one whatever kernel precedes or follows it.
KDISPATCH_DEVICE_INLINE void grid_dependency_wait_and_release() {
#if !KDISPATCH_GPU_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// The two halves of grid_dependency_wait_and_release(), for kernels with
/// much shared memory per block (skinny_mma): wait first thing, release
/// only when the block's main loop is done. A dependent kernel's blocks
/// become resident as soon as it is released and hold their shared memory
/// while they wait for our completion; released at our start they took the
/// slots of our own later blocks (graph replay of the skinny_mma stream ran
/// up to 1.3x slower than the same kernel launched cold on an H200).
KDISPATCH_DEVICE_INLINE void grid_dependency_wait() {
#if !KDISPATCH_GPU_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
KDISPATCH_DEVICE_INLINE void grid_dependency_release() {
#if !KDISPATCH_GPU_HIP && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// 1/sqrt, the fast hardware approximation (rel. error < 2^-22).
KDISPATCH_DEVICE_INLINE float rsqrt(float v) { return rsqrtf(v); }

/// Loads of 16-byte chunks. `load_ro`: data no thread of the kernel writes
/// (the weight), through the read-only/texture path where there is one.
KDISPATCH_DEVICE_INLINE uint4 load16(const void* p) { return *static_cast<const uint4*>(p); }
KDISPATCH_DEVICE_INLINE uint4 load16_ro(const void* p) {
#if KDISPATCH_GPU_HIP
  return *static_cast<const uint4*>(p);
#else
  return __ldg(static_cast<const uint4*>(p));
#endif
}
KDISPATCH_DEVICE_INLINE void store16(void* p, uint4 v) { *static_cast<uint4*>(p) = v; }

#endif  // device compilation

}  // namespace dispatch::KDISPATCH_GPU_NS::port
