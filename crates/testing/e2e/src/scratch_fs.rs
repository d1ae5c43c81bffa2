//! An encrypt-capable scratch root for a stack (the encrypted tier's e2e test and the demo): an
//! ext4 file system made with `mkfs.ext4 -O encrypt` on a loop device (tenancy-test-support's
//! [`LoopFs`]), mounted over the stack's (empty) scratch root before the first job; unmounted,
//! and its image removed, on drop. With [`require_encryption`] a tier of the stack's config
//! encrypts its jobs' scratch.

use anyhow::{anyhow, bail, Result};
use std::path::{Path, PathBuf};
use tenancy_test_support::loopfs::{Kind, LoopFs};

pub struct EncryptedScratch {
    pub mount: PathBuf,
    pub image: PathBuf,
    fs: LoopFs,
}

impl EncryptedScratch {
    /// Mounts a new `size_mb` MB ext4 with the encrypt feature over `scratch_root` (which must
    /// be an empty folder); its image is a sparse file beside it.
    pub fn mount_over(scratch_root: &Path, size_mb: u64) -> Result<EncryptedScratch> {
        if std::fs::read_dir(scratch_root)?.next().is_some() {
            bail!("{} is not empty", scratch_root.display());
        }
        let fs = LoopFs::mount(Kind::Ext4Encrypt, scratch_root, size_mb).map_err(|e| anyhow!(e))?;
        Ok(EncryptedScratch {
            mount: fs.mount.clone(),
            image: fs.image.clone().expect("an ext4's image"),
            fs,
        })
    }

    /// Binds the file system at the same path inside a Slurm release's root folder
    /// ([`LoopFs::also_in_root`]).
    pub fn also_in_root(&mut self, root: &Path) -> Result<()> {
        self.fs.also_in_root(root).map_err(|e| anyhow!(e))
    }

    /// Unmounts and removes the image ([`LoopFs::remove`]). Idempotent.
    pub fn remove(&mut self) {
        self.fs.remove();
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
