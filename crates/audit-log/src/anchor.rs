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

use crate::clock::ClockSync;
use crate::sign::{NodeKey, PublicKeys, SigCheck};

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
        let key = crate::sign::read_root_only(path, "anchor key", 0, 4096)?;
        if key.len() < ANCHOR_KEY_MIN_BYTES {
            return Err(format!(
                "anchor key {}: holds {} bytes; make one of 32 random bytes: head -c 32 \
                 /dev/urandom > {}",
                path.display(),
                key.len(),
                path.display()
            ));
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

/// How an anchor is authenticated: the cluster's HMAC key (`mac=`), this node's Ed25519 key
/// (`key=` and `sig=`), both or neither.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnchorAuth<'a> {
    pub mac: Option<&'a AnchorKey>,
    pub node_key: Option<&'a NodeKey>,
}

/// The words of an anchor that its signature covers, in this order:
/// `node=N seq=S hash=H time=T clock=synced|unsynced|unknown esterror_us=E key=K`.
pub fn signed_text(
    node: &str,
    seq: u64,
    hash: &str,
    time: &str,
    clock: &str,
    esterror_us: i64,
    key: &str,
) -> String {
    format!(
        "{} time={time} clock={clock} esterror_us={esterror_us} key={key}",
        anchor_line(node, seq, hash)
    )
}

/// The anchor's text as it goes to syslog and the anchor file: the chain head, when it was
/// made and the clock's synchronisation state then, and the signature and MAC the node's keys
/// give it. The MAC covers [`anchor_line`] alone (as anchors of earlier releases), the
/// signature [`signed_text`].
pub fn anchor_text(
    node: &str,
    seq: u64,
    hash: &str,
    time: &DateTime<Utc>,
    clock: Option<ClockSync>,
    auth: &AnchorAuth,
) -> String {
    let (word, est) = match clock {
        Some(c) => (c.token(), c.esterror_us),
        None => ("unknown", -1),
    };
    let time = crate::record::ts::format(time);
    let mut body = match auth.node_key {
        Some(k) => {
            let text = signed_text(node, seq, hash, &time, word, est, k.id());
            let sig = k.sign(&text);
            format!("{text} sig={sig}")
        }
        None => format!(
            "{} time={time} clock={word} esterror_us={est}",
            anchor_line(node, seq, hash)
        ),
    };
    if let Some(k) = auth.mac {
        body.push_str(" mac=");
        body.push_str(&k.mac(&anchor_line(node, seq, hash)));
    }
    body
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
    let auth = AnchorAuth {
        mac: key,
        node_key: None,
    };
    send_anchor_auth(socket, node, seq, hash, anchor_file, &auth)
}

/// Sends an anchor authenticated as `auth` says, with the clock's state now (adjtimex), to the
/// syslog socket `socket` and the anchor file. Never fails: look at the returned status.
pub fn send_anchor_auth(
    socket: &Path,
    node: &str,
    seq: u64,
    hash: &str,
    anchor_file: Option<&Path>,
    auth: &AnchorAuth,
) -> AnchorStatus {
    if node.is_empty() || node.chars().any(|c| c.is_whitespace() || c == '=') {
        let why = format!("node name {node:?} contains whitespace or '=' and cannot be anchored");
        return AnchorStatus {
            syslog: SyslogStatus::Rejected(why.clone()),
            file: anchor_file.map(|_| Err(why)),
        };
    }
    let now = Utc::now();
    let body = anchor_text(node, seq, hash, &now, crate::clock::clock_sync(), auth);
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

/// What the accepted anchors of one node say of its clock (anchors carry adjtimex's state).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NodeClock {
    pub synced: u64,
    pub unsynced: u64,
    /// Anchors without a clock state (written by a release before it, or adjtimex refused).
    pub unknown: u64,
    /// The seqs of the first and last anchor that says the clock was not synchronised.
    pub first_unsynced_seq: Option<u64>,
    pub last_unsynced_seq: Option<u64>,
    /// The largest estimated error an unsynchronised anchor gives, in microseconds.
    pub max_unsynced_esterror_us: i64,
    /// Where the first unsynchronised anchor was read.
    pub first_unsynced: Option<String>,
}

/// Who authenticates anchors for verify: the cluster's HMAC key, the nodes' public keys, both
/// or neither (then every anchor line is taken).
#[derive(Debug, Default)]
pub struct AnchorTrust {
    pub mac: Option<AnchorKey>,
    pub public_keys: Option<PublicKeys>,
}

/// An anchor line taken apart (see [`anchor_text`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedAnchor<'a> {
    pub node: String,
    pub seq: u64,
    pub hash: String,
    pub time: Option<&'a str>,
    pub clock: Option<&'a str>,
    pub esterror_us: Option<i64>,
    pub key: Option<&'a str>,
    pub sig: Option<&'a str>,
    pub mac: Option<&'a str>,
}

