//! Tenant identity across nodes (ARCHITECTURE.md, "Across nodes: tenant identity on the wire").
//!
//! Every node holds one IPv4 address per tenant, derived from the config alone: the tenant's
//! `address_prefix` plus the node's index, which is the host part of the node's own address in
//! `[network] node_network`. A tenant's job traffic to the cluster (the node network and every
//! tenant prefix) leaves from its tenant's address on the node (SNAT keyed by the conntrack
//! mark the output hook stamps from the socket's cgroup), a job's socket bound to another
//! tenant's address is dropped at the sender, and every node admits a new flow from a tenant
//! address only to that tenant's jobs. Nothing here is per job: `tenancyctl firewall apply`
//! adds the addresses and loads the rules, the job path is unchanged.

use std::net::Ipv4Addr;
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

pub use tenancy_config::ipv4net::Ipv4Net;

/// This node's place in the node network: found by `firewall apply` (never on the job path).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddr {
    /// The interface holding the node's address; the tenant addresses are added to it.
    pub interface: String,
    pub address: Ipv4Addr,
}

/// The cluster-wide part of the firewall: the node network and each tenant's prefix.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrossNode {
    /// The network of the nodes' own addresses (one per node); a node's index is its host part.
    pub node_network: Ipv4Net,
    /// (tenant, prefix): the tenant's address on the node with index i is prefix + i.
    pub prefixes: Vec<(String, Ipv4Net)>,
    /// This node (found by [`CrossNode::resolve`]); rendering the rules needs it.
    #[serde(default)]
    pub node: Option<NodeAddr>,
}

/// Label of the tenant addresses on the node's interface (`<interface>:tn`), by which
/// `firewall apply` finds the ones it added earlier.
pub fn address_label(interface: &str) -> String {
    format!("{interface}:tn")
}

impl CrossNode {
    pub fn prefix(&self, tenant: &str) -> Option<Ipv4Net> {
        self.prefixes
            .iter()
            .find(|(t, _)| t == tenant)
            .map(|(_, p)| *p)
    }

    /// The tenant's address on this node (needs [`CrossNode::node`]).
    pub fn address(&self, tenant: &str) -> Option<Ipv4Addr> {
        let node = self.node.as_ref()?;
        let i = self.node_network.index_of(node.address)?;
        self.prefix(tenant)?.at(i)
    }

    /// Every network whose traffic from a job leaves from the tenant's address.
    pub fn cluster_networks(&self) -> Vec<Ipv4Net> {
        let mut v = vec![self.node_network];
        v.extend(self.prefixes.iter().map(|(_, p)| *p));
        v
    }

    pub(crate) fn validate(&self, tenants: &[crate::TenantNet]) -> Result<()> {
        let bad = |m: String| Err(Error::Invalid(m));
        for t in tenants {
            if self.prefix(&t.name).is_none() {
                return bad(format!(
                    "tenant {:?} has no address_prefix: with [network] node_network every \
                     tenant needs one",
                    t.name
                ));
            }
        }
        for (i, (t, p)) in self.prefixes.iter().enumerate() {
            if !tenants.iter().any(|x| &x.name == t) {
                return bad(format!("address prefix of unknown tenant {t:?}"));
            }
            if p.len > self.node_network.len {
                return bad(format!(
                    "tenant {t:?}: address_prefix {p} is smaller than node_network {}: every \
                     node needs an address in it (make it /{} or larger)",
                    self.node_network, self.node_network.len
                ));
            }
            if p.overlaps(&self.node_network) {
                return bad(format!(
                    "tenant {t:?}: address_prefix {p} overlaps node_network {}",
                    self.node_network
                ));
            }
            for (o, q) in &self.prefixes[i + 1..] {
                if p.overlaps(q) {
                    return bad(format!(
                        "tenants {t:?} and {o:?}: address prefixes {p} and {q} overlap"
                    ));
                }
            }
        }
        if let Some(n) = &self.node {
            if self.node_network.index_of(n.address).is_none() {
                return bad(format!(
                    "node address {} is not a host address of node_network {}",
                    n.address, self.node_network
                ));
            }
            let ok = !n.interface.is_empty()
                && address_label(&n.interface).len() <= 15
                && n.interface
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-@".contains(&b));
            if !ok {
                return bad(format!(
                    "interface name {:?} must be plain and at most 12 bytes (the tenant \
                     addresses carry the label {:?})",
                    n.interface,
                    address_label(&n.interface)
                ));
            }
        }
        Ok(())
    }

