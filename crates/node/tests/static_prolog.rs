//! `tenancy-prolog` is statically linked (build-support/link.rs): it cannot load NVML or NSS
//! modules. It runs a job alone when the job needs neither (no MIG slice; its user and tenant
//! group in /etc/passwd and /etc/group, on a node whose nsswitch.conf lets those files speak
//! for NSS), and otherwise hands the job, with the same environment, to
//! `tenancy-prolog-dynamic` beside it; without that binary such a job is refused and nothing is
//! made. Real binaries, real layers (MIG through the shim, BPF device program, nft, scratch),
//! real users.

mod common;

use common::{fake_dynamic_build, install, static_world, text, World};
use std::ffi::OsString;
use std::path::Path;
use std::process::Output;
use tenancy_audit_log::{Event, Outcome};
use tenancy_node::linkage::{files_speak_for_nss, NSSWITCH};

fn prolog(w: &World, bin: &Path, env: &[(OsString, OsString)]) -> Output {
    w.command_of(&bin.join("tenancy-prolog"), &[], env)
        .output()
        .unwrap()
}

/// Whether this node's nsswitch.conf lets a static prolog answer from the files.
fn files_speak_here() -> Result<(), String> {
    let text = std::fs::read_to_string(NSSWITCH).map_err(|e| e.to_string())?;
    files_speak_for_nss(&text, |p| p.exists())
}

#[test]
fn a_job_of_users_in_the_files_runs_in_the_static_prolog_alone() {
    let Some((w, bin)) = static_world(&["tenancy-prolog", "tenancy-epilog"], "tenancy-prolog")
    else {
        return;
    };
    let job = 4201;
    let out = prolog(&w, &bin, &w.job_env(job, 1, None));
    if let Err(why) = files_speak_here() {
        // Such a node hands every job to the dynamic build, missing here.
        assert!(!out.status.success(), "{}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&why) && err.contains("tenancy-prolog-dynamic"),
            "{}",
            text(&out)
        );
        eprintln!("SKIP (the static path): {why}");
        return;
    }
    // No tenancy-prolog-dynamic in `bin`: this works only if nothing is handed off.
    assert!(out.status.success(), "{}", text(&out));
    assert!(w.cgroup(1, job).is_dir() && w.scratch_dir(1, job).is_dir());
    let last = w.records().pop().unwrap();
    assert_eq!(
        (last.event, last.outcome, last.origin.as_str()),
        (Event::JobStart, Outcome::Success, "tenancy-prolog")
    );
    assert_eq!(last.tenant.as_deref(), Some(w.tenants[1].as_str()));
    let out = w
        .command_of(&bin.join("tenancy-epilog"), &[], &w.job_env(job, 1, None))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after the static prolog and epilog");
    assert!(w.chain_is_valid());
}

