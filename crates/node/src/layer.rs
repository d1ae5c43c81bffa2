//! The contract between the spine and each isolation layer (MIG, cgroup, devices, scratch,
//! network).
//!
//! The spine records a layer's intent in the journal before calling `make`, and its result after.
//! An intent must be self-contained: `undo` gets only the intent and (when the prolog got that
//! far) the made value, possibly in another process, after a crash, under a changed config.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::path::PathBuf;
use tenancy_config::Tier;
use tenancy_job::contract::TaskEntry;
use tenancy_job::journal::Journal;

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
    pub others: Vec<tenancy_job::journal::Occupant>,
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

    /// What every task of the job joins and the environment it gets, from what the layer made;
    /// the spine journals it beside the made value ([`tenancy_job::contract::Facing`]).
    fn task_entry(&self, made: &Value) -> LayerResult<TaskEntry> {
        let _ = made;
        Ok(TaskEntry::default())
    }

    /// What the job's audit records say of the step beyond its resource (`made`: `None`
    /// unless the step was made).
    fn audit_summary(&self, intent: &Value, made: Option<&Value>) -> AuditSummary {
        let _ = (intent, made);
        AuditSummary::default()
    }

    /// What of the node the step owns, so that `tenancyctl reconcile` does not take it for an
    /// orphan (`made`: `None` unless recorded). An error (a step this build cannot read): the
    /// job's journal counts as unreadable, and what is named after the job is kept.
    fn claims(&self, intent: &Value, made: Option<&Value>) -> LayerResult<Vec<Claim>> {
        let _ = (intent, made);
        Ok(Vec::new())
    }

    /// `tenancyctl reconcile`'s search of the node for what this layer makes and no journal
    /// claims ([`OrphanScope::owned`]), in the order it reports them.
    fn orphans(&mut self, scope: &OrphanScope) -> Vec<Orphan> {
        let _ = scope;
        Vec::new()
    }
}

/// What `tenancyctl reconcile` tells a layer's orphan search.
pub struct OrphanScope<'s> {
    /// What the remaining journals claim ([`Layer::claims`]).
    pub owned: &'s std::collections::BTreeSet<Claim>,
    /// Jobs whose journal cannot be read: what is named after them may be theirs.
    pub unreadable: &'s std::collections::BTreeSet<u64>,
    /// The jobs Slurm still has, on any node, or why it could not be asked.
    pub known: &'s Result<std::collections::BTreeSet<u64>, String>,
    /// The tenants to look at; empty: every tenant.
    pub tenants: &'s [String],
    /// `--apply`: a search that acts itself (retained folders) acts only then.
    pub apply: bool,
}

impl OrphanScope<'_> {
    /// Whether `tenant`'s resources are looked at.
    pub fn wanted(&self, tenant: &str) -> bool {
        self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant)
    }
}

/// What is left of a job whose journal cannot be read.
pub const KEPT_UNREADABLE: &str = "kept: Slurm may still run the job; inspect its journal";

/// One finding of an orphan search, as reconcile reports it (one row).
pub struct Orphan {
    /// The row's kind (`mig`, `cgroup`, `scratch`, `retained`, `nvml`).
    pub kind: &'static str,
    pub resource: String,
    pub finding: String,
    pub job: Option<u64>,
    pub tenant: Option<String>,
    pub what: OrphanAction,
}

/// What becomes of an [`Orphan`].
pub enum OrphanAction {
    /// Nothing: why it is left (or what was not checked).
    Left(String),
    /// Removed by this with `--apply` (and the removal recorded), reported otherwise.
    Remove(Box<dyn FnOnce() -> Result<(), String>>),
    /// The search acted itself (or, without `--apply`, says what it would do).
    Done {
        action: String,
        /// Whether it succeeded (the reconcile record's outcome).
        ok: bool,
        /// Whether something is left for the operator.
        left: bool,
        /// Whether a reconcile record is written.
        audit: bool,
    },
}

