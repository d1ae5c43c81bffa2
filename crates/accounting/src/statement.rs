//! `tenancyctl report --statement YYYY-MM`: the priced monthly statement per tenant, as a
//! table, CSV, JSON or a self-contained HTML page (inline CSS and SVG, nothing fetched), with
//! the integrity of the logs it was made from (`audit verify` over the same files).
//!
//! Money is decimal throughout: a line's amount is its exact milliseconds × the price per hour
//! / 3,600,000, rounded to the cent (half away from zero); a total is the sum of its lines as
//! shown, so an auditor re-adds the page and gets the same figure.

use crate::report::{aggregate_paths, parse_month, GroupBy, Query};
use crate::{expand_paths, verify_paths, Render, VerifyReport};
use anyhow::Context;
use rust_decimal::{Decimal, RoundingStrategy};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use tenancy_config::Billing;

/// The profile column of a job without a MIG slice in the report's groups.
const NO_SLICE: &str = "-";
/// Reasons listed per kind of event and tenant (all are counted).
const MAX_LISTED: usize = 20;

/// Where a statement's integrity line comes from: anchors to check the chains against.
#[derive(Debug, Clone, Default)]
pub struct IntegrityInputs {
    pub anchors: Vec<PathBuf>,
    pub anchor_key: Option<PathBuf>,
    pub public_keys: Option<PathBuf>,
    pub all_nodes: bool,
}

/// One priced line: a profile's slice-hours (or, without a slice, job-hours).
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// `None`: jobs without a MIG slice.
    pub profile: Option<String>,
    pub unit: &'static str,
    pub jobs: u64,
    /// Exact usage in milliseconds (slice-ms or job-ms).
    pub usage_ms: u64,
    /// Hours, exact to the millisecond (shown with 4 decimals).
    #[serde(with = "rust_decimal::serde::str")]
    pub quantity: Decimal,
    #[serde(with = "rust_decimal::serde::str_option")]
    pub rate: Option<Decimal>,
    #[serde(with = "rust_decimal::serde::str_option")]
    pub amount: Option<Decimal>,
}

/// A refusal, rollback or teardown failure, with the reason its record gives.
#[derive(Debug, Clone, Serialize)]
pub struct Incident {
    pub time: String,
    pub node: String,
    pub job_id: Option<u64>,
    pub event: String,
    pub reason: String,
}

/// One tenant's statement for one month.
#[derive(Debug, Clone, Serialize)]
pub struct TenantStatement {
    pub tenant: String,
    pub lines: Vec<Line>,
    #[serde(with = "rust_decimal::serde::str_option")]
    pub total_amount: Option<Decimal>,
    /// Day (YYYY-MM-DD) -> profile ("-": no slice) -> usage in ms.
    pub daily_ms: BTreeMap<String, BTreeMap<String, u64>>,
    pub refusals: u64,
    pub rollbacks: u64,
    pub teardown_failures: u64,
    /// The first few of each kind (the counts above are complete).
    pub incidents: Vec<Incident>,
}

/// One node's chain as verify found it.
#[derive(Debug, Clone, Serialize)]
pub struct NodeIntegrity {
    pub cluster: String,
    pub node: String,
    pub first_seq: u64,
    pub last_seq: u64,
    pub anchor_seq: Option<u64>,
    pub findings: usize,
}

/// Whether the logs verify, in figures and in one sentence.
#[derive(Debug, Clone, Serialize)]
pub struct Integrity {
    pub verified: bool,
    pub anchors_checked: bool,
    pub anchors_authenticated: bool,
    pub nodes: Vec<NodeIntegrity>,
    pub findings: u64,
    pub first_finding: Option<String>,
    pub sentence: String,
}

/// The statements of one month, every tenant.
#[derive(Debug, Clone, Serialize)]
pub struct Statement {
    pub month: String,
    pub cluster: Option<String>,
    pub currency: Option<String>,
    pub integrity: Integrity,
    pub tenants: Vec<TenantStatement>,
    /// Every tenant's total, summed (with prices).
    #[serde(with = "rust_decimal::serde::str_option")]
    pub total_amount: Option<Decimal>,
    /// Audit records read, and lines that were not records.
    pub records: u64,
    pub malformed: u64,
    /// Starts without an end (still running, or the end not recorded): not billed.
    pub open_starts: u64,
}

