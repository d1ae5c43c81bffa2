//! End-to-end harness for slurm-tenancy: a real single-node Slurm cluster (slurmctld + slurmd,
//! munge) started from a temp folder, with real users and groups, used by the e2e tests and by
//! the demo.
//!
//! * Everything it starts (munged if none was running, slurmctld, slurmd) it records by pid and
//!   stops by pid ([`Cluster::stop`], also on Drop); it never touches daemons it did not start.
//!   Leftover job processes (slurmstepd that carry this cluster's SLURM_CONF, and tasks in the
//!   node's Slurm cgroups) are killed at stop.
//! * One cluster at a time per machine: [`Cluster::start`] takes an exclusive `flock` on
//!   /run/tenancy-e2e.lock (the node's Slurm cgroups are named after the host).
//! * Every client call gets `SLURM_CONF` of this cluster; calls "as a user" drop to the user's
//!   uid, gid and groups in the child (no shell involved).

use anyhow::{anyhow, bail, ensure, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub mod accounting;
pub mod multi_node;
pub mod release_root;
pub mod sshd;
pub mod stack;
pub mod steer;
pub mod uml_node;
pub mod users;
pub use accounting::Accounting;
pub use release_root::SlurmRoot;
pub use users::{TestUser, Users};

/// Skips (returns false) when not root, panics under CI.
pub fn require_root(what: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{what}: needs root");
    }
    eprintln!("SKIP (needs root): {what}");
    false
}

/// What the cluster runs besides Slurm itself.
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
}

/// A running single-node cluster.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    pub node: String,
    pub partition: String,
    daemons: Vec<(String, Child)>,
    stopped: bool,
    /// The release root the cluster runs in, if not the host's Slurm.
    pub slurm_root: Option<SlurmRoot>,
    // Dropped after the daemons are stopped (Drop of Cluster), before the lock.
    _mounts: Option<release_root::RootMounts>,
    _lock: Flock<File>,
}

pub(crate) fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("0.0.0.0:0")?;
    Ok(l.local_addr()?.port())
}

pub(crate) fn hostname_short() -> Result<String> {
    let h = nix::unistd::gethostname()?;
    let h = h.to_string_lossy();
    Ok(h.split('.').next().unwrap_or_default().to_string())
}

