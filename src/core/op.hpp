// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — ops, problems, launch arguments, variants and plans.
//
// Description / configuration / arguments, as CUTLASS's library separates
// them: the static key (what is computed) selects a Plan (variant + typed
// params, resolved when the table is built); the tensors and the stream are
// the per-call LaunchArgs. The hot path only builds LaunchArgs and calls
// plan.variant->launch.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype_table.hpp"
#include "core/op_list.hpp"
#include "dispatch/device.hpp"
#include "dispatch/status.hpp"
#include "dispatch/types.hpp"

namespace dispatch::core {

/// Bytes per element of `t` (dispatch::dtype_size, inline for the hot path):
/// its row of the dtype table; 0 for a value no enumerator has.
constexpr std::size_t dtype_bytes(DType t) noexcept {
  // Index, not find_dtype's pointer: GCC's -fsanitize=undefined makes a
  // pointer's null check non-constant (the asan preset's static_asserts).
  const auto i = static_cast<size_t>(t);
  return i < std::size(kDTypes) ? kDTypes[i].bytes : 0;
}

/// The ops, in the order of core/op_list.hpp.
enum class OpKind : uint8_t {
#define KD_OPKIND_ENUM(name, args, tensors, scalars) name,
  KDISPATCH_OP_LIST(KD_OPKIND_ENUM)
#undef KD_OPKIND_ENUM
};
#define KD_OPKIND_COUNT(name, args, tensors, scalars) +1
inline constexpr int kOpCount = 0 KDISPATCH_OP_LIST(KD_OPKIND_COUNT);
#undef KD_OPKIND_COUNT

/// The op's name as core/op_list.hpp spells it ("gemm", "rmsnorm", ...).
std::string_view op_name(OpKind op) noexcept;
std::optional<OpKind> parse_op(std::string_view name) noexcept;

/// How an op accumulates (the fp8 GEMMs' `accum` key field, set by their
/// fast_accum switch): precise, fp32 (the default, left out of keys and file
/// names); fast, a variant may accumulate at lower precision where its
/// library offers it (cuBLASLt's FAST_ACCUM: fp8 tensor-core sums kept at
/// ~fp22 on Hopper). A variant that always accumulates in fp32 serves both.
enum class Accum : uint8_t { precise = 0, fast = 1 };

/// Static + dynamic description of one call. Which member means what is
/// the op's spec (src/ops/<op>.hpp): gemm m = M, n = N, k = K; norms m =
/// tokens, n = hidden. Members an op does
/// not use stay 0.
struct Problem {
  OpKind op = OpKind::gemm;
  Device device{};
  DType in_dtype = DType::fp32;   ///< the spec's in_dtype_slot's dtype (A and B, x, ...)
  DType out_dtype = DType::fp32;  ///< the spec's out_dtype_slot's dtype (D, y, ...)
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  /// Further static dims an op's spec may name (Dim::extra0/1/2: a fused
  /// MoE's experts and top-k, moe_gemm's block size); 0 otherwise.
  int64_t extra[3] = {0, 0, 0};
  /// An optional argument slot is present (gemm's bias).
  bool has_bias = false;
  /// Stride classes of every operand (the spec's order), 4 bits each:
  /// see stride_class() below and table::pack_stride_code. 0 = the default
  /// (row-major, contiguous rows) layout of every operand.
  uint64_t stride_code = 0;
  /// The smallest alignment (bytes, a power of two, at most 16) of the
  /// operands' base pointers and row strides at this call; 16 for a problem
  /// described without data (a config row, a tuning key). Not part of the
  /// key: a table row is checked against it only when it is below 16 (the
  /// vector kernels then decline and the call falls back to get_default).
  uint8_t align_bytes = 16;
  /// The accumulation the caller asked for (a key field of the ops whose
  /// spec has an Accum switch scalar; precise for every other op).
  Accum accum = Accum::precise;
  /// The value of the op's choice scalar (core::ScalarKind::choice: an
  /// activation kind), the index of its label; 0 for an op without one.
  /// Part of the key (FieldKind::choice).
  uint8_t choice = 0;
};

/// Bit 63 of Problem::stride_code: some operand is not in its default layout.
inline constexpr uint64_t kStrideNonDefault = uint64_t{1} << 63;
/// The stride class of dim `dim` of operand `operand` (its place in the
/// spec's order) of `p`: dim 0 is the rows of a rank-2 operand (the rows
/// of each matrix of a rank-3 one, whose batch is dense) or the only dim of
/// a rank-1 one, dim 1 the columns. `rank` is the operand's rank in its
/// spec. The default layout's classes for a code of 0.
constexpr StrideClass stride_class(uint64_t code, int operand, int dim, int rank) noexcept {
  if ((code & kStrideNonDefault) == 0) return rank >= 2 && dim == 0 ? StrideClass::other : StrideClass::unit;
  return static_cast<StrideClass>((code >> (4 * operand + 2 * dim)) & 3u);
}

/// Most argument slots / float scalars an op has (core/op_spec.hpp).
inline constexpr int kMaxArgs = 12;
inline constexpr int kMaxScalars = 4;

/// Per-call arguments, by the op's argument slot (its spec's slot order:
/// gemm a, b, d, bias; rmsnorm y, x, w; ...): raw pointers and row strides
/// in elements. A rank-1 slot has ld 0, but one that may be longer than
/// the op's size (DimExpr::at_least: moe_align's outputs, moe_gemm's
/// sorted ids) its length as given; an absent optional slot (no bias) a
/// null pointer. Scalars in the spec's order (eps).
struct LaunchArgs {
  void* data[kMaxArgs];
  int64_t ld[kMaxArgs];
  float scalar[kMaxScalars];

