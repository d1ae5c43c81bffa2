#!/bin/sh
# A Prolog that records its environment (slurm_cluster.rs): what the SPANK plugin handed on
# reaches it as SPANK_* variables; written to prolog-env.<job> beside this script. Slurm runs it
# without PATH: absolute paths only.
/usr/bin/env > "$(/usr/bin/dirname "$0")/prolog-env.$SLURM_JOB_ID"
exit 0
