// SPDX-License-Identifier: Apache-2.0
#include "api/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "ops/specs.hpp"
#include "table/key.hpp"

namespace dispatch::api {
namespace {

using core::ArgSlot;
using core::Dim;
using core::DimExpr;
using core::OpSpec;
using core::Role;

// Error results are built out of line (cold): the checks before them stay a
// few contiguous instructions on the hot path.
[[gnu::cold, gnu::noinline]] Status unsupported(std::string what) noexcept {
  return Status(StatusCode::unsupported_problem, std::move(what));
}

[[gnu::cold, gnu::noinline]] Status bad(std::string_view arg, std::string_view what) noexcept {
  try {
    return Status(StatusCode::invalid_argument, std::string(arg) + ": " + std::string(what));
  } catch (...) {
    return Status(StatusCode::invalid_argument, std::string());
  }
}

std::string shape_text(const TensorRef& t) {
  std::string s = "[";
  for (int i = 0; i < t.rank && i < kMaxRank; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

// `base`: the tensor dim of the matrix's rows (1 for a rank-3 slot's
// [batch, rows, cols]; its batch is checked dense, so classes are the
// matrix's).
[[gnu::always_inline]] inline StrideClass stride_class_of(const TensorRef& t, int dim, int base = 0) noexcept {
  const int64_t size = t.shape[base + dim];
  // A size-1 dim: the class the contiguous layout gives (last dim unit, rows
  // other). The rows of a one-column matrix ([K/128, M] scales at M = 1):
  // any non-zero row stride is the contiguous layout too (stride 1 is
  // just one element per row), so they take the rows' default class, and
  // the key of M = 1 is the key of every other M.
  if (size == 1) return dim == 1 ? StrideClass::unit : StrideClass::other;
  const int64_t s = t.strides[base + dim];
  if (s == 0) return StrideClass::zero;
  if (dim == 0 && t.shape[base + 1] == 1) return StrideClass::other;
  if (s == 1) return StrideClass::unit;
  return StrideClass::other;
}

// Rank-2 checks shared by every 2-D operand: data, rank, non-negative
// shape, unit stride along the last dim, row stride >= cols (or 0 for a
// read-only broadcast input). ok_2d is the same test without the message
// (the hot path); check_2d, the one that names what failed: keep them equal.
// A column-major view (ArgSlot::col_major_ok): more than one column, a
// non-unit column stride, unit row stride (or one row).
// An operand spans at most 2^60 elements, so its bytes (up to 8 an element)
// stay within int64 and no index or pointer computed from its strides wraps
// (strides no memory can have are refused, never wrapped).
inline constexpr int64_t kMaxSpanElems = int64_t{1} << 60;
// (n - 1) * stride + tail, for n >= 1 and stride, tail >= 0, within
// kMaxSpanElems.
[[gnu::always_inline]] inline bool span_fits(int64_t n, int64_t stride, int64_t tail) noexcept {
  int64_t r = 0;
  return !__builtin_mul_overflow(n - 1, stride, &r) && !__builtin_add_overflow(r, tail, &r) && r <= kMaxSpanElems;
}
// A size past kMaxSpanElems (2^60): its span is not checked here; the dims'
// rule refuses it naming the dim (ops/specs.cpp asserts that no 2-D or 3-D
// extent, mul * dim / div of dims <= 2^40, comes near it). A size past
// 2^40 alone is not exempt: an extent 2 * d is 2^41 at d = 2^40.
[[gnu::always_inline]] inline bool huge_size(int64_t n) noexcept { return n > kMaxSpanElems; }
[[gnu::always_inline]] inline bool huge_2d(const TensorRef& t) noexcept {
  return huge_size(t.shape[0]) || huge_size(t.shape[1]);
}
std::string span_text(std::string_view stride, int64_t s, int64_t n, std::string_view of) {
  return std::string(stride) + " " + std::to_string(s) + " over " + std::to_string(n) + " " + std::string(of) +
         " spans past 2^60 elements (no tensor spans that)";
}
[[gnu::always_inline]] inline bool col_major(const TensorRef& t) noexcept {
  return t.rank == 2 && t.shape[1] > 1 && t.strides[1] != 1;
}
[[gnu::always_inline]] inline bool ok_col_major(const TensorRef& t) noexcept {
  return (t.shape[0] <= 1 || t.strides[0] == 1) && t.strides[1] >= (t.shape[0] > 1 ? t.shape[0] : 1);
}
[[gnu::always_inline]] inline bool ok_2d(const TensorRef& t, bool output, bool require_data,
                                         bool col_major_ok = false) noexcept {
  if (t.rank != 2 || t.shape[0] < 0 || t.shape[1] < 0) return false;
  if (require_data && t.data == nullptr && t.shape[0] > 0 && t.shape[1] > 0) return false;
  if (t.shape[0] == 0 || t.shape[1] == 0) return true;  // empty: any strides (check_2d)
  if (col_major_ok && col_major(t))
    return ok_col_major(t) && (huge_2d(t) || span_fits(t.shape[1], t.strides[1], t.shape[0]));
  if (t.shape[1] > 1 && t.strides[1] != 1) return false;
  if (t.shape[0] > 1) {
    if (t.strides[0] < 0) return false;
    if (t.strides[0] == 0 && output) return false;
    if (t.strides[0] != 0 && t.strides[0] < t.shape[1]) return false;
    if (!huge_2d(t) && !span_fits(t.shape[0], t.strides[0], t.shape[1])) return false;
  }
  return true;
}
Status check_2d(const TensorRef& t, std::string_view name, bool output, bool require_data,
                bool col_major_ok = false) noexcept {
  if (t.rank != 2) return bad(name, "must be rank 2, got rank " + std::to_string(t.rank));
  if (t.shape[0] < 0 || t.shape[1] < 0) return bad(name, "negative shape " + shape_text(t));
  if (require_data && t.data == nullptr && t.shape[0] > 0 && t.shape[1] > 0) return bad(name, "data is null");
  // Empty: it spans no memory, so its strides say nothing (numpy's
  // zeros((3, 0)) has row stride 0); the op's shape rule answers.
  if (t.shape[0] == 0 || t.shape[1] == 0) return Status();
  if (col_major_ok && col_major(t)) {
    if (ok_col_major(t))
      return huge_2d(t) || span_fits(t.shape[1], t.strides[1], t.shape[0])
                 ? Status()
                 : bad(name, span_text("column stride", t.strides[1], t.shape[1], "columns"));
    if (t.shape[0] > 1 && t.strides[0] != 1)
      return bad(name, "column-major (column stride " + std::to_string(t.strides[1]) +
                           ") needs unit row stride, got row stride " + std::to_string(t.strides[0]));
    return bad(name, "column-major: column stride " + std::to_string(t.strides[1]) + " is smaller than its " +
                         std::to_string(t.shape[0]) + " rows (columns overlap)");
  }
  if (t.shape[1] > 1 && t.strides[1] != 1)
    return bad(name, "needs unit stride along its last dimension, got stride " + std::to_string(t.strides[1]));
  if (t.shape[0] > 1) {
    if (t.strides[0] < 0) return bad(name, "negative row stride");
    if (t.strides[0] == 0 && output) return bad(name, "an output cannot have row stride 0");
    if (t.strides[0] != 0 && t.strides[0] < t.shape[1])
      return bad(name, "row stride " + std::to_string(t.strides[0]) + " is smaller than its row length " +
                           std::to_string(t.shape[1]) + " (rows overlap)");
    if (!huge_2d(t) && !span_fits(t.shape[0], t.strides[0], t.shape[1]))
      return bad(name, span_text("row stride", t.strides[0], t.shape[0], "rows"));
  }
  return Status();
}

// A rank-1 slot of n elements (at least n: DimExpr::at_least), contiguous;
// an empty one may have null data (torch.empty(0)).
[[gnu::always_inline]] inline bool ok_1d(const TensorRef& t, int64_t n, bool require_data, bool at_least) noexcept {
  return t.rank == 1 && !(require_data && t.data == nullptr && t.shape[0] > 0) && n >= 0 &&
         (at_least ? t.shape[0] >= n : t.shape[0] == n) && !(t.shape[0] > 1 && t.strides[0] != 1);
}
Status check_1d(const TensorRef& t, std::string_view name, int64_t n, bool require_data, const DimExpr& e) noexcept {
  if (t.rank != 1) return bad(name, "must be rank 1, got rank " + std::to_string(t.rank));
  if (require_data && t.data == nullptr && t.shape[0] > 0) return bad(name, "data is null");
  if (n < 0) return bad(name, "its size, " + std::string(e.text) + ", is over the largest supported size, 2^40");
  if (e.at_least ? t.shape[0] < n : t.shape[0] != n)
    return bad(name, (e.at_least ? "must have at least " : "must have ") + std::to_string(n) + " elements" +
                         (e.text.empty() ? "" : " (" + std::string(e.text) + ")") + ", has " +
                         std::to_string(t.shape[0]));
  if (t.shape[0] > 1 && t.strides[0] != 1)
    return bad(name, "must be contiguous (stride 1), got stride " + std::to_string(t.strides[0]));
  return Status();
}

// Rank-3 checks (ArgSlot rank 3, [batch, rows, cols]): each matrix as a
// rank-2 operand (unit column stride, row stride >= cols) and the batch
// dense (batch stride = rows * row stride), so the whole is the rank-2
// matrix [batch * rows, cols] the rest of the library sees.
[[gnu::always_inline]] inline int64_t row_stride_3d(const TensorRef& t) noexcept {
  return t.shape[1] > 1 ? t.strides[1] : t.shape[2];
}
[[gnu::always_inline]] inline bool ok_3d(const TensorRef& t, bool require_data) noexcept {
  if (t.rank != 3 || t.shape[0] < 0 || t.shape[1] < 0 || t.shape[2] < 0) return false;
  if (require_data && t.data == nullptr && t.shape[0] > 0 && t.shape[1] > 0 && t.shape[2] > 0) return false;
  if (t.shape[0] == 0 || t.shape[1] == 0 || t.shape[2] == 0) return true;  // empty: any strides (check_3d)
  if (t.shape[2] > 1 && t.strides[2] != 1) return false;
  const int64_t ld = row_stride_3d(t);
  if (t.shape[1] > 1 && ld < t.shape[2]) return false;
  if (huge_2d(t) || huge_size(t.shape[2])) return true;  // the dims' rule names it
  int64_t dense = 0;                                     // rows * row stride: each matrix's extent, the batch stride
  if (__builtin_mul_overflow(t.shape[1], ld, &dense) || !span_fits(t.shape[0], dense, dense)) return false;
  return t.shape[0] <= 1 || t.strides[0] == dense;
}
Status check_3d(const TensorRef& t, std::string_view name, bool require_data) noexcept {
  if (t.rank != 3) return bad(name, "must be rank 3, got rank " + std::to_string(t.rank));
  if (t.shape[0] < 0 || t.shape[1] < 0 || t.shape[2] < 0) return bad(name, "negative shape " + shape_text(t));
  if (require_data && t.data == nullptr && t.shape[0] > 0 && t.shape[1] > 0 && t.shape[2] > 0)
    return bad(name, "data is null");
  // Empty: it spans no memory, so its strides say nothing (torch gives a
  // contiguous [E, 0, K] batch stride K, not 0); the op's shape rule then
  // answers ("E, N and K must be >= 1, got shape [4, 0, 32]").
  if (t.shape[0] == 0 || t.shape[1] == 0 || t.shape[2] == 0) return Status();
  if (t.shape[2] > 1 && t.strides[2] != 1)
    return bad(name, "needs unit stride along its last dimension, got stride " + std::to_string(t.strides[2]));
  const int64_t ld = row_stride_3d(t);
  if (t.shape[1] > 1 && ld < t.shape[2])
    return bad(name, "row stride " + std::to_string(ld) + " is smaller than its row length " +
                         std::to_string(t.shape[2]) + " (rows overlap)");
  // A size past 2^60: the dims' rule refuses it naming the dim.
  if (huge_2d(t) || huge_size(t.shape[2])) return Status();
  int64_t dense = 0;
  if (__builtin_mul_overflow(t.shape[1], ld, &dense) || !span_fits(t.shape[0], dense, dense))
    return bad(name, span_text("row stride", ld, t.shape[1], "rows of " + std::to_string(t.shape[0]) + " matrices"));
  if (t.shape[0] > 1 && t.strides[0] != dense)
    return bad(name, "batch stride " + std::to_string(t.strides[0]) +
                         " must be rows * row stride = " + std::to_string(dense) +
                         " (the matrices stacked densely, as a contiguous [E, N, K] weight); a strided batch is "
                         "not supported: pass a contiguous copy");
  return Status();
}
// a * b + c (each >= 0), saturated at INT64_MAX: strides no memory can have
// span to the end of the address space, never wrap to a small span.
[[gnu::always_inline]] inline int64_t mul_add_sat(int64_t a, int64_t b, int64_t c) noexcept {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) || __builtin_add_overflow(r, c, &r) ? INT64_MAX : r;
}
// Two row-major 2-D tensors of more than one row, one row stride L and one
// element size, whose rows sit side by side in each stride (the column
// halves of one [M, 2H] buffer): every byte of a lies at an offset in
// [0, wa) mod L from a's data, every byte of b in [r, r + wb), r = (b's
// data - a's data) mod L (wa, wb: the row widths in bytes); disjoint when
// r >= wa and r + wb <= L, for any number of rows. Anything else: false
// (the bounding spans decide). Out of line: only crossing spans reach it,
// and inlined it pushed the fast path's pair checks out of line (+126
// instructions a table hit, bench/results/op_spec_hot_path.md).
[[gnu::noinline]] bool rows_side_by_side(const TensorRef& a, const TensorRef& b) noexcept {
  if (a.rank != 2 || b.rank != 2 || a.shape[0] <= 1 || b.shape[0] <= 1 || a.strides[0] != b.strides[0]) return false;
  if ((a.shape[1] > 1 && a.strides[1] != 1) || (b.shape[1] > 1 && b.strides[1] != 1)) return false;
  const int64_t e = static_cast<int64_t>(core::dtype_bytes(a.dtype));
  int64_t l = 0, wa = 0, wb = 0;
  if (e != static_cast<int64_t>(core::dtype_bytes(b.dtype)) || __builtin_mul_overflow(a.strides[0], e, &l) ||
      __builtin_mul_overflow(a.shape[1], e, &wa) || __builtin_mul_overflow(b.shape[1], e, &wb) || l <= 0)
    return false;
  const auto pa = reinterpret_cast<uintptr_t>(a.data), pb = reinterpret_cast<uintptr_t>(b.data);
  const uintptr_t gap = pb >= pa ? pb - pa : pa - pb;  // the distance, exact as an int64 or no proof
  if (gap > static_cast<uintptr_t>(INT64_MAX)) return false;
  int64_t r = static_cast<int64_t>(gap) % l;
  if (pb < pa && r != 0) r = l - r;  // (b - a) mod L for b below a
  return r >= wa && wb <= l - r;
}
// Byte ranges of two strided 2-D tensors overlap (conservative: bounding
// spans, unless rows_side_by_side proves them apart). An empty tensor spans
// nothing, so it overlaps nothing.
[[gnu::always_inline]] inline bool overlaps(const TensorRef& a, const TensorRef& b) noexcept {
  auto span = [](const TensorRef& t, uintptr_t* lo, uintptr_t* hi) __attribute__((always_inline)) {
    // A rank-3 tensor (dense batch, checked first) spans its [batch * rows, cols] matrix.
    const int64_t rows = t.rank == 3 ? mul_add_sat(t.shape[0], t.shape[1], 0) : t.rank == 2 ? t.shape[0] : 1;
    const int64_t cols = t.rank == 3 ? t.shape[2] : t.rank == 2 ? t.shape[1] : t.shape[0];
    if (rows <= 0 || cols <= 0) return false;
    const int64_t rs = t.rank == 3 ? row_stride_3d(t) : t.rank == 2 ? t.strides[0] : 0;
    const int64_t cs = t.rank == 2 && cols > 1 ? t.strides[1] : 1;  // != 1: a column-major view
    const int64_t last = mul_add_sat(rows - 1, rs, mul_add_sat(cols - 1, cs, 0));
    *lo = reinterpret_cast<uintptr_t>(t.data);
    uintptr_t bytes = 0;
    if (__builtin_mul_overflow(static_cast<uintptr_t>(last) + 1, core::dtype_bytes(t.dtype), &bytes) ||
        __builtin_add_overflow(*lo, bytes, hi))
      *hi = UINTPTR_MAX;
    return true;
  };
  uintptr_t alo, ahi, blo, bhi;
  return span(a, &alo, &ahi) && span(b, &blo, &bhi) && alo < bhi && blo < ahi && !rows_side_by_side(a, b);
}

// A write slot may be exactly its alias_of slot (in place): same data, and
// the same row stride when there is more than one row.
[[gnu::always_inline]] inline bool exact_alias(const TensorRef& w, const TensorRef& r) noexcept {
  return w.data == r.data && (r.shape[0] == 1 || w.strides[0] == r.strides[0]);
}

// An optional slot counts as given when it has data, or (pretune, without
// data) when it has the slot's rank.
[[gnu::always_inline]] inline bool slot_present(const ArgSlot& s, const TensorRef& t, bool require_data) noexcept {
  return !s.optional || !t.empty() || (!require_data && t.rank == s.rank);
}

constexpr bool is_written(const ArgSlot& s) noexcept { return s.role != Role::read; }

// A positive scalar (eps, routed_scaling_factor) is > 0 and finite (an inf
// eps zeroes rmsnorm's output; an inf scaling factor makes the MoE's inf).
[[gnu::always_inline]] inline bool positive_ok(float v) noexcept {
  return v > 0.f && v <= std::numeric_limits<float>::max();
}
// A switch scalar (ScalarKind::accum) is 0 or 1.
[[gnu::always_inline]] inline bool switch_ok(float v) noexcept { return v == 0.f || v == 1.f; }
// A choice scalar (ScalarKind::choice) is the index of one of its labels.
[[gnu::always_inline]] inline bool choice_ok(float v, size_t labels) noexcept {
  return v >= 0.f && v < static_cast<float>(labels) && v == static_cast<float>(static_cast<int>(v));
}
// A dim scalar (ScalarKind::dim) is a whole number in [1, 2^24].
[[gnu::always_inline]] inline bool dim_scalar_ok(float v) noexcept {
  return v >= 1.f && v <= core::kMaxDimScalar && v == static_cast<float>(static_cast<int32_t>(v));
}
// A scalar's value in a message: a whole number as one ("got -4", not
// "got -4.000000"), else the shortest text that reads back as the float
// ("got 0.5", "got 1.0000001", "got nan"): never rounded to a value a call
// would take.
std::string scalar_value_text(float v) {
  if (std::fabs(v) < 1e15f && v == std::trunc(v)) return std::to_string(static_cast<long long>(v));
  char buf[32];
  for (int digits = 6; digits <= 9; ++digits) {  // 9 always reads back as the float
    std::snprintf(buf, sizeof buf, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  return buf;
}
// Why a dim scalar is refused; -1 is also what an int32 size past 2^24
// arrives as (scalar_float), so the message says so.
std::string dim_scalar_text(float v) {
  return "must be a whole number in [1, 16777216], got " + scalar_value_text(v) +
         (v == -1.f ? " (an integer size past 2^24 arrives as -1)" : "");
}
std::string choice_text(const core::ScalarSlot& s, float v) {
  std::string all;
  for (size_t j = 0; j < s.labels.size(); ++j)
    all += (j ? ", " : "") + std::to_string(j) + " (" + std::string(s.labels[j]) + ")";
  return "must be one of " + all + ", got " + scalar_value_text(v) +
         (v == -1.f ? " (an integer past 2^24 arrives as -1)" : "");
}

// ------------------------------------------------------------------ the detailed path

// Binding::binder of a dim a scalar sets: kScalarBinder + the scalar's index.
constexpr int kScalarBinder = 64;

struct Binding {
  int64_t value[core::kDimCount] = {1, 0, 0, 0, 0, 0, 0};
  int8_t binder[core::kDimCount] = {-1, -1, -1, -1, -1, -1, -1};  // the slot a dim took its value from
  bool bound(Dim d) const noexcept { return d == Dim::none || binder[static_cast<int>(d)] >= 0; }
  int64_t eval(const DimExpr& e) const noexcept { return e.eval(value); }
};

std::string expr_text(const OpSpec& s, const DimExpr& e) {
  if (e.fn != nullptr) return std::string(e.text);
  std::string name(s.dim_names[static_cast<int>(e.dim)]);
  if (e.mul != 1) name = std::to_string(e.mul) + "*" + name;
  if (e.div != 1) name = "ceil(" + name + "/" + std::to_string(e.div) + ")";
  return name;
}

// Binds the unbound plain dims of a rank-2 or rank-3 slot and checks the
// rest, with the message of a mismatch.
Status bind_or_check(const OpSpec& s, int slot, const TensorRef* const* ts, Binding* b) {
  const ArgSlot& a = s.slots[static_cast<size_t>(slot)];
  const TensorRef& t = *ts[slot];
  const int n = a.rank == 3 ? 3 : 2;
  const DimExpr* axes[3] = {n == 3 ? &a.batch : &a.rows, n == 3 ? &a.rows : &a.cols, &a.cols};
  bool binds[3] = {false, false, false};
  for (int ax = 0; ax < n; ++ax) {
    binds[ax] = axes[ax]->plain() && !b->bound(axes[ax]->dim);
    for (int bx = 0; bx < ax; ++bx) binds[ax] = binds[ax] && !(binds[bx] && axes[bx]->dim == axes[ax]->dim);
  }
  // Bind first (a dim may appear in two axes only when bound already).
  Binding trial = *b;
  for (int ax = 0; ax < n; ++ax)
    if (binds[ax]) {
      trial.value[static_cast<int>(axes[ax]->dim)] = t.shape[ax];
      trial.binder[static_cast<int>(axes[ax]->dim)] = static_cast<int8_t>(slot);
    }
  for (int ax = 0; ax < n; ++ax)
    if (binds[ax] && t.shape[ax] > core::kMaxDim)
      return bad(a.name, "shape " + shape_text(t) + ": " + std::string(s.dim_names[static_cast<int>(axes[ax]->dim)]) +
                             " = " + std::to_string(t.shape[ax]) + " is over the largest supported size, 2^40");
  int bad_axis = -1;
  for (int ax = 0; ax < n && bad_axis < 0; ++ax)
    if (!binds[ax] && t.shape[ax] != trial.eval(*axes[ax])) bad_axis = ax;
  if (bad_axis < 0) {
    *b = trial;
    return Status();
  }
  const std::string name(a.name);
  std::string names = "[", values = " = [";
  for (int ax = 0; ax < n; ++ax) {
    names += (ax ? ", " : "") + expr_text(s, *axes[ax]);
    values += (ax ? ", " : "") + std::to_string(trial.eval(*axes[ax]));
  }
  names += "]";
  values += "]";
  bool any_binds = false;
  for (int ax = 0; ax < n; ++ax) any_binds = any_binds || binds[ax];
  if (any_binds) {
    // Partly bound: name the slot the mismatching dim came from.
    const int from = b->binder[static_cast<int>(axes[bad_axis]->dim)];
    std::string with;
    for (int ax = 0; ax < n; ++ax)
      if (!binds[ax])
        with += (with.empty() ? "" : ", ") + expr_text(s, *axes[ax]) + " = " + std::to_string(trial.eval(*axes[ax]));
    const std::string from_text =
        from >= kScalarBinder ? std::string(s.scalars[static_cast<size_t>(from - kScalarBinder)].name)
        : from >= 0           ? std::string(s.slots[static_cast<size_t>(from)].name) + " " + shape_text(*ts[from])
                              : "?";
    return bad(name, "shape " + shape_text(t) + " does not match " + from_text + ": " + name + " must be " + names +
                         " with " + with);
  }
  // Fully bound: an earlier slot of the same shape names it.
  auto same = [](const DimExpr& x, const DimExpr& y) { return x.dim == y.dim && x.mul == y.mul && x.div == y.div; };
  for (int8_t j : s.order) {
    if (j == slot) break;
    const ArgSlot& o = s.slots[static_cast<size_t>(j)];
    if (o.rank == a.rank && same(o.rows, a.rows) && same(o.cols, a.cols) && (a.rank != 3 || same(o.batch, a.batch)))
      return bad(name, "shape " + shape_text(t) + " must equal " + std::string(o.name) + "'s " + shape_text(*ts[j]));
  }
  return bad(name, "shape " + shape_text(t) + " must be " + names + values);
}

// 5c and 5d of check_detailed: a required slot whose dtype must equal
// another's (hidden like out); block scales given exactly when the input
// dtype is quantised.
Status check_dtype_links(const OpSpec& s, const TensorRef* const* t, bool require_data) {
  auto slot = [&](int i) -> const ArgSlot& { return s.slots[static_cast<size_t>(i)]; };
  auto name = [&](int i) { return std::string(slot(i).name); };
  // 5c. A required slot whose dtype must equal another's (hidden like out).
  for (int i = 0; i < s.slot_count(); ++i)
    if (const int like = slot(i).dtype_like; !slot(i).optional && like >= 0 && t[i]->dtype != t[like]->dtype)
      return unsupported(name(i) + " is " + std::string(dtype_name(t[i]->dtype)) + " but " + name(like) + " is " +
                         std::string(dtype_name(t[like]->dtype)) + ": they must share one dtype");
  // 5d. Block scales: given exactly when the input dtype is quantised.
  for (int i = 0; i < s.slot_count(); ++i) {
    if (!slot(i).with_quantized) continue;
    const DType in = t[s.in_dtype_slot]->dtype;
    const bool given = slot_present(slot(i), *t[i], require_data);
    if (given != core::is_quantized(in))
      return bad(slot(i).name, given ? "given, but " + name(s.in_dtype_slot) + " is " + std::string(dtype_name(in)) +
                                           ": scales go with fp8 weights only"
                                     : "missing: " + name(s.in_dtype_slot) + " is " + std::string(dtype_name(in)) +
                                           ", whose block scales it is");
  }
  // 5e. A pair of optional slots that come together (a1_scale, a2_scale).
  for (int i = 0; i < s.slot_count(); ++i) {
    const int with = slot(i).given_with;
    if (with < 0) continue;
    const bool given = slot_present(slot(i), *t[i], require_data);
    if (given != slot_present(slot(with), *t[with], require_data))
      return bad(slot(i).name, given
                                   ? "given without " + name(with) + ": the two come together (static scales)"
                                   : "missing: " + name(with) + " is given, and the two come together (static scales)");
  }
  return Status();
}

}  // namespace

StrideClass stride_class_2d(const TensorRef& t, int dim) noexcept { return stride_class_of(t, dim); }

// The checks in order, each with its message: the slow path of
// validate_slots, which tests the same conditions without them.
[[gnu::cold, gnu::noinline]] Status check_detailed(const OpSpec& s, const TensorRef* const* t, const float* scalars,
                                                   bool require_data) noexcept {
  try {
    auto slot = [&](int i) -> const ArgSlot& { return s.slots[static_cast<size_t>(i)]; };
    auto name = [&](int i) { return std::string(slot(i).name); };
    // 1. The layout of every required 2-D and 3-D slot.
    for (int8_t i : s.order) {
      if (slot(i).optional) continue;
      if (slot(i).rank == 2)
        if (Status st = check_2d(*t[i], slot(i).name, is_written(slot(i)), require_data, slot(i).col_major_ok);
            !st.ok())
          return st;
      if (slot(i).rank == 3)
        if (Status st = check_3d(*t[i], slot(i).name, require_data); !st.ok()) return st;
    }
    // 2. Shapes: bind the dims (a dim scalar's first), check the rest; the
    // sizes >= 1 once their slot bound them.
    Binding b;
    for (size_t j = 0; j < s.scalars.size(); ++j) {
      if (s.scalars[j].kind != core::ScalarKind::dim) continue;
      if (!dim_scalar_ok(scalars[j])) return bad(s.scalars[j].name, dim_scalar_text(scalars[j]));
      b.value[static_cast<int>(s.scalars[j].dim)] = static_cast<int64_t>(scalars[j]);
      b.binder[static_cast<int>(s.scalars[j].dim)] = static_cast<int8_t>(kScalarBinder + j);
    }
    auto positive = [&]() -> Status {
      for (int d = 1; d < core::kDimCount; ++d)
        if (((s.positive.dims >> d) & 1u) && b.value[d] < 1)
          return bad(slot(s.positive.slot).name, std::string(s.positive.text) + shape_text(*t[s.positive.slot]));
      return Status();
    };
    for (int8_t i : s.order) {
      if (slot(i).optional || slot(i).rank < 2) continue;
      if (Status st = bind_or_check(s, i, t, &b); !st.ok()) return st;
      if (i == s.positive.slot)
        if (Status st = positive(); !st.ok()) return st;
    }
    // 3. Required 1-D slots.
    for (int8_t i : s.order)
      if (!slot(i).optional && slot(i).rank == 1)
        if (Status st = check_1d(*t[i], slot(i).name, b.eval(slot(i).cols), require_data, slot(i).cols); !st.ok())
          return st;
    // 4. Scalars.
    for (size_t j = 0; j < s.scalars.size(); ++j) {
      if (s.scalars[j].positive && !positive_ok(scalars[j]))
        return bad(s.scalars[j].name, "must be > 0 and finite, got " + scalar_value_text(scalars[j]));
      if (s.scalars[j].kind == core::ScalarKind::accum && !switch_ok(scalars[j]))
        return bad(s.scalars[j].name, switch_text(scalars[j]));
      if (s.scalars[j].kind == core::ScalarKind::choice && !choice_ok(scalars[j], s.scalars[j].labels.size()))
        return bad(s.scalars[j].name, choice_text(s.scalars[j], scalars[j]));
    }
    // 5. One dtype where the spec wants one.
    if (!s.same_dtype.empty()) {
      bool same = true;
      for (int8_t i : s.same_dtype) same = same && t[i]->dtype == t[s.same_dtype[0]]->dtype;
      if (!same) {
        bool inputs = s.same_dtype.size() == 2;
        for (int8_t i : s.same_dtype) inputs = inputs && !is_written(slot(i));
        if (inputs) {
          const int i0 = s.same_dtype[0], i1 = s.same_dtype[1];
          return unsupported(name(i0) + " is " + std::string(dtype_name(t[i0]->dtype)) + " but " + name(i1) + " is " +
                             std::string(dtype_name(t[i1]->dtype)) + ": mixed input dtypes are not supported");
        }
        std::string list, each;
        for (size_t k = 0; k < s.same_dtype.size(); ++k) {
          const int i = s.same_dtype[k];
          list += (k == 0 ? "" : k + 1 == s.same_dtype.size() ? " and " : ", ") + name(i);
          each += (k == 0 ? "" : ", ") + name(i) + " " + std::string(dtype_name(t[i]->dtype));
        }
        return unsupported(list + " must share one dtype (" + each + ")");
      }
    }
    // 5b. Slots of a fixed dtype (fp32 scales, int32 indices).
    for (int i = 0; i < s.slot_count(); ++i)
      if (slot(i).dtype == core::SlotDType::fixed && slot_present(slot(i), *t[i], require_data) &&
          t[i]->dtype != slot(i).fixed_dtype)
        return bad(slot(i).name, "dtype " + std::string(dtype_name(t[i]->dtype)) + " must be " +
                                     std::string(dtype_name(slot(i).fixed_dtype)));
    if (Status st = check_dtype_links(s, t, require_data); !st.ok()) return st;
    // 6. Optional slots that are given.
    for (int i = 0; i < s.slot_count(); ++i) {
      if (!slot(i).optional || !slot_present(slot(i), *t[i], require_data)) continue;
      if (slot(i).rank == 1) {
        if (Status st = check_1d(*t[i], slot(i).name, b.eval(slot(i).cols), require_data, slot(i).cols); !st.ok())
          return st;
      } else {
        if (Status st = slot(i).rank == 3
                            ? check_3d(*t[i], slot(i).name, require_data)
                            : check_2d(*t[i], slot(i).name, is_written(slot(i)), require_data, slot(i).col_major_ok);
            !st.ok())
          return st;
        if (Status st = bind_or_check(s, i, t, &b); !st.ok()) return st;
      }
      if (const int like = slot(i).dtype_like; like >= 0 && t[i]->dtype != t[like]->dtype)
        return bad(slot(i).name, "dtype " + std::string(dtype_name(t[i]->dtype)) + " must equal " + name(like) +
                                     "'s dtype " + std::string(dtype_name(t[like]->dtype)));
    }
    // 7. One device.
    const int first = s.order[0];
    for (int i = 0; i < s.slot_count(); ++i) {
      if (i == first || !slot_present(slot(i), *t[i], require_data)) continue;
      if (!(t[i]->device == t[first]->device))
        return Status(StatusCode::unsupported_device,
                      name(i) + " is on " + std::string(device_type_name(t[i]->device.type)) + ":" +
                          std::to_string(t[i]->device.ordinal) + " but " + name(first) + " is on " +
                          std::string(device_type_name(t[first]->device.type)) + ":" +
                          std::to_string(t[first]->device.ordinal));
    }
    // 8. Written 2-D slots overlap nothing else 2-D (in place only as the spec allows).
    // At M = 0 only an op that still launches (launches_when_empty: it
    // writes a count or a scale) can write; an empty tensor overlaps nothing.
    if (require_data && (b.value[static_cast<int>(Dim::m)] > 0 || s.launches_when_empty)) {
      for (size_t oi = 0; oi < s.order.size(); ++oi)
        for (size_t oj = 0; oj < oi; ++oj) {
          const int i = s.order[oi], j = s.order[oj];
          if (slot(i).rank < 2 || slot(j).rank < 2) continue;
          if (!slot_present(slot(i), *t[i], require_data) || !slot_present(slot(j), *t[j], require_data)) continue;
          if (!is_written(slot(i)) && !is_written(slot(j))) continue;
          if (!overlaps(*t[i], *t[j])) continue;
          if (is_written(slot(i)) && is_written(slot(j)))
            return bad(slot(i).name, "overlaps " + name(j) + " (both are written in place)");
          const int w = is_written(slot(i)) ? i : j, r = w == i ? j : i;
          if (slot(w).alias_of == r) {
            if (exact_alias(*t[w], *t[r])) continue;
            return bad(slot(w).name, "partially overlaps " + name(r) + " (in place is allowed only with " + name(w) +
                                         " == " + name(r) + " and equal row strides)");
          }
          return bad(slot(w).name, "overlaps an input");
        }
      // Rank-1 slots (weights, a bias) against every written slot: never in
      // place; a written rank-1 slot (quant_fp8_tensor/_token's scale)
      // against every other slot, its inputs included.
      for (int i = 0; i < s.slot_count(); ++i) {
        if (slot(i).rank != 1 || !slot_present(slot(i), *t[i], require_data)) continue;
        for (int w = 0; w < s.slot_count(); ++w) {
          if (w == i || !(is_written(slot(w)) || is_written(slot(i))) || !slot_present(slot(w), *t[w], require_data))
            continue;
          if (!overlaps(*t[w], *t[i])) continue;
          if (is_written(slot(w)) && is_written(slot(i)))
            return bad(slot(std::min(i, w)).name, "overlaps " + name(std::max(i, w)) + " (both are written)");
          if (is_written(slot(w))) return bad(slot(w).name, "overlaps an input (" + name(i) + ")");
          return bad(slot(i).name, "overlaps an input (" + name(w) + ")");
        }
      }
    }
    return Status();
  } catch (...) {
    return Status(StatusCode::out_of_memory, std::string());
  }
}

namespace {

// ------------------------------------------------------------------ the fast path
//
// The spec is a constant: the slot loops unroll (index_sequence) and every
// rule that does not apply to this op compiles away.

template <const OpSpec& S, size_t... I, class F>
[[gnu::always_inline]] inline void for_slots(std::index_sequence<I...>, F&& f) {
  (f(std::integral_constant<int, static_cast<int>(I)>{}), ...);
}
template <const OpSpec& S, class F>
[[gnu::always_inline]] inline void each_slot(F&& f) {
  for_slots<S>(std::make_index_sequence<S.slots.size()>{}, f);
}
// f(o) for each position o of the spec's order (an operand of the stride code).
template <const OpSpec& S, class F>
[[gnu::always_inline]] inline void each_operand(F&& f) {
  for_slots<S>(std::make_index_sequence<S.order.size()>{}, f);
}
// The stride code's bits of every operand in its default layout (the code
// of such a call is 0).
constexpr uint64_t default_stride_code(const OpSpec& s) {
  uint64_t code = 0;
  for (size_t o = 0; o < s.order.size(); ++o) {
    const int rank = s.slots[static_cast<size_t>(s.order[o])].rank;
    const auto c0 = static_cast<uint64_t>(core::stride_class(0, static_cast<int>(o), 0, rank));
    const uint64_t c1 = rank >= 2 ? static_cast<uint64_t>(StrideClass::unit) : 0;
    code |= (c0 | c1 << 2) << (4 * o);
  }
  return code;
}

// Ordered pairs (oi, oj), oj < oi, of positions in S.order, as one index
// oi * kMaxPairSide + oj; the others are skipped at compile time.
constexpr int kMaxPairSide = core::kMaxArgs;
template <const OpSpec& S, size_t... I, class F>
[[gnu::always_inline]] inline void for_pairs(std::index_sequence<I...>, F&& f) {
  auto one = [&](auto ip) {
    constexpr size_t oi = decltype(ip)::value / kMaxPairSide, oj = decltype(ip)::value % kMaxPairSide;
    if constexpr (oi < S.order.size() && oj < oi) f(ip);
  };
  (one(std::integral_constant<size_t, I>{}), ...);
}
template <const OpSpec& S, class F>
[[gnu::always_inline]] inline void each_pair(F&& f) {
  static_assert(S.order.size() <= kMaxPairSide);
  for_pairs<S>(std::make_index_sequence<S.order.size() * kMaxPairSide>{}, f);
}

// Where each dim takes its value: (slot, axis) of its first plain mention
// among the required 2-D and 3-D slots, in the spec's order.
struct Binder {
  int8_t slot[core::kDimCount] = {-1, -1, -1, -1, -1, -1, -1};
  int8_t axis[core::kDimCount] = {0, 0, 0, 0, 0, 0, 0};
};
constexpr Binder binders(const OpSpec& s) {
  Binder b;
  bool from_scalar[core::kDimCount] = {};
  for (const core::ScalarSlot& x : s.scalars)
    if (x.kind == core::ScalarKind::dim) from_scalar[static_cast<int>(x.dim)] = true;
  for (int8_t i : s.order) {
    const ArgSlot& a = s.slots[static_cast<size_t>(i)];
    if (a.optional || a.rank < 2) continue;
    const int n = a.rank == 3 ? 3 : 2;
    const DimExpr* axes[3] = {n == 3 ? &a.batch : &a.rows, n == 3 ? &a.rows : &a.cols, &a.cols};
    for (int ax = 0; ax < n; ++ax) {
      const int d = static_cast<int>(axes[ax]->dim);
      if (axes[ax]->plain() && b.slot[d] < 0 && !from_scalar[d]) {
        b.slot[d] = i;
        b.axis[d] = static_cast<int8_t>(ax);
      }
    }
  }
  return b;
}

// Problem::stride_code of an accepted call.
template <const OpSpec& S>
[[gnu::always_inline]] inline uint64_t stride_code_of(const TensorRef* const* t, const bool* present) noexcept {
  // Every operand's stride classes (an absent optional one: its default),
  // 4 bits each in the spec's order (table::pack_stride_code's layout,
  // core::stride_class decodes it), unrolled: the ranks are constants.
  uint64_t code = 0;
  each_operand<S>([&](auto oc) {
    constexpr int o = decltype(oc)::value;
    constexpr int i = S.order[o];
    constexpr int rank = S.slots[static_cast<size_t>(i)].rank;
    uint64_t c0 = static_cast<uint64_t>(core::stride_class(0, o, 0, rank)), c1 = 0;
    if constexpr (rank >= 2) {
      c1 = static_cast<uint64_t>(StrideClass::unit);
      const TensorRef& x = *t[i];
      // A column-major view (only a col_major_ok slot gets here) takes the
      // key of its row-major layout: the variants convert it, a tuned row serves both.
      if (present[i] && !(rank == 2 && col_major(x))) {
        c0 = static_cast<uint64_t>(stride_class_of(x, 0, rank - 2));
        c1 = static_cast<uint64_t>(stride_class_of(x, 1, rank - 2));
      }
    }
    code |= (c0 | c1 << 2) << (4 * o);
  });
  static constexpr uint64_t kDefaultCode = default_stride_code(S);
  return code == kDefaultCode ? 0 : code | core::kStrideNonDefault;
}

// An extent from the dims, inlined with the spec's constant extent: a ratio
// folds and no call through DimExpr::fn is left where the spec has none.
[[gnu::always_inline]] inline int64_t extent_of(const DimExpr& e, const int64_t* dim) noexcept {
  return e.fn != nullptr ? e.fn(dim) : core::scaled_extent(dim[static_cast<int>(e.dim)], e.mul, e.div);
}

/// LaunchArgs::ld of a slot of rank `Rank` given tensor x: the row stride
/// (rank 3: of each matrix; a column-major view: minus its column stride),
/// a rank-1 at_least slot's length as given, else 0.
template <int Rank, bool ColMajorOk, bool AtLeast>
[[gnu::always_inline]] inline int64_t ld_of(const TensorRef& x) noexcept {
  if constexpr (Rank == 3) return row_stride_3d(x);
  if constexpr (Rank == 2 && ColMajorOk)
    return col_major(x) ? -x.strides[1] : x.shape[0] > 1 ? x.strides[0] : x.shape[1];
  if constexpr (Rank == 2) return x.shape[0] > 1 ? x.strides[0] : x.shape[1];
  return AtLeast ? x.shape[0] : 0;
}

template <core::OpKind Op>
[[gnu::always_inline]] inline Status validate_fast(const TensorRef* const* t, const float* scalars, core::Problem* p,
                                                   core::LaunchArgs* la, bool* empty, bool require_data) noexcept {
  static constexpr const OpSpec& S = core::OpSpecOf<Op>::value;
  static constexpr Binder B = binders(S);
  *empty = false;
  // The dims, from their binding slots (garbage when a rank is wrong: the
  // checks below then fail).
  int64_t dim[core::kDimCount] = {1, 0, 0, 0, 0, 0, 0};
  for (int d = 1; d < core::kDimCount; ++d)
    if (B.slot[d] >= 0) dim[d] = t[B.slot[d]]->shape[B.axis[d]];
  bool ok = true;
  for (size_t j = 0; j < S.scalars.size(); ++j)
    if (S.scalars[j].kind == core::ScalarKind::dim) {
      ok = ok && dim_scalar_ok(scalars[j]);
      dim[static_cast<int>(S.scalars[j].dim)] = ok ? static_cast<int64_t>(scalars[j]) : 0;
    }
  auto eval = [&](const DimExpr& e) __attribute__((always_inline)) { return extent_of(e, dim); };
  bool present[S.slots.size()];
  const Device dev = t[S.order[0]]->device;
  each_slot<S>([&](auto ic) __attribute__((always_inline)) {
    constexpr int i = decltype(ic)::value;
    constexpr const ArgSlot& a = S.slots[i];
    const TensorRef& x = *t[i];
    present[i] = slot_present(a, x, require_data);
    if constexpr (a.rank == 2) {
      // Branchless on purpose (the hot path): ints, so no compiler reads it as a mistyped &&.
      const bool here = (int{ok_2d(x, is_written(a), require_data, a.col_major_ok)} & int{x.shape[0] == eval(a.rows)} &
                         int{x.shape[1] == eval(a.cols)}) != 0;
      ok = ok && (a.optional ? !present[i] || here : here);
    } else if constexpr (a.rank == 3) {
      const bool here = (int{ok_3d(x, require_data)} & int{x.shape[0] == eval(a.batch)} &
                         int{x.shape[1] == eval(a.rows)} & int{x.shape[2] == eval(a.cols)}) != 0;
      ok = ok && (a.optional ? !present[i] || here : here);
    } else {
      const bool here = ok_1d(x, eval(a.cols), require_data, a.cols.at_least);
      ok = ok && (a.optional ? !present[i] || here : here);
    }
    if constexpr (a.dtype_like >= 0) ok = ok && (!present[i] || x.dtype == t[a.dtype_like]->dtype);
    if constexpr (a.dtype == core::SlotDType::fixed) ok = ok && (!present[i] || x.dtype == a.fixed_dtype);
    if constexpr (a.with_quantized) ok = ok && present[i] == core::is_quantized(t[S.in_dtype_slot]->dtype);
    if constexpr (a.given_with >= 0) {
      static_assert(a.given_with < i && a.optional, "given_with: an optional slot after the one it goes with");
      ok = ok && present[i] == present[a.given_with];
    }
    ok = ok && (!present[i] || x.device == dev);
  });
  for (int d = 1; d < core::kDimCount; ++d) {
    if ((S.positive.dims >> d) & 1u) ok = ok && dim[d] >= 1;
    ok = ok && dim[d] <= core::kMaxDim;
  }
  core::Accum accum = core::Accum::precise;
  uint8_t choice = 0;
  for (size_t j = 0; j < S.scalars.size(); ++j) {
    if (S.scalars[j].positive) ok = ok && positive_ok(scalars[j]);
    if (S.scalars[j].kind == core::ScalarKind::accum) {
      ok = ok && switch_ok(scalars[j]);
      if (scalars[j] != 0.f) accum = core::Accum::fast;
    }
    if (S.scalars[j].kind == core::ScalarKind::choice) {
      ok = ok && choice_ok(scalars[j], S.scalars[j].labels.size());
      if (ok) choice = static_cast<uint8_t>(scalars[j]);
    }
  }
  for (int8_t i : S.same_dtype) ok = ok && t[i]->dtype == t[S.same_dtype[0]]->dtype;
  // Written 2-D slots against the other 2-D slots (the pairs are a
  // constant of the spec: each_pair visits only those that need a test).
  // ok: no span of a refused call (UB-free); M = 0: as check_detailed's step 8.
  if (ok && require_data && (dim[static_cast<int>(Dim::m)] > 0 || S.launches_when_empty)) {
    each_pair<S>([&](auto ip) {
      constexpr int i = S.order[decltype(ip)::value / kMaxPairSide];
      constexpr int j = S.order[decltype(ip)::value % kMaxPairSide];
      constexpr const ArgSlot &ai = S.slots[static_cast<size_t>(i)], &aj = S.slots[static_cast<size_t>(j)];
      if constexpr (ai.rank >= 2 && aj.rank >= 2 && (is_written(ai) || is_written(aj))) {
        if (present[i] && present[j] && overlaps(*t[i], *t[j])) {
          constexpr bool both = is_written(ai) && is_written(aj);
          constexpr int w = is_written(ai) ? i : j, r = w == i ? j : i;
          ok = ok && !both && S.slots[static_cast<size_t>(w)].alias_of == r && exact_alias(*t[w], *t[r]);
        }
      }
    });
    // Rank-1 slots against every written slot (never in place); a written
    // rank-1 slot against every other slot.
    each_slot<S>([&](auto ic) {
      constexpr int i = decltype(ic)::value;
      if constexpr (S.slots[i].rank == 1) {
        each_slot<S>([&](auto wc) {
          constexpr int w = decltype(wc)::value;
          if constexpr (w != i && (is_written(S.slots[w]) || is_written(S.slots[i])))
            ok = ok && !(present[i] && present[w] && overlaps(*t[w], *t[i]));
        });
      }
    });
  }
  if (!ok) [[unlikely]] {
    Status s = check_detailed(S, t, scalars, require_data);
    if (s.ok())
      return Status(StatusCode::internal,
                    std::string(S.name) + " arguments: the fast and the detailed checks disagree");
    return s;
  }

  p->op = Op;
  p->device = dev;
  p->in_dtype = t[S.in_dtype_slot]->dtype;
  p->out_dtype = t[S.out_dtype_slot]->dtype;
  p->m = dim[static_cast<int>(Dim::m)];
  p->n = dim[static_cast<int>(Dim::n)];
  p->k = dim[static_cast<int>(Dim::k)];
  p->extra[0] = dim[static_cast<int>(Dim::extra0)];
  p->extra[1] = dim[static_cast<int>(Dim::extra1)];
  p->extra[2] = dim[static_cast<int>(Dim::extra2)];
  bool any_optional = false;
  uintptr_t bits = 0;
  each_slot<S>([&](auto ic) {
    constexpr int i = decltype(ic)::value;
    constexpr const ArgSlot& a = S.slots[i];
    const TensorRef& x = *t[i];
    if constexpr (a.optional) any_optional = any_optional || present[i];
    la->data[i] = present[i] ? x.data : nullptr;
    la->ld[i] = ld_of<a.rank, a.col_major_ok, a.cols.at_least>(x);
    if constexpr (((S.align_slots >> i) & 1u) != 0) {
      bits |= reinterpret_cast<uintptr_t>(x.data);
      if (x.shape[a.rank == 3 ? 1 : 0] > 1) bits |= static_cast<uintptr_t>(la->ld[i]) * core::dtype_bytes(x.dtype);
    }
  });
  // The slots the op does not have, and its unused scalars: zero (`la` may
  // come unset, LaunchArgs::Unset).
  for (size_t i = S.slots.size(); i < static_cast<size_t>(core::kMaxArgs); ++i) {
    la->data[i] = nullptr;
    la->ld[i] = 0;
  }
  p->has_bias = any_optional;
  p->accum = accum;
  p->choice = choice;
  p->stride_code = stride_code_of<S>(t, present);
  // The smallest alignment of the align slots' pointers and row strides (the
  // vector kernels need 16 bytes); a description without data is aligned.
  if (S.align_slots != 0 && require_data) {
    uint8_t al = 16;
    while (al > 1 && (bits & (al - 1u)) != 0) al = static_cast<uint8_t>(al / 2);
    p->align_bytes = al;
  }
  for (size_t j = 0; j < static_cast<size_t>(core::kMaxScalars); ++j)
    la->scalar[j] = j < S.scalars.size() ? scalars[j] : 0.f;
  *empty = p->m == 0;
  return Status();
}

}  // namespace

template <core::OpKind Op>
Status validate_slots(const TensorRef* const* t, const float* scalars, core::Problem* p, core::LaunchArgs* la,
                      bool* empty, bool require_data) noexcept {
  return validate_fast<Op>(t, scalars, p, la, empty, require_data);
}

#define KD_TENSOR_PTR(x) &args.x,
// An args member as the scalar arrays' float: a switch's bool 0 or 1; an
// int32 (a size, a choice) past 2^24, where floats skip integers, -1, which
// validation refuses by name, never the rounded neighbour.
constexpr float scalar_float(float v) noexcept { return v; }
constexpr float scalar_float(bool v) noexcept { return v ? 1.f : 0.f; }
constexpr float scalar_float(int32_t v) noexcept {
  return v >= -(int32_t{1} << 24) && v <= (int32_t{1} << 24) ? static_cast<float>(v) : -1.f;
}
#define KD_SCALAR_VAL(x) scalar_float(args.x),
#define KD_VALIDATE_DEF(op, Args, tensors, scalars)                                                       \
  template Status validate_slots<core::OpKind::op>(const TensorRef* const*, const float*, core::Problem*, \
                                                   core::LaunchArgs*, bool*, bool) noexcept;              \
  Status validate_##op(const Args& args, core::Problem* p, core::LaunchArgs* la, bool* empty,             \
                       bool require_data) noexcept {                                                      \
    const TensorRef* t[] = {KD_PP_FOR_EACH(KD_TENSOR_PTR, KD_PP_NOTHING, tensors)};                       \
    const float s[] = {KD_PP_FOR_EACH(KD_SCALAR_VAL, KD_PP_NOTHING, scalars) 0.f};                        \
    return validate_fast<core::OpKind::op>(t, s, p, la, empty, require_data);                             \
  }                                                                                                       \
  Status check_##op##_detailed(const Args& args, bool require_data) noexcept {                            \
    const TensorRef* t[] = {KD_PP_FOR_EACH(KD_TENSOR_PTR, KD_PP_NOTHING, tensors)};                       \
    const float s[] = {KD_PP_FOR_EACH(KD_SCALAR_VAL, KD_PP_NOTHING, scalars) 0.f};                        \
    return check_detailed(core::OpSpecOf<core::OpKind::op>::value, t, s, require_data);                   \
  }
KDISPATCH_OP_LIST(KD_VALIDATE_DEF)
#undef KD_VALIDATE_DEF
#undef KD_SCALAR_VAL
#undef KD_TENSOR_PTR

std::string switch_text(float v) {
  return "must be 0 or 1 (false or true: 1 asks for fast accumulation), got " + scalar_value_text(v);
}

std::string integer_scalar_text(const core::ScalarSlot& s, float v) {
  return s.kind == core::ScalarKind::choice ? choice_text(s, v) : dim_scalar_text(v);
}

}  // namespace dispatch::api
