//! The shared state file: `<state>.lock` is flock'ed (shared for reads, exclusive for
//! read-modify-write), the state is written to a spare file and swapped in, so every process
//! sees one consistent truth.
//!
//! A process keeps the lock file open and the state it last read or wrote: a MIG job's prolog
//! makes some 40 NVML calls, and re-reading and parsing the JSON for each was most of the
//! stand-in's cost. The copy is used only while the state file is the same file (device, inode,
//! size, times) and the generation number each writer bumps in the lock file is unchanged.
//!
//! A read checks both without taking the lock: the generation is read from a shared mapping of
//! the lock file before and after the state file's `statx`, as a seqlock's reader does. A writer
//! swaps the new state in (the file's identity changes at once) and then bumps the generation,
//! so a reader that sees neither change saw the state as it was at its `statx`. That makes a
//! read one system call instead of five (lock, read the generation, stat, unlock, and the pid
//! check a forked child needs before it locks).

use crate::config::Config;
use crate::state::State;
use rustix::fs::{flock, FlockOperation, Mode, OFlags};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

#[derive(Debug)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err(what: &str, p: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError(format!("nvml-shim state: {what} {}: {e}", p.display()))
}

fn lock_path(state: &Path) -> PathBuf {
    let mut s = state.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

/// Creates the state folder if missing; refuses a symlinked folder.
fn ensure_dir(state: &Path) -> Result<(), StoreError> {
    let dir = state.parent().unwrap_or(Path::new("/"));
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => {
            Err(err("refusing symlinked folder", dir, "symlink"))
        }
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(err("not a folder:", dir, "exists as a file")),
        Err(_) => std::fs::create_dir_all(dir).map_err(|e| err("cannot create folder", dir, e)),
    }
}

fn open_lock(state: &Path) -> Result<OwnedFd, StoreError> {
    ensure_dir(state)?;
    let lp = lock_path(state);
    rustix::fs::open(
        &lp,
        OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| err("cannot open lock", &lp, e))
}

fn read_state(cfg: &Config) -> Result<Option<State>, StoreError> {
    let p = &cfg.state_path;
    let fd = match rustix::fs::open(
        p,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(err("cannot open", p, e)),
    };
    let mut text = String::new();
    File::from(fd)
        .read_to_string(&mut text)
        .map_err(|e| err("cannot read", p, e))?;
    let st: State = serde_json::from_str(&text)
        .map_err(|e| err("corrupt (fix or run `nvml-shim-ctl reset`)", p, e))?;
    Ok(Some(st))
}

/// The state for this configuration: the file's, or a fresh one when the file is missing or
/// describes other GPUs (another fixture).
fn current(cfg: &Config) -> Result<(State, bool), StoreError> {
    match read_state(cfg)? {
        Some(s) if s.matches(&cfg.gpus) => Ok((s, false)),
        _ => Ok((State::fresh(&cfg.gpus, cfg.seed_faults.clone()), true)),
    }
}

fn write_state(cfg: &Config, st: &State) -> Result<(), StoreError> {
    let p = &cfg.state_path;
    let dir = p.parent().unwrap_or(Path::new("/"));
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // The state file a write replaces is kept as the spare and rewritten by the next write: an
    // unlink would free its block, and on a `discard` mount without a journal ext4 then waits
    // for the device (0.2 ms, twice per MIG job start and end). Only writers use the spare, and
    // they hold the exclusive lock, so one name serves every process.
    let spare = dir.join(format!(".{name}.spare"));
    let fd = rustix::fs::open(
        &spare,
        OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| err("cannot open", &spare, e))?;
    let mut f = File::from(fd);
    let mut text = serde_json::to_string_pretty(st).map_err(|e| err("cannot encode", p, e))?;
    text.push('\n');
    // Other processes see the new state through the rename under the lock; fsync only adds
    // power-loss durability, which a stand-in does not need (NVML_SHIM_FSYNC=1 turns it on).
    let durable = std::env::var_os("NVML_SHIM_FSYNC").is_some_and(|v| v == "1");
    f.write_all(text.as_bytes())
        .and_then(|_| f.set_len(text.len() as u64))
        .and_then(|_| if durable { f.sync_all() } else { Ok(()) })
        .map_err(|e| err("cannot write", &spare, e))?;
    // Swapped in (the old state becomes the spare): a rename over the file would make ext4
    // start writing the new one out at once (auto_da_alloc). The first write has nothing to
    // swap with.
    let cwd = rustix::fs::CWD;
    match rustix::fs::renameat_with(cwd, &spare, cwd, p, rustix::fs::RenameFlags::EXCHANGE) {
        Ok(()) => Ok(()),
        Err(_) => std::fs::rename(&spare, p).map_err(|e| err("cannot rename into", p, e)),
    }
}

