//! `tenancy-epilog` is statically linked (build-support/link.rs) and cannot load NVML: it hands
//! a job with a MIG slice to `tenancy-prolog-dynamic --epilog` next to it (at once when the job asked
//! for one, else once its journal shows one), and tears every other job down alone. Without
//! that binary it fails closed: nothing torn down, the journal kept, a teardown_failed record;
//! with it, the same epilog run leaves nothing. Real binaries, real layers (MIG through the
//! shim, BPF device program, nft, scratch).

mod common;

use common::{fake_dynamic_build, install, static_world, text, World};
use std::path::Path;
use tenancy_audit_log::{Event, Outcome};

fn epilog(
    w: &World,
    bin: &Path,
    job: u64,
    t: usize,
    profile: Option<&str>,
) -> std::process::Output {
    w.command_of(
        &bin.join("tenancy-epilog"),
        &[],
        &w.job_env(job, t, profile),
    )
    .output()
    .unwrap()
}

#[test]
fn a_mig_job_is_handed_to_the_dynamic_build_and_fails_closed_without_it() {
    let Some((w, bin)) = static_world(&["tenancy-epilog"], "tenancy-epilog") else {
        return;
    };
    let job = 4101;
    let out = w.run(&["prolog"], &w.job_env(job, 0, Some("1g.18gb")));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(w.gis().len(), 1);

    // Alone, the static epilog cannot destroy the slice: it must not touch anything.
    let out = epilog(&w, &bin, job, 0, Some("1g.18gb"));
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    let handoff = bin.join("tenancy-prolog-dynamic");
    for want in [
        format!("job {job}"),
        "layer mig".to_string(),
        format!("{} --epilog", handoff.display()),
        "nothing was torn down".to_string(),
        "Install tenancy-prolog-dynamic next to tenancy-epilog".to_string(),
    ] {
        assert!(err.contains(&want), "missing {want:?} in: {}", text(&out));
    }
    assert_eq!(w.gis().len(), 1, "the slice is still the job's");
    assert!(
        w.cgroup(0, job).is_dir(),
        "the job's cgroup was left as it was"
    );
    assert!(
        w.scratch_dir(0, job).is_dir(),
        "the scratch folder was left as it was"
    );
    assert!(
        w.journal_path(job).exists(),
        "the journal is kept for the next attempt"
    );
    let last = w.records().pop().unwrap();
    assert_eq!(
        (last.event, last.outcome, last.origin.as_str()),
        (Event::TeardownFailed, Outcome::Failure, "tenancy-epilog")
    );
    assert_eq!(last.job_id, Some(job));

    // With tenancy-prolog-dynamic beside it, the same epilog tears everything down through it.
    install(&w, "bin", &["tenancy-prolog-dynamic"]).unwrap();
    let out = epilog(&w, &bin, job, 0, Some("1g.18gb"));
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after the handed-off epilog");
    let last = w.records().pop().unwrap();
    assert_eq!(
        (last.event, last.outcome, last.origin.as_str()),
        (Event::JobEnd, Outcome::Success, "tenancy-epilog")
    );
    assert!(w.chain_is_valid());
}

/// The journal decides, not the job's `--mig`: a slice whose request is missing from the
/// epilog's environment is still handed off.
#[test]
fn a_slice_only_the_journal_shows_is_handed_off_too() {
    let Some((w, bin)) = static_world(
        &["tenancy-epilog", "tenancy-prolog-dynamic"],
        "tenancy-epilog",
    ) else {
        return;
    };
    let job = 4103;
    let out = w.run(&["prolog"], &w.job_env(job, 0, Some("1g.18gb")));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(w.gis().len(), 1);
    // Without SPANK_TENANCY_MIG; the static epilog reads the journal, then hands the job off.
    let out = epilog(&w, &bin, job, 0, None);
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after the handed-off epilog");
    assert!(w.chain_is_valid());
}

/// What the hand-off gives the program: `--epilog`, and the job id as TENANCY_HANDOFF_JOB_ID
/// instead of SLURM_JOB_ID, so that a program that does not know `--epilog` fails for want of
/// a job instead of running the prolog again for an ended job.
#[test]
fn the_hand_off_passes_the_job_under_a_name_an_old_prolog_does_not_read() {
    let Some((w, bin)) = static_world(&["tenancy-epilog"], "tenancy-epilog") else {
        return;
    };
    let job = 4104;
    let out = w.run(&["prolog"], &w.job_env(job, 0, Some("1g.18gb")));
    assert!(out.status.success(), "{}", text(&out));
    // A stand-in for the program: it says what it got, and fails.
    let seen = w.root.join("seen");
    let fake = fake_dynamic_build(&bin, &seen, 3);
    let out = epilog(&w, &bin, job, 0, Some("1g.18gb"));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let got = std::fs::read_to_string(&seen).unwrap();
    let lines: Vec<&str> = got.lines().collect();
    assert!(lines.contains(&"args=--epilog"), "{got}");
    assert!(
        lines.contains(&format!("TENANCY_HANDOFF_JOB_ID={job}").as_str()),
        "{got}"
    );
    assert!(
        !lines.iter().any(|l| l.starts_with("SLURM_JOB_ID=")),
        "{got}"
    );
    assert!(
        lines.contains(&format!("SLURM_JOB_UID={}", w.users[0].uid).as_str()),
        "{got}"
    );
    // The job is still the node's: the real binary finishes it.
    std::fs::remove_file(&fake).unwrap();
    install(&w, "bin", &["tenancy-prolog-dynamic"]).unwrap();
    let out = epilog(&w, &bin, job, 0, Some("1g.18gb"));
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after the real hand-off");
}

#[test]
fn a_job_without_mig_is_torn_down_by_the_static_epilog_alone() {
    let Some((w, bin)) = static_world(&["tenancy-epilog"], "tenancy-epilog") else {
        return;
    };
    let job = 4102;
    let out = w.run(&["prolog"], &w.job_env(job, 1, None));
    assert!(out.status.success(), "{}", text(&out));
    assert!(w.cgroup(1, job).is_dir() && w.scratch_dir(1, job).is_dir());
    // No tenancy-prolog-dynamic in `bin`: this works only if nothing is handed off.
    let out = epilog(&w, &bin, job, 1, None);
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after the static epilog");
    assert!(w.chain_is_valid());
}
