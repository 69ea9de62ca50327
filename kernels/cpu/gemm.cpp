// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — GEMM variants: D[M,N] = A[M,K] · B[N,K]^T (+ bias[N]).
//
// Both A and B are unit-stride along K (B is a torch.nn.Linear weight), so
// the natural register tile is a block of *dot products*: MR rows of A
// against NR rows of B, each (i, j) pair owning one vector accumulator of
// partial sums along K, reduced horizontally once per K slab. Per vector step
// that is MR + NR loads for MR*NR FMAs (4x4 on AVX-512: 8 loads, 16 FMAs) and,
// unlike the outer-product (BLIS) tile, it needs no packing at all for fp32:
// at M = 1 (decode) B is streamed exactly once, straight from the weight.
//
// Loop nest of the blocked variant (one thread):
//
//   for n0 in N step BLOCK_SIZE_N            B panel: BN rows of B
//     [pack_b: convert the BN x K bf16 panel to fp32 once; reused for all M]
//     for m0 in M step BLOCK_SIZE_M          C tile: BM x BN fp32 in scratch
//       for k0 in K step BLOCK_SIZE_K        A slab BM x BK stays in L2
//         for j in BN step NR                B sliver NR x BK stays in L1
//           for i in BM step MR              micro-kernel (MR x NR dot tile)
//       epilogue: D = C (+ bias), rounded once to the output dtype
//
// BLOCK_SIZE_K trades cache locality against the horizontal reductions
// (one per tile per slab); BLOCK_SIZE_M/N set the L2 working set and how often
// the B panel is re-read from memory. Tails in M and N run the MRxNR kernel
// instantiated at the smaller size; K tails use masked loads (AVX-512) or a
// scalar loop. The micro-kernel is picked at run time ("ukernel"): every ISA
// body carries a GCC target attribute, so the library itself stays baseline
// x86-64 and supports() declines an ISA the host cannot run.
//
// bf16 in: A and B are widened to fp32 on load (exact: a shift), products
// accumulate in fp32. pack_b converts each B panel once instead of once per
// M tile, which pays off when M spans several tiles. "avx512bf16" uses
// VDPBF16PS (bf16 pairs -> fp32 accumulate, 32 MACs per instruction); it
// treats bf16 denormals as zero, as the instruction does.
//
// No allocation on the hot path except one thread_local scratch buffer that
// only grows (C tile and packed panel).
#include "cpu/gemm_list.hpp"
#include "ops/gemm.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "core/numeric.hpp"
#include "cpu/cpu_common.hpp"

#if KDISPATCH_CPU_X86
// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on _mm512_undefined_*
// (GCC bug 105593, fixed in 12.3/13); the state is per source location, so
// silencing it around the include covers every inlined use.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif

namespace dispatch::cpu {
namespace {

using namespace core::variant_names;
using Bf16 = uint16_t;  // bf16 storage

inline float to_float(float v) noexcept { return v; }
inline float to_float(Bf16 v) noexcept { return core::bf16_to_float(v); }
inline void store_as(float* d, float v) noexcept { *d = v; }
inline void store_as(Bf16* d, float v) noexcept { *d = core::float_to_bf16(v); }

// ------------------------------------------------------------------ micro-kernels
//
// Contract of every micro-kernel instance (MR x NR at most the ISA's tile):
//   c[i*ldc + j] += sum_{k < kc} A(i, k) * B(j, k),  i < MR, j < NR
// with A(i, k) = a[i*lda + k] and B(j, k) = b[j*ldb + k]. kc >= 1.

template <class TA, class TB>
using UkFn = void (*)(const TA* a, int64_t lda, const TB* b, int64_t ldb, int64_t kc, float* c, int64_t ldc);

inline constexpr int kMaxTile = 4;  // largest MR and NR of any ISA

/// One ISA's micro-kernel at every tail size: fn[mr-1][nr-1].
template <class TA, class TB>
struct UkTable {
  int mr = 0;
  int nr = 0;
  UkFn<TA, TB> fn[kMaxTile][kMaxTile] = {};
};

template <class Uk, class TA, class TB, int I>
constexpr UkFn<TA, TB> table_entry() {
  constexpr int mr = I / kMaxTile + 1;
  constexpr int nr = I % kMaxTile + 1;
  if constexpr (mr <= Uk::kMr && nr <= Uk::kNr) {
    return &Uk::template run<mr, nr, TA, TB>;
  } else {
    return nullptr;
  }
}

template <class Uk, class TA, class TB>
constexpr UkTable<TA, TB> make_table() {
  UkTable<TA, TB> t;
  t.mr = Uk::kMr;
  t.nr = Uk::kNr;
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((t.fn[I / kMaxTile][I % kMaxTile] = table_entry<Uk, TA, TB, I>()), ...);
  }
  (std::make_integer_sequence<int, kMaxTile * kMaxTile>{});
  return t;
}

/// Portable C++: MR*NR independent scalar chains (no reassociation, so the
/// compiler keeps it scalar). The baseline every host runs.
struct ScalarUk {
  static constexpr int kMr = 2;
  static constexpr int kNr = 4;

