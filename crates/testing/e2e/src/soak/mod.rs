//! The soak: thousands of jobs of several tenants on the multi-node cluster while Slurm's
//! daemons, the prologs and epilogs and whole nodes fail at random times; then the harness
//! checks what both promises say (Slurm's: a failed prolog drains and requeues, nothing is
//! lost; the product's: nothing outlives its job, every job is isolated or refused with a
//! record, the audit log holds). `scripts/soak` runs it at size (src/bin/tenancy-soak.rs), the
//! test `soak_under_faults_leaks_nothing` (tests/soak.rs) at CI size.
//!
//! One thread drives it all, in rounds: top the queue up with random jobs ([`workload`]), act
//! on the jobs that wait for it (scancel in the prolog, requeue), inject the fault that is due
//! ([`faults`]), note and resume drained nodes, start the reconcile timer's runs that are due
//! ([`sweep`]). At the end [`checks`] looks at every node.

pub mod checks;
pub mod faults;
pub mod sweep;
pub mod workload;

use crate::{MultiNode, TestUser};
use anyhow::Result;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use checks::Checks;
pub use faults::{Drain, Fault, FaultKind};
pub use workload::{JobKind, Submitted};

/// The QOS whose jobs preempt (requeue) the others' (`Preempt=normal`).
pub const PREEMPTING_QOS: &str = "soakhigh";

/// H200s on each node of the soak's cluster (the NVML stand-in's).
pub const GPUS_PER_NODE: usize = 2;

/// How the soak's nodes carve each H200 (`[mig.plan]`): every slot a typed GPU GRES record of
/// slurmctld's (GRES slot mode, layers/mig/README.md), so Slurm hands out only slices that fit
/// the GPU as carved and the prolog makes exactly the slot Slurm picked. In plan_slots' order
/// (largest first), which is the gres.conf and `Gres=` order.
pub const MIG_PLAN: [(&str, u32); 3] = [("3g.71gb", 1), ("2g.35gb", 1), ("1g.18gb", 2)];

/// The MIG profiles each tier may ask for (internal: acme; regulated: globex, whose MIG jobs
/// get a node of their own, `gpu_placement = "node"`; research: initech).
pub const TIER_MIG: [(&str, &[&str]); 3] = [
    ("internal", &["1g.18gb", "2g.35gb", "3g.71gb"]),
    ("regulated", &["2g.35gb", "3g.71gb"]),
    ("research", &["1g.18gb", "2g.35gb"]),
];

/// The MIG profiles of `tier` ([`TIER_MIG`]).
pub fn tier_mig(tier: &str) -> Vec<String> {
    TIER_MIG
        .iter()
        .find(|(t, _)| *t == tier)
        .map(|(_, p)| p.iter().map(|p| p.to_string()).collect())
        .unwrap_or_default()
}

/// Slurm's GPU types on each node: [`MIG_PLAN`] times [`GPUS_PER_NODE`].
pub fn gpu_types() -> Vec<(String, u32)> {
    MIG_PLAN
        .iter()
        .map(|(p, n)| (p.to_string(), n * GPUS_PER_NODE as u32))
        .collect()
}

/// What one soak does.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Batch submissions (an array counts once; its elements are jobs of their own).
    pub jobs: usize,
    pub seed: u64,
    /// The soak stops submitting and acting at this bound, whatever is left.
    pub limit: Duration,
    /// Faults, one every `fault_every` on average (none when None).
    pub fault_every: Option<Duration>,
    /// Jobs pending or running at most (what the two nodes can start is less).
    pub queue: usize,
    /// Job durations, 0 to this many seconds.
    pub max_secs: u32,
    /// `tenancy-reconcile.timer` on every node, this often (the unit's 5 min, at the soak's
    /// pace; None: never, so every job's teardown must come from its epilog or a boot).
    pub sweep_every: Option<Duration>,
}

impl Default for Plan {
    fn default() -> Plan {
        Plan {
            jobs: 200,
            seed: 46,
            limit: Duration::from_secs(600),
            fault_every: Some(Duration::from_secs(20)),
            queue: 24,
            max_secs: 3,
            sweep_every: Some(Duration::from_secs(30)),
        }
    }
}

