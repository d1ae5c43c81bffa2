//! The contract between the spine and each isolation layer (MIG, cgroup, devices, scratch,
//! network).
//!
//! The spine records a layer's intent in the journal before calling `make`, and its result after.
//! An intent must be self-contained: `undo` gets only the intent and (when the prolog got that
//! far) the made value, possibly in another process, after a crash, under a changed config.

use crate::journal::Journal;
use serde_json::Value;
use tenancy_config::Tier;

/// What the prolog decided for the job; layers derive their intents from it.
#[derive(Debug, Clone)]
pub struct JobPlan {
    pub job_id: u64,
    pub uid: u32,
    pub gid: u32,
    pub user: String,
    pub node: String,
    pub tenant: String,
    /// The gid of the tenant's first group: owner group of its scratch folder.
    pub tenant_gid: u32,
    pub tier: Tier,
    pub profile: Option<String>,
    /// Slots slurmctld allocated (GPU GRES indexes), when the node's GRES describe MIG slots.
    pub gres_gpus: Option<Vec<u32>>,
    /// The other jobs on the node (occupancy index, read under the node lock).
    pub others: Vec<crate::journal::Occupant>,
}

/// A layer's failure: the message names the value and what to do; the spine adds job and layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerError(pub String);

impl<E: std::fmt::Display> From<E> for LayerError {
    fn from(e: E) -> Self {
        LayerError(e.to_string())
    }
}

pub type LayerResult<T> = Result<T, LayerError>;

pub trait Layer {
    /// The name recorded in journals and audit records.
    fn name(&self) -> &'static str;

    /// Decides what to make. `Ok(None)`: the layer has nothing to do for this job. Every
    /// layer's intent is journaled, in one durable write, before the first layer makes anything.
    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Value>>;

    /// Makes what `intent` describes; returns what exists now. `journal` holds what the
    /// earlier layers made (the device layer reads the MIG slice it lets through).
    fn make(&mut self, intent: &Value, journal: &Journal) -> LayerResult<Value>;

    /// Removes it. Idempotent: what is already gone is not an error. `made` is `None` when the
    /// prolog stopped between recording the intent and recording the result.
    fn undo(&mut self, intent: &Value, made: Option<&Value>) -> LayerResult<()>;

    /// What the last `undo` found worth recording beside the resource (the scratch layer: the
    /// mounts it detached), merged into the resource's detail in the job's end record.
    fn undo_notes(&mut self) -> serde_json::Map<String, Value> {
        serde_json::Map::new()
    }

    /// Whether this process can drive the layer's mechanism. A layer that must load a shared
    /// library says no in a statically linked process (`crate::linkage`); the prolog or
    /// epilog then hands the job to a dynamically linked one (`Spine::handoff`).
    fn runs_here(&self) -> bool {
        true
    }

    /// Whether the layer would make something for `plan`, decided before the node lock
    /// (`plan.others` is empty): a statically linked prolog hands the job to the dynamic
    /// build when a layer that cannot run here (`runs_here`) would act.
    fn acts_for(&self, plan: &JobPlan) -> bool {
        let _ = plan;
        true
    }

    /// Whether what the layer makes outlives a restart of the node (a folder on disk does; a
    /// MIG instance, a cgroup, a BPF program do not). The prolog waits until the intents are
    /// on disk before such a layer acts, and lets the others act while they are written.
    /// Teardown skips the others for a journal of an earlier boot
    /// ([`Journal::from_earlier_boot`]): undoing them then could only hit what a job of this
    /// boot made in their place (a GPU instance at the same placement).
    fn survives_restart(&self) -> bool {
        true
    }

    /// A short identifier of the resource for audit records.
    fn resource_id(&self, intent: &Value, made: Option<&Value>) -> String {
        let _ = (intent, made);
        self.name().to_string()
    }
}