fn hours(ms: u64) -> Decimal {
    Decimal::from(ms) / Decimal::from(3_600_000u64)
}

/// Rounded to the cent, and always written with two decimals (`4.80`).
fn cents(d: Decimal) -> Decimal {
    let mut c = d.round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero);
    c.rescale(2);
    c
}

/// Integrity of the logs at `paths`: `audit verify` over them, with the anchors given.
pub fn integrity(paths: &[PathBuf], inputs: &IntegrityInputs) -> anyhow::Result<Integrity> {
    let anchors = crate::verify::read_anchors(
        &inputs.anchors,
        inputs.anchor_key.as_deref(),
        inputs.public_keys.as_deref(),
    )?;
    let mut r: VerifyReport = verify_paths(paths, &anchors, 10)?;
    if inputs.all_nodes {
        r.require_every_anchored_node(&anchors, 10);
    }
    let nodes: Vec<NodeIntegrity> = r
        .nodes
        .iter()
        .map(|n| NodeIntegrity {
            cluster: n.cluster.clone(),
            node: n.node.clone(),
            first_seq: n.first_seq,
            last_seq: n.last_seq,
            anchor_seq: n.anchor_seq,
            findings: n.findings,
        })
        .collect();
    let anchors_checked = !inputs.anchors.is_empty();
    let verified = r.is_clean();
    let first_finding = r.first().map(|f| f.to_string());
    let places: Vec<String> = nodes
        .iter()
        .map(|n| {
            format!(
                "node {} up to seq {}{}",
                n.node,
                n.last_seq,
                match n.anchor_seq {
                    Some(a) => format!(" (anchored at seq {a})"),
                    None if anchors_checked => " (no anchor found for it)".to_string(),
                    None => String::new(),
                }
            )
        })
        .collect();
    let places = if places.is_empty() {
        "no records".to_string()
    } else {
        places.join(", ")
    };
    let sentence = if !verified {
        format!(
            "THE AUDIT LOGS THIS STATEMENT WAS MADE FROM DO NOT VERIFY: {} finding(s); first: {}. \
             Records may be missing or altered, so the figures below may be wrong: do not bill \
             from them before `tenancyctl audit verify` is clean.",
            r.total_findings,
            first_finding.as_deref().unwrap_or("?")
        )
    } else if anchors_checked {
        format!(
            "The audit logs verify: hash chains intact on {places}; the anchor check passed{}.",
            if r.anchors_signed {
                " (anchors signed by each node's own key, checked with the nodes' public keys)"
            } else if r.anchors_authenticated {
                " (anchors authenticated by their MAC)"
            } else {
                " (anchors not authenticated: no anchor key)"
            }
        )
    } else {
        format!(
            "The audit chains are intact on {places}, but no anchors were checked: a tail cut off \
             a log would not show (give --anchor)."
        )
    };
    Ok(Integrity {
        verified,
        anchors_checked,
        anchors_authenticated: r.anchors_authenticated,
        nodes,
        findings: r.total_findings,
        first_finding,
        sentence,
    })
}

/// Refusals, rollbacks and teardown failures of the month with their reasons, per tenant
/// (the first [`MAX_LISTED`] of each kind).
fn incidents(paths: &[PathBuf], q: &Query) -> anyhow::Result<BTreeMap<String, Vec<Incident>>> {
    let mut out: BTreeMap<String, Vec<Incident>> = BTreeMap::new();
    let mut buf = Vec::new();
    for f in expand_paths(paths)? {
        let file = std::fs::File::open(&f)
            .with_context(|| format!("opening audit log {}", f.display()))?;
        let mut rd = std::io::BufReader::new(file);
        loop {
            buf.clear();
            if rd.read_until(b'\n', &mut buf)? == 0 {
                break;
            }
            // Cheap filter before parsing: most lines are starts and ends.
            let wanted = [
                &b"\"job_denied\""[..],
                b"\"rollback\"",
                b"\"teardown_failed\"",
            ];
            if !wanted.iter().any(|w| buf.windows(w.len()).any(|x| x == *w)) {
                continue;
            }
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&buf) else {
                continue;
            };
            let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("");
            let event = s("event");
            if !["job_denied", "rollback", "teardown_failed"].contains(&event) {
                continue;
            }
            let Ok(t) = tenancy_audit_log::record::ts::parse(s("time")) else {
                continue;
            };
            if q.since.is_some_and(|x| t < x) || q.until.is_some_and(|x| t >= x) {
                continue;
            }
            let tenant = match s("tenant") {
                "" => NO_SLICE.to_string(),
                t => t.to_string(),
            };
            let pass = |list: &[String], v: &str| list.is_empty() || list.iter().any(|x| x == v);
            if !pass(&q.tenants, &tenant)
                || !pass(&q.users, s("user"))
                || !pass(&q.nodes, s("node"))
            {
                continue;
            }
            let list = out.entry(tenant).or_default();
            if list.iter().filter(|i| i.event == event).count() >= MAX_LISTED {
                continue;
            }
            list.push(Incident {
                time: s("time").to_string(),
                node: s("node").to_string(),
                job_id: v.get("job_id").and_then(|x| x.as_u64()),
                event: event.to_string(),
                reason: s("reason").to_string(),
            });
        }
    }
    Ok(out)
}

