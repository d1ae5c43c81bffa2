//! slurmctld's symbols, found at run time in the process that loaded the plugin (its log, the
//! message it frees, its super users), and the job description it hands over: read into a
//! [`Submission`], and the accepted job's changes written back.

use crate::{gres, sys, Accepted, Submission};
use crate::{CRON_JOB, JOB_SHARED_MCS, JOB_SHARED_NONE};
use std::ffi::{c_char, c_int, c_void, CStr, CString};

pub(crate) fn symbol(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the symbol up.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// Logs one line through slurmctld's log (`slurm_info` / `slurm_error`), or stderr outside it.
pub(crate) fn log(error: bool, msg: &str) {
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
pub(crate) unsafe fn set_err_msg(err_msg: *mut *mut c_char, msg: &str) {
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
pub(crate) fn super_user(uid: u32) -> bool {
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
pub(crate) unsafe fn bytes<'a>(p: *const c_char) -> Option<&'a [u8]> {
    (!p.is_null()).then(|| CStr::from_ptr(p).to_bytes())
}

/// # Safety
/// `desc` points to a valid `job_desc_msg_t`.
pub(crate) unsafe fn submission(desc: &sys::job_desc_msg_t) -> Result<Submission, String> {
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
pub(crate) unsafe fn set_field(field: *mut *mut c_char, value: &str) -> Result<(), String> {
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
pub(crate) unsafe fn set_spank_env(
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
pub(crate) unsafe fn apply(
    desc: *mut sys::job_desc_msg_t,
    accepted: &Accepted,
) -> Result<(), String> {
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
pub(crate) unsafe fn tres_per(desc: &sys::job_desc_msg_t) -> [Option<&str>; 4] {
    [
        desc.tres_per_job,
        desc.tres_per_node,
        desc.tres_per_socket,
        desc.tres_per_task,
    ]
    .map(|p| bytes(p).and_then(|b| std::str::from_utf8(b).ok()))
}
