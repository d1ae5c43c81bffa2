//! fd-based, parallel, symlink-safe removal of a directory tree.
//!
//! Every directory is opened with `openat(parent_fd, name, O_DIRECTORY|O_NOFOLLOW)`, entries are
//! removed with `unlinkat` on that fd, so a symlink anywhere in the tree is removed as a link and
//! never followed, and a directory swapped for a symlink mid-walk is caught by `O_NOFOLLOW`.
//! Subdirectories are cleared in parallel (threads of [`share_out`]). Trees deeper than [`MAX_DEPTH`] are flattened by
//! renaming the deep folder up to the top of the tree being removed, so neither the stack nor the
//! number of open fds grows with depth. Folders a user left without permissions (mode 000) are
//! chmodded to 0700 before descending (only needed when not running with CAP_DAC_OVERRIDE).

use crate::{io_err, unsafe_path, Result, ScratchError};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use crate::fsutil::DIR_FLAGS;

/// Depth (below the top) at which deeper folders are moved up to the top.
pub(crate) const MAX_DEPTH: usize = 24;

struct Ctx<'a> {
    top: &'a OwnedFd,
    dev: u64,
    removed: AtomicU64,
    seq: AtomicU64,
    path: &'a Path,
}

/// Removes `name` in `parent` (a directory tree, or a single non-directory entry).
/// `Ok(None)` when nothing was there; otherwise the number of entries removed.
pub(crate) fn remove_entry(parent: &OwnedFd, name: &str, path: &Path) -> Result<Option<u64>> {
    let st = match rfs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io_err("fstatat", path, e)),
        Ok(st) => st,
    };
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return match rfs::unlinkat(parent, name, AtFlags::empty()) {
            Ok(()) => Ok(Some(1)),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(io_err("unlinkat", path, e)),
        };
    }
    let top = match open_dir(parent, name) {
        Ok(Some(fd)) => fd,
        Ok(None) => return Ok(None),
        Err(e) => return Err(io_err("open", path, e)),
    };
    let dev = rfs::fstat(&top)
        .map_err(|e| io_err("fstat", path, e))?
        .st_dev;
    let ctx = Ctx {
        top: &top,
        dev,
        removed: AtomicU64::new(0),
        seq: AtomicU64::new(0),
        path,
    };
    // A few rounds: deep folders moved up, or files a still-running process adds, need another pass.
    for _ in 0..1_000_000 {
        if clear_dir(&ctx, &top, 0)? == 0 {
            match rfs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOENT) => {
                    return Ok(Some(ctx.removed.load(Ordering::Relaxed) + 1))
                }
                Err(Errno::NOTEMPTY) => continue,
                Err(e) => return Err(io_err("rmdir", path, e)),
            }
        }
    }
    Err(unsafe_path(
        path,
        "tree keeps growing while being removed; kill the job's processes first",
    ))
}

/// Opens a subdirectory without following symlinks. `Ok(None)` when it is not there, or when it
/// is not a directory any more (the caller then unlinks it as a file).
fn open_dir<P: rustix::path::Arg + Copy>(
    dir: &OwnedFd,
    name: P,
) -> std::result::Result<Option<OwnedFd>, Errno> {
    match rfs::openat(dir, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOENT) => Ok(None),
        Err(Errno::ACCESS) => {
            // A mode-000 folder and no CAP_DAC_OVERRIDE: O_PATH needs no permission on the folder
            // itself; chmod it through its /proc fd link (which names this very inode).
            let p = rfs::openat(
                dir,
                name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let link = format!("/proc/self/fd/{}", p.as_raw_fd());
            rfs::chmod(link.as_str(), Mode::from_raw_mode(0o700))?;
            rfs::openat(dir, name, DIR_FLAGS, Mode::empty()).map(Some)
        }
        Err(e) => Err(e),
    }
}

