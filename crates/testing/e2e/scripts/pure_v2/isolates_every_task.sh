# The pure cgroup v2 node isolates every task (pure_cgroup_v2.rs): acme's job listens on a port
# and keeps a secret in its scratch; globex's batch task, its steps and a task epilog of its
# own try acme's port, MIG cap nodes and scratch; acme's own steps are the controls. Results:
# each attempt's outcome, the jobs' slices and cgroups, as key=value lines in $RES.
. "$W/lib.sh"
R=$J/release; PORT=7777
a=$(as $A_USER sbatch --tenant=acme --mig=1g.18gb -o $J/a.out --wrap "$P env; $P write \$TMPDIR/secret s3cret; $P serve $PORT $R")
a=${a##* }
wait_line $J/a.out listening=
g=$(as $G_USER sbatch --tenant=globex --mig=3g.71gb -o $J/g.out --wrap "$P connect 127.0.0.1:$PORT 2000; $P envwait $R")
g=${g##* }
wait_line $J/g.out uid=
echo "a_job=$a" >>$RES; echo "g_job=$g" >>$RES
echo "batch_attack_connect=$(sed -n 's/^connect=//p' $J/g.out | head -1)" >>$RES
step() { u=$1; j=$2; shift 2; as "$u" srun --jobid=$j --overlap -n1 -N1 $P "$@"; }
echo "own_connect=$(step $A_USER $a connect 127.0.0.1:$PORT 2000 | sed -n 's/^connect=//p')" >>$RES
echo "step_attack_connect=$(step $G_USER $g connect 127.0.0.1:$PORT 2000 | sed -n 's/^connect=//p')" >>$RES
for c in $T/dev/nvidia-caps/*; do
  own=$(step $A_USER $a open $c | sed -n 's/^open=//p')
  other=$(step $G_USER $g open $c | sed -n 's/^open=//p')
  echo "cap_$(basename $c)=$own/$other" >>$RES
done
grep '^cgroup=' $J/a.out | head -3 | sed 's/^/a_batch_/' >>$RES
# Which instance each cap minor is (the stand-in's mig-minors), and the jobs' slices.
sed 's/^\([^ ]*\) \(.*\)/minor_\2=\1/' $T/nvml/mig-minors >>$RES
grep -h '^CUDA_VISIBLE_DEVICES=' $J/a.out | sed 's/^/a_/' >>$RES
grep -h '^CUDA_VISIBLE_DEVICES=' $J/g.out | sed 's/^/g_/' >>$RES
# Scratch: acme's private folder, read by acme's own step and attacked by globex's.
A_TMP=$(sed -n 's/^TMPDIR=//p' $J/a.out | head -1)
echo "own_scratch=$(step $A_USER $a read $A_TMP/secret | sed -n 's/^read=//p')" >>$RES
echo "scratch_attack=$(step $G_USER $g read $A_TMP/secret | sed -n 's/^read=//p')" >>$RES
# A task epilog (run by slurmstepd after the task, outside the task hook) attacks too.
cat >$J/attack.sh <<ATTACK
#!/bin/sh
{
  $P connect 127.0.0.1:$PORT 2000
  for c in $T/dev/nvidia-caps/*; do echo "cap \$(basename \$c) \$($P open \$c)"; done
  cat /proc/self/cgroup
} >$J/epi.out 2>&1
ATTACK
chmod 755 $J/attack.sh
as $G_USER srun --jobid=$g --overlap -n1 -N1 --task-epilog=$J/attack.sh true
wait_line $J/epi.out 0::
echo "epilog_connect=$(sed -n 's/^connect=//p' $J/epi.out)" >>$RES
grep '^cap ' $J/epi.out | while read _ n v; do echo "epi_$n=${v#open=}" >>$RES; done
echo "epilog_cgroup=$(grep '^0::' $J/epi.out)" >>$RES
touch $R
wait_done $a; wait_done $g
echo "a_state=$(job_state $a)" >>$RES
echo "g_state=$(job_state $g)" >>$RES
