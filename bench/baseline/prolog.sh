#!/bin/sh
# Baseline: a plain shell prolog doing the product's non-GPU work with the usual commands.
# Run as root with the Slurm prolog environment plus BASE_DIR (see bench/job-path.sh).
# identity: one `id` of the job's user: its uid is the job's and it is in the tenant's group
# (BASE_TENANT_GROUP), as the product re-checks both; devices: v1 devices cgroup (deny NVIDIA,
# allow nvidiactl); network: cgroup v2 dir + nft set element; scratch: mkdir/chown/chmod; audit:
# one line chained by sha256 to the previous line.
set -eu
PATH=/usr/sbin:/usr/bin:/sbin:/bin
job=$SLURM_JOB_ID uid=$SLURM_JOB_UID gid=$SLURM_JOB_GID tenant=$SPANK_TENANCY_TENANT
ids=$(id "$SLURM_JOB_USER")
case "$ids" in "uid=$uid("*) ;; *) echo "job $job: $SLURM_JOB_USER is not uid $uid" >&2; exit 1 ;; esac
case "$ids" in *" groups="*"($BASE_TENANT_GROUP)"*) ;; *) echo "job $job: $SLURM_JOB_USER is not in $BASE_TENANT_GROUP" >&2; exit 1 ;; esac
dev=/sys/fs/cgroup/devices/tenancy-base/$tenant/job_$job
mkdir -p "$dev"
echo 'c 195:* rwm' > "$dev/devices.deny"
echo 'c 195:255 rw' > "$dev/devices.allow"
net=/sys/fs/cgroup/unified/tenancy-base/$tenant/job_$job
mkdir -p "$net"
nft add element inet tenancy_base jobs "{ \"unified/tenancy-base/$tenant/job_$job\" }"
scratch=$BASE_DIR/scratch/$tenant/job_$job
mkdir -p "$scratch"
chown "$uid:$gid" "$scratch"
chmod 0700 "$scratch"
log=$BASE_DIR/audit.log
touch "$log"
prev=$(tail -n 1 "$log" | sha256sum | cut -d ' ' -f 1)
line="$(date -u +%FT%T.%NZ) job_start job=$job user=$SLURM_JOB_USER tenant=$tenant prev=$prev"
sum=$(printf '%s' "$line" | sha256sum | cut -d ' ' -f 1)
printf '%s hash=%s\n' "$line" "$sum" >> "$log"
