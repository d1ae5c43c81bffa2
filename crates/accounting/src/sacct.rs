//! `tenancyctl report --compare-sacct`: the product's audit logs against Slurm's own accounting
//! (slurmdbd, read through `sacct`), job by job. Every job where the two books disagree is
//! listed: a job Slurm ran with no `job_start` on its node, a `job_start` Slurm has no job for,
//! and MIG slice-hours that differ from Slurm's `gres/gpu:<profile>` TRES usage by more than the
//! tolerance. Exit 1 when anything disagrees. A requeued job's runs (`sacct -D`) are each
//! held to their nodes' records, and their time summed against the job's slice-hours.

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

use std::path::PathBuf;
use std::process::Command;
use tenancy_audit_log::record::ts;

/// The columns asked of `sacct` (the same are needed in a file given instead).
pub const SACCT_FIELDS: &str = "JobIDRaw,Cluster,NodeList,State,Start,End,ElapsedRaw,AllocTRES";

/// One job as Slurm accounted it.
#[derive(Debug, Clone, Serialize)]
pub struct SlurmJob {
    pub job_id: u64,
    pub nodes: Vec<String>,
    pub state: String,
    pub elapsed_s: u64,
    /// MIG profile -> slices (`gres/gpu:<profile>=N` in AllocTRES).
    pub gpus: BTreeMap<String, u64>,
}

/// One job on one node as the audit log recorded it.
#[derive(Debug, Clone, Default)]
struct AuditJob {
    start: Option<DateTime<Utc>>,
    end: Option<DateTime<Utc>>,
    /// The run whose job_end is still to come (a requeued job runs again on the node).
    open: Option<DateTime<Utc>>,
    /// Milliseconds between each run's job_start (or its job_end's `started`) and job_end.
    used_ms: u64,
    profile: Option<String>,
    /// A job_denied or rollback for it on that node (the prolog refused or undid it).
    refused: Option<String>,
    /// The first `reconcile` record of the open run, its time and whether it succeeded:
    /// `tenancyctl reconcile --apply` or another job's prolog tore the run down, its epilog
    /// never having run (or recorded).
    reconciled: Option<(String, bool)>,
}

/// A job where the books disagree.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Disagreement {
    pub job_id: u64,
    pub node: String,
    /// `no_job_start`, `no_slurm_job` or `usage_differs`.
    pub kind: &'static str,
    /// Slurm's state of the run it is about (its last run for `usage_differs`; empty for
    /// `no_slurm_job` of a job Slurm does not have).
    pub state: String,
    pub detail: String,
    /// For `usage_differs` of a profile: the profile, and the slice time in milliseconds the
    /// audit logs hold and the time Slurm accounted (its runs' elapsed × slices), so that a
    /// reader can tell which book counts more.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audit_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_ms: Option<u64>,
}

/// What the comparison found.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub since: String,
    pub until: String,
    pub tolerance_seconds: u64,
    pub slurm_jobs: usize,
    pub audit_job_starts: usize,
    pub compared_usage: usize,
    pub disagreements: Vec<Disagreement>,
}

/// Expands a Slurm host list: `n1`, `n[1-3,7]`, `a,b[01-02]`.
pub fn expand_hostlist(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    let mut parts = Vec::new();
    for c in s.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    for p in parts
        .into_iter()
        .filter(|p| !p.is_empty() && p != "None assigned")
    {
        let Some((prefix, rest)) = p.split_once('[') else {
            out.push(p);
            continue;
        };
        let (ranges, suffix) = rest.split_once(']').unwrap_or((rest, ""));
        for r in ranges.split(',') {
            match r.split_once('-') {
                Some((a, b)) => {
                    let width = a.len();
                    if let (Ok(a), Ok(b)) = (a.parse::<u64>(), b.parse::<u64>()) {
                        for i in a..=b.min(a + 100_000) {
                            out.push(format!("{prefix}{i:0width$}{suffix}"));
                        }
                    }
                }
                None => out.push(format!("{prefix}{r}{suffix}")),
            }
        }
    }
    out
}

