//! slurm-tenancy in Slurm's own processes: what the SPANK plugin (in `srun`, `sbatch`,
//! `salloc` and slurmstepd), pam_tenancy (in sshd) and `tenancyctl adopt` need: the job
//! context Slurm gives, the per-job journal and the node's occupancy index, the config cache,
//! the task entry, and the audit append. No isolation layer and no NVML: the spine and the
//! layers are in `tenancy-node`, which re-exports these modules.

pub mod abstract_sockets;
pub mod adopt;
pub mod audit;
pub mod config_cache;
pub mod context;
pub mod contract;
pub mod intent_log;
pub mod journal;
pub mod task;

pub use context::{EnvError, JobContext};
pub use journal::{Journal, JournalDir, Occupant, Step, StepState};
