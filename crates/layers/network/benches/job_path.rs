//! Cost of one job's add_job + remove_job with 1 and with 1,000 active jobs, side by side in
//! one run (needs root: a private network namespace holds the table, cgroups are real).
//! Run: `cargo bench -p tenancy-network --bench job_path`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::os::fd::AsRawFd;
use std::time::Duration;

use common::{requires_root, two_tenants, CgroupTree, Netns};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tenancy_network::{add_job, apply, remove_job, Dest, FirewallSpec};

fn bench(c: &mut Criterion) {
    if !requires_root("job_path benchmark") {
        return;
    }
    let ns = Netns::new("tnwb");
    let f = std::fs::File::open(ns.path()).unwrap();
    // SAFETY: valid fd; the bench's main thread (and the nft it spawns) move into the netns.
    assert_eq!(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
    let tree = CgroupTree::new("tnw-bench-");
    let a = vec![Dest::parse("10.77.1.0/24").unwrap()];
    let spec = FirewallSpec {
        infrastructure: vec![Dest::parse("10.77.3.0/24:53").unwrap()],
        ..two_tenants(&tree, a, vec![])
    };
    apply(&spec).unwrap();
    let mut g = c.benchmark_group("job_add_remove");
    g.sample_size(30).measurement_time(Duration::from_secs(6));
    let mut active: u64 = 0;
    for n in [1u64, 1000] {
        // Bring the number of other active jobs to n (alternating tenants).
        while active < n {
            let t = if active.is_multiple_of(2) { "a" } else { "b" };
            add_job(&spec, t, 100_000 + active).unwrap();
            active += 1;
        }
        g.bench_with_input(BenchmarkId::new("active_jobs", n), &n, |bch, _| {
            bch.iter(|| {
                let j = add_job(&spec, "a", 1).unwrap();
                std::hint::black_box(&j);
                remove_job(&spec, "a", 1).unwrap();
            })
        });
    }
    g.finish();
    for i in 0..active {
        let t = if i.is_multiple_of(2) { "a" } else { "b" };
        remove_job(&spec, t, 100_000 + i).unwrap();
    }
    drop(tree);
    drop(ns);
}

criterion_group!(benches, bench);
criterion_main!(benches);
