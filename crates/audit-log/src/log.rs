//! Appending to a per-node audit log: flock, read the chain head from the file's tail, one
//! write(2) in O_APPEND, fsync, unlock.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};
use serde::Deserialize;

use crate::record::{check_line_hash, Event, LineHash, Outcome, Record, GENESIS};

/// The event of the record that says a torn tail was cut off the log
/// ([`AuditLog::append`]).
pub const TORN_RECORD_REMOVED: &str = "torn_record_removed";

/// What [`AuditLog::append`] cut off the log's end before its record.
struct TornTail {
    offset: u64,
    removed: u64,
    sha256: String,
}

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
    #[error("audit log {path}: cannot rotate: {what}")]
    Rotate { path: PathBuf, what: String },
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

/// What [`AuditLog::rotate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    /// The old file's new name (its last record is the `log_rotated`).
    pub kept_as: PathBuf,
    /// The `log_rotated` record's seq, the last of the kept file.
    pub rotated_seq: u64,
    /// The `log_continued` record that begins the file now at the log's path: the new head.
    pub head: Appended,
    pub cluster: String,
    pub node: String,
}

/// Chain head: last seq and hash (seq 0 and GENESIS for an empty log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub hash: String,
    /// The node of the last record (None in an empty log): whose chain this file holds.
    pub node: Option<String>,
    /// The cluster of the last record (None in an empty log).
    pub cluster: Option<String>,
    /// The last record is a `log_rotated`: `tenancyctl audit rotate` set this file aside, and
    /// the chain goes on in the file now at the log's path.
    pub rotated: bool,
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
        // A rotation replaces the file at the path while this process may hold the old one:
        // the old one then ends with a `log_rotated` record, and the append goes to the new one.
        // Each rotation between the open and the lock is one reopen; more than a few means
        // something rotates in a loop, and the record is not written rather than forked off.
        for _ in 0..8 {
            if let Some(appended) = self.append_locked(rec)? {
                return Ok(appended);
            }
            *self = AuditLog::open(&self.path)?.with_fsync(self.fsync);
        }
        Err(AuditError::Invalid {
            path: self.path.clone(),
            job: rec.job_id,
            what: "the log was rotated eight times while this record waited for its lock; \
                   not written (is `tenancyctl audit rotate` run in a loop?)"
                .into(),
        })
    }

    /// Appends under the lock; `None` when the file held was rotated away (reopen and retry).
    fn append_locked(&mut self, rec: &mut Record) -> Result<Option<Appended>> {
        flock(&self.file, FlockOperation::LockExclusive).map_err(|e| AuditError::Lock {
            path: self.path.clone(),
            source: e.into(),
        })?;
        let _guard = FlockGuard(&self.file);
        if let Some(cut) = self.cut_torn_tail_locked()? {
            // Said in the chain, before the record, by whoever finds it first.
            let (head, len) = self.read_head_locked()?;
            if head.rotated && self.replaced()? {
                return Ok(None);
            }
            let mut note = Record::new(
                rec.cluster.clone(),
                rec.node.clone(),
                rec.user.clone(),
                rec.uid,
                Event::Other(TORN_RECORD_REMOVED.into()),
                Outcome::Success,
                rec.origin.clone(),
            )
            .reason(format!(
                "{} byte(s) at offset {} removed: a record cut short by its writer's death inside \
                 its write (it was never appended; sha256 of the bytes {})",
                cut.removed, cut.offset, cut.sha256
            ));
            self.write_locked(&mut note, &head, len)?;
        }
        let (head, len) = self.read_head_locked()?;
        if head.rotated && self.replaced()? {
            return Ok(None);
        }
        self.write_locked(rec, &head, len).map(Some)
    }

    /// Cuts a torn tail off the log: the bytes after its last newline. Every writer holds the
    /// lock through its one write(2), so under the lock such bytes are a dead writer's: a
    /// fatal signal (SIGKILL, the OOM killer, Slurm's PrologEpilogTimeout) stops a write at a
    /// page boundary, and the writer never got to take them out again as [`Self::append`]
    /// does on a short write. Its append never returned Ok; removing them finishes its undo,
    /// and no complete record (each ends with its newline) can be removed this way.
    fn cut_torn_tail_locked(&self) -> Result<Option<TornTail>> {
        let rerr = |source| AuditError::ReadHead {
            path: self.path.clone(),
            source,
        };
        let len = self.file.metadata().map_err(rerr)?.len();
        if len == 0 {
            return Ok(None);
        }
        let mut last = [0u8; 1];
        self.file.read_exact_at(&mut last, len - 1).map_err(rerr)?;
        if last[0] == b'\n' {
            return Ok(None);
        }
        let mut tail: Vec<u8> = Vec::new();
        let mut pos = len;
        let keep = loop {
            let take = 4096u64.min(pos);
            pos -= take;
            let mut piece = vec![0u8; take as usize];
            self.file.read_exact_at(&mut piece, pos).map_err(rerr)?;
            if let Some(i) = memrchr(b'\n', &piece) {
                tail.splice(0..0, piece[i + 1..].iter().copied());
                break pos + i as u64 + 1;
            }
            tail.splice(0..0, piece);
            if pos == 0 {
                break 0;
            }
        };
        let werr = |source| AuditError::Write {
            path: self.path.clone(),
            seq: 0,
            source,
        };
        self.file.set_len(keep).map_err(werr)?;
        self.sync().map_err(werr)?;
        Ok(Some(TornTail {
            offset: keep,
            removed: len - keep,
            sha256: crate::record::canonical_hash(&tail),
        }))
    }

    /// Whether the log's path names another file than the one held (a rotation replaced it,
    /// or it was removed). A rotation that stopped before replacing it leaves the same file,
    /// whose chain simply goes on after its `log_rotated` record.
    fn replaced(&self) -> Result<bool> {
        let held = rustix::fs::fstat(&self.file).map_err(|e| AuditError::ReadHead {
            path: self.path.clone(),
            source: e.into(),
        })?;
        Ok(match rustix::fs::lstat(&self.path) {
            Ok(now) => (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino),
            Err(rustix::io::Errno::NOENT) => true,
            Err(e) => {
                return Err(AuditError::ReadHead {
                    path: self.path.clone(),
                    source: e.into(),
                })
            }
        })
    }

    /// Seals `rec` after `head` and writes it at `len`, the file's end (the lock is held).
    fn write_locked(&self, rec: &mut Record, head: &Head, len: u64) -> Result<Appended> {
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

    /// Sets the log aside as `<name>.<UTC time>` and puts a new file at its path that goes on
    /// with its chain: the old file's last record is a `log_rotated`, the new one's first a
    /// `log_continued` chained to it, so `audit verify` reads the files as one chain, and the
    /// newest file alone as a chain that begins at that record. Under the old file's lock, so
    /// no record is written meanwhile; an append that waited on it finds the `log_rotated` head
    /// and goes to the new file. The new file takes the old one's owner and mode. `None` for
    /// an empty log (nothing to set aside). `user`, `uid`, `origin`: who rotates, for the records.
    pub fn rotate(&mut self, user: &str, uid: u32, origin: &str) -> Result<Option<Rotated>> {
        for _ in 0..3 {
            if let Some(r) = self.rotate_locked(user, uid, origin)? {
                return Ok(r);
            }
            *self = AuditLog::open(&self.path)?.with_fsync(self.fsync);
        }
        Err(self.rotate_error("another rotation replaced the log three times meanwhile".into()))
    }

    fn rotate_error(&self, what: String) -> AuditError {
        AuditError::Rotate {
            path: self.path.clone(),
            what,
        }
    }

    /// One try of [`AuditLog::rotate`]; `None` (outer) when the file held is no longer the log.
    fn rotate_locked(
        &mut self,
        user: &str,
        uid: u32,
        origin: &str,
    ) -> Result<Option<Option<Rotated>>> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        flock(&self.file, FlockOperation::LockExclusive).map_err(|e| AuditError::Lock {
            path: self.path.clone(),
            source: e.into(),
        })?;
        let _guard = FlockGuard(&self.file);
        if self.replaced()? {
            return Ok(None);
        }
        let (head, len) = self.read_head_locked()?;
        let (Some(cluster), Some(node)) = (head.cluster.clone(), head.node.clone()) else {
            return Ok(Some(None));
        };
        let (dir, name) = match (self.path.parent(), self.path.file_name()) {
            (Some(d), Some(n)) => (d.to_path_buf(), n.to_string_lossy().into_owned()),
            _ => return Err(self.rotate_error("the path names no file in a folder".into())),
        };
        let now = chrono::Utc::now();
        let kept_name = format!("{name}.{}", now.format("%Y%m%dT%H%M%S%.3fZ"));
        let kept = dir.join(&kept_name);
        if kept.symlink_metadata().is_ok() {
            return Err(self.rotate_error(format!(
                "{} exists (rotated in the same millisecond?); try again",
                kept.display()
            )));
        }
        let mut last = Record::new(
            cluster.clone(),
            node.clone(),
            user,
            uid,
            Event::LogRotated,
            crate::Outcome::Success,
            origin,
        )
        .time(now)
        .reason(format!(
            "this file is kept as {kept_name}; the chain goes on in {name}"
        ));
        let sealed = self.write_locked(&mut last, &head, len)?;
        // The new file is made whole under a hidden name (verify and report skip dot files)
        // and then takes the log's place in one rename, so the path always names a chain.
        let tmp = dir.join(format!(".{name}.rotating"));
        let made = (|| -> std::io::Result<AuditLog> {
            match std::fs::remove_file(&tmp) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let file = std::fs::OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .mode(0o640)
                .custom_flags(
                    (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC).bits() as i32,
                )
                .open(&tmp)?;
            let old = self.file.metadata()?;
            std::os::unix::fs::fchown(&file, Some(old.uid()), Some(old.gid()))?;
            file.set_permissions(std::fs::Permissions::from_mode(old.mode() & 0o7777))?;
            Ok(AuditLog {
                file,
                path: tmp.clone(),
                fsync: self.fsync,
                #[cfg(test)]
                failing_syncs: Default::default(),
            })
        })()
        .map_err(|e| self.rotate_error(format!("cannot make {}: {e}", tmp.display())))?;
        let mut first = Record::new(
            cluster.clone(),
            node.clone(),
            user,
            uid,
            Event::LogContinued,
            crate::Outcome::Success,
            origin,
        )
        .time(now)
        .reason(format!(
            "continues {kept_name}, whose last record is seq {}",
            sealed.seq
        ));
        let sealed_head = Head {
            seq: sealed.seq,
            hash: sealed.hash.clone(),
            node: Some(node.clone()),
            cluster: Some(cluster.clone()),
            rotated: true,
        };
        let continued = made.write_locked(&mut first, &sealed_head, 0)?;
        std::fs::hard_link(&self.path, &kept).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            self.rotate_error(format!(
                "cannot keep it as {}: {e}; it goes on after its log_rotated record",
                kept.display()
            ))
        })?;
        if let Err(e) = std::fs::rename(&tmp, &self.path) {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(&kept);
            return Err(self.rotate_error(format!(
                "cannot put {} in its place: {e}; it goes on after its log_rotated record",
                tmp.display()
            )));
        }
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| {
                self.rotate_error(format!(
                    "rotated, but the folder {} could not be synced: {e}",
                    dir.display()
                ))
            })?;
        Ok(Some(Some(Rotated {
            kept_as: kept,
            rotated_seq: sealed.seq,
            head: continued,
            cluster,
            node,
        })))
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
                    cluster: None,
                    rotated: false,
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
            #[serde(default)]
            cluster: Option<String>,
            // Read as text: a name this build does not know is no reason to stop the job.
            #[serde(default)]
            event: Option<String>,
        }
        let s: SeqOnly =
            serde_json::from_slice(line).map_err(|e| bad(format!("not a JSON record: {e}")))?;
        Ok((
            Head {
                seq: s.seq,
                hash,
                node: s.node,
                cluster: s.cluster,
                rotated: s.event.as_deref() == Some(Event::LogRotated.as_str()),
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
    fn torn_record_of_a_killed_writer_is_removed_and_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("audit.jsonl");
        let mut log = AuditLog::open(&p).unwrap();
        log.append(&mut rec(1)).unwrap();
        let whole = std::fs::read(&p).unwrap();
        // A writer SIGKILLed inside its write(2): its record stops at a page boundary.
        let mut torn = rec(2);
        let line = torn.seal(2, "0".repeat(64).as_str()).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(&line[..line.len() / 2]).unwrap();
        drop(f);
        let mut log = AuditLog::open(&p).unwrap();
        let a = log.append(&mut rec(3)).unwrap();
        assert_eq!(a.seq, 3, "the note is seq 2, the record seq 3");
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.as_bytes().starts_with(&whole),
            "a complete record was touched"
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[1].contains("\"event\":\"torn_record_removed\""),
            "{}",
            lines[1]
        );
        assert!(
            lines[1].contains(&format!("{} byte(s)", line.len() / 2)),
            "{}",
            lines[1]
        );
        assert!(lines[2].contains("\"job_id\":3"), "{}", lines[2]);
        for l in &lines {
            assert!(
                matches!(check_line_hash(l.as_bytes()), LineHash::Valid(_)),
                "{l}"
            );
        }
        // A log whose very first record is torn starts its chain again with the note.
        let q = dir.path().join("first.jsonl");
        std::fs::write(&q, &line[..10]).unwrap();
        let mut log = AuditLog::open(&q).unwrap();
        assert_eq!(log.append(&mut rec(4)).unwrap().seq, 2);
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
