//! The firewall: the table every job's traffic is matched in, and the node network.

use super::{row, Row};
use tenancy_config::Config;
use tenancy_devices::doctor::Severity;

/// The firewall table every job's traffic is matched in.
pub(super) fn firewall_rows(config: &Config, rows: &mut Vec<Row>) {
    match tenancy_node::layers::network::firewall_spec(config) {
        Ok(spec) => {
            let loaded = std::process::Command::new("/usr/sbin/nft")
                .args(["list", "table", "inet", &spec.table_name])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            rows.push(if loaded {
                row(
                    "firewall.table",
                    Severity::Ok,
                    format!("nft table inet {} is loaded", spec.table_name),
                    None,
                )
            } else {
                row(
                    "firewall.table",
                    Severity::Error,
                    format!(
                        "nft table inet {} is not loaded: every job would be refused",
                        spec.table_name
                    ),
                    Some("tenancyctl firewall apply".into()),
                )
            });
        }
        Err(e) => rows.push(row("firewall.table", Severity::Error, e.0, None)),
    }
    if let Ok(spec) = tenancy_node::layers::network::firewall_spec(config) {
        rows.push(stepd_row(
            &spec.cgroup.v2_mount,
            tenancy_network::stepd::attached(&spec.cgroup.v2_mount),
        ));
        if spec.cross_node.is_some() {
            rows.push(cross_node_row(&spec));
        }
    }
}

/// slurmstepd's socket program on the cgroup2 root: without it the firewall judges every
/// connection slurmstepd makes for a job (I/O to srun, sattach, task exits, step completion) as
/// the job's code, and steps fail to launch ("Slurmd could not connect IO").
fn stepd_row(root: &std::path::Path, attached: tenancy_network::Result<Option<u32>>) -> Row {
    let check = "firewall.slurmstepd";
    match attached {
        Ok(Some(id)) => row(
            check,
            Severity::Ok,
            format!(
                "slurmstepd's own sockets are marked (program {} id {id} on {}): its connections for a job are the job's, and reach the srun, sattach or salloc that asked without an egress entry",
                tenancy_network::stepd::PROG_NAME,
                root.display()
            ),
            None,
        ),
        Ok(None) => row(
            check,
            Severity::Error,
            format!(
                "no socket program {} of this build on {}: slurmstepd's connections for a job are judged as the job's code, and steps fail to connect their I/O",
                tenancy_network::stepd::PROG_NAME,
                root.display()
            ),
            Some("tenancyctl firewall apply".into()),
        ),
        Err(e) => row(check, Severity::Error, e.to_string(), None),
    }
}

/// With `[network] node_network`: this node has one address there and every tenant's address
/// on that interface (ARCHITECTURE.md, "Across nodes").
fn cross_node_row(spec: &tenancy_network::FirewallSpec) -> Row {
    let fix = Some("tenancyctl firewall apply".to_string());
    let spec = match spec.for_this_node() {
        Ok(s) => s,
        Err(e) => return row("firewall.cross_node", Severity::Error, e.to_string(), None),
    };
    let Some(c) = &spec.cross_node else {
        return row("firewall.cross_node", Severity::Ok, "off".into(), None);
    };
    let node = c
        .node
        .as_ref()
        .map(|n| format!("{} on {}", n.address, n.interface));
    match c.missing_addresses() {
        Ok(m) if m.is_empty() => row(
            "firewall.cross_node",
            Severity::Ok,
            format!(
                "node {}: every tenant's address is on it",
                node.unwrap_or_default()
            ),
            None,
        ),
        Ok(m) => row(
            "firewall.cross_node",
            Severity::Error,
            format!(
                "node {}: tenant addresses missing: {} (their jobs' traffic to other nodes \
                 would have no way back)",
                node.unwrap_or_default(),
                m.join(" ")
            ),
            fix,
        ),
        Err(e) => row("firewall.cross_node", Severity::Error, e.to_string(), fix),
    }
}

#[cfg(test)]
mod tests {
    use super::stepd_row;

    /// Without slurmstepd's socket program its connections are the job code's: an error.
    #[test]
    fn a_node_without_slurmstepds_socket_program_fails() {
        let root = std::path::Path::new("/sys/fs/cgroup");
        assert_eq!(stepd_row(root, Ok(Some(7))).severity, "ok");
        let none = stepd_row(root, Ok(None));
        assert_eq!(none.severity, "error");
        assert!(none.remedy.contains("firewall apply"), "{}", none.remedy);
    }
}
