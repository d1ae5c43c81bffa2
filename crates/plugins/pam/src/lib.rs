//! `pam_tenancy.so`: the session phase of ssh logins that pam_slurm_adopt adopts into a job.
//!
//! ```text
//! account  required  pam_slurm_adopt.so
//! session  required  pam_tenancy.so [config=/etc/slurm/tenancy.toml]
//! ```
//!
//! pam_slurm_adopt (account phase) puts the login's sshd process into the job's extern step,
//! which no SPANK task hook sees. This module runs in that same process when the session
//! opens: it moves the process into the job's isolation (cgroups of the device allowlist and
//! firewall) and writes `session_adopted` to the audit log, or refuses the session
//! (`tenancy_job::adopt::session`); then it puts the variables the job's tasks get
//! (CUDA_VISIBLE_DEVICES, TMPDIR, ...) into the PAM environment, which sshd gives the session.
//! `tenancyctl adopt` through pam_exec does the same except the environment, which a child
//! process cannot set.
//!
//! A login in no job (an administrator's, when pam_slurm_adopt lets one through) is left
//! alone, before the config is even read, so a broken config cannot lock administrators out.
//! Every failure in a job refuses the session (PAM_SESSION_ERR): it must not run beside the job
//! unisolated. Messages go to syslog (authpriv), as other PAM modules' do.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::Path;
use tenancy_job::adopt::{session, slurm_job_of, Session};

/// Linux-PAM's opaque handle.
#[repr(C)]
pub struct PamHandle {
    _private: [u8; 0],
}

// Linux-PAM's return codes (security/_pam_types.h).
const PAM_SUCCESS: c_int = 0;
const PAM_SESSION_ERR: c_int = 14;

// libpam's own functions: the process that loads this module already has libpam, so they
// resolve there (linking against it would need libpam0g-dev's libpam.so at build time).
extern "C" {
    fn pam_get_user(pamh: *mut PamHandle, user: *mut *const c_char, prompt: *const c_char)
        -> c_int;
    fn pam_getenv(pamh: *mut PamHandle, name: *const c_char) -> *const c_char;
    fn pam_putenv(pamh: *mut PamHandle, name_value: *const c_char) -> c_int;
}

/// The module's arguments from its PAM line.
#[derive(Debug, Default, PartialEq, Eq)]
struct Args {
    /// `config=PATH`; else the usual search (TENANCY_CONFIG, next to SLURM_CONF,
    /// /etc/slurm/tenancy.toml).
    config: Option<String>,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut out = Args::default();
    for a in args {
        match a.split_once('=') {
            Some(("config", v)) if !v.is_empty() => out.config = Some(v.to_string()),
            _ => return Err(format!("unknown argument {a:?} (known: config=PATH)")),
        }
    }
    Ok(out)
}

fn log(priority: c_int, message: &str) {
    if let Ok(m) = CString::new(format!("pam_tenancy: {message}")) {
        // SAFETY: a constant format string with one %s argument, a NUL-terminated string.
        unsafe { libc::syslog(libc::LOG_AUTHPRIV | priority, c"%s".as_ptr(), m.as_ptr()) };
    }
}

