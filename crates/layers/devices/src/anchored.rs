//! The device allowlist on a pure cgroup v2 node, anchored in Slurm's job cgroup
//! (ARCHITECTURE.md, "Pure cgroup v2 nodes"). Slurm's cgroup/v2 plugin attaches its own device
//! programs with `BPF_F_ALLOW_OVERRIDE` at job and step level and with flags 0 at task level, so
//! a program of ours in its tree would be overridden, and nothing can be attached below a task.
//! The kernel keeps a program attached with `BPF_F_ALLOW_MULTI` on an ancestor effective under
//! every descendant's own, and an access needs every effective program to allow it. So:
//!
//! * one node program (`tenancy_node`) is attached MULTI to slurmstepd's scope, above every job;
//!   it finds the job of the process opening a device by its ancestor cgroup at the job level
//!   (`bpf_get_current_ancestor_cgroup_id`, Linux 6.1+ for device programs) in a hash map (job
//!   cgroup id → slot), and tail-calls the job's own program (the same one the product attaches
//!   elsewhere, [`crate::bpf::generate`]) in that slot of a program array; a slot without a
//!   program denies;
//! * a process under the scope in a folder of no job the map holds (a job folder Slurm made
//!   again with a new cgroup id, a job whose prolog did not run here) gets the program of a job
//!   without devices ([`NO_JOB_SLOT`]: every GPU, capability and RDMA node denied, the rest
//!   allowed), unless it is root's: Slurm's own folders there (`system`, where slurmstepd waits
//!   before its job's folder exists; `slurmd`, where a slurmd not started by systemd moves
//!   itself, and its prologs with it) hold root's processes only; a process above the job
//!   level passes;
//! * the prolog puts the job's program into a free slot and its cgroup id into the map; the
//!   epilog empties the slot first (the job's processes, if any were left, are then denied),
//!   then the map entry.
//!
//! The maps are found through the program attached to the scope (its map ids). The kernel
//! empties a program array once no file refers to it (only programs), so the array is pinned on
//! the bpf file system (`/sys/fs/bpf/tenancy_progs_<scope cgroup id>`; bpffs is mounted there
//! when it is not, as systemd does at boot). Changes of the maps are made under an exclusive
//! `flock` on the scope folder.

use crate::bpf::{self, op, sys, Insn};
use crate::error::{Error, Result};
use crate::policy::DevicePolicy;
use crate::v1::open_dir;
use crate::v2::Programs;
use serde::{Deserialize, Serialize};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The node program's name.
pub const NODE_PROG_NAME: &str = "tenancy_node2";
/// The name of the node program before it judged unknown folders (release 2): a node whose
/// scope still has it gets the current one, on the same maps, at its next prolog.
const OLD_NODE_PROG_NAME: &str = "tenancy_node";
/// Slots of the program array: one per job at once on the node, and [`NO_JOB_SLOT`].
pub const SLOTS: u32 = 1024;
/// The slot of the program for a process in a folder of no job the map holds: a job's
/// program for no devices (every NVIDIA and RDMA node the node has denied, the rest allowed).
pub const NO_JOB_SLOT: u32 = SLOTS - 1;

/// What the prolog made for a job (journal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnchoredAttached {
    /// slurmstepd's scope, where the node program is attached.
    pub scope_dir: PathBuf,
    /// The job folder's cgroup id (the map's key).
    pub cgroup_id: u64,
    /// The job's slot in the program array.
    pub slot: Option<u32>,
    /// The job's own program.
    pub prog_id: Option<u32>,
}

fn bpf_err(cmd: &'static str, what: String, e: std::io::Error) -> Error {
    Error::Bpf {
        cmd,
        what,
        source: e,
        log: String::new(),
    }
}

/// The node program's two maps, opened.
struct NodeMaps {
    /// job cgroup id (u64) → slot (u32).
    jobs: OwnedFd,
    /// slot → job program.
    progs: OwnedFd,
    /// The id of the program found, when it is release 2's node program (to be replaced).
    old: Option<u32>,
}

/// Locks the scope folder for a change of the maps (released when the file closes).
fn lock(scope: &Path) -> Result<OwnedFd> {
    let fd = open_dir(scope)?;
    rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| Error::cgroup("lock", scope, e.into()))?;
    Ok(fd)
}

