//! Seeded generator of realistic per-node audit logs plus the ground truth it generated: the
//! report tests of the accounting crate (and tenancyctl's of `report`) and its benchmark
//! example; and a small log of known records for the chain's tests (feature `audit-logs`).

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use std::io::Write;
use std::path::{Path, PathBuf};
use tenancy_audit_log::{AuditLog, Event, Outcome, Record, Resource, ResourceAction, GENESIS};

pub const TENANTS: [&str; 5] = ["acme", "globex", "initech", "umbrella", "hooli"];
pub const PROFILES: [(&str, u32); 4] = [
    ("1g.18gb", 1),
    ("2g.35gb", 2),
    ("3g.71gb", 3),
    ("7g.141gb", 7),
];
pub const TIERS: [&str; 2] = ["gold", "standard"];

/// What happened, independent of how it is logged.
#[derive(Debug, Clone)]
pub enum Truth {
    Job {
        tenant: String,
        user: String,
        node: String,
        profile: String,
        slices: u32,
        start: DateTime<Utc>,
        end: Option<DateTime<Utc>>,
        drops: u64,
    },
    Denied {
        tenant: String,
        time: DateTime<Utc>,
    },
    Rollback {
        tenant: String,
        time: DateTime<Utc>,
    },
    TeardownFailed {
        tenant: String,
        time: DateTime<Utc>,
    },
}

struct Open {
    job_id: u64,
    tenant: usize,
    user: String,
    uid: u32,
    profile: usize,
    start: DateTime<Utc>,
}

/// Writes `records_per_node` records per node for `nodes` nodes. `sink(node_index, line)` gets
/// each sealed line (chained per node); `truth` gets the ground truth.
pub fn generate(
    seed: u64,
    nodes: usize,
    records_per_node: usize,
    base: DateTime<Utc>,
    mut sink: impl FnMut(usize, &[u8]),
    mut truth: impl FnMut(Truth),
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut job_id = 1000u64;
    for n in 0..nodes {
        let mut log = NodeLog {
            n,
            node: format!("gpu{n:03}"),
            seq: 0,
            prev: GENESIS.to_string(),
            clock: base + TimeDelta::milliseconds(rng.i64(0..3_600_000)),
            open: Vec::new(),
            sink: &mut sink,
            truth: &mut truth,
        };
        while (log.seq as usize) < records_per_node {
            log.clock += TimeDelta::milliseconds(rng.i64(1..7_200_000));
            let roll = rng.u32(0..100);
            if !log.open.is_empty() && (log.open.len() >= 4 || roll < 45) {
                log.end_job(&mut rng, records_per_node);
                continue;
            }
            job_id += 1;
            log.start_job(&mut rng, job_id);
        }
        log.still_open();
    }
}

/// One node's log as it is written: its chain, its clock and its open jobs.
struct NodeLog<'a> {
    n: usize,
    node: String,
    seq: u64,
    prev: String,
    clock: DateTime<Utc>,
    open: Vec<Open>,
    sink: &'a mut dyn FnMut(usize, &[u8]),
    truth: &'a mut dyn FnMut(Truth),
}

