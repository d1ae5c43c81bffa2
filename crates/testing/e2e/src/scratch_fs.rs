//! An encrypt-capable scratch root for a stack (the encrypted tier's e2e test and the demo): an
//! ext4 file system made with `mkfs.ext4 -O encrypt` on a loop device, mounted over the
//! stack's (empty) scratch root before the first job; unmounted, and its image removed, on
//! drop. With [`require_encryption`] a tier of the stack's config encrypts its jobs' scratch.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct EncryptedScratch {
    pub mount: PathBuf,
    pub image: PathBuf,
    mounted: bool,
    /// The same file system bound into a Slurm release root ([`Self::also_in_root`]).
    binds: Vec<PathBuf>,
}

fn run(cmd: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .with_context(|| format!("run {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl EncryptedScratch {
    /// Mounts a new `size_mb` MB ext4 with the encrypt feature over `scratch_root` (which must
    /// be an empty folder); its image is a sparse file beside it.
    pub fn mount_over(scratch_root: &Path, size_mb: u64) -> Result<EncryptedScratch> {
        if std::fs::read_dir(scratch_root)?.next().is_some() {
            bail!("{} is not empty", scratch_root.display());
        }
        let image = scratch_root.with_extension("ext4.img");
        let f = std::fs::File::create(&image)?;
        f.set_len(size_mb << 20)?;
        drop(f);
        let img = image.to_str().context("image path")?.to_string();
        let mnt = scratch_root.to_str().context("scratch path")?.to_string();
        let made = run("mkfs.ext4", &["-q", "-F", "-O", "encrypt", &img])
            .and_then(|()| run("mount", &["-o", "loop", &img, &mnt]));
        if let Err(e) = made {
            let _ = std::fs::remove_file(&image);
            return Err(e);
        }
        let fs = EncryptedScratch {
            mount: scratch_root.to_path_buf(),
            image,
            mounted: true,
            binds: Vec::new(),
        };
        std::fs::set_permissions(
            scratch_root,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        Ok(fs)
    }

    /// Binds the file system at the same path inside the root folder `root` (a Slurm
    /// release's, whose daemons run in it with chroot): the host's mounts are private, so one
    /// made after the root's bind of the temp folder does not show there by itself.
    pub fn also_in_root(&mut self, root: &Path) -> Result<()> {
        let at = root.join(self.mount.strip_prefix("/").unwrap_or(&self.mount));
        let (from, to) = (self.mount.display().to_string(), at.display().to_string());
        run("mount", &["--bind", &from, &to])?;
        self.binds.push(at);
        Ok(())
    }

    /// Unmounts (lazily when something still holds it: a deleter at work) and removes the
    /// image. Idempotent.
    pub fn remove(&mut self) {
        for at in self.binds.drain(..).rev() {
            let at = at.display().to_string();
            if run("umount", &[&at]).is_err() {
                let _ = run("umount", &["-l", &at]);
            }
        }
        if self.mounted {
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
                let _ = run("umount", &["-l", &m]);
            }
            self.mounted = false;
        }
        let _ = std::fs::remove_file(&self.image);
    }
}

impl Drop for EncryptedScratch {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Sets `scratch_encryption = "required"` for `tier` in the config file `config` (the prolog
/// reads it for every job).
pub fn require_encryption(config: &Path, tier: &str) -> Result<()> {
    let text = std::fs::read_to_string(config)?;
    let head = format!("[tiers.{tier}]\n");
    if !text.contains(&head) {
        bail!("{} has no [tiers.{tier}]", config.display());
    }
    let changed = text.replacen(
        &head,
        &format!("{head}scratch_encryption = \"required\"\n"),
        1,
    );
    std::fs::write(config, changed)?;
    Ok(())
}
