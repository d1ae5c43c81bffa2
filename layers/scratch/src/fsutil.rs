//! Symlink-safe directory helpers on file descriptors.

use crate::{io_err, unsafe_path, Result};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::os::fd::OwnedFd;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};

pub(crate) const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

pub(crate) fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

/// Opens directory `name` (one or more components) beneath `dir`: no symlink anywhere, no `..`
/// escape. ELOOP when a symlink is met, ENOTDIR when it is not a directory.
pub(crate) fn open_beneath(dir: &OwnedFd, name: &str) -> std::result::Result<OwnedFd, Errno> {
    // Set when the kernel answered ENOSYS: the process asks once.
    static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
    while !NO_OPENAT2.load(Ordering::Relaxed) {
        match rfs::openat2(dir, name, DIR_FLAGS, Mode::empty(), resolve_flags()) {
            Err(Errno::AGAIN) | Err(Errno::INTR) => continue,
            Err(Errno::NOSYS) => NO_OPENAT2.store(true, Ordering::Relaxed),
            r => return r,
        }
    }
    open_each_component(dir, name)
}

/// [`open_beneath`] where the kernel has no `openat2` (Linux before 5.6, or a seccomp filter
/// that answers ENOSYS, as container runtimes do for system calls newer than their profile):
/// one `openat` per component, each with O_NOFOLLOW, and no `.`, `..` or leading `/`, so that
/// neither a symlink nor an escape can be resolved; a few system calls more per path.
fn open_each_component(dir: &OwnedFd, name: &str) -> std::result::Result<OwnedFd, Errno> {
    if name.starts_with('/') {
        return Err(Errno::XDEV);
    }
    let mut cur: Option<OwnedFd> = None;
    for c in name.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." {
            return Err(Errno::XDEV);
        }
        let at = cur.as_ref().unwrap_or(dir);
        let next = loop {
            match rfs::openat(at, c, DIR_FLAGS, Mode::empty()) {
                Err(Errno::INTR) => continue,
                // O_DIRECTORY | O_NOFOLLOW says ENOTDIR for a symlink; openat2 says ELOOP.
                Err(Errno::NOTDIR) if is_symlink(at, c) => return Err(Errno::LOOP),
                r => break r?,
            }
        };
        cur = Some(next);
    }
    cur.ok_or(Errno::NOENT)
}

fn is_symlink(dir: &OwnedFd, name: &str) -> bool {
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
            let fd = open_each_component(&root, ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
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
                open_each_component(&root, link).err(),
                Some(Errno::LOOP),
                "{link}"
            );
        }
        assert_eq!(open_each_component(&root, "f").err(), Some(Errno::NOTDIR));
        // No way up or out, not even one that would come back beneath.
        for escape in ["..", "a/..", "a/../a", "./a", "/etc", "/"] {
            assert_eq!(
                open_each_component(&root, escape).err(),
                Some(Errno::XDEV),
                "{escape}"
            );
        }
        assert_eq!(open_each_component(&root, "").err(), Some(Errno::NOENT));
    }
}
