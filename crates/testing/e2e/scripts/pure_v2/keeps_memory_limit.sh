# Slurm's memory limit still holds on the pure cgroup v2 node with the product
# (pure_cgroup_v2.rs): the same 200 MB allocation under --mem=64 and --mem=480; each job's
# state, whether the task survived, and its cgroup, as key=value lines in $RES.
. "$W/lib.sh"
hog='cat /proc/self/cgroup; head -c 200000000 /dev/zero | tail >/dev/null && echo survived=yes'
for mem in 64 480; do
  j=$(as $A_USER sbatch --tenant=acme --mem=$mem -o $J/mem$mem.out --wrap "$hog")
  j=${j##* }
  wait_done $j
  echo "state_$mem=$(job_state $j)" >>$RES
  echo "survived_$mem=$(grep -c '^survived=yes' $J/mem$mem.out)" >>$RES
  echo "cgroup_$mem=$(grep '^0::' $J/mem$mem.out)" >>$RES
done
