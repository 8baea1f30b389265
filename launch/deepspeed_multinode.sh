#!/usr/bin/env bash
# Multi-node pretraining with the DeepSpeed launcher and a hostfile, on machines without Slurm.
#
#   launch/deepspeed_multinode.sh HOSTFILE [RECIPE] [key=value ...] [--resume auto]
#
# HOSTFILE: one line per node, `<host> slots=<GPUs on it>`, the first host holds rank 0 (DeepSpeed's format;
# launch/slurm_hostfile.py writes one from a Slurm node list). RECIPE defaults to the tiny WikiText recipe.
# Two ways to start it:
#   with ssh (DeepSpeed's default, pdsh): run this once, on the first host. Needs `pdsh` and passwordless ssh
#     from it to every host, the same checkout and venv path everywhere; DeepSpeed starts
#     deepspeed.launcher.launch on each host, which forks that host's ranks.
#   without ssh: run this on every host at about the same time with NODE_RANK=0..N-1 (host i of the
#     hostfile gets NODE_RANK=i), e.g. from your cluster's job tool; `--no_ssh` makes each call launch only
#     its own host's ranks.
# Environment: MASTER_ADDR (default: the hostfile's first host; must be reachable from every host),
# MASTER_PORT (default 29500), NODE_RANK (see above), RUN_DIR (run directory on a filesystem every host
# sees; needed with --resume auto; default: runs/<recipe>-<UTC time> chosen by rank 0).
# Rank discovery: the ranks read RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* that DeepSpeed's launcher sets
# (albert_dist.distributed.group). On GPUs, set NCCL variables here or in ~/.deepspeed_env, which the
# ssh mode copies to every host (docs/slurm.md).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $# -lt 1 || ! -f $1 ]]; then
    echo "usage: $0 HOSTFILE [RECIPE] [key=value ...]   (HOSTFILE: '<host> slots=<N>' lines)" >&2
    exit 2
fi
HOSTFILE=$1
shift
RECIPE=configs/pretrain/albert-tiny-wikitext.yaml
if [[ $# -gt 0 && $1 == *.yaml ]]; then
    RECIPE=$1
    shift
fi
MASTER_ADDR=${MASTER_ADDR:-$(awk 'NF && $1 !~ /^#/ {print $1; exit}' "$HOSTFILE")}
MASTER_PORT=${MASTER_PORT:-29500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
TRAIN=(--no_local_rank --module albert_dist.cli train --config "$RECIPE" ${RUN_DIR:+"run_dir=$RUN_DIR"} "$@")

if [[ -n ${NODE_RANK:-} ]]; then
    exec deepspeed --hostfile "$HOSTFILE" --no_ssh --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" \
        --master_port "$MASTER_PORT" "${TRAIN[@]}"
fi
exec deepspeed --hostfile "$HOSTFILE" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "${TRAIN[@]}"
