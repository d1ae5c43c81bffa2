//! The audit record and its canonical, hash-chained line form.
//!
//! # Canonical form
//!
//! A record is stored as ONE line of compact JSON (serde_json, field order as declared in
//! [`Record`], `None` optionals and an empty `resources` omitted), terminated by `\n`:
//!
//! ```text
//! {"seq":1,"time":"...",...,"prev":"<64 hex>","hash":"<64 hex>"}\n
//! ```
//!
//! `hash` is always the last member and `prev` the one before it. Let `L` be the line without its
//! trailing `\n`. `L` must end with the 75 bytes `,"hash":"` + 64 lowercase hex digits + `"}`.
//! The canonical bytes are `L` with those 75 bytes replaced by the single byte `}`; i.e. the exact
//! stored bytes of the record with the `,"hash":"…"` member cut out. Then
//! `hash = lowercase_hex(sha256(canonical bytes))` and `prev` is the previous record's `hash`
//! (64 `0`s for seq 1). Verification hashes the stored bytes as they are and never re-serializes,
//! so it does not depend on serde_json's float/escape/key-order choices.

use std::borrow::Cow;
use std::fmt;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

/// `prev` of the first record of a chain.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Byte length of the `,"hash":"<64 hex>"}` suffix of every stored line.
pub const HASH_SUFFIX_LEN: usize = 9 + 64 + 2;

/// Event kind. Known kinds plus any other `[a-z0-9_]+` name for extension.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Event {
    JobStart,
    JobEnd,
    JobDenied,
    Rollback,
    TeardownFailed,
    Reconcile,
    /// The last record of a log file that `tenancyctl audit rotate` set aside: the chain goes
    /// on in the file now at the log's path.
    LogRotated,
    /// The first record of the file that replaced a rotated one: its `prev` is the rotated
    /// file's last record, so the chain runs on across the files.
    LogContinued,
    /// `tenancyctl audit prune` removed rotated files (listed in its resources).
    LogPruned,
    /// `tenancyctl audit keygen` made this node's first signing key.
    KeyGenerated,
    /// `tenancyctl audit keygen --rotate` replaced it: the record names both keys, and its
    /// anchor is signed by the old one.
    KeyRotated,
    /// `tenancyctl audit forward` started, stopped, or could not ship to a collector.
    ForwardStarted,
    ForwardStopped,
    ForwardError,
    /// A state-changing `tenancyctl` command: who ran it (`user`, `uid`), the command line
    /// (`command`) and its outcome.
    AdminAction,
    Other(String),
}

impl Event {
    pub fn as_str(&self) -> &str {
        match self {
            Event::JobStart => "job_start",
            Event::JobEnd => "job_end",
            Event::JobDenied => "job_denied",
            Event::Rollback => "rollback",
            Event::TeardownFailed => "teardown_failed",
            Event::Reconcile => "reconcile",
            Event::LogRotated => "log_rotated",
            Event::LogContinued => "log_continued",
            Event::LogPruned => "log_pruned",
            Event::KeyGenerated => "key_generated",
            Event::KeyRotated => "key_rotated",
            Event::ForwardStarted => "forward_started",
            Event::ForwardStopped => "forward_stopped",
            Event::ForwardError => "forward_error",
            Event::AdminAction => "admin_action",
            Event::Other(s) => s,
        }
    }

    /// Parses an event name; `None` unless it is non-empty `[a-z0-9_]`, at most 64 bytes.
    pub fn parse(s: &str) -> Option<Event> {
        Some(match s {
            "job_start" => Event::JobStart,
            "job_end" => Event::JobEnd,
            "job_denied" => Event::JobDenied,
            "rollback" => Event::Rollback,
            "teardown_failed" => Event::TeardownFailed,
            "reconcile" => Event::Reconcile,
            "log_rotated" => Event::LogRotated,
            "log_continued" => Event::LogContinued,
            "log_pruned" => Event::LogPruned,
            "key_generated" => Event::KeyGenerated,
            "key_rotated" => Event::KeyRotated,
            "forward_started" => Event::ForwardStarted,
            "forward_stopped" => Event::ForwardStopped,
            "forward_error" => Event::ForwardError,
            "admin_action" => Event::AdminAction,
            other => {
                if other.is_empty()
                    || other.len() > 64
                    || !other
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                {
                    return None;
                }
                Event::Other(other.to_string())
            }
        })
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s: Cow<'de, str> = Deserialize::deserialize(d)?;
        Event::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("invalid event name {s:?} (want [a-z0-9_]+)"))
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Success,
    Failure,
    Denied,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceAction {
    Made,
    Removed,
    Failed,
}

/// One isolation resource touched by the job (a MIG instance, a cgroup, a dir, an nft table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resource {
    pub layer: String,
    pub action: ResourceAction,
    pub id: String,
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub detail: serde_json::Map<String, serde_json::Value>,
}

