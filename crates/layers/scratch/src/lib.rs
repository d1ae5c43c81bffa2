//! tenancy-scratch: tenant-scoped scratch directories.
//!
//! Layout under an admin-chosen `scratch_root` (owned by root, not group/world writable):
//!
//! ```text
//! <root>/                     root:root   0755 (or stricter)
//! <root>/<tenant>/            root:<tenant_gid> 0750  (only root creates entries; members traverse)
//! <root>/<tenant>/job_<id>/   <uid>:<gid> tier mode (default 0700)
//! <root>/<tenant>/.retained/  root:<tenant_gid> 0750
//! <root>/<tenant>/.retained/job_<id>.<unix_secs>/   a retained job folder
//! ```
//!
//! Every path below `root` is opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (where
//! the kernel has no `openat2`: one `openat(O_NOFOLLOW)` per component, never `..`) and changed
//! through file descriptors (`mkdirat`, `fchown`, `fchmod`, `unlinkat`, `renameat`), so a
//! symlink planted anywhere under the root is never followed.

pub mod acl;
pub mod fscrypt;
pub mod fsutil;
pub mod keys;
mod mounts;
pub mod quota;
pub mod trash;
mod wipe;
// The job folder's life: the tenant folder it sits in, made, ended, retained.
mod end;
mod make;
mod retained;
mod tenant;

pub use fscrypt::{JobKey, KeyId, Removal};
pub use keys::KeyStore;
pub use quota::{QuotaSpec, QuotaStatus};

pub use end::{erase, retain_encrypted, wipe, wipe_encrypted};
pub use make::{create, create_encrypted};
pub use retained::{
    find_retained, list_retained, lock, purge_retained, purge_retained_with, retain, retained_keys,
    unlock, RetainedFolder,
};

use fsutil::{open_beneath, open_root};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Mode of a tenant folder (and of `.retained`): owner root rwx, tenant group r-x, others nothing.
/// Only root can create entries in it, so no job user can plant a symlink where a job folder goes.
pub const TENANT_DIR_MODE: u32 = 0o750;
/// Default mode of a job folder.
pub const DEFAULT_JOB_MODE: u32 = 0o700;
/// Name of the per-tenant folder holding retained job folders.
pub const RETAINED_DIR: &str = ".retained";

/// What the scratch layer needs for one job; stored in the per-job journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScratchSpec {
    /// The scratch root (admin config `scratch_root`). Must exist, be a real directory (no
    /// symlink anywhere in the path), owned by root and not group/world writable.
    pub root: PathBuf,
    /// Tenant name: `[A-Za-z0-9_-]`, 1..=64 characters, not starting with `-`.
    pub tenant: String,
    /// Group that owns the tenant folder.
    pub tenant_gid: u32,
    pub job_id: u64,
    /// Job user and primary group: owner of the job folder.
    pub uid: u32,
    pub gid: u32,
    /// Job folder mode from the tier (default 0700). Only bits within 02770 are accepted.
    #[serde(default = "default_mode")]
    pub mode: u32,
    /// Optional per-tenant project quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaSpec>,
    /// The gids of the tenant's groups when it has several: the folder's group is
    /// `tenant_gid`, and each other one gets a `group:<gid>:r-x` entry in the folder's access
    /// ACL, so its members reach their job folders. Empty (one group): the folder has no ACL.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenant_groups: Vec<u32>,
}

fn default_mode() -> u32 {
    DEFAULT_JOB_MODE
}

/// Result of [`create`]; also journal material.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Created {
    pub path: PathBuf,
    pub tenant_dir: PathBuf,
    /// True when this call created the tenant folder (it is never removed by teardown).
    pub created_tenant_dir: bool,
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
    pub quota: QuotaStatus,
    /// Set when the folder is encrypted ([`create_encrypted`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted: Option<Encrypted>,
}

/// How a job folder is encrypted: its key (by identifier) and the policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encrypted {
    pub key_id: KeyId,
    pub policy: String,
    /// The file system, as the kernel and mountinfo name it.
    pub file_system: String,
    /// Where the key is kept wrapped by the node key (retain tiers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapped_key: Option<PathBuf>,
}

/// Result of [`erase`]: the key removed first, then the folder moved to the trash (deleted
/// there by [`trash::empty`]) or, where there is no trash on its file system, deleted here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Erased {
    Trashed {
        path: PathBuf,
        trash: PathBuf,
        key: Removal,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        detached: Vec<PathBuf>,
    },
    Removed {
        path: PathBuf,
        key: Removal,
        entries: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        detached: Vec<PathBuf>,
    },
    AlreadyGone {
        path: PathBuf,
        key: Removal,
    },
}

/// Result of [`wipe`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Wiped {
    Removed {
        path: PathBuf,
        entries: u64,
        /// Mounts found under the folder and detached first ([`mounts`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        detached: Vec<PathBuf>,
    },
    AlreadyGone {
        path: PathBuf,
    },
}

