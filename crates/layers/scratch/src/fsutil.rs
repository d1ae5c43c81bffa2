//! Symlink-safe directory helpers on file descriptors (the scratch layer's, and storage-audit's
//! walk).

use crate::{io_err, unsafe_path, Result};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};

/// How a folder below a root is opened: read-only, a folder, never through a symlink.
pub const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

pub(crate) fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

/// Opens directory `name` (one or more components) beneath `dir`: no symlink anywhere, no `..`
/// escape. ELOOP when a symlink is met, ENOTDIR when it is not a directory.
pub(crate) fn open_beneath(dir: &OwnedFd, name: &str) -> std::result::Result<OwnedFd, Errno> {
    open_beneath_on(dir, Path::new(name), false)
}

/// [`open_beneath`] that also stays on `dir`'s mount (the storage audit's walk): EXDEV when a
/// component is a mount point. Without `openat2` the check is each component's file system
/// (st_dev) against `dir`'s, as the walk itself checks the entries it descends into.
pub fn open_beneath_same_fs(dir: &OwnedFd, name: &Path) -> std::result::Result<OwnedFd, Errno> {
    open_beneath_on(dir, name, true)
}

fn open_beneath_on(
    dir: &OwnedFd,
    name: &Path,
    same_fs: bool,
) -> std::result::Result<OwnedFd, Errno> {
    // Set when openat2 turned out to be missing or filtered: the process asks once.
    static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
    let mut how = resolve_flags();
    if same_fs {
        how |= ResolveFlags::NO_XDEV;
    }
    while !NO_OPENAT2.load(Ordering::Relaxed) {
        match rfs::openat2(dir, name, DIR_FLAGS, Mode::empty(), how) {
            Err(Errno::AGAIN) | Err(Errno::INTR) => continue,
            Err(Errno::NOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
            Err(Errno::PERM) if openat2_filtered() => NO_OPENAT2.store(true, Ordering::Relaxed),
            r => return r,
        }
    }
    open_each_component(dir, name, same_fs)
}

/// Whether a seccomp filter refuses `openat2` itself, as older container profiles do with
/// EPERM (newer ones answer ENOSYS): then it fails even for `/` as an O_PATH, which nothing
/// else refuses. An EPERM with `openat2` working is the path's own, and is returned.
fn openat2_filtered() -> bool {
    let probe = rfs::openat2(
        rfs::CWD,
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::empty(),
    );
    matches!(probe, Err(Errno::PERM) | Err(Errno::NOSYS))
}

/// What `openat2` does for [`open_beneath_on`] where the kernel has none (Linux before 5.6, or
/// a seccomp filter that answers ENOSYS, as container runtimes do for system calls newer than
/// their profile, or EPERM, as older profiles do): one `openat` per component, each with
/// O_NOFOLLOW, and no `..`, `.` (but `name` itself) or leading `/`, so that neither a symlink
/// nor an escape can be resolved; a few system calls more per path.
fn open_each_component(
    dir: &OwnedFd,
    name: &Path,
    same_fs: bool,
) -> std::result::Result<OwnedFd, Errno> {
    if name == Path::new(".") {
        return openat_dir(dir, OsStr::new("."));
    }
    let dev = if same_fs {
        Some(rfs::fstat(dir)?.st_dev)
    } else {
        None
    };
    let mut cur: Option<OwnedFd> = None;
    for c in name.components() {
        let Component::Normal(c) = c else {
            return Err(Errno::XDEV);
        };
        let at = cur.as_ref().unwrap_or(dir);
        let next = match openat_dir(at, c) {
            // O_DIRECTORY | O_NOFOLLOW says ENOTDIR for a symlink; openat2 says ELOOP.
            Err(Errno::NOTDIR) if is_symlink(at, c) => return Err(Errno::LOOP),
            r => r?,
        };
        if let Some(dev) = dev {
            if rfs::fstat(&next)?.st_dev != dev {
                return Err(Errno::XDEV);
            }
        }
        cur = Some(next);
    }
    cur.ok_or(Errno::NOENT)
}

fn openat_dir(dir: &OwnedFd, name: &OsStr) -> std::result::Result<OwnedFd, Errno> {
    loop {
        match rfs::openat(dir, name, DIR_FLAGS, Mode::empty()) {
            Err(Errno::INTR) => continue,
            r => return r,
        }
    }
}

fn is_symlink(dir: &OwnedFd, name: &OsStr) -> bool {
    rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink)
}

/// A human description of what sits at `name` in `dir`, without following it.
pub(crate) fn describe_entry(dir: &OwnedFd, name: &str) -> String {
    match rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(e) => format!("cannot stat: {e}"),
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                let target = rfs::readlinkat(dir, name, Vec::new())
                    .map(|t| t.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| "?".into());
                format!("a symlink to {target:?}")
            }
            FileType::Directory => format!(
                "a directory owned by {}:{} mode {:04o}",
                st.st_uid,
                st.st_gid,
                st.st_mode & 0o7777
            ),
            ft => format!("a {ft:?} owned by {}:{}", st.st_uid, st.st_gid),
        },
    }
}

