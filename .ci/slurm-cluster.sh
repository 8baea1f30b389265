#!/usr/bin/env bash
# A real Slurm cluster of two virtual nodes (n1, n2) on this one machine, for the Slurm e2e tests.
#
#   .ci/slurm-cluster.sh start    install Debian's slurmctld slurmd slurm-client munge if missing, write
#                                 slurm.conf, start munged, slurmctld, slurmd -N n1, slurmd -N n2, wait idle
#   .ci/slurm-cluster.sh stop     stop the daemons this script started (by their pid files)
#   .ci/slurm-cluster.sh status   print sinfo
#
# Idempotent: `start` on a running cluster only checks it is healthy; `stop` on a stopped one does nothing.
# Needs root (apt-get, daemons running as slurm/munge). Facts behind each step: ../shared/slurm-ci.md
# (Slurm 22.05 on Debian 12: MULTIPLE_SLURMD builds allow several slurmd per host, no cgroups needed).
#
# Settings (environment): SLURM_CI_NODES (default 2), SLURM_CI_CPUS (CPUs per virtual node, default nproc),
# SLURM_CI_PARTITION (default "ci").
set -euo pipefail
# the daemons live in /usr/sbin, which a non-login CI shell may not have on PATH
export PATH=/usr/sbin:/sbin:$PATH

MODE=${1:-start}
NODES=${SLURM_CI_NODES:-2}
CPUS=${SLURM_CI_CPUS:-$(nproc)}
PARTITION=${SLURM_CI_PARTITION:-ci}
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
MUNGE_PID=/run/munge/munged.pid
CTLD_PID=/run/slurmctld.pid
HOST=$(hostname)

log() { echo "[slurm-cluster] $*" >&2; }

node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "n$i"; done; }

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() {
    # TERM, wait up to 10 s, then KILL; always remove the file (slurmctld leaves it behind, and a stale
    # one makes `apt-get remove slurmctld` fail)
    local f=$1 pid i
    [[ -f $f ]] || return 0
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
    fi
    rm -f "$f"
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    [[ ${#missing[@]} -eq 0 ]] && return 0
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # the postinsts try to start services through policy-rc.d, are refused, harmlessly: we start them below
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

write_conf() {
    mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/log/slurm /run/munge
    chown slurm:slurm /var/spool/slurmctld /var/log/slurm
    chown munge:munge /run/munge
    local n
    for n in $(node_names); do mkdir -p "/var/spool/slurmd/$n"; done
    local tmp
    tmp=$(mktemp)
    cat >"$tmp" <<EOF
# written by albert_dist .ci/slurm-cluster.sh: $NODES virtual nodes on $HOST
ClusterName=albertci
SlurmctldHost=$HOST
AuthType=auth/munge
SlurmUser=slurm
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=/run/slurmd-%n.pid
SlurmdSpoolDir=/var/spool/slurmd/%n
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
NodeName=n[1-$NODES] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[17001-$((17000 + NODES))] CPUs=$CPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP
EOF
    if ! cmp -s "$tmp" "$CONF"; then
        mv "$tmp" "$CONF"
        chmod 644 "$CONF"
        return 0
    fi
    rm -f "$tmp"
}

cluster_idle() {
    [[ "$(sinfo -h -t idle -o %D 2>/dev/null | awk '{s += $1} END {print s + 0}')" == "$NODES" ]]
}

start() {
    install_packages
    write_conf
    if ! pid_alive "$MUNGE_PID"; then
        rm -f "$MUNGE_PID"
        log "starting munged"
        runuser -u munge -- /usr/sbin/munged
    fi
    munge -n | unmunge >/dev/null || { log "munge does not work"; exit 1; }
    if ! pid_alive "$CTLD_PID"; then
        rm -f "$CTLD_PID"
        log "starting slurmctld"
        slurmctld
    fi
    local n
    for n in $(node_names); do
        if ! pid_alive "/run/slurmd-$n.pid"; then
            rm -f "/run/slurmd-$n.pid"
            log "starting slurmd -N $n"
            slurmd -N "$n"
        fi
    done
    local i
    for ((i = 0; i < 300; i++)); do
        if cluster_idle; then
            log "cluster up: $(sinfo -h -o '%P %D %t %N' | tr '\n' ' ')"
            return 0
        fi
        # a node that came back from an earlier, killed cluster can sit in DOWN: ReturnToService=2 only
        # covers nodes that register again, so resume it explicitly
        if ((i == 20)); then scontrol update NodeName="n[1-$NODES]" State=RESUME 2>/dev/null || true; fi
        sleep 0.1
    done
    log "nodes not idle after 30 s:"; sinfo >&2 || true; tail -n 20 /var/log/slurm/*.log >&2 || true
    exit 1
}

stop() {
    local n
    # any job still running would keep its task processes: cancel them first
    if pid_alive "$CTLD_PID"; then scancel --full --quiet --user="$(id -un)" 2>/dev/null || true; fi
    for n in $(node_names); do stop_pidfile "/run/slurmd-$n.pid"; done
    stop_pidfile "$CTLD_PID"
    stop_pidfile "$MUNGE_PID"
    log "stopped"
}

case "$MODE" in
    start) start ;;
    stop) stop ;;
    status) sinfo ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
