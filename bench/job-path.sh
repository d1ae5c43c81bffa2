#!/bin/sh
# Benchmark of the per-job path: tenancy-prolog + tenancy-epilog (MIG through nvml-shim, devices,
# network, scratch, audit) side by side with a plain shell prolog/epilog (bench/baseline/).
# Run as root on a node with cgroup2 and nftables; the bench user (default acme1 in group acme)
# is created for the run when missing:
#   cargo build --release -p tenancy-prolog -p tenancyctl -p nvml-shim
#   sudo bench/job-path.sh            # pair: 200 jobs per variant, then fill: N=0 and N=999
# Env: BIN (folder of the built binaries, default target/release), JOB_PATH (folder of the
#   prolog, epilog and dynamic build to measure; default target/job-path/release, which
#   scripts/build-job-path makes, run from here when that folder is missing or older than BIN's
#   build), BENCH_DIR (/tmp/tenancy-bench),
#   JOBS (200), VARIANTS (pair mode: product+mig,product,baseline-sh; their order rotates job by job), FILL ("0 999"), REPEAT (30 per round), ROUNDS (6), MODES ("pair fill"), BENCH_USER (acme1),
#   FLUSH_MB (pair mode: MiB the driver reads before every variant's job so that each starts with
#   the CPU caches evicted, as after a real job; 64; 0 = back to back, which favours whichever
#   variant follows one with the same binaries), BETWEEN (pair mode: a command run before every
#   variant's job, e.g. bench/pollute.sh),
#   BENCH_TENANT (acme; its group is the user's primary group), FIRST_JOB (7100000).
# It loads the product's nft table `inet tenancy` (tenancyctl firewall apply) and a baseline table
# `inet tenancy_base`; the baseline table and cgroups are removed at the end, and so is the product
# table when the bench loaded it (it was not there before).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
BIN=${BIN:-${CARGO_TARGET_DIR:-$root/target}/release}
# What a node installs: scripts/build-job-path's folder, (re)made here when it is missing or
# older than the release build.
if [ -z "${JOB_PATH:-}" ]; then
  JOB_PATH=${CARGO_TARGET_DIR:-$root/target}/job-path/release
  if [ ! -e "$JOB_PATH/tenancy-prolog" ] || [ "$JOB_PATH/tenancy-prolog" -ot "$BIN/tenancy-prolog" ]; then
    echo "bench: scripts/build-job-path (the prolog and epilog as a node installs them)" >&2
    "$root/scripts/build-job-path" >/dev/null || {
      echo "WARNING: scripts/build-job-path failed: measuring the build in $BIN" >&2
      JOB_PATH=$BIN
    }
  fi
fi
BENCH_DIR=${BENCH_DIR:-/tmp/tenancy-bench}
JOBS=${JOBS:-200}; VARIANTS=${VARIANTS:-product+mig,product,baseline-sh}; BETWEEN=${BETWEEN:-}; FLUSH_MB=${FLUSH_MB-64}; FILL=${FILL:-"0 999"}; REPEAT=${REPEAT:-30}; ROUNDS=${ROUNDS:-6}; MODES=${MODES:-"pair fill"}
BENCH_USER=${BENCH_USER:-acme1}; BENCH_TENANT=${BENCH_TENANT:-acme}; FIRST_JOB=${FIRST_JOB:-7100000}
# A missing bench user is created (no home, no login shell) in a group named after the tenant,
# and removed again at the end, with the group if that was created too.
made_user=no; made_group=no
if ! id "$BENCH_USER" >/dev/null 2>&1; then
  getent group "$BENCH_TENANT" >/dev/null || { groupadd "$BENCH_TENANT"; made_group=yes; }
  useradd -M -N -g "$BENCH_TENANT" -s /usr/sbin/nologin "$BENCH_USER"; made_user=yes
  # Until the full cleanup below takes over.
  trap '[ "$made_user" = no ] || userdel "$BENCH_USER"; [ "$made_group" = no ] || groupdel "$BENCH_TENANT"' EXIT
fi
uid=$(id -u "$BENCH_USER"); gid=$(id -g "$BENCH_USER"); group=$(id -gn "$BENCH_USER")
for b in "$JOB_PATH/tenancy-prolog" "$JOB_PATH/tenancy-epilog" "$JOB_PATH/tenancy-prolog-dynamic" \
         "$BIN/tenancyctl" "$BIN/nvml-shim-ctl" "$BIN/libnvidia_ml.so"; do
  [ -e "$b" ] || { echo "missing $b: build in release first (see the top of $0)" >&2; exit 2; }
done
libc=$(cat "$JOB_PATH/LIBC" 2>/dev/null || echo "glibc (cargo build)")
mkdir -p "$BENCH_DIR/scratch" "$BENCH_DIR/base/scratch"
# The bench runs installed copies, as docs/admin-guide.md installs them (`install -m 0755`), not the
# linker's output files: the page cache holds the two differently, and the installed copy starts
# with ~8 fewer page faults per process (A/B: 3.92 -> 3.79 ms per job, same build).
built=$BIN; BIN=$BENCH_DIR/bin
install -d "$BIN"
install -m 0755 "$JOB_PATH/tenancy-prolog" "$JOB_PATH/tenancy-epilog" "$JOB_PATH/tenancy-prolog-dynamic" \
  "$built/tenancyctl" "$built/nvml-shim-ctl" \
  "$built/libnvidia_ml.so" "$BIN/"
