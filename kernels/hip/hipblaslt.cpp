// SPDX-License-Identifier: Apache-2.0
// kdispatch HIP backend — the bf16/fp16 GEMM floor: hipBLASLt as torch
// calls it on ROCm (see hipblaslt.hpp; compile-checked only).
#include "hip/hipblaslt.hpp"

// Host API only (hipGetDevice, hipSetDevice, hipStream_t), from plain C++:
// the platform macro hip::host would set is not on this object's flags.
#if !defined(__HIP_PLATFORM_AMD__) && !defined(__HIP_PLATFORM_NVIDIA__)
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>
#include <vector>

#include "cuda/dl_library.hpp"  // plain dlopen helpers (no CUDA in them)
#include "gpu/blas_floor.hpp"
#include "gpu/handle_pool.hpp"
#include "ops/gemm.hpp"

namespace dispatch::hip::blaslt {
namespace {

// ---- hipBLASLt's C API (>= 0.6), declared: the values and layouts of
// hipblaslt.h, hipblas-common.h and HIP's library_types.h for the calls
// below, nothing more.
using LtStatus = int;                             // hipblasStatus_t
constexpr LtStatus kOk = 0;                       // HIPBLAS_STATUS_SUCCESS
constexpr LtStatus kInvalidValue = 3;             // HIPBLAS_STATUS_INVALID_VALUE
constexpr LtStatus kNotSupported = 7;             // HIPBLAS_STATUS_NOT_SUPPORTED
using Handle = void*;                             // hipblasLtHandle_t
using MatmulDesc = void*;                         // hipblasLtMatmulDesc_t (pointer to an opaque struct)
using Layout = void*;                             // hipblasLtMatrixLayout_t
using Preference = void*;                         // hipblasLtMatmulPreference_t
constexpr int kOpN = 111, kOpT = 112;             // hipblasOperation_t
constexpr int kCompute32F = 2;                    // hipblasComputeType_t HIPBLAS_COMPUTE_32F
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;  // hipDataType
constexpr int kDescTransA = 0, kDescTransB = 1, kDescEpilogue = 2, kDescBiasPointer = 3,
              kDescBiasDataType = 4;       // hipblasLtMatmulDescAttributes_t
constexpr uint32_t kEpilogueBias = 4;      // hipblasLtEpilogue_t HIPBLASLT_EPILOGUE_BIAS
constexpr int kPrefMaxWorkspaceBytes = 1;  // hipblasLtMatmulPreferenceAttributes_t
struct Algo {                              // hipblasLtMatmulAlgo_t
  uint8_t data[16];
  size_t max_workspace_bytes;
};
struct HeuristicResult {  // hipblasLtMatmulHeuristicResult_t
  Algo algo;
  size_t workspace_size;
  LtStatus state;
  float waves_count;
  int reserved[4];
};
static_assert(sizeof(Algo) == 24 && sizeof(HeuristicResult) == 56, "hipBLASLt's layouts (x86-64)");
constexpr int kMinVersion = 600;  // major * 100000 + minor * 100 + patch: 0.6.0

struct Api {
  void* so = nullptr;
  int version = 0;
  std::string describe;
  LtStatus (*create)(Handle*) = nullptr;
  LtStatus (*get_version)(Handle, int*) = nullptr;
  LtStatus (*desc_create)(MatmulDesc*, int, int) = nullptr;
  LtStatus (*desc_destroy)(MatmulDesc) = nullptr;
  LtStatus (*desc_set)(MatmulDesc, int, const void*, size_t) = nullptr;
  LtStatus (*layout_create)(Layout*, int, uint64_t, uint64_t, int64_t) = nullptr;
  LtStatus (*layout_destroy)(Layout) = nullptr;
  LtStatus (*pref_create)(Preference*) = nullptr;
  LtStatus (*pref_destroy)(Preference) = nullptr;
  LtStatus (*pref_set)(Preference, int, const void*, size_t) = nullptr;
  LtStatus (*heuristic)(Handle, MatmulDesc, Layout, Layout, Layout, Layout, Preference, int, HeuristicResult*,
                        int*) = nullptr;
  LtStatus (*matmul)(Handle, MatmulDesc, const void*, const void*, Layout, const void*, Layout, const void*,
                     const void*, Layout, void*, Layout, const Algo*, void*, size_t, hipStream_t) = nullptr;
  bool ok = false;
};

using cuda::dl::sym;

Api* open_api() {
  auto* a = new Api;  // kept for the process lifetime
  a->so = cuda::dl::open_or_say("KDISPATCH_HIPBLASLT", {"libhipblaslt.so.0", "libhipblaslt.so"}, "hipBLASLt",
                                "hipBLASLt floor", &a->describe);
  if (!a->so) return a;
  const bool all = sym(a->so, "hipblasLtCreate", &a->create) && sym(a->so, "hipblasLtGetVersion", &a->get_version) &&
                   sym(a->so, "hipblasLtMatmulDescCreate", &a->desc_create) &&
                   sym(a->so, "hipblasLtMatmulDescDestroy", &a->desc_destroy) &&
                   sym(a->so, "hipblasLtMatmulDescSetAttribute", &a->desc_set) &&
                   sym(a->so, "hipblasLtMatrixLayoutCreate", &a->layout_create) &&
                   sym(a->so, "hipblasLtMatrixLayoutDestroy", &a->layout_destroy) &&
                   sym(a->so, "hipblasLtMatmulPreferenceCreate", &a->pref_create) &&
                   sym(a->so, "hipblasLtMatmulPreferenceDestroy", &a->pref_destroy) &&
                   sym(a->so, "hipblasLtMatmulPreferenceSetAttribute", &a->pref_set) &&
                   sym(a->so, "hipblasLtMatmulAlgoGetHeuristic", &a->heuristic) &&
                   sym(a->so, "hipblasLtMatmul", &a->matmul);
  const std::string path = cuda::dl::path_of(reinterpret_cast<void*>(a->create));
  if (!all) {
    a->describe = "hipBLASLt unavailable: " + path + " lacks an entry point the floor uses";
    return a;
  }
  // The version needs a handle (kept: destroying it needs one more symbol).
  Handle h = nullptr;
  if (a->create(&h) != kOk || h == nullptr || a->get_version(h, &a->version) != kOk) {
    a->describe = "hipBLASLt unavailable: hipblasLtCreate failed (" + path + ")";
    return a;
  }
  if (a->version < kMinVersion) {
    a->describe = "hipBLASLt unavailable: " + path + " is version " + std::to_string(a->version) +
                  ", older than 0.6 (ROCm 6.0): its API's types differ from the ones declared here";
    return a;
  }
  a->ok = true;
  a->describe = "hipBLASLt " + std::to_string(a->version) + " (" + path + ")";
  return a;
}

const Api& api() {
  static const Api* a = open_api();
  return *a;
}

// ---- handles: one per (thread, device) (gpu::HandlePool)
Handle handle_for(const Api& a, int device) {
  struct Tag;
  return gpu::HandlePool<Tag, Handle>::acquire(device, [&](Handle* h) { return a.create(h) == kOk; });
}

/// The call's device current for the scope (the handle is per device).
using DeviceScope = gpu::DeviceScope<hipError_t, &hipGetDevice, &hipSetDevice, hipSuccess>;

int hip_type(DType t) { return t == DType::fp32 ? kR32F : t == DType::fp16 ? kR16F : kR16BF; }

/// The workspace torch offers hipBLASLt: CUBLASLT_WORKSPACE_SIZE, else
/// HIPBLASLT_WORKSPACE_SIZE (KiB), default 76 MiB.
int64_t torch_workspace() {
  static const int64_t bytes = [] {
    int64_t kib = 76 * 1024;
    const char* v = std::getenv("CUBLASLT_WORKSPACE_SIZE");
    if (!v) v = std::getenv("HIPBLASLT_WORKSPACE_SIZE");
    if (v) {
      char* end = nullptr;
      const long long x = std::strtoll(v, &end, 10);
      if (end != v && *end == '\0' && x >= 0) kib = x;
    }
    return kib * 1024;
  }();
  return bytes;
}

/// The descriptors of one call, destroyed with the scope.
struct Descs {
  const Api& a;
  MatmulDesc op = nullptr;
  Layout la = nullptr, lb = nullptr, lc = nullptr;
  explicit Descs(const Api& api) : a(api) {}
  ~Descs() {
    if (lc) (void)a.layout_destroy(lc);
    if (lb) (void)a.layout_destroy(lb);
    if (la) (void)a.layout_destroy(la);
    if (op) (void)a.desc_destroy(op);
  }
};

LtStatus make_descs(const core::Problem& p, int64_t lda, int64_t ldb, int64_t ldd, const void* bias, Descs* d) {
  const Api& a = d->a;
  LtStatus s = a.desc_create(&d->op, kCompute32F, kR32F);
  const int32_t ta = kOpT, tb = kOpN;
  if (s == kOk) s = a.desc_set(d->op, kDescTransA, &ta, sizeof ta);
  if (s == kOk) s = a.desc_set(d->op, kDescTransB, &tb, sizeof tb);
  if (s == kOk && bias != nullptr) {
    const uint32_t epi = kEpilogueBias;
    const int32_t bt = hip_type(p.out_dtype);
    s = a.desc_set(d->op, kDescEpilogue, &epi, sizeof epi);
    if (s == kOk) s = a.desc_set(d->op, kDescBiasPointer, &bias, sizeof bias);
    if (s == kOk) s = a.desc_set(d->op, kDescBiasDataType, &bt, sizeof bt);
  }
  const int in = hip_type(p.in_dtype), out = hip_type(p.out_dtype);
  const auto k = static_cast<uint64_t>(p.k), n = static_cast<uint64_t>(p.n), m = static_cast<uint64_t>(p.m);
  if (s == kOk) s = a.layout_create(&d->la, in, k, n, std::max<int64_t>(ldb, p.k));   // "A" = B^T' (K x N)
  if (s == kOk) s = a.layout_create(&d->lb, in, k, m, std::max<int64_t>(lda, p.k));   // "B" = A^T (K x M)
  if (s == kOk) s = a.layout_create(&d->lc, out, n, m, std::max<int64_t>(ldd, p.n));  // C = D = D^T (N x M)
  return s;
}

// The heuristic's first pick per exact call shape.
using PickKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool>;
struct Pick {
  bool found = false;
  Algo algo{};
  size_t workspace = 0;
};
struct PickCache {
  std::mutex mu;
  std::map<PickKey, Pick> map;
};
PickCache& picks() {
  static auto* c = new PickCache;
  return *c;
}
constexpr size_t kMaxPicks = 4096;

}  // namespace

bool available() noexcept {
  try {
    return api().ok;
  } catch (...) {
    return false;
  }
}

const std::string& describe() noexcept { return api().describe; }

Status gemm(const core::LaunchArgs& la, const core::Problem& p) noexcept {
  try {
    if (!available()) return core::needs_fallback(describe());
    gpu::BlasOperands o;
    if (Status s = gpu::blas_operands(la, p, "hipBLASLt", &o); !s.ok() || p.m < 1) return s;
    if (o.bias != nullptr && p.out_dtype != p.in_dtype)
      return core::needs_fallback("the floor's bias epilogue takes a bias in the input dtype (torch's addmm)");
    const Api& a = api();
    const int device = static_cast<int>(p.device.ordinal);
    DeviceScope on(device);
    if (!on.ok) return core::needs_fallback("cannot make device " + std::to_string(device) + " current");
    Handle h = handle_for(a, device);
    if (h == nullptr) return core::needs_fallback("hipblasLtCreate failed on device " + std::to_string(device));
    Descs d(a);
    if (LtStatus s = make_descs(p, o.lda, o.ldb, o.ldd, o.bias, &d); s != kOk)
      return make_status(StatusCode::backend_error, "hipBLASLt descriptors: status " + std::to_string(s));
    const bool has_ws = la.workspace != nullptr && la.workspace_bytes > 0;
    const int64_t offer = std::min<int64_t>(has_ws ? la.workspace_bytes : 0, torch_workspace());
    const PickKey key{p.m,
                      p.n,
                      p.k,
                      o.lda,
                      o.ldb,
                      o.ldd,
                      offer,
                      static_cast<int>(p.in_dtype),
                      static_cast<int>(p.out_dtype),
                      o.bias != nullptr};
    Pick pick;
    bool cached = false;
    PickCache& c = picks();
    {
      std::lock_guard<std::mutex> lock(c.mu);
      auto it = c.map.find(key);
      if (it != c.map.end()) pick = it->second, cached = true;
    }
    if (!cached) {
      Preference pref = nullptr;
      if (a.pref_create(&pref) == kOk) {
        const uint64_t ws = static_cast<uint64_t>(offer);
        HeuristicResult r[1] = {};
        int n = 0;
        if (a.pref_set(pref, kPrefMaxWorkspaceBytes, &ws, sizeof ws) == kOk &&
            a.heuristic(h, d.op, d.la, d.lb, d.lc, d.lc, pref, 1, r, &n) == kOk && n >= 1 && r[0].state == kOk) {
          pick.found = true;
          pick.algo = r[0].algo;
          pick.workspace = r[0].workspace_size;
        }
        (void)a.pref_destroy(pref);
      }
      std::lock_guard<std::mutex> lock(c.mu);
      if (c.map.size() < kMaxPicks) c.map.emplace(key, pick);
    }
    if (!pick.found) return core::needs_fallback("hipBLASLt's heuristic has no algorithm for this call");
    if (pick.workspace > 0 && (!has_ws || static_cast<int64_t>(pick.workspace) > la.workspace_bytes))
      return core::needs_fallback("hipBLASLt's algorithm needs " + std::to_string(pick.workspace) +
                                  " bytes of workspace, the call has " +
                                  std::to_string(has_ws ? la.workspace_bytes : 0));
    const float alpha = 1.f, beta = 0.f;
    const LtStatus s = a.matmul(h, d.op, &alpha, o.b, d.la, o.a, d.lb, &beta, o.d, d.lc, o.d, d.lc, &pick.algo,
                                has_ws ? la.workspace : nullptr, has_ws ? static_cast<size_t>(offer) : 0,
                                static_cast<hipStream_t>(la.stream));
    if (s == kOk) return Status();
    if (s == kNotSupported || s == kInvalidValue)
      return core::needs_fallback("hipblasLtMatmul refused the call: status " + std::to_string(s));
    return make_status(StatusCode::backend_error, "hipblasLtMatmul: status " + std::to_string(s));
  } catch (...) {
    return make_status(StatusCode::out_of_memory, "hipBLASLt floor");
  }
}

}  // namespace dispatch::hip::blaslt
