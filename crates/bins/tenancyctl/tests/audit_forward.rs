//! `tenancyctl audit forward` against a real collector: rsyslog with GnuTLS on a port of
//! 127.0.0.1 (tests/common/collector.rs), certificates made with openssl here. The records
//! are appended as the prolog and epilog append theirs (`tenancy_node::spine::
//! append_anchored`: the record into the chain, the head anchored signed by the node's key),
//! from a thread of the test while the forwarder runs; and what rsyslog wrote is checked with
//! `tenancyctl audit verify` as it is.

mod common;

use common::{tenancyctl, text};

use common::collector::{make_ca, make_cert, rsyslogd, Rsyslog};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use tenancy_audit_log::{Event, Record};
use tenancy_config::Config;

const NODE: &str = "n1";

/// The node's config: its log, anchors and key under `root`, forwarding to `collector`.
fn config(root: &Path, collector: &str, ca: &Path, client: Option<(&Path, &Path)>) -> PathBuf {
    let p = root.join("tenancy.toml");
    std::fs::create_dir_all(root.join("state")).unwrap();
    std::fs::create_dir_all(root.join("log")).unwrap();
    let client = client
        .map(|(c, k)| {
            format!(
                "cert_file = \"{}\"\nkey_file = \"{}\"\n",
                c.display(),
                k.display()
            )
        })
        .unwrap_or_default();
    std::fs::write(
        &p,
        format!(
            "[cluster]\nname = \"t\"\nstate_dir = \"{r}/state\"\naudit_log = \"{r}/log/audit.jsonl\"\n\
             audit_anchor = \"{r}/log/anchors.log\"\nscratch_root = \"{r}/scratch\"\n\
             [audit]\ncollectors = [\"{collector}\"]\nca_file = \"{ca}\"\n{client}\
             [tiers.internal]\n[tenants.acme]\ntier = \"internal\"\ngroups = [\"root\"]\n",
            r = root.display(),
            ca = ca.display(),
        ),
    )
    .unwrap();
    p
}

/// A job's start and end as the prolog and epilog record them.
fn job(config: &Config, id: u64) {
    for event in [Event::JobStart, Event::JobEnd] {
        let mut r = common::alice_record(NODE, event, "tenancy-epilog")
            .job_id(id)
            .tenant("acme")
            .tier("internal");
        tenancy_job::audit::append_anchored(config, &mut r).unwrap();
    }
}

/// Seq -> line of a record file (local or the collector's); copies counted.
fn by_seq(path: &Path) -> (BTreeMap<u64, String>, usize) {
    let mut m = BTreeMap::new();
    let mut copies = 0;
    for l in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        let seq = v["seq"].as_u64().unwrap();
        if let Some(old) = m.insert(seq, l.to_string()) {
            assert_eq!(old, l, "two different records seq {seq} at the collector");
            copies += 1;
        }
    }
    (m, copies)
}

