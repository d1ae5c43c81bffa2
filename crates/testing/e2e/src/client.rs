//! The Slurm client of a test cluster, single- or multi-node: every command gets the cluster's
//! SLURM_CONF and a clean environment, reaches the cluster where it runs (the host, a release
//! root, the controller's network namespace), and runs "as a user" with that user's uid, gid and
//! groups (set in the child: no shell, no su).

use crate::{parse_kv, SlurmRoot, TestUser};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::ffi::{CString, OsStr};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Where a command must run to reach the cluster.
#[derive(Clone, Debug)]
pub(crate) enum Entry {
    /// This machine's own Slurm.
    Host,
    /// A release root (release_root.rs): chroot'ed.
    Root(SlurmRoot),
    /// Network namespaces to join (`/run/netns/NAME`, `/proc/PID/ns/net` ...), with the kind
    /// of each (`CLONE_NEWNET`, ...), in that order.
    Namespaces(Vec<(PathBuf, libc::c_int)>),
}

impl Entry {
    pub fn enter(&self, cmd: &mut Command) {
        match self {
            Entry::Host => {}
            Entry::Root(r) => r.enter(cmd),
            Entry::Namespaces(ns) => enter_namespaces(cmd, ns),
        }
    }
}

/// `setns` into each namespace in the child, before exec (and before a drop to a user). Every
/// namespace file is opened before the first `setns`.
pub(crate) fn enter_namespaces(cmd: &mut Command, ns: &[(PathBuf, libc::c_int)]) {
    let ns: Vec<(CString, libc::c_int)> = ns
        .iter()
        .map(|(p, kind)| {
            let p = CString::new(p.as_os_str().as_encoded_bytes()).expect("path without NUL");
            (p, *kind)
        })
        .collect();
    let mut fds = vec![-1; ns.len()];
    // SAFETY: open, setns and close are async-signal-safe; the buffers were allocated before
    // the fork.
    unsafe {
        cmd.pre_exec(move || {
            for (i, (path, _)) in ns.iter().enumerate() {
                fds[i] = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fds[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, (_, kind)) in ns.iter().enumerate() {
                if libc::setns(fds[i], *kind) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fds[i]);
            }
            Ok(())
        });
    }
}

/// Drops the child to `user`: its groups, primary gid and uid.
pub(crate) fn drop_to(cmd: &mut Command, user: &TestUser) {
    tenancy_test_support::run_as(cmd, user.uid, user.gid, user.gids.clone());
}

/// Final job states (`wait_job_done`).
const DONE: [&str; 9] = [
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
];

/// The client side of one cluster: its folder (configs, logs, the users' job folders), its
/// slurm.conf, and where its commands run.
pub struct Client {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    pub partition: String,
    pub(crate) entry: Entry,
}

impl Client {
    pub(crate) fn new(dir: tempfile::TempDir, entry: Entry) -> Client {
        Client {
            conf: dir.path().join("etc/slurm.conf"),
            dir,
            partition: "debug".into(),
            entry,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The release root the cluster runs in, if not the host's Slurm.
    pub fn slurm_root(&self) -> Option<&SlurmRoot> {
        match &self.entry {
            Entry::Root(r) => Some(r),
            _ => None,
        }
    }

    /// A client command (sinfo, sbatch, scontrol ...) as root with this cluster's SLURM_CONF,
    /// where the cluster runs, cwd the cluster's folder.
    pub fn cmd(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("SLURM_CONF", &self.conf)
            .current_dir(self.dir.path());
        self.entry.enter(&mut c);
        c
    }

    /// [`Self::cmd`] run as `user` (its uid, primary gid and all its groups), HOME and cwd its
    /// job folder.
    pub fn cmd_as(&self, user: &TestUser, program: impl AsRef<OsStr>) -> Command {
        let mut c = self.cmd(program);
        let home = self.user_dir(user);
        c.env("HOME", &home)
            .env("USER", &user.name)
            .env("LOGNAME", &user.name)
            .current_dir(&home);
        drop_to(&mut c, user);
        c
    }

    pub fn run(&self, mut cmd: Command) -> Result<Output> {
        cmd.output().with_context(|| format!("run {cmd:?}"))
    }

    /// The user's own folder under the cluster's (made on demand, owned by the user; every
    /// node sees it).
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

    /// `sbatch ARGS --no-requeue -o /dev/null sleep.sh SECS` as `user`: a job that holds what
    /// it was given for `secs` seconds and does nothing else (scripts/jobs/sleep.sh), for a
    /// test of where and when jobs run; sbatch's output as it came.
    pub fn sbatch_sleep(&self, user: &TestUser, args: &[&str], secs: u32) -> Result<Output> {
        let script = self.user_dir(user).join("sleep.sh");
        fs::write(&script, include_str!("../scripts/jobs/sleep.sh"))
            .with_context(|| format!("write {}", script.display()))?;
        let mut c = self.cmd_as(user, "sbatch");
        c.args(args)
            .args(["--no-requeue", "-o", "/dev/null"])
            .arg(&script)
            .arg(secs.to_string());
        self.run(c)
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
                bail!(
                    "job {id} is {st} after {timeout:?}, wanted {states:?}: {info:?}; logs in {}",
                    self.path("log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until a job has ended (any final state).
    pub fn wait_job_done(&self, id: u64, timeout: Duration) -> Result<BTreeMap<String, String>> {
        self.wait_job(id, &DONE, timeout)
    }

    /// Each node's `sinfo` state (`idle`, `drain`, `alloc` ...), by node name.
    pub fn node_states(&self) -> Result<BTreeMap<String, String>> {
        let mut c = self.cmd("sinfo");
        c.args(["-h", "-N", "-o", "%N %t"]);
        let out = self.run(c)?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(n, s)| (n.to_string(), s.trim().to_string()))
            .collect())
    }

    /// Waits until all `nodes` are in one of the states `want`.
    pub fn wait_nodes(&self, nodes: &[&str], want: &[&str], timeout: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            let states = self.node_states().unwrap_or_default();
            let ok = |n: &&str| states.get(*n).is_some_and(|s| want.contains(&s.as_str()));
            if nodes.iter().all(ok) {
                return Ok(());
            }
            if t.elapsed() > timeout {
                bail!(
                    "nodes {nodes:?} are {states:?} after {timeout:?}, wanted {want:?}; logs in {}",
                    self.path("log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Cancels every job (so their epilogs run) and waits up to `timeout` for the queue to
    /// empty (or the controller to stop answering).
    pub(crate) fn cancel_all(&self, timeout: Duration) {
        let mut c = self.cmd("scancel");
        c.args(["--full", "--partition", &self.partition]);
        let _ = c.output();
        let t = Instant::now();
        while t.elapsed() < timeout {
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
    }

    /// Waits until `path` holds a line starting with `prefix`; returns the file's text.
    pub fn wait_file_line(&self, path: &Path, prefix: &str, timeout: Duration) -> Result<String> {
        crate::wait_line(path, prefix, timeout)
            .with_context(|| format!("logs in {}", self.path("log").display()))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if std::env::var_os("TENANCY_E2E_KEEP").is_some() {
            // Leak the folder on purpose for debugging.
            let d = std::mem::replace(&mut self.dir, tempfile::TempDir::new().expect("tmp"));
            eprintln!("tenancy-e2e: keeping {}", d.path().display());
            let _ = d.keep();
        }
    }
}
