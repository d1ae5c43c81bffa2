//! The soak's jobs: random tenants, sizes (one node or two), durations and `srun` steps,
//! arrays, jobs scancel'ed in their prolog, jobs requeued while they run, and submissions a
//! user may not make (refused by sbatch). A share of the jobs of every kind that runs
//! ([`MIG_PERCENT`]) asks for a MIG slice of a random profile its tenant's tier allows, on
//! each of its nodes (`--mig=P --gres=gpu:P:1`).

use super::{Plan, Submitter};
use crate::daemons::write_file;
use crate::MultiNode;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Of the jobs of the kinds a MIG slice fits (all but [`JobKind::Preempt`] and
/// [`JobKind::Refused`]), the percentage that asks for one.
pub const MIG_PERCENT: u32 = 25;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// A batch job that sleeps.
    Batch,
    /// A batch job with `srun` steps on its nodes.
    Steps,
    /// A job array of 2 to 4 elements.
    Array,
    /// scancel'ed as soon as the soak sees it start (Slurm shows it RUNNING while the prolog
    /// runs: the cancel lands in the prolog or soon after it).
    CancelInProlog,
    /// `scontrol requeue` while it runs: torn down and set up again.
    Requeue,
    /// Of QOS [`super::PREEMPTING_QOS`], both nodes whole: Slurm requeues the jobs in its way.
    Preempt,
    /// For a tenant its user is no member of: sbatch must refuse it.
    Refused,
}

impl JobKind {
    pub fn name(self) -> &'static str {
        match self {
            JobKind::Batch => "batch",
            JobKind::Steps => "steps",
            JobKind::Array => "array",
            JobKind::CancelInProlog => "cancel_in_prolog",
            JobKind::Requeue => "requeue",
            JobKind::Preempt => "preempt",
            JobKind::Refused => "refused",
        }
    }

    fn pick(rng: &mut fastrand::Rng) -> JobKind {
        match rng.u32(0..100) {
            0..=28 => JobKind::Batch,
            29..=34 => JobKind::Preempt,
            35..=59 => JobKind::Steps,
            60..=69 => JobKind::Array,
            70..=81 => JobKind::CancelInProlog,
            82..=93 => JobKind::Requeue,
            _ => JobKind::Refused,
        }
    }
}

/// A job the soak submitted.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub kind: JobKind,
    pub tenant: String,
    /// The MIG profile it asked for, one slice on each of its nodes.
    pub mig: Option<String>,
    /// Whether the soak did what the kind asks (scancel, requeue).
    pub acted: bool,
    /// The state the job was in when the soak acted on it.
    pub acted_in: Option<String>,
    /// When it acted (seconds since the epoch).
    pub acted_at: Option<f64>,
    /// When sbatch was run for it (seconds since the epoch).
    pub submitted_at: f64,
}

pub struct Workload {
    submitters: Vec<Submitter>,
    script: PathBuf,
    max_secs: u32,
    queue: usize,
    jobs_wanted: usize,
    pub submissions: usize,
    pub live: usize,
    pub refused_at_submit: usize,
    /// Jobs held after a failed prolog that the soak released (as an admin does).
    pub released: usize,
    /// Refused submissions sbatch took: each is a failure of the checks.
    pub wrongly_accepted: Vec<String>,
    pub jobs: BTreeMap<u64, Submitted>,
    kinds: Vec<JobKind>,
    /// The last round's queue: jobs by state (and pending reason).
    pub queue_now: BTreeMap<String, usize>,
    /// The first and last submission (seconds since the epoch): while the soak kept the
    /// queue full.
    pub submitting: Option<(f64, f64)>,
}

impl Workload {
    pub fn new(mn: &MultiNode, plan: &Plan, submitters: &[Submitter]) -> Result<Workload> {
        let script = mn.path("lib/soak.sh");
        write_file(&script, include_str!("../../scripts/jobs/soak.sh"), 0o755)?;
        Ok(Workload {
            submitters: submitters.to_vec(),
            script,
            max_secs: plan.max_secs,
            queue: plan.queue,
            jobs_wanted: plan.jobs,
            submissions: 0,
            live: 0,
            refused_at_submit: 0,
            released: 0,
            wrongly_accepted: Vec::new(),
            jobs: BTreeMap::new(),
            kinds: Vec::new(),
            queue_now: BTreeMap::new(),
            submitting: None,
        })
    }

