//! Journals written by release 1 (main at ca97871, before the layers' typed contract) are read
//! and torn down by this build. The fixtures under `tests/fixtures/release1/` were written by
//! that release's prolog against the NVML shim (`capture_release1_fixtures`, run with that
//! release's code) with the world's names replaced by placeholders: `@ROOT@` (the world's
//! folder), `@T0@`/`@T1@` (its tenants), `@UID0@`/`@GID0@`/`@UID1@`/`@GID1@`, `@BOOT@` and
//! `@STARTED@`.
//!
//! A replay builds the same job with this build's prolog (so that the resources the fixture
//! names exist: the same GPU instance in the shim, the job's cgroup, its scratch folder), puts
//! the release-1 journal in place of this build's, and checks that task entry, the occupancy
//! index and the epilog read it as that release did: what a task joins and the environment it
//! gets, the GPU the job holds, and a teardown that leaves nothing.

mod common;

use common::{requires_root, text, World};
use std::path::Path;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/release1");

/// file, job, tenant index, MIG profile, crash at boundary named
type Case = (
    &'static str,
    u64,
    usize,
    Option<&'static str>,
    Option<&'static str>,
);

const CASES: [Case; 3] = [
    ("mig_job_made.json", 101, 0, Some("1g.18gb"), None),
    ("plain_job_made.json", 102, 1, None, None),
    (
        "mig_job_intended_only.json",
        103,
        0,
        Some("1g.18gb"),
        Some("intents-on-disk"),
    ),
];

fn placeholders(w: &World) -> Vec<(String, String)> {
    let mut v = vec![(w.root.display().to_string(), "@ROOT@".to_string())];
    for (t, name) in w.tenants.iter().enumerate() {
        v.push((name.clone(), format!("@T{t}@")));
    }
    for (t, u) in w.users.iter().enumerate() {
        v.push((format!(":{},", u.uid), format!(":\"@UID{t}@\",")));
        v.push((format!(":{},", u.gid), format!(":\"@GID{t}@\",")));
        v.push((format!(":{}}}", u.uid), format!(":\"@UID{t}@\"}}")));
        v.push((format!(":{}}}", u.gid), format!(":\"@GID{t}@\"}}")));
        v.push((format!(":{}\n", u.uid), format!(":\"@UID{t}@\"\n")));
        v.push((format!(":{}\n", u.gid), format!(":\"@GID{t}@\"\n")));
    }
    v
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .unwrap()
        .trim()
        .replace('-', "")
}

/// Runs the prolog of `job` (to the end, or killed at the boundary named `crash`).
fn prolog(w: &World, job: u64, t: usize, profile: Option<&str>, crash: Option<&str>) {
    let env = w.job_env(job, t, profile);
    let Some(crash) = crash else {
        let out = w.run(&["prolog"], &env);
        assert!(out.status.success(), "{}", text(&out));
        return;
    };
    // The boundary's number, from a prolog that is let run (then torn down).
    let probe = job + 1000;
    let out = w.run(&["prolog"], &w.job_env(probe, t, profile));
    assert!(out.status.success(), "{}", text(&out));
    let n = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("boundary "))
        .find_map(|l| {
            let (n, what) = l.split_once(' ')?;
            (what == crash).then(|| n.to_string())
        })
        .unwrap_or_else(|| panic!("no boundary {crash}: {}", text(&out)));
    let out = w.run(&["epilog"], &w.job_env(probe, t, profile));
    assert!(out.status.success(), "{}", text(&out));
    let out = w.run(&["prolog", "--crash-at", &n], &env);
    assert!(!out.status.success(), "not killed: {}", text(&out));
}

/// Writes the fixtures with the code of this build: run on release 1 only, with
/// `TENANCY_CAPTURE_FIXTURES=1 cargo test -p tenancy-node --test release1_journals -- --ignored`.
#[test]
#[ignore]
fn capture_release1_fixtures() {
    if std::env::var_os("TENANCY_CAPTURE_FIXTURES").is_none() || !requires_root("real layers") {
        return;
    }
    let Some(w) = World::new(1, None) else { return };
    std::fs::create_dir_all(FIXTURES).unwrap();
    let boot = boot_id();
    for (file, job, t, profile, crash) in CASES {
        prolog(&w, job, t, profile, crash);
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(w.journal_path(job)).unwrap()).unwrap();
        v["started"] = "@STARTED@".into();
        let mut body = serde_json::to_string_pretty(&v).unwrap();
        body = body.replace(&boot, "@BOOT@");
        for (from, to) in placeholders(&w) {
            body = body.replace(&from, &to);
        }
        // Pretty JSON puts a space after the colon.
        for (from, to) in placeholders(&w) {
            body = body.replace(&from.replacen(':', ": ", 1), &to.replacen(':', ": ", 1));
        }
        std::fs::write(Path::new(FIXTURES).join(file), body + "\n").unwrap();
        let out = w.run(&["epilog"], &w.job_env(job, t, profile));
        assert!(out.status.success(), "{}", text(&out));
    }
    w.assert_nothing_left("after the capture");
}

