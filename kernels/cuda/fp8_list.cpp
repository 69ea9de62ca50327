// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the fp8 ops' variant lists (plain C++; kernels in
// kernels/cuda/gemm_fp8_<layout>.cu and quant_fp8_<dt>.cu, spaces in
// kernels/gpu/fp8_plan.hpp), their supports(), launch(), estimate_us() and
// get_default().
//
// The fp8 GEMMs (gemm_fp8_tensor / _rowwise / _block), e4m3fn inputs, D
// bf16, fp16 or fp32, per op in priority order:
//   gemm_fp8_<layout>_e4m3fn__skinny_mma  the decode weight stream (M <= 16)
//   gemm_fp8_<layout>_e4m3fn__cublaslt    cuBLASLt's fp8 algorithms in the
//                                         layout's scale mode (dynamic)
//   gemm_fp8_<layout>_e4m3fn__cuda_ref    the validation baseline
// A fast-accumulation problem (Problem::accum, key accum=fast) reaches the
// same rows: cuBLASLt runs it with FAST_ACCUM (a tuned row that cannot
// declines; get_default's heuristic plan runs it precise instead, kernels/
// cuda/cublaslt.cpp); skinny_mma and the reference accumulate in fp32, a
// valid (more precise) answer, and serve it unchanged.
// The quantisation ops (quant_fp8_tensor / _token / _group), x fp32, fp16
// or bf16, q e4m3fn:
//   quant_fp8_<layout>_<dt>__cuda         x * (1 / scale), num_warps
//   quant_fp8_<layout>_<dt>__cuda_ref     x / scale (the baseline)
// A wgmma/TMA family of our own slots in as one more row per layout.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#define KDISPATCH_GPU_NS cuda
#include "core/op.hpp"
#include "cuda/cublaslt.hpp"
#include "cuda/default_fit.hpp"
#include "cuda/fp8_launch.hpp"
#include "gpu/backend_decls.hpp"
#include "gpu/fp8_plan.hpp"
#include "gpu/gemm_plan.hpp"
#include "gpu/variant_checks.hpp"
#include "ops/gemm_fp8.hpp"
#include "ops/quant_fp8.hpp"

namespace dispatch::cuda {
namespace {

/// The TUs whose kernel images a point needs (kernels/gpu/families.inc): the
/// fp8 GEMM's per scale layout (0 tensor, 1 rowwise, 2 block), the
/// quantisation's per input dtype.
constexpr KernelTu kFp8GemmTus[] = {KernelTu::gemm_fp8_tensor, KernelTu::gemm_fp8_rowwise, KernelTu::gemm_fp8_block};
constexpr KernelTu quant_tu(DType dt) {
  return dt == DType::fp32   ? KernelTu::quant_fp8_fp32
         : dt == DType::fp16 ? KernelTu::quant_fp8_fp16
                             : KernelTu::quant_fp8_bf16;
}

using namespace core::variant_names;

constexpr double kBandwidth = 3.6e12;  // bytes/s, a streaming read (H200 class)
constexpr double kFp8Flops = 1.2e15;   // dense fp8 sustained by cuBLASLt
constexpr double kLaunchUs = 3.0;

double sm_scale(const DeviceInfo& dev) { return dev.compute_units > 0 ? dev.compute_units / 132.0 : 1.0; }

// ================================================================== fp8 GEMMs

constexpr OpKind kGemmOps[gpu::fp8::kLayouts] = {OpKind::gemm_fp8_tensor, OpKind::gemm_fp8_rowwise,
                                                 OpKind::gemm_fp8_block};

double gemm_bytes(const Problem& p) {
  const double ob = p.out_dtype == DType::fp32 ? 4.0 : 2.0;
  return static_cast<double>(p.m) * p.k + static_cast<double>(p.n) * p.k + static_cast<double>(p.m) * p.n * ob;
}

/// The fp8 weight stream (kernels/cuda/gemm_fp8.cuh), the bf16 skinny_mma space.
struct SkinnyMmaFamily {
  static constexpr ParamDef params[] = {
      {"row_tiles", ParamKind::integer, gpu::gemm::kSkinnyMmaRowTilesValues, {}, 1},
      {"split_k", ParamKind::integer, gpu::gemm::kSkinnyMmaSplitKValues, {}, 4},
      {"num_stages", ParamKind::integer, gpu::gemm::kSkinnyMmaStagesValues, {}, 4},
      {"cluster_k", ParamKind::integer, gpu::gemm::kSkinnyMmaClusterValues, {}, 1},
      {"warps_n", ParamKind::integer, gpu::gemm::kSkinnyMmaWarpsNValues, {}, 1},
  };
  static constexpr uint32_t flags = 0;

