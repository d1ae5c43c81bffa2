#!/usr/bin/env python3
"""A/B of two builds of tenancy-prolog + tenancy-epilog, alternating job by job (stdlib only).

Run `bench/job-path.sh` once first (it writes the bench config), load the firewall table it
removes at its end: `tenancyctl --config /tmp/tenancy-bench/tenancy.toml firewall apply`,
then, as root:
  python3 bench/ab.py DIR_A DIR_B [--jobs 300] [--mig 1g.18gb]
where each DIR holds a tenancy-prolog and a tenancy-epilog, and tenancy-prolog-dynamic where the
build has one (e.g. target/release and a copy of an older build). Both builds are first installed (`install -m 0755`) into fresh folders: a linker's
output file and a copy of it start with different numbers of page faults, and only the copy is
what a node runs. Each job runs the prolog then the epilog of one build; the builds alternate, and
so does which one goes first, so the machine's drift weighs on both alike.
"""
import argparse, os, pwd, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from driver import run, slurm_env  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a"); p.add_argument("b")
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--mig", help="MIG profile to request (default: a job without MIG)")
    p.add_argument("--config", default=os.path.join(os.environ.get("BENCH_DIR", "/tmp/tenancy-bench"), "tenancy.toml"))
    p.add_argument("--config-b", help="build B's config (default: --config): one build, two "
                   "configs, e.g. without and with cluster.audit_anchor_key")
    p.add_argument("--user", default=os.environ.get("BENCH_USER", "acme1"))
    p.add_argument("--tenant", default=os.environ.get("BENCH_TENANT", "acme"))
    p.add_argument("--first-job", type=int, default=9_100_000)
    p.add_argument("--flush-mb", type=int, default=0, help="before every job, read this many MiB in "
                   "this process: the CPU caches start as cold as after a real job (64 is enough here)")
    p.add_argument("--between", help="a command run before every job (not timed), e.g. "
                   "bench/pollute.sh: the shell commands that run between two product jobs in "
                   "bench/job-path.sh, which leave the CPU caches cold")
    a = p.parse_args()
    pw = pwd.getpwnam(a.user)
    env = dict(slurm_env(pw.pw_uid, pw.pw_gid, a.user, a.tenant), TENANCY_CONFIG=a.config)
    if a.mig:
        env["SPANK_TENANCY_MIG"] = a.mig
    config_of = {a.a: a.config, a.b: a.config_b or a.config}
    with tempfile.TemporaryDirectory(prefix="tenancy-ab-") as tmp:
        installed = {}
        for name, d in (("a", a.a), ("b", a.b)):
            installed[d] = os.path.join(tmp, name)
            os.mkdir(installed[d])
            # tenancy-prolog-dynamic: where the static prolog and epilog hand MIG jobs (builds
            # before it had none: their prolog was dynamically linked and did the MIG work).
            files = [os.path.join(d, f) for f in ("tenancy-prolog", "tenancy-epilog", "tenancy-prolog-dynamic")]
            subprocess.run(["install", "-m", "0755"] + [f for f in files if os.path.exists(f)]
                           + [installed[d]], check=True)
        if a.a == a.b and a.config_b:
            sys.exit("one build with two configs: name its folder twice in two spellings (dir, dir/)")
        rows = {a.a: [], a.b: []}
        flush = bytearray(a.flush_mb << 20)
        job = a.first_job
        for i in range(a.jobs):
            for d in ((a.a, a.b) if i % 2 == 0 else (a.b, a.a)):
                if a.between:
                    subprocess.run(a.between, shell=True, check=True)
                if a.flush_mb:
                    flush.count(b"\x02")  # reads every line: clean evictions
                e = dict(env, SLURM_JOB_ID=str(job), TENANCY_CONFIG=config_of[d]); job += 1
                r1, w1, c1 = run([os.path.join(installed[d], "tenancy-prolog")], e)
                r2, w2, c2 = run([os.path.join(installed[d], "tenancy-epilog")], e)
                if r1 != 0 or r2 != 0:
                    sys.exit(f"{d}: job {job - 1}: prolog exited {r1}, epilog {r2}")
                rows[d].append((w1, w2, c1 + c2))
    print(f"{'build':<32} {'prolog':>7} {'epilog':>7} {'total':>7} {'cpu':>7}  (median ms, {a.jobs} jobs each)")
    for d, r in rows.items():
        med = lambda f: statistics.median(f(x) for x in r)
        print(f"{d:<32} {med(lambda x: x[0]):7.3f} {med(lambda x: x[1]):7.3f} "
              f"{med(lambda x: x[0] + x[1]):7.3f} {med(lambda x: x[2]):7.3f}")


if __name__ == "__main__":
    main()
