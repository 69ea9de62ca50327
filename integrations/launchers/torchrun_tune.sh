#!/usr/bin/env bash
# kdispatch: every GPU of this host tuning its shard of a shape catalogue,
# one process per GPU started by torchrun (no Python: torchrun only sets
# RANK, WORLD_SIZE and LOCAL_RANK). --shard auto takes shard RANK of
# WORLD_SIZE and tunes on GPU LOCAL_RANK (`--device` is refused if it names
# another). The ranks share one emit dir (concurrent writers are safe: each
# table is updated under a lock, temp file + rename); the merge at the end
# writes the canonical tree.
#
#   KD_SHAPES=grid.csv KD_TUNE_DIR=/tmp/kd-tune integrations/launchers/torchrun_tune.sh
#
# KD_NPROC: processes (default: the GPUs nvidia-smi lists); TORCHRUN: the
# launcher command (default torchrun). Debian's torch 1.13 under Python 3.11
# fails on torchrun's default --redirects/--tee ("'NoneType' object has no
# attribute 'get'"): TORCHRUN="torchrun --redirects 1 --tee 1".
#
# torchrun sets OMP_NUM_THREADS=1 in its processes unless it is set: on the
# CPU backend that value is part of the tuning fingerprint (serve with it).
# Over several hosts: the same command on each with torchrun's --nnodes,
# --node_rank and --rdzv_endpoint instead of --standalone, and KD_TUNE_DIR on
# a shared filesystem (or one dir per host and a merge of them).
set -euo pipefail
: "${KD_SHAPES:?set KD_SHAPES to the shape list}"
: "${KD_TUNE_DIR:?set KD_TUNE_DIR to the emit dir}"
KDISPATCH=${KDISPATCH:-kdispatch}
NPROC=${KD_NPROC:-$( (nvidia-smi -L 2>/dev/null || true) | wc -l)}
[ "$NPROC" -ge 1 ] || { echo "no GPU found: set KD_NPROC" >&2; exit 2; }
${TORCHRUN:-torchrun} --standalone --nproc_per_node="$NPROC" --no_python \
  "$KDISPATCH" tune --shapes "$KD_SHAPES" --op "${KD_OP:-gemm}" --backend "${KD_BACKEND:-cuda}" \
  --emit "$KD_TUNE_DIR/emit" --shard auto ${KD_TUNE_ARGS:-}
"$KDISPATCH" merge --out "$KD_TUNE_DIR/merged" "$KD_TUNE_DIR/emit"
