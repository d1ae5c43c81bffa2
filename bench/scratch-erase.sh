#!/bin/sh
# Encrypted scratch (docs/encrypted-scratch.md), side by side with plain scratch:
#  - the epilog's scratch step for a job folder of SIZES GB in many files: today's wipe (every
#    file unlinked in the epilog) against crypto-erase (the key removed, the folder renamed
#    into the trash); the trash's deletion, which a detached process does after the epilog,
#    is timed apart;
#  - the prolog's scratch step with and without encryption (JOBS creates each: a fresh key,
#    the policy, the key added, against a plain folder), in microseconds.
# Run as root: it makes an ext4 file system with `mkfs.ext4 -O encrypt` on a loop device (a
# sparse image under BENCH_DIR, about SIZE + 2 GB at most), and removes it at the end.
#   cargo build --release -p tenancy-scratch --examples
#   sudo bench/scratch-erase.sh
# Env: SIZES ("1 10", GB), STATES ("cached cold"), DIRTY_SIZES ("1"), FILE_KB (64: the files' size), FILES_PER_DIR
#   (1000), JOBS (200), BENCH_DIR (/var/tmp/tenancy-erase-bench), BIN (target/release),
#   MIN_FREE_GB (3: a fill stops, and the bench fails, when the disk of BENCH_DIR has less free:
#   the machine is shared).
# The epilog step is timed in three states of the job's data: "cached" (written, synced, still
# in the page cache: a job whose output is on disk), "cold" (synced and the caches dropped: data
# the node evicted during a long job) and, for DIRTY_SIZES, "dirty" (written just before the
# end, not yet on disk). The key removal writes dirty data back (the kernel syncs the file
# system before it evicts the files), and drops the cached pages of the folder's files.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
BIN=${BIN:-${CARGO_TARGET_DIR:-$root/target}/release}
SIZES=${SIZES-"1 10"}; STATES=${STATES:-"cached cold"}; MIN_FREE_GB=${MIN_FREE_GB:-3}; DIRTY_SIZES=${DIRTY_SIZES-"1"}; FILE_KB=${FILE_KB:-64}; FILES_PER_DIR=${FILES_PER_DIR:-1000}
JOBS=${JOBS:-200}; BENCH_DIR=${BENCH_DIR:-/var/tmp/tenancy-erase-bench}
tool=$BIN/examples/scratchtool
[ -x "$tool" ] || { echo "missing $tool: cargo build --release -p tenancy-scratch --examples" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root (a loop device, fscrypt keys)" >&2; exit 2; }
max=0; for s in $SIZES; do [ "$s" -gt "$max" ] && max=$s; done
need_kb=$(( (max + 2) * 1024 * 1024 ))
mkdir -p "$BENCH_DIR"
free_kb=$(df -Pk "$BENCH_DIR" | awk 'NR==2 {print $4}')
if [ "$free_kb" -lt "$need_kb" ]; then
  echo "bench: $BENCH_DIR has $((free_kb / 1024 / 1024)) GB free, $((need_kb / 1024 / 1024)) GB needed" >&2
  exit 2
fi
img=$BENCH_DIR/scratch.img; mnt=$BENCH_DIR/mnt
cleanup() {
  umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  rm -f "$img"; rmdir "$mnt" "$BENCH_DIR" 2>/dev/null || true
}
trap cleanup EXIT INT TERM
truncate -s "$(( (max + 2) ))G" "$img"
mkfs.ext4 -q -F -O encrypt "$img"
mkdir -p "$mnt"; mount -o loop "$img" "$mnt"; chmod 755 "$mnt"
gid=$(getent group nogroup | cut -d: -f3); uid=$(id -u nobody)
tenant=bench
args="--root $mnt --tenant $tenant --tenant-gid $gid"
echo "host: $(nproc) CPUs, kernel $(uname -r), $(findmnt -no SOURCE,FSTYPE "$mnt") (ext4 -O encrypt), files of ${FILE_KB} KiB"

# Fills the job folder $1 with $2 GB in files of FILE_KB KiB, FILES_PER_DIR a folder; syncs
# unless $3 is dirty.
fill() {
  python3 - "$1" "$2" "$FILE_KB" "$FILES_PER_DIR" "$BENCH_DIR" "$MIN_FREE_GB" <<'EOF'
import os, sys
top, gb, kb, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
host, min_free = sys.argv[5], int(sys.argv[6]) << 30
chunk = os.urandom(kb * 1024)
n = gb * 1024 * 1024 // kb
for i in range(n):
    d = os.path.join(top, "d%05d" % (i // per))
    if i % per == 0:
        os.mkdir(d)
        st = os.statvfs(host)
        if st.f_bavail * st.f_frsize < min_free:
            sys.exit("bench: less than %d GB free on %s: stopped" % (min_free >> 30, host))
    with open(os.path.join(d, "f%06d" % i), "wb") as f:
        f.write(chunk)
print(n)
EOF
  [ "$3" = dirty ] || sync -f "$mnt"
}

job=1
printf '%-6s %-8s %-7s %-14s %12s %22s\n' size files state variant "epilog ms" "after the epilog (ms)"
for size in $SIZES; do
  states=$STATES
  case " $DIRTY_SIZES " in *" $size "*) states="$states dirty" ;; esac
  for state in $states; do
    for variant in wipe crypto-erase; do
      job=$((job + 1))
      if [ "$variant" = wipe ]; then
        "$tool" create $args --job "$job" --uid "$uid" >/dev/null 2>&1
      else
        made=$("$tool" create $args --job "$job" --uid "$uid" --encrypt 2>/dev/null)
        key=$(printf '%s' "$made" | sed -n 's/.*"key_id":"\([0-9a-f]*\)".*/\1/p')
      fi
      files=$(fill "$mnt/$tenant/job_$job" "$size" "$state")
      [ "$state" = cold ] && echo 3 > /proc/sys/vm/drop_caches
      if [ "$variant" = wipe ]; then
        us=$("$tool" wipe $args --job "$job" 2>&1 >/dev/null | tail -1)
        after=0
      else
        us=$("$tool" erase $args --job "$job" --key "$key" 2>&1 >/dev/null | tail -1)
        after=$("$tool" empty-trash --root "$mnt" 2>&1 >/dev/null | tail -1)
      fi
      sync -f "$mnt"
      printf '%-6s %-8s %-7s %-14s %12.1f %22.1f\n' "${size}GB" "$files" "$state" "$variant" \
        "$(echo "$us / 1000" | bc -l)" "$(echo "$after / 1000" | bc -l)"
    done
  done
done

# The prolog's scratch step, plain and encrypted: median and 90th percentile of JOBS creates.
stats() { sort -n | awk '{v[NR]=$1} END {printf "%8.0f %8.0f", v[int(NR*0.5)+1], v[int(NR*0.9)+1]}'; }
printf '\n%-26s %8s %8s   (microseconds, %s creates)\n' "prolog scratch step" median p90 "$JOBS"
for variant in plain encrypted; do
  flag=""; [ "$variant" = encrypted ] && flag=--encrypt
  printf '%-26s %s\n' "$variant" "$("$tool" bench-create --root "$mnt" --tenant "$tenant" \
    --tenant-gid "$gid" --uid "$uid" --jobs "$JOBS" $flag | stats)"
done
