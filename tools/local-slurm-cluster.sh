#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for the tests and for trying profiles/slurm:
# Debian's slurm-wlm (22.05) and munge, slurmctld and slurmd on one host, select/cons_tres, and
# GPUS GPUs declared as a GRES. Where the machine has no GPUs, the GRES files are character
# devices made with mknod (c 1 3, like /dev/null): SLURM allocates them and sets
# CUDA_VISIBLE_DEVICES as it would for real ones, but nothing can compute on them.
#
#   tools/local-slurm-cluster.sh install   apt-get install slurm-wlm munge slurmdbd mariadb-server (root)
#   tools/local-slurm-cluster.sh start     write the configuration, start munged, the accounting
#                                          (MariaDB, slurmdbd), slurmctld, slurmd
#   tools/local-slurm-cluster.sh stop      stop the daemons
#   tools/local-slurm-cluster.sh status    sinfo
#
# It also declares 16 nodes of 8 GPUs that never come up, in partition `far`: a multi-node job
# submitted there is accepted and pends, so its request can be checked and cancelled.
#
# Job accounting as a site keeps it (slurmdbd on a MariaDB database, jobacct_gather/linux, job
# comments stored), so that sacct answers as Snakemake's SLURM plugin expects, with each job's CPU
# time, peak memory and requeues (its efficiency report; `trainbench cost --slurm-efficiency`). Where
# slurmdbd or MariaDB is not installed (or ACCOUNTING=0), the cluster runs without accounting and sacct
# cannot answer (the workflow then follows jobs with squeue).
#
# Settings (environment): GPUS (4), CPUS (8; more than a small machine has, so that several
# GPU jobs can be placed at once: SlurmdParameters=config_overrides lets slurmd accept it),
# MEM_MB (64000), STATE_DIR (/var/lib/trainbench-slurm), ACCOUNTING (auto: where slurmdbd and
# MariaDB are installed; 1: required, an error without them; 0: off). Needs root. Refuses to
# overwrite an /etc/slurm/slurm.conf or slurmdbd.conf it did not write, and to use a MariaDB it did not
# start.
set -euo pipefail

GPUS=${GPUS:-4}
CPUS=${CPUS:-8}
MEM_MB=${MEM_MB:-64000}
STATE_DIR=${STATE_DIR:-/var/lib/trainbench-slurm}
ACCOUNTING=${ACCOUNTING:-auto}
DB_DIR=$STATE_DIR/mariadb  # MariaDB runs as mysql: its data, pid and log in a folder it owns
# the socket where MariaDB's clients (slurmdbd among them) look for it by default
DB_SOCKET=/run/mysqld/mysqld.sock
CONF_DIR=/etc/slurm
MARKER="# written by trainbench tools/local-slurm-cluster.sh"
host=$(hostname -s)

say() { echo "local-slurm: $*"; }

install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends slurm-wlm munge slurmdbd mariadb-server
}

with_accounting() {
  case "$ACCOUNTING" in
    0|no|off) return 1 ;;
    1|yes|on)
      command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && return 0
      say "ACCOUNTING=$ACCOUNTING, but slurmdbd or mariadbd is missing: run '$0 install'"; exit 1 ;;
    *) command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null ;;
  esac
}

# wait_for WHAT COMMAND...: run COMMAND until it succeeds (30 s at most), or say what did not come up
wait_for() {
  local what=$1; shift
  for _ in $(seq 150); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  say "$what did not come up; see $STATE_DIR/log and $DB_DIR"; exit 1
}

# the pid in a pid file, where that process is alive
live_pid() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

accounting_config() {
  if with_accounting; then
    # every job's CPU time and peak memory sampled every 5 s, its comment (the rule) kept
    printf '%s\n' "JobAcctGatherType=jobacct_gather/linux" "JobAcctGatherFrequency=task=5" \
      "AccountingStorageType=accounting_storage/slurmdbd" "AccountingStorageHost=localhost" \
      "AccountingStoreFlags=job_comment"
  else
    printf '%s\n' "JobAcctGatherType=jobacct_gather/none" "AccountingStorageType=accounting_storage/none"
  fi
}

