//! slurm-tenancy on the node: the spine that makes and undoes a job's isolation layers in order
//! for the prolog and epilog, the layer contract, and the layers' adapters.
//!
//! What also runs in Slurm's own processes (the job context, the journal, the intent log, the
//! task entry, the layer contract's keys) is tenancy-job's: use it from there.

pub mod layer;
pub mod layers;
pub mod linkage;
pub mod run;
pub mod slurm;
pub mod spine;

pub use layer::{
    AuditSummary, Claim, JobPlan, Layer, LayerError, LayerResult, Orphan, OrphanAction,
    OrphanScope, TypedLayer,
};
pub use spine::{Boundary, Ending, Handoff, Spine};
