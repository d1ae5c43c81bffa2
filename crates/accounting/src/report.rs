//! `tenancyctl report`: usage and incident figures from audit logs, streamed with bounded memory.
//!
//! Figures per group:
//! * `jobs`: successful `job_start` records;
//! * `job_ends`: `job_end` records, except the epilog's "no journal" ones that end no started
//!   job (a denied job, or a second epilog run): those are counted apart;
//! * `slice_hours`: MIG-slice wall hours, from `job_end.started` (or the matching `job_start`)
//!   to `job_end.time`, clipped to `--since/--until` and split across days/months when grouped
//!   by `day`/`month`; a `teardown_failed` ends its job's slice time the same way (the job held
//!   its slices until then, at least);
//! * `compute_slice_hours`: `slice_hours` × `compute_slices` of the job;
//! * `denied` (`job_denied`), `rollbacks`, `teardown_failures`, `firewall_drops` (sum of
//!   `firewall_drops`).
//!
//! Count events are attributed to the group and day of their own `time`.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;
use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::{expand_paths, Render};
use tenancy_audit_log::record::ts;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupBy {
    Tenant,
    Tier,
    Profile,
    User,
    Node,
    Day,
    Month,
}

impl GroupBy {
    /// Every grouping, in the order `--by` lists them.
    pub const ALL: [GroupBy; 7] = [
        GroupBy::Tenant,
        GroupBy::Tier,
        GroupBy::Profile,
        GroupBy::User,
        GroupBy::Node,
        GroupBy::Day,
        GroupBy::Month,
    ];

    /// The grouping named `name` (`tenant`, `tier`, ...), as [`GroupBy::name`] writes it.
    pub fn from_name(name: &str) -> Option<GroupBy> {
        GroupBy::ALL.into_iter().find(|g| g.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            GroupBy::Tenant => "tenant",
            GroupBy::Tier => "tier",
            GroupBy::Profile => "profile",
            GroupBy::User => "user",
            GroupBy::Node => "node",
            GroupBy::Day => "day",
            GroupBy::Month => "month",
        }
    }
}

/// Integer accumulators (times in milliseconds, so sums are exact).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Figures {
    pub jobs: u64,
    pub job_ends: u64,
    pub slice_ms: u64,
    pub compute_slice_ms: u64,
    pub denied: u64,
    pub rollbacks: u64,
    pub teardown_failures: u64,
    pub firewall_drops: u64,
}

impl Figures {
    pub fn add(&mut self, o: &Figures) {
        self.jobs += o.jobs;
        self.job_ends += o.job_ends;
        self.slice_ms += o.slice_ms;
        self.compute_slice_ms += o.compute_slice_ms;
        self.denied += o.denied;
        self.rollbacks += o.rollbacks;
        self.teardown_failures += o.teardown_failures;
        self.firewall_drops += o.firewall_drops;
    }
    pub fn slice_hours(&self) -> f64 {
        self.slice_ms as f64 / 3_600_000.0
    }
    pub fn compute_slice_hours(&self) -> f64 {
        self.compute_slice_ms as f64 / 3_600_000.0
    }
}

/// What to aggregate.
#[derive(Debug, Clone, Default)]
pub struct Query {
    /// Inclusive start.
    pub since: Option<DateTime<Utc>>,
    /// Exclusive end.
    pub until: Option<DateTime<Utc>>,
    pub tenants: Vec<String>,
    pub users: Vec<String>,
    pub nodes: Vec<String>,
    pub by: Vec<GroupBy>,
}

/// Aggregation result: group key (one value per `by` entry) -> figures.
#[derive(Debug, Clone, Default)]
pub struct Aggregate {
    pub by: Vec<GroupBy>,
    pub groups: BTreeMap<Vec<String>, Figures>,
    pub total: Figures,
    pub records: u64,
    pub malformed: u64,
    /// job_end records whose start could not be found (no `started`, no `job_start` seen).
    pub unmatched_ends: u64,
    /// Successful job_start records (passing the filters, before `until`) that no job_end or
    /// teardown_failed closed: jobs still running, or whose end was not recorded. Their slice
    /// time is not counted.
    pub open_starts: u64,
    /// "no journal" job_end records that closed no started job (the epilog of a denied or
    /// rolled-back job, or a second epilog run); not counted as job ends.
    pub no_journal_ends: u64,
}

/// The tenant group of refusals whose tenant was never verified.
pub const UNVERIFIED: &str = "(unverified)";

