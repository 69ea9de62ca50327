// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — cuBLASLt as a dynamic gemm family (see cublaslt.hpp).
#include "cuda/cublaslt.hpp"

#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "cuda/dl_library.hpp"
#include "ops/gemm.hpp"
#include "ops/gemm_fp8.hpp"
#define KDISPATCH_GPU_NS cuda
#include "cuda/fp8_launch.hpp"
#include "gpu/backend_decls.hpp"

namespace dispatch::cuda::lt {
namespace {

struct Api {
  void* so = nullptr;
  cublasLtHandle_t handle = nullptr;
  int64_t version = 0;
  std::string describe;

  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtGetVersion) get_version = nullptr;
  decltype(&cublasLtMatmulDescInit_internal) desc_init = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutInit_internal) layout_init = nullptr;
  decltype(&cublasLtMatmulPreferenceInit_internal) pref_init = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmulAlgoInit) algo_init = nullptr;
  decltype(&cublasLtMatmulAlgoConfigSetAttribute) algo_set = nullptr;
  decltype(&cublasLtMatmulAlgoConfigGetAttribute) algo_get = nullptr;
  decltype(&cublasLtMatmulAlgoCheck) algo_check = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  decltype(&cublasLtGetStatusName) status_name = nullptr;
};

using dl::sym;

Api* open_api() {
  auto* a = new Api;  // kept for the process lifetime
  a->so =
      dl::open_or_say("KDISPATCH_CUBLASLT", {"libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR), "libcublasLt.so"},
                      "cuBLASLt", "cuBLASLt", &a->describe);
  if (!a->so) return a;
  const bool ok = sym(a->so, "cublasLtCreate", &a->create) && sym(a->so, "cublasLtGetVersion", &a->get_version) &&
                  sym(a->so, "cublasLtMatmulDescInit_internal", &a->desc_init) &&
                  sym(a->so, "cublasLtMatmulDescSetAttribute", &a->desc_set) &&
                  sym(a->so, "cublasLtMatrixLayoutInit_internal", &a->layout_init) &&
                  sym(a->so, "cublasLtMatmulPreferenceInit_internal", &a->pref_init) &&
                  sym(a->so, "cublasLtMatmulPreferenceSetAttribute", &a->pref_set) &&
                  sym(a->so, "cublasLtMatmulAlgoGetHeuristic", &a->heuristic) &&
                  sym(a->so, "cublasLtMatmulAlgoInit", &a->algo_init) &&
                  sym(a->so, "cublasLtMatmulAlgoConfigSetAttribute", &a->algo_set) &&
                  sym(a->so, "cublasLtMatmulAlgoConfigGetAttribute", &a->algo_get) &&
                  sym(a->so, "cublasLtMatmulAlgoCheck", &a->algo_check) && sym(a->so, "cublasLtMatmul", &a->matmul) &&
                  sym(a->so, "cublasLtGetStatusName", &a->status_name);
  const std::string path = dl::path_of(reinterpret_cast<void*>(a->create));
  if (!ok) {
    a->describe = std::string("cuBLASLt unavailable: ") + path + " lacks an entry point we use";
    return a;
  }
  a->version = static_cast<int64_t>(a->get_version());
  // The internal *Init entry points take the opaque struct's size: a library
  // whose structs grew past the headers we built with would write past ours.
  if (a->version / 10000 != CUBLAS_VER_MAJOR) {
    a->describe = "cuBLASLt unavailable: " + std::string(path) + " is version " + std::to_string(a->version) +
                  ", this build's headers are major " + std::to_string(CUBLAS_VER_MAJOR);
    a->version = 0;
    return a;
  }
  if (a->create(&a->handle) != CUBLAS_STATUS_SUCCESS) {
    a->describe = std::string("cuBLASLt unavailable: cublasLtCreate failed (") + path + ")";
    a->handle = nullptr;
    a->version = 0;
    return a;
  }
  a->describe = "cuBLASLt " + std::to_string(a->version) + " (" + path + ")";
  return a;
}

const Api& api() {
  static const Api* a = open_api();
  return *a;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::fp32: return CUDA_R_32F;
    case DType::fp16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    // No gemm variant of this version takes these (supports() declines
    // them); the mapping is there for the fp8 GEMM to come.
    case DType::fp8_e4m3fn: return CUDA_R_8F_E4M3;
    case DType::fp8_e5m2: return CUDA_R_8F_E5M2;
    case DType::int32: return CUDA_R_32I;
    case DType::fp8_e4m3fnuz: break;  // no CUDA type (AMD's encoding)
  }
  return CUDA_R_32F;
}

std::string status_text(cublasStatus_t s) {
  const Api& a = api();
  return a.status_name ? a.status_name(s) : std::to_string(static_cast<int>(s));
}

