//! Encrypted job folders whose key is removed wait in `<scratch_root>/.trash` for deletion.
//!
//! Removing the key is the erase; unlinking a tree of many files takes time in proportion to
//! it. So the epilog removes the key, renames the folder into the trash (one rename on the same
//! file system: atomic, and the trash itself is the record of what is left to delete), and a
//! detached process ([`empty`], started by the epilog) deletes it. What a crash leaves there is
//! found again by the next emptying or `tenancyctl reconcile`. Entries are named
//! `<tenant>.job_<id>.<key id>`; the trash is root's alone (0700), so no user enters it.

use crate::fscrypt::{self, KeyId, Removal};
use crate::fsutil::{open_beneath, open_root};
use crate::{io_err, unsafe_path, wipe, Result};
use rustix::fs::{self as rfs, FlockOperation, Mode};
use rustix::io::Errno;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// The trash folder under the scratch root (no tenant can have this name).
pub const TRASH_DIR: &str = ".trash";

static PENDING: AtomicBool = AtomicBool::new(false);

/// Whether this process moved a folder into the trash: the epilog then starts [`empty`] in a
/// detached process before it exits.
pub fn pending() -> bool {
    PENDING.load(Ordering::Relaxed)
}

/// One folder waiting in the trash.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TrashEntry {
    pub path: PathBuf,
    pub tenant: String,
    pub job_id: u64,
    pub key_id: Option<KeyId>,
}

/// The name of a job folder in the trash.
pub(crate) fn entry_name(tenant: &str, job_id: u64, id: KeyId) -> String {
    format!("{tenant}.job_{job_id}.{id}")
}

fn parse_entry(name: &str) -> Option<(String, u64, Option<KeyId>)> {
    let (tenant, rest) = name.split_once(".job_")?;
    let (job, id) = rest.split_once('.')?;
    Some((tenant.to_string(), job.parse().ok()?, id.parse().ok()))
}

