//! A layer fails half-way through a real prolog: everything the earlier layers made (a MIG slice
//! in the NVML shim, a cgroup with its BPF device program under the tenant's nft rules) is rolled
//! back, the job does not run, and the audit log says why.

mod common;

use common::{requires_root, text, World};
use std::ffi::OsString;
use tenancy_audit_log::Event;

#[test]
fn an_nvml_failure_and_a_planted_symlink_roll_the_job_back_completely() {
    if !requires_root("real users, product cgroups, BPF device programs") {
        return;
    }
    let Some(w) = World::new(2, None) else { return };

    // NVML refuses the compute instance: the GI made a moment earlier must not leak.
    let mut env = w.job_env(701, 0, Some("1g.18gb"));
    env.push((
        OsString::from("NVML_SHIM_FAULTS"),
        OsString::from("ci_create=UNKNOWN"),
    ));
    let out = w.run(&["prolog"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("job 701: layer mig"), "{err}");
    assert!(err.contains("rolled back"), "{err}");
    w.assert_nothing_left("CI creation failure");

    // The tenant's scratch folder replaced by a symlink to a place the tenant must not reach:
    // scratch refuses, and MIG, devices and network are undone in reverse.
    let outside = w.root.join("outside");
    std::fs::create_dir(&outside).unwrap();
    let tenant_dir = w.root.join("scratch").join(&w.tenants[1]);
    let _ = std::fs::remove_dir(&tenant_dir);
    std::os::unix::fs::symlink(&outside, &tenant_dir).unwrap();
    let out = w.run(&["prolog"], &w.job_env(702, 1, Some("1g.18gb")));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("job 702: layer scratch"), "{err}");
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "the prolog wrote through the planted symlink"
    );
    // The slice, cgroup and BPF program are gone. The scratch step is not: its undo refuses
    // the symlink as firmly as its make did, so the journal keeps that one step and the
    // message sends the admin to reconcile (fail closed: a planted symlink needs a human).
    assert!(
        err.contains("rollback left resources behind") && err.contains("reconcile"),
        "{err}"
    );
    assert_eq!(w.gis(), vec![]);
    assert!(!w.cgroup(1, 702).exists());
    let j: serde_json::Value = w.journal(702);
    let left: Vec<&str> = j["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] != "undone")
        .map(|s| s["layer"].as_str().unwrap())
        .collect();
    assert_eq!(left, ["scratch"], "{j}");
    // Slurm's epilog after the failed prolog, while the symlink is still there: exit 1.
    let out = w.run(&["epilog"], &w.job_env(702, 1, Some("1g.18gb")));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    // The admin removes the symlink; the epilog (or reconcile) then finishes the job.
    std::fs::remove_file(&tenant_dir).unwrap();
    let out = w.run(&["epilog"], &w.job_env(702, 1, Some("1g.18gb")));
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("scratch refusal");

    // The same job, requeued with the cause gone, runs and ends cleanly.
    let env = w.job_env(702, 1, Some("1g.18gb"));
    let out = w.run(&["prolog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    let out = w.run(&["epilog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after the requeued job");

    let recs = w.records();
    let events: Vec<(Option<u64>, Event)> =
        recs.iter().map(|r| (r.job_id, r.event.clone())).collect();
    assert_eq!(
        events,
        [
            (Some(701), Event::Rollback),
            (Some(702), Event::Rollback),
            (Some(702), Event::TeardownFailed),
            (Some(702), Event::JobEnd),
            (Some(702), Event::JobStart),
            (Some(702), Event::JobEnd),
        ]
    );
    // The rollback of 702 names the three layers it undid, newest first.
    let undone: Vec<&str> = recs[1].resources.iter().map(|r| r.layer.as_str()).collect();
    assert_eq!(undone, ["scratch", "network", "devices", "mig"]);
    assert!(w.chain_is_valid());
}
