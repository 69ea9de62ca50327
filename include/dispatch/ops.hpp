// SPDX-License-Identifier: Apache-2.0
// kdispatch — the ops and the config lookup service.
//
// Every op: validate the tensors -> build the static key (device_name, arch,
// op, dtypes, static dims, stride classes) -> find it in the published
// table (one acquire load, no lock, no allocation) -> nearest M inside the
// key's bucket -> launch the plan resolved at load time. A miss runs the
// op's analytical get_default. The backend follows the tensors' device.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "dispatch/config.hpp"
#include "dispatch/export.hpp"
#include "dispatch/runtime.hpp"
#include "dispatch/status.hpp"
#include "dispatch/types.hpp"

namespace dispatch {

/// Where the plan of one call came from.
enum class PlanSource : uint8_t {
  table = 0,     ///< a row of a loaded config table (hit)
  fallback = 1,  ///< the op's analytical get_default (miss)
  forced = 2,    ///< a forced variant/config override
};
/// "table" | "default" | "forced".
KDISPATCH_API const char* plan_source_name(PlanSource s) noexcept;

/// Optional out-parameter of an op call: what ran and why. Filling it costs
/// a few stores; no allocation.
struct DispatchInfo {
  PlanSource source = PlanSource::fallback;
  /// Stable variant name (static storage), e.g. "gemm_fp32__blocked".
  const char* variant = "";
  /// The table's M key that served (nearest M), or -1 for a default plan
  /// (an engine's row that shaped the default: its M, k_source not empty).
  int64_t table_m = -1;
  /// Config source of the row; Runtime::source_path(source_id) names the
  /// file. 0 for a default plan.
  uint32_t source_id = 0;
  /// The call searched configs itself (sync tuning) before running.
  bool tuned_now = false;
  /// Non-empty when the default plan was shaped by an engine's tuned row
  /// (no row of kdispatch's own key, and the engine's table holds one for
  /// the call: fused_moe with SGLang's fused-MoE files, whose BLOCK_SIZE_M
  /// sets the plan's block_m where the variant has that param and takes
  /// the value): what that row does not know, "sglang file without K"
  /// (SGLang's files are keyed without H). Then table_m and source_id name
  /// the engine's row. Static storage.
  const char* k_source = "";
  /// When non-null, receives the canonical static key the call looked up
  /// (allocates; for tools and tests).
  std::string* key = nullptr;
};

/// Per-call options. Plain struct; all fields optional.
struct CallOptions {
  /// The caller's stream is being captured into a CUDA/HIP graph. The GPU
  /// backends query the capture state themselves (on a miss only); the flag
  /// lets a caller say so explicitly (and lets the CPU backend test it).
  /// During capture a call never benchmarks, synchronises or allocates.
  bool capturing = false;
  /// Filled with where the plan came from when non-null.
  DispatchInfo* info = nullptr;
  /// gemm on a GPU: scratch device memory for this call (cuBLASLt's and the
  /// tiled family's split-K), on the tensors' device, used in stream order
  /// on `stream` only by this call (as cublasLtMatmul's workspace). Null:
  /// the workspace Runtime::attach_stream gave this stream, else none. A
  /// plan that needs more than it gets falls back to get_default's plan in
  /// the same call (DispatchInfo::source says "default"); never allocated
  /// inside a call.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;  ///< bytes at `workspace`
};

/// Arguments of gemm: D[M,N] = A[M,K] · B[N,K]^T (+ bias[N]).
/// - a: [M, K], unit stride along K, row stride lda >= K.
/// - b: [N, K], the weight, row-major as torch.nn.Linear stores it
///      (unit stride along K, row stride >= K).
/// - d: [M, N], unit stride along N, row stride >= N.
/// - bias: empty, or [N] contiguous, dtype of d.
/// dtypes: a and b the same (fp32, bf16 on the CPU; bf16, fp16 on GPUs);
/// d fp32 or the input dtype. Accumulation is fp32.
struct GemmArgs {
  TensorRef a;
  TensorRef b;
  TensorRef d;
  TensorRef bias;  ///< optional: leave data null for none
};

/// Arguments of rmsnorm: y[t, :] = x[t, :] / sqrt(mean(x[t, :]^2) + eps) * w.
/// - x, y: [tokens, hidden]; unit stride along hidden; row strides may be
///   larger than hidden (and differ between x and y); y may alias x only
///   when both have the same row stride.
/// - w: [hidden], contiguous.
/// dtypes: x, y and w the same (fp32, bf16; fp16 where the backend has it).
/// Sum of squares in fp32. eps > 0 and finite (typically 1e-5 or 1e-6).
struct RmsNormArgs {
  TensorRef y;
  TensorRef x;
  TensorRef w;
  float eps = 1e-6f;
};

/// Arguments of fused_add_rmsnorm, in place as vLLM/SGLang define it:
///   residual[t, :] += x[t, :];   x[t, :] = rmsnorm(residual[t, :]) * w.
/// The sum is rounded to the residual dtype before the norm (so the stored
/// residual and the normalised value agree, as in vLLM's kernel).
/// - x, residual: [tokens, hidden], unit stride along hidden, row strides
///   >= hidden, must not overlap each other.
/// - w: [hidden], contiguous. dtypes as rmsnorm.
struct FusedAddRmsNormArgs {
  TensorRef x;
  TensorRef residual;
  TensorRef w;
  float eps = 1e-6f;
};

/// Arguments of silu_and_mul, the activation after a fused gate_up
/// projection (vLLM/SGLang's silu_and_mul(out, input)):
///   out[t, i] = silu(x[t, i]) * x[t, d + i],  silu(g) = g / (1 + exp(-g)).
/// - x: [tokens, 2*d] (gate then up), unit stride along the last dim, row
///   stride >= 2*d.
/// - out: [tokens, d], unit stride, row stride >= d; must not overlap x.
/// dtypes: x and out the same (fp32, bf16; fp16 where the backend has it);
/// computed in fp32, rounded once to the output dtype.
struct SiluAndMulArgs {
  TensorRef out;
  TensorRef x;
};

/// Arguments of the fp8 GEMM ops (w8a8):
///   D[M,N] = (A[M,K] ⊙ sa) · (B[N,K] ⊙ sb)^T (+ bias[N]),
/// fp32 accumulation (unless fast_accum), each 128-wide K group summed in
/// fp32 then scaled (the per-tensor and rowwise scales are the same for
/// every group).
/// - a: [M, K] fp8 (fp8_e4m3fn), unit stride along K, row stride >= K.
/// - b: [N, K] fp8, the same format, the weight row-major as
///      torch.nn.Linear stores it.
/// - d: [M, N] bf16, fp16 or fp32, unit stride along N, row stride >= N.
/// - scale_a, scale_b: fp32, by op:
///     gemm_fp8_tensor   scale_a [1], scale_b [1];
///     gemm_fp8_rowwise  scale_a [M] (per token), scale_b [N] (per output channel);
///     gemm_fp8_block    scale_a [ceil(K/128), M] row-major: M-major, each K
///                       group's M token scales contiguous (SGLang's
///                       "column_major_scales" option of per_token_group_quant_fp8,
///                       cuBLASLt's VEC128 layout); its row stride may exceed
///                       M (cuBLASLt wants a multiple of 4). The fast layout.
///                       Also taken K-major, SGLang's default output of
///                       per_token_group_quant_fp8 ([M, ceil(K/128)] row-
///                       major), passed as its transpose: shape
///                       [ceil(K/128), M], strides {1, s >= ceil(K/128)}
///                       (torch: x_s.t(); numpy: xs.T). Same key and rows as
///                       M-major; GPU variants convert it with one small
///                       kernel into the workspace (+1.9 us median on the
///                       H200, bench/results/h200_fp8.md); the references
///                       and the CPU variants read it directly;
///                       scale_b [ceil(N/128), ceil(K/128)] row-major, one per
///                       128x128 block of b. A partial last block (K or N not
///                       a multiple of 128) takes its block's scale.
/// - bias: empty, or [N] contiguous, dtype of d.
/// - fast_accum: false (the default): fp32 accumulation as above. true: the
///   caller accepts fast accumulation, cuBLASLt's FAST_ACCUM on the GPU
///   (torch._scaled_mm's use_fast_accum=True: on Hopper the fp8 tensor-core
///   sums keep ~fp22 precision; expect relative errors up to ~1e-2 of the
///   largest output at K in the thousands). A key field: the call's key and
///   its config file name carry `accum=fast` (a precise call's are unchanged),
///   and rows tuned for one accumulation never serve the other; the tuner
///   never turns it on by itself. Variants that accumulate in fp32 anyway
///   (skinny_mma, the references, every CPU variant) serve a fast call
///   exactly as a precise one; where cuBLASLt refuses FAST_ACCUM (it may in
///   the block layout, as torch refuses it with block-wise scaling), the
///   call falls back to a variant that serves it, never an error.
/// Scales are used as given: a zero scale gives zeros, an inf or NaN scale
/// gives inf/NaN in the outputs it touches (as torch._scaled_mm).
struct GemmFp8Args {
  TensorRef a;
  TensorRef b;
  TensorRef d;
  TensorRef scale_a;
  TensorRef scale_b;
  TensorRef bias;
  bool fast_accum = false;  ///< see above: key accum=fast
};
/// One args type per op (so pretune() overloads by op); the members are
/// GemmFp8Args's.
struct GemmFp8TensorArgs : GemmFp8Args {};
struct GemmFp8RowwiseArgs : GemmFp8Args {};
struct GemmFp8BlockArgs : GemmFp8Args {};

/// Arguments of the fp8 activation-quantisation ops (what an engine runs
/// right before an fp8 GEMM): per group of x,
///   scale = max(amax, 1e-10) / 448,  q = e4m3fn(clamp(x / scale, ±448)),
/// round to nearest even (SGLang's per_token_group_quant_fp8, vLLM's
/// dynamic scaled_fp8_quant).
/// - q: [M, K] fp8_e4m3fn, unit stride along K, row stride >= K.
/// - x: [M, K] fp32 or bf16 (fp16 on GPUs), unit stride along K.
/// - scale: fp32, written, by op:
///     quant_fp8_tensor  [1]  (one dynamic scale for the whole of x; at
///                       M = 0 too, where x and q may have null data:
///                       1e-10 / 448);
///     quant_fp8_token   [M];
///     quant_fp8_group   [ceil(K/128), M] row-major (M-major, row stride
///                       >= M): gemm_fp8_block's scale_a as it reads it.
struct QuantFp8Args {
  TensorRef q;
  TensorRef x;
  TensorRef scale;
};
struct QuantFp8TensorArgs : QuantFp8Args {};
struct QuantFp8TokenArgs : QuantFp8Args {};
struct QuantFp8GroupArgs : QuantFp8Args {};

/// Arguments of fused_moe: a Mixture-of-Experts layer's experts, as
/// SGLang's and vLLM's fused_experts (SGLang's tensor layout):
///   for each token t and choice j (e = topk_ids[t, j]):
///     [g | u] = w1[e] · hidden[t];  a = act(g) * u;
///     out[t] += topk_weights[t, j] * (w2[e] · a)
///   then out[t] *= routed_scaling_factor.
/// - hidden: [M, H], bf16, fp16 or fp32, unit stride along H.
/// - w1: [E, 2I, H] (each expert's gate rows, then its up rows), w2:
///   [E, H, I]; contiguous rows, the experts stacked densely (batch stride
///   = rows * row stride), as a torch parameter of that shape. The dtype
///   of hidden, or fp8_e4m3fn (block fp8, with the scales below).
/// - topk_weights: [M, top_k] fp32; topk_ids: [M, top_k] int32. An id
///   outside [0, E) contributes nothing (-1: an expert not local under
///   expert parallelism).
/// - out: [M, H], the dtype of hidden; written, overlapping no input.
/// - w1_scale [E, ceil(2I/128), ceil(H/128)], w2_scale [E, ceil(H/128),
///   ceil(I/128)] fp32: exactly when w1/w2 are fp8_e4m3fn (else empty), one
///   scale per 128x128 block (DeepSeek-V3's block fp8 in SGLang's layout).
///   The activations are then quantised inside the op per token and
///   128-wide group (quant_fp8_group's rule) before each GEMM.
/// - routed_scaling_factor: > 0 and finite (DeepSeek's; 1 for most models).
/// - activation: 0 silu (default), 1 gelu (erf), SGLang's `activation`.
/// The GPU path takes a 16-byte aligned workspace (CallOptions::workspace
/// or Runtime::attach_stream): M * top_k * I * 4 bytes for the largest M
/// serve the split and per-pair kernels (the default below 2 pairs per
/// expert); the tensor-core kernels (the default from 2 pairs per expert)
/// need more: workspace_bytes("fused_moe", key, max_M, DeviceType::cuda)
/// covers the default and every tuned plan. A plan given less falls back to
/// one that fits, else the call is refused, naming the bytes needed. The
/// CPU needs none.
struct FusedMoeArgs {
  TensorRef hidden;
  TensorRef w1;
  TensorRef w2;
  TensorRef topk_weights;
  TensorRef topk_ids;
  TensorRef out;
  TensorRef w1_scale;
  TensorRef w2_scale;
  float routed_scaling_factor = 1.f;
  int32_t activation = 0;  ///< 0 silu, 1 gelu
};

/// Arguments of moe_sum, the top-k reduction after a Mixture-of-Experts
/// layer's down projection (vLLM's moe_sum(input, output), SGLang's
/// moe_sum_reduce):
///   out[t, h] = routed_scaling_factor * sum_{j = 0 .. top_k-1} input[t, j, h].
/// - input: [M, top_k, hidden], unit stride along hidden, row stride >=
///   hidden, the tokens stacked densely (token stride = top_k * row
///   stride, as a contiguous tensor of that shape); bf16, fp16 or fp32.
/// - out: [M, hidden], the dtype of input, unit stride, row stride >=
///   hidden; written, overlapping no input.
/// - routed_scaling_factor: > 0 and finite (DeepSeek's; 1 for vLLM's moe_sum).
/// Deterministic: j summed in ascending order in fp32, multiplied by the
/// factor in fp32, rounded once to the out dtype. CPU: fp32 and bf16.
struct MoeSumArgs {
  TensorRef input;
  TensorRef out;
  float routed_scaling_factor = 1.f;
};

/// Arguments of moe_align, a Mixture-of-Experts layer's (token, choice)
/// pairs sorted by expert and padded to blocks (vLLM's and SGLang's
/// moe_align_block_size), what a grouped GEMM over experts walks. Pair
/// i = t * top_k + j goes to expert e = topk_ids[t, j] (dropped when e is
/// outside [0, num_experts)); each expert's pairs, i ascending, fill
/// ceil(count / block_size) blocks, the experts in order, each expert's
/// last block padded with M * top_k.
/// - topk_ids: [M, top_k] int32, unit stride along top_k.
/// - sorted_token_ids: rank 1, int32, contiguous, at least P = M*top_k +
///   min(num_experts, M*top_k) * (block_size - 1) elements (vLLM's and
///   SGLang's buffers are this or larger); written: the pairs, padded,
///   then M * top_k up to P (elements past P are left as they are).
/// - expert_ids: rank 1, int32, at least ceil(P / block_size) elements;
///   written: the expert of each block (expert_map[e] when given), then -1.
/// - num_tokens_post_pad: [1] int32; written: the padded pair count.
/// - expert_map: [num_experts] int32 or absent: each global expert's local
///   id, -1 for one not local (expert parallelism).
/// - num_experts, block_size: whole numbers in [1, 2^24] (block_size: the
///   grouped GEMM's BLOCK_SIZE_M).
/// Deterministic (an expert's pairs in ascending order): every variant
/// writes the same bits. M = 0 still launches (get_default's plan, no table,
/// no tuning) and writes num_tokens_post_pad = 0, as vLLM's kernel does; an
/// empty tensor may then have null data. An int32 size past 2^24 is refused
/// (the C ABI carries scalars as floats, exact up to 2^24).
struct MoeAlignArgs {
  TensorRef topk_ids;
  TensorRef sorted_token_ids;
  TensorRef expert_ids;
  TensorRef num_tokens_post_pad;
  TensorRef expert_map;
  int32_t num_experts = 0;
  int32_t block_size = 64;
};

/// Arguments of moe_gemm, one grouped GEMM of a Mixture-of-Experts layer
/// over moe_align's sorted pairs (the contract of SGLang's and vLLM's
/// fused_moe_kernel, called once for the up and once for the down
/// projection). For each block b of the first ceil(total / block_size),
/// total = num_tokens_post_pad[0] clamped to [0, P], e = expert_ids[b], and
/// each sorted id s of the block with 0 <= s < M * top_k:
///   out[s, :] = (a[s / top_k] · w[e]^T) * (mul_routed_weight ? topk_weights[s / top_k, s % top_k] : 1),
/// or 0 when e is outside [0, E) (an expert that is not local). Rows of
/// out no block lists are left as they are.
/// - a: [M, K], bf16, fp16 or fp32 (the dtype of out), unit stride along K.
/// - w: [E, N, K], the experts stacked densely, unit stride along K; the
///   dtype of a, or fp8_e4m3fn with w_scale (block fp8: a is then quantised
///   as the op runs, 1x128 groups along K per row, quant_fp8_group's rule).
/// - out: [M, top_k, N], the dtype of a, unit stride along N and the
///   tokens dense (pair s is row s of [M * top_k, N]); may not overlap an
///   input.
/// - topk_weights: [M, top_k] fp32, unit stride along top_k; read only when
///   mul_routed_weight.
/// - sorted_token_ids, expert_ids, num_tokens_post_pad: moe_align's outputs
///   for M * top_k pairs, E experts and this block_size (their sizes: see
///   MoeAlignArgs with num_experts = E).
/// - w_scale: [E, ceil(N/128), ceil(K/128)] fp32, exactly when w is fp8.
/// - top_k, block_size: whole numbers in [1, 2^24]. SGLang's up call: a =
///   hidden, top_k = the router's; its down call: a = the activated
///   intermediate [M * top_k, I], top_k = 1, out and topk_weights viewed as
///   [M * top_k, 1, H] and [M * top_k, 1], mul_routed_weight = 1.
/// - mul_routed_weight: 0 or 1.
/// M = 0 does nothing.
struct MoeGemmArgs {
  TensorRef a;
  TensorRef w;
  TensorRef out;
  TensorRef topk_weights;
  TensorRef sorted_token_ids;
  TensorRef expert_ids;
  TensorRef num_tokens_post_pad;
  TensorRef w_scale;
  int32_t top_k = 0;
  int32_t block_size = 64;
  int32_t mul_routed_weight = 0;
};

/// Arguments of moe_gemm_fp8_tensor and moe_gemm_fp8_channel: moe_gemm
/// (MoeGemmArgs) on fp8 weights with SGLang's per-tensor or per-channel
/// scales (its fused-MoE files' dtype=fp8_w8a8 without block_shape; with
/// per_channel_quant=True):
///   out[s, :] = (q(a[t]) · w[e]^T) * sa(t) * sw(e, :) * (mul_routed_weight ? topk_weights[t, s % top_k] : 1),
///   t = s / top_k, for the pairs s of each processed block as moe_gemm.
/// - a: [M, K] bf16 or fp32, unit stride along K; out [M, top_k, N] the
///   dtype of a; topk_weights, sorted_token_ids, expert_ids,
///   num_tokens_post_pad, top_k, block_size, mul_routed_weight: as
///   MoeGemmArgs.
/// - w: [E, N, K] fp8_e4m3fn, the experts stacked densely.
/// - w_scale: fp32, moe_gemm_fp8_tensor: [E] (sw(e, :) = w_scale[e]);
///   moe_gemm_fp8_channel: [E, N] (sw(e, n) = w_scale[e, n]; SGLang's
///   [E, N, 1] viewed as [E, N]).
/// - a_scale: [1] fp32 or absent. Given (static): q(a) = e4m3fn(clamp(a /
///   a_scale, -448, 448)), sa = a_scale. Absent (dynamic): the tensor op one
///   scale for all of a, the channel op one per row of a, each max(amax,
///   1e-10) / 448 (quant_fp8_tensor's and quant_fp8_token's rules).
/// fp32 accumulation, each sum scaled once and rounded once to out's dtype.
/// CPU, and CUDA with a and out bf16 (a dynamic per-tensor scale then takes
/// the call's workspace: workspace_bytes).
/// (MoeGemmArgs' members, w_scale as above, then a_scale.)
struct MoeGemmFp8Args : MoeGemmArgs {
  TensorRef a_scale;
};
struct MoeGemmFp8TensorArgs : MoeGemmFp8Args {};
struct MoeGemmFp8ChannelArgs : MoeGemmFp8Args {};

/// Arguments of fused_moe_fp8_tensor and fused_moe_fp8_channel: fused_moe
/// (FusedMoeArgs) on fp8 weights with SGLang's per-tensor or per-channel
/// scales (its fused-MoE files' dtype=fp8_w8a8 without block_shape; with
/// per_channel_quant=True), each GEMM as moe_gemm_fp8's:
///   h = (w1[e] · q1(hidden[t])) * sa1 * sw1(e, :),  a = q2(act(h[0:I]) * h[I:2I]),
///   out[t] = routed_scaling_factor * sum_j topk_weights[t, j] * (w2[e] · a) * sa2 * sw2(e, :).
/// - hidden [M, H], out: bf16 or fp32 (one dtype); w1 [E, 2I, H], w2
///   [E, H, I]: fp8_e4m3fn; topk_weights, topk_ids, routed_scaling_factor,
///   activation: as FusedMoeArgs.
/// - w1_scale, w2_scale fp32: fused_moe_fp8_tensor [E] each (one per
///   expert); fused_moe_fp8_channel [E, 2I] and [E, H] (one per expert and
///   output channel; SGLang's [E, N, 1] viewed as [E, N]).
/// - a1_scale, a2_scale: [1] fp32 each, or both absent. Given (static):
///   q(v) = e4m3fn(clamp(v / scale, -448, 448)), sa = scale. Absent
///   (dynamic): the tensor op one scale for all of hidden and one for the
///   whole intermediate, the channel op one per token and one per (token,
///   choice), each max(amax, 1e-10) / 448, as SGLang's scaled_fp8_quant.
/// fp32 accumulation; with bf16 out, h and act(h[0:I]) * h[I:2I] rounded to
/// bf16 between the steps, as SGLang's intermediate_cache1 and _cache2 hold
/// them (the top-k sum is exact, then out rounded once; CUDA's composition
/// rounds each pair's down output to bf16 first, as SGLang's _cache3, within
/// the tolerance). CPU, and CUDA with hidden and out bf16 (the call's
/// workspace: workspace_bytes).
/// (FusedMoeArgs' members, w1_scale and w2_scale as above, then a1_scale
/// and a2_scale.)
struct FusedMoeFp8Args : FusedMoeArgs {
  TensorRef a1_scale;
  TensorRef a2_scale;
};
struct FusedMoeFp8TensorArgs : FusedMoeFp8Args {};
struct FusedMoeFp8ChannelArgs : FusedMoeFp8Args {};

/// D = A·B^T (+bias). Thread-safe. On the CPU the work is done on return;
/// on a GPU it is queued on `stream`.
/// Errors: invalid_argument (null data, rank, shapes that disagree, strides,
/// naming the argument), unsupported_problem (dtype combination),
/// unsupported_device (tensors on a device whose backend is not available,
/// or on different devices), backend_error.
KDISPATCH_API Status gemm(Runtime& rt, const GemmArgs& args, Stream stream = {}, const CallOptions& opts = {}) noexcept;

/// RMSNorm. Thread-safe. Errors as gemm, plus invalid_argument for eps <= 0.
KDISPATCH_API Status rmsnorm(Runtime& rt, const RmsNormArgs& args, Stream stream = {},
                             const CallOptions& opts = {}) noexcept;

/// Fused residual add + RMSNorm, in place on x and residual. Thread-safe for
/// distinct buffers. Errors as rmsnorm, plus invalid_argument when x and
/// residual overlap.
KDISPATCH_API Status fused_add_rmsnorm(Runtime& rt, const FusedAddRmsNormArgs& args, Stream stream = {},
                                       const CallOptions& opts = {}) noexcept;

/// SiLU(gate) * up. Thread-safe. On the CPU the work is done on return; on
/// a GPU it is queued on `stream`. Errors as gemm (invalid_argument naming
/// out or x: shapes, strides, overlap).
KDISPATCH_API Status silu_and_mul(Runtime& rt, const SiluAndMulArgs& args, Stream stream = {},
                                  const CallOptions& opts = {}) noexcept;

/// The fp8 GEMMs (GemmFp8Args): per-tensor, per-token x per-channel and
/// 128-block scales, fp32 or (fast_accum) fast accumulation. Thread-safe.
/// Errors as gemm; unsupported_problem when no variant of the tensors'
/// backend computes the formats (every backend computes fp8_e4m3fn inputs;
/// CPU: d fp32 or bf16).
KDISPATCH_API Status gemm_fp8_tensor(Runtime& rt, const GemmFp8TensorArgs& args, Stream stream = {},
                                     const CallOptions& opts = {}) noexcept;
KDISPATCH_API Status gemm_fp8_rowwise(Runtime& rt, const GemmFp8RowwiseArgs& args, Stream stream = {},
                                      const CallOptions& opts = {}) noexcept;
KDISPATCH_API Status gemm_fp8_block(Runtime& rt, const GemmFp8BlockArgs& args, Stream stream = {},
                                    const CallOptions& opts = {}) noexcept;

/// fp8 activation quantisation (QuantFp8Args): a dynamic per-tensor scale,
/// a scale per token, a scale per token and 128-wide K group (M-major).
/// Thread-safe. Errors as gemm.
KDISPATCH_API Status quant_fp8_tensor(Runtime& rt, const QuantFp8TensorArgs& args, Stream stream = {},
                                      const CallOptions& opts = {}) noexcept;
KDISPATCH_API Status quant_fp8_token(Runtime& rt, const QuantFp8TokenArgs& args, Stream stream = {},
                                     const CallOptions& opts = {}) noexcept;
KDISPATCH_API Status quant_fp8_group(Runtime& rt, const QuantFp8GroupArgs& args, Stream stream = {},
                                     const CallOptions& opts = {}) noexcept;

/// The experts of a Mixture-of-Experts layer (FusedMoeArgs). Thread-safe.
/// Errors as gemm, plus invalid_argument for w1_scale/w2_scale given with
/// non-fp8 weights or missing with fp8 ones, routed_scaling_factor <= 0,
/// an activation outside {0, 1}, and a strided expert batch (naming it).
KDISPATCH_API Status fused_moe(Runtime& rt, const FusedMoeArgs& args, Stream stream = {},
                               const CallOptions& opts = {}) noexcept;

/// The top-k reduction of a Mixture-of-Experts layer (MoeSumArgs).
/// Thread-safe. On the CPU the work is done on return; on a GPU it is
/// queued on `stream`. Errors as gemm (invalid_argument naming input or
/// out: rank, shapes, strides, overlap), plus invalid_argument for
/// routed_scaling_factor <= 0 and unsupported_problem for input and out of
/// different dtypes.
KDISPATCH_API Status moe_sum(Runtime& rt, const MoeSumArgs& args, Stream stream = {},
                             const CallOptions& opts = {}) noexcept;

/// A Mixture-of-Experts layer's pairs sorted by expert (MoeAlignArgs).
/// Thread-safe. On the CPU the work is done on return; on a GPU it is
/// queued on `stream`. Errors: invalid_argument naming the argument (a rank,
/// a buffer shorter than it must be, a non-contiguous one, num_experts or
/// block_size not a whole number in [1, 2^24], expert_map not
/// [num_experts]), unsupported_device, backend_error.
KDISPATCH_API Status moe_align(Runtime& rt, const MoeAlignArgs& args, Stream stream = {},
                               const CallOptions& opts = {}) noexcept;

/// One grouped GEMM of a Mixture-of-Experts layer over sorted pairs
/// (MoeGemmArgs). Thread-safe. On the CPU the work is done on return; on a
/// GPU it is queued on `stream`. Errors: invalid_argument naming the
/// argument (shapes, a buffer shorter than moe_align's, top_k or block_size
/// not a whole number in [1, 2^24], mul_routed_weight not 0 or 1, w_scale
/// present without fp8 weights or absent with them), unsupported_device,
/// backend_error.
KDISPATCH_API Status moe_gemm(Runtime& rt, const MoeGemmArgs& args, Stream stream = {},
                              const CallOptions& opts = {}) noexcept;

/// moe_gemm on fp8 weights with per-tensor or per-channel scales
/// (MoeGemmFp8Args). Thread-safe; errors as moe_gemm (invalid_argument
/// naming w_scale or a_scale when their shapes disagree; unsupported_problem
/// for dtypes no variant computes).
KDISPATCH_API Status moe_gemm_fp8_tensor(Runtime& rt, const MoeGemmFp8TensorArgs& args, Stream stream = {},
                                         const CallOptions& opts = {}) noexcept;
KDISPATCH_API Status moe_gemm_fp8_channel(Runtime& rt, const MoeGemmFp8ChannelArgs& args, Stream stream = {},
                                          const CallOptions& opts = {}) noexcept;

/// fused_moe on fp8 weights with per-tensor or per-channel scales
/// (FusedMoeFp8Args). Thread-safe; errors as fused_moe (invalid_argument
/// naming w1_scale, w2_scale, a1_scale or a2_scale when a shape disagrees
/// or one of a1_scale and a2_scale comes alone; unsupported_problem for
/// dtypes no variant computes).
KDISPATCH_API Status fused_moe_fp8_tensor(Runtime& rt, const FusedMoeFp8TensorArgs& args, Stream stream = {},
                                          const CallOptions& opts = {}) noexcept;
KDISPATCH_API Status fused_moe_fp8_channel(Runtime& rt, const FusedMoeFp8ChannelArgs& args, Stream stream = {},
                                           const CallOptions& opts = {}) noexcept;

/// An op as the bindings see it (one row of the library's op list): the
/// C ABI's kdispatch_<op>, the Python methods and the torch ops are
/// generated from these rows.
struct OpArgInfo {
  std::string_view name;  ///< "a", "x", "residual", ... (the args struct's member)
  bool read = true;       ///< the op reads it
  bool written = false;   ///< the op writes it (both: in place)
  int32_t rank = 2;       ///< 2: [rows, cols]; 1: [cols]; 3: [batch, rows, cols] (experts' weights [E, N, K])
  bool optional = false;  ///< may be absent (a TensorRef without data; NULL in C)
  /// rows and cols as "<mul>*<dim>/<div>" of the op's dims ("M", "K",
  /// "2*d", ...): how a binding sizes an output from its inputs. rows is
  /// "" for rank 1.
  std::string_view rows_dim, cols_dim;
  int32_t rows_mul = 1, cols_mul = 1, rows_div = 1, cols_div = 1;
  /// Rank 3 only: the batch extent, as rows and cols ("" otherwise). The
  /// batch is dense: batch stride = rows * row stride.
  std::string_view batch_dim;
  int32_t batch_mul = 1, batch_div = 1;
  /// A write argument that may be this argument itself (in place), or -1.
  int32_t alias_of = -1;
  /// Its dtype rule: "in" (the op's input dtype: a, x, ...), "out" (the
  /// output dtype: d, y, a bias like d) or a fixed dtype ("fp32": scales).
  std::string_view dtype = "in";
  /// Rank 2, read only: also taken column-major (unit row stride, column
  /// stride >= rows: a transposed view), e.g. gemm_fp8_block's scale_a
  /// K-major; the call converts it (see that op).
  bool col_major_ok = false;
  /// Rank 1: cols is a formula of the dims no binding evaluates (cols_dim
  /// holds its text, moe_align's "M*top_k + min(E, M*top_k)*(block_size -
  /// 1)"); the caller allocates such an argument.
  bool cols_computed = false;
  /// Rank 1: the argument may be longer than cols; the op uses the first cols.
  bool at_least = false;
};
struct OpScalarInfo {
  std::string_view name;  ///< "eps", "fast_accum"
  float default_value = 0.f;
  /// "float" (eps), or "bool": a switch, 0 or 1 where scalars travel as
  /// floats (call_op, the C ABI), a bool member of the args struct; a
  /// caller's scalar list may leave out the trailing switches (off). The
  /// C ABI's kdispatch_<op> takes no parameter for a switch: its flags do
  /// (KDISPATCH_CALL_FAST_ACCUM for fast_accum); or "int": a size
  /// (moe_align's num_experts, block_size), a whole number in [1, 2^24], an
  /// int32 member of the args struct; or "choice": the index of one of
  /// `labels`, an int32 member. By name (call_op, the C ABI) an "int" or
  /// "choice" scalar that is not a whole number in [-2^24, 2^24] (a
  /// fraction, NaN, an infinity) is refused naming it and the value.
  std::string_view kind = "float";
  /// "choice" only: the names of its values, by index (an activation kind:
  /// "silu", "gelu"); the args struct's member is the int32 index.
  std::span<const std::string_view> labels;
  /// "int" only: the dim it sets, as the args' extents name it ("E",
  /// "block_size").
  std::string_view dim;
};
/// A static key field of an op (the fields of its config file names).
struct OpKeyFieldInfo {
  std::string_view name;  ///< "N", "K", "hidden", "dtype", "bias", "out_dtype", "stride", "accum", ...
  /// "dim" (a positive integer, required), "dtype" (required), "out_dtype"
  /// (left out when it equals dtype), "flag" (true/false, left out when
  /// false), "stride" (operand stride classes, left out for the default
  /// layout), "accum" ("fast", from the op's fast_accum switch; left out
  /// for the default "precise").
  std::string_view kind;
  std::string_view csv_name;  ///< its column in a shape CSV (aiter's "outdtype"): name when empty
  /// >= 0: its place before device_name in a file name (SGLang's
  /// N=...,K=...,device_name=...); -1: after it, by name.
  int32_t file_pos = -1;
  /// A flag's value in key text when set: "true", or its own text
  /// (fused_moe's block_shape: "[128,128]"). Empty for other kinds.
  std::string_view flag_text;
};
/// Most tensor arguments an op of op_list() has (the fp8_w8a8 fused_moe
/// ops: 10); its scalars number at most kMaxOpScalars. A binding that
/// holds an op's tensors or scalars in fixed arrays sizes them by these.
inline constexpr int kMaxOpArgs = 12;
inline constexpr int kMaxOpScalars = 4;
struct OpInfo {
  std::string_view name;  ///< "gemm", "rmsnorm", ...
  std::string_view doc;   ///< one line: what it computes
  std::span<const OpArgInfo> args;
  std::span<const OpScalarInfo> scalars;
  bool uses_workspace = false;  ///< takes CallOptions::workspace (GPU split-K)
  /// Key fields in key order (byte order of names); the batch dim (M,
  /// tokens) is not one of them: its name is m_name.
  std::span<const OpKeyFieldInfo> key_fields;
  std::string_view m_name;  ///< "M", "tokens"
  /// The input dtypes some variant of this build computes, on any backend
  /// ("fp32", "bf16", "fp16", "fp8_e4m3fn"), in DType order.
  std::span<const std::string_view> in_dtypes;
  /// The dtype of the "out" arguments a binding allocates when the caller
  /// names none: "" (the input dtype), "bf16" (the fp8 GEMMs),
  /// "fp8_e4m3fn" (the quantisation ops).
  std::string_view default_out_dtype;
};
/// Every op of this build, in a fixed order. Thread-safe; static storage.
KDISPATCH_API std::span<const OpInfo> op_list() noexcept;

/// Any op by name, with its tensors in argument order (an absent optional
/// argument is a TensorRef without data) and its scalars in order (a switch
/// as 0 or 1; trailing switches may be left out: off): the same call as the
/// op's own function (for bindings).
/// Errors: invalid_argument (unknown op, wrong number of tensors or
/// scalars, a switch other than 0 or 1, naming it), then as the op.
KDISPATCH_API Status call_op(Runtime& rt, std::string_view op, std::span<const TensorRef> tensors,
                             std::span<const float> scalars, Stream stream = {}, const CallOptions& opts = {}) noexcept;

/// A problem given by its key: an op, the file name's fields other than
/// device_name ("N=4096,K=4096,dtype=bf16", "hidden=4096,dtype=bf16",
/// fields in any order) and M.
struct KeyProblem {
  /// The fields, canonical, in file-name order (SGLang's: the dims first):
  /// "N=4096,K=4096,dtype=bf16"; the key a lookup takes.
  std::string key_fields;
  double flops = 0.0;  ///< arithmetic of one call at M (a multiply-add counts 2)
  int64_t bytes = 0;   ///< bytes one call reads and writes at M (contiguous operands)
};
/// Parses and checks a key of op `op` at batch size m (>= 1). Thread-safe.
/// Errors: invalid_argument (unknown op or field, a missing or bad value,
/// naming it).
KDISPATCH_API Result<KeyProblem> describe_key(std::string_view op, std::string_view key_fields, int64_t m) noexcept;

/// The workspace, in bytes, a call of `op` with this key at any batch up to
/// `max_m` may ask of CallOptions::workspace on `backend`: the most that any
/// of the backend's variants for the key's input dtype asks at max_m (their
/// parameters' defaults). For an engine that captures a graph per batch
/// size and gives every call one buffer sized for the largest (fused_moe's
/// GPU variants: from M * top_k * I * 4 bytes for the per-pair kernels to
/// the tensor-core ones' sorted pairs, intermediate and per-pair outputs).
/// 0 where no variant takes one (the host; ops that use Runtime::
/// attach_stream's). Thread-safe. Errors: as describe_key().
KDISPATCH_API Result<int64_t> workspace_bytes(std::string_view op, std::string_view key_fields, int64_t max_m,
                                              DeviceType backend) noexcept;

/// The workspace, in bytes, that this call (`op`'s tensors and scalars as
/// call_op takes them; tensor data may be null) may ask of
/// CallOptions::workspace: the most that any variant of the tensors'
/// backend for their dtype asks for this problem, so any plan a table,
/// tuner or default serves fits. For a binding that allocates each call's
/// workspace from its framework's allocator (the torch ops: fused_moe from
/// torch's caching allocator, so a graph capture keeps it in the graph's
/// pool). 0 where no variant takes one, and for the GEMMs (gemm, the fp8
/// GEMMs), whose cuBLASLt and split-K plans size their own use of the
/// stream's workspace (Runtime::attach_stream) or of CallOptions::workspace
/// and fall back to the default plan when it is short. Saturates at
/// INT64_MAX. Thread-safe, no runtime needed.
/// Errors: as call_op's validation (unknown op, counts, shapes, dtypes,
/// naming the argument).
KDISPATCH_API Result<int64_t> workspace_bytes(std::string_view op, std::span<const TensorRef> tensors,
                                              std::span<const float> scalars = {}) noexcept;

/// A config query: which tuned config serves this kernel at this M?
/// Serves kdispatch's own ops and kernels the engine owns (its Triton
/// fused-MoE kernel, its block-fp8 GEMM) from the same table, so an engine
/// can use kdispatch purely as its config service.
struct LookupQuery {
  /// "triton_fused_moe" (SGLang/vLLM fused-MoE tables, keyed E=,N=,...),
  /// "triton_gemm" (SGLang's dense w8a8/block-fp8 GEMM tables, N=,K=,...),
  /// or an own op (core/op_list.hpp: "gemm", "rmsnorm", ...). Empty: inferred
  /// (the one op the table holds, else "triton_fused_moe" for a key with E=,
  /// else "triton_gemm" for N= and K=). Deprecated: "fused_moe" with a key
  /// holding E= (the fused-MoE tables' name until 2026-12) answers as
  /// "triton_fused_moe" and says so in `why`.
  std::string op;
  /// The file name's fields other than device_name, in any order, e.g.
  /// "E=257,N=256,dtype=fp8_w8a8,block_shape=[128,128]" (block_shape with or
  /// without the space after the comma).
  std::string key;
  /// The device name as the runtime reports it ("NVIDIA H200") or as a file
  /// spells it ("NVIDIA_H200"). Empty: the host CPU's ISA class.
  std::string device;
  /// Optional hardware identity for the resolver (see resolve_device_name).
  std::string arch;
  int32_t compute_units = 0;
  int64_t memory_bytes = 0;
  /// Own ops only: "cpu", "cuda" or "hip"; empty = inferred from the device.
  std::string backend;
  /// The dynamic dimension: batch size / tokens (>= 1).
  int64_t M = 1;
  /// Select the `_down` table; falls back to the up table when the key has
  /// no `_down` table, as SGLang does.
  bool down = false;
};

/// Answer of lookup().
struct LookupResult {
  enum class Match : uint8_t {
    exact,     ///< the table has a row at exactly M
    nearest,   ///< the nearest M key served (ties to the smaller key)
    fallback,  ///< no table row: the op's default config
    forced,    ///< a forced variant (RuntimeOptions::force / KDISPATCH_FORCE)
  };
  Config config;
  /// File the row came from, relative to its config dir, or "default".
  std::string source;
  /// The config dir of `source` ("" for a default).
  std::string source_dir;
  Match match = Match::fallback;
  /// The table key that served, or -1 for a default.
  int64_t table_m = -1;
  /// Own ops: the variant name of the row.
  std::string variant;
  /// The canonical static key that was looked up (byte-identical to the key
  /// an op call builds for the same problem).
  std::string key;
  /// Why this config: device-name resolution, version folder, match, source.
  std::string why;
  /// A note on the row that serves, or "": a row demoted on this machine
  /// (the floor serves its M), or a CPU row tuned on another CPU vendor or
  /// family ("tuned on AuthenticAMD family 25; not yet verified here").
  std::string note;
  /// A default shaped by an engine's row (an own op without a row of its
  /// own key; DispatchInfo::k_source): that row's table key, M, config and
  /// file, and what the row does not know ("sglang file without K");
  /// engine_key empty otherwise. `config` is then the plan served.
  std::string engine_key;
  int64_t engine_m = -1;
  Config engine_config;
  std::string engine_source;
  std::string k_source;
};
/// "exact" | "nearest" | "default" | "forced".
KDISPATCH_API const char* match_name(LookupResult::Match m) noexcept;

/// Looks up a config. Thread-safe; allocates (not meant for a per-token hot
/// path of an op; the ops themselves do not allocate).
/// Errors: invalid_argument (malformed key, M < 1, unknown op, naming it),
/// not_found (an engine-owned op with no table row and no default rule).
KDISPATCH_API Result<LookupResult> lookup(const Runtime& rt, const LookupQuery& query) noexcept;

/// The whole table that serves a key (lookup_table()).
struct LookupTable {
  std::string key;  ///< the canonical key of the table that serves
  struct Row {
    int64_t m = 0;
    Config config;           ///< as written in its file (no defaults filled in)
    std::string source;      ///< the file, relative to its config dir
    std::string source_dir;  ///< the config dir
  };
  std::vector<Row> rows;  ///< ascending M
};

/// The whole table a lookup of `query` lands on (what SGLang's
/// get_moe_configs returns from one file; here merged across config dirs by
/// precedence): the same device resolution and _down -> up fallback as
/// lookup(); query.M is ignored. Thread-safe; allocates.
/// Errors: as lookup(), plus not_found when no table serves the key (a
/// lookup would answer with the default) or a forced plan serves it.
KDISPATCH_API Result<LookupTable> lookup_table(const Runtime& rt, const LookupQuery& query) noexcept;

/// What pretune() found.
struct PretuneResult {
  /// The canonical static key, byte-identical to the key an op call with
  /// the same arguments builds (DispatchInfo::key).
  std::string key;
  int64_t m = 0;  ///< the M tuned (the problem's M)
  Config config;  ///< the winner: {"variant": ..., params...}
  std::string variant;
  double best_us = 0.0;     ///< the winner's median, µs
  double default_us = 0.0;  ///< get_default's plan's median, µs
  int32_t candidates = 0;   ///< configs benchmarked
  int32_t rejected = 0;     ///< failed validation against the reference
  int32_t failed = 0;       ///< failed to launch
  bool persisted = false;   ///< written to the tuning cache
  /// How the row was chosen, as its metadata records it
  /// (docs/config-files.md, "What a tuned row records"): the margin it was
  /// held to, the floor's A/A spread over the confirmation's placements (0:
  /// not confirmed: nothing beat the floor in the search), how the
  /// confirmation timed ("cold" | "cold+graph") and why the row holds its
  /// plan ("beat floor by 7.3% (margin 2%)", "floor kept: ...").
  double margin = 0.0;
  double aa_spread = 0.0;
  std::string timing;
  std::string why;
};

/// Tunes a problem ahead of traffic, on scratch buffers of the same shape,
/// strides and dtypes (the args' data pointers are not read or written and
/// may be null), then persists and publishes the winner: the next call with
/// the same arguments is a table hit. Works in every tuning mode (not when
/// frozen). Thread-safe; blocks for the search (up to the time budget).
/// Errors: the op call's, word for word, for what it refuses (arguments, device, dtypes; before any scratch or row),
/// failed_precondition when frozen, out_of_memory over the scratch budget, no_variant when nothing runs.
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const GemmArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const RmsNormArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const FusedAddRmsNormArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const SiluAndMulArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const GemmFp8TensorArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const GemmFp8RowwiseArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const GemmFp8BlockArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const QuantFp8TensorArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const QuantFp8TokenArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const QuantFp8GroupArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const FusedMoeArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const MoeSumArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const MoeAlignArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const MoeGemmArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const MoeGemmFp8TensorArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const MoeGemmFp8ChannelArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const FusedMoeFp8TensorArgs& args) noexcept;
KDISPATCH_API Result<PretuneResult> pretune(Runtime& rt, const FusedMoeFp8ChannelArgs& args) noexcept;
/// pretune() of the problem a key describes (see describe_key) at batch
/// size m on `device`: scratch operands with contiguous rows (or the
/// layout of the key's stride field), default scalars (eps). What
/// `kdispatch tune` runs for each row of a shape list.
KDISPATCH_API Result<PretuneResult> pretune_key(Runtime& rt, std::string_view op, std::string_view key_fields,
                                                int64_t m, Device device = {}) noexcept;

