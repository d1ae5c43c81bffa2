#!/usr/bin/env bash
# Benchmarks storage-audit against find (mode tests) and find + getfacl -R (mode + ACL tests) on a
# generated tree of FILES files (default 200000), side by side in one hyperfine run; then wipe of
# a FILES-file job folder vs `rm -rf`. Needs root (chown, groupadd), hyperfine, getfacl, python3.
# storage-audit is `tenancyctl storage-audit` over a config of two tenants, ta and tb, each of a
# group made for the run (removed at the end); the wipe is the scratch layer's scratchtool example.
# Usage: crates/storage-audit/bench/storage-audit-vs-find.sh [FILES] [RUNS]
set -euo pipefail
FILES=${1:-200000}
RUNS=${2:-5}
HERE=$(cd "$(dirname "$0")" && pwd)
: "${CARGO_TARGET_DIR:=/work/target-scratch}"
export CARGO_TARGET_DIR
cargo build -q --release -p tenancyctl -p tenancy-scratch --example scratchtool
TOOL="$CARGO_TARGET_DIR/release/examples/scratchtool"
CTL="$CARGO_TARGET_DIR/release/tenancyctl"
WORK=$(mktemp -d /tmp/scratch-bench.XXXXXX)
chmod 755 "$WORK"
TA=sabench$$a; TB=sabench$$b
groupadd "$TA"; groupadd "$TB"
trap 'rm -rf "$WORK"; groupdel "$TA"; groupdel "$TB"' EXIT
GA=$(getent group "$TA" | cut -d: -f3); GB=$(getent group "$TB" | cut -d: -f3)
python3 "$HERE/gen_tree.py" "$WORK/scratch" "$FILES" "$GA" "$GB"
R="$WORK/scratch"
cat > "$WORK/tenancy.toml" <<EOT
[cluster]
name = "bench"
state_dir = "$WORK/state"
audit_log = "$WORK/audit.jsonl"
scratch_root = "$R"
[tiers.internal]
[tenants.ta]
tier = "internal"
groups = ["$TA"]
[tenants.tb]
tier = "internal"
groups = ["$TB"]
EOT
AUDIT="$CTL --config $WORK/tenancy.toml storage-audit --no-progress"
FIND="find $R -xdev \\( -perm -o+r -o -perm -o+w -o -perm -o+x -o \\( -type d -perm -o+w ! -perm -1000 \\) -o \\( -type f -perm /6000 \\) -o -type l \\) -printf '%m %U %G %p\\n'"
echo "== storage-audit vs find ($FILES files, $(nproc) cpus) =="
$AUDIT "$R" | tail -8 || true
hyperfine -N -i --warmup 1 --runs "$RUNS" --export-json "$WORK/audit.json" \
  -n storage-audit "$AUDIT --format csv $R" \
  -n find-mode-tests "bash -c \"$FIND > /dev/null\"" \
  -n find+getfacl "bash -c \"$FIND > /dev/null; getfacl -R -s -p $R > /dev/null\""
python3 - "$WORK/audit.json" <<'PY'
import json, sys
r = {x["command"]: x["mean"] for x in json.load(open(sys.argv[1]))["results"]}
a = r["storage-audit"]
for k, v in r.items():
    print(f"{k:18s} {v*1000:9.1f} ms   ratio vs storage-audit: {v/a:5.2f}x")
PY

echo "== wipe vs rm -rf ($FILES files in one job folder) =="
TMPL="$WORK/template"
mkdir "$TMPL"
python3 - "$TMPL" "$FILES" <<'PY'
import os, sys
t, n = sys.argv[1], int(sys.argv[2])
for k in range(n // 100):
    d = os.path.join(t, f"d{k}")
    os.mkdir(d)
    for m in range(100):
        open(os.path.join(d, f"f{m}"), "w").close()
os.chmod(os.path.join(t, "d0"), 0o000)  # a user-left mode-000 folder
PY
J="$R/tb/job_999999"  # tb: a tenant folder that passes the safety checks
hyperfine -N --runs "$RUNS" --export-json "$WORK/wipe.json" \
  --prepare "bash -c 'rm -rf $J; cp -a $TMPL $J'" \
  -n scratch-wipe "$TOOL wipe --root $R --tenant tb --tenant-gid $GB --job 999999" \
  -n rm-rf "rm -rf $J"
python3 - "$WORK/wipe.json" <<'PY'
import json, sys
r = {x["command"]: x["mean"] for x in json.load(open(sys.argv[1]))["results"]}
w = r["scratch-wipe"]
for k, v in r.items():
    print(f"{k:18s} {v*1000:9.1f} ms   ratio vs scratch-wipe: {v/w:5.2f}x")
PY
