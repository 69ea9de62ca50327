// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the description of an op, once (XNNPACK keeps one
// list per microkernel family; we keep one spec per op, src/ops/<op>.hpp).
//
// An OpSpec says everything the generic layers need to know about an op:
//   - its argument slots: name, role (read / write / read-write in place),
//     rank, shape as expressions of the Problem's dims (so a [M, ceil(K/128)]
//     scale tensor or an int32 top-k id tensor is a row, not a new field),
//     dtype rule, whether it may be absent, what it may alias;
//   - its float scalars (eps) with their defaults and rules;
//   - its static key fields: name, the Problem member, the default that
//     keeps it out of a file name, its place in the file name — one table
//     that both writes and parses keys and file names;
//   - the checks with their messages, the slots that enter the alignment,
//     whether it takes a workspace;
//   - its float64 reference and its validation tolerance per dtype.
// Validation, the key, the file-name grammar, the tuner's buffers and
// checks, the miss export and every binding iterate the spec; none of them
// names an op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/op.hpp"
#include "dispatch/types.hpp"

namespace dispatch::core {

/// A dimension of the Problem a shape or a key field refers to.
enum class Dim : uint8_t { none = 0, m, n, k, extra0, extra1, extra2 };
inline constexpr int kDimCount = 7;

/// The value of `d` in `p` (Dim::none: 1).
constexpr int64_t dim_value(const Problem& p, Dim d) noexcept {
  switch (d) {
    case Dim::none: return 1;
    case Dim::m: return p.m;
    case Dim::n: return p.n;
    case Dim::k: return p.k;
    case Dim::extra0: return p.extra[0];
    case Dim::extra1: return p.extra[1];
    case Dim::extra2: return p.extra[2];
  }
  return 0;
}
constexpr void set_dim(Problem& p, Dim d, int64_t v) noexcept {
  switch (d) {
    case Dim::none: break;
    case Dim::m: p.m = v; break;
    case Dim::n: p.n = v; break;
    case Dim::k: p.k = v; break;
    case Dim::extra0: p.extra[0] = v; break;
    case Dim::extra1: p.extra[1] = v; break;
    case Dim::extra2: p.extra[2] = v; break;
  }
}
/// Every dim of `p` by Dim (dims[0] = 1, Dim::none): what DimExpr::eval takes.
struct Dims {
  int64_t v[kDimCount];
  constexpr const int64_t* data() const noexcept { return v; }
};
constexpr Dims dims_of(const Problem& p) noexcept { return {{1, p.m, p.n, p.k, p.extra[0], p.extra[1], p.extra[2]}}; }

/// The largest dim (M, N, K, hidden, d, ...) an op takes: 2^40. Larger
/// ones are refused by validation and in file names, so that every extent
/// and byte count derived from dims fits in int64 without checks.
inline constexpr int64_t kMaxDim = int64_t{1} << 40;

/// ceil(v * mul / div) for v in [0, kMaxDim]; -1 (an extent no tensor has)
/// for a v outside, without overflowing.
constexpr int64_t scaled_extent(int64_t v, int32_t mul, int32_t div) noexcept {
  if (v < 0 || v > kMaxDim) return -1;
  const int64_t x = v * mul;
  return div == 1 ? x : (x + div - 1) / div;
}

/// One extent of a slot: ceil(dim * mul / div). A plain dim (mul = div =
/// 1) met for the first time (in the spec's order) takes its value from the
/// tensor: it *binds*; every other extent is checked against the bound dims.
///
/// An extent that is no such ratio (moe_align's sorted ids, M * top_k +
/// min(E, M * top_k) * (block_size - 1)) is `fn` of the dims (indexed by
/// Dim, each in [0, kMaxDim]; it returns -1 for a size past kMaxDim): it
/// never binds. `at_least` (rank-1 slots only): the tensor may be longer,
/// the op reads or writes its first value() elements (an engine allocates
/// its own worst case: vLLM's and SGLang's sorted-id buffers differ).
struct DimExpr {
  Dim dim = Dim::none;
  int32_t mul = 1;
  int32_t div = 1;
  int64_t (*fn)(const int64_t* dims) noexcept = nullptr;
  bool at_least = false;
  std::string_view text = {};  ///< fn's formula in messages ("M*top_k + ...")
  constexpr bool plain() const noexcept { return dim != Dim::none && mul == 1 && div == 1 && fn == nullptr; }
  /// The extent given the dims by Dim (dims[0] = 1, Dim::none).
  constexpr int64_t eval(const int64_t* dims) const noexcept {
    return fn != nullptr ? fn(dims) : scaled_extent(dims[static_cast<int>(dim)], mul, div);
  }
  constexpr int64_t value(const Problem& p) const noexcept { return eval(dims_of(p).data()); }
};

/// What the op does with a slot.
enum class Role : uint8_t {
  read,        ///< input, never written
  write,       ///< pure output (the tuner poisons it before a validation run)
  read_write,  ///< modified in place (the tuner restores it before every run)
};

/// Where a slot's dtype comes from.
enum class SlotDType : uint8_t {
  in,     ///< Problem::in_dtype
  out,    ///< Problem::out_dtype
  fixed,  ///< ArgSlot::fixed_dtype (an int32 index tensor, fp32 scales)
};

/// How the tuner fills a slot of its scratch inputs.
enum class Fill : uint8_t {
  signed_unit,  ///< uniform in [-1, 1]
  near_one,     ///< 1 + 0.1 * uniform[-1, 1] (norm weights)
  wide,         ///< uniform in [-4, 4] (activations whose function bends outside [-1, 1])
  /// Expert ids (an int32 slot [tokens, top_k]): each row top_k distinct
  /// ids in [0, E), E = Problem::extra[0], drawn from the tuner's routing
  /// (tune::Routing: uniform, skewed toward a few hot experts, or a file's
  /// rows). Read as integers, never as values.
  expert_ids,
  /// Router weights (an fp32 slot [tokens, top_k]): positive, each row
  /// summing to 1 (a softmax's top-k renormalised).
  routing_weights,
  /// moe_align's outputs (int32, rank 1) for the problem's M * top_k pairs
  /// among E experts in blocks of block_size (Dim::m, extra1, extra0,
  /// extra2), from one routing drawn as expert_ids draws it: the sorted
  /// pairs, each block's expert, and the padded count. The three slots of
  /// an op hold one alignment.
  aligned_sorted,
  aligned_experts,
  aligned_total,
};

/// One argument slot, in the op's slot order (the order of the args
/// struct, of LaunchArgs::data and of the C and Python signatures).
struct ArgSlot {
  std::string_view name;
  Role role = Role::read;
  /// 2: [rows, cols] row-major, unit stride along cols; 1: [cols],
  /// contiguous; 3: [batch, rows, cols], each matrix as rank 2 and the
  /// batch dense (batch stride = rows * row stride: an expert-stacked
  /// weight [E, N, K]); past validation it is the rank-2 matrix [batch *
  /// rows, cols] with the same row stride (LaunchArgs::ld, RefArgs,
  /// slot_extent), so only validation and the bindings know the rank.
  int8_t rank = 2;
  bool optional = false;  ///< absent = a TensorRef without data; its presence sets Problem::has_bias
  DimExpr batch{};        ///< rank 3 only
  DimExpr rows{};         ///< rank 2 and 3
  DimExpr cols{};
  SlotDType dtype = SlotDType::in;
  DType fixed_dtype = DType::fp32;
  int8_t alias_of = -1;    ///< a write slot that may be exactly this read slot (in place: y == x)
  int8_t dtype_like = -1;  ///< an optional slot whose dtype must equal this slot's (bias like d)
  Fill fill = Fill::signed_unit;
  /// Rank 2, read only: also accepted column-major (unit row stride, column
  /// stride >= rows; a transposed view), e.g. the block fp8 GEMM's scale_a
  /// as SGLang's per_token_group_quant_fp8 writes it, K-major. Its key is
  /// the row-major layout's; the variants see LaunchArgs::ld = -(column
  /// stride) and read or convert it (ld >= 0 is the row-major row stride).
  bool col_major_ok = false;
  /// Optional, and given exactly when the op's input dtype is quantised (an
  /// fp8 dtype): the block scales of fp8 weights. Validation refuses a
  /// quantised call without it and an unquantised one with it.
  bool with_quantized = false;
  /// Optional, and given exactly when the optional slot `given_with` (an
  /// earlier one) is: a pair that comes together (fused_moe_fp8's static
  /// a1_scale and a2_scale). Validation names this slot when one comes alone.
  int8_t given_with = -1;
};

/// What a scalar is.
enum class ScalarKind : uint8_t {
  real,  ///< a float argument (eps)
  /// A switch: 0 or 1 (a bool member of the args struct; bool in the
  /// bindings, a float 0/1 in the C ABI's scalar arrays) that chooses the
  /// accumulation, Problem::accum (1: Accum::fast); a key field of kind
  /// accum writes it. Part of the problem, not of the launch: variants read
  /// Problem::accum, never its LaunchArgs scalar.
  accum,
  /// One of `labels` (an activation kind): its index, an integer member of
  /// the args struct (a float index in the C ABI's scalar arrays). Part of
  /// the problem: Problem::choice, written by a key field of kind choice.
  choice,
  /// A size no tensor carries (moe_align's num_experts and block_size): a
  /// whole number in [1, 2^24] (exact as the C ABI's float) that sets
  /// Problem dim `dim` (an int32 member of the args struct). Part of the
  /// problem: a key field of kind dim writes it; variants read the dim.
  dim,
};

/// A scalar argument after the tensors (eps, fast_accum, activation).
struct ScalarSlot {
  std::string_view name;
  float default_value = 0.f;
  bool positive = false;  ///< must be > 0 and finite
  ScalarKind kind = ScalarKind::real;
  std::span<const std::string_view> labels = {};  ///< choice only: the names, by index
  Dim dim = Dim::none;                            ///< ScalarKind::dim only: the dim it sets
};
/// The largest value of a ScalarKind::dim scalar: 2^24, a float's exact integers.
inline constexpr float kMaxDimScalar = 16777216.f;

/// A static key field: how a Problem member is written in a key and in a
/// file name, and parsed back.
enum class FieldKind : uint8_t {
  dim,        ///< a positive integer: Problem dim `dim` (required)
  in_dtype,   ///< Problem::in_dtype (required)
  out_dtype,  ///< Problem::out_dtype; left out when equal to in_dtype
  flag,       ///< Problem::has_bias as `flag_text` ("true"); left out when false
  stride,     ///< Problem::stride_code as the stride classes of `stride_slots`; left out for the default layout
  accum,      ///< Problem::accum as "fast"; left out when precise (a file name may say "precise")
  choice,     ///< Problem::choice as the choice scalar's label; left out when 0 (the first label)
};
struct KeyField {
  std::string_view name;
  FieldKind kind = FieldKind::dim;
  Dim dim = Dim::none;
  /// >= 0: the field comes before device_name in a file name, in this order
  /// (SGLang's N=...,K=...,device_name=...); -1: after it, by name.
  int8_t file_pos = -1;
  /// The column in an aiter shape CSV when it differs from `name`
  /// ("outdtype"); "" = name.
  std::string_view csv_name = {};
  /// A flag field's text when set ("true"; SGLang's block_shape field of a
  /// block-fp8 MoE writes "[128,128]" and reads it back).
  std::string_view flag_text = "true";
};

/// The check that sizes are >= 1, run after `slot` binds its dims: "<slot>:
/// <text><shape>", e.g. "b: N and K must be >= 1, got [16, 0]".
struct PositiveCheck {
  int8_t slot = -1;
  uint8_t dims = 0;  ///< bit (1 << Dim) per dim that must be >= 1
  std::string_view text;
};

/// Validation tolerance of one output dtype: |got - want| <= atol_rel *
/// max|ref| + rtol * |want|.
struct Tolerance {
  double atol_rel = 0.0;
  double rtol = 0.0;
};

/// Host float64 buffers of one call, for the op's reference: slot i at
/// data[i] (rows x cols, row stride ld[i] elements; nullptr when absent).
struct RefArgs {
  double* data[kMaxArgs] = {};
  int64_t ld[kMaxArgs] = {};
  float scalar[kMaxScalars] = {};
};

/// An engine config field that maps onto a param of kdispatch's plan
/// (EngineRows): SGLang's "BLOCK_SIZE_M" onto fused_moe's "block_m".
struct EngineParam {
  std::string_view field;  ///< the engine row's field (an integer)
  std::string_view param;  ///< the plan variant's param: the nearest allowed value (ties: the smaller)
};

/// An engine's tuned rows that shape an op's default where kdispatch has no
/// row of its own for the call (issue 35 item 4: SGLang's fused-MoE files
/// drive fused_moe). The default plan (get_default) keeps its variant; each
/// mapped param takes the nearest allowed value to the engine row's field,
/// unless the variant then declines the call. A kdispatch row of the op's
/// own key (tuned, or in configs/) always outranks the engine's row.
struct EngineRows {
  /// The engine table kind ("triton_fused_moe"); empty: none.
  std::string_view table;
  /// Writes the engine key's fields for `p` in canonical order ("E=128,
  /// N=768" or "E=257,N=256,block_shape=[128,128],dtype=fp8_w8a8") into buf
  /// (no terminator); returns the length, 0 when the engine has no key for
  /// `p` or it does not fit cap.
  size_t (*fields)(const Problem& p, char* buf, size_t cap) noexcept = nullptr;
  std::span<const EngineParam> params;
  /// What the engine's row does not know, said where it serves
  /// (DispatchInfo::k_source, lookup --json): "sglang file without K".
  const char* k_source = "";
};

struct OpSpec {
  OpKind op = OpKind::gemm;
  std::string_view name;
  /// One line: what the op computes (the bindings' docstrings).
  std::string_view summary;
  std::span<const ArgSlot> slots;
  std::span<const ScalarSlot> scalars;
  /// Key fields in key-text order: byte order of their names.
  std::span<const KeyField> fields;
  /// The slots in validation order: binding, checks, the device and overlap
  /// messages, and the operands of the stride field (all of them).
  std::span<const int8_t> order;
  int8_t in_dtype_slot = 0;   ///< the slot whose dtype is Problem::in_dtype
  int8_t out_dtype_slot = 0;  ///< ... and Problem::out_dtype
  /// Slots that must share one dtype, in message order: two inputs give
  /// "a is bf16 but b is fp32: mixed input dtypes are not supported",
  /// otherwise "x, y and w must share one dtype (x fp32, y bf16, w fp32)".
  std::span<const int8_t> same_dtype;
  PositiveCheck positive;
  /// The names of the dims in shape messages ("M", "N", "K"), by Dim.
  std::string_view dim_names[kDimCount] = {};
  /// Slots whose base address and row stride enter Problem::align_bytes.
  uint32_t align_slots = 0;
  /// The op takes the call's GPU workspace (LaunchArgs::workspace).
  bool uses_workspace = false;
  /// A call with M = 0 still launches (the default plan: no table, no
  /// tuning): the op writes something sized by its scalars alone
  /// (moe_align's num_tokens_post_pad = 0, as vLLM's kernel does). Other
  /// ops return at once on M = 0.
  bool launches_when_empty = false;
  /// The output dtype a binding allocates by default (a DType as int), or
  /// -1 for the input dtype: bf16 for the fp8 GEMMs, fp8_e4m3fn for the
  /// quantisation ops.
  int8_t default_out_dtype = -1;
  /// Validation tolerance per output dtype (indexed by DType).
  Tolerance tolerance[kDTypeCount] = {};
  /// The tolerance of a call with Problem::accum == fast, whatever the
  /// output dtype (the accumulator, not the output's rounding, then sets the
  /// error): each bound is the larger of this and the dtype's.
  Tolerance fast_accum_tolerance = {};
  /// The tolerance of a call whose input dtype is quantised (fp8: the
  /// activations quantised inside the op), whatever the output dtype: each
  /// bound the larger of this and the dtype's.
  Tolerance quantized_tolerance = {};
  /// Arithmetic of one call (a multiply-add counts 2): what `kdispatch tune
  /// --max-flops` compares.
  double (*flops)(const Problem& p) = nullptr;
  /// The float64 reference: computes the write and read_write slots of
  /// `a` from the read ones (read_write slots hold their inputs on entry).
  void (*reference)(const Problem& p, const RefArgs& a) = nullptr;
  /// An engine's rows that shape the default where kdispatch has none.
  EngineRows engine_rows{};

