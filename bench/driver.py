#!/usr/bin/env python3
"""Times prolog+epilog pairs per job (wall clock and the child's CPU time from wait4's rusage).

Used by bench/job-path.sh; stdlib only. Modes:
  pair  N jobs, each variant's prolog then epilog, variants interleaved job by job, their order
        rotating
  fill  N prologs without epilogs (non-MIG jobs), then the prolog+epilog of one more job per
        variant, repeated; the fill levels alternate over several rounds; all fill jobs are
        torn down at the end
"""
import argparse, ctypes, json, os, statistics, subprocess, sys, time

# The binaries' one-line reports go to slurmd's log; here they are dropped (errors still show).
QUIET = [(os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]

def run(argv, env):
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, env, file_actions=QUIET)
    _, status, ru = os.wait4(pid, 0)
    wall = (time.perf_counter_ns() - t0) / 1e6
    rc = os.waitstatus_to_exitcode(status)
    return rc, wall, (ru.ru_utime + ru.ru_stime) * 1000.0

def pct(xs, p):
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo = int(k); hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNET = 0x40000000

def enter_netns(fd):
    """setns(2) of the driver into a network namespace (not timed): the prolog and epilog it
    spawns next are born there (bench/cross-node.sh: one table per variant, same run)."""
    if LIBC.setns(fd, CLONE_NEWNET) != 0:
        sys.exit(f"setns: {os.strerror(ctypes.get_errno())}")

class Variant:
    def __init__(self, name, prolog, epilog, env, netns=None):
        self.name, self.prolog, self.epilog, self.env = name, prolog, epilog, env
        self.netns = netns  # an open fd of the network namespace its jobs run in, or None
        self.rows = []  # (prolog_wall, prolog_cpu, epilog_wall, epilog_cpu)

    def job_env(self, job):
        e = dict(self.env); e["SLURM_JOB_ID"] = str(job); return e

    def prolog_only(self, job):
        rc, w, c = run([self.prolog], self.job_env(job))
        if rc != 0:
            sys.exit(f"{self.name}: prolog of job {job} exited {rc}")
        return w, c

    def epilog_only(self, job):
        rc, w, c = run([self.epilog], self.job_env(job))
        if rc != 0:
            sys.exit(f"{self.name}: epilog of job {job} exited {rc}")
        return w, c

    def one(self, job):
        if self.netns is not None:
            enter_netns(self.netns)
        pw, pc = self.prolog_only(job)
        ew, ec = self.epilog_only(job)
        self.rows.append((pw, pc, ew, ec))

def summary(rows):
    cols = {"prolog_wall": [r[0] for r in rows], "prolog_cpu": [r[1] for r in rows],
            "epilog_wall": [r[2] for r in rows], "epilog_cpu": [r[3] for r in rows],
            "total_wall": [r[0] + r[2] for r in rows], "total_cpu": [r[1] + r[3] for r in rows]}
    return {k: {"median": statistics.median(v), "p99": pct(v, 99), "n": len(v)} for k, v in cols.items()}

def slurm_env(uid, gid, user, tenant):
    """What slurmd and the SPANK plugin give a prolog for a job (the job id is added per job)."""
    return {"SLURM_JOB_UID": str(uid), "SLURM_JOB_GID": str(gid), "SLURM_JOB_USER": user,
            "SLURMD_NODENAME": os.uname().nodename.split(".")[0], "SPANK_TENANCY_TENANT": tenant}

def variants(a):
    base = slurm_env(a.uid, a.gid, a.user, a.tenant)
    prod = dict(base, TENANCY_CONFIG=a.config)
    out = {}
    out["product+mig"] = Variant("product+mig", a.prolog, a.epilog, dict(prod, SPANK_TENANCY_MIG=a.mig))
    out["product"] = Variant("product", a.prolog, a.epilog, prod)
    out["baseline-sh"] = Variant("baseline-sh", a.base_prolog, a.base_epilog,
                                 dict(base, BASE_DIR=a.base_dir, BASE_TENANT_GROUP=a.tenant_group))
    if a.xnode_config:
        # The same prolog and epilog under a config with `[network] node_network`, whose table
        # (the cross-node rules) is loaded in another network namespace.
        out["product+xnode"] = Variant("product+xnode", a.prolog, a.epilog,
                                       dict(base, TENANCY_CONFIG=a.xnode_config))
    if a.fwd_config:
        # The same prolog and epilog under a config whose audit log `tenancyctl audit forward`
        # ships to a collector meanwhile (bench/forward.sh).
        out["product+fwd"] = Variant("product+fwd", a.prolog, a.epilog,
                                     dict(base, TENANCY_CONFIG=a.fwd_config))
    for spec in a.netns or []:
        name, path = spec.split("=", 1)
        out[name].netns = os.open(path, os.O_RDONLY)
    return out

def table(results):
    print(f"{'variant':<14} {'n':>4} {'what':<7} {'wall med':>9} {'wall p99':>9} {'cpu med':>8} {'cpu p99':>8}  (ms)")
    for name, s in results.items():
        for part in ("prolog", "epilog", "total"):
            w, c = s[part + "_wall"], s[part + "_cpu"]
            print(f"{name:<14} {w['n']:>4} {part:<7} {w['median']:>9.2f} {w['p99']:>9.2f} {c['median']:>8.2f} {c['p99']:>8.2f}")

