# The owner's srun and sattach from outside the job on the pure v2 node (pure_cgroup_v2.rs),
# with no infrastructure entry in the config (the test's) and no egress entry: srun (stdin in,
# stdout out) and sattach (into a running step) from the node's shell, where the node's name is
# its own address, not loopback, and from a login host in a network namespace beside the node.
. "$W/lib.sh"
R=$J/release
echo "infrastructure=$(grep -c '^infrastructure = \[\]' /tmp/slurm/tenancy.toml)" >>$RES
# The node's name is its own address for the shell's clients; the login host's, the node's
# end of its veth pair (bind mounts inside the node only).
echo "192.0.2.10 vm" >/tmp/hosts.node; mount --bind /tmp/hosts.node /etc/hosts
ip netns add login
ip link add lv0 type veth peer name lv1 netns login
ip addr add 10.9.0.1/30 dev lv0; ip link set lv0 up
ip -n login addr add 10.9.0.2/30 dev lv1; ip -n login link set lv1 up; ip -n login link set lo up
echo "10.9.0.1 vm" >/tmp/hosts.login
node() { "$@"; }
# shellcheck disable=SC2016 # expanded by the inner shell
login() { ip netns exec login unshare -m sh -c 'mount --bind /tmp/hosts.login /etc/hosts && exec "$@"' login "$@"; }
a=$(as $A_USER sbatch --tenant=acme -o $J/a.out --wrap "$P envwait $R"); a=${a##* }
wait_line $J/a.out uid=
for at in node login; do
  out=$(echo "hello from the $at" | $at runuser -u $A_USER -- env SLURM_CONF=$SLURM_CONF timeout 60 srun --jobid=$a --overlap -n1 -N1 cat 2>$J/srun-$at.err)
  echo "srun_$at=$out" >>$RES
  # A step the node's shell starts, its stdin held open by a fifo; then sattach into it.
  rm -f /tmp/in-$at; mkfifo /tmp/in-$at
  as $A_USER srun --jobid=$a --overlap -n1 -N1 cat </tmp/in-$at >/dev/null 2>&1 &
  exec 3>/tmp/in-$at
  i=0; s=
  while [ -z "$s" ] && [ $i -lt 120 ]; do
    s=$(squeue -h -s -j $a -o %i | grep -v 'batch\|extern' | tail -1)
    [ -n "$s" ] && ! scontrol listpids "$s" 2>/dev/null | grep -q " ${s#*.} " && s=
    i=$((i + 1)); sleep 0.5
  done
  ( for k in 1 2 3 4 5 6; do sleep 2; echo "attached from the $at"; done ) |
    $at runuser -u $A_USER -- env SLURM_CONF=$SLURM_CONF timeout 20 sattach "$s" >$J/sattach-$at.out 2>$J/sattach-$at.err
  echo "sattach_$at=$(grep -c "attached from the $at" $J/sattach-$at.out)" >>$RES
  exec 3>&-
  wait
done
touch $R; wait_done $a
echo "a_state=$(job_state $a)" >>$RES
