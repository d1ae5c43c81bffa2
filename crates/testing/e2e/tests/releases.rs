//! The job_submit plugin on the Slurm releases sites run: 22.05 (this machine's), 24.11 (Debian
//! trixie) and 26.05 (Debian sid), each in a root made by scripts/slurm-root (cached in
//! /var/cache/slurm-tenancy/roots) with the plugin built against that root's headers, its
//! slurmctld and slurmd run with chroot (cgroup/v1 on this hybrid host). A root that cannot be
//! made (archive unreachable) fails the test: a release is never skipped silently. The product's
//! whole two-tenant scenario on 24.11 and 26.05 is tests/product.rs's `e2e_on_slurm_24_11` and
//! `e2e_on_slurm_26_05` (and all of product.rs with TENANCY_TEST_SLURM_RELEASE). Needs root;
//! skips loudly otherwise.

use std::fs;
use std::process::Output;
use std::time::Instant;
use tenancy_e2e::stack::{tenancy_toml, StackPaths};
use tenancy_e2e::{
    artifact, scenario, text, Cluster, ClusterOptions, Options, Slurm, Tenants, TestUser, Users,
};

fn root_of(release: &str) -> tenancy_e2e::SlurmRoot {
    let t = Instant::now();
    let r = Slurm::Release(release.into())
        .root()
        .unwrap_or_else(|e| panic!("Slurm {release}: {e:#}"))
        .expect("a release root");
    eprintln!(
        "Slurm {} root {} ready in {:.1} s",
        r.version(),
        r.dir.display(),
        t.elapsed().as_secs_f64()
    );
    assert!(
        r.version().starts_with(&format!("{release}.")),
        "root of {release} holds Slurm {}",
        r.version()
    );
    r
}

/// `sinfo --version` of the cluster: the release that runs, not the host's.
fn running_version(c: &Cluster) -> String {
    let mut v = c.cmd("sinfo");
    v.arg("--version");
    text(&c.run(v).unwrap().stdout).trim().to_string()
}

fn sbatch(c: &Cluster, user: &TestUser, args: &[&str]) -> Output {
    let dir = c.user_dir(user);
    let script = dir.join("job.sh");
    fs::write(&script, include_str!("../scripts/jobs/nothing.sh")).unwrap();
    let mut s = c.cmd_as(user, "sbatch");
    s.args(args)
        .arg("-o")
        .arg(dir.join("job-%j.out"))
        .arg(&script);
    c.run(s).unwrap()
}

// slurmctld of each release, in its root, loads job_submit_tenancy.so built against that
// release's headers (slurmctld loads a job_submit plugin only when its version equals its own,
// micro release included) and refuses at submission a job the plugin must refuse, with the
// plugin's reason; a job of a tenant's member is accepted.
scenario!(
    job_submit_plugin_loads_on_each_release,
    Options::default(),
    |users: &mut Users| {
        let t = Tenants::create(users).expect("users");
        // "22.05": this machine's own Slurm and the workspace's build of the plugin.
        for release in ["22.05", "24.11", "26.05"] {
            let slurm = (release != "22.05").then(|| root_of(release));
            let folder = tempfile::tempdir().unwrap();
            let paths = StackPaths::under(folder.path());
            let plugin = match &slurm {
                Some(s) => s.plugin("libjob_submit_tenancy.so").unwrap(),
                None => artifact("libjob_submit_tenancy.so").unwrap(),
            };
            let c = Cluster::start(ClusterOptions {
                job_submit_plugin: Some(plugin),
                tenancy_toml: Some(tenancy_toml(&paths, &t).to_string()),
                slurm_root: slurm.clone(),
                ..Default::default()
            })
            .unwrap_or_else(|e| panic!("cluster of Slurm {release}: {e:#}"));
            let version = running_version(&c);
            assert!(
                version.contains(&format!(" {release}.")),
                "Slurm {release}: the cluster runs {version}"
            );
            if let Some(s) = &slurm {
                assert!(version.ends_with(&format!(" {}", s.version())), "{version}");
            }

            let refused = sbatch(&c, &t.outsider, &["--account=acme"]);
            let err = text(&refused.stderr);
            assert!(
                !refused.status.success() && err.contains("tenancy: "),
                "Slurm {release}: a job of {} (in no tenant) on acme's account was not refused \
                 by job_submit/tenancy: {err}",
                t.outsider.name
            );
            let ok = sbatch(&c, &t.acme1, &["--account=acme"]);
            assert!(
                ok.status.success(),
                "Slurm {release}: acme's member refused: {}",
                text(&ok.stderr)
            );
            let log = fs::read_to_string(c.path("log/slurmctld.log")).unwrap_or_default();
            assert!(
                log.contains("job_submit/tenancy: refused a job"),
                "Slurm {release}: slurmctld's log has no refusal of the plugin's: {log}"
            );
            eprintln!("Slurm {release} ({version}): job_submit/tenancy loaded, refused: {err}");
        }
    }
);
