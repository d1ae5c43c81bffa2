//! Raw bpf(2) calls through libc (no libbpf, no aya). Each command's `union bpf_attr` member is
//! a `repr(C)` struct with the kernel's layout; unused trailing fields stay zero.

use super::Insn;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_int = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_MAP_DELETE_ELEM: libc::c_int = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_int = 4;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_OBJ_PIN: libc::c_int = 6;
const BPF_MAP_GET_FD_BY_ID: libc::c_int = 14;
const BPF_PROG_ATTACH: libc::c_int = 8;
const BPF_PROG_DETACH: libc::c_int = 9;
const BPF_PROG_GET_FD_BY_ID: libc::c_int = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_PROG_QUERY: libc::c_int = 16;

/// BPF_PROG_TYPE_CGROUP_DEVICE
pub const PROG_TYPE_CGROUP_DEVICE: u32 = 15;
/// BPF_CGROUP_DEVICE attach type
pub const ATTACH_CGROUP_DEVICE: u32 = 6;
/// BPF_PROG_TYPE_CGROUP_SOCK (the firewall's socket program, tenancy-network)
pub const PROG_TYPE_CGROUP_SOCK: u32 = 9;
/// BPF_CGROUP_INET_SOCK_CREATE attach type
pub const ATTACH_CGROUP_INET_SOCK_CREATE: u32 = 2;
/// BPF_F_ALLOW_OVERRIDE
pub const F_ALLOW_OVERRIDE: u32 = 1;
/// BPF_F_ALLOW_MULTI
pub const F_ALLOW_MULTI: u32 = 2;
/// BPF_F_REPLACE
pub const F_REPLACE: u32 = 4;

/// Name given to every program this layer loads (visible in `bpftool prog`, checked before a
/// detach by id so a recycled id can never make us detach someone else's program).
pub const PROG_NAME: &str = "tenancy_dev";

#[repr(C, align(8))]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C, align(8))]
#[derive(Default)]
struct Attach {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    _pad: u32,
}

#[repr(C, align(8))]
#[derive(Default)]
struct GetFdById {
    id: u32,
    next_id: u32,
    open_flags: u32,
    _pad: u32,
}

#[repr(C, align(8))]
#[derive(Default)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

#[repr(C, align(8))]
#[derive(Default)]
struct Query {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
}

#[repr(C, align(8))]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    /// Named so the struct has no padding: the kernel reads these bytes too.
    map_ifindex: u32,
}

#[repr(C, align(8))]
#[derive(Default)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// BPF_MAP_TYPE_HASH
pub const MAP_TYPE_HASH: u32 = 1;
/// BPF_MAP_TYPE_PROG_ARRAY
pub const MAP_TYPE_PROG_ARRAY: u32 = 3;
/// BPF_ANY
pub const UPDATE_ANY: u64 = 0;

/// Create a map.
pub fn map_create(
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    let mut map_name = [0u8; 16];
    let n = name.len().min(15);
    map_name[..n].copy_from_slice(&name.as_bytes()[..n]);
    let mut attr = MapCreate {
        map_type,
        key_size,
        value_size,
        max_entries,
        map_name,
        ..Default::default()
    };
    bpf(BPF_MAP_CREATE, &mut attr).map(fd_from)
}

fn map_elem(
    cmd: libc::c_int,
    map: BorrowedFd<'_>,
    key: &[u8],
    value: u64,
    flags: u64,
) -> io::Result<()> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        key: key.as_ptr() as u64,
        value,
        flags,
        ..Default::default()
    };
    bpf(cmd, &mut attr).map(|_| ())
}

/// Look `key` up into `value` (sized as the map's values). ENOENT when it is not there.
pub fn map_lookup(map: BorrowedFd<'_>, key: &[u8], value: &mut [u8]) -> io::Result<()> {
    map_elem(BPF_MAP_LOOKUP_ELEM, map, key, value.as_mut_ptr() as u64, 0)
}

/// Set `key` to `value`.
pub fn map_update(map: BorrowedFd<'_>, key: &[u8], value: &[u8], flags: u64) -> io::Result<()> {
    map_elem(BPF_MAP_UPDATE_ELEM, map, key, value.as_ptr() as u64, flags)
}

/// Delete `key`. ENOENT when it is not there.
pub fn map_delete(map: BorrowedFd<'_>, key: &[u8]) -> io::Result<()> {
    map_elem(BPF_MAP_DELETE_ELEM, map, key, 0, 0)
}

