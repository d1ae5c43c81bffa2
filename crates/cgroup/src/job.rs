//! `<root>/tenancy/<tenant>/job_<id>`: made without following a symlink, joined by writing a
//! pid into `cgroup.procs`, emptied with `cgroup.kill` (or SIGKILL through pidfds where the
//! kernel has no `cgroup.kill`: cgroup v1, Linux before 5.14), removed with rmdir.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Name of the product's subtree under a cgroup root.
pub const PRODUCT_DIR: &str = "tenancy";

/// A cgroup operation that failed: what, on which path, and why (with a hint where one helps).
#[derive(Debug)]
pub struct CgroupError {
    pub op: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

impl CgroupError {
    /// Why it failed, with what to do where that helps (without the operation and path).
    pub fn reason(&self) -> String {
        if self.op == "rmdir" && self.source.raw_os_error() == Some(libc::EBUSY) {
            format!(
                "{}: processes are still in the cgroup (see its cgroup.procs); end them, then \
                 retry teardown",
                self.source
            )
        } else {
            self.source.to_string()
        }
    }

    /// The error as an `io::Error` of the same kind carrying [`CgroupError::reason`].
    pub fn into_io(self) -> io::Error {
        io::Error::new(self.source.kind(), self.reason())
    }
}

impl std::fmt::Display for CgroupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.op, self.path.display(), self.reason())
    }
}

impl std::error::Error for CgroupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn err(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> CgroupError {
    CgroupError {
        op,
        path: path.into(),
        source,
    }
}

/// One job's cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCgroup {
    pub dir: PathBuf,
}

/// What [`JobCgroup::make`] did.
#[derive(Debug)]
pub struct Made {
    pub cgroup: JobCgroup,
    /// The job directory did not exist before.
    pub created: bool,
    /// The job directory, open (a device program is attached through it without a new walk).
    pub dir: OwnedFd,
}

/// The job's cgroup path under `root` (a cgroup2 mount or a v1 controller's mount).
pub fn job_dir(root: &Path, tenant: &str, job_id: u64) -> PathBuf {
    root.join(PRODUCT_DIR)
        .join(tenant)
        .join(format!("job_{job_id}"))
}

fn open_dir(path: &Path) -> Result<OwnedFd, CgroupError> {
    rustix::fs::open(
        path,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| err("open", path, e.into()))
}

/// `mkdirat` + `openat(O_NOFOLLOW)` of one component: an existing directory is reused, a
/// symlink or file in its place is refused.
fn mkdir_at(dir: &OwnedFd, name: &str, shown: &Path) -> Result<(OwnedFd, bool), CgroupError> {
    let path = shown.join(name);
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(err(
            "mkdir",
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "not a plain cgroup name"),
        ));
    }
    let c = CString::new(name).map_err(|_| {
        err(
            "mkdir",
            shown.join(name),
            io::Error::new(io::ErrorKind::InvalidInput, "contains NUL"),
        )
    })?;
    // SAFETY: dir is an open directory fd, c is NUL-terminated.
    let created = if unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) } == 0 {
        true
    } else {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(err("mkdir", path, e));
        }
        false
    };
    // SAFETY: as above; O_NOFOLLOW: never through a symlink.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(err("open", path, io::Error::last_os_error()));
    }
    // SAFETY: a fresh fd we own.
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, created))
}

impl JobCgroup {
    /// The job's cgroup under `root`, without touching it.
    pub fn at(root: &Path, tenant: &str, job_id: u64) -> JobCgroup {
        JobCgroup {
            dir: job_dir(root, tenant, job_id),
        }
    }

    /// Makes `<root>/tenancy/<tenant>/job_<id>` (existing parts reused), component by
    /// component, never through a symlink. The tenant name is the caller's to validate.
    pub fn make(root: &Path, tenant: &str, job_id: u64) -> Result<Made, CgroupError> {
        JobCgroup::make_in(root, PRODUCT_DIR, tenant, job_id)
    }

    /// [`JobCgroup::make`] under another subtree of `root` (`a/b`: tests keep to their own).
    pub fn make_in(
        root: &Path,
        subtree: &str,
        tenant: &str,
        job_id: u64,
    ) -> Result<Made, CgroupError> {
        let mut fd = open_dir(root)?;
        let mut shown = root.to_path_buf();
        for c in subtree.split('/').chain([tenant]) {
            fd = mkdir_at(&fd, c, &shown)?.0;
            shown.push(c);
        }
        let (dir, created) = mkdir_at(&fd, &format!("job_{job_id}"), &shown)?;
        Ok(Made {
            cgroup: JobCgroup {
                dir: shown.join(format!("job_{job_id}")),
            },
            created,
            dir,
        })
    }

    /// Puts process `pid` (all its threads) into the cgroup.
    pub fn join(&self, pid: i32) -> Result<(), CgroupError> {
        join(&self.dir, pid)
    }

    /// The pids in it (none when it is gone).
    pub fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        pids_in(&self.dir)
    }

    /// Ends every process in it and waits until none is left (up to `wait`); see [`end_all`].
    pub fn end_all(&self, wait: Duration) -> Result<(), CgroupError> {
        end_all(&self.dir, wait)
    }

    /// Removes the directory; Ok(false) when it was already gone. EBUSY (processes left) is
    /// an error whose text says so.
    pub fn remove(&self) -> Result<bool, CgroupError> {
        remove(&self.dir)
    }
}