/// The maps of the node program attached to `scope`, if there is one.
fn find(scope: BorrowedFd<'_>) -> Result<Option<NodeMaps>> {
    let (ids, _) = sys::prog_query(scope)
        .map_err(|e| bpf_err("PROG_QUERY", "slurmstepd's scope".into(), e))?;
    for id in ids {
        let Ok(prog) = sys::prog_get_fd_by_id(id) else {
            continue;
        };
        let Ok(info) = sys::prog_info_full(prog.as_fd()) else {
            continue;
        };
        let current = info.name == NODE_PROG_NAME;
        if !(current || info.name == OLD_NODE_PROG_NAME)
            || info.prog_type != sys::PROG_TYPE_CGROUP_DEVICE
        {
            continue;
        }
        let maps = sys::prog_map_ids(prog.as_fd())
            .map_err(|e| bpf_err("OBJ_GET_INFO_BY_FD", format!("program {id}"), e))?;
        let mut jobs = None;
        let mut progs = None;
        for m in maps {
            let fd = sys::map_get_fd_by_id(m)
                .map_err(|e| bpf_err("MAP_GET_FD_BY_ID", format!("map {m}"), e))?;
            // The hash map has 8-byte keys, the program array 4-byte ones.
            if map_key_size(fd.as_fd()) == Some(8) {
                jobs = Some(fd);
            } else {
                progs = Some(fd);
            }
        }
        if let (Some(jobs), Some(progs)) = (jobs, progs) {
            return Ok(Some(NodeMaps {
                jobs,
                progs,
                old: (!current).then_some(id),
            }));
        }
    }
    Ok(None)
}