/// A user of the soak and the tenant it submits for.
#[derive(Clone)]
pub struct Submitter {
    pub user: TestUser,
    pub tenant: String,
    /// The MIG profiles its tenant's tier allows (none: no MIG jobs).
    pub mig_profiles: Vec<String>,
}

/// What a soak did and found.
pub struct Summary {
    pub plan: Plan,
    pub nodes: usize,
    pub elapsed: Duration,
    /// Submissions by kind.
    pub submitted: BTreeMap<&'static str, usize>,
    /// Jobs sbatch took with a MIG slice, by profile.
    pub mig_jobs: BTreeMap<String, usize>,
    /// Submissions refused by sbatch (a tenant the user is no member of), as they should.
    pub refused_at_submit: usize,
    /// Jobs held after a failed prolog, released by the soak (as an admin does).
    pub released: usize,
    pub faults: Vec<Fault>,
    /// Why the `audit_disk_full` fault was skipped (no loop device), if it was.
    pub disk_full_skipped: Option<String>,
    pub drains: Vec<Drain>,
    /// Runs of the reconcile timer's command on a node, and how long each took.
    pub sweeps: usize,
    pub sweep_ms: Vec<u64>,
    /// The first and last submission (seconds since the epoch).
    pub submitting: Option<(f64, f64)>,
    pub checks: Checks,
}

impl Summary {
    /// Jobs that started (a `job_start` on some node) per minute per node while the soak kept
    /// the queue full (first to last submission): the rate the cluster sustains.
    pub fn jobs_per_minute_per_node(&self) -> f64 {
        let Some((first, last)) = self.submitting else {
            return 0.0;
        };
        let started = self
            .checks
            .first_starts
            .iter()
            .filter(|t| **t <= last)
            .count() as f64;
        started / ((last - first) / 60.0).max(1e-9) / self.nodes as f64
    }

    /// Jobs that started per minute per node over the whole soak, its tail included (the last
    /// requeued jobs waiting to start again).
    pub fn jobs_per_minute_per_node_overall(&self) -> f64 {
        let started = *self.checks.counts.get("jobs started").unwrap_or(&0) as f64;
        started / (self.elapsed.as_secs_f64() / 60.0).max(1e-9) / self.nodes as f64
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = &self.plan;
        writeln!(f, "soak summary")?;
        writeln!(
            f,
            "  plan: {} submissions, seed {}, {} nodes, fault every {:?}, limit {:?}",
            p.jobs, p.seed, self.nodes, p.fault_every, p.limit
        )?;
        writeln!(f, "  elapsed: {:.0} s", self.elapsed.as_secs_f64())?;
        writeln!(
            f,
            "  jobs per minute per node sustained: {:.1} (while submitting, {:.0} s; {:.1} over \
             the whole soak)",
            self.jobs_per_minute_per_node(),
            self.submitting.map_or(0.0, |(a, b)| b - a),
            self.jobs_per_minute_per_node_overall()
        )?;
        for (what, pct) in [
            ("prolog", &self.checks.prolog_us),
            ("  of MIG jobs", &self.checks.prolog_mig_us),
            ("  of CPU-only jobs", &self.checks.prolog_cpu_us),
            ("epilog", &self.checks.epilog_us),
            ("  of MIG jobs", &self.checks.epilog_mig_us),
            ("  of CPU-only jobs", &self.checks.epilog_cpu_us),
        ] {
            writeln!(
                f,
                "  {what} to its record: p50 {:.2} ms, p99 {:.2} ms ({} records)",
                checks::percentile(pct, 50.0) as f64 / 1000.0,
                checks::percentile(pct, 99.0) as f64 / 1000.0,
                pct.len()
            )?;
        }
        let kinds: Vec<String> = self
            .submitted
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        writeln!(f, "  submitted: {}", kinds.join(", "))?;
        let profiles: Vec<String> = self
            .mig_jobs
            .iter()
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
        writeln!(
            f,
            "  jobs with a MIG slice: {} ({})",
            self.mig_jobs.values().sum::<usize>(),
            profiles.join(", ")
        )?;
        writeln!(f, "  refused at submit: {}", self.refused_at_submit)?;
        writeln!(f, "  held jobs released: {}", self.released)?;
        let mut by_kind: BTreeMap<String, (usize, usize)> = BTreeMap::new();
        for x in &self.faults {
            let e = by_kind.entry(x.kind.to_string()).or_default();
            e.0 += 1;
            e.1 += usize::from(x.hit);
        }
        let faults: Vec<String> = by_kind
            .iter()
            .map(|(k, (n, hit))| format!("{k} {n} ({hit} hit)"))
            .collect();
        writeln!(f, "  faults injected: {}", faults.join(", "))?;
        if let Some(why) = &self.disk_full_skipped {
            writeln!(f, "  audit_disk_full SKIPPED: {why}")?;
        }
        writeln!(
            f,
            "  reconcile timer runs: {} (p50 {} ms, max {} ms)",
            self.sweeps,
            checks::percentile(&self.sweep_ms, 50.0),
            self.sweep_ms.iter().max().copied().unwrap_or(0)
        )?;
        let attributed = self.drains.iter().filter(|d| d.cause.is_some()).count();
        writeln!(
            f,
            "  drains: {} ({} by an injected fault)",
            self.drains.len(),
            attributed
        )?;
        for d in &self.drains {
            writeln!(
                f,
                "    {} at {:.0} s: {:?}, cause {}",
                d.node,
                d.at_s,
                d.reason,
                d.cause.as_deref().unwrap_or("NONE")
            )?;
        }
        writeln!(f, "  checks:")?;
        for (what, n) in &self.checks.counts {
            writeln!(f, "    {what}: {n}")?;
        }
        if self.checks.failures.is_empty() {
            writeln!(f, "  result: every check held")
        } else {
            writeln!(
                f,
                "  result: {} check(s) failed:",
                self.checks.failures.len()
            )?;
            for x in &self.checks.failures {
                writeln!(f, "    - {x}")?;
            }
            for d in &self.checks.details {
                writeln!(f, "  looked into: {d}")?;
            }
            Ok(())
        }
    }
}