def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["pair", "fill"])
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--fill", type=int, nargs="+", default=[0, 999])
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--first-job", type=int, default=7_100_000)
    p.add_argument("--variants", default="product+mig,product,baseline-sh")
    p.add_argument("--config", required=True)
    p.add_argument("--prolog", required=True); p.add_argument("--epilog", required=True)
    p.add_argument("--base-prolog", required=True); p.add_argument("--base-epilog", required=True)
    p.add_argument("--base-dir", required=True)
    p.add_argument("--uid", type=int, required=True); p.add_argument("--gid", type=int, required=True)
    p.add_argument("--user", required=True); p.add_argument("--tenant", required=True)
    p.add_argument("--tenant-group", required=True, help="the tenant's group, checked by the shell baseline")
    p.add_argument("--mig", default="1g.18gb")
    p.add_argument("--json")
    p.add_argument("--xnode-config", help="adds the variant product+xnode: the product with this "
                   "config (cross-node rules)")
    p.add_argument("--fwd-config", help="adds the variant product+fwd: the product with this "
                   "config (its audit log forwarded while the jobs run)")
    p.add_argument("--netns", action="append", help="VARIANT=PATH: run that variant's jobs in the "
                   "network namespace PATH (e.g. /run/netns/NAME), entered before each job")
    p.add_argument("--flush-mb", type=int, default=0, help="pair mode: before every variant's job, "
                   "write this many MiB in the driver itself (evicts the CPU caches without running "
                   "anything of either side)")
    p.add_argument("--between", help="pair mode: a command run (not timed) before every variant's "
                   "job, the same for all, so that no variant runs right after another's aftermath "
                   "or after the same binaries; job-path.sh passes bench/pollute.sh")
    a = p.parse_args()
    vs = variants(a)
    chosen = [vs[n] for n in a.variants.split(",")]
    job = a.first_job
    report = {"mode": a.mode, "host": os.uname().nodename, "load_before": os.getloadavg()}
    flush = bytearray(a.flush_mb << 20)
    if a.mode == "pair":
        for i in range(a.jobs):
            # The order rotates job by job: no variant always runs right after the same other
            # one (the shell's cgroup and nft changes leave the kernel work to finish).
            k = i % len(chosen)
            for v in chosen[k:] + chosen[:k]:
                if a.between:
                    subprocess.run(a.between, shell=True, check=True)
                if a.flush_mb:
                    flush.count(b"\x02")  # reads every line: clean evictions, nothing to write back
                v.one(job); job += 1
        report["results"] = {v.name: summary(v.rows) for v in chosen}
        table(report["results"])
        # The goals, from the same run: the shell's time over the product's for the
        # same (non-GPU) work, >= 10x, and every product variant's median per job, < 10 ms.
        res = report["results"]
        for v in chosen:
            if v.name == "baseline-sh":
                continue
            if v.name == "product" and "baseline-sh" in res:
                for kind in ("wall", "cpu"):
                    r = res["baseline-sh"]["total_" + kind]["median"] / res[v.name]["total_" + kind]["median"]
                    res[f"{v.name}:total_{kind}:speedup"] = r
                    print(f"{v.name}: shell / product total {kind} median = {r:.1f}x (goal >= 10x)")
            ms = res[v.name]["total_wall"]["median"]
            print(f"{v.name}: total wall median {ms:.2f} ms (goal < 10 ms)")
    else:
        # Rounds alternate the fill levels (0, 999, 0, 999, ...): the machine's drift over the
        # run then weighs on every level alike instead of on whichever was measured last.
        filler = vs["product"]
        filled = []
        rows = {(v.name, n): [] for v in chosen for n in a.fill}
        for rnd in range(a.rounds):
            for n in sorted(a.fill):
                while len(filled) < n:
                    filler.prolog_only(job); filled.append(job); job += 1
                while len(filled) > n:
                    filler.epilog_only(filled.pop())
                # The fillers' files (journals, scratch folders, audit lines) are written out
                # before the level is measured: on a node that filled over hours the kernel wrote
                # them back long ago, here it would do so during the measured jobs.
                os.sync()
                for v in chosen:
                    v.rows = []
                for _ in range(a.repeat):
                    for v in chosen:
                        v.one(job); job += 1
                for v in chosen:
                    rows[(v.name, n)] += v.rows
        for j in filled:
            filler.epilog_only(j)
        report["results"] = {}
        for n in sorted(a.fill):
            for v in chosen:
                report["results"][f"{v.name}@N={n}"] = summary(rows[(v.name, n)])
            print(f"-- with {n} jobs running on the node ({a.rounds} rounds of {a.repeat})")
            table({f"{v.name}": report["results"][f"{v.name}@N={n}"] for v in chosen})
        med = lambda k, part: report["results"][k][part]["median"]
        lo, hi = min(a.fill), max(a.fill)
        for v in chosen:
            for part in ("prolog_wall", "total_wall"):
                r = med(f"{v.name}@N={hi}", part) / med(f"{v.name}@N={lo}", part)
                report["results"][f"{v.name}:{part}:ratio"] = r
                print(f"{v.name}: {part.replace('_', ' ')} median at N={hi} / N={lo} = {r:.2f}x (goal <= 1.2x)")
    report["load_after"] = os.getloadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)

if __name__ == "__main__":
    main()