/// The key after `key` (the first with `None`) into `next`; ENOENT after the last.
pub fn map_next_key(map: BorrowedFd<'_>, key: Option<&[u8]>, next: &mut [u8]) -> io::Result<()> {
    let mut attr = MapElem {
        map_fd: map.as_raw_fd() as u32,
        key: key.map_or(0, |k| k.as_ptr() as u64),
        value: next.as_mut_ptr() as u64,
        ..Default::default()
    };
    bpf(BPF_MAP_GET_NEXT_KEY, &mut attr).map(|_| ())
}

#[repr(C, align(8))]
#[derive(Default)]
struct ObjPin {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// Pin `obj` at `path` on a bpf file system.
pub fn obj_pin(obj: BorrowedFd<'_>, path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let mut attr = ObjPin {
        pathname: c.as_ptr() as u64,
        bpf_fd: obj.as_raw_fd() as u32,
        ..Default::default()
    };
    bpf(BPF_OBJ_PIN, &mut attr).map(|_| ())
}

/// Open a map by id.
pub fn map_get_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = GetFdById {
        id,
        ..Default::default()
    };
    bpf(BPF_MAP_GET_FD_BY_ID, &mut attr).map(fd_from)
}

/// Ids of the maps a program uses (at most 8).
pub fn prog_map_ids(prog: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; 8];
    let mut info = ProgInfoHead {
        nr_map_ids: ids.len() as u32,
        map_ids: ids.as_mut_ptr() as u64,
        ..Default::default()
    };
    let mut attr = InfoByFd {
        bpf_fd: prog.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgInfoHead>() as u32,
        info: &mut info as *mut ProgInfoHead as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    let n = (info.nr_map_ids as usize).min(ids.len());
    Ok(ids[..n].to_vec())
}

/// Leading part of `struct bpf_prog_info` (the kernel fills at most `info_len` bytes).
#[repr(C, align(8))]
#[derive(Default, Clone, Copy)]
struct ProgInfoHead {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: attr points to a live, initialised repr(C) struct whose layout is a prefix of
    // the kernel's union bpf_attr member for `cmd`; size is its exact size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_from(r: libc::c_long) -> OwnedFd {
    // SAFETY: the kernel just returned this new file descriptor to us.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

/// Load a cgroup device program. On failure the error carries the verifier log.
pub fn prog_load(insns: &[Insn]) -> Result<OwnedFd, (io::Error, String)> {
    prog_load_named(insns, PROG_NAME)
}

/// [`prog_load`] under another name (at most 15 bytes).
pub fn prog_load_named(insns: &[Insn], prog_name: &str) -> Result<OwnedFd, (io::Error, String)> {
    prog_load_typed(
        PROG_TYPE_CGROUP_DEVICE,
        ATTACH_CGROUP_DEVICE,
        insns,
        prog_name,
        b"Apache-2.0\0",
    )
}

/// Load a program of `prog_type` for `attach_type` under `prog_name` (at most 15 bytes), with
/// `license` (NUL-terminated; helpers such as `bpf_get_current_comm` need a GPL-compatible one).
pub fn prog_load_typed(
    prog_type: u32,
    attach_type: u32,
    insns: &[Insn],
    prog_name: &str,
    license: &[u8],
) -> Result<OwnedFd, (io::Error, String)> {
    assert_eq!(license.last(), Some(&0), "license must be NUL-terminated");
    let mut name = [0u8; 16];
    let n = prog_name.len().min(15);
    name[..n].copy_from_slice(&prog_name.as_bytes()[..n]);
    let mut attr = ProgLoad {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name,
        expected_attach_type: attach_type,
        ..Default::default()
    };
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(fd_from(fd)),
        Err(e) => {
            // Retry with the verifier log for the error message.
            let mut log = vec![0u8; 64 * 1024];
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            if let Ok(fd) = bpf(BPF_PROG_LOAD, &mut attr) {
                return Ok(fd_from(fd));
            }
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            Err((e, String::from_utf8_lossy(&log[..end]).into_owned()))
        }
    }
}

/// Program id and name of a loaded program.
pub fn prog_info(prog: BorrowedFd<'_>) -> io::Result<(u32, String)> {
    prog_info_full(prog).map(|i| (i.id, i.name))
}

/// What the kernel says of a loaded program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgInfo {
    pub prog_type: u32,
    pub id: u32,
    /// The kernel's digest of the instructions ([`super::tag`]).
    pub tag: [u8; 8],
    pub name: String,
}

