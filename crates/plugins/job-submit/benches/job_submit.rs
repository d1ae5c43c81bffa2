//! What `job_submit/tenancy` adds to slurmctld per submission (it runs under slurmctld's job,
//! node and partition read locks, so it must stay short): reading the config file (parsed again
//! only when its text changed), the NSS lookup of the user and groups and the prolog's decision,
//! next to a bare read of the config file and to a parse on every call (what the plugin would
//! cost without keeping the last parse).

use criterion::{criterion_group, criterion_main, Criterion};
use job_submit_tenancy::{decide, Submission};
use tenancy_config::Config;
use tenancy_test_support::TenancyToml;

fn submission(tenant: &str) -> Submission {
    Submission {
        uid: 0,
        account: Some("acme".into()),
        tenant: Some(tenant.into()),
        mig: Some("1g.18gb".into()),
        gpus: job_submit_tenancy::gres::gpu_requests("gres/gpu:1g.18gb:1"),
        ..Submission::default()
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenancy.toml");
    std::fs::write(&path, TenancyToml::submit_bench().to_string()).unwrap();
    std::env::set_var("TENANCY_CONFIG", &path);
    let mut g = c.benchmark_group("job_submit");
    g.bench_function("read config file only (baseline)", |b| {
        b.iter(|| std::fs::read_to_string(&path).unwrap())
    });
    g.bench_function("decide: read + NSS + resolve (accepted)", |b| {
        b.iter(|| decide(Ok(submission("acme"))).unwrap())
    });
    g.bench_function("decide: refusal", |b| {
        b.iter(|| decide(Ok(submission("globex"))).unwrap_err())
    });
    g.bench_function("the same, parsing the config on every call", |b| {
        b.iter(|| {
            let config = Config::from_file(&path).unwrap();
            submission("acme").check(&config).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
