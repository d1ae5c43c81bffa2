#!/bin/sh
# hyperfine's --prepare in plugin_bench.rs: LIB LIVE NAME: puts LIB/spank-NAME.so in LIVE's
# place (a new file renamed over: new processes load it, running ones keep theirs).
cp "$1/spank-$3.so" "$1/.next.so" && mv -f "$1/.next.so" "$2"