fn unlink_file(ctx: &Ctx, dir: &OwnedFd, name: &CString) -> Result<()> {
    let mut tried_chmod = false;
    loop {
        match rfs::unlinkat(dir, name.as_c_str(), AtFlags::empty()) {
            Ok(()) => {
                ctx.removed.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Err(Errno::NOENT) => return Ok(()),
            // A folder now, made by a process of the user's since readdir: the caller's next
            // round sees it as one (an error here would fail the job's teardown at the user's
            // will).
            Err(Errno::ISDIR) => return Ok(()),
            Err(Errno::ACCESS) | Err(Errno::PERM) if !tried_chmod => {
                tried_chmod = true;
                let _ = rfs::fchmod(dir, Mode::from_raw_mode(0o700));
            }
            Err(e) => {
                return Err(io_err(
                    "unlinkat",
                    &ctx.path.join(name.to_string_lossy().as_ref()),
                    e,
                ))
            }
        }
    }
}

/// Removes everything inside `dir`. Returns the number of entries seen (0 = it was empty).
fn clear_dir(ctx: &Ctx, dir: &OwnedFd, depth: usize) -> Result<u64> {
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    let reader = rfs::Dir::read_from(dir).map_err(|e| io_err("readdir", ctx.path, e))?;
    for ent in reader {
        let ent = ent.map_err(|e| io_err("readdir", ctx.path, e))?;
        let name = ent.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        let ft = match ent.file_type() {
            FileType::Unknown => rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| FileType::from_raw_mode(st.st_mode))
                .unwrap_or(FileType::Unknown),
            ft => ft,
        };
        if ft == FileType::Directory {
            dirs.push(name.to_owned());
        } else {
            files.push(name.to_owned());
        }
    }
    let seen = (files.len() + dirs.len()) as u64;
    for f in &files {
        unlink_file(ctx, dir, f)?;
    }
    let clear_sub = |name: &CString| -> Result<()> {
        if depth >= MAX_DEPTH {
            // The name is predictable, so the user may have taken it already: the next number
            // then (each name taken is one more entry the wipe removes anyway).
            loop {
                let n = ctx.seq.fetch_add(1, Ordering::Relaxed);
                let new = format!(".wipe-deep-{}-{n}", std::process::id());
                match rfs::renameat_with(
                    dir,
                    name.as_c_str(),
                    ctx.top,
                    new.as_str(),
                    rfs::RenameFlags::NOREPLACE,
                ) {
                    Ok(()) | Err(Errno::NOENT) => return Ok(()),
                    Err(Errno::EXIST) => continue,
                    Err(e) => return Err(io_err("renameat (flatten deep tree)", ctx.path, e)),
                }
            }
        }
        match open_dir(dir, name.as_c_str()) {
            Ok(Some(sub)) => {
                let st = rfs::fstat(&sub).map_err(|e| io_err("fstat", ctx.path, e))?;
                if st.st_dev != ctx.dev {
                    return Err(ScratchError::Unsafe {
                        path: ctx.path.join(name.to_string_lossy().as_ref()),
                        msg: "is a mount point inside the tree being removed; unmount it first"
                            .into(),
                    });
                }
                clear_dir(ctx, &sub, depth + 1)?;
                drop(sub);
                match rfs::unlinkat(dir, name.as_c_str(), AtFlags::REMOVEDIR) {
                    Ok(()) => {
                        ctx.removed.fetch_add(1, Ordering::Relaxed);
                        Ok(())
                    }
                    // Refilled concurrently, or swapped: the next round of the caller handles it.
                    Err(Errno::NOENT) | Err(Errno::NOTEMPTY) | Err(Errno::NOTDIR) => Ok(()),
                    Err(e) => Err(io_err("rmdir", ctx.path, e)),
                }
            }
            Ok(None) => Ok(()),
            // Swapped for a symlink or a file since readdir: remove the link itself.
            Err(Errno::LOOP) | Err(Errno::NOTDIR) => unlink_file(ctx, dir, name),
            Err(e) => Err(io_err(
                "open",
                &ctx.path.join(name.to_string_lossy().as_ref()),
                e,
            )),
        }
    };
    share_out(&dirs, clear_sub)?;
    Ok(seen)
}

