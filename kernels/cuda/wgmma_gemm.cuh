// SPDX-License-Identifier: Apache-2.0
// kdispatch CUDA backend — the Hopper GEMM kernel on wgmma + TMA (sm_90a):
// D[M,N] = A[M,K] · B[N,K]^T (+ bias[N]), A and B bf16 or fp16, both K
// contiguous (F.linear's layout: B is the weight, one row per output column),
// fp32 accumulation, D the input dtype or fp32. Plain CUDA: only the CUDA
// headers and CCCL's cuda::ptx (the project's glue is gemm_wgmma.cuh), so a
// scratch harness can include it alone.
//
// Block: 3 warpgroups (384 threads), one block per SM, persistent.
//   warpgroup 0, the producer: setmaxnreg 40; one thread walks the block's
//     tiles and K-tiles and issues the TMA loads of each stage (A box 64 x
//     128, B box 64 x BN, both with the 128-byte swizzle) onto the stage's
//     `full` mbarrier (expect_tx of the stage's bytes), after waiting for the
//     stage's `empty` mbarrier.
//   warpgroups 1 and 2, the consumers: setmaxnreg 232; consumer c owns rows
//     [64 c, 64 c + 64) of the block's 128 x BN tile: BN / 2 fp32
//     accumulators a thread. Per K-tile: wait `full`, wgmma.fence, four
//     wgmma.m64n<BN>k16 (k step = 32 bytes inside the swizzled 128-byte
//     rows), commit; then wait_group 1, so the K-tile before this one is
//     read, and release its stage (one arrive per consumer on `empty`, whose
//     count is 2). After a tile's last K-tile: wait_group 0, release, and the
//     epilogue (acc + bias, converted, stored from registers, predicated on
//     row < M, col < N) while the producer is already loading the next tile.
// Tiles: BM = 128 rows by BN (128 or 256) columns; the block walks tiles
// blockIdx.x, + gridDim.x, ... of the GROUP_SIZE_M order (group_m M-tiles
// share their B tiles in L2). K-tiles of 64; the TMA box past K, M or N
// reads zeros, so any K (a multiple of 8, for the 16-byte row stride) works.
//
// Shared memory (dynamic, wgmma_smem_bytes): 1024 bytes of alignment slack,
// `stages` A stages [128][64], `stages` B stages [BN][64] (each 1024-byte
// aligned, as the 128-byte swizzle needs), then the 2 * stages mbarriers.
//
// Matrix descriptors (PTX ISA, "matrix descriptor"): start address >> 4
// (bits 0-13), leading byte offset >> 4 (16-29; unused for a swizzled
// K-major operand, set to 1), stride byte offset >> 4 (32-45: 1024 bytes
// between groups of 8 rows), swizzle mode 1 = 128 bytes (bits 62-63).
//
// Accumulators of m64nNk16 (warp w of the warpgroup, lane l): d[4 j + 2 h + e]
// is D[16 w + l / 4 + 8 h][8 j + 2 (l % 4) + e].
//
// sm_90a only: the compute_90 PTX pass compiles a trap (KD_WGMMA_ENABLED 0);
// the variant declines any device whose sm_90a image does not load.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cuda/ptx>
#include <type_traits>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KD_WGMMA_ENABLED 1
#else
#define KD_WGMMA_ENABLED 0
#endif

