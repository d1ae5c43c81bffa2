//! The two decisions the plugin delegates to the shared crates: who may run for which tenant
//! (tenancy-config) and how a task enters its job's isolation (tenancy-node).

use std::path::Path;
use tenancy_config::{Config, Identity, Resolved};

/// Loads the config and resolves the submitter's tenant and profile; the error is the one line
/// the user sees (without the `tenancy: ` prefix).
pub fn decide(
    config: Option<&Path>,
    uid: u32,
    account: Option<&str>,
    tenant: Option<&str>,
    mig: Option<&str>,
) -> Result<Resolved, String> {
    let config = tenancy_job::config_cache::load(config).map_err(|e| {
        format!(
            "cannot read the tenancy config ({}); ask your admin",
            one_line(&e.to_string())
        )
    })?;
    let who = Identity::from_uid(uid)?;
    config
        .resolve(&who, account, tenant, mig)
        .map_err(|refusal| refusal.to_string())
}

/// Puts task `pid` of `job` into the job's isolation; returns the variables to set in the task.
/// `inherited`: its slurmstepd is in the job's isolation already, so the task was born in the
/// job's IPC namespace (`tenancy_job::task::enter_inherited`).
pub fn enter(
    config: Option<&Path>,
    job: u64,
    pid: i32,
    inherited: bool,
) -> Result<Vec<(String, String)>, String> {
    let config = tenancy_job::config_cache::load(config).map_err(|e| one_line(&e.to_string()))?;
    if inherited {
        return tenancy_job::task::enter_inherited(&config, job, pid).map(|env| env.vars);
    }
    node_enter(&config, job, pid)
}

/// Puts slurmstepd `stepd` (and its task `task`, when given) into the job's isolation; false
/// when the job has no journal on this node (see `tenancy_job::task::contain_step`).
pub fn contain_step(
    config: Option<&Path>,
    job: u64,
    stepd: i32,
    task: Option<i32>,
    join_ipc: bool,
) -> Result<bool, String> {
    let config = tenancy_job::config_cache::load(config).map_err(|e| one_line(&e.to_string()))?;
    tenancy_job::task::contain_step(&config, job, stepd, task, join_ipc).map(|c| c.is_some())
}

fn node_enter(config: &Config, job: u64, pid: i32) -> Result<Vec<(String, String)>, String> {
    tenancy_job::task::enter(config, job, pid).map(|env| env.vars)
}

fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}