impl Orphan {
    pub fn new(
        kind: &'static str,
        resource: impl Into<String>,
        finding: impl Into<String>,
    ) -> Orphan {
        Orphan {
            kind,
            resource: resource.into(),
            finding: finding.into(),
            job: None,
            tenant: None,
            what: OrphanAction::Left(String::new()),
        }
    }

    pub fn job(mut self, job: u64) -> Orphan {
        self.job = Some(job);
        self
    }

    pub fn tenant(mut self, tenant: &str) -> Orphan {
        self.tenant = Some(tenant.to_string());
        self
    }

    pub fn left(mut self, why: impl Into<String>) -> Orphan {
        self.what = OrphanAction::Left(why.into());
        self
    }

    pub fn remove(mut self, f: impl FnOnce() -> Result<(), String> + 'static) -> Orphan {
        self.what = OrphanAction::Remove(Box::new(f));
        self
    }
}

/// What a step adds to its job's audit records (merged over the job's steps).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AuditSummary {
    /// The physical GPU of the job's slice.
    pub gpu: Option<String>,
    /// The job's compute slices (the accounting unit).
    pub compute_slices: Option<u32>,
    /// The nftables table whose per-tenant drop counters the job's end record reports.
    pub firewall_table: Option<String>,
}

impl AuditSummary {
    /// `self`, completed with what `other` knows and `self` does not.
    pub fn or(self, other: AuditSummary) -> AuditSummary {
        AuditSummary {
            gpu: self.gpu.or(other.gpu),
            compute_slices: self.compute_slices.or(other.compute_slices),
            firewall_table: self.firewall_table.or(other.firewall_table),
        }
    }
}

/// A resource of the node a journal step owns, in the terms the orphan search finds them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Claim {
    /// A made GPU instance.
    GpuInstance { gpu_uuid: String, gi_id: u32 },
    /// An intended GPU instance's placement (the instance may or may not exist).
    Placement { gpu_uuid: String, start: u32 },
    /// A cgroup directory.
    Cgroup(PathBuf),
    /// A job's folder under a tenant's (scratch).
    JobFolder { tenant: String, job_id: u64 },
    /// An encrypted job folder's key (its identifier), and its wrapped copy (scratch).
    ScratchKey(String),
}

/// A layer with typed intents and results. Every `TypedLayer` is a [`Layer`]: the spine
/// journals `Intent` and `Made` as JSON, and reads them back into these types (the journal's
/// schema is theirs: fields may be added, with serde defaults; a rename or removal needs a new
/// journal version and a reader of the old one, as [`tenancy_job::contract::release1`]). Journals
/// written by release 1 are read by this build (tests/release1_journals.rs).
pub trait TypedLayer {
    type Intent: Serialize + DeserializeOwned;
    type Made: Serialize + DeserializeOwned;

    /// See [`Layer::name`].
    fn name(&self) -> &'static str;
    /// See [`Layer::intend`].
    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Self::Intent>>;
    /// See [`Layer::make`].
    fn make(&mut self, intent: &Self::Intent, journal: &Journal) -> LayerResult<Self::Made>;
    /// See [`Layer::undo`].
    fn undo(&mut self, intent: &Self::Intent, made: Option<&Self::Made>) -> LayerResult<()>;
    /// See [`Layer::undo_notes`].
    fn undo_notes(&mut self) -> serde_json::Map<String, Value> {
        serde_json::Map::new()
    }
    /// See [`Layer::runs_here`].
    fn runs_here(&self) -> bool {
        true
    }
    /// See [`Layer::acts_for`].
    fn acts_for(&self, plan: &JobPlan) -> bool {
        let _ = plan;
        true
    }
    /// See [`Layer::survives_restart`].
    fn survives_restart(&self) -> bool {
        true
    }
    /// See [`Layer::resource_id`].
    fn resource_id(&self, intent: &Self::Intent, made: Option<&Self::Made>) -> String {
        let _ = (intent, made);
        self.name().to_string()
    }
    /// See [`Layer::task_entry`].
    fn task_entry(&self, made: &Self::Made) -> TaskEntry {
        let _ = made;
        TaskEntry::default()
    }
    /// See [`Layer::audit_summary`].
    fn audit_summary(&self, intent: &Self::Intent, made: Option<&Self::Made>) -> AuditSummary {
        let _ = (intent, made);
        AuditSummary::default()
    }
    /// See [`Layer::claims`].
    fn claims(&self, intent: &Self::Intent, made: Option<&Self::Made>) -> Vec<Claim> {
        let _ = (intent, made);
        Vec::new()
    }
    /// See [`Layer::orphans`].
    fn orphans(&mut self, scope: &OrphanScope) -> Vec<Orphan> {
        let _ = scope;
        Vec::new()
    }
}

