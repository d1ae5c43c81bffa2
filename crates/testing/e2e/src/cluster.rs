//! A real single-node Slurm cluster (slurmctld + slurmd, munge) started from a temp folder, on
//! the host's Slurm or in a release root.
//!
//! * Everything it starts (munged if none was running, slurmctld, slurmd, MariaDB and slurmdbd
//!   with accounting) it records by pid and stops by pid ([`Cluster::stop`], also on Drop); it
//!   never touches daemons it did not start. Leftover job processes (slurmstepd that carry this
//!   cluster's SLURM_CONF, and tasks in the node's Slurm cgroups) are killed at stop.
//! * One cluster at a time per machine: [`Cluster::start`] takes the e2e lock
//!   ([`crate::daemons::LOCK`]): the node's Slurm cgroups are named after the host.

use crate::client::{Client, Entry};
use crate::daemons::{
    cluster_folder, ensure_munge, free_port, hostname_short, kill_leftover_jobs, machine_lock,
    slurm_cgroups, write_file, Daemons,
};
use crate::slurm_conf::{cgroup_conf, SlurmConf};
use crate::{accounting, release_root, slurm_plugin_dir, Accounting, SlurmRoot, TestUser};
use crate::{Options, Users, World};
use anyhow::{anyhow, bail, ensure, Context, Result};
use nix::fcntl::Flock;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// What a single-node cluster runs besides Slurm itself, and where.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Prolog= (absolute path, executable by root).
    pub prolog: Option<PathBuf>,
    /// Epilog=.
    pub epilog: Option<PathBuf>,
    /// The SPANK plugin .so; copied into the cluster folder (readable by every user).
    pub spank_plugin: Option<PathBuf>,
    /// The job_submit plugin .so (`libjob_submit_tenancy.so`): installed as
    /// `job_submit_tenancy.so` in a plugin folder of the cluster's (`PluginDir` lists it after
    /// Slurm's own) with `JobSubmitPlugins=tenancy`; slurmctld finds the config next to
    /// slurm.conf.
    pub job_submit_plugin: Option<PathBuf>,
    /// The tenancy config text; written as tenancy.toml next to slurm.conf and passed to the
    /// plugin as `config=`.
    pub tenancy_toml: Option<String>,
    /// Extra slurm.conf lines.
    pub extra_conf: Vec<String>,
    /// Extra files next to slurm.conf (name, text), e.g. job_container.conf.
    pub extra_files: Vec<(String, String)>,
    /// Where the cluster's folder is made (default: the temp folder, /tmp). Jobs in their own
    /// /tmp (job_container/tmpfs) need it elsewhere: their scripts and outputs live in it.
    pub folder_in: Option<PathBuf>,
    /// Slurm's accounting: MariaDB + slurmdbd started with the cluster, MIG profiles as typed
    /// GPU GRES in AccountingStorageTRES (default off: accounting_storage/none).
    pub accounting: Option<Accounting>,
    /// Run Slurm from this release's root (daemons and clients under chroot, cgroup/v1;
    /// release_root.rs) instead of the host's Slurm. The cluster's folder must then be in the
    /// temp folder, which the root shares.
    pub slurm_root: Option<SlurmRoot>,
    /// CPUs the node declares (default this machine's; more adds
    /// `SlurmdParameters=config_overrides`).
    pub cpus: Option<usize>,
}

/// A running single-node cluster; its [`Client`] is what a test talks to it with.
pub struct Cluster {
    client: Client,
    pub node: String,
    daemons: Daemons,
    stopped: bool,
    // Dropped after the daemons are stopped (Drop of Cluster), before the lock.
    _mounts: Option<release_root::RootMounts>,
    _lock: Flock<File>,
}

