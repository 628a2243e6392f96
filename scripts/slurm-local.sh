#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for the srun tests (tests/slurm/): munged,
# slurmctld and slurmd from Debian's packages (slurm 22.05 on Debian 12), no cgroups, no systemd.
#
#   bash scripts/slurm-local.sh start   # installs what is missing, starts the daemons, waits (bounded)
#                                       # until the node is idle; srun works without SLURM_CONF after
#   bash scripts/slurm-local.sh stop    # cancels jobs, stops every daemon, leaves no process
#
# SLURM_LOCAL_DIR (default /tmp/ddp-doctor-slurm) holds the config, state and logs; SLURM_CPUS the
# CPUs the node advertises (default: what `slurmd -C` finds; more is allowed); SLURM_WAIT_S the bound
# on the wait for the node (default 60).
set -euo pipefail
D=${SLURM_LOCAL_DIR:-/tmp/ddp-doctor-slurm}
CONF=$D/etc/slurm.conf
export SLURM_CONF=$CONF
log() { echo "[slurm-local] $*" >&2; }
alive() { [ -s "$1" ] && [ "$(cat "/proc/$(cat "$1")/comm" 2>/dev/null)" = "$(basename "$1" .pid)" ]; }
pids_of() { pgrep -x "$1" 2>/dev/null || true; }

stop() {
  if alive "$D/slurmctld.pid"; then
    timeout 10 scancel --user="$(id -un)" 2>/dev/null || true
    for _ in $(seq 25); do [ -z "$(timeout 5 squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for f in slurmd slurmctld; do alive "$D/$f.pid" && kill -TERM "$(cat "$D/$f.pid")" || true; done
  for _ in $(seq 50); do
    [ -z "$(pids_of slurmd)$(pids_of slurmctld)$(pids_of slurmstepd)" ] && break
    sleep 0.2
  done
  left="$(pids_of slurmstepd) $(pids_of slurmd) $(pids_of slurmctld)"
  if [ -n "${left// /}" ]; then kill -KILL $left 2>/dev/null || true; fi
  rm -f "$D/slurmd.pid" "$D/slurmctld.pid"
  if [ "${1:-}" != "--keep-munge" ] && [ -n "$(pids_of munged)" ]; then
    munged -s >/dev/null 2>&1 || kill -TERM $(pids_of munged) 2>/dev/null || true
    for _ in $(seq 25); do [ -z "$(pids_of munged)" ] && break; sleep 0.2; done
  fi
  log "stopped"
}

start() {
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v srun >/dev/null \
     || ! command -v munged >/dev/null; then
    log "installing slurmctld slurmd slurm-client munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key --force
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  local host hw cpus real mem node
  host=$(hostname -s)
  hw=$(slurmd -C | head -1)  # NodeName=vm CPUs=2 Boards=1 ... RealMemory=N
  real=$(sed -n 's/.*\bCPUs=\([0-9]*\).*/\1/p' <<<"$hw")
  mem=$(sed -n 's/.*\bRealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
  cpus=${SLURM_CPUS:-$real}
  if [ "$cpus" = "$real" ]; then node=$(sed 's/^NodeName=[^ ]* //' <<<"$hw"); else node="CPUs=$cpus RealMemory=$mem"; fi
  mkdir -p "$D/etc" "$D/state" "$D/spool" "$D/log"
  local new
  new=$(cat <<EOF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 $node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
)
  if [ ! -f "$CONF" ] || [ "$new" != "$(cat "$CONF")" ]; then
    if alive "$D/slurmctld.pid" || alive "$D/slurmd.pid"; then stop --keep-munge; fi
    printf '%s\n' "$new" >"$CONF"
  fi
  mkdir -p /etc/slurm
  if [ ! -e /etc/slurm/slurm.conf ] || [ -L /etc/slurm/slurm.conf ]; then ln -sfn "$CONF" /etc/slurm/slurm.conf; fi
  alive "$D/slurmctld.pid" || slurmctld -c -i
  alive "$D/slurmd.pid" || slurmd
  local deadline=$(( $(date +%s) + ${SLURM_WAIT_S:-60} )) st=
  while :; do
    st=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -1 || true)
    case "$st" in
      idle|mixed|allocated) break ;;
      down*|drain*) scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
    esac
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "node $host not idle after ${SLURM_WAIT_S:-60} s (state '$st'); logs in $D/log"
      return 1
    fi
    sleep 0.2
  done
  log "node $host is $st"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
