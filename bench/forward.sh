#!/bin/sh
# Audit forwarding (issue 43), two figures in one run, against a local rsyslog with its GnuTLS
# driver (rsyslog-gnutls) on a free port of 127.0.0.1, certificates made here (openssl):
#  1. throughput: `tenancyctl audit forward --once`, pinned to one core (taskset -c 0), ships a
#     log of RECORDS job_end records (gen_chain: epilog-sized, ~700 bytes) over TLS 1.3;
#     records/s = RECORDS / its wall time less the confirmation wait (--confirm-ms), its CPU time
#     (user+sys), and the time until rsyslog had written the last one;
#  2. the job path with the forwarder running against without (bench/driver.py pair, jobs
#     interleaved): `product` appends to a log nothing forwards, `product+fwd` to the log that a
#     `tenancyctl audit forward` running all along ships to rsyslog. Same binaries, state and
#     cgroups; each node signs its anchors (audit keygen) in both.
# Run as root; it holds the e2e lock (/run/tenancy-e2e.lock), loads its firewall table in a
# network namespace of its own, and stops rsyslogd and the forwarder by pid.
#   cargo build --release -p tenancyctl -p tenancy-accounting --example gen_chain; scripts/build-job-path
#   sudo bench/forward.sh
# Env: JOB_PATH (target/job-path/release), BIN (target/release), BENCH_DIR (/tmp/tenancy-fbench),
#   RECORDS (50000), JOBS (200), FLUSH_MB (64), BENCH_TENANT (fbench), BENCH_USER (fbench1),
#   FIRST_JOB (7500000), CONFIRM_MS (100, throughput run).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
target=${CARGO_TARGET_DIR:-$root/target}
JOB_PATH=${JOB_PATH:-$target/job-path/release}
BIN=${BIN:-$target/release}
BENCH_DIR=${BENCH_DIR:-/tmp/tenancy-fbench}
RECORDS=${RECORDS:-50000}; JOBS=${JOBS:-200}; FLUSH_MB=${FLUSH_MB-64}; FIRST_JOB=${FIRST_JOB:-7500000}
CONFIRM_MS=${CONFIRM_MS:-100}
BENCH_TENANT=${BENCH_TENANT:-fbench}; BENCH_USER=${BENCH_USER:-fbench1}
TENANCYCTL=$BIN/tenancyctl
GEN=$BIN/examples/gen_chain
for b in "$JOB_PATH/tenancy-prolog" "$JOB_PATH/tenancy-epilog" "$TENANCYCTL" "$GEN" /usr/sbin/rsyslogd; do
  [ -x "$b" ] || { echo "missing $b: see the top of $0 (rsyslogd: apt-get install rsyslog rsyslog-gnutls)" >&2; exit 2; }
done
exec 9>/run/tenancy-e2e.lock
flock 9
ns=tnfbench
made_user=no; made_group=no; rsyslog_pid=""; fwd_pid=""
cleanup() {
  [ -z "$fwd_pid" ] || { kill -TERM "$fwd_pid" 2>/dev/null; wait "$fwd_pid" 2>/dev/null || true; }
  [ -z "$rsyslog_pid" ] || { kill -TERM "$rsyslog_pid" 2>/dev/null; wait "$rsyslog_pid" 2>/dev/null || true; }
  nsenter --net=/run/netns/$ns nft delete table inet tenancy 2>/dev/null || true
  ip netns del $ns 2>/dev/null || true
  rmdir "/sys/fs/cgroup/unified/tenancy/$BENCH_TENANT" "/sys/fs/cgroup/freezer/tenancy/$BENCH_TENANT" 2>/dev/null || true
  [ "$made_user" = no ] || userdel "$BENCH_USER" 2>/dev/null || true
  [ "$made_group" = no ] || groupdel "$BENCH_TENANT" 2>/dev/null || true
}
trap cleanup EXIT
if ! id "$BENCH_USER" >/dev/null 2>&1; then
  getent group "$BENCH_TENANT" >/dev/null || { groupadd "$BENCH_TENANT"; made_group=yes; }
  useradd -M -N -g "$BENCH_TENANT" -s /usr/sbin/nologin "$BENCH_USER"; made_user=yes
fi
uid=$(id -u "$BENCH_USER"); gid=$(id -g "$BENCH_USER"); group=$(id -gn "$BENCH_USER")
rm -rf "$BENCH_DIR"; mkdir -p "$BENCH_DIR/scratch" "$BENCH_DIR/base/scratch" "$BENCH_DIR/bin" \
  "$BENCH_DIR/pki" "$BENCH_DIR/collector/work" "$BENCH_DIR/collector/out" "$BENCH_DIR/tp/state"
