#!/bin/sh
# A job that uses its TMPDIR as any job does: mktemp, write and read, a 16 MB file copied,
# compared, moved and linked, and a listing. On an encrypted tier the folder is fscrypt's.
set -e
echo "tmpdir=$TMPDIR"
d=$(mktemp -d)
case "$d" in "$TMPDIR"/*) echo mktemp=inside ;; *) echo "mktemp=outside $d" ;; esac
echo hello > "$d/f" && echo "read=$(cat "$d/f")"
dd if=/dev/urandom of="$TMPDIR/big" bs=1M count=16 status=none
cp "$TMPDIR/big" "$TMPDIR/copy" && cmp "$TMPDIR/big" "$TMPDIR/copy" && echo cmp=ok
mv "$TMPDIR/copy" "$d/moved" && ln -s "$d/moved" "$TMPDIR/link" && cmp "$TMPDIR/link" "$TMPDIR/big" && echo links=ok
echo "files=$(ls "$TMPDIR" | sort | tr '\n' ,)"
echo done=ok
