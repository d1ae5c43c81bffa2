//! `tenancy` SPANK plugin (`libspank_tenancy.so`), loaded by sbatch/srun/salloc and slurmstepd
//! through plugstack.conf:
//!
//! ```text
//! required /usr/lib/x86_64-linux-gnu/slurm-wlm/libspank_tenancy.so config=/etc/slurm/tenancy.toml
//! ```
//!
//! * Submit side (local/allocator context, runs as the submitting user): `--tenant=NAME` and
//!   `--mig=PROFILE` are checked against the admin config and the user's groups. A refusal is
//!   ONE line (`tenancy: user u1 is not a member of tenant 'globex' (members need group globex)`)
//!   and `init_post_opt` returns -1, so Slurm creates no job. An accepted choice is handed to
//!   the node's Prolog as `SPANK_TENANCY_TENANT` / `SPANK_TENANCY_MIG` (job control env).
//!   This check is for the user's benefit; the Prolog decides again on the node (a user can
//!   bypass client-side plugins), so nothing here is trusted by the node.
//! * Job side (remote context, slurmstepd as root): slurmstepd itself enters the job's
//!   isolation (cgroups, IPC namespace, an abstract-socket Landlock domain) in `init`, for
//!   every step, before it opens the step's stdio files or connects anywhere for it, so that
//!   what it opens and forks for the job outside the task hook (stdio files, task epilogs, X11
//!   and MPI helpers) is inside; `task_post_fork` moves the task again after Slurm's own
//!   plugins placed it. In each task before exec, `task_init_privileged` moves the task into its
//!   job's isolation and sets CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, TMPDIR,
//!   TENANCY_SCRATCH, TENANCY_TENANT from the job's journal written by the Prolog. Any error
//!   fails the step with a message.
//!
//! No panic crosses the C ABI: every callback runs under `catch_unwind` and turns a panic into
//! an error return.

