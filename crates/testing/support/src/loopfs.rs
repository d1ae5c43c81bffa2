//! A file system of a test's own, mounted in its folder and removed on drop: ext4 on a loop
//! device (made with `mkfs.ext4 -O encrypt`, or without the feature), or a tmpfs. The scratch
//! layer's, storage-audit's and the node's tests, and the e2e harness's encrypted scratch root.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What to mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// ext4 made with `-O encrypt`.
    Ext4Encrypt,
    /// ext4 without the encrypt feature.
    Ext4,
    Tmpfs,
}

pub struct LoopFs {
    pub kind: Kind,
    /// The mount point.
    pub mount: PathBuf,
    /// The loop device's backing file (ext4).
    pub image: Option<PathBuf>,
    mounted: bool,
    /// The same file system bound into a Slurm release root ([`Self::also_in_root`]).
    binds: Vec<PathBuf>,
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn text(p: &Path) -> Result<&str, String> {
    p.to_str()
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))
}

impl LoopFs {
    /// Mounts a new file system of `kind` (`size_mb` MB) at `mount` (made, mode 0755).
    /// Panics when it cannot: the tests that use it need root and e2fsprogs.
    pub fn new(kind: Kind, mount: &Path, size_mb: u64) -> LoopFs {
        LoopFs::mount(kind, mount, size_mb).unwrap()
    }

    /// [`LoopFs::new`], or why it cannot be had (no loop device in a container, no
    /// e2fsprogs); an ext4's image is a sparse file beside `mount`, removed on failure too.
    pub fn mount(kind: Kind, mount: &Path, size_mb: u64) -> Result<LoopFs, String> {
        std::fs::create_dir_all(mount).map_err(|e| format!("{}: {e}", mount.display()))?;
        let mut fs = LoopFs {
            kind,
            mount: mount.to_path_buf(),
            image: None,
            mounted: false,
            binds: Vec::new(),
        };
        let m = text(mount)?;
        match kind {
            Kind::Tmpfs => run("mount", &["-t", "tmpfs", "-o", "mode=0755", "tmpfs", m])?,
            Kind::Ext4 | Kind::Ext4Encrypt => {
                let image = mount.with_extension("img");
                let f = std::fs::File::create(&image)
                    .map_err(|e| format!("{}: {e}", image.display()))?;
                fs.image = Some(image.clone());
                f.set_len(size_mb << 20)
                    .map_err(|e| format!("{}: {e}", image.display()))?;
                drop(f);
                let img = text(&image)?;
                let mut args = vec!["-q", "-F"];
                if kind == Kind::Ext4Encrypt {
                    args.extend(["-O", "encrypt"]);
                }
                args.push(img);
                run("mkfs.ext4", &args)?;
                run("mount", &["-o", "loop", img, m])?;
            }
        }
        fs.mounted = true;
        std::fs::set_permissions(mount, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", mount.display()))?;
        Ok(fs)
    }

    /// Binds the file system at the same path inside the root folder `root` (a Slurm
    /// release's, whose daemons run in it with chroot): the host's mounts are private, so one
    /// made after the root's bind of the temp folder does not show there by itself.
    pub fn also_in_root(&mut self, root: &Path) -> Result<(), String> {
        let at = root.join(self.mount.strip_prefix("/").unwrap_or(&self.mount));
        run("mount", &["--bind", text(&self.mount)?, text(&at)?])?;
        self.binds.push(at);
        Ok(())
    }

    /// Writes everything of the file system to its device (and the loop device's to its file).
    pub fn sync(&self) {
        run("sync", &["-f", self.mount.to_str().unwrap()]).unwrap();
    }

    /// Whether `needle` appears anywhere on the raw device (the loop device's backing file).
    pub fn raw_contains(&self, needle: &[u8]) -> bool {
        self.sync();
        let image = self.image.as_ref().expect("a device-backed file system");
        let mut f = std::fs::File::open(image).unwrap();
        let mut buf = vec![0u8; 4 << 20];
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let n = std::io::Read::read(&mut f, &mut buf).unwrap();
            if n == 0 {
                return false;
            }
            carry.extend_from_slice(&buf[..n]);
            if carry.windows(needle.len()).any(|w| w == needle) {
                return true;
            }
            let keep = needle.len().saturating_sub(1).min(carry.len());
            carry.drain(..carry.len() - keep);
        }
    }

    /// Unmounts (lazily when something still uses it: a deleter at work) and removes the
    /// backing file. Idempotent.
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
        if let Some(image) = self.image.take() {
            let _ = std::fs::remove_file(image);
        }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        self.remove();
    }
}