chmod 755 "$BENCH_DIR/scratch"
cat > "$BENCH_DIR/fixture.toml" <<EOT
state = "$BENCH_DIR/shim-state.json"
dev_dir = "$BENCH_DIR/dev"
mig_minors = "$BENCH_DIR/mig-minors"
proc_devices = "$BENCH_DIR/proc-devices"
[[gpus]]
model = "H200-141GB"
[[gpus]]
model = "H200-141GB"
EOT
# The anchor key, as docs/admin-guide.md recommends: every job end's anchor carries its HMAC.
head -c 32 /dev/urandom > "$BENCH_DIR/anchor.key"
chmod 600 "$BENCH_DIR/anchor.key"
cat > "$BENCH_DIR/tenancy.toml" <<EOT
[cluster]
name = "bench"
state_dir = "$BENCH_DIR/state"
audit_log = "$BENCH_DIR/audit.jsonl"
audit_anchor_key = "$BENCH_DIR/anchor.key"
scratch_root = "$BENCH_DIR/scratch"
nvml_library = "$BIN/libnvidia_ml.so"
nvml_shim_fixture = "$BENCH_DIR/fixture.toml"
[node]
proc_devices = "$BENCH_DIR/proc-devices"
mig_minors = "$BENCH_DIR/mig-minors"
nvidia_caps_dir = "$BENCH_DIR/dev/nvidia-caps"
[tiers.internal]
mig_profiles = ["1g.18gb", "3g.71gb"]
[tenants.$BENCH_TENANT]
tier = "internal"
groups = ["$group"]
EOT
# Each node signs its anchors with its own Ed25519 key (issue 43; at <state_dir>/audit-signing.key,
# where the package makes it): made here once; a build before it has no `audit keygen`.
mkdir -p "$BENCH_DIR/state"
"$BIN/tenancyctl" --config "$BENCH_DIR/tenancy.toml" audit keygen --if-missing >/dev/null 2>&1 || true
# The stand-in's device nodes, mig-minors and proc-devices exist before the first job, so that a
# run without the MIG variant (VARIANTS=product,baseline-sh) finds them too.
NVML_SHIM_FIXTURE="$BENCH_DIR/fixture.toml" "$BIN/nvml-shim-ctl" layout >/dev/null
had_table=no; nft list table inet tenancy >/dev/null 2>&1 && had_table=yes
"$BIN/tenancyctl" --config "$BENCH_DIR/tenancy.toml" firewall apply >/dev/null
# Baseline: one set of job cgroups, filled and emptied by the shell scripts.
mkdir -p "/sys/fs/cgroup/unified/tenancy-base/$BENCH_TENANT" "/sys/fs/cgroup/devices/tenancy-base/$BENCH_TENANT"
nft delete table inet tenancy_base 2>/dev/null || true
nft -f - <<EOT
table inet tenancy_base {
  set jobs { typeof socket cgroupv2 level 3; }
  chain out { type filter hook output priority 0; policy accept; socket cgroupv2 level 3 @jobs counter accept; }
}
EOT
cleanup() {
  nft delete table inet tenancy_base 2>/dev/null || true
  [ "$made_user" = no ] || userdel "$BENCH_USER" 2>/dev/null || true
  [ "$made_group" = no ] || groupdel "$BENCH_TENANT" 2>/dev/null || true
  if [ "$had_table" = no ]; then
    nft delete table inet tenancy 2>/dev/null || true
    # (with the keeper of the device programs the jobs shared)
    rmdir "/sys/fs/cgroup/unified/tenancy/$BENCH_TENANT" /sys/fs/cgroup/unified/tenancy/.device-programs \
      /sys/fs/cgroup/unified/tenancy 2>/dev/null || true
  fi
  rmdir "/sys/fs/cgroup/unified/tenancy-base/$BENCH_TENANT" /sys/fs/cgroup/unified/tenancy-base \
    "/sys/fs/cgroup/devices/tenancy-base/$BENCH_TENANT" /sys/fs/cgroup/devices/tenancy-base 2>/dev/null || true
}
trap cleanup EXIT
set -- --config "$BENCH_DIR/tenancy.toml" --prolog "$BIN/tenancy-prolog" --epilog "$BIN/tenancy-epilog" \
  --base-prolog "$here/baseline/prolog.sh" --base-epilog "$here/baseline/epilog.sh" \
  --base-dir "$BENCH_DIR/base" --uid "$uid" --gid "$gid" --user "$BENCH_USER" --tenant "$BENCH_TENANT" --tenant-group "$group"
# The installed binaries and the files above are written out now, not during the measured jobs.
sync
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg); built in $built, job path from $JOB_PATH ($libc), run from $BIN"
for m in $MODES; do
  case $m in
    pair) if [ "${FLUSH_MB:-0}" -gt 0 ]; then cold="$FLUSH_MB MiB read before each (CPU caches evicted)"; else cold="back to back"; fi
          echo "## pair: $JOBS jobs per variant, interleaved in a rotating order, $cold${BETWEEN:+, $BETWEEN before each}"
          python3 "$here/driver.py" pair --jobs "$JOBS" --first-job "$FIRST_JOB" --variants "$VARIANTS" \
            ${BETWEEN:+--between "$BETWEEN"} ${FLUSH_MB:+--flush-mb "$FLUSH_MB"} --json "$BENCH_DIR/pair.json" "$@" ;;
    fill) echo "## fill: the next job with N jobs running (N in $FILL), $ROUNDS rounds of $REPEAT"
          # shellcheck disable=SC2086
          python3 "$here/driver.py" fill --fill $FILL --repeat "$REPEAT" --rounds "$ROUNDS" --first-job $((FIRST_JOB + 100000)) \
            --variants product+mig,product --json "$BENCH_DIR/fill.json" "$@" ;;
  esac
done
