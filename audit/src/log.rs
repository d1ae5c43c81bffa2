//! Appending to a per-node audit log: flock, read the chain head from the file's tail, one
//! write(2) in O_APPEND, fsync, unlock.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};
use serde::Deserialize;

use crate::record::{check_line_hash, LineHash, Record, GENESIS};

/// What `append` returns: the sequence number and hash given to the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub seq: u64,
    pub hash: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit log {path}: cannot open for append: {source} (the parent directory must exist and be writable by root; the job must fail closed)")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "audit log {path}: is not a regular file (refusing to write through a symlink or device)"
    )]
    NotRegular { path: PathBuf },
    #[error("audit log {path}: cannot lock: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("audit log {path}: cannot read the chain head: {source}")]
    ReadHead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("audit log {path}: last record (ending at byte {offset}) is damaged: {what}; run `tenancyctl audit verify {path}` and have an auditor move the damaged log aside before new jobs can be recorded")]
    BadHead {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    #[error(
        "audit log {path}: record for job {job:?} event {event} cannot be serialized: {source}"
    )]
    Serialize {
        path: PathBuf,
        job: Option<u64>,
        event: String,
        source: serde_json::Error,
    },
    #[error("audit log {path}: writing record seq {seq} failed: {source} (filesystem read-only or full?)")]
    Write {
        path: PathBuf,
        seq: u64,
        source: std::io::Error,
    },
    #[error("audit log {path}: fsync after record seq {seq} failed: {source}; {state}")]
    Sync {
        path: PathBuf,
        seq: u64,
        source: std::io::Error,
        /// What the file holds now: whether the record could be taken out again.
        state: String,
    },
    #[error("audit log {path}: record for job {job:?} rejected: {what}")]
    Invalid {
        path: PathBuf,
        job: Option<u64>,
        what: String,
    },
}

pub type Result<T, E = AuditError> = std::result::Result<T, E>;

/// An open per-node audit log. Many processes/threads may each hold one on the same path; every
/// `append` serialises on an exclusive `flock` of the log file itself.
#[derive(Debug)]
pub struct AuditLog {
    file: File,
    path: PathBuf,
    fsync: bool,
    /// Unit tests: this many coming fsyncs fail (no file system here fails one on demand).
    #[cfg(test)]
    failing_syncs: std::cell::Cell<u32>,
}

/// Chain head: last seq and hash (seq 0 and GENESIS for an empty log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub hash: String,
    /// The node of the last record (None in an empty log): whose chain this file holds.
    pub node: Option<String>,
}

struct FlockGuard<'a>(&'a File);
impl Drop for FlockGuard<'_> {
    fn drop(&mut self) {
        let _ = flock(self.0, FlockOperation::Unlock);
    }
}

