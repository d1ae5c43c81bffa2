//! Other Slurm releases for the e2e tests: a Debian root per release (scripts/slurm-root: 24.11
//! from trixie, 26.05 from sid, cached in TENANCY_ROOTS_DIR, default
//! /var/cache/slurm-tenancy/roots), the product's plugins built against that root's headers,
//! and the cluster's daemons and clients run in it with chroot (cgroup/v1 on this hybrid host:
//! the kernel, cgroups and nftables are the host's).
//!
//! Inside the root, /proc, /sys and /dev are the host's, and so is the temp folder, mounted at
//! the same path: the cluster's and the stack's folders (configs, scratch, audit log, the
//! binaries the jobs run) have one path for the test and for Slurm. The test users and groups
//! are copied into the root's /etc/passwd and /etc/group with their ids.
//!
//! The cached root is never written: each [`SlurmRoot::make`] mounts an overlay of it
//! ([`crate::root_overlay`]) and everything a test writes into "the root" (its /etc/hosts and
//! users, the UML node's files, munge's folder) lands in that overlay's upper folder, removed
//! with it. So no test sees what an earlier test or run left, as on a fresh machine.

use anyhow::{bail, ensure, Context, Result};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A Slurm release's root with the product's plugins built for it.
#[derive(Debug, Clone)]
pub struct SlurmRoot {
    /// "24.11" or "26.05".
    pub release: String,
    /// The root folder: this test's overlay of the cached root.
    pub dir: PathBuf,
    /// The cached root (scripts/slurm-root), read only.
    pub cached: PathBuf,
    /// The overlay `dir` is; unmounted when the last clone goes.
    _overlay: std::sync::Arc<crate::root_overlay::Overlay>,
    /// The release's SLURM_VERSION_NUMBER (0xMMmmuu), from its headers.
    pub version_number: u32,
    /// Where the plugins built against its headers are (target/slurm-<release>/debug).
    pub build_dir: PathBuf,
}

use crate::repo_root;

impl SlurmRoot {
    /// Makes the root when missing (debootstrap; ~2.5 min here), builds the plugins against
    /// its headers (scripts/slurm-root RELEASE --plugins), and mounts this test's overlay of
    /// it. An archive that cannot be reached is an error: a release is never skipped silently.
    pub fn make(release: &str) -> Result<SlurmRoot> {
        let script = repo_root().join("scripts/slurm-root");
        let out = Command::new(&script)
            .args([release, "--plugins"])
            .current_dir(repo_root())
            .stderr(std::process::Stdio::inherit())
            .output()
            .with_context(|| format!("run {}", script.display()))?;
        ensure!(
            out.status.success(),
            "scripts/slurm-root {release} --plugins failed ({}): the Slurm {release} root \
             could not be made or its plugins built; see the lines above",
            out.status
        );
        let dir = PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap_or_default()
                .trim(),
        );
        ensure!(dir.is_dir(), "scripts/slurm-root printed no root folder");
        let overlay = crate::root_overlay::Overlay::mount(&dir, &format!("root-{release}"))?;
        let (cached, dir) = (dir, overlay.merged.clone());
        let header = dir.join("usr/include/slurm/slurm_version.h");
        let text =
            fs::read_to_string(&header).with_context(|| format!("read {}", header.display()))?;
        let version_number = text
            .lines()
            .find_map(|l| l.strip_prefix("#define SLURM_VERSION_NUMBER"))
            .and_then(|v| u32::from_str_radix(v.trim().trim_start_matches("0x"), 16).ok())
            .with_context(|| format!("no SLURM_VERSION_NUMBER in {}", header.display()))?;
        Ok(SlurmRoot {
            release: release.to_string(),
            dir,
            cached,
            _overlay: std::sync::Arc::new(overlay),
            version_number,
            build_dir: repo_root().join(format!("target/slurm-{release}/debug")),
        })
    }

    /// Another overlay of the same cached root, as scripts/slurm-root made it: for a machine
    /// booted on it after another (each UML boot writes its own users, hosts and files).
    pub fn fresh(&self) -> Result<SlurmRoot> {
        let overlay =
            crate::root_overlay::Overlay::mount(&self.cached, &format!("root-{}", self.release))?;
        Ok(SlurmRoot {
            dir: overlay.merged.clone(),
            _overlay: std::sync::Arc::new(overlay),
            ..self.clone()
        })
    }

    /// "24.11.5".
    pub fn version(&self) -> String {
        let n = self.version_number;
        format!("{}.{:02}.{}", n >> 16, (n >> 8) & 0xff, n & 0xff)
    }

    /// A plugin built for this release (`libspank_tenancy.so`, `libjob_submit_tenancy.so`).
    pub fn plugin(&self, name: &str) -> Result<PathBuf> {
        let p = self.build_dir.join(name);
        ensure!(
            p.is_file(),
            "{} missing: scripts/slurm-root {} --plugins",
            p.display(),
            self.release
        );
        Ok(p)
    }

    /// The root's Slurm plugin folder, as seen inside the root.
    pub fn plugin_dir(&self) -> Result<PathBuf> {
        [
            "usr/lib/x86_64-linux-gnu/slurm-wlm",
            "usr/lib/aarch64-linux-gnu/slurm-wlm",
        ]
        .iter()
        .find(|d| self.dir.join(d).join("select_cons_tres.so").is_file())
        .map(|d| Path::new("/").join(d))
        .with_context(|| format!("no Slurm plugin folder in {}", self.dir.display()))
    }

    /// The uid, gid of a user of the root (its own /etc/passwd).
    pub fn user(&self, name: &str) -> Result<(u32, u32)> {
        let passwd = fs::read_to_string(self.dir.join("etc/passwd"))?;
        passwd
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() > 3 && f[0] == name)
                    .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
                    .flatten()
            })
            .with_context(|| format!("no user {name} in {}/etc/passwd", self.dir.display()))
    }

    /// Runs `cmd` in the root: chroot in the child, then back into the folder it was started
    /// in (the temp folder has the same path inside), before the uid switch of a `cmd_as`.
    pub fn enter(&self, cmd: &mut Command) {
        let root = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes())
            .expect("root path without NUL");
        // SAFETY: getcwd, chroot and chdir are async-signal-safe; the buffers were allocated
        // before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let mut cwd = [0u8; 4096];
                let have = !libc::getcwd(cwd.as_mut_ptr().cast(), cwd.len()).is_null();
                if libc::chroot(root.as_ptr()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if !have || libc::chdir(cwd.as_ptr().cast()) != 0 {
                    libc::chdir(c"/".as_ptr());
                }
                Ok(())
            });
        }
    }
}

