// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — every op's spec row (src/ops/<op>.hpp), and the
// compile-time lookup OpSpecOf<OpKind> the per-op instantiations (the op
// entry points' validation) use; core::spec_of() is the run-time one.
#pragma once

#include "core/op_list.hpp"
#include "core/op_spec.hpp"
#include "ops/fused_add_rmsnorm.hpp"
#include "ops/fused_moe.hpp"
#include "ops/fused_moe_fp8.hpp"
#include "ops/gemm.hpp"
#include "ops/gemm_fp8.hpp"
#include "ops/moe_align.hpp"
#include "ops/moe_gemm.hpp"
#include "ops/moe_gemm_fp8.hpp"
#include "ops/moe_sum.hpp"
#include "ops/quant_fp8.hpp"
#include "ops/rmsnorm.hpp"
#include "ops/silu_and_mul.hpp"

namespace dispatch::core {

/// OpSpecOf<op>::value: the spec row of `op` (`<name>_spec::kSpec`).
template <OpKind Op>
struct OpSpecOf;
#define KD_SPEC_OF(kd_op, args, tensors, scalars)                                              \
  template <>                                                                                  \
  struct OpSpecOf<OpKind::kd_op> {                                                             \
    static constexpr const OpSpec& value = kd_op##_spec::kSpec;                                \
  };                                                                                           \
  static_assert(kd_op##_spec::kSpec.op == OpKind::kd_op && kd_op##_spec::kSpec.name == #kd_op, \
                "src/ops/" #kd_op ".hpp: its spec names another op");
KDISPATCH_OP_LIST(KD_SPEC_OF)
#undef KD_SPEC_OF

}  // namespace dispatch::core
