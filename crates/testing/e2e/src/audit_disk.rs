//! A node's audit folder on a small file system of its own (the soak's `audit_disk_full`
//! fault, src/soak/faults.rs): ext4 (no journal, 1 KiB blocks, nothing reserved for root) on a
//! loop device whose backing file is a sparse file in the cluster folder, mounted over
//! `<node root>/audit` before the node's mount namespace is made (the node's bind of its root
//! is recursive, so the node sees it at the config's path). [`AuditDisk::fill`] takes every
//! free block with a filler file, [`AuditDisk::free`] removes it; [`AuditDisk::remove`]
//! (also on drop) unmounts and detaches.
//!
//! 1 KiB blocks: a `job_start` record (about 1.4 KB) never fits in the slack of the log's last
//! block, so a prolog on a full disk always meets ENOSPC; a shorter record may still fit there,
//! as it would on a real full disk.

use anyhow::{bail, Context, Result};
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The filler's name in the audit folder (no name the product's log or its rotations use).
pub const FILLER: &str = ".tenancy-e2e-disk-full";

fn run(cmd: &str, args: &[&str]) -> Result<String> {
    let o = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("run {cmd}"))?;
    if !o.status.success() {
        bail!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn s(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))
}

/// Why no loop device can be attached here (a container without /dev/loop-control, no
/// losetup), if one cannot.
pub fn no_loop_device() -> Option<String> {
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing (a container?)".into());
    }
    match Command::new("losetup").arg("--find").output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "losetup --find: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("losetup: {e}")),
    }
}

/// One node's audit file system.
pub struct AuditDisk {
    /// Where it is mounted on the host (`<node root>/audit`).
    pub mount: PathBuf,
    pub image: PathBuf,
    /// The loop device (`/dev/loopN`), empty before it is attached.
    pub device: String,
    mounted: bool,
}

impl AuditDisk {
    /// Makes a sparse `size_mb` MB image at `image`, an ext4 on it, attaches it to a loop
    /// device and mounts it at `mount` (an empty folder, kept at mode 0755). On an error what
    /// was made is undone (drop).
    pub fn attach(image: &Path, mount: &Path, size_mb: u64) -> Result<AuditDisk> {
        if let Some(why) = no_loop_device() {
            bail!("no loop device: {why}");
        }
        let mut disk = AuditDisk {
            mount: mount.to_path_buf(),
            image: image.to_path_buf(),
            device: String::new(),
            mounted: false,
        };
        let f = File::create(image).with_context(|| format!("create {}", image.display()))?;
        f.set_len(size_mb << 20)?;
        drop(f);
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-b",
                "1024",
                "-m",
                "0",
                "-N",
                "256",
                "-O",
                "^has_journal",
                s(image)?,
            ],
        )?;
        disk.device = run("losetup", &["--find", "--show", s(image)?])?;
        run("mount", &[&disk.device, s(mount)?])?;
        disk.mounted = true;
        let _ = fs::remove_dir(mount.join("lost+found"));
        fs::set_permissions(mount, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        Ok(disk)
    }

    /// Takes every block a file may have with the filler: fallocate in halving
    /// steps, then writes until ENOSPC. Returns the bytes the filler holds; Err when the file
    /// system could not be filled (a block left free after the writes).
    pub fn fill(&self) -> Result<u64> {
        let path = self.mount.join(FILLER);
        let mut f = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("open {}", path.display()))?;
        let st = nix::sys::statvfs::statvfs(&self.mount)?;
        let mut step = (st.blocks_available() * st.fragment_size()).max(1024) as i64;
        let mut len = f.metadata()?.len() as i64;
        while step >= 1024 {
            // SAFETY: fallocate on an open file descriptor with plain integer arguments.
            let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, len, step) };
            if r == 0 {
                len += step;
            } else {
                step /= 2;
            }
        }
        let block = [0u8; 1024];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(e).context(format!("fill {}", path.display())),
            }
        }
        f.sync_all()?;
        let st = nix::sys::statvfs::statvfs(&self.mount)?;
        // Available, not free: ext4 keeps some clusters for its own metadata (s_resv_clusters),
        // which no file's data may take.
        if st.blocks_available() > 0 {
            bail!(
                "{} still has {} available block(s) after the filler",
                self.mount.display(),
                st.blocks_available()
            );
        }
        Ok(f.metadata()?.len())
    }

    /// Removes the filler (a file system without a journal has its blocks back at once).
    pub fn free(&self) -> Result<()> {
        let path = self.mount.join(FILLER);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).context(format!("remove {}", path.display())),
        }
        let dir = File::open(&self.mount)?;
        // SAFETY: syncfs on an open file descriptor.
        unsafe { libc::syncfs(dir.as_raw_fd()) };
        Ok(())
    }

    /// Unmounts (lazily when something still holds it), detaches the loop device and
    /// removes the image. Idempotent; errors are said on stderr.
    pub fn remove(&mut self) {
        if self.mounted {
            let _ = self.free();
            // A kept cluster folder keeps the node's audit files too (they live on this disk).
            if std::env::var_os("TENANCY_E2E_KEEP").is_some() {
                let kept = self.mount.with_extension("kept");
                let _ = std::fs::create_dir_all(&kept);
                for e in std::fs::read_dir(&self.mount)
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if e.path().is_file() {
                        let _ = std::fs::copy(e.path(), kept.join(e.file_name()));
                    }
                }
            }
            let m = self.mount.display().to_string();
            let mut done = false;
            for _ in 0..50 {
                if run("umount", &[&m]).is_ok() {
                    done = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            if !done {
                eprintln!("tenancy-e2e: {m} is busy: unmounted lazily");
                let _ = run("umount", &["-l", &m]);
            }
            self.mounted = false;
        }
        if !self.device.is_empty() {
            // Still held by a namespace that has not gone yet: the kernel detaches it when
            // the last user lets go (losetup -d sets autoclear on a busy device).
            if let Err(e) = run("losetup", &["-d", &self.device]) {
                eprintln!("tenancy-e2e: {e}");
            }
            self.device.clear();
        }
        let _ = fs::remove_file(&self.image);
    }
}

impl Drop for AuditDisk {
    fn drop(&mut self) {
        self.remove();
    }
}
