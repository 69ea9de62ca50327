// SPDX-License-Identifier: Apache-2.0
// Argument validation of every op of the list (core/op_list.hpp): the fast
// path (validate_slots: every condition at once, no message) and the
// detailed one (check_detailed: the checks one by one, each with its
// message) agree on random arguments around valid ones, built from the op's
// spec: the same acceptance, and for a refusal the same code and message.
// An accepted call's written slots share no byte with another slot (an
// exact check, row by row), in place aside: the overlap check may be
// conservative, never wrong.
// The arguments come from the spec's slots (ranks, shape expressions, dtype
// rules, optional and in-place slots, scalars), so an op added to the list,
// with however many slots, is covered without a line here.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "api/ops_impl.hpp"
#include "api/validate.hpp"
#include "core/op_list.hpp"
#include "ops/specs.hpp"

using namespace dispatch;

namespace {

using core::ArgSlot;
using core::Dim;
using core::OpKind;
using core::OpSpec;

constexpr size_t kRegion = size_t{1} << 20;  // bytes of the buffer per slot: no two slots overlap unless made to
constexpr int kIterations = 20000;           // per op

/// A status as one comparable text: "ok", or its code and message.
std::string text(const Status& s) {
  return s.ok() ? std::string("ok") : std::to_string(static_cast<int>(s.code())) + ": " + s.message();
}

/// One call's arguments: slot i at t[i], the scalars in order.
struct Call {
  TensorRef t[core::kMaxArgs];
  float scalars[core::kMaxScalars] = {};
  bool require_data = true;
  bool changed = false;                               ///< a field was changed after the consistent build
  int64_t dim[core::kDimCount] = {1, 0, 0, 0, 0, 0};  ///< the dims it was built from (by Dim)
};

class Maker {
 public:
  Maker(const OpSpec& s, uint32_t seed) : s_(s), rng_(seed), buf_(kRegion * core::kMaxArgs) {}

  /// Consistent arguments of random dims, dtypes and layouts (possibly
  /// still invalid: a zero size, an injected overlap), then up to three
  /// fields changed.
  Call next() {
    Call c;
    for (int d = 1; d < core::kDimCount; ++d) c.dim[d] = pick({0, 1, 2, 7, 8, 16, 127, 128, 129, 300});
    // Rank-3 slots (an MoE op's [E, 2I, H] weights) hold batch x rows x
    // cols elements: smaller dims keep each inside its slot's region.
    bool rank3 = false;
    for (const ArgSlot& a : s_.slots) rank3 = rank3 || a.rank == 3;
    if (rank3)
      for (int d = 1; d < core::kDimCount; ++d)
        c.dim[d] = d == static_cast<int>(Dim::extra0) ? pick({0, 1, 2, 4}) : pick({0, 1, 2, 7, 8, 16, 127, 128, 129});
    const DType dts[] = {DType::fp32, DType::fp16, DType::bf16, DType::fp8_e4m3fn};
    const DType in = dts[rng_() % 4], out = rng_() % 2 ? in : dts[rng_() % 4];
    const Device dev{rng_() % 4 ? DeviceType::cpu : DeviceType::cuda, 0};
    for (int i = 0; i < s_.slot_count(); ++i) c.t[i] = consistent(i, c, in, out, dev);
    for (int i = 0; i < s_.slot_count(); ++i) {
      const ArgSlot& a = slot(i);
      // absent (block scales: absent with unquantised weights, mostly)
      // (a slot given with another: mostly as that one is, a1_scale's a2_scale)
      const bool absent = a.given_with >= 0 && rng_() % 8 != 0 ? c.t[a.given_with].data == nullptr
                          : a.with_quantized ? (core::is_quantized(in) ? rng_() % 8 == 0 : rng_() % 8 != 0)
                                             : a.optional && rng_() % 2;
      if (absent) c.t[i] = TensorRef{};
      if (a.alias_of >= 0 && rng_() % 3 == 0) {  // in place: exactly the read slot
        const DType own = c.t[i].dtype;
        c.t[i] = c.t[a.alias_of];
        c.t[i].dtype = own;
      }
    }
    if (rng_() % 8 == 0)  // one slot over another (M = 0 skips the overlap checks)
      c.t[rng_() % s_.slot_count()].data = data_of(static_cast<int>(rng_() % s_.slot_count())) + 4 * (rng_() % 16);
    if (rng_() % 8 == 0) side_by_side(c);
    for (size_t j = 0; j < s_.scalars.size(); ++j)  // a size scalar: its dim (moe_align's block_size)
      c.scalars[j] = s_.scalars[j].kind == core::ScalarKind::dim ? static_cast<float>(c.dim[int(s_.scalars[j].dim)])
                                                                 : s_.scalars[j].default_value;
    for (int n = static_cast<int>(rng_() % 4) - 1; n >= 0; --n) change(c);
    c.require_data = rng_() % 4 != 0;
    return c;
  }