/// Identity of the state file: a write (spare file swapped in) or an edit by hand changes it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, u32),
    ctime: (i64, u32),
}

fn file_key(p: &Path) -> Option<FileKey> {
    let st = rustix::fs::statx(
        rustix::fs::CWD,
        p,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        rustix::fs::StatxFlags::BASIC_STATS,
    )
    .ok()?;
    Some(FileKey {
        dev: u64::from(st.stx_dev_major) << 32 | u64::from(st.stx_dev_minor),
        ino: st.stx_ino,
        size: st.stx_size,
        mtime: (st.stx_mtime.tv_sec, st.stx_mtime.tv_nsec),
        ctime: (st.stx_ctime.tv_sec, st.stx_ctime.tv_nsec),
    })
}

/// This process's handle on one state file: the open lock file and the last state seen.
struct Store {
    path: PathBuf,
    pid: u32,
    lock: OwnedFd,
    /// The lock file's generation number, mapped shared (None where it cannot be mapped:
    /// then every read takes the lock).
    generation: Option<GenerationMap>,
    seen: Option<(FileKey, u64, State)>,
}

/// The first 8 bytes of the lock file (the generation number), mapped read-only and shared, so
/// a writer's `pwrite` is seen without a system call.
struct GenerationMap(std::ptr::NonNull<u64>);

// SAFETY: the mapping is read-only here and read only with atomic loads.
unsafe impl Send for GenerationMap {}

impl GenerationMap {
    /// Maps the lock file's first page after making sure it holds 8 bytes (a mapping past the
    /// end of a file faults with SIGBUS). The file is only ever grown.
    fn new(lock: &OwnedFd) -> Option<GenerationMap> {
        if rustix::fs::fstat(lock).ok()?.st_size < 8 {
            flock(lock, FlockOperation::LockExclusive).ok()?;
            let _locked = Locked(std::os::fd::AsRawFd::as_raw_fd(lock));
            if rustix::fs::fstat(lock).ok()?.st_size < 8 {
                // Generation 0, as an empty lock file reads.
                rustix::io::pwrite(lock, &[0u8; 8], 0)
                    .ok()
                    .filter(|&n| n == 8)?;
            }
        }
        // SAFETY: a fresh read-only shared mapping of a file of at least 8 bytes; nothing else
        // in this process maps or unmaps this range.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                8,
                rustix::mm::ProtFlags::READ,
                rustix::mm::MapFlags::SHARED,
                lock,
                0,
            )
        }
        .ok()?;
        std::ptr::NonNull::new(p.cast::<u64>()).map(GenerationMap)
    }

    fn load(&self) -> u64 {
        // SAFETY: the mapping lives as long as self and is 8-byte aligned (page start).
        let a = unsafe { std::sync::atomic::AtomicU64::from_ptr(self.0.as_ptr()) };
        u64::from_le(a.load(std::sync::atomic::Ordering::Acquire))
    }
}

impl Drop for GenerationMap {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with length 8, unmapped once.
        let _ = unsafe { rustix::mm::munmap(self.0.as_ptr().cast(), 8) };
    }
}

/// One store per process, also serialising the process's own threads (flock locks belong to
/// the open file, which they share).
static STORE: Mutex<Option<Store>> = Mutex::new(None);

fn store_for<'a>(
    guard: &'a mut MutexGuard<'static, Option<Store>>,
    cfg: &Config,
) -> Result<&'a mut Store, StoreError> {
    let pid = std::process::id();
    // A forked child must not share the parent's lock (same open file): it opens its own.
    let reuse = guard
        .as_ref()
        .is_some_and(|s| s.path == cfg.state_path && s.pid == pid);
    if !reuse {
        let lock = open_lock(&cfg.state_path)?;
        **guard = Some(Store {
            path: cfg.state_path.clone(),
            pid,
            generation: GenerationMap::new(&lock),
            lock,
            seen: None,
        });
    }
    Ok(guard.as_mut().expect("just set"))
}

/// The generation number in the lock file (0 when never written).
fn generation(lock: &OwnedFd) -> u64 {
    let mut b = [0u8; 8];
    match rustix::io::pread(lock, &mut b, 0) {
        Ok(8) => u64::from_le_bytes(b),
        _ => 0,
    }
}

impl Store {
    /// The state seen last, when the state file and the generation are provably unchanged,
    /// checked without the lock (see the module's comment).
    fn unchanged(&self, cfg: &Config) -> Option<&State> {
        let (map, (key, gen, st)) = (self.generation.as_ref()?, self.seen.as_ref()?);
        let before = map.load();
        let now = file_key(&cfg.state_path)?;
        let after = map.load();
        (before == *gen && after == *gen && now == *key).then_some(st)
    }

