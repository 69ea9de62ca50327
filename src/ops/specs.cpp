// SPDX-License-Identifier: Apache-2.0
// The run-time op list: every spec row, by OpKind.
#include "ops/specs.hpp"

#include <iterator>

namespace dispatch::core {
namespace {

#define KD_SPEC_PTR(name, args, tensors, scalars) &OpSpecOf<OpKind::name>::value,
constexpr const OpSpec* kSpecs[] = {KDISPATCH_OP_LIST(KD_SPEC_PTR)};
#undef KD_SPEC_PTR
static_assert(std::size(kSpecs) == static_cast<size_t>(kOpCount));

// Each row's tensor names in core/op_list.hpp are its spec's slot names, in
// order (the bindings take the names from the list, the layers from the spec).
// A scalar is a switch in the row (KD_SWITCH_<name>) exactly when its
// spec says so.
#define KD_STR(x) #x,
#define KD_SWITCH_BIT(x) KD_PP_IS_SWITCH(x),
#define KD_ROW_NAMES(kd_op, args, tensors, scalars)                                                           \
  static_assert(names_match(OpSpecOf<OpKind::kd_op>::value, {KD_PP_FOR_EACH(KD_STR, KD_PP_NOTHING, tensors)}, \
                            {KD_PP_FOR_EACH(KD_STR, KD_PP_NOTHING, scalars)},                                 \
                            {KD_PP_FOR_EACH(KD_SWITCH_BIT, KD_PP_NOTHING, scalars)}),                         \
                "core/op_list.hpp: the row of " #kd_op " and its spec disagree on argument names or switches");
constexpr bool names_match(const OpSpec& s, std::initializer_list<std::string_view> tensors,
                           std::initializer_list<std::string_view> scalars, std::initializer_list<int> switches) {
  if (tensors.size() != s.slots.size() || scalars.size() != s.scalars.size()) return false;
  size_t i = 0;
  for (std::string_view t : tensors)
    if (s.slots[i++].name != t) return false;
  i = 0;
  for (std::string_view t : scalars)
    if (s.scalars[i++].name != t) return false;
  i = 0;
  for (int sw : switches)
    if ((s.scalars[i++].kind == ScalarKind::accum) != (sw == 1)) return false;
  return s.slots.size() <= static_cast<size_t>(kMaxArgs) && s.scalars.size() <= static_cast<size_t>(kMaxScalars);
}
KDISPATCH_OP_LIST(KD_ROW_NAMES)
#undef KD_ROW_NAMES

// Every 2-D and 3-D slot's extent stays below 2^60 for dims <= 2^40 (a
// plain mul <= 2^19, no formula): api/validate.cpp leaves a size past 2^60
// to the dims' rule, which then must refuse it.
constexpr bool extents_small(const OpSpec& s) {
  for (const ArgSlot& a : s.slots)
    for (const DimExpr* e : {&a.batch, &a.rows, &a.cols})
      if (a.rank >= 2 && (e->fn != nullptr || e->mul > (1 << 19))) return false;
  return true;
}
#define KD_SMALL_EXTENTS(kd_op, args, tensors, scalars)        \
  static_assert(extents_small(OpSpecOf<OpKind::kd_op>::value), \
                "the spec of " #kd_op ": a 2-D or 3-D extent can pass 2^60 (api/validate.cpp's huge_size)");
KDISPATCH_OP_LIST(KD_SMALL_EXTENTS)
#undef KD_SMALL_EXTENTS
#undef KD_SWITCH_BIT
#undef KD_STR

}  // namespace

const OpSpec& spec_of(OpKind op) noexcept { return *kSpecs[static_cast<size_t>(op)]; }

std::span<const OpSpec* const> all_specs() noexcept { return kSpecs; }

const OpSpec* find_spec(std::string_view name) noexcept {
  for (const OpSpec* s : kSpecs)
    if (s->name == name) return s;
  return nullptr;
}

std::string_view arg_name(OpKind op, int slot) noexcept {
  const OpSpec& s = spec_of(op);
  return slot >= 0 && slot < s.slot_count() ? s.slots[static_cast<size_t>(slot)].name : std::string_view{};
}

int arg_count(OpKind op) noexcept { return spec_of(op).slot_count(); }

}  // namespace dispatch::core