    /// Finds this node's address in the node network and its interface (`ip -j -4 addr`).
    pub fn resolve(&mut self) -> Result<()> {
        let addrs = ip_addresses()?;
        let mine: Vec<&(String, Ipv4Addr, u8, String)> = addrs
            .iter()
            .filter(|(_, a, _, _)| self.node_network.index_of(*a).is_some())
            .collect();
        match mine.as_slice() {
            [(ifname, a, _, _)] => {
                self.node = Some(NodeAddr {
                    interface: ifname.clone(),
                    address: *a,
                });
                Ok(())
            }
            [] => Err(Error::Invalid(format!(
                "this node has no address in [network] node_network {}: give it one, or fix \
                 node_network",
                self.node_network
            ))),
            many => Err(Error::Invalid(format!(
                "this node has {} addresses in node_network {} ({}): it needs exactly one",
                many.len(),
                self.node_network,
                many.iter()
                    .map(|(i, a, _, _)| format!("{a} on {i}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Adds each tenant's address of this node to the node's interface (label
    /// [`address_label`], the tenant prefix's length: on one L2 segment the other nodes'
    /// addresses are then reached directly). Returns the labelled addresses, on any interface,
    /// that are no longer wanted, for [`remove_addresses`] after the new rules are loaded.
    pub fn add_addresses(&self) -> Result<Vec<(String, String)>> {
        let node = self.node.as_ref().ok_or_else(|| {
            Error::Invalid("cross-node firewall without this node's address".into())
        })?;
        let label = address_label(&node.interface);
        let want: Vec<String> = self
            .prefixes
            .iter()
            .filter_map(|(t, p)| Some(format!("{}/{}", self.address(t)?, p.len)))
            .collect();
        let have = labelled_addresses()?;
        for a in &want {
            if !have.contains(&(node.interface.clone(), a.clone())) {
                ip(&["addr", "add", a, "dev", &node.interface, "label", &label])?;
            }
        }
        Ok(have
            .into_iter()
            .filter(|(i, a)| *i != node.interface || !want.contains(a))
            .collect())
    }

    /// The tenant addresses of this node that its interface lacks (`tenancyctl doctor`).
    pub fn missing_addresses(&self) -> Result<Vec<String>> {
        let Some(node) = &self.node else {
            return Ok(Vec::new());
        };
        let have = ip_addresses()?;
        Ok(self
            .prefixes
            .iter()
            .filter_map(|(t, _)| self.address(t))
            .filter(|a| {
                !have
                    .iter()
                    .any(|(i, h, _, _)| *i == node.interface && h == a)
            })
            .map(|a| a.to_string())
            .collect())
    }
}

/// Every address `firewall apply` added (label `<interface>:tn`): (interface, `addr/len`).
pub fn labelled_addresses() -> Result<Vec<(String, String)>> {
    Ok(ip_addresses()?
        .into_iter()
        .filter(|(i, _, _, l)| *l == address_label(i))
        .map(|(i, a, len, _)| (i, format!("{a}/{len}")))
        .collect())
}

/// Removes tenant addresses `firewall apply` added earlier: the stale ones after a change, or
/// all of them once the config no longer sets `node_network`.
pub fn remove_addresses(stale: &[(String, String)]) -> Result<()> {
    for (interface, a) in stale {
        ip(&["addr", "del", a, "dev", interface])?;
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new(crate::nft::tool("ip"))
        .args(args)
        .output()
        .map_err(|e| Error::Invalid(format!("cannot run ip {}: {e}", args.join(" "))))?;
    if !out.status.success() {
        return Err(Error::Invalid(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// (interface, address, prefix length, label) of every IPv4 address of this network namespace.
fn ip_addresses() -> Result<Vec<(String, Ipv4Addr, u8, String)>> {
    let text = ip(&["-j", "-4", "addr", "show"])?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Invalid(format!("cannot parse `ip -j -4 addr show`: {e}")))?;
    let mut out = Vec::new();
    for link in v.as_array().into_iter().flatten() {
        let ifname = link["ifname"].as_str().unwrap_or_default().to_string();
        for a in link["addr_info"].as_array().into_iter().flatten() {
            let (Some(local), Some(len)) = (a["local"].as_str(), a["prefixlen"].as_u64()) else {
                continue;
            };
            let Ok(addr) = local.parse::<Ipv4Addr>() else {
                continue;
            };
            let label = a["label"].as_str().unwrap_or(&ifname).to_string();
            out.push((ifname.clone(), addr, len as u8, label));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_parse_and_index() {
        let n = Ipv4Net::parse("10.99.0.0/24").unwrap();
        assert_eq!(n.index_of("10.99.0.7".parse().unwrap()), Some(7));
        assert_eq!(n.index_of("10.99.0.0".parse().unwrap()), None);
        assert_eq!(n.index_of("10.99.0.255".parse().unwrap()), None);
        assert_eq!(n.index_of("10.98.0.7".parse().unwrap()), None);
        let t = Ipv4Net::parse("10.98.0.0/16").unwrap();
        assert_eq!(t.at(7), Some("10.98.0.7".parse().unwrap()));
        assert!(Ipv4Net::parse("10.99.0.1/24").is_err());
        assert!(Ipv4Net::parse("10.99.0.0").is_err());
        assert!(Ipv4Net::parse("10.99.0.0/31").is_err());
        assert!(t.overlaps(&Ipv4Net::parse("10.98.4.0/24").unwrap()));
        assert!(!t.overlaps(&n));
    }
}
