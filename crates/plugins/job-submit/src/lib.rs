//! `job_submit/tenancy` (`job_submit_tenancy.so`), loaded by slurmctld (`JobSubmitPlugins=tenancy`
//! in slurm.conf, the file in slurmctld's `PluginDir`): refuses at submission a job the prolog
//! would refuse on the node.
//!
//! Why at slurmctld too: the SPANK plugin's check runs in sbatch/srun/salloc as the submitting
//! user, who can leave it out (their own `SLURM_CONF` and plugstack, or libslurm called
//! directly) and hand the job any `SPANK_TENANCY_TENANT`. The prolog then refuses the job, fails
//! closed, and Slurm drains the node: a user could drain every node their jobs land on. Here the
//! same decision as the prolog's ([`tenancy_config::Config::resolve`]) is taken on what slurmctld
//! received (the job's uid, account and SPANK job environment), before the job exists, so such a
//! job is refused with the reason and no node is touched. The prolog still decides again on the
//! node (the config or a membership may change while the job is pending).
//!
//! The config is found as by every command (`TENANCY_CONFIG`, `tenancy.toml` next to
//! `SLURM_CONF`, `/etc/slurm/tenancy.toml`) in slurmctld's environment, read on every submission
//! and parsed again only when its text changed. A config that cannot be read or is invalid
//! refuses every job (fail closed), with the reason in the message and slurmctld's log.
//!
//! Slurm's own symbols (`slurm_xstrdup` for the message slurmctld frees with `xfree`, its log
//! functions, `validate_super_user`) are looked up at run time in the process that loaded the
//! plugin, as slurmctld's own plugins resolve them; no panic crosses the C ABI.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tenancy_config::{request, Config, GpuPlacement, Identity, Resolved};

pub mod gres;
pub mod scheduler;
mod slurmctld;

pub use scheduler::{Placement, CRON_JOB, JOB_SHARED_MCS};
use slurmctld::{apply, bytes, log, set_err_msg, set_field, submission, super_user, tres_per};

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

/// The Slurm version (0xMMmmuu) the plugin was built against; slurmctld loads a job_submit
/// plugin only when it equals its own.
pub const SLURM_VERSION_NUMBER: u32 = sys::SLURM_VERSION_NUMBER;

#[no_mangle]
#[used]
pub static plugin_name: [u8; 29] = *b"tenancy job submission check\0";
#[no_mangle]
#[used]
pub static plugin_type: [u8; 19] = *b"job_submit/tenancy\0";
#[no_mangle]
#[used]
pub static plugin_version: c_uint = sys::SLURM_VERSION_NUMBER;

/// The SPANK job environment variables the prolog reads (set by the SPANK plugin in sbatch).
pub const TENANT_VAR: &str = "SPANK_TENANCY_TENANT";
pub const MIG_VAR: &str = "SPANK_TENANCY_MIG";
/// The job environment variables a submission path without the SPANK plugin (slurmrestd,
/// libslurm) names the tenant and MIG profile with; the plugin hands them on to the prolog as
/// the SPANK plugin would (`TENANCY_TENANT` in the SPANK job environment).
pub const ENV_TENANT: &str = "TENANCY_TENANT";
pub const ENV_MIG: &str = "TENANCY_MIG";
/// The job environment entry that makes slurmd run `su - <user>` before a batch job.
pub const GET_USER_ENV: &str = "SLURM_GET_USER_ENV=1";
#[cfg(test)]
const MAX_VALUE: usize = request::MAX_VALUE;

/// The prolog's names for the account and user (its refusals name them so).
pub const ACCOUNT_VAR: &str = "SLURM_JOB_ACCOUNT";
pub const USER_VAR: &str = "SLURM_JOB_USER";

/// `job_desc_msg_t.shared` as sbatch sets it: `--exclusive` (none), `--oversubscribe` (ok),
/// `--exclusive=user`, `--exclusive=mcs`, or unset.
pub const JOB_SHARED_NONE: u16 = 0;
pub const JOB_SHARED_OK: u16 = 1;
pub const NO_VAL16: u16 = 0xfffe;
pub const NO_VAL: u32 = 0xfffffffe;

