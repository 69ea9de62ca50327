#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Writer-safety attacks from another uid (issue 17). Runs as root, as CI
# does; the attacker is uid/gid 65534 (setpriv, util-linux). Exit 77 (ctest:
# skipped) when not root or without setpriv.
#
#  1. The per-user fallback (no KDISPATCH_CACHE_DIR, XDG_CACHE_HOME, HOME)
#     pre-created by the attacker in a sticky world-writable TMPDIR, holding
#     planted rows with this build's fingerprint: refused, said in the report
#     with the dir and why; no planted row served; nothing written there.
#  2. The fallback name is the attacker's symbolic link to a dir of theirs:
#     refused; nothing written through it.
#  3. The fallback is ours: created 0700, used.
#  4. A dir named with --cache-dir that the attacker created first (0755,
#     planted rows): refused, no planted row served.
#  5. A shared, group-writable cache dir (KDISPATCH_CACHE_DIR; the attacker is
#     in the group): links planted at the file, lock and old temp names and a
#     link in place of an op dir, all to a root-owned 0600 file or a root-only
#     dir. Every write that would go through one fails naming it; the victims
#     are untouched; writes elsewhere in the dir still work.
# Usage: hostile_uid.sh <kdispatch CLI>
set -uo pipefail
kd=${1:?usage: hostile_uid.sh <kdispatch CLI>}
if [ "$(id -u)" -ne 0 ] || ! command -v setpriv >/dev/null; then
  echo "hostile_uid.sh: needs root and setpriv (util-linux): skipped"
  exit 77
fi
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }
root=$(mktemp -d /tmp/kdispatch-hostile-XXXXXX)
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"
tmp=$root/tmp && mkdir "$tmp" && chmod 1777 "$tmp"          # a /tmp of our own
fallback=$tmp/kdispatch-0
victim_dir=$root/victim && mkdir -m 0700 "$victim_dir"
victim=$victim_dir/secret && echo "root's secret" > "$victim" && chmod 0600 "$victim"
shapes=$root/shapes.csv && printf 'M,hidden\n1,896\n2,896\n' > "$shapes" && chmod 0644 "$shapes"
trace=$root/trace.txt && echo 1 > "$trace" && chmod 0644 "$trace"
fails=0 checks=0
check() {  # check <description> <command...>
  checks=$((checks + 1))
  if "${@:2}"; then echo "  ok   $1"; else echo "  FAIL $1"; fails=$((fails + 1)); fi
}
fallback_env=(env -u KDISPATCH_CACHE_DIR -u XDG_CACHE_HOME -u HOME -u XDG_RUNTIME_DIR TMPDIR="$tmp")
state() { (cd "$1" && find . -printf '%p %u %m %s\n' | sort && find . -type f -exec sha256sum {} + | sort); }
victims_intact() {
  [ "$(cat "$victim")" = "root's secret" ] && [ "$(stat -c %a "$victim")" = 600 ] &&
    [ "$(ls -A "$victim_dir")" = secret ]
}
json_field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# A legit cache file of this build (planted rows must look real).
"$kd" tune --shapes "$shapes" --op rmsnorm --dtype bf16 --emit "$root/legit" --budget-ms 5 --no-cold-cache \
  >/dev/null 2>&1
