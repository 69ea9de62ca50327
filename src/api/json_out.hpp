// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — JSON of the public value types, written with
// core::JsonWriter (one writer for every report and --json output).
#pragma once

#include "core/json_write.hpp"
#include "dispatch/config.hpp"

namespace dispatch {

/// A config row as a JSON object, into `w` ({"variant": ..., params...}).
void config_to_json(core::JsonWriter& w, const Config& config);

}  // namespace dispatch
