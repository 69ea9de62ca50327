// SPDX-License-Identifier: Apache-2.0
// kdispatch CPU backend — the rows and the list of a vectorised row family
// (cpu_rows.hpp) for one op, written once: per op the fp32 and bf16 vec
// variants, then their references. The list headers (norm_list.hpp,
// silu_list.hpp) declare them with KDISPATCH_CPU_ROWS_LIST, the op's .cpp
// defines them with KDISPATCH_CPU_ROWS_VARIANTS.
#pragma once

#include "core/op.hpp"

/// Declares, in namespace dispatch::cpu, the four rows KDISPATCH_CPU_ROWS_VARIANTS
/// defines for `Op` and `List`, the op's list in priority order: the fp32
/// and bf16 vec variants, then the references.
#define KDISPATCH_CPU_ROWS_LIST(Op, List)                                                               \
  extern const core::VariantDef k##Op##Fp32Vec, k##Op##Bf16Vec, k##Op##Fp32Ref, k##Op##Bf16Ref;         \
  inline constexpr const core::VariantDef* List[] = {&k##Op##Fp32Vec, &k##Op##Bf16Vec, &k##Op##Fp32Ref, \
                                                     &k##Op##Bf16Ref};

/// The four rows of a row family for one op, in namespace dispatch::cpu:
/// k<Op>Fp32Vec / k<Op>Bf16Vec "<NAME>_<dt>__vec" (params VEC_PARAMS,
/// launched by VEC_LAUNCH) and k<Op>Fp32Ref / k<Op>Bf16Ref "<NAME>_<dt>__ref"
/// (kVariantReference, REF_LAUNCH), all checked by CHECK (a
/// RowsProblemCheck).
#define KDISPATCH_CPU_ROWS_VARIANTS(Op, NAME, OP, CHECK, VEC_PARAMS, VEC_LAUNCH, REF_LAUNCH)                \
  KDISPATCH_CPU_ROWS_PAIR(k##Op##Fp32Vec, k##Op##Fp32Ref, NAME "_fp32", OP, DType::fp32, CHECK, VEC_PARAMS, \
                          VEC_LAUNCH, REF_LAUNCH)                                                           \
  KDISPATCH_CPU_ROWS_PAIR(k##Op##Bf16Vec, k##Op##Bf16Ref, NAME "_bf16", OP, DType::bf16, CHECK, VEC_PARAMS, \
                          VEC_LAUNCH, REF_LAUNCH)
#define KDISPATCH_CPU_ROWS_PAIR(Vec, Ref, NAME, OP, DT, CHECK, VEC_PARAMS, VEC_LAUNCH, REF_LAUNCH)           \
  constinit const core::VariantDef Vec{                                                                      \
      NAME "__vec", OP, DeviceType::cpu, DT, VEC_PARAMS, 0, 1, &rows_vec_supports<Vec, CHECK>, VEC_LAUNCH};  \
  constinit const core::VariantDef Ref{                                                                      \
      NAME "__ref", OP, DeviceType::cpu, DT, {}, core::kVariantReference, 1, &rows_ref_supports<Ref, CHECK>, \
      REF_LAUNCH};
