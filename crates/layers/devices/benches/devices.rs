//! Per-job cost of the devices layer, each next to its baseline in the same run:
//! - driver files: full parse vs the hot-path `load_for` (a realistic 4,322-line mig-minors);
//! - policy + BPF program generation;
//! - v2 setup+teardown (mkdir, BPF load, attach, detach, rmdir) vs bare mkdir+rmdir;
//! - v1 setup+teardown (mkdir, ~510 rule writes, rmdir) vs bare mkdir+rmdir.
//!
//! The cgroup benches need root and are skipped otherwise. Run:
//! `cargo bench -p tenancy-devices --bench devices -- --warm-up-time 1 --measurement-time 3`

use criterion::{criterion_group, criterion_main, Criterion};
use std::path::{Path, PathBuf};
use tenancy_devices::job::{self, Backend, Target};
use tenancy_devices::{bpf, CgroupLayout, DevicePolicy, DriverInfo, DriverPaths, SliceRef};

fn fixture() -> (tempfile::TempDir, DriverPaths) {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("devices"),
        "Character devices:\n  1 mem\n136 pts\n195 nvidia-frontend\n508 nvidia-caps\n509 nvidia-uvm\n",
    )
    .unwrap();
    let mut m = String::from("config 1\nmonitor 2\n");
    let mut minor = 3;
    for g in 0..32 {
        for gi in 0..15 {
            m += &format!("gpu{g}/gi{gi}/access {minor}\n");
            minor += 1;
            for ci in 0..8 {
                m += &format!("gpu{g}/gi{gi}/ci{ci}/access {minor}\n");
                minor += 1;
            }
        }
    }
    std::fs::write(d.path().join("mig-minors"), m).unwrap();
    let p = DriverPaths {
        proc_devices: d.path().join("devices"),
        mig_minors: d.path().join("mig-minors"),
        rdma_devices: d.path().join("infiniband"),
        nvidia_caps: d.path().join("nvidia-caps"),
    };
    (d, p)
}

const SLICE: SliceRef = SliceRef {
    gpu_minor: 3,
    gi_id: 5,
    ci_id: 0,
};

fn driver(c: &mut Criterion) {
    let (_d, p) = fixture();
    let mut g = c.benchmark_group("driver_info");
    g.bench_function("baseline_load_full", |b| {
        b.iter(|| DriverInfo::load(&p).unwrap())
    });
    g.bench_function("load_for_job", |b| {
        b.iter(|| DriverInfo::load_for(&p, &[SLICE]).unwrap())
    });
    g.finish();
    let drv = DriverInfo::load_for(&p, &[SLICE]).unwrap();
    let mut g = c.benchmark_group("policy");
    g.bench_function("for_job", |b| {
        b.iter(|| DevicePolicy::for_job(&drv, &[SLICE], &[]).unwrap())
    });
    let pol = DevicePolicy::for_job(&drv, &[SLICE], &[]).unwrap();
    g.bench_function("generate_bpf", |b| b.iter(|| bpf::generate(&pol)));
    g.finish();
}

fn cg_bench(c: &mut Criterion, name: &str, mount: Option<PathBuf>, backend: Backend) {
    let Some(mount) = mount else {
        eprintln!("SKIP {name}: controller not mounted");
        return;
    };
    let (_d, p) = fixture();
    let drv = DriverInfo::load_for(&p, &[SLICE]).unwrap();
    let pol = DevicePolicy::for_job(&drv, &[SLICE], &[]).unwrap();
    let top = mount.join(format!("tdev_bench_{}_{name}", std::process::id()));
    std::fs::create_dir(&top).unwrap();
    let target = Target::Owned {
        root: top.clone(),
        backend,
    };
    let mut g = c.benchmark_group(name);
    g.sample_size(30);
    let mut n = 0u64;
    g.bench_function("baseline_mkdir_rmdir", |b| {
        b.iter(|| {
            n += 1;
            let d = top.join(format!("j{n}"));
            std::fs::create_dir(&d).unwrap();
            std::fs::remove_dir(&d).unwrap();
        })
    });
    g.bench_function("setup_teardown", |b| {
        b.iter(|| {
            n += 1;
            let r = job::setup_with_policy(n, "bench", &target, pol.clone()).unwrap();
            job::teardown(&r).unwrap();
        })
    });
    g.finish();
    for sub in ["tenancy/bench", "tenancy", ""] {
        let _ = std::fs::remove_dir(if sub.is_empty() {
            top.clone()
        } else {
            top.join(sub)
        });
    }
    let _ = Path::new(&top);
}

fn cgroups(c: &mut Criterion) {
    if !tenancy_test_support::requires_root("cgroup benches") {
        return;
    }
    let l = CgroupLayout::detect().unwrap();
    cg_bench(c, "v2_job", l.v2_root.clone(), Backend::V2);
    cg_bench(c, "v1_job", l.v1_devices.clone(), Backend::V1);
}

criterion_group!(benches, driver, cgroups);
criterion_main!(benches);
