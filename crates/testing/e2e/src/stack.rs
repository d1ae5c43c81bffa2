//! The whole product on a local cluster: the SPANK plugin, tenancy-prolog/-epilog as Slurm's
//! Prolog/Epilog, the NVML stand-in as the node's libnvidia-ml.so.1, two tenants with their
//! groups and users. Shared by the e2e tests and the demo.

use crate::slurm_conf::with_tenant_groups;
use crate::{artifact, Cluster, ClusterOptions, Options, TestUser, Users};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tenancy_test_support::{GpuPlacement, ScratchOnExit, TenancyToml};

/// Names made for one run (unique when the plain names are taken).
#[derive(Clone)]
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
    /// The anchor file (`cluster.audit_anchor`) and the key whose MAC anchors carry.
    pub audit_anchors: PathBuf,
    pub anchor_key: PathBuf,
    pub scratch_root: PathBuf,
    pub nvml_library: PathBuf,
    pub nvml_fixture: PathBuf,
    pub nvml_state: PathBuf,
    /// Device nodes the NVML stand-in lays out (nvidia0.., nvidiactl, nvidia-caps/).
    pub dev_dir: PathBuf,
    /// The stand-in's /proc/driver/nvidia-caps/mig-minors and /proc/devices.
    pub mig_minors: PathBuf,
    pub proc_devices: PathBuf,
    /// Binaries the jobs run (readable by every user).
    pub bin_dir: PathBuf,
}

impl StackPaths {
    pub fn under(root: &Path) -> StackPaths {
        StackPaths {
            root: root.to_path_buf(),
            state_dir: root.join("state"),
            audit_log: root.join("audit/audit.jsonl"),
            audit_anchors: root.join("audit/anchors"),
            anchor_key: root.join("audit/anchor.key"),
            scratch_root: root.join("scratch"),
            nvml_library: root.join("lib/libnvidia-ml.so.1"),
            nvml_fixture: root.join("nvml/fixture.toml"),
            nvml_state: root.join("nvml/state.json"),
            dev_dir: root.join("dev"),
            mig_minors: root.join("nvml/mig-minors"),
            proc_devices: root.join("nvml/proc-devices"),
            bin_dir: root.join("bin"),
        }
    }
}

/// The admin config for the demo tenants: acme (tier internal: shares GPUs, scratch wiped),
/// globex (tier regulated: GPU of its own beside acme on the node, `gpu_placement = "gpu"`,
/// scratch retained 30 days), billing for both.
pub fn tenancy_toml(p: &StackPaths, t: &Tenants) -> TenancyToml {
    let mut c = TenancyToml::new("demo");
    c.cluster()
        .state_dir(&p.state_dir)
        .audit_log(&p.audit_log)
        .audit_anchor(&p.audit_anchors)
        .audit_anchor_key(&p.anchor_key)
        .scratch_root(&p.scratch_root)
        .nvml_library(&p.nvml_library)
        .nvml_shim_fixture(&p.nvml_fixture);
    c.node()
        .proc_devices(&p.proc_devices)
        .mig_minors(&p.mig_minors)
        .nvidia_caps_dir(p.dev_dir.join("nvidia-caps"));
    c.tier("internal")
        .mig_profiles(["1g.18gb", "2g.35gb", "3g.71gb"])
        .share_gpu(true)
        .share_node(true)
        .scratch_on_exit(ScratchOnExit::Wipe);
    c.tier("regulated")
        .mig_profiles(["3g.71gb", "7g.141gb"])
        .share_gpu(false)
        .share_node(true)
        .gpu_placement(GpuPlacement::Gpu)
        .scratch_on_exit(ScratchOnExit::Retain)
        .retain_days(30);
    for (tenant, tier, group, egress) in [
        ("acme", "internal", &t.acme_group, "10.20.0.0/16:443/tcp"),
        (
            "globex",
            "regulated",
            &t.globex_group,
            "10.30.0.0/16:443/tcp",
        ),
    ] {
        c.tenant(tenant)
            .tier(tier)
            .groups([group])
            .accounts([tenant])
            .egress([egress]);
    }
    c.network().infrastructure(["127.0.0.1/32:1-65535/tcp"]);
    c.billing()
        .currency("EUR")
        .job_hour_without_mig("0.05")
        .rate("1g.18gb", "0.85")
        .rate("2g.35gb", "1.60")
        .rate("3g.71gb", "3.10")
        .rate("7g.141gb", "6.90");
    c
}

/// Two H200s with MIG mode on; state, device nodes and driver files kept in the stack folder.
pub fn nvml_fixture(p: &StackPaths) -> String {
    format!(
        "state = \"{}\"\ndev_dir = \"{}\"\nmig_minors = \"{}\"\nproc_devices = \"{}\"\n\n\
         [[gpus]]\nmodel = \"H200-141GB\"\n\n[[gpus]]\nmodel = \"H200-141GB\"\n",
        p.nvml_state.display(),
        p.dev_dir.display(),
        p.mig_minors.display(),
        p.proc_devices.display(),
    )
}