    /// The current state (and whether it is fresh, i.e. not from the file): the copy seen last
    /// when the file and the generation are unchanged, else read from the file.
    fn current(&mut self, cfg: &Config) -> Result<(State, bool), StoreError> {
        let gen = generation(&self.lock);
        let key = file_key(&cfg.state_path);
        if let (Some((k, g, st)), Some(key)) = (&self.seen, key) {
            if *k == key && *g == gen {
                return Ok((st.clone(), false));
            }
        }
        let (st, fresh) = current(cfg)?;
        self.seen = match (fresh, key) {
            (false, Some(key)) => Some((key, gen, st.clone())),
            _ => None,
        };
        Ok((st, fresh))
    }

    /// After a write under the exclusive lock: bump the generation, remember what was written.
    fn written(&mut self, cfg: &Config, st: &State) {
        let gen = generation(&self.lock).wrapping_add(1);
        let bumped = rustix::io::pwrite(&self.lock, &gen.to_le_bytes(), 0).is_ok_and(|n| n == 8);
        self.seen = match (bumped, file_key(&cfg.state_path)) {
            (true, Some(key)) => Some((key, gen, st.clone())),
            _ => None,
        };
    }
}

/// Unlocks the store's lock file on drop, also when a caller's closure panics.
struct Locked(std::os::fd::RawFd);

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: the lock file stays open in the store, whose mutex guard outlives this.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.0) };
        let _ = flock(fd, FlockOperation::Unlock);
    }
}

/// Runs `f` on this process's store with the state file locked (`how`: shared or exclusive).
fn locked<T>(
    cfg: &Config,
    how: FlockOperation,
    f: impl FnOnce(&mut Store) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let mut guard = STORE.lock().unwrap_or_else(|p| p.into_inner());
    let store = store_for(&mut guard, cfg)?;
    flock(&store.lock, how).map_err(|e| err("cannot lock", &cfg.state_path, e))?;
    let _locked = Locked(std::os::fd::AsRawFd::as_raw_fd(&store.lock));
    f(store)
}

/// Runs `f` on a consistent snapshot: the state seen last when nothing changed since, else
/// the file's, read under a shared lock.
pub fn read<T>(cfg: &Config, f: impl FnOnce(&State) -> T) -> Result<T, StoreError> {
    {
        let guard = STORE.lock().unwrap_or_else(|p| p.into_inner());
        // (A forked child may use the copy too: it takes no lock here.)
        if let Some(st) = guard
            .as_ref()
            .filter(|s| s.path == cfg.state_path)
            .and_then(|s| s.unchanged(cfg))
        {
            return Ok(f(st));
        }
    }
    locked(cfg, FlockOperation::LockShared, |store| {
        let (st, _) = store.current(cfg)?;
        Ok(f(&st))
    })
}