impl Resource {
    pub fn new(layer: impl Into<String>, action: ResourceAction, id: impl Into<String>) -> Self {
        Resource {
            layer: layer.into(),
            action,
            id: id.into(),
            detail: serde_json::Map::new(),
        }
    }

    pub fn detail(mut self, key: impl Into<String>, value: impl Into<serde_json::Value>) -> Self {
        self.detail.insert(key.into(), value.into());
        self
    }
}

/// Serde helpers: UTC RFC 3339 with milliseconds and `Z` on write; any RFC 3339 offset on read.
pub mod ts {
    use super::*;

    pub fn format(t: &DateTime<Utc>) -> String {
        t.to_rfc3339_opts(SecondsFormat::Millis, true)
    }

    pub fn parse(s: &str) -> Result<DateTime<Utc>, chrono::ParseError> {
        DateTime::parse_from_rfc3339(s).map(|t| t.with_timezone(&Utc))
    }

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format(t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let s: Cow<'de, str> = Deserialize::deserialize(d)?;
        parse(&s).map_err(|e| serde::de::Error::custom(format!("bad time {s:?}: {e}")))
    }

    pub mod opt {
        use super::*;
        pub fn serialize<S: Serializer>(
            t: &Option<DateTime<Utc>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => super::serialize(t, s),
                None => s.serialize_none(),
            }
        }
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<DateTime<Utc>>, D::Error> {
            let s: Option<Cow<'de, str>> = Deserialize::deserialize(d)?;
            match s {
                None => Ok(None),
                Some(s) => parse(&s)
                    .map(Some)
                    .map_err(|e| serde::de::Error::custom(format!("bad time {s:?}: {e}"))),
            }
        }
    }
}

/// One audit record (PCI DSS 10.2/10.3: who, what, when, outcome, origin, affected resources).
///
/// Build with [`Record::new`] and the chained setters, then hand it to
/// [`crate::AuditLog::append`], which fills `seq`, `prev` and `hash`. Unknown fields are ignored
/// on read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Per-node sequence number, from 1. Filled by `append`.
    #[serde(default)]
    pub seq: u64,
    #[serde(with = "ts")]
    pub time: DateTime<Utc>,
    pub cluster: String,
    pub node: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<u64>,
    pub user: String,
    pub uid: u32,
    /// The tenant the job runs for, or was refused for, as the prolog verified it (membership
    /// of the user); absent on a refusal that came before that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// On `job_denied`: the tenant the job asked for (`--tenant`), unverified: the user's
    /// claim, never counted for that tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    pub event: Event,
    pub outcome: Outcome,
    /// The program that wrote the record, e.g. `tenancy-prolog`.
    pub origin: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// MIG profile, e.g. `1g.18gb`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_slices: Option<u32>,
    /// GPU UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<Resource>,
    /// On `job_end`: when the job started (for slice-hours).
    #[serde(default, with = "ts::opt", skip_serializing_if = "Option::is_none")]
    pub started: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firewall_drops: Option<u64>,
    /// On `job_start` and `job_end`: how long the prolog or epilog took to reach the record,
    /// in microseconds (`tenancyctl metrics` makes its job path histogram of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_us: Option<u64>,
    /// On `admin_action`: the command line as the admin gave it (`tenancyctl reconcile
    /// --apply`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Hash of the previous record (64 zeros for seq 1). Filled by `append`.
    #[serde(default)]
    pub prev: String,
    /// sha256 over the canonical bytes (see module docs). Filled by `append`; never serialized by
    /// serde (the line writer appends it).
    #[serde(default, skip_serializing)]
    pub hash: String,
}

impl Record {
    /// A record stamped with the current time; fill the rest with the setters.
    pub fn new(
        cluster: impl Into<String>,
        node: impl Into<String>,
        user: impl Into<String>,
        uid: u32,
        event: Event,
        outcome: Outcome,
        origin: impl Into<String>,
    ) -> Self {
        Record {
            seq: 0,
            time: Utc::now(),
            cluster: cluster.into(),
            node: node.into(),
            job_id: None,
            user: user.into(),
            uid,
            tenant: None,
            requested_tenant: None,
            tier: None,
            event,
            outcome,
            origin: origin.into(),
            reason: None,
            profile: None,
            compute_slices: None,
            gpu: None,
            resources: Vec::new(),
            started: None,
            firewall_drops: None,
            duration_us: None,
            command: None,
            prev: String::new(),
            hash: String::new(),
        }
    }

