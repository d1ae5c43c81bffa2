#!/bin/sh
# A job submitted without the SPANK plugin (slurmrestd): prints what isolates it, its cgroups,
# its TMPDIR and the tenant it was given.
cat /proc/self/cgroup
echo "TMPDIR=$TMPDIR"
echo "TENANT=$TENANCY_TENANT"
