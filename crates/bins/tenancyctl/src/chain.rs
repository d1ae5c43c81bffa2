//! A node's audit chain as files on its disk: the log at `cluster.audit_log` and the files
//! `audit rotate` set aside beside it (`<log>.<UTC time>`), in chain order, and a reader that
//! follows the chain across them from a seq on. The forwarder, prune and metrics read it.

use std::fs::File;
use std::io::{Read, Seek as _, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use rustix::fs::{flock, FlockOperation};
use serde::Deserialize;

/// What a log file holds, from its first and last records.
#[derive(Debug, Clone)]
pub struct LogFile {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub last_time: Option<DateTime<Utc>>,
    /// Its last record is a `log_rotated`: the chain goes on in another file.
    pub rotated: bool,
}

/// The few fields of a record the chain readers need.
#[derive(Deserialize)]
pub struct Head {
    pub seq: u64,
    #[serde(default, with = "tenancy_audit_log::record::ts::opt")]
    pub time: Option<DateTime<Utc>>,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub event: Option<String>,
    #[serde(default)]
    pub tier: Option<String>,
}

pub fn parse_head(line: &[u8]) -> Option<Head> {
    serde_json::from_slice(line).ok()
}

/// The 64 hex digits of a stored line's `hash` member (its last 66 bytes but `"}`).
pub fn line_hash(line: &[u8]) -> Option<&str> {
    let n = line.len();
    if n < 68 || &line[n - 2..] != b"\"}" {
        return None;
    }
    std::str::from_utf8(&line[n - 66..n - 2]).ok()
}

/// Whether `name` is a file `audit rotate` set aside from the log `base`: `<base>.<UTC time>`.
fn is_rotated_name(base: &str, name: &str) -> bool {
    name.strip_prefix(base)
        .and_then(|r| r.strip_prefix('.'))
        .is_some_and(|stamp| {
            stamp.len() >= 16
                && stamp.ends_with('Z')
                && stamp.contains('T')
                && stamp
                    .bytes()
                    .all(|b| b.is_ascii_digit() || b == b'T' || b == b'Z' || b == b'.')
        })
}

/// The log and its rotated files, in chain order (by first seq; the log itself last among
/// equals). Files that hold no record are left out.
pub fn log_files(log: &Path) -> std::io::Result<Vec<LogFile>> {
    let dir = log.parent().unwrap_or(Path::new("."));
    let base = log
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut paths = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(rd) => {
            for e in rd {
                let e = e?;
                let name = e.file_name().to_string_lossy().into_owned();
                if (name == base || is_rotated_name(&base, &name)) && e.file_type()?.is_file() {
                    paths.push(e.path());
                }
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    }
    let mut files = Vec::new();
    for p in paths {
        if let Some(f) = describe(&p)? {
            files.push(f);
        }
    }
    files.sort_by_key(|f| (f.first_seq, f.path == log, f.last_seq));
    Ok(files)
}

/// First and last record of one file (`None`: no record in it).
pub fn describe(path: &Path) -> std::io::Result<Option<LogFile>> {
    let mut f = File::open(path)?;
    let meta = f.metadata()?;
    let mut first = None;
    let mut buf = vec![0u8; 64 * 1024];
    let n = f.read(&mut buf)?;
    for line in buf[..n].split(|&b| b == b'\n') {
        if let Some(h) = parse_head(line) {
            first = Some(h.seq);
            break;
        }
    }
    let Some(first_seq) = first else {
        return Ok(None);
    };
    // The last complete line: read the tail.
    let len = meta.len();
    let take = len.min(1 << 20);
    f.seek(SeekFrom::Start(len - take))?;
    let mut tail = Vec::with_capacity(take as usize);
    f.take(take).read_to_end(&mut tail)?;
    let mut last = None;
    for line in tail.rsplit(|&b| b == b'\n') {
        if let Some(h) = parse_head(line) {
            last = Some(h);
            break;
        }
    }
    let last = last.unwrap_or(Head {
        seq: first_seq,
        time: None,
        node: None,
        event: None,
        tier: None,
    });
    Ok(Some(LogFile {
        path: path.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
        first_seq,
        last_seq: last.seq,
        last_time: last.time,
        rotated: last.event.as_deref() == Some("log_rotated"),
    }))
}

/// Where a reader stands: after the record `seq` (hash `hash`), at `offset` of the file
/// (`dev`, `ino`) that holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Position {
    pub seq: u64,
    #[serde(default)]
    pub hash: String,
    #[serde(default)]
    pub dev: u64,
    #[serde(default)]
    pub ino: u64,
    #[serde(default)]
    pub offset: u64,
}

/// One record line read from the chain (without its `\n`), and the position after it.
#[derive(Debug, Clone)]
pub struct Line {
    pub bytes: Vec<u8>,
    pub seq: u64,
    pub node: String,
    pub time: Option<DateTime<Utc>>,
    pub after: Position,
}

/// What [`ChainReader::seek`] found about the position it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seek {
    /// The record at the position's seq is there with its hash: reading goes on after it.
    Resumed,
    /// From the oldest record on the node (seq 0 asked, or nothing older left).
    FromStart,
    /// The record at that seq has another hash than the cursor's, or is gone: the log was
    /// replaced or rewritten; reading starts over from the oldest record.
    StartedOver(String),
}

