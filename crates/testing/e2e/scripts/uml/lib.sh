# What every pure v2 scenario (scripts/pure_v2/) starts with (`. "$W/lib.sh"`; $W the node's
# folder of programs, files and results):
# `as USER CMD...` runs a client as a user, `$P` is the probe, `$J` a folder every user may
# write, `$T` the product's folder, results go to `$RES` as key=value lines; `$A_USER` and
# `$G_USER` are acme's and globex's users (the files a_user, g_user the test wrote).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
A_USER=$(cat "$W/a_user")
G_USER=$(cat "$W/g_user")
RES=$W/out/results
P=$W/bin/tenancy-e2e-probe
J=/tmp/slurm/jobs
T=/tmp/tenancy
as() { u=$1; shift; runuser -u "$u" -- env SLURM_CONF=$SLURM_CONF "$@"; }
job_state() { scontrol show job "$1" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
wait_done() {
  i=0
  while :; do
    case $(job_state "$1") in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL) return ;;
    esac
    i=$((i + 1)); [ $i -gt 240 ] && return; sleep 0.5
  done
}
wait_line() { i=0; until grep -q "^$2" "$1" 2>/dev/null; do i=$((i + 1)); [ $i -gt 240 ] && return; sleep 0.5; done; }
