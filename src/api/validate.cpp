// SPDX-License-Identifier: Apache-2.0
#include "api/validate.hpp"

#include <cstdint>
#include <string>
#include <utility>

#include "table/key.hpp"

namespace dispatch::api {
namespace {

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

constexpr size_t elem_bytes(DType t) noexcept { return t == DType::fp32 ? 4 : 2; }

[[gnu::always_inline]] inline StrideClass stride_class_of(const TensorRef& t, int dim) noexcept {
  const int64_t size = t.shape[dim];
  if (size == 1) {
    // The class the contiguous layout would give: last dim unit; rows
    // stride = cols, so unit only when a row has one element.
    if (dim == 1) return StrideClass::unit;
    return t.shape[1] == 1 ? StrideClass::unit : StrideClass::other;
  }
  const int64_t s = t.strides[dim];
  if (s == 0) return StrideClass::zero;
  if (s == 1) return StrideClass::unit;
  return StrideClass::other;
}

// Rank-2 checks shared by every 2-D operand: data, rank, non-negative
// shape, unit stride along the last dim, row stride >= cols (or 0 for a
// read-only broadcast input). ok_2d is the same test without the message
// (the hot path); check_2d, the one that names what failed: keep them equal.
[[gnu::always_inline]] inline bool ok_2d(const TensorRef& t, bool output, bool require_data) noexcept {
  if (t.rank != 2 || t.shape[0] < 0 || t.shape[1] < 0) return false;
  if (require_data && t.data == nullptr && t.shape[0] > 0 && t.shape[1] > 0) return false;
  if (t.shape[1] > 1 && t.strides[1] != 1) return false;
  if (t.shape[0] > 1) {
    if (t.strides[0] < 0) return false;
    if (t.strides[0] == 0 && output) return false;
    if (t.strides[0] != 0 && t.strides[0] < t.shape[1]) return false;
  }
  return true;
}
Status check_2d(const TensorRef& t, std::string_view name, bool output, bool require_data) noexcept {
  if (t.rank != 2) return bad(name, "must be rank 2, got rank " + std::to_string(t.rank));
  if (t.shape[0] < 0 || t.shape[1] < 0) return bad(name, "negative shape " + shape_text(t));
  if (require_data && t.data == nullptr && t.shape[0] > 0 && t.shape[1] > 0) return bad(name, "data is null");
  if (t.shape[1] > 1 && t.strides[1] != 1)
    return bad(name, "needs unit stride along its last dimension, got stride " + std::to_string(t.strides[1]));
  if (t.shape[0] > 1) {
    if (t.strides[0] < 0) return bad(name, "negative row stride");
    if (t.strides[0] == 0 && output) return bad(name, "an output cannot have row stride 0");
    if (t.strides[0] != 0 && t.strides[0] < t.shape[1])
      return bad(name, "row stride " + std::to_string(t.strides[0]) + " is smaller than its row length " +
                           std::to_string(t.shape[1]) + " (rows overlap)");
  }
  return Status();
}

[[gnu::always_inline]] inline bool ok_1d(const TensorRef& t, int64_t n, bool require_data) noexcept {
  return t.rank == 1 && !(require_data && t.data == nullptr) && t.shape[0] == n && !(n > 1 && t.strides[0] != 1);
}
Status check_1d(const TensorRef& t, std::string_view name, int64_t n, bool require_data) noexcept {
  if (t.rank != 1) return bad(name, "must be rank 1, got rank " + std::to_string(t.rank));
  if (require_data && t.data == nullptr) return bad(name, "data is null");
  if (t.shape[0] != n) return bad(name, "must have " + std::to_string(n) + " elements, has " + std::to_string(t.shape[0]));
  if (n > 1 && t.strides[0] != 1) return bad(name, "must be contiguous (stride 1), got stride " + std::to_string(t.strides[0]));
  return Status();
}

[[gnu::cold, gnu::noinline]] Status device_mismatch(const TensorRef* const* ts, const char* const* names,
                                                   int i) noexcept;

Status same_device(const TensorRef* const* ts, const char* const* names, int n) noexcept {
  for (int i = 1; i < n; ++i)
    if (!(ts[i]->device == ts[0]->device)) [[unlikely]]
      return device_mismatch(ts, names, i);
  return Status();
}

Status device_mismatch(const TensorRef* const* ts, const char* const* names, int i) noexcept {
  try {
    return Status(StatusCode::unsupported_device,
                  std::string(names[i]) + " is on " + std::string(device_type_name(ts[i]->device.type)) + ":" +
                      std::to_string(ts[i]->device.ordinal) + " but " + names[0] + " is on " +
                      std::string(device_type_name(ts[0]->device.type)) + ":" + std::to_string(ts[0]->device.ordinal));
  } catch (...) {
    return Status(StatusCode::unsupported_device, std::string());
  }
}

// Byte ranges of two strided 2-D tensors overlap (conservative: bounding spans).
[[gnu::always_inline]] inline bool overlaps(const TensorRef& a, const TensorRef& b) noexcept {
  auto span = [](const TensorRef& t, uintptr_t* lo, uintptr_t* hi) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(t.data);
    const int64_t rows = t.rank == 2 ? t.shape[0] : 1;
    const int64_t cols = t.rank == 2 ? t.shape[1] : t.shape[0];
    const int64_t rs = t.rank == 2 ? t.strides[0] : 0;
    const int64_t last = (rows > 0 ? (rows - 1) * rs : 0) + (cols > 0 ? cols - 1 : 0);
    *lo = base;
    *hi = base + static_cast<uintptr_t>(last + 1) * elem_bytes(t.dtype);
  };
  uintptr_t alo, ahi, blo, bhi;
  span(a, &alo, &ahi);
  span(b, &blo, &bhi);
  return alo < bhi && blo < ahi;
}

}  // namespace

