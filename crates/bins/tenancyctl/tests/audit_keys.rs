//! Signed anchors: each node's Ed25519 key (`tenancyctl audit keygen`) signs its anchors, and
//! `audit verify --public-keys` and `report --statement` check them with the nodes' public
//! keys and no secret. Records and anchors are made as the prolog and epilog make them
//! (`tenancy_job::audit::append_anchored`), the anchors into `cluster.audit_anchor`.

mod common;

use common::{tenancyctl, text};
use std::path::{Path, PathBuf};
use std::process::Command;
use tenancy_audit_log::{AnchorAuth, ClockSync, Event, NodeKey, Record};
use tenancy_config::Config;

/// A node's config under `root/<node>`; `hmac`: the cluster's shared anchor key file.
fn node_config(root: &Path, node: &str, hmac: Option<&Path>) -> (PathBuf, Config) {
    let d = root.join(node);
    std::fs::create_dir_all(d.join("state")).unwrap();
    let key = hmac
        .map(|k| format!("audit_anchor_key = \"{}\"\n", k.display()))
        .unwrap_or_default();
    let p = d.join("tenancy.toml");
    std::fs::write(
        &p,
        format!(
            "[cluster]\nname = \"t\"\nstate_dir = \"{r}/state\"\naudit_log = \"{r}/audit.jsonl\"\n\
             audit_anchor = \"{r}/anchors.log\"\n{key}scratch_root = \"{r}/scratch\"\n\
             [tiers.internal]\n[tenants.acme]\ntier = \"internal\"\ngroups = [\"root\"]\n",
            r = d.display()
        ),
    )
    .unwrap();
    let c = Config::from_file(&p).unwrap();
    (p, c)
}

/// A job's start and end on `node`, as the prolog and epilog record them.
fn job(config: &Config, node: &str, id: u64) {
    let t = chrono::Utc::now() - chrono::Duration::minutes(10);
    let mut r = common::alice_record(node, Event::JobStart, "tenancy-prolog")
        .job_id(id)
        .tenant("acme")
        .tier("internal")
        .time(t);
    tenancy_job::audit::append_anchored(config, &mut r).unwrap();
    let mut r = common::job_end(node, id)
        .tenant("acme")
        .tier("internal")
        .started(t);
    tenancy_job::audit::append_anchored(config, &mut r).unwrap();
}

