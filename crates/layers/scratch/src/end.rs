//! What ends a job folder: wiped, erased (its key removed first) or retained locked.

use crate::fsutil::open_root;
use crate::tenant::open_tenant_existing;
use crate::{io_err, mounts, retain, trash, Result, ScratchSpec};
use crate::{Erased, KeyId, Removal, Retained, Wiped};
use rustix::fs::{self as rfs, AtFlags};
use rustix::io::Errno;
use std::time::SystemTime;

/// Removes the job folder and everything in it without following symlinks. Idempotent.
pub fn wipe(spec: &ScratchSpec) -> Result<Wiped> {
    let path = spec.job_dir();
    let Some(tenant) = open_tenant_existing(spec)? else {
        return Ok(Wiped::AlreadyGone { path });
    };
    let detached = mounts::detach_under(&tenant, &spec.tenant_dir(), &spec.job_name())?;
    match crate::wipe::remove_entry(&tenant, &spec.job_name(), &path)? {
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
pub(crate) fn lock_job_key(spec: &ScratchSpec, id: KeyId) -> Result<Removal> {
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
            return match crate::wipe::remove_entry(&tenant, &name, &path)? {
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
        None => match crate::wipe::remove_entry(&tenant, &name, &path)? {
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
