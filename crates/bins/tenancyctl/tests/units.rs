//! The systemd units the slurm-tenancy package installs (packaging/systemd): `systemd-analyze
//! verify` accepts them, they order themselves before slurmd as docs/admin-guide.md says, and the
//! commands they run do their job on a node (this machine's PID 1 is not systemd: the commands
//! run here as the units would run them, in a network namespace of the test's).

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use tenancy_test_support::units::{unit_exec_start, units_dir};
use tenancy_test_support::{output_text, requires_root, skip, TenancyToml};

/// `key=value` lines of a unit file, by key (several values of a key in order).
fn unit(name: &str) -> BTreeMap<String, Vec<String>> {
    let t = std::fs::read_to_string(units_dir().join(name)).unwrap();
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in t.lines() {
        if let Some((k, v)) = l.split_once('=') {
            if !l.starts_with('#') {
                m.entry(k.trim().to_string())
                    .or_default()
                    .push(v.trim().to_string());
            }
        }
    }
    m
}

fn has(u: &BTreeMap<String, Vec<String>>, key: &str, word: &str) -> bool {
    u.get(key)
        .is_some_and(|v| v.iter().any(|l| l.split_whitespace().any(|w| w == word)))
}

/// The unit's ExecStart with the installed tenancyctl replaced by the one built here.
fn exec_start(name: &str) -> Vec<String> {
    unit_exec_start(name, Path::new(env!("CARGO_BIN_EXE_tenancyctl"))).unwrap()
}

