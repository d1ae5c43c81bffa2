//! Per-tenant project quotas (ext4 / XFS project ids).
//!
//! Path: the tenant folder and the job folder get the tenant's project id and
//! `FS_XFLAG_PROJINHERIT` (`FS_IOC_FSGETXATTR`/`FS_IOC_FSSETXATTR`), so everything created below
//! is charged to the project; limits are set with `quotactl_fd(Q_SETQUOTA, PRJQUOTA)` on the
//! scratch root fd (Linux >= 5.14; no block device lookup). Support is probed first
//! (`Q_GETINFO`): a kernel without CONFIG_QUOTA answers ENOSYS, a filesystem mounted without
//! project quotas answers ESRCH; both give [`QuotaStatus::Unsupported`] with the reason, never a
//! pretend success. Lustre (`lfs setquota -p`) is detected and reported as unsupported.

use rustix::fs as rfs;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// Quota wanted for the tenant (journal material).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaSpec {
    /// Project id of the tenant (unique per tenant, from the admin config).
    pub project_id: u32,
    /// Hard block limit in KiB (0 = none).
    pub block_hard_kib: u64,
    /// Hard inode limit (0 = none).
    pub inode_hard: u64,
    /// When true, `create` fails (writing nothing) where quotas cannot be applied.
    #[serde(default)]
    pub required: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum QuotaStatus {
    NotRequested,
    /// Probe result only: the filesystem accepts project quotas.
    Supported,
    Applied {
        project_id: u32,
        block_hard_kib: u64,
        inode_hard: u64,
    },
    Unsupported {
        reason: String,
    },
    /// Supported but setting it failed (only when the quota is not `required`).
    Failed {
        reason: String,
    },
}

const EXT4_SUPER_MAGIC: i64 = 0xEF53;
const XFS_SUPER_MAGIC: i64 = 0x5846_5342;
const LUSTRE_SUPER_MAGIC: i64 = 0x0BD0_0BD0;

const PRJQUOTA: u32 = 2;
const Q_GETINFO: u32 = 0x80_0005;
const Q_SETQUOTA: u32 = 0x80_0008;
const QIF_BLIMITS: u32 = 1;
const QIF_ILIMITS: u32 = 4;
const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;
// _IOR('X', 31, struct fsxattr) / _IOW('X', 32, struct fsxattr), sizeof(fsxattr) = 28
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;

fn qcmd(cmd: u32, ty: u32) -> libc::c_int {
    ((cmd << 8) | (ty & 0xff)) as libc::c_int
}

#[repr(C)]
#[derive(Default)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

#[repr(C)]
#[derive(Default)]
struct IfDqinfo {
    bgrace: u64,
    igrace: u64,
    flags: u32,
    valid: u32,
}

#[repr(C)]
#[derive(Default)]
struct IfDqblk {
    bhardlimit: u64,
    bsoftlimit: u64,
    curspace: u64,
    ihardlimit: u64,
    isoftlimit: u64,
    curinodes: u64,
    btime: u64,
    itime: u64,
    valid: u32,
}

fn quotactl_fd(
    fd: &OwnedFd,
    cmd: libc::c_int,
    id: u32,
    addr: *mut libc::c_void,
) -> std::io::Result<()> {
    // SAFETY: quotactl_fd reads/writes the struct `addr` points at, which the caller sizes for `cmd`.
    let r = unsafe { libc::syscall(libc::SYS_quotactl_fd, fd.as_raw_fd(), cmd, id, addr) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Decides whether project quotas can be set under the scratch root. Writes nothing.
pub fn probe(root: &OwnedFd, root_path: &Path, _q: &QuotaSpec) -> QuotaStatus {
    let fs = match rfs::fstatfs(root) {
        Ok(s) => s,
        Err(e) => {
            return QuotaStatus::Unsupported {
                reason: format!("fstatfs {}: {e}", root_path.display()),
            }
        }
    };
    let magic = fs.f_type as i64;
    match magic {
        EXT4_SUPER_MAGIC | XFS_SUPER_MAGIC => {}
        LUSTRE_SUPER_MAGIC => {
            return QuotaStatus::Unsupported {
                reason: format!("{} is Lustre: project quotas there are set with `lfs setquota -p`, not implemented", root_path.display()),
            }
        }
        m => {
            return QuotaStatus::Unsupported {
                reason: format!("{} is on a filesystem (magic {m:#x}) without project quota support here (ext4/XFS only)", root_path.display()),
            }
        }
    }
    let mut info = IfDqinfo::default();
    match quotactl_fd(
        root,
        qcmd(Q_GETINFO, PRJQUOTA),
        0,
        &mut info as *mut _ as *mut libc::c_void,
    ) {
        Ok(()) => QuotaStatus::Supported,
        Err(e) => QuotaStatus::Unsupported {
            reason: match e.raw_os_error() {
                Some(libc::ENOSYS) => {
                    "the kernel has no quota support (quotactl_fd: ENOSYS, CONFIG_QUOTA off)".into()
                }
                Some(libc::ESRCH) => format!(
                    "project quotas are not enabled on the filesystem of {} (mount with prjquota)",
                    root_path.display()
                ),
                _ => format!(
                    "quotactl_fd(Q_GETINFO, PRJQUOTA) on {}: {e}",
                    root_path.display()
                ),
            },
        },
    }
}

fn set_projid(fd: &OwnedFd, projid: u32) -> Result<(), String> {
    let mut x = FsXattr::default();
    // SAFETY: the ioctls read/write one `struct fsxattr` (28 bytes, repr(C) above).
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            FS_IOC_FSGETXATTR as _,
            &mut x as *mut FsXattr,
        )
    } < 0
    {
        return Err(format!(
            "FS_IOC_FSGETXATTR: {}",
            std::io::Error::last_os_error()
        ));
    }
    x.projid = projid;
    x.xflags |= FS_XFLAG_PROJINHERIT;
    if unsafe { libc::ioctl(fd.as_raw_fd(), FS_IOC_FSSETXATTR as _, &x as *const FsXattr) } < 0 {
        return Err(format!(
            "FS_IOC_FSSETXATTR projid {projid}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Tags the tenant and job folders with the project id and sets the project limits.
pub(crate) fn apply(
    root: &OwnedFd,
    tenant: &OwnedFd,
    job: &OwnedFd,
    q: &QuotaSpec,
) -> Result<QuotaStatus, String> {
    set_projid(tenant, q.project_id)?;
    set_projid(job, q.project_id)?;
    let mut d = IfDqblk {
        bhardlimit: q.block_hard_kib,
        ihardlimit: q.inode_hard,
        valid: QIF_BLIMITS | QIF_ILIMITS,
        ..Default::default()
    };
    quotactl_fd(
        root,
        qcmd(Q_SETQUOTA, PRJQUOTA),
        q.project_id,
        &mut d as *mut _ as *mut libc::c_void,
    )
    .map_err(|e| format!("quotactl_fd(Q_SETQUOTA, project {}): {e}", q.project_id))?;
    Ok(QuotaStatus::Applied {
        project_id: q.project_id,
        block_hard_kib: q.block_hard_kib,
        inode_hard: q.inode_hard,
    })
}
