//! Retained job folders under `<tenant>/.retained/`: moved there, listed, unlocked and
//! locked again, and purged after their days.

use crate::fsutil::{describe_entry, open_beneath, open_root};
use crate::tenant::{check_tenant_owned, open_or_make_tenant_owned, open_tenant_existing};
use crate::RETAINED_DIR;
use crate::{fscrypt, io_err, mounts, trash, unsafe_path, validate_tenant_name, wipe};
use crate::{Action, KeyId, KeyStore, Removal, Result, Retained, ScratchError, ScratchSpec};
use rustix::fs::{self as rfs, AtFlags};
use rustix::io::Errno;
use serde::Serialize;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

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

pub(crate) fn unix_secs(t: SystemTime) -> u64 {
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
    let tenants = tenant_names(&rootfd, root)?;
    for tenant in tenants {
        let Some((rfd, rpath)) = retained_dir(&rootfd, root, &tenant, &mut actions)? else {
            continue;
        };
        let names = folder_names(&rfd, &rpath)?;
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

/// The names under `root` that are tenant names, sorted.
fn tenant_names(rootfd: &OwnedFd, root: &Path) -> Result<Vec<String>> {
    let dir = rfs::Dir::read_from(rootfd).map_err(|e| io_err("readdir", root, e))?;
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
    Ok(tenants)
}

/// `<root>/<tenant>/.retained`, opened and checked as the tenant's; `None` when there is none,
/// or it is unsafe (a [`Action::Skip`] in `actions`).
fn retained_dir(
    rootfd: &OwnedFd,
    root: &Path,
    tenant: &str,
    actions: &mut Vec<Action>,
) -> Result<Option<(OwnedFd, PathBuf)>> {
    let tpath = root.join(tenant);
    let Ok(tfd) = open_beneath(rootfd, tenant) else {
        return Ok(None);
    }; // not a directory
    let tst = rfs::fstat(&tfd).map_err(|e| io_err("fstat", &tpath, e))?;
    let rpath = tpath.join(RETAINED_DIR);
    let rfd = match open_beneath(&tfd, RETAINED_DIR) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => {
            actions.push(Action::Skip {
                path: rpath,
                reason: format!("cannot open safely: {e}"),
            });
            return Ok(None);
        }
    };
    if let Err(e) = check_tenant_owned(&tfd, &tpath, tst.st_gid)
        .and_then(|_| check_tenant_owned(&rfd, &rpath, tst.st_gid))
    {
        actions.push(Action::Skip {
            path: rpath,
            reason: e.to_string(),
        });
        return Ok(None);
    }
    Ok(Some((rfd, rpath)))
}

/// The entries of the `.retained` folder `rfd` (at `rpath`), sorted.
fn folder_names(rfd: &OwnedFd, rpath: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for ent in rfs::Dir::read_from(rfd).map_err(|e| io_err("readdir", rpath, e))? {
        let ent = ent.map_err(|e| io_err("readdir", rpath, e))?;
        let n = ent.file_name().to_string_lossy().into_owned();
        if n != "." && n != ".." {
            names.push(n);
        }
    }
    names.sort();
    Ok(names)
}
