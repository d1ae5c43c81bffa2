#!/bin/sh
# A job of abstract_unix_socket_of_another_tenant_is_refused (slurm_daemons.rs): PROBE NAME UNTIL:
# serves the abstract UNIX socket NAME until the file UNTIL exists, connects to it from the same
# step (uconnect=), then reports (env) and waits for the server.
P=$1
NAME=$2
UNTIL=$3
"$P" userve "$NAME" "$UNTIL" &
sleep 1
"$P" uconnect "$NAME"
"$P" env
wait
