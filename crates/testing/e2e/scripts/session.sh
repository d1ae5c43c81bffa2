# An ssh session as pam_slurm_adopt leaves it (Cluster::session_in): `sh -c` of this text with
# GO PROGRAM ARGS...: waits until the file GO exists (the test has adopted it by then), then
# runs PROGRAM ARGS.
go=$1; shift; while [ ! -e "$go" ]; do sleep 0.05; done; exec "$@"
