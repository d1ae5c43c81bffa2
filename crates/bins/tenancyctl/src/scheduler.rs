//! `tenancyctl doctor`'s view of the scheduler layer: quotas enforced by slurmctld, the
//! tenants' limits in slurmdbd, the node pools, and MCS for tiers that share no node.

use crate::containment::Finding;
use crate::slurm_sync::{Dbd, Sacctmgr};
use std::collections::BTreeMap;
use tenancy_config::slurm_conf::{McsSelect, SlurmConf};
use tenancy_config::Config;
use tenancy_devices::doctor::Severity;

/// Whether slurmctld enforces the association limits the tenants' quotas are made of.
pub fn enforce_row(config: &Config, slurm: Result<&SlurmConf, &String>) -> Finding {
    const CHECK: &str = "slurm.accounting_enforce";
    let quotas = config.tenants.values().any(|t| !t.limits.is_empty())
        || config.tiers.values().any(|t| t.require_limits);
    if !quotas {
        return (
            CHECK,
            Severity::Ok,
            "no tenant has limits in the config".into(),
            None,
        );
    }
    let slurm = match slurm {
        Ok(s) => s,
        Err(e) => {
            return (
                CHECK,
                Severity::Warn,
                e.clone(),
                Some("pass --slurm-conf".into()),
            )
        }
    };
    let value = slurm.get("AccountingStorageEnforce").unwrap_or("(not set)");
    if slurm.enforces_limits() {
        return (
            CHECK,
            Severity::Ok,
            format!(
                "AccountingStorageEnforce={value}: slurmctld holds jobs to their tenant's limits"
            ),
            None,
        );
    }
    (
        CHECK,
        Severity::Error,
        format!(
            "{}: AccountingStorageEnforce={value} lacks limits: slurmctld does not enforce the \
             tenants' quotas (GrpTRES, GrpJobs), and a tenant can take the whole cluster",
            slurm.path.display()
        ),
        Some(
            "AccountingStorageEnforce=associations,limits,qos in slurm.conf (with \
             AccountingStorageType=accounting_storage/slurmdbd), then restart slurmctld"
                .into(),
        ),
    )
}

