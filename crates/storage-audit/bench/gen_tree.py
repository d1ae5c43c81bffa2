#!/usr/bin/env python3
"""Generates a scratch tree: ROOT/<tenant>/job_<n>/d<k>/f<m>, FILES files in all, with a few leaks.
Usage: gen_tree.py ROOT FILES GID_A GID_B"""
import os, sys

root, files, ga, gb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(root, exist_ok=True)
os.chmod(root, 0o755)
per_dir, dirs_per_job = 100, 100
jobs = max(1, files // (per_dir * dirs_per_job))
n = 0
for t, gid in (("ta", ga), ("tb", gb)):
    tdir = os.path.join(root, t)
    os.mkdir(tdir)
    os.chown(tdir, 0, gid)
    os.chmod(tdir, 0o750)
for j in range(jobs):
    t, gid = (("ta", ga), ("tb", gb))[j % 2]
    jdir = os.path.join(root, t, f"job_{j}")
    os.mkdir(jdir, 0o700)
    for k in range(dirs_per_job):
        d = os.path.join(jdir, f"d{k}")
        os.mkdir(d)
        for m in range(per_dir):
            with open(os.path.join(d, f"f{m}"), "w") as fh:
                fh.write("x")
            n += 1
    os.chown(jdir, 1000 + j, gid)
# leaks: an opened tenant folder path with a readable file, a setuid file, a symlink out
os.chmod(os.path.join(root, "ta"), 0o751)
os.chmod(os.path.join(root, "ta", "job_0"), 0o711)
os.chmod(os.path.join(root, "ta", "job_0", "d0"), 0o711)
os.chmod(os.path.join(root, "ta", "job_0", "d0", "f0"), 0o4755)
os.symlink("/etc", os.path.join(root, "ta", "job_0", "escape"))
print(f"{n} files in {jobs} job folders under {root}", file=sys.stderr)