  template <int MR, int NR, class TA, class TB>
  static void run(const TA* a, int64_t lda, const TB* b, int64_t ldb, int64_t kc, float* c, int64_t ldc) {
    float acc[MR][NR] = {};
    for (int64_t k = 0; k < kc; ++k) {
      float av[MR];
      float bv[NR];
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) av[i] = to_float(a[i * lda + k]);
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) bv[j] = to_float(b[j * ldb + k]);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[i][j] += av[i] * bv[j];
    }
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NR; ++j) c[i * ldc + j] += acc[i][j];
  }

  static void widen(const Bf16* src, int64_t n, float* dst) {
    for (int64_t i = 0; i < n; ++i) dst[i] = core::bf16_to_float(src[i]);
  }
};

#if KDISPATCH_CPU_X86

// ---- AVX2 + FMA: 8 fp32 lanes, 2x4 tile (8 accumulators + 2 A + 4 B of 16 ymm).

KDISPATCH_TARGET_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
KDISPATCH_TARGET_AVX2 inline __m256 load8(const Bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/// {sum(v0), sum(v1), sum(v2), sum(v3)}.
KDISPATCH_TARGET_AVX2 inline __m128 hsum4x8(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  const __m256 t0 = _mm256_hadd_ps(v0, v1);
  const __m256 t1 = _mm256_hadd_ps(v2, v3);
  const __m256 t2 = _mm256_hadd_ps(t0, t1);
  return _mm_add_ps(_mm256_castps256_ps128(t2), _mm256_extractf128_ps(t2, 1));
}

/// Adds the horizontal sums of acc[0..NR) to c[0..NR).
template <int NR>
KDISPATCH_TARGET_AVX2 inline void add_row_sums(const __m256* acc, float* c) {
  const __m256 z = _mm256_setzero_ps();
  const __m128 s = hsum4x8(acc[0], NR > 1 ? acc[1 < NR ? 1 : 0] : z, NR > 2 ? acc[2 < NR ? 2 : 0] : z,
                           NR > 3 ? acc[3 < NR ? 3 : 0] : z);
  if constexpr (NR == 4) {
    _mm_storeu_ps(c, _mm_add_ps(_mm_loadu_ps(c), s));
  } else {
    alignas(16) float tmp[4];
    _mm_store_ps(tmp, s);
    for (int j = 0; j < NR; ++j) c[j] += tmp[j];
  }
}

struct Avx2Uk {
  static constexpr int kMr = 2;
  static constexpr int kNr = 4;

  template <int MR, int NR, class TA, class TB>
  KDISPATCH_TARGET_AVX2 static void run(const TA* a, int64_t lda, const TB* b, int64_t ldb, int64_t kc, float* c,
                                        int64_t ldc) {
    __m256 acc[MR][NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
      __m256 bv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) bv[j] = load8(b + j * ldb + k);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m256 av = load8(a + i * lda + k);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]);
      }
    }
    float tail[MR][NR] = {};
    for (; k < kc; ++k)
      for (int i = 0; i < MR; ++i)
        for (int j = 0; j < NR; ++j) tail[i][j] += to_float(a[i * lda + k]) * to_float(b[j * ldb + k]);
    for (int i = 0; i < MR; ++i) {
      add_row_sums<NR>(acc[i], c + i * ldc);
      for (int j = 0; j < NR; ++j) c[i * ldc + j] += tail[i][j];
    }
  }

  KDISPATCH_TARGET_AVX2 static void widen(const Bf16* src, int64_t n, float* dst) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(src + i));
    for (; i < n; ++i) dst[i] = core::bf16_to_float(src[i]);
  }
};

// ---- AVX-512: 16 fp32 lanes, 4x4 tile (16 accumulators + 1 A + 4 B of 32 zmm).
// K tails use zero-masked loads (no fault on the masked-off lanes).

