#!/usr/bin/env bash
# Stop the one-node cluster of start_slurm.sh: cancel its jobs, then stop slurmd, slurmctld and munged by the PIDs in
# their pid files (never by process name). Idempotent.  --purge also removes Slurm's state, logs and config.
set -uo pipefail
LOG=${DWG_SLURM_LOG:-/var/log/slurm}
say() { echo "slurm: $*"; }
running() {
  local pid; pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null
}
# stop PIDFILE NAME: SIGTERM, wait up to 15 s, then SIGKILL; remove the pid file
stop() {
  if running "$1" "$2"; then
    local pid; pid=$(cat "$1"); say "stopping $2 (pid $pid)"
    kill "$pid" 2>/dev/null
    for _ in $(seq 60); do running "$1" "$2" || break; sleep 0.25; done
    if running "$1" "$2"; then say "$2 (pid $pid) ignored SIGTERM: SIGKILL"; kill -9 "$pid" 2>/dev/null; sleep 0.5; fi
  fi
  rm -f "$1"
}
[ "$(id -u)" = 0 ] || { echo "slurm: error: run me as root" >&2; exit 1; }
# jobs first: their job steps (slurmstepd and the user's processes) would outlive slurmd
if running /run/slurmctld.pid slurmctld; then
  jobs=$(squeue -h -o %A 2>/dev/null | sort -u | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    say "cancelling jobs $jobs"; scancel $jobs 2>/dev/null
    for _ in $(seq 60); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.25; done
  fi
fi
stop /run/slurmd.pid slurmd
stop /run/slurmctld.pid slurmctld
stop /run/munge/munged.pid munged
if [ "${1:-}" = "--purge" ]; then
  say "purging state, logs and config"
  rm -rf /var/lib/slurm/slurmctld/* /var/lib/slurm/slurmd/* "${LOG:?}"/*
  rm -f /etc/slurm/slurm.conf /etc/slurm/cgroup.conf
fi
say "stopped"
