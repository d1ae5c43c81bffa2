//! Network destinations as the admin writes them: `CIDR[:PORT[-PORT]][/PROTO]`.
//!
//! Examples: `10.20.0.0/16:443/tcp`, `10.0.0.53/32:53/udp`, `192.168.1.0/24` (all ports, all
//! protocols), `[fd00::/8]:8080-8090/tcp`.

use ipnet::IpNet;
use serde::Serialize;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Destination {
    pub net: IpNet,
    /// Inclusive port range; `None` means every port.
    pub ports: Option<(u16, u16)>,
    pub proto: Proto,
}

impl Destination {
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (rest, proto) = match text.rsplit_once('/') {
            Some((r, p @ ("tcp" | "udp" | "any"))) => (
                r,
                match p {
                    "tcp" => Proto::Tcp,
                    "udp" => Proto::Udp,
                    _ => Proto::Any,
                },
            ),
            _ => (text, Proto::Any),
        };
        let (net, port) = if let Some(inner) = rest.strip_prefix('[') {
            let (net, after) = inner
                .split_once(']')
                .ok_or_else(|| format!("'{text}': missing ']' after an IPv6 network"))?;
            let port =
                match after {
                    "" => None,
                    p => Some(p.strip_prefix(':').ok_or_else(|| {
                        format!("'{text}': expected ':PORT' after ']', found '{p}'")
                    })?),
                };
            (net, port)
        } else {
            match rest.split_once(':') {
                Some((n, p)) => (n, Some(p)),
                None => (rest, None),
            }
        };
        let net: IpNet = net.parse().map_err(|_| {
            format!("'{text}': '{net}' is not a CIDR network (write e.g. 10.20.0.0/16)")
        })?;
        if net.trunc() != net {
            return Err(format!(
                "'{text}': '{net}' has host bits set (did you mean {}?)",
                net.trunc()
            ));
        }
        let ports = match port {
            None => None,
            Some(p) => {
                let (lo, hi) = p.split_once('-').unwrap_or((p, p));
                let parse = |s: &str| {
                    s.parse::<u16>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| format!("'{text}': '{s}' is not a port (1-65535)"))
                };
                let (lo, hi) = (parse(lo)?, parse(hi)?);
                if lo > hi {
                    return Err(format!("'{text}': port range {lo}-{hi} is reversed"));
                }
                Some((lo, hi))
            }
        };
        if ports.is_some() && proto == Proto::Any {
            return Err(format!(
                "'{text}': a port needs a protocol (append /tcp or /udp)"
            ));
        }
        Ok(Destination { net, ports, proto })
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.net {
            IpNet::V6(_) if self.ports.is_some() => write!(f, "[{}]", self.net)?,
            _ => write!(f, "{}", self.net)?,
        }
        if let Some((lo, hi)) = self.ports {
            if lo == hi {
                write!(f, ":{lo}")?;
            } else {
                write!(f, ":{lo}-{hi}")?;
            }
        }
        match self.proto {
            Proto::Tcp => write!(f, "/tcp"),
            Proto::Udp => write!(f, "/udp"),
            Proto::Any => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_admins_write() {
        let d = Destination::parse("10.20.0.0/16:443/tcp").unwrap();
        assert_eq!(d.ports, Some((443, 443)));
        assert_eq!(d.proto, Proto::Tcp);
        assert_eq!(d.to_string(), "10.20.0.0/16:443/tcp");
        let d = Destination::parse("192.168.1.0/24").unwrap();
        assert_eq!((d.ports, d.proto), (None, Proto::Any));
        let d = Destination::parse("[fd00::/8]:8080-8090/tcp").unwrap();
        assert_eq!(d.ports, Some((8080, 8090)));
        assert_eq!(d.to_string(), "[fd00::/8]:8080-8090/tcp");
    }

    #[test]
    fn rejects_bad_cidrs_and_ports() {
        for bad in [
            "10.20.0.0/33:443/tcp",
            "10.20.0.1/16:443/tcp",
            "10.20.0.0/16:0/tcp",
            "10.20.0.0/16:70000/tcp",
            "10.20.0.0/16:443",
            "10.20.0.0/16:99-10/udp",
            "example.com:443/tcp",
            "[fd00::/8:53/udp",
        ] {
            assert!(Destination::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
