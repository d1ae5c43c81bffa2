//! Anchors: copies of the chain head kept outside the log (syslog, an anchor file elsewhere), so
//! a cut-off tail — which a hash chain alone cannot reveal — is detected by `verify --anchor`.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::ops::Bound;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::Serialize;

/// Fixed syslog tag of anchor messages.
pub const SYSLOG_TAG: &str = "tenancy-audit";
/// The local syslog socket.
pub const DEV_LOG: &str = "/dev/log";

/// `node=<node> seq=<seq> hash=<hash>`: the text every anchor carries (and its MAC covers).
pub fn anchor_line(node: &str, seq: u64, hash: &str) -> String {
    format!("node={node} seq={seq} hash={hash}")
}

/// The key that authenticates anchors (`cluster.audit_anchor_key`): an anchor sent with it
/// carries `mac=<HMAC-SHA256 of its text>`, and `audit verify --anchor-key` takes only anchors
/// whose MAC holds. Syslog takes a line from any local user (`logger`), so without a key a
/// user can add an anchor that makes verify report a cut or rewritten log; with it they cannot.
/// The same key on every node and with the auditor, readable by root alone (as munge's key).
pub struct AnchorKey {
    key: Vec<u8>,
}

impl std::fmt::Debug for AnchorKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnchorKey(..)")
    }
}

/// Fewest bytes a key file must hold: 128 bits.
pub const ANCHOR_KEY_MIN_BYTES: usize = 16;

impl AnchorKey {
    /// Reads a key file: a regular file (not followed through a symlink) that only its owner,
    /// root or the reader, may read or write, of 16 to 4096 bytes, used as they are. Errors
    /// name the file and what to do.
    pub fn load(path: &Path) -> Result<AnchorKey, String> {
        use std::io::Read;
        use std::os::unix::fs::MetadataExt;
        let why = |what: String| format!("anchor key {}: {what}", path.display());
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(
                (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC).bits() as i32,
            )
            .open(path)
            .map_err(|e| why(format!("cannot open: {e}")))?;
        let m = f.metadata().map_err(|e| why(e.to_string()))?;
        let me = rustix::process::geteuid().as_raw();
        if !m.is_file() {
            return Err(why("not a regular file".into()));
        }
        if m.uid() != 0 && m.uid() != me {
            return Err(why(format!("owned by uid {}, not root", m.uid())));
        }
        if m.mode() & 0o077 != 0 {
            return Err(why(format!(
                "mode {:04o} lets others read or write it; chmod 600",
                m.mode() & 0o7777
            )));
        }
        let mut key = Vec::with_capacity(64);
        std::io::Read::by_ref(&mut f)
            .take(4097)
            .read_to_end(&mut key)
            .map_err(|e| why(format!("cannot read: {e}")))?;
        if key.len() < ANCHOR_KEY_MIN_BYTES || key.len() > 4096 {
            return Err(why(format!(
                "holds {} bytes; make one of 32 random bytes: head -c 32 /dev/urandom > {}",
                key.len(),
                path.display()
            )));
        }
        Ok(AnchorKey { key })
    }

    /// A key from bytes (tests, and callers that hold the key already).
    pub fn from_bytes(key: &[u8]) -> AnchorKey {
        AnchorKey { key: key.to_vec() }
    }

