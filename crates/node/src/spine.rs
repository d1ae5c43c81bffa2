//! The spine of the job path: the prolog re-checks the job, then runs the layers in order,
//! journaling each intent before it is made; a failure undoes what was made, in reverse, and
//! fails closed. The epilog undoes in reverse from the journal. Both append audit records.

use crate::layer::{AuditSummary, JobPlan, Layer, LayerError};
use crate::layers::network;
use chrono::Utc;
use serde_json::Value;
use tenancy_audit_log::{Event, Outcome, Record, Resource, ResourceAction};
use tenancy_config::{group_gid, Config, Identity, Refusal};
use tenancy_job::context::{EnvError, JobContext};
use tenancy_job::contract::Facing;
use tenancy_job::intent_log::Flushing;
use tenancy_job::journal::{Journal, JournalDir, NodeLock, Occupant, Step, StepState, VERSION};

/// How a prolog or epilog run ended; the binary prints `message` and exits with `code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub code: i32,
    pub message: String,
}

impl Ending {
    fn ok(message: String) -> Ending {
        Ending { code: 0, message }
    }
    fn fail(message: String) -> Ending {
        Ending { code: 1, message }
    }
}

/// The node-side runtime: config, journals, audit log and the layers in job-start order.
pub struct Spine<'c> {
    pub config: &'c Config,
    pub journals: JournalDir,
    pub layers: Vec<Box<dyn Layer + 'c>>,
    /// `tenancy-prolog`, `tenancy-epilog`, `tenancyctl`: recorded as the audit origin.
    pub origin: &'static str,
    /// Called at each step boundary of the prolog, after the boundary is durable; crash tests
    /// kill the process here. `None` in the binaries.
    pub boundary_hook: Option<Box<dyn FnMut(Boundary)>>,
    /// Where a statically linked prolog or epilog sends a job it cannot run in this process:
    /// a layer that needs a shared library (`Layer::runs_here`), or (prolog) an identity that
    /// NSS modules may decide (`crate::linkage::identity_from_files`). The static
    /// tenancy-prolog and tenancy-epilog hand such jobs to the dynamically linked
    /// tenancy-prolog-dynamic. `None`: everything runs here, or fails.
    pub handoff: Option<Handoff>,
}

/// A dynamically linked program that runs the same prolog or epilog: `program args...`, with
/// this process's environment, in its place (exec).
#[derive(Debug, Clone)]
pub struct Handoff {
    /// The program's file name, in the folder of this process's own executable (found only
    /// when a job is handed off).
    pub sibling: String,
    pub args: Vec<String>,
    /// Environment changes: (name, new value), `None` removes the variable.
    pub env: Vec<(String, Option<String>)>,
}

/// Set in a handed-off program's environment. A process started that way never hands a job
/// on: were a statically linked file installed under the dynamic build's name, each would
/// otherwise exec the next forever.
pub const HANDED_OFF: &str = "TENANCY_HANDED_OFF";

impl Handoff {
    /// Replaces this process with the program; returns only when that failed: the program (as
    /// far as it was found) and why.
    pub fn exec(&self) -> (String, std::io::Error) {
        if std::env::var_os(HANDED_OFF).is_some() {
            return (
                self.sibling.clone(),
                std::io::Error::other(format!(
                    "this process was itself handed the job ({HANDED_OFF} is set), so the \
                     program installed as {} is not the dynamically linked build",
                    self.sibling
                )),
            );
        }
        match std::env::current_exe() {
            Ok(exe) => {
                let program = exe.with_file_name(&self.sibling);
                let mut command = std::process::Command::new(&program);
                command.args(&self.args).env(HANDED_OFF, "1");
                for (name, value) in &self.env {
                    match value {
                        Some(v) => command.env(name, v),
                        None => command.env_remove(name),
                    };
                }
                let e = std::os::unix::process::CommandExt::exec(&mut command);
                (program.display().to_string(), e)
            }
            Err(e) => (format!("{} (beside this program)", self.sibling), e),
        }
    }
}