/// The argument slots of the op (gemm, or an fp8 GEMM with its scales).
struct Slots {
  int a, b, d, bias, sa = -1, sb = -1;
  core::Fp8Scales scales = core::Fp8Scales::tensor;
  bool fp8 = false;
};
Slots slots_of(const core::Problem& p) {
  using namespace core;
  switch (p.op) {
    case OpKind::gemm_fp8_tensor:
      return {kFp8ArgA, kFp8ArgB, kFp8ArgD, kFp8ArgBias, kFp8ArgSa, kFp8ArgSb, Fp8Scales::tensor, true};
    case OpKind::gemm_fp8_rowwise:
      return {kFp8ArgA, kFp8ArgB, kFp8ArgD, kFp8ArgBias, kFp8ArgSa, kFp8ArgSb, Fp8Scales::rowwise, true};
    case OpKind::gemm_fp8_block:
      return {kFp8ArgA, kFp8ArgB, kFp8ArgD, kFp8ArgBias, kFp8ArgSa, kFp8ArgSb, Fp8Scales::block, true};
    default: return {kGemmArgA, kGemmArgB, kGemmArgD, kGemmArgBias};
  }
}

/// Bytes per element of a dtype cuBLASLt reads here.
int64_t elem_bytes(DType t) { return t == DType::fp32 ? 4 : t == DType::fp8_e4m3fn || t == DType::fp8_e5m2 ? 1 : 2; }

/// The problem cuBLASLt sees for `p`: in the block layout an M % 4 != 0
/// above 4 runs its first M & ~3 rows on cuBLASLt (launch_block_split), so
/// the algorithm check and the heuristic are asked at that M (sm_90 has no
/// block algorithm at M % 4 != 0).
core::Problem lt_problem(const core::Problem& p) noexcept {
  core::Problem q = p;
  if (p.op == core::OpKind::gemm_fp8_block && p.m > 4 && p.m % 4 != 0) q.m = p.m & ~int64_t{3};
  return q;
}

/// The scale pointers of an fp8 call ("A" = our B's, "B" = our A's); any
/// non-null address for a problem without data (the heuristic and the
/// algorithm check read the modes, never the scales).
struct ScalePtrs {
  const void* sa = nullptr;
  const void* sb = nullptr;
};
const ScalePtrs& placeholder_scales() {
  static const float one = 1.f;
  static const ScalePtrs s{&one, &one};
  return s;
}

/// The descriptors of one call, initialised in place (no allocation).
struct Descs {
  cublasLtMatmulDescOpaque_t op;
  cublasLtMatrixLayoutOpaque_t a, b, c;  // cuBLASLt's A (our B), B (our A), C = D
};

/// `fast_refused` (when non-null) is set when the failure is cuBLASLt
/// refusing FAST_ACCUM: the family then declines the call.
cublasStatus_t make_descs(const Api& api, const core::Problem& p, int64_t lda, int64_t ldb, int64_t ldd,
                          const void* bias, Descs* d, const ScalePtrs& sc = placeholder_scales(),
                          bool* fast_refused = nullptr) {
  cublasStatus_t s = api.desc_init(&d->op, sizeof d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  if ((s = api.desc_set(&d->op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t)) != CUBLAS_STATUS_SUCCESS) return s;
  if ((s = api.desc_set(&d->op, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n)) != CUBLAS_STATUS_SUCCESS) return s;
  if (const Slots sl = slots_of(p); sl.fp8) {
    // cuBLASLt's A is our B (scale_b), its B our A (scale_a). Modes: per
    // tensor SCALAR_32F (the default, not set: older libraries lack the
    // mode attributes); rowwise OUTER_VEC_32F; block BLK128x128_32F for
    // the weight, VEC128_32F (1 x 128 along K, M-major) for the activation.
    if ((s = api.desc_set(&d->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sc.sb, sizeof sc.sb)) != CUBLAS_STATUS_SUCCESS)
      return s;
    if ((s = api.desc_set(&d->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sc.sa, sizeof sc.sa)) != CUBLAS_STATUS_SUCCESS)
      return s;
    if (sl.scales != core::Fp8Scales::tensor) {
      const int32_t ma = sl.scales == core::Fp8Scales::rowwise ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                                               : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      const int32_t mb = sl.scales == core::Fp8Scales::rowwise ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                                               : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      if ((s = api.desc_set(&d->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof ma)) != CUBLAS_STATUS_SUCCESS)
        return s;
      if ((s = api.desc_set(&d->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof mb)) != CUBLAS_STATUS_SUCCESS)
        return s;
    }
    // accum=fast: FAST_ACCUM (int8_t 1), no periodic promotion of the fp8
    // MMAs' partial sums to fp32 (torch._scaled_mm's use_fast_accum). Set on
    // every descriptor of the call (the heuristic, the algorithm check, the
    // launch), so a row enumerated for a fast key is checked and run fast. A
    // refusal here, an empty heuristic or a failed algorithm check (the
    // block modes may refuse it, as torch refuses fast accumulation with
    // block-wise scaling) make a tuned row decline the call; get_default's
    // plan then runs without FAST_ACCUM (launch()).
    if (p.accum == core::Accum::fast) {
      const int8_t fast = 1;
      if ((s = api.desc_set(&d->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast)) != CUBLAS_STATUS_SUCCESS) {
        if (fast_refused) *fast_refused = true;
        return s;
      }
    }
  }
  if (p.has_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    if ((s = api.desc_set(&d->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)) != CUBLAS_STATUS_SUCCESS) return s;
    const cudaDataType_t bt = cuda_type(p.out_dtype);
    if ((s = api.desc_set(&d->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt)) != CUBLAS_STATUS_SUCCESS)
      return s;
    if ((s = api.desc_set(&d->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias)) != CUBLAS_STATUS_SUCCESS)
      return s;
  }
  const cudaDataType_t in = cuda_type(p.in_dtype), out = cuda_type(p.out_dtype);
  // ld must be >= rows even for one column (M = 1): cuBLASLt checks it.
  if ((s = api.layout_init(&d->a, sizeof d->a, in, static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.n),
                           std::max<int64_t>(ldb, p.k))) != CUBLAS_STATUS_SUCCESS)
    return s;
  if ((s = api.layout_init(&d->b, sizeof d->b, in, static_cast<uint64_t>(p.k), static_cast<uint64_t>(p.m),
                           std::max<int64_t>(lda, p.k))) != CUBLAS_STATUS_SUCCESS)
    return s;
  return api.layout_init(&d->c, sizeof d->c, out, static_cast<uint64_t>(p.n), static_cast<uint64_t>(p.m),
                         std::max<int64_t>(ldd, p.n));
}