impl NodeLog<'_> {
    /// Seals `rec` into the node's chain and hands the line to the sink.
    fn emit(&mut self, rec: &mut Record) {
        self.seq += 1;
        let line = rec.seal(self.seq, &self.prev).expect("serialize");
        self.prev = rec.hash.clone();
        (self.sink)(self.n, &line);
    }

    /// A record of the node, now.
    fn record(
        &self,
        user: &str,
        uid: u32,
        event: Event,
        outcome: Outcome,
        program: &str,
    ) -> Record {
        Record::new("c1", &self.node, user, uid, event, outcome, program).time(self.clock)
    }

    /// Ends a random open job (job_end), its teardown failing now and then.
    fn end_job(&mut self, rng: &mut fastrand::Rng, records_per_node: usize) {
        let j = self.open.swap_remove(rng.usize(0..self.open.len()));
        let (pname, slices) = PROFILES[j.profile];
        let drops = if rng.bool() { rng.u64(0..1000) } else { 0 };
        let mut r = self
            .record(
                &j.user,
                j.uid,
                Event::JobEnd,
                Outcome::Success,
                "tenancy-epilog",
            )
            .job_id(j.job_id)
            .tenant(TENANTS[j.tenant])
            .tier(TIERS[j.tenant % 2])
            .resource(Resource::new(
                "mig",
                ResourceAction::Removed,
                format!("gi-{}", j.job_id),
            ));
        // 75 %: job_end carries started/profile/slices; else the report must pair.
        if rng.u32(0..4) != 0 {
            r = r.started(j.start).profile(pname).compute_slices(slices);
        }
        if drops > 0 {
            r = r.firewall_drops(drops);
        }
        self.emit(&mut r);
        (self.truth)(Truth::Job {
            tenant: TENANTS[j.tenant].into(),
            user: j.user.clone(),
            node: self.node.clone(),
            profile: pname.into(),
            slices,
            start: trunc(j.start),
            end: Some(trunc(self.clock)),
            drops,
        });
        if rng.u32(0..50) == 0 && (self.seq as usize) < records_per_node {
            let mut r = self
                .record(
                    &j.user,
                    j.uid,
                    Event::TeardownFailed,
                    Outcome::Failure,
                    "tenancy-epilog",
                )
                .job_id(j.job_id)
                .tenant(TENANTS[j.tenant])
                .reason("nft table busy")
                .resource(
                    Resource::new("network", ResourceAction::Failed, "tenancy-job")
                        .detail("errno", 16),
                );
            self.emit(&mut r);
            (self.truth)(Truth::TeardownFailed {
                tenant: TENANTS[j.tenant].into(),
                time: trunc(self.clock),
            });
        }
    }

    /// A new job `job_id`: refused (8 %), rolled back (4 %), or started and left open.
    fn start_job(&mut self, rng: &mut fastrand::Rng, job_id: u64) {
        let tenant = rng.usize(0..TENANTS.len());
        let uid = 2000 + rng.u32(0..40);
        let user = format!("u{uid}");
        let profile = rng.usize(0..PROFILES.len());
        let (pname, slices) = PROFILES[profile];
        let kind = rng.u32(0..100);
        let prolog = |event, outcome| {
            self.record(&user, uid, event, outcome, "tenancy-prolog")
                .job_id(job_id)
                .tenant(TENANTS[tenant])
        };
        if kind < 8 {
            let mut r = prolog(Event::JobDenied, Outcome::Denied)
                .profile(pname)
                .reason("quota exceeded");
            self.emit(&mut r);
            (self.truth)(Truth::Denied {
                tenant: TENANTS[tenant].into(),
                time: trunc(self.clock),
            });
        } else if kind < 12 {
            let mut r = prolog(Event::Rollback, Outcome::Success)
                .reason("nft: failed to add rule")
                .resource(Resource::new(
                    "mig",
                    ResourceAction::Removed,
                    format!("gi-{job_id}"),
                ));
            self.emit(&mut r);
            (self.truth)(Truth::Rollback {
                tenant: TENANTS[tenant].into(),
                time: trunc(self.clock),
            });
        } else {
            let mut r = prolog(Event::JobStart, Outcome::Success)
                .tier(TIERS[tenant % 2])
                .profile(pname)
                .compute_slices(slices)
                .gpu("GPU-3f1c2b9e-0000-4000-8000-00000000000a")
                .resource(
                    Resource::new("mig", ResourceAction::Made, format!("gi-{job_id}"))
                        .detail("profile", pname),
                )
                .resource(Resource::new(
                    "devices",
                    ResourceAction::Made,
                    format!("/sys/fs/cgroup/job_{job_id}"),
                ))
                .resource(Resource::new(
                    "scratch",
                    ResourceAction::Made,
                    format!("/scratch/{}/{job_id}", TENANTS[tenant]),
                ))
                .resource(Resource::new(
                    "network",
                    ResourceAction::Made,
                    format!("tenancy-{job_id}"),
                ));
            self.emit(&mut r);
            self.open.push(Open {
                job_id,
                tenant,
                user: user.clone(),
                uid,
                profile,
                start: self.clock,
            });
        }
    }

    /// The ground truth of the jobs still running at the end of the log.
    fn still_open(self) {
        for j in self.open {
            let (pname, slices) = PROFILES[j.profile];
            (self.truth)(Truth::Job {
                tenant: TENANTS[j.tenant].into(),
                user: j.user,
                node: self.node.clone(),
                profile: pname.into(),
                slices,
                start: trunc(j.start),
                end: None,
                drops: 0,
            });
        }
    }
}