use std::ffi::{c_char, c_int, c_uint, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

mod args;
pub mod backend;

pub use args::{account_from_cmdline, parse_plugin_args, PluginArgs};

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

/// The Slurm version (0xMMmmuu) the plugin was built against; Slurm refuses a plugin whose
/// major.minor differs from its own.
pub const SLURM_VERSION_NUMBER: u32 = sys::SLURM_VERSION_NUMBER;

#[no_mangle]
#[used]
pub static plugin_name: [u8; 8] = *b"tenancy\0";
#[no_mangle]
#[used]
pub static plugin_type: [u8; 6] = *b"spank\0";
#[no_mangle]
#[used]
pub static plugin_version: c_uint = sys::SLURM_VERSION_NUMBER;
#[no_mangle]
#[used]
pub static spank_plugin_version: c_uint = 1;

const OPT_TENANT: c_int = 1;
const OPT_MIG: c_int = 2;

#[derive(Default)]
struct State {
    args: PluginArgs,
    tenant: Option<String>,
    mig: Option<String>,
    /// slurmstepd has entered its job's isolation (cgroups and IPC namespace).
    stepd_contained: bool,
    /// slurmstepd's pid, taken in `init`, which always runs in slurmstepd itself: with
    /// `SlurmdParameters=contain_spank` (24.11+) Slurm runs `task_post_fork` in a clone of it
    /// that shares its memory but has a pid of its own.
    stepd_pid: Option<i32>,
}

static STATE: Mutex<State> = Mutex::new(State {
    args: PluginArgs { config: None },
    tenant: None,
    mig: None,
    stepd_contained: false,
    stepd_pid: None,
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn log_error(msg: &str) {
    let line = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: "%s" with one NUL-terminated string.
    unsafe { sys::slurm_error(c"%s".as_ptr(), line.as_ptr()) };
}

fn log_verbose(msg: &str) {
    let line = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: as above.
    unsafe { sys::slurm_verbose(c"%s".as_ptr(), line.as_ptr()) };
}

/// Runs one callback: an `Err` is logged as one `tenancy: ...` line and returns -1; a panic is
/// caught, logged and returns -1.
fn guarded(what: &str, f: impl FnOnce() -> Result<(), String>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(msg)) => {
            log_error(&format!("tenancy: {msg}"));
            -1
        }
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            log_error(&format!(
                "tenancy: internal error in {what} ({text}); please report it to your admin"
            ));
            -1
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Local,
    Remote,
    Allocator,
    Slurmd,
    JobScript,
    Error,
}

fn context() -> Ctx {
    // SAFETY: no arguments; valid in every context.
    match unsafe { sys::spank_context() } {
        sys::spank_context_S_CTX_LOCAL => Ctx::Local,
        sys::spank_context_S_CTX_REMOTE => Ctx::Remote,
        sys::spank_context_S_CTX_ALLOCATOR => Ctx::Allocator,
        sys::spank_context_S_CTX_SLURMD => Ctx::Slurmd,
        sys::spank_context_S_CTX_JOB_SCRIPT => Ctx::JobScript,
        _ => Ctx::Error,
    }
}

extern "C" fn option_cb(val: c_int, optarg: *const c_char, _remote: c_int) -> c_int {
    guarded("option callback", || {
        let value = if optarg.is_null() {
            String::new()
        } else {
            // SAFETY: Slurm passes a NUL-terminated string or NULL.
            unsafe { CStr::from_ptr(optarg) }
                .to_str()
                .map_err(|_| "option value is not valid UTF-8".to_string())?
                .to_string()
        };
        let mut st = state();
        match val {
            OPT_TENANT => st.tenant = Some(value),
            OPT_MIG => st.mig = Some(value),
            other => return Err(format!("unexpected option id {other}")),
        }
        Ok(())
    })
}

/// The option table handed to Slurm; Slurm keeps the pointers, so it lives for the process.
fn options() -> &'static mut [sys::spank_option; 2] {
    Box::leak(Box::new([
        sys::spank_option {
            name: c"tenant".as_ptr() as *mut c_char,
            arginfo: c"name".as_ptr() as *mut c_char,
            usage: c"Run the job for tenant NAME (its isolation: GPU slice, scratch, network)"
                .as_ptr() as *mut c_char,
            has_arg: 1,
            val: OPT_TENANT,
            cb: Some(option_cb),
        },
        sys::spank_option {
            name: c"mig".as_ptr() as *mut c_char,
            arginfo: c"profile".as_ptr() as *mut c_char,
            usage: c"Give the job its own MIG slice of this profile, e.g. 1g.18gb".as_ptr()
                as *mut c_char,
            has_arg: 1,
            val: OPT_MIG,
            cb: Some(option_cb),
        },
    ]))
}

/// # Safety
/// Called by Slurm with a valid handle and `ac` arguments.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_init(
    sp: sys::spank_t,
    ac: c_int,
    av: *mut *mut c_char,
) -> c_int {
    guarded("init", || {
        let mut raw = Vec::new();
        for i in 0..usize::try_from(ac).unwrap_or(0) {
            // SAFETY: Slurm passes `ac` valid NUL-terminated strings.
            let s = unsafe { CStr::from_ptr(*av.add(i)) };
            raw.push(s.to_string_lossy().into_owned());
        }
        let args = parse_plugin_args(&raw)?;
        state().args = args;
        let ctx = context();
        if matches!(ctx, Ctx::Slurmd) {
            return Ok(());
        }
        if ctx == Ctx::Remote {
            // SAFETY: plain libc call; `init` runs in slurmstepd itself.
            state().stepd_pid = Some(unsafe { libc::getpid() });
            // slurmstepd enters the job's isolation before it does anything for the step:
            // `spank_init` runs (mgr.c `job_manager`, `_spawn_job_container`) before the step's
            // stdio files are opened and its first I/O connection made (`_fork_all_tasks` →
            // `_setup_normal_io`), before the extern step's X11 set-up, and in the thread that
            // later forks the tasks. The files are then opened under the job's device
            // allowlist and every connection is the job's (the firewall tells slurmstepd's own
            // from the job's code by the socket mark: tenancy-network's stepd.rs).
            contain_stepd(sp, None)?;
        }
        for opt in options().iter_mut() {
            // SAFETY: `opt` is leaked, so it outlives the plugin.
            let rc = unsafe { sys::spank_option_register(sp, opt) };
            if rc != sys::ESPANK_SUCCESS {
                let name = unsafe { CStr::from_ptr(opt.name) }.to_string_lossy();
                return Err(format!(
                    "cannot register option --{name} (spank error {rc})"
                ));
            }
        }
        Ok(())
    })
}

fn getenv(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// # Safety
/// Called by Slurm with a valid handle.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_init_post_opt(
    sp: sys::spank_t,
    _ac: c_int,
    _av: *mut *mut c_char,
) -> c_int {
    guarded("init_post_opt", || {
        let ctx = context();
        if !matches!(ctx, Ctx::Local | Ctx::Allocator) {
            return Ok(());
        }
        if ctx == Ctx::Local && getenv("SLURM_JOB_ID").is_some() {
            // srun inside an existing allocation: a step of a job whose tenant was decided
            // (and is enforced on the node) when the job was created.
            log_verbose("tenancy: step of an existing job; tenant decided at job creation");
            return Ok(());
        }
        let (config, tenant, mig) = {
            let st = state();
            (st.args.config.clone(), st.tenant.clone(), st.mig.clone())
        };
        // SAFETY: plain libc call.
        let uid = unsafe { libc::getuid() };
        let cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
        let account = account_from_cmdline(&cmdline)
            .or_else(|| getenv("SBATCH_ACCOUNT"))
            .or_else(|| getenv("SALLOC_ACCOUNT"))
            .or_else(|| getenv("SLURM_ACCOUNT"));
        let decided = backend::decide(
            config.as_deref(),
            uid,
            account.as_deref(),
            tenant.as_deref(),
            mig.as_deref(),
        )?;
        set_job_control_env(sp, "TENANCY_TENANT", &decided.tenant)?;
        if let Some(p) = &decided.profile {
            set_job_control_env(sp, "TENANCY_MIG", p)?;
        }
        Ok(())
    })
}