/// Runs a soak on `mn` with `submitters` (a user and its tenant each), then checks it.
pub fn run(mn: &mut MultiNode, plan: &Plan, submitters: &[Submitter]) -> Result<Summary> {
    let start = Instant::now();
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let mut work = workload::Workload::new(mn, plan, submitters)?;
    let mut faults = faults::Injector::new(plan, mn);
    let mut timer = sweep::Timer::new(plan, mn.nodes.len());
    let mut progress = Instant::now();
    while (work.submissions < plan.jobs || work.live > 0) && start.elapsed() < plan.limit {
        work.round(mn, &mut rng)?;
        faults.round(mn, &mut rng, start)?;
        timer.round(mn)?;
        if progress.elapsed() >= Duration::from_secs(30) {
            // On stderr: a soak of hours says where it is.
            eprintln!(
                "soak: {:.0} s, {}/{} submitted, queue {:?}, {} faults",
                start.elapsed().as_secs_f64(),
                work.submissions,
                plan.jobs,
                work.queue_now,
                faults.faults.len()
            );
            progress = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    timer.finish();
    let mut drains = faults.take_drains();
    let elapsed = start.elapsed();
    drains.extend(faults::settle(mn, &faults.faults, start)?);
    let checks = checks::run(mn, &work, &faults.faults, &drains)?;
    Ok(Summary {
        plan: plan.clone(),
        nodes: mn.nodes.len(),
        elapsed,
        submitted: work.by_kind(),
        mig_jobs: work.by_profile(),
        refused_at_submit: work.refused_at_submit,
        released: work.released,
        faults: faults.faults,
        disk_full_skipped: faults.disk_full_skipped,
        drains,
        sweeps: timer.runs,
        sweep_ms: timer.durations_ms,
        submitting: work.submitting,
        checks,
    })
}

/// The soak's cluster: the multi-node cluster with three tenants of three tiers (acme
/// internal, globex regulated, initech research; initech's group and user made here), Slurm
/// keeping every finished job for the checks (`MinJobAge`), each node's audit log on a file
/// system of its own (for `audit_disk_full`), and `options`' own changes.
/// Returns it with one submitter per tenant.
pub fn cluster(
    users: &mut crate::Users,
    options: crate::Options,
) -> Result<(MultiNode, Vec<Submitter>)> {
    let tag = std::process::id() % 100_000;
    let group = format!("initech{tag}");
    users.group(&group)?;
    let initech = users.user(&format!("initech1x{tag}"), &[&group])?;
    let g = group.clone();
    // Eight CPUs a node: the jobs mostly sleep, and more of them at once is more load on
    // the job path and Slurm's daemons than the machine's cores would give.
    let options = options
        .cpus(8)
        // 256 MB, sparse: a soak of 5000 jobs writes some 30 MB of records a node.
        .audit_disk(256)
        .slurm_conf("MinJobAge=86400")
        // A requeued job waits out the credential lifetime before it starts again (120 s by
        // default): 20 s keeps requeues in the soak's pace.
        .slurm_conf("AuthInfo=cred_expire=20")
        .slurm_conf("MaxJobCount=100000")
        // Slurm's accounting (the books `report --compare-sacct` holds the audit logs against)
        // and preemption by QOS: a job of QOS `soakhigh` requeues the `normal` jobs in its way.
        // The MIG slots as typed GPU GRES (accounted too), on GPUS_PER_NODE H200s a node.
        .accounting(crate::Accounting {
            gpu_types: gpu_types(),
        })
        .node_gpus(GPUS_PER_NODE)
        .slurm_conf("PreemptType=preempt/qos")
        .slurm_conf("PreemptMode=REQUEUE")
        // The audit collector (rsyslog over TLS) and each node's forwarder.
        .collector()
        .config(move |c: &mut crate::TenancyToml| {
            c.tier("internal").share_node(true).share_gpu(true);
            c.tier("regulated").share_node(true).share_gpu(false);
            for (tier, profiles) in TIER_MIG {
                c.tier(tier).mig_profiles(profiles.iter().copied());
            }
            let mut plan = c.mig_plan("H200-141GB");
            for (profile, n) in MIG_PLAN {
                plan = plan.instances(profile, n);
            }
            c.tenant("acme").tier("internal");
            c.tenant("globex").tier("regulated");
            c.tenant("initech")
                .tier("research")
                .groups([&g])
                .accounts(["initech"])
                .egress(Vec::<String>::new())
                .address_prefix("10.231.3.0/24");
        });
    let mn = MultiNode::start(users, &options)?;
    // Slurm's slots are the plan's, in its order (the record index Slurm hands the prolog is
    // the slot the prolog makes): the Gres= value the product derives from the plan and the
    // node's GPUs is the one slurm.conf has.
    let gres = crate::Accounting {
        gpu_types: gpu_types(),
    }
    .node_gres();
    for i in 0..mn.nodes.len() {
        let name = mn.nodes[i].name.clone();
        let o = mn.tenancyctl(i, &["mig", "slurm-lines", "--node", &name])?;
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        anyhow::ensure!(
            o.status.success() && out.lines().any(|l| l.ends_with(gres.trim())),
            "tenancyctl mig slurm-lines on {name} does not give{gres}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let mut q = mn.cmd("sacctmgr");
    q.args([
        "-i",
        "add",
        "qos",
        PREEMPTING_QOS,
        "set",
        "Preempt=normal",
        "PreemptMode=requeue",
    ]);
    let o = mn.run(q)?;
    anyhow::ensure!(
        o.status.success(),
        "sacctmgr add qos {PREEMPTING_QOS}: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let submitters = vec![
        Submitter {
            user: mn.tenants.acme1.clone(),
            tenant: "acme".into(),
            mig_profiles: tier_mig("internal"),
        },
        Submitter {
            user: mn.tenants.globex1.clone(),
            tenant: "globex".into(),
            mig_profiles: tier_mig("regulated"),
        },
        Submitter {
            user: initech,
            tenant: "initech".into(),
            mig_profiles: tier_mig("research"),
        },
    ];
    Ok((mn, submitters))
}