/// The fixture `file` with the world's names, boot and a start time of now.
fn fixture(w: &World, file: &str) -> String {
    let mut text = std::fs::read_to_string(Path::new(FIXTURES).join(file)).unwrap();
    for (to, from) in placeholders(w) {
        text = text.replace(&from.replacen(':', ": ", 1), &to.replacen(':', ": ", 1));
        text = text.replace(&from, &to);
    }
    text.replace("@BOOT@", &boot_id())
        .replace("@STARTED@", &chrono::Utc::now().to_rfc3339())
}

#[test]
fn release1_journals_are_read_and_torn_down() {
    if !requires_root("real users, product cgroups, BPF device programs") {
        return;
    }
    let Some(w) = World::new(1, None) else { return };
    for (file, job, t, profile, crash) in CASES {
        prolog(&w, job, t, profile, crash);
        let body = fixture(&w, file);
        let old: tenancy_job::Journal = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{file}: release-1 journal unreadable: {e}"));
        // This build journals the same intents, and results with the same fields plus the
        // contract's (a BPF program's id differs from run to run).
        let new = w.journal(job);
        let old_v = serde_json::to_value(&old).unwrap();
        let (new_steps, old_steps) = (new["steps"].as_array().unwrap(), &old_v["steps"]);
        assert_eq!(
            new_steps.len(),
            old_steps.as_array().unwrap().len(),
            "{file}"
        );
        for (n, o) in new_steps.iter().zip(old_steps.as_array().unwrap()) {
            assert_eq!(n["layer"], o["layer"], "{file}");
            assert_eq!(n["intent"], o["intent"], "{file}");
            let keys = |v: &serde_json::Value| -> Vec<String> {
                v.as_object()
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default()
            };
            let mut added = keys(&n["made"]);
            added.retain(|k| !keys(&o["made"]).contains(k));
            assert!(
                added.iter().all(|k| k == "contract" || k == "task_env"),
                "{file}: {added:?}"
            );
        }
        std::fs::write(w.journal_path(job), &body).unwrap();
        let journals = tenancy_job::JournalDir::at(&w.root.join("state"));
        let read = journals.load(job).unwrap().expect("journal");
        assert_eq!(read, old, "{file}");

        if crash.is_none() {
            // Task entry: the cgroups a task joins, the environment it gets.
            let cgroups = tenancy_job::task::job_cgroups(&read).unwrap();
            assert_eq!(cgroups, vec![w.cgroup(t, job)], "{file}: cgroups");
            let env = tenancy_job::task::job_env(&read).unwrap();
            let get = |k: &str| {
                env.vars
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(get("TENANCY_TENANT"), Some(w.tenants[t].clone()));
            let scratch = w.scratch_dir(t, job).display().to_string();
            assert_eq!(get("TMPDIR"), Some(scratch.clone()), "{file}: {env:?}");
            assert_eq!(get("TENANCY_SCRATCH"), Some(scratch), "{file}: {env:?}");
            let gpu = get("CUDA_VISIBLE_DEVICES").unwrap();
            if profile.is_some() {
                assert!(gpu.starts_with("MIG-"), "{file}: {env:?}");
                assert_eq!(get("NVIDIA_VISIBLE_DEVICES"), Some(gpu));
            } else {
                assert_eq!(gpu, "", "{file}");
                assert_eq!(get("NVIDIA_VISIBLE_DEVICES").as_deref(), Some("void"));
            }
        }
        // The occupancy index, rebuilt from the journals, names the job's GPU.
        let occupant = tenancy_job::Occupant::of(&read);
        assert_eq!(occupant.gpu_uuid.is_some(), profile.is_some(), "{file}");
        // The epilog tears the release-1 journal down (each case was captured on an empty
        // node): nothing is left.
        let out = w.run(&["epilog"], &w.job_env(job, t, profile));
        assert!(out.status.success(), "{file}: {}", text(&out));
        w.assert_nothing_left(&format!("after the epilog of {file}"));
        // The job's end record says what release 1's did: the slice's GPU and compute slices
        // (from a made slice only), every step removed, each with the layer's own detail.
        let recs = w.records();
        let end = recs
            .iter()
            .rfind(|r| r.job_id == Some(job) && r.event == tenancy_audit_log::Event::JobEnd)
            .unwrap_or_else(|| panic!("{file}: no job_end"));
        let made_mig = profile.is_some() && crash.is_none();
        assert_eq!(end.gpu.is_some(), made_mig, "{file}: {end:?}");
        assert_eq!(end.compute_slices, made_mig.then_some(1), "{file}");
        assert_eq!(end.resources.len(), old.steps.len(), "{file}");
        for r in &end.resources {
            assert!(
                !r.detail.contains_key("contract") && !r.detail.contains_key("task_env"),
                "{file}: {r:?}"
            );
        }
    }
    assert!(w.chain_is_valid());
}
