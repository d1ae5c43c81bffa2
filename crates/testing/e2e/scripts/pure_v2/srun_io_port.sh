# srun's I/O port cannot reach another tenant on the pure v2 node (pure_cgroup_v2.rs): acme's
# job takes every connection to its port; globex's srun reports that port as its own (the
# LD_PRELOAD port rewrite, $W/bin/port_rewrite.so) for a step of globex's job, then acme's srun
# does the same for acme's own job (the control). Results: connections acme's job took after
# each, both tenants' drop counters before and after the attack.
. "$W/lib.sh"
drops() { nft list counter inet tenancy "drop_$1" | sed -n 's/.*packets \([0-9]*\).*/\1/p'; }
steered() { u=$1; port=$2; shift 2; as "$u" env LD_PRELOAD=$W/bin/port_rewrite.so TENANCY_REWRITE_PORT=$port timeout 30 "$@" </dev/null; }
# The step's slurmstepd has done all it tries (I/O, the launch response and its retries).
step_done() { i=0; until grep -F "[$1]" /tmp/slurm/log/slurmd.log | grep -q "done with "; do i=$((i + 1)); [ $i -gt 240 ] && return; sleep 0.5; done; }
R=$J/release; PORT=7801
a=$(as $A_USER sbatch --tenant=acme -o $J/a.out --wrap "$P collect $PORT $R"); a=${a##* }
g=$(as $G_USER sbatch --tenant=globex -o $J/g.out --wrap "$P envwait $R"); g=${g##* }
wait_line $J/a.out listening=; wait_line $J/g.out uid=
d0=$(drops globex); a0=$(drops acme)
steered $G_USER $PORT srun --jobid=$g --overlap -n1 -N1 echo globex-secret
step_done $g.0
echo "attack_accepted=$(grep -c '^from=' $J/a.out)" >>$RES
echo "globex_drops=$d0 $(drops globex)" >>$RES
echo "acme_drops=$a0 $(drops acme)" >>$RES
steered $A_USER $PORT srun --jobid=$a --overlap -n1 -N1 echo acme-own
step_done $a.0
echo "control_accepted=$(grep -c '^from=' $J/a.out)" >>$RES
touch $R; wait_done $a; wait_done $g
