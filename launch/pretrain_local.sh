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

# Without the venv on PATH there is no launcher: say so, rather than exit 127 with a hint to resume a run that
# never started.
if ! command -v deepspeed >/dev/null 2>&1; then
    echo "$0: no 'deepspeed' command on PATH: activate the venv first (source .venv/bin/activate; 'make install' creates it)" >&2
    exit 2
fi
# --no_local_rank: the rank comes from LOCAL_RANK/RANK in the environment, so argv stays `train ...`.
# --master_port 0 is not accepted by the launcher; pick a free port instead of its fixed default 29500.
PORT="${MASTER_PORT:-$(python -c 'from albert_dist.engine.distributed import free_port; print(free_port())')}"
# Ctrl-C (SIGINT to the terminal's process group) or a SIGTERM to the whole group (`kill -- -PGID`) reaches
# every process: each rank finishes its step, the ranks checkpoint it and exit 75 (a second Ctrl-C aborts them
# at once); DeepSpeed's launch.py also SIGTERMs the ranks and SIGKILLs what is left after 30 s, then exits 1,
# whatever the ranks said. So this script judges by the checkpoint: a new `latest` whose albert_dist.json says
# "reason": "stop" means the ranks stopped after writing it (exit 75); anything else is an interrupt without a
# checkpoint at the stop (exit 128 + the signal: 130 after Ctrl-C). The launcher runs in the background, so
# `wait` returns when a signal comes and the ranks' fate can be awaited (they carry this run's `run_dir=` on
# their command line); a non-interactive shell starts background commands with SIGINT ignored, which spares
# the `deepspeed` runner a KeyboardInterrupt traceback while its ranks save.
LATEST="${RUN_DIR}/checkpoints/latest"
BEFORE="$(cat "${LATEST}" 2>/dev/null || true)"
SIGNAL=""
trap 'SIGNAL=SIGINT' INT
trap 'SIGNAL=SIGTERM' TERM
deepspeed --num_gpus "${NUM_RANKS}" --master_port "${PORT}" --no_local_rank --module albert_dist.cli \
    train --config "${RECIPE}" "run_dir=${RUN_DIR}" "$@" &
LAUNCHER=$!
status=0
wait "${LAUNCHER}" || status=$?
while kill -0 "${LAUNCHER}" 2>/dev/null; do # a trapped signal interrupts `wait`: wait again
    status=0
    wait "${LAUNCHER}" || status=$?
done
# After a signal, or whenever the launcher failed: a signal this shell cannot see (SIGINT ignored when it started,
# as in a script's `setsid launch/pretrain_local.sh ... &`: bash cannot trap it, but the ranks still stop on it)
# leaves ranks saving their stop checkpoint after DeepSpeed's launch.py has exited.
if [[ -n ${SIGNAL} || (${status} -ne 0 && ${status} -ne 2) ]]; then
    ranks_alive() {
        ps -eo args= | awk -v s="-m albert_dist.cli train --config ${RECIPE} run_dir=${RUN_DIR} " \
            '$1 != "awk" && index($0 " ", s) { n++ } END { exit n == 0 }'
    }
    for _ in $(seq 600); do ranks_alive || break; sleep 0.5; done
    ranks_alive && echo "${SIGNAL:-exit ${status}}: the ranks of ${RUN_DIR} are still running after 300 s" >&2
fi
trap - INT TERM
AFTER="$(cat "${LATEST}" 2>/dev/null || true)"
stop_checkpoint() { # the checkpoint $1 was written by a stop signal (albert_dist.json "reason": "stop")
    python -c 'import json, sys; sys.exit(json.load(open(sys.argv[1])).get("reason") != "stop")' \
        "${RUN_DIR}/checkpoints/$1/albert_dist.json" 2>/dev/null
}
if [[ ${status} -ne 0 && ${status} -ne 2 && ${status} -ne 74 && -n ${AFTER} && ${AFTER} != "${BEFORE}" ]] &&
    stop_checkpoint "${AFTER}"; then
    # the ranks stopped on a signal and checkpointed: 75 whether or not this shell saw the signal
    echo "(${SIGNAL:-a stop signal}: every rank stopped after writing checkpoint ${AFTER}; the launcher exited ${status})"
    status=75
elif [[ -n ${SIGNAL} && ${status} -ne 0 && ${status} -ne 2 && ${status} -ne 74 ]]; then
    echo "(${SIGNAL}: no checkpoint was written at the stop (a second Ctrl-C, a signal during start-up, or" \
        "the ranks were killed); newest complete checkpoint: ${AFTER:-none})"
    status=$((128 + $(kill -l "${SIGNAL#SIG}")))
elif ((status > 128)); then
    # DeepSpeed's launch.py exits with a dead rank's return code: -N for signal N, i.e. 256 - N (247 after a
    # kill -9); a shell reports 128 + N.
    signum=$((status > 192 ? 256 - status : status - 128))
    echo "(a rank was killed by signal ${signum} (SIG$(kill -l "${signum}" 2>/dev/null || echo '?'))," \
        "e.g. the kernel's OOM killer (see dmesg) or a kill -9; the launcher exited ${status})"
    status=1
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
2) echo "pretraining did not start: the configuration or an input is wrong, or another job holds the run directory (exit 2, message above)" ;;
13[0-9] | 14[0-3])
    echo "pretraining interrupted (exit ${status}); continue from its last complete checkpoint with:"
    echo "  ${CONTINUE_CMD}"
    echo "outputs in ${OUT}"
    ;;
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
