//! End-to-end tests of slurm-tenancy on real Slurm clusters: slurmctld, slurmd and munge
//! started from a temp folder (on this machine's Slurm, in a release root, on several nodes in
//! network namespaces, or on a pure cgroup v2 node under user-mode-linux), real users and
//! groups, and the whole product installed from this build.
//!
//! # A scenario
//!
//! One entry point, [`scenario!`] (the function [`scenario()`]): it skips as non-root (fails
//! under CI), runs the scenarios of one test binary one after the other, makes the two tenants'
//! users, starts the world the body takes from the [`Options`], and tears it all down in order
//! (jobs first, so their epilogs run), also when the body panics.
//!
//! ```no_run
//! use std::time::Duration;
//! use tenancy_e2e::{probe_kv, scenario, wait_output, Env, Options};
//!
//! scenario!(acme_gets_its_tenant, Options::default(), |e: &mut Env| {
//!     let job = e.probe_job(&e.t.acme1, "hello", &["env"]);
//!     let id = e.sbatch(&e.t.acme1, &["--tenant=acme"], &job);
//!     let info = e.stack.cluster.wait_job_done(id, Duration::from_secs(60)).unwrap();
//!     assert_eq!(info["JobState"], "COMPLETED", "{info:?}");
//!     let out = wait_output(&job.out, "uid=", Duration::from_secs(10));
//!     assert_eq!(probe_kv(&out)["TENANCY_TENANT"], "acme");
//! });
//! ```
//!
//! The world is the type the body takes:
//! * [`Env`]: the product on one node ([`Stack`]: plugins, prolog and epilog, NVML stand-in,
//!   firewall) with tenants acme and globex, on the Slurm [`Options::slurm`] names:
//!   [`RELEASE_ENV`] (`TENANCY_TEST_SLURM_RELEASE=24.11`) by default, the release switch that
//!   runs a whole test file on another release;
//! * [`MultiNode`]: two nodes, each a set of namespaces with its own slurmd and the product;
//! * [`PureV2Node`]: a pure cgroup v2 node (a UML kernel on the 24.11 root) that runs a shell
//!   scenario of scripts/pure_v2/;
//! * [`Users`]: only the users, for a body that starts bare [`Cluster`]s or several worlds
//!   itself.
//!
//! Every cluster talks through one [`Client`] (SLURM_CONF, commands as a user, job states),
//! writes its slurm.conf with one writer (src/slurm_conf.rs) and its tenancy.toml with
//! [`tenancy_test_support::TenancyToml`]; the shell the tests run is in scripts/. Where to add
//! what: docs/testing.md.

pub mod accounting;
pub mod audit_disk;
mod client;
mod cluster;
mod daemons;
pub mod multi_node;
pub mod release_root;
pub mod rest;
pub mod root_overlay;
mod scenario;
pub mod scratch_fs;
mod slurm_conf;
pub mod soak;
pub mod sshd;
pub mod stack;
pub mod steer;
pub mod uml_node;
pub mod users;

pub use accounting::Accounting;
pub use client::Client;
pub use cluster::{Cluster, ClusterOptions};
pub use daemons::free_port;
pub use multi_node::MultiNode;
pub use release_root::SlurmRoot;
pub use scenario::{
    scenario, wait_output, ConfigEdit, Env, Held, Job, Options, Slurm, World, RELEASE_ENV,
};
pub use stack::{Stack, Tenants};
pub use tenancy_test_support::{requires_root, skip, target_dir, Limits, TenancyToml};
pub use uml_node::PureV2Node;
pub use users::{TestUser, Users};

use anyhow::{anyhow, bail, ensure, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

/// Bytes a command printed, as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Waits until `path` holds a line starting with `prefix`; returns the file's text.
pub fn wait_line(path: &Path, prefix: &str, timeout: Duration) -> Result<String> {
    let t = Instant::now();
    loop {
        let s = std::fs::read_to_string(path).unwrap_or_default();
        if s.lines().any(|l| l.starts_with(prefix)) {
            return Ok(s);
        }
        if t.elapsed() > timeout {
            bail!(
                "no {prefix:?} in {} after {timeout:?}: {s:?}",
                path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Parses `scontrol -o` output (`Key=Value Key=Value ...`; values have no spaces except the
/// last keys, which is good enough for the fields we read).
pub fn parse_kv(text: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for word in text.split_whitespace() {
        if let Some((k, v)) = word.split_once('=') {
            m.entry(k.to_string()).or_insert_with(|| v.to_string());
        }
    }
    m
}

/// `key=value` lines (as the e2e probe prints them); the first occurrence of a key wins.
pub fn probe_kv(text: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            if !k.contains(' ') {
                m.entry(k.to_string()).or_insert_with(|| v.to_string());
            }
        }
    }
    m
}

/// The job id in `sbatch` output ("Submitted batch job 12").
pub fn submitted_id(out: &Output) -> Result<u64> {
    let s = String::from_utf8_lossy(&out.stdout);
    s.split_whitespace()
        .last()
        .and_then(|w| w.parse().ok())
        .ok_or_else(|| {
            anyhow!(
                "no job id in sbatch output: stdout {:?} stderr {:?}",
                s,
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// The repository's root: the folder of the workspace's Cargo.lock above this crate.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .expect("the workspace root (Cargo.lock) above the e2e crate")
        .to_path_buf()
}

/// The folder of Slurm's own plugins (the compiled-in `PluginDir`): where this Slurm keeps
/// `select_cons_tres.so`.
pub fn slurm_plugin_dir() -> Result<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/slurm-wlm",
        "/usr/lib/aarch64-linux-gnu/slurm-wlm",
        "/usr/lib64/slurm",
        "/usr/lib/slurm",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|d| d.join("select_cons_tres.so").is_file())
    .ok_or_else(|| {
        anyhow!(
            "Slurm's plugin folder (with select_cons_tres.so) not found: apt-get install slurm-wlm"
        )
    })
}

/// A built artifact by file name (target/<profile>/NAME or its deps/), or a clear error.
///
/// With TENANCY_JOB_PATH_DIR set, the job path's binaries (`tenancy-prolog`, `tenancy-epilog`,
/// `tenancy-prolog-dynamic`) come from that folder instead: scripts/build-job-path's, the
/// prolog and epilog as installed, linked with musl.
pub fn artifact(name: &str) -> Result<PathBuf> {
    // The demo after `apt install ./target/debian/*.deb`: the product's files where the
    // packages put them.
    if std::env::var_os("TENANCY_FROM_PACKAGES").is_some() {
        if let Some(p) = installed(name) {
            ensure!(
                p.is_file(),
                "{} missing: are the packages installed?",
                p.display()
            );
            return Ok(p);
        }
    }
    tenancy_test_support::built(name).map_err(|e| anyhow!("{e}"))
}

/// Where the Debian packages (scripts/package) install a product file built as `name`.
fn installed(name: &str) -> Option<PathBuf> {
    let multiarch = format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH);
    Some(PathBuf::from(match name {
        "tenancy-prolog" | "tenancy-epilog" | "tenancy-prolog-dynamic" => {
            format!("/usr/sbin/{name}")
        }
        "tenancyctl" => "/usr/bin/tenancyctl".into(),
        "libspank_tenancy.so" => format!("{multiarch}/slurm-tenancy/spank_tenancy.so"),
        "libjob_submit_tenancy.so" => format!("{multiarch}/slurm-wlm/job_submit_tenancy.so"),
        _ => return None,
    }))
}
