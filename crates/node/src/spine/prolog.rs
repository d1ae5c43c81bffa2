//! The prolog's steps: the job [`Checked`], its plan [`Decided`], every intent journaled
//! ([`Intended`]) and every layer [`Made`], or a denial or rollback, recorded.

use super::{short_hostname, Boundary, Ending, Spine};
use crate::layer::{JobPlan, LayerError};
use chrono::Utc;
use tenancy_audit_log::{Event, Outcome, ResourceAction};
use tenancy_config::{group_gid, Identity, Refusal};
use tenancy_job::context::{EnvError, JobContext};
use tenancy_job::contract::Facing;
use tenancy_job::intent_log::Flushing;
use tenancy_job::journal::{Journal, NodeLock, Occupant, Step, StepState, VERSION};

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
        let acting = match self.intend_layers(plan, journal) {
            Ok(acting) => acting,
            // Other jobs' journals in the way may be of jobs Slurm no longer runs here, whose
            // epilog it will not run: torn down as reconcile would, then decided again once.
            Err(refusal) => {
                let reclaimed = self.reclaim_dead_jobs(plan);
                if reclaimed.jobs.is_empty() {
                    return Err(format!("{refusal}{}", reclaimed.note).into());
                }
                plan.others = self.journals.occupants(job).map_err(|e| {
                    format!(
                        "job {job}: layer node: cannot read the occupancy index in {}: {e}",
                        self.journals.path().display()
                    )
                })?;
                journal.steps.clear();
                let acting = self
                    .intend_layers(plan, journal)
                    .map_err(|e| format!("{e}{}", reclaimed.note))?;
                // For slurmd's log; the `reconcile` records are the audit trail.
                eprintln!(
                    "tenancy: job {job}: {}",
                    reclaimed.note.trim_start_matches("; ")
                );
                acting
            }
        };
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

    /// The tier rules of the node, then every layer's intent (pushed to `journal` as steps):
    /// the layers that act, or why the job may not run here (`journal` then holds the steps
    /// intended before: their undo is a no-op).
    fn intend_layers(
        &mut self,
        plan: &JobPlan,
        journal: &mut Journal,
    ) -> Result<Vec<usize>, String> {
        let job = plan.job_id;
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
                Err(LayerError(e)) => return Err(format!("job {job}: layer {name}: {e}")),
            }
        }
        Ok(acting)
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
}
