//! RDMA device nodes (verbs, management, rdma_cm) are denied to a job unless its tier lists
//! them in `device_classes`: the verbs data path bypasses nftables, so a tier that was not
//! given RDMA must not reach it. Real cgroups (v2 BPF program and v1 devices controller) and
//! fake device nodes (mknod, no driver: an allowed open answers ENXIO, a denied one EPERM).
//! Root only; skips loudly otherwise.

mod common;
use common::*;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use tenancy_devices::doctor::rdma_findings;
use tenancy_devices::job::{self, Backend, Target};
use tenancy_devices::{CgroupLayout, JobDeviceParams};

/// uverbs0 and umad0 on the RDMA major 231 (minors 192 and 0, as the kernel numbers them),
/// rdma_cm on the misc major 10 (its minor is dynamic: 61 here).
const RDMA: [(&str, u32, u32); 3] = [
    ("infiniband/uverbs0", 231, 192),
    ("infiniband/umad0", 231, 0),
    ("infiniband/rdma_cm", 10, 61),
];

fn with_rdma_nodes(fx: &Fixture) {
    std::fs::create_dir(fx.path("infiniband")).unwrap();
    for (name, ma, mi) in RDMA {
        let p = CString::new(fx.path(name).as_os_str().as_bytes()).unwrap();
        // SAFETY: valid path; creates a character device node.
        let r = unsafe { libc::mknod(p.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(ma, mi)) };
        assert_eq!(r, 0, "mknod {name}: {}", std::io::Error::last_os_error());
    }
}

/// Opens each node from a task in `cgroup`: a denied one answers EPERM; an allowed one
/// reaches the kernel, which has no driver behind it (ENXIO; ENODEV for an unregistered misc
/// minor such as rdma_cm's here).
fn rdma_check(fx: &Fixture, cgroup: &std::path::Path, cases: &[(&str, Want)]) {
    let paths: Vec<std::path::PathBuf> = cases.iter().map(|(n, _)| fx.path(n)).collect();
    let got = open_as_task(cgroup, &paths);
    let bad: Vec<String> = cases
        .iter()
        .zip(&got)
        .filter(|((_, want), g)| match want {
            Allowed => **g != libc::ENXIO && **g != libc::ENODEV,
            Denied => **g != libc::EPERM,
            Opens => **g != 0,
        })
        .map(|((name, want), g)| format!("{name}: want {want:?}, got {} ({g})", errname(*g)))
        .collect();
    assert!(
        bad.is_empty(),
        "in {}:\n{}",
        cgroup.display(),
        bad.join("\n")
    );
}

fn params(fx: &Fixture, job: u64, extra: &[&str], target: Target) -> JobDeviceParams {
    JobDeviceParams {
        job_id: job,
        tenant: "lab".into(),
        slices: vec![],
        extra: extra.iter().map(|c| c.parse().unwrap()).collect(),
        driver: fx.driver(),
        target,
    }
}

/// The tier that lists verbs and rdma_cm (not umad).
const RDMA_TIER: [&str; 2] = ["c 231:192 rw", "c 10:61 rw"];

fn backends() -> Vec<(Backend, std::path::PathBuf)> {
    let layout = CgroupLayout::detect().unwrap();
    let mut out = Vec::new();
    if let Some(v2) = layout.v2_root {
        out.push((Backend::V2, v2));
    }
    if let Some(v1) = layout.v1_devices {
        out.push((Backend::V1, v1));
    }
    out
}

#[test]
fn rdma_devices_denied_unless_tier_allows() {
    if !requires_root("rdma_devices_denied_unless_tier_allows") {
        return;
    }
    let fx = Fixture::new();
    with_rdma_nodes(&fx);
    let backends = backends();
    assert!(
        !backends.is_empty(),
        "no cgroup device control on this machine"
    );
    for (backend, root) in backends {
        let tree = CgTree::new(root.to_str().unwrap(), "rdma");
        // Baseline: without a program every fake node answers ENXIO (no driver).
        rdma_check(
            &fx,
            &tree.mkdir("baseline"),
            &[
                ("infiniband/uverbs0", Allowed),
                ("infiniband/umad0", Allowed),
                ("infiniband/rdma_cm", Allowed),
            ],
        );
        let target = Target::Owned {
            root: tree.root.clone(),
            backend,
        };
        let plain = job::setup(&params(&fx, 2001, &[], target.clone())).unwrap();
        let rdma = job::setup(&params(&fx, 2002, &RDMA_TIER, target.clone())).unwrap();
        rdma_check(
            &fx,
            &plain.cgroup_dir,
            &[
                ("infiniband/uverbs0", Denied),
                ("infiniband/umad0", Denied),
                ("infiniband/rdma_cm", Denied),
                // The rest of the misc major still works (what /dev/null stands for here).
                ("/dev/null", Opens),
            ],
        );
        rdma_check(
            &fx,
            &rdma.cgroup_dir,
            &[
                ("infiniband/uverbs0", Allowed),
                ("infiniband/umad0", Denied),
                ("infiniband/rdma_cm", Allowed),
                ("/dev/null", Opens),
            ],
        );
        job::teardown(&plain).unwrap();
        job::teardown(&rdma).unwrap();
    }

    // The doctor names the devices and, per tier, which it may open.
    let tiers = vec![
        ("internal".to_string(), vec![]),
        (
            "hpc".to_string(),
            RDMA_TIER.iter().map(|c| c.to_string()).collect(),
        ),
    ];
    let findings = rdma_findings(&fx.path("infiniband"), &tiers);
    let text: Vec<String> = findings.iter().map(|f| f.message.clone()).collect();
    assert!(
        text[0].contains("uverbs0 (231:192)")
            && text[0].contains("umad0 (231:0)")
            && text[0].contains("rdma_cm (10:61)"),
        "{text:?}"
    );
    assert!(
        text.contains(&"tier internal may open no RDMA device".to_string()),
        "{text:?}"
    );
    let hpc = text.iter().find(|t| t.starts_with("tier hpc")).unwrap();
    assert!(
        hpc.contains("uverbs0") && hpc.contains("rdma_cm") && !hpc.contains("umad0"),
        "{hpc}"
    );
    let none = rdma_findings(&fx.path("no-such-dir"), &tiers);
    assert!(
        none[0].message.starts_with("no RDMA device nodes"),
        "{none:?}"
    );
}
