//! Appends records to one node's audit log as the epilog would (job ends with a tenant and a
//! MIG slice), without fsync: the forwarding benchmark's input (bench/forward.sh).
//! `gen_chain LOG RECORDS [NODE]`.

use tenancy_audit_log::{AuditLog, Event, Outcome, Record, Resource, ResourceAction};

fn main() -> anyhow::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    anyhow::ensure!(a.len() >= 3, "usage: gen_chain LOG RECORDS [NODE]");
    let n: u64 = a[2].parse()?;
    let node = a.get(3).map_or("n1", String::as_str);
    let mut log = AuditLog::open(&a[1])?.with_fsync(false);
    let t0 = chrono::Utc::now() - chrono::Duration::hours(1);
    for i in 0..n {
        let mut r = Record::new(
            "bench",
            node,
            "acme1",
            1001,
            Event::JobEnd,
            Outcome::Success,
            "tenancy-epilog",
        )
        .job_id(7_000_000 + i)
        .tenant("acme")
        .tier("internal")
        .profile("1g.18gb")
        .compute_slices(1)
        .gpu("GPU-6a1f3c2e-0b7d-4f51-9a36-2c8e1d4b7f90")
        .started(t0)
        .resource(Resource::new(
            "mig",
            ResourceAction::Removed,
            "gpu0/gi9/ci0",
        ))
        .resource(Resource::new(
            "scratch",
            ResourceAction::Removed,
            "/scratch/acme/job_7000000",
        ))
        .duration(std::time::Duration::from_micros(1800));
        log.append(&mut r)?;
    }
    Ok(())
}
