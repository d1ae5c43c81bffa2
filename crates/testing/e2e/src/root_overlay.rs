//! A test's own copy of a cached root, as cheap as a mount: an overlay whose lower folder is
//! the cached root (never written) and whose upper folder is made for the test and removed
//! with it. What a test writes into a root (the host's /etc/hosts, its users, a UML node's
//! files) then never reaches the cache, so a later test or run starts from the root as
//! scripts/slurm-root made it, as on a fresh machine.
//!
//! Overlays of test processes that were killed are unmounted and removed by the next one.

use anyhow::{bail, ensure, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Prefix of the overlays' folders in the temp folder: `<prefix><name>-<pid>-<random>`.
const PREFIX: &str = "tenancy-overlay-";

/// A mounted overlay of a cached root; unmounted (with whatever was mounted into it) and its
/// folders removed on drop.
#[derive(Debug)]
pub struct Overlay {
    /// The test's root: the merged view.
    pub merged: PathBuf,
    /// Holds `upper`, `work` and `merged`.
    base: PathBuf,
}

impl Overlay {
    /// Mounts an overlay of `lower` for this process (`name` tells overlays apart in the temp
    /// folder).
    pub fn mount(lower: &Path, name: &str) -> Result<Overlay> {
        let lower = lower
            .canonicalize()
            .with_context(|| format!("{}", lower.display()))?;
        let text = lower.display().to_string();
        ensure!(
            !text.contains([',', ':', '\\']),
            "{text}: a cached root's path must not hold ',', ':' or '\\' (overlay options)"
        );
        remove_stale();
        let base = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{name}-{}-", std::process::id()))
            .tempdir_in(std::env::temp_dir())
            .context("temp folder for a root overlay")?
            .keep();
        let ov = Overlay {
            merged: base.join("merged"),
            base,
        };
        for d in ["upper", "work", "merged"] {
            fs::create_dir(ov.base.join(d))?;
        }
        let opts = format!(
            "lowerdir={text},upperdir={},workdir={}",
            ov.base.join("upper").display(),
            ov.base.join("work").display()
        );
        let out = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&ov.merged)
            .output()
            .context("run mount -t overlay")?;
        if !out.status.success() {
            bail!(
                "mount -t overlay of {text} on {}: {} (the kernel needs CONFIG_OVERLAY_FS)",
                ov.merged.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(ov)
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        unmount_and_remove(&self.base);
    }
}

/// Mount points at or below `dir`.
fn mounts_below(dir: &Path) -> Vec<String> {
    let want = dir.display().to_string();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| *m == want || m.starts_with(&format!("{want}/")))
        .collect()
}

/// Lazily unmounts the overlay at `base/merged` and everything mounted into it, then removes
/// `base`, unless something is still mounted below it (removing would reach into that mount:
/// the host's /proc, /sys, /dev or temp folder a cluster bound there).
fn unmount_and_remove(base: &Path) {
    let merged = base.join("merged");
    if !mounts_below(&merged).is_empty() {
        let _ = Command::new("umount")
            .arg("-R")
            .arg("-l")
            .arg(&merged)
            .output();
    }
    let left = mounts_below(base);
    if !left.is_empty() {
        eprintln!(
            "root overlay {}: still mounted ({}), left in place",
            base.display(),
            left.join(", ")
        );
        return;
    }
    let _ = fs::remove_dir_all(base);
}

/// Overlays of processes that no longer run (a test killed before its Drop).
fn remove_stale() {
    let Ok(rd) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        // <name>-<pid>-<random>: the pid is the second field from the end.
        let pid = rest.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            unmount_and_remove(&e.path());
        }
    }
}