# MariaDB on a socket of its own (no TCP), its data under STATE_DIR, then slurmdbd on it (as root,
# through the socket: no password anywhere); the cluster is registered once.
start_accounting() {
  mkdir -p "$DB_DIR/data" "$(dirname "$DB_SOCKET")"
  chown -R mysql:mysql "$DB_DIR" "$(dirname "$DB_SOCKET")"
  if [ ! -d "$DB_DIR/data/mysql" ]; then
    mariadb-install-db --user=mysql --datadir="$DB_DIR/data" >"$STATE_DIR/log/mariadb-install.log" 2>&1
  fi
  if ! live_pid "$DB_DIR/mysqld.pid" >/dev/null; then
    if mariadb-admin --socket="$DB_SOCKET" ping >/dev/null 2>&1; then
      say "a MariaDB this script did not start answers on $DB_SOCKET; not using it (ACCOUNTING=0 to start without accounting)"
      exit 1
    fi
    mariadbd --user=mysql --datadir="$DB_DIR/data" --socket="$DB_SOCKET" --skip-networking \
      --pid-file="$DB_DIR/mysqld.pid" --log-error="$DB_DIR/mariadb.log" >>"$DB_DIR/mariadb.log" 2>&1 &
    wait_for MariaDB mariadb-admin --socket="$DB_SOCKET" ping
  fi
  mariadb --socket="$DB_SOCKET" -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db"
  if [ -f "$CONF_DIR/slurmdbd.conf" ] && ! grep -qF "$MARKER" "$CONF_DIR/slurmdbd.conf"; then
    say "$CONF_DIR/slurmdbd.conf exists and is not ours; not touching it"; exit 1
  fi
  {
    echo "$MARKER"
    echo "AuthType=auth/munge"
    echo "DbdHost=localhost"
    echo "SlurmUser=root"
    echo "PidFile=$STATE_DIR/slurmdbd.pid"
    echo "LogFile=$STATE_DIR/log/slurmdbd.log"
    echo "StorageType=accounting_storage/mysql"
    echo "StorageHost=localhost"
    echo "StoragePort=0"
    echo "StorageLoc=slurm_acct_db"
    echo "StorageUser=root"
  } > "$CONF_DIR/slurmdbd.conf"
  chmod 600 "$CONF_DIR/slurmdbd.conf"
  live_pid "$STATE_DIR/slurmdbd.pid" >/dev/null || slurmdbd
  wait_for slurmdbd sacctmgr -n list cluster
  sacctmgr -n list cluster format=cluster | grep -qw trainbench || sacctmgr -i add cluster trainbench >/dev/null
  # an account of a project besides root's own, as a site has them (the tests route jobs to it)
  if ! sacctmgr -n list assoc user=root account=bench format=account | grep -qw bench; then
    sacctmgr -i add account bench cluster=trainbench >/dev/null
    sacctmgr -i add user root account=bench cluster=trainbench >/dev/null
  fi
}

write_config() {
  if [ -f "$CONF_DIR/slurm.conf" ] && ! grep -qF "$MARKER" "$CONF_DIR/slurm.conf"; then
    say "$CONF_DIR/slurm.conf exists and is not ours; not touching it"; exit 1
  fi
  mkdir -p "$CONF_DIR" "$STATE_DIR"/{ctld,spool,log,dev}
  local gpu_files=""
  for ((i = 0; i < GPUS; i++)); do
    [ -e "$STATE_DIR/dev/nvidia$i" ] || mknod "$STATE_DIR/dev/nvidia$i" c 1 3
  done
  if [ "$GPUS" -gt 0 ]; then gpu_files="$STATE_DIR/dev/nvidia[0-$((GPUS - 1))]"; fi
  cat > "$CONF_DIR/slurm.conf" <<EOF
$MARKER
ClusterName=trainbench
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd.pid
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmdLogFile=$STATE_DIR/log/slurmd.log
# no cgroups: containers and CI machines rarely delegate them
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$(accounting_config)
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
GresTypes=gpu
NodeName=$host CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
# 16 nodes that never come up, in a partition of their own: multi-node jobs submitted there are
# accepted and pend, so their exact request can be read back (scontrol show job), then cancelled.
# Their GPUs have a model and the nodes features, so GPU-model and constraint requests can be read too.
NodeName=far[01-16] NodeAddr=127.0.0.1 CPUs=64 RealMemory=512000 Gres=gpu:h100:8 Feature=h100,nvlink State=FUTURE
PartitionName=far Nodes=far[01-16] MaxTime=INFINITE State=UP
EOF
  if [ "$GPUS" -gt 0 ]; then
    printf '%s\nNodeName=%s Name=gpu File=%s\n' "$MARKER" "$host" "$gpu_files" > "$CONF_DIR/gres.conf"
  else
    printf '%s\n' "$MARKER" > "$CONF_DIR/gres.conf"
  fi
}

start_munge() {
  if pgrep -x munged >/dev/null; then return; fi
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge
  chmod 400 /etc/munge/munge.key
  chmod 755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 50); do munge -n >/dev/null 2>&1 && return; sleep 0.1; done
  say "munged did not start"; exit 1
}

start() {
  command -v slurmctld >/dev/null || { say "slurmctld not found: run '$0 install' first"; exit 1; }
  write_config
  start_munge
  if with_accounting; then start_accounting; fi
  pgrep -x slurmctld >/dev/null || slurmctld -i
  pgrep -x slurmd >/dev/null || slurmd
  for _ in $(seq 100); do
    state=$(timeout 5 sinfo -h -N -o "%t" -n "$host" 2>/dev/null || true)
    case "$state" in
      idle*|mix*|alloc*)
        say "up: $host with $CPUS CPUs, $MEM_MB MB, $GPUS GPUs ($state), accounting $(with_accounting && echo on || echo off)"
        return ;;
      down*|drain*) scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true ;;
    esac
    sleep 0.2
  done
  say "node did not come up; see $STATE_DIR/log"; tail -n 20 "$STATE_DIR"/log/*.log; exit 1
}

stop() {
  # SLURM's daemons by name (this cluster's config is the machine's), the accounting's by the pid
  # files it wrote: a MariaDB of the machine's own is left alone
  local pids=() pid
  for daemon in slurmd slurmctld; do pids+=($(pgrep -x "$daemon" || true)); done
  for file in "$STATE_DIR/slurmdbd.pid" "$DB_DIR/mysqld.pid"; do
    pid=$(live_pid "$file") && pids+=("$pid")
  done
  [ ${#pids[@]} -eq 0 ] && { say "stopped"; return; }
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 100); do
    kill -0 "${pids[@]}" 2>/dev/null || { say "stopped"; return; }
    sleep 0.2
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
  say "stopped (killed)"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) timeout 10 sinfo -N -o "%N %t %c %m %G" ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2 ;;
esac
