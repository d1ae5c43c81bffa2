//! `tenancyctl audit verify`: checks each node's hash chain, sequence and anchors.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::expand_paths;
use tenancy_audit_log::anchor::{AnchorKey, AnchorSet, AnchorTrust, NodeAnchors, Origin};
use tenancy_audit_log::record::{check_line_hash, Event, LineHash, Record, GENESIS};
use tenancy_audit_log::sign::PublicKeys;

/// What is wrong with a record (or with the end of a chain).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FindingKind {
    /// Not a record: no valid hash member, not JSON, bad field, torn last line.
    Malformed { what: String },
    /// The stored hash does not match the record's bytes: the record was edited.
    HashMismatch { stored: String, computed: String },
    /// Sequence jumped forward: records `expected..found` are missing (deleted).
    SeqGap { expected: u64, found: u64 },
    /// A record appears out of its place (swapped/moved records), or a gap later filled by it.
    Reordered { expected: u64, found: u64 },
    /// A record repeats an already seen sequence number with other content (an exact copy, as
    /// at-least-once forwarding leaves in a collector's file, is no finding).
    Duplicate { seq: u64 },
    /// `prev` does not equal the previous record's hash (records removed or re-chained).
    PrevMismatch { expected: String, found: String },
    /// A record of another cluster/node inside this node's chain.
    NodeMismatch { expected: String, found: String },
    /// The newest anchor is ahead of the log's last record: the tail was cut off.
    TruncatedTail {
        last_seq: u64,
        anchor_seq: u64,
        anchor: String,
    },
    /// The record at the anchored seq has a different hash: the chain was rewritten.
    AnchorMismatch {
        seq: u64,
        anchor_hash: String,
        log_hash: String,
        anchor: String,
    },
    /// Different hashes anchored for one seq: one anchor is forged, or the log was rewritten
    /// (cut and grown again) between them.
    ConflictingAnchors {
        seq: u64,
        hashes: Vec<String>,
        anchors: Vec<String>,
    },
    /// With `--require-clock-sync`: the node's anchors say its clock was not synchronised.
    ClockUnsynchronised {
        anchors: u64,
        first_seq: u64,
        last_seq: u64,
        max_esterror_us: i64,
    },
    /// A node anchored records but none of its log is among the inputs, which `--all-nodes`
    /// says hold every node's: the log was deleted or lost.
    LogMissing { anchor: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub node: String,
    pub file: PathBuf,
    /// 1-based line number (for a truncated tail: the line after the last one).
    pub line: u64,
    pub seq: Option<u64>,
    #[serde(flatten)]
    pub kind: FindingKind,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: node {}: ",
            self.file.display(),
            self.line,
            self.node
        )?;
        if let Some(s) = self.seq {
            write!(f, "seq {s}: ")?;
        }
        match &self.kind {
            FindingKind::Malformed { what } => write!(f, "malformed record: {what}"),
            FindingKind::HashMismatch { stored, computed } => write!(
                f,
                "record edited: stored hash {stored} but content hashes to {computed}"
            ),
            FindingKind::SeqGap { expected, found } => write!(
                f,
                "sequence gap: expected {expected}, found {found} ({} record(s) deleted)",
                found - expected
            ),
            FindingKind::Reordered { expected, found } => write!(
                f,
                "records reordered: expected seq {expected}, found {found}"
            ),
            FindingKind::Duplicate { seq } => write!(
                f,
                "a second record seq {seq} with other content than the first"
            ),
            FindingKind::PrevMismatch { expected, found } => write!(
                f,
                "chain broken: prev is {found} but the previous record's hash is {expected}"
            ),
            FindingKind::NodeMismatch { expected, found } => {
                write!(f, "record of {found} inside the chain of {expected}")
            }
            FindingKind::TruncatedTail {
                last_seq,
                anchor_seq,
                anchor,
            } => write!(
                f,
                "tail cut off: log ends at seq {last_seq} but anchor {anchor} records seq {anchor_seq}"
            ),
            FindingKind::AnchorMismatch {
                seq,
                anchor_hash,
                log_hash,
                anchor,
            } => write!(
                f,
                "chain rewritten: record seq {seq} hashes to {log_hash} but anchor {anchor} says {anchor_hash}"
            ),
            FindingKind::ConflictingAnchors {
                seq,
                hashes,
                anchors,
            } => {
                write!(f, "conflicting anchors for seq {seq}:")?;
                for (h, a) in hashes.iter().zip(anchors) {
                    write!(f, " {h} ({a})")?;
                }
                write!(f, "; one is forged or the log was rewritten")
            }
            FindingKind::ClockUnsynchronised {
                anchors,
                first_seq,
                last_seq,
                max_esterror_us,
            } => write!(
                f,
                "clock not synchronised: {anchors} anchor(s) from seq {first_seq} to \
                 {last_seq} say so (estimated error up to {} ms): the times of its records \
                 cannot be trusted",
                max_esterror_us / 1000
            ),
            // (The anchor is where the finding is placed: file and line.)
            FindingKind::LogMissing { .. } => write!(
                f,
                "no log of this node among the inputs, though its records are anchored up to \
                 this seq: the log was deleted or lost"
            ),
        }
    }
}

