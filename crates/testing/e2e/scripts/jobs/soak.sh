#!/bin/sh
# A soak job (src/soak): sleeps SECS, then runs STEPS srun steps on its nodes.
secs=$1
steps=$2
sleep "$secs"
i=0
while [ "$i" -lt "$steps" ]; do
    srun /bin/true || exit 1
    i=$((i + 1))
done