legit=$(find "$root/legit" -name '*.json' | head -1)
[ -n "$legit" ] || { echo "could not make a cache file to plant"; exit 1; }
chmod -R a+rX "$root/legit"
rel=${legit#"$root/legit/"}

echo "case 1: fallback dir pre-created by uid 65534 with planted rows"
as_nobody mkdir -m 0755 "$fallback"
as_nobody mkdir -p "$fallback/$(dirname "$rel")"
as_nobody cp "$legit" "$fallback/$rel"
before=$(state "$fallback")
"${fallback_env[@]}" "$kd" replay --trace "$trace" --steps 1 --no-shipped-configs --json >"$root/r1.json" 2>"$root/r1.err"
check "replay exits 0" [ $? -eq 0 ]
check "cache dir not used" [ "$(json_field "$root/r1.json" 'd["cache_dir"]')" = "" ]
check "no config file loaded from it" [ "$(json_field "$root/r1.json" 'd["config_files"]')" = 0 ]
check "no planted row served (rmsnorm hits 0)" [ "$(json_field "$root/r1.json" 'd["ops"]["rmsnorm"]["hits"]')" = 0 ]
# Control: the planted file is valid: given as a config dir (--configs, read as given) it serves.
"$kd" replay --trace "$trace" --steps 1 --no-shipped-configs --configs "$fallback" --json >"$root/r0.json" 2>/dev/null
check "control: the same dir given with --configs serves the planted row (rmsnorm hits 1)" \
  [ "$(json_field "$root/r0.json" 'd["ops"]["rmsnorm"]["hits"]')" = 1 ]
note=$(json_field "$root/r1.json" 'd["load_notes"][0]')
check "the report names the dir and why: $note" \
  grep -q "tuning cache dir '$fallback' (the per-user fallback.*refused: it is owned by uid 65534, not by this process (uid 0)" <<<"$note"
check "stderr says so too" grep -q "refused: it is owned by uid 65534" "$root/r1.err"
"${fallback_env[@]}" "$kd" replay --tune sync --trace "$trace" --steps 1 --no-shipped-configs --budget-ms 5 \
  --no-cold-cache >/dev/null 2>&1
check "tuning still runs (exit 0)" [ $? -eq 0 ]
check "nothing written into the attacker's dir" [ "$(state "$fallback")" = "$before" ]

echo "case 2: the fallback name is uid 65534's symbolic link"
rm -rf "$fallback"
as_nobody mkdir -m 0777 "$tmp/theirs"
as_nobody ln -s "$tmp/theirs" "$fallback"
"${fallback_env[@]}" "$kd" replay --tune sync --trace "$trace" --steps 1 --no-shipped-configs --budget-ms 5 \
  --no-cold-cache --json >"$root/r2.json" 2>/dev/null
note=$(json_field "$root/r2.json" 'd["load_notes"][0]')
check "refused: $note" grep -q "tuning cache dir '$fallback'.*refused: it is a symbolic link" <<<"$note"
check "nothing written through it" [ -z "$(ls -A "$tmp/theirs")" ]
as_nobody rm -f "$fallback"

echo "case 3: the fallback is ours: created 0700, used"
"${fallback_env[@]}" "$kd" replay --tune sync --trace "$trace" --steps 1 --no-shipped-configs --budget-ms 5 \
  --no-cold-cache --json >"$root/r3.json" 2>/dev/null
check "cache dir is $fallback" [ "$(json_field "$root/r3.json" 'd["cache_dir"]')" = "$fallback" ]
check "mode 0700, owned by root" [ "$(stat -c '%a %u' "$fallback")" = "700 0" ]
check "tuned rows written there" [ -f "$fallback/$rel" ]

echo "case 4: --cache-dir names a dir in /tmp that uid 65534 created first (0755, planted rows)"
taken=$tmp/kd-cache
as_nobody mkdir -p -m 0755 "$taken/$(dirname "$rel")"
as_nobody cp "$legit" "$taken/$rel"
"$kd" replay --trace "$trace" --steps 1 --no-shipped-configs --cache-dir "$taken" --json >"$root/r5.json" 2>/dev/null
note=$(json_field "$root/r5.json" 'd["load_notes"][0]')
check "refused: $note" grep -q "tuning cache dir '$taken' (from tune.cache_dir) refused: it is owned by uid 65534" <<<"$note"
check "no planted row served (rmsnorm hits 0)" [ "$(json_field "$root/r5.json" 'd["ops"]["rmsnorm"]["hits"]')" = 0 ]

echo "case 5: a shared group-writable dir, links planted by a group member (uid 65534)"
shared=$root/shared && mkdir "$shared" && chgrp 65534 "$shared" && chmod 2770 "$shared"
mkdir -p "$shared/cpu/rmsnorm" && chgrp -R 65534 "$shared/cpu" && chmod -R 2770 "$shared/cpu"
name=$(basename "$rel")
as_nobody ln -s "$victim" "$shared/cpu/rmsnorm/$name"                       # the file itself
for p in $(seq $(( $$ - 50 )) $(( $$ + 400 ))); do                            # the old predictable temp names
  as_nobody ln -s "$victim" "$shared/cpu/rmsnorm/.$name.tmp.$p" 2>/dev/null || true
done 2>/dev/null
as_nobody ln -s "$victim_dir" "$shared/cpu/fused_add_rmsnorm"               # an op dir
KDISPATCH_CACHE_DIR=$shared "$kd" tune --shapes "$shapes" --op rmsnorm --dtype bf16 --emit "$shared" \
  --budget-ms 5 --no-cold-cache >"$root/t4.out" 2>&1
check "tune --emit rmsnorm fails (exit 1)" [ $? -eq 1 ]
check "the message names the link" \
  grep -q "'$shared/cpu/rmsnorm/$name' is a symbolic link: tuning results are not written through it" "$root/t4.out"
KDISPATCH_CACHE_DIR=$shared KDISPATCH_LOG_LEVEL=warn "$kd" replay --tune sync --trace "$trace" --steps 1 \
  --no-shipped-configs --budget-ms 5 --no-cold-cache >/dev/null 2>"$root/r4.err"
check "replay --tune sync: the op dir link named" \
  grep -q "could not persist it: '$shared/cpu/fused_add_rmsnorm' is a symbolic link" "$root/r4.err"
check "replay --tune sync: gemm rows written beside them" \
  [ "$(find "$shared/cpu/gemm" -name '*.json' | wc -l)" -ge 1 ]
rm -f "$shared/cpu/rmsnorm/$name"
as_nobody ln -s "$victim" "$shared/cpu/rmsnorm/.$name.lock"                 # the lock file
"$kd" tune --shapes "$shapes" --op rmsnorm --dtype bf16 --emit "$shared" --budget-ms 5 --no-cold-cache \
  >"$root/t5.out" 2>&1
check "a link at the lock name: fails naming it" \
  grep -q "cannot open lock file '$shared/cpu/rmsnorm/.$name.lock': it is a symbolic link (not followed)" "$root/t5.out"
check "victims untouched (content, mode 0600, nothing added beside them)" victims_intact
echo "hostile_uid.sh: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
