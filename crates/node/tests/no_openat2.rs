//! A node whose kernel has no `openat2` (Linux before 5.6, or a container runtime's seccomp
//! profile that answers ENOSYS for system calls newer than itself, or EPERM as older profiles
//! do): the scratch layer opens each path component with `openat(O_NOFOLLOW)` instead. Jobs
//! still get their folder, and a symlink planted in place of the tenant's folder is still
//! refused. The prolog and epilog run under a real seccomp filter that makes `openat2` fail,
//! with the real layers.

mod common;

use common::{requires_root, text, World};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::process::Output;
use tenancy_test_support::seccomp::{install, openat2_failing_with, with_openat2_failing};

/// The driver (`prolog` or `epilog`) as the world runs it, under a filter that makes `openat2`
/// fail with `errno`.
fn run_without_openat2(
    w: &World,
    errno: i32,
    args: &[&str],
    env: &[(OsString, OsString)],
) -> Output {
    let filter = openat2_failing_with(errno);
    let mut c = w.command(args, env);
    // SAFETY: the closure only makes system calls on memory allocated before the fork.
    unsafe {
        c.pre_exec(move || install(&filter));
    }
    c.output().unwrap()
}

#[test]
fn without_openat2_a_job_gets_its_scratch_folder_and_a_planted_symlink_is_still_refused() {
    a_job_gets_its_folder_and_a_planted_symlink_is_refused(libc::ENOSYS, 801);
}

/// A profile that answers EPERM: the prolog tells it from a path refused (`/` refused too) and
/// does the same without `openat2`, instead of failing every job.
#[test]
fn with_openat2_refused_eperm_a_job_gets_its_scratch_folder_and_a_planted_symlink_is_still_refused()
{
    a_job_gets_its_folder_and_a_planted_symlink_is_refused(libc::EPERM, 811);
}

fn a_job_gets_its_folder_and_a_planted_symlink_is_refused(errno: i32, job: u64) {
    if !requires_root("real users, product cgroups, BPF device programs, seccomp") {
        return;
    }
    // The filter does what the test relies on: in a thread of its own, openat2 fails.
    with_openat2_failing(errno, || ());
    let Some(w) = World::new(1, None) else { return };

    // A job: its folder is made, the user's and private, and removed by the epilog.
    let env = w.job_env(job, 0, None);
    let out = run_without_openat2(&w, errno, &["prolog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    let dir = w.scratch_dir(0, job);
    let st = std::fs::symlink_metadata(&dir).unwrap();
    assert!(st.is_dir(), "{}", dir.display());
    assert_eq!(
        (st.uid(), st.gid(), st.mode() & 0o7777),
        (w.users[0].uid, w.users[0].gid, 0o700)
    );
    let out = run_without_openat2(&w, errno, &["epilog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after a job without openat2");

    // The other tenant's folder replaced by a symlink to a place the tenant must not reach:
    // the prolog refuses, writes nothing there, and the job does not run.
    let outside = w.root.join("outside");
    std::fs::create_dir(&outside).unwrap();
    let tenant_dir = w.root.join("scratch").join(&w.tenants[1]);
    let _ = std::fs::remove_dir(&tenant_dir);
    std::os::unix::fs::symlink(&outside, &tenant_dir).unwrap();
    let env = w.job_env(job + 1, 1, None);
    let out = run_without_openat2(&w, errno, &["prolog"], &env);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("job {}: layer scratch", job + 1))
            && err.contains("is not a plain directory"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "the prolog wrote through the planted symlink"
    );
    // With the symlink gone, the epilog finishes what the refused prolog left to it.
    std::fs::remove_file(&tenant_dir).unwrap();
    let out = run_without_openat2(&w, errno, &["epilog"], &env);
    assert!(out.status.success(), "{}", text(&out));
    w.assert_nothing_left("after the refused job");
    assert!(w.chain_is_valid());
}
