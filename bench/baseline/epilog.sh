#!/bin/sh
# Baseline: the plain shell epilog undoing bench/baseline/prolog.sh.
set -eu
PATH=/usr/sbin:/usr/bin:/sbin:/bin
job=$SLURM_JOB_ID tenant=$SPANK_TENANCY_TENANT
nft delete element inet tenancy_base jobs "{ \"unified/tenancy-base/$tenant/job_$job\" }"
rmdir "/sys/fs/cgroup/unified/tenancy-base/$tenant/job_$job"
rmdir "/sys/fs/cgroup/devices/tenancy-base/$tenant/job_$job"
rm -rf "$BASE_DIR/scratch/$tenant/job_$job"
log=$BASE_DIR/audit.log
prev=$(tail -n 1 "$log" | sha256sum | cut -d ' ' -f 1)
line="$(date -u +%FT%T.%NZ) job_end job=$job user=$SLURM_JOB_USER tenant=$tenant prev=$prev"
sum=$(printf '%s' "$line" | sha256sum | cut -d ' ' -f 1)
printf '%s hash=%s\n' "$line" "$sum" >> "$log"
