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

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tenancy_config::{request, Config, GpuPlacement, Identity, Resolved};

pub mod gres;
pub mod scheduler;
pub use scheduler::{Placement, CRON_JOB, JOB_SHARED_MCS};

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

// ---- slurmctld's symbols, found at run time -----------------------------------------------

fn symbol(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the symbol up.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// Logs one line through slurmctld's log (`slurm_info` / `slurm_error`), or stderr outside it.
fn log(error: bool, msg: &str) {
    let line =
        CString::new(format!("job_submit/tenancy: {msg}").replace('\0', " ")).unwrap_or_default();
    let f = symbol(if error { c"slurm_error" } else { c"slurm_info" });
    if f.is_null() {
        eprintln!("{}", line.to_string_lossy());
        return;
    }
    // SAFETY: both are `fn(const char *fmt, ...)` in Slurm's log.h; "%s" takes one C string.
    unsafe {
        let f: unsafe extern "C" fn(*const c_char, ...) -> c_int = std::mem::transmute(f);
        f(c"%s".as_ptr(), line.as_ptr());
    }
}

/// Hands `msg` to slurmctld as the message the submitter sees (it frees it with `xfree`, so it
/// must come from Slurm's `xstrdup`).
///
/// # Safety
/// `err_msg` is null or points to a `char *` that is null or was allocated by Slurm.
unsafe fn set_err_msg(err_msg: *mut *mut c_char, msg: &str) {
    if err_msg.is_null() {
        return;
    }
    let xstrdup = symbol(c"slurm_xstrdup");
    let Ok(text) = CString::new(msg.replace('\0', " ")) else {
        return;
    };
    if xstrdup.is_null() {
        return;
    }
    let xstrdup: unsafe extern "C" fn(*const c_char) -> *mut c_char = std::mem::transmute(xstrdup);
    let old = *err_msg;
    if !old.is_null() {
        // An earlier plugin's message: ours is the reason the job is refused, keep both.
        let both = CString::new(format!(
            "{}\n{}",
            CStr::from_ptr(old).to_string_lossy(),
            msg
        ))
        .unwrap_or(text.clone());
        let xfree = symbol(c"slurm_xfree");
        if !xfree.is_null() {
            let xfree: unsafe extern "C" fn(*mut *mut c_void) = std::mem::transmute(xfree);
            let mut p = old.cast::<c_void>();
            xfree(&mut p);
            *err_msg = xstrdup(both.as_ptr());
        }
        return;
    }
    *err_msg = xstrdup(text.as_ptr());
}

/// Whether `uid` is root or a Slurm administrator (slurmctld's `validate_super_user`).
fn super_user(uid: u32) -> bool {
    if uid == 0 {
        return true;
    }
    let f = symbol(c"validate_super_user");
    if f.is_null() {
        return false;
    }
    // SAFETY: `extern bool validate_super_user(uid_t uid)` in slurmctld.
    unsafe {
        let f: unsafe extern "C" fn(libc::uid_t) -> bool = std::mem::transmute(f);
        f(uid)
    }
}

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn bytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    (!p.is_null()).then(|| CStr::from_ptr(p).to_bytes())
}

/// # Safety
/// `desc` points to a valid `job_desc_msg_t`.
unsafe fn submission(desc: &sys::job_desc_msg_t) -> Result<Submission, String> {
    let mut env = Vec::new();
    if !desc.spank_job_env.is_null() {
        for i in 0..desc.spank_job_env_size as usize {
            if let Some(e) = bytes(*desc.spank_job_env.add(i)) {
                env.push(e);
            }
        }
    }
    let mut job_env = Vec::new();
    if !desc.environment.is_null() {
        for i in 0..desc.env_size as usize {
            if let Some(e) = bytes(*desc.environment.add(i)) {
                job_env.push(e);
            }
        }
    }
    let text = |p: *const c_char| bytes(p).map(|b| String::from_utf8_lossy(b).into_owned());
    Submission::from_parts(desc.user_id, bytes(desc.account), &env)
        .and_then(|s| s.with_request_from_environment(&job_env))
        .map(|mut s| {
            s.shared = desc.shared;
            s.req_nodes = text(desc.req_nodes);
            s.exc_nodes = text(desc.exc_nodes);
            s.mcs_label = text(desc.mcs_label);
            s.cron = desc.bitflags & CRON_JOB != 0;
            s.gpus = tres_per(desc)
                .into_iter()
                .flatten()
                .flat_map(gres::gpu_requests)
                .collect();
            s.with_job_environment(&job_env)
        })
}