    fn hmac(&self) -> hmac::Hmac<sha2::Sha256> {
        use hmac::Mac;
        hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.key).expect("HMAC takes any key length")
    }

    /// The MAC of an anchor's text ([`anchor_line`]), lowercase hex.
    pub fn mac(&self, body: &str) -> String {
        use hmac::Mac;
        let mut m = self.hmac();
        m.update(body.as_bytes());
        hex::encode(m.finalize().into_bytes())
    }

    /// Whether `mac_hex` is this key's MAC of `body` (compared in constant time).
    pub fn holds(&self, body: &str, mac_hex: &str) -> bool {
        use hmac::Mac;
        let mut tag = [0u8; 32];
        if hex::decode_to_slice(mac_hex, &mut tag).is_err() {
            return false;
        }
        let mut m = self.hmac();
        m.update(body.as_bytes());
        m.verify_slice(&tag).is_ok()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum SyslogStatus {
    Sent,
    /// No syslog socket (or send failed): the anchor only went to the file, if any.
    Unavailable(String),
    /// The node name cannot be carried in an anchor (contains whitespace or `=`).
    Rejected(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AnchorStatus {
    pub syslog: SyslogStatus,
    /// `None`: no anchor file asked for; `Some(Err)`: writing it failed (message names the path).
    pub file: Option<Result<(), String>>,
}

/// Sends the anchor for `node`'s chain head to syslog (`/dev/log`) and, if given, appends it to
/// `anchor_file` (O_APPEND, 0640, fsync); with `key`, the anchor carries its MAC. Never fails:
/// look at the returned status.
pub fn send_anchor(
    node: &str,
    seq: u64,
    hash: &str,
    anchor_file: Option<&Path>,
    key: Option<&AnchorKey>,
) -> AnchorStatus {
    send_anchor_to(Path::new(DEV_LOG), node, seq, hash, anchor_file, key)
}

/// As [`send_anchor`] with an explicit syslog datagram socket path.
pub fn send_anchor_to(
    socket: &Path,
    node: &str,
    seq: u64,
    hash: &str,
    anchor_file: Option<&Path>,
    key: Option<&AnchorKey>,
) -> AnchorStatus {
    if node.is_empty() || node.chars().any(|c| c.is_whitespace() || c == '=') {
        let why = format!("node name {node:?} contains whitespace or '=' and cannot be anchored");
        return AnchorStatus {
            syslog: SyslogStatus::Rejected(why.clone()),
            file: anchor_file.map(|_| Err(why)),
        };
    }
    let mut body = anchor_line(node, seq, hash);
    if let Some(k) = key {
        let mac = k.mac(&body);
        body.push_str(" mac=");
        body.push_str(&mac);
    }
    let syslog = match syslog_send(socket, &body) {
        Ok(()) => SyslogStatus::Sent,
        Err(e) => SyslogStatus::Unavailable(format!("{}: {e}", socket.display())),
    };
    let file = anchor_file.map(|p| {
        append_anchor_file(p, &body).map_err(|e| format!("anchor file {}: {e}", p.display()))
    });
    AnchorStatus { syslog, file }
}

fn syslog_send(socket: &Path, body: &str) -> std::io::Result<()> {
    // RFC 3164: <PRI>TIMESTAMP HOSTNAME TAG[PID]: MSG ; facility authpriv(10), severity info(6).
    let pri = 10 * 8 + 6;
    let host = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let ts = rfc3164_time(&Utc::now());
    let msg = format!(
        "<{pri}>{ts} {host} {SYSLOG_TAG}[{}]: {body}",
        std::process::id()
    );
    let sock = UnixDatagram::unbound()?;
    sock.send_to(msg.as_bytes(), socket)?;
    Ok(())
}

/// RFC 3164's TIMESTAMP, `Mmm dd hh:mm:ss` with the day padded by a space, from the date's
/// fields: chrono's strftime formatter is 14 KB of code the epilog would load for 15 bytes.
fn rfc3164_time(t: &DateTime<Utc>) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    format!(
        "{} {:>2} {:02}:{:02}:{:02}",
        MONTHS[t.month0() as usize],
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

fn append_anchor_file(path: &Path, body: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC).bits() as i32)
        .open(path)?;
    let line = format!(
        "{} {SYSLOG_TAG}: {body}\n",
        crate::record::ts::format(&Utc::now())
    );
    f.write_all(line.as_bytes())?;
    f.sync_data()
}

/// The newest anchor of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Anchor {
    pub node: String,
    pub seq: u64,
    pub hash: String,
    /// Where it was read: `file:line`.
    pub source: String,
}

/// Where an anchor was first read: an index into the set's sources, and its line (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    source: u32,
    line: u64,
}

