//! What the plugin adds to `sbatch`: loading the config, looking the submitter up in NSS and
//! resolving tenant and profile (`backend::decide`), next to reading the config file alone.
//! Goal: well under 2 ms.

use criterion::{criterion_group, criterion_main, Criterion};
use spank_tenancy::backend::decide;

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

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenancy.toml");
    std::fs::write(&path, CONFIG).unwrap();
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