 private:
  const ArgSlot& slot(int i) const { return s_.slots[static_cast<size_t>(i)]; }
  unsigned char* data_of(int i) { return buf_.data() + kRegion * static_cast<size_t>(i); }
  int64_t pick(std::initializer_list<int64_t> v) { return *(v.begin() + rng_() % v.size()); }
  static int64_t extent(const Call& c, const core::DimExpr& e) { return e.eval(c.dim); }

  TensorRef consistent(int i, const Call& c, DType in, DType out, Device dev) {
    const ArgSlot& a = slot(i);
    const DType dt = a.dtype == core::SlotDType::in ? in : a.dtype == core::SlotDType::out ? out : a.fixed_dtype;
    unsigned char* data = data_of(i) + 16 * (rng_() % 4);
    if (a.rank == 1)  // a buffer that may be longer: sometimes longer
      return make_tensor_1d(data, dt, extent(c, a.cols) + (a.cols.at_least ? pick({0, 0, 3}) : 0), dev);
    if (a.rank == 3) {
      const int64_t b = extent(c, a.batch), r = extent(c, a.rows), cl = extent(c, a.cols);
      const int64_t ld = cl + pick({0, 0, 0, 1, 8});
      TensorRef t = make_tensor_2d(data, dt, r, cl, ld, dev);
      t.rank = 3;
      t.shape[0] = b, t.shape[1] = r, t.shape[2] = cl;
      t.strides[0] = r * ld + (rng_() % 16 == 0 ? 8 : 0), t.strides[1] = ld,
      t.strides[2] = 1;  // rarely a strided batch
      return t;
    }
    const int64_t rows = extent(c, a.rows), cols = extent(c, a.cols);
    TensorRef t = make_tensor_2d(data, dt, rows, cols, cols + pick({0, 0, 0, 1, 8}), dev);
    if (a.col_major_ok && rng_() % 3 == 0) {  // a transposed view
      t.strides[0] = 1;
      t.strides[1] = rows + pick({0, 0, 4});
    }
    return t;
  }

  // Two 2-D slots in one row stride, slot i at a column offset from slot j:
  // the column halves of one buffer, and near misses by an element or a byte.
  void side_by_side(Call& c) {
    const int i = static_cast<int>(rng_() % s_.slot_count()), j = static_cast<int>(rng_() % s_.slot_count());
    TensorRef &a = c.t[i], &b = c.t[j];
    if (i == j || a.rank != 2 || b.rank != 2 || a.data == nullptr || b.data == nullptr) return;
    const int64_t l = a.shape[1] + b.shape[1] + pick({0, 0, 0, -1, 1});
    if (l < 1) return;
    a.strides[0] = b.strides[0] = l, a.strides[1] = b.strides[1] = 1;
    const int64_t off = (b.shape[1] + pick({0, 0, 0, -1, 1})) * static_cast<int64_t>(core::dtype_bytes(b.dtype));
    a.data = static_cast<unsigned char*>(b.data) + off + pick({0, 0, 0, 1});
  }

