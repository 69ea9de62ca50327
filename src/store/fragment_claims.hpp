// SPDX-License-Identifier: Apache-2.0
// kdispatch internal — the claims `kdispatch merge --compact` makes of
// fragments, and their recovery (docs/tuning.md#storage-a-cluster-shares,
// "Compacting").
//
// A compaction takes a fragment <key>.json.d/<frag>.json by renaming it to
// the hidden claim ".<frag>.json.compacting-<host>-<pid>" (its host and
// pid: fragment dirs live on filesystems several hosts share), its mtime
// set to now (before the rename, and again after it: a rename keeps the
// fragment's mtime). It removes the claim once it has checked that the claim holds the bytes it merged,
// or puts it back under a name the loader reads. A compaction killed in
// between leaves the claim; nothing else reads a hidden name, so its rows
// would be served by nobody. Recovery: the next fragment write into that
// dir (store::persist_rows) and the next compaction (before it reads the
// dir) take every claim of a compaction of this host that is gone: its pid
// names no process of this host (kill(pid, 0): ESRCH; a pid of any width:
// one over INT_MAX names none), or the claim is older than
// kClaimStaleSeconds by its mtime whatever its pid says (a compaction
// holds a claim for the moments of one table: it sets the mtime when it
// claims; a live pid on an old claim was reused, or is the pid of a CLI in
// a container, often 1). Clocks: the mtime is the file server's, compared
// with this host's clock.
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
// Left alone (left_claims lists them, `kdispatch merge --compact` reports
// them): a claim of another host's compaction, or one named by an older
// build (".<frag>.json.compacting-<pid>", no host): whether its owner is
// alive cannot be told from here; a young claim of a live pid of this host
// (a compaction running now); a claim that is not a regular file (a
// symbolic link, FIFO or directory someone with write access planted):
// never put back under a name the loader reads; and a hidden name with
// ".compacting-" that does not parse as a claim.
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

/// A claim of this host older than this (seconds, by its mtime; or dated
/// that far ahead) is recovered whatever its pid says: a compaction holds
/// one for the moments of one table.
inline constexpr int kClaimStaleSeconds = 60;

/// True when `name` looks like a claim: hidden, with ".compacting-" in it.
bool looks_like_claim(std::string_view name);

/// True when `name` is a claim name (this build's or an older build's: a
/// fragment "<name>.json", then the owner's "<host>-<pid>" or "<pid>", the
/// pid of any width; past LONG_MAX it reads as LONG_MAX); fills *out.
bool parse_compact_claim(std::string_view name, CompactClaim* out);

/// True when `pid` names no process of this host: kill(pid, 0) gives
/// ESRCH, or no process can have it (<= 0, > INT_MAX).
bool local_pid_dead(long pid);

/// What a claim is to the recovery (the header comment).
enum class ClaimVerdict {
  not_a_claim,  ///< not named like a claim (or gone)
  unparsable,   ///< named like one ("." and ".compacting-"), not parsed: left, reported
  not_regular,  ///< a symbolic link, FIFO, directory, ...: left, reported
  foreign,      ///< another host's or an older build's: left, reported
  live,         ///< a live pid of this host, younger than kClaimStaleSeconds: left, reported
  dead,         ///< its pid names no process of this host: recovered
  stale,        ///< its pid runs, but it is older than kClaimStaleSeconds: recovered
};

/// Judges the entry `name` of the open dir `dir_fd` (the file is not
/// followed); *c filled when it parses, *why says why (for reports).
ClaimVerdict judge_claim(int dir_fd, const std::string& name, CompactClaim* c, std::string* why);

/// What recover_dead_claims did with one claim.
struct RecoveredClaim {
  std::string claim;   ///< the claim's name
  long pid = 0;        ///< its compaction's pid
  bool stale = false;  ///< recovered by age (its pid runs), not because its pid is gone
  std::string why;     ///< why it was judged gone (judge_claim)
  bool own = false;    ///< a claim of `own_fragment`: not moved, handed to the caller
  std::string put_as;  ///< the name it now has ("" when own, or when another process recovered it first)
  std::string error;   ///< "" or why it could not be moved (it stays)
};

/// Recovers the claims (regular files only) in the open fragment dir
/// `dir_fd` of a compaction of this host that is gone: ClaimVerdict dead or
/// stale (see the header comment). A claim of `own_fragment` (the caller's
/// own fragment name; "" for none) is not moved: it is returned with an
/// empty put_as, for the caller to merge and remove. Best effort; never
/// throws.
std::vector<RecoveredClaim> recover_dead_claims(int dir_fd, const std::string& own_fragment) noexcept;

/// A claim recover_dead_claims leaves alone.
struct LeftClaim {
  std::string name;
  ClaimVerdict verdict = ClaimVerdict::foreign;
  std::string why;  ///< judge_claim's words
};

/// The entries of the open dir `dir_fd` named like claims that
/// recover_dead_claims leaves alone: unparsable, not a regular file,
/// foreign, live (young). Never throws.
std::vector<LeftClaim> left_claims(int dir_fd) noexcept;

/// "<stem>.unmerged-<host>-<pid>[-i].json" for the fragment `fragment`
/// (stem: its name without ".json"), i = 0, 1, ...: the aside names a
/// compaction puts a claim under.
std::string unmerged_name(std::string_view fragment, std::string_view host, long pid, int i);

/// Puts the claim `claim` of `fragment` in the open dir `dir_fd` back (a
/// regular file only: anything else is left, with *error set): by
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