/// The algorithm of a row, rebuilt from its config attributes.
cublasStatus_t make_algo(const Api& api, const core::Problem& p, const int64_t* prm, cublasLtMatmulAlgo_t* algo) {
  const cudaDataType_t in = cuda_type(p.in_dtype), out = cuda_type(p.out_dtype);
  cublasStatus_t s =
      api.algo_init(api.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F, in, in, out, out, static_cast<int>(prm[kAlgoId]), algo);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  auto set32 = [&](cublasLtMatmulAlgoConfigAttributes_t attr, int64_t v) {
    const uint32_t u = static_cast<uint32_t>(v);
    return api.algo_set(algo, attr, &u, sizeof u);
  };
  auto set16 = [&](cublasLtMatmulAlgoConfigAttributes_t attr, int64_t v) {
    const uint16_t u = static_cast<uint16_t>(v);
    return api.algo_set(algo, attr, &u, sizeof u);
  };
  const int32_t split = static_cast<int32_t>(prm[kSplitK]);
  if ((s = set32(CUBLASLT_ALGO_CONFIG_TILE_ID, prm[kTile])) != CUBLAS_STATUS_SUCCESS) return s;
  if ((s = set32(CUBLASLT_ALGO_CONFIG_STAGES_ID, prm[kStages])) != CUBLAS_STATUS_SUCCESS) return s;
  if ((s = api.algo_set(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split)) != CUBLAS_STATUS_SUCCESS)
    return s;
  if ((s = set32(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, prm[kReduction])) != CUBLAS_STATUS_SUCCESS) return s;
  if ((s = set32(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, prm[kSwizzle])) != CUBLAS_STATUS_SUCCESS) return s;
  if ((s = set32(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, prm[kCustom])) != CUBLAS_STATUS_SUCCESS) return s;
  if ((s = set16(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, prm[kInnerShape])) != CUBLAS_STATUS_SUCCESS) return s;
  return set16(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, prm[kClusterShape]);
}