fn keygen(config: &Path, extra: &[&str]) -> String {
    let mut args = vec!["audit", "keygen"];
    args.extend_from_slice(extra);
    let o = tenancyctl(config, &args);
    assert!(o.status.success(), "keygen: {}", text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn verify(config: &Path, args: &[&str]) -> (bool, String) {
    let mut a = vec!["audit", "verify"];
    a.extend_from_slice(args);
    let o = tenancyctl(config, &a);
    (o.status.success(), text(&o))
}

/// `audit verify` of `log` with `opts` (what to check the anchors with) and the `anchors` files.
fn verify_anchors(config: &Path, opts: &[&str], anchors: &[&Path], log: &Path) -> (bool, String) {
    let mut a = opts.to_vec();
    for p in anchors {
        a.extend(["--anchor", s(p)]);
    }
    a.push(s(log));
    verify(config, &a)
}

/// An anchor line for n1's record `seq` of `hash`, signed by `key` alone.
fn signed_anchor(key: &NodeKey, seq: u64, hash: &str, clock: Option<ClockSync>) -> String {
    let auth = AnchorAuth {
        mac: None,
        node_key: Some(key),
    };
    tenancy_audit_log::anchor_text("n1", seq, hash, &chrono::Utc::now(), clock, &auth)
}

/// doctor's row for `check` (`doctor --format json`).
fn doctor_row(config: &Path, check: &str) -> serde_json::Value {
    let o = tenancyctl(config, &["doctor", "--format", "json"]);
    let rows: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["check"] == check);
    row.unwrap_or_else(|| panic!("{rows}")).clone()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn anchors_verify_with_public_keys_only() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, c) = node_config(dir.path(), "n1", None);
    job(&c, "n1", 1);
    let line = keygen(&cfg, &[]);
    assert!(
        line.starts_with("n1 ed25519 ") && line.len() == "n1 ed25519 ".len() + 64,
        "{line}"
    );
    for id in 2..=4 {
        job(&c, "n1", id);
    }
    let keys = dir.path().join("nodes.pub");
    std::fs::write(&keys, format!("# the nodes' public keys\n{line}\n")).unwrap();
    let signed = ["--public-keys", s(&keys)];
    // The key's generation is itself a record.
    let log = std::fs::read_to_string(&c.cluster.audit_log).unwrap();
    assert!(log.contains("\"event\":\"key_generated\""), "{log}");
    // The auditor holds no secret: the node's private key is not even there.
    std::fs::rename(&c.audit.signing_key, dir.path().join("elsewhere.key")).unwrap();
    let anchors = c.cluster.audit_anchor.clone().unwrap();
    let (ok, out) = verify_anchors(&cfg, &signed, &[&anchors], &c.cluster.audit_log);
    assert!(ok, "{out}");
    // Every anchor since the key was made: its own record's, the keygen's admin action's and
    // three job ends'; the one from before the key is not taken.
    assert!(
        out.contains("anchors checked with the nodes' public keys: 5 signed"),
        "{out}"
    );
    assert!(
        out.contains("1 anchor line(s) without a valid signature or MAC left out"),
        "{out}"
    );
    // A forged anchor line (any local user can write one to syslog) is left out, no alarm.
    let forged = dir.path().join("syslog");
    std::fs::write(
        &forged,
        format!(
            "Dec  1 12:00:00 n1 tenancy-audit: node=n1 seq=999 hash={} key=abc sig={}\n",
            "0".repeat(64),
            "1".repeat(128)
        ),
    )
    .unwrap();
    let (ok, out) = verify_anchors(&cfg, &signed, &[&anchors, &forged], &c.cluster.audit_log);
    assert!(ok && out.contains("signature does not hold"), "{out}");
    // Without the public keys the same forged line is taken, and verify cries wolf.
    let (ok, out) = verify_anchors(&cfg, &[], &[&anchors, &forged], &c.cluster.audit_log);
    assert!(!ok && out.contains("tail cut off"), "{out}");
    // A cut tail shows against the signed anchors.
    let whole = std::fs::read_to_string(&c.cluster.audit_log).unwrap();
    let cut = dir.path().join("cut.jsonl");
    let lines: Vec<&str> = whole.lines().collect();
    std::fs::write(&cut, lines[..lines.len() - 2].join("\n") + "\n").unwrap();
    let (ok, out) = verify_anchors(&cfg, &signed, &[&anchors], &cut);
    assert!(!ok && out.contains("tail cut off"), "{out}");

    // Rotation: a record, whose anchor the old key signs; the old key's line keeps verifying
    // the anchors it signed, the new one's the anchors after.
    std::fs::rename(dir.path().join("elsewhere.key"), &c.audit.signing_key).unwrap();
    let new_line = keygen(&cfg, &["--rotate"]);
    assert_ne!(new_line, line);
    job(&c, "n1", 5);
    let log = std::fs::read_to_string(&c.cluster.audit_log).unwrap();
    assert!(log.contains("\"event\":\"key_rotated\""), "{log}");
    std::fs::write(&keys, format!("{line}\n{new_line}\n")).unwrap();
    let (ok, out) = verify_anchors(&cfg, &signed, &[&anchors], &c.cluster.audit_log);
    assert!(ok && !out.contains("does not hold"), "{out}");
    // Without the old key's line its anchors are not taken (and say so).
    std::fs::write(&keys, format!("{new_line}\n")).unwrap();
    let (ok, out) = verify_anchors(&cfg, &signed, &[&anchors], &c.cluster.audit_log);
    assert!(
        ok && out.contains("by a key in no line of the public keys file"),
        "{out}"
    );
    std::fs::write(&keys, format!("{line}\n{new_line}\n")).unwrap();

    // The statement's integrity line checks them the same way.
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let o = tenancyctl(
        &cfg,
        &[
            "report",
            "--statement",
            &month,
            "--public-keys",
            s(&keys),
            "--anchor",
            s(&anchors),
            s(&c.cluster.audit_log),
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("signed by each node's own key"),
        "{}",
        text(&o)
    );
}

#[test]
fn one_nodes_key_cannot_sign_for_another() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg1, c1) = node_config(dir.path(), "n1", None);
    let (cfg2, c2) = node_config(dir.path(), "n2", None);
    job(&c1, "n1", 1);
    job(&c2, "n2", 1);
    let l1 = keygen(&cfg1, &[]);
    let l2 = keygen(&cfg2, &[]);
    for id in 2..=3 {
        job(&c1, "n1", id);
        job(&c2, "n2", id);
    }
    let keys = dir.path().join("nodes.pub");
    std::fs::write(&keys, format!("{l1}\n{l2}\n")).unwrap();
    // Root on n2 holds n2's key and signs an anchor for n1, past n1's end: a "cut tail" that
    // would make n1's log look tampered with.
    let k2 = NodeKey::load(&c2.audit.signing_key).unwrap();
    let forged = signed_anchor(&k2, 999, &"ab".repeat(32), tenancy_audit_log::clock_sync());
    let syslog = dir.path().join("syslog");
    std::fs::write(
        &syslog,
        format!("Dec  1 12:00:00 n2 tenancy-audit: {forged}\n"),
    )
    .unwrap();
    let a1 = c1.cluster.audit_anchor.clone().unwrap();
    let a2 = c2.cluster.audit_anchor.clone().unwrap();
    let args = [
        "--all-nodes",
        "--public-keys",
        s(&keys),
        "--anchor",
        s(&a1),
        "--anchor",
        s(&a2),
        "--anchor",
        s(&syslog),
        s(&c1.cluster.audit_log),
        s(&c2.cluster.audit_log),
    ];
    let (ok, out) = verify(&cfg1, &args);
    assert!(ok, "{out}");
    assert!(
        out.contains("signed by another node's key")
            && out.contains("node n2's key signed for node n1"),
        "{out}"
    );
    // Signed by n1's own key, the same claim is taken, and the cut shows: the check is real.
    let k1 = NodeKey::load(&c1.audit.signing_key).unwrap();
    let own = signed_anchor(&k1, 999, &"ab".repeat(32), None);
    std::fs::write(&syslog, format!("{own}\n")).unwrap();
    let (ok, out) = verify(&cfg1, &args);
    assert!(!ok && out.contains("tail cut off"), "{out}");
    // And the public keys file cannot give one key to two nodes.
    let k1hex = l1.rsplit(' ').next().unwrap();
    std::fs::write(&keys, format!("{l1}\nn2 ed25519 {k1hex}\n")).unwrap();
    let (ok, out) = verify(&cfg1, &args);
    assert!(
        !ok && out.contains("the same key is listed for node n1"),
        "{out}"
    );
}

