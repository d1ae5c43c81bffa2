//! cgroup v2 backend: a BPF_PROG_TYPE_CGROUP_DEVICE program generated from the policy,
//! loaded and attached with raw bpf(2). The attachment keeps the program alive after the
//! loader exits; teardown detaches exactly the recorded program id.
//!
//! Attach flags: [`ATTACH_FLAGS`] = BPF_F_ALLOW_MULTI (ARCHITECTURE.md, the devices layer): the
//! product attaches to a cgroup it owns, outside Slurm's tree; with MULTI a program attached
//! later in a child cgroup (a container runtime in the job) runs *in addition* to ours and
//! cannot override it, and a re-run of the prolog adds a second program rather than
//! silently replacing the first.

use crate::bpf::{self, sys};
use crate::error::{Error, Result};
use crate::policy::DevicePolicy;
use crate::v1::open_dir;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

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

/// Device programs already loaded on this node: a job whose allowlist an earlier job had
/// attaches that program instead of loading its own, so the verifier and the JIT run once per
/// distinct allowlist instead of once per job (BENCHMARKS.md). Each program loaded is also
/// attached to a keeper cgroup no process is in (`tenancy/.device-programs`), which keeps it
/// loaded once the jobs that had it have ended; the oldest are detached from it beyond
/// [`PROGRAMS_KEPT`]. A file of
/// `digest tag id` lines, newest first (the digest of the instructions, [`bpf::digest`]; the
/// tag the kernel gave the program when it was loaded), root's like the state folder that holds
/// it. It is a hint: a program is only reused when the kernel still has one of that id, of our
/// type and name, with that tag (an id the kernel recycled for another program fails that
/// test), and anything else (no file, a damaged line, a race with the program's last detach)
/// loads anew. A shared program lives while any cgroup has it attached; each job detaches only
/// its own attachment.
#[derive(Debug, Clone)]
pub struct Programs {
    path: PathBuf,
    keeper: Option<PathBuf>,
}

/// Programs remembered (and kept loaded) at most: allowlists differ by MIG slice, and a node
/// has few slices; well below the kernel's 64 programs of a kind per cgroup, which two prologs
/// adding at once could otherwise reach.
pub const PROGRAMS_KEPT: usize = 32;

impl Programs {
    /// Programs remembered in the file `path`, kept loaded by nothing but the jobs' cgroups.
    pub fn at(path: impl Into<PathBuf>) -> Programs {
        Programs {
            path: path.into(),
            keeper: None,
        }
    }

    /// Also keeps each program loaded by attaching it to the cgroup `keeper` (created when
    /// missing; no process ever joins it).
    pub fn keeping_in(mut self, keeper: impl Into<PathBuf>) -> Programs {
        self.keeper = Some(keeper.into());
        self
    }

    /// The loaded program of instructions `digest` (kept, or attached by a running job),
    /// opened, when there is one.
    pub fn find(&self, digest: &[u8; 16]) -> Option<OwnedFd> {
        let text = read_nofollow(&self.path)?;
        let key = hex(digest);
        let (tag, id) = text.lines().find_map(|l| {
            let mut f = l.split(' ');
            (f.next()? == key).then_some(())?;
            Some((f.next()?.to_string(), f.next()?.parse::<u32>().ok()?))
        })?;
        let prog = sys::prog_get_fd_by_id(id).ok()?;
        let info = sys::prog_info_full(prog.as_fd()).ok()?;
        (info.prog_type == sys::PROG_TYPE_CGROUP_DEVICE
            && info.name == sys::PROG_NAME
            && hex(&info.tag) == tag)
            .then_some(prog)
    }

    /// Remembers `prog` (just loaded from instructions `digest`) and keeps it loaded; best
    /// effort (a program not kept is loaded again by a later job): the file is replaced
    /// atomically, never fsynced.
    pub fn remember(&self, digest: &[u8; 16], prog: BorrowedFd<'_>) {
        let Ok(info) = sys::prog_info_full(prog) else {
            return;
        };
        let key = hex(digest);
        let old = read_nofollow(&self.path).unwrap_or_default();
        let mut text = format!("{key} {} {}\n", hex(&info.tag), info.id);
        let mut ids = vec![info.id];
        for l in old
            .lines()
            .filter(|l| l.split(' ').next() != Some(key.as_str()))
            .take(PROGRAMS_KEPT - 1)
        {
            text.push_str(l);
            text.push('\n');
            ids.extend(l.rsplit(' ').next().and_then(|id| id.parse::<u32>().ok()));
        }
        if let Some(k) = &self.keeper {
            // The keeper holds what the file remembers, no more: the rest (forgotten, or left
            // by a lost file) is let go first, and freed once no job has it. A cgroup holds at
            // most 64 programs of a kind, so this makes room for the new one.
            if let Ok((attached, _)) = query(k) {
                for id in attached.into_iter().filter(|id| !ids.contains(id)) {
                    let _ = detach(k, id);
                }
            }
            let made = !matches!(
                std::fs::DirBuilder::new().mode(0o755).create(k),
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists
            );
            let attached = made
                && open_dir(k)
                    .ok()
                    .is_some_and(|cg| sys::prog_attach(cg.as_fd(), prog, ATTACH_FLAGS).is_ok());
            if !attached {
                return;
            }
        }
        let Some(dir) = self.path.parent() else {
            return;
        };
        let tmp = dir.join(format!(".device-programs.{}.tmp", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()));
        if written.is_err() || std::fs::rename(&tmp, &self.path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn read_nofollow(path: &Path) -> Option<String> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let mut s = String::new();
    f.read_to_string(&mut s).ok()?;
    Some(s)
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
    apply_at(
        open_dir(cgroup_dir)?.as_fd(),
        cgroup_dir,
        policy,
        flags,
        None,
    )
}

/// [`apply_with_flags`] on a cgroup directory already open (`cgroup_dir` names it in errors),
/// attaching a program from `programs` when one fits, else loading one (and remembering it).
pub fn apply_at(
    cg: BorrowedFd<'_>,
    cgroup_dir: &Path,
    policy: &DevicePolicy,
    flags: u32,
    programs: Option<&Programs>,
) -> Result<V2Attached> {
    let insns = bpf::generate(policy);
    let sharing = programs.map(|p| (p, bpf::digest(&insns)));
    let shared = sharing.as_ref().and_then(|(p, d)| p.find(d));
    let fresh = shared.is_none();
    let prog = match shared {
        Some(p) => p,
        None => load(&insns, cgroup_dir)?,
    };
    let (prog_id, _) = sys::prog_info(prog.as_fd())
        .map_err(|e| bpf_err("OBJ_GET_INFO_BY_FD", "device program".into(), e))?;
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
    if let (true, Some((p, d))) = (fresh, &sharing) {
        p.remember(d, prog.as_fd());
    }
    // prog fd closes here; the attachment keeps the program.
    Ok(V2Attached {
        prog_id,
        attach_flags: flags,
        insns: insns.len(),
    })
}

/// Loads the device program `insns` (`cgroup_dir` names what it is for in errors).
fn load(insns: &[bpf::Insn], cgroup_dir: &Path) -> Result<OwnedFd> {
    sys::prog_load(insns).map_err(|(e, log)| Error::Bpf {
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
        deny_devices: vec![],
    };
    sys::prog_load(&bpf::generate(&allow_all))
        .map(drop)
        .map_err(|(e, _)| e)
}