  void change(Call& c) {
    c.changed = true;
    if (!s_.scalars.empty() && rng_() % 6 == 0) {
      const float v[] = {0.f, -1.f, 1e-6f, 0.5f, 1.f, 2.f, std::numeric_limits<float>::quiet_NaN()};
      c.scalars[rng_() % s_.scalars.size()] = v[rng_() % 7];
      return;
    }
    TensorRef& t = c.t[rng_() % s_.slot_count()];
    switch (rng_() % 8) {
      case 0: t.rank = static_cast<int32_t>(pick({0, 1, 2, 3})); break;
      case 1: t.shape[rng_() % 3] = pick({-1, 0, 1, 2, 7, 8, 16, 128, 129, int64_t{1} << 41}); break;
      case 2:  // 2^60 and up: strides whose span is past 2^60 elements (refused, never wrapped)
        t.strides[rng_() % 3] = pick({-8, 0, 1, 2, 4, 8, 16, 32, 300, int64_t{1} << 60, int64_t{1} << 62,
                                      std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()});
        break;
      case 3: t.data = rng_() % 2 ? nullptr : data_of(static_cast<int>(rng_() % s_.slot_count())) + rng_() % 256; break;
      case 4: t.dtype = static_cast<DType>(rng_() % kDTypeCount); break;
      case 5:
        t.device = Device{rng_() % 2 ? DeviceType::cpu : DeviceType::cuda, static_cast<int32_t>(rng_() % 2)};
        break;
      case 6: t = TensorRef{}; break;
      default: break;
    }
  }

  const OpSpec& s_;
  std::mt19937 rng_;
  std::vector<unsigned char> buf_;
};

/// The byte ranges [lo, hi) a tensor's elements cover: one per row (a
/// column-major view: per column; rank 1: one), none when empty.
std::vector<std::pair<uintptr_t, uintptr_t>> byte_ranges(const TensorRef& t) {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  const auto e = static_cast<uintptr_t>(core::dtype_bytes(t.dtype));
  if (t.rank == 1) {
    if (t.shape[0] > 0) out.emplace_back(base, base + static_cast<uintptr_t>(t.shape[0]) * e);
    return out;
  }
  const int64_t batch = t.rank == 3 ? t.shape[0] : 1, rows = t.shape[t.rank - 2], cols = t.shape[t.rank - 1];
  if (batch <= 0 || rows <= 0 || cols <= 0) return out;  // empty: its strides are any (never multiplied)
  const bool col_major = t.rank == 2 && cols > 1 && t.strides[1] != 1;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < (col_major ? cols : rows); ++r) {
      const int64_t first = (t.rank == 3 ? b * t.strides[0] : 0) + r * t.strides[col_major ? 1 : t.rank - 2];
      const int64_t n = col_major ? rows : cols;
      if (n > 0)
        out.emplace_back(base + static_cast<uintptr_t>(first) * e, base + static_cast<uintptr_t>(first + n) * e);
    }
  return out;
}

/// Two tensors share a byte (exactly: their rows' ranges, sorted and swept).
bool share_bytes(const TensorRef& a, const TensorRef& b) {
  auto ra = byte_ranges(a), rb = byte_ranges(b);
  std::sort(ra.begin(), ra.end());
  std::sort(rb.begin(), rb.end());
  size_t i = 0, j = 0;
  while (i < ra.size() && j < rb.size()) {
    if (ra[i].first < rb[j].second && rb[j].first < ra[i].second) return true;
    if (ra[i].second < rb[j].second)
      ++i;
    else
      ++j;
  }
  return false;
}

