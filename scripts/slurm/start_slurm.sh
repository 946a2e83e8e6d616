#!/usr/bin/env bash
# Start a one-node Slurm cluster on this machine (Debian/Ubuntu, root, no systemd needed), for CI and local tests
# of `python -m dwg.pipeline.cli run --slurm`. Idempotent: installs slurm-wlm + munge when missing, (re)writes the config,
# starts only the daemons that are not running (restarts them when the config changed), then runs a smoke job.
#
#   sudo scripts/slurm/start_slurm.sh        # "slurm: ready on <host>" when done (~15 s when installed)
#   sudo scripts/slurm/stop_slurm.sh         # stop the daemons by PID (--purge: also wipe state and config)
#
# Environment: DWG_SLURM_PARTITION (default debug), DWG_SLURM_LOG (default /var/log/slurm).
# Pitfalls handled: no systemd (daemons started by hand; munged as user munge); slurmd dies without a cgroup.conf
# naming cgroup/v1 on hosts without the cgroup v2 plugin; the node line must come from `slurmd -C` (claiming more
# memory/CPUs than present drains the node); batch_sched_delay=0 so array tasks start at once; kill_invalid_depend so a
# job whose dependency can never be met (a parent failed) is cancelled instead of pending forever; MinJobAge keeps
# finished jobs visible to `scontrol show job` for an hour (there is no accounting database).
set -euo pipefail

PARTITION=${DWG_SLURM_PARTITION:-debug}
LOG=${DWG_SLURM_LOG:-/var/log/slurm}
CONF=/etc/slurm/slurm.conf
NODE=$(hostname -s)

say() { echo "slurm: $*"; }
die() { echo "slurm: error: $*" >&2; exit 1; }
# running PIDFILE NAME: the pid in PIDFILE is a live (non-zombie) process called NAME
running() {
  local pid; pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null
}
# retry N CMD...: run CMD every 0.25 s until it succeeds, at most N times
retry() { local n=$1; shift; for _ in $(seq "$n"); do if "$@" >/dev/null 2>&1; then return 0; fi; sleep 0.25; done; return 1; }

[ "$(id -u)" = 0 ] || die "run me as root (I install packages and start daemons)"

# 1. packages
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }
if ! installed slurm-wlm || ! installed munge; then
  say "installing slurm-wlm and munge (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi
command -v slurmctld >/dev/null || die "slurmctld not found after installing slurm-wlm"

# 2. name resolution: slurmctld must resolve its own host name
getent hosts "$NODE" >/dev/null || echo "127.0.0.1 $NODE" >> /etc/hosts

# 3. munge (authentication between the daemons and the clients)
if [ ! -s /etc/munge/munge.key ]; then
  say "creating /etc/munge/munge.key"
  head -c 1024 /dev/urandom > /etc/munge/munge.key
fi
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
running /run/munge/munged.pid munged || { say "starting munged"; runuser -u munge -- /usr/sbin/munged; }
retry 40 sh -c 'munge -n | unmunge' || die "munge does not work (see /var/log/munge/munged.log)"

# 4. configuration
install -d -o slurm -g slurm -m 0755 /var/lib/slurm/slurmctld /var/lib/slurm/slurmd "$LOG"
node_line=$(slurmd -C | head -n 1)      # NodeName=... CPUs=... RealMemory=... as slurmd sees this machine
case "$node_line" in NodeName=*) ;; *) die "unexpected output of slurmd -C: $node_line" ;; esac
new=$(mktemp)
cat > "$new" <<CONF
# written by dwg scripts/slurm/start_slurm.sh: a one-node cluster for tests
ClusterName=dwg
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
MailProg=/bin/true
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.log
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
DependencyParameters=kill_invalid_depend
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=3600
KillWait=5
MpiDefault=none
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
echo 'CgroupPlugin=cgroup/v1' > /etc/slurm/cgroup.conf
if cmp -s "$new" "$CONF"; then
  rm -f "$new"
else
  say "writing $CONF ($node_line)"
  install -m 0644 "$new" "$CONF"; rm -f "$new"
  for d in slurmd slurmctld; do     # running daemons read the old config: restart them
    if running "/run/$d.pid" "$d"; then
      say "config changed: stopping $d (pid $(cat /run/$d.pid))"
      kill "$(cat /run/$d.pid)"
      for _ in $(seq 60); do running "/run/$d.pid" "$d" || break; sleep 0.25; done
    fi
  done
fi

# 5. daemons (both daemonize; slurmctld drops to user slurm)
running /run/slurmctld.pid slurmctld || { say "starting slurmctld"; slurmctld; }
retry 120 sh -c 'scontrol ping | grep -q UP' || die "slurmctld does not answer (see $LOG/slurmctld.log)"
running /run/slurmd.pid slurmd || { say "starting slurmd"; slurmd -N "$NODE"; }
state=""
for _ in $(seq 120); do
  state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
  case "$state" in
    idle|mixed|allocated|completing|planned) break ;;
    down*|drain*|fail*) scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
case "$state" in idle|mixed|allocated|completing|planned) ;; *) die "node $NODE is '$state' (see $LOG/slurmd.log)" ;; esac

# 6. smoke job: submit, wait, check it completed
job=$(sbatch --parsable -J dwg-slurm-smoke -o /dev/null --wrap 'hostname >/dev/null') || die "sbatch failed"
retry 240 sh -c "[ -z \"\$(squeue -h -j $job 2>/dev/null)\" ]" || die "smoke job $job did not finish"
scontrol show job "$job" | grep -q 'JobState=COMPLETED' || die "smoke job $job did not complete: $(scontrol show job "$job" | grep -o 'JobState=[A-Z_]*')"
say "ready on $NODE (partition $PARTITION, $(sinfo -h -o '%c CPUs, %m MB'); slurmctld pid $(cat /run/slurmctld.pid), slurmd pid $(cat /run/slurmd.pid))"
