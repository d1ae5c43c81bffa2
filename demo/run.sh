#!/bin/sh
# slurm-tenancy demo: a local single-node Slurm cluster with the plugin, prolog/epilog and the
# NVML stand-in installed; jobs of two tenants side by side; refusals; the admin report.
# Run as root on a scratch Debian/Ubuntu machine or container:  sudo demo/run.sh
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "demo/run.sh: run as root (it installs packages, starts Slurm and creates users)" >&2
    exit 1
fi
need=""
for p in slurm-wlm slurmctld slurmd libslurm-dev munge nftables iproute2 acl jq libclang-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
if [ -n "$need" ]; then
    echo "Installing:$need"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $need
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release --workspace
exec "$CARGO_TARGET_DIR/release/tenancy-demo" "$@"
