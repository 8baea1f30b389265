# shellcheck shell=bash
# Shared by slurm/pretrain.sbatch and slurm/deepspeed.sbatch (sourced from the batch shell; jobs are submitted
# from the repository root, which is where the batch shell starts).
#
# Defines: the job's settings (CONFIG, PYTHON, RESTARTS), the CPU/GPU environment, MASTER_ADDR, `resolve_run_dir`
# (RUN_DIR), and `run_preemptible`, which runs the training step in the background, turns the batch shell's SIGUSR1 into a
# checkpoint-and-stop request for the ranks, requeues the job when the ranks exit with EXIT_PREEMPTED, maps
# a rank killed by a signal to EXIT_CRASHED (README: exit codes), and requeues a crashed or hung job
# (`crash_requeue`: bounded, never an attempt that made no progress, the failed node excluded where possible).

EXIT_PREEMPTED=75 # albert_dist.exit_codes.EXIT_PREEMPTED: stopped (a signal, or a store unavailable) after a checkpoint
EXIT_INPUT_VANISHED=78 # albert_dist.exit_codes.EXIT_INPUT_VANISHED: a training file is gone; never requeued
EXIT_DIVERGED=77  # albert_dist.exit_codes.EXIT_DIVERGED: training diverged; not requeued (it would diverge again)
CONFIG=${ALBERT_CONFIG:-configs/pretrain/albert-tiny-wikitext.yaml}
PYTHON=${PYTHON:-python3}
RESTARTS=${SLURM_RESTART_COUNT:-0}
MAX_REQUEUES=${ALBERT_MAX_REQUEUES:-20}
MAX_CRASH_REQUEUES=${ALBERT_MAX_CRASH_REQUEUES:-3}
EXIT_CRASHED=1 # albert_dist.exit_codes: a crash or a rank killed by a signal; requeued by crash_requeue
EXIT_HUNG=76   # the hang watchdog ended the job; requeued by crash_requeue
# Not requeued: 2 (config), 74 (save failed), 77 (diverged), 78 (input vanished): a rerun would fail the same way.
# This attempt's start, for the run's goodput (albert_dist.tracking.goodput reads it on rank 0)
ALBERT_LAUNCH_TIME=$(date +%s.%N)
export ALBERT_LAUNCH_TIME

log() { echo "[$(basename "${SLURM_JOB_NAME:-job}") $(date -u +%H:%M:%S)] $*"; }
if ! [[ ${MAX_CRASH_REQUEUES} =~ ^[0-9]+$ ]]; then
    log "ALBERT_MAX_CRASH_REQUEUES=${MAX_CRASH_REQUEUES}: expected a whole number >= 0"
    exit 2
fi

# A task that exits non-zero (a crash, a config error, a rank killed by the OOM killer) ends the whole step:
# srun kills the other tasks (SIGTERM, SIGKILL after KillWait) instead of leaving them in a collective (NCCL
# cannot tell a dead peer) until the process-group timeout. The ranks absorb that SIGTERM once their own exit
# code is decided (albert_dist.job.stop.StopFlag.retire), so srun still reports 75, 74 or 2 as such. Set for
# every srun of the job, DeepSpeed's slurm launcher's too.
export SLURM_KILL_BAD_EXIT=1

if [[ ${ALBERT_SLURM_CPU:-0} == 1 ]]; then
    export DS_ACCELERATOR=cpu                 # DeepSpeed's CPU accelerator: gloo backend
    export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
else
    export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-8}
    # NCCL: adapt to your fabric (docs/slurm.md).
    # export NCCL_SOCKET_IFNAME=ib0            # interface for NCCL's bootstrap/socket traffic
    # export NCCL_IB_HCA=mlx5                  # InfiniBand adapters to use
    # export NCCL_DEBUG=WARN                   # INFO prints the rings/trees NCCL builds
    export TORCH_NCCL_ASYNC_ERROR_HANDLING=1  # a failed rank aborts the job instead of hanging it
fi