/// Every anchor of one node: (seq, hash) -> where it was first read. A seq with two hashes
/// means a forged anchor or a rewritten log. Hashes are kept as bytes and sources by index:
/// anchors come one per job end, so a year of a busy cluster is millions of them.
#[derive(Debug, Clone, Default)]
pub struct NodeAnchors {
    by_seq: BTreeMap<(u64, [u8; 32]), Origin>,
}

impl NodeAnchors {
    /// The distinct hashes anchored for `seq`.
    pub fn at(&self, seq: u64) -> impl Iterator<Item = (&[u8; 32], Origin)> {
        self.by_seq
            .range((seq, [0; 32])..=(seq, [0xff; 32]))
            .map(|((_, h), o)| (h, *o))
    }

    /// Anchors with a seq above `seq`, by seq.
    pub fn after(&self, seq: u64) -> impl Iterator<Item = (u64, &[u8; 32], Origin)> {
        self.by_seq
            .range((Bound::Excluded((seq, [0xff; 32])), Bound::Unbounded))
            .map(|((s, h), o)| (*s, h, *o))
    }

    /// The highest anchored seq (the first of its hashes).
    pub fn newest(&self) -> Option<(u64, &[u8; 32], Origin)> {
        let ((s, _), _) = self.by_seq.last_key_value()?;
        self.at(*s).next().map(|(h, o)| (*s, h, o))
    }

    pub fn len(&self) -> usize {
        self.by_seq.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_seq.is_empty()
    }
}

/// Anchors read for verify: the newest per node, and every (seq, hash) per node.
#[derive(Debug, Clone, Default)]
pub struct AnchorSet {
    /// Newest (highest seq) anchor per node.
    pub by_node: HashMap<String, Anchor>,
    all: HashMap<String, NodeAnchors>,
    sources: Vec<String>,
    /// With a key, only anchors whose MAC holds are taken.
    key: Option<std::sync::Arc<AnchorKey>>,
    /// Anchor lines left out for want of a valid MAC, and where the first was read.
    pub unauthenticated: u64,
    pub first_unauthenticated: Option<String>,
}

/// The `mac=` of an anchor line, if it carries one.
pub fn anchor_mac(line: &str) -> Option<&str> {
    line.split_whitespace().find_map(|t| t.strip_prefix("mac="))
}

/// Extracts `node=`, `seq=`, `hash=` from one line; `None` unless all three are present and valid.
pub fn parse_anchor_line(line: &str) -> Option<(String, u64, String)> {
    let (mut node, mut seq, mut hash) = (None, None, None);
    for tok in line.split_whitespace() {
        if let Some(v) = tok.strip_prefix("node=") {
            node = Some(v);
        } else if let Some(v) = tok.strip_prefix("seq=") {
            seq = v.parse::<u64>().ok();
        } else if let Some(v) = tok.strip_prefix("hash=") {
            if v.len() == 64
                && v.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                hash = Some(v);
            }
        }
    }
    match (node, seq, hash) {
        (Some(n), Some(s), Some(h)) if !n.is_empty() => Some((n.to_string(), s, h.to_string())),
        _ => None,
    }
}

impl AnchorSet {
    /// A set that takes only anchors carrying a valid MAC of `key`.
    pub fn with_key(key: AnchorKey) -> AnchorSet {
        AnchorSet {
            key: Some(std::sync::Arc::new(key)),
            ..AnchorSet::default()
        }
    }

    /// Whether anchors are authenticated (made with [`AnchorSet::with_key`]).
    pub fn authenticated(&self) -> bool {
        self.key.is_some()
    }

    /// Adds one anchor read from `source`. `hash` must be 64 hex digits (as
    /// [`parse_anchor_line`] gives); another value cannot match any record and is not kept
    /// (returns false).
    pub fn add(&mut self, node: String, seq: u64, hash: String, source: String) -> bool {
        // Callers add run after run from one source: only the last one is looked at.
        if self.sources.last() != Some(&source) {
            self.sources.push(source);
        }
        let src = self.sources.len() - 1;
        self.add_at(node, seq, hash, src as u32, 0)
    }

