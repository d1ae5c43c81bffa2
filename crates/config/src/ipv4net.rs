//! An IPv4 network value (`ADDR/LEN`), as the config names tenants' address prefixes and the
//! node network (ARCHITECTURE.md, "Across nodes: tenant identity on the wire").

use std::fmt;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// An IPv4 network, `ADDR/LEN` with no host bits set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Ipv4Net {
    pub addr: Ipv4Addr,
    pub len: u8,
}

impl Ipv4Net {
    /// Parse `10.99.1.0/24`; the length is required and host bits must be zero.
    pub fn parse(s: &str) -> Result<Ipv4Net, String> {
        let (a, l) = s.trim().split_once('/').ok_or_else(|| {
            format!("{s:?}: write an IPv4 network with its length, e.g. \"10.99.1.0/24\"")
        })?;
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("{s:?}: {a:?} is not an IPv4 address"))?;
        let len: u8 = l
            .parse()
            .ok()
            .filter(|n| (1..=30).contains(n))
            .ok_or_else(|| format!("{s:?}: prefix length {l:?} must be 1..=30"))?;
        let net = Ipv4Net { addr, len };
        if net.base() != u32::from(addr) {
            return Err(format!(
                "{s:?}: host bits are set; write the network address {}/{len}",
                Ipv4Addr::from(net.base())
            ));
        }
        Ok(net)
    }

    fn mask(&self) -> u32 {
        u32::MAX << (32 - u32::from(self.len))
    }

    fn base(&self) -> u32 {
        u32::from(self.addr) & self.mask()
    }

    /// Number of addresses in the network.
    fn size(&self) -> u64 {
        1u64 << (32 - u32::from(self.len))
    }

    pub fn contains(&self, a: Ipv4Addr) -> bool {
        u32::from(a) & self.mask() == self.base()
    }

    pub fn overlaps(&self, o: &Ipv4Net) -> bool {
        self.contains(o.addr) || o.contains(self.addr)
    }

    /// The host part of `a` in this network (its index), if `a` is in it and is neither the
    /// network nor the broadcast address.
    pub fn index_of(&self, a: Ipv4Addr) -> Option<u32> {
        let i = u32::from(a).wrapping_sub(self.base());
        (self.contains(a) && i != 0 && u64::from(i) != self.size() - 1).then_some(i)
    }

    /// The address with host part `index`.
    pub fn at(&self, index: u32) -> Option<Ipv4Addr> {
        (index != 0 && u64::from(index) < self.size() - 1)
            .then(|| Ipv4Addr::from(self.base() + index))
    }
}

impl fmt::Display for Ipv4Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl TryFrom<String> for Ipv4Net {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Ipv4Net::parse(&s)
    }
}

impl From<Ipv4Net> for String {
    fn from(n: Ipv4Net) -> String {
        n.to_string()
    }
}
