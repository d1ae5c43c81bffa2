//! Append latency: full append (flock, tail read, hash, one write, fsync) with and without
//! fsync, side by side with a baseline that only write(2)s a prepared line (+ fsync).
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

use criterion::{criterion_group, criterion_main, Criterion};
use tenancy_audit_log::{AuditLog, Event, Outcome, Record, Resource, ResourceAction};
use tenancy_test_support::audit_logs::record;

fn rec() -> Record {
    record(Event::JobStart, Outcome::Success, "tenancy-prolog", 123456)
        .tenant("acme")
        .tier("gold")
        .profile("1g.18gb")
        .compute_slices(1)
        .gpu("GPU-3f1c2b9e-0000-4000-8000-00000000000a")
        .resource(Resource::new("mig", ResourceAction::Made, "gi-3").detail("ci", 0))
        .resource(Resource::new(
            "devices",
            ResourceAction::Made,
            "/sys/fs/cgroup/job_123456",
        ))
        .resource(Resource::new(
            "scratch",
            ResourceAction::Made,
            "/scratch/acme/123456",
        ))
        .resource(Resource::new(
            "network",
            ResourceAction::Made,
            "tenancy-123456",
        ))
}

fn bench(c: &mut Criterion) {
    // on the real disk, not tmpfs, so fsync costs what it costs
    let dir =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into()))
            .unwrap();
    let mut g = c.benchmark_group("append");
    for fsync in [false, true] {
        let p = dir.path().join(format!("log-{fsync}.jsonl"));
        let mut log = AuditLog::open(&p).unwrap().with_fsync(fsync);
        let name = if fsync {
            "audit_append_fsync"
        } else {
            "audit_append_nofsync"
        };
        g.bench_function(name, |b| b.iter(|| log.append(&mut rec()).unwrap()));
        // baseline: one prepared line, plain O_APPEND write (no lock, no head read, no hash)
        let mut r = rec();
        let line = r.seal(1, tenancy_audit_log::GENESIS).unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o640)
            .open(dir.path().join(format!("raw-{fsync}.jsonl")))
            .unwrap();
        let name = if fsync {
            "baseline_write_fsync"
        } else {
            "baseline_write_nofsync"
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                f.write_all(&line).unwrap();
                if fsync {
                    f.sync_data().unwrap();
                }
            })
        });
    }
    g.finish();
}

/// What an anchor costs the epilog: sent to a syslog socket that is not there (as on a node
/// without one) and appended to an anchor file (with its fsync), without and with the key
/// (the key file read on every anchor, as the epilog does, and the HMAC).
fn anchor(c: &mut Criterion) {
    use std::os::unix::fs::PermissionsExt;
    let dir =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into()))
            .unwrap();
    let key = dir.path().join("anchor.key");
    std::fs::write(&key, [9u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (sock, file) = (dir.path().join("no-log"), dir.path().join("anchors"));
    let hash = "a".repeat(64);
    let mut g = c.benchmark_group("anchor");
    g.bench_function("anchor_without_key", |b| {
        b.iter(|| tenancy_audit_log::send_anchor_to(&sock, "gpu001", 7, &hash, Some(&file), None))
    });
    g.bench_function("anchor_with_key", |b| {
        b.iter(|| {
            let k = tenancy_audit_log::AnchorKey::load(&key).unwrap();
            tenancy_audit_log::send_anchor_to(&sock, "gpu001", 7, &hash, Some(&file), Some(&k))
        })
    });
    g.bench_function("key_load_and_mac", |b| {
        b.iter(|| {
            let k = tenancy_audit_log::AnchorKey::load(&key).unwrap();
            k.mac(&tenancy_audit_log::anchor_line("gpu001", 7, &hash))
        })
    });
    g.finish();
}

criterion_group!(benches, bench, anchor);
criterion_main!(benches);