StrideClass stride_class_2d(const TensorRef& t, int dim) noexcept { return stride_class_of(t, dim); }

namespace {
// Stride classes of up to three operands (rank 2 or 1) packed for the key.
[[gnu::always_inline]] inline uint32_t stride_code(const TensorRef* const* ops, int n) noexcept {
  uint8_t classes[4][2] = {};
  int ranks[4] = {0, 0, 0, 0};
  for (int i = 0; i < n; ++i) {
    ranks[i] = ops[i]->rank;
    if (ops[i]->rank == 2) {
      for (int d = 0; d < 2; ++d) classes[i][d] = static_cast<uint8_t>(stride_class_of(*ops[i], d));
    } else {
      classes[i][0] = static_cast<uint8_t>(StrideClass::unit);  // 1-D operands are checked contiguous
    }
  }
  return table::pack_stride_code(classes, ranks, n);
}

}  // namespace

// The gemm checks in order, with the message of the first that fails: the
// slow path of validate_gemm, which tested the same conditions without them.
[[gnu::cold, gnu::noinline]] Status check_gemm_detailed(const GemmArgs& g, bool require_data) noexcept {
  if (auto s = check_2d(g.a, "a", false, require_data); !s.ok()) return s;
  if (auto s = check_2d(g.b, "b", false, require_data); !s.ok()) return s;
  if (auto s = check_2d(g.d, "d", true, require_data); !s.ok()) return s;
  const int64_t M = g.a.shape[0], K = g.a.shape[1], N = g.b.shape[0];
  if (g.b.shape[1] != K)
    return bad("b", "shape " + shape_text(g.b) + " does not match a " + shape_text(g.a) + ": b must be [N, K] with K = " + std::to_string(K));
  if (g.d.shape[0] != M || g.d.shape[1] != N)
    return bad("d", "shape " + shape_text(g.d) + " must be [M, N] = [" + std::to_string(M) + ", " + std::to_string(N) + "]");
  if (N < 1 || K < 1) return bad("b", "N and K must be >= 1, got " + shape_text(g.b));
  if (g.a.dtype != g.b.dtype)
    return unsupported(
                  "a is " + std::string(dtype_name(g.a.dtype)) + " but b is " + std::string(dtype_name(g.b.dtype)) +
                      ": mixed input dtypes are not supported");
  const bool has_bias = !g.bias.empty() || (!require_data && g.bias.rank == 1);
  if (has_bias) {
    if (auto s = check_1d(g.bias, "bias", N, require_data); !s.ok()) return s;
    if (g.bias.dtype != g.d.dtype)
      return bad("bias", "dtype " + std::string(dtype_name(g.bias.dtype)) + " must equal d's dtype " + std::string(dtype_name(g.d.dtype)));
  }
  const TensorRef* ts[4] = {&g.a, &g.b, &g.d, &g.bias};
  const char* names[4] = {"a", "b", "d", "bias"};
  if (auto s = same_device(ts, names, has_bias ? 4 : 3); !s.ok()) return s;
  if (require_data && M > 0 && (overlaps(g.d, g.a) || overlaps(g.d, g.b))) return bad("d", "overlaps an input");
  return Status();
}