/// Builds the month's statements from the logs at `paths` (only `filter`'s tenants, users and
/// nodes when it names some), priced by `billing`.
pub fn build(
    paths: &[PathBuf],
    month: &str,
    filter: &Query,
    billing: Option<&Billing>,
    cluster: Option<&str>,
    inputs: &IntegrityInputs,
) -> anyhow::Result<Statement> {
    let (since, until) = parse_month(month)?;
    let q = Query {
        since: Some(since),
        until: Some(until),
        tenants: filter.tenants.clone(),
        users: filter.users.clone(),
        nodes: filter.nodes.clone(),
        by: vec![GroupBy::Tenant, GroupBy::Profile, GroupBy::Day],
    };
    let agg = aggregate_paths(paths, q.clone(), None)?;
    let mut per: BTreeMap<String, TenantStatement> = BTreeMap::new();
    let mut usage: BTreeMap<(String, String), (u64, u64)> = BTreeMap::new();
    for (k, f) in &agg.groups {
        let (tenant, profile, day) = (&k[0], &k[1], &k[2]);
        let st = per
            .entry(tenant.clone())
            .or_insert_with(|| TenantStatement {
                tenant: tenant.clone(),
                lines: Vec::new(),
                total_amount: None,
                daily_ms: BTreeMap::new(),
                refusals: 0,
                rollbacks: 0,
                teardown_failures: 0,
                incidents: Vec::new(),
            });
        st.refusals += f.denied;
        st.rollbacks += f.rollbacks;
        st.teardown_failures += f.teardown_failures;
        if f.slice_ms > 0 {
            *st.daily_ms
                .entry(day.clone())
                .or_default()
                .entry(profile.clone())
                .or_default() += f.slice_ms;
        }
        let u = usage.entry((tenant.clone(), profile.clone())).or_default();
        u.0 += f.jobs;
        u.1 += f.slice_ms;
    }
    for ((tenant, profile), (jobs, ms)) in usage {
        if jobs == 0 && ms == 0 {
            continue;
        }
        let profile = (profile != NO_SLICE).then_some(profile);
        let rate = match billing {
            None => None,
            Some(b) => Some(b.rate(profile.as_deref()).with_context(|| {
                format!(
                    "statement {month}: tenant {tenant} used MIG profile {} ({} slice-hours) but \
                     [billing.rates] has no price for it; add \"{}\" = <price per slice-hour> \
                     to the config (a profile a tier no longer offers keeps its price until its \
                     last statement)",
                    profile.as_deref().unwrap_or("?"),
                    hours(ms).round_dp(4),
                    profile.as_deref().unwrap_or("?"),
                )
            })?),
        };
        let st = per.get_mut(&tenant).expect("tenant seen");
        st.lines.push(Line {
            unit: if profile.is_some() {
                "slice-hours"
            } else {
                "job-hours"
            },
            profile,
            jobs,
            usage_ms: ms,
            quantity: hours(ms).normalize(),
            rate,
            amount: rate.map(|r| cents(Decimal::from(ms) * r / Decimal::from(3_600_000u64))),
        });
    }
    let mut listed = incidents(paths, &q)?;
    for st in per.values_mut() {
        if billing.is_some() {
            st.total_amount = Some(cents(st.lines.iter().filter_map(|l| l.amount).sum()));
        }
        st.incidents = listed.remove(&st.tenant).unwrap_or_default();
    }
    let total_amount = billing.map(|_| cents(per.values().filter_map(|t| t.total_amount).sum()));
    Ok(Statement {
        total_amount,
        month: month.to_string(),
        cluster: cluster.map(str::to_string),
        currency: billing.map(|b| b.currency.clone()),
        integrity: integrity(paths, inputs)?,
        tenants: per.into_values().collect(),
        records: agg.records,
        malformed: agg.malformed,
        open_starts: agg.open_starts,
    })
}

