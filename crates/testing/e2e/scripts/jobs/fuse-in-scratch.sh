#!/bin/sh
# A job that leaves a FUSE mount in its scratch (hardening.rs): PROBE: reports, mounts
# $TMPDIR/src on $TMPDIR/m with bindfs, prints mounted=1 when the mount is there.
"$1" env
mkdir "$TMPDIR/src" "$TMPDIR/m" && echo x > "$TMPDIR/src/f" &&
  bindfs --no-allow-other "$TMPDIR/src" "$TMPDIR/m" &&
  grep -c " $TMPDIR/m " /proc/self/mountinfo | sed 's/^/mounted=/'