/// Opens the trash under `root` (made root:root 0700 when `make` and missing); `None` when it
/// is not there. Anything else where it belongs is refused.
fn open_trash(root: &OwnedFd, root_path: &Path, make: bool) -> Result<Option<OwnedFd>> {
    let path = root_path.join(TRASH_DIR);
    let fd = match open_beneath(root, TRASH_DIR) {
        Ok(fd) => fd,
        Err(Errno::NOENT) if make => {
            match rfs::mkdirat(root, TRASH_DIR, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(io_err("mkdirat", &path, e)),
            }
            open_beneath(root, TRASH_DIR).map_err(|e| io_err("open", &path, e))?
        }
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io_err("open", &path, e)),
    };
    let st = rfs::fstat(&fd).map_err(|e| io_err("fstat", &path, e))?;
    if st.st_uid != 0 || st.st_mode & 0o077 != 0 {
        return Err(unsafe_path(
            &path,
            format!(
                "is not root's alone (uid {}, mode {:o}); it holds erased job folders: chown \
                 root and chmod 700 it",
                st.st_uid,
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(Some(fd))
}

/// Renames `tenant_dir/name` (an encrypted job folder whose key is removed) into the trash.
/// `Ok(None)`: the trash is on another file system than the folder (a tenant folder that is a
/// mount point): the caller deletes it in place.
pub(crate) fn move_in(
    root: &OwnedFd,
    root_path: &Path,
    tenant_dir: &OwnedFd,
    name: &str,
    entry: &str,
) -> Result<Option<PathBuf>> {
    let trash = open_trash(root, root_path, true)?.expect("made");
    let to = root_path.join(TRASH_DIR).join(entry);
    match rfs::renameat_with(tenant_dir, name, &trash, entry, rfs::RenameFlags::NOREPLACE) {
        Ok(()) => {
            PENDING.store(true, Ordering::Relaxed);
            Ok(Some(to))
        }
        Err(Errno::XDEV) => Ok(None),
        Err(e) => Err(io_err("renameat into the trash", &to, e)),
    }
}

/// The folders waiting in the trash of `root`.
pub fn list(root: &Path) -> Result<Vec<TrashEntry>> {
    let rootfd = open_root(root)?;
    let Some(trash) = open_trash(&rootfd, root, false)? else {
        return Ok(Vec::new());
    };
    let dir = root.join(TRASH_DIR);
    let mut out = Vec::new();
    for name in names(&trash, &dir)? {
        let (tenant, job_id, key_id) = parse_entry(&name).unwrap_or_default();
        out.push(TrashEntry {
            path: dir.join(&name),
            tenant,
            job_id,
            key_id,
        });
    }
    Ok(out)
}

fn names(dir: &OwnedFd, path: &Path) -> Result<Vec<String>> {
    let mut v = Vec::new();
    for ent in rfs::Dir::read_from(dir).map_err(|e| io_err("readdir", path, e))? {
        let ent = ent.map_err(|e| io_err("readdir", path, e))?;
        let n = ent.file_name().to_string_lossy().into_owned();
        if n != "." && n != ".." {
            v.push(n);
        }
    }
    v.sort();
    Ok(v)
}

/// What [`empty`] did.
#[derive(Debug, Default)]
pub struct Emptied {
    /// Deleted, with the number of entries each held.
    pub removed: Vec<(TrashEntry, u64)>,
    /// Could not be deleted (what is left of it stays for the next emptying).
    pub failed: Vec<(TrashEntry, String)>,
    /// Another process holds the trash (it deletes what is there, this one did nothing).
    pub held_elsewhere: bool,
}

/// Deletes everything in the trash of `root`, one process at a time (an flock on the trash;
/// with `wait` false, a second process leaves at once: the first one looks again before it
/// lets go). Before each folder goes, its key is removed again: a removal that found files in
/// use is completed here.
pub fn empty(root: &Path, wait: bool) -> Result<Emptied> {
    let mut done = Emptied::default();
    let rootfd = open_root(root)?;
    let Some(trash) = open_trash(&rootfd, root, false)? else {
        return Ok(done);
    };
    let dir = root.join(TRASH_DIR);
    let op = if wait {
        FlockOperation::LockExclusive
    } else {
        FlockOperation::NonBlockingLockExclusive
    };
    match rfs::flock(&trash, op) {
        Ok(()) => {}
        Err(Errno::WOULDBLOCK) => {
            done.held_elsewhere = true;
            return Ok(done);
        }
        Err(e) => return Err(io_err("flock", &dir, e)),
    }
    let mut failed_names = std::collections::BTreeSet::new();
    loop {
        let todo: Vec<String> = names(&trash, &dir)?
            .into_iter()
            .filter(|n| !failed_names.contains(n))
            .collect();
        if todo.is_empty() {
            break;
        }
        for name in todo {
            let (tenant, job_id, key_id) = parse_entry(&name).unwrap_or_default();
            let entry = TrashEntry {
                path: dir.join(&name),
                tenant,
                job_id,
                key_id,
            };
            match delete_entry(&rootfd, &trash, &name, &entry.path) {
                Ok(n) => done.removed.push((entry, n)),
                Err(e) => {
                    failed_names.insert(name);
                    done.failed.push((entry, e.to_string()));
                }
            }
        }
    }
    Ok(done)
}

/// Removes the key of a trashed folder (again: completes a removal that found files in use),
/// then the folder.
fn delete_entry(root: &OwnedFd, trash: &OwnedFd, name: &str, path: &Path) -> Result<u64> {
    if let Ok(fd) = open_beneath(trash, name) {
        if let Ok(Some(id)) = fscrypt::policy_of(&fd) {
            remove_key_fully(root, id).map_err(|e| io_err("remove the key of", path, e))?;
        }
    }
    Ok(wipe::remove_entry(trash, name, path)?.unwrap_or(0))
}

/// Removes the key `id` from the file system of `fs`; files still in use are given a few
/// moments to be closed (the removal evicts every file that is not), then reported.
pub(crate) fn remove_key_fully(fs: &OwnedFd, id: KeyId) -> std::result::Result<Removal, Errno> {
    let mut last = fscrypt::remove_key(fs, id)?;
    for _ in 0..4 {
        if last != Removal::FilesBusy {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
        last = match fscrypt::remove_key(fs, id)? {
            // The secret went with the first call: a later one finds no key left to remove
            // once the busy files were evicted.
            Removal::Absent => Removal::Removed,
            r => r,
        };
    }
    Ok(last)
}

/// Whether anything waits in the trash of `root` (no error: an unreadable trash is `false`,
/// and reported by [`list`]).
pub fn has_entries(root: &Path) -> bool {
    let Ok(rootfd) = open_root(root) else {
        return false;
    };
    match open_trash(&rootfd, root, false) {
        Ok(Some(fd)) => names(&fd, &root.join(TRASH_DIR)).is_ok_and(|n| !n.is_empty()),
        _ => false,
    }
}
