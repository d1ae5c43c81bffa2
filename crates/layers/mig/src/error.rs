//! Errors of the MIG layer. Every message starts with "mig:" and names the GPU, profile,
//! placement, NVML error and what the operator should do.

use thiserror::Error;

pub type Result<T, E = MigError> = std::result::Result<T, E>;

/// Where an NVML call went wrong.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct At {
    pub gpu: Option<u32>,
    pub uuid: Option<String>,
    pub profile: Option<String>,
    /// (start, size) in memory slices.
    pub placement: Option<(u32, u32)>,
    pub gi: Option<u32>,
    pub ci: Option<u32>,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.gpu {
            Some(g) => write!(f, "GPU {g}")?,
            None => write!(f, "GPU ?")?,
        }
        if let Some(u) = &self.uuid {
            write!(f, " ({u})")?;
        }
        if let Some(p) = &self.profile {
            write!(f, ", profile {p}")?;
        }
        if let Some((s, n)) = self.placement {
            write!(f, ", placement {s}:{n}")?;
        }
        if let Some(g) = self.gi {
            write!(f, ", GI {g}")?;
        }
        if let Some(c) = self.ci {
            write!(f, ", CI {c}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Error)]
pub enum MigError {
    #[error("mig: cannot load NVML library {lib}: {nvml}; install the NVIDIA driver or set nvml_library in the tenancy config")]
    Open { lib: String, nvml: String },

    #[error("mig: {at}: {op} failed: NVML {nvml} (code {code}); {hint}")]
    Nvml {
        at: At,
        op: &'static str,
        code: u32,
        nvml: String,
        hint: String,
    },

    #[error("mig: {at}: destroy of {what} still returns NVML_ERROR_IN_USE after {attempts} attempts over {waited_ms} ms; a process (a job task or a monitoring agent such as dcgm/nvidia-smi) holds it: find it with `nvidia-smi` / `fuser -v /dev/nvidia-caps/*`, stop it, then run `tenancyctl reconcile` (or `nvidia-smi mig -dci/-dgi -gi {gi} -i {gpu_index}`); until then the slice stays allocated and the node should stay drained")]
    InUse {
        at: At,
        what: &'static str,
        attempts: u32,
        /// How long the retries waited in all.
        waited_ms: u64,
        gi: u32,
        /// The compute instance, when it was the one in use.
        ci: Option<u32>,
        gpu_index: u32,
    },

    #[error("mig: plan: {0}")]
    Plan(String),

    #[error("mig: GPU {gpu} ({name}): unknown or unsupported GPU model for MIG; supported: A100-40GB, A100-80GB, H100-80GB, H200-141GB; take this GPU out of the MIG plan")]
    UnknownModel { gpu: u32, name: String },

    #[error("mig: GPU {gpu} ({uuid}): MIG mode is {state}; enable it (`nvidia-smi -i {gpu} -mig 1`, then reset the GPU) or take the GPU out of the plan")]
    MigDisabled {
        gpu: u32,
        uuid: String,
        state: String,
    },

    #[error("mig: profile {profile} is not known for {model}; known: {known}; fix the job request or the plan")]
    UnknownProfile {
        profile: String,
        model: String,
        known: String,
    },

    #[error("mig: refused: {reason}")]
    Refused { reason: String },

    #[error("mig: no free placement for profile {profile} for tenant {tenant}: {detail}; wait for jobs to end, or check `tenancyctl mig instances` for leaked instances")]
    NoPlacement {
        profile: String,
        tenant: String,
        detail: String,
    },

    #[error("mig: {at}: placement {start}:{size} is occupied by GI {gi} (profile id {profile_id}); Slurm and the node disagree: run `tenancyctl reconcile` to remove leaked instances; drain the node until then")]
    Occupied {
        at: At,
        start: u32,
        size: u32,
        gi: u32,
        profile_id: u32,
    },

    #[error("mig: {at}: {msg}")]
    Other { at: At, msg: String },
}

impl MigError {
    /// The NVML return code, for NVML failures.
    pub fn nvml_code(&self) -> Option<u32> {
        match self {
            MigError::Nvml { code, .. } => Some(*code),
            _ => None,
        }
    }
}
