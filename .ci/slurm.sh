#!/usr/bin/env bash
# Best effort, for CI: a single-node SLURM (Debian's slurm-wlm daemons) so that the batch-system
# tests in tests/test_slurm_pbs.py run against a real sbatch; without it they are skipped.  Needs
# root and apt; takes well under a minute.  Idempotent: running daemons are left as they are.
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "slurm.sh: not root, no SLURM"; exit 1; }
if ! command -v slurmctld >/dev/null || ! command -v sbatch >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null \
        || { apt-get update -q >/dev/null && apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null; }
fi
host=$(hostname -s)
mkdir -p /etc/slurm /var/spool/slurmd /var/spool/slurmctld /var/log/slurm /run/munge
if ! grep -q "dtrain single-node" /etc/slurm/slurm.conf 2>/dev/null; then
    # CPUs is deliberately more than the machine has (config_overrides): the MPI job of the
    # tests runs 3 ranks on a 2-core machine.
    cat > /etc/slurm/slurm.conf <<CONF
# dtrain single-node SLURM for CI (.ci/slurm.sh)
ClusterName=dtrain-ci
SlurmctldHost=$host
AuthType=auth/munge
SlurmUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host CPUs=8 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
fi
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 2>/dev/null; }
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
chmod 0400 /etc/munge/munge.key
pgrep -x munged >/dev/null || su -s /bin/sh munge -c munged
pgrep -x slurmctld >/dev/null || slurmctld
pgrep -x slurmd >/dev/null || slurmd
for _ in $(seq 40); do
    sinfo -h -o %T 2>/dev/null | grep -qE "idle|mixed" && { echo "slurm.sh: SLURM is up"; exit 0; }
    sleep 0.5
done
echo "slurm.sh: SLURM did not come up"; exit 1
