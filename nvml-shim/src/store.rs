//! The shared state file: `<state>.lock` is flock'ed (shared for reads, exclusive for
//! read-modify-write), the state is written to a temp file and renamed over, so every
//! process sees one consistent truth.

use crate::config::Config;
use crate::state::State;
use rustix::fs::{flock, FlockOperation, Mode, OFlags};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

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
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let fd = rustix::fs::open(
        &tmp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(|e| err("cannot create", &tmp, e))?;
    let mut f = File::from(fd);
    let text = serde_json::to_string_pretty(st).map_err(|e| err("cannot encode", p, e))?;
    // Other processes see the new state through the rename under the lock; fsync only adds
    // power-loss durability, which a stand-in does not need (NVML_SHIM_FSYNC=1 turns it on).
    let durable = std::env::var_os("NVML_SHIM_FSYNC").is_some_and(|v| v == "1");
    f.write_all(text.as_bytes())
        .and_then(|_| f.write_all(b"\n"))
        .and_then(|_| if durable { f.sync_all() } else { Ok(()) })
        .map_err(|e| err("cannot write", &tmp, e))?;
    std::fs::rename(&tmp, p).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err("cannot rename into", p, e)
    })
}

/// Runs `f` on a consistent snapshot under a shared lock.
pub fn read<T>(cfg: &Config, f: impl FnOnce(&State) -> T) -> Result<T, StoreError> {
    let lock = open_lock(&cfg.state_path)?;
    flock(&lock, FlockOperation::LockShared).map_err(|e| err("cannot lock", &cfg.state_path, e))?;
    let (st, _) = current(cfg)?;
    Ok(f(&st))
}

/// Read-modify-write under an exclusive lock. `f` returns (result, commit): with commit the
/// state is written back, after `before_commit` (used to lay out device nodes) succeeds.
pub fn modify<T>(
    cfg: &Config,
    f: impl FnOnce(&mut State) -> (T, bool),
    before_commit: impl FnOnce(&State) -> Result<(), StoreError>,
) -> Result<T, StoreError> {
    let lock = open_lock(&cfg.state_path)?;
    flock(&lock, FlockOperation::LockExclusive)
        .map_err(|e| err("cannot lock", &cfg.state_path, e))?;
    let (mut st, fresh) = current(cfg)?;
    let before = st.clone();
    let (out, commit) = f(&mut st);
    if commit && (fresh || st != before) {
        before_commit(&st)?;
        write_state(cfg, &st)?;
    }
    Ok(out)
}
