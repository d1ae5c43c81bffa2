//! The whole product on a local cluster: the SPANK plugin, tenancy-prolog/-epilog as Slurm's
//! Prolog/Epilog, the NVML stand-in as the node's libnvidia-ml.so.1, two tenants with their
//! groups and users. Shared by the e2e tests and the demo.

use crate::{artifact, Cluster, ClusterOptions, TestUser, Users};
use anyhow::{Context, Result};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Names made for one run (unique when the plain names are taken).
pub struct Tenants {
    pub acme_group: String,
    pub globex_group: String,
    /// Member of acme only.
    pub acme1: TestUser,
    /// Member of globex only.
    pub globex1: TestUser,
    /// Member of both.
    pub both: TestUser,
    /// Member of neither.
    pub outsider: TestUser,
}

fn free_name(base: &str) -> String {
    let taken = |n: &str| {
        nix::unistd::Group::from_name(n).ok().flatten().is_some()
            || nix::unistd::User::from_name(n).ok().flatten().is_some()
    };
    if !taken(base) {
        return base.to_string();
    }
    (1..)
        .map(|i| format!("{base}{}x{i}", std::process::id() % 10000))
        .find(|n| !taken(n))
        .expect("a free name")
}

impl Tenants {
    pub fn create(users: &mut Users) -> Result<Tenants> {
        let acme_group = free_name("acme");
        let globex_group = free_name("globex");
        users.group(&acme_group)?;
        users.group(&globex_group)?;
        let acme1 = users.user(&free_name("acme1"), &[&acme_group])?;
        let globex1 = users.user(&free_name("globex1"), &[&globex_group])?;
        let both = users.user(&free_name("consultant1"), &[&acme_group, &globex_group])?;
        let outsider = users.user(&free_name("outsider1"), &[])?;
        Ok(Tenants {
            acme_group,
            globex_group,
            acme1,
            globex1,
            both,
            outsider,
        })
    }
}

/// Paths of one stack's state (all inside `root`).
pub struct StackPaths {
    pub root: PathBuf,
    pub state_dir: PathBuf,
    pub audit_log: PathBuf,
    pub scratch_root: PathBuf,
    pub nvml_library: PathBuf,
    pub nvml_fixture: PathBuf,
    pub nvml_state: PathBuf,
}

impl StackPaths {
    pub fn under(root: &Path) -> StackPaths {
        StackPaths {
            root: root.to_path_buf(),
            state_dir: root.join("state"),
            audit_log: root.join("audit/audit.jsonl"),
            scratch_root: root.join("scratch"),
            nvml_library: root.join("lib/libnvidia-ml.so.1"),
            nvml_fixture: root.join("nvml/fixture.toml"),
            nvml_state: root.join("nvml/state.json"),
        }
    }
}

/// The admin config for the demo tenants: acme (tier internal: shares GPUs, scratch wiped),
/// globex (tier regulated: GPU of its own, scratch retained 30 days).
pub fn tenancy_toml(p: &StackPaths, t: &Tenants) -> String {
    format!(
        r#"[cluster]
name = "demo"
state_dir = "{state}"
audit_log = "{audit}"
scratch_root = "{scratch}"
nvml_library = "{nvml}"
nvml_shim_fixture = "{fixture}"

[tiers.internal]
mig_profiles = ["1g.18gb", "2g.35gb", "3g.71gb"]
share_gpu = true
share_node = true
scratch_on_exit = "wipe"

[tiers.regulated]
mig_profiles = ["3g.71gb", "7g.141gb"]
share_gpu = false
share_node = true
scratch_on_exit = "retain"
retain_days = 30

[tenants.acme]
tier = "internal"
groups = ["{ag}"]
accounts = ["acme"]
egress = ["10.20.0.0/16:443/tcp"]

[tenants.globex]
tier = "regulated"
groups = ["{gg}"]
accounts = ["globex"]
egress = ["10.30.0.0/16:443/tcp"]

[network]
infrastructure = ["127.0.0.1/32:1-65535/tcp"]
"#,
        state = p.state_dir.display(),
        audit = p.audit_log.display(),
        scratch = p.scratch_root.display(),
        nvml = p.nvml_library.display(),
        fixture = p.nvml_fixture.display(),
        ag = t.acme_group,
        gg = t.globex_group,
    )
}

/// Two H200s with MIG mode on, state kept in the stack folder.
pub fn nvml_fixture(p: &StackPaths) -> String {
    format!(
        "state = \"{}\"\n\n[[gpus]]\nmodel = \"H200-141GB\"\n\n[[gpus]]\nmodel = \"H200-141GB\"\n",
        p.nvml_state.display()
    )
}

/// Starts the cluster with the whole product installed from this build's artifacts.
pub fn start(root: &Path, tenants: &Tenants) -> Result<(Cluster, StackPaths)> {
    let p = StackPaths::under(root);
    for d in [&p.state_dir, &p.scratch_root] {
        fs::create_dir_all(d)?;
    }
    for f in [&p.audit_log, &p.nvml_library, &p.nvml_fixture] {
        fs::create_dir_all(f.parent().expect("parent"))?;
    }
    fs::set_permissions(root, fs::Permissions::from_mode(0o755))?;
    fs::set_permissions(&p.scratch_root, fs::Permissions::from_mode(0o755))?;
    let shim = artifact("libnvidia_ml.so")?;
    fs::copy(&shim, &p.nvml_library).with_context(|| format!("copy {}", shim.display()))?;
    fs::write(&p.nvml_fixture, nvml_fixture(&p))?;
    let cluster = Cluster::start(ClusterOptions {
        prolog: Some(artifact("tenancy-prolog")?),
        epilog: Some(artifact("tenancy-epilog")?),
        spank_plugin: Some(artifact("libspank_tenancy.so")?),
        tenancy_toml: Some(tenancy_toml(&p, tenants)),
        extra_conf: vec![],
    })?;
    Ok((cluster, p))
}
