//! cgroup v1 devices controller backend.
//!
//! The v1 exception list cannot say "deny major 195 except minors 0 and 255" while the cgroup
//! is in default-allow mode (a deny exception for 195:* matches 195:0 too), so the layer turns
//! the cgroup into default-deny (`a` into devices.deny) and allows back:
//! `b *:* rwm`, `c M:* rwm` for every character major M below 512 (the kernel's
//! CHRDEV_MAJOR_MAX: no driver can register a higher major) that is not an NVIDIA major, and
//! then the job's NVIDIA devices and extra classes. Writing `a` requires a cgroup without
//! child cgroups: apply before steps exist (prolog) or to a product-owned leaf cgroup.
//!
//! The controller is hierarchical: rules on a job-level cgroup bind every step and task below.
//! `devices.list` reads `a *:* rwm` on some kernels whatever the rules are: verify by opening.

use crate::error::{Error, Result};
use crate::policy::DevicePolicy;
use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Character majors below this value are allowed wholesale unless they are NVIDIA majors.
pub const CHRDEV_MAJOR_MAX: u32 = 512;

/// One line to write, and whether an EPERM from the parent may be skipped (the parent denies
/// that class anyway, so the child's effective rights are the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1Rule {
    /// `devices.deny` or `devices.allow`.
    pub file: &'static str,
    pub line: String,
    pub optional: bool,
}

/// The rules `apply` writes, in order.
pub fn rules(policy: &DevicePolicy) -> Vec<V1Rule> {
    let mut out = Vec::with_capacity(CHRDEV_MAJOR_MAX as usize + policy.allow.len() + 2);
    out.push(V1Rule {
        file: "devices.deny",
        line: "a".into(),
        optional: false,
    });
    out.push(V1Rule {
        file: "devices.allow",
        line: "b *:* rwm".into(),
        optional: true,
    });
    for m in 0..CHRDEV_MAJOR_MAX {
        if policy.deny_majors.contains(&m) {
            continue;
        }
        let denied: Vec<u32> = policy
            .deny_devices
            .iter()
            .filter(|d| d.major == Some(m))
            .filter_map(|d| d.minor)
            .collect();
        if denied.is_empty() {
            out.push(V1Rule {
                file: "devices.allow",
                line: format!("c {m}:* rwm"),
                optional: true,
            });
            continue;
        }
        // v1 allow lists cannot take one minor out of `c m:*`: the major's other minors are
        // allowed one by one (static minors below 256; a dynamic one above is denied).
        for minor in (0..256).filter(|n| !denied.contains(n)) {
            out.push(V1Rule {
                file: "devices.allow",
                line: format!("c {m}:{minor} rwm"),
                optional: true,
            });
        }
    }
    for r in &policy.allow {
        out.push(V1Rule {
            file: "devices.allow",
            line: r.class.to_string(),
            optional: false,
        });
    }
    out
}

pub(crate) fn open_dir(path: &Path) -> Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::cgroup("open", path, std::io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: valid NUL-terminated path; flags request a directory, never a symlink.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(Error::cgroup("open", path, std::io::Error::last_os_error()));
    }
    // SAFETY: fresh fd owned by us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) fn open_in(dir: &OwnedFd, name: &str, flags: i32, shown: &Path) -> Result<File> {
    let c = CString::new(name).expect("static name");
    // SAFETY: dir is an open directory fd; name has no NUL.
    let fd = unsafe {
        libc::openat(
            dir.as_fd().as_raw_fd(),
            c.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(Error::cgroup(
            "open",
            shown.join(name),
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: fresh fd owned by us.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// What `apply` did (journal).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct V1Applied {
    /// Number of rules written.
    pub written: usize,
    /// Optional rules the parent refused (EPERM): classes the parent denies anyway.
    pub skipped: Vec<String>,
}

/// Write the policy into the v1 devices cgroup `cgroup_dir`.
pub fn apply(cgroup_dir: &Path, policy: &DevicePolicy) -> Result<V1Applied> {
    let dir = open_dir(cgroup_dir)?;
    let mut deny = open_in(&dir, "devices.deny", libc::O_WRONLY, cgroup_dir)?;
    let mut allow = open_in(&dir, "devices.allow", libc::O_WRONLY, cgroup_dir)?;
    let mut out = V1Applied {
        written: 0,
        skipped: Vec::new(),
    };
    for r in rules(policy) {
        let f = if r.file == "devices.deny" {
            &mut deny
        } else {
            &mut allow
        };
        // One rule per write(2): the kernel parses a single rule per write.
        match f.write(r.line.as_bytes()) {
            Ok(n) if n == r.line.len() => out.written += 1,
            Ok(n) => {
                return Err(Error::cgroup(
                    "short write to",
                    cgroup_dir.join(r.file),
                    std::io::Error::other(format!("{n} of {} bytes of {:?}", r.line.len(), r.line)),
                ))
            }
            Err(e) if r.optional && e.raw_os_error() == Some(libc::EPERM) => {
                out.skipped.push(r.line)
            }
            Err(e) => {
                let hint = if r.line == "a" && e.raw_os_error() == Some(libc::EINVAL) {
                    " (the cgroup has child cgroups: apply before steps exist or to a leaf)"
                } else if e.raw_os_error() == Some(libc::EPERM) {
                    " (the parent cgroup denies this device)"
                } else {
                    ""
                };
                return Err(Error::cgroup(
                    "write",
                    cgroup_dir.join(r.file),
                    std::io::Error::new(e.kind(), format!("rule {:?}: {e}{hint}", r.line)),
                ));
            }
        }
    }
    Ok(out)
}

/// Return a cgroup that the product does not own to default-allow (`a` into devices.allow),
/// which clears every exception this layer wrote. A missing cgroup is not an error.
pub fn reset(cgroup_dir: &Path) -> Result<()> {
    let dir = match open_dir(cgroup_dir) {
        Ok(d) => d,
        Err(Error::Cgroup { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    let mut allow = open_in(&dir, "devices.allow", libc::O_WRONLY, cgroup_dir)?;
    allow
        .write_all(b"a")
        .map_err(|e| Error::cgroup("write", cgroup_dir.join("devices.allow"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tests::job_a;

    #[test]
    fn rule_list() {
        let p = job_a();
        let r = rules(&p);
        assert_eq!(r[0].line, "a");
        assert_eq!(r[0].file, "devices.deny");
        let lines: Vec<&str> = r.iter().map(|x| x.line.as_str()).collect();
        assert!(lines.contains(&"c 1:* rwm"));
        assert!(lines.contains(&"c 136:* rwm"));
        assert!(!lines.contains(&"c 195:* rwm"));
        assert!(!lines.contains(&"c 235:* rwm"));
        assert!(!lines.contains(&"c 237:* rwm"));
        assert!(!lines.contains(&"c 234:* rwm"));
        assert!(lines.contains(&"c 195:255 rw"));
        assert!(lines.contains(&"c 195:0 rw"));
        assert!(lines.contains(&"c 235:12 rw"));
        assert!(lines.contains(&"c 235:13 rw"));
        assert!(!lines.iter().any(|l| l.starts_with("c 235:21")));
        // every non-optional line is the deny-all or an allow of the policy
        assert_eq!(r.iter().filter(|x| !x.optional).count(), 1 + p.allow.len());
    }
}