pub(crate) fn write_file(path: &Path, text: &str, mode: u32) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("create {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

pub(crate) fn munge_works(root: Option<&SlurmRoot>) -> bool {
    let (mut munge, mut unmunge) = (Command::new("munge"), Command::new("unmunge"));
    if let Some(r) = root {
        r.enter(&mut munge);
        r.enter(&mut unmunge);
    }
    let Ok(mut m) = munge
        .arg("-n")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let cred = m.stdout.take();
    let Some(cred) = cred else { return false };
    let ok = unmunge
        .stdin(cred)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    let _ = m.wait();
    ok
}

pub(crate) fn spawn_daemon(name: &str, cmd: &mut Command, log: &Path) -> Result<Child> {
    let out = File::create(log)?;
    let err = out.try_clone()?;
    // SAFETY: setsid is async-signal-safe; the daemon gets its own session so that signals
    // to the test's terminal do not reach it and it cannot grab a controlling tty.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("start {name}"))
}

impl Cluster {
    /// Starts munge (if needed), slurmctld and slurmd, and waits until the node is idle.
    pub fn start(opts: ClusterOptions) -> Result<Cluster> {
        fs::create_dir_all("/run")?;
        let lock_file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/run/tenancy-e2e.lock")?;
        let lock = Flock::lock(lock_file, FlockArg::LockExclusive)
            .map_err(|(_, e)| anyhow!("flock /run/tenancy-e2e.lock: {e}"))?;

        let mounts = match &opts.slurm_root {
            Some(r) => Some(release_root::RootMounts::mount(r)?),
            None => None,
        };
        let dir = tempfile::Builder::new()
            .prefix("tenancy-e2e-")
            .tempdir_in(opts.folder_in.clone().unwrap_or_else(std::env::temp_dir))
            .context("temp dir")?;
        if opts.slurm_root.is_some() {
            ensure!(
                dir.path().starts_with(std::env::temp_dir()) || dir.path().starts_with("/var/tmp"),
                "a cluster in a Slurm release root needs its folder in the temp folder or /var/tmp \
                 (the root shares those), not {}",
                dir.path().display()
            );
        }
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
        let d = dir.path().to_path_buf();
        for sub in ["etc", "state", "spool", "log", "run", "lib", "jobs"] {
            fs::create_dir(d.join(sub))?;
        }
        fs::set_permissions(d.join("jobs"), fs::Permissions::from_mode(0o1777))?;
        let node = hostname_short()?;
        let mut cluster = Cluster {
            dir,
            conf: d.join("etc/slurm.conf"),
            node: node.clone(),
            partition: "debug".into(),
            daemons: Vec::new(),
            stopped: false,
            slurm_root: opts.slurm_root.clone(),
            _mounts: mounts,
            _lock: lock,
        };
        let root = opts.slurm_root.as_ref();

        if !munge_works(root) {
            let mut cmd = Command::new("munged");
            cmd.arg("--foreground");
            if let Some(r) = root {
                // The root's own munged, key and user (its ids are the root's).
                let (uid, gid) = r.user("munge")?;
                let run = r.dir.join("run/munge");
                fs::create_dir_all(&run)?;
                nix::unistd::chown(
                    &run,
                    Some(nix::unistd::Uid::from_raw(uid)),
                    Some(nix::unistd::Gid::from_raw(gid)),
                )?;
                fs::set_permissions(&run, fs::Permissions::from_mode(0o755))?;
                r.enter(&mut cmd);
                // SAFETY: setgroups/setgid/setuid are async-signal-safe; after the chroot.
                unsafe {
                    cmd.pre_exec(move || {
                        if libc::setgroups(0, std::ptr::null()) != 0
                            || libc::setgid(gid) != 0
                            || libc::setuid(uid) != 0
                        {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
            } else {
                fs::create_dir_all("/run/munge")?;
                let munge = nix::unistd::User::from_name("munge")?
                    .ok_or_else(|| anyhow!("no user munge: apt-get install munge"))?;
                nix::unistd::chown("/run/munge", Some(munge.uid), Some(munge.gid))?;
                fs::set_permissions("/run/munge", fs::Permissions::from_mode(0o755))?;
                cmd.uid(munge.uid.as_raw()).gid(munge.gid.as_raw());
            }
            let child = spawn_daemon("munged", &mut cmd, &d.join("log/munged.log"))?;
            cluster.daemons.push(("munged".into(), child));
            let t = Instant::now();
            while !munge_works(root) {
                if t.elapsed() > Duration::from_secs(10) {
                    bail!(
                        "munged did not answer within 10 s; see {}",
                        d.join("log/munged.log").display()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }

        let ctld_port = free_port()?;
        let mut slurmd_port = free_port()?;
        while slurmd_port == ctld_port {
            slurmd_port = free_port()?;
        }
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let p = |s: &str| d.join(s).display().to_string();
        let cluster_name = format!("tenancy{}", std::process::id());
        let dbd_port = match &opts.accounting {
            Some(_) => Some(free_port()?),
            None => None,
        };
        let mut conf = vec![
            format!("ClusterName={cluster_name}"),
            format!("SlurmctldHost={node}"),
            format!("SlurmctldPort={ctld_port}"),
            format!("SlurmdPort={slurmd_port}"),
            "SlurmUser=root".into(),
            "SlurmdUser=root".into(),
            "AuthType=auth/munge".into(),
            "CredType=cred/munge".into(),
            "SelectType=select/cons_tres".into(),
            "SelectTypeParameters=CR_Core".into(),
            "ProctrackType=proctrack/cgroup".into(),
            "TaskPlugin=task/cgroup".into(),
            "PrologFlags=Alloc,Contain".into(),
            "JobAcctGatherType=jobacct_gather/none".into(),
            "JobCompType=jobcomp/none".into(),
            "MpiDefault=none".into(),
            "MailProg=/bin/true".into(),
            "ReturnToService=2".into(),
            "SchedulerType=sched/backfill".into(),
            "SlurmctldTimeout=30".into(),
            "SlurmdTimeout=30".into(),
            "InactiveLimit=0".into(),
            "KillWait=5".into(),
            "SlurmctldDebug=info".into(),
            "SlurmdDebug=debug".into(),
            format!("StateSaveLocation={}", p("state")),
            format!("SlurmdSpoolDir={}", p("spool")),
            format!("SlurmctldPidFile={}", p("run/slurmctld.pid")),
            format!("SlurmdPidFile={}", p("run/slurmd.pid")),
            format!("SlurmctldLogFile={}", p("log/slurmctld.log")),
            format!("SlurmdLogFile={}", p("log/slurmd.log")),
        ];
        match (&opts.accounting, dbd_port) {
            (Some(a), Some(port)) => {
                conf.extend(a.conf_lines(&node, port));
                let gres = a.gres_conf(&node, &d.join("gres"))?;
                write_file(&d.join("etc/gres.conf"), &gres, 0o644)?;
            }
            _ => conf.push("AccountingStorageType=accounting_storage/none".into()),
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
                Some(_) => {
                    for name in [
                        program.file_name(),
                        Some(OsStr::new("tenancy-prolog-dynamic")),
                    ]
                    .into_iter()
                    .flatten()
                    {
                        let src = program.with_file_name(name);
                        if src.is_file() && !d.join("lib").join(name).exists() {
                            fs::copy(&src, d.join("lib").join(name))
                                .with_context(|| format!("copy {}", src.display()))?;
                        }
                    }
                    d.join("lib").join(program.file_name().unwrap_or_default())
                }
                None => program.clone(),
            };
            conf.push(format!("{key}={}", program.display()));
        }
        let plugstack = d.join("etc/plugstack.conf");
        let mut stack = String::new();
        if let Some(so) = &opts.spank_plugin {
            let dest = d.join("lib/libspank_tenancy.so");
            fs::copy(so, &dest).with_context(|| format!("copy {}", so.display()))?;
            fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;
            stack.push_str(&format!("required {}", dest.display()));
            if opts.tenancy_toml.is_some() {
                stack.push_str(&format!(" config={}", tenancy_path.display()));
            }
            stack.push('\n');
        }
        write_file(&plugstack, &stack, 0o644)?;
        conf.push(format!("PlugStackConfig={}", plugstack.display()));
        if let Some(so) = &opts.job_submit_plugin {
            let plugins = d.join("lib/plugins");
            fs::create_dir(&plugins)?;
            let dest = plugins.join("job_submit_tenancy.so");
            fs::copy(so, &dest).with_context(|| format!("copy {}", so.display()))?;
            fs::set_permissions(&dest, fs::Permissions::from_mode(0o755))?;
            let own = match root {
                Some(r) => r.plugin_dir()?,
                None => slurm_plugin_dir()?,
            };
            conf.push(format!("PluginDir={}:{}", own.display(), plugins.display()));
            conf.push("JobSubmitPlugins=tenancy".into());
        }
        conf.extend(opts.extra_conf.iter().cloned());
        for (name, text) in &opts.extra_files {
            write_file(&d.join("etc").join(name), text, 0o644)?;
        }
        let gres = opts
            .accounting
            .as_ref()
            .map(Accounting::node_gres)
            .unwrap_or_default();
        conf.push(format!(
            "NodeName={node} CPUs={cpus} RealMemory=1000 State=UNKNOWN{gres}"
        ));
        conf.push(format!(
            "PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
        ));
        write_file(&cluster.conf, &(conf.join("\n") + "\n"), 0o644)?;
        // Newer releases' cgroup/v2 refuses this hybrid host ("Hybrid mode is not supported"),
        // and their autodetect picks it: name v1.
        let cgroup_plugin = if root.is_some() {
            "cgroup/v1"
        } else {
            "autodetect"
        };
        write_file(
            &d.join("etc/cgroup.conf"),
            &format!(
                "CgroupPlugin={cgroup_plugin}\nConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n"
            ),
            0o644,
        )?;

        if let (Some(_), Some(port)) = (&opts.accounting, dbd_port) {
            accounting::start(
                &mut cluster.daemons,
                &d,
                &node,
                &cluster.conf,
                &cluster_name,
                port,
            )?;
        }
        let mut ctld = Command::new("slurmctld");
        ctld.args(["-D", "-i"]).env("SLURM_CONF", &cluster.conf);
        if let Some(r) = root {
            r.enter(&mut ctld);
        }
        let c = spawn_daemon("slurmctld", &mut ctld, &d.join("log/slurmctld.out"))?;
        cluster.daemons.push(("slurmctld".into(), c));
        let mut slurmd = Command::new("slurmd");
        slurmd.arg("-D").env("SLURM_CONF", &cluster.conf);
        if let Some(r) = root {
            r.enter(&mut slurmd);
        }
        let s = spawn_daemon("slurmd", &mut slurmd, &d.join("log/slurmd.out"))?;
        cluster.daemons.push(("slurmd".into(), s));
        cluster.wait_node_state(&["idle"], Duration::from_secs(30))?;
        Ok(cluster)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A client command (sinfo, sbatch, scontrol ...) as root with this cluster's SLURM_CONF.
    /// In a release root ([`ClusterOptions::slurm_root`]) the command runs in the root.
    pub fn cmd(&self, program: impl AsRef<OsStr>) -> Command {
        self.client(Command::new(program))
    }

    /// [`Self::cmd`] of a command made elsewhere (whose own `pre_exec` steps run first).
    pub fn client(&self, mut c: Command) -> Command {
        c.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("SLURM_CONF", &self.conf)
            .current_dir(self.dir.path());
        if let Some(r) = &self.slurm_root {
            r.enter(&mut c);
        }
        c
    }

    /// A client command run as `user` (its uid, primary gid and all its groups), with a clean
    /// environment and this cluster's SLURM_CONF; cwd is the user's job folder.
    pub fn cmd_as(&self, user: &TestUser, program: impl AsRef<OsStr>) -> Command {
        self.as_user(Command::new(program), user)
    }

    /// [`Self::cmd_as`] of a command made elsewhere (whose own `pre_exec` steps run first).
    pub fn as_user(&self, c: Command, user: &TestUser) -> Command {
        let mut c = self.client(c);
        let home = self.user_dir(user);
        c.env("HOME", &home)
            .env("USER", &user.name)
            .env("LOGNAME", &user.name)
            .current_dir(&home);
        let (uid, gid, groups) = (user.uid, user.gid, user.gids.clone());
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            c.pre_exec(move || {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c
    }

    /// A user's way around the submit-side check: in their own folder, a SPANK plugin of their
    /// own (tests/src/own_spank.c, built with gcc) that hands the job whatever tenant and MIG
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
        if let Some(root) = &self.slurm_root {
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

    /// The user's own folder under the cluster folder (created on demand, owned by the user).
    pub fn user_dir(&self, user: &TestUser) -> PathBuf {
        let p = self.path("jobs").join(&user.name);
        if !p.exists() {
            let _ = fs::create_dir(&p);
            let _ = nix::unistd::chown(
                &p,
                Some(nix::unistd::Uid::from_raw(user.uid)),
                Some(nix::unistd::Gid::from_raw(user.gid)),
            );
            let _ = fs::set_permissions(&p, fs::Permissions::from_mode(0o755));
        }
        p
    }

    pub fn run(&self, mut cmd: Command) -> Result<Output> {
        let out = cmd.output().with_context(|| format!("run {cmd:?}"))?;
        Ok(out)
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
    /// with `args` (stdout piped), so a caller can adopt it before it acts.
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
            .arg(r#"go=$1; shift; while [ ! -e "$go" ]; do sleep 0.05; done; exec "$@""#)
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
        let mut c = self.cmd("sinfo");
        c.args(["-h", "-N", "-o", "%t"]);
        let out = self.run(c)?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
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

    pub fn wait_node_state(&self, want: &[&str], timeout: Duration) -> Result<String> {
        let t = Instant::now();
        loop {
            let s = self.node_state().unwrap_or_default();
            if want.iter().any(|w| s == *w) {
                return Ok(s);
            }
            if t.elapsed() > timeout {
                bail!(
                    "node {} is '{}' after {:?}, wanted {:?}; logs in {}",
                    self.node,
                    s,
                    timeout,
                    want,
                    self.path("log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `scontrol show job -o ID` as key=value pairs.
    pub fn job_info(&self, id: u64) -> Result<BTreeMap<String, String>> {
        let mut c = self.cmd("scontrol");
        c.args(["show", "job", "-o", &id.to_string()]);
        let out = self.run(c)?;
        if !out.status.success() {
            bail!(
                "scontrol show job {id}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(parse_kv(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Waits until the job's JobState is one of `states`; returns the job info.
    pub fn wait_job(
        &self,
        id: u64,
        states: &[&str],
        timeout: Duration,
    ) -> Result<BTreeMap<String, String>> {
        let t = Instant::now();
        loop {
            let info = self.job_info(id)?;
            let st = info.get("JobState").cloned().unwrap_or_default();
            if states.iter().any(|s| *s == st) {
                return Ok(info);
            }
            if t.elapsed() > timeout {
                bail!("job {id} is {st} after {timeout:?}, wanted {states:?}: {info:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until a job has ended (any final state).
    pub fn wait_job_done(&self, id: u64, timeout: Duration) -> Result<BTreeMap<String, String>> {
        self.wait_job(
            id,
            &[
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT",
                "NODE_FAIL",
                "OUT_OF_MEMORY",
                "BOOT_FAIL",
                "DEADLINE",
                "PREEMPTED",
            ],
            timeout,
        )
    }

    /// Stops what this cluster started, by pid: jobs first (so Epilogs run), then slurmd,
    /// slurmctld, munged; then kills leftover job processes. Idempotent.
    pub fn stop(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        let mut c = self.cmd("scancel");
        c.args(["--full", "--partition", &self.partition]);
        let _ = c.output();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(15) {
            let mut q = self.cmd("squeue");
            q.args(["-h", "-o", "%i"]);
            match q.output() {
                Ok(o) if o.status.success() && o.stdout.iter().all(|b| b.is_ascii_whitespace()) => {
                    break
                }
                Ok(_) => {}
                Err(_) => break,
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut errors = Vec::new();
        while let Some((name, mut child)) = self.daemons.pop() {
            if let Err(e) = stop_child(&mut child) {
                errors.push(format!("{name} (pid {}): {e}", child.id()));
            }
        }
        self.kill_leftover_jobs();
        if errors.is_empty() {
            Ok(())
        } else {
            bail!("stopping daemons: {}", errors.join("; "))
        }
    }

    /// slurmstepd processes started by this cluster's slurmd, and tasks left in the node's
    /// Slurm cgroups.
    fn kill_leftover_jobs(&self) {
        let marker = format!("SLURM_CONF={}", self.conf.display());
        if let Ok(rd) = fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                let cmd = fs::read(e.path().join("cmdline")).unwrap_or_default();
                if !cmd.starts_with(b"slurmstepd") {
                    continue;
                }
                let env = fs::read(e.path().join("environ")).unwrap_or_default();
                if env.split(|b| *b == 0).any(|kv| kv == marker.as_bytes()) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
        for ctrl in ["freezer", "pids", "memory", "cpuset", "devices", "unified"] {
            let root = Path::new("/sys/fs/cgroup")
                .join(ctrl)
                .join(format!("slurm_{}", self.node));
            for procs in find_files(&root, "cgroup.procs") {
                for pid in fs::read_to_string(&procs).unwrap_or_default().lines() {
                    if let Ok(pid) = pid.trim().parse::<i32>() {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
            }
        }
    }
}

pub(crate) fn find_files(root: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if ft.is_dir() && !ft.is_symlink() {
                stack.push(e.path());
            } else if e.file_name() == name {
                out.push(e.path());
            }
        }
    }
    out
}

pub(crate) fn stop_child(child: &mut Child) -> Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    let pid = Pid::from_raw(i32::try_from(child.id())?);
    let _ = kill(pid, Signal::SIGTERM);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(10) {
        if child.try_wait()?.is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = kill(pid, Signal::SIGKILL);
    child.wait()?;
    Ok(())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("tenancy-e2e: {e}");
        }
        if std::env::var_os("TENANCY_E2E_KEEP").is_some() {
            let p = self.dir.path().to_path_buf();
            eprintln!("tenancy-e2e: keeping {}", p.display());
            // Leak the folder on purpose for debugging.
            let d = std::mem::replace(&mut self.dir, tempfile::TempDir::new().expect("tmp"));
            let _ = d.keep();
        }
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

/// Where cargo put this build's artifacts (target/<profile>), from the running executable.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let mut d = exe.parent().expect("exe dir").to_path_buf();
    if d.ends_with("deps") || d.ends_with("examples") {
        d.pop();
    }
    d
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
    if let Some(dir) = std::env::var_os("TENANCY_JOB_PATH_DIR") {
        if ["tenancy-prolog", "tenancy-epilog", "tenancy-prolog-dynamic"].contains(&name) {
            let p = PathBuf::from(dir).join(name);
            ensure!(p.is_file(), "TENANCY_JOB_PATH_DIR has no {}", p.display());
            return Ok(p);
        }
    }
    let t = target_dir();
    for p in [t.join(name), t.join("deps").join(name)] {
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "{name} not found in {} (build it first: cargo build --workspace, same profile and CARGO_TARGET_DIR)",
        t.display()
    )
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
