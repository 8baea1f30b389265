#!/usr/bin/env bash
# Pretrain albert-tiny on the bundled WikiText-2 sample with the deepspeed launcher on this machine
# (`make pretrain`). Usage:
#   launch/pretrain_local.sh [NUM_RANKS=2] [RECIPE=configs/pretrain/albert-tiny-wikitext.yaml] [key=value ...]
#       [--max-restarts N]
#   (e.g. `launch/pretrain_local.sh 2 max_steps=50`; a recipe is recognised by its .yaml suffix)
# On a GPU machine NUM_RANKS GPUs are used (nccl); without GPUs DeepSpeed's CPU accelerator starts NUM_RANKS
# CPU processes (gloo), each with one torch thread unless OMP_NUM_THREADS says otherwise.
# Outputs: runs/<recipe>-<UTC time>/ (config.yaml, ds_config.json, metrics.jsonl, checkpoints/); the path is
# printed at the end. Set RUN_DIR=... or run_dir=... to choose it (and add --resume auto to continue an
# interrupted run); the automatic name is reserved with mkdir, so two runs started in the same second get <name>
# and <name>-2 (as `albert-dist train` without run_dir=). Both are relative to the checkout, where this script runs.
# Exit codes (README): 0 trained to max_steps (the run's newest checkpoint says so: the launcher's 0 alone is not
# trusted), 1 crash or a rank killed, 2 bad config / run directory in use, 74 checkpoint not written, 75 stopped
# by a signal after a checkpoint, or by an object store that stayed unavailable (data.store_retry_s; the line says
# which, from the checkpoint's stop_cause; the command to continue is printed), 78 a training file or object is gone
# (after a checkpoint for an object-store source), 77 training diverged (no final model; checkpoints/latest names
# the newest healthy checkpoint), 76 a rank stopped making progress (the hang watchdog's line is repeated, the
# command to continue printed), 130 (128 + N) interrupted, nothing saved at the stop.
# --max-restarts N (default 0): after a crash or a rank killed (exit 1), a hang (76) or the ranks' stop on an object
# store that stayed unavailable (75, the checkpoint's stop_cause "store"), start again in place with
# `--resume auto`, at most N times, unless the attempt recorded no step past the one it started from
# (`albert-dist goodput RUN_DIR --json`: a crash in start-up would only repeat). Each attempt's launch and exit are
# recorded in RUN_DIR/goodput.jsonl; the run's goodput is printed at the end.
set -euo pipefail
# Started with SIGINT ignored (`setsid launch/pretrain_local.sh ... &` from a script: a non-interactive shell's
# background job), bash could not trap it, so this script would not know a `kill -INT -PGID` had come. Run again
# once with SIGINT at its default; the ranks install their own handler whatever their parent ignores.
if [[ $(trap -p INT) == *"''"* && -z ${ALBERT_DIST_SIGINT_RESET:-} ]] && command -v python >/dev/null 2>&1; then
    export ALBERT_DIST_SIGINT_RESET=1
    exec python -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp("bash", ["bash", *sys.argv[1:]])' "$0" "$@"
fi
unset ALBERT_DIST_SIGINT_RESET
cd "$(dirname "$0")/.."