fn profile_name(p: Option<&str>) -> &str {
    p.unwrap_or("no MIG slice")
}

fn money(d: Option<Decimal>, currency: Option<&str>) -> String {
    match (d, currency) {
        (Some(d), Some(c)) => format!("{c} {d:.2}"),
        (Some(d), None) => format!("{d:.2}"),
        (None, _) => "-".to_string(),
    }
}

fn rate_text(d: Option<Decimal>, unit: &str, currency: Option<&str>) -> String {
    match d {
        Some(d) => {
            // As written in the config, but at least to the cent: `2.40`, `0.0125`.
            let mut d = d.normalize();
            if d.scale() < 2 {
                d.rescale(2);
            }
            format!(
                "{} {d} / {}",
                currency.unwrap_or(""),
                unit.trim_end_matches('s')
            )
        }
        None => "-".to_string(),
    }
}

/// Incidents of one tenant in words.
fn incident_words(st: &TenantStatement) -> Vec<String> {
    let mut w = Vec::new();
    if st.refusals > 0 {
        w.push(format!(
            "{} job(s) were refused before they started (job_denied): nothing ran, nothing is \
             billed.",
            st.refusals
        ));
    }
    if st.rollbacks > 0 {
        w.push(format!(
            "{} job start(s) were rolled back (rollback): a layer could not be set up, what was \
             made was undone and the job did not run; nothing is billed.",
            st.rollbacks
        ));
    }
    if st.teardown_failures > 0 {
        w.push(format!(
            "{} job end(s) failed to tear down (teardown_failed): the job's slices are billed \
             up to the failure, the node was drained until `tenancyctl reconcile` finished it.",
            st.teardown_failures
        ));
    }
    if w.is_empty() {
        w.push("No refusals, rollbacks or teardown failures this month.".to_string());
    }
    w
}