/// An accepted call that writes never writes bytes another slot holds, but
/// in place exactly as its spec allows (alias_of: the same data and row
/// stride).
void check_no_shared_bytes(const OpSpec& s, const Call& c, const core::Problem& p) {
  if (!c.require_data || (p.m == 0 && !s.launches_when_empty)) return;
  for (int i = 0; i < s.slot_count(); ++i) {
    const ArgSlot& a = s.slots[static_cast<size_t>(i)];
    if (c.t[i].data == nullptr || !(a.role == core::Role::write || a.role == core::Role::read_write)) continue;
    for (int j = 0; j < s.slot_count(); ++j) {
      if (j == i || c.t[j].data == nullptr || c.t[j].rank < 1) continue;
      const bool in_place = a.alias_of == j && c.t[i].data == c.t[j].data &&
                            (c.t[j].shape[0] == 1 || c.t[i].strides[0] == c.t[j].strides[0]);
      if (in_place) continue;
      INFO(std::string(s.name), ": ", std::string(a.name), " and ", std::string(s.slots[static_cast<size_t>(j)].name));
      CHECK_FALSE(share_bytes(c.t[i], c.t[j]));
    }
  }
}

/// An accepted call's Problem and LaunchArgs say what the arguments do.
void check_accepted(const OpSpec& s, const Call& c, const core::Problem& p, const core::LaunchArgs& la, bool empty) {
  check_no_shared_bytes(s, c, p);
  CHECK(p.op == s.op);
  CHECK(p.in_dtype == c.t[s.in_dtype_slot].dtype);
  CHECK(p.out_dtype == c.t[s.out_dtype_slot].dtype);
  CHECK(p.device == c.t[s.order[0]].device);
  CHECK(empty == (p.m == 0));
  bool any_optional = false;
  for (int i = 0; i < s.slot_count(); ++i) {
    const ArgSlot& a = s.slots[static_cast<size_t>(i)];
    const bool present = !a.optional || c.t[i].data != nullptr || (!c.require_data && c.t[i].rank == a.rank);
    any_optional = any_optional || (a.optional && present);
    CHECK(la.data[i] == (present ? c.t[i].data : nullptr));
    // Every extent of a present slot is its expression of the Problem's dims.
    if (!present) continue;
    if (a.rank == 3) CHECK(c.t[i].shape[0] == a.batch.value(p));
    if (a.rank >= 2) CHECK(c.t[i].shape[a.rank - 2] == a.rows.value(p));
    if (a.cols.at_least)
      CHECK(c.t[i].shape[0] >= a.cols.value(p));
    else
      CHECK(c.t[i].shape[a.rank - 1] == a.cols.value(p));
  }
  CHECK(p.has_bias == any_optional);
  for (size_t j = 0; j < s.scalars.size(); ++j) CHECK(la.scalar[j] == c.scalars[j]);
  if (!c.changed)  // built from these dims, untouched: the Problem has them
    for (int d = 1; d < core::kDimCount; ++d)
      for (const ArgSlot& a : s.slots)
        if (!a.optional && a.rank >= 2 &&
            ((a.rows.plain() && a.rows.dim == Dim(d)) || (a.cols.plain() && a.cols.dim == Dim(d)) ||
             (a.rank == 3 && a.batch.plain() && a.batch.dim == Dim(d))))
          CHECK(core::dim_value(p, Dim(d)) == c.dim[d]);
}

/// Status of validate_<op> and check_<op>_detailed on the op's args struct
/// holding the call's slots and scalars (a switch as its bool).
using ArgsPaths = std::pair<Status, Status> (*)(const Call& c);

