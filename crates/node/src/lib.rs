//! slurm-tenancy on the node: the job context Slurm gives the prolog and epilog, the per-job
//! journal, the spine that makes and undoes the isolation layers in order, and the layers'
//! adapters.

pub use tenancy_job::{
    abstract_sockets, adopt, config_cache, context, contract, intent_log, journal, task,
};
pub mod layer;
pub mod layers;
pub mod linkage;
pub mod run;
pub mod spine;

pub use context::{EnvError, JobContext};
pub use journal::{Journal, JournalDir, Occupant, Step, StepState};
pub use layer::{
    AuditSummary, Claim, JobPlan, Layer, LayerError, LayerResult, Orphan, OrphanAction,
    OrphanScope, TypedLayer,
};
pub use spine::{Boundary, Ending, Handoff, Spine};
