//! Making a job folder, in clear or encrypted with a key of its own.

use crate::fsutil::{describe_entry, open_beneath, open_root};
use crate::tenant::{ensure_tenant_acl, open_or_make_tenant_owned};
use crate::{fscrypt, io_err, quota, unsafe_path, wipe, Result, ScratchError, ScratchSpec};
use crate::{Created, Encrypted, JobKey, KeyStore, QuotaStatus};
use rustix::fs::{self as rfs, AtFlags, Mode};
use rustix::io::Errno;
use std::os::fd::OwnedFd;
use std::path::Path;

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
