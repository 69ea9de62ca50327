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
//    "triton_fused_moe" (kTritonFusedMoe; "fused_moe" before 2026-12, a name
//    kdispatch's own MoE op takes), and dense Triton GEMM tables (N=..,K=..,device_name=..,
//    dtype=..[,block_shape=..]) as op "triton_gemm"; version folders
//    triton_X_Y_Z/ are recognised anywhere in the tree;
//  - fragments <file>.json.d/<name>.json (written where flock is not
//    honoured: store/private_fs.hpp): read as the file <file>.json, each
//    reported on its own; a table's rows on one M are served from the
//    first file by path (the main file, then the fragments by name);
//  - anything else (foreign JSON, bad names, unparsable files): skipped
//    and reported.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dispatch/config.hpp"
#include "dispatch/device.hpp"
#include "table/snapshot.hpp"

namespace dispatch::store {

/// The table kinds of the engines' Triton kernels (the op part of their
/// keys: "triton/<kind>|<device_name>|<fields>[|down]").
inline constexpr std::string_view kTritonFusedMoe = "triton_fused_moe";  ///< SGLang/vLLM fused-MoE tables (E=..)
inline constexpr std::string_view kTritonGemm = "triton_gemm";           ///< SGLang's block-fp8 GEMM tables (N=..,K=..)
/// The name lookups gave the fused-MoE tables until 2026-12: for one
/// release a lookup of it with an SGLang key (E=..) answers from
/// kTritonFusedMoe, with a deprecation note in `why`.
inline constexpr std::string_view kDeprecatedFusedMoe = "fused_moe";

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
  /// One per file with usable rows; shared with a FileCache (immutable).
  std::vector<std::shared_ptr<const table::TableInput>> inputs;
  LoadReport report;
  int64_t files_read = 0;    ///< files read and parsed by this load
  int64_t files_reused = 0;  ///< files unchanged since the cached load: not read
  /// Config dirs whose walk stopped at limits().max_entries_per_dir: files
  /// not reached are not in the report (a reload keeps their previous rows).
  std::vector<std::string> incomplete_dirs;
};

/// What a load keeps of each file for the next one (a Runtime's reloads):
/// a file whose device, inode, size, mtime and ctime are unchanged is not
/// read again; its report and rows are reused. A file changed less than
/// limits().racy_ns (2 s) before the load that read it is not cached (a
/// second edit within one timestamp tick, on a filesystem with coarse
/// times, would look unchanged): the next load reads it again.
struct FileCache {
  struct Sig {
    uint64_t dev = 0, ino = 0;
    int64_t size = 0, mtime_ns = 0, ctime_ns = 0;
    uint64_t link_ino = 0;      ///< a symbolic link's own inode (0: not a link)
    int64_t link_ctime_ns = 0;  ///< and its change time
    friend bool operator==(const Sig&, const Sig&) = default;
  };
  struct Entry {
    Sig sig;
    FileReport report;
    std::shared_ptr<const table::TableInput> input;  ///< null for a skipped file
  };
  std::unordered_map<std::string, Entry> files;  ///< key: the file's path, '\n', its dir's rank
};

/// Loads every dir. Never fails: problems land in the report. With `cache`,
/// files unchanged since the load that filled it are reused (and the cache
/// is replaced by this load's files).
LoadOutput load_config_dirs(const std::vector<SourceDir>& dirs, const std::vector<DeviceAlias>& aliases,
                            const InternFn& intern, FileCache* cache = nullptr);

/// The params of `plan`'s variant that an own-op `row` leaves out (they
/// take the variant's defaults): "BLOCK_SIZE_K, pack_b not in the row:
/// <variant>'s defaults serve (BLOCK_SIZE_K=512, pack_b=false)", or "" when
/// the row gives every param. For the load report and lookup's why.
std::string defaulted_params(const core::Plan& plan, const Config& row);

/// Documented defaults for engine-owned Triton rows that leave a field out:
/// Triton's own triton.Config defaults.
inline constexpr int64_t kTritonDefaultNumWarps = 4;
inline constexpr int64_t kTritonDefaultNumStages = 3;

}  // namespace dispatch::store
