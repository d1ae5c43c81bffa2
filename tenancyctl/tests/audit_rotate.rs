//! `tenancyctl audit rotate`: the node's log set aside, its chain going on in a new file, and
//! `audit verify` with the anchors clean across the files and on the newest alone; a rotation
//! the logrotate way (a new empty file) is what verify then reports.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tenancy_audit::{send_anchor_to, AuditLog, Event, Outcome, Record};

fn tenancyctl(config: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tenancyctl"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
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
fn job(log: &mut AuditLog, anchors: &Path, id: u64) -> u64 {
    let mut r = Record::new(
        "t",
        "n1",
        "alice",
        1001,
        Event::JobEnd,
        Outcome::Success,
        "tenancy-epilog",
    )
    .job_id(id);
    let a = log.append(&mut r).unwrap();
    send_anchor_to(
        Path::new("/nonexistent/log"),
        "n1",
        a.seq,
        &a.hash,
        Some(anchors),
    );
    a.seq
}

#[test]
fn a_rotated_log_verifies_with_its_anchors_across_its_files_and_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (config, log_path, anchors) = config(dir.path());
    let mut log = AuditLog::open(&log_path).unwrap();
    for id in 1..=3 {
        job(&mut log, &anchors, id);
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
    // The handle opened before the rotation writes on in the new file.
    assert_eq!(job(&mut log, &anchors, 4), 6);
    assert_eq!(job(&mut log, &anchors, 5), 7);
    let logs = dir.path().join("logs");
    assert_eq!(std::fs::read_dir(&logs).unwrap().count(), 2);
    let anchor_arg = anchors.display().to_string();
    let verify = |what: &Path| {
        tenancyctl(
            &config,
            &[
                "audit",
                "verify",
                "--anchor",
                &anchor_arg,
                &what.display().to_string(),
            ],
        )
    };
    let all = verify(&logs);
    assert!(all.status.success(), "{}", text(&all));
    assert!(
        text(&all).contains("t/n1: 7 records, last seq 7"),
        "{}",
        text(&all)
    );
    let newest = verify(&log_path);
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
}

#[test]
fn a_log_rotated_the_logrotate_way_restarts_its_chain_and_verify_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (config, log_path, anchors) = config(dir.path());
    let mut log = AuditLog::open(&log_path).unwrap();
    for id in 1..=3 {
        job(&mut log, &anchors, id);
    }
    // logrotate's `create`: rename, and the next append makes a new, empty file.
    std::fs::rename(&log_path, log_path.with_extension("jsonl.1")).unwrap();
    let mut fresh = AuditLog::open(&log_path).unwrap();
    assert_eq!(job(&mut fresh, &anchors, 4), 1, "a new chain");
    let out = tenancyctl(
        &config,
        &[
            "audit",
            "verify",
            "--anchor",
            &anchors.display().to_string(),
            &dir.path().join("logs").display().to_string(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("FINDING"), "{}", text(&out));
}