/// Parses `sacct --parsable2` output with its header line (any column order).
pub fn parse_sacct(text: &str) -> anyhow::Result<Vec<SlurmJob>> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let Some(header) = lines.next() else {
        return Ok(Vec::new());
    };
    let cols: Vec<&str> = header.split('|').map(str::trim).collect();
    let col = |names: &[&str]| cols.iter().position(|c| names.contains(c));
    let (Some(id), Some(nodes), Some(state), Some(elapsed), Some(tres)) = (
        col(&["JobIDRaw", "JobID"]),
        col(&["NodeList"]),
        col(&["State"]),
        col(&["ElapsedRaw"]),
        col(&["AllocTRES"]),
    ) else {
        bail!(
            "sacct output: its first line must be the header (sacct --parsable2 without \
             --noheader) with at least JobIDRaw, NodeList, State, ElapsedRaw and AllocTRES; \
             found {header:?}; make it with: sacct -a -X -D --parsable2 -o {SACCT_FIELDS}"
        );
    };
    let mut jobs = Vec::new();
    for (n, l) in lines.enumerate() {
        let f: Vec<&str> = l.split('|').collect();
        let get = |i: usize| f.get(i).copied().unwrap_or("").trim();
        let raw_id = get(id);
        // Steps (123.batch, 123.0) and array/het suffixes are not allocations.
        if raw_id.contains('.') {
            continue;
        }
        let Ok(job_id) = raw_id.parse::<u64>() else {
            bail!(
                "sacct output line {}: job id {raw_id:?} is not a number (use JobIDRaw)",
                n + 2
            );
        };
        let mut gpus = BTreeMap::new();
        for t in get(tres).split(',') {
            if let Some((k, v)) = t.split_once('=') {
                if let Some(p) = k.strip_prefix("gres/gpu:") {
                    if let Ok(v) = v.parse::<u64>() {
                        gpus.insert(p.to_string(), v);
                    }
                }
            }
        }
        jobs.push(SlurmJob {
            job_id,
            nodes: expand_hostlist(get(nodes)),
            state: get(state)
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string(),
            elapsed_s: get(elapsed).parse().unwrap_or(0),
            gpus,
        });
    }
    Ok(jobs)
}