/// `tenancy-prolog --epilog` is the epilog (what the static builds hand off to the dynamic one
/// runs the same way). C's argv decides it: musl, unlike glibc, gives std no arguments in a
/// program that defines C's `main` (the musl build of scripts/build-job-path).
#[test]
fn the_static_prolog_with_epilog_as_its_argument_is_the_epilog() {
    let Some((w, bin)) = static_world(&["tenancy-prolog"], "tenancy-prolog") else {
        return;
    };
    if let Err(why) = files_speak_here() {
        eprintln!("SKIP (the static path): {why}");
        return;
    }
    let job = 4202;
    let out = prolog(&w, &bin, &w.job_env(job, 1, None));
    assert!(out.status.success(), "{}", text(&out));
    assert!(w.scratch_dir(1, job).is_dir());
    let out = w
        .command_of(
            &bin.join("tenancy-prolog"),
            &["--epilog"],
            &w.job_env(job, 1, None),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let last = w.records().pop().unwrap();
    assert_eq!(
        (last.event, last.outcome),
        (Event::JobEnd, Outcome::Success)
    );
    w.assert_nothing_left("after the static prolog run as prolog, then as epilog");
    assert!(w.chain_is_valid());
}

#[test]
fn a_mig_job_is_handed_to_the_dynamic_build_and_refused_without_it() {
    let Some((w, bin)) = static_world(&["tenancy-prolog", "tenancy-epilog"], "tenancy-prolog")
    else {
        return;
    };
    let job = 4202;
    let env = w.job_env(job, 0, Some("1g.18gb"));
    let out = prolog(&w, &bin, &env);
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let dynamic = bin.join("tenancy-prolog-dynamic");
    for want in [
        format!("job {job}"),
        format!("handing the job to {}", dynamic.display()),
        "install tenancy-prolog-dynamic next to tenancy-prolog".to_string(),
    ] {
        assert!(err.contains(&want), "missing {want:?} in: {}", text(&out));
    }
    // Refused before anything was made or journaled.
    w.assert_nothing_left("after the refused MIG job");
    assert!(!w.journal_path(job).exists());
    let last = w.records().pop().unwrap();
    assert_eq!(
        (last.event, last.outcome, last.origin.as_str()),
        (Event::JobDenied, Outcome::Denied, "tenancy-prolog")
    );
    assert_eq!(last.job_id, Some(job));

    // With the dynamic build beside it, the same prolog runs the job there: one job_start.
    install(&w, "bin", &["tenancy-prolog-dynamic"]).unwrap();
    let before = w.records().len();
    let out = prolog(&w, &bin, &env);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(w.gis().len(), 1, "the job's MIG slice");
    let records = w.records();
    assert_eq!(records.len(), before + 1, "one record for the job");
    let last = records.last().unwrap();
    assert_eq!(
        (
            last.event.clone(),
            last.origin.as_str(),
            last.profile.as_deref()
        ),
        (Event::JobStart, "tenancy-prolog", Some("1g.18gb"))
    );
    let out = w
        .command_of(&bin.join("tenancy-epilog"), &[], &env)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after the handed-off prolog and epilog");
    assert!(w.chain_is_valid());
}

/// A user missing from /etc/passwd may be in another NSS source: the static prolog does not
/// refuse the job itself but hands it over, environment untouched; the dynamic build decides.
#[test]
fn a_user_missing_from_the_files_is_decided_by_the_dynamic_build() {
    let Some((w, bin)) = static_world(&["tenancy-prolog"], "tenancy-prolog") else {
        return;
    };
    let job = 4203;
    // A uid no passwd entry has.
    let ghost = (60_000..65_000u32)
        .find(|&u| tenancy_config::Identity::from_uid(u).is_err())
        .unwrap();
    let mut env = w.job_env(job, 0, None);
    for (k, v) in env.iter_mut() {
        if k == "SLURM_JOB_UID" {
            *v = ghost.to_string().into();
        }
    }
    let seen = w.root.join("seen");
    fake_dynamic_build(&bin, &seen, 7);
    let out = prolog(&w, &bin, &env);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    let got = std::fs::read_to_string(&seen).unwrap();
    let lines: Vec<&str> = got.lines().collect();
    assert!(lines.contains(&"args="), "{got}");
    for (k, v) in &env {
        let line = format!("{}={}", k.to_string_lossy(), v.to_string_lossy());
        assert!(lines.contains(&line.as_str()), "missing {line} in {got}");
    }
    assert!(w.records().is_empty(), "the static prolog recorded nothing");

    // The real dynamic build refuses the job, once.
    std::fs::remove_file(bin.join("tenancy-prolog-dynamic")).unwrap();
    install(&w, "bin", &["tenancy-prolog-dynamic"]).unwrap();
    let out = prolog(&w, &bin, &env);
    assert!(!out.status.success(), "{}", text(&out));
    let records = w.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].event, Event::JobDenied);
    assert!(
        records[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.contains(&format!("uid {ghost} has no passwd entry"))),
        "{records:?}"
    );

    // Without it, the static prolog refuses the job and says what it could not ask.
    std::fs::remove_file(bin.join("tenancy-prolog-dynamic")).unwrap();
    let out = prolog(&w, &bin, &env);
    assert!(!out.status.success(), "{}", text(&out));
    let reason = w.records().pop().unwrap().reason.unwrap_or_default();
    assert!(
        reason.contains("as far as /etc/passwd and /etc/group say")
            && reason.contains("install tenancy-prolog-dynamic next to tenancy-prolog"),
        "{reason}"
    );
    w.assert_nothing_left("after the refusals");
}

/// On a node whose users come from another NSS source too (here `files sss`, bound over
/// nsswitch.conf in a mount namespace of the prolog's own), every job goes to the dynamic
/// build, even one whose user is in /etc/passwd: the static prolog cannot ask that source.
#[test]
fn a_node_with_other_nss_sources_hands_every_job_over() {
    let Some((w, bin)) = static_world(&["tenancy-prolog"], "tenancy-prolog") else {
        return;
    };
    let job = 4204;
    let conf = w.root.join("nsswitch.conf");
    std::fs::write(&conf, "passwd: files sss\ngroup: files sss\n").unwrap();
    let seen = w.root.join("seen");
    fake_dynamic_build(&bin, &seen, 7);
    let prolog = bin.join("tenancy-prolog");
    let out = w
        .command_of(
            Path::new("/usr/bin/unshare"),
            &[
                "--mount",
                "--propagation",
                "private",
                "/bin/sh",
                "-c",
                "/bin/mount --bind \"$1\" /etc/nsswitch.conf && exec \"$2\"",
                "sh",
                conf.to_str().unwrap(),
                prolog.to_str().unwrap(),
            ],
            &w.job_env(job, 0, None),
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    let got = std::fs::read_to_string(&seen).unwrap();
    assert!(
        got.lines().any(|l| l == format!("SLURM_JOB_ID={job}")),
        "{got}"
    );
    assert!(w.records().is_empty(), "the static prolog recorded nothing");
    w.assert_nothing_left("after the hand-off");
}

/// A statically linked file installed under the dynamic build's name (a copy of
/// tenancy-prolog): the handed-off process does not hand the job on again, so the job is
/// refused at once instead of the two exec'ing each other forever.
#[test]
fn a_static_file_in_the_dynamic_builds_place_refuses_the_job_without_a_loop() {
    let Some((w, bin)) = static_world(&["tenancy-prolog"], "tenancy-prolog") else {
        return;
    };
    let job = 4205;
    std::fs::copy(
        bin.join("tenancy-prolog"),
        bin.join("tenancy-prolog-dynamic"),
    )
    .unwrap();
    let mut child = w
        .command_of(
            &bin.join("tenancy-prolog"),
            &[],
            &w.job_env(job, 0, Some("1g.18gb")),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the prolog and its hand-off exec each other without end");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not the dynamically linked build"),
        "{}",
        text(&out)
    );
    w.assert_nothing_left("after the refusal");
    let last = w.records().pop().unwrap();
    assert_eq!((last.event, last.job_id), (Event::JobDenied, Some(job)));
}