/// Per-node outcome.
#[derive(Debug, Clone, Serialize)]
pub struct NodeResult {
    pub cluster: String,
    pub node: String,
    pub files: Vec<PathBuf>,
    pub records: u64,
    pub last_seq: u64,
    pub head_hash: String,
    pub anchor_seq: Option<u64>,
    pub findings: usize,
    /// The seq the chain begins at among the inputs: 1, or the seq of a `log_continued`
    /// record whose older files were not given (records before it are not checked).
    pub first_seq: u64,
    /// That `log_continued` record's reason (which file it continues).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub continues: Option<String>,
    /// Anchors of seqs before `first_seq`: nothing among the inputs to check them against.
    pub anchors_before_first: usize,
    /// Exact copies of records already read (at-least-once delivery to a collector): skipped.
    pub duplicates: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    pub nodes: Vec<NodeResult>,
    /// All findings in file order per node (capped by `max_findings`).
    pub findings: Vec<Finding>,
    /// Total number of findings, including those beyond the cap.
    pub total_findings: u64,
    /// Nodes that have an anchor but no log among the inputs (informational: the inputs may be
    /// a subset of the cluster; does not by itself make the result unclean, unless
    /// [`VerifyReport::require_every_anchored_node`] turns them into findings).
    pub anchored_nodes_without_log: Vec<String>,
    /// Whether only anchors with a valid MAC were taken (`--anchor-key`).
    pub anchors_authenticated: bool,
    /// Anchor lines left out for want of a valid MAC (someone without the key wrote them:
    /// any local user can write to syslog), and where the first was read.
    pub unauthenticated_anchors: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_unauthenticated_anchor: Option<String>,
    /// Whether signatures were checked with the nodes' public keys (`--public-keys`).
    pub anchors_signed: bool,
    /// Anchors taken by their signature, and by their MAC alone.
    pub signed_anchors: u64,
    pub mac_anchors: u64,
    /// Anchors left out: a signature that does not hold or by an unknown key; a key of
    /// another node than the one the anchor names; a MAC alone after the node signed.
    pub bad_signatures: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bad_signature: Option<String>,
    pub foreign_signatures: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_foreign_signature: Option<String>,
    pub mac_after_signing: u64,
    /// Nodes whose anchors say their clock was not synchronised (PCI DSS 10.6).
    pub unsynchronised: Vec<UnsyncedNode>,
}

/// A node whose anchors say its clock was not synchronised when they were made.
#[derive(Debug, Clone, Serialize)]
pub struct UnsyncedNode {
    pub node: String,
    pub anchors: u64,
    pub synced_anchors: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    /// The largest estimated error those anchors give, in microseconds.
    pub max_esterror_us: i64,
    pub first_anchor: String,
}

