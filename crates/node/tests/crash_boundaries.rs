//! The prolog is killed (SIGKILL) at every durable boundary, with the real layers: MIG slice in
//! the NVML shim, v2 BPF device program on a product cgroup, the job's cgroup under the tenant's
//! nftables rules (in a network namespace of the test), scratch folder. The epilog (the
//! code `tenancy-epilog` runs) must then leave nothing: no GPU instance, no cgroup, no scratch
//! folder, no journal, and the audit log must say the job ended, in a valid chain. A requeued
//! prolog of the same job must clean the dead attempt up before it builds anew.

mod common;

use common::{requires_root, text, World};
use std::os::unix::process::ExitStatusExt;
use tenancy_audit_log::Event;

/// Boundaries a full prolog reports, in order (from a run without a crash).
fn boundaries(w: &World, job: u64) -> Vec<String> {
    let seen = w.prolog_boundaries(job);
    // Every layer is intended (journaled) before it is made; the last boundary is all-made.
    assert_eq!(
        seen.last().map(String::as_str),
        Some("all-made"),
        "{seen:?}"
    );
    for layer in ["mig", "devices", "network", "scratch"] {
        let i = seen.iter().position(|s| *s == format!("intended {layer}"));
        let m = seen.iter().position(|s| *s == format!("made {layer}"));
        assert!(
            matches!((i, m), (Some(i), Some(m)) if i + 1 == m),
            "{layer}: {seen:?}"
        );
    }
    // The layers a restart removes act while the intents go to the disk; they are there
    // before the first layer that outlives one (scratch).
    let on_disk = seen.iter().position(|s| s == "intents-on-disk");
    let scratch = seen.iter().position(|s| s == "intended scratch");
    let network = seen.iter().position(|s| s == "made network");
    let in_order = matches!(
        (network, on_disk, scratch),
        (Some(n), Some(d), Some(s)) if n + 1 == d && d + 1 == s
    );
    assert!(in_order, "{seen:?}");
    // The job really holds its resources.
    assert_eq!(w.gis().len(), 1);
    assert!(w.cgroup(0, job).is_dir());
    assert!(w.scratch_dir(0, job).is_dir());
    assert!(w.journal_path(job).exists());
    seen
}

fn crash_at(w: &World, job: u64, n: usize, want: &str) {
    let out = w.run(
        &["prolog", "--crash-at", &n.to_string()],
        &w.job_env(job, 0, Some("1g.18gb")),
    );
    assert_eq!(out.status.signal(), Some(9), "not killed: {}", text(&out));
    let last = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert_eq!(last, format!("boundary {n} {want}"));
    // Every boundary comes after the first journal write: the epilog has something to undo.
    assert!(w.journal_path(job).exists(), "crash at {want}: no journal");
    // And the node's intent log holds them (read back as every process reads it; on disk from
    // the intents-on-disk boundary on): every layer, intended.
    let logged: Vec<_> = w
        .intent_records()
        .into_iter()
        .filter(|r| r.0 == job)
        .collect();
    assert_eq!(logged.len(), 1, "crash at {want}: intent log");
    let layers: Vec<(&str, tenancy_job::StepState)> = logged[0]
        .1
        .steps
        .iter()
        .map(|s| (s.layer.as_str(), s.state))
        .collect();
    assert_eq!(
        layers,
        ["mig", "devices", "network", "scratch"].map(|l| (l, tenancy_job::StepState::Intended)),
        "crash at {want}"
    );
    // After "made X", X really exists (so the epilog below really removes something).
    match want {
        "made mig" => assert_eq!(w.gis().len(), 1),
        "made devices" | "made network" => assert!(w.cgroup(0, job).is_dir()),
        "made scratch" | "all-made" => assert!(w.scratch_dir(0, job).is_dir()),
        _ => {}
    }
}