namespace kd_wgmma {

inline constexpr int kBM = 128;          ///< rows of a block tile
inline constexpr int kBK = 64;           ///< K of a stage (128 bytes of 16-bit elements)
inline constexpr int kBK8 = 128;         ///< K of a stage of 1-byte (e4m3) elements: the same 128 bytes
inline constexpr int kThreads = 384;     ///< producer + 2 consumer warpgroups
inline constexpr int kSmemSlack = 1024;  ///< alignment slack of the dynamic shared memory
inline constexpr int kStageBytesA = kBM * kBK * 2;

/// 1 in the sm_90a image, 0 in the compute_90 PTX (whose kernels trap): the
/// probe reads it from the image the driver chose for the device, since
/// binaryVersion is 90 for the sm_90a SASS and for the compute_90 PTX
/// JIT-compiled on a CC 9.0 device alike (CUDA_FORCE_PTX_JIT=1, or an arch
/// list without 90a). One copy per translation unit: each TU's own module.
static __constant__ int kSm90aImage = KD_WGMMA_ENABLED;

/// Dynamic shared memory of a launch (bytes); b_boxes B boxes a stage
/// (moe_gemm's two experts of a tile: 2).
__host__ __device__ constexpr int smem_bytes(int bn, int stages, int b_boxes = 1) {
  return kSmemSlack + stages * (kStageBytesA + b_boxes * bn * kBK * 2) + 2 * stages * 8;
}

/// Kernel parameters (besides the two tensor maps), by value.
struct Args {
  void* d;           ///< [M][ldd], the output dtype
  const void* bias;  ///< [N] or null, the output dtype
  int64_t ldd;
  int32_t m, n, k;
  int32_t tiles_m, tiles_n, k_tiles;
  int32_t stages;   ///< shared-memory pipeline depth
  int32_t group_m;  ///< M-tiles per group of the tile order
  int32_t out_fp32;
  int32_t d_vec2;  ///< two consecutive D elements may be stored as one access
};

// ------------------------------------------------------------------ device primitives

#define KD_WGMMA_REGS64                                              \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"           \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31," \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47," \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"
#define KD_WGMMA_REGS128                                                         \
  KD_WGMMA_REGS64                                                                \
  ",%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"            \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"             \
  "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111," \
  "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
#define KD_WGMMA_O8(b)                                                                                        \
  "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]), \
      "+f"(d[b + 7])
#define KD_WGMMA_O64(b)                                                                              \
  KD_WGMMA_O8(b), KD_WGMMA_O8(b + 8), KD_WGMMA_O8(b + 16), KD_WGMMA_O8(b + 24), KD_WGMMA_O8(b + 32), \
      KD_WGMMA_O8(b + 40), KD_WGMMA_O8(b + 48), KD_WGMMA_O8(b + 56)
// One wgmma.m64n<N>k<16|32> with fp32 accumulators: NREG = N / 2 registers,
// the descriptors and scale-d after them (operands NREG, NREG + 1, NREG +
// 2); TAIL: imm-scale-a, imm-scale-b [, the 16-bit types' transposes].
#define KD_WGMMA_ASM_TAIL(SHAPE, AB, TAIL, REGS, I_DA, I_DB, I_SC, ...)                                              \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" I_SC                                                             \
               ", 0;\n"                                                                                              \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." AB "." AB " {" REGS "}, %" I_DA ", %" I_DB ", p, " TAIL \
               ";\n}\n"                                                                                              \
               : __VA_ARGS__                                                                                         \
               : "l"(da), "l"(db), "r"(scale_d))
#define KD_WGMMA_ASM(SHAPE, AB, ...) KD_WGMMA_ASM_TAIL(SHAPE, AB, "1, 1, 0, 0", __VA_ARGS__)