  static Status supports(int layout, const Problem& p, const int64_t* prm, const DeviceState* st,
                         const KernelImage** need) {
    if (p.k % 16 != 0)
      return make_status(StatusCode::unsupported_problem, "K must be a multiple of 16 (16-byte copies)");
    if (p.align_bytes < 16) return make_status(StatusCode::unsupported_problem, "operands are not 16-byte aligned");
    gpu::gemm::SkinnyMma s;
    if (const char* why =
            gpu::gemm::resolve_skinny_mma(p.n, p.k, prm, st ? st->smem_optin : 0, st ? st->cc_major : 0, &s))
      return make_status(StatusCode::unsupported_problem, why);
    if (layout == 2 && st && st->smem_optin > 0 &&
        gpu::gemm::skinny_mma_smem_bytes(s.row_tiles, 2, s.stages, s.split_k, s.warps_n, s.cluster_k, true) >
            st->smem_optin)
      return make_status(
          StatusCode::unsupported_problem,
          "split_k x num_stages x stage bytes and the scale ring exceed the device's shared memory per block");
    if (st)
      *need = &st->image(kFp8GemmTus[layout],
                         gpu::gemm::skinny_mma_kernel_index(s.row_tiles, gpu::gemm::skinny_mma_n_tiles(p.m), s.stages));
    return Status();
  }

  static Status launch(int layout, const LaunchArgs& la, const Problem& p, const int64_t* prm) {
    gpu::gemm::SkinnyMma s;
    if (const char* why = gpu::gemm::resolve_skinny_mma(p.n, p.k, prm, 0, 0, &s))
      return make_status(StatusCode::unsupported_problem, why);
    switch (layout) {
      case 0: return launch_gemm_fp8_skinny_mma_tensor(s, la, p);
      case 1: return launch_gemm_fp8_skinny_mma_rowwise(s, la, p);
      default: return launch_gemm_fp8_skinny_mma_block(s, la, p);
    }
  }

  static double estimate_us(const Problem& p, const int64_t* prm, const DeviceInfo& dev) {
    // The bf16 family's model with fp8 bytes: a read of B per 16 rows of A.
    const double sc = sm_scale(dev), sms = dev.compute_units > 0 ? dev.compute_units : 132;
    const int rt = static_cast<int>(prm[gpu::gemm::kSkinnyMmaRowTiles]);
    const int sk = static_cast<int>(prm[gpu::gemm::kSkinnyMmaSplitK]);
    const int ck = static_cast<int>(prm[gpu::gemm::kSkinnyMmaCluster]);
    const int wn = static_cast<int>(prm[gpu::gemm::kSkinnyMmaWarpsN]);
    const double warps = std::ceil(static_cast<double>(p.n) / (16.0 * rt)) * sk * ck;
    const double fill = std::min(1.0, warps / (sms * 8.0));
    const double chunks = std::ceil(static_cast<double>(p.m) / 16.0);
    const double a_share = 0.5 * 8.0 * gpu::gemm::skinny_mma_n_tiles(p.m) / (16.0 * rt * wn);
    return kLaunchUs + (ck - 1) +
           1e6 * gemm_bytes(p) * chunks * (1.0 + a_share) / (kBandwidth * sc * std::max(fill, 0.05));
  }
};

/// cuBLASLt's fp8 algorithms (kernels/cuda/cublaslt.hpp) in the layout's mode.
struct CublasLtFamily {
  static constexpr int64_t kZero[] = {0};
  static constexpr int64_t kMinusOne[] = {-1};
  static constexpr ParamDef params[] = {
      {"algo_id", ParamKind::integer, kMinusOne, {}, -1},     {"tile_id", ParamKind::integer, kZero, {}, 0},
      {"stages_id", ParamKind::integer, kZero, {}, 0},        {"split_k", ParamKind::integer, kZero, {}, 0},
      {"reduction_scheme", ParamKind::integer, kZero, {}, 0}, {"cta_swizzling", ParamKind::integer, kZero, {}, 0},
      {"custom_option", ParamKind::integer, kZero, {}, 0},    {"inner_shape_id", ParamKind::integer, kZero, {}, 0},
      {"cluster_shape_id", ParamKind::integer, kZero, {}, 0}, {"workspace_bytes", ParamKind::integer, kZero, {}, 0},
      {"cublaslt_version", ParamKind::integer, kZero, {}, 0},
  };
  static constexpr uint32_t flags = core::kVariantDynamicSpace;