/// A point of the prolog after which a crash must leave nothing the epilog cannot undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// An earlier attempt's journal was looked for (and torn down); the node lock is not
    /// taken yet.
    Checked,
    /// The layer's intent is journaled; nothing made yet.
    Intended(&'static str),
    /// The layer made its resource; the result is not journaled yet.
    Made(&'static str),
    /// The intents are on disk; the layer that comes next is the first whose resource
    /// outlives a restart. The layers before it acted while the intents were being written.
    IntentsOnDisk,
    /// Every layer is made and journaled; the job_start record is not written yet.
    AllMade,
}

/// The prolog's first step: the job's environment read and checked.
struct Checked {
    ctx: JobContext,
}

/// The job's plan: who, which tenant and tier, which profile (re-checked on the node).
struct Decided {
    ctx: JobContext,
    plan: JobPlan,
}

/// Every acting layer's intent journaled, under the node lock (held until the layers are made).
struct Intended {
    ctx: JobContext,
    plan: JobPlan,
    journal: Journal,
    _lock: NodeLock,
    /// The layers that act, in order (their steps are the journal's).
    acting: Vec<usize>,
    /// The write that takes the intents to the disk.
    on_disk: Flushing,
}

/// Every layer made, its result journaled.
struct Made {
    ctx: JobContext,
    plan: JobPlan,
    journal: Journal,
}

/// Why [`Spine::intend_all`] or [`Spine::make_intended`] made nothing or failed.
enum MakeFailure {
    /// A layer or the journal failed: what was made is rolled back.
    Layer(String),
    /// Another prolog of the same job holds the journal: nothing was made, nothing to undo.
    AnotherAttempt(String),
}

impl From<String> for MakeFailure {
    fn from(reason: String) -> Self {
        MakeFailure::Layer(reason)
    }
}

/// Why the prolog refused or failed: the text for slurmd's log and the audit reason.
struct Denial {
    event: Event,
    reason: String,
    /// The job's tenant, once the prolog verified it (never the one asked for alone).
    tenant: Option<String>,
}

impl<'c> Spine<'c> {
    pub fn new(
        config: &'c Config,
        layers: Vec<Box<dyn Layer + 'c>>,
        origin: &'static str,
    ) -> std::io::Result<Spine<'c>> {
        Ok(Spine {
            config,
            journals: JournalDir::open(&config.cluster.state_dir)?,
            layers,
            origin,
            boundary_hook: None,
            handoff: None,
        })
    }

    fn record(&self, user: &str, uid: u32, node: &str, event: Event, outcome: Outcome) -> Record {
        Record::new(
            self.config.cluster.name.clone(),
            node,
            user,
            uid,
            event,
            outcome,
            self.origin,
        )
    }

    /// Appends one audit record; the caller decides what a failure means (fail closed).
    pub fn audit(&self, rec: &mut Record) -> Result<tenancy_audit_log::Appended, String> {
        append_anchored(self.config, rec)
    }

    fn boundary(&mut self, b: Boundary) {
        if let Some(hook) = self.boundary_hook.as_mut() {
            hook(b);
        }
    }

    fn layer_index(&self, name: &str) -> Option<usize> {
        self.layers.iter().position(|l| l.name() == name)
    }

    // ---- prolog ------------------------------------------------------------------------

    /// Runs the prolog for the job described by `ctx`, in named steps: the job's environment
    /// is [`Checked`], its tenant, tier and profile [`Decided`] (an earlier attempt's journal
    /// torn down), every layer's intent journaled ([`Intended`], under the node lock), every
    /// layer [`Made`], and the job's start recorded. A step that refuses or fails ends the
    /// prolog with what it made rolled back.
    pub fn prolog(&mut self, ctx: Result<JobContext, EnvError>) -> Ending {
        let begun = std::time::Instant::now();
        let steps = self
            .check(ctx)
            .and_then(|checked| self.decide_plan(checked))
            .and_then(|decided| self.clear_earlier_attempt(decided))
            .and_then(|decided| self.intend_all(decided))
            .and_then(|intended| self.make_intended(intended))
            .map(|made| self.record_start(made, begun));
        match steps {
            Ok(ending) | Err(ending) => ending,
        }
    }

    /// The job's environment, or the denial of a bad one (recorded).
    fn check(&mut self, ctx: Result<JobContext, EnvError>) -> Result<Checked, Ending> {
        let ctx = match ctx {
            Ok(c) => c,
            Err(e) => {
                let job = e
                    .job_id
                    .map_or("unknown job".to_string(), |j| format!("job {j}"));
                let reason = format!("{job}: bad job environment: {e}");
                // The record goes into this node's chain: without SLURMD_NODENAME, name the
                // node as the kernel does (short host name), so `audit verify` keeps one node.
                let node = e.node.clone().unwrap_or_else(short_hostname);
                let mut rec = self.record(
                    e.user.as_deref().unwrap_or("unknown"),
                    e.uid.unwrap_or(u32::MAX),
                    &node,
                    Event::JobDenied,
                    Outcome::Denied,
                );
                if let Some(j) = e.job_id {
                    rec = rec.job_id(j);
                }
                rec = rec.reason(reason.clone());
                return Err(match self.audit(&mut rec) {
                    Ok(_) => Ending::fail(format!("tenancy: {reason}")),
                    Err(a) => Ending::fail(format!("tenancy: {reason}; and {a}")),
                });
            }
        };
        // A static prolog asks /etc/passwd and /etc/group only: on a node where other NSS
        // sources decide, every job goes to the dynamic build (`crate::linkage`).
        if self.handoff.is_some() {
            if let Err(why) = crate::linkage::identity_from_files() {
                return Err(self.hand_off_prolog(
                    &ctx,
                    Event::JobDenied,
                    format!("job {}: {why}", ctx.job_id),
                ));
            }
        }
        Ok(Checked { ctx })
    }

    /// The job's plan (tenant, tier, profile), or its denial; a statically linked prolog hands
    /// the job on when a layer that acts for it cannot run here.
    fn decide_plan(&mut self, Checked { ctx }: Checked) -> Result<Decided, Ending> {
        let plan = match self.decide(&ctx) {
            Ok(plan) => plan,
            // A user or group missing from the files may be in another NSS source: the
            // dynamic build decides with all of them (and records the denial if it stands).
            Err(d) if self.handoff.is_some() && d.event == Event::JobDenied => {
                return Err(self.hand_off_prolog(
                    &ctx,
                    d.event,
                    format!("{}, as far as /etc/passwd and /etc/group say", d.reason),
                ));
            }
            Err(d) => return Err(self.deny(&ctx, d)),
        };
        if self.handoff.is_some() {
            if let Some(li) = (0..self.layers.len())
                .find(|&li| !self.layers[li].runs_here() && self.layers[li].acts_for(&plan))
            {
                let why = format!(
                    "job {}: layer {} needs a shared library, which this statically linked \
                     prolog cannot load",
                    ctx.job_id,
                    self.layers[li].name()
                );
                return Err(self.hand_off_prolog(&ctx, Event::JobDenied, why));
            }
        }
        Ok(Decided { ctx, plan })
    }

    /// Tears down a journal left by a prolog that died (and whose epilog never ran): a
    /// requeued job must not inherit, or leak, an earlier attempt's resources.
    fn clear_earlier_attempt(&mut self, decided: Decided) -> Result<Decided, Ending> {
        let Decided { ctx, plan } = &decided;
        let stale = match self.journals.load(ctx.job_id) {
            Ok(stale) => stale,
            // Overwriting a journal that cannot be read would orphan what it records.
            Err(e) => {
                return Err(self.deny(
                    ctx,
                    Denial {
                        event: Event::TeardownFailed,
                        reason: format!(
                            "job {}: an earlier attempt's journal cannot be read: {e}; inspect it, \
                             then run `tenancyctl reconcile --apply` on {}",
                            ctx.job_id, ctx.node
                        ),
                        tenant: Some(plan.tenant.clone()),
                    },
                ))
            }
        };
        let Some(stale) = stale else {
            return Ok(decided);
        };
        if self.handoff.is_some() {
            if let Some(li) = self.needs_another_process(&stale) {
                let why = format!(
                    "job {}: an earlier attempt's {} must be torn down with a shared \
                     library, which this statically linked prolog cannot load",
                    ctx.job_id,
                    self.layers[li].name()
                );
                return Err(self.hand_off_prolog(ctx, Event::TeardownFailed, why));
            }
        }
        let failures = self.undo_all(stale, ctx);
        if !failures.is_empty() {
            return Err(self.deny(
                ctx,
                Denial {
                    event: Event::TeardownFailed,
                    reason: format!(
                        "job {}: an earlier attempt's resources could not be removed: {}; \
                         run `tenancyctl reconcile --apply` on {}",
                        ctx.job_id,
                        failures.join("; "),
                        ctx.node
                    ),
                    tenant: Some(plan.tenant.clone()),
                },
            ));
        }
        Ok(decided)
    }

    /// Ends the prolog after [`Spine::intend_all`] or [`Spine::make_intended`] failed.
    fn failed(
        &mut self,
        ctx: &JobContext,
        plan: &JobPlan,
        journal: Journal,
        f: MakeFailure,
    ) -> Ending {
        match f {
            MakeFailure::Layer(reason) => self.roll_back(ctx, plan, journal, reason),
            // Nothing was made, and the journal there is the other attempt's: a rollback would
            // remove it, and its resources with no record left.
            MakeFailure::AnotherAttempt(reason) => self.deny(
                ctx,
                Denial {
                    event: Event::JobDenied,
                    reason,
                    tenant: Some(plan.tenant.clone()),
                },
            ),
        }
    }

    /// Records the job's start; without its record no job runs: everything is undone.
    fn record_start(&mut self, made: Made, begun: std::time::Instant) -> Ending {
        let Made { ctx, plan, journal } = made;
        let mut rec = self
            .record(
                &ctx.user,
                ctx.uid,
                &ctx.node,
                Event::JobStart,
                Outcome::Success,
            )
            .job_id(ctx.job_id)
            .tenant(plan.tenant.clone())
            .tier(plan.tier.name.clone());
        rec.time = journal.started;
        self.describe(&mut rec, &journal, ResourceAction::Made);
        rec.duration_us = Some(begun.elapsed().as_micros() as u64);
        match self.audit(&mut rec) {
            Ok(_) => Ending::ok(format!(
                "tenancy: job {} runs for tenant {} (tier {}) with {} layer(s)",
                ctx.job_id,
                plan.tenant,
                plan.tier.name,
                journal.steps.len()
            )),
            // No job runs without its record: undo everything.
            Err(e) => self.roll_back(
                &ctx,
                &plan,
                journal,
                format!("job {}: layer audit: {e}", ctx.job_id),
            ),
        }
    }

    /// Re-checks everything the submit side claimed: identity, tenant, profile, tier rules.
    fn decide(&self, ctx: &JobContext) -> Result<JobPlan, Denial> {
        let deny = |reason: String| Denial {
            event: Event::JobDenied,
            reason: format!("job {}: {reason}", ctx.job_id),
            tenant: None,
        };
        let who = Identity::from_uid(ctx.uid).map_err(&deny)?;
        if who.user != ctx.user {
            return Err(deny(format!(
                "SLURM_JOB_USER '{}' does not match uid {} ('{}' in NSS)",
                ctx.user, ctx.uid, who.user
            )));
        }
        let resolved = self
            .config
            .resolve(
                &who,
                ctx.account.as_deref(),
                ctx.requested_tenant.as_deref(),
                ctx.requested_profile.as_deref(),
            )
            .map_err(|r: Refusal| deny(r.to_string()))?;
        let tenant = &self.config.tenants[&resolved.tenant];
        // Node pools: job_submit/tenancy keeps every job on the nodes its tenant may use;
        // this is the last line (a pool changed while the job was pending).
        if self.config.has_pools() {
            if let Some(why) = self.config.node_refusal(&tenant.name, &ctx.node) {
                return Err(deny(why));
            }
        }
        let tier = self.config.tier_of(tenant).clone();
        // Found while checking membership (a member's group exists); looked up again only if
        // it was not.
        let tenant_gid = resolved
            .tenant_gid
            .or_else(|| tenant.groups.iter().find_map(|g| group_gid(g)))
            .ok_or_else(|| {
                deny(format!(
                    "none of tenant '{}''s groups ({}) exists in NSS on this node",
                    tenant.name,
                    tenant.groups.join(", ")
                ))
            })?;
        Ok(JobPlan {
            job_id: ctx.job_id,
            uid: ctx.uid,
            gid: ctx.gid,
            user: ctx.user.clone(),
            node: ctx.node.clone(),
            tenant: resolved.tenant,
            tenant_gid,
            tier,
            profile: resolved.profile,
            gres_gpus: ctx.gres_gpus.clone(),
            others: Vec::new(),
        })
    }

    /// share_node: a tenant whose tier forbids sharing the node is alone on it, and nobody joins
    /// a node such a tenant holds. Decided under the node lock from the occupancy index.
    fn check_node_sharing(plan: &JobPlan) -> Result<(), String> {
        for other in &plan.others {
            if other.tenant == plan.tenant {
                continue;
            }
            if !plan.tier.share_node {
                return Err(format!(
                    "tier {} does not share nodes, and job {} of tenant '{}' runs on {}; \
                     submit with --exclusive or to a partition reserved for the tenant",
                    plan.tier.name, other.job_id, other.tenant, plan.node
                ));
            }
            if !other.share_node {
                return Err(format!(
                    "job {} of tenant '{}' (tier {}) holds node {} exclusively",
                    other.job_id, other.tenant, other.tier, plan.node
                ));
            }
        }
        Ok(())
    }

    /// Journals every layer's intent, under the node lock, before any layer makes anything.
    ///
    /// Every intent is journaled before the first layer makes anything, and on disk (through
    /// the intent log) before the first layer whose resource outlives a restart of the node
    /// acts. The layers whose resources a restart removes (MIG,
    /// devices, network) act while that write is under way: until a restart every process
    /// reads the journal from the page cache, and after one there is nothing of theirs to
    /// find. Results need no fsync: every layer can undo from its intent alone, so the last
    /// write only informs the task entry.
    fn intend_all(&mut self, decided: Decided) -> Result<Intended, Ending> {
        let Decided { ctx, mut plan } = decided;
        let mut journal = Journal {
            version: VERSION,
            job_id: ctx.job_id,
            cluster: self.config.cluster.name.clone(),
            node: ctx.node.clone(),
            user: ctx.user.clone(),
            uid: ctx.uid,
            gid: ctx.gid,
            tenant: plan.tenant.clone(),
            tier: plan.tier.name.clone(),
            profile: plan.profile.clone(),
            share_gpu: plan.tier.share_gpu,
            share_node: plan.tier.share_node,
            started: Utc::now(),
            steps: Vec::new(),
            intent_slot: None,
            boot_id: None,
        };
        self.boundary(Boundary::Checked);
        match self.journal_intents(&mut plan, &mut journal) {
            Ok((lock, acting, on_disk)) => Ok(Intended {
                ctx,
                plan,
                journal,
                _lock: lock,
                acting,
                on_disk,
            }),
            Err(f) => Err(self.failed(&ctx, &plan, journal, f)),
        }
    }

    /// [`Spine::intend_all`]'s work: the node lock, the layers' intents (journaled), which
    /// layers act, and the write that takes the intents to the disk.
    fn journal_intents(
        &mut self,
        plan: &mut JobPlan,
        journal: &mut Journal,
    ) -> Result<(NodeLock, Vec<usize>, Flushing), MakeFailure> {
        let job = plan.job_id;
        let lock = self.journals.lock_node().map_err(|e| {
            format!(
                "job {job}: cannot take the node lock in {}: {e}",
                self.journals.path().display()
            )
        })?;
        // Another prolog of this job (slurmd restarted, a prolog run by hand) may have made its
        // journal since this one looked for an earlier attempt's: writing ours over it would
        // leave what it records (a GPU instance) to no journal.
        match self.journals.load(job) {
            Ok(None) => {}
            Ok(Some(_)) => {
                return Err(MakeFailure::AnotherAttempt(format!(
                    "job {job}: another prolog of this job made its isolation on this node while \
                     this one started (journal {}); this one makes nothing. Check that Slurm \
                     runs one prolog per job (slurmd's log), then resume the node",
                    self.journals.journal_path(job).display()
                )))
            }
            Err(e) => {
                return Err(MakeFailure::AnotherAttempt(format!(
                    "job {job}: another prolog of this job wrote its journal while this one \
                     started, and it cannot be read: {e}; this one makes nothing. Inspect it, \
                     then run `tenancyctl reconcile --apply`"
                )))
            }
        }
        // Read once under the lock; the tier rules here and in the MIG layer use it.
        plan.others = self.journals.occupants(job).map_err(|e| {
            format!(
                "job {job}: layer node: cannot read the occupancy index in {}: {e}",
                self.journals.path().display()
            )
        })?;
        let plan = &*plan;
        Self::check_node_sharing(plan).map_err(|e| format!("job {job}: layer node: {e}"))?;
        let mut acting = Vec::new();
        for li in 0..self.layers.len() {
            let name = self.layers[li].name();
            match self.layers[li].intend(plan) {
                Ok(Some(intent)) => {
                    journal.steps.push(Step {
                        layer: name.to_string(),
                        state: StepState::Intended,
                        intent,
                        made: None,
                    });
                    acting.push(li);
                }
                Ok(None) => {}
                Err(LayerError(e)) => return Err(format!("job {job}: layer {name}: {e}").into()),
            }
        }
        let mut on_disk = Flushing::done();
        if !acting.is_empty() {
            on_disk = self.journals.save_intents(journal).map_err(|e| {
                format!(
                    "job {job}: cannot journal the intents of {} in {}: {e}",
                    self.layer_names(&acting),
                    self.journals.path().display()
                )
            })?;
        }
        Ok((lock, acting, on_disk))
    }

    /// Makes every intended layer in order (see [`Spine::intend_all`] for when each acts),
    /// then journals the results and the job's occupancy entry; the node lock is released
    /// after.
    fn make_intended(&mut self, intended: Intended) -> Result<Made, Ending> {
        let Intended {
            ctx,
            plan,
            mut journal,
            _lock,
            acting,
            mut on_disk,
        } = intended;
        let made = self.make_each(&plan, &mut journal, &acting, &mut on_disk);
        // A rollback takes the lock again.
        drop(_lock);
        match made {
            Ok(()) => Ok(Made { ctx, plan, journal }),
            Err(f) => Err(self.failed(&ctx, &plan, journal, f)),
        }
    }

    fn make_each(
        &mut self,
        plan: &JobPlan,
        journal: &mut Journal,
        acting: &[usize],
        on_disk: &mut Flushing,
    ) -> Result<(), MakeFailure> {
        let job = plan.job_id;
        // A later layer's `make` may read an earlier one's result from the journal.
        let first_step = journal.steps.len() - acting.len();
        for (k, &li) in acting.iter().enumerate() {
            let step = first_step + k;
            let name = self.layers[li].name();
            if self.layers[li].survives_restart() && on_disk.is_pending() {
                if let Err(e) = on_disk.wait() {
                    // Nothing made yet outlives a restart; the rollback undoes the rest.
                    journal.steps.truncate(step);
                    return Err(format!(
                        "job {job}: layer {name}: the intents did not reach the disk in {}: \
                         {e}; check that file system",
                        self.journals.path().display()
                    )
                    .into());
                }
                self.boundary(Boundary::IntentsOnDisk);
            }
            self.boundary(Boundary::Intended(name));
            let intent = journal.steps[step].intent.clone();
            let made = self.layers[li].make(&intent, journal).and_then(|mut made| {
                // What every task joins and gets, beside the layer's own result.
                if let Some(facing) = Facing::of(self.layers[li].task_entry(&made)?) {
                    facing.merge_into(&mut made);
                }
                Ok(made)
            });
            match made {
                Ok(made) => {
                    self.boundary(Boundary::Made(name));
                    journal.steps[step].made = Some(made);
                    journal.steps[step].state = StepState::Made;
                }
                Err(LayerError(e)) => {
                    // Later intents were never acted on: nothing to undo.
                    journal.steps.truncate(step + 1);
                    return Err(format!("job {job}: layer {name}: {e}").into());
                }
            }
        }
        self.journals.save(journal, false).map_err(|e| {
            format!(
                "job {job}: cannot journal the result in {}: {e}",
                self.journals.path().display()
            )
        })?;
        self.journals
            .set_occupant(job, Some(Occupant::of(journal)))
            .map_err(|e| {
                format!(
                    "job {job}: cannot update the occupancy index in {}: {e}",
                    self.journals.path().display()
                )
            })?;
        self.boundary(Boundary::AllMade);
        Ok(())
    }

    fn layer_names(&self, idx: &[usize]) -> String {
        idx.iter()
            .map(|&i| self.layers[i].name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn roll_back(
        &mut self,
        ctx: &JobContext,
        plan: &JobPlan,
        journal: Journal,
        reason: String,
    ) -> Ending {
        let undone: Vec<Step> = journal.steps.clone();
        let failures = self.undo_all(journal, ctx);
        let mut rec = self
            .record(
                &ctx.user,
                ctx.uid,
                &ctx.node,
                Event::Rollback,
                Outcome::Failure,
            )
            .job_id(ctx.job_id)
            .tenant(plan.tenant.clone())
            .tier(plan.tier.name.clone());
        for step in undone.iter().rev() {
            rec = rec.resource(self.resource(step, ResourceAction::Removed));
        }
        if let Some(p) = &plan.profile {
            rec = rec.profile(p.clone());
        }
        let mut message = format!("tenancy: {reason}; the job does not run (rolled back)");
        if !failures.is_empty() {
            message.push_str(&format!(
                "; rollback left resources behind: {}; run `tenancyctl reconcile --apply`",
                failures.join("; ")
            ));
            rec = rec.reason(format!(
                "{reason}; rollback incomplete: {}",
                failures.join("; ")
            ));
        } else {
            rec = rec.reason(reason);
        }
        if let Err(e) = self.audit(&mut rec) {
            message.push_str(&format!("; and the rollback record was not written: {e}"));
        }
        Ending::fail(message)
    }

    fn deny(&self, ctx: &JobContext, d: Denial) -> Ending {
        let outcome = if d.event == Event::JobDenied {
            Outcome::Denied
        } else {
            Outcome::Failure
        };
        let mut rec = self
            .record(&ctx.user, ctx.uid, &ctx.node, d.event, outcome)
            .job_id(ctx.job_id)
            .reason(d.reason.clone());
        // The tenant asked for is the user's claim; `tenant` only once the prolog verified it.
        if let Some(t) = &ctx.requested_tenant {
            rec = rec.requested_tenant(t.clone());
        }
        if let Some(t) = d.tenant.as_ref() {
            rec = rec.tenant(t.clone());
        }
        let mut message = format!("tenancy: {}", d.reason);
        if let Err(e) = self.audit(&mut rec) {
            message.push_str(&format!("; and the denial record was not written: {e}"));
        }
        Ending::fail(message)
    }

    // ---- teardown ----------------------------------------------------------------------

    /// Undoes every step in reverse; returns what could not be undone. The journal is removed
    /// when everything is gone, and otherwise kept holding only what is left.
    fn undo_all(&mut self, mut journal: Journal, ctx: &JobContext) -> Vec<String> {
        // Teardown runs under the node lock, as make_all does: a GI destroyed meanwhile shifts
        // NVML's MIG device indexes under a prolog's slice lookup (tests/concurrency.rs).
        let _lock = match self.journals.lock_node() {
            Ok(l) => l,
            Err(e) => {
                return vec![format!(
                    "job {}: cannot take the node lock in {}: {e}",
                    journal.job_id,
                    self.journals.path().display()
                )]
            }
        };
        teardown(&mut self.layers, &self.journals, &mut journal)
            .into_iter()
            .map(|f| format!("job {}: {f}", ctx.job_id))
            .collect()
    }

    /// The first layer with something left to undo in `journal` that cannot run here.
    fn needs_another_process(&self, journal: &Journal) -> Option<usize> {
        journal
            .steps
            .iter()
            .filter(|s| s.state != StepState::Undone)
            .filter_map(|s| self.layer_index(&s.layer))
            .find(|&li| !self.layers[li].runs_here())
    }

    /// Replaces this static prolog with the dynamic build (`handoff`), which runs the whole
    /// prolog for the job again; nothing is made or recorded here before. Returns only when
    /// that failed: the job is refused (`event`) for `why` and that failure.
    fn hand_off_prolog(&self, ctx: &JobContext, event: Event, why: String) -> Ending {
        let Some(handoff) = self.handoff.as_ref() else {
            return self.deny(
                ctx,
                Denial {
                    event,
                    reason: why,
                    tenant: None,
                },
            );
        };
        let (program, e) = handoff.exec();
        let reason = format!(
            "{why}; handing the job to {program} failed: {e}; install tenancy-prolog-dynamic \
             next to tenancy-prolog (docs/admin-guide.md, Build and install)"
        );
        self.deny(
            ctx,
            Denial {
                event,
                reason,
                tenant: None,
            },
        )
    }

    /// Replaces this process with the hand-off program when a layer with something left to
    /// undo cannot run here; returns only when that failed (nothing was torn down: fail
    /// closed, with a record) or when there is nothing to hand off.
    fn hand_off_if_needed(&mut self, journal: &Journal, ctx: &JobContext) -> Option<Ending> {
        let handoff = self.handoff.as_ref()?;
        let layer = self.needs_another_process(journal)?;
        let name = self.layers[layer].name();
        // Only returns on failure; the journal and the node lock are not held here.
        let (program, e) = handoff.exec();
        let reason = format!(
            "job {}: layer {name}: its teardown needs a shared library this statically linked \
             epilog cannot load, and handing the job to {program} {} failed: {e}; nothing was \
             torn down. Install tenancy-prolog-dynamic next to tenancy-epilog (it runs the \
             epilog when given --epilog), then run `tenancyctl reconcile --apply`",
            ctx.job_id,
            handoff.args.join(" ")
        );
        Some(self.teardown_failed(ctx, Some(journal), reason))
    }

    /// Records a `teardown_failed` for an epilog that undid nothing, and fails with `reason`.
    fn teardown_failed(
        &self,
        ctx: &JobContext,
        journal: Option<&Journal>,
        reason: String,
    ) -> Ending {
        let mut rec = self
            .record(
                &ctx.user,
                ctx.uid,
                &ctx.node,
                Event::TeardownFailed,
                Outcome::Failure,
            )
            .job_id(ctx.job_id)
            .reason(reason.clone());
        if let Some(j) = journal {
            rec = rec.tenant(j.tenant.clone()).tier(j.tier.clone());
        }
        let mut message = format!("tenancy: {reason}");
        if let Err(e) = self.audit(&mut rec) {
            message.push_str(&format!("; and the audit record was not written: {e}"));
        }
        Ending::fail(message)
    }

    /// Runs the epilog: tears the job down from its journal and records the end.
    pub fn epilog(&mut self, ctx: &JobContext) -> Ending {
        let begun = std::time::Instant::now();
        let journal = match self.journals.load(ctx.job_id) {
            Ok(j) => j,
            Err(e) => {
                let reason = format!(
                    "job {}: cannot read its journal: {e}; inspect it, then run `tenancyctl \
                     reconcile --apply`",
                    ctx.job_id
                );
                return self.teardown_failed(ctx, None, reason);
            }
        };
        let Some(journal) = journal else {
            // The prolog never ran, was denied, or rolled back: nothing to undo.
            let mut rec = self
                .record(
                    &ctx.user,
                    ctx.uid,
                    &ctx.node,
                    Event::JobEnd,
                    Outcome::Success,
                )
                .job_id(ctx.job_id)
                .reason("no journal: the prolog made nothing for this job");
            return match self.audit(&mut rec) {
                Ok(_) => Ending::ok(format!("tenancy: job {}: nothing to tear down", ctx.job_id)),
                // Nothing was made, so nothing is left unisolated: report, do not drain.
                Err(e) => Ending::ok(format!(
                    "tenancy: job {}: nothing to tear down; audit record not written: {e}",
                    ctx.job_id
                )),
            };
        };
        if let Some(end) = self.hand_off_if_needed(&journal, ctx) {
            return end;
        }
        let steps = journal.steps.clone();
        let (tenant, tier, profile, started) = (
            journal.tenant.clone(),
            journal.tier.clone(),
            journal.profile.clone(),
            journal.started,
        );
        let summary = self.summary(&journal);
        let failures = self.undo_all(journal, ctx);
        let (event, outcome) = if failures.is_empty() {
            (Event::JobEnd, Outcome::Success)
        } else {
            (Event::TeardownFailed, Outcome::Failure)
        };
        let mut rec = self
            .record(&ctx.user, ctx.uid, &ctx.node, event, outcome)
            .job_id(ctx.job_id)
            .tenant(tenant)
            .tier(tier)
            .started(started);
        if let Some(p) = profile {
            rec = rec.profile(p);
        }
        if let Some(n) = summary.compute_slices {
            rec = rec.compute_slices(n);
        }
        if let Some(g) = &summary.gpu {
            rec = rec.gpu(g);
        }
        for step in steps.iter().rev() {
            let mut r = self.resource(step, ResourceAction::Removed);
            if let Some(i) = self.layer_index(&step.layer) {
                r.detail.extend(self.layers[i].undo_notes());
            }
            rec = rec.resource(r);
        }
        if let Some(table) = &summary.firewall_table {
            let tenant = rec.tenant.clone().unwrap_or_default();
            if let Some(n) = network::drops_since_last_report(&self.journals, table, &tenant) {
                rec = rec.firewall_drops(n);
            }
        }
        if !failures.is_empty() {
            rec = rec.reason(failures.join("; "));
        }
        let audit = self.audit(&mut rec.duration(begun.elapsed()));
        match (failures.is_empty(), audit) {
            (true, Ok(_)) => Ending::ok(format!("tenancy: job {} torn down", ctx.job_id)),
            // Everything is gone; only the record is missing. Draining the node would not bring
            // it back, so the epilog reports it and succeeds (documented in ARCHITECTURE.md).
            (true, Err(e)) => Ending::ok(format!(
                "tenancy: job {} torn down; job_end record not written: {e}",
                ctx.job_id
            )),
            (false, _) => Ending::fail(format!(
                "tenancy: teardown incomplete, the node keeps resources of the job: {}; the \
                 journal is kept: fix the cause, then run `tenancyctl reconcile --apply`",
                failures.join("; ")
            )),
        }
    }

    fn resource(&self, step: &Step, action: ResourceAction) -> Resource {
        let id = match self.layer_index(&step.layer) {
            Some(i) => self.layers[i].resource_id(&step.intent, step.made.as_ref()),
            None => step.layer.clone(),
        };
        let mut r = Resource::new(step.layer.clone(), action, id);
        if let Some(Value::Object(m)) = step.made.as_ref().or(Some(&step.intent)) {
            r.detail = m.clone();
            Facing::strip_added(&mut r.detail);
        }
        r
    }

    /// What the job's steps add to its audit records, from the layers of this build.
    fn summary(&self, journal: &Journal) -> AuditSummary {
        journal
            .steps
            .iter()
            .filter_map(|s| {
                let made = (s.state == StepState::Made)
                    .then_some(s.made.as_ref())
                    .flatten();
                let i = self.layer_index(&s.layer)?;
                Some(self.layers[i].audit_summary(&s.intent, made))
            })
            .fold(AuditSummary::default(), AuditSummary::or)
    }

    fn describe(&self, rec: &mut Record, journal: &Journal, action: ResourceAction) {
        for step in &journal.steps {
            rec.resources.push(self.resource(step, action));
        }
        if let Some(p) = &journal.profile {
            rec.profile = Some(p.clone());
        }
        let summary = self.summary(journal);
        if summary.gpu.is_some() || summary.compute_slices.is_some() {
            rec.compute_slices = summary.compute_slices;
            rec.gpu = summary.gpu;
        }
    }
}

/// This machine's host name up to the first dot, as Slurm names nodes by default.
fn short_hostname() -> String {
    let uname = rustix::system::uname();
    let name = uname.nodename().to_string_lossy();
    name.split('.').next().unwrap_or("localhost").to_string()
}

use tenancy_job::audit::append_anchored;

/// Undoes every step of `journal` in reverse with `layers` (the epilog's and reconcile's
/// teardown; the caller holds the node lock); returns what could not be undone, each naming
/// its layer or the journal. The journal is removed when everything is gone, and otherwise kept
/// holding only what is left; either way the job leaves the occupancy index (placement sees
/// leftovers through NVML). A journal of an earlier boot undoes only the layers whose resources
/// outlive a restart: what stands in the others' place now is this boot's.
pub fn teardown(
    layers: &mut [Box<dyn Layer + '_>],
    journals: &JournalDir,
    journal: &mut Journal,
) -> Vec<String> {
    let mut failures = Vec::new();
    let earlier_boot = journal.from_earlier_boot();
    // No process of the job may outlive any of its layers.
    if let Err(e) = tenancy_job::task::end_tasks(journal, tenancy_job::task::END_WAIT) {
        failures.push(e);
        if let Err(e) = journals.save(journal, true) {
            failures.push(format!(
                "journal {}: {e}",
                journals.journal_path(journal.job_id).display()
            ));
        }
        return failures;
    }
    for idx in (0..journal.steps.len()).rev() {
        let step = &journal.steps[idx];
        if step.state == StepState::Undone {
            continue;
        }
        let Some(layer) = layers.iter_mut().find(|l| l.name() == step.layer) else {
            failures.push(format!(
                "layer {}: this build does not know the layer; tear it down by hand",
                step.layer
            ));
            continue;
        };
        if earlier_boot && !layer.survives_restart() {
            journal.steps[idx].state = StepState::Undone;
            continue;
        }
        match layer.undo(&step.intent, step.made.as_ref()) {
            Ok(()) => journal.steps[idx].state = StepState::Undone,
            Err(LayerError(e)) => failures.push(format!("layer {}: {e}", step.layer)),
        }
    }
    // The occupancy entry goes first: a kill between the two then leaves a journal without an
    // entry (the journal is torn down again by the next epilog or reconcile, which rebuilds the
    // index), never an entry without a journal, which nothing removes and which blocks
    // placement for tiers that do not share the node.
    let saved = journals.set_occupant(journal.job_id, None).and_then(|()| {
        if failures.is_empty() {
            journals.remove(journal)
        } else {
            journals.save(journal, true)
        }
    });
    if let Err(e) = saved {
        failures.push(format!(
            "journal {}: {e}",
            journals.journal_path(journal.job_id).display()
        ));
    }
    failures
}

#[cfg(test)]
mod journal_tests {
    //! (Moved from the journal's tests: it needs the spine's teardown.)
    use tenancy_job::journal::{Journal, JournalDir, Occupant};

    fn sample(job_id: u64) -> Journal {
        tenancy_test_support::journals::journal(job_id, "c", "u", 1)
    }

    #[test]
    fn teardown_removes_the_occupancy_entry_before_the_journal() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut j = sample(1);
        j.steps.clear();
        j.share_node = false;
        dir.save(&j, true).unwrap();
        dir.set_occupant(1, Some(Occupant::of(&j))).unwrap();
        // The `- 1` append fails (as if the epilog were killed there): the journal, which the
        // next epilog or reconcile tears down again, must still be there; an index entry
        // without a journal is never removed.
        let index = tmp.path().join("occupancy");
        std::fs::rename(&index, tmp.path().join("kept")).unwrap();
        std::os::unix::fs::symlink("kept", &index).unwrap();
        let failures = super::teardown(&mut [], &dir, &mut j);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(dir.load(1).unwrap(), Some(j.clone()));
        // With the index writable again it goes as the epilog would.
        std::fs::remove_file(&index).unwrap();
        std::fs::rename(tmp.path().join("kept"), &index).unwrap();
        assert!(super::teardown(&mut [], &dir, &mut j).is_empty());
        assert_eq!(dir.load(1).unwrap(), None);
        assert_eq!(dir.occupants(0).unwrap(), vec![]);
    }
}