/// Threads a wipe may start besides the epilog's own: one per CPU the process may use
/// (affinity and the cgroup's CPU quota), less one. A slot is taken for the life of a thread.
fn free_threads() -> &'static AtomicUsize {
    static FREE: OnceLock<AtomicUsize> = OnceLock::new();
    FREE.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        AtomicUsize::new(cpus - 1)
    })
}

/// Runs `f` on every folder of `dirs`, sharing them out with as many more threads as there are
/// free slots (at most one per folder but the first), each taking the next folder when done
/// with one; the first error stops them all taking more, and is returned. Most jobs' scratch
/// is shallow: a folder of one subfolder or none starts no thread, and the folders below a
/// thread's share out again with the slots left free, so a deep tree uses every CPU too.
fn share_out(dirs: &[CString], f: impl Fn(&CString) -> Result<()> + Sync) -> Result<()> {
    if dirs.len() < 2 {
        // Not even the CPU count is looked up (affinity, the cgroup's quota): the epilog's
        // usual case.
        return dirs.iter().try_for_each(f);
    }
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let work = || -> Result<()> {
        while !failed.load(Ordering::Relaxed) {
            let Some(name) = dirs.get(next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            if let Err(e) = f(name) {
                failed.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        Ok(())
    };
    let free = free_threads();
    let take = || {
        free.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    };
    std::thread::scope(|s| {
        let mut helpers = Vec::new();
        while helpers.len() + 1 < dirs.len() && take() {
            let spawned = std::thread::Builder::new().spawn_scoped(s, || {
                let r = work();
                free.fetch_add(1, Ordering::AcqRel);
                r
            });
            match spawned {
                Ok(h) => helpers.push(h),
                // No thread to be had (a pids limit): this one does the work alone.
                Err(_) => {
                    free.fetch_add(1, Ordering::AcqRel);
                    break;
                }
            }
        }
        let mine = work();
        let theirs = helpers.into_iter().map(|h| match h.join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        });
        theirs.fold(mine, |first, r| first.and(r))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file the wipe saw that a user's process has replaced by a folder before its unlink:
    /// left for the next round, not an error that fails the teardown.
    #[test]
    fn a_file_swapped_for_a_folder_is_left_for_the_next_round() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("f")).unwrap();
        let top: OwnedFd = std::fs::File::open(t.path()).unwrap().into();
        let ctx = Ctx {
            top: &top,
            dev: 0,
            removed: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            path: t.path(),
        };
        unlink_file(&ctx, &top, &CString::new("f").unwrap()).unwrap();
        assert_eq!(ctx.removed.load(Ordering::Relaxed), 0);
        assert!(t.path().join("f").is_dir());
    }

    /// Every folder is cleared once, whichever thread takes it; an error comes back, and every
    /// thread slot is free again after.
    #[test]
    fn share_out_clears_each_folder_once_and_returns_an_error() {
        let dirs: Vec<CString> = (0..200)
            .map(|i| CString::new(format!("d{i}")).unwrap())
            .collect();
        let seen = std::sync::Mutex::new(Vec::new());
        share_out(&dirs, |d| {
            std::thread::sleep(std::time::Duration::from_micros(200));
            seen.lock().unwrap().push(d.clone());
            Ok(())
        })
        .unwrap();
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        let mut want = dirs.clone();
        want.sort();
        assert_eq!(seen, want);
        let failed = share_out(&dirs, |d| match d.to_bytes() {
            b"d7" => Err(unsafe_path(Path::new("/scratch/t/job_1/d7"), "planted")),
            _ => Ok(()),
        });
        assert!(
            matches!(&failed, Err(ScratchError::Unsafe { path, .. }) if path.ends_with("d7")),
            "{failed:?}"
        );
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(free_threads().load(Ordering::Acquire), cpus - 1);
    }
}
