//! `tenancyctl audit rotate`: the node's log set aside, its chain going on in a new file, and
//! `audit verify` with the anchors clean across the files and on the newest alone; a rotation
//! the logrotate way (a new empty file) is what verify then reports.

mod common;

use common::{printed as text, tenancyctl};

use std::path::{Path, PathBuf};
use std::process::Output;

use tenancy_audit_log::{send_anchor_to, AnchorKey, AuditLog};

/// `tenancyctl audit verify` with `config`, each of `anchors` as `--anchor`, `extra`, and `logs`.
fn verify(config: &Path, anchors: &[&Path], extra: &[&str], logs: &Path) -> Output {
    let mut args: Vec<String> = ["audit", "verify"].map(String::from).into();
    for a in anchors {
        args.push("--anchor".into());
        args.push(a.display().to_string());
    }
    args.extend(extra.iter().map(|e| e.to_string()));
    args.push(logs.display().to_string());
    tenancyctl(config, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// A config whose audit log lies in `root/logs` and whose anchors go to `root/anchors`.
fn config(root: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let c = common::minimal_config(root);
    let t = std::fs::read_to_string(&c).unwrap();
    let anchors = root.join("anchors");
    std::fs::create_dir(root.join("logs")).unwrap();
    let log = root.join("logs/audit.jsonl");
    let t = t
        .replace(
            &format!("{}/audit.jsonl", root.display()),
            &log.display().to_string(),
        )
        .replace(
            "[tiers.internal]",
            &format!("audit_anchor = \"{}\"\n[tiers.internal]", anchors.display()),
        );
    std::fs::write(&c, t).unwrap();
    (c, log, anchors)
}

/// Appends a job's record through `log` and anchors it as the node does.
fn job(log: &mut AuditLog, anchors: &Path, key: Option<&AnchorKey>, id: u64) -> u64 {
    job_on("n1", log, anchors, key, id)
}

/// [`job`] on node `node`.
fn job_on(node: &str, log: &mut AuditLog, anchors: &Path, key: Option<&AnchorKey>, id: u64) -> u64 {
    let mut r = common::job_end(node, id);
    let a = log.append(&mut r).unwrap();
    send_anchor_to(
        Path::new("/nonexistent/log"),
        node,
        a.seq,
        &a.hash,
        Some(anchors),
        key,
    );
    a.seq
}

#[test]
fn a_rotated_log_verifies_with_its_anchors_across_its_files_and_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (config, log_path, anchors) = config(dir.path());
    let mut log = AuditLog::open(&log_path).unwrap();
    for id in 1..=3 {
        job(&mut log, &anchors, None, id);
    }
    let out = tenancyctl(&config, &["audit", "rotate"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("the chain goes on at seq 5 (log_continued)"),
        "{}",
        text(&out)
    );
    // The new head is anchored as every record's.
    assert!(std::fs::read_to_string(&anchors)
        .unwrap()
        .contains("node=n1 seq=5 hash="));
    // The handle opened before the rotation writes on in the new file (after the rotation's
    // admin_action record, seq 6).
    assert_eq!(job(&mut log, &anchors, None, 4), 7);
    assert_eq!(job(&mut log, &anchors, None, 5), 8);
    let logs = dir.path().join("logs");
    assert_eq!(std::fs::read_dir(&logs).unwrap().count(), 2);
    let all = verify(&config, &[&anchors], &[], &logs);
    assert!(all.status.success(), "{}", text(&all));
    assert!(
        text(&all).contains("t/n1: 8 records, last seq 8"),
        "{}",
        text(&all)
    );
    let newest = verify(&config, &[&anchors], &[], &log_path);
    assert!(newest.status.success(), "{}", text(&newest));
    assert!(
        text(&newest).contains("the chain begins at seq 5 (continues audit.jsonl.")
            && text(&newest).contains("and 3 anchor(s) of them are not checked"),
        "{}",
        text(&newest)
    );
    // Nothing to set aside in an empty log.
    let empty = dir.path().join("empty.jsonl");
    let out = tenancyctl(
        &config,
        &["audit", "rotate", "--log", &empty.display().to_string()],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("empty, nothing to rotate"),
        "{}",
        text(&out)
    );
    assert!(!empty.exists(), "rotate made the log it was asked about");
}

#[test]
fn a_log_rotated_the_logrotate_way_restarts_its_chain_and_verify_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (config, log_path, anchors) = config(dir.path());
    let mut log = AuditLog::open(&log_path).unwrap();
    for id in 1..=3 {
        job(&mut log, &anchors, None, id);
    }
    // logrotate's `create`: rename, and the next append makes a new, empty file.
    std::fs::rename(&log_path, log_path.with_extension("jsonl.1")).unwrap();
    let mut fresh = AuditLog::open(&log_path).unwrap();
    assert_eq!(job(&mut fresh, &anchors, None, 4), 1, "a new chain");
    let out = verify(&config, &[&anchors], &[], &dir.path().join("logs"));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("FINDING"), "{}", text(&out));
}

