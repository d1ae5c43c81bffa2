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

pub use fscrypt::{JobKey, KeyId, Removal};
pub use keys::KeyStore;
pub use quota::{QuotaSpec, QuotaStatus};

use fsutil::{describe_entry, open_beneath, open_root};
use rustix::fs::{self as rfs, AtFlags, Mode};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// Verifies an open tenant-owned folder (tenant folder or `.retained`): a directory owned by root,
/// group `gid`, no group write, nothing for others.
fn check_tenant_owned(fd: &OwnedFd, path: &Path, gid: u32) -> Result<()> {
    let st = rfs::fstat(fd).map_err(|e| io_err("fstat", path, e))?;
    let mode = st.st_mode & 0o7777;
    if st.st_uid != 0 {
        return Err(unsafe_path(
            path,
            format!("owned by uid {}, expected root", st.st_uid),
        ));
    }
    if st.st_gid != gid {
        return Err(unsafe_path(
            path,
            format!("group is gid {}, expected tenant gid {gid}", st.st_gid),
        ));
    }
    if mode & 0o022 != 0 {
        return Err(unsafe_path(
            path,
            format!("mode {mode:04o} is group- or world-writable, expected {TENANT_DIR_MODE:04o}"),
        ));
    }
    if mode & 0o007 != 0 {
        return Err(unsafe_path(
            path,
            format!("mode {mode:04o} gives others access, expected {TENANT_DIR_MODE:04o}"),
        ));
    }
    if mode & 0o050 != 0o050 {
        return Err(unsafe_path(
            path,
            format!(
                "mode {mode:04o} keeps the tenant's group out (its members could not reach \
                 their folders), expected {TENANT_DIR_MODE:04o}"
            ),
        ));
    }
    Ok(())
}

/// Opens (creating when missing) a root-owned, tenant-group folder `name` under `parent`.
/// Returns the fd and whether it was created.
fn open_or_make_tenant_owned(
    parent: &OwnedFd,
    parent_path: &Path,
    name: &str,
    gid: u32,
) -> Result<(OwnedFd, bool)> {
    let path = parent_path.join(name);
    match open_beneath(parent, name) {
        Ok(fd) => {
            check_tenant_owned(&fd, &path, gid)?;
            Ok((fd, false))
        }
        Err(Errno::NOENT) => {
            // Made whole under a name of its own, then renamed into place: a process killed
            // half-way (after mkdir, before chown or chmod) leaves no folder of the wrong owner
            // or mode under the real name, which every later job would meet.
            let temp = format!(".{name}.new-{}", std::process::id());
            let _ = rfs::unlinkat(parent, temp.as_str(), AtFlags::REMOVEDIR);
            rfs::mkdirat(parent, temp.as_str(), Mode::from_raw_mode(0o700))
                .map_err(|e| io_err("mkdirat", &parent_path.join(&temp), e))?;
            let made = open_beneath(parent, &temp)
                .map_err(|e| io_err("open new folder", &parent_path.join(&temp), e))
                .and_then(|fd| {
                    rfs::fchown(
                        &fd,
                        Some(rustix::fs::Uid::ROOT),
                        Some(rfs::Gid::from_raw(gid)),
                    )
                    .map_err(|e| io_err("fchown", &path, e))?;
                    rfs::fchmod(&fd, Mode::from_raw_mode(TENANT_DIR_MODE))
                        .map_err(|e| io_err("fchmod", &path, e))?;
                    Ok(fd)
                });
            let placed = made.and_then(|fd| {
                rfs::renameat_with(
                    parent,
                    temp.as_str(),
                    parent,
                    name,
                    rfs::RenameFlags::NOREPLACE,
                )
                .map(|()| fd)
                .map_err(|e| io_err("renameat", &path, e))
            });
            match placed {
                Ok(fd) => {
                    check_tenant_owned(&fd, &path, gid)?;
                    Ok((fd, true))
                }
                Err(e) => {
                    let _ = rfs::unlinkat(parent, temp.as_str(), AtFlags::REMOVEDIR);
                    // Lost a race with another prolog: verify what is there now.
                    match open_beneath(parent, name) {
                        Ok(fd) => {
                            check_tenant_owned(&fd, &path, gid)?;
                            Ok((fd, false))
                        }
                        Err(_) => Err(e),
                    }
                }
            }
        }
        Err(e) => Err(open_error(parent, name, &path, e)),
    }
}

