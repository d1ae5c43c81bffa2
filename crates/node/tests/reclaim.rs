//! What a lost epilog leaves must not refuse the next job (and so drain the node): the
//! prolog asks Slurm (`node.squeue`) about the journals in a job's way, tears down those of
//! jobs Slurm no longer runs on the node with a `reconcile` record, and decides again; live
//! jobs, an answer it cannot get and an answer that does not know the job itself leave every
//! journal alone and the refusal as it was. Found by the soak at size (a MIG job refused
//! "GPU 1 is held by tenant globex whose tier forbids sharing a GPU" after slurmd lost the
//! epilog of globex's job, and the node drained). Real layers, users and NVML stand-in; the
//! question to Slurm is a script in squeue's place. Needs root.

mod common;

use common::{requires_root, text, World};
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tenancy_audit_log::{Event, Outcome};

fn jobs(n: u64) -> u64 {
    7_900_000 + u64::from(std::process::id() % 10_000) * 100 + n * 10
}

/// A world of one H200 whose tenant 1 is on a tier that shares no GPU, and whose squeue is
/// a script answering with the job ids in `<root>/running` (and checking how it was asked).
fn world() -> Option<(World, PathBuf)> {
    if !requires_root("real cgroups, nftables and users under the prolog") {
        return None;
    }
    let w = World::new(1, None)?;
    let running = w.root.join("running");
    let squeue = w.root.join("squeue");
    std::fs::write(
        &squeue,
        format!(
            "#!/bin/sh\n\
             [ \"$*\" = \"-h -o %A -w {node}\" ] || {{ echo \"asked: $*\" >&2; exit 2; }}\n\
             [ -f {r} ] || {{ echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1; }}\n\
             exec /bin/cat {r}\n",
            node = w.node,
            r = running.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&squeue, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tenant1 = w.tenants[1].clone();
    w.rewrite_config(|t| {
        t.node().squeue(&squeue);
        t.tier("alone").mig_profiles(["1g.18gb"]).share_gpu(false);
        t.tenant(&tenant1).tier("alone");
    });
    Some((w, running))
}

fn answer(running: &Path, jobs: &[u64]) {
    let text: String = jobs.iter().map(|j| format!("{j}\n")).collect();
    std::fs::write(running, text).unwrap();
}

fn env(w: &World, job: u64, t: usize) -> Vec<(OsString, OsString)> {
    w.job_env(job, t, Some("1g.18gb"))
}

/// Job 1 of tenant 1 (no GPU sharing) started on the GPU; its epilog never runs.
fn lost_epilog(w: &World, running: &Path) -> u64 {
    let j1 = jobs(1);
    answer(running, &[j1]);
    let out = w.run(&["prolog"], &env(w, j1, 1));
    assert!(out.status.success(), "job {j1}'s prolog: {}", text(&out));
    assert_eq!(w.gis().len(), 1);
    j1
}

#[test]
fn prolog_tears_down_a_job_slurm_no_longer_runs_instead_of_refusing() {
    let Some((w, running)) = world() else { return };
    let j1 = lost_epilog(&w, &running);
    let (j2, j3) = (jobs(2), jobs(3));
    // Slurm ended job 1 on this node without its epilog and starts job 2 (tenant 0) here.
    answer(&running, &[j2]);
    let out = w.run(&["prolog"], &env(&w, j2, 0));
    assert!(out.status.success(), "job {j2}: {}", text(&out));
    assert!(!w.journal_path(j1).exists(), "job {j1}'s journal is left");
    assert!(!w.cgroup(1, j1).exists(), "job {j1}'s cgroup is left");
    assert!(!w.scratch_dir(1, j1).exists(), "job {j1}'s scratch is left");
    assert_eq!(w.gis().len(), 1, "job {j2}'s slice alone: {:?}", w.gis());
    let recs = w.records();
    let reconciled: Vec<_> = recs
        .iter()
        .filter(|r| r.event == Event::Reconcile && r.job_id == Some(j1))
        .collect();
    assert_eq!(reconciled.len(), 1, "{recs:#?}");
    let r = reconciled[0];
    assert_eq!(r.outcome, Outcome::Success);
    assert_eq!(r.tenant.as_deref(), Some(w.tenants[1].as_str()));
    assert_eq!(r.profile.as_deref(), Some("1g.18gb"));
    assert!(
        r.reason
            .as_deref()
            .is_some_and(|s| s.contains(&format!("prolog of job {j2}"))),
        "{r:?}"
    );
    assert!(
        r.resources.iter().any(|x| x.layer == "mig"),
        "the record names the slice: {r:?}"
    );
    assert!(
        recs.iter()
            .any(|r| r.event == Event::JobStart && r.job_id == Some(j2)),
        "{recs:#?}"
    );
    // A job with nothing in its way does not ask Slurm at all: no answer, and it runs.
    std::fs::remove_file(&running).unwrap();
    let out = w.run(&["prolog"], &env(&w, j3, 0));
    assert!(out.status.success(), "job {j3}: {}", text(&out));
    for j in [j2, j3] {
        let out = w.run(&["epilog"], &env(&w, j, 0));
        assert!(out.status.success(), "job {j}'s epilog: {}", text(&out));
    }
    assert!(w.chain_is_valid());
    w.assert_nothing_left("after the epilogs");
}

#[test]
fn prolog_leaves_live_and_unknown_jobs_alone_and_refuses() {
    let Some((w, running)) = world() else { return };
    let j1 = lost_epilog(&w, &running);
    let j2 = jobs(2);
    let refused = |what: &str, note: &str| {
        let out = w.run(&["prolog"], &env(&w, j2, 0));
        assert!(!out.status.success(), "{what}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(err.contains("forbids sharing a GPU"), "{what}: {err}");
        assert!(err.contains(note), "{what}: {err}");
        assert!(w.journal_path(j1).exists(), "{what}: job {j1}'s journal");
        assert_eq!(w.gis().len(), 1, "{what}: {:?}", w.gis());
    };
    // Slurm still runs job 1 here: a true refusal.
    answer(&running, &[j1, j2]);
    refused("job 1 live", "the job does not run");
    // slurmctld does not answer.
    std::fs::remove_file(&running).unwrap();
    refused("no answer", "Slurm could not be asked");
    // An answer that does not list job 2 itself is another node's, or stale.
    answer(&running, &[]);
    refused("job 2 not listed", "is not trusted");
    assert!(
        !w.records()
            .iter()
            .any(|r| r.event == Event::Reconcile && r.job_id == Some(j1)),
        "job {j1} was reconciled"
    );
    // What the lost epilog left, the epilog (or reconcile) still tears down.
    let out = w.run(&["epilog"], &env(&w, j1, 1));
    assert!(out.status.success(), "job {j1}'s epilog: {}", text(&out));
    w.assert_nothing_left("after job 1's epilog");
}