# --max-restarts N, anywhere on the command line (taken out of the arguments the ranks get)
MAX_RESTARTS=0
ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --max-restarts) MAX_RESTARTS=${2-}; shift $(($# > 1 ? 2 : 1)) ;;
    --max-restarts=*) MAX_RESTARTS=${1#*=}; shift ;;
    *) ARGS+=("$1"); shift ;;
    esac
done
set -- ${ARGS[@]+"${ARGS[@]}"}
if ! [[ ${MAX_RESTARTS} =~ ^[0-9]+$ ]]; then
    echo "$0: --max-restarts=${MAX_RESTARTS}: expected a whole number of restarts >= 0" >&2
    exit 2
fi
RESTARTED=${ALBERT_RESTARTED:-0} # restarts done by this script so far (set when it starts itself again)
unset ALBERT_RESTARTED

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
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

# Without the venv on PATH there is no launcher: say so, rather than exit 127 with a hint to resume a run that
# never started.
if ! command -v deepspeed >/dev/null 2>&1; then
    echo "$0: no 'deepspeed' command on PATH: activate the venv first (source .venv/bin/activate; 'make install' creates it)" >&2
    exit 2
fi
# The run directory the ranks will use, as they resolve it (a `run_dir=` override, else RUN_DIR, else the
# recipe's run_dir), or a new runs/<recipe>-<UTC time>[-k] reserved with mkdir as their rank 0 would name it:
# `albert-dist train --print-run-dir`, the one home of the rule. This script judges that directory and passes it
# on; a config that does not load is refused here, its one line printed once (exit 2).
RUN_DIR_ARGS=(${RUN_DIR:+"run_dir=${RUN_DIR}"} "$@")
RESOLVED=$(python -m albert_dist.cli train --config "${RECIPE}" "${RUN_DIR_ARGS[@]}" --print-run-dir auto) || exit
RUN_DIR=${RESOLVED%%$'\n'*}
RESERVED=""
[[ ${RESOLVED} == *$'\n'new ]] && RESERVED=1
# --no_local_rank: the rank comes from LOCAL_RANK/RANK in the environment, so argv stays `train ...`.
# --master_port 0 is not accepted by the launcher; pick a free port instead of its fixed default 29500.
PORT="${MASTER_PORT:-$(python -c 'from albert_dist.distributed.env import free_port; print(free_port())')}"
# Ctrl-C (SIGINT to the terminal's process group) or a SIGTERM to the whole group (`kill -- -PGID`) reaches
# every process: each rank finishes its step, the ranks checkpoint it and exit 75 (a second Ctrl-C aborts them
# at once). DeepSpeed's launch.py also SIGTERMs the ranks and SIGKILLs what is left after 30 s, then exits 1,
# whatever the ranks said; and when launch.py itself dies of a signal, the `deepspeed` runner exits 0. So this
# script judges by what the ranks left, never by the launcher's status alone: a new newest checkpoint whose
# albert_dist.json says "reason": "stop" means the ranks stopped after writing it (exit 75); 0 only when the
# newest checkpoint is at the run's max_steps (every finished run writes one there); an interrupt otherwise
# (exit 128 + the signal: 130 after Ctrl-C). The launcher runs in the background, so `wait` returns when a
# signal comes and the ranks' fate can be awaited (they carry this run's `run_dir=` on their command line); a
# non-interactive shell starts background commands with SIGINT ignored, which spares the `deepspeed` runner a
# KeyboardInterrupt traceback while its ranks save.
newest_checkpoint() { # the run's newest complete checkpoint: its path, reason, step, max_steps, stop cause, one a line;
    # with --any, the name of its newest step directory, complete or not (a save cut short leaves one)
    python -m albert_dist.runs.newest "${RUN_DIR}" ${1:+"$1"} 2>/dev/null || true
}
# The line of a hang report the ranks' watchdog wrote during this launch (<run dir>/watchdog/<job>/hang.json,
# albert_dist.job.watchdog): the launcher's own status then is the live ranks' 76, or a stopped rank's SIGKILL.
hang_line() {
    python - "${RUN_DIR}" "${STARTED}" 2>/dev/null <<'PY' || true
import json, sys
from pathlib import Path
found = [p for p in Path(sys.argv[1]).glob("watchdog/*/hang.json") if p.stat().st_mtime >= float(sys.argv[2])]
if found:
    print(json.loads(max(found, key=lambda p: p.stat().st_mtime).read_text())["line"])
PY
}
mapfile -t BEFORE < <(newest_checkpoint)
STARTED=$(date +%s)
SIGNAL=""
trap 'SIGNAL=SIGINT' INT
trap 'SIGNAL=SIGTERM' TERM
ALBERT_LAUNCH_TIME=$(date +%s.%N) # this attempt's start, for the run's goodput (albert_dist.tracking.goodput)
export ALBERT_LAUNCH_TIME
deepspeed --num_gpus "${NUM_RANKS}" --master_port "${PORT}" --no_local_rank --module albert_dist.cli \
    train --config "${RECIPE}" "run_dir=${RUN_DIR}" "$@" &
LAUNCHER=$!
status=0
wait "${LAUNCHER}" || status=$?
while kill -0 "${LAUNCHER}" 2>/dev/null; do # a trapped signal interrupts `wait`: wait again
    status=0
    wait "${LAUNCHER}" || status=$?
done
# Whatever the launcher said: a signal this shell did not see, or launch.py dying of one (the runner then exits
# 0), can leave ranks saving their stop checkpoint after the launcher has exited. With none left this is one ps.
ranks_alive() {
    ps -eo args= | awk -v s="-m albert_dist.cli train --config ${RECIPE} run_dir=${RUN_DIR} " \
        '$1 != "awk" && index($0 " ", s) { n++ } END { exit n == 0 }'
}
# Not after exit 2: the ranks refused the job before any process group (nothing to save), and ranks with this
# run_dir on their command line are then another job's, the one holding the run directory.
if [[ ${status} -ne 2 ]]; then
    for _ in $(seq 600); do ranks_alive || break; sleep 0.5; done
    ranks_alive && echo "${SIGNAL:-exit ${status}}: the ranks of ${RUN_DIR} are still running after 300 s" >&2
fi
trap - INT TERM
mapfile -t AFTER < <(newest_checkpoint)
NEWEST="$(basename "${AFTER[0]:-none}")"
# A save cut short (a hang or a kill in the first one) leaves an incomplete step directory and no `latest`: the
# ranks refuse a run_dir holding one without --resume (exit 2), and --resume auto skips it and starts from step 0.
LEFT="$(newest_checkpoint --any)"
[[ -z ${AFTER[0]:-} && -n ${LEFT} ]] && NEWEST="none; ${LEFT} is incomplete"
NEW_CHECKPOINT=""
[[ -n ${AFTER[0]:-} && ${AFTER[0]} != "${BEFORE[0]:-}" ]] && NEW_CHECKPOINT=1
finished() { # the newest checkpoint is at the run's max_steps
    [[ ${AFTER[2]:-} =~ ^[0-9]+$ && ${AFTER[3]:-} =~ ^[0-9]+$ ]] && ((AFTER[2] >= AFTER[3]))
}
# the signal: the one this shell trapped, else SIGINT (the documented "interrupted" code, 130)
interrupted_status() { if [[ -n ${SIGNAL} ]]; then echo $((128 + $(kill -l "${SIGNAL#SIG}"))); else echo 130; fi; }
HANG=$(hang_line)
if [[ ${status} -eq 2 || ${status} -eq 74 || ${status} -eq 77 || ${status} -eq 78 ]]; then
    : # the trainer's own codes: did not start / a checkpoint could not be written / diverged / an input file is gone
    # (its stop checkpoint is not a signal's)
elif [[ -n ${HANG} ]]; then
    # the watchdog ended the live ranks (76); launch.py then ended a stopped one (SIGKILL 30 s after SIGTERM)
    echo "(${HANG}; the launcher exited ${status})"
    status=76
elif [[ -n ${NEW_CHECKPOINT} && ${AFTER[1]:-} == stop ]]; then
    # the ranks stopped on a signal and checkpointed: 75 whether or not this shell saw the signal, whatever the
    # launcher said (1 from launch.py's own signal handler, 0 from the runner when launch.py died of one)
    if [[ ${AFTER[4]:-} == store ]]; then # the stop's cause, as the checkpoint records it
        echo "(the object store stayed unavailable for data.store_retry_s (the ranks' log names the URL): every rank" \
            "stopped after writing checkpoint ${NEWEST}; the launcher exited ${status})"
    else
        echo "(${SIGNAL:-a stop signal}: every rank stopped after writing checkpoint ${NEWEST}; the launcher exited ${status})"
    fi
    status=75
elif finished && [[ ${status} -eq 0 || -n ${SIGNAL} ]]; then
    # a signal that came after the final checkpoint (the run was over, the launcher still exiting) changes nothing
    [[ ${status} -ne 0 ]] && echo "(${SIGNAL} came after the final checkpoint ${NEWEST} at max_steps; the launcher exited ${status})"
    status=0
elif [[ ${status} -eq 0 ]]; then
    echo "(${SIGNAL:-a signal}: the launcher exited 0, but the run did not reach max_steps and wrote no checkpoint" \
        "at the stop (the launcher was killed by the signal); newest complete checkpoint: ${NEWEST})"
    status=$(interrupted_status)
elif [[ -n ${SIGNAL} ]] || ((status == 254 || status == 130)); then
    # 254 (launch.py: a rank's -2) / 130: a rank died of a second SIGINT, which this shell may not have seen
    echo "(${SIGNAL:-SIGINT}: no checkpoint was written at the stop (a second Ctrl-C, a signal during start-up, or" \
        "the ranks were killed); newest complete checkpoint: ${NEWEST})"
    status=$(interrupted_status)
elif ((status > 128)); then
    # DeepSpeed's launch.py exits with a dead rank's return code: -N for signal N, i.e. 256 - N (247 after a
    # kill -9); a shell reports 128 + N.
    signum=$((status > 192 ? 256 - status : status - 128))
    echo "(a rank was killed by signal ${signum} (SIG$(kill -l "${signum}" 2>/dev/null || echo '?'))," \
        "e.g. the kernel's OOM killer (see dmesg) or a kill -9; the launcher exited ${status})"
    status=1
fi
# The attempt's end in the run's goodput events; not after exit 2 (another job may hold the run directory)
if [[ ${status} -ne 2 && -d ${RUN_DIR} ]]; then
    printf '{"event": "exit", "t": %s, "launch_t": %s, "status": %d, "by": "launch/pretrain_local.sh"}\n' \
        "$(date +%s.%N)" "${ALBERT_LAUNCH_TIME}" "${status}" >>"${RUN_DIR}/goodput.jsonl"
fi
# --max-restarts: a crash, a killed rank, a hang or the ranks' own stop on an object store that stayed unavailable
# (75 with its stop checkpoint's cause "store", or with none at the stop and no signal here) starts the run again in
# place, from its newest checkpoint; a store still down then fails that attempt's start within data.store_retry_s
STORE_STOP=""
[[ ${status} -eq 75 && -z ${SIGNAL} && ( -z ${NEW_CHECKPOINT} || ${AFTER[4]:-} == store ) ]] && STORE_STOP=1
if [[ ${status} -eq 1 || ${status} -eq 76 || -n ${STORE_STOP} ]] && ((MAX_RESTARTS > 0)) && [[ -z ${SIGNAL} ]]; then
    if python -m albert_dist.cli goodput "${RUN_DIR}" --json 2>/dev/null |
        python -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["attempts"][-1]["progressed"] else 1)'; then
        RESUME=()
        [[ " $* " != *" --resume auto "* && " $* " != *" --resume=auto "* ]] && RESUME=(--resume auto)
        echo "(exit ${status}: restart $((RESTARTED + 1)) in place with --resume auto, $((MAX_RESTARTS - 1)) more allowed)"
        RUN_DIR=${RUN_DIR} ALBERT_RESTARTED=$((RESTARTED + 1)) exec bash "$0" --max-restarts $((MAX_RESTARTS - 1)) \
            "${NUM_RANKS}" "${RECIPE}" "$@" ${RESUME[@]+"${RESUME[@]}"}
    fi
    echo "(exit ${status}: not restarted: the attempt recorded no step past the one it started from)"