/// One config's time by time_configs().
struct ConfigTiming {
  /// ok, or why the config was not timed: config_error (not a plan of this
  /// build: an unknown variant, a param outside its space),
  /// unsupported_problem (its variant computes another dtype, or its
  /// supports() declines the problem on this device), or the search's
  /// error (a launch failure, an output that differs from the reference's).
  Status status;
  double us = 0.0;               ///< the mean of the rounds' medians, µs (ok only)
  std::vector<double> round_us;  ///< each round's median, µs, in round order
};
/// What time_configs() measured.
struct ConfigTimings {
  std::string key;          ///< the canonical static key (as PretuneResult::key)
  std::string device_name;  ///< the device timed on, as config file names spell it
  /// This build's tuning fingerprint on that backend (what a table tuned
  /// here records): a JSON object, "" when the backend has none.
  std::string fingerprint;
  std::vector<ConfigTiming> configs;  ///< one per config, in the order given
  /// The floor (what the engine runs without kdispatch: cuBLAS / cuBLASLt
  /// as torch calls them on CUDA, get_default's plan elsewhere), timed in
  /// the same rounds after the given configs; floor_config is its row.
  /// floor.status is not ok (and floor_config empty) when the op has no
  /// floor here or it declines the key; a floor equal to a given config is
  /// that config's timing again.
  ConfigTiming floor;
  Config floor_config;
  /// The given config that is the floor's plan (its timing is `floor`), or
  /// -1 when none is.
  int32_t floor_index = -1;
};
/// Times given configs of the problem a key describes at batch size m on
/// `device`: the scratch operands pretune_key() searches on, the tuner's
/// method and options (validation against the reference variant's output,
/// then the harness with RuntimeOptions::tune's reps and cold cache), one
/// config at a time, no confirmation; `rounds` rounds, the configs (and
/// the floor, last) in the given order on even rounds and reversed on odd
/// ones. Persists and
/// publishes nothing (runs when frozen too): `kdispatch merge --retime`.
/// Thread-safe; blocks. Errors: as pretune_key() for the op, key, M, device
/// and scratch budget; invalid_argument for rounds outside [1, 16]. A config
/// that cannot be timed is reported in its ConfigTiming, not as an error.
KDISPATCH_API Result<ConfigTimings> time_configs(Runtime& rt, std::string_view op, std::string_view key_fields,
                                                 int64_t m, std::span<const Config> configs, Device device = {},
                                                 int32_t rounds = 2) noexcept;
