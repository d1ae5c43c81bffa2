//! slurmstepd's own sockets (ARCHITECTURE.md, "What Slurm's daemons do for a job").
//!
//! slurmstepd sits in its job's cgroup from `slurm_spank_init` on, so every socket it makes
//! for the job (the I/O and response connections to srun, sattach's attach, task exits,
//! X11 forwarding, step completion to slurmctld) is judged as the job's: its tenant's ct mark,
//! its tenant's address across nodes. Those connections go where the user's srun, sattach or
//! salloc listens, on any host, which no egress list names; user code in the same cgroup, with
//! the same uid for the first I/O connection (`_setup_normal_io` opens it with the user's euid),
//! must not go there. What tells them apart is the creating thread: slurmstepd's threads run
//! with real uid 0 and the command name `slurmstepd` (Slurm renames none of them), and every
//! process of the job's user code has the user's real uid (Slurm's `_become_user` and
//! `_run_script_as_user` set it before they exec anything).
//!
//! [`program`] is a `BPF_CGROUP_INET_SOCK_CREATE` program that stamps such a socket with
//! [`STEPD_MARK`] (`sk_mark`, which the kernel copies into every packet the socket sends, so
//! nft's `meta mark` sees it at output and, on loopback, at input). [`attach`] puts it on the
//! cgroup2 root (`BPF_F_ALLOW_MULTI`, beside any other's), where it covers every slurmstepd of
//! the node, in its job or not yet; `tenancyctl firewall apply` calls it. The mark is not on
//! the wire: across nodes the tenant's source address (cross.rs) carries the identity.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use tenancy_devices::bpf::{sys, Insn};

use crate::{io_err, Error, Result};

/// The socket mark of slurmstepd's sockets (`meta mark` in the ruleset). No job can set a
/// socket's mark (SO_MARK needs CAP_NET_ADMIN).
pub const STEPD_MARK: u32 = 0x544e_5344;

/// The program's name (`bpftool prog`), by which [`attach`] finds the one it attached before.
pub const PROG_NAME: &str = "tenancy_stepd";

/// The command name of slurmstepd's threads, as `bpf_get_current_comm` fills 16 bytes.
const COMM: &[u8; 16] = b"slurmstepd\0\0\0\0\0\0";

/// `struct bpf_sock`'s `mark` (writable in `BPF_CGROUP_INET_SOCK_CREATE` programs).
const SOCK_MARK: i16 = 16;
const FUNC_GET_CURRENT_UID_GID: i32 = 15;
const FUNC_GET_CURRENT_COMM: i32 = 16;

