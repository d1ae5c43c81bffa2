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
        if unsafe { libc::geteuid() } != 0 {
            if std::env::var_os("CI").is_some() {
                panic!("needs root");
            }
            eprintln!("SKIP (needs root): netlink query of nf_tables");
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