/// The session's user (PAM_USER).
fn user(pamh: *mut PamHandle) -> Option<String> {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: pamh comes from libpam; p is set to a string libpam owns, or left null.
    let rc = unsafe { pam_get_user(pamh, &mut p, std::ptr::null()) };
    if rc != PAM_SUCCESS || p.is_null() {
        return None;
    }
    // SAFETY: libpam returned a NUL-terminated string that lives as long as the handle.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// A variable of the PAM environment (pam_slurm_adopt puts SLURM_JOB_ID there).
fn pam_env(pamh: *mut PamHandle, name: &str) -> Option<String> {
    let name = CString::new(name).ok()?;
    // SAFETY: pamh comes from libpam; the result is null or a string libpam owns.
    let p = unsafe { pam_getenv(pamh, name.as_ptr()) };
    // SAFETY: as above.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn put_env(pamh: *mut PamHandle, name: &str, value: &str) -> Result<(), String> {
    let nv = CString::new(format!("{name}={value}"))
        .map_err(|_| format!("{name}: the value holds a NUL byte"))?;
    // SAFETY: pamh comes from libpam, which copies the string.
    match unsafe { pam_putenv(pamh, nv.as_ptr()) } {
        PAM_SUCCESS => Ok(()),
        rc => Err(format!("pam_putenv {name} failed (PAM error {rc})")),
    }
}

fn open_session(pamh: *mut PamHandle, args: &[String]) -> c_int {
    let pid = std::process::id() as i32;
    let claimed = pam_env(pamh, "SLURM_JOB_ID");
    // A login in no job needs no config: decide that first (see the module's comment).
    // (Unreadable cgroups take the full path, which refuses.)
    let in_no_job = std::fs::read_to_string("/proc/self/cgroup").is_ok_and(|cgroups| {
        matches!(
            slurm_job_of(&cgroups, tenancy_cgroup::PRODUCT_DIR),
            Ok(None)
        )
    });
    if claimed.is_none() && in_no_job {
        return PAM_SUCCESS;
    }
    let refuse = |why: String| {
        log(
            libc::LOG_ERR,
            &format!("refusing the session (process {pid}): {why}"),
        );
        PAM_SESSION_ERR
    };
    let args = match parse_args(args) {
        Ok(a) => a,
        Err(e) => return refuse(format!("bad module line: {e}")),
    };
    let config = match tenancy_job::config_cache::load(args.config.as_deref().map(Path::new)) {
        Ok(c) => c,
        Err(e) => {
            return refuse(format!(
                "cannot load the tenancy config: {e} (pam_tenancy.so takes config=PATH)"
            ))
        }
    };
    let Some(user) = user(pamh) else {
        return refuse("PAM has no user for the session".into());
    };
    match session(&config, pid, &user, claimed.as_deref(), "pam_tenancy") {
        Session::NotInJob => PAM_SUCCESS,
        Session::Refused { message } => {
            log(libc::LOG_ERR, &message);
            PAM_SESSION_ERR
        }
        Session::Joined { job, tenant, env } => {
            // Without them the session would still be isolated, but would write its temporary
            // files to the node's shared /tmp instead of the tenant's scratch: refuse.
            for (k, v) in &env.vars {
                if let Err(e) = put_env(pamh, k, v) {
                    return refuse(format!("job {job}: {e}"));
                }
            }
            log(
                libc::LOG_INFO,
                &format!(
                    "session process {pid} of {user} joined the isolation of job {job} \
                     (tenant {tenant})"
                ),
            );
            PAM_SUCCESS
        }
    }
}

/// The module's arguments as strings.
///
/// # Safety
/// `argv` holds `argc` NUL-terminated strings (libpam's contract).
unsafe fn args(argc: c_int, argv: *const *const c_char) -> Vec<String> {
    (0..argc.max(0) as usize)
        .filter_map(|i| {
            let p = *argv.add(i);
            (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
        })
        .collect()
}

/// PAM's session-open entry point.
///
/// # Safety
/// Called by libpam with its handle and the module's arguments.
#[no_mangle]
pub unsafe extern "C" fn pam_sm_open_session(
    pamh: *mut PamHandle,
    _flags: c_int,
    argc: c_int,
    argv: *const *const c_char,
) -> c_int {
    let args = args(argc, argv);
    // A panic must not unwind into sshd; it refuses the session like any other failure.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| open_session(pamh, &args)))
        .unwrap_or(PAM_SESSION_ERR)
}

/// PAM's session-close entry point: the job's epilog undoes the isolation, nothing to do.
///
/// # Safety
/// Called by libpam.
#[no_mangle]
pub unsafe extern "C" fn pam_sm_close_session(
    _pamh: *mut PamHandle,
    _flags: c_int,
    _argc: c_int,
    _argv: *const *const c_char,
) -> c_int {
    PAM_SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments() {
        assert_eq!(parse_args(&[]).unwrap(), Args::default());
        assert_eq!(
            parse_args(&["config=/etc/t.toml".into()]).unwrap().config,
            Some("/etc/t.toml".into())
        );
        for bad in ["config=", "conf=/x", "debug"] {
            assert!(parse_args(&[bad.into()]).is_err(), "{bad}");
        }
    }
}
