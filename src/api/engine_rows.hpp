// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — an engine's tuned rows shaping an own op's default
// (core::EngineRows; issue 35 item 4: SGLang's fused-MoE files drive
// fused_moe).
//
// Where kdispatch has no row of the op's own key for a call (tuned, or in
// configs/), the engine's table for the call's engine key (SGLang's
// E=..,N=..[,block_shape=..,dtype=..] under the device's name) is asked at
// the nearest M, and its row's mapped fields set the default plan's params:
// each to the nearest value the param allows (ties: the smaller), unless the
// variant then declines the call (get_default's plan serves as it is). The
// variant stays get_default's. The answer counts as a default (no memo, the
// tuner still sees a miss), and says which row shaped it.
//
// Used by the op call's miss path (api/ops.cpp choose_full: the key in a
// stack buffer, no allocation unless the variant declines the mapped plan,
// whose message allocates) and by lookup (api/lookup.cpp: the row and the
// mapping in `why`). The op call asks under the device's own name; lookup
// also under the device-name candidates (aliases), as it does for own rows.
// A key longer than kEngineKeyBytes (a device name of ~450 characters) has
// no engine row; lookup says so.
#pragma once

#include <cstddef>
#include <string>

#include "core/op_spec.hpp"
#include "dispatch/config.hpp"
#include "table/snapshot.hpp"

namespace dispatch::api {

/// The longest engine key looked up (backend, table, device name, fields).
inline constexpr size_t kEngineKeyBytes = 512;

/// The engine row found for a call.
struct EngineRowHit {
  const table::Bucket* bucket = nullptr;
  const table::Row* row = nullptr;
  size_t index = 0;  ///< of the row in the bucket (bucket->ms[index]: its M)
};

/// The engine key of `p` on device `device_name` (the canonical spelling of
/// a table key: "NVIDIA_H200") written into buf; returns its length, 0 when
/// the op has no engine rows or the key does not fit.
size_t engine_key(const core::OpSpec& spec, const core::Problem& p, std::string_view device_name, char* buf,
                  size_t cap) noexcept;

/// The row of `snap` for `p` at the nearest M; false when there is none
/// (no engine rows for the op, no such table, M outside a bounded range).
bool find_engine_row(const table::Snapshot& snap, const table::NearestPolicy& policy, const core::OpSpec& spec,
                     const core::Problem& p, std::string_view device_name, EngineRowHit* hit) noexcept;

/// `dflt` (get_default's plan) with the params that spec.engine_rows maps
/// from `row` set; `why`, when not null, gets one "; ..." clause per mapped
/// field (the value served, or why the default's stays). Returns dflt
/// unchanged when nothing maps or the variant declines the mapped plan.
core::Plan shape_by_engine_row(const core::OpSpec& spec, const core::Plan& dflt, const Config& row,
                               const core::Problem& p, const DeviceInfo& dev, std::string* why) noexcept;

}  // namespace dispatch::api
