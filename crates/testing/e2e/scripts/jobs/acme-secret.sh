#!/bin/sh
# acme's job beside another tenant's (product.rs): PROBE PORT RELEASE: reports what it got,
# leaves a secret in its scratch, and listens on PORT until the file RELEASE exists.
P=$1 PORT=$2 RELEASE=$3
"$P" env
"$P" write "$TMPDIR/secret" acme-secret
"$P" serve "$PORT" "$RELEASE"