  constexpr int slot_count() const noexcept { return static_cast<int>(slots.size()); }
  constexpr uint32_t written_slots() const noexcept {
    uint32_t m = 0;
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].role != Role::read) m |= 1u << i;
    return m;
  }
};

/// A quantised dtype (an fp8 format): ArgSlot::with_quantized, quantized_tolerance.
constexpr bool is_quantized(DType t) noexcept {
  const auto i = static_cast<size_t>(t);
  return i < std::size(kDTypes) && kDTypes[i].codec == HostCodec::fp8;
}

/// The validation tolerance of output dtype `t` for problem `p`: the
/// dtype's, widened to fast_accum_tolerance when p asks for fast
/// accumulation and to quantized_tolerance when its input dtype is fp8.
constexpr Tolerance tolerance_of(const OpSpec& spec, const Problem& p, DType t) noexcept {
  Tolerance tol = spec.tolerance[static_cast<size_t>(t)];
  auto widen = [&](const Tolerance& w) {
    if (w.atol_rel > tol.atol_rel) tol.atol_rel = w.atol_rel;
    if (w.rtol > tol.rtol) tol.rtol = w.rtol;
  };
  if (p.accum == Accum::fast) widen(spec.fast_accum_tolerance);
  if (is_quantized(p.in_dtype)) widen(spec.quantized_tolerance);
  return tol;
}