/// A journaled value read back into its layer's type.
/// (The error reads as serde's, as before the layers were typed.)
fn typed<T: DeserializeOwned>(_layer: &str, _what: &str, v: &Value) -> LayerResult<T> {
    serde_json::from_value(v.clone()).map_err(LayerError::from)
}

impl<T: TypedLayer> Layer for T {
    fn name(&self) -> &'static str {
        TypedLayer::name(self)
    }

    fn intend(&mut self, plan: &JobPlan) -> LayerResult<Option<Value>> {
        match TypedLayer::intend(self, plan)? {
            Some(i) => Ok(Some(serde_json::to_value(i)?)),
            None => Ok(None),
        }
    }

    fn make(&mut self, intent: &Value, journal: &Journal) -> LayerResult<Value> {
        let intent: T::Intent = typed(TypedLayer::name(self), "intent", intent)?;
        Ok(serde_json::to_value(TypedLayer::make(
            self, &intent, journal,
        )?)?)
    }

    fn undo(&mut self, intent: &Value, made: Option<&Value>) -> LayerResult<()> {
        let name = TypedLayer::name(self);
        let intent: T::Intent = typed(name, "intent", intent)?;
        let made: Option<T::Made> = made.map(|m| typed(name, "result", m)).transpose()?;
        TypedLayer::undo(self, &intent, made.as_ref())
    }

    fn undo_notes(&mut self) -> serde_json::Map<String, Value> {
        TypedLayer::undo_notes(self)
    }

    fn runs_here(&self) -> bool {
        TypedLayer::runs_here(self)
    }

    fn acts_for(&self, plan: &JobPlan) -> bool {
        TypedLayer::acts_for(self, plan)
    }

    fn survives_restart(&self) -> bool {
        TypedLayer::survives_restart(self)
    }

    fn resource_id(&self, intent: &Value, made: Option<&Value>) -> String {
        let name = TypedLayer::name(self);
        match typed::<T::Intent>(name, "intent", intent) {
            Ok(i) => {
                let made: Option<T::Made> = made.and_then(|m| typed(name, "result", m).ok());
                TypedLayer::resource_id(self, &i, made.as_ref())
            }
            Err(_) => name.to_string(),
        }
    }

    fn task_entry(&self, made: &Value) -> LayerResult<TaskEntry> {
        let made: T::Made = typed(TypedLayer::name(self), "result", made)?;
        Ok(TypedLayer::task_entry(self, &made))
    }

    fn audit_summary(&self, intent: &Value, made: Option<&Value>) -> AuditSummary {
        let name = TypedLayer::name(self);
        let Ok(i) = typed::<T::Intent>(name, "intent", intent) else {
            return AuditSummary::default();
        };
        let made: Option<T::Made> = made.and_then(|m| typed(name, "result", m).ok());
        TypedLayer::audit_summary(self, &i, made.as_ref())
    }

    fn claims(&self, intent: &Value, made: Option<&Value>) -> LayerResult<Vec<Claim>> {
        let name = TypedLayer::name(self);
        let i = typed::<T::Intent>(name, "intent", intent)?;
        let made: Option<T::Made> = made.map(|m| typed(name, "result", m)).transpose()?;
        Ok(TypedLayer::claims(self, &i, made.as_ref()))
    }

    fn orphans(&mut self, scope: &OrphanScope) -> Vec<Orphan> {
        TypedLayer::orphans(self, scope)
    }
}
