//! `tenancyctl audit prune`: removes rotated audit files that are older than the retention and
//! that every collector has confirmed, and says of every file what it kept and why. The log
//! at `cluster.audit_log` is never removed, nor is anything by `audit rotate`.
//!
//! A file's age is the time of its last record (a rotated file's `log_rotated`), not its
//! mtime; its retention is `[audit] retain_days`, or the longest `audit_retain_days` of the
//! tiers its records name. "Forwarded" is the cursor of each `[audit] collectors` entry past
//! the file's last seq; without collectors nothing counts as forwarded, unless
//! `--unforwarded-ok` says the site collects the files another way.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::process::ExitCode;

use anyhow::Context;
use chrono::Utc;
use serde::Serialize;
use tenancy_audit_log::{Event, Outcome, Resource, ResourceAction};
use tenancy_config::Config;

use crate::output::Format;

#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Say what would be removed, remove nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Without [audit] collectors: prune by age alone (the site copies the files off the node
    /// itself)
    #[arg(long)]
    pub unforwarded_ok: bool,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Serialize)]
struct Row {
    file: String,
    first_seq: u64,
    last_seq: u64,
    last_record: String,
    retain_days: u32,
    action: &'static str,
    why: String,
}

/// The tiers a file's records name.
fn tiers_in(path: &std::path::Path) -> std::io::Result<BTreeSet<String>> {
    let f = std::fs::File::open(path)?;
    let mut tiers = BTreeSet::new();
    for line in std::io::BufReader::new(f).split(b'\n') {
        if let Some(t) = crate::chain::parse_head(&line?).and_then(|h| h.tier) {
            tiers.insert(t);
        }
    }
    Ok(tiers)
}

pub fn run(config: &Config, args: &PruneArgs) -> anyhow::Result<ExitCode> {
    let log = &config.cluster.audit_log;
    let files = crate::chain::log_files(log)
        .with_context(|| format!("listing the files of {}", log.display()))?;
    let forwarded = Forwarded::read(config);
    let now = Utc::now();
    let mut rows = Vec::new();
    let mut removed = Vec::new();
    for f in &files {
        let row = judge(config, args, f, &forwarded, now);
        if row.action == "remove" {
            std::fs::remove_file(&f.path)
                .with_context(|| format!("removing {}", f.path.display()))?;
            removed.push(f.clone());
        }
        rows.push(row);
    }
    if !removed.is_empty() {
        record_removed(config, &removed)?;
    }
    print(&rows, args.format)?;
    Ok(ExitCode::SUCCESS)
}

/// What the collectors confirmed: the seq every one of them is past (None: no collector),
/// and why that is less than it could be.
struct Forwarded {
    seq: Option<u64>,
    note: String,
}

impl Forwarded {
    fn read(config: &Config) -> Forwarded {
        if config.audit.collectors.is_empty() {
            return Forwarded {
                seq: None,
                note: "no [audit] collectors: nothing is forwarded".into(),
            };
        }
        let mut note = String::new();
        let mut min = u64::MAX;
        for c in &config.audit.collectors {
            let p = crate::forward::cursor_path(config, c);
            match crate::forward::read_cursor(&p) {
                Ok(Some(cur)) => min = min.min(cur.record.seq),
                Ok(None) => {
                    min = 0;
                    note = format!("collector {c} has confirmed nothing yet");
                }
                Err(e) => {
                    min = 0;
                    note = e;
                }
            }
        }
        Forwarded {
            seq: Some(min),
            note,
        }
    }

    /// Whether the collectors lack some of a file that ends at `last_seq`.
    fn short_of(&self, last_seq: u64) -> bool {
        self.seq.is_none_or(|s| s < last_seq)
    }
}

/// A file's retention: the longest of `[audit] retain_days` and its tiers'
/// `audit_retain_days`, and the tier that sets it when one does.
fn retention(config: &Config, tiers: &BTreeSet<String>) -> (u32, Option<String>) {
    let days = tiers
        .iter()
        .map(|t| config.audit_retain_days(Some(t)))
        .chain([config.audit_retain_days(None)])
        .max()
        .unwrap_or(config.audit.retain_days);
    let longest_tier = tiers
        .iter()
        .find(|t| config.audit_retain_days(Some(t)) == days && days > config.audit.retain_days)
        .cloned();
    (days, longest_tier)
}