/// What slurmctld received for one job, as the prolog will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    /// The tenant and profile came from the job's environment (`TENANCY_TENANT`,
    /// `TENANCY_MIG`), not the SPANK job environment: they are to be handed on to the prolog.
    pub from_job_env: bool,
    /// `--nodelist` and `--exclude` as given.
    pub req_nodes: Option<String>,
    pub exc_nodes: Option<String>,
    /// `--mcs-label` as given.
    pub mcs_label: Option<String>,
    /// Submitted through scrontab (`CRON_JOB` in the job's flags).
    pub cron: bool,
    pub uid: u32,
    /// Lowercased, as slurmctld stores it right after the job_submit plugins ran.
    pub account: Option<String>,
    pub tenant: Option<String>,
    pub mig: Option<String>,
    /// `job_desc_msg_t.shared` (NO_VAL16 when the user asked nothing).
    pub shared: u16,
    /// The job asks slurmd for the user's login environment (`SLURM_GET_USER_ENV=1` in its
    /// environment: `sbatch --get-user-env`, `--export=NONE`, `--export=<list>`, scrontab).
    pub get_user_env: bool,
    /// The GPUs it asks Slurm for (`--gres`, `--gpus*`), checked against `--mig` ([`gres`]).
    pub gpus: Vec<gres::GpuRequest>,
}

/// What the plugin changes in an accepted job so that slurmctld places it by its tenant's rules
/// and the prolog's cannot refuse it on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    pub resolved: Resolved,
    /// `shared` = JOB_SHARED_NONE (a node of its own): `share_node = false` without MCS, or
    /// `share_gpu = false` with a MIG slice.
    pub exclusive: bool,
    /// MCS label, node exclusions and the rest ([`Placement`]).
    pub placement: Placement,
    /// `NAME=value` entries for the SPANK job environment (the prolog reads them).
    pub spank_env: Vec<(String, String)>,
}

/// The tier rules that depend only on the request, decided where slurmctld can still place the
/// job accordingly: a tier that shares no node (`share_node = false`), or no GPU
/// (`share_gpu = false`) for a job with a MIG slice, gets a node of its own (`--exclusive`),
/// so slurmctld never puts it beside another tenant's job, nor another tenant's job beside
/// it: the prolog's occupancy check then has nothing to refuse. A user who asked to share the
/// node (`--oversubscribe`) is refused with the reason. (Node granularity for `share_gpu`:
/// Slurm 22.05's MCS plugins cannot label a job with its tenant, and GRES does not know which
/// tenant holds a MIG slice; docs/admin-guide.md, "Tier rules at submission".) A tier with
/// `gpu_placement = "gpu"` opts out for `share_gpu`: its jobs go beside other tenants and the
/// prolog gives them a GPU of their own, or refuses them when there is none.
pub fn placement(config: &Config, resolved: &Resolved, shared: u16) -> Result<bool, String> {
    let Some(tier) = config.tiers.get(&resolved.tier) else {
        return Err(format!("tier '{}' is not in the config", resolved.tier));
    };
    let rule = if !tier.share_node {
        "share_node = false"
    } else if !tier.share_gpu
        && tier.gpu_placement == GpuPlacement::Node
        && resolved.profile.is_some()
    {
        "share_gpu = false"
    } else {
        return Ok(false);
    };
    if shared == JOB_SHARED_OK {
        return Err(format!(
            "tenant '{}' (tier {}, {rule}) does not share nodes with other tenants: submit \
             without --oversubscribe (the job gets a node of its own)",
            resolved.tenant, tier.name
        ));
    }
    Ok(shared != JOB_SHARED_NONE)
}

impl Default for Submission {
    fn default() -> Self {
        Submission {
            from_job_env: false,
            req_nodes: None,
            exc_nodes: None,
            mcs_label: None,
            cron: false,
            uid: u32::MAX,
            account: None,
            tenant: None,
            mig: None,
            shared: NO_VAL16,
            get_user_env: false,
            gpus: Vec::new(),
        }
    }
}

