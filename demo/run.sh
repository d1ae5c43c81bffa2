#!/bin/sh
# slurm-tenancy demo: a local single-node Slurm cluster with the product installed from its
# Debian packages (scripts/package, apt) and the NVML stand-in; jobs of two tenants side by
# side, what each got, its DCGM job mapping files and metrics, what was refused, attacks of
# one tenant's job on the other's that fail, the audit report and its verification, a job
# waiting on its tenant's quota and a node pool keeping another tenant out; then
# everything is shut down and removed (the packages too, unless they were installed before).
#
# Run as root on a scratch Debian 12 machine or container, from a clone:  sudo ./demo/run.sh
# (It installs Debian packages, starts Slurm daemons, creates users and nftables rules.)
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "demo/run.sh: run as root: sudo ./demo/run.sh (it starts Slurm and creates users)" >&2
    exit 1
fi

# Rust >= 1.80: on PATH, in the invoking user's or root's ~/.cargo (sudo resets PATH).
user_home=""
if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    user_home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
fi
cargo=""
for c in "$(command -v cargo 2>/dev/null || true)" "${user_home:+$user_home/.cargo/bin/cargo}" \
         "${HOME:-/root}/.cargo/bin/cargo" /root/.cargo/bin/cargo; do
    if [ -n "$c" ] && [ -x "$c" ]; then cargo=$c; break; fi
done
if [ -n "$cargo" ]; then
    PATH="$(dirname "$cargo"):$PATH"
    export PATH
fi

./scripts/install-deps
cargo=$(command -v cargo || true)
if [ -z "$cargo" ]; then
    echo "demo/run.sh: no Rust toolchain; install one with https://rustup.rs (Rust >= 1.80), then rerun" >&2
    exit 1
fi
minor=$("$cargo" --version | sed -n 's/^cargo 1\.\([0-9][0-9]*\).*/\1/p')
if [ -z "$minor" ] || [ "$minor" -lt 80 ]; then
    echo "demo/run.sh: $("$cargo" --version) is too old (Rust >= 1.80 needed): install rustup from https://rustup.rs, then rerun" >&2
    exit 1
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
set -- --release -p tenancy-prolog -p tenancyctl -p spank-tenancy -p job-submit-tenancy -p nvml-shim -p tenancy-e2e
echo "Building slurm-tenancy (release; the first build takes a few minutes) ..."
as_builder() {
    if [ -n "$user_home" ] && [ "${cargo#"$user_home"/}" != "$cargo" ]; then
        # The invoking user's toolchain builds in their clone, so target/ stays theirs.
        runuser -u "$SUDO_USER" -- env HOME="$user_home" PATH="$PATH" \
            CARGO_TARGET_DIR="$CARGO_TARGET_DIR" "$@"
    else
        "$@"
    fi
}
as_builder "$cargo" build "$@"
# Installed as docs/admin-guide.md says: the Debian packages (scripts/package: the prolog and epilog
# linked with musl where the toolchain can), with apt. The cluster then runs the installed
# prolog, epilog and plugins. Packages the demo installed are purged at its end.
debs=$(as_builder ./scripts/package)
installed_before=$(dpkg-query -W -f='${Package} ${Status}\n' slurm-tenancy 2>/dev/null | grep -c 'install ok installed' || true)
echo "Installing the packages: apt-get install $debs/*.deb"
ls -s --block-size=K "$debs"
DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Dpkg::Options::=--force-confold "$debs"/*.deb
purge() {
    if [ "$installed_before" = 0 ]; then
        echo "Removing the packages the demo installed (dpkg --purge)"
        dpkg --purge libpam-tenancy slurm-tenancy-job-submit slurm-tenancy-spank slurm-tenancy >/dev/null || true
    fi
}
trap purge EXIT
TENANCY_FROM_PACKAGES=1 "$CARGO_TARGET_DIR/release/tenancy-demo"
