//! Slurm's own job cgroups on a pure cgroup v2 node (its cgroup/v2 plugin): where the
//! product anchors a job's isolation instead of moving its processes (ARCHITECTURE.md, "Pure
//! cgroup v2 nodes"). Slurm keeps every process of a job under
//! `<scope>/job_<id>/step_*/{slurm,user/task_*}`, where `<scope>` is slurmd's
//! `[<node>_]slurmstepd.scope` (under `system.slice` without systemd, `IgnoreSystemd=yes`, and
//! with it). Its memory and CPU limits live there, so processes stay there; the device program
//! and the firewall find the job by its ancestor at the job's level.

use serde::{Deserialize, Serialize};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::layout::is_cgroup2;

/// Where Slurm's cgroup/v2 plugin puts slurmstepd and everything of its jobs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmScope {
    /// The cgroup2 mount (`/sys/fs/cgroup`).
    pub v2_mount: PathBuf,
    /// The scope relative to the mount: `system.slice/<node>_slurmstepd.scope`.
    pub rel: String,
}

/// The cgroup level of Slurm's job folders: `system.slice/<scope>/<job>`.
pub const JOB_LEVEL: u32 = 3;

/// The name Slurm gives the scope, after an optional `<node>_` prefix (Slurm built with
/// multiple-slurmd support, as Debian's is).
const SCOPE_SUFFIX: &str = "slurmstepd.scope";

impl SlurmScope {
    /// Slurm's scope on this node when the node is pure cgroup v2 (cgroup2 mounted at
    /// `/sys/fs/cgroup`) and slurmd made it (Slurm's cgroup/v2 plugin is in use); `node` picks
    /// `<node>_slurmstepd.scope` where there are several.
    pub fn detect(node: Option<&str>) -> Option<SlurmScope> {
        Self::detect_in(Path::new("/sys/fs/cgroup"), node)
    }

    /// [`SlurmScope::detect`] with cgroup2 at `v2_mount` (tests).
    pub fn detect_in(v2_mount: &Path, node: Option<&str>) -> Option<SlurmScope> {
        if !is_cgroup2(v2_mount) {
            return None;
        }
        let slice = v2_mount.join("system.slice");
        let mut found: Vec<String> = std::fs::read_dir(&slice)
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.ends_with(SCOPE_SUFFIX))
            .collect();
        found.sort();
        let pick = match node {
            Some(n) if found.len() > 1 => found
                .iter()
                .find(|s| s.strip_suffix(SCOPE_SUFFIX) == Some(&format!("{n}_")))
                .cloned(),
            _ if found.len() == 1 => found.pop(),
            _ => None,
        }?;
        Some(SlurmScope {
            v2_mount: v2_mount.to_path_buf(),
            rel: format!("system.slice/{pick}"),
        })
    }

    /// The scope's folder.
    pub fn dir(&self) -> PathBuf {
        self.v2_mount.join(&self.rel)
    }

    /// Slurm's folder of job `job_id` ([`job_folder`]).
    pub fn job_dir(&self, job_id: u64) -> PathBuf {
        self.dir().join(job_folder(job_id))
    }

    /// The job folder relative to the mount, as nft names cgroups.
    pub fn job_rel(&self, job_id: u64) -> String {
        format!("{}/{}", self.rel, job_folder(job_id))
    }

    /// The cgroup level of a job folder (the mount's root is level 0), which
    /// `bpf_get_current_ancestor_cgroup_id` and nft's `socket cgroupv2 level` take.
    pub fn job_level(&self) -> u32 {
        self.rel.split('/').filter(|c| !c.is_empty()).count() as u32 + 1
    }

    /// Makes Slurm's job folder when slurmstepd has not yet (Slurm's own mkdir takes an
    /// existing folder), so the job's cgroup id is known before any of its processes exists,
    /// and the keeper folder in it ([`KEEPER`]) that holds it for the job's whole life.
    /// Returns the folder and its cgroup id (the inode number on cgroup2).
    pub fn ensure_job_dir(&self, job_id: u64) -> io::Result<(PathBuf, u64)> {
        let dir = self.job_dir(job_id);
        for d in [dir.clone(), dir.join(KEEPER)] {
            match std::fs::DirBuilder::new().mode(0o755).create(&d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let id = cgroup_id(&dir)?;
        Ok((dir, id))
    }

    /// [`release_folder`] of job `job_id`'s folder.
    pub fn release_job_dir(&self, job_id: u64, cgroup_id: Option<u64>) -> io::Result<bool> {
        release_folder(&self.job_dir(job_id), cgroup_id)
    }
}

/// Removes a job folder's keeper ([`KEEPER`]) and then the folder itself, once the job has
/// ended (the epilog: Slurm has ended every process and removed its step folders); `Ok(true)`
/// when the folder was removed now. Idempotent. With `cgroup_id`, a folder of another id (made
/// again since, not by the product) is not touched. Slurm's own folders or processes still in
/// it leave the folder to Slurm (`Ok(false)`), as its own removal does; a keeper that cannot be
/// removed is an error.
pub fn release_folder(dir: &Path, cgroup_id: Option<u64>) -> io::Result<bool> {
    match (cgroup_id, self::cgroup_id(dir)) {
        (_, Err(e)) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        (Some(want), Ok(id)) if id != want => return Ok(false),
        (_, Err(e)) => return Err(e),
        _ => {}
    }
    match std::fs::remove_dir(dir.join(KEEPER)) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The empty child folder the prolog makes in Slurm's job folder. Slurm's cgroup/v2 plugin
/// removes the job folder when the job's last running step ends (`cgroup_p_step_destroy`, a
/// "best try" rmdir) and makes it again, with a new cgroup id, for the next step
/// (`cgroup_p_step_create`); without `PrologFlags=Contain`, or once a user ended their own
/// extern step, every step would run in a folder the job's firewall elements and device map
/// entry do not name. A cgroup with a child cannot be removed (EBUSY, which Slurm logs at
/// debug level and ignores), so the folder, and its id, last until the epilog removes the
/// keeper. No process is ever in it; it is root's, so a job's user cannot remove it.
pub const KEEPER: &str = "tenancy-keeper";

/// The name of a job's folder in Slurm's scope: `job_<id>`, or from Slurm 26.05 the job's SLUID
/// (`SLURM_JOB_SLUID` in the prolog's and epilog's environment) unless cgroup.conf sets
/// `CgroupJobIdPaths=yes` (cgroup.conf next to `SLURM_CONF`, else /etc/slurm/cgroup.conf).
pub fn job_folder(job_id: u64) -> String {
    let sluid = std::env::var("SLURM_JOB_SLUID").ok();
    let conf = std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .and_then(|c| c.parent().map(|d| d.join("cgroup.conf")))
        .unwrap_or_else(|| PathBuf::from("/etc/slurm/cgroup.conf"));
    let text = std::fs::read_to_string(conf).unwrap_or_default();
    job_folder_with(job_id, sluid.as_deref(), &text)
}

/// [`job_folder`] from the SLUID and cgroup.conf's text.
pub fn job_folder_with(job_id: u64, sluid: Option<&str>, cgroup_conf: &str) -> String {
    let id_paths = cgroup_conf.lines().any(|l| {
        let l = l.split('#').next().unwrap_or_default();
        l.split_once('=').is_some_and(|(k, v)| {
            k.trim().eq_ignore_ascii_case("CgroupJobIdPaths")
                && v.trim().eq_ignore_ascii_case("yes")
        })
    });
    match sluid {
        // A SLUID is a short alphanumeric string; anything else is not a folder name we make.
        Some(s)
            if !id_paths
                && !s.is_empty()
                && s.len() <= 32
                && s.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            s.to_string()
        }
        _ => format!("job_{job_id}"),
    }
}

/// The cgroup id of a cgroup2 folder: its inode number (what nft and BPF key cgroups on).
pub fn cgroup_id(dir: &Path) -> io::Result<u64> {
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a cgroup folder", dir.display()),
        ));
    }
    Ok(m.ino())
}