/// The access ACL of a tenant folder whose tenant has groups besides its first (`gid`, the
/// folder's group): what mode 0750 says, plus `group:<g>:r-x` for each of `groups`.
fn tenant_acl(gid: u32, groups: &[u32]) -> Vec<u8> {
    use acl::{ACL_GROUP, ACL_GROUP_OBJ, ACL_MASK, ACL_OTHER, ACL_USER_OBJ};
    const UNDEFINED: u32 = u32::MAX;
    let mut named: Vec<u32> = groups.iter().copied().filter(|g| *g != gid).collect();
    named.sort_unstable();
    named.dedup();
    let mut entries = vec![
        (ACL_USER_OBJ, 7u16, UNDEFINED),
        (ACL_GROUP_OBJ, 5, UNDEFINED),
    ];
    entries.extend(named.into_iter().map(|g| (ACL_GROUP, 5, g)));
    entries.extend([(ACL_MASK, 5, UNDEFINED), (ACL_OTHER, 0, UNDEFINED)]);
    let mut out = acl::ACL_XATTR_VERSION.to_le_bytes().to_vec();
    for (tag, perm, id) in entries {
        out.extend(tag.to_le_bytes());
        out.extend(perm.to_le_bytes());
        out.extend(id.to_le_bytes());
    }
    out
}

/// Members of the tenant's other groups reach the tenant folder through its access ACL (a
/// folder has one group); a tenant of one group has none. Written only when it differs from
/// what is there. A file system
/// without POSIX ACLs fails the job: its user may be a member through one of those groups, and
/// would get a scratch folder it cannot reach.
fn ensure_tenant_acl(fd: &OwnedFd, path: &Path, gid: u32, groups: &[u32]) -> Result<()> {
    const NAME: &str = "system.posix_acl_access";
    if groups.iter().all(|g| *g == gid) {
        // One group: no ACL. One left from when the tenant had more groups would still let
        // their members in (one look per job, nothing written in the usual case).
        return match rfs::fgetxattr(fd, NAME, &mut [0u8; 0]) {
            Err(Errno::NODATA) | Err(Errno::OPNOTSUPP) => Ok(()),
            Ok(_) | Err(Errno::RANGE) => match rfs::fremovexattr(fd, NAME) {
                Ok(()) | Err(Errno::NODATA) => Ok(()),
                Err(e) => Err(io_err("fremovexattr system.posix_acl_access", path, e)),
            },
            Err(e) => Err(io_err("fgetxattr system.posix_acl_access", path, e)),
        };
    }
    let want = tenant_acl(gid, groups);
    let mut have = vec![0u8; want.len()];
    match rfs::fgetxattr(fd, NAME, &mut have) {
        Ok(n) if n == want.len() && have == want => return Ok(()),
        Ok(_) | Err(Errno::NODATA) | Err(Errno::RANGE) => {}
        Err(e) => return Err(io_err("fgetxattr system.posix_acl_access", path, e)),
    }
    rfs::fsetxattr(fd, NAME, &want, rfs::XattrFlags::empty()).map_err(|e| match e {
        Errno::OPNOTSUPP => unsafe_path(
            path,
            "its file system has no POSIX ACLs, and the tenant has several groups: members \
             through any group but the first could not enter it; mount scratch_root with ACLs \
             or give the tenant one group",
        ),
        e => io_err("fsetxattr system.posix_acl_access", path, e),
    })
}

fn open_error(parent: &OwnedFd, name: &str, path: &Path, e: Errno) -> ScratchError {
    match e {
        Errno::LOOP | Errno::NOTDIR | Errno::XDEV => unsafe_path(
            path,
            format!(
                "is not a plain directory ({})",
                describe_entry(parent, name)
            ),
        ),
        e => io_err("open", path, e),
    }
}

/// Creates `<root>/<tenant>/job_<id>` for the job, safely. Refuses, writing nothing, when the
/// root or tenant folder is unsafe or anything already sits where the job folder goes.
pub fn create(spec: &ScratchSpec) -> Result<Created> {
    create_inner(spec, None)
}