/// A heuristic result as a param row.
void algo_to_params(const Api& api, const cublasLtMatmulHeuristicResult_t& r, int64_t* out) {
  for (int i = 0; i < core::kMaxParams; ++i) out[i] = 0;
  int32_t id = 0, split = 1;
  uint32_t tile = 0, stages = 0, red = 0, swz = 0, custom = 0;
  uint16_t inner = 0, cluster = 0;
  size_t w = 0;
  (void)api.algo_get(&r.algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
  (void)api.algo_get(&r.algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
  (void)api.algo_get(&r.algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
  (void)api.algo_get(&r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split, &w);
  (void)api.algo_get(&r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red, &w);
  (void)api.algo_get(&r.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof swz, &w);
  (void)api.algo_get(&r.algo, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &custom, sizeof custom, &w);
  (void)api.algo_get(&r.algo, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID, &inner, sizeof inner, &w);
  (void)api.algo_get(&r.algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster, &w);
  out[kAlgoId] = id;
  out[kTile] = tile;
  out[kStages] = stages;
  out[kSplitK] = split;
  out[kReduction] = red;
  out[kSwizzle] = swz;
  out[kCustom] = custom;
  out[kInnerShape] = inner;
  out[kClusterShape] = cluster;
  out[kWorkspace] = static_cast<int64_t>(r.workspaceSize);
  out[kVersion] = api.version;
}

/// The split-K reduction schemes a problem may use: all but "in the output
/// type" when the output is 16-bit (fp32 accumulation end to end).
uint32_t reduction_mask(const core::Problem& p) {
  uint32_t m = CUBLASLT_REDUCTION_SCHEME_MASK;
  // OUTPUT_TYPE reduces in a workspace of the output type; INPLACE adds the
  // parts up in the output buffer, in the output type too (cuBLASLt's
  // documentation): both lose fp32 accumulation for a 16-bit D.
  if (p.out_dtype != DType::fp32)
    m &= ~static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE | CUBLASLT_REDUCTION_SCHEME_INPLACE);
  return m;
}

/// Alignment (bytes, a power of two up to 256) of a pointer and a row stride.
uint32_t align_of(const void* ptr, int64_t ld_bytes) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(ptr) | static_cast<uintptr_t>(ld_bytes) | uintptr_t{256};
  return static_cast<uint32_t>(bits & (~bits + 1));
}

/// The operands' alignments as cuBLASLt's preferences see them ("A" = our
/// B, "B" = our A, C = D): 256 (its default) for a problem without data.
struct Aligns {
  uint32_t a = 256, b = 256, c = 256, d = 256;
};

/// The workspace torch offers cuBLASLt (its Lt workspace: CUBLASLT_WORKSPACE_SIZE
/// KiB, default 1024, as torch reads it), which the floor offers too: the
/// heuristic's answer depends on it.
int64_t torch_lt_workspace() {
  static const int64_t bytes = [] {
    int64_t kib = 1024;
    if (const char* v = std::getenv("CUBLASLT_WORKSPACE_SIZE")) {
      char* end = nullptr;
      const long long x = std::strtoll(v, &end, 10);
      if (end != v && *end == '\0' && x >= 0) kib = std::min<long long>(x, kDefaultWorkspaceBytes / 1024);
    }
    return std::min<int64_t>(kib * 1024, kDefaultWorkspaceBytes);
  }();
  return bytes;
}

int heuristic(const Api& api, const core::Problem& p, int64_t lda, int64_t ldb, int64_t ldd, const void* bias,
              int64_t workspace_bytes, cublasLtMatmulHeuristicResult_t* res, int cap, const Aligns& al = {},
              const ScalePtrs& sc = placeholder_scales(), bool torch_prefs = false) {
  Descs d;
  if (make_descs(api, p, lda, ldb, ldd, bias, &d, sc) != CUBLAS_STATUS_SUCCESS) return 0;
  cublasLtMatmulPreferenceOpaque_t pref;
  if (api.pref_init(&pref, sizeof pref) != CUBLAS_STATUS_SUCCESS) return 0;
  const uint64_t ws = static_cast<uint64_t>(workspace_bytes > 0 ? workspace_bytes : 0);
  if (api.pref_set(&pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) != CUBLAS_STATUS_SUCCESS) return 0;
  // No split-K whose partial sums are reduced in a 16-bit output type: the
  // H200 measured 0.02 absolute error on outputs of 0.6 (3% with K = 264,
  // M = 300), beyond what a bf16 GEMM with fp32 accumulation may return.
  // The floor (torch_prefs) asks as torch does: no mask, so the heuristic
  // returns what it returns to torch.
  const uint32_t mask = reduction_mask(p);
  if (!torch_prefs &&
      api.pref_set(&pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask) != CUBLAS_STATUS_SUCCESS)
    return 0;
  // Less aligned operands (an odd K, a sliced tensor): ask for algorithms
  // that take them, as cuBLAS does, instead of ones the call would refuse.
  if (api.pref_set(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al.a, sizeof al.a) != CUBLAS_STATUS_SUCCESS ||
      api.pref_set(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al.b, sizeof al.b) != CUBLAS_STATUS_SUCCESS ||
      api.pref_set(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al.c, sizeof al.c) != CUBLAS_STATUS_SUCCESS ||
      api.pref_set(&pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al.d, sizeof al.d) != CUBLAS_STATUS_SUCCESS)
    return 0;
  int n = 0;
  if (api.heuristic(api.handle, &d.op, &d.a, &d.b, &d.c, &d.c, &pref, cap, res, &n) != CUBLAS_STATUS_SUCCESS) return 0;
  int kept = 0;
  for (int i = 0; i < n; ++i)
    if (res[i].state == CUBLAS_STATUS_SUCCESS) res[kept++] = res[i];
  return kept;
}

// ---- the get_default pick (algo_id = -1): the heuristic's first result per
// exact call shape, asked once (a miss path only), kept for the process.
struct PickKey {
  int64_t m, n, k, lda, ldb, ldd, ws;
  int32_t in, out, bias, op, accum, mode;
  uint32_t align_a, align_b, align_c, align_d;
  bool operator==(const PickKey&) const = default;
};
struct PickHash {
  size_t operator()(const PickKey& k) const noexcept {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldd, k.ws, int64_t{k.in}, int64_t{k.out}, int64_t{k.bias},
                      int64_t{k.op}, int64_t{k.accum}, int64_t{k.mode}, int64_t{k.align_a}, int64_t{k.align_b},
                      int64_t{k.align_c}, int64_t{k.align_d}}) {
      h ^= static_cast<uint64_t>(v);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};
struct Pick {
  bool found = false;
  cublasLtMatmulAlgo_t algo;
  size_t workspace = 0;
};
struct PickCache {
  std::mutex mu;
  std::unordered_map<PickKey, Pick, PickHash> map;
};
PickCache& picks() {
  static auto* c = new PickCache;
  return *c;
}
constexpr size_t kMaxPicks = 1 << 14;

}  // namespace