  /// All zero (no data, ld 0, scalars 0).
  LaunchArgs() noexcept : data{}, ld{}, scalar{} {}
  /// Slots and scalars left unset for a writer that sets every one (the op
  /// entry points' validation): on the hit path the 168-byte zeroing cost
  /// more than the rest of the launch bookkeeping (a `rep stos`).
  struct Unset {};
  explicit LaunchArgs(Unset) noexcept {}

  void* stream = nullptr;
  /// Scratch device memory for the call (gemm: cuBLASLt's split-K
  /// workspace, the tiled family's split-K partials), stream-ordered on
  /// `stream`; null/0 when the call has none. A plan that needs more than
  /// `workspace_bytes` declines at launch (kNeedsFallbackCode) and the call
  /// falls back to get_default, which never needs a workspace.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;

  /// Slot `i`'s data as T.
  template <class T = void>
  T* ptr(int i) const noexcept {
    return static_cast<T*>(data[i]);
  }
};

/// How a config parameter's value is written in a file.
enum class ParamKind : uint8_t {
  integer,      ///< JSON number
  boolean,      ///< JSON true/false (stored 0/1)
  enumeration,  ///< JSON string, one of `labels` (stored as the label's index)
};

/// One knob of a variant's config space.
struct ParamDef {
  std::string_view name;  ///< e.g. "BLOCK_SIZE_M", "num_warps"
  ParamKind kind = ParamKind::integer;
  std::span<const int64_t> values;           ///< the space: allowed stored values
  std::span<const std::string_view> labels;  ///< enumeration labels (index = stored value)
  int64_t default_value = 0;                 ///< used when a row leaves the param out
};

inline constexpr int kMaxParams = 12;

/// The name of argument `slot` of `op` ("a", "residual", ...), "" past the
/// end (the op's spec, core/op_spec.hpp).
std::string_view arg_name(OpKind op, int slot) noexcept;
/// Number of argument slots of `op`.
int arg_count(OpKind op) noexcept;

enum VariantFlags : uint32_t {
  kVariantReference = 1u << 0,         ///< the op's reference implementation (validation baseline)
  kVariantNondeterministic = 1u << 1,  ///< results depend on scheduling (atomics, split-K races)
  /// A dynamic family (cuBLASLt): its candidates are discovered per problem
  /// by enumerate(), not by a cartesian product of `values`; a row's params
  /// are any integers (every param must be present), and supports() is the
  /// whole check (the library's own algorithm check).
  kVariantDynamicSpace = 1u << 2,
};

/// The code a variant's launch returns when this call cannot run its plan
/// although the key accepted it (a workspace too small, a pointer less
/// aligned than the plan needs, a cuBLASLt algorithm the library refuses for
/// this M): the op then runs get_default's plan instead, inside the same
/// call (api/ops.cpp). Internal: never returned by a public function (when
/// nothing can run the call it becomes unsupported_problem).
inline constexpr StatusCode kNeedsFallbackCode = static_cast<StatusCode>(64);
/// The message prefix of such a Status.
inline constexpr std::string_view kNeedsFallback = "needs fallback: ";
/// A kNeedsFallbackCode Status: "needs fallback: <why>". Inline (a CPU
/// plugin calls no library function).
inline Status needs_fallback(std::string_view why) noexcept {
  try {
    return Status(kNeedsFallbackCode, std::string(kNeedsFallback) + std::string(why));
  } catch (...) {
    return Status(kNeedsFallbackCode, std::string());
  }
}

struct Plan;

/// A precompiled kernel family with a config space. One list per op and
/// backend names every variant (kernels/<backend>/<op>_list); registration,
/// the correctness tests and the benchmarks all iterate that list.
struct VariantDef {
  /// Stable id used in config files: "<what>__<how>", e.g.
  /// "gemm_fp32__blocked", "rmsnorm_bf16__vec8_warp_per_row".
  std::string_view name;
  OpKind op = OpKind::gemm;
  DeviceType backend{};  ///< the backend that runs it (cpu, cuda, hip)
  /// Input dtype this variant computes (A/B or x/w).
  DType in_dtype = DType::fp32;
  /// Knobs, in the order launch() reads them from Plan::params.
  std::span<const ParamDef> params;
  uint32_t flags = 0;
  /// Schema version of this variant's config space; bumped when a knob's
  /// meaning changes so stale committed rows are rejected at load.
  int32_t schema_version = 1;
  /// Accepts the problem with these params, or declines with a reason
  /// (invalid_argument/unsupported_problem). Must not depend on m beyond
  /// m >= 1: a row tuned at one M serves every M through nearest-M.
  Status (*supports)(const Problem& p, const int64_t* params, const DeviceInfo& dev) = nullptr;
  /// Runs (CPU) or enqueues (GPU) the op. Must handle any m >= 1.
  Status (*launch)(const LaunchArgs& args, const Problem& p, const int64_t* params) = nullptr;
  /// Argument roles, as Triton's autotuner has them but enforced (bit =
  /// argument slot, see kGemmArgA...). Only the variants that need them pay:
  /// - restore_args ("restore_value"): arguments the variant modifies in place
  ///   and also reads; the tuner snapshots them before a search and restores
  ///   them before every rep and after the search, so the caller's real call
  ///   sees its own data exactly once.
  /// - reset_args ("reset_to_zero"): arguments the variant accumulates into
  ///   (an atomic split-K writes D with +=); zeroed before every rep AND
  ///   before every real launch, so a call gives the same result whether or
  ///   not it tuned.
  /// One argument may not carry both roles: validate_variant refuses it,
  /// naming the argument.
  uint32_t restore_args = 0;
  uint32_t reset_args = 0;
  /// Optional perf model: estimated µs for (problem, params); the search
  /// keeps the top-k points by estimate when the space is large.
  double (*estimate_us)(const Problem& p, const int64_t* params, const DeviceInfo& dev) = nullptr;
  /// Dynamic families only (kVariantDynamicSpace): writes up to `cap`
  /// candidate param sets for `p` into out[i * kMaxParams ...] and returns
  /// how many (cuBLASLt: its heuristic's top results). Called by the tuner
  /// and config_space(), never on a call's hit path.
  int (*enumerate)(const Problem& p, const DeviceInfo& dev, int64_t* out, int cap) = nullptr;
  /// Scratch device memory (bytes) a launch of (problem, params) needs in
  /// LaunchArgs::workspace, or null for none beyond what the op's spec
  /// says (OpSpec::uses_workspace). Depends on p.m: the caller sizes a
  /// buffer for its largest M; a call whose workspace is smaller falls back
  /// (kNeedsFallbackCode). (The tuner still gives every candidate its fixed
  /// 32 MiB GPU workspace: sizing it from here is issue 35's tuning step.)
  int64_t (*workspace_bytes)(const Problem& p, const int64_t* params) = nullptr;
};

/// A failed Status "<variant>: <why>": what a variant's supports() returns
/// when it declines a problem (oneDNN-style: every decline names the variant
/// and says why). Without memory for the message, just `why`. Inline: the
/// CPU, CUDA and HIP variant lists all build their declines with it.
inline Status decline(const VariantDef& v, StatusCode code, std::string_view why) noexcept {
  std::string msg;
  try {
    msg.reserve(v.name.size() + 2 + why.size());
    msg.append(v.name).append(": ").append(why);
  } catch (...) {
    return make_status(code, why);
  }
  return make_status(code, msg);
}

/// The names every variant list (kernels/cpu, kernels/cuda, kernels/hip,
/// kernels/gpu/*_variants.inc) spells unqualified, brought in at once by
/// `using namespace core::variant_names;` in the list's namespace.
namespace variant_names {
using core::decline;
using core::LaunchArgs;
using core::OpKind;
using core::ParamDef;
using core::ParamKind;
using core::Plan;
using core::Problem;
using core::VariantDef;
}  // namespace variant_names

/// Checks a variant's declaration: a name, launch and supports functions,
/// at most kMaxParams params each with a non-empty space holding its
/// default, enumeration labels for enum params, and no argument declared
/// both restore_value and reset_to_zero. Errors: invalid_argument naming
/// the variant and the argument or param.
Status validate_variant(const VariantDef& v, int arg_slots, std::string_view (*arg_names)(int)) noexcept;

/// A variant plus its resolved params: what the table stores per row.
struct Plan {
  const VariantDef* variant = nullptr;
  int64_t params[kMaxParams] = {};
  bool valid() const noexcept { return variant != nullptr; }
  /// The same variant with the same knobs (every slot of params).
  friend bool operator==(const Plan& a, const Plan& b) noexcept {
    if (a.variant != b.variant) return false;
    for (int i = 0; i < kMaxParams; ++i)
      if (a.params[i] != b.params[i]) return false;
    return true;
  }
};

}  // namespace dispatch::core