/// Writes the statement as a table, CSV or JSON.
pub fn write_plain(out: &mut dyn Write, s: &Statement, format: Render) -> anyhow::Result<()> {
    let cur = s.currency.as_deref();
    match format {
        Render::Json => {
            serde_json::to_writer_pretty(&mut *out, s)?;
            writeln!(out)?;
        }
        Render::Csv => {
            let mut w = csv::Writer::from_writer(out);
            w.write_record([
                "month",
                "tenant",
                "profile",
                "unit",
                "jobs",
                "usage_ms",
                "quantity",
                "rate",
                "amount",
                "currency",
                "refusals",
                "rollbacks",
                "teardown_failures",
                "logs_verify",
            ])?;
            let verified = if s.integrity.verified { "yes" } else { "no" };
            let d = |x: Option<Decimal>| x.map(|d| d.to_string()).unwrap_or_default();
            for t in &s.tenants {
                for l in &t.lines {
                    w.write_record([
                        s.month.clone(),
                        t.tenant.clone(),
                        l.profile.clone().unwrap_or_else(|| NO_SLICE.into()),
                        l.unit.to_string(),
                        l.jobs.to_string(),
                        l.usage_ms.to_string(),
                        format!("{:.4}", l.quantity),
                        d(l.rate),
                        d(l.amount),
                        cur.unwrap_or("").to_string(),
                        String::new(),
                        String::new(),
                        String::new(),
                        verified.to_string(),
                    ])?;
                }
                w.write_record([
                    s.month.clone(),
                    t.tenant.clone(),
                    "TOTAL".into(),
                    String::new(),
                    t.lines.iter().map(|l| l.jobs).sum::<u64>().to_string(),
                    String::new(),
                    String::new(),
                    String::new(),
                    d(t.total_amount),
                    cur.unwrap_or("").to_string(),
                    t.refusals.to_string(),
                    t.rollbacks.to_string(),
                    t.teardown_failures.to_string(),
                    verified.to_string(),
                ])?;
            }
            w.flush()?;
        }
        Render::Table => {
            writeln!(out, "{}", s.integrity.sentence)?;
            writeln!(out)?;
            if s.tenants.is_empty() {
                writeln!(out, "Statement {}: no usage recorded", s.month)?;
            }
            for t in &s.tenants {
                writeln!(out, "Statement {} — tenant {}", s.month, t.tenant)?;
                let mut tab = comfy_table::Table::new();
                tab.load_preset(comfy_table::presets::NOTHING);
                tab.set_header(["PROFILE", "UNIT", "JOBS", "QUANTITY", "RATE", "AMOUNT"]);
                for l in &t.lines {
                    tab.add_row([
                        profile_name(l.profile.as_deref()).to_string(),
                        l.unit.to_string(),
                        l.jobs.to_string(),
                        format!("{:.4}", l.quantity),
                        rate_text(l.rate, l.unit, cur),
                        money(l.amount, cur),
                    ]);
                }
                tab.add_row([
                    "TOTAL".to_string(),
                    String::new(),
                    t.lines.iter().map(|l| l.jobs).sum::<u64>().to_string(),
                    String::new(),
                    String::new(),
                    money(t.total_amount, cur),
                ]);
                writeln!(out, "{tab}")?;
                for w in incident_words(t) {
                    writeln!(out, "  {w}")?;
                }
                writeln!(out)?;
            }
            match s.total_amount {
                Some(t) if s.tenants.len() > 1 => {
                    writeln!(out, "All tenants, {}: {}", s.month, money(Some(t), cur))?
                }
                Some(_) => {}
                None => writeln!(
                    out,
                    "No [billing] prices in the config: quantities only (see docs/admin-guide.md, Billing)."
                )?,
            }
        }
    }
    Ok(())
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const PALETTE: [&str; 8] = [
    "#2f6db5", "#e07b28", "#3a9a4a", "#c23b3b", "#7d57b0", "#8c6239", "#d26fb1", "#6b7280",
];

/// A stacked bar chart of usage per day and profile (hours), as inline SVG.
fn chart(s: &Statement, t: &TenantStatement) -> String {
    let (start, end) = parse_month(&s.month).expect("month parsed before");
    let days = (end - start).num_days().max(1) as usize;
    let mut profiles: Vec<String> = t
        .daily_ms
        .values()
        .flat_map(|m| m.keys().cloned())
        .collect();
    profiles.sort();
    profiles.dedup();
    let max_ms = t
        .daily_ms
        .values()
        .map(|m| m.values().sum::<u64>())
        .max()
        .unwrap_or(0);
    let axis = Axis::for_hours(max_ms as f64 / 3_600_000.0);
    // Bars are drawn against the axis top, in hours.
    let top = axis.top_hours();
    let (w, h, left, right, top_m, bottom) = (760.0, 280.0, 56.0, 16.0, 16.0, 64.0);
    let plot_w = w - left - right;
    let plot_h = h - top_m - bottom;
    let bw = plot_w / days as f64;
    let mut o = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="Usage per day and profile, {tenant}, {month}" class="chart">"##,
        tenant = esc(&t.tenant),
        month = esc(&s.month)
    );
    for i in 0..=Axis::TICKS {
        let y = top_m + plot_h - plot_h * i as f64 / Axis::TICKS as f64;
        o.push_str(&format!(
            r##"<line x1="{left}" x2="{x2}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text class="tick" x="{tx}" y="{ty:.1}" font-size="11" text-anchor="end">{v}</text>"##,
            x2 = w - right,
            tx = left - 6.0,
            ty = y + 4.0,
            v = axis.label(i),
        ));
    }
    o.push_str(&format!(
        r##"<text class="axis-unit" x="14" y="{y:.1}" font-size="11" transform="rotate(-90 14 {y:.1})" text-anchor="middle">{unit}</text>"##,
        y = top_m + plot_h / 2.0,
        unit = axis.unit
    ));
    for d in 0..days {
        let date = start + chrono::Duration::days(d as i64);
        let key = date.format("%Y-%m-%d").to_string();
        let x = left + bw * d as f64;
        let mut y = top_m + plot_h;
        if let Some(m) = t.daily_ms.get(&key) {
            for (pi, p) in profiles.iter().enumerate() {
                let Some(ms) = m.get(p) else { continue };
                let hh = plot_h * (*ms as f64 / 3_600_000.0) / top;
                y -= hh;
                o.push_str(&format!(
                    r##"<rect class="bar" data-day="{key}" data-profile="{pe}" x="{x:.1}" y="{y:.1}" width="{bwi:.1}" height="{hh:.1}" fill="{c}"><title>{key} {pn}: {q} h</title></rect>"##,
                    pe = esc(p),
                    bwi = (bw - 2.0).max(1.0),
                    c = PALETTE[pi % PALETTE.len()],
                    pn = esc(profile_name((p != NO_SLICE).then_some(p))),
                    q = hours(*ms).round_dp(3),
                ));
            }
        }
        if d % 2 == 0 || days <= 16 {
            o.push_str(&format!(
                r##"<text x="{tx:.1}" y="{ty}" font-size="10" text-anchor="middle">{n}</text>"##,
                tx = x + bw / 2.0,
                ty = top_m + plot_h + 14.0,
                n = d + 1
            ));
        }
    }
    o.push_str(&format!(
        r##"<line x1="{left}" x2="{x2}" y1="{y}" y2="{y}" stroke="#333"/>"##,
        x2 = w - right,
        y = top_m + plot_h
    ));
    let mut lx = left;
    let ly = h - 18.0;
    for (pi, p) in profiles.iter().enumerate() {
        let name = profile_name((p != NO_SLICE).then_some(p));
        o.push_str(&format!(
            r##"<rect x="{lx:.1}" y="{ry:.1}" width="12" height="12" fill="{c}"/><text x="{tx:.1}" y="{ly:.1}" font-size="12">{n}</text>"##,
            ry = ly - 10.0,
            c = PALETTE[pi % PALETTE.len()],
            tx = lx + 16.0,
            n = esc(name),
        ));
        lx += 24.0 + 7.0 * name.len() as f64;
    }
    if profiles.is_empty() {
        o.push_str(&format!(
            r##"<text x="{x}" y="{y}" font-size="13" text-anchor="middle">no usage this month</text>"##,
            x = left + plot_w / 2.0,
            y = top_m + plot_h / 2.0
        ));
    }
    o.push_str("</svg>");
    o
}

