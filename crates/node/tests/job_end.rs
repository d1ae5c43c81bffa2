//! What the epilog does about processes that outlive their job. On cgroup v2 the job's tasks
//! live in the product's job cgroup, out of Slurm's step cgroups, so Slurm does not end them:
//! the epilog does, before it undoes any layer.

mod common;

use common::{requires_root, text, World};
use std::os::unix::process::ExitStatusExt;
use std::process::Command;

/// A process left in the job's cgroup that watches its scratch folder (shell builtins only, so
/// it checks without pause): it is killed before the folder goes, so it never sees it go, and
/// the job's end leaves nothing behind.
#[test]
fn a_process_that_outlives_its_job_is_ended_before_any_layer_comes_down() {
    if !requires_root("moves a process into a job's cgroup") {
        return;
    }
    let Some(w) = World::new(1, None) else {
        eprintln!("SKIP: nvml-shim not built");
        return;
    };
    let job = 7_300_000 + u64::from(std::process::id() % 100_000);
    let env = w.job_env(job, 0, None);
    let out = w.run(&["prolog"], &env);
    assert!(out.status.success(), "prolog: {}", text(&out));
    let scratch = w.scratch_dir(0, job);
    assert!(scratch.is_dir());
    let marker = w.root.join("saw-its-scratch-go");
    let mut leftover = Command::new("/bin/sh")
        .args([
            "-c",
            r#"while :; do [ -d "$1" ] || { echo alive > "$2"; exit 0; }; done"#,
            "sh",
        ])
        .arg(&scratch)
        .arg(&marker)
        .spawn()
        .unwrap();
    std::fs::write(
        w.cgroup(0, job).join("cgroup.procs"),
        leftover.id().to_string(),
    )
    .unwrap();

    let out = w.run(&["epilog"], &env);
    assert!(out.status.success(), "epilog: {}", text(&out));
    let status = leftover.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "the leftover process: {status:?}");
    assert!(
        !marker.exists(),
        "a process of job {job} was still running when its scratch folder was removed"
    );
    w.assert_nothing_left("after the epilog");
}