KDISPATCH_TARGET_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
KDISPATCH_TARGET_AVX512 inline __m512 load16(const Bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
KDISPATCH_TARGET_AVX512 inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
KDISPATCH_TARGET_AVX512 inline __m512 load16(const Bf16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/// Folds a 16-lane accumulator to 8 lanes (then hsum4x8 finishes the job).
KDISPATCH_TARGET_AVX512 inline __m256 fold16(__m512 v) {
  return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

template <int NR>
KDISPATCH_TARGET_AVX512 inline void add_row_sums16(const __m512* acc, float* c) {
  __m256 f[4];
  for (int j = 0; j < 4; ++j) f[j] = j < NR ? fold16(acc[j < NR ? j : 0]) : _mm256_setzero_ps();
  const __m128 s = hsum4x8(f[0], f[1], f[2], f[3]);
  if constexpr (NR == 4) {
    _mm_storeu_ps(c, _mm_add_ps(_mm_loadu_ps(c), s));
  } else {
    alignas(16) float tmp[4];
    _mm_store_ps(tmp, s);
    for (int j = 0; j < NR; ++j) c[j] += tmp[j];
  }
}

struct Avx512Uk {
  static constexpr int kMr = 4;
  static constexpr int kNr = 4;

  template <int MR, int NR, class TA, class TB>
  KDISPATCH_TARGET_AVX512 static void run(const TA* a, int64_t lda, const TB* b, int64_t ldb, int64_t kc, float* c,
                                          int64_t ldc) {
    __m512 acc[MR][NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= kc; k += 16) {
      __m512 bv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) bv[j] = load16(b + j * ldb + k);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m512 av = load16(a + i * lda + k);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
      }
    }
    if (k < kc) {
      const __mmask16 m = static_cast<__mmask16>((1u << (kc - k)) - 1u);
      __m512 bv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) bv[j] = load16(b + j * ldb + k, m);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m512 av = load16(a + i * lda + k, m);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) add_row_sums16<NR>(acc[i], c + i * ldc);
  }

  KDISPATCH_TARGET_AVX512 static void widen(const Bf16* src, int64_t n, float* dst) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16(src + i));
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
      _mm512_mask_storeu_ps(dst + i, m, load16(src + i, m));
    }
  }
};

// ---- AVX512_BF16: VDPBF16PS, 32 bf16 MACs per instruction, 4x4 tile; bf16 x bf16 only.

struct Avx512Bf16Uk {
  static constexpr int kMr = 4;
  static constexpr int kNr = 4;

  template <int MR, int NR, class TA, class TB>
  KDISPATCH_TARGET_AVX512BF16 static void run(const TA* a, int64_t lda, const TB* b, int64_t ldb, int64_t kc, float* c,
                                              int64_t ldc) {
    static_assert(std::is_same_v<TA, Bf16> && std::is_same_v<TB, Bf16>);
    __m512 acc[MR][NR];
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= kc; k += 32) {
      __m512i bv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) bv[j] = _mm512_loadu_si512(b + j * ldb + k);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m512i av = _mm512_loadu_si512(a + i * lda + k);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)av, (__m512bh)bv[j]);
      }
    }
    if (k < kc) {
      const __mmask32 m = static_cast<__mmask32>((1u << (kc - k)) - 1u);  // kc - k < 32
      __m512i bv[NR];
#pragma GCC unroll 4
      for (int j = 0; j < NR; ++j) bv[j] = _mm512_maskz_loadu_epi16(m, b + j * ldb + k);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m512i av = _mm512_maskz_loadu_epi16(m, a + i * lda + k);
#pragma GCC unroll 4
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)av, (__m512bh)bv[j]);
      }
    }
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) add_row_sums16<NR>(acc[i], c + i * ldc);
  }
};

#endif  // KDISPATCH_CPU_X86

// ------------------------------------------------------------------ scratch

/// The calling thread's scratch (cpu_common.hpp's thread_floats, growing
/// geometrically): the C tile and the packed B panel.
struct GemmScratch;

inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// ------------------------------------------------------------------ drivers

