// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the config store: walks config dirs, reads every
// *.json file, reports every problem per file and keeps going.
//
// File kinds, by where a file sits and what its name holds:
//  - own-op tables: <dir>/<backend>/<op>/<fields>.json with backend in
//    {cpu, cuda, hip} and op in {gemm, rmsnorm, fused_add_rmsnorm}; every
//    row names its "variant";
//  - engine-owned tables read as they are: SGLang/vLLM fused-MoE
//    (E=..,N=..,device_name=..[,dtype=..][,block_shape=[..]][_down]) as op
//    "fused_moe", and dense Triton GEMM tables (N=..,K=..,device_name=..,
//    dtype=..[,block_shape=..]) as op "triton_gemm"; version folders
//    triton_X_Y_Z/ are recognised anywhere in the tree;
//  - anything else (foreign JSON, bad names, unparsable files): skipped
//    and reported.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dispatch/config.hpp"
#include "dispatch/device.hpp"
#include "table/snapshot.hpp"

namespace dispatch::store {

struct SourceDir {
  std::string dir;
  int32_t rank = 0;  ///< 0 = highest precedence
  /// A tuning cache: own-op files must carry a fingerprint equal to this
  /// process's (store/fingerprint.hpp) or they are skipped as stale.
  bool check_fingerprint = false;
};

/// Interns (dir, path relative to dir) into a stable source id (>= 1).
using InternFn = std::function<uint32_t(const std::string& dir, const std::string& rel_path)>;

struct LoadOutput {
  std::vector<table::TableInput> inputs;
  LoadReport report;
};

/// Loads every dir. Never fails: problems land in the report.
LoadOutput load_config_dirs(const std::vector<SourceDir>& dirs,
                            const std::vector<DeviceAlias>& aliases, const InternFn& intern);

/// Documented defaults for engine-owned Triton rows that leave a field out:
/// Triton's own triton.Config defaults.
inline constexpr int64_t kTritonDefaultNumWarps = 4;
inline constexpr int64_t kTritonDefaultNumStages = 3;

}  // namespace dispatch::store