/// A map's key size, from its fdinfo.
fn map_key_size(map: BorrowedFd<'_>) -> Option<u32> {
    use std::os::fd::AsRawFd;
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", map.as_raw_fd())).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("key_size:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The node program: the job of the current process by its ancestor at `level`, then that
/// job's program by a tail call; a process of another uid than root in a folder of no job in
/// the map gets [`NO_JOB_SLOT`]'s.
pub fn node_program(level: u32, jobs_fd: i32, progs_fd: i32) -> Vec<Insn> {
    const LD_IMM64: u8 = 0x18;
    const CALL: u8 = 0x85;
    const STX_DW: u8 = 0x7b;
    const ADD64_IMM: u8 = 0x07;
    /// BPF_JMP32 | BPF_JEQ | BPF_K: compares the low 32 bits.
    const JEQ32_IMM: u8 = 0x16;
    const PSEUDO_MAP_FD: u8 = 1;
    const GET_CURRENT_ANCESTOR_CGROUP_ID: i32 = 123;
    const GET_CURRENT_UID_GID: i32 = 15;
    const MAP_LOOKUP_ELEM: i32 = 1;
    const TAIL_CALL: i32 = 12;
    let i = |code: u8, dst: u8, src: u8, off: i16, imm: i32| Insn {
        code,
        regs: (src << 4) | (dst & 0xf),
        off,
        imm,
    };
    // Jumps count instructions (LD_IMM64 takes two): 3 → ALLOW (25), 10 → NO_JOB (18),
    // 19 → ALLOW.
    vec![
        i(op::MOV64_REG, 6, 1, 0, 0),
        i(op::MOV64_IMM, 1, 0, 0, level as i32),
        i(CALL, 0, 0, 0, GET_CURRENT_ANCESTOR_CGROUP_ID),
        // Above the job level (the scope itself): allow.
        i(op::JEQ_IMM, 0, 0, 21, 0),
        i(STX_DW, 10, 0, -8, 0),
        i(op::MOV64_REG, 2, 10, 0, 0),
        i(ADD64_IMM, 2, 0, 0, -8),
        i(LD_IMM64, 1, PSEUDO_MAP_FD, 0, jobs_fd),
        i(0, 0, 0, 0, 0),
        i(CALL, 0, 0, 0, MAP_LOOKUP_ELEM),
        // Not a job of the map.
        i(op::JEQ_IMM, 0, 0, 7, 0),
        i(op::LDXW, 3, 0, 0, 0),
        i(op::MOV64_REG, 1, 6, 0, 0),
        i(LD_IMM64, 2, PSEUDO_MAP_FD, 0, progs_fd),
        i(0, 0, 0, 0, 0),
        i(CALL, 0, 0, 0, TAIL_CALL),
        // The job's slot is empty: deny.
        i(op::MOV64_IMM, 0, 0, 0, 0),
        i(op::EXIT, 0, 0, 0, 0),
        // NO_JOB: root's processes pass (slurmd and its prologs in Slurm's own folders under
        // the scope, slurmstepd waiting in `system`); anyone else's get the program of a job
        // without devices. The real uid: a user's setuid program is still the user's.
        i(CALL, 0, 0, 0, GET_CURRENT_UID_GID),
        i(JEQ32_IMM, 0, 0, 5, 0),
        i(op::MOV64_REG, 1, 6, 0, 0),
        i(LD_IMM64, 2, PSEUDO_MAP_FD, 0, progs_fd),
        i(0, 0, 0, 0, 0),
        i(op::MOV64_IMM, 3, 0, 0, NO_JOB_SLOT as i32),
        i(CALL, 0, 0, 0, TAIL_CALL),
        // No program for jobs without devices yet: the node has set up no job since its node
        // program was made (the prolog loads it before it adds a job), so nothing to tell.
        // ALLOW:
        i(op::MOV64_IMM, 0, 0, 0, 1),
        i(op::EXIT, 0, 0, 0, 0),
    ]
}

/// The node program on `scope` (attached now when there is none), its maps opened. Call under
/// [`lock`].
fn ensure(scope_fd: BorrowedFd<'_>, scope: &Path, level: u32) -> Result<NodeMaps> {
    use std::os::fd::AsRawFd;
    let (jobs, progs, old) = match find(scope_fd)? {
        Some(m) if m.old.is_none() => return Ok(m),
        // Release 2's node program: the current one on the same maps, then the old one goes.
        Some(m) => (m.jobs, m.progs, m.old),
        None => {
            let jobs = sys::map_create(sys::MAP_TYPE_HASH, 8, 4, SLOTS, "tenancy_jobs")
                .map_err(|e| bpf_err("MAP_CREATE", "the jobs map".into(), e))?;
            let progs = sys::map_create(sys::MAP_TYPE_PROG_ARRAY, 4, 4, SLOTS, "tenancy_progs")
                .map_err(|e| bpf_err("MAP_CREATE", "the job programs array".into(), e))?;
            pin_progs(progs.as_fd(), scope)?;
            (jobs, progs, None)
        }
    };
    let insns = node_program(level, jobs.as_raw_fd(), progs.as_raw_fd());
    let prog = sys::prog_load_named(&insns, NODE_PROG_NAME).map_err(|(e, log)| Error::Bpf {
        cmd: "PROG_LOAD",
        what: format!(
            "the node device program for {} (needs Linux 6.1+: bpf_get_current_ancestor_cgroup_id in device programs)",
            scope.display()
        ),
        source: e,
        log: if log.is_empty() {
            log
        } else {
            format!("\nverifier log:\n{log}")
        },
    })?;
    sys::prog_attach(scope_fd, prog.as_fd(), sys::F_ALLOW_MULTI).map_err(|e| {
        bpf_err(
            "PROG_ATTACH",
            format!(
                "the node device program to {} (flags MULTI): another program attached there \
                 without BPF_F_ALLOW_MULTI?",
                scope.display()
            ),
            e,
        )
    })?;
    if let Some(id) = old {
        // Found by its id and name (`find`); gone meanwhile is fine.
        if let Ok(prog) = sys::prog_get_fd_by_id(id) {
            match sys::prog_detach(scope_fd, prog.as_fd()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => {
                    return Err(bpf_err(
                        "PROG_DETACH",
                        format!("release 2's node program {id} from {}", scope.display()),
                        e,
                    ))
                }
            }
        }
    }
    Ok(NodeMaps {
        jobs,
        progs,
        old: None,
    })
}

/// Where bpffs is mounted (and mounted by us when it is not).
pub const BPFFS: &str = "/sys/fs/bpf";
/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Pins the program array so it keeps its programs: a pin is a file reference, and it stays
/// as long as the node runs. An earlier node program's pin (slurmd restarted with a new scope)
/// is replaced.
#[allow(clippy::unnecessary_cast)]
fn pin_progs(progs: BorrowedFd<'_>, scope: &Path) -> Result<()> {
    let fs = Path::new(BPFFS);
    let is_bpffs = |p: &Path| rustix::fs::statfs(p).is_ok_and(|s| s.f_type as i64 == BPF_FS_MAGIC);
    if !is_bpffs(fs) {
        let _ = std::fs::create_dir_all(fs);
        rustix::mount::mount("bpf", fs, "bpf", rustix::mount::MountFlags::empty(), None)
            .map_err(|e| Error::cgroup("mount bpffs on", fs, e.into()))?;
    }
    let id =
        tenancy_cgroup::slurm::cgroup_id(scope).map_err(|e| Error::cgroup("stat", scope, e))?;
    let pin = fs.join(format!("tenancy_progs_{id}"));
    let _ = std::fs::remove_file(&pin);
    sys::obj_pin(progs, &pin).map_err(|e| {
        bpf_err(
            "OBJ_PIN",
            format!("the job programs array at {}", pin.display()),
            e,
        )
    })
}

/// Puts job `cgroup_id`'s program for `policy` under the node program on `scope` (attached
/// when missing). On error nothing of the job stays.
pub fn add_job(
    scope: &Path,
    level: u32,
    cgroup_id: u64,
    policy: &DevicePolicy,
    programs: Option<&Programs>,
) -> Result<AnchoredAttached> {
    let insns = bpf::generate(policy);
    let digest = bpf::digest(&insns);
    let prog = match programs.and_then(|p| p.find(&digest)) {
        Some(p) => p,
        None => {
            let p = sys::prog_load(&insns).map_err(|(e, log)| Error::Bpf {
                cmd: "PROG_LOAD",
                what: format!(
                    "device program ({} insns) for job cgroup {cgroup_id}",
                    insns.len()
                ),
                source: e,
                log,
            })?;
            if let Some(ps) = programs {
                ps.remember(&digest, p.as_fd());
            }
            p
        }
    };
    let (prog_id, _) = sys::prog_info(prog.as_fd())
        .map_err(|e| bpf_err("OBJ_GET_INFO_BY_FD", "device program".into(), e))?;
    let scope_fd = lock(scope)?;
    let maps = ensure(scope_fd.as_fd(), scope, level)?;
    ensure_no_job(&maps, policy)?;
    let key = cgroup_id.to_ne_bytes();
    // A re-run of the prolog keeps the job's slot.
    let mut v = [0u8; 4];
    let slot = match sys::map_lookup(maps.jobs.as_fd(), &key, &mut v) {
        Ok(()) => u32::from_ne_bytes(v),
        Err(_) => free_slot(&maps, scope_fd.as_fd())?,
    };
    use std::os::fd::AsRawFd;
    let fd = (prog.as_raw_fd() as u32).to_ne_bytes();
    sys::map_update(
        maps.progs.as_fd(),
        &slot.to_ne_bytes(),
        &fd,
        sys::UPDATE_ANY,
    )
    .map_err(|e| bpf_err("MAP_UPDATE_ELEM", format!("job program slot {slot}"), e))?;
    if let Err(e) = sys::map_update(
        maps.jobs.as_fd(),
        &key,
        &slot.to_ne_bytes(),
        sys::UPDATE_ANY,
    ) {
        let _ = sys::map_delete(maps.progs.as_fd(), &slot.to_ne_bytes());
        return Err(bpf_err(
            "MAP_UPDATE_ELEM",
            format!("job cgroup {cgroup_id} in the jobs map"),
            e,
        ));
    }
    Ok(AnchoredAttached {
        scope_dir: scope.to_path_buf(),
        cgroup_id,
        slot: Some(slot),
        prog_id: Some(prog_id),
    })
}

/// The jobs map's key under which the first four bytes of the no-job program's digest are
/// kept ([`NO_JOB_SLOT`]), so that a prolog loads that program again only when the node's
/// devices changed. No cgroup has this id.
const NO_JOB_DIGEST_KEY: u64 = u64::MAX;

/// Puts the program of a job without devices, for the node's devices as `policy` sees them
/// (its deny lists), in [`NO_JOB_SLOT`] unless it is there already.
fn ensure_no_job(maps: &NodeMaps, policy: &DevicePolicy) -> Result<()> {
    let no_job = DevicePolicy {
        allow: Vec::new(),
        deny_majors: policy.deny_majors.clone(),
        deny_devices: policy.deny_devices.clone(),
    };
    let insns = bpf::generate(&no_job);
    let d = bpf::digest(&insns);
    let want = [d[0], d[1], d[2], d[3]];
    let key = NO_JOB_DIGEST_KEY.to_ne_bytes();
    let mut have = [0u8; 4];
    if sys::map_lookup(maps.jobs.as_fd(), &key, &mut have).is_ok() && have == want {
        return Ok(());
    }
    let prog = sys::prog_load(&insns).map_err(|(e, log)| Error::Bpf {
        cmd: "PROG_LOAD",
        what: format!(
            "device program for processes of no job ({} insns)",
            insns.len()
        ),
        source: e,
        log,
    })?;
    use std::os::fd::AsRawFd;
    let fd = (prog.as_raw_fd() as u32).to_ne_bytes();
    sys::map_update(
        maps.progs.as_fd(),
        &NO_JOB_SLOT.to_ne_bytes(),
        &fd,
        sys::UPDATE_ANY,
    )
    .map_err(|e| bpf_err("MAP_UPDATE_ELEM", format!("slot {NO_JOB_SLOT} (no job)"), e))?;
    sys::map_update(maps.jobs.as_fd(), &key, &want, sys::UPDATE_ANY).map_err(|e| {
        bpf_err(
            "MAP_UPDATE_ELEM",
            "the no-job program's digest in the jobs map".into(),
            e,
        )
    })
}

/// The lowest slot no job holds. When every slot is held, the entries of job folders that no
/// longer exist (an epilog that never ran, a prolog killed before it journaled the result) are
/// collected first.
fn free_slot(maps: &NodeMaps, scope_fd: BorrowedFd<'_>) -> Result<u32> {
    let free = |maps: &NodeMaps| {
        let used: Vec<u32> = entries(maps).into_iter().map(|(_, slot)| slot).collect();
        (0..NO_JOB_SLOT).find(|s| !used.contains(s))
    };
    if let Some(s) = free(maps) {
        return Ok(s);
    }
    collect_stale_in(maps, scope_fd)?;
    free(maps).ok_or_else(|| {
        Error::Policy(format!(
            "all {NO_JOB_SLOT} device program slots of this node are held by running jobs"
        ))
    })
}

/// (job cgroup id, slot) of every job in the node program's map.
fn entries(maps: &NodeMaps) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    let mut key: Option<[u8; 8]> = None;
    loop {
        let mut next = [0u8; 8];
        if sys::map_next_key(maps.jobs.as_fd(), key.as_ref().map(|k| &k[..]), &mut next).is_err() {
            break;
        }
        let mut v = [0u8; 4];
        if u64::from_ne_bytes(next) != NO_JOB_DIGEST_KEY
            && sys::map_lookup(maps.jobs.as_fd(), &next, &mut v).is_ok()
        {
            out.push((u64::from_ne_bytes(next), u32::from_ne_bytes(v)));
        }
        key = Some(next);
    }
    out
}