#[test]
fn a_prolog_killed_at_any_boundary_leaves_nothing_after_the_epilog() {
    if !requires_root("real users, product cgroups, BPF device programs") {
        return;
    }
    let Some(w) = World::new(2, None) else { return };
    let seen = boundaries(&w, 100);
    let out = w.run(&["epilog"], &w.job_env(100, 0, Some("1g.18gb")));
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after a normal job");

    for (i, want) in seen.iter().enumerate() {
        let n = i + 1;
        // Crash, then the epilog Slurm runs after a failed prolog.
        let job = 200 + n as u64;
        crash_at(&w, job, n, want);
        let out = w.run(&["epilog"], &w.job_env(job, 0, Some("1g.18gb")));
        assert!(
            out.status.success(),
            "epilog after crash at {want}: {}",
            text(&out)
        );
        w.assert_nothing_left(&format!("epilog after a crash at {want}"));

        // Crash, then the job is requeued on the same node: the new prolog removes the dead
        // attempt's resources before it builds, and the epilog leaves nothing.
        let job = 300 + n as u64;
        crash_at(&w, job, n, want);
        let out = w.run(&["prolog"], &w.job_env(job, 0, Some("1g.18gb")));
        assert!(
            out.status.success(),
            "requeue after crash at {want}: {}",
            text(&out)
        );
        assert_eq!(w.gis().len(), 1, "requeue after crash at {want}: one slice");
        let out = w.run(&["epilog"], &w.job_env(job, 0, Some("1g.18gb")));
        assert!(out.status.success(), "{}", text(&out));
        w.assert_nothing_left(&format!("requeue after a crash at {want}"));
    }

    // The audit log tells each story: a crashed prolog wrote nothing, the epilog's job_end
    // names what it removed; a requeued job starts once and ends once.
    let recs = w.records();
    for (i, want) in seen.iter().enumerate() {
        let n = (i + 1) as u64;
        let of = |job: u64| -> Vec<&tenancy_audit_log::Record> {
            recs.iter().filter(|r| r.job_id == Some(job)).collect()
        };
        let crashed = of(200 + n);
        assert_eq!(crashed.len(), 1, "crash at {want}: {crashed:?}");
        assert_eq!(crashed[0].event, Event::JobEnd, "crash at {want}");
        assert!(
            !crashed[0].resources.is_empty(),
            "crash at {want}: job_end names nothing removed"
        );
        assert_eq!(crashed[0].origin, "tenancy-epilog");
        let requeued: Vec<Event> = of(300 + n).iter().map(|r| r.event.clone()).collect();
        assert_eq!(
            requeued,
            [Event::JobStart, Event::JobEnd],
            "crash at {want}"
        );
    }
    assert!(w.chain_is_valid(), "audit chain broken");
    eprintln!(
        "crash test: {} boundaries x 2 (epilog, requeue) = {} killed prologs",
        seen.len(),
        2 * seen.len()
    );
}

/// The epilog is killed at moments spread over its run (SIGKILL, no hook: anywhere in the
/// teardown); the next epilog finishes the job: teardown is idempotent from any point, and the
/// audit log stays whole.
#[test]
fn an_epilog_killed_at_any_moment_is_finished_by_the_next_one() {
    if !requires_root("real users, product cgroups, BPF device programs") {
        return;
    }
    let Some(w) = World::new(2, None) else { return };
    // How long a whole epilog takes here.
    let env = w.job_env(400, 1, Some("1g.18gb"));
    assert!(w.run(&["prolog"], &env).status.success());
    let t0 = std::time::Instant::now();
    assert!(w.run(&["epilog"], &env).status.success());
    let full = t0.elapsed();
    const TRIES: u32 = 12;
    let mut interrupted = 0;
    for k in 0..TRIES {
        let job = 401 + u64::from(k);
        let env = w.job_env(job, (k % 2) as usize, Some("1g.18gb"));
        let out = w.run(&["prolog"], &env);
        assert!(out.status.success(), "{}", text(&out));
        let mut child = w
            .command(&["epilog"], &env)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(full * k / TRIES);
        let _ = child.kill();
        let status = child.wait().unwrap();
        if status.signal() == Some(9) {
            interrupted += 1;
        }
        let out = w.run(&["epilog"], &env);
        assert!(
            out.status.success(),
            "epilog after a kill at {:?}: {}",
            full * k / TRIES,
            text(&out)
        );
        w.assert_nothing_left(&format!("epilog killed after {:?}", full * k / TRIES));
    }
    assert!(
        interrupted > 0,
        "no epilog was interrupted (full run {full:?})"
    );
    assert!(w.chain_is_valid(), "audit chain broken");
    eprintln!("epilog kills: {interrupted} of {TRIES} interrupted (full epilog {full:?})");
}

/// A prolog killed after its MIG intent, before its GPU instance existed, leaves that
/// placement free, and the next job's prolog may be given it. The first job's epilog has no
/// recorded slice and looks for one at its intended placement: it must leave the second job's
/// slice there alone.
#[test]
fn an_epilog_with_no_recorded_slice_leaves_another_jobs_slice_at_its_placement() {
    if !requires_root("real users, product cgroups, BPF device programs") {
        return;
    }
    let Some(w) = World::new(1, None) else { return };
    let seen = boundaries(&w, 400);
    let out = w.run(&["epilog"], &w.job_env(400, 0, Some("1g.18gb")));
    assert!(out.status.success(), "{}", text(&out));
    let n = 1 + seen.iter().position(|s| s == "intended mig").unwrap();
    crash_at(&w, 401, n, "intended mig");
    assert_eq!(w.gis(), vec![], "the killed prolog made no slice");
    let out = w.run(&["prolog"], &w.job_env(402, 0, Some("1g.18gb")));
    assert!(out.status.success(), "{}", text(&out));
    let placement = |job: u64, field: &str| {
        let mig = w.journal_step(job, "mig").unwrap();
        mig["intent"][field].clone()
    };
    assert_eq!(
        placement(401, "placement_start"),
        placement(402, "placement_start"),
        "the second job was given the placement the first one intended"
    );
    let slices = w.gis();
    assert_eq!(slices.len(), 1);

    let out = w.run(&["epilog"], &w.job_env(401, 0, Some("1g.18gb")));
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        w.gis(),
        slices,
        "job 401's epilog destroyed job 402's slice"
    );
    let out = w.run(&["epilog"], &w.job_env(402, 0, Some("1g.18gb")));
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after both epilogs");
}
