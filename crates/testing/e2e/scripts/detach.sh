#!/bin/sh
# A process left behind by a job (product.rs, nothing_a_job_started_outlives_it): starts the
# probe in a session of its own, waiting ten minutes on MARKER (a path never made), then, with
# RELEASE, reports and waits for it. PROBE MARKER [RELEASE] are the arguments, or, where Slurm
# runs this as a task prolog or epilog (no arguments), the lines of the file $0.args.
if [ $# -eq 0 ]; then
  set -- $(cat "$0.args")
fi
setsid "$1" wait "$2" 600 </dev/null >/dev/null 2>&1 &
if [ -n "${3:-}" ]; then
  "$1" envwait "$3"
fi
