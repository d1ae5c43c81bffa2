#!/bin/sh
# What the shell baseline runs between two product jobs, without its side effects.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
d=$(mktemp -d /tmp/pollute.XXXXXX)
id root >/dev/null
mkdir -p "$d/a/b"; chown 0:0 "$d/a/b"; chmod 0700 "$d/a/b"
nft list tables >/dev/null
tail -n 1 /etc/passwd | sha256sum | cut -d ' ' -f 1 >/dev/null
date -u +%FT%T.%NZ >/dev/null
printf '%s' x | sha256sum >/dev/null
rm -rf "$d"
