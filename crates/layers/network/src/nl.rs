//! One netlink query to nf_tables, without spawning `nft`: does the product's table hold a
//! counter object of this name? Used on the job path (see `check_loaded`).

use rustix::net::{
    netlink, recv, send, socket_with, AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType,
};
use std::io;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWOBJ: u16 = 18;
const NFT_MSG_GETOBJ: u16 = 19;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NFPROTO_INET: u8 = 1;
const NFTA_OBJ_TABLE: u16 = 1;
const NFTA_OBJ_NAME: u16 = 2;
const NFTA_OBJ_TYPE: u16 = 3;
const NFT_OBJECT_COUNTER: u32 = 1;
const NFTA_OBJ_DATA: u16 = 4;
const NFTA_COUNTER_BYTES: u16 = 1;
const NFTA_COUNTER_PACKETS: u16 = 2;
const NLA_TYPE_MASK: u16 = 0x3fff;

fn attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len() + (4 - len % 4) % 4, 0);
}

fn cstr(s: &str) -> io::Result<Vec<u8>> {
    if s.is_empty() || s.len() > 255 || s.bytes().any(|b| b == 0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("bad nft name {s:?}"),
        ));
    }
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    Ok(v)
}

/// `Ok(true)`: table `inet <table>` has counter `<name>`; `Ok(false)`: it does not (or the
/// table is missing); `Err`: the question could not be asked.
pub(crate) fn counter_exists(table: &str, name: &str) -> io::Result<bool> {
    counter(table, name).map(|c| c.is_some())
}

/// Walks netlink attributes: (type, payload) pairs.
fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let payload = &buf[4..len];
        buf = buf.get((len + 3) & !3usize..).unwrap_or(&[]);
        Some((kind, payload))
    })
}

fn be64(p: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(p.get(..8)?.try_into().ok()?))
}

/// The (packets, bytes) of counter `<name>` in table `inet <table>`, `None` when it is not
/// there: one netlink request, no process.
pub(crate) fn counter(table: &str, name: &str) -> io::Result<Option<(u64, u64)>> {
    let fd = socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(netlink::NETFILTER),
    )?;
    let mut msg = Vec::with_capacity(128);
    msg.extend_from_slice(&0u32.to_ne_bytes()); // length, set below
    msg.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETOBJ).to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // seq
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel assigns ours
    msg.extend_from_slice(&[NFPROTO_INET, 0, 0, 0]); // nfgenmsg: family, version, res_id
    attr(&mut msg, NFTA_OBJ_TABLE, &cstr(table)?);
    attr(&mut msg, NFTA_OBJ_NAME, &cstr(name)?);
    attr(&mut msg, NFTA_OBJ_TYPE, &NFT_OBJECT_COUNTER.to_be_bytes());
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_ne_bytes());
    send(&fd, &msg, SendFlags::empty())?;
    let mut buf = vec![0u8; 8192];
    let (n, _) = recv(&fd, &mut buf, RecvFlags::empty())?;
    if n < 16 {
        return Err(io::Error::other("short netlink reply"));
    }
    let kind = u16::from_ne_bytes([buf[4], buf[5]]);
    if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWOBJ {
        // nlmsghdr (16) + nfgenmsg (4), then the object's attributes.
        let total = (u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize).min(n);
        let data = attrs(buf.get(20..total).unwrap_or(&[]))
            .find(|(k, _)| *k == NFTA_OBJ_DATA)
            .map(|(_, d)| d)
            .unwrap_or(&[]);
        let (mut packets, mut bytes) = (0, 0);
        for (k, p) in attrs(data) {
            match k {
                NFTA_COUNTER_PACKETS => packets = be64(p).unwrap_or(0),
                NFTA_COUNTER_BYTES => bytes = be64(p).unwrap_or(0),
                _ => {}
            }
        }
        return Ok(Some((packets, bytes)));
    }
    if kind == NLMSG_ERROR && n >= 20 {
        let errno = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        return match -errno {
            0 => Err(io::Error::other("netlink acknowledged without an answer")),
            e if e == rustix::io::Errno::NOENT.raw_os_error() => Ok(None),
            e => Err(io::Error::from_raw_os_error(e)),
        };
    }
    Err(io::Error::other(format!(
        "unexpected netlink reply type {kind}"
    )))
}

