//! Egress destinations: `ADDR[/PREFIX][:PORT[-PORT]][/PROTO]`.
//!
//! Grammar (chosen and documented here, validated strictly):
//! - IPv4: `10.20.0.0/16`, `10.20.0.5` (a bare address means /32).
//! - IPv6 must be in brackets: `[fd00::/8]`, `[fd00::1]` (a bare address means /128).
//! - `:PORT` or `:LOW-HIGH` (1..=65535) restricts the destination port; no port means all ports.
//! - `/tcp`, `/udp` or `/any` restricts the protocol; no protocol means `any`.
//!   `any` with a port means TCP and UDP to that port; `any` without a port means TCP, UDP
//!   and ICMP to the address range (a job sends no other IP protocol: `ruleset::JUDGED`).
//! - Host bits set below the prefix (`10.20.0.1/16`) are rejected: write the network address.
//!
//! Examples: `10.20.0.0/16:443/tcp`, `[fd00::/8]:53/udp`, `192.168.5.0/24`, `10.0.0.1:8000-8100`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Transport protocol of a destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
    Any,
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Any => "any",
        })
    }
}

/// An allowed destination: an address range, an optional port range and a protocol.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Dest {
    pub addr: IpAddr,
    pub prefix: u8,
    /// Inclusive port range; `None` means every port.
    pub ports: Option<(u16, u16)>,
    pub proto: Proto,
}

/// Why a destination string was refused. The message names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid destination {input:?}: {reason} (expected e.g. \"10.20.0.0/16:443/tcp\" or \"[fd00::/8]:53/udp\")")]
pub struct DestError {
    pub input: String,
    pub reason: String,
}

impl Dest {
    /// Parse `ADDR[/PREFIX][:PORT[-PORT]][/PROTO]`; see the module documentation.
    pub fn parse(input: &str) -> Result<Dest, DestError> {
        let err = |reason: String| DestError {
            input: input.to_string(),
            reason,
        };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("empty".into()));
        }
        let (s, proto) = split_proto(s);
        let (addr_part, port_part) = split_port(s).map_err(err)?;
        let (addr, prefix) =
            parse_net(addr_part, input.trim_start().starts_with('[')).map_err(err)?;
        let ports = port_part.map(parse_ports).transpose().map_err(err)?;
        Ok(Dest {
            addr,
            prefix,
            ports,
            proto,
        })
    }

    pub fn is_ipv4(&self) -> bool {
        self.addr.is_ipv4()
    }

    /// Whether `ip` lies in this destination's address range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && masked(ip, self.prefix) == self.addr
    }

    /// The nft match expression for this destination (without a verdict), e.g.
    /// `ip daddr 10.20.0.0/16 tcp dport 443`.
    pub fn nft_match(&self) -> String {
        let fam = if self.is_ipv4() { "ip" } else { "ip6" };
        let max = if self.is_ipv4() { 32 } else { 128 };
        let addr = if self.prefix == max {
            self.addr.to_string()
        } else {
            format!("{}/{}", self.addr, self.prefix)
        };
        let port = self.ports.map(|(lo, hi)| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        });
        match (self.proto, port) {
            (Proto::Any, None) => format!("{fam} daddr {addr}"),
            (Proto::Any, Some(p)) => {
                format!("{fam} daddr {addr} meta l4proto {{ tcp, udp }} th dport {p}")
            }
            (proto, None) => format!("{fam} daddr {addr} meta l4proto {proto}"),
            (proto, Some(p)) => format!("{fam} daddr {addr} {proto} dport {p}"),
        }
    }
}

/// The protocol suffix (`/tcp`, `/udp`, `/any`; none: any) and what comes before it.
fn split_proto(s: &str) -> (&str, Proto) {
    match s.rsplit_once('/') {
        Some((rest, p)) if p.eq_ignore_ascii_case("tcp") => (rest, Proto::Tcp),
        Some((rest, p)) if p.eq_ignore_ascii_case("udp") => (rest, Proto::Udp),
        Some((rest, p)) if p.eq_ignore_ascii_case("any") => (rest, Proto::Any),
        _ => (s, Proto::Any),
    }
}

/// The address part (`ADDR[/PREFIX]`, without an IPv6 address's brackets) and the port part.
fn split_port(s: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(rest) = s.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or_else(|| "missing ']' after IPv6 address".to_string())?;
        let port = match after {
            "" => None,
            a => Some(
                a.strip_prefix(':')
                    .ok_or_else(|| format!("unexpected {a:?} after ']'"))?,
            ),
        };
        return Ok((inside, port));
    }
    if s.matches(':').count() > 1 {
        return Err("IPv6 addresses must be written in brackets: [fd00::/8]".into());
    }
    Ok(match s.split_once(':') {
        Some((a, p)) => (a, Some(p)),
        None => (s, None),
    })
}

/// `ADDR[/PREFIX]` (IPv6 when it was `bracketed`): the network address and its prefix length.
fn parse_net(addr_part: &str, bracketed: bool) -> Result<(IpAddr, u8), String> {
    let (ip_str, prefix_str) = match addr_part.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (addr_part, None),
    };
    let addr: IpAddr = if bracketed {
        IpAddr::V6(
            Ipv6Addr::from_str(ip_str).map_err(|_| format!("{ip_str:?} is not an IPv6 address"))?,
        )
    } else {
        IpAddr::V4(
            Ipv4Addr::from_str(ip_str).map_err(|_| format!("{ip_str:?} is not an IPv4 address"))?,
        )
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix_str {
        None => max,
        Some(p) => {
            let v: u8 = p
                .parse()
                .map_err(|_| format!("prefix length {p:?} is not a number"))?;
            if v > max {
                return Err(format!("prefix length {v} is larger than {max}"));
            }
            v
        }
    };
    if masked(addr, prefix) != addr {
        return Err(format!(
            "host bits are set below /{prefix}: write the network address {}/{prefix}",
            masked(addr, prefix)
        ));
    }
    Ok((addr, prefix))
}