impl Submission {
    /// Reads the job's uid, account and SPANK job environment. `spank_env` entries are
    /// `NAME=value`; a variable given twice with different values is refused (which one the
    /// node would see is not this plugin's to guess).
    pub fn from_parts(
        uid: u32,
        account: Option<&[u8]>,
        spank_env: &[&[u8]],
    ) -> Result<Self, String> {
        // The prolog's own checks (tenancy_config::request), with the same words.
        let text = |name: &str, raw: &[u8]| -> Result<Option<String>, String> {
            request::env_text(raw).map_err(|problem| format!("{name} {problem}"))
        };
        let var = |name: &str| -> Result<Option<String>, String> {
            let mut found: Option<&[u8]> = None;
            // Clients send the names as the plugin gave them (`TENANCY_TENANT`), and slurmd
            // puts `SPANK_` before every name that lacks it when it builds the prolog's
            // environment: both spellings reach the prolog as `name`.
            let bare = name.strip_prefix("SPANK_").unwrap_or(name);
            for entry in spank_env {
                let Some(eq) = entry.iter().position(|&b| b == b'=') else {
                    continue;
                };
                let (n, value) = (&entry[..eq], &entry[eq + 1..]);
                if n != name.as_bytes() && n != bare.as_bytes() {
                    continue;
                }
                match found {
                    Some(earlier) if earlier != value => {
                        return Err(format!("{name} is given twice, with different values"))
                    }
                    _ => found = Some(value),
                }
            }
            found.map_or(Ok(None), |v| text(name, v))
        };
        let account = account
            .map(|a| text(ACCOUNT_VAR, a))
            .transpose()?
            .flatten()
            .map(|a| a.to_ascii_lowercase());
        if let Some(problem) = account.as_deref().and_then(request::name_problem) {
            return Err(format!("{ACCOUNT_VAR} {problem}"));
        }
        Ok(Submission {
            uid,
            account,
            tenant: var(TENANT_VAR)?,
            mig: var(MIG_VAR)?,
            ..Submission::default()
        })
    }

    /// Takes what the job's own environment says (`NAME=value` entries): slurmd loads the
    /// user's login environment for a batch job whose environment holds exactly
    /// `SLURM_GET_USER_ENV=1` (req.c `_get_user_env`), whoever put it there.
    pub fn with_job_environment(mut self, env: &[&[u8]]) -> Self {
        self.get_user_env = env.iter().any(|e| *e == GET_USER_ENV.as_bytes());
        self
    }

    /// A job that reached slurmctld without the SPANK plugin's job environment (slurmrestd,
    /// a program on libslurm) names its tenant and MIG profile in its own environment,
    /// `TENANCY_TENANT` and `TENANCY_MIG`: taken (and checked the same way) only when the SPANK
    /// job environment names neither, so `sbatch --tenant` always wins over a variable the
    /// user's shell exports.
    pub fn with_request_from_environment(mut self, env: &[&[u8]]) -> Result<Self, String> {
        if self.tenant.is_some() || self.mig.is_some() {
            return Ok(self);
        }
        let var = |name: &str| -> Result<Option<String>, String> {
            let mut found: Option<&[u8]> = None;
            for entry in env {
                let Some(value) = entry
                    .strip_prefix(name.as_bytes())
                    .and_then(|r| r.strip_prefix(b"="))
                else {
                    continue;
                };
                match found {
                    Some(earlier) if earlier != value => {
                        return Err(format!("{name} is given twice, with different values"))
                    }
                    _ => found = Some(value),
                }
            }
            found
                .map_or(Ok(None), request::env_text)
                .map_err(|problem| format!("{name} {problem}"))
        };
        self.tenant = var(ENV_TENANT)?;
        self.mig = var(ENV_MIG)?;
        self.from_job_env = self.tenant.is_some() || self.mig.is_some();
        Ok(self)
    }