impl VerifyReport {
    /// The inputs hold every node's log (`--all-nodes`): a node anchored without one is a
    /// finding, at its newest anchor, not a note (listed while fewer than `max_findings` are).
    pub fn require_every_anchored_node(&mut self, anchors: &AnchorSet, max_findings: usize) {
        for node in std::mem::take(&mut self.anchored_nodes_without_log) {
            let Some(a) = anchors.by_node.get(&node) else {
                continue;
            };
            self.total_findings += 1;
            if self.findings.len() >= max_findings {
                continue;
            }
            // `file:line` of the anchor (a path may hold a colon: split at the last).
            let (file, line) = a
                .source
                .rsplit_once(':')
                .and_then(|(f, l)| Some((f, l.parse::<u64>().ok()?)))
                .unwrap_or((a.source.as_str(), 0));
            self.findings.push(Finding {
                node: node.clone(),
                file: PathBuf::from(file),
                line,
                seq: Some(a.seq),
                kind: FindingKind::LogMissing {
                    anchor: a.source.clone(),
                },
            });
        }
    }

    /// Nodes whose anchors say their clock was not synchronised become findings.
    pub fn require_clock_sync(&mut self, max_findings: usize) {
        for u in &self.unsynchronised {
            self.total_findings += 1;
            if self.findings.len() >= max_findings {
                continue;
            }
            let (file, line) = u
                .first_anchor
                .rsplit_once(':')
                .and_then(|(f, l)| Some((f, l.parse::<u64>().ok()?)))
                .unwrap_or((u.first_anchor.as_str(), 0));
            self.findings.push(Finding {
                node: u.node.clone(),
                file: PathBuf::from(file),
                line,
                seq: Some(u.first_seq),
                kind: FindingKind::ClockUnsynchronised {
                    anchors: u.anchors,
                    first_seq: u.first_seq,
                    last_seq: u.last_seq,
                    max_esterror_us: u.max_esterror_us,
                },
            });
        }
    }

    pub fn is_clean(&self) -> bool {
        self.total_findings == 0
    }
    /// The first finding (in node order, then file order).
    pub fn first(&self) -> Option<&Finding> {
        self.findings.first()
    }
}

struct ChainState<'a> {
    key: String,
    last_seq: u64,
    last_hash: String,
    records: u64,
    /// Where the chain begins among the inputs (see [`NodeResult::first_seq`]).
    first_seq: u64,
    continues: Option<String>,
    /// Every anchor of this node: each is checked against the record with its seq.
    anchors: Option<&'a NodeAnchors>,
    set: &'a AnchorSet,
    /// indices into report.findings of open gaps: (index, expected, found)
    gaps: Vec<(usize, u64, u64)>,
    findings: Vec<Finding>,
    total: u64,
    max: usize,
    /// The first 8 bytes of each record's hash from seq `seen_base` on: a repeated seq is an
    /// exact copy when its hash is the one already read.
    seen: Vec<u64>,
    seen_base: u64,
    duplicates: u64,
}

impl ChainState<'_> {
    fn remember(&mut self, seq: u64, hash: &str) {
        if self.seen.is_empty() {
            self.seen_base = seq;
        }
        let Some(i) = seq.checked_sub(self.seen_base) else {
            return;
        };
        let i = i as usize;
        if self.seen.len() <= i {
            self.seen.resize(i + 1, 0);
        }
        self.seen[i] = hash_prefix(hash);
    }

    /// Whether `hash` is the hash already read for `seq`.
    fn copy_of_seen(&self, seq: u64, hash: &str) -> bool {
        seq.checked_sub(self.seen_base)
            .and_then(|i| self.seen.get(i as usize))
            .is_some_and(|&h| h != 0 && h == hash_prefix(hash))
    }

    fn push(&mut self, f: Finding) {
        self.total += 1;
        if self.findings.len() < self.max {
            self.findings.push(f);
        }
    }

    fn conflict(&self, seq: u64, found: &[(&[u8; 32], Origin)]) -> FindingKind {
        FindingKind::ConflictingAnchors {
            seq,
            hashes: found.iter().map(|(h, _)| hex::encode(h)).collect(),
            anchors: found.iter().map(|(_, o)| self.set.source(*o)).collect(),
        }
    }

    /// Checks every anchor of `seq` against its record's `hash`; `mk` places a finding there.
    fn check_anchors(&mut self, seq: u64, hash: &str, mk: impl Fn(FindingKind) -> Finding) {
        let Some(na) = self.anchors else { return };
        if na.at(seq).next().is_none() {
            return;
        }
        let found: Vec<_> = na.at(seq).collect();
        if found.len() > 1 {
            let f = mk(self.conflict(seq, &found));
            self.push(f);
        }
        let mut log = [0u8; 32];
        let log_ok = hex::decode_to_slice(hash, &mut log).is_ok();
        for (h, o) in found {
            if !log_ok || *h != log {
                let f = mk(FindingKind::AnchorMismatch {
                    seq,
                    anchor_hash: hex::encode(h),
                    log_hash: hash.to_string(),
                    anchor: self.set.source(o),
                });
                self.push(f);
            }
        }
    }
}