fn mounted(path: &Path) -> bool {
    let want = path.display().to_string();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

fn run(cmd: &mut Command) -> Result<()> {
    let o = cmd.output().with_context(|| format!("run {cmd:?}"))?;
    if !o.status.success() {
        bail!("{cmd:?}: {}", String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(())
}

/// The host's file systems a root needs while a cluster runs in it; unmounted on Drop.
pub struct RootMounts {
    mounts: Vec<PathBuf>,
}

impl RootMounts {
    /// Mounts /proc, /sys, /dev, the temp folder and /var/tmp into `root`, and copies the host's
    /// /etc/hosts and its users and groups the root lacks into it.
    pub fn mount(root: &SlurmRoot) -> Result<RootMounts> {
        let mut m = RootMounts { mounts: Vec::new() };
        let tmp = std::env::temp_dir();
        for (host, rec) in [
            (Path::new("/proc"), false),
            (Path::new("/sys"), true),
            (Path::new("/dev"), true),
            (tmp.as_path(), false),
            // Where tests keep what must not be under a job's private /tmp (job_container/tmpfs).
            (Path::new("/var/tmp"), false),
        ] {
            let at = root.dir.join(host.strip_prefix("/").unwrap_or(host));
            fs::create_dir_all(&at)?;
            if mounted(&at) {
                // Left by a test that was killed: replace it.
                let _ = Command::new("umount").arg("-R").arg("-l").arg(&at).output();
            }
            if host == Path::new("/proc") {
                run(Command::new("mount").args(["-t", "proc", "proc"]).arg(&at))?;
            } else {
                run(Command::new("mount")
                    .arg(if rec { "--rbind" } else { "--bind" })
                    .arg(host)
                    .arg(&at))?;
                if rec {
                    run(Command::new("mount").arg("--make-rslave").arg(&at))?;
                }
            }
            m.mounts.push(at);
        }
        fs::copy("/etc/hosts", root.dir.join("etc/hosts")).context("copy /etc/hosts")?;
        merge_users(&root.dir)?;
        Ok(m)
    }
}

impl Drop for RootMounts {
    fn drop(&mut self) {
        for at in self.mounts.drain(..).rev() {
            let _ = Command::new("umount").arg("-R").arg("-l").arg(&at).output();
        }
    }
}

/// Copies the host's users and groups the root lacks (the test users) into its /etc/passwd
/// and /etc/group, with their ids.
pub fn merge_users(root: &Path) -> Result<()> {
    for db in ["passwd", "group"] {
        merge_db(root, db)?;
    }
    Ok(())
}

/// The root's own entries of /etc/`db` (kept aside at first use as `db.root`) plus the host's
/// entries for names the root does not have, with the host's ids: the test users and groups.
fn merge_db(root: &Path, db: &str) -> Result<()> {
    let file = root.join("etc").join(db);
    let own = root.join("etc").join(format!("{db}.root"));
    if !own.exists() {
        fs::copy(&file, &own)?;
    }
    let own_text = fs::read_to_string(&own)?;
    let name = |l: &str| l.split(':').next().unwrap_or_default().to_string();
    let names: std::collections::BTreeSet<String> = own_text.lines().map(name).collect();
    let mut text = own_text.clone();
    if !text.ends_with('\n') && !text.is_empty() {
        text.push('\n');
    }
    for l in fs::read_to_string(Path::new("/etc").join(db))?.lines() {
        if !l.trim().is_empty() && !names.contains(&name(l)) {
            text.push_str(l);
            text.push('\n');
        }
    }
    let tmp = root.join("etc").join(format!("{db}.tenancy-e2e"));
    fs::write(&tmp, text)?;
    fs::rename(&tmp, &file)?;
    Ok(())
}
