//! What the plugin adds to `sbatch`: loading the config, looking the submitter up in NSS and
//! resolving tenant and profile (`backend::decide`), next to reading the config file alone.
//! Goal: well under 2 ms.

use criterion::{criterion_group, criterion_main, Criterion};
use spank_tenancy::backend::decide;
use tenancy_test_support::TenancyToml;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenancy.toml");
    std::fs::write(&path, TenancyToml::submit_bench().to_string()).unwrap();
    let mut g = c.benchmark_group("submit_check");
    g.bench_function("read config file only (baseline)", |b| {
        b.iter(|| std::fs::read_to_string(&path).unwrap())
    });
    g.bench_function("decide: load + NSS + resolve", |b| {
        b.iter(|| decide(Some(&path), 0, None, Some("acme"), Some("1g.18gb")).unwrap())
    });
    g.bench_function("decide: refusal", |b| {
        b.iter(|| decide(Some(&path), 0, None, Some("globex"), None).unwrap_err())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
