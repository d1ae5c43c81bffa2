//! The audit trail's own life and the administrators' actions: every state-changing
//! `tenancyctl` command leaves an `admin_action` record (uid, user, command line, outcome),
//! and `audit prune` removes only rotated files past their retention that every collector
//! has, saying of each file what it kept and why.

mod common;

use common::{tenancyctl, text};

use chrono::{Duration, Utc};
use std::path::{Path, PathBuf};
use std::process::Command;
use tenancy_audit_log::{Event, Outcome, Record, GENESIS};

fn records(log: &Path) -> Vec<Record> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every record of the log and its rotated files, by seq.
fn chain_records(log: &Path) -> Vec<Record> {
    let dir = log.parent().unwrap();
    let name = log.file_name().unwrap().to_string_lossy().into_owned();
    let mut all: Vec<Record> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&name))
        .flat_map(|e| records(&e.path()))
        .collect();
    all.sort_by_key(|r| r.seq);
    all.dedup_by_key(|r| r.seq);
    all
}

fn admin_actions(log: &Path) -> Vec<Record> {
    chain_records(log)
        .into_iter()
        .filter(|r| r.event == Event::AdminAction)
        .collect()
}

#[test]
fn admin_actions_are_audited() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // A tenant of this test's own: the node's cgroup tree is shared with other tests.
    let tenant = format!("adm{}", std::process::id());
    let config = common::minimal_config(root);
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("[tenants.acme]", &format!("[tenants.{tenant}]")),
    )
    .unwrap();
    std::fs::create_dir_all(root.join("state")).unwrap();
    std::fs::create_dir_all(root.join("scratch")).unwrap();
    let log = root.join("audit.jsonl");
    let mut l = tenancy_audit_log::AuditLog::open(&log).unwrap();
    let mut r = common::job_end("n1", 1);
    l.append(&mut r).unwrap();
    drop(l);
    let me = rustix::process::geteuid().as_raw();

    // Each state-changing command, as the admin types it.
    let ok = |args: &[&str]| {
        let o = tenancyctl(&config, args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    };
    ok(&["audit", "keygen"]);
    ok(&["audit", "rotate"]);
    ok(&["audit", "prune", "--unforwarded-ok"]);
    // One that fails is recorded with its outcome and why.
    let o = tenancyctl(&config, &["audit", "keygen"]);
    assert!(!o.status.success(), "{}", text(&o));
    // Commands that change nothing leave no admin record.
    ok(&["audit", "prune", "--dry-run"]);
    ok(&["check"]);
    let mut want = vec![
        ("tenancyctl --config CONFIG audit keygen", Outcome::Success),
        ("tenancyctl --config CONFIG audit rotate", Outcome::Success),
        (
            "tenancyctl --config CONFIG audit prune --unforwarded-ok",
            Outcome::Success,
        ),
        ("tenancyctl --config CONFIG audit keygen", Outcome::Failure),
    ];
    if rustix::process::geteuid().is_root() {
        // The node's firewall and reconcile, in a network namespace of the test's.
        let netns = format!("adm{}", std::process::id());
        let _c = common::TestNetns::add(&netns, &tenant);
        let none = root.join("no-jobs");
        std::fs::write(&none, "").unwrap();
        let on_n1 = [
            "--node",
            "n1",
            "--running-jobs-from",
            none.to_str().unwrap(),
        ];
        let reconcile = [&["reconcile"][..], &on_n1, &["--tenant", &tenant]].concat();
        let apply = [&["reconcile", "--apply"][..], &reconcile[1..]].concat();
        for args in [
            vec!["firewall", "apply"],
            apply,
            // Dry runs are not actions.
            vec!["firewall", "apply", "--dry-run"],
            reconcile,
        ] {
            let o = Command::new("/usr/bin/nsenter")
                .arg(format!("--net=/run/netns/{netns}"))
                .arg(env!("CARGO_BIN_EXE_tenancyctl"))
                .arg("--config")
                .arg(&config)
                .args(&args)
                .output()
                .unwrap();
            assert!(o.status.success(), "{args:?}: {}", text(&o));
        }
        want.push((
            "tenancyctl --config CONFIG firewall apply",
            Outcome::Success,
        ));
        want.push((
            "tenancyctl --config CONFIG reconcile --apply --node n1 --running-jobs-from NONE --tenant TENANT",
            Outcome::Success,
        ));
    } else {
        tenancy_test_support::skip(
            "needs root",
            "firewall apply and reconcile --apply as admin actions",
        );
    }
    let got = admin_actions(&log);
    let shown: Vec<(String, Outcome)> = got
        .iter()
        .map(|r| {
            let c = r.command.clone().unwrap_or_default();
            let c = c.replace(config.to_str().unwrap(), "CONFIG");
            let c = c.replace(root.join("no-jobs").to_str().unwrap(), "NONE");
            let c = c.replace(&tenant, "TENANT");
            (c, r.outcome)
        })
        .collect();
    let want: Vec<(String, Outcome)> = want.into_iter().map(|(c, o)| (c.to_string(), o)).collect();
    assert_eq!(shown, want, "{got:#?}");
    for r in &got {
        assert_eq!(r.uid, me, "{r:?}");
        assert_eq!(r.node, "n1", "{r:?}");
        assert_eq!(r.origin, "tenancyctl");
        assert!(!r.user.is_empty());
    }
    let failed = &got[3];
    assert!(
        failed.reason.as_deref().unwrap().contains("exists"),
        "{failed:?}"
    );
    // The trail's own events are there too, and the whole chain verifies across the rotation.
    let events: Vec<String> = chain_records(&log)
        .into_iter()
        .map(|r| r.event.to_string())
        .collect();
    for e in ["key_generated", "log_rotated", "log_continued"] {
        assert!(events.iter().any(|x| x == e), "no {e}: {events:?}");
    }
    // (the folder holds the config and key files too: verify the logs)
    let logs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("audit.jsonl")
        })
        .collect();
    let mut args = vec!["audit".to_string(), "verify".to_string()];
    args.extend(logs.iter().map(|p| p.display().to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = tenancyctl(&config, &args);
    assert!(o.status.success(), "{}", text(&o));
}

/// Writes a chain of files with the records' times given: `(file name, [(days ago, tier)])`,
/// each file but the last ending with a `log_rotated` record and the next beginning with a
/// `log_continued` one.
fn chain(dir: &Path, files: &[(&str, i64, Option<&str>, usize)]) {
    let mut seq = 0;
    let mut prev = GENESIS.to_string();
    let n = files.len();
    for (i, (name, days, tier, count)) in files.iter().enumerate() {
        let t = Utc::now() - Duration::days(*days);
        let mut out = Vec::new();
        let mut push = |mut r: Record, out: &mut Vec<u8>| {
            seq += 1;
            let line = r.seal(seq, &prev).unwrap();
            prev = r.hash.clone();
            out.extend_from_slice(&line);
        };
        if i > 0 {
            push(
                Record::new(
                    "t",
                    "n1",
                    "root",
                    0,
                    Event::LogContinued,
                    Outcome::Success,
                    "tenancyctl",
                )
                .time(t),
                &mut out,
            );
        }
        for j in 0..*count {
            let mut r = common::job_end("n1", 100 + j as u64).time(t + Duration::seconds(j as i64));
            if let Some(tier) = tier {
                r = r.tier(*tier);
            }
            push(r, &mut out);
        }
        if i + 1 < n {
            push(
                Record::new(
                    "t",
                    "n1",
                    "root",
                    0,
                    Event::LogRotated,
                    Outcome::Success,
                    "tenancyctl",
                )
                .time(t + Duration::seconds(60)),
                &mut out,
            );
        }
        std::fs::write(dir.join(name), out).unwrap();
    }
}

#[test]
fn prune_keeps_unforwarded_and_young_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let logs = root.join("log");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::create_dir_all(root.join("state/audit-forward")).unwrap();
    let ca = root.join("ca.pem");
    std::fs::write(&ca, "").unwrap();
    let config = root.join("tenancy.toml");
    let write_config = |collectors: &str| {
        std::fs::write(
            &config,
            format!(
                "[cluster]\nname = \"t\"\nstate_dir = \"{r}/state\"\naudit_log = \"{r}/log/audit.jsonl\"\n\
                 audit_anchor = \"{r}/log/anchors.log\"\nscratch_root = \"{r}/scratch\"\n\
                 [audit]\nretain_days = 30\n{collectors}\
                 [tiers.internal]\n[tiers.regulated]\naudit_retain_days = 2190\n\
                 [tenants.acme]\ntier = \"internal\"\ngroups = [\"root\"]\n",
                r = root.display()
            ),
        )
        .unwrap();
    };
    write_config(&format!(
        "collectors = [\"127.0.0.1:6514\"]\nca_file = \"{}\"\n",
        ca.display()
    ));
    // seq 1-3: 400 days old, internal          -> past 30 days, forwarded: removed
    // seq 4-7: 200 days old, a regulated job   -> its tier keeps it 2190 days
    // seq 8-11: 100 days old                    -> past 30 days, but the collector has seq 9 only
    // seq 12-15: 10 days old                    -> young
    // seq 16-: the log itself                   -> never
    let old = "audit.jsonl.20251001T000000.000Z";
    let regulated = "audit.jsonl.20260501T000000.000Z";
    let unforwarded = "audit.jsonl.20260801T000000.000Z";
    let young = "audit.jsonl.20261120T000000.000Z";
    chain(
        &logs,
        &[
            (old, 400, Some("internal"), 2),
            (regulated, 200, Some("regulated"), 2),
            (unforwarded, 100, None, 2),
            (young, 10, None, 2),
            ("audit.jsonl", 1, None, 2),
        ],
    );
    std::fs::write(
        root.join("state/audit-forward/127.0.0.1_6514.json"),
        r#"{"collector": "127.0.0.1:6514", "record": {"seq": 9}}"#,
    )
    .unwrap();
    // A dry run says it all and removes nothing.
    let o = tenancyctl(&config, &["audit", "prune", "--dry-run"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(logs.join(old).exists());
    let out = text(&o);
    assert!(out.contains("would remove"), "{out}");
    // The real run.
    let o = tenancyctl(&config, &["audit", "prune", "--format", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let why = |name: &str| -> (String, String) {
        let r = rows
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["file"].as_str().unwrap().ends_with(&format!("/{name}")))
            .unwrap_or_else(|| panic!("{name}: {rows}"));
        (
            r["action"].as_str().unwrap().into(),
            r["why"].as_str().unwrap().into(),
        )
    };
    let (a, w) = why(old);
    assert_eq!(a, "remove", "{w}");
    assert!(w.contains("forwarded"), "{w}");
    let (a, w) = why(regulated);
    assert_eq!(a, "keep");
    assert!(w.contains("tier regulated requires 2190"), "{w}");
    let (a, w) = why(unforwarded);
    assert_eq!(a, "keep");
    assert!(w.contains("not forwarded") && w.contains("seq 9"), "{w}");
    let (a, w) = why(young);
    assert_eq!(a, "keep");
    assert!(w.contains("young"), "{w}");
    let (a, w) = why("audit.jsonl");
    assert_eq!(a, "keep");
    assert!(w.contains("never pruned"), "{w}");
    assert!(!logs.join(old).exists());
    for kept in [regulated, unforwarded, young, "audit.jsonl"] {
        assert!(logs.join(kept).exists(), "{kept}");
    }
    // The prune is a record naming what went; the rest still verifies as one chain.
    let recs = records(&logs.join("audit.jsonl"));
    let pruned = recs
        .iter()
        .find(|r| r.event == Event::LogPruned)
        .expect("log_pruned");
    assert!(pruned.resources[0].id.ends_with(old), "{pruned:?}");
    let mut args = vec!["audit", "verify"];
    let paths: Vec<String> = [regulated, unforwarded, young, "audit.jsonl"]
        .iter()
        .map(|n| logs.join(n).display().to_string())
        .collect();
    args.extend(paths.iter().map(String::as_str));
    let o = tenancyctl(&config, &args);
    assert!(o.status.success(), "{}", text(&o));
    // Without collectors nothing counts as forwarded: nothing goes unless the site says it
    // copies the files itself.
    write_config("");
    std::fs::set_permissions(&logs, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = tenancyctl(&config, &["audit", "prune"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(logs.join(unforwarded).exists(), "{}", text(&o));
    assert!(text(&o).contains("no [audit] collectors"), "{}", text(&o));
    let o = tenancyctl(&config, &["audit", "prune", "--unforwarded-ok"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!logs.join(unforwarded).exists(), "{}", text(&o));
    assert!(logs.join(regulated).exists() && logs.join(young).exists());
}
