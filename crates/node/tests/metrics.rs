//! `tenancyctl metrics`: OpenMetrics text a real parser accepts (prometheus_client's, the
//! Python client's strict OpenMetrics parser), whose numbers are what the journals, the NVML
//! stand-in, the firewall and the audit log of a node with real jobs say.

mod common;

use common::{built_or_skip, requires_root, text, World};
use serde_json::Value;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use tenancy_audit_log::{Event, Record};

/// `tenancyctl metrics ARGS` in the world's network namespace (its firewall's counters).
fn metrics(w: &World, args: &[&str]) -> Option<String> {
    let bin = built_or_skip("tenancyctl")?;
    let mut all = vec!["metrics"];
    all.extend_from_slice(args);
    let out = w
        .command_of(&bin, &all, &[("PATH".into(), "/usr/sbin:/usr/bin".into())])
        .output()
        .unwrap();
    assert!(out.status.success(), "tenancyctl metrics: {}", text(&out));
    Some(String::from_utf8(out.stdout).unwrap())
}

/// Parses OpenMetrics text with prometheus_client: `[{name, type, samples: [{name, labels,
/// value}]}]`, or None (skip) when the parser is not installed.
fn parse(exposition: &str) -> Option<Value> {
    const PY: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
fams = [{"name": f.name, "type": f.type,
         "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples]}
        for f in text_string_to_metric_families(sys.stdin.read())]
print(json.dumps(fams))
"#;
    let has = Command::new("/usr/bin/python3")
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .status()
        .is_ok_and(|s| s.success());
    if !has {
        tenancy_test_support::skip(
            "needs python3-prometheus-client",
            "apt-get install python3-prometheus-client",
        );
        return None;
    }
    let out = tenancy_test_support::output_with_stdin(
        Command::new("/usr/bin/python3").args(["-c", PY]),
        exposition,
    )
    .unwrap();
    assert!(
        out.status.success(),
        "not valid OpenMetrics: {}\n--- the text:\n{exposition}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// The value of sample `name` whose labels include `labels`; 0 when there is none.
fn value(fams: &Value, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut found = Vec::new();
    for f in fams.as_array().unwrap() {
        for s in f["samples"].as_array().unwrap() {
            if s["name"] == name && labels.iter().all(|(k, v)| s["labels"][k] == *v) {
                found.push(s["value"].as_f64().unwrap());
            }
        }
    }
    assert!(found.len() <= 1, "{name} {labels:?}: {found:?}");
    found.first().copied().unwrap_or(0.0)
}

/// A node with jobs of both tenants running (MIG and not), one ended, one refused, one rolled
/// back and one whose teardown failed once.
fn busy_world() -> Option<(World, Vec<(OsString, OsString)>)> {
    let w = World::new(1, None)?;
    let base = 7_700_000 + u64::from(std::process::id() % 100_000) * 10;
    let run = |args: &[&str], env: &[(OsString, OsString)], ok: bool| {
        let out = w.run(args, env);
        assert_eq!(out.status.success(), ok, "{args:?}: {}", text(&out));
    };
    run(&["prolog"], &w.job_env(base, 0, Some("1g.18gb")), true);
    run(&["prolog"], &w.job_env(base + 1, 1, Some("1g.18gb")), true);
    run(&["prolog"], &w.job_env(base + 2, 1, None), true);
    let ended = w.job_env(base + 3, 0, None);
    run(&["prolog"], &ended, true);
    run(&["epilog"], &ended, true);
    // Refused: tenant 0's user asks for tenant 1.
    let mut refused = w.job_env(base + 4, 0, None);
    for (k, v) in refused.iter_mut() {
        if k == "SPANK_TENANCY_TENANT" {
            *v = w.tenants[1].clone().into();
        }
    }
    run(&["prolog"], &refused, false);
    // Rolled back: NVML refuses the compute instance.
    let mut rolled = w.job_env(base + 5, 0, Some("1g.18gb"));
    rolled.push(("NVML_SHIM_FAULTS".into(), "ci_create=UNKNOWN".into()));
    run(&["prolog"], &rolled, false);
    // A teardown that fails once (the GI is in use), then succeeds.
    let torn = w.job_env(base + 6, 1, Some("1g.18gb"));
    run(&["prolog"], &torn, true);
    let mut busy = torn.clone();
    // (In use for longer than the epilog's retry budget.)
    busy.push(("NVML_SHIM_FAULTS".into(), "destroy_in_use=1000".into()));
    run(&["epilog"], &busy, false);
    Some((w, torn))
}

#[test]
fn metrics_parse_as_openmetrics() {
    if !requires_root("real cgroups, nftables and the prolog") {
        return;
    }
    let Some((w, _)) = busy_world() else { return };
    let Some(exposition) = metrics(&w, &[]) else {
        return;
    };
    let Some(fams) = parse(&exposition) else {
        return;
    };
    assert!(exposition.ends_with("# EOF\n"), "{exposition}");
    let names: Vec<&str> = fams
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    for want in [
        "slurm_tenancy_jobs_running",
        "slurm_tenancy_mig_slices_in_use",
        "slurm_tenancy_firewall_dropped_packets",
        "slurm_tenancy_firewall_dropped_bytes",
        "slurm_tenancy_job_path_seconds",
        "slurm_tenancy_rollbacks",
        "slurm_tenancy_teardown_failures",
        "slurm_tenancy_jobs_refused",
        "slurm_tenancy_journals_left_for_reconcile",
        "slurm_tenancy_audit_chain_head_seq",
        "slurm_tenancy_last_reconcile_timestamp_seconds",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    // Bounded label sets: never a job or a user.
    for f in fams.as_array().unwrap() {
        assert!(f["name"].as_str().unwrap().starts_with("slurm_tenancy_"));
        for s in f["samples"].as_array().unwrap() {
            for k in s["labels"].as_object().unwrap().keys() {
                assert!(
                    ["tenant", "tier", "gpu", "profile", "path", "le"].contains(&k.as_str()),
                    "label {k} in {s}"
                );
            }
        }
    }
    // --textfile: the same text, renamed into place whole (no temporary file left).
    let dir = w.root.join("textfile");
    std::fs::create_dir(&dir).unwrap();
    metrics(&w, &["--textfile", dir.to_str().unwrap()]).unwrap();
    let written = std::fs::read_to_string(dir.join("slurm_tenancy.prom")).unwrap();
    parse(&written).unwrap();
    let entries: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, vec!["slurm_tenancy.prom".to_string()]);
    // A folder that is not there is an error naming it, not an empty success.
    let bin = built_or_skip("tenancyctl").unwrap();
    let missing = w.root.join("no-such-folder");
    let out = w
        .command_of(
            &bin,
            &["metrics", "--textfile", missing.to_str().unwrap()],
            &[],
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-folder"),
        "{}",
        common::text(&out)
    );
}

#[test]
fn metrics_count_what_the_audit_log_says() {
    if !requires_root("real cgroups, nftables and the prolog") {
        return;
    }
    let Some((w, torn)) = busy_world() else {
        return;
    };
    let Some(exposition) = metrics(&w, &[]) else {
        return;
    };
    let Some(fams) = parse(&exposition) else {
        return;
    };

    let records = w.records();
    let count = |e: Event| records.iter().filter(|r| r.event == e).count() as f64;
    assert!(count(Event::JobDenied) >= 1.0 && count(Event::Rollback) >= 1.0);
    assert!(count(Event::TeardownFailed) >= 1.0);
    assert_eq!(
        value(&fams, "slurm_tenancy_jobs_refused_total", &[]),
        count(Event::JobDenied)
    );
    assert_eq!(
        value(&fams, "slurm_tenancy_rollbacks_total", &[]),
        count(Event::Rollback)
    );
    assert_eq!(
        value(&fams, "slurm_tenancy_teardown_failures_total", &[]),
        count(Event::TeardownFailed)
    );
    assert_eq!(
        value(&fams, "slurm_tenancy_job_starts_total", &[]),
        count(Event::JobStart)
    );
    assert_eq!(
        value(&fams, "slurm_tenancy_job_ends_total", &[]),
        count(Event::JobEnd)
    );
    let head = records.iter().map(|r| r.seq).max().unwrap() as f64;
    assert_eq!(
        value(&fams, "slurm_tenancy_audit_chain_head_seq", &[]),
        head
    );

    // The histogram holds every prolog's and epilog's recorded duration.
    for (path, event) in [("prolog", Event::JobStart), ("epilog", Event::JobEnd)] {
        let d: Vec<f64> = records
            .iter()
            .filter(|r| r.event == event)
            .map(|r| {
                r.duration_us
                    .expect("job_start/job_end records carry duration_us") as f64
                    / 1e6
            })
            .collect();
        assert!(!d.is_empty());
        let name = "slurm_tenancy_job_path_seconds";
        assert_eq!(
            value(&fams, &format!("{name}_count"), &[("path", path)]),
            d.len() as f64
        );
        let sum = value(&fams, &format!("{name}_sum"), &[("path", path)]);
        assert!(
            (sum - d.iter().sum::<f64>()).abs() < 1e-6,
            "{path}: {sum} vs {d:?}"
        );
        let within = d.iter().filter(|&&s| s <= 0.1).count() as f64;
        assert_eq!(
            value(
                &fams,
                &format!("{name}_bucket"),
                &[("path", path), ("le", "0.1")]
            ),
            within
        );
    }

    // Running jobs per tenant and tier, and MIG slices per GPU and profile, from the journals;
    // the job whose teardown failed is left for reconcile, not running.
    let journal_ids: Vec<String> = w.journals();
    assert_eq!(journal_ids.len(), 4, "{journal_ids:?}");
    let mut per_tenant = BTreeMap::new();
    for r in records.iter().filter(|r| r.event == Event::JobStart) {
        let ended = records.iter().any(|e| {
            e.job_id == r.job_id && matches!(e.event, Event::JobEnd | Event::TeardownFailed)
        });
        if !ended {
            *per_tenant.entry(r.tenant.clone().unwrap()).or_insert(0.0) += 1.0;
        }
    }
    for t in &w.tenants {
        assert_eq!(
            value(
                &fams,
                "slurm_tenancy_jobs_running",
                &[("tenant", t), ("tier", "internal")]
            ),
            per_tenant.get(t).copied().unwrap_or(0.0),
            "tenant {t}"
        );
    }
    assert_eq!(
        value(&fams, "slurm_tenancy_journals_left_for_reconcile", &[]),
        1.0
    );
    // Two MIG jobs hold a 1g slice each; the teardown that failed left its GI too (NVML has
    // it; the journal no longer counts it as a running job's).
    assert_eq!(
        value(
            &fams,
            "slurm_tenancy_mig_slices_in_use",
            &[("gpu", "0"), ("profile", "1g.18gb")]
        ),
        2.0
    );
    // The firewall's counters, as nft lists them.
    let table = w.nft_table();
    assert!(table.contains("counter drop_"), "{table}");
    assert_eq!(value(&fams, "slurm_tenancy_firewall_loaded", &[]), 1.0);

    // The failed teardown finished by its epilog: one journal fewer to reconcile, one more end.
    let out = w.run(&["epilog"], &torn);
    assert!(out.status.success(), "{}", text(&out));
    let fams = parse(&metrics(&w, &[]).unwrap()).unwrap();
    assert_eq!(
        value(&fams, "slurm_tenancy_journals_left_for_reconcile", &[]),
        0.0
    );
    let records: Vec<Record> = w.records();
    let ends = records.iter().filter(|r| r.event == Event::JobEnd).count() as f64;
    assert_eq!(value(&fams, "slurm_tenancy_job_ends_total", &[]), ends);
    assert!(Path::new(&w.audit_path()).exists());
}
