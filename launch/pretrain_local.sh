#!/usr/bin/env bash
# Pretrain albert-tiny on the bundled WikiText-2 sample with the deepspeed launcher on this machine
# (`make pretrain`). Usage:
#   launch/pretrain_local.sh [NUM_RANKS=2] [RECIPE=configs/pretrain/albert-tiny-wikitext.yaml] [key=value ...]
#   (e.g. `launch/pretrain_local.sh 2 max_steps=50`; a recipe is recognised by its .yaml suffix)
# On a GPU machine NUM_RANKS GPUs are used (nccl); without GPUs DeepSpeed's CPU accelerator starts NUM_RANKS
# CPU processes (gloo), each with one torch thread unless OMP_NUM_THREADS says otherwise.
# Outputs: runs/<recipe>-<UTC time>/ (config.yaml, ds_config.json, metrics.jsonl, checkpoints/); the path is
# printed at the end. Set RUN_DIR=... to choose it (and add --resume auto to continue an interrupted run).
set -euo pipefail
cd "$(dirname "$0")/.."

# Both positionals are optional and recognised by their form (as in launch/torchrun.sh), so
# `launch/pretrain_local.sh 2 max_steps=50` keeps the default recipe instead of taking the override as one.
NUM_RANKS=2
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
    NUM_RANKS=$1
    shift
elif [[ $# -gt 0 && ( $1 == -h || $1 == --help ) ]]; then
    echo "usage: $0 [NUM_RANKS=2] [RECIPE.yaml] [key=value ...] [--resume auto]" >&2
    exit 0
fi
RECIPE=configs/pretrain/albert-tiny-wikitext.yaml
if [[ $# -gt 0 && $1 == *.yaml ]]; then
    RECIPE=$1
    shift
fi
RUN_DIR="${RUN_DIR:-runs/$(basename "${RECIPE}" .yaml)-$(date -u +%Y%m%d-%H%M%S)}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

# --no_local_rank: the rank comes from LOCAL_RANK/RANK in the environment, so argv stays `train ...`.
# --master_port 0 is not accepted by the launcher; pick a free port instead of its fixed default 29500.
PORT="${MASTER_PORT:-$(python -c 'from albert_dist.engine.distributed import free_port; print(free_port())')}"
# Ctrl-C (SIGINT to the terminal's process group) or a SIGTERM to the whole group (`kill -- -PGID`) reaches
# the ranks too (on SIGTERM they finish their step, checkpoint and exit 75; SIGINT interrupts them, the last
# interval checkpoint stays), but `deepspeed`'s runner exits at once (130 or 143). The shell notes the signal instead of dying with it (SIGTERM) or calling it a failure, waits for the
# ranks (they carry this run's `run_dir=` on their command line) and then prints the command that continues.
SIGNAL=""
trap 'SIGNAL=SIGINT' INT
trap 'SIGNAL=SIGTERM' TERM
set +e
deepspeed --num_gpus "${NUM_RANKS}" --master_port "${PORT}" --no_local_rank --module albert_dist.cli \
    train --config "${RECIPE}" "run_dir=${RUN_DIR}" "$@"
status=$?
set -e
if [[ -n ${SIGNAL} ]]; then
    ranks_alive() {
        ps -eo args= | awk -v s="-m albert_dist.cli train --config ${RECIPE} run_dir=${RUN_DIR} " \
            '$1 != "awk" && index($0 " ", s) { n++ } END { exit n == 0 }'
    }
    for _ in $(seq 600); do ranks_alive || break; sleep 0.5; done
    ranks_alive && echo "${SIGNAL}: the ranks of ${RUN_DIR} are still running after 300 s" >&2
fi
trap - INT TERM
if [[ -n ${SIGNAL} && ${status} -ne 0 && ${status} -ne 2 && -f ${RUN_DIR}/checkpoints/latest ]]; then
    echo "(${SIGNAL} received, the launcher exited ${status}; newest complete checkpoint: $(cat "${RUN_DIR}/checkpoints/latest"))"
    status=75
fi
OUT="$(realpath -m "${RUN_DIR}")"
# The command that continues this run: same ranks, recipe and overrides, the same RUN_DIR, --resume auto
# (added once). Words other than plain ones are single-quoted (as Python's shlex.quote does), so the line
# pastes back into a shell unchanged.
quote() {
    if [[ $1 =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
CONTINUE=(launch/pretrain_local.sh "${NUM_RANKS}" "${RECIPE}" "$@")
[[ " $* " == *" --resume auto "* || " $* " == *" --resume=auto "* ]] || CONTINUE+=(--resume auto)
CONTINUE_CMD="RUN_DIR=$(quote "${RUN_DIR}")"
for word in "${CONTINUE[@]}"; do CONTINUE_CMD+=" $(quote "${word}")"; done
echo
case "${status}" in
0) echo "pretraining finished; outputs in ${OUT}" ;;
75)
    echo "pretraining stopped by a signal after writing a checkpoint (exit 75); continue with:"
    echo "  ${CONTINUE_CMD}"
    echo "outputs in ${OUT}"
    ;;
2) echo "pretraining did not start: the configuration or an input is wrong (exit 2, message above)" ;;
*)
    echo "pretraining failed (exit ${status}); outputs in ${OUT}"
    echo "  after fixing the cause, continue from its last complete checkpoint with:"
    echo "  ${CONTINUE_CMD}"
    ;;
esac
if [ "${status}" -eq 2 ]; then exit 2; fi
echo "  config.yaml, ds_config.json: the resolved config and the DeepSpeed config"
echo "  metrics.jsonl: one JSON record per logged step (train and val_* metrics)"
echo "  checkpoints/: DeepSpeed checkpoints, 'latest' names the newest complete one"
exit "${status}"