    pub fn time(mut self, t: DateTime<Utc>) -> Self {
        self.time = t;
        self
    }
    pub fn job_id(mut self, id: u64) -> Self {
        self.job_id = Some(id);
        self
    }
    pub fn tenant(mut self, t: impl Into<String>) -> Self {
        self.tenant = Some(t.into());
        self
    }
    pub fn requested_tenant(mut self, t: impl Into<String>) -> Self {
        self.requested_tenant = Some(t.into());
        self
    }
    pub fn tier(mut self, t: impl Into<String>) -> Self {
        self.tier = Some(t.into());
        self
    }
    pub fn reason(mut self, r: impl Into<String>) -> Self {
        self.reason = Some(r.into());
        self
    }
    pub fn profile(mut self, p: impl Into<String>) -> Self {
        self.profile = Some(p.into());
        self
    }
    pub fn compute_slices(mut self, n: u32) -> Self {
        self.compute_slices = Some(n);
        self
    }
    pub fn gpu(mut self, uuid: impl Into<String>) -> Self {
        self.gpu = Some(uuid.into());
        self
    }
    pub fn resource(mut self, r: Resource) -> Self {
        self.resources.push(r);
        self
    }
    pub fn started(mut self, t: DateTime<Utc>) -> Self {
        self.started = Some(t);
        self
    }
    pub fn firewall_drops(mut self, n: u64) -> Self {
        self.firewall_drops = Some(n);
        self
    }
    pub fn command(mut self, c: impl Into<String>) -> Self {
        self.command = Some(c.into());
        self
    }
    pub fn duration(mut self, d: std::time::Duration) -> Self {
        self.duration_us = Some(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        self
    }

    /// Fills `seq`, `prev` and `hash` and returns the complete stored line (with `\n`).
    /// Times are truncated to milliseconds first so the struct equals what a reader parses back.
    pub fn seal(&mut self, seq: u64, prev: &str) -> Result<Vec<u8>, serde_json::Error> {
        use chrono::DurationRound;
        self.seq = seq;
        self.prev.clear();
        self.prev.push_str(prev);
        if let Ok(t) = self.time.duration_trunc(chrono::TimeDelta::milliseconds(1)) {
            self.time = t;
        }
        if let Some(s) = self.started {
            self.started = s.duration_trunc(chrono::TimeDelta::milliseconds(1)).ok();
        }
        let mut line = Vec::with_capacity(512);
        serde_json::to_writer(&mut line, self)?;
        debug_assert_eq!(line.last(), Some(&b'}'));
        let hash = canonical_hash(&line);
        self.hash = hash.clone();
        line.pop();
        line.extend_from_slice(b",\"hash\":\"");
        line.extend_from_slice(hash.as_bytes());
        line.extend_from_slice(b"\"}\n");
        Ok(line)
    }
}

/// Lowercase hex sha256 of canonical bytes.
pub fn canonical_hash(canonical: &[u8]) -> String {
    hex::encode(Sha256::digest(canonical))
}

/// Result of checking one stored line's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineHash<'a> {
    /// The line's stored hash matches its bytes.
    Valid(&'a str),
    /// Well-formed suffix but the stored hash does not match the bytes (edited record).
    Mismatch { stored: &'a str, computed: String },
    /// The line does not end in a `,"hash":"<64 lowercase hex>"}` member.
    NoHashSuffix,
}

/// Checks a stored line (without its `\n`) against its own `hash` member. Does not parse JSON.
pub fn check_line_hash(line: &[u8]) -> LineHash<'_> {
    let n = line.len();
    if n < HASH_SUFFIX_LEN + 2 {
        return LineHash::NoHashSuffix;
    }
    let cut = n - HASH_SUFFIX_LEN;
    let suffix = &line[cut..];
    if &suffix[..9] != b",\"hash\":\"" || &suffix[73..] != b"\"}" {
        return LineHash::NoHashSuffix;
    }
    let hex_part = &suffix[9..73];
    if !hex_part
        .iter()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    {
        return LineHash::NoHashSuffix;
    }
    let stored = std::str::from_utf8(hex_part).expect("ascii hex");
    let mut h = Sha256::new();
    h.update(&line[..cut]);
    h.update(b"}");
    let computed = hex::encode(h.finalize());
    if computed == stored {
        LineHash::Valid(stored)
    } else {
        LineHash::Mismatch { stored, computed }
    }
}