fn hash_prefix(hash: &str) -> u64 {
    let mut b = [0u8; 8];
    match hex::decode_to_slice(hash.get(..16).unwrap_or(""), &mut b) {
        Ok(()) => u64::from_be_bytes(b) | 1,
        Err(_) => 0,
    }
}

/// First parseable record of a file: (cluster, node, seq).
fn first_record(path: &Path) -> std::io::Result<Option<(String, String, u64)>> {
    let f = std::fs::File::open(path)?;
    for line in std::io::BufReader::new(f).split(b'\n') {
        let line = line?;
        if let Ok(r) = serde_json::from_slice::<Record>(&line) {
            return Ok(Some((r.cluster, r.node, r.seq)));
        }
    }
    Ok(None)
}

/// Verifies the logs at `paths` (files, or folders whose regular files are logs).
pub fn verify_paths(
    paths: &[PathBuf],
    anchors: &AnchorSet,
    max_findings: usize,
) -> anyhow::Result<VerifyReport> {
    debug_assert!(!anchors.unsettled(), "AnchorSet::settle before verify");
    let files = expand_paths(paths)?;
    // group files by (cluster,node), ordered by first seq
    let mut groups: BTreeMap<(String, String), Vec<(u64, PathBuf)>> = BTreeMap::new();
    let mut report = VerifyReport::default();
    for f in files {
        match first_record(&f).with_context(|| format!("reading audit log {}", f.display()))? {
            Some((c, n, s)) => groups.entry((c, n)).or_default().push((s, f)),
            None => {
                report.total_findings += 1;
                report.findings.push(Finding {
                    node: "?".into(),
                    file: f.clone(),
                    line: 1,
                    seq: None,
                    kind: FindingKind::Malformed {
                        what: "file holds no audit record".into(),
                    },
                });
            }
        }
    }
    let mut seen_nodes = std::collections::HashSet::new();
    for ((cluster, node), mut files) in groups {
        files.sort();
        seen_nodes.insert(node.clone());
        let mut st = ChainState {
            key: format!("{cluster}/{node}"),
            last_seq: 0,
            last_hash: GENESIS.to_string(),
            records: 0,
            first_seq: 1,
            continues: None,
            anchors: anchors.node(&node),
            set: anchors,
            gaps: Vec::new(),
            findings: Vec::new(),
            total: 0,
            max: max_findings.saturating_sub(report.findings.len()),
            seen: Vec::new(),
            seen_base: 0,
            duplicates: 0,
        };
        let mut last_pos = (PathBuf::new(), 0u64);
        for (_, path) in &files {
            let lines = check_file(path, &cluster, &node, &mut st)?;
            last_pos = (path.clone(), lines);
        }
        let newest = st
            .anchors
            .and_then(|na| na.newest().map(|(s, _, o)| (s, o)));
        if let Some((anchor_seq, o)) = newest.filter(|(s, _)| *s > st.last_seq) {
            st.push(Finding {
                node: st.key.clone(),
                file: last_pos.0.clone(),
                line: last_pos.1 + 1,
                seq: Some(st.last_seq + 1),
                kind: FindingKind::TruncatedTail {
                    last_seq: st.last_seq,
                    anchor_seq,
                    anchor: anchors.source(o),
                },
            });
        }
        // Anchors past the end have no record to be checked against, but may still disagree.
        if let Some(na) = st.anchors {
            let past: Vec<_> = na.after(st.last_seq).collect();
            for run in past.chunk_by(|a, b| a.0 == b.0).filter(|r| r.len() > 1) {
                let found: Vec<_> = run.iter().map(|(_, h, o)| (*h, *o)).collect();
                let kind = st.conflict(run[0].0, &found);
                st.push(Finding {
                    node: st.key.clone(),
                    file: last_pos.0.clone(),
                    line: last_pos.1 + 1,
                    seq: Some(run[0].0),
                    kind,
                });
            }
        }
        report.nodes.push(NodeResult {
            cluster,
            node,
            files: files.into_iter().map(|(_, p)| p).collect(),
            records: st.records,
            last_seq: st.last_seq,
            head_hash: st.last_hash.clone(),
            anchor_seq: newest.map(|(s, _)| s),
            findings: st.total as usize,
            first_seq: st.first_seq,
            continues: st.continues.clone(),
            anchors_before_first: st
                .anchors
                .map_or(0, |na| na.len() - na.after(st.first_seq - 1).count()),
            duplicates: st.duplicates,
        });
        report.total_findings += st.total;
        report.findings.extend(st.findings);
    }
    let mut missing: Vec<String> = anchors
        .by_node
        .keys()
        .filter(|n| !seen_nodes.contains(*n))
        .cloned()
        .collect();
    missing.sort();
    report.anchored_nodes_without_log = missing;
    report.anchors_authenticated = anchors.authenticated();
    report.unauthenticated_anchors = anchors.unauthenticated;
    report.first_unauthenticated_anchor = anchors.first_unauthenticated.clone();
    report.anchors_signed = anchors.signatures_checked();
    report.signed_anchors = anchors.signed;
    report.mac_anchors = anchors.maced;
    report.bad_signatures = anchors.bad_signatures;
    report.first_bad_signature = anchors.first_bad_signature.clone();
    report.foreign_signatures = anchors.foreign_signatures;
    report.first_foreign_signature = anchors.first_foreign_signature.clone();
    report.mac_after_signing = anchors.mac_after_signing;
    let mut unsynced: Vec<UnsyncedNode> = anchors
        .clocks
        .iter()
        .filter(|(_, c)| c.unsynced > 0)
        .map(|(n, c)| UnsyncedNode {
            node: n.clone(),
            anchors: c.unsynced,
            synced_anchors: c.synced,
            first_seq: c.first_unsynced_seq.unwrap_or(0),
            last_seq: c.last_unsynced_seq.unwrap_or(0),
            max_esterror_us: c.max_unsynced_esterror_us,
            first_anchor: c.first_unsynced.clone().unwrap_or_default(),
        })
        .collect();
    unsynced.sort_by(|a, b| a.node.cmp(&b.node));
    report.unsynchronised = unsynced;
    Ok(report)
}

