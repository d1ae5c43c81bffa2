//! Many prologs and epilogs at once on one node, as processes with the real layers: no MIG
//! placement is given twice, every audit record is whole and in one chain, and the journals are
//! consistent (one per running job, none at the end).

mod common;

use common::{requires_root, text, World};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Barrier};
use tenancy_audit_log::Event;

const MIG_JOBS: u64 = 32;
const PLAIN_JOBS: u64 = 8;

/// Runs `f(job)` for every job in its own thread, all released at once.
fn all_at_once(jobs: &[u64], f: impl Fn(u64) + Send + Sync + 'static) {
    let f = Arc::new(f);
    let barrier = Arc::new(Barrier::new(jobs.len()));
    let handles: Vec<_> = jobs
        .iter()
        .map(|&job| {
            let (f, barrier) = (f.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                f(job)
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

fn profile(job: u64) -> Option<&'static str> {
    (job % 100 < MIG_JOBS).then_some("1g.18gb")
}

#[test]
fn forty_prolog_epilog_pairs_at_once_place_each_slice_once_and_keep_one_chain() {
    if !requires_root("real users, product cgroups, BPF device programs") {
        return;
    }
    let started = std::time::Instant::now();
    // 5 H200s: 35 1g slices for 32 MIG jobs, and 8 jobs without a slice.
    let Some(w) = World::new(5, None) else { return };
    let w = Arc::new(w);
    let jobs: Vec<u64> = (0..MIG_JOBS + PLAIN_JOBS).map(|i| 1000 + i).collect();

    // Round 1: every prolog at once; while all jobs run, the node is checked.
    let ww = w.clone();
    all_at_once(&jobs, move |job| {
        let t = (job % 2) as usize;
        let out = ww.run(&["prolog"], &ww.job_env(job, t, profile(job)));
        assert!(out.status.success(), "prolog {job}: {}", text(&out));
    });
    let gis = w.gis();
    assert_eq!(gis.len() as u64, MIG_JOBS, "{gis:?}");
    // The shim's own view: no two instances on one GPU overlap.
    for a in &gis {
        for b in &gis {
            if a != b && a.0 == b.0 {
                assert!(a.2 + a.3 <= b.2 || b.2 + b.3 <= a.2, "overlap {a:?} {b:?}");
            }
        }
    }
    // Every job got a distinct placement, and it is the one the shim holds.
    let mut placements = BTreeMap::new();
    for &job in &jobs {
        let j: serde_json::Value = w.journal(job);
        let steps = j["steps"].as_array().unwrap();
        assert!(steps.iter().all(|s| s["state"] == "made"), "job {job}: {j}");
        let mig = steps.iter().find(|s| s["layer"] == "mig");
        assert_eq!(mig.is_some(), profile(job).is_some(), "job {job}");
        if let Some(m) = mig {
            let key = (
                m["made"]["gpu_uuid"].as_str().unwrap().to_string(),
                m["made"]["gi_id"].as_u64().unwrap(),
            );
            if let Some(other) = placements.insert(key.clone(), job) {
                panic!("jobs {other} and {job} both hold {key:?}");
            }
        }
        assert!(w.cgroup((job % 2) as usize, job).is_dir(), "job {job}");
        assert!(w.scratch_dir((job % 2) as usize, job).is_dir(), "job {job}");
    }
    assert_eq!(placements.len() as u64, MIG_JOBS);
    assert_eq!(w.journals().len(), jobs.len());

    // Every epilog at once.
    let ww = w.clone();
    all_at_once(&jobs, move |job| {
        let t = (job % 2) as usize;
        let out = ww.run(&["epilog"], &ww.job_env(job, t, profile(job)));
        assert!(out.status.success(), "epilog {job}: {}", text(&out));
    });
    w.assert_nothing_left("after round 1");

    // Round 2: each job's prolog and epilog back to back, all jobs at once (churn: slices are
    // freed and taken while others decide). An epilog that destroys a GI outside the node lock
    // shifts NVML's MIG device indexes under a prolog looking its new slice up ("no MIG device
    // for GI n CI 0 among 7 MIG device slots"): the prolog fails and the node would drain. The
    // spine must tear down under the node lock (Spine::undo_all takes it).
    let jobs2: Vec<u64> = jobs.iter().map(|j| j + 1000).collect();
    let ww = w.clone();
    all_at_once(&jobs2, move |job| {
        let t = (job % 2) as usize;
        let env = ww.job_env(job, t, profile(job));
        let out = ww.run(&["prolog"], &env);
        assert!(out.status.success(), "prolog {job}: {}", text(&out));
        let out = ww.run(&["epilog"], &env);
        assert!(out.status.success(), "epilog {job}: {}", text(&out));
    });
    w.assert_nothing_left("after round 2");

    // The audit log: every line whole, one start and one end per job, seq without gaps, and a
    // valid chain.
    let recs = w.records();
    let n = 2 * 2 * jobs.len();
    assert_eq!(recs.len(), n);
    let seqs: Vec<u64> = recs.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=n as u64).collect::<Vec<_>>());
    let mut per_job: BTreeMap<u64, Vec<Event>> = BTreeMap::new();
    for r in &recs {
        per_job
            .entry(r.job_id.unwrap())
            .or_default()
            .push(r.event.clone());
    }
    let want: BTreeSet<u64> = jobs.iter().chain(&jobs2).copied().collect();
    assert_eq!(per_job.keys().copied().collect::<BTreeSet<_>>(), want);
    for (job, events) in per_job {
        assert_eq!(events, [Event::JobStart, Event::JobEnd], "job {job}");
    }
    assert!(w.chain_is_valid(), "audit chain broken");
    eprintln!(
        "concurrency: {} prolog/epilog pairs ({} with a MIG slice) in {:.1?}",
        want.len(),
        2 * MIG_JOBS,
        started.elapsed()
    );
}