/// The blocked loop nest (see the file comment). TA: A/B storage type; TU:
/// the B type the micro-kernel reads (TA, or float when the panel is packed).
template <class Uk, class TA, class TU, class TO>
Status run_blocked(const LaunchArgs& args, const Problem& p, const int64_t* prm) noexcept {
  static constexpr UkTable<TA, TU> kTable = make_table<Uk, TA, TU>();
  constexpr bool kPack = !std::is_same_v<TA, TU>;
  const int64_t M = p.m, N = p.n, K = p.k;
  const int64_t bm = prm[kGemmBlockM], bn = prm[kGemmBlockN], bk = prm[kGemmBlockK];
  const auto* a = static_cast<const TA*>(args.data[core::kGemmArgA]);
  const auto* b = static_cast<const TA*>(args.data[core::kGemmArgB]);
  auto* d = static_cast<TO*>(args.data[core::kGemmArgD]);
  const auto* bias = static_cast<const TO*>(args.data[core::kGemmArgBias]);
  const int64_t lda = args.ld[core::kGemmArgA], ldb = args.ld[core::kGemmArgB], ldd = args.ld[core::kGemmArgD];

  // Scratch: the C tile (bm x bn) then, when packing, the B panel (bn x ldp).
  const int64_t ldc = bn;
  const int64_t ctile = round_up(bm * bn, 16);
  const int64_t ldp = kPack ? round_up(K, 16) : 0;
  float* scratch = thread_floats<GemmScratch>(static_cast<std::size_t>(ctile + (kPack ? bn * ldp : 0)), true);
  if (scratch == nullptr) return make_status(StatusCode::out_of_memory, "gemm: scratch allocation failed");
  float* ctl = scratch;

  for (int64_t n0 = 0; n0 < N; n0 += bn) {
    const int64_t nb = std::min(bn, N - n0);
    const TU* bp;
    int64_t ldbp;
    if constexpr (kPack) {
      float* panel = scratch + ctile;
      for (int64_t j = 0; j < nb; ++j) Uk::widen(b + (n0 + j) * ldb, K, panel + j * ldp);
      bp = panel;
      ldbp = ldp;
    } else {
      bp = b + n0 * ldb;
      ldbp = ldb;
    }
    for (int64_t m0 = 0; m0 < M; m0 += bm) {
      const int64_t mb = std::min(bm, M - m0);
      for (int64_t i = 0; i < mb; ++i) std::memset(ctl + i * ldc, 0, static_cast<std::size_t>(nb) * sizeof(float));
      for (int64_t k0 = 0; k0 < K; k0 += bk) {
        const int64_t kc = std::min(bk, K - k0);
        for (int64_t j0 = 0; j0 < nb; j0 += kTable.nr) {
          const int nr = static_cast<int>(std::min<int64_t>(kTable.nr, nb - j0));
          const TU* bj = bp + j0 * ldbp + k0;
          for (int64_t i0 = 0; i0 < mb; i0 += kTable.mr) {
            const int mr = static_cast<int>(std::min<int64_t>(kTable.mr, mb - i0));
            kTable.fn[mr - 1][nr - 1](a + (m0 + i0) * lda + k0, lda, bj, ldbp, kc, ctl + i0 * ldc + j0, ldc);
          }
        }
      }
      // Epilogue: bias in fp32, one rounding to the output dtype.
      for (int64_t i = 0; i < mb; ++i) {
        const float* crow = ctl + i * ldc;
        TO* drow = d + (m0 + i) * ldd + n0;
        if (bias != nullptr) {
          for (int64_t j = 0; j < nb; ++j) store_as(drow + j, crow[j] + to_float(bias[n0 + j]));
        } else {
          for (int64_t j = 0; j < nb; ++j) store_as(drow + j, crow[j]);
        }
      }
    }
  }
  return Status::Ok();
}

/// The reference: one fp32 dot product per output, in K order.
template <class TA, class TO>
Status run_ref(const LaunchArgs& args, const Problem& p) noexcept {
  const auto* a = static_cast<const TA*>(args.data[core::kGemmArgA]);
  const auto* b = static_cast<const TA*>(args.data[core::kGemmArgB]);
  auto* d = static_cast<TO*>(args.data[core::kGemmArgD]);
  const auto* bias = static_cast<const TO*>(args.data[core::kGemmArgBias]);
  for (int64_t m = 0; m < p.m; ++m) {
    for (int64_t n = 0; n < p.n; ++n) {
      const TA* arow = a + m * args.ld[core::kGemmArgA];
      const TA* brow = b + n * args.ld[core::kGemmArgB];
      float acc = 0.f;
      for (int64_t k = 0; k < p.k; ++k) acc += to_float(arow[k]) * to_float(brow[k]);
      if (bias != nullptr) acc += to_float(bias[n]);
      store_as(d + m * args.ld[core::kGemmArgD] + n, acc);
    }
  }
  return Status::Ok();
}

// ------------------------------------------------------------------ config spaces