/// Checks one file of a node's chain; returns its number of lines.
fn check_file(path: &Path, cluster: &str, node: &str, st: &mut ChainState) -> anyhow::Result<u64> {
    let f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut rd = std::io::BufReader::with_capacity(1 << 16, f);
    let mut buf = Vec::with_capacity(1024);
    let mut lineno = 0u64;
    let key = st.key.clone();
    loop {
        buf.clear();
        let n = rd
            .read_until(b'\n', &mut buf)
            .with_context(|| format!("reading {} after line {lineno}", path.display()))?;
        if n == 0 {
            break;
        }
        lineno += 1;
        let mk = |seq, kind| Finding {
            node: key.clone(),
            file: path.to_path_buf(),
            line: lineno,
            seq,
            kind,
        };
        if buf.last() != Some(&b'\n') {
            let f = mk(
                None,
                FindingKind::Malformed {
                    what: "last line is not terminated (torn write)".into(),
                },
            );
            st.push(f);
            break;
        }
        let line = &buf[..buf.len() - 1];
        let stored_hash = match check_line_hash(line) {
            LineHash::Valid(h) => Ok(h.to_string()),
            LineHash::Mismatch { stored, computed } => Err((stored.to_string(), computed)),
            LineHash::NoHashSuffix => {
                let f = mk(
                    None,
                    FindingKind::Malformed {
                        what: "no `\"hash\":\"<64 hex>\"` member at the end of the line".into(),
                    },
                );
                st.push(f);
                continue;
            }
        };
        let rec: Record = match serde_json::from_slice(line) {
            Ok(r) => r,
            Err(e) => {
                let f = mk(
                    None,
                    FindingKind::Malformed {
                        what: format!("not a valid record: {e}"),
                    },
                );
                st.push(f);
                continue;
            }
        };
        let seq = rec.seq;
        let hash = match stored_hash {
            Ok(h) => h,
            Err((stored, computed)) => {
                let f = mk(
                    Some(seq),
                    FindingKind::HashMismatch {
                        stored: stored.clone(),
                        computed,
                    },
                );
                st.push(f);
                stored
            }
        };
        if rec.cluster != cluster || rec.node != node {
            let f = mk(
                Some(seq),
                FindingKind::NodeMismatch {
                    expected: format!("{cluster}/{node}"),
                    found: format!("{}/{}", rec.cluster, rec.node),
                },
            );
            st.push(f);
            continue;
        }
        // A file that a rotation started, given without the files before it: the chain
        // begins at its `log_continued` record, chained to a record that is not among the inputs.
        if st.last_seq == 0 && st.records == 0 && seq > 1 && rec.event == Event::LogContinued {
            st.first_seq = seq;
            st.continues = rec.reason.clone();
            st.last_seq = seq - 1;
            st.last_hash = rec.prev.clone();
        }
        let expected = st.last_seq + 1;
        if seq == expected {
            if rec.prev != st.last_hash {
                let f = mk(
                    Some(seq),
                    FindingKind::PrevMismatch {
                        expected: st.last_hash.clone(),
                        found: rec.prev.clone(),
                    },
                );
                st.push(f);
            }
        } else if seq > expected {
            let f = mk(
                Some(seq),
                FindingKind::SeqGap {
                    expected,
                    found: seq,
                },
            );
            if st.findings.len() < st.max {
                st.gaps.push((st.findings.len(), expected, seq));
            }
            st.push(f);
        } else {
            // seq < expected: a moved record fills an earlier gap, or a duplicate
            let gap = st
                .gaps
                .iter()
                .find(|(_, lo, hi)| (*lo..*hi).contains(&seq))
                .map(|g| g.0);
            if gap.is_none() && st.copy_of_seen(seq, &hash) {
                st.duplicates += 1;
                continue;
            }
            if let Some(i) = gap {
                if let FindingKind::SeqGap { expected, found } = st.findings[i].kind {
                    st.findings[i].kind = FindingKind::Reordered { expected, found };
                }
                let f = mk(
                    Some(seq),
                    FindingKind::Reordered {
                        expected,
                        found: seq,
                    },
                );
                st.push(f);
            } else {
                let f = mk(Some(seq), FindingKind::Duplicate { seq });
                st.push(f);
            }
            continue;
        }
        st.check_anchors(seq, &hash, |k| mk(Some(seq), k));
        st.remember(seq, &hash);
        st.last_seq = seq;
        st.last_hash = hash;
        st.records += 1;
    }
    Ok(lineno)
}

/// The anchors of `files`, authenticated by the HMAC key and the public keys given (neither:
/// every anchor line is taken), settled.
pub fn read_anchors(
    files: &[PathBuf],
    anchor_key: Option<&Path>,
    public_keys: Option<&Path>,
) -> anyhow::Result<AnchorSet> {
    let mac = anchor_key
        .map(|k| AnchorKey::load(k).map_err(anyhow::Error::msg))
        .transpose()?;
    let public_keys = public_keys
        .map(|p| PublicKeys::load(p).map_err(anyhow::Error::msg))
        .transpose()?;
    let mut anchors = if mac.is_none() && public_keys.is_none() {
        AnchorSet::default()
    } else {
        AnchorSet::with_trust(AnchorTrust { mac, public_keys })
    };
    for a in files {
        anchors
            .read_file(a)
            .with_context(|| format!("reading anchor file {}", a.display()))?;
    }
    anchors.settle();
    Ok(anchors)
}