#[test]
fn units_verify() {
    let names = [
        "tenancy-firewall.service",
        "tenancy-reconcile.service",
        "tenancy-reconcile.timer",
        "tenancy-audit-rotate.service",
        "tenancy-audit-rotate.timer",
        "tenancy-metrics.service",
        "tenancy-metrics.timer",
        "tenancy-audit-forward.service",
        "tenancy-audit-prune.service",
        "tenancy-audit-prune.timer",
    ];
    // systemd-analyze verify, in a root holding the units and the tenancyctl they run.
    let Ok(sa) = Command::new("systemd-analyze").arg("--version").output() else {
        skip("needs systemd-analyze", "apt-get install systemd");
        return;
    };
    assert!(sa.status.success());
    let root = tempfile::tempdir().unwrap();
    let system = root.path().join("lib/systemd/system");
    std::fs::create_dir_all(&system).unwrap();
    std::fs::create_dir_all(root.path().join("usr/bin")).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_tenancyctl"),
        root.path().join("usr/bin/tenancyctl"),
    )
    .unwrap();
    // The system's own units (targets, slurmd.service) beside ours, which name them.
    let cp = Command::new("cp")
        .args(["-a", "/lib/systemd/system/."])
        .arg(&system)
        .output()
        .unwrap();
    assert!(cp.status.success(), "{}", output_text(&cp));
    for n in names {
        std::fs::copy(units_dir().join(n), system.join(n)).unwrap();
    }
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .arg(format!("--root={}", root.path().display()))
        .args(names.map(|n| system.join(n)))
        .output()
        .unwrap();
    let said = output_text(&out);
    assert!(out.status.success(), "systemd-analyze verify: {said}");
    // Any complaint about our units is a failure (verify exits 0 on some of them).
    for n in names {
        assert!(
            !said.contains(n),
            "systemd-analyze verify about {n}: {said}"
        );
    }

    // The ordering docs/admin-guide.md promises: the firewall and reconcile before slurmd; slurmd
    // does not start without the firewall; the timers start their services.
    let fw = unit("tenancy-firewall.service");
    assert!(has(&fw, "Before", "slurmd.service"), "{fw:?}");
    assert!(has(&fw, "RequiredBy", "slurmd.service"), "{fw:?}");
    let rc = unit("tenancy-reconcile.service");
    assert!(has(&rc, "Before", "slurmd.service"), "{rc:?}");
    assert!(has(&rc, "After", "tenancy-firewall.service"), "{rc:?}");
    assert_eq!(
        exec_start("tenancy-reconcile.service")[1..],
        ["reconcile", "--apply"]
    );
    // Started again by its timer (for jobs whose epilog Slurm never ran): a oneshot that
    // stays active after its run would never be started again.
    assert!(!has(&rc, "RemainAfterExit", "yes"), "{rc:?}");
    let rt = unit("tenancy-reconcile.timer");
    assert!(rt.contains_key("OnUnitActiveSec"), "{rt:?}");
    assert!(has(&rt, "WantedBy", "timers.target"), "{rt:?}");
    assert_eq!(
        exec_start("tenancy-firewall.service")[1..],
        ["firewall", "apply"]
    );
    assert_eq!(
        exec_start("tenancy-audit-rotate.service")[1..],
        ["audit", "rotate"]
    );
    assert_eq!(unit("tenancy-audit-rotate.timer")["OnCalendar"], ["daily"]);
    assert_eq!(
        exec_start("tenancy-metrics.service")[1..3],
        ["metrics", "--textfile"]
    );
    assert!(unit("tenancy-metrics.timer").contains_key("OnUnitActiveSec"));
    assert_eq!(
        exec_start("tenancy-audit-forward.service")[1..],
        ["audit", "forward"]
    );
    let fwd = unit("tenancy-audit-forward.service");
    assert!(has(&fwd, "Restart", "always"), "{fwd:?}");
    assert!(has(&fwd, "RestartPreventExitStatus", "3"), "{fwd:?}");
    assert_eq!(
        exec_start("tenancy-audit-prune.service")[1..],
        ["audit", "prune"]
    );
    assert_eq!(unit("tenancy-audit-prune.timer")["OnCalendar"], ["daily"]);

    // The commands themselves, as root, on a config of the test's.
    if !requires_root("running the units' commands") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tenant = format!("u{}", std::process::id());
    let config = dir.path().join("tenancy.toml");
    let mut toml = TenancyToml::under("t", dir.path());
    toml.tier("internal");
    toml.tenant(&tenant).tier("internal").groups(["root"]);
    std::fs::write(&config, toml.to_string()).unwrap();
    std::fs::create_dir(dir.path().join("scratch")).unwrap();
    let netns = format!("units{}", std::process::id());
    let _cleanup = common::TestNetns::add(&netns, &tenant);
    let run = |words: &[String], extra: &[&str]| -> Output {
        Command::new("/usr/bin/nsenter")
            .arg(format!("--net=/run/netns/{netns}"))
            .args(words)
            .args(extra)
            .env("TENANCY_CONFIG", &config)
            .output()
            .unwrap()
    };
    // tenancy-firewall.service: the table is loaded with the tenant's counter.
    let out = run(&exec_start("tenancy-firewall.service"), &[]);
    assert!(
        out.status.success(),
        "firewall apply: {}",
        output_text(&out)
    );
    let nft = Command::new("/usr/bin/nsenter")
        .arg(format!("--net=/run/netns/{netns}"))
        .args(["/usr/sbin/nft", "list", "counters"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&nft.stdout).contains(&format!("drop_{tenant}")),
        "{}",
        output_text(&nft)
    );
    // tenancy-reconcile.service: nothing left on a fresh node; Slurm's answer (no job on the
    // node) given as a file, as this machine runs no slurmctld for it.
    let none = dir.path().join("no-jobs");
    std::fs::write(&none, "").unwrap();
    let out = run(
        &exec_start("tenancy-reconcile.service"),
        &[
            "--node",
            "n1",
            "--running-jobs-from",
            none.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "reconcile --apply: {}",
        output_text(&out)
    );
    assert!(dir.path().join("state/reconciled").is_file());
    // tenancy-metrics.service: the textfile, in a folder of the test's.
    let mut metrics = exec_start("tenancy-metrics.service");
    let prom = dir.path().join("prom");
    std::fs::create_dir(&prom).unwrap();
    metrics[3] = prom.display().to_string();
    let out = run(&metrics, &[]);
    assert!(out.status.success(), "metrics: {}", output_text(&out));
    let m = std::fs::read_to_string(prom.join("slurm_tenancy.prom")).unwrap();
    assert!(
        m.contains("slurm_tenancy_last_reconcile_timestamp_seconds "),
        "{m}"
    );
    assert!(
        !m.contains("slurm_tenancy_last_reconcile_timestamp_seconds 0\n"),
        "{m}"
    );
    assert!(m.contains("slurm_tenancy_firewall_loaded 1"), "{m}");
    // tenancy-audit-rotate.service: the log (one job's end) set aside, its chain going on.
    let mut log = tenancy_audit_log::AuditLog::open(dir.path().join("audit.jsonl")).unwrap();
    let mut rec = common::job_end("n1", 1);
    log.append(&mut rec).unwrap();
    drop(log);
    let out = run(&exec_start("tenancy-audit-rotate.service"), &[]);
    assert!(out.status.success(), "audit rotate: {}", output_text(&out));
    let rotated: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            n.starts_with("audit.jsonl.").then_some(n)
        })
        .collect();
    assert_eq!(rotated.len(), 1, "{rotated:?}");
    // tenancy-audit-forward.service with no collectors in the config: exit 3, which the unit
    // does not restart.
    let out = run(&exec_start("tenancy-audit-forward.service"), &[]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "audit forward: {}",
        output_text(&out)
    );
    assert!(
        output_text(&out).contains("collectors is empty"),
        "{}",
        output_text(&out)
    );
    // tenancy-audit-prune.service: the rotated file is young, and kept.
    let out = run(
        &exec_start("tenancy-audit-prune.service"),
        &["--unforwarded-ok"],
    );
    assert!(out.status.success(), "audit prune: {}", output_text(&out));
    assert!(output_text(&out).contains("young"), "{}", output_text(&out));
}
