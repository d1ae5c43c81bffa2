//! `tenancyctl audit forward`: ships every record of this node's audit chain, and every
//! anchor of `cluster.audit_anchor`, to each `[audit] collectors` entry as RFC 5424 syslog
//! messages over TLS with RFC 5425 octet-counting framing (`LEN SP MSG`), in order.
//!
//! The local log is the buffer: the forwarder reads it (never waiting on the appenders' lock,
//! so the job path never waits for a collector) and keeps, per collector, a cursor in
//! `<state_dir>/audit-forward/` of the last record the collector confirmed. Syslog over TLS has
//! no acknowledgement (and a TCP acknowledgement says only that the collector's kernel holds
//! the bytes, not that its daemon read them), so the forwarder ends each TLS session after
//! `--confirm-ms`: close_notify and its half of the connection, then it waits for the
//! collector's end. A collector closes its end once it has read everything before ours, so
//! that end confirms every message of the session; a collector that resets, hangs or dies
//! confirms nothing, and the forwarder sends again from the cursor in a new session (at least
//! once: `audit verify` skips exact copies).
//! After a restart it resumes at the cursor; a cursor that is corrupt, or names a record the
//! log no longer holds with its hash, starts over from the oldest record on the node (copies,
//! never a gap). A collector whose certificate does not verify against `ca_file` gets nothing:
//! the TLS handshake fails before the first byte of a record.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tenancy_audit_log::{Event, Outcome};
use tenancy_config::{Collector, Config};

use crate::chain::{ChainReader, Line, Position, Seek};

mod tls;
use tls::{alive, close_and_wait, connect, tls_config, Tls, CLOSE_WAIT};

#[derive(Debug, clap::Args)]
pub struct ForwardArgs {
    /// Exit once every record and anchor there at the start is confirmed by every collector
    /// (default: run until SIGTERM, as the tenancy-audit-forward unit does)
    #[arg(long)]
    pub once: bool,
    /// How long a TLS session lasts: the collector's end of it confirms every message sent in
    /// it (what a session sent goes again until then)
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    pub confirm_ms: u64,
    /// How often the log is looked at for new records
    #[arg(long, default_value_t = 100, value_name = "MS")]
    pub poll_ms: u64,
    /// With --once: give up (exit 1) after this many seconds without every collector caught up
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub timeout: u64,
    /// Send again from this seq on (every collector), e.g. after a collector lost what it had
    /// confirmed and `audit verify` of its copy found the gap; its cursor moves back there
    #[arg(long, value_name = "SEQ")]
    pub resend_from: Option<u64>,
}

/// The folder of the cursors, in the state folder (root's alone).
pub fn cursor_dir(config: &Config) -> PathBuf {
    config.cluster.state_dir.join("audit-forward")
}

/// A collector's cursor file.
pub fn cursor_path(config: &Config, c: &Collector) -> PathBuf {
    let name: String = c
        .to_string()
        .chars()
        .map(|ch| {
            if ch.is_ascii_alphanumeric() || ch == '.' || ch == '-' {
                ch
            } else {
                '_'
            }
        })
        .collect();
    cursor_dir(config).join(format!("{name}.json"))
}

/// What a cursor file holds: where the collector's copy ends, and how forwarding to it goes.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Cursor {
    pub collector: String,
    /// After the last record the collector confirmed.
    pub record: Position,
    /// The time of that record.
    #[serde(default, with = "tenancy_audit_log::record::ts::opt")]
    pub record_time: Option<DateTime<Utc>>,
    /// After the last anchor line it confirmed in `cluster.audit_anchor`.
    #[serde(default)]
    pub anchors: AnchorPosition,
    /// Failed connections and sends since the cursor was made.
    #[serde(default)]
    pub errors: u64,
    #[serde(default)]
    pub last_error: Option<String>,
    #[serde(default)]
    pub connected: bool,
    #[serde(default, with = "tenancy_audit_log::record::ts::opt")]
    pub updated: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchorPosition {
    pub dev: u64,
    pub ino: u64,
    pub offset: u64,
}