    /// The prolog's decision, taken here: the error is the one line the user sees.
    pub fn check(&self, config: &Config) -> Result<Resolved, String> {
        let who = Identity::from_uid(self.uid)?;
        // Slurm gives the prolog this name as SLURM_JOB_USER, which it checks so.
        if let Some(problem) = request::name_problem(&who.user) {
            return Err(format!("{USER_VAR} {problem}"));
        }
        let resolved = config
            .resolve(
                &who,
                self.account.as_deref(),
                self.tenant.as_deref(),
                self.mig.as_deref(),
            )
            .map_err(|refusal| refusal.to_string())?;
        if self.get_user_env {
            let allowed = config
                .tiers
                .get(&resolved.tier)
                .is_some_and(|t| t.allow_get_user_env);
            if !allowed && self.cron {
                return Err(format!(
                    "scrontab jobs ask for your login environment (scrontab sets \
                     {GET_USER_ENV} in every one): slurmd would run your login shell as root \
                     outside every job's isolation, and tier '{}' of tenant '{}' does not \
                     allow it; run the job with sbatch --begin from a job of your own, or ask \
                     your admin for allow_get_user_env",
                    resolved.tier, resolved.tenant
                ));
            }
            if !allowed {
                return Err(format!(
                    "the job asks for your login environment (--get-user-env, or \
                     --export=NONE or --export=<list>, for which sbatch sets {GET_USER_ENV} \
                     itself, or that variable in its environment, as scrontab sets): slurmd \
                     would run your login shell as root outside every job's isolation, and \
                     tier '{}' of tenant '{}' does not allow it; submit without \
                     --get-user-env and with --export=ALL (the default), setting what the job \
                     needs in the environment you submit from (VAR=value sbatch ...) or in \
                     the job script, or ask your admin for allow_get_user_env",
                    resolved.tier, resolved.tenant
                ));
            }
        }
        Ok(resolved)
    }
}

/// The config last parsed, with the path and text it came from: slurmctld runs for months and
/// sees many submissions, the config rarely changes.
static PARSED: Mutex<Option<(PathBuf, String, Arc<Config>)>> = Mutex::new(None);

/// Finds and reads the config; parses it only when the path or text differ from the last time.
pub fn current_config() -> Result<Arc<Config>, String> {
    let unreadable = |e: &dyn std::fmt::Display| {
        format!(
            "cannot read the tenancy config on the controller ({}); ask your admin",
            one_line(&e.to_string())
        )
    };
    let path = Config::find(None).map_err(|e| unreadable(&e))?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| unreadable(&format!("{}: {e}", path.display())))?;
    let mut parsed = PARSED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, t, c)) = parsed.as_ref() {
        if *p == path && *t == text {
            return Ok(Arc::clone(c));
        }
    }
    let config = Arc::new(Config::parse(&text, &path).map_err(|e| unreadable(&e))?);
    *parsed = Some((path, text, Arc::clone(&config)));
    Ok(config)
}

/// The whole check of one submission: the job is accepted with `Ok`.
pub fn decide(submission: Result<Submission, String>) -> Result<Accepted, String> {
    let submission = submission?;
    let config = current_config()?;
    let slurm = if scheduler::needs_slurm_conf(&config) {
        match scheduler::current_slurm_conf() {
            Ok(s) => Some(s),
            // Pools cannot be kept without it (refused in decide_in); share_node = false
            // falls back to a node of its own.
            Err(e) => {
                log(true, &format!("slurm.conf: {e}"));
                None
            }
        }
    } else {
        None
    };
    decide_in(&submission, &config, slurm.as_deref())
}

/// [`decide`] with a config at hand and no slurm.conf: no node pools, no MCS.
pub fn decide_with(submission: &Submission, config: &Config) -> Result<Accepted, String> {
    decide_in(submission, config, None)
}

