//! tenancy-mig: the hardware layer of the job path. A job gets a MIG GPU instance (GI) and a
//! full-size compute instance (CI) of its own, created in the prolog and destroyed in the
//! epilog, through NVML (`nvml-wrapper` 0.13; GI/CI calls go through the raw symbol table
//! because the wrapper has no API for them).
//!
//! Flow: [`Mig::choose`] -> journal the [`MigIntent`] -> [`Mig::create`] -> journal the
//! [`MigSlice`]; teardown: [`Mig::destroy`] with the intent and (if journaled) the slice.
//! See README.md for the Slurm GRES design.

// Errors carry full context (GPU, profile, placement, NVML code, hint) by design; they are
// the rare path, so their size does not matter.
#![allow(clippy::result_large_err)]

pub mod choose;
pub mod error;
pub mod names;
mod nvml;
pub mod plan;
pub mod profiles;

pub use choose::{choose_in, GiView, GpuView};
pub use error::{At, MigError, Result};
pub use names::{Configured, DriverNames};
pub use nvml::{lost_reason, GpuInfo, Mig, RetryPolicy};
pub use plan::{parse_job_gpus, plan_slots, slurm_lines, Carving, NodePlan, PlanGpu, Slot};
pub use profiles::{GpuModel, MigProfile};

use serde::{Deserialize, Serialize};

/// What a job asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Profile name ("3g.71gb"). May be None when `slot` is given (the slot fixes it).
    pub profile: Option<String>,
    /// The plan slot Slurm allocated (from SLURM_JOB_GPUS); None: first fit within the plan.
    pub slot: Option<u32>,
    pub tenant: String,
    /// The tenant's tier allows sharing a physical GPU with other tenants.
    pub share_gpu: bool,
}

/// A slice another live job holds (from its journal), given by the caller under a node lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Occupant {
    pub gpu_uuid: String,
    pub tenant: String,
    pub share_gpu: bool,
    /// How many of the tenant's jobs hold a slice on the GPU.
    pub jobs: u32,
}

/// What the prolog is about to create. Journal it BEFORE [`Mig::create`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigIntent {
    pub gpu_index: u32,
    pub gpu_uuid: String,
    pub profile: String,
    pub gi_profile_id: u32,
    /// NVML_COMPUTE_INSTANCE_PROFILE_* index of the full-size CI (the id NVML returns for
    /// it is checked at creation).
    pub ci_profile_id: u32,
    pub placement_start: u32,
    pub placement_size: u32,
    /// The plan slot, when the node has a plan.
    pub slot: Option<u32>,
}

/// What [`Mig::create`] made. Journal it right after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigSlice {
    pub gpu_index: u32,
    pub gpu_minor: u32,
    pub gpu_uuid: String,
    pub gi_id: u32,
    pub ci_id: u32,
    /// "MIG-<uuid>": the value for CUDA_VISIBLE_DEVICES.
    pub mig_uuid: String,
}

/// What happened to one part in teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Destroyed,
    AlreadyGone,
}

/// Result of [`Mig::destroy`] / [`Mig::destroy_gi`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Teardown {
    pub gpu_index: u32,
    pub gpu_uuid: String,
    /// The GI that was (or would have been) destroyed, when one was found.
    pub gi_id: Option<u32>,
    /// CIs destroyed inside the GI.
    pub ci_ids: Vec<u32>,
    pub ci: Outcome,
    pub gi: Outcome,
    /// How many IN_USE answers were waited out.
    pub in_use_retries: u32,
    /// Anything the operator should know (e.g. a GI id now used by another placement).
    pub note: Option<String>,
}

#[cfg(test)]
mod tests;