constexpr int64_t kBlockMValues[] = {8, 32, 128};
constexpr int64_t kBlockNValues[] = {16, 64, 256};
constexpr int64_t kBlockKValues[] = {128, 512, 2048};
constexpr int64_t kUkernelFp32Values[] = {0, 1, 2};
constexpr int64_t kUkernelBf16Values[] = {0, 1, 2, 3};
constexpr std::string_view kUkernelLabels[] = {"scalar", "avx2", "avx512", "avx512bf16"};
constexpr int64_t kBoolValues[] = {0, 1};

constexpr ParamDef kFp32BlockedParams[] = {
    {"BLOCK_SIZE_M", ParamKind::integer, kBlockMValues, {}, 32},
    {"BLOCK_SIZE_N", ParamKind::integer, kBlockNValues, {}, 64},
    {"BLOCK_SIZE_K", ParamKind::integer, kBlockKValues, {}, 512},
    {"ukernel", ParamKind::enumeration, kUkernelFp32Values, std::span(kUkernelLabels).first(3), 0},
};
constexpr ParamDef kBf16BlockedParams[] = {
    {"BLOCK_SIZE_M", ParamKind::integer, kBlockMValues, {}, 32},
    {"BLOCK_SIZE_N", ParamKind::integer, kBlockNValues, {}, 64},
    {"BLOCK_SIZE_K", ParamKind::integer, kBlockKValues, {}, 512},
    {"ukernel", ParamKind::enumeration, kUkernelBf16Values, kUkernelLabels, 0},
    {"pack_b", ParamKind::boolean, kBoolValues, {}, 0},
};

// ------------------------------------------------------------------ supports / launch

/// Checks shared by every GEMM variant: op, backend, dtypes, static dims.
Status check_problem(const VariantDef& v, const Problem& p) noexcept {
  if (p.op != OpKind::gemm) return decline(v, StatusCode::unsupported_problem, "not a gemm problem");
  if (p.device.type != DeviceType::cpu)
    return decline(v, StatusCode::unsupported_device, "CPU variant, problem is on another device");
  if (p.in_dtype != v.in_dtype) {
    return decline(v, StatusCode::unsupported_problem,
                   v.in_dtype == DType::fp32 ? "input dtype must be fp32" : "input dtype must be bf16");
  }
  if (p.out_dtype != DType::fp32 && p.out_dtype != p.in_dtype)
    return decline(v, StatusCode::unsupported_problem, "output dtype must be fp32 or the input dtype");
  if (p.n < 1 || p.k < 1) return decline(v, StatusCode::invalid_argument, "N and K must be >= 1");
  return Status::Ok();
}

/// Every param of a blocked plan is a point of its ParamDef's space, and the
/// host runs the chosen micro-kernel.
Status check_blocked_params(const VariantDef& v, const int64_t* prm) noexcept {
  if (!params_in_space(v, prm))
    return decline(v, StatusCode::invalid_argument, "a param value is outside its config space");
  const HostIsa& isa = host_isa();
  switch (static_cast<GemmUkernel>(prm[kGemmUkernel])) {
    case GemmUkernel::scalar: break;
    case GemmUkernel::avx2:
      if (!KDISPATCH_CPU_X86 || !isa.avx2)
        return decline(v, StatusCode::unsupported_problem, "ukernel avx2 needs AVX2+FMA, which this host lacks");
      break;
    case GemmUkernel::avx512:
      if (!KDISPATCH_CPU_X86 || !isa.avx512)
        return decline(v, StatusCode::unsupported_problem,
                       "ukernel avx512 needs AVX-512 F/BW/VL/DQ, which this host lacks");
      break;
    case GemmUkernel::avx512bf16:
      if (!KDISPATCH_CPU_X86 || !isa.avx512_bf16)
        return decline(v, StatusCode::unsupported_problem,
                       "ukernel avx512bf16 needs AVX512_BF16, which this host lacks");
      if (prm[kGemmPackB] != 0)
        return decline(v, StatusCode::unsupported_problem,
                       "ukernel avx512bf16 reads bf16 B directly; pack_b must be false");
      break;
  }
  return Status::Ok();
}

Status check_args(const LaunchArgs& args, const Problem& p) noexcept {
  if (args.data[core::kGemmArgA] == nullptr || args.data[core::kGemmArgB] == nullptr ||
      args.data[core::kGemmArgD] == nullptr)
    return make_status(StatusCode::invalid_argument, "gemm: a, b and d must not be null");
  if (p.has_bias && args.data[core::kGemmArgBias] == nullptr)
    return make_status(StatusCode::invalid_argument, "gemm: has_bias but bias is null");
  return Status::Ok();
}