    fn add_at(&mut self, node: String, seq: u64, hash: String, source: u32, line: u64) -> bool {
        let mut bytes = [0u8; 32];
        if hash.len() != 64 || hex::decode_to_slice(&hash, &mut bytes).is_err() {
            return false;
        }
        // The same anchor read twice (syslog and anchor file) keeps where it was seen first.
        self.all
            .entry(node.clone())
            .or_default()
            .by_seq
            .entry((seq, bytes))
            .or_insert(Origin { source, line });
        let newer = self.by_node.get(&node).is_none_or(|a| seq >= a.seq);
        if newer {
            let source = self.source(Origin { source, line });
            self.by_node.insert(
                node.clone(),
                Anchor {
                    node,
                    seq,
                    hash,
                    source,
                },
            );
        }
        true
    }

    /// Every anchor of `node`.
    pub fn node(&self, node: &str) -> Option<&NodeAnchors> {
        self.all.get(node)
    }

    /// `file:line` (or the source given to [`AnchorSet::add`]) of an anchor.
    pub fn source(&self, o: Origin) -> String {
        let s = self
            .sources
            .get(o.source as usize)
            .map(String::as_str)
            .unwrap_or("?");
        if o.line == 0 {
            s.to_string()
        } else {
            format!("{s}:{}", o.line)
        }
    }

    /// Reads anchors from a file (an anchor file or a syslog file; other lines are skipped).
    pub fn read_file(&mut self, path: &Path) -> std::io::Result<usize> {
        let f = std::fs::File::open(path)?;
        self.sources.push(path.display().to_string());
        let src = (self.sources.len() - 1) as u32;
        let mut n = 0;
        for (i, line) in std::io::BufReader::new(f).split(b'\n').enumerate() {
            let line = line?;
            let line = String::from_utf8_lossy(&line);
            if let Some((node, seq, hash)) = parse_anchor_line(&line) {
                if let Some(k) = &self.key {
                    let body = anchor_line(&node, seq, &hash);
                    if !anchor_mac(&line).is_some_and(|m| k.holds(&body, m)) {
                        self.unauthenticated += 1;
                        if self.first_unauthenticated.is_none() {
                            self.first_unauthenticated =
                                Some(format!("{}:{}", path.display(), i + 1));
                        }
                        continue;
                    }
                }
                self.add_at(node, seq, hash, src, i as u64 + 1);
                n += 1;
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn an_anchor_key_file_is_roots_alone_and_long_enough() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8], mode: u32| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p
        };
        let good = write("good", &[1; 32], 0o600);
        let k = AnchorKey::load(&good).unwrap();
        let body = anchor_line("gpu001", 7, &"c".repeat(64));
        let mac = k.mac(&body);
        assert!(k.holds(&body, &mac));
        assert!(!k.holds(&anchor_line("gpu001", 8, &"c".repeat(64)), &mac));
        assert!(!AnchorKey::from_bytes(&[2; 32]).holds(&body, &mac));
        assert!(!k.holds(&body, "not hex"));
        assert_eq!(
            format!("{k:?}"),
            "AnchorKey(..)",
            "the key is never printed"
        );
        let e = AnchorKey::load(&write("readable", &[1; 32], 0o640)).unwrap_err();
        assert!(e.contains("mode 0640") && e.contains("chmod 600"), "{e}");
        let e = AnchorKey::load(&write("short", b"secret", 0o600)).unwrap_err();
        assert!(
            e.contains("holds 6 bytes") && e.contains("/dev/urandom"),
            "{e}"
        );
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let e = AnchorKey::load(&link).unwrap_err();
        assert!(e.contains("cannot open"), "{e}");
    }

    #[test]
    fn rfc3164_time_is_what_strftime_writes() {
        for (y, mo, d, h, mi, s) in [
            (2026, 1, 1, 0, 0, 0),
            (2026, 11, 30, 0, 34, 47),
            (2027, 2, 9, 9, 5, 7),
            (2028, 12, 31, 23, 59, 59),
        ] {
            let t = Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap();
            assert_eq!(rfc3164_time(&t), t.format("%b %e %H:%M:%S").to_string());
        }
    }
}
