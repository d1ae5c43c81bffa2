//! The job side of the SPANK plugin: before user code runs, slurmstepd (root) puts each task
//! into the job's isolation and gives it the job's environment, both read from the journal the
//! prolog wrote.
//!
//! Layers say what a task must join through their made value: `"join_cgroups": [paths]` lists
//! cgroup directories whose `cgroup.procs` the task is written into (the device allowlist and the
//! firewall key on them).

use crate::journal::{Journal, JournalDir, StepState};
use serde_json::Value;
use std::path::Path;
use tenancy_config::Config;

/// Variables to set in the task's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskEnv {
    pub vars: Vec<(String, String)>,
}

/// Moves `pid` into the job's cgroups and returns the job's environment. Fails (so the step
/// fails, never unisolated) when the job has no journal or a cgroup cannot be joined.
pub fn enter(config: &Config, job_id: u64, pid: i32) -> Result<TaskEnv, String> {
    let journals = JournalDir::open(&config.cluster.state_dir).map_err(|e| e.to_string())?;
    let journal = journals
        .load(job_id)
        .map_err(|e| format!("job {job_id}: {e}"))?
        .ok_or_else(|| {
            format!(
                "job {job_id}: no journal in {}: the tenancy prolog did not set this job up on \
                 this node (is Prolog=tenancy-prolog in slurm.conf?)",
                config.cluster.state_dir.display()
            )
        })?;
    enter_journal(&journal, pid)
}

/// [`enter`] with the job's journal already read.
pub fn enter_journal(journal: &Journal, pid: i32) -> Result<TaskEnv, String> {
    let job_id = journal.job_id;
    let mut vars = vec![("TENANCY_TENANT".to_string(), journal.tenant.clone())];
    let mut gpu = String::new();
    let mut joined: Vec<&str> = Vec::new();
    for step in &journal.steps {
        let made = match (&step.state, &step.made) {
            (StepState::Made, Some(m)) => m,
            _ => {
                return Err(format!(
                    "job {job_id}: layer {} is not set up (state {:?}); the job must not run",
                    step.layer, step.state
                ))
            }
        };
        if let Some(paths) = made.get("join_cgroups").and_then(Value::as_array) {
            for p in paths.iter().filter_map(Value::as_str) {
                // Layers may share one cgroup (devices and network key on the job's).
                if joined.contains(&p) {
                    continue;
                }
                joined.push(p);
                join(Path::new(p), pid)
                    .map_err(|e| format!("job {job_id}: layer {}: {e}", step.layer))?;
            }
        }
        match step.layer.as_str() {
            "mig" => {
                if let Some(u) = made.get("mig_uuid").and_then(Value::as_str) {
                    gpu = u.to_string();
                }
            }
            "scratch" => {
                if let Some(p) = made.get("path").and_then(Value::as_str) {
                    vars.push(("TMPDIR".into(), p.into()));
                    vars.push(("TENANCY_SCRATCH".into(), p.into()));
                }
            }
            _ => {}
        }
    }
    // A job without a slice sees no GPU (its device allowlist denies them all anyway).
    vars.push(("CUDA_VISIBLE_DEVICES".into(), gpu.clone()));
    vars.push((
        "NVIDIA_VISIBLE_DEVICES".into(),
        if gpu.is_empty() { "void".into() } else { gpu },
    ));
    Ok(TaskEnv { vars })
}

fn join(cgroup: &Path, pid: i32) -> Result<(), String> {
    std::fs::write(cgroup.join("cgroup.procs"), pid.to_string())
        .map_err(|e| format!("cannot move task {pid} into {}: {e}", cgroup.display()))
}