mod op {
    pub const MOV64_REG: u8 = 0xbf;
    pub const MOV64_IMM: u8 = 0xb7;
    /// BPF_ALU | BPF_MOV | BPF_X: the low 32 bits, zero-extended.
    pub const MOV32_REG: u8 = 0xbc;
    pub const MOV32_IMM: u8 = 0xb4;
    pub const ADD64_IMM: u8 = 0x07;
    pub const CALL: u8 = 0x85;
    pub const JNE_IMM: u8 = 0x55;
    pub const JNE_REG: u8 = 0x5d;
    pub const LDXDW: u8 = 0x79;
    pub const STXW: u8 = 0x63;
    pub const LD_IMM64: u8 = 0x18;
    pub const EXIT: u8 = 0x95;
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

/// The socket program: `sk_mark = STEPD_MARK` when the creating thread has real uid 0 and the
/// command name `slurmstepd`; every socket is let through (return 1).
pub fn program() -> Vec<Insn> {
    let half = |i: usize| u64::from_le_bytes(COMM[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let (lo, hi) = (half(0), half(1));
    // Jumps go to the last two instructions (r0 = 1; exit): OUT is the index of the first.
    const OUT: i16 = 19;
    let to_out = |at: i16| OUT - at - 1;
    vec![
        insn(op::MOV64_REG, 6, 1, 0, 0),
        insn(op::CALL, 0, 0, 0, FUNC_GET_CURRENT_UID_GID),
        // r0 = the real uid (the low half; the gid is the high one).
        insn(op::MOV32_REG, 0, 0, 0, 0),
        insn(op::JNE_IMM, 0, 0, to_out(3), 0),
        insn(op::MOV64_REG, 1, 10, 0, 0),
        insn(op::ADD64_IMM, 1, 0, 0, -16),
        insn(op::MOV64_IMM, 2, 0, 0, 16),
        insn(op::CALL, 0, 0, 0, FUNC_GET_CURRENT_COMM),
        insn(op::JNE_IMM, 0, 0, to_out(8), 0),
        insn(op::LDXDW, 1, 10, -16, 0),
        insn(op::LD_IMM64, 2, 0, 0, lo as u32 as i32),
        insn(0, 0, 0, 0, (lo >> 32) as u32 as i32),
        insn(op::JNE_REG, 1, 2, to_out(12), 0),
        insn(op::LDXDW, 1, 10, -8, 0),
        insn(op::LD_IMM64, 2, 0, 0, hi as u32 as i32),
        insn(0, 0, 0, 0, (hi >> 32) as u32 as i32),
        insn(op::JNE_REG, 1, 2, to_out(16), 0),
        insn(op::MOV32_IMM, 1, 0, 0, STEPD_MARK as i32),
        insn(op::STXW, 6, 1, SOCK_MARK, 0),
        insn(op::MOV64_IMM, 0, 0, 0, 1),
        insn(op::EXIT, 0, 0, 0, 0),
    ]
}

fn open_dir(dir: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        dir,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| io_err("cannot open cgroup", dir, e.into()))
}

fn bpf_error(what: &str, dir: &Path, e: std::io::Error) -> Error {
    Error::Invalid(format!(
        "cannot {what} slurmstepd's socket program ({PROG_NAME}) on {}: {e}; the kernel needs \
         CONFIG_CGROUP_BPF and the cgroup must take BPF_F_ALLOW_MULTI programs",
        dir.display()
    ))
}

/// Ours among the socket programs attached to `cg`: (id, tag, open fd), in attach order.
fn ours(cg: &OwnedFd, dir: &Path) -> Result<Vec<(u32, [u8; 8], OwnedFd)>> {
    let (ids, _) = sys::prog_query_typed(cg.as_fd(), sys::ATTACH_CGROUP_INET_SOCK_CREATE)
        .map_err(|e| bpf_error("query", dir, e))?;
    Ok(ids
        .into_iter()
        .filter_map(|id| {
            let fd = sys::prog_get_fd_by_id(id).ok()?;
            let info = sys::prog_info_full(fd.as_fd()).ok()?;
            (info.prog_type == sys::PROG_TYPE_CGROUP_SOCK && info.name == PROG_NAME)
                .then_some((id, info.tag, fd))
        })
        .collect())
}

fn load() -> Result<OwnedFd> {
    sys::prog_load_typed(
        sys::PROG_TYPE_CGROUP_SOCK,
        sys::ATTACH_CGROUP_INET_SOCK_CREATE,
        &program(),
        PROG_NAME,
        b"Apache-2.0\0",
    )
    .map_err(|(e, log)| {
        Error::Invalid(format!(
            "cannot load slurmstepd's socket program ({PROG_NAME}): {e}; verifier: {}",
            log.trim()
        ))
    })
}

/// Attaches [`program`] to the cgroup `root` (the cgroup2 mount's root), once: an attached
/// program of ours with the same instructions stays, an older one is replaced in one step
/// (`BPF_F_REPLACE`: no socket is made meanwhile without the mark). Returns the program's id.
pub fn attach(root: &Path) -> Result<u32> {
    let cg = open_dir(root)?;
    let new = load()?;
    let new_info = sys::prog_info_full(new.as_fd()).map_err(|e| bpf_error("inspect", root, e))?;
    let mut old = ours(&cg, root)?;
    if let Some(i) = old.iter().position(|(_, tag, _)| *tag == new_info.tag) {
        let (id, _, _) = old.remove(i);
        for (_, _, fd) in &old {
            let _ =
                sys::prog_detach_typed(cg.as_fd(), fd.as_fd(), sys::ATTACH_CGROUP_INET_SOCK_CREATE);
        }
        return Ok(id);
    }
    let replace = old.first().map(|(_, _, fd)| fd.as_fd());
    let flags = sys::F_ALLOW_MULTI | if replace.is_some() { sys::F_REPLACE } else { 0 };
    sys::prog_attach_typed(
        cg.as_fd(),
        new.as_fd(),
        sys::ATTACH_CGROUP_INET_SOCK_CREATE,
        flags,
        replace,
    )
    .map_err(|e| bpf_error("attach", root, e))?;
    for (_, _, fd) in old.iter().skip(1) {
        let _ = sys::prog_detach_typed(cg.as_fd(), fd.as_fd(), sys::ATTACH_CGROUP_INET_SOCK_CREATE);
    }
    Ok(new_info.id)
}

/// The id of our program attached to `root` with this build's instructions (`tenancyctl
/// doctor`); `None` when there is none (or only an older one).
pub fn attached(root: &Path) -> Result<Option<u32>> {
    let cg = open_dir(root)?;
    let tag = sys::prog_info_full(load()?.as_fd())
        .map_err(|e| bpf_error("inspect", root, e))?
        .tag;
    Ok(ours(&cg, root)?
        .into_iter()
        .find(|(_, t, _)| *t == tag)
        .map(|(id, _, _)| id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_on_the_exit_pair() {
        let p = program();
        assert_eq!(p.len(), 21);
        for (i, x) in p.iter().enumerate() {
            if matches!(x.code, op::JNE_IMM | op::JNE_REG) {
                assert_eq!(i as i16 + 1 + x.off, 19, "jump at {i}");
            }
        }
        assert_eq!(p[19].code, op::MOV64_IMM);
        assert_eq!(p[19].imm, 1);
        assert_eq!(p[20].code, op::EXIT);
        assert_eq!(p[17].imm as u32, STEPD_MARK);
    }
}