  static Status supports(int, const Problem& p, const int64_t* prm, const DeviceState* st, const KernelImage**) {
    if (!st) return Status();
    if (Status s = lt::check(p, prm); !s.ok()) return make_status(StatusCode::unsupported_problem, s.message());
    return Status();
  }
  /// get_default's plan (algo_id -1) that cuBLASLt declines (no algorithm
  /// for the call: e.g. fp32 output with bias at N = 264 on cuBLASLt 13.1)
  /// runs skinny_mma (2, 4, 3), which takes any M, instead of leaving the
  /// call to the reference; a tuned row declines as it is.
  static Status launch(int layout, const LaunchArgs& la, const Problem& p, const int64_t* prm) {
    const Status st = lt::launch(la, p, prm);
    // (The block layout's row split has tried skinny_mma already when it says so.)
    if (prm[lt::kAlgoId] >= 0 || st.code() != core::kNeedsFallbackCode || p.k % 16 != 0 || p.align_bytes < 16 ||
        st.message().find("skinny_mma") != std::string::npos)
      return st;
    int64_t sk[core::kMaxParams] = {};
    sk[gpu::gemm::kSkinnyMmaRowTiles] = 2;
    sk[gpu::gemm::kSkinnyMmaSplitK] = 4;
    sk[gpu::gemm::kSkinnyMmaStages] = 3;
    sk[gpu::gemm::kSkinnyMmaCluster] = 1;
    sk[gpu::gemm::kSkinnyMmaWarpsN] = 1;
    const Status s2 = SkinnyMmaFamily::launch(layout, la, p, sk);
    if (s2.ok() || (s2.code() != core::kNeedsFallbackCode && s2.code() != StatusCode::unsupported_problem)) return s2;
    const auto why = [](const Status& x) {
      const std::string_view m = x.message(), pre = core::kNeedsFallback;
      return std::string(m.substr(0, pre.size()) == pre ? m.substr(pre.size()) : m);
    };
    return core::needs_fallback(why(st) + "; skinny_mma (2, 4, 3): " + why(s2));
  }
  static double estimate_us(const Problem& p, const int64_t*, const DeviceInfo& dev) {
    const double sc = sm_scale(dev);
    return kLaunchUs +
           1e6 * std::max(2.0 * p.m * p.n * p.k / (kFp8Flops * sc), gemm_bytes(p) / (kBandwidth * 0.8 * sc));
  }
  static int enumerate(const Problem& p, const DeviceInfo& dev, int64_t* out, int cap) {
    if (!probed(dev, DeviceType::cuda) || p.in_dtype != DType::fp8_e4m3fn || cap < 1) return 0;
    // The floor first (torch._scaled_mm's pick at the call: every search
    // races it), then the heuristic's algorithms.
    std::fill(out, out + core::kMaxParams, int64_t{0});
    out[lt::kAlgoId] = lt::kTorchPick;
    return 1 + lt::enumerate(p, lt::kDefaultWorkspaceBytes, out + core::kMaxParams, cap > 12 ? 11 : cap - 1);
  }
};

struct ReferenceFamily {
  static constexpr std::span<const ParamDef> params{};
  static constexpr uint32_t flags = core::kVariantReference;
  static Status supports(int layout, const Problem&, const int64_t*, const DeviceState* st, const KernelImage** need) {
    if (st) *need = &st->image(kFp8GemmTus[layout], kFp8RefImage);
    return Status();
  }
  static Status launch(int layout, const LaunchArgs& la, const Problem& p, const int64_t*) {
    switch (layout) {
      case 0: return launch_gemm_fp8_ref_tensor(la, p);
      case 1: return launch_gemm_fp8_ref_rowwise(la, p);
      default: return launch_gemm_fp8_ref_block(la, p);
    }
  }
  static double estimate_us(const Problem& p, const int64_t*, const DeviceInfo& dev) {
    return 1e6 * 2.0 * p.m * p.n * p.k / (1e12 * sm_scale(dev));
  }
};

template <int L, class F>
struct GemmDef {
  static const VariantDef v;
  static Status supports(const Problem& p, const int64_t* prm, const DeviceInfo& dev) {
    if (p.op != kGemmOps[L])
      return decline(v, StatusCode::unsupported_problem,
                     "not a " + std::string(v.name.substr(0, v.name.find("_e4m3fn"))) + " problem");
    if (Status s = check_device_and_dtype(v, p); !s.ok()) return s;
    if (p.out_dtype != DType::bf16 && p.out_dtype != DType::fp16 && p.out_dtype != DType::fp32)
      return decline(v, StatusCode::unsupported_problem, "the output dtype must be bf16, fp16 or fp32");
    if (p.n < 1 || p.k < 1) return decline(v, StatusCode::invalid_argument, "N and K must be >= 1");
    if (p.n > INT32_MAX || p.k > INT32_MAX)
      return decline(v, StatusCode::unsupported_problem, "N and K must be < 2^31");
    const DeviceState* st = probed(dev, DeviceType::cuda);
    const KernelImage* need = nullptr;
    if (Status s = F::supports(L, p, prm, st, &need); !s.ok()) return decline(v, s.code(), s.message());
    if (need && st) return image_ok(v, *need, *st);
    return Status();
  }
  static Status launch(const LaunchArgs& la, const Problem& p, const int64_t* prm) {
    if (p.m < 1) return Status();
    return F::launch(L, la, p, prm);
  }
};

template <int L, class F>
constexpr VariantDef gemm_variant(std::string_view name) {
  int (*en)(const Problem&, const DeviceInfo&, int64_t*, int) = nullptr;
  if constexpr (requires { &F::enumerate; }) en = &F::enumerate;
  return VariantDef{name,
                    kGemmOps[L],
                    DeviceType::cuda,
                    DType::fp8_e4m3fn,
                    F::params,
                    F::flags,
                    1,
                    &GemmDef<L, F>::supports,
                    &GemmDef<L, F>::launch,
                    0,
                    0,
                    &F::estimate_us,
                    en};
}

#define KD_FP8_GEMM(L, layout)                                                    \
  template <>                                                                     \
  constinit const VariantDef GemmDef<L, SkinnyMmaFamily>::v =                     \
      gemm_variant<L, SkinnyMmaFamily>("gemm_fp8_" layout "_e4m3fn__skinny_mma"); \
  template <>                                                                     \
  constinit const VariantDef GemmDef<L, CublasLtFamily>::v =                      \
      gemm_variant<L, CublasLtFamily>("gemm_fp8_" layout "_e4m3fn__cublaslt");    \
  template <>                                                                     \
  constinit const VariantDef GemmDef<L, ReferenceFamily>::v =                     \
      gemm_variant<L, ReferenceFamily>("gemm_fp8_" layout "_e4m3fn__cuda_ref");
KD_FP8_GEMM(0, "tensor")
KD_FP8_GEMM(1, "rowwise")
KD_FP8_GEMM(2, "block")
#undef KD_FP8_GEMM

template <int L>
constexpr const VariantDef* kGemmRows[] = {&GemmDef<L, SkinnyMmaFamily>::v, &GemmDef<L, CublasLtFamily>::v,
                                           &GemmDef<L, ReferenceFamily>::v};

int gemm_layout(OpKind op) {
  return op == OpKind::gemm_fp8_tensor ? 0 : op == OpKind::gemm_fp8_rowwise ? 1 : op == OpKind::gemm_fp8_block ? 2 : -1;
}

// ================================================================== quantisation

constexpr OpKind kQuantOps[gpu::fp8::kLayouts] = {OpKind::quant_fp8_tensor, OpKind::quant_fp8_token,
                                                  OpKind::quant_fp8_group};

Status launch_quant(DType dt, int layout, int warps, bool mul, const LaunchArgs& la, const Problem& p) {
  switch (dt) {
    case DType::fp32: return launch_quant_fp8_fp32(layout, warps, mul, la, p);
    case DType::fp16: return launch_quant_fp8_fp16(layout, warps, mul, la, p);
    default: return launch_quant_fp8_bf16(layout, warps, mul, la, p);
  }
}

double quant_us(const Problem& p, const DeviceInfo& dev) {
  const double in = p.in_dtype == DType::fp32 ? 4.0 : 2.0;
  return kLaunchUs + 1e6 * static_cast<double>(p.m) * p.k * (in + 1.0) / (kBandwidth * sm_scale(dev));
}

template <int L, DType DT, bool Ref>
struct QuantDef {
  static constexpr ParamDef kParams[] = {{"num_warps", ParamKind::integer, gpu::fp8::kQuantWarpsValues, {}, 4}};
  static const VariantDef v;
  static Status supports(const Problem& p, const int64_t* prm, const DeviceInfo& dev) {
    if (p.op != kQuantOps[L]) return decline(v, StatusCode::unsupported_problem, "not this op's problem");
    if (Status s = check_device_and_dtype(v, p); !s.ok()) return s;
    if (p.out_dtype != DType::fp8_e4m3fn) return decline(v, StatusCode::unsupported_problem, "q must be fp8_e4m3fn");
    if (p.k < 1) return decline(v, StatusCode::invalid_argument, "K must be >= 1");
    int w = 4;
    if (!Ref)
      if (const char* why = gpu::fp8::resolve_quant(prm, &w)) return decline(v, StatusCode::unsupported_problem, why);
    if (const DeviceState* st = probed(dev, DeviceType::cuda))
      return image_ok(v, st->image(quant_tu(DT), L * gpu::fp8::kQuantKernels + (Ref ? 1 : 0)), *st);
    return Status();
  }
  static Status launch(const LaunchArgs& la, const Problem& p, const int64_t* prm) {
    int w = 4;
    if (!Ref)
      if (const char* why = gpu::fp8::resolve_quant(prm, &w)) return make_status(StatusCode::unsupported_problem, why);
    return launch_quant(DT, L, w, !Ref, la, p);
  }
  static double estimate_us(const Problem& p, const int64_t*, const DeviceInfo& dev) { return quant_us(p, dev); }
};

template <int L, DType DT, bool Ref>
constexpr VariantDef quant_variant(std::string_view name) {
  std::span<const ParamDef> prm;
  if constexpr (!Ref) prm = QuantDef<L, DT, Ref>::kParams;
  return VariantDef{name,
                    kQuantOps[L],
                    DeviceType::cuda,
                    DT,
                    prm,
                    Ref ? core::kVariantReference : 0u,
                    1,
                    &QuantDef<L, DT, Ref>::supports,
                    &QuantDef<L, DT, Ref>::launch,
                    0,
                    0,
                    &QuantDef<L, DT, Ref>::estimate_us,
                    nullptr};
}

#define KD_FP8_QUANT(L, layout, DT)                                             \
  template <>                                                                   \
  constinit const VariantDef QuantDef<L, DType::DT, false>::v =                 \
      quant_variant<L, DType::DT, false>("quant_fp8_" layout "_" #DT "__cuda"); \
  template <>                                                                   \
  constinit const VariantDef QuantDef<L, DType::DT, true>::v =                  \
      quant_variant<L, DType::DT, true>("quant_fp8_" layout "_" #DT "__cuda_ref");
#define KD_FP8_QUANT_DTYPES(L, layout) \
  KD_FP8_QUANT(L, layout, fp32) KD_FP8_QUANT(L, layout, fp16) KD_FP8_QUANT(L, layout, bf16)
KD_FP8_QUANT_DTYPES(0, "tensor")
KD_FP8_QUANT_DTYPES(1, "token")
KD_FP8_QUANT_DTYPES(2, "group")
#undef KD_FP8_QUANT_DTYPES
#undef KD_FP8_QUANT

template <int L>
constexpr const VariantDef* kQuantRows[] = {&QuantDef<L, DType::fp32, false>::v, &QuantDef<L, DType::fp16, false>::v,
                                            &QuantDef<L, DType::bf16, false>::v, &QuantDef<L, DType::fp32, true>::v,
                                            &QuantDef<L, DType::fp16, true>::v,  &QuantDef<L, DType::bf16, true>::v};

}  // namespace

std::span<const core::VariantDef* const> gemm_fp8_tensor_variants() noexcept { return kGemmRows<0>; }
std::span<const core::VariantDef* const> gemm_fp8_rowwise_variants() noexcept { return kGemmRows<1>; }
std::span<const core::VariantDef* const> gemm_fp8_block_variants() noexcept { return kGemmRows<2>; }
std::span<const core::VariantDef* const> quant_fp8_tensor_variants() noexcept { return kQuantRows<0>; }
std::span<const core::VariantDef* const> quant_fp8_token_variants() noexcept { return kQuantRows<1>; }
std::span<const core::VariantDef* const> quant_fp8_group_variants() noexcept { return kQuantRows<2>; }

// ------------------------------------------------------------------ get_default
//
// fp8 GEMMs, in order, each checked with supports() (the next serves when it
// declines):
//  1. M <= 16: skinny_mma with the bf16 family's decode rule on t = 16-row
//     tiles of B per SM: row_tiles 1 up to M = 8, 2 above; (split_k,
//     num_stages) = (8, 6) for t < 1.5, (4, 6) for t < 3.2, (4, 3) for
//     t < 8, else (8, 3) (a stage is 128 elements of K here, 64 in bf16: the
//     same bytes per stage), then the same point with 3 stages (it fits
//     where 6 do not). At t >= 8 split_k is capped at ceil(K/128) / 4
//     (a power of two, >= 1): the tuned H200 rows of 32768x512 (1, not 8:
//     10.5 us against 18.0) and 24576x1536 (2) say a split of a few K
//     groups only adds partial sums;
//  2. the floor: cuBLASLt's heuristic pick for the exact call asked as
//     torch._scaled_mm asks it (algo_id = -2, cublaslt.hpp); in the
//     block layout its launch serves M % 4 != 0 and a padded or K-major
//     scale_a by splitting the rows, and ceil(K/128) % 4 != 0 (SGLang's
//     K = 256, 1152, 2304) on a copy of scale_b with its rows padded to a
//     multiple of 4 floats, the stride cuBLASLt reads (kernels/cuda/cublaslt.cpp);
//  3. skinny_mma (any M: chunks of 16 rows), then the reference.
// Quantisation: the multiply variant with 4 warps, then the reference.
core::Plan gemm_fp8_default(const core::Problem& p, const DeviceInfo& dev) noexcept {
  const int L = gemm_layout(p.op);
  Plan plan;
  if (L < 0 || p.device.type != DeviceType::cuda || p.in_dtype != DType::fp8_e4m3fn) return plan;
  const VariantDef* skinny[] = {&GemmDef<0, SkinnyMmaFamily>::v, &GemmDef<1, SkinnyMmaFamily>::v,
                                &GemmDef<2, SkinnyMmaFamily>::v};
  const VariantDef* lt_rows[] = {&GemmDef<0, CublasLtFamily>::v, &GemmDef<1, CublasLtFamily>::v,
                                 &GemmDef<2, CublasLtFamily>::v};
  const VariantDef* refs[] = {&GemmDef<0, ReferenceFamily>::v, &GemmDef<1, ReferenceFamily>::v,
                              &GemmDef<2, ReferenceFamily>::v};
  Plan cands[8];
  int nc = 0;
  const double sms = dev.compute_units > 0 ? dev.compute_units : 132;
  const double t = std::ceil(static_cast<double>(p.n) / 16.0) / sms;
  auto skinny_mma = [&](int64_t rt, int64_t sk, int64_t stages) {
    Plan c;
    c.variant = skinny[L];
    c.params[gpu::gemm::kSkinnyMmaRowTiles] = rt;
    c.params[gpu::gemm::kSkinnyMmaSplitK] = sk;
    c.params[gpu::gemm::kSkinnyMmaStages] = stages;
    c.params[gpu::gemm::kSkinnyMmaCluster] = 1;
    c.params[gpu::gemm::kSkinnyMmaWarpsN] = 1;
    cands[nc++] = c;
  };
  // The rule's point, then the same with 3 stages where it has more (at
  // row_tiles 2 and split_k 8, 6 stages exceed the H200's shared memory).
  auto decode_rule = [&] {
    const int64_t rt = p.m <= 8 ? 1 : 2;
    int64_t sk = t < 1.5 || t >= 8 ? 8 : 4;
    if (t >= 8)
      while (sk > 1 && sk * 4 > (p.k + core::kFp8Block - 1) / core::kFp8Block) sk /= 2;
    const int64_t st = t < 3.2 ? 6 : 3;
    skinny_mma(rt, sk, st);
    if (st != 3) skinny_mma(rt, sk, 3);
  };
  // The decode rule serves the (t, M) cells where the fit says it beats the
  // floor (kernels/cuda/default_fit.hpp), and the block layout's M % 4 != 0
  // (torch._scaled_mm refuses those; cuBLASLt runs only the first M & ~3 rows).
  if (p.m <= 16 && (fit::fp8_rule(L, t, p.m) || (L == 2 && p.m % 4 != 0) || !lt::available())) decode_rule();
  if (lt::available()) {
    Plan c;
    c.variant = lt_rows[L];
    c.params[lt::kAlgoId] = lt::kTorchPick;
    cands[nc++] = c;
  }
  skinny_mma(2, 4, 3);
  {
    Plan c;
    c.variant = refs[L];
    cands[nc++] = c;
  }
  for (int i = 0; i < nc; ++i)
    if (cands[i].variant->supports(p, cands[i].params, dev).ok()) return cands[i];
  return plan;
}

core::Plan gemm_fp8_floor(const core::Problem& p, const DeviceInfo& dev) noexcept {
  const int L = gemm_layout(p.op);
  if (L >= 0 && p.device.type == DeviceType::cuda && p.in_dtype == DType::fp8_e4m3fn && lt::available()) {
    const VariantDef* lt_rows[] = {&GemmDef<0, CublasLtFamily>::v, &GemmDef<1, CublasLtFamily>::v,
                                   &GemmDef<2, CublasLtFamily>::v};
    Plan c;
    c.variant = lt_rows[L];
    c.params[lt::kAlgoId] = lt::kTorchPick;
    if (c.variant->supports(p, c.params, dev).ok()) return c;
  }
  return gemm_fp8_default(p, dev);
}

core::Plan quant_fp8_default(const core::Problem& p, const DeviceInfo& dev) noexcept {
  Plan plan;
  if (p.device.type != DeviceType::cuda) return plan;
  for (int L = 0; L < gpu::fp8::kLayouts; ++L) {
    if (p.op != kQuantOps[L]) continue;
    const VariantDef* const* rows = L == 0 ? kQuantRows<0> : L == 1 ? kQuantRows<1> : kQuantRows<2>;
    for (int i = 0; i < 6; ++i) {
      Plan c;
      c.variant = rows[i];
      if (!(rows[i]->flags & core::kVariantReference)) c.params[gpu::fp8::kQuantWarps] = 4;
      if (rows[i]->supports(p, c.params, dev).ok()) return c;
    }
  }
  return plan;
}

}  // namespace dispatch::cuda