template <OpKind Op>
void fast_and_detailed_agree(ArgsPaths via_args) {
  static constexpr const OpSpec& S = core::OpSpecOf<Op>::value;
  Maker make(S, 1000u + static_cast<uint32_t>(Op));
  int accepted = 0, refused = 0, changed_accepted = 0, bad_argument = 0, bad_device = 0;
  for (int it = 0; it < kIterations; ++it) {
    const Call c = make.next();
    const TensorRef* t[core::kMaxArgs] = {};
    for (int i = 0; i < S.slot_count(); ++i) t[i] = &c.t[i];
    core::Problem p;
    core::LaunchArgs la;
    bool empty = false;
    const Status fast = api::validate_slots<Op>(t, c.scalars, &p, &la, &empty, c.require_data);
    const Status slow = api::check_detailed(S, t, c.scalars, c.require_data);
    INFO(std::string(S.name), " iteration ", it);
    REQUIRE(text(fast) == text(slow));
    // The args struct's entry points: the same two paths, the same answer
    // (the raw one where every switch holds 0 or 1, as a bool does).
    const auto [args_fast, args_slow] = via_args(c);
    REQUIRE(text(args_fast) == text(args_slow));
    bool bools = true;
    for (size_t j = 0; j < S.scalars.size(); ++j)
      if (S.scalars[j].kind == core::ScalarKind::accum)
        bools = bools && (c.scalars[j] == 0.f || c.scalars[j] == 1.f);
      else if (S.scalars[j].kind != core::ScalarKind::real)  // an int member holds whole values only
        bools = bools && c.scalars[j] >= -core::kMaxDimScalar && c.scalars[j] <= core::kMaxDimScalar &&
                c.scalars[j] == std::floor(c.scalars[j]);
    if (bools) REQUIRE(text(args_fast) == text(fast));
    if (fast.ok()) {
      ++accepted;
      changed_accepted += c.changed;
      check_accepted(S, c, p, la, empty);
    } else {
      ++refused;
      CHECK(!fast.message().empty());  // every refusal names what is wrong
      bad_argument += fast.code() == StatusCode::invalid_argument;
      bad_device += fast.code() == StatusCode::unsupported_device;
    }
  }
  INFO(std::string(S.name), ": ", accepted, " accepted (", changed_accepted, " after a change), ", refused, " refused");
  // The random walk both stays on valid arguments and leaves them.
  CHECK(accepted > kIterations / 10);
  CHECK(changed_accepted > 0);
  CHECK(refused > kIterations / 10);
  CHECK(bad_argument > 0);  // among them bad shapes, strides, pointers ...
  CHECK(bad_device > 0);    // ... and slots on two devices
}

/// A scalar as its args member: a float as is, a switch's bool, a choice's
/// or a size's int (a value no int holds: -1, as the generic entry points
/// make it).
template <class T>
T scalar_as(float v) {
  if constexpr (std::is_same_v<T, int32_t>) {
    int32_t m = 0;
    api::set_scalar(m, v);
    return m;
  }
  return static_cast<T>(v);
}

}  // namespace

#define KD_TEST_SLOT(x) &args.x,
#define KD_TEST_SCALAR(x) args.x = scalar_as<decltype(args.x)>(c.scalars[j++]);
#define KD_TEST_AGREE(op, Args, tensors, scalars)                                                 \
  SUBCASE(#op) {                                                                                  \
    fast_and_detailed_agree<OpKind::op>([](const Call& c) {                                       \
      Args args;                                                                                  \
      TensorRef* slots[] = {KD_PP_FOR_EACH(KD_TEST_SLOT, KD_PP_NOTHING, tensors)};                \
      for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); ++i) *slots[i] = c.t[i];           \
      [[maybe_unused]] size_t j = 0;                                                              \
      KD_PP_FOR_EACH(KD_TEST_SCALAR, KD_PP_NOTHING, scalars)                                      \
      core::Problem p;                                                                            \
      core::LaunchArgs la;                                                                        \
      bool empty = false;                                                                         \
      return std::pair<Status, Status>(api::validate_##op(args, &p, &la, &empty, c.require_data), \
                                       api::check_##op##_detailed(args, c.require_data));         \
    });                                                                                           \
  }

TEST_CASE("every op's arguments: the fast and the detailed checks agree (same answer, same code and message)") {
  KDISPATCH_OP_LIST(KD_TEST_AGREE)
}

#undef KD_TEST_AGREE
#undef KD_TEST_SCALAR
#undef KD_TEST_SLOT