/// Tenants of a tier with `require_limits = true` whose account in slurmdbd has none.
pub fn required_limits_row(config: &Config, dbd: Option<Result<Dbd, String>>) -> Option<Finding> {
    const CHECK: &str = "slurm.tenant_limits";
    let required: Vec<&tenancy_config::Tenant> = config
        .tenants
        .values()
        .filter(|t| config.tier_of(t).require_limits)
        .collect();
    if required.is_empty() {
        return None;
    }
    let dbd = match dbd? {
        Ok(d) => d,
        Err(e) => {
            return Some((
                CHECK,
                Severity::Warn,
                format!("cannot read the tenants' limits from slurmdbd: {e}"),
                Some("check slurmdbd and sacctmgr, then tenancyctl slurm sync".into()),
            ))
        }
    };
    let missing: Vec<String> = required
        .iter()
        .filter(|t| {
            dbd.assocs.get(t.limit_account()).is_none_or(|a| {
                a.grp_jobs.is_none()
                    && !a
                        .grp_tres
                        .keys()
                        .any(|k| k.starts_with("gres/") || k == "node")
            })
        })
        .map(|t| {
            format!(
                "{} (tier {}, account {})",
                t.name,
                t.tier,
                t.limit_account()
            )
        })
        .collect();
    Some(if missing.is_empty() {
        (
            CHECK,
            Severity::Ok,
            format!(
                "every tenant of a tier with require_limits has its limits in slurmdbd ({})",
                required
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None,
        )
    } else {
        (
            CHECK,
            Severity::Warn,
            format!(
                "tenant(s) of a tier with require_limits = true without limits in slurmdbd: {}: \
                 their jobs are held to no quota",
                missing.join(", ")
            ),
            Some("tenancyctl slurm sync --apply".into()),
        )
    })
}

/// The node pools, with their node counts, the nodes slurm.conf lacks, and nodes in two pools.
pub fn pool_rows(config: &Config, slurm: Result<&SlurmConf, &String>) -> Vec<Finding> {
    const CHECK: &str = "scheduler.pools";
    let pools = config.pools();
    if pools.is_empty() {
        return vec![(CHECK, Severity::Ok, "no node pools".into(), None)];
    }
    let mut out = Vec::new();
    let listed: Vec<String> = pools
        .iter()
        .map(|p| {
            format!(
                "{}: {} ({} node(s))",
                p.owner,
                p.nodes,
                p.nodes.names().len()
            )
        })
        .collect();
    out.push((
        CHECK,
        Severity::Ok,
        format!("node pools: {}", listed.join("; ")),
        None,
    ));
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in &pools {
        for n in p.nodes.names() {
            owners.entry(n).or_default().push(p.owner.to_string());
        }
    }
    let twice: Vec<String> = owners
        .iter()
        .filter(|(_, o)| o.len() > 1)
        .map(|(n, o)| format!("{n} ({})", o.join(", ")))
        .collect();
    if !twice.is_empty() {
        out.push((
            "scheduler.pools_overlap",
            Severity::Warn,
            format!(
                "node(s) in two pools: {}: only a tenant both pools admit may run there (a \
                 tenant's own pool within its tier's keeps the tier's other tenants out)",
                twice.join(", ")
            ),
            Some("give each node to one pool".into()),
        ));
    }
    match slurm {
        Ok(s) => {
            let unknown: Vec<String> = pools
                .iter()
                .filter_map(|p| {
                    let u = s.unknown_nodes(p.nodes);
                    (!u.is_empty())
                        .then(|| format!("{}: {}", p.owner, tenancy_config::hostlist::compress(&u)))
                })
                .collect();
            if !unknown.is_empty() {
                out.push((
                    "scheduler.pools_nodes",
                    Severity::Error,
                    format!(
                        "pools name nodes {} does not have: {}",
                        s.path.display(),
                        unknown.join("; ")
                    ),
                    Some(
                        "fix nodes = in the tenancy config (tenancyctl check names the line)"
                            .into(),
                    ),
                ));
            }
        }
        Err(e) => out.push(("scheduler.pools_nodes", Severity::Warn, e.clone(), None)),
    }
    out
}

/// Tiers with `share_node = false`: kept apart by MCS labels where slurm.conf has MCS, else
/// on whole nodes.
pub fn share_node_row(config: &Config, slurm: Result<&SlurmConf, &String>) -> Option<Finding> {
    const CHECK: &str = "scheduler.share_node";
    let tiers: Vec<&str> = config
        .tiers
        .values()
        .filter(|t| !t.share_node)
        .map(|t| t.name.as_str())
        .collect();
    if tiers.is_empty() {
        return None;
    }
    let Ok(slurm) = slurm else {
        return Some((
            CHECK,
            Severity::Warn,
            "cannot read slurm.conf: MCS not checked".into(),
            None,
        ));
    };
    let mcs = slurm.mcs();
    let usable = mcs.select != McsSelect::Never
        && matches!(mcs.plugin.as_str(), "label" | "account" | "group");
    Some(if usable {
        (
            CHECK,
            Severity::Ok,
            format!(
                "tier(s) {} (share_node = false): jobs labelled with their tenant by mcs/{} and \
                 kept off other labels' nodes (MCSParameters={}): a tenant's jobs pack",
                tiers.join(", "),
                mcs.plugin,
                slurm.get("MCSParameters").unwrap_or("")
            ),
            None,
        )
    } else {
        (
            CHECK,
            Severity::Warn,
            format!(
                "tier(s) {} (share_node = false) get a whole node per job (MCSPlugin={}, \
                 MCSParameters={}): a tenant's small jobs do not pack",
                tiers.join(", "),
                slurm.get("MCSPlugin").unwrap_or("mcs/none"),
                slurm.get("MCSParameters").unwrap_or("")
            ),
            Some(
                "MCSPlugin=mcs/label (Slurm 24.05.5 and later) or mcs/account, with \
                 MCSParameters=ondemand,select, in slurm.conf; restart slurmctld"
                    .into(),
            ),
        )
    })
}

/// Every scheduler row of doctor.
pub fn findings(config: &Config, slurm_conf: &std::path::Path) -> Vec<Finding> {
    let slurm = SlurmConf::load(slurm_conf);
    let slurm_ref = slurm.as_ref();
    let mut out = vec![enforce_row(config, slurm_ref)];
    let needs_dbd = config.tiers.values().any(|t| t.require_limits);
    let dbd = needs_dbd.then(|| {
        let cluster = slurm_ref
            .ok()
            .and_then(|s| s.get("ClusterName"))
            .map(|c| c.to_ascii_lowercase())
            .ok_or_else(|| format!("{}: no ClusterName", slurm_conf.display()))?;
        Sacctmgr {
            program: "sacctmgr".into(),
        }
        .read(&cluster)
    });
    out.extend(required_limits_row(config, dbd));
    out.extend(pool_rows(config, slurm_ref));
    out.extend(share_node_row(config, slurm_ref));
    out
}