bool available() noexcept {
  try {
    return api().handle != nullptr;
  } catch (...) {
    return false;
  }
}

int64_t version() noexcept { return available() ? api().version : 0; }

const std::string& describe() noexcept { return api().describe; }

Status check(const core::Problem& p, const int64_t* prm) noexcept {
  if (!available()) return make_status(StatusCode::unsupported_problem, describe());
  const Api& a = api();
  if (prm[kAlgoId] == kDefaultPick || prm[kAlgoId] == kTorchPick) return Status();  // asked at the call
  if (prm[kAlgoId] < 0)
    return make_status(StatusCode::unsupported_problem,
                       "algo_id " + std::to_string(prm[kAlgoId]) + " is neither an algorithm nor -1/-2 (a pick)");
  if (prm[kVersion] != a.version)
    return make_status(StatusCode::unsupported_problem, "tuned with cuBLASLt " + std::to_string(prm[kVersion]) +
                                                            ", this process has " + std::to_string(a.version));
  if ((static_cast<uint32_t>(prm[kReduction]) & ~reduction_mask(p)) != 0)
    return make_status(StatusCode::unsupported_problem,
                       "split-K partial sums reduced in the 16-bit output type (reduction_scheme " +
                           std::to_string(prm[kReduction]) + "): not fp32 accumulation");
  Descs d;
  const core::Problem q = lt_problem(p);  // the block layout's K as cuBLASLt runs it
  const int64_t lda = q.k, ldb = q.k, ldd = q.n;
  static const char kBias = 0;
  bool fast_refused = false;
  cublasStatus_t s =
      make_descs(a, q, lda, ldb, ldd, q.has_bias ? &kBias : nullptr, &d, placeholder_scales(), &fast_refused);
  if (fast_refused)
    return make_status(StatusCode::unsupported_problem, "cuBLASLt refuses FAST_ACCUM (accum=fast): " + status_text(s));
  cublasLtMatmulAlgo_t algo;
  if (s == CUBLAS_STATUS_SUCCESS) s = make_algo(a, q, prm, &algo);
  cublasLtMatmulHeuristicResult_t r;
  std::memset(&r, 0, sizeof r);
  if (s == CUBLAS_STATUS_SUCCESS) s = a.algo_check(a.handle, &d.op, &d.a, &d.b, &d.c, &d.c, &algo, &r);
  if (s != CUBLAS_STATUS_SUCCESS)
    return make_status(StatusCode::unsupported_problem,
                       "cublasLtMatmulAlgoCheck: " + status_text(s) +
                           (q.accum == core::Accum::fast ? " (with FAST_ACCUM, accum=fast)" : ""));
  return Status();
}

Status launch(const core::LaunchArgs& la, const core::Problem& p, const int64_t* prm) noexcept;