/// Reads a node's chain record by record across its files, never waiting on the lock the
/// appenders hold (a busy log is read again a moment later).
pub struct ChainReader {
    log: PathBuf,
    file: Option<(File, u64, u64)>,
    /// Offset of the next byte to read in `file`, and the position after the last line given.
    offset: u64,
    pos: Position,
    pending: Vec<u8>,
    /// The last line read was a `log_rotated`.
    at_rotation: bool,
}

impl ChainReader {
    pub fn new(log: &Path) -> ChainReader {
        ChainReader {
            log: log.to_path_buf(),
            file: None,
            offset: 0,
            pos: Position::default(),
            pending: Vec::new(),
            at_rotation: false,
        }
    }

    /// Goes to just after `p` (seq 0: the chain's start).
    pub fn seek(&mut self, p: &Position) -> std::io::Result<Seek> {
        self.file = None;
        self.pending.clear();
        self.at_rotation = false;
        self.pos = Position::default();
        let files = log_files(&self.log)?;
        if p.seq == 0 {
            self.open_first(&files)?;
            return Ok(Seek::FromStart);
        }
        // The file that holds seq p.seq: the hint if it still names it, else by first seq.
        let holder = files
            .iter()
            .find(|f| {
                (f.dev, f.ino) == (p.dev, p.ino) && f.first_seq <= p.seq && p.seq <= f.last_seq
            })
            .or_else(|| {
                files
                    .iter()
                    .rev()
                    .find(|f| f.first_seq <= p.seq && p.seq <= f.last_seq)
            })
            .cloned();
        let Some(holder) = holder else {
            self.open_first(&files)?;
            return Ok(Seek::StartedOver(format!(
                "no file of {} holds seq {} any more",
                self.log.display(),
                p.seq
            )));
        };
        let f = File::open(&holder.path)?;
        self.file = Some((f, holder.dev, holder.ino));
        self.offset = 0;
        // Read on to seq p.seq (the file is read from its start: positions are cheap to
        // find again, and a hint that no longer fits is never trusted) and check its hash.
        loop {
            let lines = self.read_lines(1 << 20)?;
            if lines.is_empty() {
                break;
            }
            let Some(found) = lines.into_iter().find(|l| l.seq == p.seq) else {
                continue;
            };
            let hash = line_hash(&found.bytes).unwrap_or_default().to_string();
            if !p.hash.is_empty() && hash != p.hash {
                let why = format!(
                    "the record seq {} in {} has hash {hash}, the cursor says {}",
                    p.seq,
                    holder.path.display(),
                    p.hash
                );
                self.seek(&Position::default())?;
                return Ok(Seek::StartedOver(why));
            }
            // Lines read past it in the same batch are read again.
            self.offset = found.after.offset;
            self.pending.clear();
            self.pos = found.after;
            return Ok(Seek::Resumed);
        }
        let why = format!("seq {} was not found in {}", p.seq, holder.path.display());
        self.seek(&Position::default())?;
        Ok(Seek::StartedOver(why))
    }