/// Puts process `pid` into the cgroup `dir`.
pub fn join(dir: &Path, pid: i32) -> Result<(), CgroupError> {
    std::fs::write(dir.join("cgroup.procs"), pid.to_string()).map_err(|e| {
        err(
            "move a process into",
            dir,
            io::Error::new(e.kind(), format!("pid {pid}: {e}")),
        )
    })
}

/// The pids in `dir` (none when it is gone).
pub fn pids_in(dir: &Path) -> Result<Vec<i32>, CgroupError> {
    match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(s) => Ok(s
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(err("read", dir.join("cgroup.procs"), e)),
    }
}

/// Removes `dir`; Ok(false) when it was already gone.
pub fn remove(dir: &Path) -> Result<bool, CgroupError> {
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(err("rmdir", dir, e)),
    }
}

/// Kills every process in `dir` and waits until none is left. cgroup v2 (Linux 5.14+) kills
/// them all at once with `cgroup.kill`, forks in flight included; elsewhere each process is
/// signalled, round after round, through a pidfd taken only while it is still in the cgroup
/// (a pid read from cgroup.procs may have exited and been reused). After `wait` the pids left
/// are the error.
pub fn end_all(dir: &Path, wait: Duration) -> Result<(), CgroupError> {
    // Most jobs leave nothing behind: one read.
    if pids_in(dir)?.is_empty() {
        return Ok(());
    }
    let whole = std::fs::write(dir.join("cgroup.kill"), "1").is_ok();
    let deadline = Instant::now() + wait;
    loop {
        let pids = pids_in(dir)?;
        if pids.is_empty() {
            return Ok(());
        }
        if !whole {
            for pid in &pids {
                if let Some(fd) = pidfd_if_in(*pid, dir) {
                    let _ = rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL);
                }
            }
        }
        if Instant::now() >= deadline {
            let pids: Vec<String> = pids.iter().map(i32::to_string).collect();
            return Err(err(
                "end the processes of",
                dir,
                io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!("processes [{}] still there after SIGKILL", pids.join(" ")),
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Ends what is left in `dir`, then removes it; Ok(false) when it was already gone.
pub fn end_and_remove(dir: &Path, wait: Duration) -> Result<bool, CgroupError> {
    match remove(dir) {
        Err(e) if e.source.raw_os_error() == Some(libc::EBUSY) => {
            end_all(dir, wait)?;
            remove(dir)
        }
        other => other,
    }
}

/// A pidfd of `pid` if that process is in the cgroup `dir`: the pidfd holds one process, so
/// if /proc/<pid> then shows it in the cgroup, it is.
pub fn pidfd_if_in(pid: i32, dir: &Path) -> Option<OwnedFd> {
    use rustix::process::{pidfd_open, Pid, PidfdFlags};
    let fd = pidfd_open(Pid::from_raw(pid)?, PidfdFlags::empty()).ok()?;
    let inside = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|s| {
        s.lines().any(|l| {
            let rel = l.splitn(3, ':').nth(2).unwrap_or_default();
            rel.len() > 1 && dir.ends_with(rel.trim_start_matches('/'))
        })
    });
    inside.then_some(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid listed in a cgroup it is not in (exited, and the number reused by another
    /// process) is not signalled; a cgroup that stays busy fails with its pids, never Ok.
    #[test]
    fn a_cgroup_that_stays_busy_fails_and_a_process_outside_it_is_not_signalled() {
        let t = tempfile::tempdir().unwrap();
        let me = std::process::id();
        std::fs::write(t.path().join("cgroup.procs"), format!("{me}\n")).unwrap();
        // No cgroup.kill to write: each pid is signalled only if it is in the cgroup.
        std::fs::create_dir(t.path().join("cgroup.kill")).unwrap();
        let e = end_all(t.path(), Duration::from_millis(30)).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("processes [{me}] still there")),
            "{e}"
        );
        // (this test process is still alive)
        std::fs::write(t.path().join("cgroup.procs"), "").unwrap();
        end_all(t.path(), Duration::from_millis(30)).unwrap();
        end_all(&t.path().join("gone"), Duration::from_millis(30)).unwrap();
    }

    #[test]
    fn make_reuses_what_exists_and_never_follows_a_symlink() {
        let t = tempfile::tempdir().unwrap();
        let m = JobCgroup::make(t.path(), "acme", 7).unwrap();
        assert!(m.created);
        assert_eq!(m.cgroup.dir, t.path().join("tenancy/acme/job_7"));
        assert!(!JobCgroup::make(t.path(), "acme", 7).unwrap().created);
        std::os::unix::fs::symlink("/tmp", t.path().join("tenancy/evil")).unwrap();
        let e = JobCgroup::make(t.path(), "evil", 1).unwrap_err();
        assert_eq!(e.op, "open", "{e}");
        assert!(!Path::new("/tmp/job_1").exists() || !m.cgroup.dir.starts_with("/tmp"));
        assert!(JobCgroup::make(t.path(), "..", 1).is_err());
        assert!(m.cgroup.remove().unwrap());
        assert!(!m.cgroup.remove().unwrap());
    }
}
