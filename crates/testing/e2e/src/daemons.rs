//! What every cluster here does with the processes it starts: the machine-wide e2e lock, daemons
//! in sessions of their own stopped by pid, munge when none answers, and the leftovers of jobs.

use crate::SlurmRoot;
use anyhow::{anyhow, bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The lock every real-Slurm test of this machine takes (the nodes' Slurm cgroups are named
/// after the host, and other engineers' tests run here too).
pub const LOCK: &str = "/run/tenancy-e2e.lock";

/// Waits for and holds [`LOCK`] (released when dropped).
pub(crate) fn machine_lock() -> Result<Flock<File>> {
    fs::create_dir_all("/run")?;
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK)?;
    Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| anyhow!("flock {LOCK}: {e}"))
}

/// Daemons a cluster started, stopped by pid in the reverse order (also on Drop).
#[derive(Default)]
pub(crate) struct Daemons(Vec<(String, Child)>);

impl Daemons {
    /// Starts `cmd` in a session of its own (signals to the test's terminal do not reach it, it
    /// cannot take a controlling tty), stdout and stderr to `log`.
    pub fn spawn(&mut self, name: &str, cmd: &mut Command, log: &Path) -> Result<()> {
        let child = spawn_daemon(name, cmd, log)?;
        self.0.push((name.to_string(), child));
        Ok(())
    }

    pub fn pid_of(&self, name: &str) -> Option<u32> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, c)| c.id())
    }

    /// SIGKILLs the daemon `name` and reaps it (a crash, for the fault tests); false when
    /// there is none of that name.
    pub fn kill(&mut self, name: &str) -> bool {
        let Some(i) = self.0.iter().position(|(n, _)| n == name) else {
            return false;
        };
        let (_, mut child) = self.0.remove(i);
        let _ = child.kill();
        let _ = child.wait();
        true
    }

    /// Stops every daemon (SIGTERM, SIGKILL after 10 s), newest first; says which failed.
    pub fn stop(&mut self) -> Result<()> {
        let mut errors = Vec::new();
        while let Some((name, mut child)) = self.0.pop() {
            if let Err(e) = stop_child(&mut child) {
                errors.push(format!("{name} (pid {}): {e}", child.id()));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            bail!("stopping daemons: {}", errors.join("; "))
        }
    }
}

impl Drop for Daemons {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("tenancy-e2e: {e}");
        }
    }
}

pub(crate) fn spawn_daemon(name: &str, cmd: &mut Command, log: &Path) -> Result<Child> {
    // Appended: a daemon started again (after a fault) keeps its earlier log.
    let out = File::options().create(true).append(true).open(log)?;
    let err = out.try_clone()?;
    // SAFETY: setsid is async-signal-safe.
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

/// Stops `child` by pid: SIGTERM, SIGKILL after 10 s. Idempotent.
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

/// Whether munge answers (`munge -n | unmunge`), in `root` when given.
fn munge_works(root: Option<&SlurmRoot>) -> bool {
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
    let Some(cred) = m.stdout.take() else {
        return false;
    };
    let ok = unmunge
        .stdin(cred)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let _ = m.wait();
    ok
}

/// Starts munged (the root's own, with its key and user, in a release root) unless one
/// answers already, and waits until it does. Its socket is a file: every namespace reaches it.
pub(crate) fn ensure_munge(
    daemons: &mut Daemons,
    root: Option<&SlurmRoot>,
    log: &Path,
) -> Result<()> {
    if munge_works(root) {
        return Ok(());
    }
    let mut cmd = Command::new("munged");
    cmd.arg("--foreground");
    let (uid, gid, run) = match root {
        Some(r) => {
            let (uid, gid) = r.user("munge")?;
            (uid, gid, r.dir.join("run/munge"))
        }
        None => {
            let munge = nix::unistd::User::from_name("munge")?
                .ok_or_else(|| anyhow!("no user munge: apt-get install munge"))?;
            (
                munge.uid.as_raw(),
                munge.gid.as_raw(),
                PathBuf::from("/run/munge"),
            )
        }
    };
    fs::create_dir_all(&run)?;
    nix::unistd::chown(
        &run,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )?;
    fs::set_permissions(&run, fs::Permissions::from_mode(0o755))?;
    if let Some(r) = root {
        r.enter(&mut cmd);
    }
    // After the chroot, in a root.
    tenancy_test_support::run_as(&mut cmd, uid, gid, Vec::new());
    daemons.spawn("munged", &mut cmd, log)?;
    let t = Instant::now();
    while !munge_works(root) {
        if t.elapsed() > Duration::from_secs(10) {
            bail!("munged did not answer within 10 s; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Kills what jobs of the cluster at `conf` left: slurmstepd processes carrying its
/// SLURM_CONF, and every process in the cgroup trees `roots`.
pub(crate) fn kill_leftover_jobs(conf: &Path, roots: &[PathBuf]) {
    let marker = format!("SLURM_CONF={}", conf.display());
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
    for root in roots {
        for procs in find_files(root, "cgroup.procs") {
            for pid in fs::read_to_string(&procs).unwrap_or_default().lines() {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
    }
}

/// Slurm's own cgroups of node `node` on this hybrid host, in each v1 controller it uses
/// (and the v2 tree, `unified`).
pub(crate) fn slurm_cgroups(node: &str, controllers: &[&str]) -> Vec<PathBuf> {
    controllers
        .iter()
        .map(|c| {
            Path::new("/sys/fs/cgroup")
                .join(c)
                .join(format!("slurm_{node}"))
        })
        .collect()
}

fn find_files(root: &Path, name: &str) -> Vec<PathBuf> {
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

/// A TCP port nothing listens on now (on every address).
pub fn free_port() -> Result<u16> {
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

/// A cluster's folder: `prefix` in `parent` (the temp folder by default), 0755, with the
/// sub-folders `subs`; `jobs/` is 1777 (every user's job folder is made there).
pub(crate) fn cluster_folder(
    prefix: &str,
    parent: Option<&Path>,
    subs: &[&str],
) -> Result<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(
            parent
                .map(Path::to_path_buf)
                .unwrap_or_else(std::env::temp_dir),
        )
        .context("temp dir")?;
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755))?;
    for sub in subs {
        fs::create_dir(dir.path().join(sub))?;
    }
    fs::set_permissions(dir.path().join("jobs"), fs::Permissions::from_mode(0o1777))?;
    Ok(dir)
}
