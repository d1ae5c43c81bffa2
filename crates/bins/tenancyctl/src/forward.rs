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
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};
use tenancy_audit_log::{Event, Outcome};
use tenancy_config::{Collector, Config};

use crate::chain::{ChainReader, Line, Position, Seek};

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

/// The TLS client of every collector: the CA file's certificates, and the node's client
/// certificate when the config names one (its key root's alone).
pub fn tls_config(config: &Config) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let Some(ca) = &config.audit.ca_file else {
        bail!("audit.ca_file is not set: the collectors' certificates cannot be checked");
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs: Vec<CertificateDer> = CertificateDer::pem_file_iter(ca)
        .with_context(|| format!("audit.ca_file {}", ca.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("audit.ca_file {}: not PEM certificates", ca.display()))?;
    if certs.is_empty() {
        bail!("audit.ca_file {}: holds no certificate", ca.display());
    }
    for c in certs {
        roots
            .add(c)
            .with_context(|| format!("audit.ca_file {}: a certificate it holds", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_root_certificates(roots);
    let cfg = match (&config.audit.cert_file, &config.audit.key_file) {
        (Some(cert), Some(key)) => {
            // The key file: root's alone, as every key of the product.
            let pem = tenancy_audit_log::sign::read_root_only(key, "audit.key_file", 1, 1 << 20)
                .map_err(anyhow::Error::msg)?;
            let key_der = PrivateKeyDer::from_pem_slice(&pem)
                .with_context(|| format!("audit.key_file {}: no PEM private key", key.display()))?;
            let chain: Vec<CertificateDer> = CertificateDer::pem_file_iter(cert)
                .with_context(|| format!("audit.cert_file {}", cert.display()))?
                .collect::<Result<_, _>>()
                .with_context(|| format!("audit.cert_file {}: not PEM", cert.display()))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .context("audit.cert_file and audit.key_file do not make a client certificate")?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
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

/// Whether the collector still holds the session: what it sent (session tickets, an alert,
/// close_notify) is read without waiting; end of stream, a reset or an alert mean it is gone.
fn alive(tls: &mut Tls) -> bool {
    if tls.sock.set_nonblocking(true).is_err() {
        return false;
    }
    let up = loop {
        match tls.conn.read_tls(&mut tls.sock) {
            Ok(0) => break false,
            Ok(_) => match tls.conn.process_new_packets() {
                Ok(st) if st.peer_has_closed() => break false,
                Ok(_) => continue,
                Err(_) => break false,
            },
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    // Plaintext the collector sent (it never should) is dropped.
    let mut sink = [0u8; 512];
    while matches!(tls.conn.reader().read(&mut sink), Ok(n) if n > 0) {}
    up && tls.sock.set_nonblocking(false).is_ok()
}

/// How long a collector has to close its end of a session after ours.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Ends a session and waits for the collector's end: Ok once it closed after reading
/// everything (end of stream, after its close_notify or without); a reset (it closed with our
/// bytes unread), an error or no answer within [`CLOSE_WAIT`] is an Err.
fn close_and_wait(tls: &mut Tls) -> Result<(), String> {
    tls.conn.send_close_notify();
    while tls.conn.wants_write() {
        tls.conn
            .write_tls(&mut tls.sock)
            .map_err(|e| format!("sending close_notify: {e}"))?;
    }
    tls.sock
        .shutdown(std::net::Shutdown::Write)
        .map_err(|e| format!("closing our end: {e}"))?;
    let deadline = Instant::now() + CLOSE_WAIT;
    let _ = tls.sock.set_read_timeout(Some(CLOSE_WAIT));
    loop {
        match tls.conn.read_tls(&mut tls.sock) {
            Ok(0) => return Ok(()),
            Ok(_) => {
                let _ = tls.conn.process_new_packets();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "no end of the session from it within {CLOSE_WAIT:?}"
                ))
            }
            Err(e) => return Err(format!("the session ended with {e}")),
        }
        if Instant::now() > deadline {
            return Err(format!(
                "no end of the session from it within {CLOSE_WAIT:?}"
            ));
        }
    }
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// Connects and completes the TLS handshake: nothing is sent to a collector whose certificate
/// does not verify.
fn connect(c: &Collector, tls: &Arc<rustls::ClientConfig>) -> Result<Tls, String> {
    let addrs: Vec<_> = (c.host.as_str(), c.port)
        .to_socket_addrs()
        .map_err(|e| format!("collector {c}: cannot resolve {}: {e}", c.host))?
        .collect();
    let mut last = format!("collector {c}: no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, Duration::from_secs(5)) {
            Ok(sock) => {
                let _ = sock.set_write_timeout(Some(Duration::from_secs(30)));
                let _ = sock.set_read_timeout(Some(Duration::from_secs(10)));
                let name = ServerName::try_from(c.host.clone())
                    .map_err(|e| format!("collector {c}: {e}"))?;
                let conn = rustls::ClientConnection::new(tls.clone(), name)
                    .map_err(|e| format!("collector {c}: TLS: {e}"))?;
                let mut s = rustls::StreamOwned::new(conn, sock);
                while s.conn.is_handshaking() {
                    if let Err(e) = s.conn.complete_io(&mut s.sock) {
                        return Err(format!("collector {c}: TLS handshake with {a}: {e}"));
                    }
                }
                return Ok(s);
            }
            Err(e) => last = format!("collector {c}: cannot connect to {a}: {e}"),
        }
    }
    Err(last)
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
        let lines: Vec<Line> = self
            .reader
            .next(256 * 1024)
            .map_err(|e| format!("reading {}: {e}", config.cluster.audit_log.display()))?;
        let mut buf = Vec::with_capacity(64 * 1024);
        let mut batch: Vec<Sent> = Vec::new();
        let mut anchor_pos = self.anchors.pos.clone();
        let mut n = 0;
        let push_anchors = |me: &mut Self,
                            upto: u64,
                            buf: &mut Vec<u8>,
                            batch: &mut Vec<Sent>,
                            anchor_pos: &mut AnchorPosition,
                            n: &mut usize|
         -> Result<(), String> {
            for (body, pos) in me
                .anchors
                .next(upto)
                .map_err(|e| format!("reading the anchor file: {e}"))?
            {
                let host = tenancy_audit_log::ParsedAnchor::parse(&body)
                    .map(|p| p.node)
                    .unwrap_or_default();
                frame(buf, &Utc::now(), &host, "anchor", body.as_bytes());
                *anchor_pos = pos.clone();
                batch.push(Sent {
                    record: None,
                    anchors: pos,
                });
                *n += 1;
            }
            Ok(())
        };
        push_anchors(
            self,
            self.sent_seq,
            &mut buf,
            &mut batch,
            &mut anchor_pos,
            &mut n,
        )?;
        for l in lines {
            if l.seq <= self.sent_seq {
                continue;
            }
            frame(
                &mut buf,
                &l.time.unwrap_or_else(Utc::now),
                &l.node,
                "record",
                &l.bytes,
            );
            self.sent_seq = l.seq;
            batch.push(Sent {
                record: Some((l.after.clone(), l.time)),
                anchors: anchor_pos.clone(),
            });
            n += 1;
            // The anchors of the records up to here.
            push_anchors(
                self,
                self.sent_seq,
                &mut buf,
                &mut batch,
                &mut anchor_pos,
                &mut n,
            )?;
        }
        if batch.is_empty() {
            return Ok(0);
        }
        if self.conn.is_none() {
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
        }
        let conn = self.conn.as_mut().expect("connected above");
        conn.write_all(&buf)
            .and_then(|()| conn.flush())
            .map_err(|e| format!("collector {}: sending: {e}", self.collector))?;
        // A record's position carries the anchors sent before it: fill them in order.
        let mut last_anchor = self.cursor.anchors.clone();
        for mut s in batch {
            if s.record.is_none() {
                last_anchor = s.anchors.clone();
            } else if s.anchors == AnchorPosition::default() {
                s.anchors = last_anchor.clone();
            }
            self.unconfirmed.push_back(s);
        }
        Ok(n)
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
    let confirm_after = Duration::from_millis(args.confirm_ms);
    let poll = Duration::from_millis(args.poll_ms.max(1));
    let mut streams = Vec::new();
    for c in &config.audit.collectors {
        streams.push(Stream::new(config, c, args.resend_from)?);
    }
    // With --once: caught up to the head there is now (this run's own start record included).
    let target = crate::chain::log_files(&config.cluster.audit_log)?
        .last()
        .map_or(0, |f| f.last_seq);
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let mut code = ExitCode::SUCCESS;
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
            break;
        }
        if args.once {
            let done = streams
                .iter()
                .all(|s| s.caught_up() && s.cursor.record.seq >= target);
            if done {
                break;
            }
            if Instant::now() > deadline {
                say("--once: not every collector caught up in time");
                code = ExitCode::FAILURE;
                break;
            }
        }
        if sent == 0 {
            std::thread::sleep(poll);
        }
    }
    // Stopping: the stop is recorded and sent too, and what was sent gets its chance to be
    // confirmed before the cursors are saved.
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
    Ok(code)
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