fn set_job_control_env(sp: sys::spank_t, name: &str, value: &str) -> Result<(), String> {
    let n = CString::new(name).map_err(|_| format!("bad variable name {name}"))?;
    let v = CString::new(value).map_err(|_| format!("value of {name} contains a NUL byte"))?;
    // SAFETY: valid handle and NUL-terminated strings.
    let rc = unsafe { sys::spank_job_control_setenv(sp, n.as_ptr(), v.as_ptr(), 1) };
    if rc != sys::ESPANK_SUCCESS {
        return Err(format!("cannot hand {name} to the job (spank error {rc})"));
    }
    Ok(())
}

fn set_task_env(sp: sys::spank_t, name: &str, value: &str) -> Result<(), String> {
    let n = CString::new(name).map_err(|_| format!("bad variable name {name}"))?;
    let v = CString::new(value).map_err(|_| format!("value of {name} contains a NUL byte"))?;
    // SAFETY: valid handle and NUL-terminated strings.
    let rc = unsafe { sys::spank_setenv(sp, n.as_ptr(), v.as_ptr(), 1) };
    if rc != sys::ESPANK_SUCCESS {
        return Err(format!("cannot set {name} in the task (spank error {rc})"));
    }
    Ok(())
}

/// A `uint32_t` item of the job (S_JOB_ID, S_JOB_STEPID).
fn item_u32(sp: sys::spank_t, item: sys::spank_item, what: &str) -> Result<u32, String> {
    let mut v: u32 = 0;
    // SAFETY: the items this is called with take one uint32_t*.
    let rc = unsafe { sys::spank_get_item(sp, item, &mut v as *mut u32) };
    if rc != sys::ESPANK_SUCCESS {
        return Err(format!("cannot read the {what} (spank error {rc})"));
    }
    Ok(v)
}

fn job_id(sp: sys::spank_t) -> Result<u32, String> {
    item_u32(sp, sys::spank_item_S_JOB_ID, "job id")
}

/// slurmstepd (this process) and `task` into the job's isolation; slurmstepd joins the job's
/// IPC namespace once.
fn contain_stepd(sp: sys::spank_t, task: Option<i32>) -> Result<(), String> {
    let job = job_id(sp)?;
    // SAFETY: plain libc call.
    let me = unsafe { libc::getpid() };
    let (config, stepd, contained) = {
        let st = state();
        (
            st.args.config.clone(),
            st.stepd_pid.unwrap_or(me),
            st.stepd_contained,
        )
    };
    // A namespace is entered by the process that calls setns: only slurmstepd itself can put
    // itself in the job's, not a clone of it running the hook (contain_spank).
    let ipc = !contained && me == stepd;
    let set_up = backend::contain_step(config.as_deref(), u64::from(job), stepd, task, ipc)
        .map_err(|e| {
            format!("job {job}: cannot put slurmstepd {stepd} into the job's isolation: {e}")
        })?;
    if set_up {
        state().stepd_contained = true;
    } else {
        // The task hook refuses every task of such a job, before user code.
        log_verbose(&format!(
            "tenancy: job {job} has no journal on this node: its tasks are refused"
        ));
    }
    Ok(())
}

/// # Safety
/// Called by Slurm in slurmstepd (root) after each task is forked and placed by Slurm's own
/// proctrack and task plugins, before the task may exec.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_task_post_fork(
    sp: sys::spank_t,
    _ac: c_int,
    _av: *mut *mut c_char,
) -> c_int {
    guarded("task_post_fork", || {
        if context() != Ctx::Remote {
            return Ok(());
        }
        let mut pid: libc::pid_t = 0;
        // SAFETY: S_TASK_PID takes one pid_t*; the extern step's "task" (-1) has none.
        let rc = unsafe { sys::spank_get_item(sp, sys::spank_item_S_TASK_PID, &mut pid as *mut _) };
        let task = (rc == sys::ESPANK_SUCCESS && pid > 0).then_some(pid);
        contain_stepd(sp, task)
    })
}

/// # Safety
/// Called by Slurm in the forked task, as root, before privileges are dropped.
#[no_mangle]
pub unsafe extern "C" fn slurm_spank_task_init_privileged(
    sp: sys::spank_t,
    _ac: c_int,
    _av: *mut *mut c_char,
) -> c_int {
    guarded("task_init_privileged", || {
        if context() != Ctx::Remote {
            return Ok(());
        }
        let job = job_id(sp)?;
        // The plugin's state is slurmstepd's, copied by the fork: contained, slurmstepd had
        // joined the job's IPC namespace before it forked this task.
        let (config, inherited) = {
            let st = state();
            (st.args.config.clone(), st.stepd_contained)
        };
        // SAFETY: plain libc call; we are the task process.
        let pid = unsafe { libc::getpid() };
        let vars = backend::enter(config.as_deref(), u64::from(job), pid, inherited)
            .map_err(|e| format!("job {job}: cannot put the task into its isolation: {e}"))?;
        for (k, v) in &vars {
            set_task_env(sp, k, v)?;
        }
        Ok(())
    })
}
