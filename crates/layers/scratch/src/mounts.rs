//! Mounts under a job's scratch folder, detached before the folder is wiped or retained.
//!
//! A job's user can mount inside the folder they own (FUSE through the setuid `fusermount`;
//! root in the job can bind-mount). The wipe cannot remove a mount point (EBUSY), nor enter a
//! FUSE mount of another user (EACCES, even as root), and a retained folder would carry the
//! mount with it: every mount under the folder is detached first (`MNT_DETACH`, which also takes
//! the mounts under it). The mount point is reached from the tenant folder's descriptor without
//! following symlinks (its parent opened beneath, the last component with `UMOUNT_NOFOLLOW`),
//! so a path the user swapped meanwhile cannot make this detach another mount.

use crate::fsutil::open_beneath;
use crate::{io_err, unsafe_path, Result};
use rustix::io::Errno;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Rounds of detaching: a mount stacked on another needs one round per layer.
const MAX_ROUNDS: usize = 64;

/// `\040`-style escapes of /proc/self/mountinfo undone.
fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(out))
}

/// Mount points of this process's mount namespace (field 5 of mountinfo).
fn mount_points() -> std::io::Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape)
        .collect())
}

/// One mount, as mountinfo describes it.
pub(crate) struct MountInfo {
    pub fstype: String,
    pub source: String,
    pub mount_point: PathBuf,
}

/// The mount of device `dev` that holds `path`: of the mounts of that device (field 3 of
/// mountinfo), the one whose mount point is the longest prefix of `path`.
pub(crate) fn mount_of(path: &Path, dev: u64) -> Option<MountInfo> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
    let mut best: Option<MountInfo> = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.get(2) != Some(&want.as_str()) || fields.len() < sep + 3 {
            continue;
        }
        let point = unescape(fields[4]);
        if !path.starts_with(&point) {
            continue;
        }
        if best
            .as_ref()
            .is_some_and(|b| b.mount_point.as_os_str().len() >= point.as_os_str().len())
        {
            continue;
        }
        best = Some(MountInfo {
            fstype: fields[sep + 1].to_string(),
            source: unescape(fields[sep + 2]).display().to_string(),
            mount_point: point,
        });
    }
    best
}

/// The outermost mount points at or below `dir` (a mount below another goes with it).
fn outermost_under(points: &[PathBuf], dir: &Path) -> Vec<PathBuf> {
    let mut under: Vec<PathBuf> = points
        .iter()
        .filter(|p| p.starts_with(dir))
        .cloned()
        .collect();
    under.sort();
    under.dedup();
    let all = under.clone();
    under.retain(|p| !all.iter().any(|q| q != p && p.starts_with(q)));
    under
}

/// Detaches every mount at or below `<tenant>/<job_name>`; returns their paths (as `tenant_path`
/// names the tenant folder). `tenant` is the tenant folder's descriptor.
pub(crate) fn detach_under(
    tenant: &OwnedFd,
    tenant_path: &Path,
    job_name: &str,
) -> Result<Vec<PathBuf>> {
    // The folder as the kernel names it in mountinfo (scratch_root may hold a symlink).
    let real = std::fs::read_link(format!("/proc/self/fd/{}", tenant.as_raw_fd()))
        .map_err(|e| unsafe_path(tenant_path, format!("cannot name the tenant folder: {e}")))?;
    let job_real = real.join(job_name);
    let mut detached = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let points = mount_points().map_err(|e| {
            unsafe_path(
                tenant_path,
                format!("cannot read /proc/self/mountinfo: {e}"),
            )
        })?;
        let found = outermost_under(&points, &job_real);
        if found.is_empty() {
            return Ok(detached);
        }
        for point in found {
            let rel = point.strip_prefix(&real).expect("under the tenant folder");
            let shown = tenant_path.join(rel);
            let name = rel.file_name().expect("a job folder or below it");
            let parent_rel = rel.parent().unwrap_or(Path::new(""));
            let parent = if parent_rel.as_os_str().is_empty() {
                None
            } else {
                let p = parent_rel.to_str().ok_or_else(|| {
                    unsafe_path(&shown, "mount point path is not UTF-8; detach it by hand")
                })?;
                Some(open_beneath(tenant, p).map_err(|e| io_err("open", &shown, e))?)
            };
            let dirfd = parent.as_ref().unwrap_or(tenant).as_raw_fd();
            let mut target = format!("/proc/self/fd/{dirfd}/").into_bytes();
            target.extend_from_slice(name.as_bytes());
            let target = CString::new(target)
                .map_err(|_| unsafe_path(&shown, "mount point name holds a NUL byte"))?;
            // SAFETY: umount2 reads a NUL-terminated path; the fd stays open meanwhile.
            let rc =
                unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
            if rc != 0 {
                let e = Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO);
                // Gone meanwhile (EINVAL: no longer a mount point; ENOENT): the next round sees.
                if e != Errno::INVAL && e != Errno::NOENT {
                    return Err(io_err("umount2(MNT_DETACH)", &shown, e));
                }
            } else {
                detached.push(shown);
            }
        }
    }
    Err(unsafe_path(
        &tenant_path.join(job_name),
        "mounts keep appearing under the job folder; end the job's processes first",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_and_nesting() {
        assert_eq!(unescape("/s/a\\040b"), PathBuf::from("/s/a b"));
        assert_eq!(unescape("/x\\"), PathBuf::from("/x\\"));
        let p = |s: &str| PathBuf::from(s);
        let points = [
            p("/"),
            p("/s/t/job_1x"),
            p("/s/t/job_1/m"),
            p("/s/t/job_1/m/n"),
            p("/s/t/job_1"),
        ];
        assert_eq!(
            outermost_under(&points, Path::new("/s/t/job_1")),
            vec![p("/s/t/job_1")]
        );
        assert_eq!(
            outermost_under(&points[..4], Path::new("/s/t/job_1")),
            vec![p("/s/t/job_1/m")]
        );
    }
}
