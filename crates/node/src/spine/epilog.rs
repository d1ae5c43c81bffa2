//! The epilog: the job torn down from its journal (in another process when a layer cannot
//! run in this one), and its end recorded.

use super::{Ending, Spine};
use crate::layers::network;
use tenancy_audit_log::{Event, Outcome, ResourceAction};
use tenancy_job::context::JobContext;
use tenancy_job::journal::Journal;

impl<'c> Spine<'c> {
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
        let mut journal = journal;
        let failures = self.undo_locked(&mut journal, ctx, true);
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
        // The journal goes last, after the record: killed before it, the epilog leaves the
        // journal to reconcile (which records what it tears down), never a job with no end.
        if failures.is_empty() {
            if let Err(e) = self.journals.remove(&journal) {
                return Ending::fail(format!(
                    "tenancy: job {} torn down, but its journal {} could not be removed: {e}; \
                     run `tenancyctl reconcile --apply`",
                    ctx.job_id,
                    self.journals.journal_path(ctx.job_id).display()
                ));
            }
        }
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
}