/// Whether the cgroup of id `id` still exists, asked by file handle on the cgroup2 file system
/// of `fs_fd` (`open_by_handle_at`: a cgroup's handle is its id). Only a definite "gone"
/// (ESTALE, ENOENT) is false: anything else keeps the entry.
fn cgroup_exists(fs_fd: BorrowedFd<'_>, id: u64) -> bool {
    use std::os::fd::AsRawFd;
    /// FILEID_KERNFS
    const KERNFS: i32 = 0xfe;
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        id: u64,
    }
    let mut h = Handle {
        bytes: 8,
        kind: KERNFS,
        id,
    };
    // SAFETY: a file_handle of 8 bytes laid out as the kernel's struct; the fd returned, if
    // any, is closed at once.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            fs_fd.as_raw_fd(),
            &mut h as *mut Handle,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd >= 0 {
        // SAFETY: the kernel just gave us this descriptor.
        unsafe { libc::close(fd as i32) };
        return true;
    }
    let e = std::io::Error::last_os_error().raw_os_error();
    !matches!(e, Some(libc::ESTALE) | Some(libc::ENOENT))
}

/// Removes the entries of job folders that no longer exist from the node program on `scope`
/// (slot first); returns their cgroup ids.
pub fn collect_stale(scope: &Path) -> Result<Vec<u64>> {
    let scope_fd = lock(scope)?;
    let Some(maps) = find(scope_fd.as_fd())? else {
        return Ok(Vec::new());
    };
    collect_stale_in(&maps, scope_fd.as_fd())
}