Status validate_gemm(const GemmArgs& g, core::Problem* p, core::LaunchArgs* la, bool* empty,
                     bool require_data) noexcept {
  *empty = false;
  // The conditions of gemm_error, without building a Status per check: on
  // a hit this function is most of dispatch::gemm's own host time.
  const int64_t M = g.a.shape[0], K = g.a.shape[1], N = g.b.shape[0];
  // An absent bias is a null TensorRef (rank 0); pretune may pass a rank-1
  // bias with null data to describe one.
  const bool has_bias = !g.bias.empty() || (!require_data && g.bias.rank == 1);
  bool ok = ok_2d(g.a, false, require_data) & ok_2d(g.b, false, require_data) & ok_2d(g.d, true, require_data);
  ok = ok && g.b.shape[1] == K && g.d.shape[0] == M && g.d.shape[1] == N && N >= 1 && K >= 1 &&
       g.a.dtype == g.b.dtype && g.b.device == g.a.device && g.d.device == g.a.device;
  if (has_bias)
    ok = ok && ok_1d(g.bias, N, require_data) && g.bias.dtype == g.d.dtype && g.bias.device == g.a.device;
  ok = ok && !(require_data && M > 0 && (overlaps(g.d, g.a) || overlaps(g.d, g.b)));
  if (!ok) [[unlikely]] {
    Status s = check_gemm_detailed(g, require_data);
    if (s.ok()) return Status(StatusCode::internal, "gemm arguments: the fast and the detailed checks disagree");
    return s;
  }

  p->op = core::OpKind::gemm;
  p->device = g.a.device;
  p->in_dtype = g.a.dtype;
  p->out_dtype = g.d.dtype;
  p->m = M;
  p->n = N;
  p->k = K;
  p->has_bias = has_bias;
  const TensorRef* ops[3] = {&g.a, &g.b, &g.d};
  p->stride_code = stride_code(ops, 3);
  la->a = g.a.data;
  la->lda = g.a.shape[0] > 1 ? g.a.strides[0] : K;
  la->b = g.b.data;
  la->ldb = g.b.shape[0] > 1 ? g.b.strides[0] : K;
  la->d = g.d.data;
  la->ldd = g.d.shape[0] > 1 ? g.d.strides[0] : N;
  la->bias = has_bias ? g.bias.data : nullptr;
  // The smallest alignment of the operands' pointers and row strides (the
  // vector kernels need 16 bytes of A and B); a description without data is aligned.
  if (require_data) {
    // (D and the bias are written/read element by element: not counted.)
    uintptr_t bits = reinterpret_cast<uintptr_t>(la->a) | reinterpret_cast<uintptr_t>(la->b);
    const size_t ie = elem_bytes(g.a.dtype);
    if (M > 1) bits |= static_cast<uintptr_t>(la->lda) * ie;
    if (N > 1) bits |= static_cast<uintptr_t>(la->ldb) * ie;
    uint8_t al = 16;
    while (al > 1 && (bits & (al - 1u)) != 0) al = static_cast<uint8_t>(al / 2);
    p->align_bytes = al;
  }
  *empty = M == 0;
  return Status();
}

