//! The tenant folder `<root>/<tenant>/`: root's, the tenant's group, its ACL, checked on
//! every open.

use crate::fsutil::{describe_entry, open_beneath, open_root};
use crate::{acl, io_err, unsafe_path, Result, ScratchError, ScratchSpec, TENANT_DIR_MODE};
use rustix::fs::{self as rfs, AtFlags, Mode};
use rustix::io::Errno;
use std::os::fd::OwnedFd;
use std::path::Path;

/// Verifies an open tenant-owned folder (tenant folder or `.retained`): a directory owned by root,
/// group `gid`, no group write, nothing for others.
pub(crate) fn check_tenant_owned(fd: &OwnedFd, path: &Path, gid: u32) -> Result<()> {
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
pub(crate) fn open_or_make_tenant_owned(
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
pub(crate) fn ensure_tenant_acl(fd: &OwnedFd, path: &Path, gid: u32, groups: &[u32]) -> Result<()> {
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

/// Opens root and the tenant folder for teardown; `None` when the tenant folder does not exist.
pub(crate) fn open_tenant_existing(spec: &ScratchSpec) -> Result<Option<OwnedFd>> {
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