/// d (+)= A · B^T of one k16 step: A 64 x 16 and B N x 16 from shared memory
/// (descriptors), K-major; scale_d 0 overwrites d. BF16: bf16 inputs, else fp16.
template <bool BF16, int N>
__device__ __forceinline__ void wgmma_k16(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {
#if KD_WGMMA_ENABLED
  if constexpr (N == 256) {
    if constexpr (BF16)
      KD_WGMMA_ASM("m64n256k16", "bf16", KD_WGMMA_REGS128, "128", "129", "130", KD_WGMMA_O64(0), KD_WGMMA_O64(64));
    else
      KD_WGMMA_ASM("m64n256k16", "f16", KD_WGMMA_REGS128, "128", "129", "130", KD_WGMMA_O64(0), KD_WGMMA_O64(64));
  } else {
    static_assert(N == 128, "BN is 128 or 256");
    if constexpr (BF16)
      KD_WGMMA_ASM("m64n128k16", "bf16", KD_WGMMA_REGS64, "64", "65", "66", KD_WGMMA_O64(0));
    else
      KD_WGMMA_ASM("m64n128k16", "f16", KD_WGMMA_REGS64, "64", "65", "66", KD_WGMMA_O64(0));
  }
#else
  (void)d, (void)da, (void)db, (void)scale_d;
#endif
}

/// d (+)= A · B^T of one k32 step of e4m3 (fp8) operands: A 64 x 32 and B
/// N x 32 bytes from shared memory (descriptors), K-major; scale_d 0
/// overwrites d. The same 32 bytes of K as a 16-bit k16 step.
template <int N>
__device__ __forceinline__ void wgmma_k32_e4m3(float (&d)[N / 2], uint64_t da, uint64_t db, int scale_d) {
#if KD_WGMMA_ENABLED
  static_assert(N == 128, "fp8 tiles are 128 wide (two accumulator sets)");
  KD_WGMMA_ASM_TAIL("m64n128k32", "e4m3", "1, 1", KD_WGMMA_REGS64, "64", "65", "66", KD_WGMMA_O64(0));
#else
  (void)d, (void)da, (void)db, (void)scale_d;
#endif
}
#undef KD_WGMMA_ASM
#undef KD_WGMMA_ASM_TAIL

__device__ __forceinline__ void wgmma_fence() {
#if KD_WGMMA_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if KD_WGMMA_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if KD_WGMMA_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
#if KD_WGMMA_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
#if KD_WGMMA_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
#endif
}

/// The descriptor of a K-major operand tile in the 128-byte swizzle, whose
/// rows (128 bytes each, groups of 8 rows 1024 bytes apart) start at `p`.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

/// Waits for the phase of `bar` with parity `parity` to complete. Built
/// with -DKD_WGMMA_WATCHDOG_NS=<ns> (bench/gpu/wgmma_harness.cu), a wait
/// longer than that prints the block, thread, barrier and parity and traps:
/// a hang becomes a diagnosable error (never in the library's build).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#ifdef KD_WGMMA_WATCHDOG_NS
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > static_cast<uint64_t>(KD_WGMMA_WATCHDOG_NS)) {
      printf("kd_wgmma watchdog: block %d thread %d waited %llu ns on mbarrier %p parity %u\n", blockIdx.x, threadIdx.x,
             static_cast<unsigned long long>(t - t0), static_cast<void*>(bar), parity);
      __trap();
    }
  }
#else
  while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
#endif
}

/// Tile t of the GROUP_SIZE_M order: its M-tile and N-tile.
__device__ __forceinline__ void tile_of(int t, const Args& a, int& tm, int& tn) {
  const int per_group = a.group_m * a.tiles_n;
  const int g = t / per_group;
  const int first = g * a.group_m;
  const int size = min(a.tiles_m - first, a.group_m);
  const int r = t - g * per_group;
  tm = first + r % size;
  tn = r / size;
}

template <bool BF16>
struct Out {
  using T = typename std::conditional<BF16, __nv_bfloat16, __half>::type;
  using T2 = typename std::conditional<BF16, __nv_bfloat162, __half2>::type;
  __device__ static float load(const void* p, int i, bool f32) {
    return f32 ? static_cast<const float*>(p)[i] : static_cast<float>(static_cast<const T*>(p)[i]);
  }
};

