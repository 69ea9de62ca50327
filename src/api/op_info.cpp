// SPDX-License-Identifier: Apache-2.0
// The op list as bindings see it (op_list: every op's slots, scalars, key
// fields and dtypes, from core/op_list.hpp's specs) and plan_source_name.
// Off the call path (api/ops.cpp); api/ops_impl.hpp says how the op files
// divide.
#include <string_view>
#include <vector>

#include "backends/backend.hpp"
#include "backends/registry.hpp"
#include "core/op_spec.hpp"
#include "dispatch/c_api.h"
#include "dispatch/ops.hpp"

namespace dispatch {

static_assert(kMaxOpArgs == core::kMaxArgs && kMaxOpScalars == core::kMaxScalars &&
                  KDISPATCH_MAX_OP_TENSORS == kMaxOpArgs && KDISPATCH_MAX_OP_SCALARS == kMaxOpScalars,
              "ops.hpp's and c_api.h's bounds are the op specs'");

const char* plan_source_name(PlanSource s) noexcept {
  switch (s) {
    case PlanSource::table: return "table";
    case PlanSource::fallback: return "default";
    case PlanSource::forced: return "forced";
  }
  return "?";
}

// ------------------------------------------------------------------ the op list, for bindings

namespace {

std::string_view dim_symbol(const core::OpSpec& s, core::Dim d) noexcept {
  return d == core::Dim::none ? std::string_view() : s.dim_names[static_cast<int>(d)];
}

std::string_view field_kind_name(core::FieldKind k) noexcept {
  switch (k) {
    case core::FieldKind::dim: return "dim";
    case core::FieldKind::in_dtype: return "dtype";
    case core::FieldKind::out_dtype: return "out_dtype";
    case core::FieldKind::flag: return "flag";
    case core::FieldKind::stride: return "stride";
    case core::FieldKind::accum: return "accum";
    case core::FieldKind::choice: return "choice";
  }
  return "?";
}

struct OpListStorage {
  std::vector<std::vector<OpArgInfo>> args;
  std::vector<std::vector<OpScalarInfo>> scalars;
  std::vector<std::vector<OpKeyFieldInfo>> fields;
  std::vector<std::vector<std::string_view>> in_dtypes;
  std::vector<OpInfo> ops;
  OpListStorage() {
    for (const core::OpSpec* s : core::all_specs()) {
      std::vector<OpArgInfo> a;
      for (const core::ArgSlot& slot : s->slots) {
        OpArgInfo i;
        i.name = slot.name;
        i.read = slot.role != core::Role::write;
        i.written = slot.role != core::Role::read;
        i.rank = slot.rank;
        i.optional = slot.optional;
        if (slot.rank == 3) {
          i.batch_dim = dim_symbol(*s, slot.batch.dim);
          i.batch_mul = slot.batch.mul;
          i.batch_div = slot.batch.div;
        }
        if (slot.rank >= 2) {
          i.rows_dim = dim_symbol(*s, slot.rows.dim);
          i.rows_mul = slot.rows.mul;
          i.rows_div = slot.rows.div;
        }
        // A computed extent (DimExpr::fn): its formula in place of a dim.
        i.cols_dim = slot.cols.fn != nullptr ? slot.cols.text : dim_symbol(*s, slot.cols.dim);
        i.cols_computed = slot.cols.fn != nullptr;
        i.at_least = slot.cols.at_least;
        i.cols_mul = slot.cols.mul;
        i.cols_div = slot.cols.div;
        i.alias_of = slot.alias_of;
        i.col_major_ok = slot.col_major_ok;
        i.dtype = slot.dtype == core::SlotDType::in    ? std::string_view("in")
                  : slot.dtype == core::SlotDType::out ? std::string_view("out")
                                                       : dtype_name(slot.fixed_dtype);
        a.push_back(i);
      }
      std::vector<OpScalarInfo> sc;
      for (const core::ScalarSlot& x : s->scalars)
        sc.push_back({x.name, x.default_value,
                      x.kind == core::ScalarKind::accum    ? "bool"
                      : x.kind == core::ScalarKind::choice ? "choice"
                      : x.kind == core::ScalarKind::dim    ? "int"
                                                           : "float",
                      x.labels, x.kind == core::ScalarKind::dim ? dim_symbol(*s, x.dim) : std::string_view()});
      std::vector<OpKeyFieldInfo> f;
      for (const core::KeyField& k : s->fields)
        f.push_back({k.name, field_kind_name(k.kind), k.csv_name.empty() ? k.name : k.csv_name, k.file_pos,
                     k.kind == core::FieldKind::flag ? k.flag_text : std::string_view()});
      args.push_back(std::move(a));
      scalars.push_back(std::move(sc));
      fields.push_back(std::move(f));
      bool seen[kDTypeCount] = {};
      for (const backends::Backend* b : backends::compiled())
        for (const core::VariantDef* v : core::variants_for(s->op, b->type()))
          seen[static_cast<size_t>(v->in_dtype)] = true;
      std::vector<std::string_view> dts;
      for (int t = 0; t < kDTypeCount; ++t)
        if (seen[t]) dts.push_back(dtype_name(static_cast<DType>(t)));
      in_dtypes.push_back(std::move(dts));
    }
    size_t i = 0;
    for (const core::OpSpec* s : core::all_specs()) {
      ops.push_back(
          OpInfo{s->name, s->summary, args[i], scalars[i], s->uses_workspace, fields[i],
                 s->dim_names[static_cast<int>(core::Dim::m)], in_dtypes[i],
                 s->default_out_dtype < 0 ? std::string_view() : dtype_name(static_cast<DType>(s->default_out_dtype))});
      ++i;
    }
  }
};

}  // namespace

std::span<const OpInfo> op_list() noexcept {
  static const OpListStorage storage;
  return storage.ops;
}

}  // namespace dispatch