/// Reads a cursor; `Err` names what is wrong with one that is there but cannot be read.
pub fn read_cursor(path: &Path) -> Result<Option<Cursor>, String> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| format!("cursor {} is corrupt: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cursor {}: {e}", path.display())),
    }
}

fn write_cursor(path: &Path, c: &Cursor) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(c).map_err(std::io::Error::other)?)?;
    f.sync_data()?;
    std::fs::rename(&tmp, path)
}

/// One message of RFC 5424 in its RFC 5425 frame: `LEN SP <86>1 TIME HOST tenancy-audit -
/// MSGID - MSG` (facility authpriv, severity info; MSGID `record` or `anchor`, so a collector
/// can file them apart; MSG the line as the node holds it).
pub fn frame(out: &mut Vec<u8>, time: &DateTime<Utc>, host: &str, msgid: &str, msg: &[u8]) {
    let head = format!(
        "<86>1 {} {} tenancy-audit - {msgid} - ",
        tenancy_audit_log::record::ts::format(time),
        if host.is_empty() { "-" } else { host }
    );
    let len = head.len() + msg.len();
    out.extend_from_slice(format!("{len} ").as_bytes());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(msg);
}

/// Reads the anchor file line by line from a position, never past an anchor whose record has
/// not been sent (a collector gets every record before its anchor).
struct AnchorReader {
    path: Option<PathBuf>,
    file: Option<(std::fs::File, u64, u64)>,
    pos: AnchorPosition,
    pending: Vec<u8>,
}

impl AnchorReader {
    fn new(path: Option<PathBuf>, pos: AnchorPosition) -> AnchorReader {
        AnchorReader {
            path,
            file: None,
            pos,
            pending: Vec::new(),
        }
    }

    fn open(&mut self) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom};
        use std::os::unix::fs::MetadataExt;
        let Some(p) = &self.path else { return Ok(()) };
        let f = match std::fs::File::open(p) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let m = f.metadata()?;
        if (m.dev(), m.ino()) != (self.pos.dev, self.pos.ino) || m.len() < self.pos.offset {
            // Another file than the cursor's (the anchor file was rotated): from its start.
            self.pos = AnchorPosition {
                dev: m.dev(),
                ino: m.ino(),
                offset: 0,
            };
        }
        let mut f = f;
        f.seek(SeekFrom::Start(self.pos.offset))?;
        self.file = Some((f, m.dev(), m.ino()));
        self.pending.clear();
        Ok(())
    }

    /// Anchor lines up to those of records at or below `sent_seq`, each with the position
    /// after it.
    fn next(&mut self, sent_seq: u64) -> std::io::Result<Vec<(String, AnchorPosition)>> {
        if self.path.is_none() {
            return Ok(Vec::new());
        }
        if self.file.is_none() {
            self.open()?;
        }
        if let Some((f, _, _)) = &mut self.file {
            let mut chunk = Vec::new();
            f.take(256 * 1024).read_to_end(&mut chunk)?;
            self.pending.extend_from_slice(&chunk);
            if chunk.is_empty() {
                // Rotated away? Read the file now at the path once this one is drained.
                use std::os::unix::fs::MetadataExt;
                let (d, i) = (self.pos.dev, self.pos.ino);
                if let Some(p) = &self.path {
                    if let Ok(m) = std::fs::metadata(p) {
                        if (m.dev(), m.ino()) != (d, i) && self.pending.is_empty() {
                            self.file = None;
                            self.pos = AnchorPosition::default();
                            return self.next(sent_seq);
                        }
                    }
                }
            }
        }
        let mut out = Vec::new();
        let mut consumed = 0;
        let mut offset = self.pos.offset;
        for line in self.pending.split_inclusive(|&b| b == b'\n') {
            if line.last() != Some(&b'\n') {
                break;
            }
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            let body = text
                .find("node=")
                .map_or(String::new(), |i| text[i..].to_string());
            if let Some(p) = tenancy_audit_log::ParsedAnchor::parse(&body) {
                if p.seq > sent_seq {
                    break;
                }
            }
            consumed += line.len();
            offset += line.len() as u64;
            if !body.is_empty() {
                out.push((
                    body,
                    AnchorPosition {
                        offset,
                        ..self.pos.clone()
                    },
                ));
            }
        }
        self.pending.drain(..consumed);
        self.pos.offset = offset;
        Ok(out)
    }

    fn seek(&mut self, pos: &AnchorPosition) {
        self.pos = pos.clone();
        self.file = None;
        self.pending.clear();
    }
}