/// The whole decision, with slurm.conf when the config needs it (node pools, MCS labels).
pub fn decide_in(
    submission: &Submission,
    config: &Config,
    slurm: Option<&tenancy_config::slurm_conf::SlurmConf>,
) -> Result<Accepted, String> {
    let resolved = submission.check(config)?;
    gres::check(config, resolved.profile.as_deref(), &submission.gpus)?;
    let who = Identity::from_uid(submission.uid)?;
    let mcs = scheduler::mcs_placement(
        config,
        &resolved,
        &who,
        submission.account.as_deref(),
        submission.mcs_label.as_deref(),
        slurm,
    )?;
    let tier = &config.tiers[&resolved.tier];
    // share_node = false packs a tenant's jobs by MCS label where slurm.conf has it; without
    // it, a node of its own (share_gpu = false with a MIG slice always takes one).
    let by_mcs = mcs.as_ref().is_some_and(|p| p.mcs_label.is_some());
    let mut exclusive = placement(config, &resolved, submission.shared)?;
    if by_mcs && !tier.share_node {
        // No other tenant on the node at all: no GPU of it is shared either.
        exclusive = false;
    }
    let mut placement = mcs.unwrap_or_default();
    placement.exclusive = exclusive;
    if config.has_pools() {
        let slurm = slurm.ok_or_else(|| {
            "the tenancy config has node pools and slurm.conf cannot be read on the \
             controller; ask your admin"
                .to_string()
        })?;
        placement.exc_nodes = scheduler::pool_placement(
            config,
            &resolved.tenant,
            slurm,
            submission.req_nodes.as_deref(),
            submission.exc_nodes.as_deref(),
        )?;
    }
    let mut spank_env = Vec::new();
    if submission.from_job_env {
        if let Some(t) = &submission.tenant {
            spank_env.push(("TENANCY_TENANT".to_string(), t.clone()));
        }
        if let Some(m) = &submission.mig {
            spank_env.push(("TENANCY_MIG".to_string(), m.clone()));
        }
    }
    Ok(Accepted {
        resolved,
        exclusive,
        placement,
        spank_env,
    })
}

fn one_line(s: &str) -> String {
    s.split('\n')
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

// ---- the plugin interface ----------------------------------------------------------------

const SUCCESS: c_int = sys::SLURM_SUCCESS as c_int;
const REFUSED: c_int = sys::slurm_err_t::ESLURM_ACCESS_DENIED as c_int;

#[no_mangle]
pub extern "C" fn init() -> c_int {
    SUCCESS
}

#[no_mangle]
pub extern "C" fn fini() -> c_int {
    SUCCESS
}

/// Called by slurmctld for every job submission and allocation request (sbatch, salloc, srun
/// without an allocation), before the job exists.
///
/// # Safety
/// Called by slurmctld with a valid `job_desc` and `err_msg`.
#[no_mangle]
pub unsafe extern "C" fn job_submit(
    job_desc: *mut sys::job_desc_msg_t,
    submit_uid: u32,
    err_msg: *mut *mut c_char,
) -> c_int {
    if job_desc.is_null() {
        return REFUSED;
    }
    let mut from_job_env = false;
    let verdict = catch_unwind(AssertUnwindSafe(|| {
        let s = submission(&*job_desc);
        from_job_env = s.as_ref().is_ok_and(|s| s.from_job_env);
        decide(s)
    }))
    .unwrap_or_else(|_| Err("internal error in the tenancy check; ask your admin".into()));
    match verdict {
        Ok(accepted) => {
            if let Err(e) = apply(job_desc, &accepted) {
                let why =
                    format!("cannot place the job by its tenant's rules ({e}); ask your admin");
                log(true, &why);
                set_err_msg(err_msg, &format!("tenancy: {why}"));
                return REFUSED;
            }
            let p = &accepted.placement;
            if accepted.exclusive || p.mcs_label.is_some() || p.exc_nodes.is_some() {
                log(
                    false,
                    &format!(
                        "job of uid {} for tenant '{}' (tier {}):{}{}{}",
                        (*job_desc).user_id,
                        accepted.resolved.tenant,
                        accepted.resolved.tier,
                        if accepted.exclusive { " exclusive" } else { "" },
                        p.mcs_label
                            .as_ref()
                            .map(|l| format!(" mcs_label={l}"))
                            .unwrap_or_default(),
                        p.exc_nodes
                            .as_ref()
                            .map(|e| format!(" exc_nodes={e}"))
                            .unwrap_or_default(),
                    ),
                );
            }
            SUCCESS
        }
        Err(why) => {
            let uid = (*job_desc).user_id;
            log(
                false,
                &format!("refused a job of uid {uid} (submitted by uid {submit_uid}): {why}"),
            );
            if from_job_env && hold_refused(job_desc, &why).is_ok() {
                set_err_msg(err_msg, &format!("tenancy: {why} {HELD_NOTE}"));
                return SUCCESS;
            }
            set_err_msg(err_msg, &format!("tenancy: {why}"));
            REFUSED
        }
    }
}

/// What a refused request named in `TENANCY_TENANT`/`TENANCY_MIG` is told besides the reason.
pub const HELD_NOTE: &str = "(refused: the job is held and never runs; scancel it)";

/// A refused job whose tenant came from its environment (slurmrestd, libslurm): slurmctld
/// hands a refusal's message to libslurm, which logs it and drops it, so a REST client would
/// see only "Access/permission denied". Such a job is accepted held instead (priority 0), its
/// comment and the submit response's message (`job_submit_user_msg`) carrying the one-line
/// reason, with a deadline it cannot meet: a minute of time limit and a deadline 61 seconds
/// away. Slurm cancels a job past its deadline before it would start it (`deadline_ok`), so
/// a release of the hold ends it (state DEADLINE) and it never reaches a node.
///
/// # Safety
/// `desc` is a job description from slurmctld.
unsafe fn hold_refused(desc: *mut sys::job_desc_msg_t, why: &str) -> Result<(), String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as libc::time_t)
        .unwrap_or(0);
    (*desc).priority = 0;
    (*desc).time_limit = 1;
    (*desc).time_min = NO_VAL;
    (*desc).deadline = now + 61;
    let comment: String = format!("tenancy: refused: {why}")
        .chars()
        .take(1000)
        .collect();
    set_field(&mut (*desc).comment, &comment)
}