Status fp32_blocked_supports(const Problem& p, const int64_t* prm, const DeviceInfo&) {
  if (Status s = check_problem(kGemmFp32Blocked, p); !s.ok()) return s;
  return check_blocked_params(kGemmFp32Blocked, prm);
}

Status bf16_blocked_supports(const Problem& p, const int64_t* prm, const DeviceInfo&) {
  if (Status s = check_problem(kGemmBf16Blocked, p); !s.ok()) return s;
  return check_blocked_params(kGemmBf16Blocked, prm);
}

Status fp32_ref_supports(const Problem& p, const int64_t*, const DeviceInfo&) { return check_problem(kGemmFp32Ref, p); }

Status bf16_ref_supports(const Problem& p, const int64_t*, const DeviceInfo&) { return check_problem(kGemmBf16Ref, p); }

Status isa_missing() noexcept {
  return make_status(StatusCode::unsupported_problem, "gemm: the plan's ukernel needs an ISA this host lacks");
}

Status fp32_blocked_launch(const LaunchArgs& args, const Problem& p, const int64_t* prm) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(args, p); !s.ok()) return s;
  const HostIsa& isa = host_isa();
  switch (static_cast<GemmUkernel>(prm[kGemmUkernel])) {
#if KDISPATCH_CPU_X86
    case GemmUkernel::avx512:
      if (!isa.avx512) return isa_missing();
      return run_blocked<Avx512Uk, float, float, float>(args, p, prm);
    case GemmUkernel::avx2:
      if (!isa.avx2) return isa_missing();
      return run_blocked<Avx2Uk, float, float, float>(args, p, prm);
#endif
    case GemmUkernel::scalar: return run_blocked<ScalarUk, float, float, float>(args, p, prm);
    default: return isa_missing();
  }
}

/// bf16 in, TO out: picks the micro-kernel and whether B is packed.
template <class TO>
Status bf16_blocked_dispatch(const LaunchArgs& args, const Problem& p, const int64_t* prm) noexcept {
  const bool pack = prm[kGemmPackB] != 0;
  const HostIsa& isa = host_isa();
  switch (static_cast<GemmUkernel>(prm[kGemmUkernel])) {
#if KDISPATCH_CPU_X86
    case GemmUkernel::avx512bf16:
      if (!isa.avx512_bf16) return isa_missing();
      return run_blocked<Avx512Bf16Uk, Bf16, Bf16, TO>(args, p, prm);  // pack_b declined
    case GemmUkernel::avx512:
      if (!isa.avx512) return isa_missing();
      return pack ? run_blocked<Avx512Uk, Bf16, float, TO>(args, p, prm)
                  : run_blocked<Avx512Uk, Bf16, Bf16, TO>(args, p, prm);
    case GemmUkernel::avx2:
      if (!isa.avx2) return isa_missing();
      return pack ? run_blocked<Avx2Uk, Bf16, float, TO>(args, p, prm)
                  : run_blocked<Avx2Uk, Bf16, Bf16, TO>(args, p, prm);
#endif
    case GemmUkernel::scalar:
      return pack ? run_blocked<ScalarUk, Bf16, float, TO>(args, p, prm)
                  : run_blocked<ScalarUk, Bf16, Bf16, TO>(args, p, prm);
    default: return isa_missing();
  }
}

Status bf16_blocked_launch(const LaunchArgs& args, const Problem& p, const int64_t* prm) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(args, p); !s.ok()) return s;
  return p.out_dtype == DType::fp32 ? bf16_blocked_dispatch<float>(args, p, prm)
                                    : bf16_blocked_dispatch<Bf16>(args, p, prm);
}

Status fp32_ref_launch(const LaunchArgs& args, const Problem& p, const int64_t*) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(args, p); !s.ok()) return s;
  return run_ref<float, float>(args, p);
}

Status bf16_ref_launch(const LaunchArgs& args, const Problem& p, const int64_t*) {
  if (p.m < 1) return Status::Ok();
  if (Status s = check_args(args, p); !s.ok()) return s;
  return p.out_dtype == DType::fp32 ? run_ref<Bf16, float>(args, p) : run_ref<Bf16, Bf16>(args, p);
}

}  // namespace

// ------------------------------------------------------------------ the list

