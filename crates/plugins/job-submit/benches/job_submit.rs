//! What `job_submit/tenancy` adds to slurmctld per submission (it runs under slurmctld's job,
//! node and partition read locks, so it must stay short): reading the config file (parsed again
//! only when its text changed), the NSS lookup of the user and groups and the prolog's decision,
//! next to a bare read of the config file and to a parse on every call (what the plugin would
//! cost without keeping the last parse).

use criterion::{criterion_group, criterion_main, Criterion};
use job_submit_tenancy::{decide, Submission};
use tenancy_config::Config;

const CONFIG: &str = r#"
[cluster]
name = "bench"
state_dir = "/var/lib/slurm-tenancy/jobs"
audit_log = "/var/log/slurm-tenancy/audit.jsonl"
scratch_root = "/scratch"
[tiers.internal]
mig_profiles = ["1g.18gb", "2g.35gb", "3g.71gb"]
[tiers.regulated]
mig_profiles = ["3g.71gb"]
share_gpu = false
scratch_on_exit = "retain"
retain_days = 30
[tenants.acme]
tier = "internal"
groups = ["root"]
accounts = ["acme"]
egress = ["10.20.0.0/16:443/tcp"]
[tenants.globex]
tier = "regulated"
groups = ["daemon"]
egress = ["10.30.0.0/16:443/tcp"]
[network]
infrastructure = ["10.0.0.53/32:53/udp", "10.0.0.10/32:6817-6819/tcp"]
"#;

fn submission(tenant: &str) -> Submission {
    Submission {
        uid: 0,
        account: Some("acme".into()),
        tenant: Some(tenant.into()),
        mig: Some("1g.18gb".into()),
        shared: job_submit_tenancy::NO_VAL16,
        get_user_env: false,
        gpus: job_submit_tenancy::gres::gpu_requests("gres/gpu:1g.18gb:1"),
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenancy.toml");
    std::fs::write(&path, CONFIG).unwrap();
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