/// [`prog_info`] with the program's type and tag.
pub fn prog_info_full(prog: BorrowedFd<'_>) -> io::Result<ProgInfo> {
    let mut info = ProgInfoHead::default();
    let mut attr = InfoByFd {
        bpf_fd: prog.as_raw_fd() as u32,
        info_len: std::mem::size_of::<ProgInfoHead>() as u32,
        info: &mut info as *mut ProgInfoHead as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    let end = info.name.iter().position(|&b| b == 0).unwrap_or(16);
    Ok(ProgInfo {
        prog_type: info.prog_type,
        id: info.id,
        tag: info.tag,
        name: String::from_utf8_lossy(&info.name[..end]).into_owned(),
    })
}

/// Open a program by id. ENOENT when it no longer exists.
pub fn prog_get_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = GetFdById {
        id,
        ..Default::default()
    };
    bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).map(fd_from)
}

/// Attach `prog` to the cgroup directory `cg` as a device program.
pub fn prog_attach(cg: BorrowedFd<'_>, prog: BorrowedFd<'_>, flags: u32) -> io::Result<()> {
    prog_attach_typed(cg, prog, ATTACH_CGROUP_DEVICE, flags, None)
}

/// Attach `prog` to `cg` for `attach_type`; with `replace` (and [`F_REPLACE`] in `flags`) in
/// place of that program, atomically.
pub fn prog_attach_typed(
    cg: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
    attach_type: u32,
    flags: u32,
    replace: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut attr = Attach {
        target_fd: cg.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type,
        attach_flags: flags,
        replace_bpf_fd: replace.map_or(0, |r| r.as_raw_fd() as u32),
        ..Default::default()
    };
    bpf(BPF_PROG_ATTACH, &mut attr).map(|_| ())
}

/// Detach exactly `prog` from `cg`. ENOENT when it is not attached there.
pub fn prog_detach(cg: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> io::Result<()> {
    prog_detach_typed(cg, prog, ATTACH_CGROUP_DEVICE)
}

/// [`prog_detach`] for `attach_type`.
pub fn prog_detach_typed(
    cg: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
    attach_type: u32,
) -> io::Result<()> {
    let mut attr = Attach {
        target_fd: cg.as_raw_fd() as u32,
        attach_bpf_fd: prog.as_raw_fd() as u32,
        attach_type,
        ..Default::default()
    };
    bpf(BPF_PROG_DETACH, &mut attr).map(|_| ())
}

/// Ids of the device programs attached directly to `cg` and the cgroup's attach flags.
pub fn prog_query(cg: BorrowedFd<'_>) -> io::Result<(Vec<u32>, u32)> {
    prog_query_typed(cg, ATTACH_CGROUP_DEVICE)
}

/// Ids of the programs of `attach_type` attached directly to `cg`, and its attach flags.
pub fn prog_query_typed(cg: BorrowedFd<'_>, attach_type: u32) -> io::Result<(Vec<u32>, u32)> {
    let mut ids = vec![0u32; 64];
    loop {
        let mut attr = Query {
            target_fd: cg.as_raw_fd() as u32,
            attach_type,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: ids.len() as u32,
            ..Default::default()
        };
        match bpf(BPF_PROG_QUERY, &mut attr) {
            Ok(_) => {
                ids.truncate(attr.prog_cnt as usize);
                return Ok((ids, attr.attach_flags));
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && ids.len() < 65536 => {
                ids = vec![0u32; ids.len() * 4];
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layouts() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        assert_eq!(std::mem::offset_of!(ProgLoad, prog_name), 48);
        assert_eq!(std::mem::offset_of!(ProgLoad, expected_attach_type), 68);
        assert_eq!(std::mem::offset_of!(Query, prog_ids), 16);
        assert_eq!(std::mem::offset_of!(Query, prog_cnt), 24);
        assert_eq!(std::mem::offset_of!(ProgInfoHead, name), 64);
        assert_eq!(std::mem::offset_of!(ProgInfoHead, created_by_uid), 48);
        assert_eq!(std::mem::offset_of!(ProgInfoHead, map_ids), 56);
        assert_eq!(std::mem::offset_of!(MapCreate, map_name), 28);
        assert_eq!(std::mem::size_of::<MapElem>(), 32);
        assert_eq!(std::mem::size_of::<MapCreate>(), 48);
    }
}