impl std::ops::Deref for Cluster {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

/// Slurm alone (no product) on the release, with the slurm.conf lines, files, folder and
/// accounting the options name.
impl World for Cluster {
    fn start(options: &Options, _: &mut Users) -> Result<Cluster> {
        Cluster::start(ClusterOptions {
            extra_conf: options.slurm_conf.clone(),
            extra_files: options.files.clone(),
            folder_in: options.folder_in.clone(),
            accounting: options.accounting.clone(),
            slurm_root: options.slurm.root()?,
            cpus: options.cpus,
            ..ClusterOptions::default()
        })
    }
}

impl Cluster {
    /// Starts munge (if needed), slurmctld and slurmd, and waits until the node is idle.
    pub fn start(opts: ClusterOptions) -> Result<Cluster> {
        let lock = machine_lock()?;
        let mounts = match &opts.slurm_root {
            Some(r) => Some(release_root::RootMounts::mount(r)?),
            None => None,
        };
        let dir = cluster_folder(
            "tenancy-e2e-",
            opts.folder_in.as_deref(),
            &["etc", "state", "spool", "log", "run", "lib", "jobs"],
        )?;
        if opts.slurm_root.is_some() {
            ensure!(
                dir.path().starts_with(std::env::temp_dir()) || dir.path().starts_with("/var/tmp"),
                "a cluster in a Slurm release root needs its folder in the temp folder or /var/tmp \
                 (the root shares those), not {}",
                dir.path().display()
            );
        }
        let d = dir.path().to_path_buf();
        let entry = match &opts.slurm_root {
            Some(r) => Entry::Root(r.clone()),
            None => Entry::Host,
        };
        let mut cluster = Cluster {
            client: Client::new(dir, entry),
            node: hostname_short()?,
            daemons: Daemons::default(),
            stopped: false,
            _mounts: mounts,
            _lock: lock,
        };
        let root = opts.slurm_root.as_ref();
        ensure_munge(&mut cluster.daemons, root, &d.join("log/munged.log"))?;
        let cluster_name = format!("tenancy{}", std::process::id());
        let dbd_port = match &opts.accounting {
            Some(_) => Some(free_port()?),
            None => None,
        };
        let conf = cluster.slurm_conf(&opts, &cluster_name, dbd_port)?;
        write_file(&cluster.conf, &conf, 0o644)?;
        // Newer releases' cgroup/v2 refuses this hybrid host ("Hybrid mode is not supported"),
        // and their autodetect picks it: name v1.
        let plugin = if root.is_some() {
            "cgroup/v1"
        } else {
            "autodetect"
        };
        write_file(&d.join("etc/cgroup.conf"), &cgroup_conf(plugin), 0o644)?;
        if let (Some(_), Some(port)) = (&opts.accounting, dbd_port) {
            accounting::start(
                &mut cluster.daemons,
                &d,
                &cluster.node,
                &cluster.client.conf,
                &cluster_name,
                port,
                &|_| {},
            )?;
        }
        for (name, program, args) in [
            ("slurmctld", "slurmctld", &["-D", "-i"][..]),
            ("slurmd", "slurmd", &["-D"][..]),
        ] {
            let mut cmd = Command::new(program);
            cmd.args(args).env("SLURM_CONF", &cluster.client.conf);
            if let Some(r) = root {
                r.enter(&mut cmd);
            }
            cluster
                .daemons
                .spawn(name, &mut cmd, &d.join(format!("log/{name}.out")))?;
        }
        cluster.wait_node_state(&["idle"], Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// slurm.conf with what `opts` asks for; writes the files it names next to it (gres.conf,
    /// tenancy.toml, plugstack.conf, the extra files) and copies the plugins in.
    fn slurm_conf(
        &self,
        opts: &ClusterOptions,
        cluster_name: &str,
        dbd_port: Option<u16>,
    ) -> Result<String> {
        let d = self.dir.path();
        let root = opts.slurm_root.as_ref();
        let ctld_port = free_port()?;
        let mut slurmd_port = free_port()?;
        while slurmd_port == ctld_port {
            slurmd_port = free_port()?;
        }
        let mut conf = SlurmConf::new(cluster_name, &self.node)
            .on_host(ctld_port, slurmd_port)
            .files_in(d, false);
        if let (Some(a), Some(port)) = (&opts.accounting, dbd_port) {
            for line in a.conf_lines(&self.node, port) {
                let (k, v) = line.split_once('=').expect("Key=Value");
                conf.set(k, v);
            }
            let gres = a.gres_conf(&self.node, &d.join("gres"))?;
            write_file(&d.join("etc/gres.conf"), &gres, 0o644)?;
        }
        let tenancy_path = d.join("etc/tenancy.toml");
        if let Some(t) = &opts.tenancy_toml {
            write_file(&tenancy_path, t, 0o644)?;
        }
        for (key, program) in [("Prolog", &opts.prolog), ("Epilog", &opts.epilog)] {
            let Some(program) = program else { continue };
            let program = match root {
                // Slurm in the root sees only the temp folder of the host's: a copy there, with
                // tenancy-prolog-dynamic beside it when the build has one.
                Some(_) => self.copy_for_root(program)?,
                None => program.clone(),
            };
            conf.set(key, &program.display().to_string());
        }
        let plugstack = d.join("etc/plugstack.conf");
        let mut stack = String::new();
        if let Some(so) = &opts.spank_plugin {
            let dest = install_plugin(so, &d.join("lib"), "libspank_tenancy.so")?;
            stack.push_str(&format!("required {}", dest.display()));
            if opts.tenancy_toml.is_some() {
                stack.push_str(&format!(" config={}", tenancy_path.display()));
            }
            stack.push('\n');
        }
        write_file(&plugstack, &stack, 0o644)?;
        conf.set("PlugStackConfig", &plugstack.display().to_string());
        if let Some(so) = &opts.job_submit_plugin {
            let plugins = d.join("lib/plugins");
            fs::create_dir(&plugins)?;
            install_plugin(so, &plugins, "job_submit_tenancy.so")?;
            let own = match root {
                Some(r) => r.plugin_dir()?,
                None => slurm_plugin_dir()?,
            };
            conf.set(
                "PluginDir",
                &format!("{}:{}", own.display(), plugins.display()),
            );
            conf.set("JobSubmitPlugins", "tenancy");
        }
        for l in &opts.extra_conf {
            conf.extra(l);
        }
        for (name, text) in &opts.extra_files {
            write_file(&d.join("etc").join(name), text, 0o644)?;
        }
        let cpus = conf.node_cpus(opts.cpus);
        let gres = opts
            .accounting
            .as_ref()
            .map(Accounting::node_gres)
            .unwrap_or_default();
        let node = &self.node;
        conf.line(format!(
            "NodeName={node} CPUs={cpus} RealMemory=1000 State=UNKNOWN{gres}"
        ));
        conf.line(format!(
            "PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
        ));
        Ok(conf.render())
    }

    /// A copy of `program` in the cluster's lib/ (what a release root sees), with
    /// tenancy-prolog-dynamic beside it when the build has one.
    fn copy_for_root(&self, program: &Path) -> Result<PathBuf> {
        let lib = self.path("lib");
        for name in [
            program.file_name(),
            Some(OsStr::new("tenancy-prolog-dynamic")),
        ]
        .into_iter()
        .flatten()
        {
            let src = program.with_file_name(name);
            if src.is_file() && !lib.join(name).exists() {
                fs::copy(&src, lib.join(name))
                    .with_context(|| format!("copy {}", src.display()))?;
            }
        }
        Ok(lib.join(program.file_name().unwrap_or_default()))
    }

    /// A user's way around the submit-side check: in their own folder, a SPANK plugin of their
    /// own (src/own_spank.c, built with gcc) that hands the job whatever tenant and MIG
    /// profile `OWN_TENANT` / `OWN_MIG` say, unchecked, and a copy of slurm.conf whose
    /// plugstack loads it instead of the product's. Returns that slurm.conf: run a client with
    /// `SLURM_CONF` set to it.
    pub fn own_plugstack(&self, user: &TestUser) -> Result<PathBuf> {
        let dir = self.user_dir(user);
        let src = dir.join("own_spank.c");
        fs::write(&src, include_str!("own_spank.c"))?;
        let so = dir.join("own_spank.so");
        let mut gcc = Command::new("gcc");
        gcc.args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&src);
        // Against the headers of the Slurm that loads it (SPANK checks the release).
        if let Some(root) = self.slurm_root() {
            gcc.arg("-I").arg(root.dir.join("usr/include"));
        }
        let o = gcc
            .output()
            .context("gcc (apt-get install gcc libslurm-dev)")?;
        if !o.status.success() {
            bail!(
                "gcc {}: {}",
                src.display(),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let plugstack = dir.join("plugstack.conf");
        write_file(&plugstack, &format!("required {}\n", so.display()), 0o644)?;
        let conf: String = fs::read_to_string(&self.conf)?
            .lines()
            .map(|l| {
                if l.starts_with("PlugStackConfig=") {
                    format!("PlugStackConfig={}\n", plugstack.display())
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        let own = dir.join("slurm.conf");
        write_file(&own, &conf, 0o644)?;
        Ok(own)
    }

    /// The cgroup directories of job `job`'s extern step, in every hierarchy Slurm put it in:
    /// where pam_slurm_adopt moves an ssh session into the job. Empty when the job has no
    /// extern step process (PrologFlags without Contain).
    pub fn extern_step_dirs(&self, job: u64) -> Result<Vec<PathBuf>> {
        let mut c = self.cmd("scontrol");
        c.args(["listpids", &job.to_string()]);
        let out = self.run(c)?;
        let pids = String::from_utf8_lossy(&out.stdout);
        // PID JOBID STEPID ...; the extern step's first row is its placeholder task (pid -1).
        let Some(pid) = pids.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && f[2] == "extern")
                .then(|| f[0].parse::<u32>().ok())
                .flatten()
        }) else {
            return Ok(Vec::new());
        };
        let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .with_context(|| format!("cgroups of job {job}'s extern step process {pid}"))?;
        let v2_root = tenancy_devices::CgroupLayout::detect()
            .map_err(|e| anyhow!("cgroup layout: {e}"))?
            .v2_root;
        Ok(cgroups
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
                if !path.contains(&format!("/job_{job}/")) {
                    return None;
                }
                let mount = if ctrls.is_empty() {
                    v2_root.clone()?
                } else {
                    Path::new("/sys/fs/cgroup").join(ctrls.trim_start_matches("name="))
                };
                Some(mount.join(path.trim_start_matches('/'))).filter(|d| d.is_dir())
            })
            .collect())
    }

    /// An ssh session of `user` as pam_slurm_adopt leaves it: a process placed in `dirs` (a
    /// job's [`Self::extern_step_dirs`]) that waits for the file `go`, then runs `program`
    /// with `args` (stdout piped), so a caller can adopt it before it acts
    /// (scripts/session.sh).
    pub fn session_in(
        &self,
        user: &TestUser,
        dirs: &[PathBuf],
        go: &Path,
        program: &str,
        args: &[&str],
    ) -> Result<std::process::Child> {
        let mut c = self.cmd_as(user, "sh");
        c.arg("-c")
            .arg(include_str!("../scripts/session.sh"))
            .arg("session")
            .arg(go)
            .arg(program)
            .args(args)
            .stdout(std::process::Stdio::piped());
        let child = c.spawn().context("spawn the session process")?;
        for d in dirs {
            fs::write(d.join("cgroup.procs"), child.id().to_string())
                .with_context(|| format!("move the session into {}", d.display()))?;
        }
        Ok(child)
    }

    /// `sinfo` state of the node, e.g. "idle", "drain", "alloc".
    pub fn node_state(&self) -> Result<String> {
        Ok(self.node_states()?.remove(&self.node).unwrap_or_default())
    }

    /// The node's drain/down reason as `scontrol show node` prints it (without Slurm's
    /// `[user@time]` suffix); empty when it has none.
    pub fn node_reason(&self) -> Result<String> {
        let mut c = self.cmd("scontrol");
        c.args(["show", "node", &self.node]);
        let out = self.run(c)?;
        let text = String::from_utf8_lossy(&out.stdout);
        // `   Reason=text with spaces [root@2026-01-01T00:00:00]` on a line of its own.
        let reason = text
            .lines()
            .find_map(|l| l.trim_start().strip_prefix("Reason="))
            .unwrap_or("");
        let reason = match reason.rfind(" [") {
            Some(i) if reason.ends_with(']') => &reason[..i],
            _ => reason,
        };
        Ok(reason.trim().to_string())
    }

    /// Waits until the node is in one of the states `want`; returns it.
    pub fn wait_node_state(&self, want: &[&str], timeout: Duration) -> Result<String> {
        self.wait_nodes(&[&self.node], want, timeout)?;
        self.node_state()
    }

    /// Stops what this cluster started, by pid: jobs first (so Epilogs run), then slurmd,
    /// slurmctld, munged; then kills leftover job processes. Idempotent.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        self.cancel_all(Duration::from_secs(15));
        let r = self.daemons.stop();
        let cgroups = slurm_cgroups(
            &self.node,
            &["freezer", "pids", "memory", "cpuset", "devices", "unified"],
        );
        kill_leftover_jobs(&self.conf, &cgroups);
        r
    }
}

/// Copies a plugin into `dir` as `name`, readable and executable by every user.
fn install_plugin(so: &Path, dir: &Path, name: &str) -> Result<PathBuf> {
    let dest = dir.join(name);
    fs::copy(so, &dest).with_context(|| format!("copy {}", so.display()))?;
    fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;
    Ok(dest)
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("tenancy-e2e: {e}");
        }
    }
}