/// [`create`], the folder encrypted with `key` (fscrypt v2) before its user can write in it:
/// made root's, its policy set (naming the key, on disk from then on), the key added to the
/// file system's keyring, and only then given to the user. With `store`, the key is kept
/// wrapped by the node key first (retain tiers), durably. A scratch root whose file system
/// cannot be encrypted fails before anything is written, naming the file system.
pub fn create_encrypted(
    spec: &ScratchSpec,
    key: &JobKey,
    store: Option<&KeyStore>,
) -> Result<Created> {
    create_inner(spec, Some((key, store)))
}

fn create_inner(spec: &ScratchSpec, enc: Option<(&JobKey, Option<&KeyStore>)>) -> Result<Created> {
    spec.validate()?;
    let root = open_root(&spec.root)?;
    let file_system = match enc {
        Some(_) => match fscrypt::probe(&root, &spec.root) {
            Ok(()) => Some(fscrypt::describe_fs(&root, &spec.root)),
            Err(msg) => {
                return Err(ScratchError::Encryption {
                    job: spec.job_id,
                    msg,
                })
            }
        },
        None => None,
    };
    // Quota support is decided before anything is written, so a required quota fails closed.
    let quota_support = spec
        .quota
        .as_ref()
        .map(|q| quota::probe(&root, &spec.root, q));
    if let (Some(q), Some(QuotaStatus::Unsupported { reason })) = (&spec.quota, &quota_support) {
        if q.required {
            return Err(ScratchError::Quota {
                job: spec.job_id,
                msg: reason.clone(),
            });
        }
    }
    let tenant_path = spec.tenant_dir();
    let (tenant, created_tenant_dir) =
        open_or_make_tenant_owned(&root, &spec.root, &spec.tenant, spec.tenant_gid)?;
    ensure_tenant_acl(&tenant, &tenant_path, spec.tenant_gid, &spec.tenant_groups)?;
    let name = spec.job_name();
    let path = spec.job_dir();
    match rfs::statat(&tenant, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => {}
        Ok(_) => {
            return Err(unsafe_path(
                &path,
                format!(
                    "already exists ({}); a job folder is never reused",
                    describe_entry(&tenant, &name)
                ),
            ));
        }
        Err(e) => return Err(io_err("fstatat", &path, e)),
    }
    rfs::mkdirat(&tenant, name.as_str(), Mode::from_raw_mode(0o700)).map_err(|e| match e {
        Errno::EXIST => unsafe_path(&path, "appeared while creating it; refusing"),
        e => io_err("mkdirat", &path, e),
    })?;
    let fd = open_beneath(&tenant, &name).map_err(|e| io_err("open new job folder", &path, e))?;
    // Encrypted before the user owns it: nothing can be written in clear.
    let encrypted = match (enc, file_system) {
        (Some((key, store)), Some(file_system)) => Some(encrypt_new_folder(
            spec,
            &root,
            &fd,
            &path,
            key,
            store,
            file_system,
        )?),
        _ => None,
    };
    rfs::fchown(
        &fd,
        Some(rfs::Uid::from_raw(spec.uid)),
        Some(rfs::Gid::from_raw(spec.gid)),
    )
    .map_err(|e| io_err("fchown", &path, e))?;
    // fchmod after fchown: chown clears setgid.
    rfs::fchmod(&fd, Mode::from_raw_mode(spec.mode)).map_err(|e| io_err("fchmod", &path, e))?;
    let quota = match (&spec.quota, quota_support) {
        (Some(q), Some(QuotaStatus::Supported)) => match quota::apply(&root, &tenant, &fd, q) {
            Ok(s) => s,
            Err(msg) if q.required => {
                let _ = wipe(spec);
                return Err(ScratchError::Quota {
                    job: spec.job_id,
                    msg,
                });
            }
            Err(msg) => QuotaStatus::Failed { reason: msg },
        },
        (Some(_), Some(s)) => s,
        _ => QuotaStatus::NotRequested,
    };
    Ok(Created {
        path,
        tenant_dir: tenant_path,
        created_tenant_dir,
        uid: spec.uid,
        gid: spec.gid,
        mode: spec.mode,
        quota,
        encrypted,
    })
}