fi
# A config error leaves the run directory this script reserved empty: remove it (rmdir removes only an empty one)
[[ ${status} -eq 2 && -n ${RESERVED} ]] && rmdir "${RUN_DIR}" 2>/dev/null
OUT="$(realpath -m "${RUN_DIR}")"
# The command that continues this run: same ranks, recipe and overrides, the same RUN_DIR, --resume auto
# (added once, and only when there is a checkpoint to continue from). Words other than plain ones are
# single-quoted (as Python's shlex.quote does), so the line pastes back into a shell unchanged.
quote() {
    if [[ $1 =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
CONTINUE=(launch/pretrain_local.sh "${NUM_RANKS}" "${RECIPE}" "$@")
if [[ ( -n ${AFTER[0]:-} || -n ${LEFT} ) && " $* " != *" --resume auto "* && " $* " != *" --resume=auto "* ]]; then
    CONTINUE+=(--resume auto)
fi
CONTINUE_CMD="RUN_DIR=$(quote "${RUN_DIR}")"
for word in "${CONTINUE[@]}"; do CONTINUE_CMD+=" $(quote "${word}")"; done
echo
case "${status}" in
0) echo "pretraining finished; outputs in ${OUT}" ;;
75)
    if [[ -z ${NEW_CHECKPOINT} ]]; then # the ranks' own 75 with no checkpoint at the stop: a store that did not answer
        echo "pretraining stopped (exit 75) without a checkpoint at the stop: an object store stayed unavailable (the" \
            "ranks' log names it); once it answers, continue${AFTER[0]:+ from its last complete checkpoint (${NEWEST})} with:"
    elif [[ ${AFTER[4]:-} == store ]]; then
        echo "pretraining stopped: the object store stayed unavailable, after writing a checkpoint (exit 75); once it" \
            "answers, continue with:"
    else
        echo "pretraining stopped by a signal after writing a checkpoint (exit 75); continue with:"
    fi
    echo "  ${CONTINUE_CMD}"
    echo "outputs in ${OUT}"
    ;;
78)
    echo "pretraining stopped: a training file or object is gone (exit 78, named above); restore it, then continue with:"
    echo "  ${CONTINUE_CMD}"
    echo "or start a new run (another RUN_DIR) on the corpus as it is now; outputs in ${OUT}"
    ;;