namespace {

/// A block-scaled call cuBLASLt takes only in part: M % 4 != 0 (sm_90
/// refuses it), or a scale_a that is padded (row stride != M) or K-major.
/// Its first M & ~3 rows go to cuBLASLt with an M-major copy of their
/// scale_a packed into the front of the workspace (a small kernel: K/128 x M
/// floats); the last M % 4 rows, and any call without room or with a
/// scale_b cuBLASLt cannot read, to our block skinny_mma (2, 4, 3), which
/// reads any layout. Never the reference: correct at any M, one launch more.
Status launch_block_split(const core::LaunchArgs& la, const core::Problem& p, const int64_t* prm, const Slots& sl,
                          bool sb_ok) noexcept {
  gpu::gemm::SkinnyMma sk;
  sk.row_tiles = 2, sk.split_k = 4, sk.stages = 3, sk.cluster_k = 1, sk.warps_n = 1;
  const int64_t head = p.m & ~int64_t{3};
  const int64_t kbs = (p.k + core::kFp8Block - 1) / core::kFp8Block;
  const int64_t bytes = (kbs * head * 4 + 255) / 256 * 256;  // the copy; cuBLASLt's workspace follows, 256-aligned
  if (!sb_ok || head == 0 || la.workspace == nullptr || la.workspace_bytes < bytes) {
    const Status st = launch_gemm_fp8_skinny_mma_block(sk, la, p);
    if (st.ok() || st.code() != core::kNeedsFallbackCode) return st;
    return core::needs_fallback(
        std::string("cuBLASLt's block-scaled fp8 GEMM ") +
        (!sb_ok ? "needs scale_b's rows contiguous" : "needs M % 4 == 0 and an M-major scale_a") +
        ", and the block family declined: " + st.message());
  }
  core::LaunchArgs lh = la;
  core::Problem ph = p;
  ph.m = head;
  float* packed = static_cast<float*>(la.workspace);
  if (Status st = launch_gemm_fp8_pack_scale_a_block(la, p, 0, head, packed, head); !st.ok()) return st;
  lh.data[sl.sa] = packed;
  lh.ld[sl.sa] = head;
  lh.workspace = static_cast<char*>(la.workspace) + bytes;
  lh.workspace_bytes = la.workspace_bytes - bytes;
  if (Status st = launch(lh, ph, prm); !st.ok()) {
    if (st.code() != core::kNeedsFallbackCode) return st;
    return launch_gemm_fp8_skinny_mma_block(sk, la, p);  // cuBLASLt declined the head: ours serves every row
  }
  if (head == p.m) return Status();
  // The tail rows: their A, D and scale_a rows (any scale_a layout).
  core::LaunchArgs lt = la;
  core::Problem pt = p;
  pt.m = p.m - head;
  const int64_t ldsa = la.ld[sl.sa];
  lt.data[sl.a] = static_cast<uint8_t*>(la.data[sl.a]) + head * la.ld[sl.a];
  lt.data[sl.d] = static_cast<char*>(la.data[sl.d]) + head * la.ld[sl.d] * elem_bytes(p.out_dtype);
  lt.data[sl.sa] = static_cast<float*>(la.data[sl.sa]) + (ldsa >= 0 ? head : head * -ldsa);
  return launch_gemm_fp8_skinny_mma_block(sk, lt, pt);
}

/// A block-scaled call at ceil(K/128) % 4 != 0 (SGLang's K = 256, 1152,
/// 2304): cuBLASLt's BLK128x128 mode reads scale_b with a row stride of
/// ceil(K/128) rounded up to 4 floats, so scale_b is copied into the front
/// of the workspace with its rows zero-padded to that stride (one small
/// kernel: ceil(N/128) x kb4 floats), then cuBLASLt runs on the rest of the
/// workspace. Without room a tuned row declines (needs fallback: the tuner
/// records the candidate as failed instead of timing a substitute under its
/// name); get_default's plan (algo_id -1, the plan a call falls back to)
/// runs our block skinny_mma instead, as launch_block_split does: declining
/// there would leave the call to the reference kernel.
Status launch_block_pad_sb(const core::LaunchArgs& la, const core::Problem& p, const int64_t* prm,
                           int64_t kb4) noexcept {
  const int64_t nb = (p.n + core::kFp8Block - 1) / core::kFp8Block;
  const int64_t bytes = (nb * kb4 * 4 + 255) / 256 * 256;
  if ((la.workspace == nullptr || la.workspace_bytes < bytes) && prm[kAlgoId] < 0) {
    gpu::gemm::SkinnyMma sk;
    sk.row_tiles = 2, sk.split_k = 4, sk.stages = 3, sk.cluster_k = 1, sk.warps_n = 1;
    return launch_gemm_fp8_skinny_mma_block(sk, la, p);
  }
  if (la.workspace == nullptr || la.workspace_bytes < bytes)
    return core::needs_fallback("cuBLASLt's block fp8 GEMM at ceil(K/128) % 4 != 0 (K = " + std::to_string(p.k) +
                                ") reads scale_b padded to rows of " + std::to_string(kb4) + " floats: needs " +
                                std::to_string(bytes) + " bytes of workspace, the call has " +
                                std::to_string(la.workspace ? la.workspace_bytes : 0));
  auto* sb = static_cast<float*>(la.workspace);
  if (Status st = launch_gemm_fp8_pad_scale_b_block(la, p, sb, kb4); !st.ok()) return st;
  core::LaunchArgs lp = la;
  lp.data[core::kFp8ArgSb] = sb;
  lp.ld[core::kFp8ArgSb] = kb4;
  lp.workspace = static_cast<char*>(la.workspace) + bytes;
  lp.workspace_bytes = la.workspace_bytes - bytes;
  return launch(lp, p, prm);
}

}  // namespace

namespace {
Status launch_one(const core::LaunchArgs& la, const core::Problem& p, const int64_t* prm) noexcept;
}  // namespace

/// accum=fast is a permission, not a demand: get_default's plan (algo_id -1)
/// that cuBLASLt cannot run with FAST_ACCUM (the flag refused, or no
/// algorithm with it: the H200's cuBLASLt 13.1 has none for the block modes
/// and for some fp32-output calls) runs with fp32 accumulation instead, as
/// skinny_mma and the reference serve fast calls. A tuned row keeps
/// FAST_ACCUM or declines: it was validated and timed fast.
Status launch(const core::LaunchArgs& la, const core::Problem& p, const int64_t* prm) noexcept {
  Status st = launch_one(la, p, prm);
  if (prm[kAlgoId] < 0 && p.accum == core::Accum::fast && st.code() == core::kNeedsFallbackCode &&
      st.message().find("FAST_ACCUM") != std::string::npos) {
    core::Problem q = p;
    q.accum = core::Accum::precise;
    return launch_one(la, q, prm);
  }
  return st;
}