/// A message written to the collector and not yet confirmed.
struct Sent {
    record: Option<(Position, Option<DateTime<Utc>>)>,
    anchors: AnchorPosition,
}

/// Messages framed for one write, and what each of them is.
struct Batch {
    buf: Vec<u8>,
    sent: Vec<Sent>,
    /// After the last anchor framed so far.
    anchor_pos: AnchorPosition,
}

/// Everything about forwarding to one collector.
struct Stream {
    collector: Collector,
    cursor_path: PathBuf,
    cursor: Cursor,
    reader: ChainReader,
    anchors: AnchorReader,
    /// The last record sent (not confirmed), its seq.
    sent_seq: u64,
    unconfirmed: VecDeque<Sent>,
    conn: Option<Tls>,
    session_started: Instant,
    /// The outage in progress: when it began, and whether its record was written.
    failing_since: Option<Instant>,
    backoff: Duration,
    next_try: Instant,
    saved: Instant,
}

/// One line for the forwarder's own log (stderr: the journal under systemd).
fn say(s: &str) {
    eprintln!("tenancyctl audit forward: {s}");
}

fn audit_record(config: &Config, event: Event, outcome: Outcome, reason: String) {
    let mut rec = crate::admin::record(config, event, outcome).reason(reason);
    if let Err(e) = tenancy_job::audit::append_anchored(config, &mut rec) {
        say(&format!("cannot record {}: {e}", rec.event));
    }
}

impl Stream {
    fn new(
        config: &Config,
        collector: &Collector,
        resend_from: Option<u64>,
    ) -> anyhow::Result<Stream> {
        let cursor_path = cursor_path(config, collector);
        let mut reader = ChainReader::new(&config.cluster.audit_log);
        let (cursor, note) = match read_cursor(&cursor_path) {
            Ok(Some(c)) => (c, None),
            Ok(None) => (
                Cursor {
                    collector: collector.to_string(),
                    ..Cursor::default()
                },
                None,
            ),
            Err(why) => {
                let kept = cursor_path.with_extension("json.corrupt");
                let _ = std::fs::rename(&cursor_path, &kept);
                (
                    Cursor {
                        collector: collector.to_string(),
                        ..Cursor::default()
                    },
                    Some(format!(
                        "{why} (kept as {}): starting over from the oldest record on the node; \
                         the collector gets copies of what it has, never a gap",
                        kept.display()
                    )),
                )
            }
        };
        let mut cursor = cursor;
        if let Some(from) = resend_from {
            // Back to just before `from` (its hash unknown: not checked); anchors from the start.
            cursor.record = Position {
                seq: from.saturating_sub(1),
                ..Position::default()
            };
            cursor.anchors = AnchorPosition::default();
            say(&format!(
                "collector {collector}: sending again from seq {from}"
            ));
        }
        let mut anchor_pos = cursor.anchors.clone();
        let note = match reader.seek(&cursor.record)? {
            Seek::Resumed | Seek::FromStart => note,
            Seek::StartedOver(why) => {
                cursor.record = Position::default();
                anchor_pos = AnchorPosition::default();
                Some(format!(
                    "collector {collector}: {why}: starting over from the oldest record on the node"
                ))
            }
        };
        if let Some(n) = note {
            say(&n);
            cursor.errors += 1;
            cursor.last_error = Some(n.clone());
            audit_record(config, Event::ForwardError, Outcome::Failure, n);
        }
        Ok(Stream {
            collector: collector.clone(),
            cursor_path,
            sent_seq: cursor.record.seq,
            anchors: AnchorReader::new(config.cluster.audit_anchor.clone(), anchor_pos),
            cursor,
            reader,
            unconfirmed: VecDeque::new(),
            conn: None,
            session_started: Instant::now(),
            failing_since: None,
            backoff: Duration::from_millis(500),
            next_try: Instant::now(),
            saved: Instant::now() - Duration::from_secs(10),
        })
    }