/// Stores one consumer's 64 x BN accumulators (+ bias) to D.
template <bool BF16, int BN>
__device__ __forceinline__ void epilogue(const float (&acc)[BN / 2], const Args& a, int row0, int col0) {
  using O = Out<BF16>;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  const int r0 = row0 + 16 * warp + lane / 4;
  const bool f32 = a.out_fp32 != 0;
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    const int col = col0 + 8 * j + 2 * (lane % 4);
    if (col >= a.n) continue;
    const bool two = col + 1 < a.n;
    float b0 = 0.f, b1 = 0.f;
    if (a.bias != nullptr) {
      b0 = O::load(a.bias, col, f32);
      if (two) b1 = O::load(a.bias, col + 1, f32);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = r0 + 8 * h;
      if (row >= a.m) continue;
      const float v0 = acc[4 * j + 2 * h] + b0, v1 = acc[4 * j + 2 * h + 1] + b1;
      const int64_t off = static_cast<int64_t>(row) * a.ldd + col;
      if (f32) {
        float* d = static_cast<float*>(a.d) + off;
        if (two && a.d_vec2) {
          *reinterpret_cast<float2*>(d) = make_float2(v0, v1);
        } else {
          d[0] = v0;
          if (two) d[1] = v1;
        }
      } else {
        typename O::T* d = static_cast<typename O::T*>(a.d) + off;
        if (two && a.d_vec2) {
          typename O::T2 v;
          v.x = static_cast<typename O::T>(v0);
          v.y = static_cast<typename O::T>(v1);
          *reinterpret_cast<typename O::T2*>(d) = v;
        } else {
          d[0] = static_cast<typename O::T>(v0);
          if (two) d[1] = static_cast<typename O::T>(v1);
        }
      }
    }
  }
}

/// The block's pipeline in its dynamic shared memory (1024-byte aligned).
struct Stages {
  uint8_t* a;       ///< `stages` A stages of kStageBytesA
  uint8_t* b;       ///< `stages` B stages of b_boxes * BN * kBK * 2 bytes
  uint64_t* full;   ///< a stage's loads landed
  uint64_t* empty;  ///< a stage's wgmma done (one arrival per consumer)
};

/// Lays out the stages (b_boxes B boxes each) and their mbarriers and
/// initialises the barriers (thread 0: `full` expecting `full_arrivals`
/// arrivals, `empty` 2), then __syncthreads(). Called by every thread.
template <int BN>
__device__ __forceinline__ Stages stages_of(uint8_t* smem_raw, int stages, uint32_t full_arrivals, int b_boxes = 1) {
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* const smem = smem_raw + ((1024 - (raw & 1023)) & 1023);
  Stages st;
  st.a = smem;
  st.b = smem + stages * kStageBytesA;
  st.full = reinterpret_cast<uint64_t*>(st.b + stages * (b_boxes * BN * kBK * 2));
  st.empty = st.full + stages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      cuda::ptx::mbarrier_init(&st.full[s], full_arrivals);
      cuda::ptx::mbarrier_init(&st.empty[s], 2);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  }
  __syncthreads();
  return st;
}

// ------------------------------------------------------------------ the kernel