/// The job an update's `job_desc` names. Slurm 26.05 moved it into `step_id` (beside the
/// job's SLUID); the release is the headers' (build-support/slurm_bindings.rs).
#[cfg(not(slurm_ge_26_05))]
fn job_id(desc: &sys::job_desc_msg_t) -> u32 {
    desc.job_id
}

#[cfg(slurm_ge_26_05)]
fn job_id(desc: &sys::job_desc_msg_t) -> u32 {
    desc.step_id.job_id
}

/// Called by slurmctld for `scontrol update job`. What it is given holds only the changed
/// fields, not the job's tenant, so a new account a tenant owns is accepted only when it cannot
/// contradict the tenant: from an administrator, or from a user who is a member of that tenant
/// and of no other one (the job's tenant was checked against their memberships at submission).
/// The job's `--mig` is not in an update either (nor readable here: `job_record_t` is
/// slurmctld's own), so only an administrator may change its GPU requests: they were checked
/// against `--mig` at submission ([`gres`]). From 23.02 slurmctld also passes `err_msg`, and
/// the submitter sees the reason.
///
/// # Safety
/// Called by slurmctld with a valid `job_desc` (and `err_msg`, from 23.02).
#[cfg(slurm_ge_24_11)]
#[no_mangle]
pub unsafe extern "C" fn job_modify(
    job_desc: *mut sys::job_desc_msg_t,
    _job_ptr: *mut c_void,
    submit_uid: u32,
    err_msg: *mut *mut c_char,
) -> c_int {
    modify(job_desc, submit_uid, err_msg)
}

/// [`job_modify`] of 22.05, whose slurmctld passes no `err_msg` (the reason is logged).
///
/// # Safety
/// Called by slurmctld with a valid `job_desc`.
#[cfg(not(slurm_ge_24_11))]
#[no_mangle]
pub unsafe extern "C" fn job_modify(
    job_desc: *mut sys::job_desc_msg_t,
    _job_ptr: *mut c_void,
    submit_uid: u32,
) -> c_int {
    modify(job_desc, submit_uid, std::ptr::null_mut())
}