pub fn trunc(t: DateTime<Utc>) -> DateTime<Utc> {
    use chrono::DurationRound;
    t.duration_trunc(TimeDelta::milliseconds(1)).unwrap()
}

/// [`generate`] into one file per node in `dir` (`gpu000.audit.jsonl`, ...), from
/// 2026-10-25T00:00Z; the ground truth.
pub fn write_logs(dir: &Path, seed: u64, nodes: usize, per_node: usize) -> Vec<Truth> {
    let mut files: Vec<std::io::BufWriter<std::fs::File>> = (0..nodes)
        .map(|n| {
            std::io::BufWriter::new(
                std::fs::File::create(dir.join(format!("gpu{n:03}.audit.jsonl"))).unwrap(),
            )
        })
        .collect();
    let mut truths = Vec::new();
    let base = Utc.with_ymd_and_hms(2026, 10, 25, 0, 0, 0).unwrap();
    generate(
        seed,
        nodes,
        per_node,
        base,
        |n, l| files[n].write_all(l).unwrap(),
        |t| truths.push(t),
    );
    for f in &mut files {
        f.flush().unwrap();
    }
    truths
}

/// A record of job `job` by alice (uid 2001) of cluster c1 on node gpu001, its other fields to
/// be added.
pub fn record(event: Event, outcome: Outcome, origin: &str, job: u64) -> Record {
    Record::new("c1", "gpu001", "alice", 2001, event, outcome, origin).job_id(job)
}

/// Job `i`'s `job_start` as the prolog writes it, with every kind of field the chain hashes: a
/// tenant, a MIG slice, a resource, and a reason with a line break, quotes and non-ASCII.
pub fn job_start(i: u64) -> Record {
    record(Event::JobStart, Outcome::Success, "tenancy-prolog", i)
        .tenant("acme")
        .tier("gold")
        .profile("1g.18gb")
        .compute_slices(1)
        .gpu("GPU-3f1c2b9e-0000-4000-8000-00000000000a")
        .resource(Resource::new("mig", ResourceAction::Made, format!("gi-{i}")).detail("ci", 0))
        .reason("line\nbreak \"quoted\" ünïcode")
}

/// `dir`/gpu001.audit.jsonl with [`job_start`] 1 to `n` appended (without fsync), seq 1 to `n`.
pub fn make_log(dir: &Path, n: u64) -> PathBuf {
    let p = dir.join("gpu001.audit.jsonl");
    let mut log = AuditLog::open(&p).unwrap().with_fsync(false);
    for i in 1..=n {
        let a = log.append(&mut job_start(i)).unwrap();
        assert_eq!(a.seq, i);
    }
    p
}

/// The lines of a log.
pub fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Writes `l` as the lines of a log (a tampered copy).
pub fn write_lines(p: &Path, l: &[String]) {
    let mut s = l.join("\n");
    s.push('\n');
    std::fs::write(p, s).unwrap();
}