/// The encryption steps of [`create_encrypted`] on the new, empty, root-owned folder `fd`.
fn encrypt_new_folder(
    spec: &ScratchSpec,
    root: &OwnedFd,
    fd: &OwnedFd,
    path: &Path,
    key: &JobKey,
    store: Option<&KeyStore>,
    file_system: String,
) -> Result<Encrypted> {
    let id = key.id();
    fscrypt::set_policy(fd, id).map_err(|e| ScratchError::Encryption {
        job: spec.job_id,
        msg: format!(
            "setting the encryption policy of {} failed: {e}; check the file system ({file_system})",
            path.display()
        ),
    })?;
    let wrapped_key = store
        .map(|s| s.store(key, &spec.tenant, spec.job_id))
        .transpose()?;
    let added = fscrypt::add_key(root, key).map_err(|e| ScratchError::Encryption {
        job: spec.job_id,
        msg: format!("adding the job's key to {file_system} failed: {e}"),
    })?;
    if added != id {
        // Not the key this folder names: it could open nothing, and would be nobody's.
        let _ = fscrypt::remove_key(root, added);
        return Err(ScratchError::Encryption {
            job: spec.job_id,
            msg: format!(
                "the kernel named the job's key {added}, not {id}: refusing an unknown key derivation"
            ),
        });
    }
    Ok(Encrypted {
        key_id: id,
        policy: fscrypt::POLICY_NAME.to_string(),
        file_system,
        wrapped_key,
    })
}

