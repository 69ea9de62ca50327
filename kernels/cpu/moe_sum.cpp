// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — moe_sum variants:
//   out[t, h] = routed_scaling_factor * sum_{j < top_k} input[t, j, h].
//
//   moe_sum_fp32__vec / _bf16__vec   SIMD (cpu_simd.hpp), the row families'
//                                    (vec, unroll) space (cpu_rows.hpp)
//   moe_sum_fp32__ref / _bf16__ref   plain loops (validation baseline)
//
// Every variant starts from choice 0 and adds choices 1 .. top_k-1 in
// order, per element in fp32, then multiplies by the factor in fp32 and
// rounds once to the dtype: the vector lanes, the scalar tail and the
// reference do the same operations in the same order, so they agree bit
// for bit.
#include <cstdint>

#include "cpu/cpu_common.hpp"
#include "cpu/cpu_rows.hpp"
#include "cpu/cpu_simd.hpp"
#include "cpu/moe_sum_list.hpp"
#include "ops/moe_sum.hpp"

namespace dispatch::cpu {

// The model: a streaming pass that reads top_k rows and writes one per
// token, one add per element read: the row families' default over rows of
// hidden (cpu_rows.hpp).
core::Plan moe_sum_default(const core::Problem& p, const DeviceInfo&) noexcept {
  return rows_default(p, core::OpKind::moe_sum, kMoeSumVariants, p.n);
}

namespace {

using namespace core::variant_names;
using namespace simd;

/// One token's view: its top_k input rows and its output row.
template <class T>
struct TokenRows {
  const T* in;  ///< choice 0's row; choice j at in + j * ld
  int64_t ld;   ///< input row stride (elements)
  int64_t top_k;
  T* out;
  float scale;  ///< routed_scaling_factor

  float element(int64_t h) const noexcept {
    float acc = to_float(in[h]);
    for (int64_t j = 1; j < top_k; ++j) acc += to_float(in[j * ld + h]);
    return acc * scale;
  }
};

template <class T>
TokenRows<T> token(const LaunchArgs& a, const Problem& p, int64_t t) noexcept {
  const int64_t ld = a.ld[core::kMoeSumArgInput];
  return {a.ptr<const T>(core::kMoeSumArgInput) + t * p.k * ld, ld, p.k,
          a.ptr<T>(core::kMoeSumArgOut) + t * a.ld[core::kMoeSumArgOut], a.scalar[0]};
}

/// The moe_sum row body (cpu_rows.hpp): U vectors of hidden per step, each
/// summed over the token's choices.
template <class T>
struct MoeSumRows {
  template <int W, int U>
  KDISPATCH_INLINE static void run(const LaunchArgs& a, const Problem& p) {
    using F = typename Vec<W>::F;
    for (int64_t t = 0; t < p.m; ++t) {
      const TokenRows<T> r = token<T>(a, p, t);
      const int64_t tail = for_each_vector<W, U>(p.n, [&](int64_t h, int) KDISPATCH_LAMBDA_INLINE {
        F acc, x;
        vload<W>(acc, r.in + h);
        for (int64_t j = 1; j < r.top_k; ++j) {
          vload<W>(x, r.in + j * r.ld + h);
          acc += x;
        }
        vstore<W>(r.out + h, acc * r.scale);
      });
      for (int64_t h = tail; h < p.n; ++h) store_as(r.out + h, r.element(h));
    }
  }
};

template <class T>
void moe_sum_ref_rows(const LaunchArgs& a, const Problem& p) {
  for (int64_t t = 0; t < p.m; ++t) {
    const TokenRows<T> r = token<T>(a, p, t);
    for (int64_t h = 0; h < p.n; ++h) store_as(r.out + h, r.element(h));
  }
}

constexpr RowsTable kMoeSumF32 = make_rows_table<MoeSumRows<float>>();
constexpr RowsTable kMoeSumBf16 = make_rows_table<MoeSumRows<Bf16>>();

Status moe_sum_check(const VariantDef& v, const Problem& p) noexcept {
  if (Status s = rows_check_op_and_dtype(v, p, "not a moe_sum problem", "input and out must be fp32",
                                         "input and out must be bf16");
      !s.ok())
    return s;
  if (p.n < 1 || p.k < 1) return decline(v, StatusCode::invalid_argument, "hidden and top_k must be >= 1");
  return Status::Ok();
}

/// Ok when the call has rows to write and both pointers; *empty when it has none.
Status moe_sum_ready(const LaunchArgs& a, const Problem& p, bool* empty) noexcept {
  *empty = p.m < 1;
  if (*empty || (a.data[core::kMoeSumArgInput] != nullptr && a.data[core::kMoeSumArgOut] != nullptr))
    return Status::Ok();
  return make_status(StatusCode::invalid_argument, "moe_sum: input and out must not be null");
}

Status moe_sum_vec(const LaunchArgs& a, const Problem& p, const int64_t* prm) {
  bool empty = false;
  if (Status s = moe_sum_ready(a, p, &empty); !s.ok() || empty) return s;
  return run_rows(p.in_dtype == DType::fp32 ? kMoeSumF32 : kMoeSumBf16, prm, a, p,
                  "moe_sum: the plan's vec width needs an ISA this host lacks");
}

Status moe_sum_ref(const LaunchArgs& a, const Problem& p, const int64_t*) {
  bool empty = false;
  if (Status s = moe_sum_ready(a, p, &empty); !s.ok() || empty) return s;
  (p.in_dtype == DType::fp32 ? &moe_sum_ref_rows<float> : &moe_sum_ref_rows<Bf16>)(a, p);
  return Status::Ok();
}

}  // namespace

// The list: fp32 and bf16, vec then ref.
KDISPATCH_CPU_ROWS_VARIANTS(MoeSum, "moe_sum", OpKind::moe_sum, moe_sum_check, kRowsParams, &moe_sum_vec, &moe_sum_ref)

}  // namespace dispatch::cpu