    /// Submissions by kind.
    pub fn by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for k in &self.kinds {
            *m.entry(k.name()).or_default() += 1;
        }
        m
    }

    /// Jobs sbatch took that asked for a MIG slice, by profile.
    pub fn by_profile(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for p in self.jobs.values().filter_map(|j| j.mig.as_ref()) {
            *m.entry(p.clone()).or_default() += 1;
        }
        m
    }

    /// One round: the queue's states, the actions that are due, then new jobs up to the
    /// queue's size. A round while slurmctld is down does nothing.
    pub fn round(&mut self, mn: &MultiNode, rng: &mut fastrand::Rng) -> Result<()> {
        let Some(states) = queue_states(mn) else {
            return Ok(());
        };
        self.live = states.len();
        self.queue_now.clear();
        for (state, reason) in states.values() {
            let key = if state == "PENDING" {
                format!("PENDING ({reason})")
            } else {
                state.clone()
            };
            *self.queue_now.entry(key).or_default() += 1;
        }
        for (id, (state, reason)) in &states {
            // A job Slurm requeued and held for a failed prolog: the admin releases it.
            if state == "PENDING" && reason.contains("held") {
                let mut c = mn.cmd("scontrol");
                c.args(["release", &id.to_string()]);
                if mn.run(c).is_ok_and(|o| o.status.success()) {
                    self.released += 1;
                }
            }
            let Some(job) = self.jobs.get_mut(id) else {
                continue;
            };
            if job.acted {
                continue;
            }
            let act = match job.kind {
                JobKind::CancelInProlog => ["CONFIGURING", "RUNNING"].contains(&state.as_str()),
                JobKind::Requeue => *state == "RUNNING",
                _ => false,
            };
            if !act {
                continue;
            }
            let (program, args): (&str, Vec<String>) = match job.kind {
                JobKind::CancelInProlog => ("scancel", vec![id.to_string()]),
                _ => ("scontrol", vec!["requeue".into(), id.to_string()]),
            };
            let mut c = mn.cmd(program);
            c.args(&args);
            if mn.run(c).is_ok_and(|o| o.status.success()) {
                job.acted = true;
                job.acted_in = Some(state.clone());
                job.acted_at = Some(super::faults::epoch_now());
            }
        }
        let mut live = states.len();
        while self.submissions < self.jobs_wanted && live < self.queue {
            self.submit(mn, rng)?;
            live += 1;
        }
        Ok(())
    }

    fn submit(&mut self, mn: &MultiNode, rng: &mut fastrand::Rng) -> Result<()> {
        let kind = JobKind::pick(rng);
        let who = &self.submitters[rng.usize(0..self.submitters.len())];
        let tenant = if kind == JobKind::Refused {
            // A tenant of another submitter's that this user is no member of.
            let others: Vec<&Submitter> = self
                .submitters
                .iter()
                .filter(|s| s.tenant != who.tenant && !member_of_tenant(&who.user, s))
                .collect();
            match others.first() {
                Some(o) => o.tenant.clone(),
                None => return Ok(()),
            }
        } else {
            who.tenant.clone()
        };
        // A preempting job takes both nodes whole: some `normal` job is nearly always in its way.
        let nodes = if kind == JobKind::Preempt || rng.bool() {
            2
        } else {
            1
        };
        let secs = rng.u32(0..=self.max_secs);
        let steps = match kind {
            JobKind::Steps => rng.u32(1..=3),
            _ => 0,
        };
        let mig = match kind {
            JobKind::Preempt | JobKind::Refused => None,
            _ if who.mig_profiles.is_empty() || rng.u32(0..100) >= MIG_PERCENT => None,
            _ => Some(who.mig_profiles[rng.usize(0..who.mig_profiles.len())].clone()),
        };
        let mut c = mn.cmd_as(&who.user, "sbatch");
        c.arg(format!("-N{nodes}"))
            .args(["--ntasks-per-node=1", "-t", "5", "-o", "/dev/null"])
            .arg(format!("--job-name=soak-{}", kind.name()))
            .arg(format!("--tenant={tenant}"));
        match kind {
            JobKind::Requeue => {
                c.arg("--requeue");
            }
            JobKind::Array => {
                c.arg(format!("--array=0-{}", rng.u32(1..=3)));
            }
            JobKind::Preempt => {
                c.arg(format!("--qos={}", super::PREEMPTING_QOS))
                    .arg("--exclusive");
            }
            _ => {}
        }
        if let Some(p) = &mig {
            c.arg(format!("--mig={p}")).arg(format!("--gres=gpu:{p}:1"));
        }
        c.arg(&self.script)
            .arg(secs.to_string())
            .arg(steps.to_string());
        self.submissions += 1;
        self.kinds.push(kind);
        let now = super::faults::epoch_now();
        self.submitting = Some((self.submitting.map_or(now, |(first, _)| first), now));
        let submitted_at = super::faults::epoch_now();
        let o = mn.run(c)?;
        if kind == JobKind::Refused {
            if o.status.success() {
                self.wrongly_accepted.push(format!(
                    "{} submitted for tenant {tenant} and sbatch took it: {}",
                    who.user.name,
                    String::from_utf8_lossy(&o.stdout).trim()
                ));
            } else {
                self.refused_at_submit += 1;
            }
            return Ok(());
        }
        // sbatch may fail while slurmctld restarts: that submission is lost, and counted.
        if let Ok(id) = crate::submitted_id(&o) {
            self.jobs.insert(
                id,
                Submitted {
                    kind,
                    tenant,
                    mig,
                    acted: false,
                    acted_in: None,
                    acted_at: None,
                    submitted_at,
                },
            );
        }
        Ok(())
    }
}

/// Whether `user` is in a group of `other`'s tenant (the groups of its user but its own).
fn member_of_tenant(user: &crate::TestUser, other: &Submitter) -> bool {
    other
        .user
        .gids
        .iter()
        .filter(|g| **g != other.user.gid)
        .any(|g| user.gids.contains(g))
}

/// `squeue`'s jobs with their states and reasons (array elements by their own ids), or None
/// when slurmctld does not answer.
fn queue_states(mn: &MultiNode) -> Option<BTreeMap<u64, (String, String)>> {
    let mut c = mn.cmd("squeue");
    c.args(["-h", "-o", "%A %T %r"]);
    let o = mn.run(c).ok().filter(|o| o.status.success())?;
    let mut out = BTreeMap::new();
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let mut w = l.splitn(3, ' ');
        let (Some(id), Some(st)) = (w.next(), w.next()) else {
            continue;
        };
        let Ok(id) = id.trim().parse() else { continue };
        let reason = w.next().unwrap_or_default().to_lowercase();
        out.insert(id, (st.trim().to_string(), reason));
    }
    Some(out)
}