/// Opens root and the tenant folder for teardown; `None` when the tenant folder does not exist.
fn open_tenant_existing(spec: &ScratchSpec) -> Result<Option<OwnedFd>> {
    spec.validate()?;
    // A scratch root that is gone holds no job folder: teardown stays idempotent.
    if matches!(std::fs::symlink_metadata(&spec.root), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
    {
        return Ok(None);
    }
    let root = open_root(&spec.root)?;
    let path = spec.tenant_dir();
    match open_beneath(&root, &spec.tenant) {
        Ok(fd) => {
            check_tenant_owned(&fd, &path, spec.tenant_gid)?;
            Ok(Some(fd))
        }
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(open_error(&root, &spec.tenant, &path, e)),
    }
}

/// Removes the job folder and everything in it without following symlinks. Idempotent.
pub fn wipe(spec: &ScratchSpec) -> Result<Wiped> {
    let path = spec.job_dir();
    let Some(tenant) = open_tenant_existing(spec)? else {
        return Ok(Wiped::AlreadyGone { path });
    };
    let detached = mounts::detach_under(&tenant, &spec.tenant_dir(), &spec.job_name())?;
    match wipe::remove_entry(&tenant, &spec.job_name(), &path)? {
        None => Ok(Wiped::AlreadyGone { path }),
        Some(entries) => Ok(Wiped::Removed {
            path,
            entries,
            detached,
        }),
    }
}

/// Removes the key `id` of an encrypted job folder from its file system: what the folder
/// holds is unreadable from then on, to root too.
fn lock_job_key(spec: &ScratchSpec, id: KeyId) -> Result<Removal> {
    if matches!(std::fs::symlink_metadata(&spec.root), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
    {
        return Ok(Removal::Absent);
    }
    let root = open_root(&spec.root)?;
    trash::remove_key_fully(&root, id).map_err(|e| {
        io_err(
            "remove the encryption key (FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS) of",
            &spec.job_dir(),
            e,
        )
    })
}

/// [`wipe`] of an encrypted job folder: its key `id` removed first, then the tree deleted
/// here (a rollback, an orphan; the epilog uses [`erase`]).
pub fn wipe_encrypted(spec: &ScratchSpec, id: KeyId) -> Result<Wiped> {
    lock_job_key(spec, id)?;
    wipe(spec)
}

/// The end of an encrypted job folder of a wipe tier: its key `id` removed (the erase), then
/// the folder renamed into the trash under the scratch root, where [`trash::empty`] deletes
/// it outside the epilog: the epilog's time does not grow with the folder. Idempotent.
pub fn erase(spec: &ScratchSpec, id: KeyId) -> Result<Erased> {
    let path = spec.job_dir();
    let key = lock_job_key(spec, id)?;
    let Some(tenant) = open_tenant_existing(spec)? else {
        return Ok(Erased::AlreadyGone { path, key });
    };
    let name = spec.job_name();
    match rfs::statat(&tenant, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => return Ok(Erased::AlreadyGone { path, key }),
        Ok(st) if rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory => {}
        Ok(_) => {
            // Not a folder (never one this layer made): removed as it is.
            return match wipe::remove_entry(&tenant, &name, &path)? {
                None => Ok(Erased::AlreadyGone { path, key }),
                Some(entries) => Ok(Erased::Removed {
                    path,
                    key,
                    entries,
                    detached: Vec::new(),
                }),
            };
        }
        Err(e) => return Err(io_err("fstatat", &path, e)),
    }
    let detached = mounts::detach_under(&tenant, &spec.tenant_dir(), &name)?;
    let root = open_root(&spec.root)?;
    let entry = trash::entry_name(&spec.tenant, spec.job_id, id);
    match trash::move_in(&root, &spec.root, &tenant, &name, &entry)? {
        Some(trash) => Ok(Erased::Trashed {
            path,
            trash,
            key,
            detached,
        }),
        None => match wipe::remove_entry(&tenant, &name, &path)? {
            None => Ok(Erased::AlreadyGone { path, key }),
            Some(entries) => Ok(Erased::Removed {
                path,
                key,
                entries,
                detached,
            }),
        },
    }
}

/// [`retain`] of an encrypted job folder: its key `id` removed first, so the retained folder
/// is unreadable until `tenancyctl scratch unlock` adds it again from its wrapped copy.
pub fn retain_encrypted(spec: &ScratchSpec, id: KeyId, now: SystemTime) -> Result<Retained> {
    let removal = lock_job_key(spec, id)?;
    Ok(match retain(spec, now)? {
        Retained::Moved {
            from,
            to,
            retained_at,
            detached,
            ..
        } => Retained::Moved {
            from,
            to,
            retained_at,
            detached,
            key: Some(removal),
        },
        gone => gone,
    })
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

/// A retained folder of a job ([`find_retained`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RetainedFolder {
    pub path: PathBuf,
    pub tenant: String,
    pub job_id: u64,
    pub retained_at: u64,
    /// Its key, when it is encrypted.
    pub key_id: Option<KeyId>,
}

/// The retained folders of job `job_id` under `root` (of `tenant` alone when given): a job
/// requeued on the node may have several.
pub fn find_retained(
    root: &Path,
    job_id: u64,
    tenant: Option<&str>,
) -> Result<Vec<RetainedFolder>> {
    Ok(list_retained(root, tenant)?
        .into_iter()
        .filter(|f| f.job_id == job_id)
        .collect())
}

/// The keys of every encrypted retained folder under `root` (reconcile keeps their wrapped
/// copies).
pub fn retained_keys(root: &Path) -> Result<std::collections::BTreeSet<KeyId>> {
    if !root.is_dir() {
        return Ok(Default::default());
    }
    Ok(list_retained(root, None)?
        .into_iter()
        .filter_map(|f| f.key_id)
        .collect())
}

/// Every retained folder under `root` (of `tenant` alone when given).
pub fn list_retained(root: &Path, tenant: Option<&str>) -> Result<Vec<RetainedFolder>> {
    let rootfd = open_root(root)?;
    let mut out = Vec::new();
    let mut tenants = Vec::new();
    for ent in rfs::Dir::read_from(&rootfd).map_err(|e| io_err("readdir", root, e))? {
        let ent = ent.map_err(|e| io_err("readdir", root, e))?;
        let Ok(name) = ent.file_name().to_str() else {
            continue;
        };
        if validate_tenant_name(name).is_ok() && (tenant.is_none() || tenant == Some(name)) {
            tenants.push(name.to_string());
        }
    }
    tenants.sort();
    for t in tenants {
        let rel = format!("{t}/{RETAINED_DIR}");
        let Ok(rfd) = open_beneath(&rootfd, &rel) else {
            continue;
        };
        let rpath = root.join(&rel);
        for ent in rfs::Dir::read_from(&rfd).map_err(|e| io_err("readdir", &rpath, e))? {
            let ent = ent.map_err(|e| io_err("readdir", &rpath, e))?;
            let n = ent.file_name().to_string_lossy().into_owned();
            let Some((job_id, retained_at)) = parse_retained(&n) else {
                continue;
            };
            let key_id = open_beneath(&rfd, &n)
                .ok()
                .and_then(|fd| fscrypt::policy_of(&fd).ok().flatten());
            out.push(RetainedFolder {
                path: rpath.join(&n),
                tenant: t.clone(),
                job_id,
                retained_at,
                key_id,
            });
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Makes the retained encrypted folder readable again: its key unwrapped from `store` (it must
/// be bound to the folder's tenant and job) and added to the file system.
pub fn unlock(root: &Path, folder: &RetainedFolder, store: &KeyStore) -> Result<KeyId> {
    let Some(id) = folder.key_id else {
        return Err(unsafe_path(
            &folder.path,
            "is not encrypted: nothing to unlock",
        ));
    };
    let (key, owner) = store.load(id)?;
    if owner.tenant != folder.tenant || owner.job_id != folder.job_id {
        return Err(ScratchError::Key {
            msg: format!(
                "the wrapped key {id} belongs to tenant {} job {}, not to {} (tenant {} job {}): not unlocked",
                owner.tenant,
                owner.job_id,
                folder.path.display(),
                folder.tenant,
                folder.job_id
            ),
        });
    }
    let rootfd = open_root(root)?;
    let added = fscrypt::add_key(&rootfd, &key)
        .map_err(|e| io_err("add the encryption key of", &folder.path, e))?;
    if added != id {
        let _ = fscrypt::remove_key(&rootfd, added);
        return Err(unsafe_path(
            &folder.path,
            format!("the kernel named its key {added}, not {id}"),
        ));
    }
    Ok(id)
}

/// Locks a retained encrypted folder again (its key removed from the file system).
pub fn lock(root: &Path, folder: &RetainedFolder) -> Result<Removal> {
    let Some(id) = folder.key_id else {
        return Err(unsafe_path(
            &folder.path,
            "is not encrypted: nothing to lock",
        ));
    };
    let rootfd = open_root(root)?;
    trash::remove_key_fully(&rootfd, id).map_err(|e| io_err("remove the key of", &folder.path, e))
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Moves the job folder aside atomically to `<tenant>/.retained/job_<id>.<now_unix_secs>`.
/// Idempotent: a job folder that is already gone gives `AlreadyGone`.
pub fn retain(spec: &ScratchSpec, now: SystemTime) -> Result<Retained> {
    let from = spec.job_dir();
    let Some(tenant) = open_tenant_existing(spec)? else {
        return Ok(Retained::AlreadyGone { path: from });
    };
    let name = spec.job_name();
    match rfs::statat(&tenant, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => return Ok(Retained::AlreadyGone { path: from }),
        Ok(st) if rfs::FileType::from_raw_mode(st.st_mode) != rfs::FileType::Directory => {
            return Err(unsafe_path(
                &from,
                format!(
                    "is not a directory ({}); not retained",
                    describe_entry(&tenant, &name)
                ),
            ));
        }
        Ok(_) => {}
        Err(e) => return Err(io_err("fstatat", &from, e)),
    }
    // A mount would move with the folder and stay mounted there.
    let detached = mounts::detach_under(&tenant, &spec.tenant_dir(), &name)?;
    let (retained, _) =
        open_or_make_tenant_owned(&tenant, &spec.tenant_dir(), RETAINED_DIR, spec.tenant_gid)?;
    let ts = unix_secs(now);
    let new_name = format!("{name}.{ts}");
    let to = spec.tenant_dir().join(RETAINED_DIR).join(&new_name);
    rfs::renameat_with(
        &tenant,
        name.as_str(),
        &retained,
        new_name.as_str(),
        rfs::RenameFlags::NOREPLACE,
    )
    .map_err(|e| io_err("renameat", &from, e))?;
    Ok(Retained::Moved {
        from,
        to,
        retained_at: ts,
        detached,
        key: None,
    })
}

fn parse_retained(name: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix("job_")?;
    let (id, ts) = rest.split_once('.')?;
    Some((id.parse().ok()?, ts.parse().ok()?))
}

/// Removes retained job folders older than `retain_days` under every tenant folder of `root`.
/// Used by `tenancyctl reconcile`. Tenant folders that fail the safety checks are skipped; a
/// folder that cannot be removed is reported as [`Action::Failed`] and the purge goes on.
pub fn purge_retained(
    root: &Path,
    retain_days: u64,
    now: SystemTime,
    dry_run: bool,
) -> Result<Vec<Action>> {
    purge_retained_with(root, retain_days, now, dry_run, None)
}

/// [`purge_retained`]; an encrypted folder's key goes first ([`Action::DestroyKey`]): removed
/// from the file system if it was unlocked, and its wrapped copy in `keys` destroyed, so what
/// a failed removal leaves of the folder can never be read again.
pub fn purge_retained_with(
    root: &Path,
    retain_days: u64,
    now: SystemTime,
    dry_run: bool,
    keys: Option<&KeyStore>,
) -> Result<Vec<Action>> {
    let rootfd = open_root(root)?;
    let now = unix_secs(now);
    let mut actions = Vec::new();
    let dir = rfs::Dir::read_from(&rootfd).map_err(|e| io_err("readdir", root, e))?;
    let mut tenants: Vec<String> = Vec::new();
    for ent in dir {
        let ent = ent.map_err(|e| io_err("readdir", root, e))?;
        let Ok(name) = ent.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." || validate_tenant_name(name).is_err() {
            continue;
        }
        tenants.push(name.to_string());
    }
    tenants.sort();
    for tenant in tenants {
        let tpath = root.join(&tenant);
        let Ok(tfd) = open_beneath(&rootfd, &tenant) else {
            continue;
        }; // not a directory
        let tst = rfs::fstat(&tfd).map_err(|e| io_err("fstat", &tpath, e))?;
        let rpath = tpath.join(RETAINED_DIR);
        let rfd = match open_beneath(&tfd, RETAINED_DIR) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => continue,
            Err(e) => {
                actions.push(Action::Skip {
                    path: rpath,
                    reason: format!("cannot open safely: {e}"),
                });
                continue;
            }
        };
        if let Err(e) = check_tenant_owned(&tfd, &tpath, tst.st_gid)
            .and_then(|_| check_tenant_owned(&rfd, &rpath, tst.st_gid))
        {
            actions.push(Action::Skip {
                path: rpath,
                reason: e.to_string(),
            });
            continue;
        }
        let mut names = Vec::new();
        for ent in rfs::Dir::read_from(&rfd).map_err(|e| io_err("readdir", &rpath, e))? {
            let ent = ent.map_err(|e| io_err("readdir", &rpath, e))?;
            let n = ent.file_name().to_string_lossy().into_owned();
            if n != "." && n != ".." {
                names.push(n);
            }
        }
        names.sort();
        for n in names {
            let path = rpath.join(&n);
            let Some((job_id, retained_at)) = parse_retained(&n) else {
                actions.push(Action::Skip {
                    path,
                    reason: "name is not job_<id>.<unix_secs>".into(),
                });
                continue;
            };
            let age = now.saturating_sub(retained_at);
            if age < retain_days.saturating_mul(86_400) {
                continue;
            }
            let key_id = open_beneath(&rfd, &n)
                .ok()
                .and_then(|fd| fscrypt::policy_of(&fd).ok().flatten());
            if let Some(key_id) = key_id {
                let wrapped = keys.map(|k| k.path_of(key_id)).filter(|p| p.exists());
                if !dry_run {
                    let destroyed = trash::remove_key_fully(&rootfd, key_id)
                        .map_err(|e| io_err("remove the key of", &path, e))
                        .and_then(|_| keys.map_or(Ok(false), |k| k.destroy(key_id)));
                    if let Err(e) = destroyed {
                        actions.push(Action::Failed {
                            path,
                            tenant: tenant.clone(),
                            job_id,
                            retained_at,
                            age_days: age / 86_400,
                            error: format!("its key could not be destroyed: {e}"),
                        });
                        continue;
                    }
                }
                actions.push(Action::DestroyKey {
                    path: path.clone(),
                    tenant: tenant.clone(),
                    job_id,
                    key_id,
                    wrapped,
                    dry_run,
                });
            }
            let entries = if dry_run {
                0
            } else {
                match wipe::remove_entry(&rfd, &n, &path) {
                    Ok(entries) => entries.unwrap_or(0),
                    // One folder that cannot go (an immutable file, a mount point) must neither
                    // keep the others nor hide from the caller what was already removed.
                    Err(e) => {
                        actions.push(Action::Failed {
                            path,
                            tenant: tenant.clone(),
                            job_id,
                            retained_at,
                            age_days: age / 86_400,
                            error: e.to_string(),
                        });
                        continue;
                    }
                }
            };
            actions.push(Action::Remove {
                path,
                tenant: tenant.clone(),
                job_id,
                retained_at,
                age_days: age / 86_400,
                dry_run,
                entries,
            });
        }
    }
    Ok(actions)
}