/// The chart's value axis: its unit and its ticks chosen from the data, so that every tick has
/// a label of its own at any scale (a month of 0.0006 slice-hours is 0, 0.5, 1, 1.5, 2 ... seconds,
/// not 0, 0, 0.001, 0.001, 0.001 hours).
#[derive(Debug, Clone, PartialEq)]
struct Axis {
    unit: &'static str,
    /// Units per hour.
    per_hour: f64,
    /// Between two ticks, in the unit.
    step: f64,
    /// Decimals that write every tick exactly.
    decimals: usize,
}

impl Axis {
    const TICKS: usize = 4;

    fn for_hours(max_h: f64) -> Axis {
        let (unit, per_hour) = if max_h >= 1.0 {
            ("hours", 1.0)
        } else if max_h * 60.0 >= 1.0 {
            ("minutes", 60.0)
        } else {
            ("seconds", 3600.0)
        };
        let v = max_h * per_hour;
        let raw = if v > 0.0 {
            v / Self::TICKS as f64
        } else {
            0.25
        };
        // A round step: 1, 2, 2.5 or 5 times a power of ten, the smallest whose ticks reach v.
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|m| m * mag)
            .find(|st| *st * Self::TICKS as f64 >= v * (1.0 - 1e-12))
            .unwrap_or(10.0 * mag);
        let decimals = (0..=9)
            .find(|d| {
                let scaled = step * 10f64.powi(*d as i32);
                (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
            })
            .unwrap_or(9);
        Axis {
            unit,
            per_hour,
            step,
            decimals,
        }
    }

    fn top_hours(&self) -> f64 {
        self.step * Self::TICKS as f64 / self.per_hour
    }

    /// The label of tick `i` (0 at the bottom), thousands grouped.
    fn label(&self, i: usize) -> String {
        let s = format!("{:.*}", self.decimals, self.step * i as f64);
        let (int, frac) = s
            .split_once('.')
            .map_or((s.as_str(), None), |(a, b)| (a, Some(b)));
        let mut grouped = String::new();
        for (k, ch) in int.chars().enumerate() {
            if k > 0 && (int.len() - k) % 3 == 0 {
                grouped.push(',');
            }
            grouped.push(ch);
        }
        match frac {
            Some(f) => format!("{grouped}.{f}"),
            None => grouped,
        }
    }
}