/// Replaces a string field of the job description with a copy made by Slurm's `xstrdup` (the
/// old one freed by `xfree`, as slurmctld frees the field later).
///
/// # Safety
/// `field` points to a `char *` of a job description that is null or Slurm-allocated.
unsafe fn set_field(field: *mut *mut c_char, value: &str) -> Result<(), String> {
    let xstrdup = symbol(c"slurm_xstrdup");
    let xfree = symbol(c"slurm_xfree");
    if xstrdup.is_null() || xfree.is_null() {
        return Err("Slurm's xstrdup/xfree not found in this process".into());
    }
    let v = CString::new(value).map_err(|_| "a NUL byte in a value".to_string())?;
    let xstrdup: unsafe extern "C" fn(*const c_char) -> *mut c_char = std::mem::transmute(xstrdup);
    let xfree: unsafe extern "C" fn(*mut *mut c_void) = std::mem::transmute(xfree);
    if !(*field).is_null() {
        let mut p = (*field).cast::<c_void>();
        xfree(&mut p);
    }
    *field = xstrdup(v.as_ptr());
    Ok(())
}

/// Sets `NAME=value` in the job's SPANK environment (Slurm's `env_array_overwrite`, so
/// slurmctld owns and frees it), keeping `spank_job_env_size` right.
///
/// # Safety
/// `desc` is a job description from slurmctld.
unsafe fn set_spank_env(
    desc: *mut sys::job_desc_msg_t,
    name: &str,
    value: &str,
) -> Result<(), String> {
    let f = symbol(c"slurm_env_array_overwrite");
    if f.is_null() {
        return Err("Slurm's env_array_overwrite not found in this process".into());
    }
    let f: unsafe extern "C" fn(*mut *mut *mut c_char, *const c_char, *const c_char) -> c_int =
        std::mem::transmute(f);
    let (n, v) = (
        CString::new(name).map_err(|_| "a NUL byte in a name".to_string())?,
        CString::new(value).map_err(|_| "a NUL byte in a value".to_string())?,
    );
    if f(&mut (*desc).spank_job_env, n.as_ptr(), v.as_ptr()) == 0 {
        return Err(format!("cannot set {name} in the job's SPANK environment"));
    }
    let mut count = 0usize;
    while !(*(*desc).spank_job_env.add(count)).is_null() {
        count += 1;
    }
    (*desc).spank_job_env_size = count as u32;
    Ok(())
}

/// Makes the accepted job what the decision says.
///
/// # Safety
/// `desc` is a job description from slurmctld.
unsafe fn apply(desc: *mut sys::job_desc_msg_t, accepted: &Accepted) -> Result<(), String> {
    let p = &accepted.placement;
    if accepted.exclusive {
        // As `--exclusive` would: slurmctld copies it into the job's record after this.
        (*desc).shared = JOB_SHARED_NONE;
    } else if p.shared_mcs {
        (*desc).shared = JOB_SHARED_MCS;
    }
    if let Some(l) = &p.mcs_label {
        set_field(&mut (*desc).mcs_label, l)?;
    }
    if let Some(a) = &p.account {
        set_field(&mut (*desc).account, a)?;
    }
    if let Some(e) = &p.exc_nodes {
        set_field(&mut (*desc).exc_nodes, e)?;
    }
    for (n, v) in &accepted.spank_env {
        set_spank_env(desc, n, v)?;
    }
    Ok(())
}

