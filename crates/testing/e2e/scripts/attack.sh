#!/bin/sh
# What a process of globex's job tries, run by Slurm for the job (a task prolog or epilog, the
# admin's TaskEpilog, an interactive step's shell): opens acme's MIG cap node and connects to
# acme's listener, reports with its cgroups into out-<job>-<pid> next to this script. Reads
# the probe, the node and the address from the files `probe`, `cap` and `addr` beside it;
# without `cap` (the admin's TaskEpilog before the test has written it) it does nothing.
D=$(dirname "$0")
[ -f "$D/cap" ] || exit 0
out=$D/out-$SLURM_JOB_ID-$$
{
  "$D/probe" open "$(cat "$D/cap")"
  "$D/probe" connect "$(cat "$D/addr")" 2000
  "$D/probe" env
  echo done=1
} >"$out.tmp" 2>&1
mv "$out.tmp" "$out"