const CSS: &str = "body{font-family:'DejaVu Sans',Arial,sans-serif;margin:2em;color:#1f2937}\
h1{font-size:1.5em;margin-bottom:.2em}.sub{color:#555;margin-top:0}\
.integrity{padding:.8em 1em;border-radius:6px;margin:1em 0}\
.ok{background:#e7f5ea;border:1px solid #3a9a4a}.bad{background:#fde8e8;border:2px solid #c23b3b;font-weight:bold}\
.warn{background:#fff7e0;border:1px solid #e0a800}\
table{border-collapse:collapse;margin:1em 0;min-width:640px}th,td{padding:.35em .8em;border-bottom:1px solid #ddd}\
th{text-align:left;background:#f3f4f6}td.n{text-align:right;font-variant-numeric:tabular-nums}\
tr.total td{font-weight:bold;border-top:2px solid #333}\
section.tenant{page-break-after:always}footer{color:#666;font-size:.85em;margin-top:2em}";

/// One tenant's statement as a complete HTML page section.
fn tenant_html(s: &Statement, t: &TenantStatement) -> String {
    let cur = s.currency.as_deref();
    let mut o = String::new();
    o.push_str(&format!(
        "<section class=\"tenant\" id=\"tenant-{te}\"><h1>Statement {m} — tenant {te}</h1>\
         <p class=\"sub\">Cluster {c}. Usage from the product's audit logs: MIG slice-hours per \
         profile, job-hours for jobs without a MIG slice.</p>",
        te = esc(&t.tenant),
        m = esc(&s.month),
        c = esc(s.cluster.as_deref().unwrap_or("(not named)")),
    ));
    let class = if !s.integrity.verified {
        "bad"
    } else if s.integrity.anchors_checked {
        "ok"
    } else {
        "warn"
    };
    o.push_str(&format!(
        "<p class=\"integrity {class}\">{}</p>",
        esc(&s.integrity.sentence)
    ));
    o.push_str(
        "<table class=\"lines\"><thead><tr><th>Profile</th><th>Unit</th><th>Jobs</th>\
         <th>Quantity</th><th>Rate</th><th>Amount</th></tr></thead>",
    );
    for l in &t.lines {
        o.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.4}</td>\
             <td class=\"n\">{}</td><td class=\"n amount\">{}</td></tr>",
            esc(profile_name(l.profile.as_deref())),
            l.unit,
            l.jobs,
            l.quantity,
            esc(&rate_text(l.rate, l.unit, cur)),
            esc(&money(l.amount, cur)),
        ));
    }
    if t.lines.is_empty() {
        o.push_str("<tr><td colspan=\"6\">No usage this month.</td></tr>");
    }
    o.push_str(&format!(
        "<tr class=\"total\"><td>Total</td><td></td><td class=\"n\">{}</td><td></td><td></td>\
         <td class=\"n amount total\">{}</td></tr></table>",
        t.lines.iter().map(|l| l.jobs).sum::<u64>(),
        esc(&money(t.total_amount, cur)),
    ));
    if s.currency.is_none() {
        o.push_str(
            "<p class=\"warn integrity\">No [billing] prices in the config: quantities only.</p>",
        );
    }
    o.push_str("<h2>Usage per day</h2>");
    o.push_str(&chart(s, t));
    o.push_str("<h2>Refusals, rollbacks and teardown failures</h2><ul class=\"incidents\">");
    for w in incident_words(t) {
        o.push_str(&format!("<li>{}</li>", esc(&w)));
    }
    o.push_str("</ul>");
    if !t.incidents.is_empty() {
        o.push_str(
            "<table class=\"incidents\"><thead><tr><th>Time (UTC)</th><th>Node</th><th>Job</th>\
             <th>Event</th><th>Reason</th></tr></thead>",
        );
        for i in &t.incidents {
            o.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&i.time),
                esc(&i.node),
                i.job_id.map(|j| j.to_string()).unwrap_or_default(),
                esc(&i.event),
                esc(&i.reason),
            ));
        }
        o.push_str("</table>");
    }
    o.push_str(&format!(
        "<footer>Made by tenancyctl from {} audit record(s){}{}. Amounts: each line's exact \
         milliseconds × its rate, rounded to the cent (half away from zero); the total is the \
         sum of the lines.</footer></section>",
        s.records,
        if s.malformed > 0 {
            format!(", {} malformed line(s) skipped", s.malformed)
        } else {
            String::new()
        },
        if s.open_starts > 0 {
            format!(
                ", {} job(s) without a recorded end not billed (still running, or the end was \
                 not recorded)",
                s.open_starts
            )
        } else {
            String::new()
        },
    ));
    o
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">\
         <title>{}</title><style>{CSS}</style></head><body>{body}</body></html>\n",
        esc(title)
    )
}

