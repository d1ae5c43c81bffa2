//! `tenancyctl report --statement YYYY-MM`: the priced monthly statement per tenant, as a
//! table, CSV, JSON or a self-contained HTML page (inline CSS and SVG, nothing fetched), with
//! the integrity of the logs it was made from (`audit verify` over the same files).
//!
//! Money is decimal throughout: a line's amount is its exact milliseconds × the price per hour
//! / 3,600,000, rounded to the cent (half away from zero); a total is the sum of its lines as
//! shown, so an auditor re-adds the page and gets the same figure.

use crate::report::{aggregate_paths, parse_month, GroupBy, Query};
use crate::{verify_paths, Render, VerifyReport};
use anyhow::Context;
use rust_decimal::{Decimal, RoundingStrategy};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use tenancy_config::Billing;

mod html;

pub use html::write_html;

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
    crate::for_each_line(paths, |buf| {
        // Cheap filter before parsing: most lines are starts and ends.
        let wanted = [
            &b"\"job_denied\""[..],
            b"\"rollback\"",
            b"\"teardown_failed\"",
        ];
        if !wanted.iter().any(|w| buf.windows(w.len()).any(|x| x == *w)) {
            return;
        }
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(buf) else {
            return;
        };
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("");
        let event = s("event");
        if !["job_denied", "rollback", "teardown_failed"].contains(&event) {
            return;
        }
        let Ok(t) = tenancy_audit_log::record::ts::parse(s("time")) else {
            return;
        };
        if q.since.is_some_and(|x| t < x) || q.until.is_some_and(|x| t >= x) {
            return;
        }
        let tenant = match s("tenant") {
            "" => NO_SLICE.to_string(),
            t => t.to_string(),
        };
        let pass = |list: &[String], v: &str| list.is_empty() || list.iter().any(|x| x == v);
        if !pass(&q.tenants, &tenant) || !pass(&q.users, s("user")) || !pass(&q.nodes, s("node")) {
            return;
        }
        let list = out.entry(tenant).or_default();
        if list.iter().filter(|i| i.event == event).count() >= MAX_LISTED {
            return;
        }
        list.push(Incident {
            time: s("time").to_string(),
            node: s("node").to_string(),
            job_id: v.get("job_id").and_then(|x| x.as_u64()),
            event: event.to_string(),
            reason: s("reason").to_string(),
        });
    })?;
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
    price_lines(&mut per, usage, billing, month)?;
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

/// One line per tenant and profile used in `month`: its jobs, hours and, with `billing`, its
/// price (a profile without one is an error, never a line left out).
fn price_lines(
    per: &mut BTreeMap<String, TenantStatement>,
    usage: BTreeMap<(String, String), (u64, u64)>,
    billing: Option<&Billing>,
    month: &str,
) -> anyhow::Result<()> {
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
    Ok(())
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
    match format {
        Render::Json => {
            serde_json::to_writer_pretty(&mut *out, s)?;
            writeln!(out)?;
        }
        Render::Csv => write_csv(out, s)?,
        Render::Table => write_table(out, s)?,
    }
    Ok(())
}

/// The statement as CSV: one row per line, one TOTAL row per tenant.
fn write_csv(out: &mut dyn Write, s: &Statement) -> anyhow::Result<()> {
    let cur = s.currency.as_deref();
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
    Ok(())
}

/// The statement as a table per tenant, with its incidents, and the total of all tenants.
fn write_table(out: &mut dyn Write, s: &Statement) -> anyhow::Result<()> {
    let cur = s.currency.as_deref();
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
