#!/usr/bin/env bash
# Benchmark: `tenancyctl report --by tenant,profile`
# versus jq doing the same streaming reduction, on N generated records (default 5 million).
# Prints records/s, peak RSS, the ratio, and whether both produced the same figures.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
N=${N:-5000000}
NODES=${NODES:-16}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-audit}
DATA=${DATA:-$CARGO_TARGET_DIR/bench-data-$N}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

cargo build -q --release -p tenancyctl -p tenancy-accounting --example gen_logs
bin=$CARGO_TARGET_DIR/release/examples
ctl=$CARGO_TARGET_DIR/release/tenancyctl
if [ ! -f "$DATA/.complete" ]; then
  echo "generating $N records on $NODES nodes into $DATA ..."
  rm -rf "$DATA"
  "$bin/gen_logs" "$DATA" "$N" "$NODES" 42
  touch "$DATA/.complete"
fi
records=$(cat "$DATA"/*.jsonl | wc -l)
bytes=$(cat "$DATA"/*.jsonl | wc -c)
echo "input: $records records, $((bytes / 1048576)) MiB in $NODES files"

run() { # name cmd...
  local name=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -v -o "$OUT/$name.time" "$@" > "$OUT/$name.out"
  t1=$(date +%s.%N)
  local secs rss cpu
  secs=$(echo "$t1 - $t0" | bc -l)
  rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$OUT/$name.time")
  cpu=$(awk -F': ' '/User time|System time/ {s += $2} END {print s}' "$OUT/$name.time")
  printf '%-16s wall %8.2f s (%10.0f rec/s)  cpu %8.2f s (%10.0f rec/s)  peak RSS %7.1f MiB\n' \
    "$name" "$secs" "$(echo "$records / $secs" | bc -l)" "$cpu" "$(echo "$records / $cpu" | bc -l)" \
    "$(echo "$rss / 1024" | bc -l)"
  echo "$cpu" > "$OUT/$name.secs"
}

run tenancy-report "$ctl" report --by tenant,profile --format csv --no-progress "$DATA"
run jq jq -n -r -f "$here/report.jq" "$DATA"/*.jsonl
printf 'ratio (cpu time; the machine is shared): tenancy-report is %.1fx faster than jq\n' \
  "$(echo "$(cat "$OUT/jq.secs") / $(cat "$OUT/tenancy-report.secs")" | bc -l)"

# same figures? (our csv has a header row; columns are identical)
tail -n +2 "$OUT/tenancy-report.out" | awk -F, -v OFS=, '{for(i=5;i<=6;i++) $i=sprintf("%.3f",$i)} 1' > "$OUT/a"
awk -F, -v OFS=, '{for(i=5;i<=6;i++) $i=sprintf("%.3f",$i)} 1' "$OUT/jq.out" > "$OUT/b"
if diff -q "$OUT/a" "$OUT/b" >/dev/null; then
  echo "figures: identical ($(wc -l < "$OUT/a") groups)"
else
  echo "figures DIFFER:"; diff "$OUT/a" "$OUT/b" | head -20; exit 1
fi
head -5 "$OUT/tenancy-report.out"
