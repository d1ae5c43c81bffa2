//! cgroup v1 devices controller integration tests. Root only; need the v1 devices controller
//! (the hybrid test machine has it at /sys/fs/cgroup/devices); skipped loudly without it.

mod common;
use common::*;
use std::path::PathBuf;
use tenancy_devices::job::{self, Backend, Target};
use tenancy_devices::{CgroupLayout, JobDeviceParams, SliceRef};

fn v1_root(test: &str) -> Option<PathBuf> {
    let r = CgroupLayout::detect().unwrap().v1_devices;
    if r.is_none() {
        eprintln!("SKIP (no v1 devices controller): {test}");
    }
    r
}

fn params(fx: &Fixture, job: u64, slices: &[SliceRef], target: Target) -> JobDeviceParams {
    JobDeviceParams {
        job_id: job,
        tenant: "lab".into(),
        slices: slices.to_vec(),
        extra: vec![],
        driver: fx.driver(),
        target,
    }
}

#[test]
fn v1_two_jobs_share_a_gpu_but_not_caps() {
    if !requires_root("v1_two_jobs_share_a_gpu_but_not_caps") {
        return;
    }
    let Some(root) = v1_root("v1_two_jobs_share_a_gpu_but_not_caps") else {
        return;
    };
    let fx = Fixture::new();
    let tree = CgTree::new(root.to_str().unwrap(), "v1jobs");
    check(&fx, &tree.mkdir("baseline"), &unrestricted_cases());
    let target = Target::Owned {
        root: tree.root.clone(),
        backend: Backend::V1,
    };
    let a = job::setup(&params(&fx, 1001, &[SLICE_A], target.clone())).unwrap();
    let b = job::setup(&params(&fx, 1002, &[SLICE_B], target.clone())).unwrap();
    let v1 = a.v1.as_ref().unwrap();
    assert!(v1.skipped.is_empty(), "{:?}", v1.skipped);
    check(&fx, &a.cgroup_dir, &job_a_cases());
    check(&fx, &b.cgroup_dir, &job_b_cases());
    // Hierarchical: a step cgroup created later under the job is bound by the job's rules.
    let step = a.cgroup_dir.join("step_0");
    std::fs::create_dir(&step).unwrap();
    check(&fx, &step, &job_a_cases());
    // ... and cannot widen them: allowing B's cap in the child is refused by the kernel.
    let e = std::fs::write(step.join("devices.allow"), format!("c {CAPS}:21 rw")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    std::fs::remove_dir(&step).unwrap();

    let t = job::teardown(&a).unwrap();
    assert!(t.removed_dir);
    assert!(!a.cgroup_dir.exists());
    assert!(!job::teardown(&a).unwrap().removed_dir);
    check(&fx, &b.cgroup_dir, &job_b_cases());
    job::teardown(&b).unwrap();
}

#[test]
fn v1_existing_cgroup_reset_on_teardown() {
    if !requires_root("v1_existing_cgroup_reset_on_teardown") {
        return;
    }
    let Some(root) = v1_root("v1_existing_cgroup_reset_on_teardown") else {
        return;
    };
    let fx = Fixture::new();
    let tree = CgTree::new(root.to_str().unwrap(), "v1exist");
    let dir = tree.mkdir("job");
    let rec = job::setup(&params(
        &fx,
        2001,
        &[SLICE_A],
        Target::Existing {
            dir: dir.clone(),
            backend: Backend::V1,
        },
    ))
    .unwrap();
    check(&fx, &dir, &job_a_cases());
    let t = job::teardown(&rec).unwrap();
    assert!(!t.removed_dir && dir.exists());
    // No rule of the product is left: everything opens as before.
    check(&fx, &dir, &unrestricted_cases());
    job::teardown(&rec).unwrap();
}

#[test]
fn v1_apply_to_cgroup_with_children_is_refused_clearly() {
    if !requires_root("v1_apply_to_cgroup_with_children_is_refused_clearly") {
        return;
    }
    let Some(root) = v1_root("v1_apply_to_cgroup_with_children_is_refused_clearly") else {
        return;
    };
    let fx = Fixture::new();
    let tree = CgTree::new(root.to_str().unwrap(), "v1kids");
    let dir = tree.mkdir("job");
    tree.mkdir("job/step_0");
    let e = job::setup(&params(
        &fx,
        3001,
        &[SLICE_A],
        Target::Existing {
            dir: dir.clone(),
            backend: Backend::V1,
        },
    ))
    .unwrap_err();
    assert!(e.to_string().contains("child cgroups"), "{e}");
}