2) echo "pretraining did not start: the configuration or an input is wrong, or another job holds the run directory (exit 2, message above)" ;;
77)
    echo "pretraining diverged (exit 77, the line above names the step): no final model; checkpoints/latest names the" \
        "newest healthy checkpoint (${NEWEST}); change what made it diverge (optimizer.lr, ...), then continue with:"
    echo "  ${CONTINUE_CMD}"
    echo "outputs in ${OUT}"
    ;;
76)
    echo "pretraining hung: a rank stopped making progress (exit 76; the line above names it, stacks in ${OUT}/watchdog/); continue from its last complete checkpoint (${NEWEST}) with:"
    echo "  ${CONTINUE_CMD}"
    echo "outputs in ${OUT}"
    ;;
13[0-9] | 14[0-3])
    if [[ -n ${AFTER[0]:-} ]]; then
        echo "pretraining interrupted, unsaved at the stop (exit ${status}); continue from its last complete checkpoint (${NEWEST}) with:"
    else
        echo "pretraining interrupted before its first checkpoint (exit ${status}); nothing to resume, start it again with:"
    fi
    echo "  ${CONTINUE_CMD}"
    echo "outputs in ${OUT}"
    ;;
*)
    echo "pretraining failed (exit ${status}); outputs in ${OUT}"
    if [[ -n ${AFTER[0]:-} ]]; then
        echo "  after fixing the cause, continue from its last complete checkpoint (${NEWEST}) with:"
    else
        echo "  no checkpoint was written; after fixing the cause, start it again with:"
    fi
    echo "  ${CONTINUE_CMD}"
    ;;
esac
if [ "${status}" -eq 2 ]; then exit 2; fi
if [[ -f ${RUN_DIR}/goodput.jsonl ]]; then # the run's goodput across every attempt (albert-dist goodput RUN_DIR)
    python -m albert_dist.cli goodput "${RUN_DIR}" 2>/dev/null | sed 's/^/  /' || true
fi
echo "  config.yaml, ds_config.json: the resolved config and the DeepSpeed config"
echo "  metrics.jsonl: one JSON record per logged step (train/*, perf/*, mem/* and val/* metrics)"
echo "  checkpoints/: DeepSpeed checkpoints, 'latest' names the newest complete one"
exit "${status}"