/// Result of [`retain`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Retained {
    Moved {
        from: PathBuf,
        to: PathBuf,
        retained_at: u64,
        /// Mounts found under the folder and detached before the move ([`mounts`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        detached: Vec<PathBuf>,
        /// An encrypted folder's key, removed before the move (it is locked until
        /// `tenancyctl scratch unlock`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<Removal>,
    },
    AlreadyGone {
        path: PathBuf,
    },
}

/// One step of [`purge_retained`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Removed (or, in a dry run, would remove) a retained job folder past retention.
    Remove {
        path: PathBuf,
        tenant: String,
        job_id: u64,
        retained_at: u64,
        age_days: u64,
        dry_run: bool,
        entries: u64,
    },
    /// The key of an encrypted retained folder past retention destroyed (or, in a dry run,
    /// would be): its wrapped copy (`wrapped`, when the node kept one) and the file system's
    /// (if it was unlocked). Comes before the folder's own [`Action::Remove`].
    DestroyKey {
        path: PathBuf,
        tenant: String,
        job_id: u64,
        key_id: KeyId,
        wrapped: Option<PathBuf>,
        dry_run: bool,
    },
    /// Left alone: something that is not ours or not safe to touch.
    Skip { path: PathBuf, reason: String },
    /// Past retention, but removing it failed (part of it may be gone); the others are still
    /// purged.
    Failed {
        path: PathBuf,
        tenant: String,
        job_id: u64,
        retained_at: u64,
        age_days: u64,
        error: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ScratchError {
    #[error("scratch layer, job {job}: invalid spec: {msg}")]
    InvalidSpec { job: u64, msg: String },
    #[error("scratch layer: unsafe path {path}: {msg}; refusing to touch it (fix ownership/mode by hand or remove the entry, then retry)")]
    Unsafe { path: PathBuf, msg: String },
    #[error("scratch layer: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("scratch layer, job {job}: quota required but not applied: {msg}")]
    Quota { job: u64, msg: String },
    #[error("scratch layer, job {job}: scratch_encryption is required but {msg}")]
    Encryption { job: u64, msg: String },
    #[error("scratch layer: key store: {msg}")]
    Key { msg: String },
}

pub type Result<T> = std::result::Result<T, ScratchError>;

pub(crate) fn io_err(op: &'static str, path: &Path, e: Errno) -> ScratchError {
    ScratchError::Io {
        op,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

pub(crate) fn unsafe_path(path: &Path, msg: impl Into<String>) -> ScratchError {
    ScratchError::Unsafe {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Checks a tenant name: `[A-Za-z0-9_-]`, 1..=64, not starting with `-`.
pub fn validate_tenant_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("tenant name {name:?} must be 1..=64 characters"));
    }
    if name.starts_with('-')
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "tenant name {name:?} may only hold A-Z a-z 0-9 _ - and not start with -"
        ));
    }
    Ok(())
}

impl ScratchSpec {
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| ScratchError::InvalidSpec {
            job: self.job_id,
            msg,
        };
        validate_tenant_name(&self.tenant).map_err(bad)?;
        if !self.root.is_absolute() {
            return Err(bad(format!(
                "scratch root {} is not an absolute path",
                self.root.display()
            )));
        }
        if self.mode & !0o2770 != 0 {
            return Err(bad(format!(
                "job folder mode {:o} grants access to others or sets setuid/sticky; allowed bits: 2770",
                self.mode
            )));
        }
        if self.mode & 0o700 != 0o700 {
            return Err(bad(format!(
                "job folder mode {:o} must give the owner rwx",
                self.mode
            )));
        }
        if self.uid == 0 {
            return Err(bad("job uid 0 (root) gets no scratch folder".into()));
        }
        Ok(())
    }
    pub fn job_name(&self) -> String {
        format!("job_{}", self.job_id)
    }
    pub fn tenant_dir(&self) -> PathBuf {
        self.root.join(&self.tenant)
    }
    pub fn job_dir(&self) -> PathBuf {
        self.tenant_dir().join(self.job_name())
    }
}

/// Whether job folders under the scratch root `root` can be encrypted: the file system as
/// the kernel names it, or why not (naming it, and what to do). What the prolog of a tier with
/// `scratch_encryption = "required"` decides on, and `tenancyctl doctor` reports.
pub fn encryption_support(root: &Path) -> std::result::Result<String, String> {
    let fd = open_root(root).map_err(|e| e.to_string())?;
    fscrypt::probe(&fd, root)?;
    Ok(fscrypt::describe_fs(&fd, root))
}

/// The key of the encrypted folder `<root>/<tenant>/<name>`, `None` when it is not one (or is
/// not there).
pub fn folder_key(root: &Path, tenant: &str, name: &str) -> Option<KeyId> {
    let rootfd = open_root(root).ok()?;
    let fd = open_beneath(&rootfd, &format!("{tenant}/{name}")).ok()?;
    fscrypt::policy_of(&fd).ok().flatten()
}