/// Runs `sacct` for the period (times in UTC).
pub fn run_sacct(since: DateTime<Utc>, until: DateTime<Utc>) -> anyhow::Result<String> {
    let fmt = |t: DateTime<Utc>| t.format("%Y-%m-%dT%H:%M:%S").to_string();
    let out = Command::new("sacct")
        .env("TZ", "UTC")
        // Every run of a requeued or preempted job (-D), not only its last.
        .args(["-a", "-X", "-D", "--parsable2", "-o", SACCT_FIELDS, "-S"])
        .arg(fmt(since))
        .arg("-E")
        .arg(fmt(until))
        .output()
        .context("running sacct (Slurm's accounting client; or give --sacct-file)")?;
    if !out.status.success() {
        bail!(
            "sacct failed ({}): {}; is slurmdbd reachable (AccountingStorageType=\
             accounting_storage/slurmdbd)? Or give its output with --sacct-file",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).context("sacct output is not UTF-8")
}

/// Every job on every node as the audit logs at `paths` record it.
fn audit_jobs(paths: &[PathBuf]) -> anyhow::Result<BTreeMap<(String, u64), AuditJob>> {
    let mut jobs: BTreeMap<(String, u64), AuditJob> = BTreeMap::new();
    crate::for_each_line(paths, |buf| {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(buf) else {
            return;
        };
        let s = |k: &str| v.get(k).and_then(|x| x.as_str());
        let (Some(id), Some(node), Some(event)) = (
            v.get("job_id").and_then(|x| x.as_u64()),
            s("node"),
            s("event"),
        ) else {
            return;
        };
        let Some(Ok(t)) = s("time").map(ts::parse) else {
            return;
        };
        let j = jobs.entry((node.to_string(), id)).or_default();
        match event {
            "job_start" if s("outcome") == Some("success") => {
                j.start = Some(t);
                j.open = Some(t);
                j.reconciled = None;
                j.profile = s("profile").map(str::to_string);
            }
            "reconcile" if j.open.is_some() && j.reconciled.is_none() => {
                let ok = s("outcome") == Some("success");
                j.reconciled = s("time").map(|t| (t.to_string(), ok));
            }
            "job_end" | "teardown_failed" => {
                let started = s("started").and_then(|x| ts::parse(x).ok());
                if let Some(st) = started {
                    j.start.get_or_insert(st);
                }
                if let Some(began) = j.open.take().or(started) {
                    j.used_ms += (t - began).num_milliseconds().max(0) as u64;
                }
                if j.start.is_some() {
                    j.end = Some(t);
                }
                if j.profile.is_none() {
                    j.profile = s("profile").map(str::to_string);
                }
            }
            "job_denied" | "rollback" => {
                j.refused = Some(format!("{event}: {}", s("reason").unwrap_or("")));
            }
            _ => {}
        }
    })?;
    Ok(jobs)
}

/// Compares the books for [since, until).
pub fn compare(
    slurm: &[SlurmJob],
    paths: &[PathBuf],
    since: DateTime<Utc>,
    until: DateTime<Utc>,
    tolerance_seconds: u64,
) -> anyhow::Result<Comparison> {
    let audit = audit_jobs(paths)?;
    let mut d = Vec::new();
    // Each job's runs in sacct's order (`sacct -D` lists every run of a requeued or
    // preempted job, its last one last), and every node any of them ran on.
    let mut runs: BTreeMap<u64, Vec<&SlurmJob>> = BTreeMap::new();
    for j in slurm {
        runs.entry(j.job_id).or_default().push(j);
    }
    let slurm_nodes: BTreeMap<u64, Vec<String>> = runs
        .iter()
        .map(|(id, rs)| {
            let mut nodes: Vec<String> = Vec::new();
            for n in rs.iter().flat_map(|r| &r.nodes) {
                if !nodes.contains(n) {
                    nodes.push(n.clone());
                }
            }
            (*id, nodes)
        })
        .collect();
    let mut compared = 0;
    for (id, rs) in &runs {
        let mut missing = false;
        let mut ran: Vec<&SlurmJob> = Vec::new();
        for j in rs {
            // Never started (pending, held after a refused prolog): nothing to record. A run
            // Slurm requeued counts when it ran (`scontrol requeue`, a preemption).
            let never_ran = matches!(
                j.state.as_str(),
                "PENDING" | "REQUEUE_HOLD" | "REQUEUE_FED" | "BOOT_FAIL"
            ) || (matches!(j.state.as_str(), "CANCELLED" | "REQUEUED")
                && j.elapsed_s == 0);
            if never_ran {
                continue;
            }
            ran.push(j);
            missing |= no_job_start(j, &audit, &mut d);
        }
        let Some(last) = ran.last() else { continue };
        // Running, or already listed for want of a start: no usage to hold against Slurm's.
        if last.state == "RUNNING" || missing {
            continue;
        }
        let nodes = &slurm_nodes[id];
        let mut audit_ms: BTreeMap<String, u64> = BTreeMap::new();
        // Each node whose last run of the job has no end, and what the log has instead.
        let mut unended: Vec<String> = Vec::new();
        for node in nodes {
            match audit.get(&(node.clone(), *id)) {
                Some(a) if a.start.is_some() => {
                    if a.end.is_none() || a.open.is_some() {
                        unended.push(match &a.reconciled {
                            Some((t, true)) => format!(
                                "on {node} a reconcile record at {t} tore its last run down \
                                 instead of its epilog"
                            ),
                            Some((t, false)) => format!(
                                "on {node} a reconcile record at {t} failed to tear its last run \
                                 down instead of its epilog"
                            ),
                            None => format!(
                                "on {node} nothing after its last job_start: its epilog did not \
                                 run or could not write (a full audit disk); `tenancyctl \
                                 reconcile` there lists what is left"
                            ),
                        });
                    } else if let Some(p) = &a.profile {
                        *audit_ms.entry(p.clone()).or_default() += a.used_ms;
                    }
                }
                _ => {}
            }
        }
        if !unended.is_empty() {
            d.push(Disagreement {
                job_id: *id,
                node: nodes.join(","),
                kind: "usage_differs",
                state: last.state.clone(),
                detail: format!(
                    "Slurm ended job {id} ({}, {} s) but the audit log has no job_end or \
                     teardown_failed for it ({}): its slice-hours are not in the statement",
                    last.state,
                    last.elapsed_s,
                    unended.join("; ")
                ),
                ..Default::default()
            });
            continue;
        }
        // Every run's time against the audit log's: the slices of the last run (a job asks
        // for the same GRES each time it runs).
        let whole = SlurmJob {
            job_id: *id,
            nodes: nodes.clone(),
            state: last.state.clone(),
            elapsed_s: ran.iter().map(|r| r.elapsed_s).sum(),
            gpus: last.gpus.clone(),
        };
        compared += usage_differs(&whole, &audit_ms, tolerance_seconds, &mut d);
    }
    let last_state: BTreeMap<u64, String> = runs
        .iter()
        .filter_map(|(id, rs)| Some((*id, rs.last()?.state.clone())))
        .collect();
    let starts =
        starts_without_slurm_job(&audit, &slurm_nodes, &last_state, (since, until), &mut d);
    d.sort();
    Ok(Comparison {
        since: ts::format(&since),
        until: ts::format(&until),
        tolerance_seconds,
        slurm_jobs: runs.len(),
        audit_job_starts: starts,
        compared_usage: compared,
        disagreements: d,
    })
}

/// One run of a job Slurm accounted against the audit logs: a disagreement for each of its
/// nodes with no job_start of the job (a refusal there agrees with a run Slurm did not
/// complete). Whether any was missing.
fn no_job_start(
    j: &SlurmJob,
    audit: &BTreeMap<(String, u64), AuditJob>,
    d: &mut Vec<Disagreement>,
) -> bool {
    let mut missing = false;
    for node in &j.nodes {
        let a = audit.get(&(node.clone(), j.job_id));
        match a {
            Some(a) if a.start.is_some() => {}
            Some(a) if a.refused.is_some() && j.state != "COMPLETED" => {
                // The prolog refused it and Slurm did not complete it: the books agree.
            }
            other => {
                missing = true;
                let gres = if j.gpus.is_empty() {
                    "no GPU GRES".to_string()
                } else {
                    j.gpus
                        .iter()
                        .map(|(p, n)| format!("gres/gpu:{p}={n}"))
                        .collect::<Vec<_>>()
                        .join(",")
                };
                let only = match other.and_then(|a| a.refused.as_deref()) {
                    Some(r) => format!(" (only {r})"),
                    None => String::new(),
                };
                d.push(Disagreement {
                    job_id: j.job_id,
                    node: node.clone(),
                    kind: "no_job_start",
                    state: j.state.clone(),
                    detail: format!(
                        "Slurm accounted job {} on {node} ({}, {} s, {gres}) but the audit log \
                         has no job_start for it on that node{only}",
                        j.job_id, j.state, j.elapsed_s
                    ),
                    ..Default::default()
                });
            }
        }
    }
    missing
}

/// Slurm's job `j` against its slice-hours in the audit log (`audit_ms`, per profile): a
/// disagreement per profile that differs by more than the tolerance. Returns the profiles
/// compared.
fn usage_differs(
    j: &SlurmJob,
    audit_ms: &BTreeMap<String, u64>,
    tolerance_seconds: u64,
    d: &mut Vec<Disagreement>,
) -> usize {
    let mut compared = 0;
    let profiles: BTreeSet<&String> = audit_ms.keys().chain(j.gpus.keys()).collect();
    for p in profiles {
        compared += 1;
        let a = audit_ms.get(p).copied().unwrap_or(0);
        let n = j.gpus.get(p).copied().unwrap_or(0);
        let s = n * j.elapsed_s * 1000;
        let tol = tolerance_seconds * 1000 * n.max(1);
        if a.abs_diff(s) > tol {
            d.push(Disagreement {
                job_id: j.job_id,
                node: j.nodes.join(","),
                kind: "usage_differs",
                state: j.state.clone(),
                detail: format!(
                    "profile {p}: audit {:.4} slice-hours, Slurm gres/gpu:{p}={n} × {} s = \
                     {:.4} slice-hours; differ by {:.1} s, more than the tolerance of {} s \
                     per slice",
                    a as f64 / 3.6e6,
                    j.elapsed_s,
                    s as f64 / 3.6e6,
                    a.abs_diff(s) as f64 / 1000.0,
                    tolerance_seconds
                ),
                profile: Some(p.clone()),
                audit_ms: Some(a),
                slurm_ms: Some(s),
            });
        }
    }
    compared
}

/// The audit log's job starts in [since, until) against Slurm's jobs: a disagreement for each
/// Slurm has not, or not on that node. Returns the starts in the period.
fn starts_without_slurm_job(
    audit: &BTreeMap<(String, u64), AuditJob>,
    slurm_nodes: &BTreeMap<u64, Vec<String>>,
    last_state: &BTreeMap<u64, String>,
    (since, until): (DateTime<Utc>, DateTime<Utc>),
    d: &mut Vec<Disagreement>,
) -> usize {
    let mut starts = 0;
    for ((node, id), a) in audit {
        let Some(s) = a.start else { continue };
        if s < since || s >= until {
            continue;
        }
        starts += 1;
        match slurm_nodes.get(id) {
            Some(nodes) if nodes.iter().any(|n| n == node) => {}
            Some(nodes) => d.push(Disagreement {
                job_id: *id,
                node: node.clone(),
                kind: "no_slurm_job",
                state: last_state.get(id).cloned().unwrap_or_default(),
                detail: format!(
                    "job_start of job {id} on {node} at {} but Slurm accounted the job on {} only",
                    ts::format(&s),
                    nodes.join(",")
                ),
                ..Default::default()
            }),
            None => d.push(Disagreement {
                job_id: *id,
                node: node.clone(),
                kind: "no_slurm_job",
                state: String::new(),
                detail: format!(
                    "job_start of job {id} on {node} at {} ({}) but Slurm's accounting has no \
                     such job in the period",
                    ts::format(&s),
                    a.profile.as_deref().unwrap_or("no MIG slice")
                ),
                ..Default::default()
            }),
        }
    }
    starts
}