/// The tenant's part of a file name. Names come from the logs, which may have been tampered
/// with: only a valid tenant name goes into a path, anything else (`../x`, the `-` of records
/// without a tenant) becomes a fixed form.
fn file_part(tenant: &str) -> String {
    if tenant != NO_SLICE && tenancy_config::valid_name(tenant) {
        tenant.to_string()
    } else {
        let h: String = tenant
            .bytes()
            .map(|b| format!("{b:02x}"))
            .take(32)
            .collect();
        format!("_no-valid-tenant-{h}")
    }
}

/// The HTML statement: one page per tenant in `dir` (returned), or every tenant in one page.
pub fn write_html(s: &Statement, dir: Option<&Path>, out: &mut dyn Write) -> anyhow::Result<()> {
    match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating --out folder {}", dir.display()))?;
            if s.tenants.is_empty() {
                writeln!(
                    out,
                    "statement {}: no usage recorded; no file written",
                    s.month
                )?;
            }
            for t in &s.tenants {
                let name = format!("statement-{}-{}.html", s.month, file_part(&t.tenant));
                let path = dir.join(&name);
                let tmp = dir.join(format!(".{name}.tmp"));
                std::fs::write(
                    &tmp,
                    page(
                        &format!("Statement {} — {}", s.month, t.tenant),
                        &tenant_html(s, t),
                    ),
                )
                .with_context(|| format!("writing {}", tmp.display()))?;
                std::fs::rename(&tmp, &path)
                    .with_context(|| format!("renaming to {}", path.display()))?;
                writeln!(out, "{}", path.display())?;
            }
        }
        None => {
            let mut body = String::new();
            for t in &s.tenants {
                body.push_str(&tenant_html(s, t));
            }
            if s.tenants.is_empty() {
                body.push_str(&format!(
                    "<h1>Statement {}</h1><p class=\"integrity {}\">{}</p><p>No usage recorded.</p>",
                    esc(&s.month),
                    if s.integrity.verified { "ok" } else { "bad" },
                    esc(&s.integrity.sentence)
                ));
            }
            out.write_all(page(&format!("Statement {}", s.month), &body).as_bytes())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_name_from_the_logs_never_leaves_the_out_folder() {
        assert_eq!(file_part("acme"), "acme");
        assert_eq!(file_part("-"), "_no-valid-tenant-2d");
        let p = file_part("../../etc/x");
        assert!(!p.contains('/') && !p.contains(".."), "{p}");
    }

    #[test]
    fn axis_ticks_are_distinct_at_any_scale() {
        for max_h in [
            0.0, 0.0006, 0.004, 0.2, 0.9, 1.0, 3.7, 99.0, 12_345.0, 2.5e6,
        ] {
            let a = super::Axis::for_hours(max_h);
            let labels: Vec<String> = (0..=super::Axis::TICKS).map(|i| a.label(i)).collect();
            let mut d = labels.clone();
            d.dedup();
            assert_eq!(d.len(), labels.len(), "{max_h}: {labels:?}");
            assert!(a.top_hours() >= max_h, "{max_h}: {a:?}");
            assert!(
                a.top_hours() <= (max_h * 2.6).max(0.001),
                "{max_h}: {a:?} too tall"
            );
        }
        let small = super::Axis::for_hours(0.0006);
        assert_eq!(small.unit, "seconds");
        let big = super::Axis::for_hours(12_345.0);
        assert_eq!(big.label(4), "20,000");
    }

    #[test]
    fn amounts_round_half_away_from_zero_to_the_cent() {
        assert_eq!(cents(Decimal::new(2975, 3)).to_string(), "2.98");
        assert_eq!(cents(Decimal::new(48, 1)).to_string(), "4.80");
        // 1 ms at 1.00 per hour is below half a cent.
        assert_eq!(
            cents(Decimal::ONE / Decimal::from(3_600_000u64)).to_string(),
            "0.00"
        );
    }
}