constinit const core::VariantDef kGemmFp32Blocked{
    "gemm_fp32__blocked",   OpKind::gemm,        DeviceType::cpu, DType::fp32, kFp32BlockedParams, 0, 1,
    &fp32_blocked_supports, &fp32_blocked_launch};
constinit const core::VariantDef kGemmBf16Blocked{
    "gemm_bf16__blocked",   OpKind::gemm,        DeviceType::cpu, DType::bf16, kBf16BlockedParams, 0, 1,
    &bf16_blocked_supports, &bf16_blocked_launch};
constinit const core::VariantDef kGemmFp32Ref{
    "gemm_fp32__ref",   OpKind::gemm,    DeviceType::cpu, DType::fp32, {}, core::kVariantReference, 1,
    &fp32_ref_supports, &fp32_ref_launch};
constinit const core::VariantDef kGemmBf16Ref{
    "gemm_bf16__ref",   OpKind::gemm,    DeviceType::cpu, DType::bf16, {}, core::kVariantReference, 1,
    &bf16_ref_supports, &bf16_ref_launch};

// ------------------------------------------------------------------ the default

namespace {

/// The largest value of `values` (ascending) that is <= limit, else the smallest.
int64_t largest_within(std::span<const int64_t> values, int64_t limit) noexcept {
  int64_t best = values.front();
  for (int64_t v : values)
    if (v <= limit) best = v;
  return best;
}

/// The smallest value of `values` (ascending) that is >= want, if it is <=
/// limit; else the largest value <= limit.
int64_t fit_or_largest(std::span<const int64_t> values, int64_t want, int64_t limit) noexcept {
  for (int64_t v : values)
    if (v >= want && v <= limit) return v;
  return largest_within(values, limit);
}

}  // namespace

// A small model of one core (measured on Zen 5, see the report in the
// commit that added this file):
//  - K < 8: the reference. A dot-product tile would run mostly masked lanes
//    and its horizontal reductions dominate; the plain loop was faster there.
//  - ukernel: the widest the host runs (avx512bf16 for bf16 in: 32 MACs per
//    instruction beat widen-then-FMA at every measured shape).
//  - BLOCK_SIZE_K: with a single M tile (decode) the B sliver is used once,
//    so take the largest slab (fewest horizontal reductions; at M=1 K=4096,
//    slab 2048 was 1.9x faster than 128). Otherwise the MR+NR slivers of
//    one slab must sit in half of a 32 KiB L1 (the x86 floor).
//  - BLOCK_SIZE_N / BLOCK_SIZE_M: the B panel (BN x BK, reused over every
//    M tile) gets half of the per-core L2, the A slab (BM x BK) a quarter.
//    The L2 is estimated from the LLC share per hardware thread, clamped to
//    [256 KiB, 1 MiB] (1 MiB when unknown). Blocks no larger than the
//    problem needs. (At 2048^3 fp32 this picks 128/256/512, the measured
//    best of the 27 block points: 99 vs 48..97 GFLOP/s.)
//  - pack_b (bf16 without avx512bf16): once the panel is reused by >= 64
//    M tiles; on the fly the widening is nearly free at small M (at M=1
//    packing was 1.7x slower, at M=256 it was 10% faster).
core::Plan gemm_default(const core::Problem& p, const DeviceInfo& dev) noexcept {
  core::Plan plan;
  const bool bf16 = p.in_dtype == DType::bf16;
  if (p.op != OpKind::gemm || (p.in_dtype != DType::fp32 && !bf16)) return plan;
  if (p.out_dtype != DType::fp32 && p.out_dtype != p.in_dtype) return plan;
  const VariantDef& blocked = bf16 ? kGemmBf16Blocked : kGemmFp32Blocked;
  const VariantDef& ref = bf16 ? kGemmBf16Ref : kGemmFp32Ref;
  if (p.k < 8) {
    plan.variant = &ref;
    return plan;
  }

  const HostIsa& isa = host_isa();
  GemmUkernel uk = GemmUkernel::scalar;
  int64_t mr = ScalarUk::kMr, nr = ScalarUk::kNr;
#if KDISPATCH_CPU_X86
  if (bf16 && isa.avx512_bf16) {
    uk = GemmUkernel::avx512bf16;
    mr = Avx512Bf16Uk::kMr;
    nr = Avx512Bf16Uk::kNr;
  } else if (isa.avx512) {
    uk = GemmUkernel::avx512;
    mr = Avx512Uk::kMr;
    nr = Avx512Uk::kNr;
  } else if (isa.avx2) {
    uk = GemmUkernel::avx2;
    mr = Avx2Uk::kMr;
    nr = Avx2Uk::kNr;
  }
#endif
  const bool pack = bf16 && uk != GemmUkernel::avx512bf16 && (p.m + mr - 1) / mr >= 64;
  // Bytes per element as the micro-kernel reads them from cache.
  const int64_t elt = (!bf16 || pack) ? 4 : 2;

  constexpr int64_t kL1 = 32 << 10;
  int64_t l2 = 1 << 20;
  if (dev.l2_bytes > 0) {
    l2 = std::clamp<int64_t>(dev.l2_bytes / std::max<int32_t>(1, dev.compute_units), 256 << 10, 1 << 20);
  }

  const std::span<const int64_t> bk_values = blocked.params[kGemmBlockK].values;
  const std::span<const int64_t> bn_values = blocked.params[kGemmBlockN].values;
  const std::span<const int64_t> bm_values = blocked.params[kGemmBlockM].values;
  const int64_t bk = p.m <= mr ? bk_values.back() : largest_within(bk_values, kL1 / 2 / ((mr + nr) * elt));
  const int64_t slab = std::min(bk, p.k);
  const int64_t bn = fit_or_largest(bn_values, p.n, l2 / 2 / (slab * elt));
  const int64_t bm = fit_or_largest(bm_values, p.m, l2 / 4 / (slab * elt));

  plan.variant = &blocked;
  plan.params[kGemmBlockM] = bm;
  plan.params[kGemmBlockN] = bn;
  plan.params[kGemmBlockK] = bk;
  plan.params[kGemmUkernel] = static_cast<int64_t>(uk);
  if (bf16) plan.params[kGemmPackB] = pack ? 1 : 0;
  return plan;
}

}  // namespace dispatch::cpu

