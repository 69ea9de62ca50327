// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the claims `kdispatch merge --compact` makes of
// fragments, and their recovery (docs/tuning.md#storage-a-cluster-shares,
// "Compacting").
//
// A compaction takes a fragment <key>.json.d/<frag>.json by renaming it to
// the hidden claim ".<frag>.json.compacting-<host>-<pid>" (its host and
// pid: fragment dirs live on filesystems several hosts share). It removes
// the claim once it has checked that the claim holds the bytes it merged,
// or puts it back under a name the loader reads. A compaction killed in
// between leaves the claim; nothing else reads a hidden name, so its rows
// would be served by nobody. Recovery: the next fragment write into that
// dir (store::persist_rows) and the next compaction (before it reads the
// dir) take every claim whose owner is a process of this host that no
// longer exists (kill(pid, 0): ESRCH):
//  - a claim of the recovering writer's own fragment is handed to it: its
//    write merges the claim's rows (under its newer rows) and then removes
//    the claim;
//  - any other claim is put back by link() (never replacing a file; on a
//    filesystem without hard links, by rename to a name found free) under
//    its fragment name when that name is free and the fragment's writer is
//    a process of this host that no longer exists (nobody will write that
//    name again), else as "<frag stem>.unmerged-<host>-<pid>[-i].json"
//    (<host>-<pid> the dead compaction's): a live writer of the fragment
//    could otherwise rename its next file over the put-back one, between
//    its re-read (which saw no file) and its rename, and lose the claim's
//    rows. The loader reads such a file as a fragment; the next compaction
//    merges and removes it.
// A claim of another host's compaction, or one named by an older build
// (".<frag>.json.compacting-<pid>", no host), is left alone: whether its
// owner is alive cannot be told from here. `kdispatch merge --compact`
// reports those.
//
// Compiled into the library (the writer) and into the CLI (merge), which
// links only the exported API: no dependency on other store files.
// Thread-safety: reentrant; no shared state.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dispatch::store {

/// This host's name as kdispatch's file names carry it: gethostname(),
/// '/' replaced by '_', "unknown-host" when there is none.
std::string name_host();

/// The claim name of `fragment` (a file name in a fragment dir) for this
/// process: ".<fragment>.compacting-<host>-<pid>".
std::string compact_claim_name(std::string_view fragment);

/// A claim name, parsed.
struct CompactClaim {
  std::string fragment;  ///< the fragment's name ("<host>-<pid>.json")
  std::string host;      ///< the compaction's host ("" for an older build's claim)
  long pid = 0;          ///< the compaction's pid
};

/// True when `name` is a claim name (this build's or an older build's);
/// fills *out.
bool parse_compact_claim(std::string_view name, CompactClaim* out);

/// True when `pid` names no process of this host (kill(pid, 0): ESRCH).
bool local_pid_dead(long pid);

/// What recover_dead_claims did with one claim.
struct RecoveredClaim {
  std::string claim;   ///< the claim's name
  bool own = false;    ///< a claim of `own_fragment`: not moved, handed to the caller
  std::string put_as;  ///< the name it now has ("" when own, or when another process recovered it first)
  std::string error;   ///< "" or why it could not be moved (it stays)
};

/// Recovers the claims in the open fragment dir `dir_fd` whose owner is a
/// process of this host that no longer exists (see the header comment).
/// A claim of `own_fragment` (the caller's own fragment name; "" for none)
/// is not moved: it is returned with an empty put_as, for the caller to
/// merge and remove. Best effort; never throws.
std::vector<RecoveredClaim> recover_dead_claims(int dir_fd, const std::string& own_fragment) noexcept;

/// The claims in the open dir `dir_fd` that recover_dead_claims leaves
/// alone because their owner cannot be judged from here (another host's,
/// or an older build's claim without a host). Never throws.
std::vector<std::string> foreign_claims(int dir_fd) noexcept;

/// "<stem>.unmerged-<host>-<pid>[-i].json" for the fragment `fragment`
/// (stem: its name without ".json"), i = 0, 1, ...: the aside names a
/// compaction puts a claim under.
std::string unmerged_name(std::string_view fragment, std::string_view host, long pid, int i);

/// Puts the claim `claim` of `fragment` in the open dir `dir_fd` back: by
/// link() under `fragment` when `to_fragment` and that name is free, else
/// under the first free unmerged_name(fragment, host, pid, i); then
/// unlinks the claim. The name used; "" with *error set, or "" with *error
/// empty when the claim is gone (another process recovered it meanwhile).
std::string put_back_claim(int dir_fd, const std::string& claim, const std::string& fragment, bool to_fragment,
                           const std::string& host, long pid, std::string* error);

/// True when the fragment name `fragment` ("<host>-<pid>.json", as
/// fragment_name() makes it) names a writer of this host that no longer
/// exists; false for another host's, a live one's, or another name.
bool fragment_writer_dead(std::string_view fragment);

}  // namespace dispatch::store
