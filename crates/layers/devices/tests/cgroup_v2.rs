//! cgroup v2 (BPF device program) integration tests. Root only; they use the cgroup2 mount
//! (/sys/fs/cgroup/unified on the hybrid test machine, /sys/fs/cgroup on pure v2).

mod common;
use common::*;
use std::path::PathBuf;
use tenancy_devices::bpf::sys;
use tenancy_devices::job::{self, Backend, Target};
use tenancy_devices::v2::{self, Detached};
use tenancy_devices::{CgroupLayout, DevicePolicy, DriverInfo, JobDeviceParams, SliceRef};

fn v2_root() -> PathBuf {
    CgroupLayout::detect()
        .unwrap()
        .v2_root
        .expect("cgroup2 mounted")
}

fn params(
    fx: &Fixture,
    job: u64,
    tenant: &str,
    slices: &[SliceRef],
    target: Target,
) -> JobDeviceParams {
    JobDeviceParams {
        job_id: job,
        tenant: tenant.into(),
        slices: slices.to_vec(),
        extra: vec!["c 1:* rwm".parse().unwrap()],
        driver: fx.driver(),
        target,
    }
}

#[test]
fn v2_two_jobs_share_a_gpu_but_not_caps() {
    if !requires_root("v2_two_jobs_share_a_gpu_but_not_caps") {
        return;
    }
    let fx = Fixture::new();
    let tree = CgTree::new(v2_root().to_str().unwrap(), "v2jobs");
    let target = Target::Owned {
        root: tree.root.clone(),
        backend: Backend::V2,
    };
    // Baseline: without our program every fake node answers ENXIO (no driver).
    check(&fx, &tree.mkdir("baseline"), &unrestricted_cases());

    let a = job::setup(&params(&fx, 1001, "lab-a", &[SLICE_A], target.clone())).unwrap();
    let b = job::setup(&params(&fx, 1002, "lab-b", &[SLICE_B], target.clone())).unwrap();
    let c = job::setup(&params(&fx, 1003, "lab-a", &[], target.clone())).unwrap();
    assert_eq!(a.cgroup_dir, tree.root.join("tenancy/lab-a/job_1001"));
    assert!(a.owned);
    let (ids, flags) = v2::query(&a.cgroup_dir).unwrap();
    assert_eq!(ids, vec![a.v2.as_ref().unwrap().prog_id]);
    assert_eq!(flags, sys::F_ALLOW_MULTI);

    // The loader's fd is closed: only the attachment keeps the program.
    check(&fx, &a.cgroup_dir, &job_a_cases());
    check(&fx, &b.cgroup_dir, &job_b_cases());
    // A step cgroup created later under the job is bound too (effective programs inherit).
    let step = a.cgroup_dir.join("step_0");
    std::fs::create_dir(&step).unwrap();
    check(&fx, &step, &job_a_cases());
    std::fs::remove_dir(&step).unwrap();
    // A job without a MIG slice gets no NVIDIA device at all.
    check(
        &fx,
        &c.cgroup_dir,
        &[
            ("nvidiactl", Denied),
            ("nvidia0", Denied),
            ("nvidia-uvm", Denied),
            ("nvidia-caps/nvidia-cap12", Denied),
            ("/dev/null", Opens),
        ],
    );

    // Teardown: product cgroup removed, and with it its program, which the kernel then frees
    // (asynchronously: a moment after the rmdir); twice is fine.
    let id = a.v2.as_ref().unwrap().prog_id;
    let t = job::teardown(&a).unwrap();
    assert_eq!(t.detached, Some(Detached::Detached));
    assert!(t.removed_dir);
    assert!(!a.cgroup_dir.exists());
    let freed = (0..200).any(|_| {
        let gone = sys::prog_get_fd_by_id(id)
            .err()
            .is_some_and(|e| e.raw_os_error() == Some(libc::ENOENT));
        if !gone {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        gone
    });
    assert!(freed, "program {id} still loaded 2 s after its cgroup went");
    let t = job::teardown(&a).unwrap();
    assert_eq!(t.detached, Some(Detached::AlreadyGone));
    assert!(!t.removed_dir);
    // B is untouched by A's teardown.
    check(&fx, &b.cgroup_dir, &job_b_cases());
    job::teardown(&b).unwrap();
    job::teardown(&c).unwrap();
    assert!(
        tree.root.join("tenancy/lab-a").exists(),
        "tenant dirs are left for other jobs"
    );
}

#[test]
fn v2_existing_cgroup_teardown_leaves_no_program() {
    if !requires_root("v2_existing_cgroup_teardown_leaves_no_program") {
        return;
    }
    let fx = Fixture::new();
    let tree = CgTree::new(v2_root().to_str().unwrap(), "v2exist");
    let dir = tree.mkdir("job");
    let target = Target::Existing {
        dir: dir.clone(),
        backend: Backend::V2,
    };
    let rec = job::setup(&params(&fx, 2001, "lab", &[SLICE_A], target)).unwrap();
    assert!(!rec.owned);
    check(&fx, &dir, &job_a_cases());
    let t = job::teardown(&rec).unwrap();
    assert_eq!(t.detached, Some(Detached::Detached));
    assert!(!t.removed_dir);
    assert!(dir.exists(), "a cgroup we do not own stays");
    let (ids, _) = v2::query(&dir).unwrap();
    assert!(ids.is_empty(), "BPF_PROG_QUERY after teardown: {ids:?}");
    check(&fx, &dir, &unrestricted_cases());
    assert_eq!(
        job::teardown(&rec).unwrap().detached,
        Some(Detached::AlreadyGone)
    );
}

#[test]
fn v2_setup_rerun_replaces_program() {
    if !requires_root("v2_setup_rerun_replaces_program") {
        return;
    }
    let fx = Fixture::new();
    let tree = CgTree::new(v2_root().to_str().unwrap(), "v2rerun");
    let target = Target::Owned {
        root: tree.root.clone(),
        backend: Backend::V2,
    };
    let p = params(&fx, 3001, "lab", &[SLICE_A], target);
    let first = job::setup(&p).unwrap();
    let second = job::setup(&p).unwrap();
    let (ids, _) = v2::query(&second.cgroup_dir).unwrap();
    assert_eq!(ids, vec![second.v2.as_ref().unwrap().prog_id]);
    assert_ne!(
        first.v2.as_ref().unwrap().prog_id,
        second.v2.as_ref().unwrap().prog_id
    );
    check(&fx, &second.cgroup_dir, &job_a_cases());
    // Teardown with either record removes the job's cgroup, and with it the current
    // program; the other is then harmless.
    assert!(job::teardown(&first).unwrap().removed_dir);
    assert!(!first.cgroup_dir.exists());
    assert_eq!(
        job::teardown(&second).unwrap().detached,
        Some(Detached::AlreadyGone)
    );
}

/// Why BPF_F_ALLOW_MULTI: a program attached below ours (a container runtime in the job, or
/// an attacker with CAP_BPF in a child cgroup) cannot switch ours off. With
/// BPF_F_ALLOW_OVERRIDE it could.
#[test]
fn v2_multi_cannot_be_overridden_from_below() {
    if !requires_root("v2_multi_cannot_be_overridden_from_below") {
        return;
    }
    let fx = Fixture::new();
    let tree = CgTree::new(v2_root().to_str().unwrap(), "v2flags");
    let drv = DriverInfo::load(&fx.driver()).unwrap();
    let policy = DevicePolicy::for_job(&drv, &[SLICE_A], &[]).unwrap();
    let allow_all = DevicePolicy {
        allow: vec![],
        deny_majors: vec![],
        deny_devices: vec![],
    };

    // Ours with MULTI (the layer's choice), an allow-all program in a child cgroup.
    let job = tree.mkdir("multi");
    v2::apply(&job, &policy).unwrap();
    let child = tree.mkdir("multi/inner");
    v2::apply_with_flags(&child, &allow_all, sys::F_ALLOW_MULTI).unwrap();
    check(
        &fx,
        &child,
        &[
            ("nvidia-caps/nvidia-cap21", Denied),
            ("nvidia-caps/nvidia-cap12", Allowed),
        ],
    );

    // Contrast: had we attached with ALLOW_OVERRIDE, the child's program replaces ours.
    let job = tree.mkdir("override");
    v2::apply_with_flags(&job, &policy, sys::F_ALLOW_OVERRIDE).unwrap();
    let child = tree.mkdir("override/inner");
    v2::apply_with_flags(&child, &allow_all, sys::F_ALLOW_OVERRIDE).unwrap();
    check(&fx, &child, &[("nvidia-caps/nvidia-cap21", Allowed)]);

    // Slurm's task level attaches with flags 0: nothing can be attached below it (EPERM),
    // which is why tenancy cannot live inside Slurm's tree with ConstrainDevices on pure v2.
    let slurm_task = tree.mkdir("slurmlike");
    v2::apply_with_flags(&slurm_task, &allow_all, 0).unwrap();
    let below = tree.mkdir("slurmlike/below");
    let e = v2::apply(&below, &policy).unwrap_err();
    assert!(e.to_string().contains("Operation not permitted"), "{e}");
    // And mixing flags on one cgroup is refused too.
    let e = v2::apply(&slurm_task, &policy).unwrap_err();
    assert!(e.to_string().contains("PROG_ATTACH"), "{e}");
    // Failed attaches left nothing behind.
    assert!(v2::query(&below).unwrap().0.is_empty());
    assert_eq!(v2::query(&slurm_task).unwrap().0.len(), 1);
}

#[test]
fn v2_setup_fails_closed_and_cleans_up() {
    if !requires_root("v2_setup_fails_closed_and_cleans_up") {
        return;
    }
    let fx = Fixture::new();
    let tree = CgTree::new(v2_root().to_str().unwrap(), "v2fail");
    let target = Target::Owned {
        root: tree.root.clone(),
        backend: Backend::V2,
    };
    let bad = SliceRef {
        gpu_minor: 0,
        gi_id: 9,
        ci_id: 0,
    };
    let e = job::setup(&params(&fx, 4001, "lab", &[bad], target.clone())).unwrap_err();
    assert!(
        e.to_string().contains("job 4001") && e.to_string().contains("gi9"),
        "{e}"
    );
    assert!(!tree.root.join("tenancy/lab/job_4001").exists());
    // A tenant name that would escape the tree is refused before anything is made.
    let e = job::setup(&params(&fx, 4002, "../x", &[SLICE_A], target)).unwrap_err();
    assert!(e.to_string().contains("tenant"), "{e}");
}

/// Jobs with the same allowlist share one program (the verifier runs once), which the keeper
/// cgroup keeps loaded between jobs; each job's teardown detaches only its own attachment; a
/// remembered id that holds another program is never used.
#[test]
fn v2_jobs_with_one_allowlist_share_its_program() {
    if !requires_root("v2_jobs_with_one_allowlist_share_its_program") {
        return;
    }
    let fx = Fixture::new();
    let tree = CgTree::new(v2_root().to_str().unwrap(), "v2share");
    let target = Target::Owned {
        root: tree.root.clone(),
        backend: Backend::V2,
    };
    let programs = job::programs_for(&target, fx.path("device-programs")).unwrap();
    let keeper = tree.root.join("tenancy").join(job::PROGRAM_KEEPER);
    let setup = |job: u64, slices: &[SliceRef]| {
        job::setup_sharing(
            &params(&fx, job, "lab-a", slices, target.clone()),
            Some(&programs),
        )
        .unwrap()
    };
    let id = |r: &tenancy_devices::DevicesRecord| r.v2.as_ref().unwrap().prog_id;
    let a = setup(2001, &[SLICE_A]);
    let a2 = setup(2002, &[SLICE_A]);
    let b = setup(2003, &[SLICE_B]);
    assert_eq!(id(&a), id(&a2), "same allowlist, one program");
    assert_ne!(id(&a), id(&b), "another allowlist, another program");
    let mut kept = v2::query(&keeper).unwrap().0;
    kept.sort();
    assert_eq!(kept, vec![id(&a), id(&b)]);
    check(&fx, &a2.cgroup_dir, &job_a_cases());
    check(&fx, &b.cgroup_dir, &job_b_cases());
    // A's teardown leaves the program on A2, which stays bound by it.
    assert_eq!(
        job::teardown(&a).unwrap().detached,
        Some(Detached::Detached)
    );
    check(&fx, &a2.cgroup_dir, &job_a_cases());
    assert_eq!(v2::query(&a2.cgroup_dir).unwrap().0, vec![id(&a2)]);
    // With no job left that has it, the keeper still does: the next job reuses it.
    job::teardown(&a2).unwrap();
    let a3 = setup(2004, &[SLICE_A]);
    assert_eq!(id(&a3), id(&a));
    check(&fx, &a3.cgroup_dir, &job_a_cases());
    // A remembered id now holding another allowlist's program (B's) is not taken for A's:
    // A's line, with B's id.
    let text = std::fs::read_to_string(fx.path("device-programs")).unwrap();
    let line_a = text
        .lines()
        .find(|l| l.ends_with(&format!(" {}", id(&a3))))
        .unwrap();
    let (key_tag, _) = line_a.rsplit_once(' ').unwrap();
    std::fs::write(
        fx.path("device-programs"),
        format!("{key_tag} {}\n", id(&b)),
    )
    .unwrap();
    let a4 = setup(2005, &[SLICE_A]);
    assert_ne!(id(&a4), id(&b));
    check(&fx, &a4.cgroup_dir, &job_a_cases());
    // A damaged hint is ignored.
    std::fs::write(fx.path("device-programs"), "not a tag\n\0\n").unwrap();
    let a5 = setup(2006, &[SLICE_A]);
    check(&fx, &a5.cgroup_dir, &job_a_cases());
    for r in [&a3, &a4, &a5, &b] {
        job::teardown(r).unwrap();
    }
    // The keeper holds at most PROGRAMS_KEPT programs, those the file remembers: the oldest
    // are let go (and freed, as no job has them), and so are programs a lost file forgot.
    // Distinct allowlists: one more NVIDIA minor each.
    std::fs::remove_file(fx.path("device-programs")).unwrap();
    let mut first = None;
    // (Some minors share a program: more allowlists than the keeper holds.)
    for n in 0..v2::PROGRAMS_KEPT as u32 + 16 {
        let mut p = params(&fx, 3000 + u64::from(n), "lab-a", &[], target.clone());
        p.extra = vec![format!("c 195:{n} rw").parse().unwrap()];
        let r = job::setup_sharing(&p, Some(&programs)).unwrap();
        first.get_or_insert(id(&r));
        job::teardown(&r).unwrap();
    }
    let first = first.unwrap();
    let kept = v2::query(&keeper).unwrap().0;
    assert_eq!(kept.len(), v2::PROGRAMS_KEPT);
    for gone in [first, id(&b), id(&a)] {
        assert!(!kept.contains(&gone), "{gone} still kept");
    }
    // A removed cgroup's programs are released by a kernel worker after an RCU grace period,
    // not by the rmdir itself: wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let gone = loop {
        match sys::prog_get_fd_by_id(first) {
            Err(e) => break e.raw_os_error(),
            Ok(_) if std::time::Instant::now() > deadline => break None,
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    };
    assert_eq!(gone, Some(libc::ENOENT), "program {first} was never freed");
}

/// A process still in the job's cgroup at teardown (EBUSY) keeps its device program: the
/// teardown fails and nothing is detached, so the process never runs without its allowlist.
#[test]
fn v2_teardown_of_a_busy_cgroup_keeps_its_program() {
    if !requires_root("v2_teardown_of_a_busy_cgroup_keeps_its_program") {
        return;
    }
    let fx = Fixture::new();
    let tree = CgTree::new(v2_root().to_str().unwrap(), "v2busy");
    let target = Target::Owned {
        root: tree.root.clone(),
        backend: Backend::V2,
    };
    let a = job::setup(&params(&fx, 4001, "lab", &[SLICE_A], target)).unwrap();
    let mut sleeper = std::process::Command::new("/bin/sleep")
        .arg("60")
        .spawn()
        .unwrap();
    std::fs::write(a.cgroup_dir.join("cgroup.procs"), sleeper.id().to_string()).unwrap();
    let e = job::teardown(&a).unwrap_err();
    assert!(
        e.to_string().contains("processes are still in the cgroup"),
        "{e}"
    );
    let (ids, _) = v2::query(&a.cgroup_dir).unwrap();
    assert_eq!(
        ids,
        vec![a.v2.as_ref().unwrap().prog_id],
        "the program was detached"
    );
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    // (the killed process leaves the cgroup a moment after it is reaped)
    let removed = (0..200).any(|_| {
        let r = job::teardown(&a).is_ok();
        if !r {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        r
    });
    assert!(removed);
    assert!(!a.cgroup_dir.exists());
}