/// One committed row timed against the floor by verify_rows().
struct RowVerification {
  std::string op;   ///< "gemm", "rmsnorm", ...
  std::string key;  ///< the canonical static key
  int64_t m = 0;    ///< the row's M
  Config config;    ///< the row as written
  std::string variant;
  std::string source;      ///< its file, relative to its config dir
  std::string source_dir;  ///< the config dir (the shipped configs' dir included)
  /// ok, or why no verdict could be reached (the floor failing here, the
  /// scratch over the memory budget, a verdict file that cannot be written);
  /// a row that fails to launch or validate here is a loss, not an error.
  Status status;
  double row_us = 0.0;    ///< the row's mean time over the confirmation's placements, µs
  double floor_us = 0.0;  ///< the floor's, µs
  /// The row against the floor: 1 - mean(row / floor) over the placements,
  /// in the worse of the timing modes (0.073: the row is 7.3% faster;
  /// negative: slower).
  double margin = 0.0;
  double required_margin = 0.0;      ///< the margin a row must win by (TuneOptions::margin)
  double aa_spread = 0.0;            ///< the floor's own spread over the placements
  std::vector<double> ratios;        ///< row / floor per placement, cold
  std::vector<double> graph_ratios;  ///< row / floor per placement in a CUDA graph ("cold+graph"); else empty
  std::string timing;                ///< "cold" | "cold+graph": how the confirmation timed
  std::string outcome;               ///< this verification: "ahead" | "within margin" | "lost"
  /// The verdict after it: "ahead" | "within margin" | "lost once" |
  /// "demoted" (lost by more than the margin in 2 verifications since the
  /// last win: the floor serves the row's M).
  std::string verdict;
  int32_t losses = 0;       ///< losses since the last win
  std::string tuned_on;     ///< CPU rows: "AuthenticAMD family 25" as the file records it; "" not recorded
  bool foreign = false;     ///< a CPU row of another vendor or family than this host's (or not recorded)
  std::string recorded_in;  ///< the verdict file ("" when kept in memory: no cache dir)
};
/// What verify_rows() did.
struct VerifyReport {
  std::vector<RowVerification> rows;  ///< in the order verified (rows tuned on another CPU first)
  int64_t floor_rows = 0;             ///< committed rows whose plan is the floor itself: nothing to verify
  int64_t demoted = 0;                ///< rows demoted now (the table was republished)
};
/// Verifies the committed rows of this machine's devices (the runtime's
/// config dirs and shipped configs, not its tuning cache) that serve, of
/// op `op` ("" = every op): each row's plan timed against the floor on
/// scratch operands with the tuner's confirmation (validation against the
/// reference, then kConfirmPlacements placements, two rounds each in both
/// orders), judged at RuntimeOptions::tune.margin, and the verdict recorded
/// in the tuning cache dir's verdict cache (.verify/, keyed by this build's
/// fingerprint and, on the CPU, the CPU's vendor, family and model). A row
/// that lost by more than the margin in two verifications is demoted: the
/// table is republished with the floor serving its M; a win resets the
/// count. `on_row` (optional) sees each row as it is done. Thread-safe;
/// blocks (about 16 timings of each row and the floor per row). Works
/// when frozen (the demotion is then applied at the next reload). Errors:
/// invalid_argument for an unknown op; failed_precondition in a forked child.
/// (`kdispatch verify`; RuntimeOptions::tune.verify_shipped does it in the
/// background.)
KDISPATCH_API Result<VerifyReport> verify_rows(Runtime& rt, std::string_view op = {},
                                               const std::function<void(const RowVerification&)>& on_row = {}) noexcept;

/// pretune() of any op by name, its tensors and scalars as call_op takes them.
KDISPATCH_API Result<PretuneResult> pretune_op(Runtime& rt, std::string_view op, std::span<const TensorRef> tensors,
                                               std::span<const float> scalars) noexcept;

/// The result as one JSON object: {"config": {...}, "source": ...,
/// "match": ..., "M": <table key or null>, "variant": ..., "key": ..., "why": ...}
/// (the CLI's `lookup --json` format). Thread-safe. Not noexcept: allocates
/// the text, and throws std::bad_alloc (only) when memory runs out.
KDISPATCH_API std::string lookup_result_to_json(const LookupResult& r);

}  // namespace dispatch
