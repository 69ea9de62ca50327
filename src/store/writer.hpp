// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — writing tuning results: the same file format the
// loader reads, so a tuning cache or an `--emit` dir can be committed as is.
//
// Safety, in order:
//  - Atomic: write a temp file in the same dir, fsync it, rename it over the
//    target, fsync the dir. A reader sees the old file or the new one,
//    never a torn one.
//  - Merge, never overwrite: several processes (tensor-parallel ranks, two
//    servers sharing a cache dir) writing the same file take an exclusive
//    flock on a side lock file, re-read the current file, merge their rows
//    into it (their row wins on the same M) and write the result. Case C10a.
//  - Where flock is not honoured (store/private_fs.hpp, locking_scheme:
//    checked once per process per dir), each process writes only its own
//    fragment <file>.d/<host>-<pid>.json instead, with the same atomic
//    sequence and no lock; the loader reads a file and its fragments as one
//    table (docs/tuning.md#storage-a-cluster-shares).
//  - Stale rows are dropped on merge: rows of a file whose fingerprint
//    differs from the writer's are not carried over.
//  - Claims: before tuning a (key, M) a process creates a claim file with
//    O_EXCL; others skip that shape and pick up the result from the cache.
//    A claim older than its TTL, or held by a dead process on this host, is
//    taken over.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dispatch/config.hpp"
#include "dispatch/status.hpp"
#include "store/fingerprint.hpp"
#include "store/row_meta.hpp"

namespace dispatch::core {
class JsonWriter;
}

namespace dispatch::store {

/// A config row as a JSON object into `w` ({"variant": ..., params...}),
/// its entries in the Config's order: how the writer and every JSON output
/// of the library spell a Config (api/json_out.hpp).
void config_json(core::JsonWriter& w, const Config& c);

struct PersistRow {
  int64_t m = 0;
  Config config;            ///< {"variant": ..., params...}
  double us = 0.0;          ///< measured median of the winner (0 = unknown)
  double default_us = 0.0;  ///< measured median of the incumbent, the floor (0 = unknown)
  /// How the row was chosen: the margin, the A/A spread, the timing, why,
  /// and on the CPU the CPU it was tuned on (store/row_meta.hpp); carried
  /// over by the merge of an existing file, row by row.
  RowMeta meta;
};

/// The default tuning cache dir: $KDISPATCH_CACHE_DIR, else
/// $XDG_CACHE_HOME/kdispatch, else $HOME/.cache/kdispatch, else the
/// per-user fallback (resolve_cache_dir); "" when that dir is refused.
std::string default_cache_dir();

/// Merges `rows` into <dir>/<rel_path> (creating dirs 0700), atomically
/// and under the file's lock (store/private_fs.hpp): temp file (O_EXCL,
/// never through a link), fsync, rename, fsync of the dir. Under the lock,
/// temp files of dead writers of that file and claims of dead processes of
/// this host are removed; the lock file is removed on the way out.
/// Where `dir`'s scheme is fragments (locking_scheme), the file written is
/// this process's fragment <dir>/<rel_path>.d/<host>-<pid>.json, merged
/// with its own earlier rows, without a lock (one fragment write of this
/// process at a time); temp files there of dead processes of this host are
/// removed. Errors also: invalid_argument for a bad KDISPATCH_CACHE_LOCKING.
/// `schema` lists (variant, schema_version) to record.
/// `*dropped_stale` (optional) is set when the existing file's rows were
/// dropped because its fingerprint differed.
/// `keep_stale` keeps the rows of a file written with another fingerprint
/// (committed-config dirs); by default they are dropped as stale.
/// A file at the target that does not parse as a config table is moved
/// aside to "<file>.corrupt-<UTC time>" and a note appended to `*notes`
/// (optional); it is never silently overwritten.
/// Errors: io_error naming the path (a link or a non-regular file at the
/// target or lock name is refused, never followed).
Status persist_rows(const std::string& dir, const std::string& rel_path, const std::vector<PersistRow>& rows,
                    const Fingerprint& fp, const std::vector<std::pair<std::string, int32_t>>& schema,
                    bool* dropped_stale = nullptr, bool keep_stale = false,
                    std::vector<std::string>* notes = nullptr) noexcept;

/// The JSON text persist_rows writes (deterministic: metadata first, then
/// rows by ascending M). The metadata object "kdispatch": "tool", "schema",
/// "fingerprint", "us" and "default_us" per M, then the rows' RowMeta
/// (store/row_meta.hpp: "margin", "aa_spread", "timing", "why", "cpu").
std::string render_table(const std::vector<PersistRow>& rows, const Fingerprint& fp,
                         const std::vector<std::pair<std::string, int32_t>>& schema);

/// Tries to claim (key, m) in `dir`/.claims. True when this process holds it.
bool try_claim(const std::string& dir, const std::string& key, int64_t m, double ttl_s = 600.0) noexcept;
/// Removes the claims under `dir`/.claims held by processes of this host
/// that no longer exist.
void remove_dead_claims(const std::string& dir) noexcept;
/// Releases a claim taken by try_claim.
void release_claim(const std::string& dir, const std::string& key, int64_t m) noexcept;

}  // namespace dispatch::store
