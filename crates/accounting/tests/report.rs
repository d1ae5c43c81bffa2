//! Report totals versus an independent computation from the generator's ground truth.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use tenancy_accounting::report::{
    aggregate_paths, parse_month, write_statement, Figures, GroupBy, Query,
};
use tenancy_accounting::Render;
use tenancy_audit_log::{AuditLog, Event, Outcome, Record};
use tenancy_test_support::audit_logs::{self as gen, write_logs, Truth};

/// Independent expectation: (tenant, profile) -> figures, within [since, until).
fn expected_by_tenant_profile(
    truths: &[Truth],
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> BTreeMap<(String, String), Figures> {
    let mut m: BTreeMap<(String, String), Figures> = BTreeMap::new();
    let inside = |t: DateTime<Utc>| t >= since && t < until;
    for t in truths {
        match t {
            Truth::Job {
                tenant,
                profile,
                slices,
                start,
                end,
                drops,
                ..
            } => {
                if inside(*start) {
                    m.entry((tenant.clone(), profile.clone())).or_default().jobs += 1;
                }
                if let Some(end) = end {
                    let e = m.entry((tenant.clone(), profile.clone())).or_default();
                    if inside(*end) {
                        e.job_ends += 1;
                        e.firewall_drops += drops;
                    }
                    let lo = (*start).max(since);
                    let hi = (*end).min(until);
                    if hi > lo {
                        let ms = (hi - lo).num_milliseconds() as u64;
                        e.slice_ms += ms;
                        e.compute_slice_ms += ms * *slices as u64;
                    }
                }
            }
            Truth::Denied { tenant, time } if inside(*time) => {
                // denied records carry a profile in the generator only for grouping; count per tenant
                m.entry((tenant.clone(), "*".into())).or_default().denied += 1;
            }
            Truth::Rollback { tenant, time } if inside(*time) => {
                m.entry((tenant.clone(), "*".into())).or_default().rollbacks += 1;
            }
            Truth::TeardownFailed { tenant, time } if inside(*time) => {
                m.entry((tenant.clone(), "*".into()))
                    .or_default()
                    .teardown_failures += 1;
            }
            _ => {}
        }
    }
    m.retain(|_, f| *f != Figures::default());
    m
}

/// The query of `since` to `until`, grouped by tenant and profile.
fn by_tenant_and_profile(since: DateTime<Utc>, until: DateTime<Utc>) -> Query {
    Query {
        since: Some(since),
        until: Some(until),
        by: vec![GroupBy::Tenant, GroupBy::Profile],
        ..Default::default()
    }
}

#[test]
fn totals_match_independent_computation() {
    let dir = tempfile::tempdir().unwrap();
    let truths = write_logs(dir.path(), 0x5eed, 4, 3000);
    let since = Utc.with_ymd_and_hms(2026, 11, 1, 0, 0, 0).unwrap();
    let until = Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap();
    let q = by_tenant_and_profile(since, until);
    let agg = aggregate_paths(&[dir.path().to_path_buf()], q, None).unwrap();
    assert_eq!(agg.malformed, 0);
    assert_eq!(agg.records, 4 * 3000);
    assert_eq!(agg.unmatched_ends, 0);
    let exp = expected_by_tenant_profile(&truths, since, until);

    // Job figures per (tenant, profile) must match exactly.
    let mut got_jobs: BTreeMap<(String, String), Figures> = BTreeMap::new();
    let mut got_tenant_incidents: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for (k, f) in &agg.groups {
        let mut jf = *f;
        let inc = got_tenant_incidents.entry(k[0].clone()).or_default();
        inc.0 += f.denied;
        inc.1 += f.rollbacks;
        inc.2 += f.teardown_failures;
        jf.denied = 0;
        jf.rollbacks = 0;
        jf.teardown_failures = 0;
        if jf != Figures::default() {
            got_jobs.insert((k[0].clone(), k[1].clone()), jf);
        }
    }
    let mut exp_jobs = BTreeMap::new();
    let mut exp_inc: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for ((t, p), f) in &exp {
        if p == "*" {
            let e = exp_inc.entry(t.clone()).or_default();
            e.0 += f.denied;
            e.1 += f.rollbacks;
            e.2 += f.teardown_failures;
        } else {
            exp_jobs.insert((t.clone(), p.clone()), *f);
        }
    }
    got_tenant_incidents.retain(|_, v| *v != (0, 0, 0));
    assert!(!exp_jobs.is_empty());
    assert_eq!(got_jobs, exp_jobs, "job figures per tenant/profile");
    assert_eq!(
        got_tenant_incidents, exp_inc,
        "denied/rollbacks/teardown failures per tenant"
    );
    let total_ms: u64 = exp_jobs.values().map(|f| f.slice_ms).sum();
    assert_eq!(agg.total.slice_ms, total_ms);
    assert!(agg.total.denied > 0 && agg.total.rollbacks > 0 && agg.total.teardown_failures > 0);
}

#[test]
fn day_grouping_splits_slice_time_at_midnight() {
    let dir = tempfile::tempdir().unwrap();
    let truths = write_logs(dir.path(), 7, 2, 1500);
    let q = Query {
        by: vec![GroupBy::Day],
        ..Default::default()
    };
    let agg = aggregate_paths(&[dir.path().to_path_buf()], q, None).unwrap();
    // Independent: for each day of the span, clip every job to that day.
    let first = Utc.with_ymd_and_hms(2026, 10, 25, 0, 0, 0).unwrap();
    let mut day = first;
    let mut checked = 0;
    while let Some(got) = agg.groups.get(&vec![day.format("%Y-%m-%d").to_string()]) {
        let next = day + TimeDelta::days(1);
        let mut exp_ms = 0u64;
        for t in &truths {
            if let Truth::Job {
                start,
                end: Some(end),
                ..
            } = t
            {
                let lo = (*start).max(day);
                let hi = (*end).min(next);
                if hi > lo {
                    exp_ms += (hi - lo).num_milliseconds() as u64;
                }
            }
        }
        assert_eq!(got.slice_ms, exp_ms, "slice ms on {day}");
        checked += 1;
        day = next;
    }
    assert!(checked > 30, "only {checked} days checked");
    let all_ms: u64 = truths
        .iter()
        .filter_map(|t| match t {
            Truth::Job {
                start,
                end: Some(end),
                ..
            } => Some((*end - *start).num_milliseconds() as u64),
            _ => None,
        })
        .sum();
    assert_eq!(agg.total.slice_ms, all_ms);
}

#[test]
fn statement_lists_each_tenant_with_totals() {
    let dir = tempfile::tempdir().unwrap();
    let truths = write_logs(dir.path(), 11, 2, 2000);
    let (since, until) = parse_month("2026-11").unwrap();
    let q = by_tenant_and_profile(since, until);
    let agg = aggregate_paths(&[dir.path().to_path_buf()], q, None).unwrap();
    let mut out = Vec::new();
    write_statement(&mut out, &agg, "2026-11", Render::Csv).unwrap();
    let text = String::from_utf8(out).unwrap();
    let exp = expected_by_tenant_profile(&truths, since, until);
    for tenant in gen::TENANTS {
        let ms: u64 = exp
            .iter()
            .filter(|((t, _), _)| t == tenant)
            .map(|(_, f)| f.compute_slice_ms)
            .sum();
        let want = format!("{:.3}", ms as f64 / 3_600_000.0);
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("2026-11,{tenant},TOTAL,")))
            .unwrap_or_else(|| panic!("no TOTAL line for {tenant} in\n{text}"));
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells[6], want, "compute slice hours of {tenant}: {line}");
    }
}

