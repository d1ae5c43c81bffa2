//! The spine of the job path: the prolog re-checks the job, then runs the layers in order,
//! journaling each intent before it is made; a failure undoes what was made, in reverse, and
//! fails closed. The epilog undoes in reverse from the journal. Both append audit records.

use crate::layer::{AuditSummary, Layer, LayerError};
use serde_json::Value;
use tenancy_audit_log::{Event, Outcome, Record, Resource, ResourceAction};
use tenancy_config::Config;
use tenancy_job::context::JobContext;
use tenancy_job::contract::Facing;
use tenancy_job::journal::{Journal, JournalDir, Step, StepState};

mod epilog;
mod prolog;
mod reclaim;

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

    // ---- teardown ----------------------------------------------------------------------

    /// Undoes every step in reverse; returns what could not be undone. The journal is removed
    /// when everything is gone, and otherwise kept holding only what is left.
    fn undo_all(&mut self, mut journal: Journal, ctx: &JobContext) -> Vec<String> {
        self.undo_locked(&mut journal, ctx, false)
    }

    /// [`Self::undo_all`]; with `keep_journal`, the journal stays when everything is gone
    /// ([`teardown_keeping_journal`]: the epilog removes it after the job's record).
    fn undo_locked(
        &mut self,
        journal: &mut Journal,
        ctx: &JobContext,
        keep_journal: bool,
    ) -> Vec<String> {
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
        let failures = if keep_journal {
            teardown_keeping_journal(&mut self.layers, &self.journals, journal)
        } else {
            teardown(&mut self.layers, &self.journals, journal)
        };
        failures
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
    let mut failures = teardown_keeping_journal(layers, journals, journal);
    if failures.is_empty() {
        if let Err(e) = journals.remove(journal) {
            failures.push(format!(
                "journal {}: {e}",
                journals.journal_path(journal.job_id).display()
            ));
        }
    }
    failures
}

/// [`teardown`], except that when everything is gone the journal stays for the caller to
/// remove once the job's record is written (the epilog): a kill before the record then leaves
/// a journal that reconcile tears down again (every undo is idempotent) and records, never a
/// job torn down with no record of its end.
pub fn teardown_keeping_journal(
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
            Ok(())
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

    /// The epilog's teardown leaves the journal for after the job_end record (the soak found
    /// an epilog killed between the journal's removal and its record: a job torn down with
    /// no record of its end, and nothing left for reconcile to record).
    #[test]
    fn epilog_teardown_keeps_the_journal_until_the_record() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = JournalDir::open(tmp.path()).unwrap();
        let mut j = sample(2);
        j.steps.clear();
        j.share_node = false;
        dir.save(&j, true).unwrap();
        dir.set_occupant(2, Some(Occupant::of(&j))).unwrap();
        assert!(super::teardown_keeping_journal(&mut [], &dir, &mut j).is_empty());
        // Placement no longer sees the job; the journal waits for the epilog's record (or
        // for reconcile, should the epilog die first).
        assert_eq!(dir.occupants(0).unwrap(), vec![]);
        assert_eq!(dir.load(2).unwrap(), Some(j.clone()));
        // Torn down again, as reconcile does, it goes.
        assert!(super::teardown(&mut [], &dir, &mut j).is_empty());
        assert_eq!(dir.load(2).unwrap(), None);
    }
}