Status validate_rmsnorm(const RmsNormArgs& r, core::Problem* p, core::LaunchArgs* la, bool* empty,
                        bool require_data) noexcept {
  *empty = false;
  if (auto s = check_2d(r.x, "x", false, require_data); !s.ok()) return s;
  if (auto s = check_2d(r.y, "y", true, require_data); !s.ok()) return s;
  const int64_t T = r.x.shape[0], H = r.x.shape[1];
  if (H < 1) return bad("x", "hidden must be >= 1, got shape " + shape_text(r.x));
  if (r.y.shape[0] != T || r.y.shape[1] != H)
    return bad("y", "shape " + shape_text(r.y) + " must equal x's " + shape_text(r.x));
  if (auto s = check_1d(r.w, "w", H, require_data); !s.ok()) return s;
  if (!(r.eps > 0.f)) return bad("eps", "must be > 0, got " + std::to_string(r.eps));
  if (r.x.dtype != r.y.dtype || r.x.dtype != r.w.dtype)
    return unsupported(
                  "x, y and w must share one dtype (x " + std::string(dtype_name(r.x.dtype)) + ", y " +
                      std::string(dtype_name(r.y.dtype)) + ", w " + std::string(dtype_name(r.w.dtype)) + ")");
  const TensorRef* ts[3] = {&r.x, &r.y, &r.w};
  const char* names[3] = {"x", "y", "w"};
  if (auto s = same_device(ts, names, 3); !s.ok()) return s;
  if (require_data && T > 0 && overlaps(r.x, r.y) &&
      !(r.x.data == r.y.data && (T == 1 || r.x.strides[0] == r.y.strides[0])))
    return bad("y", "partially overlaps x (in place is allowed only with y == x and equal row strides)");
  p->op = core::OpKind::rmsnorm;
  p->device = r.x.device;
  p->in_dtype = r.x.dtype;
  p->out_dtype = r.y.dtype;
  p->m = T;
  p->n = H;
  p->k = 0;
  p->has_bias = false;
  const TensorRef* ops[3] = {&r.x, &r.y, &r.w};
  p->stride_code = stride_code(ops, 3);
  la->x = r.x.data;
  la->ldx = T > 1 ? r.x.strides[0] : H;
  la->y = r.y.data;
  la->ldy = T > 1 ? r.y.strides[0] : H;
  la->w = r.w.data;
  la->eps = r.eps;
  *empty = T == 0;
  return Status();
}

Status validate_fused_add_rmsnorm(const FusedAddRmsNormArgs& r, core::Problem* p, core::LaunchArgs* la,
                                  bool* empty, bool require_data) noexcept {
  *empty = false;
  if (auto s = check_2d(r.x, "x", true, require_data); !s.ok()) return s;
  if (auto s = check_2d(r.residual, "residual", true, require_data); !s.ok()) return s;
  const int64_t T = r.x.shape[0], H = r.x.shape[1];
  if (H < 1) return bad("x", "hidden must be >= 1, got shape " + shape_text(r.x));
  if (r.residual.shape[0] != T || r.residual.shape[1] != H)
    return bad("residual", "shape " + shape_text(r.residual) + " must equal x's " + shape_text(r.x));
  if (auto s = check_1d(r.w, "w", H, require_data); !s.ok()) return s;
  if (!(r.eps > 0.f)) return bad("eps", "must be > 0, got " + std::to_string(r.eps));
  if (r.x.dtype != r.residual.dtype || r.x.dtype != r.w.dtype)
    return unsupported(
                  "x, residual and w must share one dtype (x " + std::string(dtype_name(r.x.dtype)) + ", residual " +
                      std::string(dtype_name(r.residual.dtype)) + ", w " + std::string(dtype_name(r.w.dtype)) + ")");
  const TensorRef* ts[3] = {&r.x, &r.residual, &r.w};
  const char* names[3] = {"x", "residual", "w"};
  if (auto s = same_device(ts, names, 3); !s.ok()) return s;
  if (require_data && T > 0 && overlaps(r.x, r.residual)) return bad("residual", "overlaps x (both are written in place)");
  p->op = core::OpKind::fused_add_rmsnorm;
  p->device = r.x.device;
  p->in_dtype = r.x.dtype;
  p->out_dtype = r.x.dtype;
  p->m = T;
  p->n = H;
  p->k = 0;
  p->has_bias = false;
  const TensorRef* ops[3] = {&r.x, &r.residual, &r.w};
  p->stride_code = stride_code(ops, 3);
  la->x = r.x.data;
  la->ldx = T > 1 ? r.x.strides[0] : H;
  la->residual = r.residual.data;
  la->ldr = T > 1 ? r.residual.strides[0] : H;
  la->w = r.w.data;
  la->eps = r.eps;
  *empty = T == 0;
  return Status();
}

}  // namespace dispatch::api
