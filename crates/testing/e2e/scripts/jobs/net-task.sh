#!/bin/sh
# A multi-node job (MultiNode::sbatch): one task per node runs src/net_task.py with the
# arguments (TASK MODE ARGS...); what it needs from the test comes in the job's environment.
srun /usr/bin/python3 "$@"