/// What to do with one element of a verdict map keyed by cgroup id.
#[derive(Clone, Copy)]
pub(crate) enum ElemOp<'a> {
    /// Add `cgroup id : goto <chain>`.
    AddGoto(&'a str),
    /// Delete the element (a missing one is no error).
    Delete,
}

const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NLM_F_CREATE: u16 = 0x400;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFT_GOTO: i32 = -4;

fn nested(buf: &mut Vec<u8>, kind: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let start = buf.len();
    buf.extend_from_slice(&[0, 0]);
    buf.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    inner(buf);
    let len = (buf.len() - start) as u16;
    buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}

fn message(out: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, res_id: u16, body: &[u8]) {
    let len = (16 + 4 + body.len()) as u32;
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.push(NFPROTO_INET);
    out.push(0);
    out.extend_from_slice(&res_id.to_be_bytes());
    out.extend_from_slice(body);
}

/// Changes elements of the verdict maps `(set, cgroup id, op)` of table `inet <table>` in one
/// nf_tables transaction, without `nft`: the element of a cgroup that no longer exists can still
/// be deleted by its id (nft names cgroups by path, and would fail on it). A missing element to
/// delete is not an error.
pub(crate) fn cgroup_elems(table: &str, changes: &[(&str, u64, ElemOp<'_>)]) -> io::Result<()> {
    let fd = socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC,
        Some(netlink::NETFILTER),
    )?;
    // A reply that never comes must not hold the prolog: each wait is bounded.
    rustix::net::sockopt::set_socket_timeout(
        &fd,
        rustix::net::sockopt::Timeout::Recv,
        Some(std::time::Duration::from_secs(5)),
    )?;
    send(&fd, &elem_batch(table, changes)?, SendFlags::empty())?;
    let Some(missing) = acks(&fd, changes)? else {
        return Ok(());
    };
    // A missing element aborts the transaction: retry without it.
    let rest: Vec<(&str, u64, ElemOp<'_>)> = changes
        .iter()
        .enumerate()
        .filter(|(i, _)| 2 + *i as u32 != missing)
        .map(|(_, c)| *c)
        .collect();
    if rest.is_empty() {
        Ok(())
    } else {
        cgroup_elems(table, &rest)
    }
}

/// The transaction: batch begin (seq 1), one message per change (seq 2, 3, ...), batch end.
fn elem_batch(table: &str, changes: &[(&str, u64, ElemOp<'_>)]) -> io::Result<Vec<u8>> {
    let mut msg = Vec::with_capacity(256);
    message(
        &mut msg,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        1,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    for (i, (set, id, op)) in changes.iter().enumerate() {
        let body = elem_body(table, set, *id, *op)?;
        let (kind, flags) = match op {
            ElemOp::AddGoto(_) => (NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE),
            ElemOp::Delete => (NFT_MSG_DELSETELEM, NLM_F_REQUEST | NLM_F_ACK),
        };
        message(
            &mut msg,
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            flags,
            2 + i as u32,
            0,
            &body,
        );
    }
    let last = 2 + changes.len() as u32;
    message(
        &mut msg,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        last,
        NFNL_SUBSYS_NFTABLES,
        &[],
    );
    Ok(msg)
}

/// The attributes of one change: element `id` of map `set`, with its `goto` verdict when
/// it is added.
fn elem_body(table: &str, set: &str, id: u64, op: ElemOp<'_>) -> io::Result<Vec<u8>> {
    let mut body = Vec::with_capacity(96);
    attr(&mut body, NFTA_SET_ELEM_LIST_TABLE, &cstr(table)?);
    attr(&mut body, NFTA_SET_ELEM_LIST_SET, &cstr(set)?);
    let chain = match op {
        ElemOp::AddGoto(c) => Some(cstr(c)?),
        ElemOp::Delete => None,
    };
    nested(&mut body, NFTA_SET_ELEM_LIST_ELEMENTS, |b| {
        nested(b, NFTA_LIST_ELEM, |b| {
            nested(b, NFTA_SET_ELEM_KEY, |b| {
                attr(b, NFTA_DATA_VALUE, &id.to_ne_bytes());
            });
            if let Some(chain) = &chain {
                nested(b, NFTA_SET_ELEM_DATA, |b| {
                    nested(b, NFTA_DATA_VERDICT, |b| {
                        attr(b, NFTA_VERDICT_CODE, &NFT_GOTO.to_be_bytes());
                        attr(b, NFTA_VERDICT_CHAIN, chain);
                    });
                });
            }
        });
    });
    Ok(body)
}

/// Reads one ack per change; the first error aborts the whole transaction. `Ok(Some(seq))`:
/// it was aborted because change `seq` deletes an element that is not there.
fn acks(fd: &std::os::fd::OwnedFd, changes: &[(&str, u64, ElemOp<'_>)]) -> io::Result<Option<u32>> {
    let mut acked = 0;
    let mut buf = vec![0u8; 8192];
    while acked < changes.len() {
        let (n, _) = recv(fd, &mut buf, RecvFlags::empty())?;
        let mut at = 0;
        while at + 20 <= n {
            let len = u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap()) as usize;
            let kind = u16::from_ne_bytes([buf[at + 4], buf[at + 5]]);
            if len < 16 {
                break;
            }
            if kind == NLMSG_ERROR {
                let errno = -i32::from_ne_bytes(buf[at + 16..at + 20].try_into().unwrap());
                // The request's header follows the error code: its seq names the change.
                let seq = buf
                    .get(at + 28..at + 32)
                    .map_or(0, |b| u32::from_ne_bytes(b.try_into().unwrap()));
                let delete = seq
                    .checked_sub(2)
                    .and_then(|i| changes.get(i as usize))
                    .is_some_and(|c| matches!(c.2, ElemOp::Delete));
                match errno {
                    0 => {}
                    e if delete && e == rustix::io::Errno::NOENT.raw_os_error() => {
                        return Ok(Some(seq))
                    }
                    e => return Err(io::Error::from_raw_os_error(e)),
                }
                acked += 1;
            }
            at += (len + 3) & !3;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::counter_exists;
    use std::io::Write;
    use std::process::{Command, Stdio};

    fn nft(script: &str) -> bool {
        let mut c = Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        c.wait().unwrap().success()
    }

    #[test]
    fn finds_a_loaded_counter_and_not_a_missing_one() {
        if !tenancy_test_support::requires_root("netlink query of nf_tables") {
            return;
        }
        let table = format!("nltest{}", std::process::id());
        struct Drop_(String);
        impl Drop for Drop_ {
            fn drop(&mut self) {
                let _ = nft(&format!("table inet {0}\ndelete table inet {0}\n", self.0));
            }
        }
        assert!(!counter_exists(&table, "drop_x").unwrap(), "no table yet");
        let _guard = Drop_(table.clone());
        assert!(nft(&format!(
            "table inet {table} {{\n counter drop_x {{\n }}\n}}\n"
        )));
        assert!(counter_exists(&table, "drop_x").unwrap());
        assert!(!counter_exists(&table, "drop_y").unwrap());
        assert_eq!(super::counter(&table, "drop_x").unwrap(), Some((0, 0)));
        assert!(nft(&format!("reset counter inet {table} drop_x\n")));
        assert!(nft(&format!(
            "delete counter inet {table} drop_x\nadd counter inet {table} drop_x {{ packets 7 bytes 420 }}\n"
        )));
        assert_eq!(super::counter(&table, "drop_x").unwrap(), Some((7, 420)));
        assert!(nft(&format!("delete counter inet {table} drop_x\n")));
        assert!(
            !counter_exists(&table, "drop_x").unwrap(),
            "deleted counter is seen as gone"
        );
    }
}