/// The fields the report needs; everything else in a line is skipped.
#[derive(Deserialize)]
struct Row<'a> {
    #[serde(borrow)]
    time: Cow<'a, str>,
    #[serde(borrow)]
    cluster: Cow<'a, str>,
    #[serde(borrow)]
    node: Cow<'a, str>,
    #[serde(default)]
    job_id: Option<u64>,
    #[serde(borrow)]
    user: Cow<'a, str>,
    #[serde(default, borrow)]
    tenant: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tier: Option<Cow<'a, str>>,
    #[serde(borrow)]
    event: Cow<'a, str>,
    #[serde(borrow)]
    outcome: Cow<'a, str>,
    #[serde(default, borrow)]
    profile: Option<Cow<'a, str>>,
    #[serde(default)]
    compute_slices: Option<u32>,
    #[serde(default, borrow)]
    started: Option<Cow<'a, str>>,
    #[serde(default)]
    firewall_drops: Option<u64>,
    #[serde(default, borrow)]
    reason: Option<Cow<'a, str>>,
}

struct Pending {
    start: DateTime<Utc>,
    profile: Option<String>,
    slices: Option<u32>,
    /// Passed the tenant/user/node filters: an open start is only worth a warning then.
    selected: bool,
}

/// Streaming aggregator: feed lines, then [`Aggregator::finish`].
pub struct Aggregator {
    q: Query,
    /// Keyed by one value per `by` entry, kept apart: any separator could be in a value.
    groups: HashMap<Vec<String>, Figures>,
    pending: HashMap<(String, String, u64), Pending>,
    /// The key being built, its strings reused from record to record.
    key: Vec<String>,
    out: Aggregate,
}

impl Aggregator {
    pub fn new(q: Query) -> Self {
        Aggregator {
            out: Aggregate {
                by: q.by.clone(),
                ..Default::default()
            },
            q,
            groups: HashMap::new(),
            pending: HashMap::new(),
            key: Vec::new(),
        }
    }

    fn in_window(&self, t: DateTime<Utc>) -> bool {
        self.q.since.is_none_or(|s| t >= s) && self.q.until.is_none_or(|u| t < u)
    }

    fn build_key(&mut self, r: &Row, profile: Option<&str>, t: DateTime<Utc>) {
        use std::fmt::Write as _;
        self.key.resize_with(self.q.by.len(), String::new);
        for (k, g) in self.key.iter_mut().zip(&self.q.by) {
            k.clear();
            match g {
                // A refusal before the tenant was verified belongs to no tenant: its
                // `requested_tenant` is the user's claim.
                GroupBy::Tenant => k.push_str(match r.tenant.as_deref() {
                    Some(t) => t,
                    None if r.event == "job_denied" => UNVERIFIED,
                    None => "-",
                }),
                GroupBy::Tier => k.push_str(r.tier.as_deref().unwrap_or("-")),
                GroupBy::Profile => k.push_str(profile.unwrap_or("-")),
                GroupBy::User => k.push_str(&r.user),
                GroupBy::Node => k.push_str(&r.node),
                GroupBy::Day => {
                    let _ = write!(k, "{:04}-{:02}-{:02}", t.year(), t.month(), t.day());
                }
                GroupBy::Month => {
                    let _ = write!(k, "{:04}-{:02}", t.year(), t.month());
                }
            }
        }
    }

    fn figures_mut(&mut self) -> &mut Figures {
        if !self.groups.contains_key(self.key.as_slice()) {
            self.groups.insert(self.key.clone(), Figures::default());
        }
        self.groups.get_mut(self.key.as_slice()).expect("inserted")
    }