chmod 755 "$BENCH_DIR/scratch"
install -m 0755 "$JOB_PATH/tenancy-prolog" "$JOB_PATH/tenancy-epilog" "$TENANCYCTL" "$BENCH_DIR/bin/"
[ -e "$JOB_PATH/tenancy-prolog-dynamic" ] && install -m 0755 "$JOB_PATH/tenancy-prolog-dynamic" "$BENCH_DIR/bin/"
TENANCYCTL=$BENCH_DIR/bin/tenancyctl

# The collector's CA and certificate.
pki=$BENCH_DIR/pki
(cd "$pki"
 openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem \
   -days 2 -subj "/CN=bench CA" -addext basicConstraints=critical,CA:TRUE \
   -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
 openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout collector.key \
   -out collector.csr -subj "/CN=collector" 2>/dev/null
 printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > ext
 openssl x509 -req -in collector.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out collector.pem \
   -days 2 -extfile ext 2>/dev/null)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
out=$BENCH_DIR/collector/out
cat > "$BENCH_DIR/collector/rsyslog.conf" <<EOT
global(workDirectory="$BENCH_DIR/collector/work" maxMessageSize="64k"
  defaultNetstreamDriver="gtls" defaultNetstreamDriverCAFile="$pki/ca.pem"
  defaultNetstreamDriverCertFile="$pki/collector.pem" defaultNetstreamDriverKeyFile="$pki/collector.key")
module(load="imtcp" streamDriver.name="gtls" streamDriver.mode="1" streamDriver.authMode="anon")
input(type="imtcp" address="127.0.0.1" port="$port")
template(name="tenancyRecords" type="string" string="$out/%hostname%/audit.jsonl")
template(name="tenancyAnchors" type="string" string="$out/%hostname%/anchors.log")
template(name="tenancyLine" type="string" string="%msg%\n")
if \$app-name == "tenancy-audit" and \$msgid == "record" then {
  action(type="omfile" dynaFile="tenancyRecords" template="tenancyLine" action.resumeRetryCount="-1")
  stop
}
if \$app-name == "tenancy-audit" and \$msgid == "anchor" then {
  action(type="omfile" dynaFile="tenancyAnchors" template="tenancyLine" action.resumeRetryCount="-1")
  stop
}
EOT
/usr/sbin/rsyslogd -n -f "$BENCH_DIR/collector/rsyslog.conf" -i "$BENCH_DIR/collector/pid" \
  >"$BENCH_DIR/collector/rsyslogd.log" 2>&1 &
rsyslog_pid=$!
i=0
until python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null; do
  i=$((i + 1)); [ $i -lt 100 ] || { echo "rsyslogd did not listen on $port" >&2; cat "$BENCH_DIR/collector/rsyslogd.log" >&2; exit 1; }
  sleep 0.1
done
rsyslog_v=$(/usr/sbin/rsyslogd -v | head -1)
config() { # NAME LOG [FORWARDED]: a node's config with its own audit log
  {
    echo "[cluster]"; echo "name = \"bench\""; echo "state_dir = \"$BENCH_DIR/state\""
    echo "audit_log = \"$2\""; echo "audit_anchor = \"$2.anchors\""; echo "scratch_root = \"$BENCH_DIR/scratch\""
    if [ -n "${3:-}" ]; then
      echo "[audit]"; echo "collectors = [\"127.0.0.1:$port\"]"; echo "ca_file = \"$pki/ca.pem\""
    fi
    echo "[tiers.internal]"; echo "mig_profiles = [\"1g.18gb\"]"
    echo "[tenants.$BENCH_TENANT]"; echo "tier = \"internal\""; echo "groups = [\"$group\"]"
  } > "$BENCH_DIR/$1.toml"
}
mkdir -p "$BENCH_DIR/logs"
echo "# $(date -u +%FT%TZ) $(uname -r) $(nproc) cpus, load $(cut -d' ' -f1-3 /proc/loadavg); $rsyslog_v; job path from $JOB_PATH ($(cat "$JOB_PATH/LIBC" 2>/dev/null || echo glibc))"

