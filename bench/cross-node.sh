#!/bin/sh
# The job path (tenancy-prolog + tenancy-epilog of a job without a MIG slice) with the
# cross-node rules loaded against without, in one run, jobs interleaved (bench/driver.py pair):
#   product        config without [network] node_network; its table in network namespace A
#   product+xnode  the same config plus node_network and each tenant's address_prefix; its
#                  table (the cross-node rules, tenant addresses on a veth interface) in B
# The driver enters the variant's namespace before each job (not timed), so each prolog finds
# its own table; the binaries, cgroups and state folder are the same.
# Run as root; it holds the e2e lock (/run/tenancy-e2e.lock) so that no test cluster shares the
# product's cgroup subtree meanwhile, and touches neither the host's network nor its nft tables.
#   scripts/build-job-path; cargo build -p tenancyctl   (or --release)
#   sudo bench/cross-node.sh
# Env: JOB_PATH (default target/job-path/release), TENANCYCTL (default target/release/tenancyctl,
#   else target/debug's: it only loads the tables), BENCH_DIR (/tmp/tenancy-xbench), JOBS (200),
#   FLUSH_MB (64), BENCH_TENANT (xbench), BENCH_USER (xbench1), FIRST_JOB (7300000).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
target=${CARGO_TARGET_DIR:-$root/target}
JOB_PATH=${JOB_PATH:-$target/job-path/release}
TENANCYCTL=${TENANCYCTL:-$target/release/tenancyctl}
[ -x "$TENANCYCTL" ] || TENANCYCTL=$target/debug/tenancyctl
BENCH_DIR=${BENCH_DIR:-/tmp/tenancy-xbench}
JOBS=${JOBS:-200}; FLUSH_MB=${FLUSH_MB-64}; FIRST_JOB=${FIRST_JOB:-7300000}
BENCH_TENANT=${BENCH_TENANT:-xbench}; BENCH_USER=${BENCH_USER:-xbench1}
for b in "$JOB_PATH/tenancy-prolog" "$JOB_PATH/tenancy-epilog" "$TENANCYCTL"; do
  [ -x "$b" ] || { echo "missing $b: see the top of $0" >&2; exit 2; }
done
exec 9>/run/tenancy-e2e.lock
flock 9
ns_a=tnxbench-a; ns_b=tnxbench-b
made_user=no; made_group=no
cleanup() {
  for ns in $ns_a $ns_b; do
    nsenter --net=/run/netns/$ns nft delete table inet tenancy 2>/dev/null || true
    ip netns del $ns 2>/dev/null || true
  done
  rmdir "/sys/fs/cgroup/unified/tenancy/$BENCH_TENANT" "/sys/fs/cgroup/unified/tenancy/${BENCH_TENANT}b" 2>/dev/null || true
  [ "$made_user" = no ] || userdel "$BENCH_USER" 2>/dev/null || true
  [ "$made_group" = no ] || groupdel "$BENCH_TENANT" 2>/dev/null || true
}
trap cleanup EXIT
if ! id "$BENCH_USER" >/dev/null 2>&1; then
  getent group "$BENCH_TENANT" >/dev/null || { groupadd "$BENCH_TENANT"; made_group=yes; }
  useradd -M -N -g "$BENCH_TENANT" -s /usr/sbin/nologin "$BENCH_USER"; made_user=yes
fi
uid=$(id -u "$BENCH_USER"); gid=$(id -g "$BENCH_USER"); group=$(id -gn "$BENCH_USER")
rm -rf "$BENCH_DIR"; mkdir -p "$BENCH_DIR/scratch" "$BENCH_DIR/base/scratch" "$BENCH_DIR/bin"
chmod 755 "$BENCH_DIR/scratch"
# Installed copies, as job-path.sh runs them.
install -m 0755 "$JOB_PATH/tenancy-prolog" "$JOB_PATH/tenancy-epilog" "$BENCH_DIR/bin/"
[ -e "$JOB_PATH/tenancy-prolog-dynamic" ] && install -m 0755 "$JOB_PATH/tenancy-prolog-dynamic" "$BENCH_DIR/bin/"
head -c 32 /dev/urandom > "$BENCH_DIR/anchor.key"; chmod 600 "$BENCH_DIR/anchor.key"
cat > "$BENCH_DIR/tenancy.toml" <<EOT
[cluster]
name = "bench"
state_dir = "$BENCH_DIR/state"
audit_log = "$BENCH_DIR/audit.jsonl"
audit_anchor_key = "$BENCH_DIR/anchor.key"
scratch_root = "$BENCH_DIR/scratch"
[tiers.internal]
mig_profiles = ["1g.18gb"]
[tenants.$BENCH_TENANT]
tier = "internal"
groups = ["$group"]
egress = ["10.231.0.0/24"]
EOT
# The same with the cross-node keys (a second tenant, so that the rules tell two apart).
sed -e "s|^egress = .*|&\naddress_prefix = \"10.231.1.0/24\"|" "$BENCH_DIR/tenancy.toml" > "$BENCH_DIR/xnode.toml"
cat >> "$BENCH_DIR/xnode.toml" <<EOT
[tenants.${BENCH_TENANT}b]
tier = "internal"
groups = ["root"]
address_prefix = "10.231.2.0/24"
[network]
node_network = "10.231.0.0/24"
EOT
for ns in $ns_a $ns_b; do
  ip netns add $ns; ip -n $ns link set lo up
  # (no dummy driver in every kernel: a veth pair whose both ends stay in the namespace)
  ip -n $ns link add d0 type veth peer name d1; ip -n $ns addr add 10.231.0.7/24 dev d0
  ip -n $ns link set d1 up; ip -n $ns link set d0 up
done
nsenter --net=/run/netns/$ns_a "$TENANCYCTL" --config "$BENCH_DIR/tenancy.toml" firewall apply >/dev/null
nsenter --net=/run/netns/$ns_b "$TENANCYCTL" --config "$BENCH_DIR/xnode.toml" firewall apply >/dev/null
echo "# rules in A: $(nsenter --net=/run/netns/$ns_a nft list table inet tenancy | grep -c .) lines; in B: $(nsenter --net=/run/netns/$ns_b nft list table inet tenancy | grep -c .) lines, addresses $(ip -n $ns_b -4 -o addr show dev d0 | awk '{print $4}' | tr '\n' ' ')"
sync
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg); job path from $JOB_PATH ($(cat "$JOB_PATH/LIBC" 2>/dev/null || echo glibc))"
echo "## pair: $JOBS jobs per variant, interleaved in a rotating order, ${FLUSH_MB} MiB read before each"
python3 "$here/driver.py" pair --jobs "$JOBS" --first-job "$FIRST_JOB" --variants product,product+xnode \
  --xnode-config "$BENCH_DIR/xnode.toml" --netns "product=/run/netns/$ns_a" --netns "product+xnode=/run/netns/$ns_b" \
  ${FLUSH_MB:+--flush-mb "$FLUSH_MB"} --json "$BENCH_DIR/pair.json" \
  --config "$BENCH_DIR/tenancy.toml" --prolog "$BENCH_DIR/bin/tenancy-prolog" --epilog "$BENCH_DIR/bin/tenancy-epilog" \
  --base-prolog "$here/baseline/prolog.sh" --base-epilog "$here/baseline/epilog.sh" \
  --base-dir "$BENCH_DIR/base" --uid "$uid" --gid "$gid" --user "$BENCH_USER" --tenant "$BENCH_TENANT" --tenant-group "$group"