/// Waits until the collector holds every record of the local log (rsyslog writes on its own
/// time).
fn wait_for_all(local: &Path, remote: &Path, within: Duration) -> (BTreeMap<u64, String>, usize) {
    let t = Instant::now();
    loop {
        let (want, _) = by_seq(local);
        let (got, copies) = by_seq(remote);
        if want.keys().all(|s| got.get(s) == want.get(s)) {
            return (got, copies);
        }
        if t.elapsed() > within {
            let missing: Vec<_> = want.keys().filter(|s| !got.contains_key(s)).collect();
            panic!("the collector lacks seqs {missing:?} after {within:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The node's key and the public keys file holding its line.
fn keygen(root: &Path, config: &Path) -> PathBuf {
    let o = tenancyctl(config, &["audit", "keygen"]);
    assert!(o.status.success(), "keygen: {}", text(&o));
    let keys = root.join("nodes.pub");
    std::fs::write(&keys, &o.stdout).unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("n1 ed25519 "),
        "{}",
        text(&o)
    );
    keys
}

fn verify(config: &Path, keys: &Path, r: &Rsyslog) -> Output {
    tenancyctl(
        config,
        &[
            "audit",
            "verify",
            "--public-keys",
            keys.to_str().unwrap(),
            "--anchor",
            r.anchors(NODE).to_str().unwrap(),
            r.records(NODE).to_str().unwrap(),
        ],
    )
}

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config_path: PathBuf,
    config: Config,
    rsyslog: Rsyslog,
}

fn setup(client_auth: bool) -> Option<Setup> {
    rsyslogd()?;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let pki = root.join("pki");
    std::fs::create_dir(&pki).unwrap();
    let ca = make_ca(&pki, "site");
    make_cert(&pki, "site", "collector", "serverAuth");
    let (cc, ck) = make_cert(&pki, "site", "node", "clientAuth");
    let rsyslog = Rsyslog::start(&pki, "site", "collector", client_auth);
    let config_path = config(
        &root,
        &rsyslog.collector(),
        &ca,
        client_auth.then_some((cc.as_path(), ck.as_path())),
    );
    let config = Config::from_file(&config_path).unwrap();
    Some(Setup {
        _dir: dir,
        root,
        config_path,
        config,
        rsyslog,
    })
}

#[test]
fn records_reach_rsyslog_over_tls() {
    // The collector asks for a client certificate: the node's cert_file/key_file.
    let Some(s) = setup(true) else { return };
    job(&s.config, 1);
    let keys = keygen(&s.root, &s.config_path);
    for id in 2..=20 {
        job(&s.config, id);
    }
    let o = tenancyctl(
        &s.config_path,
        &["audit", "forward", "--once", "--confirm-ms", "300"],
    );
    assert!(o.status.success(), "forward: {}", text(&o));
    let local = s.config.cluster.audit_log.clone();
    let (got, _) = wait_for_all(&local, &s.rsyslog.records(NODE), Duration::from_secs(20));
    // Every record as the node holds it, byte for byte, job records and the trail's own
    // (the key's generation, the forwarder's start).
    let events: Vec<String> = got
        .values()
        .map(|l| serde_json::from_str::<Record>(l).unwrap().event.to_string())
        .collect();
    for e in [
        "job_start",
        "job_end",
        "key_generated",
        "admin_action",
        "forward_started",
    ] {
        assert!(
            events.iter().any(|x| x == e),
            "no {e} at the collector: {events:?}"
        );
    }
    // The anchors arrived too, signed, and the collector's files verify as rsyslog wrote them.
    let anchors = std::fs::read_to_string(s.rsyslog.anchors(NODE)).unwrap();
    assert!(anchors.lines().any(|l| l.contains(" sig=")), "{anchors}");
    let o = verify(&s.config_path, &keys, &s.rsyslog);
    let out = text(&o);
    assert!(o.status.success(), "verify of the collector's copy: {out}");
    assert!(
        out.contains("all chains intact") && out.contains("signed"),
        "{out}"
    );
    // What `tenancyctl metrics` says of it: nothing left to forward.
    let o = tenancyctl(&s.config_path, &["metrics"]);
    let m = String::from_utf8_lossy(&o.stdout).to_string();
    let c = s.rsyslog.collector();
    assert!(
        m.contains(&format!(
            "slurm_tenancy_audit_forward_lag_records{{collector=\"{c}\"}} 0"
        )),
        "{m}"
    );
}

#[test]
fn collector_down_loses_nothing() {
    let Some(mut s) = setup(false) else { return };
    job(&s.config, 1);
    let keys = keygen(&s.root, &s.config_path);
    // Stopped by pid, also when the test fails.
    struct Forwarder(std::process::Child);
    impl Drop for Forwarder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut fwd = Forwarder(
        Command::new(env!("CARGO_BIN_EXE_tenancyctl"))
            .arg("--config")
            .arg(&s.config_path)
            .args(["audit", "forward", "--confirm-ms", "500", "--poll-ms", "20"])
            .stderr(std::fs::File::create(s.root.join("forward.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    // Jobs end while the forwarder runs; in the middle the collector hangs (its kernel still
    // acknowledges the bytes it is sent), then dies (what it held is gone), and comes back.
    let cfg = s.config.clone();
    let jobs = std::thread::spawn(move || {
        for id in 2..=300 {
            job(&cfg, id);
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    std::thread::sleep(Duration::from_millis(1500));
    s.rsyslog.hang();
    std::thread::sleep(Duration::from_millis(1500));
    s.rsyslog.crash();
    let down_at = by_seq(&s.config.cluster.audit_log).0.len();
    std::thread::sleep(Duration::from_millis(2000));
    s.rsyslog.resume();
    jobs.join().unwrap();
    let local = s.config.cluster.audit_log.clone();
    let (got, copies) = wait_for_all(&local, &s.rsyslog.records(NODE), Duration::from_secs(60));
    unsafe { libc::kill(fwd.0.id() as i32, libc::SIGTERM) };
    assert!(fwd.0.wait().unwrap().success());
    let err = std::fs::read_to_string(s.root.join("forward.err")).unwrap();
    assert!(
        err.contains("reachable again"),
        "the outage was not seen: {err}"
    );
    eprintln!(
        "{} records at the collector ({copies} copies), {down_at} records when it stopped",
        got.len()
    );
    // The outage is in the trail, and the collector's copy verifies (copies skipped).
    let recs = std::fs::read_to_string(&local).unwrap();
    assert!(
        recs.contains("\"event\":\"forward_error\""),
        "no forward_error record"
    );
    let o = verify(&s.config_path, &keys, &s.rsyslog);
    assert!(
        o.status.success(),
        "verify of the collector's copy: {}",
        text(&o)
    );
    // And the gap a lost record would leave is found there: take one out of the copy.
    let copy = s.root.join("copy.jsonl");
    let lines: Vec<&str> = std::fs::read_to_string(s.rsyslog.records(NODE))
        .unwrap()
        .leak()
        .lines()
        .collect();
    let cut: Vec<&str> = lines
        .iter()
        .filter(|l| !l.starts_with("{\"seq\":100,"))
        .copied()
        .collect();
    std::fs::write(&copy, cut.join("\n") + "\n").unwrap();
    let o = tenancyctl(&s.config_path, &["audit", "verify", copy.to_str().unwrap()]);
    assert!(
        !o.status.success() && text(&o).contains("sequence gap"),
        "{}",
        text(&o)
    );
}

#[test]
fn forwarder_restart_resumes_at_cursor() {
    let Some(s) = setup(false) else { return };
    job(&s.config, 1);
    keygen(&s.root, &s.config_path);
    for id in 2..=5 {
        job(&s.config, id);
    }
    let once = |what: &str| {
        let o = tenancyctl(
            &s.config_path,
            &["audit", "forward", "--once", "--confirm-ms", "200"],
        );
        assert!(o.status.success(), "{what}: {}", text(&o));
        o
    };
    once("first run");
    let local = s.config.cluster.audit_log.clone();
    let remote = s.rsyslog.records(NODE);
    wait_for_all(&local, &remote, Duration::from_secs(20));
    let cursor_file = std::fs::read_dir(s.root.join("state/audit-forward"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .expect("a cursor file");
    let cursor: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cursor_file).unwrap()).unwrap();
    let at = cursor["record"]["seq"].as_u64().unwrap();
    assert!(at > 0, "{cursor}");
    // The forwarder restarts: it sends what came after its cursor, not the chain again, and
    // follows the chain across a rotation meanwhile (the tail of the file set aside, then the
    // new file).
    for id in 6..=7 {
        job(&s.config, id);
    }
    let o = tenancyctl(&s.config_path, &["audit", "rotate"]);
    assert!(o.status.success(), "{}", text(&o));
    job(&s.config, 8);
    once("second run");
    let (got, copies) = wait_for_all(&local, &remote, Duration::from_secs(20));
    let events: Vec<String> = got
        .values()
        .map(|l| serde_json::from_str::<Record>(l).unwrap().event.to_string())
        .collect();
    assert!(
        events.iter().any(|e| e == "log_rotated") && events.iter().any(|e| e == "log_continued"),
        "{events:?}"
    );
    // Every seq of the chain, across both files, once.
    let last = *got.keys().last().unwrap();
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        (1..=last).collect::<Vec<_>>()
    );
    assert_eq!(
        copies, 0,
        "a resumed forwarder sent records the collector had"
    );
    assert!(got.len() as u64 > at);
    // A cursor that is corrupt: the forwarder starts over from the oldest record rather than
    // skipping any (the collector gets copies, which verify skips), and says so in the trail.
    std::fs::write(&cursor_file, b"{\"record\": 17").unwrap();
    job(&s.config, 9);
    let o = once("run after the cursor was damaged");
    assert!(text(&o).contains("corrupt"), "{}", text(&o));
    let (_, copies) = wait_for_all(&local, &remote, Duration::from_secs(20));
    assert!(
        copies as u64 >= at,
        "started over: the early records come again ({copies})"
    );
    let recs = std::fs::read_to_string(&local).unwrap();
    assert!(recs.contains("\"event\":\"forward_error\"") && recs.contains("corrupt"));
    let o = tenancyctl(
        &s.config_path,
        &["audit", "verify", remote.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn untrusted_collector_certificate_gets_nothing() {
    let Some(()) = rsyslogd().map(|_| ()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let pki = root.join("pki");
    std::fs::create_dir(&pki).unwrap();
    let site = make_ca(&pki, "site");
    // The collector's certificate is of another CA than the one the node trusts.
    make_ca(&pki, "other");
    make_cert(&pki, "other", "collector", "serverAuth");
    let rsyslog = Rsyslog::start(&pki, "other", "collector", false);
    let cfg = config(root, &rsyslog.collector(), &site, None);
    let config = Config::from_file(&cfg).unwrap();
    for id in 1..=3 {
        job(&config, id);
    }
    let o = tenancyctl(&cfg, &["audit", "forward", "--once", "--timeout", "4"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("certificate") || out.contains("Certificate"),
        "{out}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let written: Vec<_> = walk(&rsyslog.out);
    assert!(written.is_empty(), "the collector got {written:?}");
    // The refusal is in the node's trail, and the records wait for a collector that verifies.
    let recs = std::fs::read_to_string(&config.cluster.audit_log).unwrap();
    assert!(recs.contains("\"event\":\"forward_error\""), "{recs}");
    let cursor = std::fs::read_dir(root.join("state/audit-forward"))
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&cursor).unwrap();
    assert_eq!(v["record"]["seq"], 0, "{cursor}");
    assert!(v["errors"].as_u64().unwrap() >= 1, "{cursor}");
}

#[test]
fn bad_forwarding_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let pki = root.join("pki");
    std::fs::create_dir(&pki).unwrap();
    let ca = make_ca(&pki, "site");
    let (cc, ck) = make_cert(&pki, "site", "node", "clientAuth");
    // A collector address that does not parse: the config names it, with line and column.
    let cfg = config(root, "logs1.example.org", &ca, None);
    let o = tenancyctl(&cfg, &["check"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("no port") && text(&o).contains("tenancy.toml:"),
        "{}",
        text(&o)
    );
    let cfg = config(root, "logs1.example.org:99999", &ca, None);
    assert!(text(&tenancyctl(&cfg, &["check"])).contains("not 1 to 65535"));
    // A client key others can read: the forwarder does not start.
    std::fs::set_permissions(&ck, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let cfg = config(root, "127.0.0.1:1", &ca, Some((&cc, &ck)));
    let o = tenancyctl(&cfg, &["audit", "forward", "--once"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("mode 0644") && text(&o).contains("chmod 600"),
        "{}",
        text(&o)
    );
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if std::fs::metadata(&p).map(|m| m.len() > 0).unwrap_or(false) {
            out.push(p);
        }
    }
    out
}
