//! The job's cgroup, owned in one place. The device layer attaches its program (or v1 rules)
//! to it, the firewall matches its tenant ancestor, tasks, slurmstepd and ssh sessions join
//! it, and the epilog ends what is left in it: all of that goes through this crate, so there
//! is one way to find the cgroup mount, one way to make `tenancy/<tenant>/job_<id>` (no
//! symlink followed), one way to put a process in, one way to end its processes and one way
//! to remove it.

pub mod job;
pub mod layout;
pub mod slurm;

pub use job::{CgroupError, JobCgroup, PRODUCT_DIR};
pub use layout::{v2_mount, CgroupLayout, LayoutKind};
pub use slurm::SlurmScope;
