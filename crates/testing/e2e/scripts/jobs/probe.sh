#!/bin/sh
# A job of the e2e tests (Env::probe_job): PROBE STEP...: runs the probe once per STEP, the
# step's words its arguments (`env`, `envwait FILE`, `serve PORT FILE`, `write PATH TEXT`).
P=$1
shift
for step in "$@"; do
  # shellcheck disable=SC2086 # a step is the probe's words
  "$P" $step
done