    fn open_first(&mut self, files: &[LogFile]) -> std::io::Result<()> {
        if let Some(f) = files.first() {
            self.file = Some((File::open(&f.path)?, f.dev, f.ino));
        }
        self.offset = 0;
        Ok(())
    }

    /// Reads what the file holds past `offset` into `pending` (a busy log: nothing now).
    fn read_more(&mut self) -> std::io::Result<usize> {
        if self.file.is_none() {
            let files = log_files(&self.log)?;
            self.open_first(&files)?;
        }
        let Some((f, _, _)) = &self.file else {
            return Ok(0);
        };
        // A shared lock, never waited for: under it no append is half done (an append that
        // fails takes its record out again under its exclusive lock).
        match flock(f, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => return Ok(0),
            Err(e) => return Err(e.into()),
        }
        let read = (|| {
            let mut f = f;
            f.seek(SeekFrom::Start(self.offset + self.pending.len() as u64))?;
            let mut chunk = Vec::with_capacity(256 * 1024);
            f.take(256 * 1024).read_to_end(&mut chunk)?;
            Ok::<_, std::io::Error>(chunk)
        })();
        let _ = flock(f, FlockOperation::Unlock);
        let chunk = read?;
        self.pending.extend_from_slice(&chunk);
        Ok(chunk.len())
    }

    /// The next complete lines of the file (at most about `max_bytes`).
    fn read_lines(&mut self, max_bytes: usize) -> std::io::Result<Vec<Line>> {
        let mut out = Vec::new();
        let mut taken = 0;
        loop {
            let Some(nl) = self.pending.iter().position(|&b| b == b'\n') else {
                if !out.is_empty() || self.read_more()? == 0 {
                    break;
                }
                continue;
            };
            let line: Vec<u8> = self.pending.drain(..=nl).collect();
            self.offset += line.len() as u64;
            let body = &line[..line.len() - 1];
            let Some(h) = parse_head(body) else {
                // Not a record: verify reports it; nothing to ship.
                continue;
            };
            let (dev, ino) = self.file.as_ref().map_or((0, 0), |(_, d, i)| (*d, *i));
            self.at_rotation = h.event.as_deref() == Some("log_rotated");
            self.pos = Position {
                seq: h.seq,
                hash: line_hash(body).unwrap_or_default().to_string(),
                dev,
                ino,
                offset: self.offset,
            };
            taken += line.len();
            out.push(Line {
                bytes: body.to_vec(),
                seq: h.seq,
                node: h.node.unwrap_or_default(),
                time: h.time,
                after: self.pos.clone(),
            });
            if taken >= max_bytes {
                break;
            }
        }
        Ok(out)
    }

    /// The next lines after the position (empty: nothing new now).
    pub fn next(&mut self, max_bytes: usize) -> std::io::Result<Vec<Line>> {
        let lines = self.read_lines(max_bytes)?;
        if !lines.is_empty() {
            return Ok(lines);
        }
        if self.at_rotation && self.pending.is_empty() {
            // The chain goes on in the file whose first record follows the log_rotated one.
            let want = self.pos.seq + 1;
            if let Some(next) = log_files(&self.log)?
                .into_iter()
                .find(|f| f.first_seq == want)
            {
                self.file = Some((File::open(&next.path)?, next.dev, next.ino));
                self.offset = 0;
                self.at_rotation = false;
                return self.read_lines(max_bytes);
            }
        }
        if self.file.is_none() {
            return self.read_lines(max_bytes);
        }
        Ok(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotated_names_are_the_log_and_a_utc_time() {
        assert!(is_rotated_name(
            "audit.jsonl",
            "audit.jsonl.20261201T101112.123Z"
        ));
        assert!(!is_rotated_name("audit.jsonl", "audit.jsonl.anchors"));
        assert!(!is_rotated_name("audit.jsonl", "audit.jsonl"));
        assert!(!is_rotated_name(
            "audit.jsonl",
            "other.20261201T101112.123Z"
        ));
    }
}