    /// Feeds one stored line (without `\n`). Malformed lines are counted and skipped.
    pub fn feed(&mut self, line: &[u8]) {
        let r: Row = match serde_json::from_slice(line) {
            Ok(r) => r,
            Err(_) => {
                self.out.malformed += 1;
                return;
            }
        };
        let Ok(t) = ts::parse(&r.time) else {
            self.out.malformed += 1;
            return;
        };
        self.out.records += 1;
        let pass = |list: &[String], v: Option<&str>| {
            list.is_empty() || v.is_some_and(|v| list.iter().any(|x| x == v))
        };
        let event = r.event.as_ref();
        let selected = pass(&self.q.tenants, r.tenant.as_deref())
            && pass(&self.q.users, Some(&r.user))
            && pass(&self.q.nodes, Some(&r.node));
        // Pair bookkeeping happens before filtering so that a start before --since still counts.
        let mut pend = None;
        // A failed teardown ends the job too: it no longer runs, and its slices must be billed.
        let closes = event == "job_end" || event == "teardown_failed";
        match event {
            "job_start" if r.outcome == "success" => {
                if let Some(id) = r.job_id {
                    self.pending.insert(
                        (r.cluster.to_string(), r.node.to_string(), id),
                        Pending {
                            start: t,
                            profile: r.profile.as_deref().map(str::to_string),
                            slices: r.compute_slices,
                            selected,
                        },
                    );
                }
            }
            _ if closes => {
                if let Some(id) = r.job_id {
                    // lookup by borrowed parts without allocating when absent
                    if !self.pending.is_empty() {
                        pend =
                            self.pending
                                .remove(&(r.cluster.to_string(), r.node.to_string(), id));
                    }
                }
            }
            _ => {}
        }
        if !selected {
            return;
        }
        if closes {
            let start = match r.started.as_deref().map(ts::parse) {
                Some(Ok(s)) => Some(s),
                _ => pend.as_ref().map(|p| p.start),
            };
            let profile_owned;
            let profile = match r.profile.as_deref() {
                Some(p) => Some(p),
                None => {
                    profile_owned = pend.as_ref().and_then(|p| p.profile.clone());
                    profile_owned.as_deref()
                }
            };
            let slices = r
                .compute_slices
                .or(pend.as_ref().and_then(|p| p.slices))
                .unwrap_or(0) as u64;
            let is_end = event == "job_end";
            // The epilog (node/src/spine.rs) writes this when the prolog made nothing: a denied
            // job, or a second epilog run. It ends no job of its own.
            if is_end
                && start.is_none()
                && r.reason
                    .as_deref()
                    .is_some_and(|w| w.starts_with("no journal"))
            {
                self.out.no_journal_ends += 1;
                return;
            }
            if self.in_window(t) {
                self.build_key(&r, profile, t);
                let f = self.figures_mut();
                f.job_ends += u64::from(is_end);
                f.teardown_failures += u64::from(!is_end);
                f.firewall_drops += r.firewall_drops.unwrap_or(0);
            }
            match start {
                // A teardown_failed of a job that never started (a prolog's) closes nothing.
                None if is_end => self.out.unmatched_ends += 1,
                None => {}
                Some(s) if s < t => {
                    let mut lo = s;
                    let mut hi = t;
                    if let Some(since) = self.q.since {
                        lo = lo.max(since);
                    }
                    if let Some(until) = self.q.until {
                        hi = hi.min(until);
                    }
                    let split_day = self.q.by.contains(&GroupBy::Day);
                    let split_month = self.q.by.contains(&GroupBy::Month);
                    while lo < hi {
                        let next = if split_day {
                            next_day(lo)
                        } else if split_month {
                            next_month(lo)
                        } else {
                            hi
                        };
                        let end = next.min(hi);
                        let ms = (end - lo).num_milliseconds().max(0) as u64;
                        self.build_key(&r, profile, lo);
                        let f = self.figures_mut();
                        f.slice_ms += ms;
                        f.compute_slice_ms += ms * slices;
                        lo = end;
                    }
                }
                Some(_) => {}
            }
            return;
        }
        if !self.in_window(t) {
            return;
        }
        let (jobs, denied, rollbacks) = match event {
            "job_start" => (u64::from(r.outcome == "success"), 0, 0),
            "job_denied" => (0, 1, 0),
            "rollback" => (0, 0, 1),
            _ => (0, 0, 0),
        };
        let drops = r.firewall_drops.unwrap_or(0);
        if jobs + denied + rollbacks + drops == 0 {
            return;
        }
        let profile = r.profile.as_deref().map(str::to_string);
        self.build_key(&r, profile.as_deref(), t);
        let f = self.figures_mut();
        f.jobs += jobs;
        f.denied += denied;
        f.rollbacks += rollbacks;
        f.firewall_drops += drops;
    }

    /// Number of starts still waiting for their end (bounded by running jobs).
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    pub fn finish(mut self) -> Aggregate {
        let until = self.q.until;
        self.out.open_starts = self
            .pending
            .values()
            .filter(|p| p.selected && until.is_none_or(|u| p.start < u))
            .count() as u64;
        for (k, f) in self.groups {
            self.out.total.add(&f);
            self.out.groups.insert(k, f);
        }
        self.out
    }
}

fn next_day(t: DateTime<Utc>) -> DateTime<Utc> {
    let d = t.date_naive().succ_opt().expect("date in range");
    Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight"))
}

fn next_month(t: DateTime<Utc>) -> DateTime<Utc> {
    let (y, m) = if t.month() == 12 {
        (t.year() + 1, 1)
    } else {
        (t.year(), t.month() + 1)
    };
    month_start(y, m)
}