impl AuditLog {
    /// Opens (creating with mode 0640 if absent) the log at `path`. The parent directory must
    /// exist. Symlinks are refused (O_NOFOLLOW) and the target must be a regular file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o640)
            .custom_flags(
                (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC).bits() as i32,
            )
            .open(&path)
            .map_err(|source| AuditError::Open {
                path: path.clone(),
                source,
            })?;
        let meta = file.metadata().map_err(|source| AuditError::Open {
            path: path.clone(),
            source,
        })?;
        if !meta.file_type().is_file() {
            return Err(AuditError::NotRegular { path });
        }
        Ok(AuditLog {
            file,
            path,
            fsync: true,
            #[cfg(test)]
            failing_syncs: Default::default(),
        })
    }

    /// Turns fsync after each append on (default) or off (benchmarks, tests only).
    pub fn with_fsync(mut self, fsync: bool) -> Self {
        self.fsync = fsync;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `rec`, filling its `seq`, `prev` and `hash`. On any error nothing is left in the
    /// log (a partial write, or a written record whose fsync failed, is truncated away under the
    /// lock; should that fail too, the error says so) and the caller must fail closed.
    pub fn append(&mut self, rec: &mut Record) -> Result<Appended> {
        for (name, v) in [
            ("cluster", &rec.cluster),
            ("node", &rec.node),
            ("user", &rec.user),
            ("origin", &rec.origin),
        ] {
            if v.is_empty() {
                return Err(AuditError::Invalid {
                    path: self.path.clone(),
                    job: rec.job_id,
                    what: format!("field {name} is empty"),
                });
            }
        }
        flock(&self.file, FlockOperation::LockExclusive).map_err(|e| AuditError::Lock {
            path: self.path.clone(),
            source: e.into(),
        })?;
        let _guard = FlockGuard(&self.file);
        let (head, len) = self.read_head_locked()?;
        let seq = head.seq + 1;
        let line = rec
            .seal(seq, &head.hash)
            .map_err(|source| AuditError::Serialize {
                path: self.path.clone(),
                job: rec.job_id,
                event: rec.event.to_string(),
                source,
            })?;
        // One write(2): O_APPEND places it atomically at the end; we hold the lock anyway.
        let res = (&self.file).write(&line);
        match res {
            Ok(n) if n == line.len() => {}
            Ok(n) => {
                let _ = self.file.set_len(len);
                return Err(AuditError::Write {
                    path: self.path.clone(),
                    seq,
                    source: std::io::Error::new(
                        std::io::ErrorKind::WriteZero,
                        format!("short write {n} of {} bytes (undone)", line.len()),
                    ),
                });
            }
            Err(source) => {
                let _ = self.file.set_len(len);
                return Err(AuditError::Write {
                    path: self.path.clone(),
                    seq,
                    source,
                });
            }
        }
        if self.fsync {
            if let Err(source) = self.sync() {
                // An Err must mean "not written": take the record out again, still under the lock.
                let state = match self.file.set_len(len) {
                    Err(e) => format!(
                        "taking the record out again failed too ({e}): the log holds record \
                         seq {seq} although this append failed"
                    ),
                    Ok(()) => match self.sync() {
                        Ok(()) => {
                            format!("the record was taken out again (log back to {len} bytes)")
                        }
                        Err(e) => format!(
                            "the record was taken out again (log back to {len} bytes) but that \
                             could not be synced either ({e}): after a crash the log may still \
                             hold record seq {seq}"
                        ),
                    },
                };
                return Err(AuditError::Sync {
                    path: self.path.clone(),
                    seq,
                    source,
                    state,
                });
            }
        }
        Ok(Appended {
            seq,
            hash: rec.hash.clone(),
        })
    }

    fn sync(&self) -> std::io::Result<()> {
        #[cfg(test)]
        if self.failing_syncs.get() > 0 {
            self.failing_syncs.set(self.failing_syncs.get() - 1);
            return Err(std::io::Error::other("injected fsync failure"));
        }
        self.file.sync_data()
    }

    /// Reads the current chain head under a shared lock.
    pub fn head(&self) -> Result<Head> {
        flock(&self.file, FlockOperation::LockShared).map_err(|e| AuditError::Lock {
            path: self.path.clone(),
            source: e.into(),
        })?;
        let _guard = FlockGuard(&self.file);
        self.read_head_locked().map(|(h, _)| h)
    }

    /// Reads the last line backwards from the end; returns the head and the file length.
    fn read_head_locked(&self) -> Result<(Head, u64)> {
        let rerr = |source| AuditError::ReadHead {
            path: self.path.clone(),
            source,
        };
        let len = self.file.metadata().map_err(rerr)?.len();
        if len == 0 {
            return Ok((
                Head {
                    seq: 0,
                    hash: GENESIS.to_string(),
                    node: None,
                },
                0,
            ));
        }
        let bad = |what: String| AuditError::BadHead {
            path: self.path.clone(),
            offset: len,
            what,
        };
        // Read chunks backwards until we hold the whole last line.
        let mut buf: Vec<u8> = Vec::new();
        let mut pos = len;
        let chunk = 4096u64;
        let start_in_buf;
        loop {
            let take = chunk.min(pos);
            pos -= take;
            let mut piece = vec![0u8; take as usize];
            self.file.read_exact_at(&mut piece, pos).map_err(rerr)?;
            piece.extend_from_slice(&buf);
            buf = piece;
            if buf.last() != Some(&b'\n') {
                return Err(bad(
                    "the log does not end with a newline (torn write)".into()
                ));
            }
            // search for the newline before the final one
            if let Some(i) = memrchr(b'\n', &buf[..buf.len() - 1]) {
                start_in_buf = i + 1;
                break;
            }
            if pos == 0 {
                start_in_buf = 0;
                break;
            }
            if buf.len() > 1 << 20 {
                return Err(bad("last line longer than 1 MiB".into()));
            }
        }
        let line = &buf[start_in_buf..buf.len() - 1];
        let hash = match check_line_hash(line) {
            LineHash::Valid(h) => h.to_string(),
            LineHash::Mismatch { stored, computed } => {
                return Err(bad(format!(
                    "stored hash {stored} does not match its content ({computed})"
                )))
            }
            LineHash::NoHashSuffix => return Err(bad("no hash member at the end".into())),
        };
        #[derive(Deserialize)]
        struct SeqOnly {
            seq: u64,
            #[serde(default)]
            node: Option<String>,
        }
        let s: SeqOnly =
            serde_json::from_slice(line).map_err(|e| bad(format!("not a JSON record: {e}")))?;
        Ok((
            Head {
                seq: s.seq,
                hash,
                node: s.node,
            },
            len,
        ))
    }
}

fn memrchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().rposition(|&b| b == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Event, Outcome};

    fn rec(job: u64) -> Record {
        Record::new(
            "c1",
            "gpu001",
            "alice",
            2001,
            Event::JobStart,
            Outcome::Success,
            "tenancy-prolog",
        )
        .job_id(job)
    }

    #[test]
    fn failed_fsync_takes_the_record_out_again() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("audit.jsonl");
        let mut log = AuditLog::open(&p).unwrap();
        log.append(&mut rec(1)).unwrap();
        let before = std::fs::read(&p).unwrap();
        log.failing_syncs.set(1);
        let e = log.append(&mut rec(2)).unwrap_err();
        assert!(matches!(e, AuditError::Sync { seq: 2, .. }), "{e}");
        assert!(e.to_string().contains("taken out again"), "{e}");
        assert_eq!(
            std::fs::read(&p).unwrap(),
            before,
            "an Err left the record in"
        );
        // the next append takes seq 2: the failed one is not in the chain
        assert_eq!(log.append(&mut rec(3)).unwrap().seq, 2);
    }

    #[test]
    fn failed_undo_says_what_the_log_may_hold() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("audit.jsonl");
        let mut log = AuditLog::open(&p).unwrap();
        log.append(&mut rec(1)).unwrap();
        log.failing_syncs.set(2);
        let e = log.append(&mut rec(2)).unwrap_err().to_string();
        assert!(e.contains("could not be synced either"), "{e}");
        assert!(e.contains("may still hold record seq 2"), "{e}");
    }
}