impl<'a> ParsedAnchor<'a> {
    /// Parses one line (an anchor file's, a syslog file's or a collector's); `None` unless
    /// `node=`, `seq=` and `hash=` are all there and valid.
    pub fn parse(line: &'a str) -> Option<ParsedAnchor<'a>> {
        let (node, seq, hash) = parse_anchor_line(line)?;
        let (mut time, mut clock, mut est, mut key, mut sig, mut mac) =
            (None, None, None, None, None, None);
        for tok in line.split_whitespace() {
            if let Some((k, v)) = tok.split_once('=') {
                match k {
                    "time" => time = Some(v),
                    "clock" => clock = Some(v),
                    "esterror_us" => est = v.parse::<i64>().ok(),
                    "key" => key = Some(v),
                    "sig" => sig = Some(v),
                    "mac" => mac = Some(v),
                    _ => {}
                }
            }
        }
        Some(ParsedAnchor {
            node,
            seq,
            hash,
            time,
            clock,
            esterror_us: est,
            key,
            sig,
            mac,
        })
    }

    /// What the signature covers, rebuilt from the words read; `None` if one is missing.
    pub fn signed_text(&self) -> Option<String> {
        Some(signed_text(
            &self.node,
            self.seq,
            &self.hash,
            self.time?,
            self.clock?,
            self.esterror_us?,
            self.key?,
        ))
    }
}

/// An anchor whose MAC holds, taken only if its node signed no anchor at or before its seq.
#[derive(Debug, Clone)]
struct PendingMac {
    node: String,
    seq: u64,
    hash: String,
    origin: Origin,
    clock: Option<(String, Option<i64>)>,
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
    /// With public keys, anchors signed by their node's key are taken.
    public_keys: Option<std::sync::Arc<PublicKeys>>,
    /// Anchor lines left out for want of a valid MAC or signature, and where the first was read.
    pub unauthenticated: u64,
    pub first_unauthenticated: Option<String>,
    /// Anchors whose signature does not hold, or by a key in no line of the public keys file.
    pub bad_signatures: u64,
    pub first_bad_signature: Option<String>,
    /// Anchors signed by another node's key than the node they name (that node's root forging
    /// this one's anchors), and where the first was read, with the signer.
    pub foreign_signatures: u64,
    pub first_foreign_signature: Option<String>,
    /// HMAC-only anchors of a node at or after its first signed one: the HMAC key is the same
    /// on every node, so once a node signs its anchors, an anchor with the MAC alone is no
    /// longer evidence of it.
    pub mac_after_signing: u64,
    /// Anchors taken by their signature, and by their MAC alone.
    pub signed: u64,
    pub maced: u64,
    /// The clock state the taken anchors record, per node.
    pub clocks: HashMap<String, NodeClock>,
    first_signed: HashMap<String, u64>,
    pending: Vec<PendingMac>,
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

/// What [`AnchorSet`] does with one anchor line.
enum Verdict {
    Take {
        signed: bool,
    },
    /// MAC holds; public keys are in use too: taken if the node had not signed by then.
    Pending,
    Unauthenticated,
    BadSignature,
    Foreign(String),
}

impl AnchorSet {
    /// A set that takes only anchors carrying a valid MAC of `key`.
    pub fn with_key(key: AnchorKey) -> AnchorSet {
        AnchorSet::with_trust(AnchorTrust {
            mac: Some(key),
            public_keys: None,
        })
    }

    /// A set that takes only anchors that `trust` authenticates: signed by a key listed for
    /// their node, or (for logs written before the nodes signed) with a valid MAC. Call
    /// [`AnchorSet::settle`] after the last file is read.
    pub fn with_trust(trust: AnchorTrust) -> AnchorSet {
        AnchorSet {
            key: trust.mac.map(std::sync::Arc::new),
            public_keys: trust.public_keys.map(std::sync::Arc::new),
            ..AnchorSet::default()
        }
    }

    /// Whether anchors are authenticated (a key or public keys).
    pub fn authenticated(&self) -> bool {
        self.key.is_some() || self.public_keys.is_some()
    }