/// `PORT` or `LOW-HIGH`, each in 1..=65535: an inclusive range.
fn parse_ports(p: &str) -> Result<(u16, u16), String> {
    let parse_port = |t: &str| -> Result<u16, String> {
        match t.parse::<u16>() {
            Ok(0) | Err(_) => Err(format!("port {t:?} is not in 1..=65535")),
            Ok(v) => Ok(v),
        }
    };
    let (lo, hi) = match p.split_once('-') {
        Some((a, b)) => (parse_port(a)?, parse_port(b)?),
        None => {
            let v = parse_port(p)?;
            (v, v)
        }
    };
    if lo > hi {
        return Err(format!("port range {lo}-{hi} is empty"));
    }
    Ok((lo, hi))
}

fn masked(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - prefix as u32)
            };
            IpAddr::V4(Ipv4Addr::from(bits & mask))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let mask = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - prefix as u32)
            };
            IpAddr::V6(Ipv6Addr::from(bits & mask))
        }
    }
}

impl fmt::Display for Dest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let max = if self.is_ipv4() { 32 } else { 128 };
        let addr = if self.prefix == max {
            self.addr.to_string()
        } else {
            format!("{}/{}", self.addr, self.prefix)
        };
        if self.is_ipv4() {
            f.write_str(&addr)?;
        } else {
            write!(f, "[{addr}]")?;
        }
        if let Some((lo, hi)) = self.ports {
            if lo == hi {
                write!(f, ":{lo}")?;
            } else {
                write!(f, ":{lo}-{hi}")?;
            }
        }
        write!(f, "/{}", self.proto)
    }
}

impl FromStr for Dest {
    type Err = DestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dest::parse(s)
    }
}

impl TryFrom<String> for Dest {
    type Error = DestError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Dest::parse(&s)
    }
}

impl From<Dest> for String {
    fn from(d: Dest) -> String {
        d.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        let d = Dest::parse("10.20.0.0/16:443/tcp").unwrap();
        assert_eq!(d.addr, "10.20.0.0".parse::<IpAddr>().unwrap());
        assert_eq!(
            (d.prefix, d.ports, d.proto),
            (16, Some((443, 443)), Proto::Tcp)
        );
        let d = Dest::parse("[fd00::/8]:53/udp").unwrap();
        assert_eq!(
            (d.prefix, d.ports, d.proto),
            (8, Some((53, 53)), Proto::Udp)
        );
        let d = Dest::parse("192.168.5.7").unwrap();
        assert_eq!((d.prefix, d.ports, d.proto), (32, None, Proto::Any));
        let d = Dest::parse("10.0.0.0/8:8000-8100").unwrap();
        assert_eq!((d.ports, d.proto), (Some((8000, 8100)), Proto::Any));
        let d = Dest::parse("[fd00::1]/tcp").unwrap();
        assert_eq!((d.prefix, d.ports, d.proto), (128, None, Proto::Tcp));
        let d = Dest::parse("0.0.0.0/0").unwrap();
        assert_eq!(d.prefix, 0);
    }

    #[test]
    fn refuses_bad_input_naming_it() {
        for bad in [
            "",
            "10.20.0.1/16",
            "10.20.0.0/33",
            "10.20.0.0/16:0",
            "10.20.0.0/16:70000",
            "10.20.0.0/16:443/sctp",
            "fd00::/8",
            "[fd00::/8",
            "[10.0.0.0/8]",
            "example.com:443",
            "10.0.0.0/8:200-100",
            "10.0.0.0/8:443 ; flush ruleset",
        ] {
            let e = Dest::parse(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn round_trips_and_renders_nft() {
        for (s, nft) in [
            (
                "10.20.0.0/16:443/tcp",
                "ip daddr 10.20.0.0/16 tcp dport 443",
            ),
            ("[fd00::/8]:53/udp", "ip6 daddr fd00::/8 udp dport 53"),
            ("10.1.2.3", "ip daddr 10.1.2.3"),
            (
                "10.0.0.0/8:53",
                "ip daddr 10.0.0.0/8 meta l4proto { tcp, udp } th dport 53",
            ),
            ("10.0.0.0/8/udp", "ip daddr 10.0.0.0/8 meta l4proto udp"),
            (
                "10.0.0.0/8:1000-2000/tcp",
                "ip daddr 10.0.0.0/8 tcp dport 1000-2000",
            ),
        ] {
            let d = Dest::parse(s).unwrap();
            assert_eq!(d.nft_match(), nft);
            assert_eq!(Dest::parse(&d.to_string()).unwrap(), d);
        }
        let json = serde_json::to_string(&Dest::parse("[fd00::/8]:53/udp").unwrap()).unwrap();
        assert_eq!(json, "\"[fd00::/8]:53/udp\"");
        assert!(serde_json::from_str::<Dest>("\"10.0.0.1/8\"").is_err());
    }

    #[test]
    fn contains() {
        let d = Dest::parse("10.20.0.0/16").unwrap();
        assert!(d.contains("10.20.3.4".parse().unwrap()));
        assert!(!d.contains("10.21.0.1".parse().unwrap()));
        assert!(!d.contains("::1".parse().unwrap()));
    }
}