/// With `cluster.audit_anchor_key`, anchors carry a MAC and verify takes only those: a line a
/// user wrote to syslog (`logger`) without the key raises no alarm, a cut tail still does.
#[test]
fn anchors_without_the_keys_mac_are_left_out_and_a_cut_tail_still_shows() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (config, log_path, anchors) = config(dir.path());
    let key_path = dir.path().join("anchor.key");
    std::fs::write(&key_path, [7u8; 32]).unwrap();
    std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let t = std::fs::read_to_string(&config).unwrap().replace(
        "[tiers.internal]",
        &format!(
            "audit_anchor_key = \"{}\"\n[tiers.internal]",
            key_path.display()
        ),
    );
    std::fs::write(&config, t).unwrap();
    let key = AnchorKey::load(&key_path).unwrap();
    let mut log = AuditLog::open(&log_path).unwrap();
    for id in 1..=4 {
        job(&mut log, &anchors, Some(&key), id);
    }
    // The rotation's anchor carries the MAC too (the config's key).
    let out = tenancyctl(&config, &["audit", "rotate"]);
    assert!(out.status.success(), "{}", text(&out));
    let rotated_anchor = std::fs::read_to_string(&anchors)
        .unwrap()
        .lines()
        .find(|l| l.contains("seq=6 "))
        .map(str::to_string)
        .expect("the rotation anchored its head");
    assert!(rotated_anchor.contains(" mac="), "{rotated_anchor}");
    // What `logger -t tenancy-audit "node=n1 seq=99 hash=..."` leaves in syslog, and a copy
    // of a genuine anchor's MAC on another head.
    let syslog = dir.path().join("syslog");
    let genuine_mac = tenancy_audit_log::anchor_mac(&rotated_anchor)
        .unwrap()
        .to_string();
    std::fs::write(
        &syslog,
        format!(
            "Nov 30 18:50:01 n1 tenancy-audit: node=n1 seq=99 hash={}\n\
             Nov 30 18:50:02 n1 tenancy-audit: node=n1 seq=98 hash={} mac={genuine_mac}\n",
            "a".repeat(64),
            "b".repeat(64)
        ),
    )
    .unwrap();
    let logs = dir.path().join("logs");
    let verify_with =
        |config: &Path, extra: &[&str]| verify(config, &[&anchors, &syslog], extra, &logs);
    let verify = |extra: &[&str]| verify_with(&config, extra);
    // The config's key: the forged lines are left out, the chain is intact.
    let out = verify(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("t/n1: 7 records, last seq 7, head")
            && text(&out).contains("anchor seq 7: OK")
            && text(&out).contains("NOTE 2 anchor line(s) without a valid MAC left out"),
        "{}",
        text(&out)
    );
    // Without a key (another config), the forged line is a cut tail: the false alarm a user
    // could raise before.
    let bare = dir.path().join("bare.toml");
    std::fs::write(
        &bare,
        std::fs::read_to_string(&config).unwrap().replace(
            &format!("audit_anchor_key = \"{}\"\n", key_path.display()),
            "",
        ),
    )
    .unwrap();
    let out = verify_with(&bare, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("tail cut off"), "{}", text(&out));
    // A wrong key takes none of the anchors.
    let wrong = dir.path().join("wrong.key");
    std::fs::write(&wrong, [8u8; 32]).unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let w = wrong.display().to_string();
    let out = verify(&["--anchor-key", &w]);
    assert!(text(&out).contains("anchor none"), "{}", text(&out));
    // A key others may read is refused, by name.
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = verify(&["--anchor-key", &w]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("chmod 600"), "{}", text(&out));
    // The genuine anchors still catch a cut: the last two records taken off.
    let kept: Vec<_> = std::fs::read_dir(dir.path().join("logs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p != &log_path)
        .collect();
    let old = std::fs::read_to_string(&kept[0]).unwrap();
    let cut: Vec<&str> = old.lines().collect();
    std::fs::write(&kept[0], format!("{}\n", cut[..3].join("\n"))).unwrap();
    std::fs::remove_file(&log_path).unwrap();
    let out = verify(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("tail cut off"), "{}", text(&out));
}

/// A node's whole log deleted: a note when the inputs may be a few nodes' logs, a finding with
/// `--all-nodes` (the inputs are every node's), placed at the node's newest anchor (line 5 of
/// the anchor file: the two nodes' anchors alternate).
#[test]
fn a_deleted_log_is_a_finding_when_verify_is_given_every_nodes_logs() {
    let dir = tempfile::tempdir().unwrap();
    let (config, log_path, anchors) = config(dir.path());
    let mut n1 = AuditLog::open(&log_path).unwrap();
    let n2_path = dir.path().join("logs/n2.audit.jsonl");
    let mut n2 = AuditLog::open(&n2_path).unwrap();
    for id in 1..=3 {
        job_on("n1", &mut n1, &anchors, None, id);
        job_on("n2", &mut n2, &anchors, None, 10 + id);
    }
    let logs = dir.path().join("logs");
    let a = anchors.display().to_string();
    let verify = |extra: &[&str]| verify(&config, &[&anchors], extra, &logs);
    let out = verify(&["--all-nodes"]);
    assert!(out.status.success(), "{}", text(&out));
    std::fs::remove_file(&log_path).unwrap();
    let out = verify(&[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("NOTE node n1: anchored but no log among the inputs"),
        "{}",
        text(&out)
    );
    let out = verify(&["--all-nodes"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "FINDING {a}:5: node n1: seq 3: no log of this node among the inputs"
        )) && text(&out).contains("t/n2: 3 records")
            && !text(&out).contains("NOTE node n1"),
        "{}",
        text(&out)
    );
    let out = verify(&["--all-nodes", "--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("\"kind\": \"log_missing\""),
        "{}",
        text(&out)
    );
}