/// What becomes of one file, and why.
fn judge(
    config: &Config,
    args: &PruneArgs,
    f: &crate::chain::LogFile,
    forwarded: &Forwarded,
    now: chrono::DateTime<Utc>,
) -> Row {
    let tiers = tiers_in(&f.path).unwrap_or_default();
    let (days, longest_tier) = retention(config, &tiers);
    let age_days = f.last_time.map(|t| (now - t).num_days());
    let mut row = Row {
        file: f.path.display().to_string(),
        first_seq: f.first_seq,
        last_seq: f.last_seq,
        last_record: f
            .last_time
            .map(|t| tenancy_audit_log::record::ts::format(&t))
            .unwrap_or_else(|| "?".into()),
        retain_days: days,
        action: "keep",
        why: String::new(),
    };
    row.why = if f.path == config.cluster.audit_log {
        "the log itself (never pruned)".into()
    } else if !f.rotated {
        "does not end with log_rotated: not a file audit rotate set aside".into()
    } else if age_days.is_none_or(|a| a < i64::from(days)) {
        format!(
            "young: last record {} day(s) ago, kept {days} day(s){}",
            age_days.map_or("?".to_string(), |a| a.to_string()),
            longest_tier
                .map(|t| format!(" (tier {t} requires {days})"))
                .unwrap_or_default()
        )
    } else if !args.unforwarded_ok && forwarded.short_of(f.last_seq) {
        format!(
            "not forwarded: its last seq {} is past what every collector confirmed ({}){}",
            f.last_seq,
            forwarded
                .seq
                .map_or("none".to_string(), |s| format!("seq {s}")),
            if forwarded.note.is_empty() {
                String::new()
            } else {
                format!("; {}", forwarded.note)
            }
        )
    } else {
        row.action = if args.dry_run {
            "would remove"
        } else {
            "remove"
        };
        format!(
            "{} day(s) old, past {days}; {}",
            age_days.unwrap_or(0),
            if args.unforwarded_ok && forwarded.short_of(f.last_seq) {
                "--unforwarded-ok".to_string()
            } else {
                format!("forwarded (every collector past seq {})", f.last_seq)
            }
        )
    };
    row
}

/// The log_pruned record of the files removed, once their removal is on disk.
fn record_removed(config: &Config, removed: &[crate::chain::LogFile]) -> anyhow::Result<()> {
    if let Some(dir) = config.cluster.audit_log.parent() {
        let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
    }
    let mut rec = crate::admin::record(config, Event::LogPruned, Outcome::Success).reason(format!(
        "removed {} rotated file(s), seq {} to {}",
        removed.len(),
        removed.iter().map(|f| f.first_seq).min().unwrap_or(0),
        removed.iter().map(|f| f.last_seq).max().unwrap_or(0)
    ));
    for f in removed {
        rec = rec.resource(
            Resource::new(
                "audit",
                ResourceAction::Removed,
                f.path.display().to_string(),
            )
            .detail("first_seq", f.first_seq)
            .detail("last_seq", f.last_seq),
        );
    }
    tenancy_job::audit::append_anchored(config, &mut rec)
        .map_err(|e| anyhow::anyhow!("the files are removed but their record is not: {e}"))?;
    Ok(())
}

fn print(rows: &[Row], format: crate::output::Format) -> anyhow::Result<()> {
    crate::output::Rows {
        headers: &[
            "file",
            "first_seq",
            "last_seq",
            "last_record",
            "retain_days",
            "action",
            "why",
        ],
        rows,
        cells: |r| {
            vec![
                r.file.clone(),
                r.first_seq.to_string(),
                r.last_seq.to_string(),
                r.last_record.clone(),
                r.retain_days.to_string(),
                r.action.to_string(),
                r.why.clone(),
            ]
        },
    }
    .print(format)
}