# 1. Throughput.
config tp "$BENCH_DIR/tp/audit.jsonl" forwarded
sed -i "s|state_dir = .*|state_dir = \"$BENCH_DIR/tp/state\"|" "$BENCH_DIR/tp.toml"
"$GEN" "$BENCH_DIR/tp/audit.jsonl" "$RECORDS" tp1
: > "$BENCH_DIR/tp/audit.jsonl.anchors"
bytes=$(stat -c %s "$BENCH_DIR/tp/audit.jsonl")
sync
echo "## throughput: $RECORDS records ($((bytes / RECORDS)) bytes each) to rsyslog over TLS, the forwarder on one core (taskset -c 0)"
python3 - "$TENANCYCTL" "$BENCH_DIR/tp.toml" "$RECORDS" "$CONFIRM_MS" "$out/tp1/audit.jsonl" <<'EOT'
import os, resource, subprocess, sys, time
ctl, cfg, n, confirm, remote = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
t0 = time.monotonic()
p = subprocess.run(["taskset", "-c", "0", ctl, "--config", cfg, "audit", "forward", "--once",
                    "--confirm-ms", str(confirm)], capture_output=True, text=True)
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
if p.returncode != 0:
    sys.exit(f"forward failed: {p.stderr}")
def lines():
    try:
        with open(remote, "rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0
while lines() < n and time.monotonic() - t0 < 300:
    time.sleep(0.05)
landed = time.monotonic() - t0
send = wall - confirm / 1000.0
cpu = ru.ru_utime + ru.ru_stime
print(f"forward --once: wall {wall:.2f} s (of it {confirm} ms confirmation wait), cpu {cpu:.2f} s "
      f"(user {ru.ru_utime:.2f}, sys {ru.ru_stime:.2f})")
print(f"throughput: {n / send:,.0f} records/s wall on one core, {n / cpu:,.0f} records/s of forwarder CPU; "
      f"the last record written by rsyslog after {landed:.2f} s ({n / landed:,.0f} records/s end to end)")
EOT
if "$TENANCYCTL" --config "$BENCH_DIR/tp.toml" audit verify "$out/tp1/audit.jsonl" >"$BENCH_DIR/tp-verify.txt"; then
  echo "the collector's copy verifies: $(tail -1 "$BENCH_DIR/tp-verify.txt")"
else
  echo "WARNING: the collector's copy does not verify:"; tail -3 "$BENCH_DIR/tp-verify.txt"
fi

# 2. The job path with the forwarder running against without.
config nofwd "$BENCH_DIR/logs/local.jsonl"
config fwd "$BENCH_DIR/logs/forwarded.jsonl" forwarded
mkdir -p "$BENCH_DIR/state"
"$TENANCYCTL" --config "$BENCH_DIR/nofwd.toml" audit keygen >/dev/null 2>&1
ip netns add $ns; ip -n $ns link set lo up
nsenter --net=/run/netns/$ns "$TENANCYCTL" --config "$BENCH_DIR/nofwd.toml" firewall apply >/dev/null
"$TENANCYCTL" --config "$BENCH_DIR/fwd.toml" audit forward --confirm-ms 500 2>"$BENCH_DIR/forward.log" &
fwd_pid=$!
sync
echo "## pair: $JOBS jobs per variant, interleaved in a rotating order, ${FLUSH_MB} MiB read before each; the forwarder (pid $fwd_pid) ships product+fwd's log meanwhile"
python3 "$here/driver.py" pair --jobs "$JOBS" --first-job "$FIRST_JOB" --variants product,product+fwd \
  --fwd-config "$BENCH_DIR/fwd.toml" --netns "product=/run/netns/$ns" --netns "product+fwd=/run/netns/$ns" \
  ${FLUSH_MB:+--flush-mb "$FLUSH_MB"} --json "$BENCH_DIR/pair.json" \
  --config "$BENCH_DIR/nofwd.toml" --prolog "$BENCH_DIR/bin/tenancy-prolog" --epilog "$BENCH_DIR/bin/tenancy-epilog" \
  --base-prolog "$here/baseline/prolog.sh" --base-epilog "$here/baseline/epilog.sh" \
  --base-dir "$BENCH_DIR/base" --uid "$uid" --gid "$gid" --user "$BENCH_USER" --tenant "$BENCH_TENANT" --tenant-group "$group"
sleep 2
kill -TERM "$fwd_pid"; wait "$fwd_pid" || true; fwd_pid=""
node=$(head -1 "$BENCH_DIR/logs/forwarded.jsonl" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["node"])')
local_n=$(wc -l < "$BENCH_DIR/logs/forwarded.jsonl")
remote_n=$(sort -u "$out/$node/audit.jsonl" | wc -l)
echo "forwarded log: $local_n records on the node, $remote_n distinct at the collector"