#[test]
fn old_hmac_anchors_still_verify() {
    let dir = tempfile::tempdir().unwrap();
    let hmac = dir.path().join("anchor.key");
    std::fs::write(&hmac, [7u8; 32]).unwrap();
    std::fs::set_permissions(&hmac, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (cfg, c) = node_config(dir.path(), "n1", Some(&hmac));
    // A log of the release before: anchors with the cluster's HMAC alone.
    for id in 1..=3 {
        job(&c, "n1", id);
    }
    let anchors = c.cluster.audit_anchor.clone().unwrap();
    let before = std::fs::read_to_string(&anchors).unwrap();
    assert!(
        before
            .lines()
            .all(|l| l.contains(" mac=") && !l.contains(" sig=")),
        "{before}"
    );
    // Then the node gets its own key; its anchors carry both.
    let line = keygen(&cfg, &[]);
    for id in 4..=6 {
        job(&c, "n1", id);
    }
    let keys = dir.path().join("nodes.pub");
    std::fs::write(&keys, format!("{line}\n")).unwrap();
    let log = c.cluster.audit_log.as_path();
    let mac = ["--anchor-key", s(&hmac)];
    let both = ["--anchor-key", s(&hmac), "--public-keys", s(&keys)];
    // With the HMAC key alone, as before.
    let (ok, out) = verify_anchors(&cfg, &mac, &[&anchors], log);
    assert!(ok, "{out}");
    // With both: the old anchors by their MAC, the new ones by their signature.
    let (ok, out) = verify_anchors(&cfg, &both, &[&anchors], log);
    assert!(ok, "{out}");
    assert!(out.contains("signed, 3 by their MAC alone"), "{out}");
    // Root on any node holds the HMAC key: after the node signed, a MAC alone proves nothing
    // and is left out (with the HMAC key alone it would pass for a cut tail).
    let key = tenancy_audit_log::AnchorKey::load(&hmac).unwrap();
    let forged = tenancy_audit_log::anchor_text(
        "n1",
        999,
        &"cd".repeat(32),
        &chrono::Utc::now(),
        None,
        &AnchorAuth {
            mac: Some(&key),
            node_key: None,
        },
    );
    let syslog = dir.path().join("syslog");
    std::fs::write(&syslog, format!("{forged}\n")).unwrap();
    let (ok, out) = verify_anchors(&cfg, &both, &[&anchors, &syslog], log);
    assert!(
        ok && out.contains("MAC alone, at or after their node's first signed anchor"),
        "{out}"
    );
    let (ok, out) = verify_anchors(&cfg, &mac, &[&anchors, &syslog], log);
    assert!(!ok && out.contains("tail cut off"), "{out}");
    // doctor says which the node uses.
    let signing = doctor_row(&cfg, "audit.signing");
    assert_eq!(signing["severity"], "ok", "{signing}");
    assert!(
        signing["message"].as_str().unwrap().contains("Ed25519 key"),
        "{signing}"
    );
    std::fs::remove_file(&c.audit.signing_key).unwrap();
    let signing = doctor_row(&cfg, "audit.signing");
    assert_eq!(signing["severity"], "warn", "{signing}");
    assert!(
        signing["message"]
            .as_str()
            .unwrap()
            .contains("shared HMAC alone"),
        "{signing}"
    );
}

/// The kernel's clock state, asked through another door than the product's (python's ctypes).
fn kernel_synchronised() -> bool {
    let o = Command::new("python3")
        .args([
            "-c",
            "import ctypes\nclass T(ctypes.Structure):\n _fields_=[('modes',ctypes.c_uint),('offset',ctypes.c_long),('freq',ctypes.c_long),('maxerror',ctypes.c_long),('esterror',ctypes.c_long),('status',ctypes.c_int),('pad',ctypes.c_char*200)]\nt=T()\nr=ctypes.CDLL(None).adjtimex(ctypes.byref(t))\nprint('synced' if r!=5 and not t.status&0x40 else 'unsynced')",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim() == "synced"
}

#[test]
fn unsynchronised_clock_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (cfg, c) = node_config(dir.path(), "n1", None);
    job(&c, "n1", 1);
    let line = keygen(&cfg, &[]);
    for id in 2..=3 {
        job(&c, "n1", id);
    }
    let anchors = c.cluster.audit_anchor.clone().unwrap();
    let keys = dir.path().join("nodes.pub");
    std::fs::write(&keys, format!("{line}\n")).unwrap();
    let signed = ["--public-keys", s(&keys)];
    // Every anchor carries the clock's state as the kernel gives it.
    let synced = kernel_synchronised();
    let want = if synced {
        "clock=synced"
    } else {
        "clock=unsynced"
    };
    let a = std::fs::read_to_string(&anchors).unwrap();
    assert!(
        a.lines()
            .all(|l| l.contains(want) && l.contains("esterror_us=")),
        "{want}: {a}"
    );
    let (ok, out) = verify_anchors(&cfg, &signed, &[&anchors], &c.cluster.audit_log);
    assert!(ok, "{out}");
    assert_eq!(
        out.contains("WARNING node n1: its clock was not synchronised"),
        !synced,
        "{out}"
    );
    // doctor warns on such a node.
    let clock = doctor_row(&cfg, "audit.clock");
    assert_eq!(
        clock["severity"],
        if synced { "ok" } else { "warn" },
        "{clock}"
    );

    // Both states, whatever this machine's: anchors signed by the node's key that say
    // synchronised and not, the later ones not (the clock lost its source).
    let k = NodeKey::load(&c.audit.signing_key).unwrap();
    let log = std::fs::read_to_string(&c.cluster.audit_log).unwrap();
    let made = dir.path().join("made-anchors.log");
    let mut out_lines = String::new();
    for l in log.lines() {
        let r: Record = serde_json::from_str(l).unwrap();
        let clock = ClockSync {
            synchronised: r.seq < 5,
            esterror_us: if r.seq < 5 { 800 } else { 250_000 },
            maxerror_us: 500_000,
        };
        let t = signed_anchor(&k, r.seq, &r.hash_of_line(l), Some(clock));
        out_lines.push_str(&t);
        out_lines.push('\n');
    }
    std::fs::write(&made, out_lines).unwrap();
    let last = log.lines().count();
    let (ok, out) = verify_anchors(&cfg, &signed, &[&made], &c.cluster.audit_log);
    assert!(ok, "{out}");
    let want = format!(
        "WARNING node n1: its clock was not synchronised: {} anchor(s) from seq 5 to {last}",
        last - 4
    );
    assert!(
        out.contains(&want) && out.contains("up to 250 ms"),
        "{want}\n{out}"
    );
    // An assessor who requires it gets a finding.
    let required = ["--require-clock-sync", "--public-keys", s(&keys)];
    let (ok, out) = verify_anchors(&cfg, &required, &[&made], &c.cluster.audit_log);
    assert!(!ok && out.contains("clock not synchronised"), "{out}");
}

/// The stored hash of a record line.
trait HashOfLine {
    fn hash_of_line(&self, line: &str) -> String;
}
impl HashOfLine for Record {
    fn hash_of_line(&self, line: &str) -> String {
        line[line.len() - 66..line.len() - 2].to_string()
    }
}