/// Opens the scratch root, walking from `/` one component at a time without following any
/// symlink. Every ancestor must be owned by root and not writable by group/others unless it
/// has the sticky bit (like /tmp); the root itself must be owned by root and not group/world
/// writable, sticky or not.
pub(crate) fn open_root(root: &Path) -> Result<OwnedFd> {
    if !root.is_absolute() {
        return Err(unsafe_path(root, "scratch root must be an absolute path"));
    }
    let mut cur =
        rfs::open("/", DIR_FLAGS, Mode::empty()).map_err(|e| io_err("open", Path::new("/"), e))?;
    let mut cur_path = std::path::PathBuf::from("/");
    let comps: Vec<Component> = root.components().collect();
    for (i, c) in comps.iter().enumerate() {
        let last = i + 1 == comps.len();
        match c {
            Component::RootDir => {}
            Component::Normal(name) => {
                cur_path.push(name);
                let next = rfs::openat(&cur, *name, DIR_FLAGS, Mode::empty()).map_err(|e| match e {
                    Errno::LOOP | Errno::NOTDIR => unsafe_path(
                        &cur_path,
                        "is a symlink or not a directory; configure the real path of the scratch root",
                    ),
                    e => io_err("open", &cur_path, e),
                })?;
                cur = next;
            }
            _ => {
                return Err(unsafe_path(
                    root,
                    "scratch root path must not contain . or ..",
                ))
            }
        }
        let st = rfs::fstat(&cur).map_err(|e| io_err("fstat", &cur_path, e))?;
        let mode = st.st_mode & 0o7777;
        let what = if last {
            "scratch root"
        } else {
            "ancestor of the scratch root"
        };
        if st.st_uid != 0 {
            return Err(unsafe_path(
                &cur_path,
                format!("{what} is owned by uid {}, expected root", st.st_uid),
            ));
        }
        let writable = mode & 0o022 != 0;
        if writable && (last || mode & 0o1000 == 0) {
            return Err(unsafe_path(
                &cur_path,
                format!("{what} has mode {mode:04o}: group- or world-writable"),
            ));
        }
    }
    Ok(cur)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use tenancy_test_support::{requires_root, seccomp};

    /// A profile that refuses `openat2` with EPERM (older container runtimes) is told from an
    /// EPERM of the path's own: the probe fails only under such a filter (or an ENOSYS one).
    #[test]
    fn an_openat2_that_seccomp_refuses_is_told_from_a_path_refused() {
        assert!(!openat2_filtered());
        assert!(seccomp::with_openat2_failing(libc::EPERM, openat2_filtered));
        assert!(seccomp::with_openat2_failing(
            libc::ENOSYS,
            openat2_filtered
        ));
        assert!(!seccomp::with_openat2_failing(
            libc::EACCES,
            openat2_filtered
        ));
    }

    fn inode(fd: &OwnedFd) -> (u64, u64) {
        let st = rfs::fstat(fd).unwrap();
        (st.st_dev as u64, st.st_ino as u64)
    }

    #[test]
    fn without_openat2_a_path_opens_the_same_folder_and_no_symlink_or_escape_is_resolved() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        std::fs::create_dir_all(t.join("a/b")).unwrap();
        std::fs::write(t.join("f"), b"").unwrap();
        symlink("/", t.join("s")).unwrap();
        symlink("b", t.join("a/inner")).unwrap();
        let root = rfs::open(t, DIR_FLAGS, Mode::empty()).unwrap();

        for ok in ["a", "a/b", "a//b/", "a/b/"] {
            let fd = open_each_component(&root, Path::new(ok), false)
                .unwrap_or_else(|e| panic!("{ok}: {e}"));
            let want = rfs::open(t.join(ok), DIR_FLAGS, Mode::empty()).unwrap();
            assert_eq!(inode(&fd), inode(&want), "{ok}");
            // The same folder openat2 opens, where the kernel has it.
            if let Ok(fd2) = rfs::openat2(&root, ok, DIR_FLAGS, Mode::empty(), resolve_flags()) {
                assert_eq!(inode(&fd), inode(&fd2), "{ok}");
            }
        }
        // A symlink, first or last, is refused as openat2 refuses it: ELOOP (which the callers
        // report as "is not a plain directory").
        for link in ["s", "a/inner", "s/etc"] {
            assert_eq!(
                open_each_component(&root, Path::new(link), false).err(),
                Some(Errno::LOOP),
                "{link}"
            );
        }
        assert_eq!(
            open_each_component(&root, Path::new("f"), false).err(),
            Some(Errno::NOTDIR)
        );
        // No way up or out, not even one that would come back beneath.
        for escape in ["..", "a/..", "a/../a", "./a", "/etc", "/"] {
            assert_eq!(
                open_each_component(&root, Path::new(escape), false).err(),
                Some(Errno::XDEV),
                "{escape}"
            );
        }
        assert_eq!(
            open_each_component(&root, Path::new(""), false).err(),
            Some(Errno::NOENT)
        );
    }

    /// The storage audit's walk stays on its mount without openat2 too: a folder another file
    /// system is mounted on is refused with EXDEV, as RESOLVE_NO_XDEV refuses it.
    #[test]
    fn without_openat2_the_same_fs_walk_does_not_cross_a_mount() {
        if !requires_root("mount") {
            return;
        }
        use tenancy_test_support::loopfs::{Kind, LoopFs};
        let tmp = tempfile::tempdir().unwrap();
        let m = tmp.path().join("m");
        let _mounted = LoopFs::new(Kind::Tmpfs, &m, 1);
        std::fs::create_dir(m.join("inner")).unwrap();
        let root = rfs::open(tmp.path(), DIR_FLAGS, Mode::empty()).unwrap();
        for name in ["m", "m/inner"] {
            let path = Path::new(name);
            assert_eq!(
                open_each_component(&root, path, true).err(),
                Some(Errno::XDEV)
            );
            assert!(open_each_component(&root, path, false).is_ok(), "{name}");
            let how = resolve_flags() | ResolveFlags::NO_XDEV;
            if let Err(e) = rfs::openat2(&root, path, DIR_FLAGS, Mode::empty(), how) {
                assert_eq!(e, Errno::XDEV, "openat2 agrees");
            }
        }
        assert!(open_each_component(&root, Path::new("."), true).is_ok());
    }
}