# Rendezvous, computed once here rather than by every rank. Rank 0 runs on the first node of the node list
# (block distribution), so MASTER_ADDR is that node's address: its NodeAddr from slurmctld, which also covers
# node names that do not resolve (several virtual nodes on one host). The port is derived from the job id by
# albert_dist.distributed.group (the same after a requeue, which keeps the job id).
if [[ -z ${MASTER_ADDR:-} ]]; then
    _first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    MASTER_ADDR=$(scontrol show node "$_first_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2 || true)
    export MASTER_ADDR=${MASTER_ADDR:-$_first_node}
fi

# resolve_run_dir [OVERRIDE...]
#   Sets RUN_DIR to the run directory the ranks of `train --config $CONFIG run_dir=$RUN_DIR OVERRIDE...` use, as
#   they resolve it (`albert-dist train --print-run-dir`): a run_dir= among the overrides, else ALBERT_RUN_DIR,
#   else the recipe's run_dir, else runs/slurm-<job id> (the same for every requeued run of the job); absolute.
#   A config that does not load ends the job here, before any srun: its one line, exit 2.
resolve_run_dir() {
    # shellcheck disable=SC2034 # RUN_DIR is read by the sbatch scripts that source this file
    RUN_DIR=$("$PYTHON" -m albert_dist.cli train --config "$CONFIG" ${ALBERT_RUN_DIR:+"run_dir=$ALBERT_RUN_DIR"} "$@" \
        --print-run-dir "runs/slurm-$SLURM_JOB_ID") || { log "the job's config does not load (above): exit 2"; exit 2; }
}

# hang_reports [SINCE]
#   The hang reports the ranks' watchdog wrote in RUN_DIR (<run dir>/watchdog/<job>/hang.json,
#   albert_dist.job.watchdog), one path a line: all of them, or those written after epoch second SINCE.
hang_reports() {
    find "${RUN_DIR:-.}/watchdog" -name hang.json ${1:+-newermt "@$1"} 2>/dev/null || true
}

# newest_checkpoint
#   The run's newest complete checkpoint (`python -m albert_dist.runs.newest`, as launch/pretrain_local.sh reads it):
#   its path, reason, step, max_steps and stop cause (signal, store or input), one a line; nothing when there is none.
newest_checkpoint() {
    "$PYTHON" -m albert_dist.runs.newest "$RUN_DIR" 2>/dev/null || true
}

# run_preemptible STOP_COMMAND -- COMMAND...
#   Runs COMMAND in the background (bash runs a trap only between foreground commands, so a foreground srun
#   would hold the signal until training ends). On SIGUSR1 to this shell (`--signal=B:USR1@T` before the time
#   limit, or `scancel -b -s USR1 <job>`), runs STOP_COMMAND, which must deliver SIGUSR1 to every rank. If
#   COMMAND then exits with EXIT_PREEMPTED (or died of that SIGUSR1 during start-up), requeues the job (at
#   most ALBERT_MAX_REQUEUES times) and returns 0; otherwise returns COMMAND's status. The signal lead time
#   must be shorter than the time limit, or every run is signalled at its start.
run_preemptible() {
    local stop_command=$1
    shift 2
    _preempted=0
    _train_pid=
    _stop_command=$stop_command
    _out_file=$(scontrol -o show job "$SLURM_JOB_ID" 2>/dev/null | grep -o 'StdOut=[^ ]*' | cut -d= -f2 || true)
    _out_from=$(stat -c %s "$_out_file" 2>/dev/null || echo 0) # this attempt's part of the job's output
    local started before after
    started=$(date +%s)
    before=$(newest_checkpoint | head -n 1)
    trap '_preempted=1; log "SIGUSR1: asking every rank to checkpoint and stop"; [[ -n $_train_pid ]] && eval "$_stop_command" || true' USR1
    "$@" &
    _train_pid=$!
    local rc=0
    wait "$_train_pid" || rc=$?
    while kill -0 "$_train_pid" 2>/dev/null; do # a trapped signal interrupts `wait`: wait again
        rc=0
        wait "$_train_pid" || rc=$?
    done
    rc=0
    wait "$_train_pid" || rc=$? # the command's own exit status (srun: the highest of its tasks)
    log "training exited with status $rc"
    record_exit "$rc"
    # 75: the ranks checkpointed and stopped. 138 (128 + SIGUSR1): the signal came before the trainer had
    # installed its handler (start-up), so the ranks died of it with nothing to save since the last
    # checkpoint; the requeued run resumes from that one.
    if [[ $_preempted == 1 && ($rc == "$EXIT_PREEMPTED" || $rc == 138) ]]; then
        if ((RESTARTS >= MAX_REQUEUES)); then
            log "checkpointed, not requeueing: restarted $RESTARTS times already (ALBERT_MAX_REQUEUES)"
            return "$rc"
        fi
        log "checkpoint written; requeueing job $SLURM_JOB_ID (restart $((RESTARTS + 1)))"
        scontrol requeue "$SLURM_JOB_ID"
        return 0
    fi
    # 75 with no SIGUSR1 here: the ranks stopped by themselves, after their object store stayed unavailable past
    # data.store_retry_s (or on `scancel --signal=INT`, a stop asked for: its checkpoint records "signal"). The
    # store is no node's fault: requeued within the crash budget, every node kept; Slurm's hold of a requeued job
    # (~2.5 min) gives the store that long to come back, and an attempt that made no progress is not requeued.
    # The stop's cause, as launch/pretrain_local.sh judges it: a new checkpoint's stop_cause, "store" without one.
    mapfile -t after < <(newest_checkpoint)
    if [[ $_preempted == 0 && $rc == "$EXIT_PREEMPTED" ]] &&
        [[ -z ${after[0]:-} || ${after[0]} == "$before" || ${after[4]:-store} == store ]]; then
        log "the ranks stopped after their object store stayed unavailable (exit 75; the ranks' log names the URL)"
        crash_requeue "$rc" store && return 0
        return "$rc"
    fi
    if ((rc == EXIT_INPUT_VANISHED)); then
        log "a training file or object is gone (the ranks' log names it): not requeueing; restore it and resubmit" \
            "(--resume auto), or start a new run on the corpus as it is now (exit $rc)"
        return "$rc"
    fi
    if [[ $rc == "$EXIT_DIVERGED" ]]; then
        log "training diverged (exit $EXIT_DIVERGED; rank 0's line above names the step and the healthy checkpoint):" \
            "not requeued, the same data and settings would diverge again (docs/faults.md)"
        return "$rc"
    fi
    # A hang: the live ranks exit 76 and srun SIGKILLs a stopped one after KillWait, so srun's status may be 137;
    # the watchdog's report in the run directory tells. Requeued as a crash is (`crash_requeue`: bounded).
    local report
    report=$(hang_reports "$started" | tail -n 1)
    if [[ $rc == "$EXIT_HUNG" || -n $report ]]; then
        [[ -n $report ]] && log "$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["line"])' "$report" 2>/dev/null)"
        log "the hang watchdog ended the job (exit $EXIT_HUNG; srun exited $rc)"
        rc=$EXIT_HUNG
    fi
    # srun reports a task killed by signal N as 128 + N (DeepSpeed's launch.py as 256 - N): not an exit code of
    # albert-dist train. A second SIGINT (`scancel --signal=INT` twice) is an interrupt without a checkpoint at
    # the stop (130); any other signal is a crash (1), the signal named.
    if ((rc > 128)); then
        local signum=$((rc > 192 ? 256 - rc : rc - 128))
        if ((signum == 2)); then
            log "SIGINT killed the ranks (a second one, or one during start-up): no checkpoint at the stop (exit 130)"
            return 130
        fi
        log "a rank was killed by signal $signum (SIG$(kill -l "$signum" 2>/dev/null || echo '?')): the kernel's" \
            "OOM killer (see dmesg), a kill -9, or srun ending a rank stuck after another failed (the first error" \
            "above is the cause); exit 1 (srun exited $rc)"
        rc=$EXIT_CRASHED
    fi
    if [[ $rc == "$EXIT_CRASHED" || $rc == "$EXIT_HUNG" ]] && crash_requeue "$rc"; then
        return 0
    fi
    [[ -f $RUN_DIR/goodput.jsonl ]] && log "$("$PYTHON" -m albert_dist.cli goodput "$RUN_DIR" 2>/dev/null || true)"
    return "$rc"
}

# record_exit STATUS
#   The attempt's end in the run's goodput events (<run dir>/goodput.jsonl, albert_dist.tracking.goodput), with
#   srun's STATUS as the job reports it (a signal's 128 + N as 1). Not after 2: the ranks refused the job, and
#   another job may hold the run directory.
record_exit() {
    local status=$1
    ((status > 128 && status != 130 && status != 138)) && status=$EXIT_CRASHED
    [[ $status == 2 || ! -d $RUN_DIR ]] && return 0
    printf '{"event": "exit", "t": %s, "launch_t": %s, "status": %d, "by": "slurm", "job": "%s", "restart": %d}\n' \
        "$(date +%s.%N)" "$ALBERT_LAUNCH_TIME" "$status" "$SLURM_JOB_ID" "$RESTARTS" >>"$RUN_DIR/goodput.jsonl"
}

# crash_requeue STATUS [store]
#   After a crash, a rank killed by a signal (EXIT_CRASHED), a hang (EXIT_HUNG) or, with "store", the ranks' own
#   stop on an object store that stayed unavailable (EXIT_PREEMPTED, no node excluded): requeue the job (its next run
#   resumes from the newest checkpoint) and return 0; return 1, with a line saying why, when
#   ALBERT_MAX_CRASH_REQUEUES crash requeues of this job were made already (counted in <run dir>/.crash_requeues,
#   "<job id> <count>", which survives the requeues), ALBERT_MAX_REQUEUES restarts in all, or when the attempt
#   recorded no step past the one it started from (`albert-dist goodput RUN_DIR --json`: a crash in start-up would
#   only repeat). The node of the first task srun reported failing is excluded from the requeued job
#   (`scontrol update ExcNodeList`) when the partition keeps enough other usable nodes for the job.
crash_requeue() {
    local status=$1 why=${2:-crash} count=0 file=$RUN_DIR/.crash_requeues
    if [[ -f $file && $(cut -d' ' -f1 "$file") == "$SLURM_JOB_ID" ]]; then count=$(cut -d' ' -f2 "$file"); fi
    if ((count >= MAX_CRASH_REQUEUES)); then
        log "exit $status: not requeueing: $count crash requeue(s) of job $SLURM_JOB_ID already (ALBERT_MAX_CRASH_REQUEUES)"
        return 1
    fi
    if ((RESTARTS >= MAX_REQUEUES)); then
        log "exit $status: not requeueing: restarted $RESTARTS times already (ALBERT_MAX_REQUEUES)"
        return 1
    fi
    if ! "$PYTHON" -m albert_dist.cli goodput "$RUN_DIR" --json 2>/dev/null |
        "$PYTHON" -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["attempts"][-1]["progressed"] else 1)'; then
        log "exit $status: not requeueing: the attempt recorded no step past the one it started from"
        return 1
    fi
    echo "$SLURM_JOB_ID $((count + 1))" >"$file"
    local node=""
    [[ $why == crash ]] && node=$(tail -c +"$((_out_from + 1))" "$_out_file" 2>/dev/null |
        sed -n 's/^srun: error: \([^:]*\): task [0-9]*: .*/\1/p' | head -n 1 || true)
    log "exit $status: requeueing job $SLURM_JOB_ID ($why requeue $((count + 1)) of at most $MAX_CRASH_REQUEUES;" \
        "restart $((RESTARTS + 1)))"
    # Slurm refuses ExcNodeList while the job runs, and a requeue SIGTERMs this shell (SIGKILL after KillWait, 30 s
    # by default): ignore the TERM for the few scontrol calls that exclude the node from the requeued job.
    trap '' TERM
    scontrol requeue "$SLURM_JOB_ID"
    [[ -n $node ]] && exclude_node "$node"
    return 0
}