/// Read-modify-write under an exclusive lock. `f` returns (result, commit): with commit the
/// state is written back, after `before_commit` (used to lay out device nodes) succeeds.
pub fn modify<T>(
    cfg: &Config,
    f: impl FnOnce(&mut State) -> (T, bool),
    before_commit: impl FnOnce(&mut State) -> Result<(), StoreError>,
) -> Result<T, StoreError> {
    locked(cfg, FlockOperation::LockExclusive, |store| {
        let (mut st, fresh) = store.current(cfg)?;
        let before = st.clone();
        let (out, commit) = f(&mut st);
        if commit && (fresh || st != before) {
            before_commit(&mut st)?;
            write_state(cfg, &st)?;
            store.written(cfg, &st);
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_copy_gives_way_to_a_changed_file() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = one_h200(tmp.path());
        // A GI made through the store is seen by the next read (from the kept copy).
        modify(
            &cfg,
            |st| (st.create_gi(0, 19, None, nf()), true),
            |_| Ok(()),
        )
        .unwrap()
        .unwrap();
        let gis = |cfg: &Config| read(cfg, |st| st.gpu(0).unwrap().gis.len()).unwrap();
        assert_eq!(gis(&cfg), 1);
        // Another writer replaces the file (here: a fresh state written by hand).
        let fresh = State::fresh(&cfg.gpus, crate::state::Faults::default());
        let text = serde_json::to_string_pretty(&fresh).unwrap();
        std::fs::write(&cfg.state_path, text + "\n").unwrap();
        assert_eq!(gis(&cfg), 0);
        // A writer that bumps the generation is seen even if the file looked the same.
        modify(
            &cfg,
            |st| (st.create_gi(0, 19, None, nf()), true),
            |_| Ok(()),
        )
        .unwrap()
        .unwrap();
        let gen = generation(&STORE.lock().unwrap().as_ref().unwrap().lock);
        assert!(gen >= 1);
        assert_eq!(gis(&cfg), 1);
    }

    #[test]
    fn writes_swap_two_files_and_never_leave_a_longer_tail() {
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let cfg = one_h200(tmp.path());
        let fresh = State::fresh(&cfg.gpus, crate::state::Faults::default());
        let mut one = fresh.clone();
        one.create_gi(0, 19, None, nf()).unwrap();
        let mut two = one.clone();
        two.create_gi(0, 19, None, nf()).unwrap();
        let text = |st: &State| serde_json::to_string_pretty(st).unwrap() + "\n";
        let spare = tmp.path().join(".state.json.spare");
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        // The first write has nothing to swap with: no spare yet.
        write_state(&cfg, &fresh).unwrap();
        assert!(!spare.exists());
        let first = ino(&cfg.state_path);
        // From the second write on, the replaced file is the spare: the same two inodes.
        write_state(&cfg, &one).unwrap();
        assert_eq!(ino(&spare), first);
        let second = ino(&cfg.state_path);
        write_state(&cfg, &two).unwrap();
        assert_eq!(ino(&cfg.state_path), first);
        assert_eq!(ino(&spare), second);
        // The spare now holds `one`, longer than `fresh`: the rewrite cuts its tail.
        write_state(&cfg, &fresh).unwrap();
        assert_eq!(
            std::fs::read_to_string(&cfg.state_path).unwrap(),
            text(&fresh)
        );
        assert_eq!(std::fs::read_to_string(&spare).unwrap(), text(&two));
        let mut names: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [".state.json.spare", "state.json"]);
    }

    /// What another process's writes look like to a reader that checks without the lock: each
    /// is seen, also a generation bumped with the file as it was (what two writes in a row that
    /// bring the inode back may look like), and an edit by hand.
    #[test]
    fn a_read_without_the_lock_sees_every_write_of_another_handle() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = one_h200(&tmp.path().join("state"));
        // The writer: a handle of its own (as another process has), writing under its lock.
        let write = |st: &State| {
            let lock = open_lock(&cfg.state_path).unwrap();
            flock(&lock, FlockOperation::LockExclusive).unwrap();
            write_state(&cfg, st).unwrap();
            let gen = generation(&lock) + 1;
            rustix::io::pwrite(&lock, &gen.to_le_bytes(), 0).unwrap();
        };
        let fresh = State::fresh(&cfg.gpus, crate::state::Faults::default());
        let mut one = fresh.clone();
        one.create_gi(0, 19, None, nf()).unwrap();
        write(&fresh);
        write(&one);
        // The reader: its copy is the file's, checked without a lock.
        let lock = open_lock(&cfg.state_path).unwrap();
        let mut reader = Store {
            path: cfg.state_path.clone(),
            pid: std::process::id(),
            generation: Some(GenerationMap::new(&lock).expect("the lock file maps")),
            lock,
            seen: None,
        };
        let gis = |st: &State| st.gpu(0).unwrap().gis.len();
        assert_eq!(gis(&reader.current(&cfg).unwrap().0), 1);
        assert_eq!(reader.unchanged(&cfg).map(gis), Some(1), "nothing changed");
        // One write swaps the other inode in.
        write(&fresh);
        assert!(reader.unchanged(&cfg).is_none());
        assert_eq!(gis(&reader.current(&cfg).unwrap().0), 0);
        // Two writes bring back the inode the reader saw, with the same size, and the times
        // may look the same on a coarse clock: the generation still tells. (Here it is bumped
        // alone, the file untouched.)
        assert!(reader.unchanged(&cfg).is_some());
        let lock = open_lock(&cfg.state_path).unwrap();
        let gen = generation(&lock) + 1;
        rustix::io::pwrite(&lock, &gen.to_le_bytes(), 0).unwrap();
        assert!(reader.unchanged(&cfg).is_none());
        reader.current(&cfg).unwrap();
        // A hand edit (no lock, no generation) changes the file's size and times.
        std::fs::write(&cfg.state_path, serde_json::to_string(&one).unwrap()).unwrap();
        reader.current(&cfg).unwrap();
        let text = serde_json::to_string_pretty(&fresh).unwrap() + "\n";
        std::fs::write(&cfg.state_path, text).unwrap();
        assert!(reader.unchanged(&cfg).is_none());
        assert_eq!(gis(&reader.current(&cfg).unwrap().0), 0);
    }

    /// One H200 in MIG mode, its state file `state.json` in `dir`.
    fn one_h200(dir: &Path) -> Config {
        Config::from_fixture_text(
            "state = \"state.json\"\n[[gpus]]\nmodel = \"H200-141GB\"\nmig_mode = true\n",
            dir,
        )
        .unwrap()
    }

    fn nf() -> crate::state::FaultSources<'static> {
        crate::state::FaultSources { local: None }
    }
}