/// The cgroup2 path of `pid` relative to the mount (`/system.slice/...`), from
/// `/proc/<pid>/cgroup`'s `0::` line.
pub fn v2_path_of(pid: i32) -> io::Result<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    v2_path_in(&text).map(str::to_string).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("process {pid} has no cgroup2 path"),
        )
    })
}

/// The cgroup2 path (`0::` line) of a `/proc/<pid>/cgroup` text.
pub fn v2_path_in(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// Whether `pid` is in the cgroup folder `dir` (on the mount `v2_mount`) or below it.
pub fn is_under(pid: i32, v2_mount: &Path, dir: &Path) -> io::Result<bool> {
    let rel = dir.strip_prefix(v2_mount).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not under {}", dir.display(), v2_mount.display()),
        )
    })?;
    let own = v2_path_of(pid)?;
    let own = Path::new(own.trim_start_matches('/'));
    Ok(own.starts_with(rel))
}

/// Every process in `dir` and the cgroups below it.
pub fn pids_below(dir: &Path) -> io::Result<Vec<i32>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        match std::fs::read_to_string(d.join("cgroup.procs")) {
            Ok(t) => out.extend(t.lines().filter_map(|l| l.trim().parse::<i32>().ok())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
        for e in std::fs::read_dir(&d)?.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_level_counts_the_scope_components() {
        let s = SlurmScope {
            v2_mount: "/sys/fs/cgroup".into(),
            rel: "system.slice/vm_slurmstepd.scope".into(),
        };
        assert_eq!(s.job_level(), 3);
        assert_eq!(
            s.job_dir(7),
            Path::new("/sys/fs/cgroup/system.slice/vm_slurmstepd.scope/job_7")
        );
        assert_eq!(s.job_rel(7), "system.slice/vm_slurmstepd.scope/job_7");
    }

    #[test]
    fn job_folders_are_named_by_sluid_on_26_05_unless_job_id_paths() {
        assert_eq!(job_folder_with(7, None, ""), "job_7");
        assert_eq!(
            job_folder_with(7, Some("sEKNKTV3WPV500"), ""),
            "sEKNKTV3WPV500"
        );
        assert_eq!(
            job_folder_with(
                7,
                Some("sEKNKTV3WPV500"),
                "ConstrainDevices=yes\nCgroupJobIdPaths=yes\n"
            ),
            "job_7"
        );
        assert_eq!(
            job_folder_with(7, Some("sEKNKTV3WPV500"), "#CgroupJobIdPaths=yes\n"),
            "sEKNKTV3WPV500"
        );
        assert_eq!(job_folder_with(7, Some("../x"), ""), "job_7");
    }

    #[test]
    fn no_scope_where_cgroup2_is_not_mounted() {
        let d = std::env::temp_dir();
        assert_eq!(SlurmScope::detect_in(&d, None), None);
    }
}