template <bool BF16, int BN>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_kernel(const __grid_constant__ CUtensorMap tma_a, const __grid_constant__ CUtensorMap tma_b, const Args a) {
#if KD_WGMMA_ENABLED
  extern __shared__ uint8_t smem_raw[];
  const int stages = a.stages;
  constexpr int kStageBytesB = BN * kBK * 2;
  const Stages st = stages_of<BN>(smem_raw, stages, 1);
  uint8_t* const sa = st.a;
  uint8_t* const sb = st.b;
  uint64_t* const full = st.full;
  uint64_t* const empty = st.empty;
  asm volatile("griddepcontrol.wait;" ::: "memory");

  const int tiles = a.tiles_m * a.tiles_n;
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (threadIdx.x == 0) {
      int s = 0;
      uint32_t phase = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        int tm, tn;
        tile_of(t, a, tm, tn);
        for (int kt = 0; kt < a.k_tiles; ++kt) {
          mbar_wait(&empty[s], phase ^ 1);
          cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                               &full[s], static_cast<uint32_t>(kStageBytesA + kStageBytesB));
          const int32_t ca[2] = {kt * kBK, tm * kBM};
          const int32_t cb[2] = {kt * kBK, tn * BN};
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, sa + s * kStageBytesA,
                                          &tma_a, ca, &full[s]);
          cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, sb + s * kStageBytesB,
                                          &tma_b, cb, &full[s]);
          if (++s == stages) {
            s = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    setmaxnreg_inc<232>();
    const int c = wg - 1;
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    int s = 0;
    uint32_t phase = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      int tm, tn;
      tile_of(t, a, tm, tn);
      int prev = -1;
      for (int kt = 0; kt < a.k_tiles; ++kt) {
        mbar_wait(&full[s], phase);
        const uint8_t* ta = sa + s * kStageBytesA + c * (64 * 128);
        const uint8_t* tb = sb + s * kStageBytesB;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk)
          wgmma_k16<BF16, BN>(acc, smem_desc(ta + 32 * kk), smem_desc(tb + 32 * kk), (kt > 0 || kk > 0) ? 1 : 0);
        wgmma_commit();
        wgmma_wait<1>();
        if (prev >= 0 && threadIdx.x % 128 == 0) cuda::ptx::mbarrier_arrive(&empty[prev]);
        prev = s;
        if (++s == stages) {
          s = 0;
          phase ^= 1;
        }
      }
      wgmma_wait<0>();
      if (prev >= 0 && threadIdx.x % 128 == 0) cuda::ptx::mbarrier_arrive(&empty[prev]);
      epilogue<BF16, BN>(acc, a, tm * kBM + 64 * c, tn * BN);
    }
  }
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
  (void)tma_a, (void)tma_b, (void)a;
  __trap();
#endif
}

// ------------------------------------------------------------------ host helpers

/// cuTensorMapEncodeTiled's signature (the driver entry point, found at run
/// time through the runtime: no link against libcuda).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/// The driver's cuTensorMapEncodeTiled, found once through the runtime
/// (cudaGetDriverEntryPointByVersion), or null where the driver has none.
inline EncodeTiledFn encode_fn() noexcept {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else  // CUDA 12.0-12.4: the unversioned query (deprecated from 12.5)
    const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return EncodeTiledFn{nullptr};
    }
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

/// Whether this translation unit's wgmma kernels can run on the current
/// device: its module's image is the sm_90a one (kSm90aImage) and the
/// driver has the tensor-map encoder.
inline bool sm90a_code_runs() noexcept {
  int v = 0;
  if (cudaMemcpyFromSymbol(&v, kSm90aImage, sizeof v) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return v == 1 && encode_fn() != nullptr;
}

/// The tensor map of a row-major [rows][cols] operand of `type` with row
/// stride `ld_bytes`, read in boxes of 128 bytes of columns (`box_cols`
/// elements) by `box_rows` rows with the 128-byte swizzle; zeros past its
/// edges.
inline CUresult encode_2d(EncodeTiledFn encode, CUtensorMap* out, CUtensorMapDataType type, const void* base,
                          int64_t rows, int64_t cols, int64_t ld_bytes, int box_cols, int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  return encode(out, type, 2, const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

/// The tensor map of a row-major [rows][cols] 16-bit operand with row stride
/// `ld` elements, read in boxes of kBK columns by `box_rows` rows.
inline CUresult encode_operand(EncodeTiledFn encode, CUtensorMap* out, const void* base, int64_t rows, int64_t cols,
                               int64_t ld, int box_rows, bool bf16) {
  return encode_2d(encode, out, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, base, rows,
                   cols, ld * 2, kBK, box_rows);
}

/// The same for a 1-byte (e4m3) operand, row stride `ld` bytes: boxes of
/// 128 columns (kBK8).
inline CUresult encode_operand_e4m3(EncodeTiledFn encode, CUtensorMap* out, const void* base, int64_t rows,
                                    int64_t cols, int64_t ld, int box_rows) {
  return encode_2d(encode, out, CU_TENSOR_MAP_DATA_TYPE_UINT8, base, rows, cols, ld, 128, box_rows);
}

}  // namespace kd_wgmma