/// The four fields every GPU request of a job lands in (module [`gres`]).
///
/// # Safety
/// `desc` points to a valid `job_desc_msg_t`.
unsafe fn tres_per(desc: &sys::job_desc_msg_t) -> [Option<&str>; 4] {
    [
        desc.tres_per_job,
        desc.tres_per_node,
        desc.tres_per_socket,
        desc.tres_per_task,
    ]
    .map(|p| bytes(p).and_then(|b| std::str::from_utf8(b).ok()))
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
mod tests {
    use super::*;
    use tenancy_test_support::{GpuPlacement as TestPlacement, ScratchOnExit, TenancyToml};

    /// A config with a tenant the test's user is a member of (through its primary group) and one
    /// it is not (a group NSS does not know).
    fn config() -> (tempfile::TempDir, PathBuf, Config) {
        let me = Identity::from_uid(rustix_uid()).expect("the test's own user");
        let group = nix_group_name(me.gid);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tenancy.toml");
        let mut text = TenancyToml::under("t", dir.path());
        text.tier("internal")
            .mig_profiles(["1g.18gb"])
            .share_gpu(true)
            .share_node(true)
            .scratch_on_exit(ScratchOnExit::Wipe);
        text.tenant("mine")
            .tier("internal")
            .groups([&group])
            .accounts(["mine-acct"]);
        text.tenant("other")
            .tier("internal")
            .groups(["tenancy-no-such-group"])
            .accounts(["other-acct"]);
        let text = text.to_string();
        std::fs::write(&path, &text).unwrap();
        let config = Config::parse(&text, &path).expect("valid test config");
        (dir, path, config)
    }

    fn rustix_uid() -> u32 {
        // SAFETY: getuid cannot fail.
        unsafe { libc::getuid() }
    }

    fn nix_group_name(gid: u32) -> String {
        // SAFETY: getgrgid returns a pointer into static storage or null; read at once.
        unsafe {
            let g = libc::getgrgid(gid);
            assert!(
                !g.is_null(),
                "the test user's primary group {gid} has no name"
            );
            CStr::from_ptr((*g).gr_name).to_string_lossy().into_owned()
        }
    }

    fn submission(env: &[&str], account: Option<&str>) -> Result<Submission, String> {
        let env: Vec<&[u8]> = env.iter().map(|e| e.as_bytes()).collect();
        Submission::from_parts(rustix_uid(), account.map(str::as_bytes), &env)
    }

    #[test]
    fn reads_what_the_prolog_reads_from_the_spank_environment() {
        let s = submission(
            &[
                "SPANK_OTHER=x",
                "SPANK_TENANCY_TENANTX=no",
                "SPANK_TENANCY_TENANT=mine",
                "SPANK_TENANCY_MIG=1g.18gb",
            ],
            Some("Mine-Acct"),
        )
        .unwrap();
        assert_eq!(s.tenant.as_deref(), Some("mine"));
        assert_eq!(s.mig.as_deref(), Some("1g.18gb"));
        // slurmctld lowercases the account after the job_submit plugins, and the prolog sees that.
        assert_eq!(s.account.as_deref(), Some("mine-acct"));
        // Empty values are absent, as in the prolog; the same value twice is one value.
        let s = submission(
            &[
                "SPANK_TENANCY_TENANT=",
                "SPANK_TENANCY_MIG=a",
                "SPANK_TENANCY_MIG=a",
            ],
            Some(""),
        )
        .unwrap();
        assert_eq!(
            (s.tenant, s.mig.as_deref(), s.account),
            (None, Some("a"), None)
        );
    }

    #[test]
    fn refuses_what_the_prolog_could_not_read() {
        let twice = submission(
            &["SPANK_TENANCY_TENANT=mine", "SPANK_TENANCY_TENANT=other"],
            None,
        );
        assert!(twice
            .unwrap_err()
            .contains("SPANK_TENANCY_TENANT is given twice"));
        // The two spellings slurmd merges into one variable of the prolog.
        let both = submission(&["TENANCY_TENANT=mine", "SPANK_TENANCY_TENANT=other"], None);
        assert!(both.unwrap_err().contains("given twice"));
        let control = submission(&["SPANK_TENANCY_TENANT=mine\nother"], None);
        assert!(control.unwrap_err().contains("control characters"));
        let bad = Submission::from_parts(0, None, &[b"SPANK_TENANCY_MIG=\xff"]);
        assert!(bad
            .unwrap_err()
            .contains("SPANK_TENANCY_MIG is not valid UTF-8"));
        let long = format!("SPANK_TENANCY_TENANT={}", "a".repeat(MAX_VALUE + 1));
        assert!(submission(&[&long], None)
            .unwrap_err()
            .contains("bytes long"));
    }

    /// `SLURM_GET_USER_ENV=1` in the job's environment (whoever put it there) is refused
    /// unless the tenant's tier allows it; a look-alike value is not the request.
    #[test]
    fn a_login_environment_is_refused_unless_the_tier_allows_it() {
        let (_dir, path, config) = config();
        let job = |env: &[&str]| {
            let env: Vec<&[u8]> = env.iter().map(|e| e.as_bytes()).collect();
            submission(&["SPANK_TENANCY_TENANT=mine"], None)
                .unwrap()
                .with_job_environment(&env)
        };
        let asked = job(&["PATH=/bin", "SLURM_GET_USER_ENV=1"]);
        assert!(asked.get_user_env);
        let why = asked.check(&config).unwrap_err();
        assert!(
            why.contains("--get-user-env") && why.contains("tier 'internal'"),
            "{why}"
        );
        for other in [
            &["SLURM_GET_USER_ENV=0"][..],
            &["SLURM_GET_USER_ENV=1x"],
            &[],
        ] {
            assert!(!job(other).get_user_env, "{other:?}");
            job(other).check(&config).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap().replace(
            "scratch_on_exit = \"wipe\"\n",
            "scratch_on_exit = \"wipe\"\nallow_get_user_env = true\n",
        );
        let allowing = Config::parse(&text, &path).unwrap();
        assert!(allowing.tiers["internal"].allow_get_user_env);
        job(&["SLURM_GET_USER_ENV=1"]).check(&allowing).unwrap();
    }

    #[test]
    fn takes_the_prologs_decision() {
        let (_dir, _path, config) = config();
        let check =
            |env: &[&str], account: Option<&str>| submission(env, account).unwrap().check(&config);
        let ok = check(
            &["SPANK_TENANCY_TENANT=mine", "SPANK_TENANCY_MIG=1g.18gb"],
            Some("mine-acct"),
        )
        .unwrap();
        assert_eq!(
            (ok.tenant.as_str(), ok.profile.as_deref()),
            ("mine", Some("1g.18gb"))
        );
        // No --tenant: the one tenant the user is a member of.
        assert_eq!(check(&[], None).unwrap().tenant, "mine");
        let not_member = check(&["SPANK_TENANCY_TENANT=other"], None).unwrap_err();
        assert!(
            not_member.contains("not a member of tenant 'other'"),
            "{not_member}"
        );
        let unknown = check(&["SPANK_TENANCY_TENANT=nope"], None).unwrap_err();
        assert!(unknown.contains("nope"), "{unknown}");
        let profile = check(
            &["SPANK_TENANCY_TENANT=mine", "SPANK_TENANCY_MIG=7g.141gb"],
            None,
        )
        .unwrap_err();
        assert!(profile.contains("7g.141gb"), "{profile}");
        let account = check(&["SPANK_TENANCY_TENANT=mine"], Some("OTHER-ACCT")).unwrap_err();
        assert!(
            account.contains("other-acct") && account.contains("other"),
            "{account}"
        );
    }

    #[test]
    fn refuses_accounts_the_prolog_refuses_with_its_words() {
        let bad = submission(&[], Some("bad acct")).unwrap_err();
        assert!(
            bad.starts_with("SLURM_JOB_ACCOUNT is not a plain name: 'bad acct'"),
            "{bad}"
        );
        let long = submission(&[], Some(&"a".repeat(200))).unwrap_err();
        assert!(long.contains("200 bytes long (at most 128)"), "{long}");
        // What Slurm takes for an account, the prolog takes too.
        assert_eq!(
            submission(&[], Some("Acme.A$")).unwrap().account.as_deref(),
            Some("acme.a$")
        );
    }

    #[test]
    fn tiers_that_share_no_node_or_gpu_get_a_node_of_their_own() {
        let mut text = TenancyToml::under("t", std::path::Path::new("/"));
        text.tier("open").mig_profiles(["1g.18gb"]);
        text.tier("alone").share_node(false);
        text.tier("gpu-alone")
            .mig_profiles(["1g.18gb"])
            .share_gpu(false);
        text.tier("gpu-packed")
            .mig_profiles(["1g.18gb"])
            .share_gpu(false)
            .gpu_placement(TestPlacement::Gpu);
        for (tenant, tier, group) in [
            ("a", "open", "root"),
            ("b", "alone", "daemon"),
            ("c", "gpu-alone", "bin"),
            ("d", "gpu-packed", "sys"),
        ] {
            text.tenant(tenant).tier(tier).groups([group]);
        }
        let text = text.to_string();
        let config = Config::parse(&text, std::path::Path::new("/t.toml")).unwrap();
        let r = |tenant: &str, tier: &str, profile: Option<&str>| Resolved {
            tenant: tenant.into(),
            tier: tier.into(),
            profile: profile.map(String::from),
            tenant_gid: Some(0),
        };
        let p = |res: &Resolved, shared| placement(&config, res, shared);
        assert_eq!(p(&r("a", "open", Some("1g.18gb")), NO_VAL16), Ok(false));
        assert_eq!(p(&r("b", "alone", None), NO_VAL16), Ok(true));
        assert_eq!(p(&r("b", "alone", None), 2), Ok(true));
        assert_eq!(p(&r("b", "alone", None), JOB_SHARED_NONE), Ok(false));
        let e = p(&r("b", "alone", None), JOB_SHARED_OK).unwrap_err();
        assert!(
            e.contains("share_node = false") && e.contains("--oversubscribe"),
            "{e}"
        );
        assert_eq!(p(&r("c", "gpu-alone", Some("1g.18gb")), NO_VAL16), Ok(true));
        assert_eq!(p(&r("c", "gpu-alone", None), NO_VAL16), Ok(false));
        assert!(p(&r("c", "gpu-alone", Some("1g.18gb")), JOB_SHARED_OK)
            .unwrap_err()
            .contains("share_gpu = false"));
        // Opted out: placed by the prolog on a GPU of its own, beside other tenants.
        assert_eq!(
            p(&r("d", "gpu-packed", Some("1g.18gb")), NO_VAL16),
            Ok(false)
        );
    }

    /// slurmrestd and libslurm jobs name the tenant in their own environment: taken only
    /// when the SPANK job environment names none, checked the same way, and handed on to the
    /// prolog in the SPANK job environment.
    #[test]
    fn a_job_without_the_spank_environment_names_its_tenant_in_its_environment() {
        let (_dir, _path, config) = config();
        let job = |spank: &[&str], env: &[&str]| {
            let env: Vec<&[u8]> = env.iter().map(|e| e.as_bytes()).collect();
            submission(spank, None).and_then(|s| s.with_request_from_environment(&env))
        };
        let rest = job(
            &[],
            &["PATH=/bin", "TENANCY_TENANT=mine", "TENANCY_MIG=1g.18gb"],
        )
        .unwrap();
        assert!(rest.from_job_env);
        let a = decide_with(&rest, &config).unwrap();
        assert_eq!(
            a.spank_env,
            [
                ("TENANCY_TENANT".to_string(), "mine".to_string()),
                ("TENANCY_MIG".to_string(), "1g.18gb".to_string())
            ]
        );
        // The same refusal, in the same words, as through sbatch.
        let refused =
            decide_with(&job(&[], &["TENANCY_TENANT=other"]).unwrap(), &config).unwrap_err();
        let via_sbatch = decide_with(
            &submission(&["SPANK_TENANCY_TENANT=other"], None).unwrap(),
            &config,
        )
        .unwrap_err();
        assert_eq!(refused, via_sbatch);
        // sbatch --tenant wins over a variable the user's shell exports.
        let both = job(&["SPANK_TENANCY_TENANT=mine"], &["TENANCY_TENANT=other"]).unwrap();
        assert!(!both.from_job_env);
        assert!(decide_with(&both, &config).unwrap().spank_env.is_empty());
        let twice = job(&[], &["TENANCY_TENANT=mine", "TENANCY_TENANT=other"]).unwrap_err();
        assert!(twice.contains("TENANCY_TENANT is given twice"), "{twice}");
        let bad = job(&[], &["TENANCY_TENANT=a\u{7}"]).unwrap_err();
        assert!(bad.contains("control characters"), "{bad}");
    }

    /// A scrontab job (always `SLURM_GET_USER_ENV=1`) is refused with a reason that names
    /// scrontab unless the tier allows a login environment.
    #[test]
    fn a_scrontab_job_is_refused_with_its_reason() {
        let (_dir, _path, config) = config();
        let mut s = submission(&[], None)
            .unwrap()
            .with_job_environment(&[b"SLURM_GET_USER_ENV=1"]);
        s.cron = true;
        let why = decide_with(&s, &config).unwrap_err();
        assert!(
            why.starts_with("scrontab jobs ask for your login environment"),
            "{why}"
        );
    }

    const SLURM_CONF: &str = "ClusterName=t\nNodeName=n[1-4] CPUs=2\nMCSPlugin=mcs/label\n\
                              MCSParameters=ondemand,select\n";

    fn pooled(extra: &str) -> (tenancy_config::slurm_conf::SlurmConf, Config) {
        let me = Identity::from_uid(rustix_uid()).unwrap();
        let text = format!(
            "[cluster]\nname = \"t\"\nstate_dir = \"/s\"\naudit_log = \"/a.jsonl\"\n\
             scratch_root = \"/scratch\"\n[tiers.open]\n[tiers.own]\nnodes = \"n[3-4]\"\n\
             share_node = false\n{extra}\n[tenants.mine]\ntier = \"own\"\ngroups = [\"{}\"]\n\
             accounts = [\"mine-acct\"]\n[tenants.other]\ntier = \"open\"\n\
             groups = [\"tenancy-no-such-group\"]\n",
            nix_group_name(me.gid)
        );
        let slurm = tenancy_config::slurm_conf::SlurmConf::parse(
            SLURM_CONF,
            std::path::Path::new("/etc/slurm/slurm.conf"),
        )
        .unwrap();
        (
            slurm,
            Config::parse(&text, std::path::Path::new("/t.toml")).unwrap(),
        )
    }

    /// Node pools: a pool tenant's job excludes every node outside its pool (with the user's
    /// own exclusions kept), another tenant's every pool node; a --nodelist against the rules
    /// is refused.
    #[test]
    fn pools_become_excluded_nodes_and_contrary_nodelists_are_refused() {
        let (slurm, config) = pooled("");
        let mine = submission(&["SPANK_TENANCY_TENANT=mine"], None).unwrap();
        let a = decide_in(&mine, &config, Some(&slurm)).unwrap();
        assert_eq!(a.placement.exc_nodes.as_deref(), Some("n[1-2]"));
        let mut user = mine.clone();
        user.exc_nodes = Some("n4".into());
        let a = decide_in(&user, &config, Some(&slurm)).unwrap();
        assert_eq!(a.placement.exc_nodes.as_deref(), Some("n4,n[1-2]"));
        let mut wrong = mine.clone();
        wrong.req_nodes = Some("n[1,3]".into());
        let e = decide_in(&wrong, &config, Some(&slurm)).unwrap_err();
        assert!(
            e.contains("--nodelist names n1: node n1 is outside the node pool of tenant 'mine'"),
            "{e}"
        );
        // The other tenant's rules, decided for a resolved job of it (its group is unknown).
        assert_eq!(
            scheduler::pool_placement(&config, "other", &slurm, None, None)
                .unwrap()
                .as_deref(),
            Some("n[3-4]")
        );
        let e = scheduler::pool_placement(&config, "other", &slurm, Some("n4"), None).unwrap_err();
        assert!(
            e.contains("node n4 is in the node pool of tier 'own'"),
            "{e}"
        );
        // Pools and no slurm.conf: refused, not guessed.
        assert!(decide_in(&mine, &config, None)
            .unwrap_err()
            .contains("slurm.conf cannot be read"));
    }

    /// share_node = false on MCS: the tenant's label, not a node of its own; a label the user
    /// chose is refused; without MCS the old exclusivity.
    #[test]
    fn share_node_false_is_an_mcs_label_where_slurm_has_mcs() {
        let (slurm, config) = pooled("");
        let mine = submission(&["SPANK_TENANCY_TENANT=mine"], None).unwrap();
        let a = decide_in(&mine, &config, Some(&slurm)).unwrap();
        assert!(!a.exclusive);
        assert_eq!(a.placement.mcs_label.as_deref(), Some("mine"));
        assert!(!a.placement.shared_mcs);
        let mut asked = mine.clone();
        asked.mcs_label = Some("other".into());
        let e = decide_in(&asked, &config, Some(&slurm)).unwrap_err();
        assert!(e.starts_with("--mcs-label=other"), "{e}");
        // ondemandselect filters only --exclusive=mcs jobs: the plugin asks for it.
        let ondemand = tenancy_config::slurm_conf::SlurmConf::parse(
            &SLURM_CONF.replace("ondemand,select", "ondemand,ondemandselect"),
            std::path::Path::new("/s.conf"),
        )
        .unwrap();
        assert!(
            decide_in(&mine, &config, Some(&ondemand))
                .unwrap()
                .placement
                .shared_mcs
        );
        // mcs/account: the label is the job's account, one of the tenant's.
        let account = tenancy_config::slurm_conf::SlurmConf::parse(
            &SLURM_CONF.replace("mcs/label", "mcs/account"),
            std::path::Path::new("/s.conf"),
        )
        .unwrap();
        let a = decide_in(&mine, &config, Some(&account)).unwrap();
        assert_eq!(
            (
                a.placement.mcs_label.as_deref(),
                a.placement.account.as_deref()
            ),
            (Some("mine-acct"), Some("mine-acct"))
        );
        // No MCS: a node of its own, as before.
        let none = tenancy_config::slurm_conf::SlurmConf::parse(
            "NodeName=n[1-4]\n",
            std::path::Path::new("/s.conf"),
        )
        .unwrap();
        let a = decide_in(&mine, &config, Some(&none)).unwrap();
        assert!(a.exclusive && a.placement.mcs_label.is_none());
    }

    #[test]
    fn an_account_change_cannot_contradict_the_tenant() {
        let (_dir, _path, config) = config();
        let uid = rustix_uid();
        assert_eq!(check_account_change(&config, uid, 7, None), Ok(()));
        assert_eq!(
            check_account_change(&config, uid, 7, Some("no-tenants-acct")),
            Ok(())
        );
        assert_eq!(
            check_account_change(&config, uid, 7, Some("mine-acct")),
            Ok(())
        );
        let e = check_account_change(&config, uid, 7, Some("other-acct")).unwrap_err();
        assert!(e.contains("job 7") && e.contains("tenant 'other'"), "{e}");
        // Through the C entry point: an account the prolog would refuse, from anyone.
        let bad = c"bad acct";
        // SAFETY: an all-zero job_desc_msg_t is valid (null pointers, zero numbers).
        let mut desc: sys::job_desc_msg_t = unsafe { std::mem::zeroed() };
        desc.job_id = 7;
        desc.shared = NO_VAL16;
        desc.account = bad.as_ptr().cast_mut();
        // SAFETY: desc lives through the call.
        let rc = unsafe { job_modify(&mut desc, std::ptr::null_mut(), 0) };
        assert_eq!(rc, REFUSED);
    }

    /// The C entry point with a job description as slurmctld passes it, the message made by
    /// Slurm's own `xstrdup` when libslurmfull is installed (as it is where slurmctld runs).
    #[test]
    fn job_submit_accepts_and_refuses_through_the_c_interface() {
        let (_dir, path, _config) = config();
        std::env::set_var("TENANCY_CONFIG", &path);
        let slurm = c"/usr/lib/x86_64-linux-gnu/slurm-wlm/libslurmfull.so";
        // SAFETY: loading Slurm's library only makes its symbols visible to dlsym.
        let loaded =
            unsafe { !libc::dlopen(slurm.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL).is_null() };
        if !loaded {
            eprintln!("NOTE: {slurm:?} not found: the refusal's message is not checked");
        }
        let run = |env: &[&CStr], account: Option<&CStr>| -> (c_int, Option<String>) {
            let mut vars: Vec<*mut c_char> = env.iter().map(|e| e.as_ptr().cast_mut()).collect();
            // SAFETY: an all-zero job_desc_msg_t is valid (null pointers, zero numbers).
            let mut desc: sys::job_desc_msg_t = unsafe { std::mem::zeroed() };
            desc.user_id = rustix_uid();
            desc.spank_job_env = vars.as_mut_ptr();
            desc.spank_job_env_size = vars.len() as u32;
            desc.account = account.map_or(std::ptr::null_mut(), |a| a.as_ptr().cast_mut());
            let mut msg: *mut c_char = std::ptr::null_mut();
            // SAFETY: desc and msg live through the call.
            let rc = unsafe { job_submit(&mut desc, 0, &mut msg) };
            let text = (!msg.is_null()).then(|| {
                // SAFETY: made by slurm_xstrdup; freed by slurm_xfree as slurmctld does.
                unsafe {
                    let t = CStr::from_ptr(msg).to_string_lossy().into_owned();
                    let xfree: unsafe extern "C" fn(*mut *mut c_void) =
                        std::mem::transmute(symbol(c"slurm_xfree"));
                    let mut p = msg.cast::<c_void>();
                    xfree(&mut p);
                    t
                }
            });
            (rc, text)
        };
        assert_eq!(run(&[c"SPANK_TENANCY_TENANT=mine"], None), (SUCCESS, None));
        let (rc, msg) = run(&[c"SPANK_TENANCY_TENANT=other"], None);
        assert_eq!(rc, REFUSED);
        if loaded {
            let msg = msg.expect("a message for the submitter");
            assert!(
                msg.starts_with("tenancy: ") && msg.contains("not a member of tenant 'other'"),
                "{msg}"
            );
        }
        assert_eq!(
            run(&[c"SPANK_TENANCY_TENANT=mine"], Some(c"other-acct")).0,
            REFUSED
        );

        // A config that cannot be read refuses every job (fail closed), and says why.
        std::env::set_var("TENANCY_CONFIG", path.with_file_name("missing.toml"));
        let (rc, msg) = run(&[c"SPANK_TENANCY_TENANT=mine"], None);
        assert_eq!(rc, REFUSED);
        if loaded {
            let msg = msg.unwrap();
            assert!(
                msg.contains("cannot read the tenancy config") && msg.contains("missing.toml"),
                "{msg}"
            );
        }
        std::env::remove_var("TENANCY_CONFIG");
    }
}