namespace {

Status launch_one(const core::LaunchArgs& la, const core::Problem& p, const int64_t* prm) noexcept {
  if (!available()) return core::needs_fallback(std::string() + describe());
  const Api& a = api();
  const Slots sl = slots_of(p);
  const void* const A = la.data[sl.a];
  const void* const B = la.data[sl.b];
  void* const D = la.data[sl.d];
  const void* const bias = la.data[sl.bias];
  const int64_t lda = la.ld[sl.a], ldb = la.ld[sl.b], ldd = la.ld[sl.d];
  if (A == nullptr || B == nullptr || D == nullptr)
    return make_status(StatusCode::invalid_argument, "gemm: a, b and d must not be null");
  // cuBLASLt's layouts need ld >= rows: a broadcast operand (row stride 0)
  // or overlapping rows go to our kernels, which take any stride.
  if ((p.m > 1 && (lda < p.k || ldd < p.n)) || (p.n > 1 && ldb < p.k))
    return core::needs_fallback("cuBLASLt needs row strides >= the row length");
  ScalePtrs sc;
  if (sl.fp8) {
    sc.sa = la.data[sl.sa];
    sc.sb = la.data[sl.sb];
    if (sc.sa == nullptr || sc.sb == nullptr)
      return make_status(StatusCode::invalid_argument, "gemm_fp8: scale_a and scale_b must not be null");
    if (sl.scales == core::Fp8Scales::block) {
      // VEC128_32F reads the activation's scales M-major with no stride of
      // their own (M rows, a multiple of 4 on sm_90), the weight's as
      // [ceil(N/128), ceil(K/128)] with no padding.
      const int64_t ldsa = la.ld[sl.sa];
      const bool m4 = p.m % 4 == 0;
      // scale_b's rows: ceil(K/128) floats as given, cuBLASLt reads them
      // at a stride rounded up to 4 (launch_block_pad_sb copies them).
      const int64_t kbs = (p.k + core::kFp8Block - 1) / core::kFp8Block, kb4 = (kbs + 3) / 4 * 4;
      // One row (N <= 128) has no stride: taken as unpadded unless it is
      // launch_block_pad_sb's copy (row stride kb4).
      const int64_t ldsb = p.n <= core::kFp8Block && la.ld[sl.sb] != kb4 ? kbs : la.ld[sl.sb];
      const bool sa_ok = ldsa >= 0 && (p.k <= core::kFp8Block || ldsa == p.m);
      const bool sb_ok = ldsb == kbs || ldsb == kb4;
      if (!m4 || !sa_ok || !sb_ok) return launch_block_split(la, p, prm, sl, sb_ok);
      if (ldsb != kb4) return launch_block_pad_sb(la, p, prm, kb4);
    }
  }
  Descs d;
  bool fast_refused = false;
  cublasStatus_t s = make_descs(a, p, lda, ldb, ldd, bias, &d, sc, &fast_refused);
  if (fast_refused) return core::needs_fallback("cuBLASLt refuses FAST_ACCUM (accum=fast): " + status_text(s));
  if (s != CUBLAS_STATUS_SUCCESS)
    return make_status(StatusCode::backend_error, "cuBLASLt descriptors: " + status_text(s));
  cublasLtMatmulAlgo_t algo;
  size_t ws_need = 0;
  if (prm[kAlgoId] < 0) {
    // A pick at the call: the heuristic's first result for this exact shape,
    // offered the call's workspace (up to 32 MiB), asked with our
    // preferences (kDefaultPick, get_default's plan) or torch's (kTorchPick,
    // the floor).
    const bool torch_pick = prm[kAlgoId] == kTorchPick;
    const int64_t offer = std::min<int64_t>(la.workspace ? la.workspace_bytes : 0,
                                            torch_pick ? torch_lt_workspace() : kDefaultWorkspaceBytes);
    const int64_t ie = elem_bytes(p.in_dtype), oe = elem_bytes(p.out_dtype);
    Aligns al;
    if (!torch_pick) {
      al.a = align_of(B, ldb * ie);
      al.b = align_of(A, lda * ie);
      al.c = al.d = align_of(D, ldd * oe);
    } else if (!sl.fp8) {
      // torch's gemm_and_bias: the addresses' alignments (no strides), D's
      // taken from the bias pointer; torch._scaled_mm sets none (256).
      al.a = align_of(B, 0);
      al.b = align_of(A, 0);
      al.c = align_of(D, 0);
      al.d = align_of(bias, 0);
    }
    const PickKey key{p.m,
                      p.n,
                      p.k,
                      lda,
                      ldb,
                      ldd,
                      offer,
                      static_cast<int32_t>(p.in_dtype),
                      static_cast<int32_t>(p.out_dtype),
                      bias ? 1 : 0,
                      static_cast<int32_t>(p.op),
                      static_cast<int32_t>(p.accum),
                      static_cast<int32_t>(prm[kAlgoId]),
                      al.a,
                      al.b,
                      al.c,
                      al.d};
    Pick pick;
    bool cached = false;
    try {
      PickCache& c = picks();
      {
        std::lock_guard<std::mutex> lock(c.mu);
        auto it = c.map.find(key);
        if (it != c.map.end()) pick = it->second, cached = true;
      }
      if (!cached) {
        cublasLtMatmulHeuristicResult_t r[1];
        if (heuristic(a, p, lda, ldb, ldd, bias, offer, r, 1, al, sc, prm[kAlgoId] == kTorchPick) == 1) {
          pick.found = true;
          pick.algo = r[0].algo;
          pick.workspace = r[0].workspaceSize;
        }
        std::lock_guard<std::mutex> lock(c.mu);
        if (c.map.size() < kMaxPicks) c.map.emplace(key, pick);
      }
    } catch (...) {
      return make_status(StatusCode::out_of_memory, "cuBLASLt heuristic cache");
    }
    if (!pick.found)
      return core::needs_fallback(
          p.accum == core::Accum::fast
              ? "cuBLASLt's heuristic has no algorithm with FAST_ACCUM (accum=fast) for this call"
              : "cuBLASLt's heuristic has no algorithm for this call");
    algo = pick.algo;
    ws_need = pick.workspace;
  } else {
    if (prm[kVersion] != a.version)
      return core::needs_fallback(std::string() + "row tuned with cuBLASLt " + std::to_string(prm[kVersion]));
    if ((s = make_algo(a, p, prm, &algo)) != CUBLAS_STATUS_SUCCESS)
      return core::needs_fallback(std::string() + "cublasLtMatmulAlgoInit: " + status_text(s));
    ws_need = static_cast<size_t>(prm[kWorkspace]);
  }
  if (ws_need > 0 && (la.workspace == nullptr || static_cast<int64_t>(ws_need) > la.workspace_bytes))
    return core::needs_fallback(std::string() + "cuBLASLt algorithm needs " + std::to_string(ws_need) +
                                " bytes of workspace, the call has " +
                                std::to_string(la.workspace ? la.workspace_bytes : 0));
  const float alpha = 1.f, beta = 0.f;
  // The call's whole workspace (a row tuned at another M may need more than
  // it recorded; cuBLASLt takes what it needs).
  const bool has_ws = la.workspace != nullptr && la.workspace_bytes > 0;
  s = a.matmul(a.handle, &d.op, &alpha, B, &d.a, A, &d.b, &beta, D, &d.c, D, &d.c, &algo,
               has_ws ? la.workspace : nullptr, has_ws ? static_cast<size_t>(la.workspace_bytes) : 0,
               static_cast<cudaStream_t>(la.stream));
  if (s == CUBLAS_STATUS_SUCCESS) return Status();
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE)
    return core::needs_fallback(std::string() + "cublasLtMatmul refused the algorithm: " + status_text(s));
  return make_status(StatusCode::backend_error, "cublasLtMatmul: " + status_text(s));
}

}  // namespace