fn month_start(y: i32, m: u32) -> DateTime<Utc> {
    Utc.from_utc_datetime(
        &NaiveDate::from_ymd_opt(y, m, 1)
            .expect("valid month")
            .and_hms_opt(0, 0, 0)
            .expect("midnight"),
    )
}

/// Parses `YYYY-MM-DD` (start of that day, or of the next day when `end_of_day`) or RFC 3339.
pub fn parse_bound(s: &str, end_of_day: bool) -> anyhow::Result<DateTime<Utc>> {
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        let d = if end_of_day {
            d.succ_opt().context("date out of range")?
        } else {
            d
        };
        return Ok(Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight")));
    }
    ts::parse(s).with_context(|| format!("{s:?} is neither YYYY-MM-DD nor RFC 3339"))
}

/// Parses `YYYY-MM` into [start, next month start).
pub fn parse_month(s: &str) -> anyhow::Result<(DateTime<Utc>, DateTime<Utc>)> {
    let d = NaiveDate::parse_from_str(&format!("{s}-01"), "%Y-%m-%d")
        .with_context(|| format!("--statement {s:?}: want YYYY-MM, e.g. 2026-11"))?;
    let start = month_start(d.year(), d.month());
    Ok((start, next_month(start)))
}

/// Streams every file of `paths` through an [`Aggregator`]. `progress` is called with
/// (bytes read, total bytes) about every 4 MiB.
pub fn aggregate_paths(
    paths: &[PathBuf],
    q: Query,
    mut progress: Option<&mut dyn FnMut(u64, u64)>,
) -> anyhow::Result<Aggregate> {
    let files = expand_paths(paths)?;
    let total: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let mut agg = Aggregator::new(q);
    let mut done = 0u64;
    let mut next_tick = 4 << 20;
    let mut buf = Vec::with_capacity(4096);
    for f in &files {
        let file =
            std::fs::File::open(f).with_context(|| format!("opening audit log {}", f.display()))?;
        let mut rd = std::io::BufReader::with_capacity(1 << 18, file);
        loop {
            buf.clear();
            let n = rd
                .read_until(b'\n', &mut buf)
                .with_context(|| format!("reading audit log {}", f.display()))?;
            if n == 0 {
                break;
            }
            done += n as u64;
            let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
            if !line.is_empty() {
                agg.feed(line);
            }
            if done >= next_tick {
                next_tick = done + (4 << 20);
                if let Some(p) = progress.as_mut() {
                    p(done, total);
                }
            }
        }
    }
    if let Some(p) = progress.as_mut() {
        p(done, total);
    }
    Ok(agg.finish())
}

const FIG_COLS: [&str; 8] = [
    "jobs",
    "job_ends",
    "slice_hours",
    "compute_slice_hours",
    "denied",
    "rollbacks",
    "teardown_failures",
    "firewall_drops",
];

fn fig_cells(f: &Figures) -> Vec<String> {
    vec![
        f.jobs.to_string(),
        f.job_ends.to_string(),
        format!("{:.3}", f.slice_hours()),
        format!("{:.3}", f.compute_slice_hours()),
        f.denied.to_string(),
        f.rollbacks.to_string(),
        f.teardown_failures.to_string(),
        f.firewall_drops.to_string(),
    ]
}

fn fig_json(f: &Figures) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("jobs".into(), f.jobs.into());
    m.insert("job_ends".into(), f.job_ends.into());
    m.insert("slice_hours".into(), round6(f.slice_hours()).into());
    m.insert(
        "compute_slice_hours".into(),
        round6(f.compute_slice_hours()).into(),
    );
    m.insert("denied".into(), f.denied.into());
    m.insert("rollbacks".into(), f.rollbacks.into());
    m.insert("teardown_failures".into(), f.teardown_failures.into());
    m.insert("firewall_drops".into(), f.firewall_drops.into());
    m
}

fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

