//! A file made immutable for a test (`chattr +i`): the scratch layer's tests and tenancyctl's.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A file made immutable (`chattr +i`): not even root can remove it. The flag is cleared on
/// drop, so the tree can go. `None` (SKIP) where the filesystem has no such flag.
pub struct Immutable(PathBuf);
impl Immutable {
    pub fn set(p: &Path) -> Option<Immutable> {
        let out = Command::new("chattr").arg("+i").arg(p).output().unwrap();
        if out.status.success() {
            return Some(Immutable(p.into()));
        }
        let why = format!(
            "chattr +i {}: {}",
            p.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        crate::skip(&why, "");
        None
    }
}
impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}
