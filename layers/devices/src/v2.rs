//! cgroup v2 backend: a BPF_PROG_TYPE_CGROUP_DEVICE program generated from the policy,
//! loaded and attached with raw bpf(2). The attachment keeps the program alive after the
//! loader exits; teardown detaches exactly the recorded program id.
//!
//! Attach flags: [`ATTACH_FLAGS`] = BPF_F_ALLOW_MULTI (see README "Attach flags"): the
//! product attaches to a cgroup it owns, outside Slurm's tree; with MULTI a program attached
//! later in a child cgroup (a container runtime in the job) runs *in addition* to ours and
//! cannot override it, and a re-run of the prolog adds a second program rather than
//! silently replacing the first.

use crate::bpf::{self, sys};
use crate::error::{Error, Result};
use crate::policy::DevicePolicy;
use crate::v1::open_dir;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

/// Flags the layer attaches with.
pub const ATTACH_FLAGS: u32 = sys::F_ALLOW_MULTI;

/// What `apply` attached (journal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct V2Attached {
    /// Kernel program id (BPF_OBJ_GET_INFO_BY_FD).
    pub prog_id: u32,
    /// Flags used for BPF_PROG_ATTACH.
    pub attach_flags: u32,
    /// Program length in instructions.
    pub insns: usize,
}

fn bpf_err(cmd: &'static str, what: String, source: std::io::Error) -> Error {
    let hint = match source.raw_os_error() {
        Some(libc::EPERM) if cmd == "PROG_ATTACH" => "\n(hint: EPERM on attach means an ancestor cgroup holds a device program attached without BPF_F_ALLOW_MULTI/OVERRIDE, or this cgroup already has one attached with other flags: run `tenancyctl doctor`)".to_string(),
        Some(libc::ENOSYS) => "\n(hint: kernel built without CONFIG_BPF_SYSCALL)".to_string(),
        Some(libc::EPERM) => "\n(hint: needs root / CAP_BPF+CAP_SYS_ADMIN)".to_string(),
        _ => String::new(),
    };
    Error::Bpf {
        cmd,
        what,
        source,
        log: hint,
    }
}

/// Generate, load and attach the device program of `policy` to `cgroup_dir` (a cgroup2
/// directory). On error nothing stays attached.
pub fn apply(cgroup_dir: &Path, policy: &DevicePolicy) -> Result<V2Attached> {
    apply_with_flags(cgroup_dir, policy, ATTACH_FLAGS)
}

/// [`apply`] with explicit attach flags (tests of the flag interplay; keep [`ATTACH_FLAGS`]).
pub fn apply_with_flags(
    cgroup_dir: &Path,
    policy: &DevicePolicy,
    flags: u32,
) -> Result<V2Attached> {
    apply_at(open_dir(cgroup_dir)?.as_fd(), cgroup_dir, policy, flags)
}

/// [`apply_with_flags`] on a cgroup directory already open (`cgroup_dir` names it in errors).
pub fn apply_at(
    cg: BorrowedFd<'_>,
    cgroup_dir: &Path,
    policy: &DevicePolicy,
    flags: u32,
) -> Result<V2Attached> {
    let insns = bpf::generate(policy);
    let prog = sys::prog_load(&insns).map_err(|(e, log)| Error::Bpf {
        cmd: "PROG_LOAD",
        what: format!(
            "device program ({} insns) for {}",
            insns.len(),
            cgroup_dir.display()
        ),
        source: e,
        log: if log.is_empty() {
            log
        } else {
            format!("\nverifier log:\n{log}")
        },
    })?;
    let (prog_id, _) = sys::prog_info(prog.as_fd())
        .map_err(|e| bpf_err("OBJ_GET_INFO_BY_FD", "new device program".into(), e))?;
    sys::prog_attach(cg, prog.as_fd(), flags).map_err(|e| {
        bpf_err(
            "PROG_ATTACH",
            format!(
                "program {prog_id} to {} (flags {flags})",
                cgroup_dir.display()
            ),
            e,
        )
    })?;
    // prog fd closes here; the attachment keeps the program.
    Ok(V2Attached {
        prog_id,
        attach_flags: flags,
        insns: insns.len(),
    })
}

/// Outcome of a detach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Detached {
    /// The program was attached and is now detached.
    Detached,
    /// Nothing to do: cgroup gone, program gone, or not attached there.
    AlreadyGone,
}

fn not_found(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT)
}

/// Detach program `prog_id` from `cgroup_dir`, idempotently. A program of that id that is not
/// one of ours (name differs, id recycled) is never detached.
pub fn detach(cgroup_dir: &Path, prog_id: u32) -> Result<Detached> {
    let cg = match open_dir(cgroup_dir) {
        Ok(c) => c,
        Err(Error::Cgroup { source, .. }) if not_found(&source) => {
            return Ok(Detached::AlreadyGone)
        }
        Err(e) => return Err(e),
    };
    let prog = match sys::prog_get_fd_by_id(prog_id) {
        Ok(p) => p,
        Err(e) if not_found(&e) => return Ok(Detached::AlreadyGone),
        Err(e) => {
            return Err(bpf_err(
                "PROG_GET_FD_BY_ID",
                format!("program {prog_id}"),
                e,
            ))
        }
    };
    let (_, name) = sys::prog_info(prog.as_fd())
        .map_err(|e| bpf_err("OBJ_GET_INFO_BY_FD", format!("program {prog_id}"), e))?;
    if name != sys::PROG_NAME {
        return Ok(Detached::AlreadyGone);
    }
    match sys::prog_detach(cg.as_fd(), prog.as_fd()) {
        Ok(()) => Ok(Detached::Detached),
        Err(e) if not_found(&e) => Ok(Detached::AlreadyGone),
        Err(e) => Err(bpf_err(
            "PROG_DETACH",
            format!("program {prog_id} from {}", cgroup_dir.display()),
            e,
        )),
    }
}

/// Ids of device programs attached directly to `cgroup_dir`, and its attach flags.
pub fn query(cgroup_dir: &Path) -> Result<(Vec<u32>, u32)> {
    let cg = open_dir(cgroup_dir)?;
    sys::prog_query(cg.as_fd())
        .map_err(|e| bpf_err("PROG_QUERY", cgroup_dir.display().to_string(), e))
}

/// Detach every program of ours (by name) from `cgroup_dir`: recovery when a crash lost the
/// recorded id. Returns the ids detached.
pub fn detach_ours(cgroup_dir: &Path) -> Result<Vec<u32>> {
    let (ids, _) = match query(cgroup_dir) {
        Ok(q) => q,
        Err(Error::Cgroup { source, .. }) if not_found(&source) => return Ok(vec![]),
        Err(e) => return Err(e),
    };
    let mut done = Vec::new();
    for id in ids {
        if detach(cgroup_dir, id)? == Detached::Detached {
            done.push(id);
        }
    }
    Ok(done)
}

/// Load (and drop) a trivial device program: is bpf(2) usable for this layer here?
pub fn probe() -> std::result::Result<(), std::io::Error> {
    let allow_all = crate::policy::DevicePolicy {
        allow: vec![],
        deny_majors: vec![],
    };
    sys::prog_load(&bpf::generate(&allow_all))
        .map(drop)
        .map_err(|(e, _)| e)
}