/// One record as the prolog/epilog write it: job `job` of alice, tenant acme.
fn job_rec(job: u64, event: Event, outcome: Outcome, t: DateTime<Utc>) -> Record {
    Record::new(
        "c1",
        "gpu001",
        "alice",
        2001,
        event,
        outcome,
        "tenancy-epilog",
    )
    .job_id(job)
    .tenant("acme")
    .time(t)
}

fn aggregate_records(recs: Vec<Record>, q: Query) -> tenancy_accounting::report::Aggregate {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("gpu001.audit.jsonl");
    let mut log = AuditLog::open(&p).unwrap().with_fsync(false);
    for mut r in recs {
        log.append(&mut r).unwrap();
    }
    aggregate_paths(&[p], q, None).unwrap()
}

#[test]
fn teardown_failed_ends_the_job_and_bills_its_slices() {
    let t0 = Utc.with_ymd_and_hms(2026, 11, 2, 0, 0, 0).unwrap();
    let h = TimeDelta::hours(1);
    let start = |job, slices| {
        job_rec(job, Event::JobStart, Outcome::Success, t0)
            .profile("2g.35gb")
            .compute_slices(slices)
    };
    let failed = |job, t| job_rec(job, Event::TeardownFailed, Outcome::Failure, t);
    let agg = aggregate_records(
        vec![
            // the epilog could not tear down (hand-off failed): no started/profile in the record
            start(1, 2),
            failed(1, t0 + h * 10),
            // the epilog's teardown_failed carries started, profile and slices itself
            failed(2, t0 + h * 3)
                .started(t0 + h)
                .profile("2g.35gb")
                .compute_slices(3),
            // a prolog's teardown_failed (an earlier attempt's journal): no start to close
            failed(3, t0 + h),
            // never ended
            start(4, 1),
        ],
        Query {
            by: vec![GroupBy::Tenant, GroupBy::Profile],
            ..Default::default()
        },
    );
    let f = agg.groups[&vec!["acme".to_string(), "2g.35gb".to_string()]];
    assert_eq!(f.slice_ms, (10 + 2) * 3_600_000, "{f:?}");
    assert_eq!(f.compute_slice_ms, (10 * 2 + 2 * 3) * 3_600_000, "{f:?}");
    assert_eq!((f.jobs, f.job_ends, f.teardown_failures), (2, 0, 2));
    assert_eq!(agg.total.teardown_failures, 3);
    assert_eq!(agg.total.job_ends, 0);
    assert_eq!(agg.unmatched_ends, 0);
    assert_eq!(agg.open_starts, 1, "job 4 has no end");
}