/// The label of value `v` of the op's choice scalar ("" when it has none or
/// `v` is past its labels).
constexpr std::string_view choice_label(const OpSpec& spec, int v) noexcept {
  for (const ScalarSlot& s : spec.scalars)
    if (s.kind == ScalarKind::choice)
      return v >= 0 && static_cast<size_t>(v) < s.labels.size() ? s.labels[static_cast<size_t>(v)] : "";
  return "";
}

/// The spec of `op` (every OpKind has one).
const OpSpec& spec_of(OpKind op) noexcept;
/// Every op's spec, in OpKind order.
std::span<const OpSpec* const> all_specs() noexcept;
/// The spec named `name`, or nullptr.
const OpSpec* find_spec(std::string_view name) noexcept;

/// The dtype of slot `i` of `spec` for problem `p`.
constexpr DType slot_dtype(const OpSpec& spec, int i, const Problem& p) noexcept {
  const ArgSlot& s = spec.slots[static_cast<size_t>(i)];
  return s.dtype == SlotDType::in ? p.in_dtype : s.dtype == SlotDType::out ? p.out_dtype : s.fixed_dtype;
}

/// Logical extent of slot `i` for problem `p`: a rank-1 slot is one row, a
/// rank-3 slot its batch * rows rows.
/// present = false for an absent optional slot (no bias).
struct SlotExtent {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::fp32;
  bool present = true;
};
constexpr SlotExtent slot_extent(const OpSpec& spec, int i, const Problem& p) noexcept {
  const ArgSlot& s = spec.slots[static_cast<size_t>(i)];
  SlotExtent e;
  e.rows = s.rank == 3 ? s.batch.value(p) * s.rows.value(p) : s.rank == 2 ? s.rows.value(p) : 1;
  e.cols = s.cols.value(p);
  e.dtype = slot_dtype(spec, i, p);
  e.present = !s.optional || p.has_bias;
  return e;
}

}  // namespace dispatch::core