fn write_table(
    out: &mut dyn Write,
    header: &[String],
    rows: &[Vec<String>],
) -> std::io::Result<()> {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let fmt_row = |r: &[String]| {
        r.iter()
            .enumerate()
            .map(|(i, c)| {
                if i >= header.len() - FIG_COLS.len() {
                    format!("{c:>width$}", width = w[i])
                } else {
                    format!("{c:<width$}", width = w[i])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    writeln!(out, "{}", fmt_row(header).trim_end())?;
    for r in rows {
        writeln!(out, "{}", fmt_row(r).trim_end())?;
    }
    Ok(())
}

/// Writes a grouped report.
pub fn write_report(out: &mut dyn Write, agg: &Aggregate, format: Render) -> anyhow::Result<()> {
    let mut header: Vec<String> = agg.by.iter().map(|g| g.name().to_string()).collect();
    header.extend(FIG_COLS.iter().map(|s| s.to_string()));
    match format {
        Render::Json => {
            let rows: Vec<serde_json::Value> = agg
                .groups
                .iter()
                .map(|(k, f)| {
                    let mut m = serde_json::Map::new();
                    for (g, v) in agg.by.iter().zip(k) {
                        m.insert(g.name().into(), v.clone().into());
                    }
                    m.extend(fig_json(f));
                    serde_json::Value::Object(m)
                })
                .collect();
            let doc = serde_json::json!({
                "by": agg.by,
                "groups": rows,
                "total": fig_json(&agg.total),
                "records": agg.records,
                "malformed": agg.malformed,
            });
            serde_json::to_writer_pretty(&mut *out, &doc)?;
            writeln!(out)?;
        }
        Render::Csv => {
            let mut w = csv::Writer::from_writer(out);
            w.write_record(&header)?;
            for (k, f) in &agg.groups {
                let mut r = k.clone();
                r.extend(fig_cells(f));
                w.write_record(&r)?;
            }
            w.flush()?;
        }
        Render::Table => {
            let mut rows: Vec<Vec<String>> = agg
                .groups
                .iter()
                .map(|(k, f)| {
                    let mut r = k.clone();
                    r.extend(fig_cells(f));
                    r
                })
                .collect();
            if !agg.by.is_empty() {
                let mut r = vec!["TOTAL".to_string()];
                r.extend(std::iter::repeat_n(String::new(), agg.by.len() - 1));
                r.extend(fig_cells(&agg.total));
                rows.push(r);
            } else if rows.is_empty() {
                rows.push(fig_cells(&agg.total));
            }
            write_table(out, &header, &rows)?;
        }
    }
    Ok(())
}

/// Writes the per-tenant monthly statement (groups are tenant, profile).
pub fn write_statement(
    out: &mut dyn Write,
    agg: &Aggregate,
    month: &str,
    format: Render,
) -> anyhow::Result<()> {
    let mut tenants: BTreeMap<&str, Vec<(&str, &Figures)>> = BTreeMap::new();
    for (k, f) in &agg.groups {
        tenants.entry(&k[0]).or_default().push((&k[1], f));
    }
    let total_of = |lines: &[(&str, &Figures)]| {
        let mut t = Figures::default();
        for (_, f) in lines {
            t.add(f);
        }
        t
    };
    match format {
        Render::Json => {
            let docs: Vec<serde_json::Value> = tenants
                .iter()
                .map(|(t, lines)| {
                    let items: Vec<serde_json::Value> = lines
                        .iter()
                        .map(|(p, f)| {
                            let mut m = serde_json::Map::new();
                            m.insert("profile".into(), (*p).into());
                            m.extend(fig_json(f));
                            serde_json::Value::Object(m)
                        })
                        .collect();
                    serde_json::json!({
                        "tenant": t, "month": month, "lines": items,
                        "total": fig_json(&total_of(lines)),
                    })
                })
                .collect();
            serde_json::to_writer_pretty(&mut *out, &docs)?;
            writeln!(out)?;
        }
        Render::Csv => {
            let mut w = csv::Writer::from_writer(out);
            let mut h = vec!["month", "tenant", "profile"];
            h.extend(FIG_COLS);
            w.write_record(&h)?;
            for (t, lines) in &tenants {
                for (p, f) in lines {
                    let mut r = vec![month.to_string(), t.to_string(), p.to_string()];
                    r.extend(fig_cells(f));
                    w.write_record(&r)?;
                }
                let mut r = vec![month.to_string(), t.to_string(), "TOTAL".to_string()];
                r.extend(fig_cells(&total_of(lines)));
                w.write_record(&r)?;
            }
            w.flush()?;
        }
        Render::Table => {
            if tenants.is_empty() {
                writeln!(out, "Statement {month}: no usage recorded")?;
            }
            for (t, lines) in &tenants {
                writeln!(out, "Statement {month} — tenant {t}")?;
                let mut header = vec!["profile".to_string()];
                header.extend(FIG_COLS.iter().map(|s| s.to_string()));
                let mut rows: Vec<Vec<String>> = lines
                    .iter()
                    .map(|(p, f)| {
                        let mut r = vec![p.to_string()];
                        r.extend(fig_cells(f));
                        r
                    })
                    .collect();
                let mut r = vec!["TOTAL".to_string()];
                r.extend(fig_cells(&total_of(lines)));
                rows.push(r);
                write_table(out, &header, &rows)?;
                writeln!(out)?;
            }
        }
    }
    Ok(())
}