    /// Whether signatures are checked (public keys given).
    pub fn signatures_checked(&self) -> bool {
        self.public_keys.is_some()
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

    fn judge(&self, p: &ParsedAnchor) -> Verdict {
        if !self.authenticated() {
            return Verdict::Take { signed: false };
        }
        if let (Some(keys), Some(sig), Some(key)) = (&self.public_keys, p.sig, p.key) {
            match p.signed_text().map(|t| keys.check(&p.node, key, &t, sig)) {
                Some(SigCheck::Valid) => return Verdict::Take { signed: true },
                Some(SigCheck::OtherNodesKey(owner)) => return Verdict::Foreign(owner),
                // Not the node's key (unknown), or edited: the MAC may still vouch for it.
                _ if self.key.is_none() => return Verdict::BadSignature,
                _ => {}
            }
        }
        match (&self.key, p.mac) {
            (Some(k), Some(m)) if k.holds(&anchor_line(&p.node, p.seq, &p.hash), m) => {
                if self.public_keys.is_some() {
                    Verdict::Pending
                } else {
                    Verdict::Take { signed: false }
                }
            }
            _ if p.sig.is_some() && self.public_keys.is_some() => Verdict::BadSignature,
            _ => Verdict::Unauthenticated,
        }
    }

    fn note_clock(&mut self, node: &str, seq: u64, clock: Option<(&str, Option<i64>)>, at: &str) {
        let c = self.clocks.entry(node.to_string()).or_default();
        match clock {
            Some(("synced", _)) => c.synced += 1,
            Some(("unsynced", est)) => {
                c.unsynced += 1;
                c.first_unsynced_seq = Some(c.first_unsynced_seq.map_or(seq, |s| s.min(seq)));
                c.last_unsynced_seq = Some(c.last_unsynced_seq.map_or(seq, |s| s.max(seq)));
                c.max_unsynced_esterror_us = c.max_unsynced_esterror_us.max(est.unwrap_or(-1));
                if c.first_unsynced.is_none() {
                    c.first_unsynced = Some(at.to_string());
                }
            }
            _ => c.unknown += 1,
        }
    }

    /// Reads anchors from a file (an anchor file, a syslog file or a collector's file; other
    /// lines are skipped).
    pub fn read_file(&mut self, path: &Path) -> std::io::Result<usize> {
        let f = std::fs::File::open(path)?;
        self.sources.push(path.display().to_string());
        let src = (self.sources.len() - 1) as u32;
        let mut n = 0;
        for (i, line) in std::io::BufReader::new(f).split(b'\n').enumerate() {
            let line = line?;
            let line = String::from_utf8_lossy(&line);
            let Some(p) = ParsedAnchor::parse(&line) else {
                continue;
            };
            let at = || format!("{}:{}", path.display(), i + 1);
            let origin = Origin {
                source: src,
                line: i as u64 + 1,
            };
            match self.judge(&p) {
                Verdict::Take { signed } => {
                    if signed {
                        self.signed += 1;
                        let first = self.first_signed.entry(p.node.clone()).or_insert(p.seq);
                        *first = (*first).min(p.seq);
                    } else if self.key.is_some() {
                        self.maced += 1;
                    }
                    self.note_clock(&p.node, p.seq, p.clock.map(|c| (c, p.esterror_us)), &at());
                    self.add_at(p.node, p.seq, p.hash, src, origin.line);
                    n += 1;
                }
                Verdict::Pending => self.pending.push(PendingMac {
                    clock: p.clock.map(|c| (c.to_string(), p.esterror_us)),
                    node: p.node,
                    seq: p.seq,
                    hash: p.hash,
                    origin,
                }),
                Verdict::Unauthenticated => {
                    self.unauthenticated += 1;
                    self.first_unauthenticated.get_or_insert_with(at);
                }
                Verdict::BadSignature => {
                    self.bad_signatures += 1;
                    self.first_bad_signature.get_or_insert_with(at);
                }
                Verdict::Foreign(owner) => {
                    self.foreign_signatures += 1;
                    self.first_foreign_signature.get_or_insert_with(|| {
                        format!("{}: node {}'s key signed for node {}", at(), owner, p.node)
                    });
                }
            }
        }
        Ok(n)
    }

    /// Takes the anchors that only their MAC vouches for, of a node that had not yet signed
    /// an anchor at their seq; the others are counted in [`AnchorSet::mac_after_signing`].
    /// Call once the last file is read (verify does).
    pub fn settle(&mut self) {
        for p in std::mem::take(&mut self.pending) {
            if self.first_signed.get(&p.node).is_some_and(|&s| p.seq >= s) {
                self.mac_after_signing += 1;
                continue;
            }
            self.maced += 1;
            let at = self.source(p.origin);
            self.note_clock(
                &p.node,
                p.seq,
                p.clock.as_ref().map(|(c, e)| (c.as_str(), *e)),
                &at,
            );
            self.add_at(p.node, p.seq, p.hash, p.origin.source, p.origin.line);
        }
    }

    /// Whether anchors wait for [`AnchorSet::settle`].
    pub fn unsettled(&self) -> bool {
        !self.pending.is_empty()
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
