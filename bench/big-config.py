#!/usr/bin/env python3
"""Writes to stdout the bench config (bench/job-path.sh's tenancy.toml) with N more tenants, to
measure how the job path's cost grows with the config (stdlib only):
  python3 bench/big-config.py /tmp/tenancy-bench/tenancy.toml 100 > /tmp/tenancy-bench/big.toml
  sudo python3 bench/ab.py OLD_BIN_DIR target/release --flush-mb 64 --config /tmp/tenancy-bench/big.toml
Each added tenant has two groups, one account and two egress destinations, alternately in the
bench's `internal` tier and a `regulated` tier added here; the bench's own tenant gets one egress
destination. The added groups need not exist (`tenancyctl check` warns, the jobs do not care).
"""
import sys


def main():
    base, n = sys.argv[1], int(sys.argv[2])
    text = open(base).read()
    text = text.replace("[tiers.internal]", '[tiers.regulated]\nmig_profiles = ["3g.71gb"]\n[tiers.internal]', 1)
    out = []
    for line in text.splitlines():
        out.append(line)
        if line.startswith("groups = [") and not any(l.startswith("egress") for l in out[-3:]):
            out.append('egress = ["10.20.0.0/16:443/tcp"]')
    for i in range(n):
        out += [f"[tenants.t{i:03d}]",
                f'tier = "{"regulated" if i % 2 else "internal"}"',
                f'groups = ["g{i:03d}", "h{i:03d}"]',
                f'accounts = ["a{i:03d}"]',
                f'egress = ["10.{i % 256}.0.0/16:443/tcp", "10.{i % 256}.1.0/24:8443/tcp"]']
    print("\n".join(out))


if __name__ == "__main__":
    main()