#[test]
fn no_journal_job_end_is_not_another_job_end() {
    let t0 = Utc.with_ymd_and_hms(2026, 11, 2, 0, 0, 0).unwrap();
    let h = TimeDelta::hours(1);
    // what the epilog writes when it finds no journal (node/src/spine.rs)
    let no_journal = |job, t| {
        job_rec(job, Event::JobEnd, Outcome::Success, t)
            .reason("no journal: the prolog made nothing for this job")
    };
    let start = |job| {
        job_rec(job, Event::JobStart, Outcome::Success, t0)
            .profile("1g.18gb")
            .compute_slices(1)
    };
    let agg = aggregate_records(
        vec![
            // a normal job, then a second epilog run for it
            start(1),
            job_rec(1, Event::JobEnd, Outcome::Success, t0 + h)
                .started(t0)
                .profile("1g.18gb")
                .compute_slices(1),
            no_journal(1, t0 + h * 2),
            // a denied job: its epilog finds no journal
            job_rec(2, Event::JobDenied, Outcome::Denied, t0),
            no_journal(2, t0 + h),
            // a started job whose journal was lost: its end still ends it
            start(3),
            no_journal(3, t0 + h * 4),
        ],
        Query {
            by: vec![GroupBy::Tenant],
            ..Default::default()
        },
    );
    let f = agg.groups[&vec!["acme".to_string()]];
    assert_eq!((f.jobs, f.job_ends, f.denied), (2, 2, 1), "{f:?}");
    assert_eq!(f.slice_ms, (1 + 4) * 3_600_000);
    assert_eq!(agg.unmatched_ends, 0);
    assert_eq!(agg.no_journal_ends, 2);
    assert_eq!(agg.open_starts, 0);
}

#[test]
fn group_values_may_hold_any_character() {
    // U+001F once joined the group key's parts: a user name holding it split into two columns
    let t0 = Utc.with_ymd_and_hms(2026, 11, 2, 0, 0, 0).unwrap();
    let mut r = job_rec(1, Event::JobDenied, Outcome::Denied, t0).profile("1g\u{1f}18gb");
    r.user = "a\u{1f}b".into();
    let agg = aggregate_records(
        vec![r],
        Query {
            by: vec![GroupBy::User, GroupBy::Profile],
            ..Default::default()
        },
    );
    let key = vec!["a\u{1f}b".to_string(), "1g\u{1f}18gb".to_string()];
    assert_eq!(agg.groups[&key].denied, 1, "{:?}", agg.groups);
    let write = |format| {
        let mut out = Vec::new();
        tenancy_accounting::report::write_report(&mut out, &agg, format).unwrap();
        String::from_utf8(out).unwrap()
    };
    let table = write(Render::Table);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("a\u{1f}b ") && l.contains(" 1g\u{1f}18gb ")),
        "{table}"
    );
    let csv = write(Render::Csv);
    assert!(csv.contains("\na\u{1f}b,1g\u{1f}18gb,0,"), "{csv}");
    let doc: serde_json::Value = serde_json::from_str(&write(Render::Json)).unwrap();
    assert_eq!(doc["groups"][0]["user"], "a\u{1f}b");
    assert_eq!(doc["groups"][0]["profile"], "1g\u{1f}18gb");
}
