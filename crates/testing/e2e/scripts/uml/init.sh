#!/bin/sh
# PID 1 of the pure cgroup v2 node (uml_node.rs): file systems, a pure cgroup v2 tree with memory
# and pids for Slurm, an address for slurmd, munged, Slurm with cgroup/v2 (slurm.conf and
# cgroup.conf as the test wrote them into this script's folder, $W), setup.sh before the daemons
# start, then scenario.sh once the node is idle; results as key=value lines in $W/out/results;
# then power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
W=$(dirname "$0")
export W
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
chmod 1777 /tmp
exec >$W/out/init.log 2>&1
echo "+cpu +memory +pids" >/sys/fs/cgroup/cgroup.subtree_control
hostname vm
ip link set lo up
ip link add d0 type dummy && ip addr add 192.0.2.10/24 dev d0 && ip link set d0 up
grep -q ' vm$' /etc/hosts || echo '192.0.2.10 vm' >>/etc/hosts
mkdir -p /run/munge && chown munge:munge /run/munge
# Logs and seed on tmpfs: hostfs shows files the node writes as the host's root, and munged
# refuses a log it does not own.
runuser -u munge -- munged --force --log-file=/run/munge/munged.log --seed-file=/run/munge/munged.seed
S=/tmp/slurm
mkdir -p $S/state $S/spool $S/run $S/log $S/jobs && chmod 1777 $S/jobs
cp $W/slurm.conf $W/cgroup.conf $S/
export SLURM_CONF=$S/slurm.conf
sh $W/setup.sh >$W/out/setup.log 2>&1
echo "setup_rc=$?" >>$W/out/results
slurmctld -i
slurmd
# At most 90 s: a client without munge waits for its message timeout each time.
end=$(($(date +%s) + 90))
until timeout 5 sinfo -h -o %t 2>/dev/null | grep -q idle; do
  [ "$(date +%s)" -gt $end ] && break; sleep 0.5
done
state=$(timeout 5 sinfo -h -o %t 2>&1)
echo "node_state=$state" >>$W/out/results
# A node that did not come up runs no scenario: its logs say why.
if [ "$state" = idle ]; then
  sh $W/scenario.sh >$W/out/scenario.log 2>&1
  echo "scenario_rc=$?" >>$W/out/results
fi
cp $S/log/*.log $W/out/ 2>/dev/null
sync
echo o >/proc/sysrq-trigger