fn collect_stale_in(maps: &NodeMaps, scope_fd: BorrowedFd<'_>) -> Result<Vec<u64>> {
    let mut gone = Vec::new();
    for (id, slot) in entries(maps) {
        if cgroup_exists(scope_fd, id) {
            continue;
        }
        let _ = sys::map_delete(maps.progs.as_fd(), &slot.to_ne_bytes());
        match sys::map_delete(maps.jobs.as_fd(), &id.to_ne_bytes()) {
            Ok(()) => gone.push(id),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => {
                return Err(bpf_err(
                    "MAP_DELETE_ELEM",
                    format!("stale job cgroup {id} in the jobs map"),
                    e,
                ))
            }
        }
    }
    Ok(gone)
}

/// Removes job `a.cgroup_id` from the node program's maps (idempotent): its slot first, so a
/// process of it left would be denied, never allowed.
pub fn remove_job(a: &AnchoredAttached) -> Result<bool> {
    let scope_fd = match lock(&a.scope_dir) {
        Ok(fd) => fd,
        // The scope is gone (slurmd stopped with cgroup/v2 off): so is everything attached.
        Err(_) if !a.scope_dir.exists() => return Ok(false),
        Err(e) => return Err(e),
    };
    let Some(maps) = find(scope_fd.as_fd())? else {
        return Ok(false);
    };
    let key = a.cgroup_id.to_ne_bytes();
    let mut v = [0u8; 4];
    let slot = match sys::map_lookup(maps.jobs.as_fd(), &key, &mut v) {
        Ok(()) => u32::from_ne_bytes(v),
        Err(_) => return Ok(false),
    };
    match sys::map_delete(maps.progs.as_fd(), &slot.to_ne_bytes()) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => {
            return Err(bpf_err(
                "MAP_DELETE_ELEM",
                format!("job program slot {slot}"),
                e,
            ))
        }
    }
    match sys::map_delete(maps.jobs.as_fd(), &key) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) => Err(bpf_err(
            "MAP_DELETE_ELEM",
            format!("job cgroup {} in the jobs map", a.cgroup_id),
            e,
        )),
    }
}