// ------------------------------------------------------------------ the blocked nest as a building block

namespace dispatch::cpu {
namespace {

template <class Uk>
void accumulate_fp32(const GemmAccumulate& g) noexcept {
  static constexpr UkTable<float, float> kTable = make_table<Uk, float, float>();
  for (int64_t n0 = 0; n0 < g.n; n0 += g.bn) {
    const int64_t nb = std::min(g.bn, g.n - n0);
    for (int64_t m0 = 0; m0 < g.m; m0 += g.bm) {
      const int64_t mb = std::min(g.bm, g.m - m0);
      for (int64_t k0 = 0; k0 < g.k; k0 += g.bk) {
        const int64_t kc = std::min(g.bk, g.k - k0);
        for (int64_t j0 = 0; j0 < nb; j0 += kTable.nr) {
          const int nr = static_cast<int>(std::min<int64_t>(kTable.nr, nb - j0));
          const float* bj = g.b + (n0 + j0) * g.ldb + k0;
          for (int64_t i0 = 0; i0 < mb; i0 += kTable.mr) {
            const int mr = static_cast<int>(std::min<int64_t>(kTable.mr, mb - i0));
            kTable.fn[mr - 1][nr - 1](g.a + (m0 + i0) * g.lda + k0, g.lda, bj, g.ldb, kc,
                                      g.c + (m0 + i0) * g.ldc + n0 + j0, g.ldc);
          }
        }
      }
    }
  }
}

}  // namespace

bool gemm_fp32_accumulate(const GemmAccumulate& g, GemmUkernel uk) noexcept {
  if (g.m < 1 || g.n < 1 || g.k < 1) return true;
  if (g.bm < 1 || g.bn < 1 || g.bk < 1) return false;
  [[maybe_unused]] const HostIsa& isa = host_isa();
  switch (uk) {
#if KDISPATCH_CPU_X86
    case GemmUkernel::avx512:
      if (!isa.avx512) return false;
      accumulate_fp32<Avx512Uk>(g);
      return true;
    case GemmUkernel::avx2:
      if (!isa.avx2) return false;
      accumulate_fp32<Avx2Uk>(g);
      return true;
#endif
    case GemmUkernel::scalar: accumulate_fp32<ScalarUk>(g); return true;
    default: return false;
  }
}

int gemm_ukernel_mr(GemmUkernel uk) noexcept {
  switch (uk) {
#if KDISPATCH_CPU_X86
    case GemmUkernel::avx512: return Avx512Uk::kMr;
    case GemmUkernel::avx2: return Avx2Uk::kMr;
    case GemmUkernel::avx512bf16: return Avx512Bf16Uk::kMr;
#endif
    default: return ScalarUk::kMr;
  }
}

}  // namespace dispatch::cpu
