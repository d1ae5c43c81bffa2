//! Symlink-safe directory helpers on file descriptors.

use crate::{io_err, unsafe_path, Result};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::os::fd::OwnedFd;
use std::path::{Component, Path};

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
    loop {
        match rfs::openat2(dir, name, DIR_FLAGS, Mode::empty(), resolve_flags()) {
            Err(Errno::AGAIN) | Err(Errno::INTR) => continue,
            r => return r,
        }
    }
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