    fn save(&mut self) {
        self.cursor.updated = Some(Utc::now());
        self.cursor.connected = self.failing_since.is_none();
        if let Err(e) = write_cursor(&self.cursor_path, &self.cursor) {
            say(&format!("cannot write {}: {e}", self.cursor_path.display()));
        }
        self.saved = Instant::now();
    }

    /// The connection failed: everything not confirmed goes again from the cursor.
    fn fail(&mut self, config: &Config, why: String) {
        self.conn = None;
        self.unconfirmed.clear();
        self.cursor.errors += 1;
        self.cursor.last_error = Some(why.clone());
        if let Err(e) = self.reader.seek(&self.cursor.record) {
            say(&format!("cannot read the log again from the cursor: {e}"));
        }
        self.anchors.seek(&self.cursor.anchors);
        self.sent_seq = self.cursor.record.seq;
        if self.failing_since.is_none() {
            self.failing_since = Some(Instant::now());
            say(&why);
            audit_record(
                config,
                Event::ForwardError,
                Outcome::Failure,
                format!("{why}; records wait in the node's log and go when it is reachable"),
            );
        }
        self.next_try = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(30));
        self.save();
    }

    /// Confirms what this session sent once it is `confirm_after` old (`now`: at once), by
    /// ending it: the collector's end of the session means it read every message of it, and
    /// the cursor moves over them. `Err` when the connection is gone or the collector does not
    /// end the session: nothing of it is confirmed, and it all goes again.
    fn confirm(&mut self, confirm_after: Duration, now: bool) -> Result<(), String> {
        let Some(conn) = &mut self.conn else {
            return Ok(());
        };
        if !alive(conn) {
            return Err(format!(
                "collector {}: the connection was closed",
                self.collector
            ));
        }
        if self.unconfirmed.is_empty() || (!now && self.session_started.elapsed() < confirm_after) {
            return Ok(());
        }
        let mut conn = self.conn.take().expect("checked above");
        close_and_wait(&mut conn).map_err(|e| {
            format!(
                "collector {}: {e}: the session's {} message(s) are not confirmed and go again",
                self.collector,
                self.unconfirmed.len()
            )
        })?;
        for s in self.unconfirmed.drain(..) {
            if let Some((p, t)) = s.record {
                self.cursor.record = p;
                self.cursor.record_time = t;
            }
            self.cursor.anchors = s.anchors;
        }
        self.save();
        Ok(())
    }

    /// Sends what the log and the anchor file hold past what was sent. Returns how many
    /// messages went.
    fn pump(&mut self, config: &Config) -> Result<usize, String> {
        if self.conn.is_none() && Instant::now() < self.next_try {
            return Ok(0);
        }
        let batch = self.next_batch(config)?;
        if batch.sent.is_empty() {
            return Ok(0);
        }
        self.ensure_connected(config)?;
        let n = batch.sent.len();
        self.send(batch)?;
        Ok(n)
    }

    /// Frames the records the log holds past what was sent, each after the anchors of the
    /// records before it.
    fn next_batch(&mut self, config: &Config) -> Result<Batch, String> {
        let lines: Vec<Line> = self
            .reader
            .next(256 * 1024)
            .map_err(|e| format!("reading {}: {e}", config.cluster.audit_log.display()))?;
        let mut batch = Batch {
            buf: Vec::with_capacity(64 * 1024),
            sent: Vec::new(),
            anchor_pos: self.anchors.pos.clone(),
        };
        self.frame_anchors(&mut batch)?;
        for l in lines {
            if l.seq <= self.sent_seq {
                continue;
            }
            frame(
                &mut batch.buf,
                &l.time.unwrap_or_else(Utc::now),
                &l.node,
                "record",
                &l.bytes,
            );
            self.sent_seq = l.seq;
            batch.sent.push(Sent {
                record: Some((l.after.clone(), l.time)),
                anchors: batch.anchor_pos.clone(),
            });
            // The anchors of the records up to here.
            self.frame_anchors(&mut batch)?;
        }
        Ok(batch)
    }

    /// Frames the anchor lines of the records sent so far.
    fn frame_anchors(&mut self, batch: &mut Batch) -> Result<(), String> {
        for (body, pos) in self
            .anchors
            .next(self.sent_seq)
            .map_err(|e| format!("reading the anchor file: {e}"))?
        {
            let host = tenancy_audit_log::ParsedAnchor::parse(&body)
                .map(|p| p.node)
                .unwrap_or_default();
            frame(
                &mut batch.buf,
                &Utc::now(),
                &host,
                "anchor",
                body.as_bytes(),
            );
            batch.anchor_pos = pos.clone();
            batch.sent.push(Sent {
                record: None,
                anchors: pos,
            });
        }
        Ok(())
    }

    /// Opens a session when none is open (after an outage, says it is over).
    fn ensure_connected(&mut self, config: &Config) -> Result<(), String> {
        if self.conn.is_some() {
            return Ok(());
        }
        let tls = tls_config(config).map_err(|e| format!("{e:#}"))?;
        let conn = connect(&self.collector, &tls)?;
        if let Some(since) = self.failing_since.take() {
            say(&format!(
                "collector {} reachable again after {:.1} s; sending from seq {}",
                self.collector,
                since.elapsed().as_secs_f64(),
                self.cursor.record.seq + 1
            ));
        }
        self.backoff = Duration::from_millis(500);
        self.conn = Some(conn);
        self.session_started = Instant::now();
        Ok(())
    }

    /// Writes a batch to the session; its messages wait for the session's end to be confirmed.
    fn send(&mut self, batch: Batch) -> Result<(), String> {
        let conn = self.conn.as_mut().expect("connected before");
        conn.write_all(&batch.buf)
            .and_then(|()| conn.flush())
            .map_err(|e| format!("collector {}: sending: {e}", self.collector))?;
        // A record's position carries the anchors sent before it: fill them in order.
        let mut last_anchor = self.cursor.anchors.clone();
        for mut s in batch.sent {
            if s.record.is_none() {
                last_anchor = s.anchors.clone();
            } else if s.anchors == AnchorPosition::default() {
                s.anchors = last_anchor.clone();
            }
            self.unconfirmed.push_back(s);
        }
        Ok(())
    }

    /// Everything there now was sent and confirmed.
    fn caught_up(&self) -> bool {
        self.failing_since.is_none() && self.unconfirmed.is_empty()
    }
}

