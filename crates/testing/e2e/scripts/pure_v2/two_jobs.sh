# What the job folder scenarios of pure_cgroup_v2.rs start with (their own lines follow):
# acme's batch job with a MIG slice listening on $PORT ($a), globex's allocation without a
# shell ($g, its job folder $F), and `probe USER JOB KEY`, a new step of JOB as USER that tries
# acme's port and every MIG capability node and says where it ran; its results go to $RES as
# KEY_connect, KEY_cap_<node>, KEY_folder (the inode of the step's job folder), KEY_rc and
# KEY_refused (the step was refused because its job folder was made again).
# `end_two_jobs` ends both jobs; folder_after_end says whether the epilog removed globex's job
# folder and its keeper.
. "$W/lib.sh"
R=$J/release; PORT=7777
cat >$J/probe.sh <<PROBE
#!/bin/sh
$P connect 127.0.0.1:$PORT 2000
for c in $T/dev/nvidia-caps/*; do echo "cap \$(basename \$c) \$($P open \$c)"; done
cg=\$(sed -n 's/^0:://p' /proc/self/cgroup)
echo "cgroup=\$cg"
stat -c 'folder=%i' /sys/fs/cgroup\$(echo \$cg | cut -d/ -f1-4)
PROBE
chmod 755 $J/probe.sh
probe() {
  as "$1" timeout 120 srun --jobid=$2 --overlap -n1 -N1 sh $J/probe.sh >$J/$3.out 2>&1
  echo "$3_rc=$?" >>$RES
  echo "$3_connect=$(sed -n 's/^connect=//p' $J/$3.out | head -1)" >>$RES
  echo "$3_folder=$(sed -n 's/^folder=//p' $J/$3.out | head -1)" >>$RES
  grep '^cap ' $J/$3.out | while read _ n v; do echo "$3_cap_$n=${v#open=}" >>$RES; done
  echo "$3_refused=$(grep -c 'made again' $J/$3.out)" >>$RES
}
folder() { stat -c %i $F 2>/dev/null || echo gone; }
# Until globex's steps have left (slurmstepd removes its folders, then tries the job's).
steps_gone() { i=0; while ls -d $F/step_* >/dev/null 2>&1; do i=$((i + 1)); [ $i -gt 120 ] && break; sleep 0.5; done; sleep 1; }
end_two_jobs() {
  scancel $g; touch $R
  wait_done $a; wait_done $g
  i=0; while [ -d $F ] && [ $i -lt 60 ]; do i=$((i + 1)); sleep 0.5; done
  echo "folder_after_end=$(folder)" >>$RES
  echo "a_state=$(job_state $a)" >>$RES
}
a=$(as $A_USER sbatch --tenant=acme --mig=1g.18gb -o $J/a.out --wrap "$P serve $PORT $R")
a=${a##* }
wait_line $J/a.out listening=
g=$(as $G_USER timeout 120 salloc --tenant=globex --no-shell 2>&1 | sed -n 's/.*Granted job allocation \([0-9]*\).*/\1/p')
F=$(echo /sys/fs/cgroup/system.slice/*slurmstepd.scope)/job_$g
echo "a_job=$a" >>$RES; echo "g_job=$g" >>$RES
echo "folder_prolog=$(folder)" >>$RES
echo "keeper_prolog=$([ -d $F/tenancy-keeper ] && echo yes || echo no)" >>$RES
probe $A_USER $a own
