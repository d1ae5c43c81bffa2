#!/bin/sh
# The demo's job (src/bin/tenancy-demo/main.rs): PROBE PORT RELEASE: reports what it got, keeps its
# user's data in its scratch, and listens on PORT until the file RELEASE exists.
P=$1 PORT=$2 RELEASE=$3
"$P" env
"$P" write "$TMPDIR/secret.txt" "$USER's data"
"$P" serve "$PORT" "$RELEASE"