pub fn run(config: &Config, args: &ForwardArgs) -> anyhow::Result<ExitCode> {
    if config.audit.collectors.is_empty() {
        // Exit 3: the unit's RestartPreventExitStatus (nothing to retry until the config
        // names a collector).
        say("[audit] collectors is empty: nothing to forward to (e.g. collectors = [\"logs1.example.org:6514\"])");
        return Ok(ExitCode::from(3));
    }
    // Bad TLS files are an error now, not a retry loop.
    tls_config(config)?;
    let dir = cursor_dir(config);
    std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("signal handler")?;
    }
    let list: Vec<String> = config
        .audit
        .collectors
        .iter()
        .map(|c| c.to_string())
        .collect();
    audit_record(
        config,
        Event::ForwardStarted,
        Outcome::Success,
        format!(
            "forwarding this node's audit records and anchors to {}",
            list.join(", ")
        ),
    );
    let mut streams = Vec::new();
    for c in &config.audit.collectors {
        streams.push(Stream::new(config, c, args.resend_from)?);
    }
    // With --once: caught up to the head there is now (this run's own start record included).
    let target = crate::chain::log_files(&config.cluster.audit_log)?
        .last()
        .map_or(0, |f| f.last_seq);
    let code = forward_until_stopped(config, args, &mut streams, &stop, target);
    finish(config, args, &mut streams);
    Ok(code)
}

