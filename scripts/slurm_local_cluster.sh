#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine (Debian's slurm-wlm and munge), for CI and for trying the
# generated sbatch scripts locally: `start` installs (if needed), configures and starts munged, slurmctld and
# slurmd, and waits until the node takes jobs; `stop` stops them. Needs root (CI runs as root).
set -euo pipefail
cmd=${1:-start}
CONF_DIR=/etc/slurm
NODE=$(hostname -s)

stop() {
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
    pkill -x munged 2>/dev/null || true
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: $0 start|stop" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "$0: starting slurmctld/slurmd needs root" >&2; exit 2; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
fi
stop
sleep 1

# munge: a key of its own, runtime dirs owned by the munge user
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none; }
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge
runuser -u munge -- munged --force

# slurm: node facts from slurmd -C (CPUs, memory), no cgroups, no accounting daemon
mkdir -p "$CONF_DIR" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
node_line=$(slurmd -C | head -1 | sed 's/ UpTime.*//')
cat > "$CONF_DIR/slurm.conf" <<CONF
ClusterName=local
SlurmctldHost=$NODE(127.0.0.1)
AuthType=auth/munge
SlurmUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
rm -f "$CONF_DIR/cgroup.conf"
fail() { echo "slurm: $1 did not start; see /var/log/slurm/" >&2; tail -20 /var/log/slurm/*.log >&2 || true; exit 1; }
slurmctld -c || fail slurmctld
slurmd -N "$NODE" || fail slurmd
for _ in $(seq 60); do
    state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null || true)
    case "$state" in idle|mixed|allocated) echo "slurm: node $NODE $state ($(sinfo -V))"; exit 0 ;; esac
    sleep 1
done
echo "slurm: node $NODE did not come up (state: ${state:-none}); see /var/log/slurm/" >&2
tail -20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
