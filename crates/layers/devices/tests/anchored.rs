//! The device allowlist anchored in a Slurm-like cgroup/v2 tree (`Target::Anchored`): Slurm's
//! own programs at job and step level (`BPF_F_ALLOW_OVERRIDE`) and task level (flags 0) stay
//! in force, and the node program on slurmstepd's scope (MULTI) adds each job's allowlist on
//! top, found by the job's ancestor cgroup. Root only; on the cgroup2 mount of the machine.

mod common;
use common::*;
use std::path::PathBuf;
use tenancy_devices::bpf::sys;
use tenancy_devices::job::{self, SlurmScope, Target};
use tenancy_devices::v2;
use tenancy_devices::{anchored, CgroupLayout, DevicePolicy, JobDeviceParams, SliceRef};

fn v2_root() -> PathBuf {
    CgroupLayout::detect()
        .unwrap()
        .v2_root
        .expect("cgroup2 mounted")
}

/// Slurm's own program, like its cgroup/v2 plugin's with ConstrainDevices: here it denies
/// /dev/zero (an unallocated GRES file stands for it) and accepts everything else.
fn slurms_program() -> DevicePolicy {
    DevicePolicy {
        allow: vec![],
        deny_majors: vec![],
        deny_devices: vec!["c 1:5 rwm".parse().unwrap()],
    }
}

/// Slurm's tree of one job: `job_<id>` (OVERRIDE), `step_0` (OVERRIDE), `step_0/user/task_0`
/// (flags 0), as its cgroup/v2 plugin makes it; returns the task folder.
fn slurm_job(scope: &SlurmScope, job: u64) -> PathBuf {
    let j = scope.job_dir(job);
    std::fs::create_dir_all(&j).unwrap();
    v2::apply_with_flags(&j, &slurms_program(), sys::F_ALLOW_OVERRIDE).unwrap();
    let step = j.join("step_0");
    std::fs::create_dir_all(step.join("user/task_0")).unwrap();
    v2::apply_with_flags(&step, &slurms_program(), sys::F_ALLOW_OVERRIDE).unwrap();
    let task = step.join("user/task_0");
    v2::apply_with_flags(&task, &slurms_program(), 0).unwrap();
    task
}

fn params(fx: &Fixture, job: u64, slices: &[SliceRef], target: Target) -> JobDeviceParams {
    JobDeviceParams {
        job_id: job,
        tenant: "lab".into(),
        slices: slices.to_vec(),
        extra: vec!["c 1:* rwm".parse().unwrap()],
        driver: fx.driver(),
        target,
    }
}

#[test]
fn anchored_allowlist_holds_under_slurms_programs() {
    if !requires_root("anchored_allowlist_holds_under_slurms_programs") {
        return;
    }
    let fx = Fixture::new();
    let mount = v2_root();
    let tree = CgTree::new(mount.to_str().unwrap(), "anchored");
    let scope_dir = tree.mkdir("system.slice/t_slurmstepd.scope");
    let scope = SlurmScope {
        v2_mount: mount.clone(),
        rel: scope_dir
            .strip_prefix(&mount)
            .unwrap()
            .to_str()
            .unwrap()
            .to_string(),
    };
    let target = Target::Anchored {
        scope: scope.clone(),
    };
    // The prolog runs first and makes Slurm's job folder; Slurm attaches its programs later.
    let a = job::setup(&params(&fx, 5, &[SLICE_A], target.clone())).unwrap();
    let b = job::setup(&params(&fx, 6, &[SLICE_B], target.clone())).unwrap();
    assert_eq!(a.cgroup_dir, scope.job_dir(5));
    assert!(!a.owned);
    let a_task = slurm_job(&scope, 5);
    let b_task = slurm_job(&scope, 6);
    // One node program on the scope, MULTI; Slurm's stay where Slurm put them.
    let (ids, flags) = v2::query(&scope_dir).unwrap();
    assert_eq!((ids.len(), flags), (1, sys::F_ALLOW_MULTI));
    assert_eq!(v2::query(&a_task).unwrap().1, 0);

    let mut a_cases = job_a_cases();
    a_cases.retain(|(n, _)| *n != "/dev/zero");
    a_cases.push(("/dev/zero", Denied)); // Slurm's own program still applies
    check(&fx, &a_task, &a_cases);
    check(&fx, &b_task, &job_b_cases());
    // slurmstepd's own folder of the step (no task program): ours and Slurm's step program.
    let stepd = tree.mkdir("system.slice/t_slurmstepd.scope/job_5/step_0/slurm");
    check(&fx, &stepd, &job_a_cases()[..6]);
    check(&fx, &stepd, &[("nvidia-caps/nvidia-cap21", Denied)]);
    // A process under the scope but in no job of ours is not this layer's business.
    let other = tree.mkdir("system.slice/t_slurmstepd.scope/job_99/step_0");
    check(&fx, &other, &unrestricted_cases());

    // Teardown empties A's slot and entry; B keeps its allowlist; twice is fine.
    let held = anchored::jobs(&scope_dir).unwrap();
    assert_eq!(held.len(), 2);
    job::teardown(&a).unwrap();
    assert_eq!(
        anchored::jobs(&scope_dir).unwrap(),
        vec![b.anchored.as_ref().unwrap().cgroup_id]
    );
    job::teardown(&a).unwrap();
    check(&fx, &b_task, &job_b_cases());
    // A re-run of B's prolog keeps its slot.
    let b2 = job::setup(&params(&fx, 6, &[SLICE_B], target.clone())).unwrap();
    assert_eq!(
        b2.anchored.as_ref().unwrap().slot,
        b.anchored.as_ref().unwrap().slot
    );
    check(&fx, &b_task, &job_b_cases());
    job::teardown(&b2).unwrap();
    assert!(anchored::jobs(&scope_dir).unwrap().is_empty());
    // A job whose epilog never ran: once Slurm removed its folder, its entry is collected
    // (a prolog does so when every slot is held); a live job's entry is kept.
    let c = job::setup(&params(&fx, 7, &[SLICE_A], target.clone())).unwrap();
    let d = job::setup(&params(&fx, 8, &[SLICE_B], target.clone())).unwrap();
    std::fs::remove_dir(&c.cgroup_dir).unwrap();
    assert_eq!(
        anchored::collect_stale(&scope_dir).unwrap(),
        vec![c.anchored.as_ref().unwrap().cgroup_id]
    );
    assert_eq!(
        anchored::jobs(&scope_dir).unwrap(),
        vec![d.anchored.as_ref().unwrap().cgroup_id]
    );
    job::teardown(&d).unwrap();
    let pin = format!(
        "{}/tenancy_progs_{}",
        anchored::BPFFS,
        tenancy_cgroup_id(&scope_dir)
    );
    std::fs::remove_file(&pin).unwrap_or_else(|e| panic!("the program array's pin {pin}: {e}"));
}

fn tenancy_cgroup_id(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).unwrap().ino()
}