/// Sends and confirms, stream by stream, until a signal comes or, with --once, every
/// collector confirmed `target` (or the timeout passed: FAILURE).
fn forward_until_stopped(
    config: &Config,
    args: &ForwardArgs,
    streams: &mut [Stream],
    stop: &AtomicBool,
    target: u64,
) -> ExitCode {
    let confirm_after = Duration::from_millis(args.confirm_ms);
    let poll = Duration::from_millis(args.poll_ms.max(1));
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    loop {
        let mut sent = 0;
        for s in streams.iter_mut() {
            match s
                .pump(config)
                .and_then(|n| s.confirm(confirm_after, false).map(|()| n))
            {
                Ok(n) => sent += n,
                Err(why) => s.fail(config, why),
            }
        }
        if stop.load(Ordering::Relaxed) {
            return ExitCode::SUCCESS;
        }
        if args.once {
            let done = streams
                .iter()
                .all(|s| s.caught_up() && s.cursor.record.seq >= target);
            if done {
                return ExitCode::SUCCESS;
            }
            if Instant::now() > deadline {
                say("--once: not every collector caught up in time");
                return ExitCode::FAILURE;
            }
        }
        if sent == 0 {
            std::thread::sleep(poll);
        }
    }
}

/// Stopping: the stop is recorded and sent too, and what was sent gets its chance to be
/// confirmed before the cursors are saved.
fn finish(config: &Config, args: &ForwardArgs, streams: &mut [Stream]) {
    audit_record(
        config,
        Event::ForwardStopped,
        Outcome::Success,
        format!(
            "stopping; collectors confirmed up to {}",
            streams
                .iter()
                .map(|s| format!("{} seq {}", s.collector, s.cursor.record.seq))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    // Each collector that is reachable gets the rest (the stop record too) and confirms it
    // now; one that is not keeps its cursor, and the next run sends again from there.
    let confirm_after = Duration::from_millis(args.confirm_ms);
    let until = Instant::now() + CLOSE_WAIT + Duration::from_secs(2);
    for s in streams.iter_mut().filter(|s| s.failing_since.is_none()) {
        s.next_try = Instant::now();
        while Instant::now() < until {
            match s
                .pump(config)
                .and_then(|n| s.confirm(confirm_after, true).map(|()| n))
            {
                Ok(0) if s.unconfirmed.is_empty() => break,
                Ok(_) => {}
                Err(why) => {
                    say(&why);
                    s.conn = None;
                    break;
                }
            }
        }
        s.save();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_frame_is_its_length_and_an_rfc5424_message() {
        let mut out = Vec::new();
        let t = chrono::DateTime::parse_from_rfc3339("2026-12-01T10:00:00.123Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        super::frame(&mut out, &t, "n1", "record", b"{\"seq\":1}");
        let s = String::from_utf8(out).unwrap();
        let (len, msg) = s.split_once(' ').unwrap();
        assert_eq!(len.parse::<usize>().unwrap(), msg.len());
        assert_eq!(
            msg,
            "<86>1 2026-12-01T10:00:00.123Z n1 tenancy-audit - record - {\"seq\":1}"
        );
    }
}
