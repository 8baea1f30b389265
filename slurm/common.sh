# shellcheck shell=bash
# Shared by slurm/pretrain.sbatch and slurm/deepspeed.sbatch (sourced from the batch shell; jobs are submitted
# from the repository root, which is where the batch shell starts).
#
# Defines: the job's settings (CONFIG, PYTHON, RESTARTS), the CPU/GPU environment, MASTER_ADDR, `resolve_run_dir`
# (RUN_DIR), and `run_preemptible`, which runs the training step in the background, turns the batch shell's SIGUSR1 into a
# checkpoint-and-stop request for the ranks, requeues the job when the ranks exit with EXIT_PREEMPTED or
# EXIT_HUNG (bounded), and maps a rank killed by a signal to EXIT_CRASHED (README: exit codes).

EXIT_PREEMPTED=75 # albert_dist.exit_codes.EXIT_PREEMPTED: stopped by a signal after a checkpoint
EXIT_HUNG=76      # albert_dist.exit_codes.EXIT_HUNG: the hang watchdog ended the job (a rank stopped making progress)
MAX_HANG_REQUEUES=${ALBERT_MAX_HANG_REQUEUES:-3} # hangs of one run directory requeued at most this many times
CONFIG=${ALBERT_CONFIG:-configs/pretrain/albert-tiny-wikitext.yaml}
PYTHON=${PYTHON:-python3}
RESTARTS=${SLURM_RESTART_COUNT:-0}
MAX_REQUEUES=${ALBERT_MAX_REQUEUES:-20}

log() { echo "[$(basename "${SLURM_JOB_NAME:-job}") $(date -u +%H:%M:%S)] $*"; }

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
    local started
    started=$(date +%s)
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
    # A hang: the live ranks exit 76 and srun SIGKILLs a stopped one after KillWait, so srun's status may be 137;
    # the watchdog's report in the run directory tells. Requeued (--resume auto), at most MAX_HANG_REQUEUES per run.
    local report
    report=$(hang_reports "$started" | tail -n 1)
    if [[ $rc == "$EXIT_HUNG" || -n $report ]]; then
        [[ -n $report ]] && log "$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["line"])' "$report" 2>/dev/null)"
        local hangs
        hangs=$(hang_reports | wc -l)
        if ((hangs > MAX_HANG_REQUEUES || RESTARTS >= MAX_REQUEUES)); then
            log "the hang watchdog ended the job (exit $EXIT_HUNG; srun exited $rc); not requeueing: $hangs hang(s) in" \
                "$RUN_DIR (ALBERT_MAX_HANG_REQUEUES=$MAX_HANG_REQUEUES), $RESTARTS restart(s) (ALBERT_MAX_REQUEUES)"
            return "$EXIT_HUNG"
        fi
        log "the hang watchdog ended the job (exit $EXIT_HUNG; srun exited $rc); requeueing job $SLURM_JOB_ID" \
            "(hang $hangs of at most $MAX_HANG_REQUEUES; --resume auto continues from the newest checkpoint)"
        scontrol requeue "$SLURM_JOB_ID"
        return 0
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
        return 1
    fi
    return "$rc"
}