/// The product's nft table and cgroup subtree (fixed names: `tenancyctl firewall apply` uses
/// them on a real node too).
const NFT_TABLE: &str = "tenancy";
const CGROUP_SUBTREE: &str = "/sys/fs/cgroup/unified/tenancy";

/// A local cluster with the whole product installed from this build's artifacts. Dropping it
/// stops the cluster (jobs first, so epilogs run) and removes the firewall table it loaded.
pub struct Stack {
    pub cluster: Cluster,
    pub paths: StackPaths,
    /// The config file the cluster uses (next to slurm.conf).
    pub config: PathBuf,
    /// What that file was written from ([`Stack::reconfigure`]).
    toml: TenancyToml,
    /// Whether this build has the per-tenant firewall and the stack loaded it.
    pub firewall: bool,
    tenant_names: Vec<String>,
    stopped: bool,
}

/// Copies a built binary where every job user can run it.
fn install_bin(name: &str, dir: &Path) -> Result<PathBuf> {
    let src = artifact(name)?;
    let dest = dir.join(name);
    fs::copy(&src, &dest).with_context(|| format!("copy {}", src.display()))?;
    fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;
    Ok(dest)
}

impl Stack {
    /// Starts the cluster (its folder next to `root`) with the plugin, prolog/epilog, NVML
    /// stand-in (device nodes laid out) and, when this build has it, the per-tenant firewall
    /// loaded; on the Slurm `options` name, with its extra slurm.conf lines and files,
    /// accounting and config changes.
    pub fn start(root: &Path, tenants: &Tenants, options: &Options) -> Result<Stack> {
        let slurm = options.slurm.root()?;
        let p = StackPaths::under(root);
        for d in [&p.state_dir, &p.scratch_root, &p.bin_dir] {
            fs::create_dir_all(d)?;
        }
        for f in [&p.audit_log, &p.nvml_library, &p.nvml_fixture] {
            fs::create_dir_all(f.parent().expect("parent"))?;
        }
        for d in [root, &p.scratch_root, &p.bin_dir] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))?;
        }
        // The anchor key, as an admin makes it: 32 random bytes, root's alone.
        let mut key = [0u8; 32];
        fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
        fs::write(&p.anchor_key, key)?;
        fs::set_permissions(&p.anchor_key, fs::Permissions::from_mode(0o600))?;
        let shim = artifact("libnvidia_ml.so")?;
        fs::copy(&shim, &p.nvml_library).with_context(|| format!("copy {}", shim.display()))?;
        fs::write(&p.nvml_fixture, nvml_fixture(&p))?;
        for b in ["tenancy-e2e-probe", "nvml-shim-ctl", "tenancyctl"] {
            install_bin(b, &p.bin_dir)?;
        }
        let plugin = |name: &str| match &slurm {
            Some(r) => r.plugin(name),
            None => artifact(name),
        };
        let mut config = tenancy_toml(&p, tenants);
        for edit in &options.config {
            edit(&mut config);
        }
        let cluster = Cluster::start(ClusterOptions {
            prolog: Some(artifact("tenancy-prolog")?),
            epilog: Some(artifact("tenancy-epilog")?),
            spank_plugin: Some(plugin("libspank_tenancy.so")?),
            job_submit_plugin: Some(plugin("libjob_submit_tenancy.so")?),
            tenancy_toml: Some(config.to_string()),
            extra_conf: options
                .slurm_conf
                .iter()
                .map(|l| with_tenant_groups(l, tenants))
                .collect(),
            extra_files: options.files.clone(),
            folder_in: root.parent().map(Path::to_path_buf),
            accounting: options.accounting.clone(),
            slurm_root: slurm,
            cpus: options.cpus,
        })?;
        let path = cluster.path("etc/tenancy.toml");
        let mut stack = Stack {
            cluster,
            paths: p,
            config: path,
            toml: config,
            firewall: false,
            tenant_names: vec!["acme".into(), "globex".into()],
            stopped: false,
        };
        let o = stack.shim_ctl(&["layout"])?;
        if !o.status.success() {
            bail!(
                "nvml-shim-ctl layout: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        // The firewall must be loaded before the first job (the prolog adds jobs to it).
        let mut help = stack.tenancyctl();
        help.args(["firewall", "--help"]);
        if stack.cluster.run(help)?.status.success() {
            let mut apply = stack.tenancyctl();
            apply.args(["firewall", "apply"]);
            let o = stack.cluster.run(apply)?;
            if !o.status.success() {
                bail!(
                    "tenancyctl firewall apply: {}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            stack.firewall = true;
        }
        Ok(stack)
    }

    /// Changes the config while the cluster runs, through the builder it was written with
    /// (job_submit/tenancy, the prolog and tenancyctl read the file again on each use). The
    /// file is written anew: a text edit made to it since is gone.
    pub fn reconfigure(&mut self, edit: impl FnOnce(&mut TenancyToml)) -> Result<()> {
        edit(&mut self.toml);
        fs::write(&self.config, self.toml.to_string())
            .with_context(|| format!("write {}", self.config.display()))
    }

    /// A built binary installed for the jobs (readable and executable by every user).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.paths.bin_dir.join(name)
    }

    /// `tenancyctl --config <this stack's config>` as root.
    pub fn tenancyctl(&self) -> Command {
        let mut c = self.cluster.cmd(self.bin("tenancyctl"));
        c.arg("--config").arg(&self.config);
        c
    }

    /// Runs `nvml-shim-ctl ARGS` on this stack's stand-in state.
    pub fn shim_ctl(&self, args: &[&str]) -> Result<Output> {
        let mut c = self.cluster.cmd(self.bin("nvml-shim-ctl"));
        c.env("NVML_SHIM_FIXTURE", &self.paths.nvml_fixture)
            .args(args);
        self.cluster.run(c)
    }

    /// MIG compute instances the stand-in holds now (rows of `nvml-shim-ctl list` with a
    /// MIG UUID), and GPU instances without a compute instance.
    pub fn shim_instances(&self) -> Result<Vec<Value>> {
        let o = self.shim_ctl(&["list", "--format", "json"])?;
        if !o.status.success() {
            bail!("nvml-shim-ctl list: {}", String::from_utf8_lossy(&o.stderr));
        }
        let rows: Vec<Value> = serde_json::from_slice(&o.stdout).with_context(|| {
            format!("nvml-shim-ctl list: {}", String::from_utf8_lossy(&o.stdout))
        })?;
        Ok(rows
            .into_iter()
            .filter(|r| {
                r.get("gi")
                    .and_then(Value::as_str)
                    .is_some_and(|g| g != "-")
            })
            .collect())
    }

    /// The job's journal on this node, if the prolog left one.
    pub fn journal(&self, job: u64) -> Result<Option<Value>> {
        let path = self.paths.state_dir.join(format!("job_{job}.json"));
        match fs::read(&path) {
            Ok(b) => Ok(Some(
                serde_json::from_slice(&b)
                    .with_context(|| format!("journal {}", path.display()))?,
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("read {}", path.display())),
        }
    }

    /// The `made` value of `layer` in the job's journal.
    pub fn made(&self, job: u64, layer: &str) -> Result<Option<Value>> {
        Ok(self.journal(job)?.and_then(|j| {
            j.get("steps")?
                .as_array()?
                .iter()
                .find(|s| s.get("layer").and_then(Value::as_str) == Some(layer))?
                .get("made")
                .cloned()
        }))
    }

    /// Every audit record so far.
    pub fn audit_records(&self) -> Result<Vec<Value>> {
        let text = match fs::read_to_string(&self.paths.audit_log) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).context("read the audit log"),
        };
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).with_context(|| format!("audit line {l:?}")))
            .collect()
    }

    /// Audit events recorded for `job`, in order (`job_start`, `job_end`, `rollback`...).
    pub fn audit_events(&self, job: u64) -> Result<Vec<String>> {
        Ok(self
            .audit_records()?
            .iter()
            .filter(|r| r.get("job_id").and_then(Value::as_u64) == Some(job))
            .filter_map(|r| r.get("event").and_then(Value::as_str).map(String::from))
            .collect())
    }

    /// Stops the cluster (jobs first, so their epilogs run), then unloads what the stack
    /// loaded: the firewall table and the tenant cgroups left empty. Idempotent.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let r = self.cluster.stop();
        // A tenant cgroup the loaded table still names must stay: nft cannot list, save or
        // delete a ruleset whose cgroup match lost its folder (facts.md). The table goes with
        // the nft that loaded it (a release root's, whose cgroup matches the host's nft 1.0.6
        // cannot read back: it crashes on every later command).
        let unloaded = self.firewall
            && self
                .cluster
                .run({
                    let mut c = self.cluster.cmd("nft");
                    c.args(["delete", "table", "inet", NFT_TABLE]);
                    c
                })
                .is_ok_and(|o| o.status.success());
        if unloaded {
            for t in &self.tenant_names {
                let _ = fs::remove_dir(Path::new(CGROUP_SUBTREE).join(t));
            }
            // The device programs jobs shared, kept between jobs (gone with it).
            let _ = fs::remove_dir(
                Path::new(CGROUP_SUBTREE).join(tenancy_devices::job::PROGRAM_KEEPER),
            );
            let _ = fs::remove_dir(CGROUP_SUBTREE);
        }
        r
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("tenancy-e2e: {e}");
        }
    }
}
