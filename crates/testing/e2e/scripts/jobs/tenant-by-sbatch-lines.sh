#!/bin/sh
#SBATCH --tenant=acme
#SBATCH --mig=1g.18gb
# A job that asks for its tenant and slice in #SBATCH lines (slurm_cluster.rs).
echo ran