# exclude_node NODE
#   Add NODE to the (requeued, pending) job's ExcNodeList when the job's partition still has at least
#   SLURM_JOB_NUM_NODES usable nodes (idle, mixed, allocated or completing) outside the new list; else say why not.
exclude_node() {
    local node=$1 excluded usable
    excluded=$(scontrol -o show job "$SLURM_JOB_ID" | grep -o 'ExcNodeList=[^ ]*' | cut -d= -f2 || true)
    [[ $excluded == "(null)" ]] && excluded=""
    excluded=$(scontrol show hostnames "${excluded:+$excluded,}$node" | sort -u | paste -sd, -)
    usable=$(sinfo -h -N ${SLURM_JOB_PARTITION:+-p "$SLURM_JOB_PARTITION"} -t idle,mix,alloc,comp -o %N 2>/dev/null | sort -u |
        grep -cvxF -f <(tr , '\n' <<<"$excluded") || true)
    if ((usable >= ${SLURM_JOB_NUM_NODES:-1})); then
        scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$excluded" &&
            log "node $node (the first failed task's) excluded from the requeued job: ExcNodeList=$excluded"
    else
        log "node $node (the first failed task's) kept: the partition has $usable usable node(s) besides" \
            "ExcNodeList=$excluded, the job needs ${SLURM_JOB_NUM_NODES:-1}"
    fi
}