int enumerate(const core::Problem& p, int64_t workspace_bytes, int64_t* out, int cap) noexcept {
  if (!available() || cap <= 0) return 0;
  const Api& a = api();
  constexpr int kMax = 16;
  cublasLtMatmulHeuristicResult_t r[kMax];
  static const char kBias = 0;
  const core::Problem q = lt_problem(p);  // the block layout's rows as cuBLASLt runs them
  // The block launch's copies take the front of the workspace first (the
  // packed scale_a of the M % 4 != 0 split, the padded scale_b): offer
  // cuBLASLt what is left, as the launch will.
  if (p.op == core::OpKind::gemm_fp8_block) {
    const int64_t kbs = (p.k + core::kFp8Block - 1) / core::kFp8Block,
                  nb = (p.n + core::kFp8Block - 1) / core::kFp8Block;
    if (q.m != p.m) workspace_bytes -= (kbs * q.m * 4 + 255) / 256 * 256;
    if (kbs % 4 != 0) workspace_bytes -= (nb * ((kbs + 3) / 4 * 4) * 4 + 255) / 256 * 256;
    if (workspace_bytes < 0) workspace_bytes = 0;
  }
  const int n =
      heuristic(a, q, q.k, q.k, q.n, q.has_bias ? &kBias : nullptr, workspace_bytes, r, cap < kMax ? cap : kMax);
  for (int i = 0; i < n; ++i) algo_to_params(a, r[i], out + i * core::kMaxParams);
  return n;
}

}  // namespace dispatch::cuda::lt
