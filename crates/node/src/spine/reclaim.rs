//! The prolog's reclaim: when other jobs' journals stand in a job's way (a tier rule on the
//! node, a MIG slot held), the journals of jobs Slurm no longer runs on the node are torn down
//! as `tenancyctl reconcile --apply` would, each with a `reconcile` record, and the job is
//! decided again.
//!
//! Such a journal is one whose epilog Slurm will not run: slurmd killed between the job's end
//! and its epilog (the restarted slurmd knows no such job, and slurmctld counts it done here),
//! a node whose epilog was lost. Until `tenancy-reconcile.timer` came by, its slice and its
//! tier's claim on a GPU or the node refused every job Slurm placed in their stead, and each
//! refusal drained the node (found by the soak at size: a drain no fault explained).
//!
//! The question goes to slurmctld only then, never on the common path, and after the node
//! lock is held: every journal on disk is older than the answer, as in reconcile. An answer
//! that does not list this very job (which slurmctld is starting here) is not trusted.

use super::Spine;
use crate::layer::JobPlan;
use tenancy_audit_log::{Event, Outcome, ResourceAction};

/// The jobs torn down, and what the refusal should add when it stands.
pub(super) struct Reclaimed {
    pub jobs: Vec<u64>,
    /// Begins with "; " when not empty.
    pub note: String,
}

impl Reclaimed {
    fn none(note: impl Into<String>) -> Reclaimed {
        Reclaimed {
            jobs: Vec::new(),
            note: note.into(),
        }
    }
}

fn list(ids: &[u64]) -> String {
    ids.iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Spine<'_> {
    /// Tears down the journals on this node of jobs Slurm no longer runs here (the caller
    /// holds the node lock).
    pub(super) fn reclaim_dead_jobs(&mut self, plan: &JobPlan) -> Reclaimed {
        let (ours, node) = (plan.job_id, plan.node.clone());
        let others: Vec<u64> = match self.journals.job_ids() {
            Ok(ids) => ids.into_iter().filter(|&j| j != ours).collect(),
            Err(_) => return Reclaimed::none(""),
        };
        if others.is_empty() {
            return Reclaimed::none("");
        }
        let squeue = &self.config.node.squeue;
        let running = match crate::slurm::jobs_on_node(squeue, &node, crate::slurm::ASK_LIMIT) {
            Ok(r) => r,
            Err(e) => {
                return Reclaimed::none(format!(
                    "; Slurm could not be asked whether job(s) {} still run on {node} ({e}): \
                     `tenancyctl reconcile --apply` tears down those it no longer runs",
                    list(&others)
                ))
            }
        };
        if !running.contains(&ours) {
            return Reclaimed::none(format!(
                "; {} does not list job {ours} on {node}, so its answer about job(s) {} is not \
                 trusted: check that SLURMD_NODENAME is this node's NodeName",
                squeue.display(),
                list(&others)
            ));
        }
        let dead: Vec<u64> = others
            .into_iter()
            .filter(|j| !running.contains(j))
            .collect();
        let mut jobs = Vec::new();
        let mut problems = Vec::new();
        for id in dead {
            let journal = match self.journals.load(id) {
                Ok(Some(j)) => j,
                Ok(None) => continue,
                Err(e) => {
                    problems.push(format!("job {id}'s journal cannot be read: {e}"));
                    continue;
                }
            };
            if let Some(li) = self.needs_another_process(&journal) {
                problems.push(format!(
                    "job {id}'s {} needs the dynamically linked build to be torn down",
                    self.layers[li].name()
                ));
                continue;
            }
            let mut rec = self
                .record("root", 0, &node, Event::Reconcile, Outcome::Success)
                .job_id(id)
                .tenant(journal.tenant.clone())
                .tier(journal.tier.clone());
            self.describe(&mut rec, &journal, ResourceAction::Removed);
            let mut left = journal;
            let failures = super::teardown(&mut self.layers, &self.journals, &mut left);
            let why = format!(
                "job {id}: Slurm no longer runs the job on {node}, and its epilog did not tear \
                 it down; torn down by the prolog of job {ours}, in whose way it stood"
            );
            if failures.is_empty() {
                rec = rec.reason(why);
                jobs.push(id);
            } else {
                rec.outcome = Outcome::Failure;
                rec = rec.reason(format!("{why}; left: {}", failures.join("; ")));
                problems.push(format!(
                    "job {id} (Slurm no longer runs it) could not be torn down: {}",
                    failures.join("; ")
                ));
            }
            if let Err(e) = self.audit(&mut rec) {
                problems.push(format!(
                    "the reconcile record of job {id} was not written: {e}"
                ));
            }
        }
        let mut note = String::new();
        if !jobs.is_empty() {
            note.push_str(&format!(
                "; job(s) {} (no longer run by Slurm) were torn down first",
                list(&jobs)
            ));
        }
        if !problems.is_empty() {
            note.push_str(&format!(
                "; {}; run `tenancyctl reconcile --apply` on {node}",
                problems.join("; ")
            ));
        }
        Reclaimed { jobs, note }
    }
}
