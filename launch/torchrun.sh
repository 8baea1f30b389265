#!/usr/bin/env bash
# Pretraining started by torchrun (PyTorch's elastic launcher) instead of DeepSpeed's launcher.
#
#   launch/torchrun.sh NPROC_PER_NODE [RECIPE] [key=value ...] [--resume auto]
#
# One node: `launch/torchrun.sh 8` (or 2 CPU processes: `launch/torchrun.sh 2`).
# Several nodes: run the same command on every node with NNODES=<nodes> and RDZV_ENDPOINT=<host:port of one
# node reachable by all>; torchrun's c10d rendezvous assigns node ranks, no ssh needed. RUN_DIR: a run
# directory on a filesystem every node sees (needed with --resume auto).
# torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT for each rank;
# albert_dist.distributed.group reads them (and they win over Slurm variables when torchrun runs in srun).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 || ! $1 =~ ^[0-9]+$ ]]; then
    echo "usage: $0 NPROC_PER_NODE [RECIPE] [key=value ...]" >&2
    exit 2
fi
NPROC=$1
shift
RECIPE=configs/pretrain/albert-tiny-wikitext.yaml
if [[ $# -gt 0 && $1 == *.yaml ]]; then
    RECIPE=$1
    shift
fi
NNODES=${NNODES:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [[ $NNODES == 1 && -z ${RDZV_ENDPOINT:-} ]]; then
    RDZV=(--standalone) # a local rendezvous on a free port
else
    RDZV=(--rdzv-backend=c10d --rdzv-endpoint="${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port for several nodes}"
          --rdzv-id="${RDZV_ID:-albert}")
fi
exec torchrun --nnodes="$NNODES" --nproc-per-node="$NPROC" "${RDZV[@]}" -m albert_dist.cli \
    train --config "$RECIPE" ${RUN_DIR:+"run_dir=$RUN_DIR"} "$@"