/// The job cgroup ids the node program on `scope` holds (reconcile, doctor).
pub fn jobs(scope: &Path) -> Result<Vec<u64>> {
    let fd = open_dir(scope)?;
    let Some(maps) = find(fd.as_fd())? else {
        return Ok(Vec::new());
    };
    Ok(entries(&maps).into_iter().map(|(id, _)| id).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node program's jumps land where its comments say: above the job level and root in
    /// a folder of no job on ALLOW (r0 = 1), anyone else there on the tail call into
    /// NO_JOB_SLOT.
    #[test]
    fn node_program_jumps_land_on_their_labels() {
        let p = node_program(3, 7, 8);
        assert_eq!(p.len(), 27);
        let target = |at: usize| (at as i64 + 1 + i64::from(p[at].off)) as usize;
        let allow = p.len() - 2;
        assert_eq!((p[allow].code, p[allow].imm), (op::MOV64_IMM, 1));
        assert_eq!((p[3].code, target(3)), (op::JEQ_IMM, allow));
        let no_job = target(10);
        assert_eq!(p[10].code, op::JEQ_IMM);
        assert_eq!((p[no_job - 2].code, p[no_job - 2].imm), (op::MOV64_IMM, 0));
        assert_eq!(p[no_job].imm, 15, "get_current_uid_gid");
        assert_eq!(target(no_job + 1), allow);
        assert_eq!(p[no_job + 5].imm, NO_JOB_SLOT as i32);
    }
}