/// # Safety
/// `job_desc` is valid; `err_msg` is null or as [`set_err_msg`] takes it.
unsafe fn modify(
    job_desc: *mut sys::job_desc_msg_t,
    submit_uid: u32,
    err_msg: *mut *mut c_char,
) -> c_int {
    if job_desc.is_null() {
        return REFUSED;
    }
    let job = job_id(&*job_desc);
    let verdict = catch_unwind(AssertUnwindSafe(|| {
        let account =
            bytes((*job_desc).account).map(|a| String::from_utf8_lossy(a).to_ascii_lowercase());
        // An account the prolog refuses would drain the node the job lands on, whoever set it.
        if let Some(problem) = account.as_deref().and_then(request::name_problem) {
            return Err(format!("job {job}: {ACCOUNT_VAR} {problem}"));
        }
        let shares = (*job_desc).shared == JOB_SHARED_OK;
        let text = |p: *const c_char| bytes(p).map(|b| String::from_utf8_lossy(b).into_owned());
        let nodes = text((*job_desc).req_nodes).is_some() || text((*job_desc).exc_nodes).is_some();
        let label = text((*job_desc).mcs_label).is_some();
        let gpus = gres::update_touches_gpus(&tres_per(&*job_desc));
        if (account.is_none() && !shares && !nodes && !label && gpus.is_none())
            || super_user(submit_uid)
        {
            return Ok(());
        }
        // The node lists carry the tenant's pool rules and the MCS label its tenant: set at
        // submission, changed by administrators alone.
        if label {
            return Err(format!(
                "job {job}: only an administrator may change a job's MCS label: it keeps the \
                 tenant's nodes its own"
            ));
        }
        if nodes && current_config()?.has_pools() {
            return Err(format!(
                "job {job}: only an administrator may change a job's node lists (NodeList, \
                 ExcNodeList): they keep the job on the nodes its tenant may use; cancel the \
                 job and submit it again with --nodelist or --exclude"
            ));
        }
        if account.is_none() && !shares && gpus.is_none() {
            return Ok(());
        }
        // The job's tier is not known here: a tier that shares no node would land beside
        // another tenant and be refused on the node. Administrators may.
        if shares {
            return Err(format!(
                "job {job}: only an administrator may let a job share its node \
                 (OverSubscribe=yes): a tenant's tier may forbid it"
            ));
        }
        if let Some(gpus) = gpus {
            return Err(format!(
                "job {job}: only an administrator may change a job's GPU request (GRES \
                 {gpus}): its --mig slice and its GRES were checked together at submission, \
                 and an update names only the GRES; cancel the job and submit it again with \
                 both (--mig=<profile> --gres=gpu:<profile>:1)"
            ));
        }
        check_account_change(&*current_config()?, submit_uid, job, account.as_deref())
    }))
    .unwrap_or_else(|_| Err("internal error in the tenancy check".into()));
    match verdict {
        Ok(()) => SUCCESS,
        Err(why) => {
            log(false, &format!("refused an update: {why}"));
            set_err_msg(err_msg, &format!("tenancy: {why}"));
            REFUSED
        }
    }
}

/// The account change of [`job_modify`] by a user who is not an administrator.
pub fn check_account_change(
    config: &Config,
    uid: u32,
    job: u32,
    account: Option<&str>,
) -> Result<(), String> {
    let Some(account) = account else {
        return Ok(());
    };
    let Some(owner) = config.tenant_of_account(account) else {
        return Ok(());
    };
    let who = Identity::from_uid(uid)?;
    let mine: Vec<&str> = config
        .tenants
        .values()
        .filter(|t| config.is_member(&who, t))
        .map(|t| t.name.as_str())
        .collect();
    if mine == [owner.name.as_str()] {
        return Ok(());
    }
    Err(format!(
        "user {} may not move job {job} to account '{account}' of tenant '{}': the prolog \
         checks the account against the job's tenant; cancel the job and submit it again with \
         --account",
        who.user, owner.name
    ))
}

#[cfg(test)]
mod tests;
